//! The HTTP API of docs/api.md on axum: authenticates the client, parses the command,
//! hands it to the ledger and turns the ledger's answer into a response. The idempotency
//! check is the ledger's, inside its commit: nothing here caches answers.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ledger::fact::json;
use ledger::{
    Account, ClientId, Command, Config, Key, KeyQuery, KeyStatus, Ledger, LedgerError, Outcome,
    Store, Submission,
};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};

use crate::feed;
use crate::listener::{self, BodyTimeout, Limits};
use crate::metrics::Metrics;
use crate::wire::{self, CommandKind};

/// The largest request body accepted.
pub const BODY_LIMIT_BYTES: usize = 64 * 1024;

/// How the API behaves, independent of where the ledger lives.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// Client tokens: (client, secret). Empty: one client, `default`, loopback only.
    pub tokens: Vec<(ClientId, String)>,
    /// The operator's secret for the feed endpoints when client tokens are configured.
    pub admin_token: Option<String>,
    /// How long a request waits for an in-flight twin before answering 409.
    pub in_flight_wait: Duration,
    /// How often the sweeper looks for keys past the retention.
    pub sweep_every: Duration,
    /// How often `verify` runs for the snapshot (it also runs at start).
    pub verify_every: Duration,
    /// The connection cap and each phase's timeout (see `listener`).
    pub limits: Limits,
    /// The RabbitMQ consumer's counters, for /metrics, when the worker runs one.
    pub amqp_stats: Option<Arc<crate::amqp::AmqpStats>>,
}

impl Default for ApiOptions {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            admin_token: None,
            in_flight_wait: Duration::from_millis(20),
            sweep_every: Duration::from_secs(5),
            verify_every: Duration::from_secs(600),
            limits: Limits::default(),
            amqp_stats: None,
        }
    }
}

/// Everything `serve` needs: the ledger's folder and options, the address, the API.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub db: PathBuf,
    /// A PostgreSQL URL: the facts live there instead of the sled folder `db`.
    pub store_url: Option<String>,
    /// Connections to PostgreSQL (with `store_url`).
    pub pg_pool: usize,
    /// Consume inbox messages from RabbitMQ too.
    pub amqp: Option<crate::amqp::AmqpOptions>,
    pub listen: SocketAddr,
    pub retention: Duration,
    pub lease: Duration,
    pub cache_bytes: u64,
    pub api: ApiOptions,
}

impl ServeConfig {
    pub fn new(db: impl Into<PathBuf>) -> Self {
        Self {
            db: db.into(),
            store_url: None,
            pg_pool: 16,
            amqp: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 7420)),
            retention: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(10),
            cache_bytes: 64 * 1024 * 1024,
            api: ApiOptions::default(),
        }
    }

    pub fn ledger_config(&self) -> Config {
        let mut c = Config::new(&self.db)
            .retention(self.retention)
            .lease(self.lease);
        c.cache_capacity_bytes = self.cache_bytes;
        c
    }
}

