//! The operator feed as the dashboard reads it: keys by time, what the last verify
//! covered, and whose counts the snapshot's counters are.

use std::time::Duration;

use ledger::testing::PgTestDb;
use serde_json::Value;

use crate::support::{Http, Worker, eventually, scratch};

/// The keys of a listing, in its order.
fn keys(page: &Value) -> Vec<String> {
    page["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap().to_owned())
        .collect()
}

fn refund(http: &Http, key: &str, withdrawal: &str, amount: u64) -> u16 {
    http.post(
        "/v1/refunds",
        Some(key),
        &format!(r#"{{"withdrawal":"{withdrawal}","amount":{amount}}}"#),
    )
    .status
}

/// Six commands, one of each kind of outcome, in this order: the newest-first listing
/// is their reverse.
fn six_commands(http: &Http) {
    assert_eq!(http.deposit("big-17", "alice", 1000).status, 201);
    assert_eq!(http.deposit("big-102", "alice", 500).status, 201);
    assert_eq!(http.withdraw("w-1", "alice", 300).status, 201);
    assert_eq!(http.withdraw("w-2", "alice", 999_999).status, 422);
    assert_eq!(refund(http, "r-1", "w-1", 50), 201);
    assert_eq!(refund(http, "r-2", "nope", 50), 422);
}

const NEWEST_FIRST: [&str; 6] = ["r-2", "r-1", "w-2", "w-1", "big-102", "big-17"];

#[test]
fn keys_are_listed_newest_first_and_paged_by_time() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    six_commands(&http);

    let all = http.get("/v1/live/keys?order=newest").json();
    assert_eq!(keys(&all), NEWEST_FIRST);
    assert!(all["next"].is_null(), "{all}");
    // The listing by key, still the default, is in byte order.
    let by_key = keys(&http.get("/v1/live/keys").json());
    assert_eq!(by_key, ["big-102", "big-17", "r-1", "r-2", "w-1", "w-2"]);

    // A refund's row carries its withdrawal's currency; one of no withdrawal has none.
    let rows = all["keys"].as_array().unwrap();
    assert_eq!(rows[1]["currency"], "RUB", "{}", rows[1]);
    assert!(rows[0].get("currency").is_none(), "{}", rows[0]);
    let detail = http.get("/v1/live/keys/default/r-1").json();
    assert_eq!(detail["currency"], "RUB", "{detail}");
    assert_eq!(detail["fact"]["currency"], "RUB", "{detail}");

    // Pages of four and two, the second where the first stopped.
    let first = http.get("/v1/live/keys?order=newest&limit=4").json();
    assert_eq!(keys(&first), NEWEST_FIRST[..4]);
    let next = first["next"].as_str().unwrap();
    let second = http
        .get(&format!("/v1/live/keys?order=newest&limit=4&after={next}"))
        .json();
    assert_eq!(keys(&second), NEWEST_FIRST[4..]);
    assert!(second["next"].is_null(), "{second}");

    // Filters keep the order.
    let big = http.get("/v1/live/keys?order=newest&q=big").json();
    assert_eq!(keys(&big), ["big-102", "big-17"]);
    let done = http.get("/v1/live/keys?order=newest&status=done").json();
    assert_eq!(keys(&done), NEWEST_FIRST);
    for status in ["pending", "expired"] {
        let none = http
            .get(&format!("/v1/live/keys?order=newest&status={status}"))
            .json();
        assert_eq!(keys(&none), Vec::<String>::new(), "{status}");
        assert!(none["next"].is_null(), "{status}: {none}");
    }
    let shop = http.get("/v1/live/keys?order=newest&client=shop").json();
    assert_eq!(keys(&shop), Vec::<String>::new());

    // A cursor goes on with the listing it came from, whatever `order` says; an unknown
    // order and a cursor that is neither kind are refused.
    let by_key_cursor = http.get("/v1/live/keys?limit=1").json()["next"]
        .as_str()
        .unwrap()
        .to_owned();
    let on_by_key = http
        .get(&format!(
            "/v1/live/keys?order=newest&limit=1&after={by_key_cursor}"
        ))
        .json();
    assert_eq!(keys(&on_by_key), ["big-17"]);
    let on_by_time = http
        .get(&format!("/v1/live/keys?order=key&limit=4&after={next}"))
        .json();
    assert_eq!(keys(&on_by_time), NEWEST_FIRST[4..]);
    for bad in [
        "order=oldest",
        "order=newest&after=n-1",
        "after=nine",
        "after=zz",
    ] {
        let r = http.get(&format!("/v1/live/keys?{bad}"));
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert_eq!(r.code(), "invalid_request", "{bad}");
    }
    assert_eq!(w.term().code(), Some(0));
}

#[test]
fn the_snapshot_says_what_verify_covered_and_since_when() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &["--verify-every", "1s"]);
    let http = w.http();
    let snapshot = || http.get("/v1/live/snapshot").json();
    let at_start = eventually(Duration::from_secs(20), "the verify at start", || {
        let v = snapshot()["verify"].clone();
        (!v.is_null()).then_some(v)
    });
    assert_eq!(at_start["run"], "start", "{at_start}");
    assert_eq!(at_start["ok"], true, "{at_start}");
    assert_eq!(at_start["up_to_seq"], 0, "{at_start}");
    assert_eq!(at_start["facts"], 0, "{at_start}");
    assert_eq!(at_start["violations"], 0, "{at_start}");
    let time = |v: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(v[field].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{field}: {e}: {v}"))
    };
    let gap = time(&at_start, "next_at") - time(&at_start, "at");
    assert!(
        (900..=1500).contains(&gap.num_milliseconds()),
        "the next run is about a second after this one: {at_start}"
    );

    for i in 0..3 {
        assert_eq!(http.deposit(&format!("d-{i}"), "alice", 10).status, 201);
    }
    let periodic = eventually(Duration::from_secs(20), "a verify of the 3 facts", || {
        let v = snapshot()["verify"].clone();
        (v["up_to_seq"] == 3).then_some(v)
    });
    assert_eq!(periodic["run"], "periodic", "{periodic}");
    assert_eq!(periodic["facts"], 3, "{periodic}");
    assert_eq!(periodic["keys_done"], 3, "{periodic}");
    assert_eq!(periodic["accounts"], 1, "alice: {periodic}");
    assert_eq!(periodic["currencies"], 1, "{periodic}");

    let s = snapshot();
    let started = time(&s, "started_at");
    assert!(started <= time(&s, "now"), "{s}");
    assert!(started <= time(&at_start, "at"), "{s}");
    // The sled store keeps the replay and conflict counts in the ledger.
    assert_eq!(s["observed_scope"], "ledger", "{s}");
    assert_eq!(w.term().code(), Some(0));
}

/// On PostgreSQL the log has gaps and the counts are the worker's own.
#[test]
fn keys_newest_first_on_postgres() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some(db) = runtime.block_on(PgTestDb::create(
        "keys_newest_first_on_postgres",
        "idem_feed",
    )) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let w = Worker::start_store(&db.url, &dir.path().join("worker.log"), &[]);
    let http = w.http();
    six_commands(&http);
    let all = http.get("/v1/live/keys?order=newest").json();
    assert_eq!(keys(&all), NEWEST_FIRST);
    assert_eq!(all["keys"][1]["currency"], "RUB");
    let first = http.get("/v1/live/keys?order=newest&limit=5").json();
    assert_eq!(keys(&first), NEWEST_FIRST[..5]);
    let next = first["next"].as_str().unwrap();
    let rest = http
        .get(&format!("/v1/live/keys?order=newest&limit=5&after={next}"))
        .json();
    assert_eq!(keys(&rest), NEWEST_FIRST[5..]);
    assert_eq!(
        http.get("/v1/live/snapshot").json()["observed_scope"],
        "worker"
    );
    assert_eq!(w.term().code(), Some(0));
    runtime.block_on(db.drop_now());
}
