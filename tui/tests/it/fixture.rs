//! Fixed feed data and a fixed clock (the worker's `now`), shaped like docs/FEED.md.
//! Some client strings carry escape sequences on purpose: the screens must not.

use ledger_tui::App;
use ledger_tui::app::{Data, Event};
use ledger_tui::model::{AccountsPage, FactRow, KeysPage, QuarantinePage, Snapshot, Units};
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
        "verify": {"at": "2026-11-30T11:59:00.000Z", "run": "periodic", "up_to_seq": 138,
                   "ok": true, "facts": 138, "keys_done": 130, "keys_expired": 4,
                   "accounts": 5, "currencies": 2, "violations": 0, "took_ms": 41,
                   "next_at": "2026-11-30T12:09:00.041Z",
                   "summary": "checked 138 facts, 130 keys done, 4 expired, 5 accounts in 2 currencies"},
        "started_at": "2026-11-30T08:00:00.000Z",
        "observed_scope": "ledger",
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
    // The stored answers as the worker renders them: a receipt, or problem details.
    let receipt = |key: &str, command: &str, seq: u64, balance: i64, at: &str| {
        json!({"key": key, "command": command, "account": "alice", "amount": 300,
               "currency": "RUB", "seq": seq, "balance": balance, "created_at": at,
               "outcome": "applied"})
    };
    let rejection = |key: &str, seq: u64, code: &str, title: &str| {
        json!({"key": key, "seq": seq, "created_at": "2026-11-30T11:50:00.000Z",
               "outcome": "rejected", "type": format!("urn:idem:problem:{code}"),
               "title": title, "status": 422, "code": code})
    };
    let mut mismatch = rejection(
        EVIL_KEY,
        120,
        "currency_mismatch",
        "The account holds another currency.",
    );
    mismatch["command"] = json!("deposit");
    mismatch["account"] = json!("mallory");
    mismatch["amount"] = json!(300);
    mismatch["currency"] = json!("RUB");
    mismatch["account_currency"] = json!("USD");
    mismatch["detail"] = json!("mallory holds USD, not RUB; nothing changed");
    // A field this dashboard has no words for is still shown, labelled by its name.
    mismatch["audit_note"] = json!("reviewed");
    let mut exceeds = rejection(
        "ref-5",
        125,
        "refund_exceeds_withdrawal",
        "The refunds would exceed the amount withdrawn.",
    );
    exceeds["command"] = json!("refund");
    exceeds["withdrawal"] = json!("ord-2");
    exceeds["amount"] = json!(100);
    exceeds["refundable"] = json!(50);
    serde_json::from_value(json!({
        "keys": [
            {"client": "default", "key": "dep-77", "status": "pending", "command": "deposit",
             "account": "bob", "amount": 5000, "currency": "RUB",
             "since": "2026-11-30T11:59:59.960Z", "age_ms": 40, "lease_expired": false,
             "replays": 0, "conflicts": 0},
            {"client": "shop", "key": "ord-8831", "status": "pending", "command": "withdraw",
             "account": "alice", "amount": 300, "currency": "RUB",
             "since": "2026-11-30T11:59:47.600Z", "age_ms": 12_400, "lease_expired": true,
             "replays": 0, "conflicts": 1},
            {"client": "shop", "key": "ord-2", "status": "done", "command": "withdraw",
             "account": "alice", "amount": 300, "currency": "RUB",
             "since": "2026-11-30T11:58:00.000Z", "age_ms": 120_000, "lease_expired": false,
             "expires_at": "2026-12-01T11:58:00.000Z", "replays": 2, "conflicts": 1,
             "outcome": receipt("ord-2", "withdraw", 131, 700, "2026-11-30T11:58:00.000Z")},
            {"client": "billing", "key": "ref-5", "status": "done", "command": "refund",
             "withdrawal": "ord-2", "amount": 100, "currency": "RUB",
             "since": "2026-11-30T11:56:00.000Z", "age_ms": 240_000, "lease_expired": false,
             "replays": 5, "conflicts": 1, "outcome": exceeds},
            {"client": "default", "key": EVIL_KEY, "status": "done", "command": "deposit",
             "account": "mallory", "amount": 300, "currency": "RUB",
             "since": "2026-11-30T11:50:00.000Z", "age_ms": 600_000, "lease_expired": false,
             "replays": 0, "conflicts": 1, "outcome": mismatch},
            {"client": "default", "key": "dep-1", "status": "expired", "command": "deposit",
             "account": "alice", "amount": 1000, "currency": "RUB",
             "since": "2026-11-29T10:00:00.000Z", "age_ms": 93_600_000,
             "lease_expired": false, "replays": 1, "conflicts": 0,
             "outcome": receipt("dep-1", "deposit", 3, 1000, "2026-11-29T10:00:00.000Z")}
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

/// The balances after `deposits` deposits of 10^15 minor units (the largest amount the
/// ledger takes) to alice: `@world` goes as far negative. Written as strings, as the
/// worker writes amounts that outgrow 64 bits.
pub fn accounts_after_deposits(deposits: i128) -> AccountsPage {
    let total = deposits * 1_000_000_000_000_000;
    serde_json::from_value(json!({
        "accounts": [
            {"account": "alice", "currency": "RUB", "balance": total.to_string(),
             "system": false},
            {"account": "@world", "currency": "RUB", "balance": (-total).to_string(),
             "system": true}
        ],
        "sums": {"RUB": 0}
    }))
    .unwrap()
}

/// The largest amount the ledger takes, in minor units.
const AMOUNT_MAX: u64 = 1_000_000_000_000_000;

/// A snapshot with every counter near the end of its type: u64::MAX facts and keys,
/// a latency of days, an average batch of 10^15.
pub fn extreme_snapshot() -> Snapshot {
    let throughput: Vec<Value> = (0..120u64)
        .map(|i| {
            json!({
                "t": 1_796_040_000 - 119 + i64::try_from(i).unwrap(),
                "applied": if i == 60 { u64::MAX } else { 123_456_789 + i },
                "replayed": 99_999 * i,
                "conflicts": if i.is_multiple_of(17) { AMOUNT_MAX } else { 0 },
            })
        })
        .collect();
    serde_json::from_value(json!({
        "now": NOW,
        "last_seq": u64::MAX,
        "keys": {"pending": u64::MAX, "done": u64::MAX - 1, "expired": AMOUNT_MAX},
        "counters": {
            "applied": u64::MAX, "rejected": 101_000_000_000_000_000_u64,
            "replayed": u64::MAX - 2,
            "conflicts_in_flight": 123_456_789_012_345_u64, "conflicts_reused": u64::MAX,
            "expired": AMOUNT_MAX,
            "rejections": {"insufficient_funds": u64::MAX,
                           "withdrawal_not_found": 101_000_000_000_000_000_u64}
        },
        "throughput": throughput,
        "commit": {"p50_ms": 123_456.7, "p99_ms": 1e12, "batch_size_avg": 1e15,
                   "batches": u64::MAX},
        "size_on_disk_bytes": u64::MAX,
        "verify": {"at": "2026-11-30T11:59:00.000Z", "run": "periodic",
                   "up_to_seq": u64::MAX - 1, "ok": false, "facts": u64::MAX - 1,
                   "violations": u64::MAX, "next_at": "2026-11-30T12:09:00.000Z",
                   "summary": "checked 18446744073709551614 facts, 18446744073709551615 violations"},
        "started_at": "2026-11-30T08:00:00.000Z",
        "observed_scope": "worker",
        "pending": [
            {"client": "shop", "key": "ord-max", "command": "withdraw", "account": "alice",
             "amount": u64::MAX, "currency": "RUB", "age_ms": u64::MAX,
             "lease_expired": true},
            {"client": "default", "key": "dep-big", "command": "deposit", "account": "bob",
             "amount": AMOUNT_MAX, "currency": "RUB", "age_ms": 86_400_000_u64 * 1000,
             "lease_expired": false}
        ],
        "conflicts": [
            {"at": "2026-11-30T11:59:58.120Z", "client": "shop", "key": "ord-max",
             "kind": "in_flight", "command": "withdraw", "differs": []},
            {"at": "2026-11-30T11:59:41.000Z", "client": "shop", "key": "ord-2",
             "kind": "reused", "command": "withdraw", "differs": ["amount"]}
        ]
    }))
    .unwrap()
}

/// Keys with the largest amounts a feed can carry and counters at u64::MAX.
pub fn extreme_keys_page() -> KeysPage {
    serde_json::from_value(json!({
        "keys": [
            {"client": "shop", "key": "ord-max", "status": "pending", "command": "withdraw",
             "account": "alice", "amount": u64::MAX, "currency": "RUB",
             "since": "2026-11-30T11:59:47.600Z", "age_ms": u64::MAX, "lease_expired": true,
             "replays": u64::MAX, "conflicts": u64::MAX},
            {"client": "default", "key": "dep-big", "status": "done", "command": "deposit",
             "account": "alice", "amount": AMOUNT_MAX, "currency": "RUB",
             "since": "2026-11-30T11:58:00.000Z", "age_ms": 86_400_000_u64 * 1000,
             "lease_expired": false, "replays": 101_000_000_000_000_000_u64,
             "conflicts": 0,
             "outcome": {"key": "dep-big", "command": "deposit", "account": "alice",
                         "amount": AMOUNT_MAX, "currency": "RUB", "seq": u64::MAX,
                         "balance": 101_000_000_000_000_000_u64,
                         "created_at": "2026-11-30T11:58:00.000Z", "outcome": "applied"}},
            {"client": "default", "key": "dep-1", "status": "expired", "command": "deposit",
             "account": "bob", "amount": 1, "currency": "RUB",
             "since": "2026-11-29T10:00:00.000Z", "age_ms": 93_600_000,
             "lease_expired": false, "replays": 0, "conflicts": 0}
        ],
        "next": null
    }))
    .unwrap()
}

/// `@world` 101 deposits of 10^15 down, past i64 in USD, and both ends of i128 in EUR;
/// GBP's sum is off, by as much as an i128 can be.
pub fn extreme_accounts() -> AccountsPage {
    serde_json::from_value(json!({
        "accounts": [
            {"account": "alice", "currency": "RUB", "balance": 101_000_000_000_000_000_i64,
             "system": false},
            {"account": "whale", "currency": "USD", "balance": "20000000000000000000",
             "system": false},
            {"account": "max", "currency": "EUR", "balance": i128::MAX.to_string(),
             "system": false},
            {"account": "zero", "currency": "RUB", "balance": 0, "system": false},
            {"account": "@world", "currency": "RUB", "balance": -101_000_000_000_000_000_i64,
             "system": true},
            {"account": "@world", "currency": "USD", "balance": "-20000000000000000000",
             "system": true},
            {"account": "@world", "currency": "EUR", "balance": (-i128::MAX).to_string(),
             "system": true},
            {"account": "@world", "currency": "GBP", "balance": i128::MIN.to_string(),
             "system": true}
        ],
        "sums": {"RUB": 0, "USD": 0, "EUR": 0, "GBP": i128::MIN.to_string()}
    }))
    .unwrap()
}

/// The last 30 facts of a log at u64::MAX, with the largest amounts and balances.
pub fn extreme_facts() -> Vec<FactRow> {
    facts(111, 140)
        .into_iter()
        .map(|mut fact| {
            fact.seq = u64::MAX - (140 - fact.seq);
            fact.amount = fact.amount.map(|amount| match amount {
                1000 => u64::MAX,
                _ => AMOUNT_MAX,
            });
            fact.balance_after = fact.balance_after.map(|after| match after.0 {
                12_000 => Units(i128::MAX),
                _ => Units(101_000_000_000_000_000),
            });
            fact
        })
        .collect()
}

/// [`live_app`] with every view's numbers at their extremes.
pub fn extreme_app() -> App {
    let mut app = App::new(SERVER, true);
    app.handle(Event::Resize(80, 24));
    // A quiet start, then the extremes: the trend is as large as the counts.
    app.handle(data(Data::Snapshot(Box::new(snapshot(0, 0, 0)))));
    app.handle(data(Data::Snapshot(Box::new(extreme_snapshot()))));
    let query = app.key_query();
    app.handle(data(Data::Keys {
        query,
        page: extreme_keys_page(),
    }));
    app.handle(data(Data::Accounts(extreme_accounts())));
    app.handle(data(Data::Facts {
        facts: extreme_facts(),
        reset: true,
    }));
    app
}

/// A tenant's account name at its longest: `tenant/name`, 129 bytes.
pub fn longest_account() -> String {
    format!(
        "shop/{}:wallet",
        "x".repeat(129 - "shop/".len() - ":wallet".len())
    )
}

/// Five currencies, each with its `@world` and `@payouts` (ten system accounts), and
/// tenants' account names up to the longest.
pub fn many_currencies_accounts() -> AccountsPage {
    let mut accounts = Vec::new();
    let mut sums = serde_json::Map::new();
    let users = [
        ("shop/customer-000123:wallet", "RUB", 100_000),
        ("shop/customer-000124:wallet", "USD", 2_500),
        ("billing/acme-gmbh:eur-main", "EUR", 70_000),
        ("jp/tanaka", "JPY", 500),
        ("kw/fund", "KWD", 1_000),
    ];
    for (account, currency, balance) in users {
        accounts.push(
            json!({"account": account, "currency": currency, "balance": balance,
                             "system": false}),
        );
        accounts.push(json!({"account": "@world", "currency": currency,
                             "balance": -2 * balance, "system": true}));
        accounts.push(json!({"account": "@payouts", "currency": currency,
                             "balance": balance, "system": true}));
        sums.insert(currency.to_string(), json!(0));
    }
    accounts.push(
        json!({"account": longest_account(), "currency": "RUB", "balance": 0,
                         "system": false}),
    );
    serde_json::from_value(json!({"accounts": accounts, "sums": sums})).unwrap()
}

/// The key of a payout withdrawal with a long name, and its account's.
pub const PAYOUT_KEY: &str = "payout-2026-12-07-customer-000123";
pub const PAYOUT_ACCOUNT: &str = "shop/customer-000123:wallet";

/// Facts with long keys and accounts: a payout withdrawal, a refund of it that was
/// rejected (its fact names the withdrawal, not the currency), and a rejected refund of a
/// withdrawal the dashboard has never seen.
pub fn long_name_facts() -> Vec<FactRow> {
    let facts = [
        json!({"seq": 141, "type": "WithdrawalRecorded", "key": PAYOUT_KEY,
               "command": "withdraw", "account": PAYOUT_ACCOUNT, "amount": 100_000,
               "currency": "RUB", "balance_after": 0}),
        json!({"seq": 142, "type": "CommandRejected", "key": "refund-2026-12-08-customer-000123",
               "command": "refund", "withdrawal": PAYOUT_KEY, "amount": 100_000,
               "rejection": "refund_exceeds_withdrawal", "refundable": 50_000}),
        json!({"seq": 143, "type": "CommandRejected", "key": "refund-of-a-stranger",
               "command": "refund", "withdrawal": "wd-never-seen", "amount": 100_000,
               "rejection": "withdrawal_not_found"}),
    ];
    facts
        .into_iter()
        .map(|mut fact| {
            fact["at"] = json!("2026-11-30T11:59:59.000Z");
            fact["client"] = json!("shop");
            fact["version"] = json!(1);
            serde_json::from_value(fact).unwrap()
        })
        .collect()
}

/// A keys page of long names: the payout, a rejected refund of it whose row carries no
/// currency, and a deposit to the longest account name.
pub fn long_name_keys() -> KeysPage {
    serde_json::from_value(json!({
        "keys": [
            {"client": "shop", "key": "refund-2026-12-08-customer-000123", "status": "done",
             "command": "refund", "withdrawal": PAYOUT_KEY, "amount": 100_000,
             "since": "2026-11-30T11:59:59.000Z", "age_ms": 1_000, "replays": 0,
             "conflicts": 0,
             "outcome": {"outcome": "rejected", "code": "refund_exceeds_withdrawal"}},
            {"client": "shop", "key": PAYOUT_KEY, "status": "done", "command": "withdraw",
             "account": PAYOUT_ACCOUNT, "amount": 100_000, "currency": "RUB",
             "since": "2026-11-30T11:59:58.000Z", "age_ms": 2_000, "replays": 0,
             "conflicts": 0, "outcome": {"outcome": "applied"}},
            {"client": "tenant-with-a-long-client-name", "key": "dep-1", "status": "done",
             "command": "deposit", "account": longest_account(), "amount": 300,
             "currency": "RUB", "since": "2026-11-30T11:59:00.000Z", "age_ms": 60_000,
             "replays": 0, "conflicts": 0, "outcome": {"outcome": "applied"}}
        ],
        "next": null
    }))
    .unwrap()
}

/// A client name at its longest: 64 bytes.
pub fn longest_client() -> String {
    format!(
        "tenant-{}-eu",
        "c".repeat(64 - "tenant-".len() - "-eu".len())
    )
}

/// An idempotency key at its longest: 255 bytes of visible ASCII.
pub fn longest_key() -> String {
    format!(
        "payout-2026-12-07-{}-000123",
        "k".repeat(255 - "payout-2026-12-07-".len() - "-000123".len())
    )
}

/// A message id as long as a broker may make one.
pub const LONG_MESSAGE_ID: &str =
    "amq.ctag-2f0c9a77-1b2e-4c1d-9f3e-7a8b6c5d4e3f.delivery-000000042";

/// A reason whose code runs long, and the code as the quarantine table shows it.
pub const LONG_REASON: &str = "account_currency_mismatch_for_the_tenant_account_named: \
    the account holds USD and the command is in RUB; nothing changed";
pub const LONG_REASON_CODE: &str = "account_currency_mismatch_for_the_tenant_account_named";

/// [`snapshot`] whose conflicts carry the longest names: a 255-byte key under a 64-byte
/// client whose command differs in three fields, beside short ones.
pub fn long_name_snapshot() -> Snapshot {
    let mut snapshot = snapshot(3, 120, 4);
    snapshot.conflicts = serde_json::from_value(json!([
        {"at": "2026-11-30T11:59:58.120Z", "client": longest_client(), "key": longest_key(),
         "kind": "reused", "command": "withdraw",
         "differs": ["account", "amount", "currency"]},
        {"at": "2026-11-30T11:59:41.000Z", "client": "shop", "key": "ord-2",
         "kind": "in_flight", "command": "withdraw", "differs": []}
    ]))
    .unwrap();
    snapshot
}

/// The payload of a quarantined message that names the longest client, key and account.
pub fn long_payload() -> String {
    json!({"message_id": LONG_MESSAGE_ID, "client": longest_client(), "key": longest_key(),
           "command": {"type": "deposit", "account": longest_account(), "amount": 100,
                       "currency": "RUB"}})
    .to_string()
}

/// Quarantined messages with a long id, a long reason and a long payload, and a short one.
pub fn long_name_quarantine() -> QuarantinePage {
    serde_json::from_value(json!({"quarantined": [
        {"id": 21, "at": "2026-11-30T11:59:55.000Z", "message_id": LONG_MESSAGE_ID,
         "reason": LONG_REASON, "payload": long_payload()},
        {"id": 20, "at": "2026-11-30T11:59:20.000Z", "message_id": "m-76",
         "reason": "undecodable: the line is not JSON", "payload": "not json"}
    ]}))
    .unwrap()
}

/// A keys page of 200 applied deposits, `key-001` newest, and more after it: more rows
/// than any terminal shows.
pub fn full_keys_page() -> KeysPage {
    let keys: Vec<Value> = (1..=200u64)
        .map(|i| {
            json!({"client": "shop", "key": format!("key-{i:03}"), "status": "done",
                   "command": "deposit", "account": "alice", "amount": 100 * i,
                   "currency": "RUB", "since": "2026-11-30T11:59:00.000Z",
                   "age_ms": 1_000 * i, "replays": 0, "conflicts": 0,
                   "outcome": {"outcome": "applied"}})
        })
        .collect();
    serde_json::from_value(json!({"keys": keys, "next": "cursor-200"})).unwrap()
}

/// [`snapshot`] with 50 conflicts listed, `cf-01` newest, the two kinds in turn: more
/// than the view has rows for.
pub fn many_conflicts_snapshot() -> Snapshot {
    let mut snapshot = snapshot(3, 120, 4);
    let conflicts: Vec<Value> = (1..=50u32)
        .map(|i| {
            json!({"at": format!("2026-11-30T11:59:{:02}.000Z", 59 - i), "client": "shop",
                   "key": format!("cf-{i:02}"),
                   "kind": if i % 2 == 1 { "in_flight" } else { "reused" },
                   "command": "withdraw",
                   "differs": if i % 2 == 1 { json!([]) } else { json!(["amount"]) }})
        })
        .collect();
    snapshot.conflicts = serde_json::from_value(Value::Array(conflicts)).unwrap();
    snapshot.counters.conflicts_in_flight = 25;
    snapshot.counters.conflicts_reused = 25;
    snapshot
}

/// The newest 20 quarantined messages, `mq-01` newest: more than half a view holds.
pub fn full_quarantine() -> QuarantinePage {
    let quarantined: Vec<Value> = (1..=20u64)
        .map(|i| {
            json!({"id": 100 - i, "at": format!("2026-11-30T11:58:{:02}.000Z", 59 - i),
                   "message_id": format!("mq-{i:02}"),
                   "reason": "undecodable: the line is not JSON", "payload": "not json"})
        })
        .collect();
    serde_json::from_value(json!({ "quarantined": quarantined })).unwrap()
}
