//! What the answers tell, on a worker over sled and one over PostgreSQL: an account's
//! statement, the figure a rejection was decided on (replayed byte for byte), until when a
//! stored answer is kept, and amounts in any JSON spelling of a whole number.

use chrono::{DateTime, Utc};
use ledger::testing::PgTestDb;
use serde_json::{Value, json};

use crate::support::{Http, Reply, Worker, scratch};

const SHOP: &str = "shop-secret";
const BANK: &str = "bank-secret";
const ADMIN: &str = "admin-secret";
const RETENTION_MS: i64 = 3_600_000;

fn args() -> Vec<&'static str> {
    vec![
        "--token",
        "shop=shop-secret",
        "--token",
        "bank=bank-secret",
        "--admin-token",
        ADMIN,
        "--retention",
        "1h",
    ]
}

#[test]
fn statements_details_and_expiry_on_sled() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &args());
    scenario(&w.http());
    assert_eq!(w.term().code(), Some(0));
}

#[test]
fn statements_details_and_expiry_on_postgres() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some(db) = runtime.block_on(PgTestDb::create(
        "answers::statements_details_and_expiry_on_postgres",
        "idem_answers",
    )) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let w = Worker::start_store(&db.url, &dir.path().join("worker.log"), &args());
    scenario(&w.http());
    assert_eq!(w.term().code(), Some(0));
    crate::support::verify_store(&db.url);
    runtime.block_on(db.drop_now());
}

fn time(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .with_timezone(&Utc)
}

/// A stored answer says until when it is kept: its first execution plus the retention,
/// in RFC 3339 UTC, the same on every replay.
fn kept_until(r: &Reply) -> String {
    let expires = r
        .expires
        .clone()
        .unwrap_or_else(|| panic!("no Idempotency-Expires on {}: {}", r.status, r.body));
    let created = time(r.json()["created_at"].as_str().unwrap());
    assert_eq!(
        (time(&expires) - created).num_milliseconds(),
        RETENTION_MS,
        "{expires} vs {}",
        r.body
    );
    assert!(expires.ends_with('Z'), "{expires}");
    expires
}

fn seq(r: &Reply) -> u64 {
    assert!(matches!(r.status, 201 | 422), "{}", r.body);
    r.json()["seq"].as_u64().unwrap()
}

/// Reads the whole statement, `limit` lines a page, and checks the paging on the way.
fn statement(http: &Http, account: &str, limit: usize) -> (Value, Vec<Value>) {
    let mut lines = Vec::new();
    let mut after = 0;
    let mut first = None;
    loop {
        let r = http.get(&format!(
            "/v1/accounts/{account}/facts?after={after}&limit={limit}"
        ));
        assert_eq!(r.status, 200, "{}", r.body);
        let page = r.json();
        let facts = page["facts"].as_array().unwrap().clone();
        assert!(facts.len() <= limit, "{page}");
        lines.extend(facts.iter().cloned());
        first.get_or_insert(page.clone());
        match &page["next_after"] {
            Value::Null => break,
            next => {
                // A page that says more follows is full.
                assert_eq!(facts.len(), limit, "{page}");
                after = next.as_u64().unwrap();
                assert_eq!(after, facts.last().unwrap()["seq"].as_u64().unwrap());
            }
        }
    }
    (first.unwrap(), lines)
}

fn summary(lines: &[Value]) -> Vec<(u64, i64, i64, &str)> {
    lines
        .iter()
        .map(|l| {
            (
                l["seq"].as_u64().unwrap(),
                l["balance_after"].as_i64().unwrap(),
                l["change"].as_i64().unwrap(),
                l["key"].as_str().unwrap(),
            )
        })
        .collect()
}

