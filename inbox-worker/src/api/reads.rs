//! The read endpoints: balances, a client's keys, the facts, `/healthz` and `/metrics`.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ledger::fact::json;
use ledger::{Account, Key, KeyQuery, KeyStatus};
use serde_json::{Value, json};

use super::feed;
use super::problem::{Params, Problem, json_ok, limit_param, number_param, params};
use super::state::{Caller, Shared};

pub(crate) async fn accounts(State(app): State<Shared>, headers: HeaderMap) -> Response {
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

pub(crate) async fn account(
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

pub(crate) async fn one_key(
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

pub(crate) async fn facts(State(app): State<Shared>, headers: HeaderMap, q: Params) -> Response {
    let caller = match app.caller(&headers) {
        Ok(c) => c,
        Err(p) => return app.fail(p),
    };
    let p = match params(q, &["after", "limit"]) {
        Ok(p) => p,
        Err(p) => return app.fail(p),
    };
    let (after, limit) = match (number_param(&p, "after", 0, u64::MAX), limit_param(&p)) {
        (Ok(a), Ok(l)) => (a, l),
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

pub(crate) async fn healthz(State(app): State<Shared>) -> Response {
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

pub(crate) async fn metrics(State(app): State<Shared>) -> Response {
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