/// Refuses an open server on a non-loopback address: with no tokens, anyone who can reach
/// the port could move money.
pub fn check_exposure(listen: SocketAddr, api: &ApiOptions) -> anyhow::Result<()> {
    if api.tokens.is_empty() && !listen.ip().is_loopback() {
        anyhow::bail!(
            "refusing to listen on {listen} without tokens: with no --token or --tokens-file \
             the worker serves the client `default` to anyone who connects, so it only \
             listens on loopback (e.g. 127.0.0.1:7420)"
        );
    }
    Ok(())
}

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
        eprintln!(
            "consuming queue {} from {} (prefetch {})",
            opts.queue,
            crate::amqp::redact(&opts.url),
            opts.prefetch
        );
        let (store, stop, until) = (ledger.clone(), stop_tx.clone(), stopped(stop_rx.clone()));
        tokio::spawn(async move {
            let consumed = crate::amqp::consume(store, opts, until).await;
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
        let options = ledger::pg::PgOptions {
            in_flight_wait: config.api.in_flight_wait,
            pool_size: config.pg_pool,
            ..ledger::pg::PgOptions::default()
        };
        let (store, report) = ledger::pg::PgStore::open(url, rules, options)
            .await
            .context("opening the PostgreSQL store")?;
        let store: Arc<dyn Store> = Arc::new(store);
        eprintln!("ledger {}: {report}", store.location());
        return Ok(store);
    }
    let ledger_config = config.ledger_config();
    let (ledger, report) = tokio::task::spawn_blocking(move || Ledger::open(ledger_config))
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
    let (events, _) = broadcast::channel(crate::metrics::FEED_EVENTS);
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

/// The state every handler shares.
pub(crate) struct App {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    pub options: ApiOptions,
    pub events: broadcast::Sender<feed::FeedEvent>,
    pub stop: watch::Receiver<bool>,
}

pub(crate) type Shared = Arc<App>;

pub(crate) fn router(app: Shared) -> Router {
    Router::new()
        .route("/v1/deposits", post(deposit))
        .route("/v1/withdrawals", post(withdraw))
        .route("/v1/refunds", post(refund))
        .route("/v1/accounts", get(accounts))
        .route("/v1/accounts/{id}", get(account))
        .route("/v1/keys", get(keys))
        .route("/v1/keys/{key}", get(one_key))
        .route("/v1/facts", get(facts))
        .route("/v1/live/snapshot", get(feed::snapshot))
        .route("/v1/live/keys", get(feed::live_keys))
        .route("/v1/live/keys/{client}/{key}", get(feed::live_key))
        .route("/v1/live/stream", get(feed::stream))
        .route("/v1/live/quarantine", get(feed::quarantine))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
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

/// A refusal sent before the body was read: what follows on the socket is not a request.
fn fail_and_close(app: &App, p: Problem) -> Response {
    let mut r = app.fail(p);
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

// ---- problems -----------------------------------------------------------------------------

/// An RFC 9457 problem with a stable `code`. `detail` is always written by the server.
#[derive(Debug)]
pub(crate) struct Problem {
    pub status: StatusCode,
    pub code: &'static str,
    pub title: &'static str,
    pub detail: Option<String>,
    pub retry_after_secs: Option<u64>,
    pub extra: Option<Box<(&'static str, Value)>>,
}

impl Problem {
    pub fn new(status: StatusCode, code: &'static str, title: &'static str) -> Self {
        Self {
            status,
            code,
            title,
            detail: None,
            retry_after_secs: None,
            extra: None,
        }
    }
    pub fn detail(mut self, d: impl Into<String>) -> Self {
        self.detail = Some(d.into());
        self
    }
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "A valid bearer token is required.",
        )
    }
    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "The request is not a valid command.",
        )
        .detail(detail)
    }
    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "The ledger's storage is unavailable; nothing was recorded. Retry later.",
        )
    }
    pub fn not_found(code: &'static str, title: &'static str) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, title)
    }
}

pub(crate) fn problem_body(p: &Problem) -> Value {
    let mut body = json!({
        "type": format!("urn:idem:problem:{}", p.code),
        "title": p.title,
        "status": p.status.as_u16(),
        "code": p.code,
    });
    if let Some(d) = &p.detail {
        body["detail"] = json!(d);
    }
    if let Some(extra) = &p.extra {
        body[extra.0] = extra.1.clone();
    }
    body
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut r = bytes_response(
            self.status,
            body_bytes(&problem_body(&self)),
            "application/problem+json",
        );
        if let Some(secs) = self.retry_after_secs {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body is never read, so the connection cannot carry another
            // request: saying so keeps a client from reusing it and failing there.
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

pub(crate) fn body_bytes(v: &Value) -> Vec<u8> {
    // serde_json's map is ordered by key, so the same value gives the same bytes.
    serde_json::to_vec(v).unwrap_or_default()
}

pub(crate) fn bytes_response(
    status: StatusCode,
    body: Vec<u8>,
    content_type: &'static str,
) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub(crate) fn json_ok(v: &Value) -> Response {
    bytes_response(StatusCode::OK, body_bytes(v), "application/json")
}

impl App {
    pub(crate) fn fail(&self, p: Problem) -> Response {
        self.metrics.answered(p.code);
        p.into_response()
    }
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

// ---- authentication -----------------------------------------------------------------------

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    Client(ClientId),
    Admin,
}

/// Compares secrets in time independent of where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
    fn client(&self, headers: &HeaderMap) -> Result<ClientId, Problem> {
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

// ---- commands -----------------------------------------------------------------------------

async fn deposit(State(app): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    command(app, CommandKind::Deposit, headers, body).await
}

async fn withdraw(State(app): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    command(app, CommandKind::Withdraw, headers, body).await
}

async fn refund(State(app): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    command(app, CommandKind::Refund, headers, body).await
}

fn idempotency_key(headers: &HeaderMap) -> Result<Key, Problem> {
    let mut values = headers.get_all("idempotency-key").iter();
    let first = values.next().ok_or_else(|| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency_key_missing",
            "Money-moving requests need an Idempotency-Key header.",
        )
    })?;
    let invalid = || {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency_key_invalid",
            "The Idempotency-Key must be one header of 1 to 255 bytes of visible ASCII.",
        )
    };
    if values.next().is_some() {
        return Err(invalid());
    }
    let text = first.to_str().map_err(|_| invalid())?;
    Key::parse(text).map_err(|_| invalid())
}

