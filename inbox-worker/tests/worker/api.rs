//! docs/contract.md: every row of the answers table, and the concurrency guarantees.

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::support::{Http, Reply, Worker, eventually, run, scratch};

const W: &str = "/v1/withdrawals";
const D: &str = "/v1/deposits";

fn problem(r: &Reply, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    assert_eq!(r.content_type, "application/problem+json", "{}", r.body);
    assert_eq!(r.code(), code, "{}", r.body);
    assert!(!r.replayed);
}

/// A key refused before reaching the ledger must still be free: the next valid request
/// with it is a first execution.
fn assert_unused(http: &Http, key: &str) {
    let r = http.deposit(key, "unused-check", 1);
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(!r.replayed, "key {key} was used by a refused request");
}

#[test]
fn answers_table_rows() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();

    // first execution, applied: 201 with the receipt.
    let first = http.deposit("dep-1", "alice", 1000);
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.content_type, "application/json");
    assert!(!first.replayed);
    let receipt = first.json();
    assert_eq!(receipt["key"], "dep-1");
    assert_eq!(receipt["command"], "deposit");
    assert_eq!(receipt["amount"], 1000);
    assert_eq!(receipt["balance"], 1000);
    assert!(receipt["seq"].as_u64().unwrap() >= 1);
    assert!(receipt["created_at"].as_str().unwrap().ends_with('Z'));

    // replay of a stored outcome: same status, byte-identical body, marked.
    let again = http.deposit("dep-1", "alice", 1000);
    assert_eq!((again.status, &again.body), (201, &first.body));
    assert!(again.replayed);
    assert_eq!(http.balance("alice"), 1000);

    // business rejection: 422 with its code, stored, replayed too.
    let broke = http.withdraw("w-big", "alice", 5000);
    problem(&broke, 422, "insufficient_funds");
    let broke_again = http.withdraw("w-big", "alice", 5000);
    assert_eq!((broke_again.status, &broke_again.body), (422, &broke.body));
    assert!(broke_again.replayed);
    // A retry can never turn the failure into a success, even once money arrived.
    http.deposit("dep-2", "alice", 10_000);
    let still = http.withdraw("w-big", "alice", 5000);
    assert_eq!((still.status, &still.body), (422, &broke.body));
    problem(
        &http.withdraw("w-nobody", "nobody", 1),
        422,
        "account_not_found",
    );
    problem(
        &http.post(
            W,
            Some("w-usd"),
            r#"{"account":"alice","amount":1,"currency":"USD"}"#,
        ),
        422,
        "currency_mismatch",
    );
    problem(
        &http.post(
            "/v1/refunds",
            Some("r-none"),
            r#"{"withdrawal":"nope","amount":1}"#,
        ),
        422,
        "withdrawal_not_found",
    );

    // same key, other command: 422 reused, nothing changes, the key keeps its outcome.
    let reused = http.deposit("dep-1", "alice", 999);
    problem(&reused, 422, "idempotency_key_reused");
    assert_eq!(reused.json()["differs"], serde_json::json!(["amount"]));
    assert_eq!(http.balance("alice"), 11_000);
    let original = http.deposit("dep-1", "alice", 1000);
    assert_eq!(original.body, first.body);

    // no or an invalid Idempotency-Key: 400, nothing stored.
    let body = r#"{"account":"alice","amount":1,"currency":"RUB"}"#;
    problem(&http.post(D, None, body), 400, "idempotency_key_missing");
    let long = "k".repeat(256);
    for bad in ["has space", long.as_str(), ""] {
        problem(
            &http.post(D, Some(bad), body),
            400,
            "idempotency_key_invalid",
        );
    }
    assert_eq!(http.balance("alice"), 11_000);

    // malformed JSON, unknown or missing field, wrong type, amount out of range, a
    // system account: 400 invalid_request, and the key stays unused.
    let invalid = [
        r#"{"account":"alice","amount":1,"currency":"RUB""#,
        r#"not json"#,
        r#"{"account":"alice","amount":1,"currency":"RUB","note":"x"}"#,
        r#"{"account":"alice","amount":1}"#,
        r#"{"account":"alice","amount":"1","currency":"RUB"}"#,
        r#"{"account":7,"amount":1,"currency":"RUB"}"#,
        r#"{"account":"alice","amount":0,"currency":"RUB"}"#,
        r#"{"account":"alice","amount":-5,"currency":"RUB"}"#,
        r#"{"account":"alice","amount":1.5,"currency":"RUB"}"#,
        r#"{"account":"alice","amount":1000000000000001,"currency":"RUB"}"#,
        r#"{"account":"@world","amount":1,"currency":"RUB"}"#,
        r#"{"account":"alice","amount":1,"currency":"rub"}"#,
        r#"[]"#,
        r#""#,
    ];
    for (i, b) in invalid.iter().enumerate() {
        let key = format!("bad-{i}");
        problem(&http.post(D, Some(&key), b), 400, "invalid_request");
        assert_unused(&http, &key);
    }

    // body over 64 KiB: 413, key unused.
    let huge = format!(
        r#"{{"account":"alice","amount":1,"currency":"RUB","pad":"{}"}}"#,
        "x".repeat(70 * 1024)
    );
    problem(&http.post(D, Some("huge"), &huge), 413, "payload_too_large");
    assert_unused(&http, "huge");

    // No error body quotes the client's values back; an unknown field is named (its name
    // only), so that a typo can be fixed from the answer.
    let marker = r#"{"zzzmarker":"zzzvalue","amount":"zzzamount"}"#;
    let r = http.post(D, Some("echo"), marker);
    assert_eq!(r.status, 400);
    assert!(
        !r.body.contains("zzzvalue") && !r.body.contains("zzzamount"),
        "echoed input: {}",
        r.body
    );
    assert_eq!(
        r.json()["detail"],
        "unknown field `zzzmarker`: a deposit or a withdrawal takes exactly account, amount, currency"
    );
    let r = http.post(D, Some("zzz key"), marker);
    assert_eq!(r.status, 400);
    assert!(!r.body.contains("zzz"), "echoed input: {}", r.body);

    // unknown endpoints are problems too.
    problem(&http.get("/v1/nope"), 404, "not_found");
    problem(&http.get("/v1/accounts/nobody"), 404, "account_not_found");
    assert_eq!(w.term().code(), Some(0));
}

