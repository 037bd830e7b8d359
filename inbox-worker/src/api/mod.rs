//! The HTTP API of docs/api.md on axum, with the operator feed of docs/FEED.md: the router,
//! `serve` (an open store on a bound listener) and `run_server` (open, bind, serve, stop).
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

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use ledger::{SledStore, Store};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};

pub use commands::BODY_LIMIT_BYTES;
pub use listener::Limits;
pub use options::{ApiOptions, ServeConfig, check_exposure};
pub use state::FeedEvent;

use metrics::Metrics;
use problem::Problem;
use state::{App, Shared, fail_and_close};

use crate::inbox::amqp;

/// Opens the ledger, binds `config.listen`, serves until `shutdown` resolves, finishes
/// what is in flight, and shuts the ledger down (flushing it). Prints
/// `listening on http://ADDR` on stdout once it accepts connections.
pub async fn run_server<F>(config: ServeConfig, shutdown: F) -> anyhow::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    check_exposure(config.listen, &config.api)?;
    let ledger = open_store(&config).await?;
    let listener = match TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            close(ledger).await;
            return Err(e).with_context(|| format!("binding {}", config.listen));
        }
    };
    let addr = listener.local_addr()?;
    // One shutdown for the HTTP server and the broker consumer.
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut api = config.api;
    let consumer = config.amqp.map(|opts| {
        api.amqp_stats = Some(opts.stats.clone());
        // "consuming" is said by the consumer once the broker took it.
        eprintln!(
            "amqp: connecting to {} to consume queue {}",
            amqp::redact(&opts.url),
            opts.queue
        );
        let (store, stop, until) = (ledger.clone(), stop_tx.clone(), stopped(stop_rx.clone()));
        tokio::spawn(async move {
            let consumed = amqp::consume(store, opts, until).await;
            // A worker told to consume that cannot is not healthy: stop it all, loudly.
            if consumed.is_err() {
                let _ = stop.send(true);
            }
            consumed
        })
    });
    println!("listening on http://{addr}");
    let stop = stop_tx.clone();
    let trigger = tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    let served = serve(listener, ledger.clone(), api, stopped(stop_rx)).await;
    trigger.abort();
    let mut failed = None;
    if let Some(consumer) = consumer {
        // Stops taking deliveries and waits for those in hand: each is acked after its
        // outcome is durable, or left for the broker to redeliver.
        match consumer.await {
            Ok(Ok(report)) => eprintln!("amqp: {report}"),
            Ok(Err(e)) => failed = Some(e.context("the RabbitMQ consumer stopped")),
            Err(e) => failed = Some(anyhow::anyhow!("the RabbitMQ consumer panicked: {e}")),
        }
    }
    close(ledger).await;
    if let Some(e) = failed {
        return Err(e);
    }
    eprintln!("stopped: everything acknowledged is on disk");
    served
}

/// Opens the store `config` names: PostgreSQL when `store_url` is set, else the sled
/// folder `db`. Prints what opening found on stderr.
pub async fn open_store(config: &ServeConfig) -> anyhow::Result<Arc<dyn Store>> {
    if let Some(url) = &config.store_url {
        let rules = ledger::Rules {
            retention: config.retention,
            lease: config.lease,
            clock: Arc::new(ledger::SystemClock),
        };
        let options = ledger::PgConfig {
            in_flight_wait: config.api.in_flight_wait,
            pool_size: config.pg_pool,
            lanes: config.pg_lanes,
            group_max: config.pg_group_max,
            group_wait: config.pg_group_wait,
            allow_unsafe_settings: config.pg_allow_unsafe_settings,
            ..ledger::PgConfig::default()
        };
        let (store, report) = ledger::PgStore::open(url, rules, options)
            .await
            .context("opening the PostgreSQL store")?;
        let store: Arc<dyn Store> = Arc::new(store);
        eprintln!("ledger {}: {report}", store.location());
        return Ok(store);
    }
    let ledger_config = config.ledger_config();
    let (ledger, report) = tokio::task::spawn_blocking(move || SledStore::open(ledger_config))
        .await
        .context("opening the ledger")??;
    eprintln!("ledger {}: {report}", config.db.display());
    Ok(Arc::new(ledger))
}

async fn close(ledger: Arc<dyn Store>) {
    ledger.shutdown().await;
}

/// Serves the API of an open ledger on an already-bound listener until `shutdown`
/// resolves, then waits for in-flight requests. The caller owns the ledger and shuts it
/// down; this is how the dashboard embeds a worker (bind `127.0.0.1:0`, read
/// `local_addr`, spawn this).
pub async fn serve<F>(
    listener: TcpListener,
    ledger: Arc<dyn Store>,
    options: ApiOptions,
    shutdown: F,
) -> anyhow::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    check_exposure(listener.local_addr()?, &options)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let (events, _) = broadcast::channel(metrics::FEED_EVENTS);
    let app = Arc::new(App {
        store: ledger,
        metrics: Arc::new(Metrics::new()),
        options,
        events,
        stop: stop_rx,
    });
    let background = feed::spawn_background(app.clone());
    let stop = stop_tx.clone();
    let trigger = tokio::spawn(async move {
        shutdown.await;
        // Ends the event streams too, which would otherwise hold the shutdown open.
        let _ = stop.send(true);
    });
    listener::serve(
        listener,
        router(app.clone()),
        app.options.limits,
        app.metrics.clone(),
        stop_tx.subscribe(),
    )
    .await;
    trigger.abort();
    let _ = stop_tx.send(true);
    for task in background {
        let _ = task.await;
    }
    Ok(())
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