fn scenario(root: &Http) {
    let shop = root.with_token(SHOP);
    let bank = root.with_token(BANK);
    let admin = root.with_token(ADMIN);

    // The first answers, each kept until its time plus the retention.
    let d1 = shop.deposit("d-1", "alice", 1000);
    assert_eq!(d1.status, 201, "{}", d1.body);
    let d1_until = kept_until(&d1);
    let w1 = shop.withdraw("w-1", "alice", 300);
    // Another tenant's `alice` is another account: it moves nothing here.
    assert_eq!(bank.deposit("d-b", "alice", 50).status, 201);
    let db = shop.deposit("d-b", "alice", 50);
    let r1 = shop.post(
        "/v1/refunds",
        Some("r-1"),
        r#"{"withdrawal":"w-1","amount":100}"#,
    );
    assert_eq!(r1.status, 201, "{}", r1.body);
    shop.deposit("d-bob", "bob", 7);

    // insufficient_funds tells the balance it was decided on and the amount asked.
    let no = shop.withdraw("w-no", "alice", 5000);
    assert_eq!((no.status, no.code().as_str()), (422, "insufficient_funds"));
    let told = no.json();
    assert_eq!(
        (told["balance"].clone(), told["amount"].clone()),
        (json!(850), json!(5000))
    );
    assert_eq!(
        told["detail"],
        "alice's balance is 850, lower than the 5000 asked (minor units of RUB); nothing changed"
    );
    let no_until = kept_until(&no);
    // currency_mismatch names the account's currency.
    let usd = shop.post(
        "/v1/deposits",
        Some("d-usd"),
        r#"{"account":"alice","amount":5,"currency":"USD"}"#,
    );
    assert_eq!(
        (usd.status, usd.code().as_str()),
        (422, "currency_mismatch")
    );
    assert_eq!(usd.json()["account_currency"], "RUB");
    assert_eq!(
        usd.json()["detail"],
        "alice holds RUB, not USD; nothing changed"
    );

    // The balance moves on; the rejections' replays are their first bytes, and so is the
    // time they are kept until.
    shop.deposit("d-2", "alice", 10_000);
    for (first, again) in [
        (&no, shop.withdraw("w-no", "alice", 5000)),
        (
            &usd,
            shop.post(
                "/v1/deposits",
                Some("d-usd"),
                r#"{"account":"alice","amount":5,"currency":"USD"}"#,
            ),
        ),
    ] {
        assert!(again.replayed, "{}", again.body);
        assert_eq!((again.status, &again.body), (first.status, &first.body));
        assert_eq!(again.expires, first.expires);
    }

    // 1000.0 and 1e3 are the amount 1000: the same command as d-1's, so a replay.
    for spelling in ["1000.0", "1e3", "1.000e+3"] {
        let again = shop.post(
            "/v1/deposits",
            Some("d-1"),
            &format!(r#"{{"account":"alice","amount":{spelling},"currency":"RUB"}}"#),
        );
        assert!(again.replayed, "{spelling}: {}", again.body);
        assert_eq!((again.status, &again.body), (201, &d1.body), "{spelling}");
        assert_eq!(again.expires.as_deref(), Some(d1_until.as_str()));
    }
    let fraction = shop.post(
        "/v1/deposits",
        Some("d-frac"),
        r#"{"account":"alice","amount":1000.5,"currency":"RUB"}"#,
    );
    assert_eq!(
        (fraction.status, fraction.code().as_str()),
        (400, "invalid_request")
    );

    // The key says until when its answer is kept; a refusal that stores nothing says
    // nothing of it.
    let key = shop.get("/v1/keys/w-no").json();
    assert_eq!(key["expires_at"], no_until.as_str(), "{key}");
    assert_eq!(key["status"], "done");
    let listed = shop.get("/v1/keys?limit=1000").json();
    let d1_row = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == "d-1")
        .unwrap()
        .clone();
    assert_eq!(d1_row["expires_at"], d1_until.as_str());
    let reused = shop.deposit("d-1", "alice", 1);
    assert_eq!(
        (reused.status, reused.code().as_str()),
        (422, "idempotency_key_reused")
    );
    assert_eq!(reused.expires, None);

    // The operator's statement of alice: every movement in order with the balance after
    // it, rejections left out, paged two lines at a time.
    let want = [
        (seq(&d1), 1000, 1000, "d-1"),
        (seq(&w1), 700, -300, "w-1"),
        (seq(&db), 750, 50, "d-b"),
        (seq(&r1), 850, 100, "r-1"),
    ];
    let (head, lines) = statement(&admin, "shop%2Falice", 2);
    let got = summary(&lines);
    assert_eq!(&got[..4], &want[..], "{lines:#?}");
    assert_eq!(got.len(), 5, "{lines:#?}");
    assert_eq!((got[4].1, got[4].2, got[4].3), (10_850, 10_000, "d-2"));
    assert_eq!(
        (
            head["account"].clone(),
            head["currency"].clone(),
            head["balance"].clone()
        ),
        (json!("shop/alice"), json!("RUB"), json!(10_850))
    );
    assert_eq!(lines[1]["type"], "WithdrawalRecorded");
    assert_eq!(lines[1]["account"], "shop/alice");
    assert_eq!(lines[3]["withdrawal"], "w-1");
    // One page that holds it all says nothing follows.
    let whole = admin.get("/v1/accounts/shop%2Falice/facts").json();
    assert_eq!(whole["facts"].as_array().unwrap().len(), 5);
    assert_eq!(whole["next_after"], Value::Null);

    // A tenant reads its account's statement in its own names; another tenant's `alice`
    // is its own.
    let (head, mine) = statement(&shop, "alice", 100);
    assert_eq!(head["account"], "alice");
    assert_eq!(mine[0]["account"], "alice");
    let mine: Vec<_> = summary(&mine).into_iter().map(|l| l.3).collect();
    assert_eq!(mine, ["d-1", "w-1", "d-b", "r-1", "d-2"]);
    let (_, theirs) = statement(&bank, "alice", 1);
    assert_eq!(summary(&theirs).len(), 1);
    assert_eq!(summary(&theirs)[0].1, 50);

    // What a statement refuses.
    for (path, status, code) in [
        ("/v1/accounts/nobody/facts", 404, "account_not_found"),
        ("/v1/accounts/a%20b/facts", 404, "account_not_found"),
        ("/v1/accounts/@world/facts", 400, "invalid_request"),
        ("/v1/accounts/alice/facts?limit=0", 400, "invalid_request"),
        (
            "/v1/accounts/alice/facts?limit=1001",
            400,
            "invalid_request",
        ),
        ("/v1/accounts/alice/facts?after=-1", 400, "invalid_request"),
        (
            "/v1/accounts/alice/facts?account=bob",
            400,
            "invalid_request",
        ),
    ] {
        let r = admin.get(path);
        assert_eq!(
            (r.status, r.code().as_str()),
            (status, code),
            "{path}: {}",
            r.body
        );
    }
    let anonymous = root.get("/v1/accounts/alice/facts");
    assert_eq!(
        (anonymous.status, anonymous.code().as_str()),
        (401, "unauthorized")
    );

    // A balance at a point of the log: after the account's last movement at or before
    // it, naming that movement.
    let at = |http: &Http, query: &str| {
        let r = http.get(&format!("/v1/accounts/alice?{query}"));
        assert_eq!(r.status, 200, "{query}: {}", r.body);
        let v = r.json();
        (v["balance"].as_i64().unwrap(), v["movement_seq"].as_u64())
    };
    assert_eq!(at(&shop, "as_of_seq=0"), (0, None));
    assert_eq!(
        at(&shop, &format!("as_of_seq={}", seq(&d1))),
        (1000, Some(seq(&d1)))
    );
    // Bank's deposit to its own `alice` comes between: shop's `alice` did not move.
    assert_eq!(
        at(&shop, &format!("as_of_seq={}", seq(&w1) + 1)),
        (700, Some(seq(&w1)))
    );
    assert_eq!(
        at(&shop, &format!("as_of_seq={}", seq(&r1))),
        (850, Some(seq(&r1)))
    );
    let d1_at = d1.json()["created_at"].as_str().unwrap().to_owned();
    let first = shop
        .get(&format!("/v1/accounts/alice?as_of={d1_at}"))
        .json();
    assert_eq!(first["as_of"], d1_at.as_str());
    assert!(first["balance"].as_i64().unwrap() >= 1000, "{first}");
    assert_eq!(at(&shop, "as_of=2000-01-01T00:00:00Z"), (0, None));
    // Both: the earlier bound decides.
    assert_eq!(
        at(
            &shop,
            &format!("as_of_seq={}&as_of=2000-01-01T00:00:00Z", seq(&r1))
        ),
        (0, None)
    );
    let operator = admin.get(&format!("/v1/accounts/shop%2Falice?as_of_seq={}", seq(&w1)));
    assert_eq!(operator.json()["balance"], 700, "{}", operator.body);
    assert_eq!(operator.json()["account"], "shop/alice");
    assert_eq!(at(&bank, "as_of_seq=1000000").0, 50);
    for (who, query, status) in [
        (&shop, "as_of=yesterday", 400),
        (&shop, "as_of_seq=-1", 400),
        (&shop, "as_of_seq=1&limit=1", 400),
    ] {
        assert_eq!(
            who.get(&format!("/v1/accounts/alice?{query}")).status,
            status,
            "{query}"
        );
    }
    let system = admin.get("/v1/accounts/@world?as_of_seq=1");
    assert_eq!(
        (system.status, system.code().as_str()),
        (400, "invalid_request")
    );
    let ghost = shop.get("/v1/accounts/ghost?as_of_seq=1");
    assert_eq!(
        (ghost.status, ghost.code().as_str()),
        (404, "account_not_found")
    );
}
