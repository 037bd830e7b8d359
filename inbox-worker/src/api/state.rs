//! The state every handler shares, who is calling (bearer tokens), and how a refusal is
//! answered and counted.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use ledger::{ClientId, Store};

use crate::access::{self, Caller, Unknown};
use crate::wire::CommandKind;
use tokio::sync::{broadcast, watch};

use super::metrics::Metrics;
use super::options::ApiOptions;
use super::problem::Problem;

/// One event of `/v1/live/stream`: `fact`, `key` or `conflict`, with its JSON.
#[derive(Debug, Clone)]
pub struct FeedEvent {
    pub name: &'static str,
    pub data: String,
}

/// The state every handler shares.
pub(crate) struct App {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    pub options: ApiOptions,
    pub events: broadcast::Sender<FeedEvent>,
    pub stop: watch::Receiver<bool>,
}

pub(crate) type Shared = Arc<App>;

impl App {
    pub(crate) fn fail(&self, p: Problem) -> Response {
        self.metrics.answered(p.code);
        p.into_response()
    }
}

/// A refusal sent before the body was read: what follows on the socket is not a request.
pub(crate) fn fail_and_close(app: &App, p: Problem) -> Response {
    let mut r = app.fail(p);
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

// ---- authentication -----------------------------------------------------------------------

/// What a read may see: one tenant's data in its own names, or everything in ledger-wide
/// names (the operator, or anyone on a worker without tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum View {
    Tenant(ClientId),
    All,
}

impl App {
    fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
        let v = headers.get(header::AUTHORIZATION)?.as_bytes();
        let (scheme, rest) = (v.get(..7)?, v.get(7..)?);
        scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| rest.trim_ascii())
    }

    fn open(&self) -> bool {
        self.options.tokens.is_empty()
    }

    pub(crate) fn caller(&self, headers: &HeaderMap) -> Result<Caller, Problem> {
        access::resolve(
            &self.options.tokens,
            self.options.admin_token.as_deref(),
            Self::bearer(headers),
        )
        .map_err(|why| match why {
            Unknown::Missing => Problem::unauthorized("This worker needs a token.").detail(
                "send Authorization: Bearer <your token>; the operator configures tokens \
                 with serve --token or --tokens-file",
            ),
            Unknown::NotAccepted => Problem::unauthorized("This token is not accepted."),
        })
    }

    /// The tenant a command of `kind` acts for, if its caller may send it.
    pub(crate) fn submitter(
        &self,
        headers: &HeaderMap,
        kind: CommandKind,
    ) -> Result<ClientId, Problem> {
        match self.caller(headers)? {
            Caller::Tenant { tenant, role } => match role.may_submit(kind) {
                Ok(()) => Ok(tenant),
                Err(why) => Err(Problem::forbidden().detail(why)),
            },
            Caller::Operator if self.open() => Ok(ClientId::default_client()),
            Caller::Operator => Err(Problem::forbidden()
                .detail("the operator token reads; commands need a tenant's token")),
        }
    }

    /// The tenant whose keys a key endpoint reads.
    pub(crate) fn key_reader(&self, headers: &HeaderMap) -> Result<ClientId, Problem> {
        match self.caller(headers)? {
            Caller::Tenant { tenant, .. } => Ok(tenant),
            Caller::Operator if self.open() => Ok(ClientId::default_client()),
            Caller::Operator => Err(Problem::forbidden().detail(
                "keys are read with their tenant's token; the operator reads them at \
                 /v1/live/keys",
            )),
        }
    }

    /// What a read of accounts or facts may see.
    pub(crate) fn reader(&self, headers: &HeaderMap) -> Result<View, Problem> {
        match self.caller(headers)? {
            Caller::Tenant { .. } if self.open() => Ok(View::All),
            Caller::Tenant { tenant, .. } => Ok(View::Tenant(tenant)),
            Caller::Operator => Ok(View::All),
        }
    }

    /// Operator endpoints: open without tokens, the admin token with them.
    pub(crate) fn operator(&self, headers: &HeaderMap) -> Result<(), Problem> {
        match self.caller(headers)? {
            Caller::Operator => Ok(()),
            Caller::Tenant { .. } if self.open() => Ok(()),
            Caller::Tenant { .. } => Err(Problem::forbidden()
                .detail("operator endpoints need the operator token (serve --admin-token)")),
        }
    }
}
