//! The state every handler shares, who is calling (bearer tokens), and how a refusal is
//! answered and counted.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use ledger::{ClientId, Store};
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

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    Client(ClientId),
    Admin,
}

/// Compares secrets in time independent of where they differ, with `subtle`, whose
/// comparison the optimiser is kept from turning into an early exit. Only a difference in
/// length answers at once.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    a.ct_eq(b).into()
}

impl App {
    fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
        let v = headers.get(header::AUTHORIZATION)?.as_bytes();
        let (scheme, rest) = (v.get(..7)?, v.get(7..)?);
        scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| rest.trim_ascii())
    }

    pub(crate) fn caller(&self, headers: &HeaderMap) -> Result<Caller, Problem> {
        let presented = Self::bearer(headers);
        if let (Some(p), Some(admin)) = (presented, &self.options.admin_token)
            && same_secret(p, admin.as_bytes())
        {
            return Ok(Caller::Admin);
        }
        if self.options.tokens.is_empty() {
            return Ok(Caller::Client(ClientId::default_client()));
        }
        let presented = presented.ok_or_else(Problem::unauthorized)?;
        // Every token is compared, so the time taken does not tell which one came close.
        let mut found = None;
        for (client, secret) in &self.options.tokens {
            if same_secret(presented, secret.as_bytes()) {
                found = Some(client.clone());
            }
        }
        found.map(Caller::Client).ok_or_else(Problem::unauthorized)
    }

    /// The client a money or key endpoint acts for.
    pub(crate) fn client(&self, headers: &HeaderMap) -> Result<ClientId, Problem> {
        match self.caller(headers)? {
            Caller::Client(c) => Ok(c),
            Caller::Admin if self.options.tokens.is_empty() => Ok(ClientId::default_client()),
            Caller::Admin => Err(Problem::unauthorized()
                .detail("the operator token reads the feed; commands need a client token")),
        }
    }

    /// Operator endpoints: open without tokens, the admin token with them.
    pub(crate) fn operator(&self, headers: &HeaderMap) -> Result<(), Problem> {
        match self.caller(headers)? {
            Caller::Admin => Ok(()),
            Caller::Client(_) if self.options.tokens.is_empty() => Ok(()),
            Caller::Client(_) => Err(Problem::unauthorized()
                .detail("operator endpoints need the operator token (serve --admin-token)")),
        }
    }
}
