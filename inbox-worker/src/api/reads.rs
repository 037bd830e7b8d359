//! The read endpoints: balances, an account's statement, a client's keys, the facts,
//! `/healthz`, `/metrics` and the API's own description, `/openapi.json`.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ledger::json;
use ledger::{Account, AsOf, Key, KeyQuery, KeyStatus, Timestamp};
use serde_json::{Value, json};

use super::feed;
use super::problem::{Params, Problem, json_ok, limit_param, no_params, number_param, params};
use super::state::{Shared, View};

/// `GET /v1/accounts`: the accounts the caller may see, in name order, paged by `after`
/// (the last name of the previous page) and `limit`; `next` is the name to pass as
/// `after`, null on the last page. `sums` is over every account the caller may see, not
/// only this page: a tenant's sums are its own accounts' totals; the operator's are the
/// ledger's, system accounts included, and are zero per currency while the books balance.
pub(crate) async fn accounts(State(app): State<Shared>, headers: HeaderMap, q: Params) -> Response {
    let (view, after, limit) = match accounts_page(&app, &headers, q) {
        Ok(page) => page,
        Err(p) => return app.fail(p),
    };
    let balances = match app.store.balances().await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("ledger error: {e}");
            return app.fail(Problem::unavailable());
        }
    };
    let mut rows = Vec::new();
    let mut listed = 0usize;
    let mut sums: std::collections::BTreeMap<&str, i128> = std::collections::BTreeMap::new();
    let mut next = Value::Null;
    for (account, per) in &balances.accounts {
        let Some(name) = visible(&view, account) else {
            continue;
        };
        for (currency, balance) in per {
            *sums.entry(currency.as_str()).or_default() += *balance;
        }
        if after.as_deref().is_some_and(|a| name.as_str() <= a) {
            continue;
        }
        if listed == limit {
            // The page is full and another account follows: the page's last name goes on.
            next = rows
                .last()
                .and_then(|r: &Value| r.get("account").cloned())
                .unwrap_or(Value::Null);
            continue;
        }
        listed += 1;
        for (currency, balance) in per {
            rows.push(json!({
                "account": name.as_str(),
                "currency": currency.as_str(),
                "balance": json::wide(*balance),
                "system": account.is_system(),
            }));
        }
    }
    let sums: serde_json::Map<String, Value> = sums
        .into_iter()
        .map(|(c, s)| (c.to_owned(), json::wide(s)))
        .collect();
    json_ok(&json!({"accounts": rows, "sums": sums, "next": next}))
}

/// The caller's view and the page of `GET /v1/accounts`.
fn accounts_page(
    app: &Shared,
    headers: &HeaderMap,
    q: Params,
) -> Result<(View, Option<String>, usize), Problem> {
    let view = app.reader(headers)?;
    let p = params(q, &["after", "limit"])?;
    let after = match p.get("after") {
        None => None,
        Some(a) if Account::parse_any(a).is_ok() => Some(a.clone()),
        Some(_) => return Err(Problem::invalid("after must be an account name")),
    };
    Ok((view, after, limit_param(&p)?))
}

/// The name `view` shows `account` under, or `None` when the caller may not see it: a
/// tenant sees its own accounts in its own names, and no system account, whose balances
/// are every tenant's movements together.
fn visible(view: &View, account: &Account) -> Option<Account> {
    match view {
        View::All => Some(account.clone()),
        View::Tenant(_) if account.is_system() => None,
        View::Tenant(t) => ledger::tenant::seen_by(t, account),
    }
}

/// The ledger-wide account the caller means by `id`, or `None` when it can name none: a
/// tenant names its own accounts only (never a system account or another tenant's), the
/// operator any account by its ledger-wide name.
fn named(view: &View, id: &str) -> Option<Account> {
    match view {
        View::All => Account::parse_any(id).ok(),
        View::Tenant(t) => Account::parse(id)
            .ok()
            .map(|a| ledger::tenant::scoped(t, &a)),
    }
}

pub(crate) async fn account(
    State(app): State<Shared>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    q: Params,
) -> Response {
    let (view, point) = match app
        .reader(&headers)
        .and_then(|v| as_of_param(q).map(|p| (v, p)))
    {
        Ok(v) => v,
        Err(p) => return app.fail(p),
    };
    // Another tenant's account answers as one that does not exist: its existence is not
    // the caller's to learn.
    let missing = || Problem::not_found("account_not_found", "The account does not exist.");
    let Ok(Path(id)) = id else {
        return app.fail(missing());
    };
    let Some(account) = named(&view, &id) else {
        return app.fail(missing());
    };
    if let Some(point) = point {
        return balance_at(&app, &id, &account, point).await;
    }
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
        json!({"account": id, "currency": currency, "balance": json::wide(balance)})
    } else {
        // Only system accounts hold several currencies.
        let rows: Vec<Value> = per
            .iter()
            .map(|(c, b)| json!({"currency": c.as_str(), "balance": json::wide(*b)}))
            .collect();
        json!({"account": id, "balances": rows})
    };
    json_ok(&body)
}