fn too_large() -> Problem {
    Problem::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "The body is larger than 64 KiB.",
    )
}

async fn read_body(headers: &HeaderMap, body: Body) -> Result<axum::body::Bytes, Problem> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > BODY_LIMIT_BYTES as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, BODY_LIMIT_BYTES)
        .await
        .map_err(|e| {
            let inner = e.into_inner();
            if inner
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                too_large()
            } else if caused_by::<BodyTimeout>(&*inner) {
                Problem::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    "The request body did not arrive in time; nothing changed.",
                )
            } else {
                Problem::invalid("the body could not be read")
            }
        })
}

/// Whether `E` is `e` or anywhere in its chain of sources (the body's errors arrive
/// wrapped by each layer they pass).
fn caused_by<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<E>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// The order of checks: who, which key, how big, what. Each refusal leaves the key unused.
async fn command(app: Shared, kind: CommandKind, headers: HeaderMap, body: Body) -> Response {
    let client = match app.client(&headers) {
        Ok(c) => c,
        Err(p) => return app.fail(p),
    };
    let key = match idempotency_key(&headers) {
        Ok(k) => k,
        Err(p) => return app.fail(p),
    };
    let bytes = match read_body(&headers, body).await {
        Ok(b) => b,
        // The rest of a late body may still come: the connection cannot be reused.
        Err(p) if p.status == StatusCode::REQUEST_TIMEOUT => return fail_and_close(&app, p),
        Err(p) => return app.fail(p),
    };
    let command = match wire::parse_body(kind, &bytes) {
        Ok(c) => c,
        Err(e) => return app.fail(Problem::invalid(e.detail)),
    };
    execute(&app, client, key, command).await
}

/// Submits and waits for the durable answer. The request may go meanwhile (the client hung
/// up): the outcome is durable anyway, and a retry replays it.
pub(crate) async fn submit(
    store: &dyn Store,
    client: &ClientId,
    key: &Key,
    command: Command,
) -> Result<Submission, LedgerError> {
    store.submit(client, key, command, None).await
}

async fn execute(app: &Shared, client: ClientId, key: Key, command: Command) -> Response {
    let mut answer = submit(&*app.store, &client, &key, command.clone()).await;
    if matches!(answer, Ok(Submission::InProgress { .. })) && !app.store.waits_for_twins() {
        // The twin usually commits within milliseconds: poll the key (reads only, so the
        // poll adds no conflicts) and answer with its outcome rather than a 409. A store
        // that waited for the twin already (PostgreSQL) is not waited on twice.
        let deadline = Instant::now() + app.options.in_flight_wait;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
            match app.store.key(&client, &key).await {
                Ok(Some(info)) if info.status == KeyStatus::Pending => continue,
                Ok(_) => {
                    answer = submit(&*app.store, &client, &key, command.clone()).await;
                    break;
                }
                Err(_) => break,
            }
        }
    }
    match answer {
        Ok(Submission::Executed(o)) => outcome_response(app, &o, false),
        Ok(Submission::Replayed(o)) => outcome_response(app, &o, true),
        Ok(Submission::Reused) => {
            let stored = app.store.key(&client, &key).await.ok().flatten();
            let differs = stored
                .map(|k| wire::differs(&k.command, &command))
                .unwrap_or_default();
            feed::conflict(app, &client, &key, "reused", &command, &differs);
            let mut p = Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "This key was used for another command; nothing changed.",
            )
            .detail(
                "an idempotency key names one command: retry with the same body, \
                 or use a new key for a new command",
            );
            p.extra = Some(Box::new(("differs", json!(differs))));
            app.fail(p)
        }
        Ok(Submission::InProgress { retry_after }) => {
            feed::conflict(app, &client, &key, "in_flight", &command, &[]);
            let mut p = Problem::new(
                StatusCode::CONFLICT,
                "request_in_progress",
                "A request with this key is in progress; retry after a moment.",
            );
            p.retry_after_secs = Some(retry_after.as_secs().max(1));
            app.fail(p)
        }
        Ok(Submission::Quarantined { .. }) => app.fail(Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Unexpected answer from the ledger.",
        )),
        Err(e) => {
            eprintln!("ledger error: {e}");
            app.fail(Problem::unavailable())
        }
    }
}

