//! Two tenants on one worker, every endpoint, on sled and on PostgreSQL: neither can
//! name, list, read or move the other's accounts, keys or facts, and an answer never
//! tells that the other's exist. Roles within a tenant (read only, some command kinds)
//! and the operator's token are held endpoint by endpoint. PostgreSQL is found as the
//! other PostgreSQL tests find it, and its half fails when `IDEM_REQUIRE_SERVICES=1` and
//! the server is missing.

use ledger::testing::PgTestDb;
use serde_json::{Value, json};

use crate::support::{Http, Reply, Worker, scratch};

const TOKENS: &str = "\
# two tenants, each with its own roles
shop=s-shop
shop:read=s-shop-read
shop:deposit=s-shop-checkout
other=s-other
other:withdraw,refund=s-other-payouts
";

fn expect(r: &Reply, status: u16, code: &str) -> Value {
    assert_eq!(r.status, status, "{}", r.body);
    let body = r.json();
    assert_eq!(body["code"], code, "{}", r.body);
    body
}

fn names(r: &Reply) -> Vec<(String, i64)> {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["account"].as_str().unwrap().to_owned(),
                a["balance"].as_i64().unwrap(),
            )
        })
        .collect()
}

fn fact_accounts(r: &Reply) -> Vec<String> {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["facts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let account = f.get("account").or_else(|| f["command"].get("account"));
            account.and_then(Value::as_str).unwrap_or("-").to_owned()
        })
        .collect()
}

fn refund(h: &Http, key: &str, withdrawal: &str, amount: u64) -> Reply {
    h.post(
        "/v1/refunds",
        Some(key),
        &json!({"withdrawal": withdrawal, "amount": amount}).to_string(),
    )
}

