//! The operator feed of docs/FEED.md: snapshot, paged key lists and an SSE stream, plus
//! the tasks that keep them fresh (throughput sampler, fact follower) and the snapshot's
//! record of the verifies the server runs. The feed only reads: it never moves money.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use ledger::json;
use ledger::{
    ClientId, Command, Key, KeyInfo, KeyQuery, KeyStatus, LedgerError, Outcome, Timestamp,
    VerifyReport,
};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

use super::metrics::commit_summary;
use super::problem::{Params, Problem, json_ok, limit_param, no_params, number_param, params};
pub use super::state::FeedEvent;
use super::state::Shared;

fn now_rfc3339() -> String {
    Timestamp(chrono::Utc::now().timestamp_millis()).to_rfc3339()
}

/// Records a conflict for the snapshot and the stream.
pub(crate) fn conflict(
    app: &Shared,
    client: &ClientId,
    key: &Key,
    kind: &'static str,
    command: &Command,
    differs: &[&'static str],
) {
    let entry = json!({
        "at": now_rfc3339(),
        "client": client.as_str(),
        "key": key.as_str(),
        "kind": kind,
        "command": command.name(),
        "differs": differs,
    });
    let _ = app.events.send(FeedEvent {
        name: "conflict",
        data: entry.to_string(),
    });
    app.metrics.conflict(entry);
}

/// A key as the API and the feed show it. `retention` is how long the worker keeps a done
/// key's answer: `expires_at` is until when, from the key's fact (null while pending).
pub fn key_json(info: &KeyInfo, now: Timestamp, retention: Duration) -> Value {
    let mut map = serde_json::Map::new();
    json::command_fields(&info.command, &mut map);
    map.insert("client".into(), json!(info.client.as_str()));
    map.insert("key".into(), json!(info.key.as_str()));
    map.insert("status".into(), json!(info.status.as_str()));
    map.insert("since".into(), json!(info.since.to_rfc3339()));
    let expires_at = match info.status {
        KeyStatus::Pending => Value::Null,
        KeyStatus::Done | KeyStatus::Expired => json!(expires_at(info.since, retention)),
    };
    map.insert("expires_at".into(), expires_at);
    map.insert(
        "age_ms".into(),
        json!(now.millis().saturating_sub(info.since.millis()).max(0)),
    );
    map.insert("lease_expired".into(), json!(info.lease_expired));
    map.insert("replays".into(), json!(info.replays));
    map.insert("conflicts".into(), json!(info.conflicts));
    map.insert(
        "outcome".into(),
        info.outcome.as_ref().map_or(Value::Null, json::outcome),
    );
    Value::Object(map)
}

/// Until when the answer of a key done at `done` is kept, in RFC 3339 UTC: the worker's
/// retention after the key's fact. A retry after that is still answered from the fact
/// (docs/contract.md, guarantee 10); this is the time the worker promises.
pub(crate) fn expires_at(done: Timestamp, retention: Duration) -> String {
    let ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    done.saturating_add_ms(ms).to_rfc3339()
}

/// A refund names its withdrawal, not a currency, yet the operator's screens show money in
/// its currency: a refund's row gets the withdrawal's, from the receipt once applied, else
/// from the withdrawal's key, and none when no withdrawal has that key.
async fn with_currency(app: &Shared, info: &KeyInfo, mut row: Value) -> Value {
    let Command::Refund { withdrawal, .. } = &info.command else {
        return row;
    };
    let currency = match &info.outcome {
        Some(Outcome::Applied(receipt)) => Some(receipt.currency),
        _ => match app.store.key(&info.client, withdrawal).await {
            Ok(Some(KeyInfo {
                command: Command::Withdraw { currency, .. },
                ..
            })) => Some(currency),
            _ => None,
        },
    };
    if let (Some(currency), Value::Object(map)) = (currency, &mut row) {
        map.insert("currency".into(), json!(currency.as_str()));
    }
    row
}

// ---- background tasks ---------------------------------------------------------------------

/// Starts the feed's own tasks, the throughput sampler and the fact follower; each ends
/// when the server stops.
pub(crate) fn spawn_feed(app: Shared) -> Vec<JoinHandle<()>> {
    vec![
        tokio::spawn(sampler(app.clone())),
        tokio::spawn(follower(app)),
    ]
}

/// Sleeps for `d`; false once the server is stopping.
async fn tick(app: &Shared, d: Duration) -> bool {
    let mut stop = app.stop.clone();
    if *stop.borrow() {
        return false;
    }
    tokio::select! {
        () = tokio::time::sleep(d) => !*stop.borrow(),
        _ = stop.changed() => false,
    }
}

/// One verify the server ran, for the snapshot's `verify`.
#[derive(Debug)]
pub(crate) struct VerifyRun {
    /// When it began.
    pub at: Timestamp,
    /// What started it: `start` or `periodic`.
    pub run: &'static str,
    /// The last seq it covers: the log as it stood when it began (facts committed
    /// meanwhile may be checked too).
    pub up_to_seq: u64,
    pub took: Duration,
    pub report: Result<VerifyReport, LedgerError>,
}

/// Records a verify's result for the snapshot, with when the next one is due.
pub(crate) fn verified(app: &Shared, run: VerifyRun) {
    let took_ms = u64::try_from(run.took.as_millis()).unwrap_or(u64::MAX);
    let every_ms = i64::try_from(app.options.verify_every.as_millis()).unwrap_or(i64::MAX);
    let next_at = Timestamp(chrono::Utc::now().timestamp_millis()).saturating_add_ms(every_ms);
    let mut entry = json!({
        "at": run.at.to_rfc3339(),
        "run": run.run,
        "up_to_seq": run.up_to_seq,
        "took_ms": took_ms,
        "next_at": next_at.to_rfc3339(),
    });
    let fields = match run.report {
        Ok(report) => {
            let summary = report.to_string();
            json!({
                "ok": report.ok(),
                "summary": summary.lines().next().unwrap_or(""),
                "facts": report.facts,
                "keys_done": report.keys_done,
                "keys_expired": report.keys_expired,
                "accounts": report.accounts,
                "currencies": report.currencies,
                "violations": report.violations.len(),
            })
        }
        Err(e) => json!({"ok": false, "summary": format!("verify could not run: {e}")}),
    };
    if let (Value::Object(entry), Value::Object(fields)) = (&mut entry, fields) {
        entry.extend(fields);
    }
    *app.metrics.verify.lock() = Some(entry);
}

async fn sampler(app: Shared) {
    async fn counts(app: &Shared) -> (u64, u64, u64) {
        let s = app.store.stats().await.unwrap_or_default();
        (
            s.applied_total() + s.rejected_total(),
            s.observed.replayed,
            s.observed.conflicts_in_flight + s.observed.conflicts_reused,
        )
    }
    let mut last = counts(&app).await;
    while tick(&app, Duration::from_secs(1)).await {
        let now = counts(&app).await;
        app.metrics.push_throughput(json!({
            "t": chrono::Utc::now().timestamp(),
            "applied": now.0.saturating_sub(last.0),
            "replayed": now.1.saturating_sub(last.1),
            "conflicts": now.2.saturating_sub(last.2),
        }));
        last = now;
    }
}

/// Follows the log and publishes each new fact (and its key becoming done) to the stream.
async fn follower(app: Shared) {
    let mut after = app.store.durable_seq();
    while tick(&app, Duration::from_millis(50)).await {
        if app.events.receiver_count() == 0 {
            after = app.store.durable_seq();
            continue;
        }
        while let Ok(facts) = app.store.facts(after, 1000).await {
            let Some(last) = facts.last() else { break };
            after = last.seq;
            for fact in &facts {
                let _ = app.events.send(FeedEvent {
                    name: "fact",
                    data: json::fact(fact).to_string(),
                });
                let _ = app.events.send(FeedEvent {
                    name: "key",
                    data: json!({"client": fact.client.as_str(), "key": fact.key.as_str(), "status": "done"})
                        .to_string(),
                });
            }
        }
    }
}

// ---- endpoints ----------------------------------------------------------------------------

pub(crate) async fn snapshot(State(app): State<Shared>, headers: HeaderMap, q: Params) -> Response {
    if let Err(p) = app.operator(&headers).and_then(|()| no_params(q)) {
        return app.fail(p);
    }
    let ledger = &*app.store;
    let stats = match ledger.stats().await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ledger error: {e}");
            return app.fail(Problem::unavailable());
        }
    };
    let now = ledger.rules().clock.now();
    let pending = ledger.pending();
    let rejections: serde_json::Map<String, Value> = stats
        .rejected_by_code()
        .into_iter()
        .map(|(r, n)| (r.code().to_owned(), json!(n)))
        .collect();
    let pending_rows: Vec<Value> = pending
        .iter()
        .take(50)
        .map(|k| {
            let mut v = key_json(k, now, ledger.rules().retention);
            if let Value::Object(m) = &mut v {
                for drop in [
                    "status",
                    "since",
                    "replays",
                    "conflicts",
                    "outcome",
                    "expires_at",
                ] {
                    m.remove(drop);
                }
            }
            v
        })
        .collect();
    let body = json!({
        "now": now.to_rfc3339(),
        "last_seq": ledger.durable_seq(),
        "keys": {"pending": pending.len(), "done": stats.keys_done, "expired": stats.keys_expired},
        "counters": {
            "applied": stats.applied_total(),
            "rejected": stats.rejected_total(),
            "replayed": stats.observed.replayed,
            "conflicts_in_flight": stats.observed.conflicts_in_flight,
            "conflicts_reused": stats.observed.conflicts_reused,
            "expired": stats.keys_expired,
            "rejections": rejections,
        },
        "throughput": app.metrics.throughput(),
        "commit": commit_summary(ledger),
        "size_on_disk_bytes": ledger.size_on_disk().await.ok(),
        "verify": app.metrics.verify.lock().clone(),
        "pending": pending_rows,
        "conflicts": app.metrics.conflicts(),
        "started_at": app.metrics.started_at.to_rfc3339(),
        "observed_scope": observed_scope(ledger.kind()),
        "index_rebuilt": ledger.commit_metrics().index_rebuilt,
    });
    json_ok(&body)
}

