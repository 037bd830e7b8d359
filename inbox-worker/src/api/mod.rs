//! The HTTP API of docs/api.md on axum, with the operator feed of docs/FEED.md: the router
//! and [`Http`], the API of one open store, which the server (`crate::server`) starts
//! beside the store's other tasks. This module answers HTTP only: it knows nothing of the
//! inbox, and reads a broker consumer through [`ConsumerStatus`].
//!
//! The modules form a chain, each importing only those before it: `problem` and `metrics`
//! know nothing of the others; `listener` counts into `metrics`; `options` names the
//! listener's limits; `state` (the shared `App`, callers, refusals) builds on those; `feed`,
//! then `reads` and `commands` are the endpoints; this module wires them together.

mod commands;
pub mod feed;
pub mod listener;
pub mod metrics;
mod options;
mod problem;
mod reads;
mod state;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use ledger::Store;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

pub use commands::BODY_LIMIT_BYTES;
pub use listener::Limits;
pub use options::{ApiOptions, ConsumerStatus, check_exposure};
pub use state::FeedEvent;

use metrics::Metrics;
use problem::Problem;
use state::{App, Shared, fail_and_close};

/// The HTTP side of a running worker: the state every handler shares, for one open store.
/// The server (`crate::server`) builds it, starts its feed's tasks, serves it on a bound
/// listener and records in it what the tasks it runs beside it report.
#[derive(Clone)]
pub(crate) struct Http {
    app: Shared,
}

impl Http {
    /// The API of `store` with `options`; its event streams and feed tasks end when `stop`
    /// turns true.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        options: ApiOptions,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let (events, _) = broadcast::channel(metrics::FEED_EVENTS);
        let app = Arc::new(App {
            store,
            metrics: Arc::new(Metrics::new()),
            options,
            events,
            stop,
        });
        Self { app }
    }

    pub(crate) fn options(&self) -> &ApiOptions {
        &self.app.options
    }

    /// Starts the feed's own tasks (throughput sampler, fact follower).
    pub(crate) fn spawn_feed(&self) -> Vec<JoinHandle<()>> {
        feed::spawn_feed(self.app.clone())
    }

    /// Records a verify the server ran, for the feed's snapshot.
    pub(crate) fn verified(&self, run: feed::VerifyRun) {
        feed::verified(&self.app, run);
    }

    /// Serves `listener` until `stop` turns true, then waits for in-flight requests within
    /// the shutdown grace (see `listener`).
    pub(crate) async fn serve(&self, listener: TcpListener, stop: watch::Receiver<bool>) {
        listener::serve(
            listener,
            router(self.app.clone()),
            self.app.options.limits,
            self.app.metrics.clone(),
            stop,
        )
        .await;
    }
}

pub(crate) fn router(app: Shared) -> Router {
    Router::new()
        .route("/v1/deposits", post(commands::deposit))
        .route("/v1/withdrawals", post(commands::withdraw))
        .route("/v1/refunds", post(commands::refund))
        .route("/v1/accounts", get(reads::accounts))
        .route("/v1/accounts/{id}", get(reads::account))
        .route("/v1/accounts/{id}/facts", get(reads::statement))
        .route("/v1/keys", get(reads::keys))
        .route("/v1/keys/{key}", get(reads::one_key))
        .route("/v1/facts", get(reads::facts))
        .route("/v1/live/snapshot", get(feed::snapshot))
        .route("/v1/live/keys", get(feed::live_keys))
        .route("/v1/live/keys/{client}/{key}", get(feed::live_key))
        .route("/v1/live/stream", get(feed::stream))
        .route("/v1/live/quarantine", get(feed::quarantine))
        .route("/healthz", get(reads::healthz))
        .route("/metrics", get(reads::metrics))
        .route("/openapi.json", get(reads::openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(app.clone(), framing))
        .with_state(app)
}

/// Refuses a body framed or coded in a way the worker does not decode, before any
/// handler sees it: hyper frames `Transfer-Encoding: gzip, chunked` by its last coding
/// and would hand the handler the still-gzipped bytes, and a proxy in front that decodes
/// the coding would then have seen another request than the worker. Only `chunked` (and
/// an identity content coding) is spoken; anything else changes nothing.
async fn framing(
    State(app): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = request.headers();
    let codings = |name| {
        headers
            .get_all(name)
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("?").split(','))
            .map(|c| c.trim().to_ascii_lowercase())
            .filter(|c| !c.is_empty())
            .collect::<Vec<_>>()
    };
    let transfer = codings(header::TRANSFER_ENCODING);
    if transfer.iter().any(|c| c != "chunked") {
        return fail_and_close(
            &app,
            Problem::new(
                StatusCode::NOT_IMPLEMENTED,
                "transfer_coding_unsupported",
                "The worker decodes no transfer coding but chunked; nothing changed.",
            )
            .detail("send the body with a Content-Length, or chunked with no other coding"),
        );
    }
    let content = codings(header::CONTENT_ENCODING);
    if content.iter().any(|c| c != "identity") {
        return fail_and_close(
            &app,
            Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "content_coding_unsupported",
                "The worker takes bodies without a content coding; nothing changed.",
            )
            .detail("send the JSON body uncompressed"),
        );
    }
    next.run(request).await
}

async fn not_found(State(app): State<Shared>) -> Response {
    app.fail(Problem::not_found("not_found", "No such endpoint."))
}

async fn method_not_allowed(State(app): State<Shared>) -> Response {
    app.fail(Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "This endpoint does not take this method.",
    ))
}
