//! Group commit on PostgreSQL: what a group of commands in one transaction must keep.
//! Each test holds the store's only lane busy (a session holds an account's row, so the
//! lane's group waits on it) while more commands queue, so the next group is known to
//! hold them together.
//!
//! PostgreSQL is found at `IDEM_TEST_PG_URL`, as for the conformance suite; without it the
//! tests say SKIPPED, or fail when `IDEM_REQUIRE_SERVICES=1` (see `ledger::testing`).

use std::sync::Arc;
use std::time::Duration;

use ledger::testing::PgTestDb;
use ledger::*;

use crate::support::*;

/// A fresh database and a store on it with one lane, so every command meets in it.
async fn one_lane(test: &str) -> Option<(PgTestDb, Arc<dyn Store>, tokio_postgres::Client)> {
    let db = PgTestDb::create(test, "idem_group").await?;
    let rules = Rules {
        retention: Duration::from_secs(24 * 3600),
        lease: Duration::from_secs(10),
        clock: Arc::new(SystemClock),
    };
    let config = PgConfig::default().pool_size(1);
    let (store, _) = PgStore::open(&db.url, rules, config).await.unwrap();
    let (session, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    Some((db, Arc::new(store), session))
}

fn spawn(
    store: &Arc<dyn Store>,
    k: &str,
    command: Command,
) -> tokio::task::JoinHandle<Result<Submission, LedgerError>> {
    let (store, k) = (store.clone(), key(k));
    tokio::spawn(async move { store.submit(&client(), &k, command, None).await })
}

/// Holds `account`'s row from another session: the lane's group that touches it waits.
async fn hold(session: &tokio_postgres::Client, account: &str) {
    session
        .batch_execute(&format!(
            "BEGIN; SELECT * FROM idem.accounts WHERE account = '{account}' FOR UPDATE"
        ))
        .await
        .unwrap();
}

/// Waits until the lane's group waits on the held row, as seen from a session of its own
/// outside any transaction (inside one, `pg_stat_activity` is read once and kept).
async fn until_the_group_waits(url: &str) {
    let (watcher, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    for _ in 0..500 {
        let n: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE '%idem_claim_group%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the group never waited on the held row");
}

/// Waits until `n` commands are in flight in the store (claimed, waiting for a group).
async fn until_pending(store: &Arc<dyn Store>, n: usize) {
    for _ in 0..500 {
        if store.pending().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("{} in flight, expected {n}", store.pending().len());
}

async fn balance(store: &Arc<dyn Store>, a: &str) -> Option<i128> {
    store
        .account(&Account::parse(a).unwrap())
        .await
        .unwrap()
        .and_then(|per| per.get(&rub()).copied())
}

/// Twenty withdrawals of 100 from a balance of 1,000 in one group: the first ten apply,
/// each seeing the balance the one before left, and the other ten are rejected for
/// insufficient funds, each its own fact; the group is one commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_decides_in_arrival_order_and_a_rejection_rejects_only_its_command() {
    let test = "pg_groups::a_group_decides_in_arrival_order";
    let Some((db, store, session)) = one_lane(test).await else {
        return;
    };
    executed(
        store
            .submit(&client(), &key("d-0"), deposit("alice", 1_000, rub()), None)
            .await
            .unwrap(),
    );
    hold(&session, "alice").await;
    let first = spawn(&store, "d-1", deposit("alice", 1, rub()));
    until_the_group_waits(&db.url).await;
    let mut withdrawals = Vec::new();
    for i in 0..20 {
        withdrawals.push(spawn(
            &store,
            &format!("w-{i}"),
            withdraw("alice", 100, rub()),
        ));
        until_pending(&store, i + 2).await;
    }
    let before = store.commit_metrics();
    session.batch_execute("COMMIT").await.unwrap();
    executed(first.await.unwrap().unwrap());
    let mut balances = Vec::new();
    let mut rejected = 0;
    for w in withdrawals {
        match executed(w.await.unwrap().unwrap()) {
            Outcome::Applied(r) => balances.push(r.balance),
            Outcome::Rejected(r) => {
                assert_eq!(r.rejection, Rejection::InsufficientFunds);
                rejected += 1;
            }
        }
    }
    assert_eq!(
        balances,
        (0..10).map(|i| 901 - 100 * i).collect::<Vec<u128>>()
    );
    assert_eq!(rejected, 10);
    assert_eq!(balance(&store, "alice").await, Some(1));
    let after = store.commit_metrics();
    assert_eq!(after.batches - before.batches, 2, "{after:?}");
    assert_eq!(after.batch_size_max, 20, "{after:?}");
    let report = store.verify().await.unwrap();
    assert!(report.ok(), "{report}");
    store.shutdown().await;
    db.drop_now().await;
}

/// A withdrawal and a refund of it in one group: the refund is decided against the
/// withdrawal its group decided before it, not told 409 or `withdrawal_not_found`; a
/// second refund past what is left is rejected; replays give the first answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_reads_a_withdrawal_decided_earlier_in_its_group() {
    let test = "pg_groups::a_refund_reads_a_withdrawal_decided_earlier_in_its_group";
    let Some((db, store, session)) = one_lane(test).await else {
        return;
    };
    executed(
        store
            .submit(&client(), &key("d-0"), deposit("alice", 500, rub()), None)
            .await
            .unwrap(),
    );
    hold(&session, "alice").await;
    let first = spawn(&store, "d-1", deposit("alice", 1, rub()));
    until_the_group_waits(&db.url).await;
    let w = spawn(&store, "w-1", withdraw("alice", 100, rub()));
    until_pending(&store, 2).await;
    let r1 = spawn(&store, "r-1", refund("w-1", 60));
    until_pending(&store, 3).await;
    let r2 = spawn(&store, "r-2", refund("w-1", 60));
    until_pending(&store, 4).await;
    session.batch_execute("COMMIT").await.unwrap();
    executed(first.await.unwrap().unwrap());
    let w = executed(w.await.unwrap().unwrap());
    let r1 = executed(r1.await.unwrap().unwrap());
    let r2 = executed(r2.await.unwrap().unwrap());
    match (&w, &r1, &r2) {
        (Outcome::Applied(w), Outcome::Applied(r1), Outcome::Rejected(r2)) => {
            assert_eq!(w.balance, 401);
            assert_eq!((r1.balance, r1.refunded_total), (461, Some(60)));
            assert_eq!(r2.rejection, Rejection::RefundExceedsWithdrawal);
        }
        other => panic!("{other:?}"),
    }
    for (k, command, first) in [
        ("w-1", withdraw("alice", 100, rub()), w),
        ("r-1", refund("w-1", 60), r1),
        ("r-2", refund("w-1", 60), r2),
    ] {
        match store
            .submit(&client(), &key(k), command, None)
            .await
            .unwrap()
        {
            Submission::Replayed(o) => assert_eq!(o, first),
            other => panic!("{k}: {other:?}"),
        }
    }
    let report = store.verify().await.unwrap();
    assert!(report.ok(), "{report}");
    store.shutdown().await;
    db.drop_now().await;
}

/// A command whose write disagrees with its decision (a withdrawal's refundable amount
/// lowered behind the ledger's back) fails its group's transaction: the group is split
/// until that command is answered alone with the error, and the others in it commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_that_fails_its_group_is_split_out_and_the_others_commit() {
    let test = "pg_groups::a_command_that_fails_its_group_is_split_out";
    let Some((db, store, session)) = one_lane(test).await else {
        return;
    };
    executed(
        store
            .submit(&client(), &key("d-0"), deposit("alice", 500, rub()), None)
            .await
            .unwrap(),
    );
    executed(
        store
            .submit(&client(), &key("w-1"), withdraw("alice", 100, rub()), None)
            .await
            .unwrap(),
    );
    executed(
        store
            .submit(&client(), &key("r-1"), refund("w-1", 30), None)
            .await
            .unwrap(),
    );
    session
        .batch_execute("UPDATE idem.refunded SET withdrawn = 40")
        .await
        .unwrap();
    hold(&session, "alice").await;
    let first = spawn(&store, "d-1", deposit("alice", 1, rub()));
    until_the_group_waits(&db.url).await;
    let mut deposits = Vec::new();
    for i in 0..3 {
        deposits.push(spawn(&store, &format!("b-{i}"), deposit("bob", 10, rub())));
        until_pending(&store, i + 2).await;
    }
    let bad = spawn(&store, "r-2", refund("w-1", 30));
    until_pending(&store, 5).await;
    for i in 3..6 {
        deposits.push(spawn(&store, &format!("b-{i}"), deposit("bob", 10, rub())));
        until_pending(&store, i + 3).await;
    }
    session.batch_execute("COMMIT").await.unwrap();
    executed(first.await.unwrap().unwrap());
    match bad.await.unwrap() {
        Err(LedgerError::Unavailable(why)) => assert!(why.contains("refunded total"), "{why}"),
        other => panic!("expected the refund's disagreement, got {other:?}"),
    }
    for d in deposits {
        executed(d.await.unwrap().unwrap());
    }
    assert_eq!(balance(&store, "bob").await, Some(60));
    assert!(store.key(&client(), &key("r-2")).await.unwrap().is_none());
    store.shutdown().await;
    db.drop_now().await;
}

/// A group whose transaction fails while the next group's claim rides behind its COMMIT:
/// that claim is rolled back before the failed group runs again (it holds the pool's only
/// connection, and rows the failed group's next attempt may lock), the failed group is
/// split until its bad command is answered alone, and the next group then commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_that_fails_under_the_next_claim_lets_that_claim_go() {
    let test = "pg_groups::a_group_that_fails_under_the_next_claim";
    let Some((db, store, session)) = one_lane(test).await else {
        return;
    };
    for (k, command) in [
        ("d-0", deposit("alice", 500, rub())),
        ("w-1", withdraw("alice", 100, rub())),
        ("r-1", refund("w-1", 30)),
        ("b-0", deposit("bob", 10, rub())),
    ] {
        executed(
            store
                .submit(&client(), &key(k), command, None)
                .await
                .unwrap(),
        );
    }
    session
        .batch_execute("UPDATE idem.refunded SET withdrawn = 40")
        .await
        .unwrap();
    let (bobs, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    hold(&session, "alice").await;
    hold(&bobs, "bob").await;
    // Group A, alone on its own task (the lane was idle), waits on alice; group B (the
    // bad refund, two deposits to bob) queues.
    let first = spawn(&store, "d-1", deposit("alice", 1, rub()));
    until_the_group_waits(&db.url).await;
    let bad = spawn(&store, "r-2", refund("w-1", 30));
    until_pending(&store, 2).await;
    let mut deposits = Vec::new();
    for i in 1..3 {
        deposits.push(spawn(&store, &format!("b-{i}"), deposit("bob", 10, rub())));
        until_pending(&store, i + 2).await;
    }
    let before = store.commit_metrics();
    // A commits; the lane gathers B, whose claim waits on bob.
    session.batch_execute("COMMIT").await.unwrap();
    executed(first.await.unwrap().unwrap());
    assert_eq!(store.commit_metrics().pipelined, before.pipelined);
    until_the_group_waits(&db.url).await;
    // Group C queues; once bob is free, B is decided and its apply fails with C's
    // claim sent behind it.
    let late = spawn(&store, "c-1", deposit("carol", 5, rub()));
    until_pending(&store, 4).await;
    bobs.batch_execute("COMMIT").await.unwrap();
    match bad.await.unwrap() {
        Err(LedgerError::Unavailable(why)) => assert!(why.contains("refunded total"), "{why}"),
        other => panic!("expected the refund's disagreement, got {other:?}"),
    }
    for d in deposits {
        executed(d.await.unwrap().unwrap());
    }
    executed(late.await.unwrap().unwrap());
    assert_eq!(balance(&store, "bob").await, Some(30));
    assert_eq!(balance(&store, "carol").await, Some(5));
    assert!(store.key(&client(), &key("r-2")).await.unwrap().is_none());
    let after = store.commit_metrics();
    // C's claim was sent behind B's COMMIT, once.
    assert_eq!(after.pipelined - before.pipelined, 1, "{after:?}");
    store.shutdown().await;
    db.drop_now().await;
}

/// A group of one does not wait: with the lane idle, a command's answer does not include
/// any gathering, and every group is one command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_command_at_a_time_makes_groups_of_one() {
    let test = "pg_groups::one_command_at_a_time_makes_groups_of_one";
    let Some((db, store, _session)) = one_lane(test).await else {
        return;
    };
    for i in 0..20 {
        executed(
            store
                .submit(
                    &client(),
                    &key(&format!("d-{i}")),
                    deposit("alice", 1, rub()),
                    None,
                )
                .await
                .unwrap(),
        );
    }
    let m = store.commit_metrics();
    assert_eq!(
        (m.batches, m.commands, m.batch_size_max),
        (20, 20, 1),
        "{m:?}"
    );
    // The first of each group began its transaction as soon as it was queued.
    assert!(m.batch_wait_max_us < 5_000, "{m:?}");
    store.shutdown().await;
    db.drop_now().await;
}

/// The settings a server must run with for its commits to be durable: each one off is
/// named in the refusal (`fsync` and `full_page_writes` are server-wide, so the suite's
/// shared server is not turned unsafe to see the open refuse; every other test here opens
/// a store through the same check on a server with both on).
#[test]
fn a_server_that_may_lose_acknowledged_commits_is_refused() {
    use ledger::store::pg::unsafe_settings;
    assert_eq!(unsafe_settings("on", "on"), None);
    let refusal = unsafe_settings("off", "on").unwrap();
    assert!(refusal.contains("fsync = off"), "{refusal}");
    assert!(!refusal.contains("full_page_writes"), "{refusal}");
    assert!(refusal.contains("--pg-allow-unsafe-settings"), "{refusal}");
    let refusal = unsafe_settings("on", "off").unwrap();
    assert!(refusal.contains("full_page_writes = off"), "{refusal}");
    let refusal = unsafe_settings("off", "off").unwrap();
    assert!(
        refusal.contains("fsync = off, full_page_writes = off"),
        "{refusal}"
    );
}