/// A query is as strict as a body: an unknown parameter (a typo such as `staus`) and a
/// `limit` outside 1..=1000 are refused, never ignored or clamped into another answer.
#[test]
fn queries_are_strict() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    assert_eq!(http.deposit("q-1", "alice", 5).status, 201);
    for path in [
        "/v1/keys",
        "/v1/facts",
        "/v1/live/keys",
        "/v1/live/quarantine",
    ] {
        assert_eq!(http.get(&format!("{path}?limit=1")).status, 200, "{path}");
        assert_eq!(
            http.get(&format!("{path}?limit=1000")).status,
            200,
            "{path}"
        );
        for bad in [
            "staus=pending",
            "account=nobody",
            "limit=0",
            "limit=1001",
            "limit=-1",
        ] {
            let r = http.get(&format!("{path}?{bad}"));
            problem(&r, 400, "invalid_request");
            assert!(
                !r.body.contains("staus") && !r.body.contains("nobody"),
                "{}",
                r.body
            );
        }
    }
    // What each endpoint takes is accepted together.
    for path in [
        "/v1/keys?status=done&limit=5&after=q-0",
        "/v1/facts?after=0&limit=5",
        "/v1/live/keys?status=done&client=default&q=q-&limit=5",
        "/v1/live/quarantine?order=newest&limit=5",
    ] {
        assert_eq!(http.get(path).status, 200, "{path}");
    }
}

#[test]
fn field_order_and_whitespace_do_not_make_a_mismatch() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    http.deposit("dep", "bob", 500);
    let first = http.post(
        W,
        Some("w1"),
        r#"{"account":"bob","amount":200,"currency":"RUB"}"#,
    );
    assert_eq!(first.status, 201);
    let shuffled = http.post(
        W,
        Some("w1"),
        "{\n  \"currency\" : \"RUB\",\t\"amount\": 200 ,\"account\":\"bob\"\n}\n",
    );
    assert_eq!(shuffled.status, 201, "{}", shuffled.body);
    assert!(shuffled.replayed);
    assert_eq!(shuffled.body, first.body);
    assert_eq!(http.balance("bob"), 300);
}

#[test]
fn same_key_on_another_endpoint_is_a_mismatch() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    http.deposit("dep", "carol", 500);
    assert_eq!(http.withdraw("k", "carol", 100).status, 201);
    let other = http.deposit("k", "carol", 100);
    problem(&other, 422, "idempotency_key_reused");
    assert_eq!(other.json()["differs"], serde_json::json!(["command"]));
    assert_eq!(http.balance("carol"), 400);
}

