//! Fixed feed data and a fixed clock (the worker's `now`), shaped like docs/FEED.md.
//! Some client strings carry escape sequences on purpose: the screens must not.

use ledger_tui::App;
use ledger_tui::app::{Data, Event};
use ledger_tui::model::{AccountsPage, FactRow, KeysPage, QuarantinePage, Snapshot};
use serde_json::{Value, json};

pub const SERVER: &str = "http://127.0.0.1:7420";
pub const NOW: &str = "2026-11-30T12:00:00.000Z";
/// A key that tries to clear the screen and recolour it.
pub const EVIL_KEY: &str = "evil\u{1b}[2J\u{9b}31m-key";

pub fn snapshot(pending: u64, done: u64, expired: u64) -> Snapshot {
    let throughput: Vec<Value> = (0..120u64)
        .map(|i| {
            json!({
                "t": 1_796_040_000 - 119 + i64::try_from(i).unwrap(),
                "applied": (i * 7) % 13 + 2,
                "replayed": (i * 3) % 5,
                "conflicts": if i.is_multiple_of(17) { 2 } else { 0 },
            })
        })
        .collect();
    serde_json::from_value(json!({
        "now": NOW,
        "last_seq": 140,
        "keys": {"pending": pending, "done": done, "expired": expired},
        "counters": {
            "applied": 100, "rejected": 20, "replayed": 50,
            "conflicts_in_flight": 3, "conflicts_reused": 2, "expired": 4,
            "rejections": {"account_not_found": 0, "withdrawal_not_found": 1,
                           "currency_mismatch": 0, "insufficient_funds": 5,
                           "refund_exceeds_withdrawal": 0}
        },
        "throughput": throughput,
        "commit": {"p50_ms": 0.8, "p99_ms": 3.1, "batch_size_avg": 12.0, "batches": 100},
        "size_on_disk_bytes": 123_456,
        "verify": {"at": "2026-11-30T11:59:00.000Z", "ok": true,
                   "summary": "checked 140 facts, 0 violations"},
        "pending": [
            {"client": "shop", "key": "ord-8831", "command": "withdraw", "account": "alice",
             "amount": 300, "currency": "RUB", "age_ms": 12_400, "lease_expired": true},
            {"client": "default", "key": "dep-77", "command": "deposit", "account": "bob",
             "amount": 5000, "currency": "RUB", "age_ms": 40, "lease_expired": false}
        ],
        "conflicts": [
            {"at": "2026-11-30T11:59:58.120Z", "client": "shop", "key": "ord-8831",
             "kind": "in_flight", "command": "withdraw", "differs": []},
            {"at": "2026-11-30T11:59:41.000Z", "client": "shop", "key": "ord-2",
             "kind": "reused", "command": "withdraw", "differs": ["amount"]},
            {"at": "2026-11-30T11:58:03.500Z", "client": "default", "key": EVIL_KEY,
             "kind": "reused", "command": "deposit", "differs": ["account", "currency"]},
            {"at": "2026-11-30T11:57:00.000Z", "client": "billing", "key": "ref-5",
             "kind": "in_flight", "command": "refund", "differs": []}
        ]
    }))
    .unwrap()
}

pub fn keys_page() -> KeysPage {
    let receipt = |key: &str, seq: u64, balance: i64| {
        json!({"key": key, "command": "withdraw", "account": "alice", "amount": 300,
               "currency": "RUB", "seq": seq, "balance": balance,
               "at": "2026-11-30T11:58:00.000Z"})
    };
    serde_json::from_value(json!({
        "keys": [
            {"client": "shop", "key": "ord-8831", "status": "pending", "command": "withdraw",
             "account": "alice", "amount": 300, "currency": "RUB",
             "since": "2026-11-30T11:59:47.600Z", "age_ms": 12_400, "lease_expired": true,
             "replays": 0, "conflicts": 1},
            {"client": "default", "key": "dep-77", "status": "pending", "command": "deposit",
             "account": "bob", "amount": 5000, "currency": "RUB",
             "since": "2026-11-30T11:59:59.960Z", "age_ms": 40, "lease_expired": false,
             "replays": 0, "conflicts": 0},
            {"client": "shop", "key": "ord-2", "status": "done", "command": "withdraw",
             "account": "alice", "amount": 300, "currency": "RUB",
             "since": "2026-11-30T11:58:00.000Z", "age_ms": 120_000, "lease_expired": false,
             "replays": 2, "conflicts": 1, "outcome": receipt("ord-2", 131, 700)},
            {"client": "default", "key": EVIL_KEY, "status": "done", "command": "deposit",
             "account": "mallory", "amount": 300, "currency": "RUB",
             "since": "2026-11-30T11:50:00.000Z", "age_ms": 600_000, "lease_expired": false,
             "replays": 0, "conflicts": 1,
             "outcome": {"key": EVIL_KEY, "seq": 120, "balance": 300}},
            {"client": "billing", "key": "ref-5", "status": "done", "command": "refund",
             "withdrawal": "ord-2", "amount": 100, "currency": "RUB",
             "since": "2026-11-30T11:56:00.000Z", "age_ms": 240_000, "lease_expired": false,
             "replays": 5, "conflicts": 1,
             "outcome": {"status": 422, "code": "refund_exceeds_withdrawal"}},
            {"client": "default", "key": "dep-1", "status": "expired", "command": "deposit",
             "account": "alice", "amount": 1000, "currency": "RUB",
             "since": "2026-11-29T10:00:00.000Z", "age_ms": 93_600_000,
             "lease_expired": false, "replays": 1, "conflicts": 0}
        ],
        "next": "cursor-6"
    }))
    .unwrap()
}

