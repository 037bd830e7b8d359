//! The read endpoints: balances, an account's statement, a client's keys, the facts,
//! `/healthz`, `/metrics` and the API's own description, `/openapi.json`.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ledger::fact::json;
use ledger::{Account, Key, KeyQuery, KeyStatus};
use serde_json::{Value, json};

use super::feed;
use super::problem::{Params, Problem, json_ok, limit_param, no_params, number_param, params};
use super::state::{Caller, Shared};

pub(crate) async fn accounts(State(app): State<Shared>, headers: HeaderMap, q: Params) -> Response {
    if let Err(p) = app.caller(&headers).and_then(|_| no_params(q)) {
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

pub(crate) async fn account(
    State(app): State<Shared>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    q: Params,
) -> Response {
    if let Err(p) = app.caller(&headers).and_then(|_| no_params(q)) {
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

/// `GET /v1/accounts/{id}/facts`: the statement of a user account. Its movements in seq
/// order, each as `/v1/facts` shows the fact plus `change` (this account's, signed), paged
/// by `after` and `limit` like `/v1/facts`; `next_after` is the seq to pass as `after` for
/// the next page, null once there is nothing after this page. A client token sees its own
/// facts only, as on `/v1/facts`; `balance_after` is still the account's.
pub(crate) async fn statement(
    State(app): State<Shared>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    q: Params,
) -> Response {
    let (caller, after, limit) = match log_page(&app, &headers, q) {
        Ok(page) => page,
        Err(p) => return app.fail(p),
    };
    // As for `GET /v1/accounts/{id}`: a name no account can have is an unknown account.
    let missing = || Problem::not_found("account_not_found", "The account does not exist.");
    let Some(account) = id.ok().and_then(|Path(id)| Account::parse_any(&id).ok()) else {
        return app.fail(missing());
    };
    if account.is_system() {
        return app.fail(Problem::invalid(
            "a statement is of a user account; a system account takes the other leg of \
             every movement, which /v1/facts lists",
        ));
    }
    let (currency, balance) = match app.store.account(&account).await {
        Ok(Some(per)) => match per.into_iter().next() {
            Some(held) => held,
            None => return app.fail(missing()),
        },
        Ok(None) => return app.fail(missing()),
        Err(e) => {
            eprintln!("ledger error: {e}");
            return app.fail(Problem::unavailable());
        }
    };
    let only = match caller {
        Caller::Client(c) if !app.options.tokens.is_empty() => Some(c),
        _ => None,
    };
    // A page is read until one fact past it shows that something follows.
    let mut rows = Vec::new();
    let mut last_seq_of_page = after;
    let mut cursor = after;
    let mut scanned = 0usize;
    let mut more = false;
    'read: loop {
        let chunk = match app.store.statement(&account, cursor, 1000).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("ledger error: {e}");
                return app.fail(Problem::unavailable());
            }
        };
        let exhausted = chunk.len() < 1000;
        for fact in chunk {
            cursor = fact.seq;
            scanned += 1;
            if only.as_ref().is_some_and(|c| *c != fact.client) {
                continue;
            }
            if rows.len() == limit {
                more = true;
                break 'read;
            }
            last_seq_of_page = fact.seq;
            rows.push(statement_row(&fact));
        }
        // Bounded like `/v1/facts`: a client with few of an account's many facts cannot
        // make one request read them all; it goes on from `next_after`.
        if exhausted {
            break;
        }
        if scanned >= 100_000 {
            more = true;
            last_seq_of_page = cursor;
            break;
        }
    }
    let next_after = if more {
        json!(last_seq_of_page)
    } else {
        Value::Null
    };
    json_ok(&json!({
        "account": account.as_str(),
        "currency": currency.as_str(),
        "balance": json::wide(balance),
        "facts": rows,
        "next_after": next_after,
    }))
}

/// A movement as a statement shows it: the fact as `/v1/facts` does, and `change`, the
/// signed amount it moved on the account.
fn statement_row(fact: &ledger::Fact) -> Value {
    let mut row = json::fact(fact);
    if let (Some(line), Value::Object(map)) = (ledger::projection::statement_line(fact), &mut row) {
        map.insert("change".into(), json::wide(line.change));
    }
    row
}

pub(crate) async fn keys(State(app): State<Shared>, headers: HeaderMap, q: Params) -> Response {
    let client = match app.client(&headers) {
        Ok(c) => c,
        Err(p) => return app.fail(p),
    };
    let p = match params(q, &["status", "limit", "after"]) {
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
    let limit = match limit_param(&p) {
        Ok(n) => n,
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
            let rules = app.store.rules();
            let now = rules.clock.now();
            let next = page.next.map(|(_, k)| k.as_str().to_owned());
            let rows: Vec<Value> = page
                .keys
                .iter()
                .map(|k| feed::key_json(k, now, rules.retention))
                .collect();
            json_ok(&json!({"keys": rows, "next": next}))
        }
        Err(e) => {
            eprintln!("ledger error: {e}");
            app.fail(Problem::unavailable())
        }
    }
}

pub(crate) async fn one_key(
    State(app): State<Shared>,
    headers: HeaderMap,
    key: Result<Path<String>, PathRejection>,
    q: Params,
) -> Response {
    let client = match app.client(&headers) {
        Ok(c) => c,
        Err(p) => return app.fail(p),
    };
    if let Err(p) = no_params(q) {
        return app.fail(p);
    }
    let missing = || Problem::not_found("key_not_found", "This client has no such key.");
    let Some(key) = key.ok().and_then(|Path(k)| Key::parse(&k).ok()) else {
        return app.fail(missing());
    };
    match app.store.key(&client, &key).await {
        Ok(Some(info)) => {
            let rules = app.store.rules();
            json_ok(&feed::key_json(&info, rules.clock.now(), rules.retention))
        }
        Ok(None) => app.fail(missing()),
        Err(e) => {
            eprintln!("ledger error: {e}");
            app.fail(Problem::unavailable())
        }
    }
}

/// The caller and the page (`after`, `limit`) of a read of the log or of a statement,
/// which take exactly those two parameters.
fn log_page(app: &Shared, headers: &HeaderMap, q: Params) -> Result<(Caller, u64, usize), Problem> {
    let caller = app.caller(headers)?;
    let p = params(q, &["after", "limit"])?;
    Ok((
        caller,
        number_param(&p, "after", 0, u64::MAX)?,
        limit_param(&p)?,
    ))
}

pub(crate) async fn facts(State(app): State<Shared>, headers: HeaderMap, q: Params) -> Response {
    let (caller, after, limit) = match log_page(&app, &headers, q) {
        Ok(page) => page,
        Err(p) => return app.fail(p),
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

pub(crate) async fn healthz(State(app): State<Shared>, q: Params) -> Response {
    if let Err(p) = no_params(q) {
        return app.fail(p);
    }
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

pub(crate) async fn metrics(State(app): State<Shared>, q: Params) -> Response {
    if let Err(p) = no_params(q) {
        return app.fail(p);
    }
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

/// The OpenAPI document of this API, as docs/openapi.json holds it: the file is compiled
/// in, so what is served is what is reviewed, byte for byte.
const OPENAPI: &str = include_str!("../../../docs/openapi.json");

pub(crate) async fn openapi(State(app): State<Shared>, q: Params) -> Response {
    if let Err(p) = no_params(q) {
        return app.fail(p);
    }
    super::problem::bytes_response(
        StatusCode::OK,
        OPENAPI.as_bytes().to_vec(),
        "application/json",
    )
}