/// The whole check, against a worker started with `TOKENS` and the operator token `s-admin`.
fn two_tenants_on_every_endpoint(worker: &Worker) {
    let anon = worker.http();
    let shop = anon.with_token("s-shop");
    let other = anon.with_token("s-other");
    let shop_read = anon.with_token("s-shop-read");
    let checkout = anon.with_token("s-shop-checkout");
    let payouts = anon.with_token("s-other-payouts");
    let admin = anon.with_token("s-admin");

    // Who: a missing token and a wrong one are told apart; neither changes anything.
    let missing = expect(&anon.deposit("k", "alice", 100), 401, "unauthorized");
    assert_eq!(missing["title"], "This worker needs a token.");
    let wrong = expect(
        &anon.with_token("s-nope").deposit("k", "alice", 100),
        401,
        "unauthorized",
    );
    assert_eq!(wrong["title"], "This token is not accepted.");

    // The scenario a user reported: `other` withdrew from `shop`'s `alice`.
    let d = shop.deposit("d-1", "alice", 1_000);
    assert_eq!(d.status, 201, "{}", d.body);
    assert_eq!(d.json()["account"], "alice");
    let w = expect(
        &other.withdraw("w-1", "alice", 900),
        422,
        "account_not_found",
    );
    assert_eq!(w["account"], "alice");
    assert_eq!(shop.balance("alice"), 1_000);
    // `other` cannot write a name in `shop`'s space either: it is not an account name.
    expect(
        &other.withdraw("w-2", "shop/alice", 900),
        400,
        "invalid_request",
    );
    // Nor refund a withdrawal of `shop`: keys are the tenant's.
    assert_eq!(shop.withdraw("w-shop", "alice", 100).status, 201);
    expect(
        &refund(&other, "r-1", "w-shop", 100),
        422,
        "withdrawal_not_found",
    );
    assert_eq!(shop.balance("alice"), 900);
    // `other`'s own `alice` is another account.
    assert_eq!(other.deposit("d-1", "alice", 50).status, 201);
    assert_eq!((shop.balance("alice"), other.balance("alice")), (900, 50));

    // Reads of an account: the other tenant's, a system account, a ledger-wide name all
    // answer as an account that does not exist.
    for path in [
        "/v1/accounts/ghost",
        "/v1/accounts/shop%2Falice",
        "/v1/accounts/@world",
        "/v1/accounts/ghost/facts",
        "/v1/accounts/shop%2Falice/facts",
        "/v1/accounts/@payouts/facts",
    ] {
        expect(&other.get(path), 404, "account_not_found");
    }
    assert_eq!(admin.balance("shop%2Falice"), 900);
    assert_eq!(admin.balance("other%2Falice"), 50);

    // Lists: each tenant its own accounts in its own names, sums of its own; the
    // operator everything, ledger-wide, and the books balance.
    let shop_accounts = shop.get("/v1/accounts");
    assert_eq!(names(&shop_accounts), [("alice".to_owned(), 900)]);
    assert_eq!(shop_accounts.json()["sums"], json!({"RUB": 900}));
    assert_eq!(
        names(&other.get("/v1/accounts")),
        [("alice".to_owned(), 50)]
    );
    let all = admin.get("/v1/accounts");
    let all_names: Vec<String> = names(&all).into_iter().map(|(n, _)| n).collect();
    for n in ["@payouts", "@world", "other/alice", "shop/alice"] {
        assert!(all_names.iter().any(|a| a == n), "{n} in {all_names:?}");
    }
    assert_eq!(all.json()["sums"], json!({"RUB": 0}));

    // Statements and the log: own facts, own names.
    let statement = shop.get("/v1/accounts/alice/facts");
    assert_eq!(fact_accounts(&statement), ["alice", "alice"]);
    assert_eq!(statement.json()["account"], "alice");
    assert_eq!(fact_accounts(&shop.get("/v1/facts")), ["alice", "alice"]);
    assert_eq!(
        fact_accounts(&other.get("/v1/facts")),
        ["alice", "-", "alice"]
    );
    let everything = fact_accounts(&admin.get("/v1/facts"));
    assert_eq!(everything.len(), 5);
    assert!(
        everything.contains(&"shop/alice".to_owned()),
        "{everything:?}"
    );

    // Keys: each tenant its own, in its own names; one key name, two tenants, two keys.
    let shop_key = shop.get("/v1/keys/d-1").json();
    assert_eq!(
        (shop_key["account"].clone(), shop_key["amount"].clone()),
        (json!("alice"), json!(1_000))
    );
    assert_eq!(other.get("/v1/keys/d-1").json()["amount"], 50);
    expect(&other.get("/v1/keys/w-shop"), 404, "key_not_found");
    let listed = other.get("/v1/keys").json();
    let keys: Vec<&str> = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    // `w-2` was refused before the ledger saw it (400): no key.
    assert_eq!(keys, ["d-1", "r-1", "w-1"]);
    // A replay answers in the tenant's names, byte for byte.
    let again = shop.deposit("d-1", "alice", 1_000);
    assert!(again.replayed);
    assert_eq!(again.body, d.body);

    // Roles: read only, and command kinds.
    let r = expect(&shop_read.deposit("d-r", "alice", 5), 403, "forbidden");
    assert_eq!(r["detail"], "this token may only read");
    assert_eq!(shop_read.balance("alice"), 900);
    assert_eq!(fact_accounts(&shop_read.get("/v1/facts")).len(), 2);
    let c = expect(&checkout.withdraw("w-c", "alice", 5), 403, "forbidden");
    assert_eq!(c["detail"], "this token may send deposit commands only");
    assert_eq!(checkout.deposit("d-c", "alice", 5).status, 201);
    assert_eq!(shop.balance("alice"), 905);
    expect(&payouts.deposit("d-p", "alice", 5), 403, "forbidden");
    assert_eq!(payouts.withdraw("w-p", "alice", 5).status, 201);
    assert_eq!(other.balance("alice"), 45);
    // A refused command leaves its key unused: the same key goes through afterwards.
    assert_eq!(shop.deposit("d-r", "alice", 5).status, 201);

    // The operator reads everything and moves nothing; a tenant reads no operator feed.
    expect(&admin.deposit("d-a", "alice", 5), 403, "forbidden");
    expect(&admin.get("/v1/keys"), 403, "forbidden");
    expect(&admin.get("/v1/keys/d-1"), 403, "forbidden");
    for path in [
        "/v1/live/snapshot",
        "/v1/live/keys",
        "/v1/live/keys/shop/d-1",
        "/v1/live/quarantine",
        "/v1/live/stream",
    ] {
        expect(&shop.get(path), 403, "forbidden");
        expect(&anon.get(path), 401, "unauthorized");
        if path != "/v1/live/stream" {
            assert_eq!(admin.get(path).status, 200, "{path}");
        }
    }
    let live = admin.get("/v1/live/keys/shop/d-1").json();
    assert_eq!(live["account"], "shop/alice");

    // Open to all: health, metrics and the API's description.
    for path in ["/healthz", "/metrics", "/openapi.json"] {
        assert_eq!(anon.get(path).status, 200, "{path}");
    }

    // Paging the accounts, as the operator: one at a time, every account once.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            None => "/v1/accounts?limit=1".to_owned(),
            Some(a) => format!("/v1/accounts?limit=1&after={}", a.replace('/', "%2F")),
        };
        let page = admin.get(&path);
        let rows = names(&page);
        assert!(rows.len() <= 2, "{rows:?}"); // a system account: a row per currency
        seen.extend(rows.into_iter().map(|(n, _)| n));
        match page.json()["next"].as_str() {
            Some(n) => after = Some(n.to_owned()),
            None => break,
        }
    }
    seen.dedup();
    assert_eq!(seen, ["@payouts", "@world", "other/alice", "shop/alice"]);
}

fn worker_args(tokens: &std::path::Path) -> Vec<String> {
    vec![
        "--tokens-file".into(),
        tokens.to_str().unwrap().into(),
        "--admin-token".into(),
        "s-admin".into(),
    ]
}

#[test]
fn two_tenants_on_every_endpoint_on_sled() {
    let (dir, db) = scratch();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, TOKENS).unwrap();
    let args = worker_args(&tokens);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let worker = Worker::start(&db, &args);
    two_tenants_on_every_endpoint(&worker);
}

#[test]
fn two_tenants_on_every_endpoint_on_postgres() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some(pg) = runtime.block_on(PgTestDb::create(
        "worker::tenants::two_tenants_on_every_endpoint_on_postgres",
        "idem_tenants",
    )) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, TOKENS).unwrap();
    let args = worker_args(&tokens);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let worker = Worker::start_store(&pg.url, &dir.path().join("w.log"), &args);
    two_tenants_on_every_endpoint(&worker);
    assert_eq!(worker.term().code(), Some(0));
    runtime.block_on(pg.drop_now());
}