/// `as_of_seq=N` and `as_of=TIME` (RFC 3339), each bounding the point (both: the earlier
/// of the two); neither: the balance now.
fn as_of_param(q: Params) -> Result<Option<AsOf>, Problem> {
    let p = params(q, &["as_of_seq", "as_of"])?;
    let seq = match p.get("as_of_seq") {
        None => None,
        Some(_) => Some(number_param(&p, "as_of_seq", 0, u64::MAX)?),
    };
    let time = match p.get("as_of") {
        None => None,
        Some(t) => Some(
            chrono::DateTime::parse_from_rfc3339(t)
                .map(|t| Timestamp(t.timestamp_millis()))
                .map_err(|_| {
                    Problem::invalid("as_of must be an RFC 3339 time, such as 2026-12-07T10:00:00Z")
                })?,
        ),
    };
    Ok((seq.is_some() || time.is_some()).then_some(AsOf { seq, time }))
}

/// A user account's balance at a point of the log, from its statement index: the
/// balance after its last movement at or before the point, and that movement's seq
/// (null before its first).
async fn balance_at(app: &Shared, id: &str, account: &Account, point: AsOf) -> Response {
    if account.is_system() {
        return app.fail(Problem::invalid(
            "a balance at a point of the log is of a user account; a system account keeps \
             no statement",
        ));
    }
    let at = match app.store.balance_at(account, point).await {
        Ok(Some(at)) => at,
        Ok(None) => {
            return app.fail(Problem::not_found(
                "account_not_found",
                "The account does not exist.",
            ));
        }
        Err(e) => {
            eprintln!("ledger error: {e}");
            return app.fail(Problem::unavailable());
        }
    };
    let mut body = json!({
        "account": id,
        "currency": at.currency.as_str(),
        "balance": json::wide_unsigned(at.balance),
        "movement_seq": at.movement,
    });
    if let Some(seq) = point.seq {
        body["as_of_seq"] = json!(seq);
    }
    if let Some(t) = point.time {
        body["as_of"] = json!(t.to_rfc3339());
    }
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
    let (view, after, limit) = match log_page(&app, &headers, q) {
        Ok(page) => page,
        Err(p) => return app.fail(p),
    };
    // As for `GET /v1/accounts/{id}`: a name no account can have, or another tenant's,
    // is an unknown account.
    let missing = || Problem::not_found("account_not_found", "The account does not exist.");
    let Ok(Path(id)) = id else {
        return app.fail(missing());
    };
    if matches!(view, View::Tenant(_)) && Account::parse_any(&id).is_ok_and(|a| a.is_system()) {
        return app.fail(missing());
    }
    let Some(account) = named(&view, &id) else {
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
    let only = match &view {
        View::Tenant(t) => Some(t.clone()),
        View::All => None,
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
            rows.push(statement_row(&shown(&view, &fact)));
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
        "account": id,
        "currency": currency.as_str(),
        "balance": json::wide(balance),
        "facts": rows,
        "next_after": next_after,
    }))
}

/// `fact` as the caller reads it: in its tenant's names, or ledger-wide for the operator.
fn shown(view: &View, fact: &ledger::Fact) -> ledger::Fact {
    match view {
        View::Tenant(_) => fact.seen_by_owner(),
        View::All => fact.clone(),
    }
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
    let client = match app.key_reader(&headers) {
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
                .map(|k| feed::key_json(&k.seen_by_owner(), now, rules.retention))
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
    let client = match app.key_reader(&headers) {
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
            json_ok(&feed::key_json(
                &info.seen_by_owner(),
                rules.clock.now(),
                rules.retention,
            ))
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
fn log_page(app: &Shared, headers: &HeaderMap, q: Params) -> Result<(View, u64, usize), Problem> {
    let caller = app.reader(headers)?;
    let p = params(q, &["after", "limit"])?;
    Ok((
        caller,
        number_param(&p, "after", 0, u64::MAX)?,
        limit_param(&p)?,
    ))
}

pub(crate) async fn facts(State(app): State<Shared>, headers: HeaderMap, q: Params) -> Response {
    let (view, after, limit) = match log_page(&app, &headers, q) {
        Ok(page) => page,
        Err(p) => return app.fail(p),
    };
    // A tenant sees only its own facts; the operator (or the only tenant) sees all.
    let only = match &view {
        View::Tenant(t) => Some(t.clone()),
        View::All => None,
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
                out.push(json::fact(&shown(&view, &fact)));
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
        None => {
            let last_seq = app.store.durable_seq();
            // A consumer that cannot reach its broker leaves the worker degraded, not down:
            // it still serves every HTTP request, so a load balancer must not take it out
            // (200), while a monitor reads `status` and the reason.
            let Some(consumer) = &app.options.consumer else {
                return json_ok(&json!({"status": "ok", "last_seq": last_seq}));
            };
            match consumer.consuming() {
                Ok(()) => json_ok(&json!({
                    "status": "ok",
                    "last_seq": last_seq,
                    "amqp": {"status": "consuming"},
                })),
                Err(reason) => json_ok(&json!({
                    "status": "degraded",
                    "last_seq": last_seq,
                    "amqp": {"status": "disconnected", "reason": reason},
                })),
            }
        }
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
    if let Some(consumer) = &app.options.consumer {
        consumer.write_metrics(&mut text);
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
