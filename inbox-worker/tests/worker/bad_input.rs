//! The bad-input catalogue, one table. Every row is a request with its expected
//! status and problem `code`, run through `check`, which also proves what the row did to
//! the books: a refused request changes nothing and leaves its key unused; a business
//! rejection stores exactly one outcome, replayed byte-identical on retry.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::raw::{RawClient, RawReply, request};
use crate::support::{Http, Worker, eventually, scratch};

const D: &str = "/v1/deposits";
const W: &str = "/v1/withdrawals";
const R: &str = "/v1/refunds";

/// What a row may do to the ledger.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Effect {
    /// Refused before the ledger: facts, accounts and the key are untouched, and the
    /// key is free for a first execution afterwards.
    Refused,
    /// A business rejection: one rejected fact, balances untouched, the outcome stored
    /// under the key and replayed on retry.
    Stored,
}

struct Row {
    name: &'static str,
    method: &'static str,
    path: String,
    /// Raw header bytes, the `Idempotency-Key` included when the row has one.
    headers: Vec<(&'static str, Vec<u8>)>,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
    effect: Effect,
    /// The key, when it is a valid one whose record we can look up and reuse.
    key: Option<String>,
    /// A distinctive piece of the input that the answer must not quote.
    marker: Option<&'static str>,
}

/// A POST with a valid key `bad-<name>` and `body`.
fn post(name: &'static str, path: &str, body: &str, status: u16, code: &'static str) -> Row {
    let key = format!("bad-{name}");
    Row {
        name,
        method: "POST",
        path: path.to_owned(),
        headers: vec![
            ("Idempotency-Key", key.clone().into_bytes()),
            ("Content-Type", b"application/json".to_vec()),
        ],
        body: body.as_bytes().to_vec(),
        status,
        code,
        effect: if status == 422 {
            Effect::Stored
        } else {
            Effect::Refused
        },
        key: Some(key),
        marker: None,
    }
}

fn invalid(name: &'static str, body: &str) -> Row {
    post(name, D, body, 400, "invalid_request")
}

/// A deposit body with `field` replaced by the raw JSON `value`.
fn dep_with(field: &str, value: &str) -> String {
    let mut m = [
        ("account", "\"alice\""),
        ("amount", "1"),
        ("currency", "\"RUB\""),
    ];
    for (f, v) in &mut m {
        if *f == field {
            *v = value;
        }
    }
    format!(
        r#"{{"account":{},"amount":{},"currency":{}}}"#,
        m[0].1, m[1].1, m[2].1
    )
}

/// A deposit with a valid body and the raw key header bytes `key` (or none).
fn key_row(name: &'static str, key: Option<&[u8]>, code: &'static str) -> Row {
    let mut r = invalid(name, &dep_with("amount", "1"));
    r.headers.retain(|(n, _)| *n != "Idempotency-Key");
    if let Some(k) = key {
        r.headers.push(("Idempotency-Key", k.to_vec()));
    }
    r.key = None;
    r.code = code;
    r
}

fn get(name: &'static str, path: &str, status: u16, code: &'static str) -> Row {
    Row {
        name,
        method: "GET",
        path: path.to_owned(),
        headers: vec![],
        body: vec![],
        status,
        code,
        effect: Effect::Refused,
        key: None,
        marker: None,
    }
}

impl Row {
    fn marker(mut self, m: &'static str) -> Row {
        self.marker = Some(m);
        self
    }
    fn method(mut self, m: &'static str) -> Row {
        self.method = m;
        self
    }
}

fn rows() -> Vec<Row> {
    let long_acct = format!("\"{}\"", "a".repeat(65));
    let huge = format!(
        r#"{{"account":"alice","amount":1,"currency":"RUB","pad":"{}"}}"#,
        "x".repeat(64 * 1024 + 1)
    );
    let long_key = vec![b'k'; 256];
    vec![
        // bodies
        invalid("malformed", "{account: alice}"),
        invalid("truncated", r#"{"account":"alice","amount":1,"curr"#),
        invalid("empty-body", ""),
        // Regression: serde's derived structs take a JSON array of the fields in order, and
        // this body was once applied as a deposit.
        invalid("json-array", r#"["alice",1,"RUB"]"#),
        post("oversized", D, &huge, 413, "payload_too_large"),
        invalid("json-array-empty", "[]"),
        invalid("json-array-short", r#"["alice",1]"#),
        invalid("json-string", r#""zqxstring""#).marker("zqxstring"),
        invalid("json-number", "12345"),
        invalid("json-null", "null"),
        // An unknown field is named, its value never quoted; a long name is not repeated.
        invalid(
            "unknown-field",
            r#"{"account":"alice","amount":1,"currency":"RUB","zqxfield":"zqxvalue"}"#,
        )
        .marker("zqxvalue"),
        invalid(
            "unknown-field-long-name",
            &format!(
                r#"{{"account":"alice","amount":1,"currency":"RUB","zqxlong{}":1}}"#,
                "n".repeat(60)
            ),
        )
        .marker("zqxlong"),
        invalid(
            "unknown-field-control-name",
            r#"{"account":"alice","amount":1,"currency":"RUB","zqxctl":1}"#,
        )
        .marker("zqxctl"),
        invalid(
            "duplicate-field",
            r#"{"account":"alice","amount":1,"amount":1,"currency":"RUB"}"#,
        ),
        invalid("missing-field", r#"{"account":"alice","amount":1}"#),
        invalid("account-number", &dep_with("account", "7")),
        invalid("account-null", &dep_with("account", "null")),
        invalid("currency-object", &dep_with("currency", r#"{"x":1}"#)),
        invalid("amount-bool", &dep_with("amount", "true")),
        // amounts
        invalid("amount-zero", &dep_with("amount", "0")),
        invalid("amount-negative", &dep_with("amount", "-5")),
        invalid("amount-fraction", &dep_with("amount", "1.5")),
        invalid("amount-string", &dep_with("amount", "\"300\"")),
        invalid("amount-over-1e15", &dep_with("amount", "1000000000000001")),
        invalid(
            "amount-over-2^63",
            &dep_with("amount", "9223372036854775808"),
        ),
        invalid(
            "amount-over-2^64",
            &dep_with("amount", "18446744073709551616"),
        ),
        // 1e3 and 1000.0 are the whole number 1000 and are taken; these are not whole.
        invalid("amount-exponent-fraction", &dep_with("amount", "1.5e0")),
        invalid(
            "amount-fraction-past-a-float",
            &dep_with("amount", "1.00000000000000000001"),
        ),
        invalid("amount-huge", &dep_with("amount", &"9".repeat(400))),
        // accounts
        invalid("account-empty", &dep_with("account", "\"\"")),
        invalid("account-65-bytes", &dep_with("account", &long_acct)),
        invalid("account-@world", &dep_with("account", "\"@world\"")),
        invalid("account-@payouts", &dep_with("account", "\"@payouts\"")),
        invalid("account-space", &dep_with("account", "\"zqx acct\"")).marker("zqx"),
        invalid("account-control", &dep_with("account", "\"zqx\\u0001\"")).marker("zqx"),
        invalid("account-non-ascii", &dep_with("account", "\"zqxé\"")).marker("zqx"),
        // currencies
        invalid("currency-lower", &dep_with("currency", "\"rub\"")),
        invalid("currency-two", &dep_with("currency", "\"RU\"")),
        invalid("currency-four", &dep_with("currency", "\"ZQXW\"")).marker("ZQXW"),
        invalid("currency-digits", &dep_with("currency", "\"123\"")),
        // keys
        key_row("key-missing", None, "idempotency_key_missing"),
        key_row("key-empty", Some(b""), "idempotency_key_invalid"),
        key_row("key-256-bytes", Some(&long_key), "idempotency_key_invalid"),
        key_row(
            "key-non-ascii",
            Some("zqx-é".as_bytes()),
            "idempotency_key_invalid",
        )
        .marker("zqx"),
        key_row("key-space", Some(b"zqx key"), "idempotency_key_invalid").marker("zqx"),
        // The HTTP parser (hyper) refuses a header value with a control byte before the
        // worker sees it: 400 and nothing changed, but a bare answer, not problem details
        // (documented in the answers table of docs/contract.md).
        key_row("key-control", Some(b"zqx\x01key"), "").marker("zqx"),
        key_row("key-tab", Some(b"zqx\tkey"), "idempotency_key_invalid").marker("zqx"),
        {
            let mut r = key_row("key-twice", Some(b"k-one"), "idempotency_key_invalid");
            r.headers.push(("Idempotency-Key", b"k-two".to_vec()));
            r
        },
        // the checks' order: a bad key is reported before a bad body
        {
            let mut r = key_row("key-and-body", None, "idempotency_key_missing");
            r.body = b"not json".to_vec();
            r
        },
        // business rejections: stored under the key, replayed on retry
        post(
            "unknown-account",
            W,
            r#"{"account":"nobody","amount":1,"currency":"RUB"}"#,
            422,
            "account_not_found",
        ),
        post(
            "wrong-currency",
            W,
            r#"{"account":"alice","amount":1,"currency":"USD"}"#,
            422,
            "currency_mismatch",
        ),
        post(
            "overdraft",
            W,
            r#"{"account":"alice","amount":1000000000000000,"currency":"RUB"}"#,
            422,
            "insufficient_funds",
        ),
        post(
            "refund-over-withdrawal",
            R,
            r#"{"withdrawal":"w-ok","amount":101}"#,
            422,
            "refund_exceeds_withdrawal",
        ),
        post(
            "refund-unknown-withdrawal",
            R,
            r#"{"withdrawal":"zqx-nope","amount":1}"#,
            422,
            "withdrawal_not_found",
        ),
        post(
            "refund-rejected-withdrawal",
            R,
            r#"{"withdrawal":"w-rejected","amount":1}"#,
            422,
            "withdrawal_not_found",
        ),
        post(
            "refund-bad-body",
            R,
            r#"{"withdrawal":"w-ok","amount":0}"#,
            400,
            "invalid_request",
        ),
        // reads and routes
        get(
            "unknown-account-read",
            "/v1/accounts/nobody",
            404,
            "account_not_found",
        ),
        get(
            "unknown-key-read",
            "/v1/keys/zqx-none",
            404,
            "key_not_found",
        ),
        get(
            "statement-unknown-account",
            "/v1/accounts/nobody/facts",
            404,
            "account_not_found",
        ),
        get(
            "statement-system-account",
            "/v1/accounts/@world/facts",
            400,
            "invalid_request",
        ),
        get(
            "statement-limit-zero",
            "/v1/accounts/alice/facts?limit=0",
            400,
            "invalid_request",
        ),
        get(
            "read-unknown-query",
            "/v1/accounts?zqxq=1",
            400,
            "invalid_request",
        )
        .marker("zqx"),
        // A command takes no query: a `dry_run` the client believes in must not move money.
        post(
            "command-with-query",
            "/v1/deposits?zqxdry_run=1",
            &dep_with("amount", "1"),
            400,
            "invalid_request",
        )
        .marker("zqx"),
        get("unknown-path", "/v1/zqxpath", 404, "not_found"),
        get("unknown-root", "/", 404, "not_found"),
        post("post-unknown-path", "/v1/transfers", "{}", 404, "not_found"),
        post("get-on-command", D, "", 405, "method_not_allowed").method("GET"),
        post("delete-on-command", W, "", 405, "method_not_allowed").method("DELETE"),
    ]
}

/// Rows where the worker breaks docs/contract.md today, each asserting the contract.
/// What `check` compares before and after a row.
#[derive(PartialEq, Debug)]
struct State {
    facts: String,
    accounts: String,
    key: Option<(u16, String)>,
}

fn state(http: &Http, key: Option<&str>) -> State {
    State {
        facts: http.get("/v1/facts?after=0&limit=1000").body,
        accounts: http.get("/v1/accounts").body,
        key: key.map(|k| {
            let r = http.get(&format!("/v1/keys/{k}"));
            (r.status, r.body)
        }),
    }
}

fn send(raw: &mut RawClient, row: &Row) -> RawReply {
    let headers: Vec<(&str, &[u8])> = row.headers.iter().map(|(n, v)| (*n, &v[..])).collect();
    let bytes = request(row.method, &row.path, &headers, &row.body);
    raw.send(&bytes)
        .unwrap_or_else(|e| panic!("{}: no answer: {e}", row.name))
}

fn check(http: &Http, raw: &mut RawClient, row: &Row) {
    let name = row.name;
    let before = state(http, row.key.as_deref());
    let last_before = http.last_seq();
    let r = send(raw, row);
    let text = r.text();
    assert_eq!(r.status, row.status, "{name}: {text}");
    if row.code.is_empty() {
        assert_eq!(state(http, None), before, "{name}: state changed");
        return;
    }
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{name}: {text}"
    );
    let v: serde_json::Value =
        serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{name}: {e}: {text}"));
    assert_eq!(v["code"], row.code, "{name}: {text}");
    assert_eq!(v["status"], row.status, "{name}: {text}");
    assert_eq!(
        v["type"],
        format!("urn:idem:problem:{}", row.code),
        "{name}: {text}"
    );
    assert!(v["title"].is_string(), "{name}: {text}");
    if row.status == 413 {
        // The body was not read: the connection must not be reused for another request.
        assert_eq!(r.header("connection"), Some("close"), "{name}: {text}");
    }
    if let Some(m) = row.marker {
        assert!(
            !text.contains(m),
            "{name}: the answer quotes the input: {text}"
        );
    }
    match row.effect {
        Effect::Refused => {
            assert!(r.header("idempotent-replayed").is_none(), "{name}");
            assert_eq!(
                state(http, row.key.as_deref()),
                before,
                "{name}: state changed"
            );
            if let Some(k) = &row.key {
                assert_eq!(
                    before.key.as_ref().unwrap().0,
                    404,
                    "{name}: key used before"
                );
                // The key is still free: a valid request with it is a first execution.
                let first = http.deposit(k, "unused-check", 1);
                assert_eq!(first.status, 201, "{name}: {}", first.body);
                assert!(!first.replayed, "{name}: the refused request used its key");
            }
        }
        Effect::Stored => {
            let after = state(http, None);
            assert_eq!(after.accounts, before.accounts, "{name}: balances changed");
            assert_eq!(
                http.last_seq(),
                last_before + 1,
                "{name}: one rejected fact"
            );
            let k = row.key.as_deref().unwrap();
            let rec = http.get(&format!("/v1/keys/{k}"));
            assert_eq!(rec.status, 200, "{name}: {}", rec.body);
            assert_eq!(rec.json()["status"], "done", "{name}: {}", rec.body);
            let again = send(raw, row);
            assert_eq!(
                (again.status, again.text()),
                (r.status, text.clone()),
                "{name}: the retry is not a replay"
            );
            assert_eq!(again.header("idempotent-replayed"), Some("true"), "{name}");
            assert_eq!(
                http.last_seq(),
                last_before + 1,
                "{name}: retry changed the log"
            );
            assert_eq!(state(http, None).accounts, before.accounts, "{name}");
        }
    }
}

fn sums_zero(http: &Http) {
    let a = http.get("/v1/accounts").json();
    let mut total = 0i64;
    for acc in a["accounts"].as_array().unwrap() {
        total += acc["balance"].as_i64().unwrap();
    }
    assert_eq!(total, 0, "the books do not balance: {a}");
    for (cur, sum) in a["sums"].as_object().unwrap() {
        assert_eq!(sum, 0, "{cur}: {a}");
    }
}

#[test]
fn bad_input_catalogue() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    let mut raw = RawClient::new(w.port);

    // The setting the business rows refer to.
    assert_eq!(http.deposit("setup-dep", "alice", 1000).status, 201);
    assert_eq!(http.withdraw("w-ok", "alice", 100).status, 201);
    assert_eq!(http.withdraw("w-rejected", "nobody", 1).status, 422);

    let rows = rows();
    let mut names = std::collections::BTreeSet::new();
    let mut failed = Vec::new();
    for row in &rows {
        assert!(names.insert(row.name), "duplicate row {}", row.name);
        let run = std::panic::AssertUnwindSafe(|| check(&http, &mut raw, row));
        if std::panic::catch_unwind(run).is_err() {
            failed.push(row.name);
        }
    }
    assert!(failed.is_empty(), "failed rows: {failed:?}");
    sums_zero(&http);

    // A refund racing its withdrawal: every refund is applied, finds no withdrawal yet, or
    // (its withdrawal in flight) is told to come again and then applies.
    refund_races_its_withdrawal(&http);
    sums_zero(&http);
    assert_eq!(w.term().code(), Some(0));
    let out = crate::support::run(&["verify", "--db", db.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A replay after the key expired is identical and marked replayed.
    replay_after_expiry();
}

fn refund_races_its_withdrawal(http: &Http) {
    assert_eq!(http.deposit("race-dep", "racer", 1_000_000).status, 201);
    let rounds = 40;
    let (mut applied, mut retried) = (0, 0);
    for i in 0..rounds {
        let barrier = Arc::new(Barrier::new(2));
        let (h1, b1) = (http.clone(), barrier.clone());
        let wkey = format!("race-w-{i}");
        let wk = wkey.clone();
        let t = std::thread::spawn(move || {
            b1.wait();
            h1.withdraw(&wk, "racer", 10)
        });
        barrier.wait();
        let (rkey, rbody) = (
            format!("race-r-{i}"),
            format!(r#"{{"withdrawal":"{wkey}","amount":10}}"#),
        );
        let refund = http.post(R, Some(&rkey), &rbody);
        let wd = t.join().unwrap();
        assert_eq!(wd.status, 201, "withdrawal {i}: {}", wd.body);
        match refund.status {
            201 => applied += 1,
            422 => assert_eq!(refund.code(), "withdrawal_not_found", "{}", refund.body),
            409 => {
                assert_eq!(refund.code(), "request_in_progress", "{}", refund.body);
                // Nothing was stored under the refund's key: now that the withdrawal is
                // done, the same key applies.
                let again = http.post(R, Some(&rkey), &rbody);
                assert_eq!(again.status, 201, "refund {i} retried: {}", again.body);
                retried += 1;
            }
            s => panic!("refund {i}: {s} {}", refund.body),
        }
    }
    eprintln!(
        "refund race: {applied} of {rounds} refunds won, {retried} were told 409 and applied \
         when retried"
    );
}

fn replay_after_expiry() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &["--retention", "300ms", "--sweep-every", "50ms"]);
    let http = w.http();
    let first = http.deposit("exp-dep", "eve", 500);
    assert_eq!(first.status, 201, "{}", first.body);
    let rej = http.withdraw("exp-rej", "eve", 10_000);
    assert_eq!(rej.status, 422, "{}", rej.body);
    let seq = http.last_seq();
    for k in ["exp-dep", "exp-rej"] {
        eventually(Duration::from_secs(10), "the key to expire", || {
            let r = http.get(&format!("/v1/keys/{k}"));
            (r.status == 200 && r.json()["status"] == "expired").then_some(())
        });
    }
    for (again, was) in [
        (http.deposit("exp-dep", "eve", 500), &first),
        (http.withdraw("exp-rej", "eve", 10_000), &rej),
    ] {
        assert_eq!((again.status, &again.body), (was.status, &was.body));
        assert!(again.replayed, "{}", again.body);
    }
    assert_eq!(http.last_seq(), seq);
    assert_eq!(http.balance("eve"), 500);
    // Another command under an expired key is still a mismatch, not a new execution.
    let other = http.deposit("exp-dep", "eve", 7);
    assert_eq!(other.status, 422, "{}", other.body);
    assert_eq!(other.code(), "idempotency_key_reused");
    assert_eq!(http.balance("eve"), 500);
    assert_eq!(w.term().code(), Some(0));
}