pub fn accounts() -> AccountsPage {
    serde_json::from_value(json!({
        "accounts": [
            {"account": "alice", "currency": "RUB", "balance": 700, "system": false},
            {"account": "bob", "currency": "RUB", "balance": 12_000, "system": false},
            {"account": "mallory\u{1b}]0;pwned\u{7}", "currency": "RUB", "balance": 300,
             "system": false},
            {"account": "carol", "currency": "USD", "balance": 5000, "system": false},
            {"account": "dave", "currency": "USD", "balance": 0, "system": false},
            {"account": "@world", "currency": "RUB", "balance": -15_000, "system": true},
            {"account": "@payouts", "currency": "RUB", "balance": 2000, "system": true},
            {"account": "@world", "currency": "USD", "balance": -5500, "system": true},
            {"account": "@payouts", "currency": "USD", "balance": 500, "system": true}
        ],
        "sums": {"RUB": 0, "USD": 0}
    }))
    .unwrap()
}

pub fn facts(from: u64, to: u64) -> Vec<FactRow> {
    (from..=to)
        .map(|seq| {
            let second = seq % 60;
            let at = format!("2026-11-30T11:59:{second:02}.000Z");
            let fact = match seq % 5 {
                0 => json!({"type": "WithdrawalRecorded", "command": "withdraw",
                            "account": "alice", "amount": 300, "currency": "RUB",
                            "balance_after": 700}),
                1 => json!({"type": "RejectionRecorded", "command": "withdraw",
                            "account": "dave", "amount": 900, "currency": "USD",
                            "code": "insufficient_funds"}),
                2 => json!({"type": "RefundRecorded", "command": "refund",
                            "withdrawal": "ord-2", "amount": 100, "currency": "RUB",
                            "balance_after": 800}),
                _ => json!({"type": "DepositRecorded", "command": "deposit",
                            "account": "bob", "amount": 1000, "currency": "RUB",
                            "balance_after": 12_000}),
            };
            let mut fact = fact;
            fact["seq"] = json!(seq);
            fact["at"] = json!(at);
            fact["client"] = json!(if seq.is_multiple_of(2) {
                "shop"
            } else {
                "default"
            });
            fact["key"] = json!(format!("k-{seq}"));
            fact["version"] = json!(1);
            serde_json::from_value(fact).unwrap()
        })
        .collect()
}

/// An app that has seen a few rounds of the feed: a trend, every view's data, 30 facts.
pub fn live_app(color: bool) -> App {
    let mut app = App::new(SERVER, color);
    app.handle(Event::Resize(80, 24));
    for (pending, done) in [(1, 112), (2, 115), (3, 120)] {
        app.handle(data(Data::Snapshot(Box::new(snapshot(pending, done, 4)))));
    }
    let query = app.key_query();
    app.handle(data(Data::Keys {
        query,
        page: keys_page(),
    }));
    app.handle(data(Data::Accounts(accounts())));
    app.handle(data(Data::Facts {
        facts: facts(111, 140),
        reset: true,
    }));
    app
}

/// Three quarantined messages, newest first; one payload carries a terminal escape.
pub fn quarantine() -> QuarantinePage {
    serde_json::from_value(json!({"quarantined": [
        {"id": 12, "at": "2026-11-30T11:59:50.000Z", "message_id": "m-77",
         "reason": "message_id_reused: this message id was delivered before with another payload",
         "payload": "{\"key\":\"ord-9\",\"command\":\"withdraw\"}"},
        {"id": 11, "at": "2026-11-30T11:59:20.000Z", "message_id": "m-76",
         "reason": "idempotency_key_reused: the key already holds another command; nothing changed",
         "payload": "{\"message_id\":\"m-76\",\"key\":\"ord-2\",\"command\":{\"type\":\"withdraw\"}}"},
        {"id": 10, "at": "2026-11-30T11:58:00.000Z", "message_id": null,
         "reason": "undecodable: the line is not JSON",
         "payload": "not json \u{1b}[2J\u{9b}31mred"}
    ]}))
    .unwrap()
}

pub fn data(data: Data) -> Event {
    Event::Data(data)
}
