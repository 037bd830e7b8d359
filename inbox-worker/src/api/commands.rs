//! `POST /v1/deposits`, `/v1/withdrawals`, `/v1/refunds`: authenticates the client,
//! reads the key and the body, hands the command to the store and renders its answer. The
//! idempotency check is the store's, inside its commit: nothing here caches answers.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use ledger::json;
use ledger::{ClientId, Command, Key, Outcome, Submission};
use serde_json::json;

use super::feed;
use super::listener::BodyTimeout;
use super::problem::{Params, Problem, body_bytes, bytes_response, no_params};
use super::state::{App, Shared, fail_and_close};
use crate::wire::{self, CommandKind};

/// The largest request body accepted.
pub const BODY_LIMIT_BYTES: usize = 64 * 1024;

pub(crate) async fn deposit(
    State(app): State<Shared>,
    headers: HeaderMap,
    q: Params,
    body: Body,
) -> Response {
    command(app, CommandKind::Deposit, headers, q, body).await
}

pub(crate) async fn withdraw(
    State(app): State<Shared>,
    headers: HeaderMap,
    q: Params,
    body: Body,
) -> Response {
    command(app, CommandKind::Withdraw, headers, q, body).await
}

pub(crate) async fn refund(
    State(app): State<Shared>,
    headers: HeaderMap,
    q: Params,
    body: Body,
) -> Response {
    command(app, CommandKind::Refund, headers, q, body).await
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

/// The order of checks: who, no query, which key, how big, what. Each refusal leaves the
/// key unused. A command takes no query parameter: one the client believes in (a
/// `dry_run`, say) must not be ignored while money moves.
async fn command(
    app: Shared,
    kind: CommandKind,
    headers: HeaderMap,
    q: Params,
    body: Body,
) -> Response {
    let tenant = match app.submitter(&headers, kind) {
        Ok(t) => t,
        Err(p) => return app.fail(p),
    };
    if let Err(p) = no_params(q) {
        return app.fail(p);
    }
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
    if let Err(p) = accepted_currency(&app, &command) {
        return app.fail(p);
    }
    execute(&app, tenant, key, command).await
}

/// Refuses, before the ledger sees it, a currency the operator does not accept: an
/// account's first deposit fixes its currency for ever, so a typo (`USS`) must not.
fn accepted_currency(app: &App, command: &Command) -> Result<(), Problem> {
    let (Command::Deposit { currency, .. } | Command::Withdraw { currency, .. }) = command else {
        // A refund is in its withdrawal's currency, accepted when it was taken.
        return Ok(());
    };
    crate::access::accepts_currency(&app.options.currencies, *currency).map_err(Problem::invalid)
}

async fn execute(app: &Shared, tenant: ClientId, key: Key, sent: Command) -> Response {
    // The tenant's account names are taken inside its own space: nothing it can write
    // reaches another tenant's money.
    let command = sent.for_tenant(&tenant);
    let client = tenant;
    // The store waits a bounded time for a twin in flight before it answers 409.
    let answer = app.store.submit(&client, &key, command.clone(), None).await;
    match answer {
        Ok(Submission::Executed(o)) => outcome_response(app, &o.seen_by(&client), false),
        Ok(Submission::Replayed(o)) => outcome_response(app, &o.seen_by(&client), true),
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
    // Until when this answer is kept under its key, from the retention the worker runs
    // with now. A header and not a body member: the body is the stored answer, the same
    // bytes on every replay, while the retention may change between two runs.
    let until = feed::expires_at(outcome.created_at(), app.store.rules().retention);
    if let Ok(v) = HeaderValue::from_str(&until) {
        r.headers_mut().insert(IDEMPOTENCY_EXPIRES, v);
    }
    r
}

/// The response header that says until when a stored answer is kept (RFC 3339, UTC).
pub(crate) const IDEMPOTENCY_EXPIRES: &str = "idempotency-expires";