/// The stored answer: 201 with the receipt, or 422 with the rejection; the same bytes on
/// every replay, because both are rendered from the outcome alone.
pub(crate) fn outcome_response(app: &App, outcome: &Outcome, replayed: bool) -> Response {
    let body = body_bytes(&json::outcome(outcome));
    let (status, content_type, code) = match outcome {
        Outcome::Applied(_) => (StatusCode::CREATED, "application/json", "applied"),
        Outcome::Rejected(r) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "application/problem+json",
            r.rejection.code(),
        ),
    };
    app.metrics
        .answered(if replayed { "replayed" } else { code });
    let mut r = bytes_response(status, body, content_type);
    if replayed {
        r.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    r
}

// ---- reads --------------------------------------------------------------------------------

pub(crate) type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

pub(crate) fn params(q: Params) -> Result<HashMap<String, String>, Problem> {
    q.map(|Query(m)| m)
        .map_err(|_| Problem::invalid("the query string could not be decoded"))
}

pub(crate) fn number_param(
    p: &HashMap<String, String>,
    name: &'static str,
    default: u64,
    max: u64,
) -> Result<u64, Problem> {
    match p.get(name) {
        None => Ok(default),
        Some(v) => {
            v.parse::<u64>().ok().filter(|n| *n <= max).ok_or_else(|| {
                Problem::invalid(format!("{name} must be a whole number up to {max}"))
            })
        }
    }
}

pub(crate) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

async fn accounts(State(app): State<Shared>, headers: HeaderMap) -> Response {
    if let Err(p) = app.caller(&headers) {
        return app.fail(p);
    }
    let balances = match app.store.balances().await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("ledger error: {e}");
            return app.fail(Problem::unavailable());
        }
    };
    let mut rows = Vec::new();
    for (account, per) in &balances.accounts {
        for (currency, balance) in per {
            rows.push(json!({
                "account": account.as_str(),
                "currency": currency.as_str(),
                "balance": json::wide(*balance),
                "system": account.is_system(),
            }));
        }
    }
    let sums: serde_json::Map<String, Value> = balances
        .sums()
        .into_iter()
        .map(|(c, s)| (c.as_str().to_owned(), json::wide(s)))
        .collect();
    json_ok(&json!({"accounts": rows, "sums": sums}))
}

async fn account(
    State(app): State<Shared>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    if let Err(p) = app.caller(&headers) {
        return app.fail(p);
    }
    let missing = || Problem::not_found("account_not_found", "The account does not exist.");
    let Ok(Path(id)) = id else {
        return app.fail(missing());
    };
    let Ok(account) = Account::parse_any(&id) else {
        return app.fail(missing());
    };
    let per = match app.store.account(&account).await {
        Ok(Some(per)) => per,
        Ok(None) => return app.fail(missing()),
        Err(e) => {
            eprintln!("ledger error: {e}");
            return app.fail(Problem::unavailable());
        }
    };
    let body = if per.len() == 1 {
        let (currency, balance) = per.iter().next().map_or(("", 0), |(c, b)| (c.as_str(), *b));
        json!({"account": account.as_str(), "currency": currency, "balance": json::wide(balance)})
    } else {
        // Only system accounts hold several currencies.
        let rows: Vec<Value> = per
            .iter()
            .map(|(c, b)| json!({"currency": c.as_str(), "balance": json::wide(*b)}))
            .collect();
        json!({"account": account.as_str(), "balances": rows})
    };
    json_ok(&body)
}