#[test]
fn refunds_are_idempotent_and_bounded() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    http.deposit("dep", "dan", 1000);
    http.withdraw("req-7f3a", "dan", 300);
    let refund = |key: &str, amount: u64| {
        http.post(
            "/v1/refunds",
            Some(key),
            &format!(r#"{{"withdrawal":"req-7f3a","amount":{amount}}}"#),
        )
    };
    let first = refund("ref-1", 200);
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.json()["balance"], 900);
    assert_eq!(first.json()["refunded_total"], 200);
    let retried = refund("ref-1", 200);
    assert!(retried.replayed);
    assert_eq!(retried.body, first.body);
    problem(&refund("ref-2", 101), 422, "refund_exceeds_withdrawal");
    assert_eq!(refund("ref-3", 100).status, 201);
    assert_eq!(http.balance("dan"), 1000);
}

/// Fires `n` requests at once from `n` threads.
fn at_once<T: Send + 'static>(n: usize, f: impl Fn(usize) -> T + Send + Sync + 'static) -> Vec<T> {
    let barrier = Arc::new(Barrier::new(n));
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (barrier, f) = (barrier.clone(), f.clone());
            std::thread::spawn(move || {
                barrier.wait();
                f(i)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn concurrent_identical_requests_make_one_effect() {
    let (_dir, db) = scratch();
    // No waiting for the twin, so that the 409 row shows up under contention.
    let w = Worker::start(&db, &["--in-flight-wait", "0ms"]);
    let http = w.http();
    http.deposit("dep", "erin", 1_000_000);
    let mut saw_409 = false;
    for round in 0..20 {
        let key = format!("double-click-{round}");
        let client = http.clone();
        let replies = at_once(48, move |_| client.withdraw(&key, "erin", 100));
        let mut first = Vec::new();
        let mut bodies = BTreeMap::new();
        for r in &replies {
            match r.status {
                201 if !r.replayed => first.push(r.body.clone()),
                201 => {
                    *bodies.entry(r.body.clone()).or_insert(0) += 1;
                }
                409 => {
                    problem(r, 409, "request_in_progress");
                    assert!(r.retry_after.as_deref().unwrap().parse::<u64>().unwrap() >= 1);
                    saw_409 = true;
                }
                other => panic!("unexpected {other}: {}", r.body),
            }
        }
        assert_eq!(
            first.len(),
            1,
            "round {round}: {} first executions",
            first.len()
        );
        for body in bodies.keys() {
            assert_eq!(body, &first[0], "a replay differs from the first answer");
        }
        assert_eq!(http.balance("erin"), 1_000_000 - 100 * (round + 1));
        if saw_409 && round >= 2 {
            break;
        }
    }
    assert!(
        saw_409,
        "48 concurrent duplicates never met an in-flight twin"
    );
    // Every 409 is an operator-visible conflict, not only the reused keys.
    let snap = http.get("/v1/live/snapshot").json();
    let conflicts = snap["conflicts"].as_array().unwrap();
    let in_flight = conflicts
        .iter()
        .find(|c| c["kind"] == "in_flight")
        .unwrap_or_else(|| panic!("no in_flight conflict after a 409: {conflicts:?}"));
    assert_eq!(in_flight["client"], "default");
    assert!(
        in_flight["key"]
            .as_str()
            .unwrap()
            .starts_with("double-click-"),
        "{in_flight}"
    );
    assert_eq!(in_flight["command"], "withdraw");
    assert_eq!(in_flight["differs"], serde_json::json!([]));
    assert!(
        in_flight["at"].as_str().unwrap().ends_with('Z'),
        "{in_flight}"
    );
    assert!(snap["counters"]["conflicts_in_flight"].as_u64().unwrap() >= 1);
    let out = {
        drop(http);
        assert_eq!(w.term().code(), Some(0));
        run(&["verify", "--db", db.to_str().unwrap()])
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn concurrent_withdrawals_never_overdraw() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    http.deposit("dep", "fay", 1000);
    let client = http.clone();
    let replies = at_once(40, move |i| client.withdraw(&format!("w-{i}"), "fay", 100));
    let applied = replies.iter().filter(|r| r.status == 201).count();
    let refused = replies
        .iter()
        .filter(|r| r.status == 422 && r.code() == "insufficient_funds")
        .count();
    assert_eq!((applied, refused), (10, 30));
    assert_eq!(http.balance("fay"), 0);
}

#[test]
fn two_tokens_are_isolated() {
    let (dir, db) = scratch();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "# clients\nshop=s3cret-shop\n").unwrap();
    let w = Worker::start(
        &db,
        &[
            "--token",
            "bank=s3cret-bank",
            "--tokens-file",
            tokens.to_str().unwrap(),
            "--admin-token",
            "s3cret-admin",
        ],
    );
    let anon = w.http();
    let shop = anon.with_token("s3cret-shop");
    let bank = anon.with_token("s3cret-bank");
    let admin = anon.with_token("s3cret-admin");

    problem(&anon.deposit("k", "gus", 100), 401, "unauthorized");
    problem(
        &anon.with_token("wrong").deposit("k", "gus", 100),
        401,
        "unauthorized",
    );
    problem(&admin.deposit("k", "gus", 100), 403, "forbidden");

    let a = shop.deposit("k", "gus", 100);
    assert_eq!(a.status, 201, "{}", a.body);
    // The same key for another client is another scope: its own first execution, never
    // shop's answer and never a reuse.
    let b = bank.deposit("k", "hal", 700);
    assert_eq!(b.status, 201, "{}", b.body);
    assert!(!b.replayed);
    assert_ne!(a.body, b.body);
    assert!(shop.deposit("k", "gus", 100).replayed);
    assert_eq!(shop.get("/v1/keys/k").json()["account"], "gus");
    assert_eq!(bank.get("/v1/keys/k").json()["account"], "hal");
    // A client reads only its own facts; the operator reads all.
    let facts = |h: &Http| h.get("/v1/facts").json()["facts"].as_array().unwrap().len();
    assert_eq!((facts(&shop), facts(&bank), facts(&admin)), (1, 1, 2));
    // Operator endpoints need the operator token.
    problem(&shop.get("/v1/live/snapshot"), 403, "forbidden");
    assert_eq!(admin.get("/v1/live/snapshot").status, 200);
    problem(&shop.get("/v1/live/quarantine"), 403, "forbidden");
    assert_eq!(admin.get("/v1/live/quarantine").status, 200);
    let one = admin.get("/v1/live/keys/shop/k");
    assert_eq!(one.status, 200, "{}", one.body);
    assert_eq!(one.json()["fact"]["type"], "DepositRecorded");
    // The dashboard reads balances with the operator token.
    let accounts = admin.get("/v1/accounts");
    assert_eq!(accounts.status, 200, "{}", accounts.body);
    let accounts = accounts.json();
    let balance = |name: &str| {
        accounts["accounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["account"] == name)
            .map(|a| a["balance"].clone())
    };
    // Each tenant's accounts under their ledger-wide names.
    assert_eq!(balance("shop/gus"), Some(serde_json::json!(100)));
    assert_eq!(balance("bank/hal"), Some(serde_json::json!(700)));
    assert_eq!(accounts["sums"]["RUB"], 0);
    assert_eq!(admin.balance("bank%2Fhal"), 700);
    assert_eq!(bank.balance("hal"), 700);
    problem(&anon.get("/v1/accounts"), 401, "unauthorized");
    problem(
        &anon.with_token("wrong").get("/v1/accounts"),
        401,
        "unauthorized",
    );
}

#[test]
fn refuses_to_listen_openly_without_tokens() {
    let (_dir, db) = scratch();
    let out = run(&[
        "serve",
        "--db",
        db.to_str().unwrap(),
        "--listen",
        "0.0.0.0:0",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without tokens"));
    // Said explicitly, it listens.
    let (_dir, db) = scratch();
    let w = Worker::start_on(&db, "0.0.0.0:0", &["--allow-no-tokens"]);
    assert_eq!(w.term().code(), Some(0));
}

/// A currency is checked before the ledger sees the command: an ISO 4217 code, and one
/// of `--currencies` when the operator lists them. The refusal leaves the key unused.
#[test]
fn currencies_are_checked_before_the_ledger_sees_the_command() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &["--currencies", "RUB,EUR"]);
    let http = w.http();
    let send = |key: &str, currency: &str| {
        http.post(
            "/v1/deposits",
            Some(key),
            &format!(r#"{{"account":"alice","amount":100,"currency":"{currency}"}}"#),
        )
    };
    let typo = send("d-1", "USS");
    problem(&typo, 400, "invalid_request");
    assert_eq!(
        typo.json()["detail"],
        "the currency is not an ISO 4217 code"
    );
    let other = send("d-1", "USD");
    problem(&other, 400, "invalid_request");
    assert_eq!(other.json()["detail"], "this worker accepts RUB, EUR only");
    problem(&http.get("/v1/accounts/alice"), 404, "account_not_found");
    // The key was left unused.
    assert_eq!(send("d-1", "EUR").status, 201);
    assert_eq!(w.term().code(), Some(0));
    // A typo in the worker's own list stops it at start.
    let out = run(&[
        "serve",
        "--db",
        db.to_str().unwrap(),
        "--currencies",
        "RUB,USS",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not an ISO 4217 code"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn keys_expire_but_answers_stay() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &["--retention", "300ms", "--sweep-every", "50ms"]);
    let http = w.http();
    let first = http.deposit("old", "ivy", 100);
    eventually(Duration::from_secs(20), "the key to expire", || {
        (http.get("/v1/keys/old").json()["status"] == "expired").then_some(())
    });
    let after = http.deposit("old", "ivy", 100);
    assert!(after.replayed);
    assert_eq!(after.body, first.body);
    problem(
        &http.deposit("old", "ivy", 5),
        422,
        "idempotency_key_reused",
    );
    assert_eq!(http.balance("ivy"), 100);
    // The key record is read from the tree as soon as the sweep's batch is applied; the
    // counters are published once it is durable, a moment later.
    eventually(Duration::from_secs(5), "the expiry to be counted", || {
        http.get("/metrics")
            .body
            .contains("idem_keys_expired_total 1")
            .then_some(())
    });
}

#[test]
fn metrics_health_and_feed() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    let health = http.get("/healthz");
    assert_eq!(health.status, 200);
    for i in 0..5 {
        http.deposit(&format!("d{i}"), "jo", 10);
    }
    http.deposit("d0", "jo", 10);
    http.deposit("d0", "jo", 11);
    let m = http.get("/metrics");
    assert!(m.content_type.starts_with("text/plain"));
    for needle in [
        "idem_commands_applied_total{command=\"deposit\"} 5",
        "idem_replays_total 1",
        "idem_conflicts_total{kind=\"reused\"} 1",
        "idem_commit_latency_seconds_bucket{le=\"+Inf\"}",
        "idem_commit_batches_total",
        "idem_commit_applies_total",
        // One 16 MiB journal segment holds these few groups.
        "idem_journal_segments 1",
        "idem_journal_bytes 16777216",
        "idem_checkpoints_total",
        "idem_open_connections",
        "idem_http_answers_total{code=\"applied\"} 5",
        "idem_commands_rejected_total{code=\"insufficient_funds\"} 0",
    ] {
        assert!(m.body.contains(needle), "missing {needle}:\n{}", m.body);
    }
    let snap = http.get("/v1/live/snapshot").json();
    assert_eq!(snap["last_seq"], 5);
    assert_eq!(snap["counters"]["applied"], 5);
    assert_eq!(snap["conflicts"][0]["kind"], "reused");
    assert_eq!(
        snap["conflicts"][0]["differs"],
        serde_json::json!(["amount"])
    );
    // Paged lists: two pages of three and two.
    let page = http.get("/v1/live/keys?status=done&limit=3").json();
    assert_eq!(page["keys"].as_array().unwrap().len(), 3);
    let next = page["next"].as_str().unwrap();
    let rest = http
        .get(&format!("/v1/live/keys?status=done&limit=3&after={next}"))
        .json();
    assert_eq!(rest["keys"].as_array().unwrap().len(), 2);
    assert!(rest["next"].is_null());
    let q = http.get("/v1/live/keys?q=d3").json();
    assert_eq!(q["keys"].as_array().unwrap().len(), 1);
    let verify = eventually(Duration::from_secs(20), "the first verify", || {
        let v = http.get("/v1/live/snapshot").json()["verify"].clone();
        (!v.is_null()).then_some(v)
    });
    assert_eq!(verify["ok"], true);
}

#[test]
fn stream_sends_facts_and_does_not_hold_shutdown() {
    use std::io::{BufRead, BufReader};
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let response = agent
        .get(format!("{}/v1/live/stream", w.base))
        .call()
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut body = response.into_body();
        for line in BufReader::new(body.as_reader())
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
        let _ = tx.send("<closed>".to_owned());
    });
    // The subscription is live once the first fact after it arrives.
    let mut seen = Vec::new();
    eventually(Duration::from_secs(20), "a fact event", || {
        http.deposit(&format!("s{}", seen.len()), "kai", 1);
        while let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.push(line);
        }
        seen.iter().any(|l| l == "event: fact").then_some(())
    });
    assert!(seen.iter().any(|l| l == "event: key"), "{seen:?}");
    // An open stream must not keep the worker from stopping.
    assert_eq!(w.term().code(), Some(0));
    let end = eventually(Duration::from_secs(20), "the stream to close", || {
        rx.recv_timeout(Duration::from_millis(100))
            .ok()
            .filter(|l| l == "<closed>")
    });
    assert_eq!(end, "<closed>");
}