/// Whose replays and conflicts the snapshot's counters count. The sled store keeps them
/// in the ledger (written with the next batch, best-effort), so they run on across
/// restarts; a PostgreSQL worker counts its own, in memory, from its start. The
/// dashboard says which, so that a count that fell back to 0 reads as a restart.
fn observed_scope(store: &str) -> &'static str {
    match store {
        "sled" => "ledger",
        _ => "worker",
    }
}

/// Cursors are opaque to clients: hex of `client NUL key`, so any key survives a URL.
fn encode_cursor(client: &ClientId, key: &Key) -> String {
    let mut out = String::new();
    for b in client
        .as_str()
        .bytes()
        .chain([0])
        .chain(key.as_str().bytes())
    {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The (client, key) of a cursor `encode_cursor` wrote, and only of one: lowercase hex
/// (`from_str_radix` alone would also take capitals and a `+`), so one position has one
/// spelling, the one docs/openapi.json describes.
fn decode_cursor(s: &str) -> Option<(ClientId, Key)> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    let bytes = bytes?;
    let nul = bytes.iter().position(|b| *b == 0)?;
    let client = ClientId::parse(std::str::from_utf8(&bytes[..nul]).ok()?).ok()?;
    let key = Key::parse(std::str::from_utf8(&bytes[nul + 1..]).ok()?).ok()?;
    Some((client, key))
}

/// The query of a paged operator endpoint and its `limit` (100 unless given, at most
/// 1,000), or the problem to answer: the caller is not the operator, or the query is bad.
fn operator_page(
    app: &Shared,
    headers: &HeaderMap,
    q: Params,
    allowed: &[&str],
) -> Result<(HashMap<String, String>, usize), Problem> {
    app.operator(headers)?;
    let p = params(q, allowed)?;
    let limit = limit_param(&p)?;
    Ok((p, limit))
}

pub(crate) async fn live_keys(
    State(app): State<Shared>,
    headers: HeaderMap,
    q: Params,
) -> Response {
    let (p, limit) = match operator_page(
        &app,
        &headers,
        q,
        &["status", "client", "after", "q", "limit", "order"],
    ) {
        Ok(page) => page,
        Err(p) => return app.fail(p),
    };
    let status = match p.get("status").map(|s| KeyStatus::parse(s)) {
        None => None,
        Some(Some(s)) => Some(s),
        Some(None) => return app.fail(Problem::invalid("status must be pending, done or expired")),
    };
    let client = match p.get("client").map(|c| ClientId::parse(c)) {
        None => None,
        Some(Ok(c)) => Some(c),
        Some(Err(_)) => return app.fail(Problem::invalid("client is not a client name")),
    };
    let by_time = match p.get("order").map(String::as_str) {
        None | Some("key") => false,
        Some("newest") => true,
        Some(_) => return app.fail(Problem::invalid("order must be key or newest")),
    };
    // `order` chooses the listing of a first page; a cursor from `next` goes on with the
    // listing it came from (the two kinds cannot be mistaken for each other), so no
    // well-formed request is refused for a combination.
    let (before, mut after) = match p.get("after") {
        None => (None, None),
        Some(a) => match (decode_seq_cursor(a), decode_cursor(a)) {
            (Some(seq), _) => (Some(seq), None),
            (None, Some(at)) => (None, Some(at)),
            (None, None) => {
                return app.fail(Problem::invalid("after must be a cursor from `next`"));
            }
        },
    };
    let q = p.get("q").cloned().filter(|q| !q.is_empty());
    if before.is_some() || (by_time && after.is_none()) {
        let filter = KeyFilter {
            status,
            client,
            text: q,
        };
        return match newest_keys(&app, &filter, before, limit).await {
            Ok(page) => json_ok(&page),
            Err(p) => app.fail(p),
        };
    }
    let now = app.store.rules().clock.now();
    let retention = app.store.rules().retention;
    let mut rows = Vec::new();
    let mut next = None;
    // With a text filter, ledger pages are read until the answer is full, at most this
    // many; the cursor then says where the next request goes on.
    for _ in 0..20 {
        let page = app
            .store
            .keys(KeyQuery {
                status,
                client: client.clone(),
                after: after.clone(),
                limit,
            })
            .await;
        let page = match page {
            Ok(p) => p,
            Err(e) => {
                eprintln!("ledger error: {e}");
                return app.fail(Problem::unavailable());
            }
        };
        let mut stopped_at = None;
        for k in &page.keys {
            let hit = q.as_ref().is_none_or(|q| {
                k.client.as_str().contains(q.as_str()) || k.key.as_str().contains(q.as_str())
            });
            if hit {
                rows.push(with_currency(&app, k, key_json(k, now, retention)).await);
                if rows.len() == limit {
                    stopped_at = Some((k.client.clone(), k.key.clone()));
                    break;
                }
            }
        }
        after = match stopped_at {
            // The answer filled up inside this page: go on right after its last row,
            // unless that row was also the listing's last.
            Some(at) => {
                let ended_here = page.next.is_none()
                    && page
                        .keys
                        .last()
                        .is_some_and(|l| l.client == at.0 && l.key == at.1);
                (!ended_here).then_some(at)
            }
            // The whole page was read: go on where the ledger's page ended (None: the end).
            None => page.next.clone(),
        };
        next = after.as_ref().map(|(c, k)| encode_cursor(c, k));
        if rows.len() >= limit || after.is_none() {
            break;
        }
    }
    json_ok(&json!({"keys": rows, "next": next}))
}

/// What a listing of keys keeps: a status, a client, text in the client or the key.
struct KeyFilter {
    status: Option<KeyStatus>,
    client: Option<ClientId>,
    text: Option<String>,
}

impl KeyFilter {
    fn names(&self, client: &ClientId, key: &Key) -> bool {
        self.client.as_ref().is_none_or(|c| c == client)
            && self.text.as_ref().is_none_or(|q| {
                client.as_str().contains(q.as_str()) || key.as_str().contains(q.as_str())
            })
    }
}

/// A cursor of the newest-first listing: the seq the next page stays below, as `n<seq>`,
/// which no cursor of the listing by key can be (those are hex).
fn encode_seq_cursor(below: u64) -> String {
    format!("n{below}")
}

fn decode_seq_cursor(s: &str) -> Option<u64> {
    s.strip_prefix('n')?.parse().ok()
}

/// `order=newest`: keys by time, newest first. This worker's pending keys come first on
/// the first page (newest claim first, at most a page of them), then the done and expired
/// keys in the reverse order of their facts: a key's fact holds its time, so the log read
/// backwards is the listing, and each row reads its key for the status, the stored answer
/// and the counts. A filter reads at most 20 pages' worth of facts per request; `next`
/// then says where the next request goes on.
async fn newest_keys(
    app: &Shared,
    filter: &KeyFilter,
    before: Option<u64>,
    limit: usize,
) -> Result<Value, Problem> {
    let unavailable = |e: ledger::LedgerError| {
        eprintln!("ledger error: {e}");
        Problem::unavailable()
    };
    let now = app.store.rules().clock.now();
    let retention = app.store.rules().retention;
    let mut rows = Vec::new();
    if before.is_none() && matches!(filter.status, None | Some(KeyStatus::Pending)) {
        for info in app.store.pending().iter().rev() {
            if rows.len() == limit {
                break;
            }
            if filter.names(&info.client, &info.key) {
                rows.push(with_currency(app, info, key_json(info, now, retention)).await);
            }
        }
    }
    if filter.status == Some(KeyStatus::Pending) {
        return Ok(json!({"keys": rows, "next": null}));
    }
    // Facts below `below` are still to be read.
    let mut below = before
        .unwrap_or(u64::MAX)
        .min(app.store.durable_seq().saturating_add(1));
    let window = u64::try_from(limit).unwrap_or(u64::MAX);
    for _ in 0..20 {
        if rows.len() >= limit || below <= 1 {
            break;
        }
        let after = below.saturating_sub(window.saturating_add(1));
        let count = usize::try_from(below - 1 - after).unwrap_or(usize::MAX);
        // On PostgreSQL the log has gaps, so a window may hold facts at `below` or past it.
        let facts = app.store.facts(after, count).await.map_err(unavailable)?;
        let top = below;
        for fact in facts.iter().rev().filter(|f| f.seq < top) {
            if rows.len() >= limit {
                break;
            }
            if !filter.names(&fact.client, &fact.key) {
                below = fact.seq;
                continue;
            }
            let info = app
                .store
                .key(&fact.client, &fact.key)
                .await
                .map_err(unavailable)?;
            if let Some(info) = info
                && filter.status.is_none_or(|s| s == info.status)
            {
                rows.push(with_currency(app, &info, key_json(&info, now, retention)).await);
            }
            below = fact.seq;
        }
        if rows.len() < limit {
            below = after + 1;
        }
    }
    let next = (below > 1).then(|| encode_seq_cursor(below));
    Ok(json!({"keys": rows, "next": next}))
}

/// `GET /v1/live/quarantine?after=ID&limit=N`: the messages the inbox kept instead of
/// applying (a reused message id, a reused key, an undecodable line), oldest first, with
/// the reason and the payload as received. Paged by id: `next` is the `after` of the next
/// page, null on a page that is not full. `order=newest` lists the newest `limit` (above
/// `after`, when given) instead, newest first, in one answer: what an operator looks at.
pub(crate) async fn quarantine(
    State(app): State<Shared>,
    headers: HeaderMap,
    q: Params,
) -> Response {
    let (p, limit) = match operator_page(&app, &headers, q, &["after", "order", "limit"]) {
        Ok(page) => page,
        Err(p) => return app.fail(p),
    };
    let after = match number_param(&p, "after", 0, u64::MAX) {
        Ok(n) => n,
        Err(p) => return app.fail(p),
    };
    let newest = match p.get("order").map(String::as_str) {
        None | Some("oldest") => false,
        Some("newest") => true,
        Some(_) => return app.fail(Problem::invalid("order must be oldest or newest")),
    };
    // `after` bounds the ids in either order. The newest `limit` above it are the newest
    // `limit` of all, less those not above it: had one of those been left out for an
    // older one above it, it would not be among the newest.
    let kept = if newest {
        app.store
            .quarantined_newest(limit)
            .await
            .map(|kept| kept.into_iter().filter(|q| q.id > after).collect())
    } else {
        app.store.quarantined(after, limit).await
    };
    let kept = match kept {
        Ok(k) => k,
        Err(e) => {
            eprintln!("ledger error: {e}");
            return app.fail(Problem::unavailable());
        }
    };
    // Only the oldest-first listing pages; the newest are one answer.
    let next = (!newest && kept.len() == limit)
        .then(|| kept.last().map(|q| q.id))
        .flatten();
    let rows: Vec<Value> = kept
        .iter()
        .map(|q| {
            json!({
                "id": q.id,
                "at": q.at.to_rfc3339(),
                "message_id": q.message_id,
                "reason": q.reason,
                "payload": q.payload,
            })
        })
        .collect();
    json_ok(&json!({"quarantined": rows, "next": next}))
}

pub(crate) async fn live_key(
    State(app): State<Shared>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    q: Params,
) -> Response {
    if let Err(p) = app.operator(&headers).and_then(|()| no_params(q)) {
        return app.fail(p);
    }
    let missing = || Problem::not_found("key_not_found", "No such key.");
    let Some((client, key)) = path
        .ok()
        .and_then(|Path((c, k))| Some((ClientId::parse(&c).ok()?, Key::parse(&k).ok()?)))
    else {
        return app.fail(missing());
    };
    let info = match app.store.key(&client, &key).await {
        Ok(Some(i)) => i,
        Ok(None) => return app.fail(missing()),
        Err(e) => {
            eprintln!("ledger error: {e}");
            return app.fail(Problem::unavailable());
        }
    };
    let rules = app.store.rules();
    let mut v = with_currency(
        &app,
        &info,
        key_json(&info, rules.clock.now(), rules.retention),
    )
    .await;
    if let Some(o) = &info.outcome
        && let Ok(Some(fact)) = app.store.fact(o.seq()).await
    {
        v["fact"] = json::fact(&fact);
    }
    json_ok(&v)
}

pub(crate) async fn stream(State(app): State<Shared>, headers: HeaderMap, q: Params) -> Response {
    if let Err(p) = app.operator(&headers).and_then(|()| no_params(q)) {
        return app.fail(p);
    }
    let rx = app.events.subscribe();
    let stop = app.stop.clone();
    let events = futures_util::stream::unfold((rx, stop), |(mut rx, mut stop)| async move {
        if *stop.borrow() {
            return None;
        }
        let event = tokio::select! {
            r = rx.recv() => match r {
                Ok(e) => Event::default().event(e.name).data(e.data),
                Err(RecvError::Lagged(n)) => Event::default()
                    .event("lagged")
                    .data(json!({"missed": n}).to_string()),
                Err(RecvError::Closed) => return None,
            },
            _ = stop.changed() => return None,
        };
        Some((Ok::<_, Infallible>(event), (rx, stop)))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cursors_round_trip() {
        let c = ClientId::parse("shop").unwrap();
        let k = Key::parse("ord/1?&#").unwrap();
        assert_eq!(decode_cursor(&encode_cursor(&c, &k)), Some((c, k)));
        assert_eq!(decode_cursor("zz"), None);
    }
}