async fn keys(State(app): State<Shared>, headers: HeaderMap, q: Params) -> Response {
    let client = match app.client(&headers) {
        Ok(c) => c,
        Err(p) => return app.fail(p),
    };
    let p = match params(q) {
        Ok(p) => p,
        Err(p) => return app.fail(p),
    };
    let status = match p.get("status").map(|s| KeyStatus::parse(s)) {
        None => None,
        Some(Some(s)) => Some(s),
        Some(None) => {
            return app.fail(Problem::invalid("status must be pending, done or expired"));
        }
    };
    let limit = match number_param(&p, "limit", 100, 1000) {
        Ok(n) => to_usize(n.max(1)),
        Err(p) => return app.fail(p),
    };
    let after = match p.get("after").map(|a| Key::parse(a)) {
        None => None,
        Some(Ok(k)) => Some(k),
        Some(Err(_)) => return app.fail(Problem::invalid("after must be a key")),
    };
    let listed = app
        .store
        .keys(KeyQuery {
            status,
            client: Some(client.clone()),
            after: after.map(|k| (client.clone(), k)),
            limit,
        })
        .await;
    match listed {
        Ok(page) => {
            let now = app.store.rules().clock.now();
            let next = page.next.map(|(_, k)| k.as_str().to_owned());
            let rows: Vec<Value> = page.keys.iter().map(|k| feed::key_json(k, now)).collect();
            json_ok(&json!({"keys": rows, "next": next}))
        }
        Err(e) => {
            eprintln!("ledger error: {e}");
            app.fail(Problem::unavailable())
        }
    }
}

async fn one_key(
    State(app): State<Shared>,
    headers: HeaderMap,
    key: Result<Path<String>, PathRejection>,
) -> Response {
    let client = match app.client(&headers) {
        Ok(c) => c,
        Err(p) => return app.fail(p),
    };
    let missing = || Problem::not_found("key_not_found", "This client has no such key.");
    let Some(key) = key.ok().and_then(|Path(k)| Key::parse(&k).ok()) else {
        return app.fail(missing());
    };
    match app.store.key(&client, &key).await {
        Ok(Some(info)) => json_ok(&feed::key_json(&info, app.store.rules().clock.now())),
        Ok(None) => app.fail(missing()),
        Err(e) => {
            eprintln!("ledger error: {e}");
            app.fail(Problem::unavailable())
        }
    }
}

async fn facts(State(app): State<Shared>, headers: HeaderMap, q: Params) -> Response {
    let caller = match app.caller(&headers) {
        Ok(c) => c,
        Err(p) => return app.fail(p),
    };
    let p = match params(q) {
        Ok(p) => p,
        Err(p) => return app.fail(p),
    };
    let (after, limit) = match (
        number_param(&p, "after", 0, u64::MAX),
        number_param(&p, "limit", 100, 1000),
    ) {
        (Ok(a), Ok(l)) => (a, to_usize(l.max(1))),
        (Err(p), _) | (_, Err(p)) => return app.fail(p),
    };
    // A client sees only its own facts; the operator (or the only client) sees all.
    let only = match caller {
        Caller::Client(c) if !app.options.tokens.is_empty() => Some(c),
        _ => None,
    };
    let mut out = Vec::new();
    let mut cursor = after;
    let mut scanned = 0usize;
    loop {
        let chunk = match app.store.facts(cursor, 1000).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("ledger error: {e}");
                return app.fail(Problem::unavailable());
            }
        };
        let exhausted = chunk.len() < 1000;
        for fact in chunk {
            if out.len() >= limit {
                break;
            }
            cursor = fact.seq;
            scanned += 1;
            if only.as_ref().is_none_or(|c| *c == fact.client) {
                out.push(json::fact(&fact));
            }
        }
        // The scan is bounded so that a client with few facts cannot make one request
        // read the whole log.
        if exhausted || out.len() >= limit || scanned >= 100_000 {
            break;
        }
    }
    json_ok(&json!({
        "facts": out,
        "last_seq": app.store.durable_seq(),
        "next_after": cursor,
    }))
}

async fn healthz(State(app): State<Shared>) -> Response {
    match app.store.failure() {
        None => json_ok(&json!({"status": "ok", "last_seq": app.store.durable_seq()})),
        Some(reason) => {
            eprintln!("health: storage failed: {reason}");
            app.fail(Problem::unavailable().detail(
                "the ledger stopped writing after a storage failure; restart the worker \
                 once the disk is healthy",
            ))
        }
    }
}

async fn metrics(State(app): State<Shared>) -> Response {
    let stats = app.store.stats().await.unwrap_or_default();
    let own = app
        .metrics
        .memory(app.options.limits.max_connections, app.events.len());
    let mut text = app.metrics.render(&stats, &*app.store, own);
    if let Some(amqp) = &app.options.amqp_stats {
        amqp.write_prometheus(&mut text);
    }
    let mut r = (StatusCode::OK, text).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
