//! The conformance suite: one set of scenarios, each written once against `dyn Store`, run
//! on both stores (`sled_store::*` on a temporary folder, `postgres::*` on a fresh
//! database per test). A store that passes keeps the guarantees of docs/contract.md the way the other does.
//!
//! PostgreSQL is found at `IDEM_TEST_PG_URL` (default `postgres://postgres@127.0.0.1:5432/
//! postgres`). When it is not reachable the PostgreSQL tests say SKIPPED on stderr, or fail
//! when `IDEM_REQUIRE_SERVICES=1` (see `ledger::testing`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ledger::testing::PgTestDb;
use ledger::*;

use crate::support::*;

const START_MS: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
const HOUR_MS: i64 = 3_600_000;
const RETENTION: Duration = Duration::from_secs(24 * 3600);

// ---- the two stores --------------------------------------------------------------------

enum Backing {
    Sled(tempfile::TempDir),
    Pg(PgTestDb),
}

/// One test's store: where it lives and the hand-moved clock it reads. `open` opens it
/// (again, after a shutdown: the same folder or database).
struct Env {
    backing: Backing,
    clock: ManualClock,
}

impl Env {
    fn sled() -> Env {
        Env {
            backing: Backing::Sled(tempfile::tempdir().unwrap()),
            clock: ManualClock::new(Timestamp(START_MS)),
        }
    }

    async fn pg(test: &str) -> Option<Env> {
        let db = PgTestDb::create(test, "idem_conf").await?;
        Some(Env {
            backing: Backing::Pg(db),
            clock: ManualClock::new(Timestamp(START_MS)),
        })
    }

    fn rules(&self) -> Rules {
        Rules {
            retention: RETENTION,
            lease: Duration::from_secs(10),
            clock: Arc::new(self.clock.clone()),
        }
    }

    async fn open(&self) -> Arc<dyn Store> {
        self.open_with_handle().await.0
    }

    /// [`Env::open`], with the sled store's own handle too, for what only it offers
    /// (holding its committer); `None` on PostgreSQL.
    async fn open_with_handle(&self) -> (Arc<dyn Store>, Option<SledStore>) {
        self.open_waiting(None).await
    }

    /// [`Env::open_with_handle`], with the store's wait for a twin in flight set to
    /// `in_flight_wait` (each store's default when `None`).
    async fn open_waiting(
        &self,
        in_flight_wait: Option<Duration>,
    ) -> (Arc<dyn Store>, Option<SledStore>) {
        self.open_with(in_flight_wait, None).await
    }

    /// [`Env::open_waiting`], with `pg_lanes` lanes on PostgreSQL (its default when
    /// `None`; sled has none).
    async fn open_with(
        &self,
        in_flight_wait: Option<Duration>,
        pg_lanes: Option<usize>,
    ) -> (Arc<dyn Store>, Option<SledStore>) {
        let rules = self.rules();
        match &self.backing {
            Backing::Sled(dir) => {
                let mut config = SledConfig::new(dir.path().join("ledger"))
                    .clock(rules.clock)
                    .retention(rules.retention)
                    .lease(rules.lease);
                if let Some(wait) = in_flight_wait {
                    config = config.in_flight_wait(wait);
                }
                let (ledger, _) = tokio::task::spawn_blocking(move || SledStore::open(config))
                    .await
                    .unwrap()
                    .unwrap();
                (Arc::new(ledger.clone()), Some(ledger))
            }
            Backing::Pg(db) => {
                let mut config = PgConfig::default();
                if let Some(wait) = in_flight_wait {
                    config = config.in_flight_wait(wait);
                }
                if let Some(lanes) = pg_lanes {
                    config = config.lanes(lanes);
                }
                let (store, _) = PgStore::open(&db.url, rules, config).await.unwrap();
                (Arc::new(store), None)
            }
        }
    }

    /// A second handle on the same data, as a second worker would have: only PostgreSQL
    /// can be shared by two processes.
    async fn open_another(&self) -> Option<Arc<dyn Store>> {
        match &self.backing {
            Backing::Sled(_) => None,
            Backing::Pg(_) => Some(self.open().await),
        }
    }

    async fn finish(self) {
        if let Backing::Pg(db) = self.backing {
            db.drop_now().await;
        }
    }
}

/// Closes a store and waits until its files or connections are released.
async fn close(store: Arc<dyn Store>) {
    store.shutdown().await;
    drop(store);
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sled_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let env = super::Env::sled();
                    super::$name(&env).await;
                    env.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let test = concat!("postgres::", stringify!($name));
                    let Some(env) = super::Env::pg(test).await else { return };
                    super::$name(&env).await;
                    env.finish().await;
                }
            )*
        }
    };
}

conformance!(
    a_new_key_is_applied_and_its_replay_is_byte_identical,
    the_same_key_with_another_command_is_refused_and_changes_nothing,
    insufficient_funds_is_recorded_and_replayed_even_after_a_deposit,
    currency_mismatch_is_rejected_both_ways,
    an_unknown_account_cannot_be_withdrawn_from,
    refunds_add_up_to_at_most_the_withdrawal_and_are_idempotent,
    concurrent_identical_submits_make_one_fact,
    concurrent_withdrawals_never_overdraw,
    the_inbox_replays_a_redelivery_and_quarantines_a_reused_message_id,
    a_message_and_a_direct_submit_with_one_key_make_one_effect,
    expired_keys_still_answer_and_move_nothing,
    a_clock_that_steps_back_never_makes_a_fact_earlier,
    verify_holds_and_counts,
    keys_are_paged_and_filtered,
    facts_are_paged_in_order,
    balances_sum_to_zero_per_currency,
    reopening_keeps_everything,
    after_shutdown_submissions_are_refused,
    two_workers_on_one_store_make_one_effect_per_key,
    retries_of_a_done_key_are_replayed_while_a_twin_holds_a_claim,
    a_refund_of_a_withdrawal_in_flight_is_in_progress_until_it_is_decided,
    a_twin_during_the_first_attempt_gets_the_replay_after_a_short_wait,
    a_reused_message_id_is_quarantined_while_its_key_is_claimed,
    rejections_tell_their_figure_and_replay_it_byte_for_byte,
    a_statement_lists_one_account_s_movements_in_order_with_balances,
    replays_and_conflicts_are_counted_across_a_clean_restart,
    two_tenants_accounts_of_one_name_are_two_accounts,
    a_balance_is_read_at_any_point_of_the_log,
);

// ---- helpers --------------------------------------------------------------------------

/// The bytes a client gets for an outcome.
fn body(o: &Outcome) -> String {
    serde_json::to_string(&json::outcome(o)).unwrap()
}

fn replayed(s: Submission) -> Outcome {
    match s {
        Submission::Replayed(o) => o,
        other => panic!("expected Replayed, got {other:?}"),
    }
}

fn applied(o: &Outcome) -> &Receipt {
    match o {
        Outcome::Applied(r) => r,
        Outcome::Rejected(r) => panic!("expected applied, got {:?}", r.rejection),
    }
}

async fn balance(store: &Arc<dyn Store>, a: &str, c: Currency) -> Option<i128> {
    store
        .account(&Account::parse_any(a).unwrap())
        .await
        .unwrap()
        .and_then(|per| per.get(&c).copied())
}

async fn fact_count(store: &Arc<dyn Store>) -> usize {
    store.facts(0, 1_000_000).await.unwrap().len()
}

async fn assert_verified(store: &Arc<dyn Store>) -> VerifyReport {
    let report = store.verify().await.unwrap();
    assert!(report.ok(), "{report}");
    report
}

/// Submits until the answer is not "in progress" (a twin of it is still committing).
async fn settle(store: &Arc<dyn Store>, k: &str, command: Command) -> Submission {
    for _ in 0..500 {
        match submit(store, k, command.clone()).await {
            Submission::InProgress { .. } => tokio::time::sleep(Duration::from_millis(5)).await,
            other => return other,
        }
    }
    panic!("{k} stayed in progress");
}

// ---- the scenarios --------------------------------------------------------------------

async fn a_new_key_is_applied_and_its_replay_is_byte_identical(env: &Env) {
    let store = env.open().await;
    let first = executed(submit(&store, "d-1", deposit("alice", 1_000, rub())).await);
    let receipt = applied(&first);
    assert_eq!(receipt.balance, 1_000);
    assert_eq!(receipt.created_at, Timestamp(START_MS));
    assert_eq!(balance(&store, "alice", rub()).await, Some(1_000));
    assert_eq!(balance(&store, "@world", rub()).await, Some(-1_000));

    env.clock.advance_ms(5_000);
    for _ in 0..3 {
        let again = replayed(submit(&store, "d-1", deposit("alice", 1_000, rub())).await);
        assert_eq!(again, first);
        assert_eq!(body(&again), body(&first));
    }
    assert_eq!(balance(&store, "alice", rub()).await, Some(1_000));
    assert_eq!(fact_count(&store).await, 1);
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.applied, [1, 0, 0]);
    assert_eq!(stats.keys_done, 1);
    assert_eq!(stats.observed.replayed, 3);
    let info = store.key(&client(), &key("d-1")).await.unwrap().unwrap();
    assert_eq!(info.status, KeyStatus::Done);
    assert_eq!(info.outcome.as_ref(), Some(&first));
    assert!(store.key(&client(), &key("nope")).await.unwrap().is_none());
    // Another client's key of the same name is its own.
    let other = ClientId::parse("bob-shop").unwrap();
    let theirs = store
        .submit(&other, &key("d-1"), deposit("bob", 5, rub()), None)
        .await
        .unwrap();
    assert!(matches!(theirs, Submission::Executed(_)), "{theirs:?}");
    close(store).await;
}

async fn the_same_key_with_another_command_is_refused_and_changes_nothing(env: &Env) {
    let store = env.open().await;
    executed(submit(&store, "d-1", deposit("alice", 1_000, rub())).await);
    let before = store.balances().await.unwrap();
    for other in [
        deposit("alice", 999, rub()),
        deposit("bob", 1_000, rub()),
        deposit("alice", 1_000, usd()),
        withdraw("alice", 1_000, rub()),
        refund("d-1", 1_000),
    ] {
        assert_eq!(submit(&store, "d-1", other).await, Submission::Reused);
    }
    assert_eq!(store.balances().await.unwrap(), before);
    assert_eq!(fact_count(&store).await, 1);
    assert_eq!(store.stats().await.unwrap().observed.conflicts_reused, 5);
    // The original command still replays.
    replayed(submit(&store, "d-1", deposit("alice", 1_000, rub())).await);
    close(store).await;
}

async fn insufficient_funds_is_recorded_and_replayed_even_after_a_deposit(env: &Env) {
    let store = env.open().await;
    executed(submit(&store, "d-1", deposit("alice", 100, rub())).await);
    let rejected = executed(submit(&store, "w-1", withdraw("alice", 300, rub())).await);
    assert_eq!(rejected.rejection(), Some(Rejection::InsufficientFunds));
    executed(submit(&store, "d-2", deposit("alice", 1_000, rub())).await);
    // Now the money is there, but the key's outcome is final.
    let again = replayed(submit(&store, "w-1", withdraw("alice", 300, rub())).await);
    assert_eq!(body(&again), body(&rejected));
    assert_eq!(balance(&store, "alice", rub()).await, Some(1_100));
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.applied, [2, 0, 0]);
    assert_eq!(stats.rejected[Rejection::InsufficientFunds as usize], 1);
    assert_eq!(stats.keys_done, 3);
    close(store).await;
}

async fn currency_mismatch_is_rejected_both_ways(env: &Env) {
    let store = env.open().await;
    executed(submit(&store, "d-1", deposit("alice", 100, rub())).await);
    let o = executed(submit(&store, "d-2", deposit("alice", 100, usd())).await);
    assert_eq!(o.rejection(), Some(Rejection::CurrencyMismatch));
    let o = executed(submit(&store, "w-1", withdraw("alice", 10, usd())).await);
    assert_eq!(o.rejection(), Some(Rejection::CurrencyMismatch));
    let per = store.account(&acct("alice")).await.unwrap().unwrap();
    assert_eq!(per.len(), 1);
    assert_eq!(per[&rub()], 100);
    assert!(balance(&store, "@world", usd()).await.is_none());
    close(store).await;
}

async fn an_unknown_account_cannot_be_withdrawn_from(env: &Env) {
    let store = env.open().await;
    let o = executed(submit(&store, "w-1", withdraw("ghost", 10, rub())).await);
    assert_eq!(o.rejection(), Some(Rejection::AccountNotFound));
    assert!(store.account(&acct("ghost")).await.unwrap().is_none());
    assert_eq!(
        replayed(submit(&store, "w-1", withdraw("ghost", 10, rub())).await),
        o
    );
    close(store).await;
}

async fn refunds_add_up_to_at_most_the_withdrawal_and_are_idempotent(env: &Env) {
    let store = env.open().await;
    executed(submit(&store, "d-1", deposit("alice", 1_000, rub())).await);
    executed(submit(&store, "w-1", withdraw("alice", 300, rub())).await);
    let r1 = executed(submit(&store, "r-1", refund("w-1", 100)).await);
    let receipt = applied(&r1);
    assert_eq!((receipt.balance, receipt.refunded_total), (800, Some(100)));
    assert_eq!(receipt.account, acct("alice"));
    let over = executed(submit(&store, "r-2", refund("w-1", 250)).await);
    assert_eq!(over.rejection(), Some(Rejection::RefundExceedsWithdrawal));
    let r3 = executed(submit(&store, "r-3", refund("w-1", 200)).await);
    assert_eq!(applied(&r3).refunded_total, Some(300));
    let over = executed(submit(&store, "r-4", refund("w-1", 1)).await);
    assert_eq!(over.rejection(), Some(Rejection::RefundExceedsWithdrawal));

    // Unknown, rejected and non-withdrawal keys are no withdrawal.
    let o = executed(submit(&store, "r-5", refund("w-nope", 1)).await);
    assert_eq!(o.rejection(), Some(Rejection::WithdrawalNotFound));
    let w2 = executed(submit(&store, "w-2", withdraw("alice", 5_000, rub())).await);
    assert_eq!(w2.rejection(), Some(Rejection::InsufficientFunds));
    let o = executed(submit(&store, "r-6", refund("w-2", 1)).await);
    assert_eq!(o.rejection(), Some(Rejection::WithdrawalNotFound));
    let o = executed(submit(&store, "r-7", refund("d-1", 1)).await);
    assert_eq!(o.rejection(), Some(Rejection::WithdrawalNotFound));
    // Another client cannot refund this client's withdrawal.
    let other = ClientId::parse("mallory").unwrap();
    let theirs = store
        .submit(&other, &key("r-1"), refund("w-1", 1), None)
        .await
        .unwrap();
    assert_eq!(
        theirs.outcome().and_then(Outcome::rejection),
        Some(Rejection::WithdrawalNotFound)
    );

    // A refund is idempotent like any command.
    let again = replayed(submit(&store, "r-1", refund("w-1", 100)).await);
    assert_eq!(body(&again), body(&r1));
    assert_eq!(balance(&store, "alice", rub()).await, Some(1_000));
    assert_eq!(balance(&store, "@payouts", rub()).await, Some(0));
    assert_eq!(store.stats().await.unwrap().applied, [1, 1, 2]);
    assert_verified(&store).await;
    close(store).await;
}

async fn concurrent_identical_submits_make_one_fact(env: &Env) {
    let store = env.open().await;
    executed(submit(&store, "d-1", deposit("alice", 1_000, rub())).await);
    let barrier = Arc::new(tokio::sync::Barrier::new(48));
    let tasks: Vec<_> = (0..48)
        .map(|_| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                submit(&store, "pay-1", withdraw("alice", 300, rub())).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let firsts: Vec<_> = answers
        .iter()
        .filter_map(|a| match a {
            Submission::Executed(o) => Some(o.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(firsts.len(), 1, "{answers:?}");
    for a in &answers {
        match a {
            Submission::Executed(_) | Submission::InProgress { .. } => {}
            Submission::Replayed(o) => assert_eq!(o, &firsts[0]),
            other => panic!("unexpected {other:?}"),
        }
    }
    let settled = replayed(settle(&store, "pay-1", withdraw("alice", 300, rub())).await);
    assert_eq!(body(&settled), body(&firsts[0]));
    assert_eq!(balance(&store, "alice", rub()).await, Some(700));
    assert_eq!(fact_count(&store).await, 2);
    assert_verified(&store).await;
    close(store).await;
}

async fn concurrent_withdrawals_never_overdraw(env: &Env) {
    let store = env.open().await;
    executed(submit(&store, "d-1", deposit("alice", 100, rub())).await);
    let barrier = Arc::new(tokio::sync::Barrier::new(40));
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                submit(&store, &format!("w-{i}"), withdraw("alice", 10, rub())).await
            })
        })
        .collect();
    let mut applied_n = 0;
    for t in tasks {
        let o = executed(t.await.unwrap());
        if o.is_applied() {
            applied_n += 1;
        } else {
            assert_eq!(o.rejection(), Some(Rejection::InsufficientFunds));
        }
    }
    assert_eq!(applied_n, 10);
    assert_eq!(balance(&store, "alice", rub()).await, Some(0));
    assert_eq!(balance(&store, "@payouts", rub()).await, Some(100));
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.applied, [1, 10, 0]);
    assert_eq!(stats.rejected[Rejection::InsufficientFunds as usize], 30);
    assert_verified(&store).await;
    close(store).await;
}

async fn the_inbox_replays_a_redelivery_and_quarantines_a_reused_message_id(env: &Env) {
    let store = env.open().await;
    let first = executed(deliver(&store, "m-1", "k-1", deposit("alice", 100, rub())).await);
    let again = replayed(deliver(&store, "m-1", "k-1", deposit("alice", 100, rub())).await);
    assert_eq!(body(&again), body(&first));
    // The same message id with another key, or another command: refused and kept.
    let q = deliver(&store, "m-1", "k-2", deposit("alice", 50, rub())).await;
    assert!(matches!(q, Submission::Quarantined { .. }), "{q:?}");
    let q = deliver(&store, "m-1", "k-1", deposit("alice", 70, rub())).await;
    assert!(matches!(q, Submission::Quarantined { .. }), "{q:?}");
    assert_eq!(balance(&store, "alice", rub()).await, Some(100));
    assert_eq!(fact_count(&store).await, 1);
    assert!(store.key(&client(), &key("k-2")).await.unwrap().is_none());
    let kept = store.quarantined(0, 10).await.unwrap();
    assert_eq!(kept.len(), 2);
    assert!(kept.iter().all(|q| q.message_id.as_deref() == Some("m-1")));
    assert!(kept[0].id < kept[1].id);
    // Each kept whole, as decoded: the refused message, not a summary of it.
    let message: serde_json::Value = serde_json::from_str(&kept[1].payload).unwrap();
    assert_eq!(
        message,
        serde_json::json!({"message_id": "m-1", "key": "k-1", "client": "default",
            "command": {"type": "deposit", "account": "alice", "amount": 70, "currency": "RUB"}})
    );
    // The store keeps what the inbox itself could not parse, too.
    let id = store
        .quarantine(None, "invalid_json".into(), b"{nope\0".to_vec())
        .await
        .unwrap();
    let kept = store.quarantined(0, 10).await.unwrap();
    assert_eq!(kept.len(), 3);
    assert_eq!(kept[2].id, id);
    assert_eq!(kept[2].reason, "invalid_json");
    assert!(kept[2].payload.starts_with("{nope"));
    // Paged by id: a page starts after the last id of the one before.
    let page = store.quarantined(0, 2).await.unwrap();
    assert_eq!(page, kept[..2]);
    let next = store.quarantined(page[1].id, 2).await.unwrap();
    assert_eq!(next, kept[2..]);
    assert!(store.quarantined(id, 2).await.unwrap().is_empty());
    // The newest first, for an operator's screen.
    let newest = store.quarantined_newest(2).await.unwrap();
    assert_eq!(newest, [kept[2].clone(), kept[1].clone()]);
    assert_eq!(store.quarantined_newest(10).await.unwrap().len(), 3);
    assert_verified(&store).await;
    close(store).await;
}

async fn a_message_and_a_direct_submit_with_one_key_make_one_effect(env: &Env) {
    let store = env.open().await;
    let direct = executed(submit(&store, "k-5", deposit("alice", 10, rub())).await);
    let via_inbox = replayed(deliver(&store, "m-5", "k-5", deposit("alice", 10, rub())).await);
    assert_eq!(body(&via_inbox), body(&direct));
    // Its redelivery is known by id now too.
    replayed(deliver(&store, "m-5", "k-5", deposit("alice", 10, rub())).await);

    let first = executed(deliver(&store, "m-6", "k-6", deposit("alice", 10, rub())).await);
    let again = replayed(submit(&store, "k-6", deposit("alice", 10, rub())).await);
    assert_eq!(body(&again), body(&first));
    // A message under a key that holds another command is a reuse of the key.
    assert_eq!(
        deliver(&store, "m-7", "k-6", deposit("alice", 11, rub())).await,
        Submission::Reused
    );
    assert_eq!(balance(&store, "alice", rub()).await, Some(20));
    assert_eq!(fact_count(&store).await, 2);
    close(store).await;
}

async fn expired_keys_still_answer_and_move_nothing(env: &Env) {
    let store = env.open().await;
    let old = executed(submit(&store, "d-old", deposit("alice", 100, rub())).await);
    env.clock.advance_ms(23 * HOUR_MS);
    executed(submit(&store, "d-new", deposit("alice", 5, rub())).await);
    env.clock.advance_ms(HOUR_MS + 1);
    assert_eq!(store.sweep().await.unwrap(), 1);
    assert_eq!(store.sweep().await.unwrap(), 0);

    let info = store.key(&client(), &key("d-old")).await.unwrap().unwrap();
    assert_eq!(info.status, KeyStatus::Expired);
    assert_eq!(info.outcome.as_ref(), Some(&old));
    let new = store.key(&client(), &key("d-new")).await.unwrap().unwrap();
    assert_eq!(new.status, KeyStatus::Done);

    let again = replayed(submit(&store, "d-old", deposit("alice", 100, rub())).await);
    assert_eq!(body(&again), body(&old));
    assert_eq!(
        submit(&store, "d-old", deposit("alice", 101, rub())).await,
        Submission::Reused
    );
    assert_eq!(balance(&store, "alice", rub()).await, Some(105));
    assert_eq!(fact_count(&store).await, 2);
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.keys_done, stats.keys_expired), (1, 1));

    env.clock.advance_ms(24 * HOUR_MS);
    assert_eq!(store.sweep().await.unwrap(), 1);
    let report = assert_verified(&store).await;
    assert_eq!((report.keys_done, report.keys_expired), (0, 2));
    close(store).await;
}

async fn a_clock_that_steps_back_never_makes_a_fact_earlier(env: &Env) {
    let store = env.open().await;
    env.clock.advance_ms(10_000);
    let first = executed(submit(&store, "d-1", deposit("alice", 10, rub())).await);
    env.clock.advance_ms(-HOUR_MS);
    let second = executed(submit(&store, "d-2", deposit("alice", 10, rub())).await);
    let (t1, t2) = (applied(&first).created_at, applied(&second).created_at);
    assert!(t2 >= t1, "{t2:?} < {t1:?}");
    let facts = store.facts(0, 10).await.unwrap();
    assert!(facts.windows(2).all(|w| w[1].at >= w[0].at));
    // The sweep measures age with the clock as it is: neither key is old yet.
    assert_eq!(store.sweep().await.unwrap(), 0);
    env.clock.advance_ms(HOUR_MS + 25 * HOUR_MS);
    assert_eq!(store.sweep().await.unwrap(), 2);
    assert_verified(&store).await;
    close(store).await;
}

async fn verify_holds_and_counts(env: &Env) {
    let store = env.open().await;
    let empty = assert_verified(&store).await;
    assert_eq!((empty.facts, empty.accounts, empty.currencies), (0, 0, 0));
    assert!(empty.held.is_empty());
    executed(submit(&store, "d-1", deposit("alice", 500, rub())).await);
    executed(submit(&store, "d-2", deposit("bob", 70, usd())).await);
    executed(submit(&store, "w-1", withdraw("alice", 200, rub())).await);
    executed(submit(&store, "w-2", withdraw("bob", 100, usd())).await); // rejected
    executed(submit(&store, "r-1", refund("w-1", 50)).await);
    env.clock.advance_ms(25 * HOUR_MS);
    store.sweep().await.unwrap();
    executed(submit(&store, "d-3", deposit("carol", 1, rub())).await);
    let report = assert_verified(&store).await;
    assert_eq!(report.facts, 6);
    assert_eq!((report.keys_done, report.keys_expired), (1, 5));
    assert_eq!((report.accounts, report.currencies), (3, 2));
    // What the user accounts hold, from the fold: alice 500 - 200 + 50 and carol 1 in
    // RUB, bob 70 in USD (his withdrawal was rejected).
    assert_eq!(report.held, [(rub(), 351), (usd(), 70)].into());
    assert!(report.violations.is_empty());
    close(store).await;
}

async fn keys_are_paged_and_filtered(env: &Env) {
    let store = env.open().await;
    let shop = ClientId::parse("shop").unwrap();
    for i in 0..12 {
        let k = key(&format!("old-{i:02}"));
        store
            .submit(&client(), &k, deposit("alice", 1, rub()), None)
            .await
            .unwrap();
    }
    env.clock.advance_ms(25 * HOUR_MS);
    assert_eq!(store.sweep().await.unwrap(), 12);
    for i in 0..9 {
        let k = key(&format!("new-{i:02}"));
        store
            .submit(&client(), &k, deposit("alice", 1, rub()), None)
            .await
            .unwrap();
        store
            .submit(&shop, &k, deposit("shop-acct", 1, rub()), None)
            .await
            .unwrap();
    }

    // Following `next` visits every key once, in (client, key) order.
    let all = page_through(&store, None, None, 7).await;
    assert_eq!(all.len(), 30);
    let names: Vec<_> = all
        .iter()
        .map(|k| (k.client.as_str().to_owned(), k.key.as_str().to_owned()))
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(names.iter().collect::<HashSet<_>>().len(), 30);

    let expired = page_through(&store, Some(KeyStatus::Expired), None, 5).await;
    assert_eq!(expired.len(), 12);
    assert!(expired.iter().all(|k| k.status == KeyStatus::Expired
        && k.key.as_str().starts_with("old-")
        && k.outcome.is_some()));
    let done = page_through(&store, Some(KeyStatus::Done), None, 4).await;
    assert_eq!(done.len(), 18);
    let theirs = page_through(&store, None, Some(shop.clone()), 4).await;
    assert_eq!(theirs.len(), 9);
    assert!(theirs.iter().all(|k| k.client == shop));
    let pending = store
        .keys(KeyQuery {
            status: Some(KeyStatus::Pending),
            limit: 10,
            ..KeyQuery::default()
        })
        .await
        .unwrap();
    assert!(pending.keys.is_empty() && pending.next.is_none());
    assert!(store.pending().is_empty());
    close(store).await;
}

async fn page_through(
    store: &Arc<dyn Store>,
    status: Option<KeyStatus>,
    client: Option<ClientId>,
    limit: usize,
) -> Vec<KeyInfo> {
    let mut out = Vec::new();
    let mut after = None;
    for _ in 0..100 {
        let page = store
            .keys(KeyQuery {
                status,
                client: client.clone(),
                after: after.clone(),
                limit,
            })
            .await
            .unwrap();
        assert!(page.keys.len() <= limit);
        out.extend(page.keys);
        match page.next {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
    panic!("paging did not end");
}

async fn facts_are_paged_in_order(env: &Env) {
    let store = env.open().await;
    for i in 0..12 {
        executed(submit(&store, &format!("d-{i}"), deposit("alice", 1, rub())).await);
    }
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let page = store.facts(after, 5).await.unwrap();
        assert!(page.len() <= 5);
        let Some(last) = page.last() else { break };
        after = last.seq;
        seen.extend(page);
    }
    assert_eq!(seen.len(), 12);
    assert!(seen.windows(2).all(|w| w[0].seq < w[1].seq));
    let keys: Vec<_> = seen.iter().map(|f| f.key.as_str().to_owned()).collect();
    let expected: Vec<_> = (0..12).map(|i| format!("d-{i}")).collect();
    assert_eq!(keys, expected);
    for f in &seen {
        assert_eq!(store.fact(f.seq).await.unwrap().as_ref(), Some(f));
    }
    assert!(store.fact(seen[11].seq + 1000).await.unwrap().is_none());
    assert!(store.durable_seq() >= seen[11].seq);
    assert_eq!(store.stats().await.unwrap().last_seq, seen[11].seq);
    close(store).await;
}

async fn balances_sum_to_zero_per_currency(env: &Env) {
    let store = env.open().await;
    let mut n = 0;
    for (a, c) in [("alice", rub()), ("bob", usd()), ("carol", rub())] {
        for amount in [100, 250, 7] {
            n += 1;
            executed(submit(&store, &format!("d-{n}"), deposit(a, amount, c)).await);
        }
        n += 1;
        executed(submit(&store, &format!("w-{n}"), withdraw(a, 57, c)).await);
    }
    let balances = store.balances().await.unwrap();
    for (currency, sum) in balances.sums() {
        assert_eq!(sum, 0, "{currency}");
    }
    assert_eq!(balances.get(&Account::world(), rub()), Some(-714));
    assert_eq!(balances.get(&Account::payouts(), rub()), Some(114));
    assert_eq!(balances.get(&Account::world(), usd()), Some(-357));
    assert_eq!(balances.get(&acct("bob"), usd()), Some(300));
    assert_eq!(balances.accounts.len(), 5);
    close(store).await;
}

async fn reopening_keeps_everything(env: &Env) {
    let store = env.open().await;
    let d = executed(submit(&store, "d-1", deposit("alice", 1_000, rub())).await);
    executed(submit(&store, "w-1", withdraw("alice", 300, rub())).await);
    executed(submit(&store, "r-1", refund("w-1", 100)).await);
    executed(deliver(&store, "m-1", "k-1", deposit("bob", 5, usd())).await);
    let q = deliver(&store, "m-1", "k-9", deposit("bob", 6, usd())).await;
    assert!(matches!(q, Submission::Quarantined { .. }));
    env.clock.advance_ms(25 * HOUR_MS);
    assert_eq!(store.sweep().await.unwrap(), 4);
    let balances = store.balances().await.unwrap();
    let facts = store.facts(0, 100).await.unwrap();
    let stats = store.stats().await.unwrap();
    let keys = page_through(&store, None, None, 100).await;
    close(store).await;

    let store = env.open().await;
    assert_eq!(store.balances().await.unwrap(), balances);
    assert_eq!(store.facts(0, 100).await.unwrap(), facts);
    let reopened = store.stats().await.unwrap();
    assert_eq!(
        (reopened.last_seq, reopened.applied, reopened.rejected),
        (stats.last_seq, stats.applied, stats.rejected)
    );
    assert_eq!((reopened.keys_done, reopened.keys_expired), (0, 4));
    let again = page_through(&store, None, None, 100).await;
    let strip = |ks: &[KeyInfo]| -> Vec<_> {
        ks.iter()
            .map(|k| (k.client.clone(), k.key.clone(), k.status, k.outcome.clone()))
            .collect()
    };
    assert_eq!(strip(&again), strip(&keys));
    assert_eq!(store.quarantined(0, 10).await.unwrap().len(), 1);
    assert_eq!(
        body(&replayed(
            submit(&store, "d-1", deposit("alice", 1_000, rub())).await
        )),
        body(&d)
    );
    replayed(deliver(&store, "m-1", "k-1", deposit("bob", 5, usd())).await);
    let next = executed(submit(&store, "d-2", deposit("alice", 1, rub())).await);
    assert!(next.seq() > facts.last().unwrap().seq);
    assert_verified(&store).await;
    close(store).await;
}

async fn after_shutdown_submissions_are_refused(env: &Env) {
    let store = env.open().await;
    executed(submit(&store, "d-1", deposit("alice", 1, rub())).await);
    store.shutdown().await;
    let late = store
        .submit(&client(), &key("d-2"), deposit("alice", 1, rub()), None)
        .await;
    assert!(matches!(late, Err(LedgerError::Closed)), "{late:?}");
    drop(store);
    // What was done before is kept.
    let store = env.open().await;
    assert_eq!(balance(&store, "alice", rub()).await, Some(1));
    close(store).await;
}

/// Two workers on one database (PostgreSQL only; on sled, one handle shared by many tasks
/// is the same test as above): twins of one key race through both, and withdrawals race
/// on one account, with no effect doubled and no overdraft.
async fn two_workers_on_one_store_make_one_effect_per_key(env: &Env) {
    let a = env.open().await;
    let b = match env.open_another().await {
        Some(b) => b,
        None => a.clone(),
    };
    executed(submit(&a, "d-1", deposit("alice", 1_000, rub())).await);
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                // Half the tasks race on one key, the others each take 30 of the 1,000.
                if i % 4 < 2 {
                    (
                        "twin",
                        submit(&store, "pay-1", withdraw("alice", 100, rub())).await,
                    )
                } else {
                    let k = format!("w-{i}");
                    (
                        "own",
                        submit(&store, &k, withdraw("alice", 30, rub())).await,
                    )
                }
            })
        })
        .collect();
    let mut twin_executed = 0;
    let mut own_applied = 0u64;
    for t in tasks {
        match t.await.unwrap() {
            ("twin", Submission::Executed(_)) => twin_executed += 1,
            ("twin", Submission::Replayed(_) | Submission::InProgress { .. }) => {}
            ("own", Submission::Executed(o)) if o.is_applied() => own_applied += 1,
            ("own", Submission::Executed(o)) => {
                assert_eq!(o.rejection(), Some(Rejection::InsufficientFunds));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(twin_executed, 1);
    let twin = settle(&b, "pay-1", withdraw("alice", 100, rub())).await;
    let twin_applied = u64::from(twin.outcome().unwrap().is_applied());
    let left = balance(&a, "alice", rub()).await.unwrap();
    assert_eq!(
        left,
        1_000 - i128::from(twin_applied * 100 + own_applied * 30)
    );
    assert!(left >= 0);
    assert_eq!(balance(&b, "alice", rub()).await.unwrap(), left);
    assert_verified(&a).await;
    if !Arc::ptr_eq(&a, &b) {
        close(b).await;
    }
    close(a).await;
}

/// Retries of a key done long ago, all at once: first 40 identical ones, then 40 with 8
/// other bodies among them. The store is reopened before each round, so no answer is
/// cached in its memory: the first arrival takes a claim to read the key, and every
/// arrival that meets a live claim is answered from the key's durable record: its replay,
/// or `Reused` for another body. None is told 409, since nothing about the key is in
/// flight, and no true retry is refused because another body holds the claim.
async fn retries_of_a_done_key_are_replayed_while_a_twin_holds_a_claim(env: &Env) {
    let store = env.open().await;
    let first = executed(submit(&store, "d1", deposit("alice", 1_000, rub())).await);
    close(store).await;
    for others in [0, 8] {
        env.clock.advance_ms(HOUR_MS);
        let store = env.open().await;
        let retries = 40;
        let barrier = Arc::new(tokio::sync::Barrier::new(retries + others));
        let tasks: Vec<_> = (0..retries + others)
            .map(|i| {
                let (store, barrier) = (store.clone(), barrier.clone());
                // Every sixth arrival carries another amount under the key.
                let other = i < 6 * others && i % 6 == 5;
                tokio::spawn(async move {
                    barrier.wait().await;
                    let amount = if other { 999 } else { 1_000 };
                    let answer = submit(&store, "d1", deposit("alice", amount, rub())).await;
                    (other, answer)
                })
            })
            .collect();
        let (mut replays, mut refused, mut in_progress, mut wrong) = (0, 0, 0, Vec::new());
        for t in tasks {
            match t.await.unwrap() {
                (false, Submission::Replayed(o)) if o == first => replays += 1,
                (true, Submission::Reused) => refused += 1,
                (_, Submission::InProgress { .. }) => in_progress += 1,
                other => wrong.push(other),
            }
        }
        assert_eq!(
            (replays, refused, in_progress),
            (retries, others, 0),
            "{in_progress} of {} told in progress, {} answered otherwise: {wrong:?}",
            retries + others,
            wrong.len()
        );
        assert_eq!(balance(&store, "alice", rub()).await, Some(1_000));
        assert_eq!(fact_count(&store).await, 1);
        assert!(store.pending().is_empty());
        close(store).await;
    }
}

/// The inbox rule checks the message id before the key. A redelivered id with another
/// payload is quarantined as `message_id_reused` even when it arrives while other messages
/// hold claims on its key (they reuse the key for another command, and are refused as
/// such): a claim never lets the key's check answer for the message id's.
async fn a_reused_message_id_is_quarantined_while_its_key_is_claimed(env: &Env) {
    let store = env.open().await;
    executed(deliver(&store, "m-1", "k-1", deposit("alice", 100, rub())).await);
    close(store).await;
    for round in 0..4 {
        // A store opened afresh holds no answer in memory: every arrival takes a claim.
        env.clock.advance_ms(HOUR_MS);
        let store = env.open().await;
        let n = 24;
        let barrier = Arc::new(tokio::sync::Barrier::new(n));
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let (store, barrier) = (store.clone(), barrier.clone());
                // Odd arrivals redeliver m-1 with another amount; even ones are new
                // messages reusing its key for that same other amount.
                let id = if i % 2 == 1 {
                    "m-1".to_owned()
                } else {
                    format!("m-{round}-{i}")
                };
                tokio::spawn(async move {
                    barrier.wait().await;
                    loop {
                        match deliver(&store, &id, "k-1", deposit("alice", 999, rub())).await {
                            Submission::InProgress { .. } => {
                                tokio::time::sleep(Duration::from_millis(2)).await;
                            }
                            answer => break (i % 2 == 1, answer),
                        }
                    }
                })
            })
            .collect();
        let mut wrong = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                (true, Submission::Quarantined { reason })
                    if reason.starts_with("message_id_reused") => {}
                (false, Submission::Reused) => {}
                other => wrong.push(other),
            }
        }
        assert!(wrong.is_empty(), "round {round}: {wrong:?}");
        assert_eq!(balance(&store, "alice", rub()).await, Some(100));
        assert_eq!(fact_count(&store).await, 1);
        close(store).await;
    }
}

/// A refund sent while its withdrawal is in flight (claimed, not yet decided) is told 409,
/// with nothing stored under its key; once the withdrawal is done, the same refund key
/// applies. A withdrawal that does not exist or was rejected is still
/// `withdrawal_not_found`, final, and so is a refund that names its own key (its own claim
/// is no withdrawal in flight).
async fn a_refund_of_a_withdrawal_in_flight_is_in_progress_until_it_is_decided(env: &Env) {
    // On PostgreSQL the withdrawal waits in its lane on a row held elsewhere; with two
    // lanes the refund is decided in the other one meanwhile (with one, it would queue
    // behind the withdrawal and be decided after it).
    let (store, ledger) = env.open_with(None, Some(2)).await;
    executed(submit(&store, "d-1", deposit("alice", 500, rub())).await);
    let (early, withdrawal) = match (&env.backing, &ledger) {
        (Backing::Sled(_), Some(ledger)) => refund_held_on_sled(ledger).await,
        (Backing::Pg(db), _) => refund_held_on_postgres(&store, &db.url).await,
        (Backing::Sled(_), None) => unreachable!(),
    };
    assert!(
        matches!(early, Submission::InProgress { .. }),
        "a refund of a withdrawal in flight: {early:?}"
    );
    assert_eq!(applied(&executed(withdrawal)).balance, 400);
    assert!(store.key(&client(), &key("r-1")).await.unwrap().is_none());
    let r1 = executed(submit(&store, "r-1", refund("w-1", 30)).await);
    assert_eq!(
        (applied(&r1).balance, applied(&r1).refunded_total),
        (430, Some(30))
    );
    replayed(submit(&store, "r-1", refund("w-1", 30)).await);

    let o = executed(submit(&store, "r-2", refund("w-nope", 1)).await);
    assert_eq!(o.rejection(), Some(Rejection::WithdrawalNotFound));
    let w2 = executed(submit(&store, "w-2", withdraw("alice", 5_000, rub())).await);
    assert_eq!(w2.rejection(), Some(Rejection::InsufficientFunds));
    let o = executed(submit(&store, "r-3", refund("w-2", 1)).await);
    assert_eq!(o.rejection(), Some(Rejection::WithdrawalNotFound));
    let o = executed(submit(&store, "r-self", refund("r-self", 1)).await);
    assert_eq!(o.rejection(), Some(Rejection::WithdrawalNotFound));
    assert_eq!(balance(&store, "alice", rub()).await, Some(430));
    assert_verified(&store).await;
    drop(ledger);
    close(store).await;
}

/// sled: the committer is held while the refund "r-1" is queued and then the withdrawal
/// "w-1" is claimed and queued behind it, so the refund is decided while the withdrawal is
/// claimed and not yet decided. Returns the refund's answer, then the withdrawal's.
async fn refund_held_on_sled(ledger: &SledStore) -> (Submission, Submission) {
    let queue = |k: &str, command: Command| {
        let (tx, rx) = tokio::sync::oneshot::channel();
        ledger.submit_with(
            &client(),
            &key(k),
            command,
            None,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx
    };
    let pause = ledger.pause();
    let refund_answer = queue("r-1", refund("w-1", 30));
    let withdrawal_answer = queue("w-1", withdraw("alice", 100, rub()));
    drop(pause);
    (
        refund_answer.await.unwrap().unwrap(),
        withdrawal_answer.await.unwrap().unwrap(),
    )
}

/// PostgreSQL: the withdrawal "w-1" is submitted while another session holds alice's row,
/// so its transaction holds the key's claim and waits; the refund "r-1" is submitted
/// meanwhile, then the row is let go. Returns the refund's answer, then the withdrawal's.
async fn refund_held_on_postgres(store: &Arc<dyn Store>, url: &str) -> (Submission, Submission) {
    let locker = session(url).await;
    locker
        .batch_execute("BEGIN; SELECT * FROM idem.accounts WHERE account = 'alice' FOR UPDATE")
        .await
        .unwrap();
    let withdrawal = {
        let store = store.clone();
        tokio::spawn(async move { submit(&store, "w-1", withdraw("alice", 100, rub())).await })
    };
    // Watched from a session outside any transaction: inside one, pg_stat_activity is read
    // once and kept, so the locker would never see the withdrawal start waiting.
    assert!(
        waits_on_a_lock(url, "idem_claim_group").await,
        "the withdrawal never waited on alice's row"
    );
    let refund_answer = submit(store, "r-1", refund("w-1", 30)).await;
    locker.batch_execute("COMMIT").await.unwrap();
    (refund_answer, withdrawal.await.unwrap())
}

/// A twin (the same key and command, on the same store) that arrives while the first
/// attempt is in flight is not told 409 at once: the store waits a bounded time for the
/// first's durable answer and gives the twin its replay. The first attempt is held a
/// moment (sled: its committer paused; PostgreSQL: alice's row locked by another session)
/// while the twin arrives, well within the wait.
async fn a_twin_during_the_first_attempt_gets_the_replay_after_a_short_wait(env: &Env) {
    let (store, ledger) = env.open_waiting(Some(Duration::from_secs(10))).await;
    executed(submit(&store, "d-1", deposit("alice", 500, rub())).await);
    let hold = match (&env.backing, &ledger) {
        (Backing::Sled(_), Some(ledger)) => Hold::Committer(ledger.pause()),
        (Backing::Pg(db), _) => {
            let locker = session(&db.url).await;
            locker
                .batch_execute(
                    "BEGIN; SELECT * FROM idem.accounts WHERE account = 'alice' FOR UPDATE",
                )
                .await
                .unwrap();
            Hold::Row(locker)
        }
        (Backing::Sled(_), None) => unreachable!(),
    };
    let spawn_w1 = || {
        let store = store.clone();
        tokio::spawn(async move { submit(&store, "w-1", withdraw("alice", 100, rub())).await })
    };
    let first = spawn_w1();
    while store.pending().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let twin = spawn_w1();
    // The twin meets the first's claim and waits; nothing is answered while held.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!first.is_finished() && !twin.is_finished());
    match hold {
        Hold::Committer(pause) => drop(pause),
        Hold::Row(locker) => locker.batch_execute("COMMIT").await.unwrap(),
    }
    let first = executed(first.await.unwrap());
    let twin = replayed(twin.await.unwrap());
    assert_eq!(body(&twin), body(&first));
    assert_eq!(applied(&first).balance, 400);
    assert_eq!(fact_count(&store).await, 2);
    assert_eq!(store.stats().await.unwrap().observed.conflicts_in_flight, 0);
    assert_verified(&store).await;
    drop(ledger);
    close(store).await;
}

/// What holds the first attempt of a key in flight.
enum Hold {
    Committer(PauseGuard),
    Row(tokio_postgres::Client),
}

async fn session(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

// ---- PostgreSQL only -------------------------------------------------------------------

mod postgres_only {
    use super::*;

    async fn env(test: &str) -> Option<Env> {
        Env::pg(test).await
    }

    /// A fresh database, its store with alice's deposit of 500 (key "d-1"), and a session
    /// of its own on that database (another worker, an operator, a locker).
    async fn with_alice(test: &str) -> Option<(Env, Arc<dyn Store>, tokio_postgres::Client)> {
        let env = env(test).await?;
        let Backing::Pg(db) = &env.backing else {
            unreachable!()
        };
        let other = session(&db.url).await;
        let store = env.open().await;
        executed(submit(&store, "d-1", deposit("alice", 500, rub())).await);
        Some((env, store, other))
    }

    /// Workers starting together each apply the migrations or find them applied.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn workers_starting_together_migrate_once() {
        let Some(env) = env("postgres_only::workers_starting_together_migrate_once").await else {
            return;
        };
        let Backing::Pg(db) = &env.backing else {
            unreachable!()
        };
        let opens: Vec<_> = (0..6)
            .map(|_| {
                let (url, rules) = (db.url.clone(), env.rules());
                tokio::spawn(async move { PgStore::open(&url, rules, PgConfig::default()).await })
            })
            .collect();
        let mut fresh = 0;
        let mut stores = Vec::new();
        for o in opens {
            let (store, report) = o.await.unwrap().unwrap();
            fresh += usize::from(report.fresh);
            stores.push(store);
        }
        assert_eq!(fresh, 1);
        let s: Arc<dyn Store> = Arc::new(stores.pop().unwrap());
        executed(submit(&s, "d-1", deposit("alice", 1, rub())).await);
        for other in stores {
            other.shutdown().await;
        }
        close(s).await;
        env.finish().await;
    }

    /// The database is at the schema version this build migrates to.
    async fn assert_latest_schema(admin: &tokio_postgres::Client) {
        let version: i32 = admin
            .query_one("SELECT max(version) FROM idem.schema_version", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(version, LATEST);
    }

    /// The settings of the function `name` in the schema, or `None` if there is none.
    async fn function_settings(admin: &tokio_postgres::Client, name: &str) -> Option<Vec<String>> {
        admin
            .query_opt(
                "SELECT coalesce(p.proconfig, '{}') FROM pg_proc p \
                 JOIN pg_namespace n ON n.oid = p.pronamespace \
                 WHERE n.nspname = 'idem' AND p.proname = $1",
                &[&name],
            )
            .await
            .unwrap()
            .map(|row| row.get(0))
    }

    /// The plan settings every apply function is made with (version 9's).
    fn assert_planned_once(settings: &[String]) {
        for s in ["plan_cache_mode=force_generic_plan", "enable_seqscan=off"] {
            assert!(settings.iter().any(|x| x == s), "{s} missing: {settings:?}");
        }
    }

    /// After an upgrade, the key "w-1" written before it (a withdrawal of 100 from alice's
    /// 500, answered `first`) replays, is refused for another command, and a new
    /// withdrawal executes.
    async fn answers_as_before_the_upgrade(store: &Arc<dyn Store>, first: &Outcome) {
        assert_eq!(
            &replayed(submit(store, "w-1", withdraw("alice", 100, rub())).await),
            first
        );
        assert!(matches!(
            submit(store, "w-1", withdraw("alice", 99, rub())).await,
            Submission::Reused
        ));
        let o = executed(submit(store, "w-2", withdraw("alice", 50, rub())).await);
        assert_eq!(applied(&o).balance, 350);
    }

    /// The schema version this build migrates to.
    const LATEST: i32 = 13;

    /// Versions 1 to 12, which a scratch schema runs to make the functions version 12 left.
    const V1_TO_V12: [&str; 12] = [
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v1.sql"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v2.sql"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v3.sql"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v4.sql"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v5.sql"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v6.sql"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v7.sql"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v8.sql"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v9.sql"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v10.sql"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v11.sql"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/pg/migrations/v12.sql"
        )),
    ];

    /// The functions version 13 makes (by their role, and the previous build's names
    /// calling them).
    const MADE_BY_V13: [&str; 7] = [
        "idem_wait_lock",
        "idem_claim_group",
        "idem_apply_group",
        "idem_apply_one",
        "idem_group_claim_v8",
        "idem_group_apply_v12",
        "idem_apply_one_v12",
    ];

    /// What version 13 changes, undone: its functions dropped, and the functions version
    /// 12 left made again by versions 1 to 12 in a scratch schema, then moved into the
    /// store's (those the store's schema still has, the ones its tables use, stay).
    fn undo_v13() -> String {
        let mut sql = String::from("CREATE SCHEMA idem_v12; SET search_path = idem_v12;\n");
        for migration in V1_TO_V12 {
            sql.push_str(migration);
            sql.push('\n');
        }
        sql.push_str("RESET search_path;\n");
        for name in MADE_BY_V13 {
            sql.push_str(&format!("DROP FUNCTION idem.{name};\n"));
        }
        sql.push_str(
            "DO $$ DECLARE f regprocedure; BEGIN \
                 FOR f IN SELECT p.oid FROM pg_proc p \
                           WHERE p.pronamespace = 'idem_v12'::regnamespace \
                             AND NOT EXISTS (SELECT 1 FROM pg_proc q \
                                  WHERE q.pronamespace = 'idem'::regnamespace \
                                    AND q.proname = p.proname) LOOP \
                     EXECUTE format('ALTER FUNCTION %s SET SCHEMA idem', f); \
                 END LOOP; \
             END $$; \
             DROP SCHEMA idem_v12 CASCADE; \
             DELETE FROM idem.schema_version WHERE version = 13;",
        );
        sql
    }

    /// The names of the functions in the store's schema.
    async fn function_names(admin: &tokio_postgres::Client) -> Vec<String> {
        admin
            .query(
                "SELECT p.proname::text FROM pg_proc p \
                 WHERE p.pronamespace = 'idem'::regnamespace ORDER BY 1",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    /// What version 12 changes, undone: the responses jsonb again with their digest by
    /// SHA-256 over `jsonb_send` (version 6's), the functions it made gone.
    const UNDO_V12: &str = "DROP FUNCTION idem.idem_group_apply_v12; \
        DROP FUNCTION idem.idem_apply_one_v12; \
        ALTER TABLE idem.idempotency_keys DROP COLUMN response_digest, \
            ALTER COLUMN response TYPE jsonb USING response::jsonb, \
            ADD COLUMN response_digest bytea \
            GENERATED ALWAYS AS (substring(sha256(jsonb_send(response)) FOR 16)) STORED; \
        DROP FUNCTION idem.idem_utf8; \
        DELETE FROM idem.schema_version WHERE version = 12;";

    /// A database at schema version 9 with commands in it is upgraded in place to the
    /// latest version by the next worker that opens it: the claim locks accounts by an
    /// index scan,
    /// while the log keeps its unique constraint on (client, key), every key done before
    /// still replays, a reused key is still refused, new commands execute and verify finds
    /// the ledger clean.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_version_9_database_is_upgraded_in_place() {
        let Some((env, store, admin)) =
            with_alice("postgres_only::a_version_9_database_is_upgraded_in_place").await
        else {
            return;
        };
        let first = executed(submit(&store, "w-1", withdraw("alice", 100, rub())).await);
        close(store).await;
        // The database as version 9 left it: what version 10 changes, undone (version 9's
        // claim, run again, replaces version 10's body and settings).
        admin
            .batch_execute(&format!(
                "{} SET search_path = idem; {} RESET search_path; \
                 ALTER FUNCTION idem.idem_group_claim_v8(text[], text[], bytea[], timestamptz, \
                     integer, text[], bytea[], text[], text[], integer) \
                     RESET enable_bitmapscan; \
                 DROP FUNCTION idem.idem_apply_one_v11; \
                 {UNDO_V12} \
                 DELETE FROM idem.schema_version WHERE version >= 10",
                undo_v13(),
                include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/src/store/pg/migrations/v9.sql"
                ))
            ))
            .await
            .unwrap();
        // The claim's body for a group of one, in the function named `name`.
        let group_of_one = |name: &str| {
            format!(
                "SELECT count(*) FROM pg_proc p \
                 JOIN pg_namespace n ON n.oid = p.pronamespace \
                 WHERE n.nspname = 'idem' AND p.proname = '{name}' \
                   AND p.prosrc LIKE '%IF n = 1 AND p_message[1] IS NULL%'"
            )
        };
        let before: i64 = admin
            .query_one(&group_of_one("idem_group_claim_v8"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(before, 0);
        let store = env.open().await;
        assert_latest_schema(&admin).await;
        let unique: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_constraint \
                 WHERE conrelid = 'idem.facts'::regclass AND conname = 'facts_one_per_key'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(unique, 1);
        let settings = function_settings(&admin, "idem_claim_group").await.unwrap();
        assert!(
            settings.iter().any(|s| s == "enable_bitmapscan=off"),
            "{settings:?}"
        );
        let after: i64 = admin
            .query_one(&group_of_one("idem_claim_group"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(after, 1);
        answers_as_before_the_upgrade(&store, &first).await;
        assert_verified(&store).await;
        close(store).await;
        env.finish().await;
    }

    /// A database at schema version 10 is upgraded in place to version 11 by the next
    /// worker that opens it: the apply of a group of one fact is there with its plan
    /// settings, and every kind of group of one it takes (a withdrawal, a deposit opening
    /// an account, a rejection) and a replay and a reuse of a key written by version 10
    /// answer as before, with verify finding the ledger clean.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_version_10_database_is_upgraded_in_place() {
        let Some((env, store, admin)) =
            with_alice("postgres_only::a_version_10_database_is_upgraded_in_place").await
        else {
            return;
        };
        let first = executed(submit(&store, "w-1", withdraw("alice", 100, rub())).await);
        close(store).await;
        // The database as version 10 left it.
        admin
            .batch_execute(&format!(
                "{} {UNDO_V12} DROP FUNCTION idem.idem_apply_one_v11; \
                 DELETE FROM idem.schema_version WHERE version >= 11",
                undo_v13(),
            ))
            .await
            .unwrap();
        assert!(
            function_settings(&admin, "idem_apply_one_v11")
                .await
                .is_none()
        );
        let store = env.open().await;
        assert_latest_schema(&admin).await;
        assert_planned_once(&function_settings(&admin, "idem_apply_one").await.unwrap());
        answers_as_before_the_upgrade(&store, &first).await;
        let o = executed(submit(&store, "d-2", deposit("bob", 7, rub())).await);
        assert_eq!(applied(&o).balance, 7);
        let o = executed(submit(&store, "w-3", withdraw("bob", 8, rub())).await);
        assert_eq!(o.rejection(), Some(Rejection::InsufficientFunds));
        assert_eq!(balance(&store, "alice", rub()).await, Some(350));
        assert_eq!(balance(&store, "bob", rub()).await, Some(7));
        assert_verified(&store).await;
        close(store).await;
        env.finish().await;
    }

    /// A database at schema version 11, whose responses are jsonb, is upgraded in place to
    /// version 12 by the next worker that opens it: each response becomes the text jsonb
    /// prints, its digest SHA-256 over that text, which verify renders alike from the facts
    /// (keys and answers that need escapes, a balance beyond 64 bits, a rejection with its
    /// detail, a refund); keys done before replay and refuse reuse, new commands write text.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_version_11_database_is_upgraded_in_place() {
        let Some((env, store, admin)) =
            with_alice("postgres_only::a_version_11_database_is_upgraded_in_place").await
        else {
            return;
        };
        let first = executed(submit(&store, "w-1", withdraw("alice", 100, rub())).await);
        for i in 0..20 {
            let key = format!("whale-{i}");
            executed(
                submit(
                    &store,
                    &key,
                    deposit("whale", ledger::domain::AMOUNT_MAX, usd()),
                )
                .await,
            );
        }
        executed(submit(&store, r#"w"1\x"#, withdraw("whale", 10, usd())).await);
        executed(submit(&store, "r-1", refund(r#"w"1\x"#, 3)).await);
        let rejected = executed(submit(&store, "w-big", withdraw("alice", 10_000, rub())).await);
        assert_eq!(rejected.rejection(), Some(Rejection::InsufficientFunds));
        close(store).await;
        // The database as version 11 left it: the responses jsonb again, digested by
        // SHA-256 over `jsonb_send`, the apply functions of version 12 gone.
        admin
            .batch_execute(&format!("{} {UNDO_V12}", undo_v13()))
            .await
            .unwrap();
        let column = "SELECT data_type FROM information_schema.columns \
             WHERE table_schema = 'idem' AND table_name = 'idempotency_keys' \
               AND column_name = 'response'";
        let before: String = admin.query_one(column, &[]).await.unwrap().get(0);
        assert_eq!(before, "jsonb");
        let store = env.open().await;
        assert_latest_schema(&admin).await;
        let after: String = admin.query_one(column, &[]).await.unwrap().get(0);
        assert_eq!(after, "text");
        // The apply functions with their plan settings.
        for name in ["idem_apply_group", "idem_apply_one"] {
            assert_planned_once(&function_settings(&admin, name).await.unwrap());
        }
        answers_as_before_the_upgrade(&store, &first).await;
        assert_verified(&store).await;
        // A response written now is the same text a converted one is.
        executed(submit(&store, "d-9", deposit("carol", 5, rub())).await);
        let texts: Vec<String> = admin
            .query(
                "SELECT response FROM idem.idempotency_keys WHERE key IN ('w-1', 'd-9') \
                 ORDER BY key",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        for text in &texts {
            assert!(
                text.starts_with("{\"key\": ") && text.contains(", \"seq\": "),
                "{text}"
            );
        }
        assert_verified(&store).await;
        close(store).await;
        env.finish().await;
    }

    /// The apply of a group of one fact checks each write against the decisions as the
    /// apply of a larger group does: a balance the decisions do not give, or a new
    /// account whose first change is not its balance, raises IDM01 and writes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_apply_of_a_group_of_one_refuses_what_the_decisions_do_not_give() {
        let Some((env, store, admin)) = with_alice(
            "postgres_only::the_apply_of_a_group_of_one_refuses_what_the_decisions_do_not_give",
        )
        .await
        else {
            return;
        };
        // One withdrawal of 1 from alice (500), decided as leaving `after`; `exists` says
        // whether the claim found her row.
        let apply = |exists: bool, after: &str| {
            format!(
                "SET search_path = idem; SELECT idem_apply_one(now(), 0::smallint, \
                 9999, 'default', 'x-1', 'WithdrawalRecorded', NULL, '\\x00'::bytea, \
                 '{{}}'::jsonb, '{{}}'::text, '\\x00'::bytea, 'alice', 'RUB', '-1', {exists}, \
                 '{after}', '@payouts', 'RUB', '1', 'applied', 1)"
            )
        };
        for (exists, after, said) in [
            (
                true,
                "12345",
                "alice's balance is 500, from which the decisions do not give 12345",
            ),
            (
                false,
                "7",
                "a new account's first change is not its balance",
            ),
        ] {
            let e = admin
                .batch_execute(&apply(exists, after))
                .await
                .unwrap_err();
            let db = e.as_db_error().unwrap();
            assert_eq!(db.code().code(), "IDM01", "{db:?}");
            assert!(db.message().contains(said), "{db:?}");
        }
        let written: i64 = admin
            .query_one(
                "SELECT (SELECT count(*) FROM idem.facts WHERE seq = 9999) \
                      + (SELECT count(*) FROM idem.idempotency_keys WHERE key = 'x-1')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(written, 0);
        assert_eq!(balance(&store, "alice", rub()).await, Some(500));
        // The same call with the balance the decision gives is written whole.
        admin.batch_execute(&apply(true, "499")).await.unwrap();
        assert_eq!(balance(&store, "alice", rub()).await, Some(499));
        close(store).await;
        env.finish().await;
    }

    /// A worker that hangs inside its transaction holds the key's claim: others are told
    /// 409, until the server ends the hung session at the lease and the key is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_hung_claim_answers_in_progress_until_the_lease_frees_it() {
        let Some((env, store, hung)) =
            with_alice("postgres_only::a_hung_claim_answers_in_progress_until_the_lease_frees_it")
                .await
        else {
            return;
        };
        // The hung worker: a session that claimed "w-1" (its advisory lock, and a pending
        // row for the key) and stopped, with a 1 s lease.
        hung.batch_execute(
            "SET idle_in_transaction_session_timeout = '1s'; BEGIN; \
             SELECT pg_advisory_xact_lock(idem.idem_claim_lock('k', 'default', 'w-1')); \
             INSERT INTO idem.idempotency_keys (client, key, request_hash, status, created_at) \
             VALUES ('default', 'w-1', '\\x00', 'pending', now());",
        )
        .await
        .unwrap();
        let started = std::time::Instant::now();
        let answer = submit(&store, "w-1", withdraw("alice", 100, rub())).await;
        assert!(
            matches!(answer, Submission::InProgress { .. }),
            "{answer:?}"
        );
        // The bounded wait: well under the lease (10 s here).
        assert!(started.elapsed() < Duration::from_secs(2));
        let settled = settle(&store, "w-1", withdraw("alice", 100, rub())).await;
        let o = executed(settled);
        assert_eq!(applied(&o).balance, 400);
        assert!(hung.is_closed() || hung.simple_query("SELECT 1").await.is_err());
        assert_verified(&store).await;
        close(store).await;
        env.finish().await;
    }

    /// During an upgrade, workers of the previous build (which call the claim by the name
    /// `idem_group_claim_v8`) and of this one (`idem_claim_group`) share a database: they
    /// must still exclude each other on a key. They do because the previous build's name
    /// calls this build's claim, which takes the same advisory lock, whose hash is the one
    /// every version took.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn workers_of_the_previous_schema_and_this_one_exclude_each_other() {
        let Some((env, store, old)) = with_alice(
            "postgres_only::workers_of_the_previous_schema_and_this_one_exclude_each_other",
        )
        .await
        else {
            return;
        };
        // The lock's hash as version 2 spelled it (`kind || length(a) || ':' || a || b`).
        let same: bool = old
            .query_one(
                "SELECT idem.idem_claim_lock('k', 'default', 'w-1') \
                 = hashtextextended('k7:defaultw-1', 7157)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(same);
        // A claim of a group of one withdrawal from alice by the function `f`, waiting at
        // most `wait` ms for the key: the command's state.
        let claim = |f: &str, key: &str, wait: i32| {
            format!(
                "SELECT r_state FROM {f}(ARRAY['default'], ARRAY['{key}'], \
                 ARRAY['\\x00'::bytea], now(), {wait}, ARRAY[NULL::text], \
                 ARRAY[NULL::bytea], ARRAY[NULL::text], ARRAY['alice'], 10000) \
                 WHERE r_i = 1"
            )
        };
        // A worker of the previous build in the middle of "w-1": claimed, not yet applied.
        // The functions find their tables on the search_path, as a worker's session sets.
        old.batch_execute("SET search_path = idem").await.unwrap();
        old.batch_execute("BEGIN").await.unwrap();
        let state: String = old
            .query_one(&claim("idem_group_claim_v8", "w-1", 1000), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(state, "claimed");
        let answer = submit(&store, "w-1", withdraw("alice", 100, rub())).await;
        assert!(
            matches!(answer, Submission::InProgress { .. }),
            "{answer:?}"
        );
        old.batch_execute("ROLLBACK").await.unwrap();
        let o = executed(submit(&store, "w-1", withdraw("alice", 100, rub())).await);
        assert_eq!(applied(&o).balance, 400);
        // And the other way round: this build's claim on "w-2" held, the previous build's
        // claim on it waits out its 50 ms and answers in flight.
        let Backing::Pg(db) = &env.backing else {
            unreachable!()
        };
        let new = session(&db.url).await;
        new.batch_execute("SET search_path = idem").await.unwrap();
        new.batch_execute("BEGIN").await.unwrap();
        let held: String = new
            .query_one(&claim("idem_claim_group", "w-2", 1000), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(held, "claimed");
        old.batch_execute("BEGIN").await.unwrap();
        let waited: String = old
            .query_one(&claim("idem_group_claim_v8", "w-2", 50), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(waited, "in_flight");
        old.batch_execute("ROLLBACK").await.unwrap();
        new.batch_execute("ROLLBACK").await.unwrap();
        assert_verified(&store).await;
        close(store).await;
        env.finish().await;
    }

    /// A database at schema version 12 is upgraded in place to version 13 by the next
    /// worker that opens it: the functions are there by their role, with their plan
    /// settings; the ones no build from version 12 on calls are gone; the previous build's
    /// names call the functions of their role (its applies check their writes against the
    /// decisions); keys done before replay and refuse reuse, new commands execute, and
    /// verify finds the ledger clean.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_version_12_database_is_upgraded_in_place() {
        let Some((env, store, admin)) =
            with_alice("postgres_only::a_version_12_database_is_upgraded_in_place").await
        else {
            return;
        };
        let first = executed(submit(&store, "w-1", withdraw("alice", 100, rub())).await);
        close(store).await;
        admin.batch_execute(&undo_v13()).await.unwrap();
        let before = function_names(&admin).await;
        for name in [
            "idem_claim",
            "idem_lock",
            "idem_apply",
            "idem_claim_v3",
            "idem_apply_v3",
            "idem_withdrawal_v5",
            "idem_wait_lock_v8",
            "idem_group_claim_v8",
            "idem_group_apply_v8",
            "idem_apply_one_v11",
            "idem_group_apply_v12",
            "idem_apply_one_v12",
        ] {
            assert!(before.iter().any(|n| n == name), "{name}: {before:?}");
        }
        assert!(
            !before.iter().any(|n| n == "idem_claim_group"),
            "{before:?}"
        );
        let store = env.open().await;
        assert_latest_schema(&admin).await;
        let mut after = function_names(&admin).await;
        after.sort();
        let mut expected = vec![
            "idem_apply_group",
            "idem_apply_one",
            "idem_apply_one_v12",
            "idem_claim_group",
            "idem_claim_lock",
            "idem_group_apply_v12",
            "idem_group_claim_v8",
            "idem_key_state_ok",
            "idem_utf8",
            "idem_wait_lock",
        ];
        expected.sort_unstable();
        assert_eq!(after, expected);
        let claim = function_settings(&admin, "idem_claim_group").await.unwrap();
        assert_planned_once(&claim);
        assert!(
            claim.iter().any(|s| s == "enable_bitmapscan=off"),
            "{claim:?}"
        );
        for name in ["idem_apply_group", "idem_apply_one"] {
            assert_planned_once(&function_settings(&admin, name).await.unwrap());
        }
        // The previous build's applies, with a balance for alice (400) the decision does
        // not give: refused by the checks of the functions they call.
        let one = "SET search_path = idem; SELECT idem_apply_one_v12(now(), 0::smallint, \
             9999, 'default', 'x-1', 'WithdrawalRecorded', NULL, '\\x00'::bytea, \
             '{}'::jsonb, '{}'::text, '\\x00'::bytea, 'alice', 'RUB', '-1', true, \
             '12345', '@payouts', 'RUB', '1', 'applied', 1)";
        let group = "SET search_path = idem; SELECT idem_group_apply_v12(now(), 0::smallint, \
             '{}'::bigint[], '{}'::text[], '{}'::text[], '{}'::text[], '{}'::text[], \
             '{}'::bytea[], '{}'::jsonb[], '{}'::text[], '{}'::bytea[], ARRAY['alice'], \
             ARRAY['RUB'], ARRAY['-1'], ARRAY[true], ARRAY['12345'], '{}'::text[], \
             '{}'::text[], '{}'::bigint[], '{}'::bigint[], '{}'::boolean[], '{}'::bigint[], \
             '{}'::text[], '{}'::text[], '{}'::text[], '{}'::text[], '{}'::bigint[], \
             '{}'::text[], '{}'::bigint[], '{}'::text[], '{}'::text[], '{}'::text[], \
             '{}'::text[])";
        for call in [one, group] {
            let e = admin.batch_execute(call).await.unwrap_err();
            let db = e.as_db_error().unwrap();
            assert_eq!(db.code().code(), "IDM01", "{db:?}");
            assert!(
                db.message()
                    .contains("alice's balance is 400, from which the decisions do not give"),
                "{db:?}"
            );
        }
        answers_as_before_the_upgrade(&store, &first).await;
        assert_verified(&store).await;
        close(store).await;
        env.finish().await;
    }

    /// The tables are changed behind the ledger's back (a withdrawal's refundable amount
    /// lowered by hand): the refund the log allows cannot be written as decided, so
    /// idem_apply_group refuses it, the COMMIT sent behind it rolls back, and nothing of the
    /// command is recorded, not even its key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_disagrees_with_the_decision_records_nothing() {
        let Some((env, store, admin)) =
            with_alice("postgres_only::a_write_that_disagrees_with_the_decision_records_nothing")
                .await
        else {
            return;
        };
        executed(submit(&store, "w-1", withdraw("alice", 100, rub())).await);
        executed(submit(&store, "r-1", refund("w-1", 30)).await);
        admin
            .batch_execute("UPDATE idem.refunded SET withdrawn = 40")
            .await
            .unwrap();
        let facts = fact_count(&store).await;
        let answer = store
            .submit(&client(), &key("r-2"), refund("w-1", 30), None)
            .await;
        match answer {
            Err(LedgerError::Unavailable(why)) => {
                assert!(why.contains("disagree"), "{why}");
                assert!(why.contains("refunded total"), "{why}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert_eq!(fact_count(&store).await, facts);
        assert!(store.key(&client(), &key("r-2")).await.unwrap().is_none());
        assert_eq!(balance(&store, "alice", rub()).await, Some(430));
        let total: i64 = admin
            .query_one("SELECT total FROM idem.refunded", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(total, 30);
        close(store).await;
        env.finish().await;
    }

    /// Only a twin makes a 409. A new key whose insert waits on something else (here a
    /// session holding a lock on the keys table for 300 ms, as PostgreSQL's own lock on
    /// extending a table can under a burst of inserts) waits it out and executes, though
    /// the wait is longer than the in-flight wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_that_is_not_a_twin_is_not_in_progress() {
        let Some((env, store, locker)) =
            with_alice("postgres_only::a_wait_that_is_not_a_twin_is_not_in_progress").await
        else {
            return;
        };
        locker
            .batch_execute("BEGIN; LOCK TABLE idem.idempotency_keys IN SHARE MODE")
            .await
            .unwrap();
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            locker.batch_execute("COMMIT").await.unwrap();
        });
        let started = std::time::Instant::now();
        let o = executed(submit(&store, "w-1", withdraw("alice", 100, rub())).await);
        assert!(started.elapsed() >= Duration::from_millis(250));
        assert_eq!(applied(&o).balance, 400);
        release.await.unwrap();
        close(store).await;
        env.finish().await;
    }

    /// The key's row is inserted at the end of the transaction, after the effect, and the
    /// advisory lock is what keeps two writers of a key apart; the primary key is the
    /// backstop for a writer that took no lock. Here such a writer (a session copying
    /// "w-1"'s done row to "w-9", uncommitted) is ahead of the store's attempt at "w-9":
    /// the attempt's insert waits for it, fails once it commits, and the rerun finds the
    /// row and replays it. The withdrawal the attempt had decided is rolled back with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_row_written_behind_the_lock_is_replayed_not_executed_again() {
        let Some((env, store, intruder)) = with_alice(
            "postgres_only::a_key_row_written_behind_the_lock_is_replayed_not_executed_again",
        )
        .await
        else {
            return;
        };
        let first = executed(submit(&store, "w-1", withdraw("alice", 100, rub())).await);
        assert_eq!(applied(&first).balance, 400);
        intruder
            .batch_execute(
                "BEGIN; INSERT INTO idem.idempotency_keys \
                 (client, key, request_hash, status, created_at, seq, response) \
                 SELECT client, 'w-9', request_hash, status, created_at, seq, response \
                 FROM idem.idempotency_keys WHERE key = 'w-1'",
            )
            .await
            .unwrap();
        let attempt = {
            let store = store.clone();
            tokio::spawn(async move { submit(&store, "w-9", withdraw("alice", 100, rub())).await })
        };
        // Commit only once the attempt is waiting on the intruder's row, so that the
        // attempt has decided and written its withdrawal first. Watched from a session
        // outside any transaction: inside one (the intruder's), pg_stat_activity is read
        // once and kept, and a first look taken before the attempt waited would stay.
        let Backing::Pg(db) = &env.backing else {
            unreachable!()
        };
        assert!(
            // A group of one fact is applied by `idem_apply_one`.
            waits_on_a_lock(&db.url, "idem_apply_one").await,
            "the attempt never waited on the intruder's key row"
        );
        intruder.batch_execute("COMMIT").await.unwrap();
        match attempt.await.unwrap() {
            Submission::Replayed(o) => assert_eq!(o, first),
            other => panic!("expected the intruder's row replayed, got {other:?}"),
        }
        assert_eq!(balance(&store, "alice", rub()).await, Some(400));
        let facts: i64 = intruder
            .query_one("SELECT count(*) FROM idem.facts", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            facts, 2,
            "the deposit and the first withdrawal, nothing else"
        );
        // Without the intruder's row, the ledger is whole: the rolled-back attempt left
        // nothing behind.
        intruder
            .batch_execute("DELETE FROM idem.idempotency_keys WHERE key = 'w-9'")
            .await
            .unwrap();
        assert_verified(&store).await;
        close(store).await;
        env.finish().await;
    }

    /// The schema's last line of defence, whatever writes to it: no negative balance, no
    /// user account named like a system one, and a key's status agrees with its fact and
    /// stored response. Each statement below breaks one rule and is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_schema_refuses_rows_that_break_the_invariants() {
        let Some((env, store, admin)) =
            with_alice("postgres_only::the_schema_refuses_rows_that_break_the_invariants").await
        else {
            return;
        };
        for bad in [
            "UPDATE idem.accounts SET balance = -1",
            "INSERT INTO idem.accounts VALUES ('@mallory', 'RUB', 1)",
            "UPDATE idem.idempotency_keys SET response = NULL",
            "UPDATE idem.idempotency_keys SET seq = NULL",
            "UPDATE idem.idempotency_keys SET status = 'pending'",
            "UPDATE idem.idempotency_keys SET status = 'expired'",
            "UPDATE idem.idempotency_keys SET status = 'lost'",
        ] {
            let refused = admin.batch_execute(bad).await;
            let code = refused.as_ref().err().and_then(|e| e.code().cloned());
            assert_eq!(
                code,
                Some(tokio_postgres::error::SqlState::CHECK_VIOLATION),
                "{bad}: {refused:?}"
            );
        }
        // The rule allows what the sweep does: expired, with the response dropped.
        admin
            .batch_execute("UPDATE idem.idempotency_keys SET status = 'expired', response = NULL")
            .await
            .unwrap();
        close(store).await;
        env.finish().await;
    }

    /// verify reads each stored response as a 16-byte digest the server keeps of it, and
    /// compares it with the digest of the answer rendered from the fact the way
    /// PostgreSQL prints a jsonb. So first a ledger whose answers hold what that printing
    /// escapes or orders (quotes and backslashes in keys, a balance beyond 64 bits printed
    /// as a string, rejections, refunds) verifies clean; then each row changed behind the
    /// store's back is found, under the guarantee it breaks, and the ledger is clean again
    /// once the change is undone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn verify_finds_rows_changed_behind_its_back() {
        let Some((env, store, admin)) =
            with_alice("postgres_only::verify_finds_rows_changed_behind_its_back").await
        else {
            return;
        };
        for i in 0..20 {
            executed(
                submit(
                    &store,
                    &format!("whale-{i}"),
                    deposit("whale", ledger::domain::AMOUNT_MAX, usd()),
                )
                .await,
            );
        }
        executed(submit(&store, r#"w"1\x"#, withdraw("alice", 100, rub())).await);
        executed(submit(&store, "r-1", refund(r#"w"1\x"#, 30)).await);
        executed(submit(&store, "w-big", withdraw("alice", 10_000, rub())).await); // rejected
        executed(submit(&store, "w-usd", withdraw("alice", 1, usd())).await); // rejected
        let clean = assert_verified(&store).await;
        assert_eq!(clean.facts, 25);
        let answer = "every key answers with its own fact";
        let key_fact = "every done key has its fact and every fact its key";
        let cases = [
            (
                "a stored response with another seq",
                "UPDATE idem.idempotency_keys SET response = jsonb_set(response::jsonb, '{seq}', '999') \
                 WHERE key = 'd-1'",
                answer,
            ),
            (
                "a stored response with one escape less",
                r#"UPDATE idem.idempotency_keys SET response = jsonb_set(response::jsonb, '{withdrawal}', '"w\"1x"') WHERE key = 'r-1'"#,
                answer,
            ),
            (
                "a stored response with the same members spaced otherwise",
                "UPDATE idem.idempotency_keys SET response = replace(response, '\": ', '\":') \
                 WHERE key = 'w-usd'",
                answer,
            ),
            (
                "another command's fingerprint",
                "UPDATE idem.idempotency_keys SET request_hash = \
                 (SELECT request_hash FROM idem.idempotency_keys WHERE key = 'd-1') \
                 WHERE key = 'w-big'",
                answer,
            ),
            (
                "a fact whose key row is gone",
                "DELETE FROM idem.idempotency_keys WHERE key = 'whale-3'",
                key_fact,
            ),
            (
                "a key row pointing at another key's fact",
                "UPDATE idem.idempotency_keys SET seq = \
                 (SELECT seq FROM idem.facts WHERE key = 'd-1') WHERE key = 'whale-4'",
                key_fact,
            ),
        ];
        each_change_is_found(&admin, &[("", &store)], &cases).await;
        // A second fact for a key, which the table's own constraint would refuse.
        admin
            .batch_execute(
                "ALTER TABLE idem.facts DROP CONSTRAINT facts_one_per_key; \
                 INSERT INTO idem.facts (seq, at, client, key, kind, rejection, body, doc) \
                 SELECT seq + 1000, at, client, key, kind, rejection, body, doc \
                 FROM idem.facts WHERE key = 'w-usd'",
            )
            .await
            .unwrap();
        let report = store.verify().await.unwrap();
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.guarantee == "one effect per key" && v.detail.contains("w-usd")),
            "{report}"
        );
        close(store).await;
        env.finish().await;
    }

    /// On one session verify merges the log with the key rows in one query; on two it
    /// reads the log on one and the key rows on the other, in one snapshot, and merges
    /// them itself. Either way, on a log longer than one fetch, each row changed behind
    /// the store's back is found under the guarantee it breaks, and the ledger is clean
    /// again once the change is undone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn verify_on_one_session_and_on_two_finds_rows_changed_behind_its_back() {
        let Some(env) = env(
            "postgres_only::verify_on_one_session_and_on_two_finds_rows_changed_behind_its_back",
        )
        .await
        else {
            return;
        };
        let store = env.open().await;
        let two = two_sessions(&env).await;
        // More facts than one batch of rows, so the checks cross batches.
        for i in 0..2_500 {
            executed(submit(&store, &format!("d-{i}"), deposit("alice", 5, rub())).await);
        }
        executed(submit(&store, "w-1", withdraw("alice", 100, rub())).await);
        executed(submit(&store, "r-1", refund("w-1", 30)).await);
        assert_eq!(assert_verified(&store).await.facts, 2_502);
        let Backing::Pg(db) = &env.backing else {
            unreachable!()
        };
        let admin = session(&db.url).await;
        let answer = "every key answers with its own fact";
        let key_fact = "every done key has its fact and every fact its key";
        let cases = [
            (
                "a stored response with another seq",
                "UPDATE idem.idempotency_keys SET response = jsonb_set(response::jsonb, '{seq}', '999') \
                 WHERE key = 'd-2400'",
                answer,
            ),
            (
                "another command's fingerprint",
                "UPDATE idem.idempotency_keys SET request_hash = \
                 (SELECT request_hash FROM idem.idempotency_keys WHERE key = 'w-1') \
                 WHERE key = 'r-1'",
                answer,
            ),
            (
                "a fact whose key row is gone",
                "DELETE FROM idem.idempotency_keys WHERE key = 'd-2100'",
                key_fact,
            ),
            (
                "a key row pointing at another key's fact",
                "UPDATE idem.idempotency_keys SET seq = \
                 (SELECT seq FROM idem.facts WHERE key = 'd-7') WHERE key = 'd-2300'",
                key_fact,
            ),
            (
                "a key row pointing at no fact",
                "UPDATE idem.idempotency_keys SET seq = 99999 WHERE key = 'd-3'",
                key_fact,
            ),
        ];
        assert_eq!(assert_verified(&two).await.facts, 2_502);
        each_change_is_found(
            &admin,
            &[(", on 1 session", &store), (", on 2 sessions", &two)],
            &cases,
        )
        .await;
        close(two).await;
        close(store).await;
        env.finish().await;
    }

    /// Keeps a copy of the key rows; then, for each (what, change, guarantee), changes rows
    /// behind the stores' back, requires each store's verify to report the guarantee, and
    /// puts the copy back, after which each store verifies clean again.
    async fn each_change_is_found(
        admin: &tokio_postgres::Client,
        stores: &[(&str, &Arc<dyn Store>)],
        cases: &[(&str, &str, &str)],
    ) {
        admin
            .batch_execute("CREATE TABLE public.keys_copy AS SELECT * FROM idem.idempotency_keys")
            .await
            .unwrap();
        let restore = "DELETE FROM idem.idempotency_keys; \
            INSERT INTO idem.idempotency_keys (client, key, request_hash, status, response, created_at, seq) \
            SELECT client, key, request_hash, status, response, created_at, seq FROM public.keys_copy";
        for (what, change, guarantee) in cases {
            admin.batch_execute(change).await.unwrap();
            for (on, store) in stores {
                let report = store.verify().await.unwrap();
                assert!(
                    report.violations.iter().any(|v| v.guarantee == *guarantee),
                    "{what}{on}: expected [{guarantee}], got {report}"
                );
            }
            admin.batch_execute(restore).await.unwrap();
            for (_, store) in stores {
                assert_verified(store).await;
            }
        }
    }

    /// The test's store, verifying on two sessions.
    async fn two_sessions(env: &Env) -> Arc<dyn Store> {
        let Backing::Pg(db) = &env.backing else {
            unreachable!()
        };
        let config = PgConfig::default().verify_sessions(2);
        let (store, _) = PgStore::open(&db.url, env.rules(), config).await.unwrap();
        Arc::new(store)
    }

    /// The two sessions of a verify read one snapshot: while commands commit and sweeps
    /// expire keys all along, every verify finds each fact's key row, each key row's fact,
    /// and the counters of that same instant (a key row read later than the log would
    /// be expired where the counters are not).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn verify_beside_commits_reads_one_instant_on_both_sessions() {
        let Some(env) =
            env("postgres_only::verify_beside_commits_reads_one_instant_on_both_sessions").await
        else {
            return;
        };
        let store = two_sessions(&env).await;
        executed(submit(&store, "d-1", deposit("alice", 500, rub())).await);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let running = || !stop.load(std::sync::atomic::Ordering::Relaxed);
        let writers: Vec<_> = (0..3)
            .map(|w| {
                let (store, stop) = (store.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let k = format!("c-{w}-{n}");
                        executed(submit(&store, &k, deposit("bob", 1, rub())).await);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let sweeper = {
            let (store, stop, clock) = (store.clone(), stop.clone(), env.clock.clone());
            tokio::spawn(async move {
                let mut expired = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    clock.advance_ms(25 * HOUR_MS);
                    expired += store.sweep().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                expired
            })
        };
        let mut seen = Vec::new();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            seen.push(assert_verified(&store).await.keys_expired);
        }
        assert!(running());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut written = 0;
        for w in writers {
            written += w.await.unwrap();
        }
        assert!(sweeper.await.unwrap() > 0, "the sweeps expired nothing");
        assert!(
            seen.windows(2).any(|p| p[0] < p[1]),
            "keys expired while verify read: {seen:?}"
        );
        assert_eq!(assert_verified(&store).await.facts, written + 1);
        close(store).await;
        env.finish().await;
    }

    /// An attempt that ends while its transaction is open (here: the account's row is
    /// locked by a session that outlives the lease) rolls back before its connection is
    /// used again: with a pool of one connection, the next command runs on that same
    /// connection and finds the key unclaimed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_attempt_cut_short_leaves_its_connection_clean() {
        let Some(env) =
            env("postgres_only::an_attempt_cut_short_leaves_its_connection_clean").await
        else {
            return;
        };
        let Backing::Pg(db) = &env.backing else {
            unreachable!()
        };
        let rules = Rules {
            lease: Duration::from_millis(500),
            ..env.rules()
        };
        let (store, _) = PgStore::open(&db.url, rules, PgConfig::default().pool_size(1))
            .await
            .unwrap();
        let store: Arc<dyn Store> = Arc::new(store);
        executed(submit(&store, "d-1", deposit("alice", 500, rub())).await);
        let locker = session(&db.url).await;
        locker
            .batch_execute("BEGIN; SELECT * FROM idem.accounts WHERE account = 'alice' FOR UPDATE")
            .await
            .unwrap();
        let answer = store
            .submit(&client(), &key("w-1"), withdraw("alice", 100, rub()), None)
            .await;
        assert!(
            matches!(answer, Err(LedgerError::Unavailable(_))),
            "{answer:?}"
        );
        locker.batch_execute("ROLLBACK").await.unwrap();
        let o = executed(submit(&store, "w-1", withdraw("alice", 100, rub())).await);
        assert_eq!(applied(&o).balance, 400);
        assert_verified(&store).await;
        close(store).await;
        env.finish().await;
    }

    #[tokio::test]
    async fn an_unreachable_server_is_unavailable_not_a_hang() {
        let rules = Rules {
            retention: RETENTION,
            lease: Duration::from_secs(10),
            clock: Arc::new(SystemClock),
        };
        let opened = PgStore::open(
            "postgres://postgres@127.0.0.1:1/postgres",
            rules,
            PgConfig::default(),
        )
        .await;
        match opened {
            Err(LedgerError::Unavailable(why)) => assert!(!why.is_empty()),
            other => panic!("expected Unavailable, got {:?}", other.map(|_| ())),
        }
    }

    /// A statement reads its account's range of the index v7.sql makes (the planner may
    /// pick it: the query's expression and predicate are the index's), and a fact filed
    /// under another account than it moves is named by verify and never shown.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_statement_reads_its_index_and_verify_checks_what_it_is_filed_under() {
        let Some((env, store, other)) = with_alice(
            "postgres_only::a_statement_reads_its_index_and_verify_checks_what_it_is_filed_under",
        )
        .await
        else {
            return;
        };
        executed(submit(&store, "d-bob", deposit("bob", 5, rub())).await);
        other
            .batch_execute("SET search_path = idem; SET enable_seqscan = off")
            .await
            .unwrap();
        let plan: Vec<String> = other
            .query(
                "EXPLAIN SELECT seq, body FROM facts \
                 WHERE (doc ->> 'account') = 'alice' AND kind <> 'CommandRejected' \
                 AND seq > 0 ORDER BY seq LIMIT 100",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            plan.iter().any(|l| l.contains("facts_by_account")),
            "{plan:#?}"
        );
        // bob's deposit, filed as alice's.
        other
            .batch_execute(
                "UPDATE facts SET doc = jsonb_set(doc, '{account}', '\"alice\"') \
                 WHERE key = 'd-bob'",
            )
            .await
            .unwrap();
        let err = store.statement(&acct("alice"), 0, 100).await.unwrap_err();
        assert!(err.to_string().contains("is not its movement"), "{err}");
        let report = store.verify().await.unwrap();
        let text = report.to_string();
        assert_eq!(report.violations.len(), 1, "{text}");
        assert!(
            text.contains(
                "[each account's statement holds exactly its movements] seq 2 is in the \
                 statement of Some(\"alice\") but moves Some(\"bob\")"
            ),
            "{text}"
        );
        close(store).await;
        env.finish().await;
    }
}

/// Whether a call of `function` comes to wait on a lock within 5 s, as seen from a
/// session of its own outside any transaction: inside one, `pg_stat_activity` is read
/// once and kept, so a first look taken before the wait began would stay.
async fn waits_on_a_lock(url: &str, function: &str) -> bool {
    let watcher = session(url).await;
    let pattern = format!("%{function}%");
    for _ in 0..250 {
        let n: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE $1",
                &[&pattern],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// `insufficient_funds` tells the balance it was decided on, `currency_mismatch` the
/// account's currency, `refund_exceeds_withdrawal` what was left to refund. The figure is
/// the fact's: replays, after the balance moved and after a reopen, are the first answer's
/// bytes.
async fn rejections_tell_their_figure_and_replay_it_byte_for_byte(env: &Env) {
    let store = env.open().await;
    executed(submit(&store, "d-1", deposit("alice", 500, rub())).await);
    executed(submit(&store, "w-ok", withdraw("alice", 100, rub())).await);
    executed(submit(&store, "r-ok", refund("w-ok", 30)).await);
    let cases = [
        (
            "w-big",
            withdraw("alice", 700, rub()),
            RejectionDetail::Balance(430),
            ("balance", serde_json::json!(430)),
        ),
        (
            "d-usd",
            deposit("alice", 5, usd()),
            RejectionDetail::AccountCurrency(rub()),
            ("account_currency", serde_json::json!("RUB")),
        ),
        (
            "w-usd",
            withdraw("alice", 5, usd()),
            RejectionDetail::AccountCurrency(rub()),
            ("account_currency", serde_json::json!("RUB")),
        ),
        (
            "r-over",
            refund("w-ok", 71),
            RejectionDetail::Refundable(70),
            ("refundable", serde_json::json!(70)),
        ),
    ];
    let mut first = Vec::new();
    for (k, command, detail, (member, value)) in &cases {
        let o = executed(submit(&store, k, command.clone()).await);
        let Outcome::Rejected(r) = &o else {
            panic!("{k}: expected a rejection, got {o:?}")
        };
        assert_eq!((r.rejection, r.detail), (detail.rejection(), Some(*detail)));
        let told = json::outcome(&o);
        assert_eq!(told[member], *value, "{told}");
        assert!(
            told["detail"]
                .as_str()
                .unwrap()
                .ends_with("nothing changed"),
            "{told}"
        );
        first.push(body(&o));
    }
    // The balance moves; the told balance does not.
    executed(submit(&store, "d-2", deposit("alice", 10_000, rub())).await);
    for ((k, command, ..), bytes) in cases.iter().zip(&first) {
        let again = replayed(submit(&store, k, command.clone()).await);
        assert_eq!(body(&again), *bytes, "{k}");
    }
    close(store).await;
    let store = env.open().await;
    for ((k, command, ..), bytes) in cases.iter().zip(&first) {
        let again = replayed(submit(&store, k, command.clone()).await);
        assert_eq!(body(&again), *bytes, "{k} after a reopen");
        let info = store.key(&client(), &key(k)).await.unwrap().unwrap();
        assert_eq!(
            body(info.outcome.as_ref().unwrap()),
            *bytes,
            "{k}: the key's outcome"
        );
    }
    assert_verified(&store).await;
    close(store).await;
}

/// A statement: one user account's movements (deposits, withdrawals, refunds to it) in
/// seq order, each with the balance after it, paged by the last seq; other accounts'
/// movements and rejections are not in it, and it survives a reopen.
async fn a_statement_lists_one_account_s_movements_in_order_with_balances(env: &Env) {
    let store = env.open().await;
    let alice = acct("alice");
    assert!(store.statement(&alice, 0, 10).await.unwrap().is_empty());
    let mut want = Vec::new();
    let mut note = |o: Outcome| {
        let r = applied(&o);
        want.push((r.seq, r.balance));
    };
    note(executed(
        submit(&store, "d-1", deposit("alice", 1_000, rub())).await,
    ));
    executed(submit(&store, "d-bob", deposit("bob", 50, rub())).await);
    note(executed(
        submit(&store, "w-1", withdraw("alice", 300, rub())).await,
    ));
    executed(submit(&store, "w-no", withdraw("alice", 5_000, rub())).await);
    executed(submit(&store, "w-bob", withdraw("bob", 20, rub())).await);
    note(executed(submit(&store, "r-1", refund("w-1", 100)).await));
    for i in 0..4 {
        note(executed(
            submit(&store, &format!("d-{i}x"), deposit("alice", 5, rub())).await,
        ));
    }
    let read_all = |store: Arc<dyn Store>, limit: usize| {
        let alice = alice.clone();
        async move {
            let mut got = Vec::new();
            let mut after = 0;
            loop {
                let page = store.statement(&alice, after, limit).await.unwrap();
                assert!(page.len() <= limit);
                let Some(last) = page.last() else { break };
                after = last.seq;
                for f in page {
                    let line = projection::statement_line(&f).unwrap();
                    assert_eq!(line.account, &alice);
                    got.push((f.seq, line.balance_after, line.change));
                }
            }
            got
        }
    };
    let got = read_all(store.clone(), 3).await;
    let seqs: Vec<_> = got.iter().map(|(s, b, _)| (*s, *b)).collect();
    assert_eq!(seqs, want);
    let changes: Vec<_> = got.iter().map(|g| g.2).collect();
    assert_eq!(changes, [1_000, -300, 100, 5, 5, 5, 5]);
    assert_eq!(
        got.last().map(|g| i128::try_from(g.1).unwrap()),
        balance(&store, "alice", rub()).await
    );
    // A page starting inside the statement, and one past its end.
    let tail = store.statement(&alice, want[4].0, 100).await.unwrap();
    assert_eq!(tail.len(), 2);
    assert!(
        store
            .statement(&alice, want[6].0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let bob = store.statement(&acct("bob"), 0, 100).await.unwrap();
    assert_eq!(bob.len(), 2);
    assert!(
        store
            .statement(&acct("ghost"), 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_verified(&store).await;
    close(store).await;
    let store = env.open().await;
    assert_eq!(read_all(store.clone(), 100).await, got);
    close(store).await;
}

/// Two tenants name an account `alice`; each command taken inside its tenant's space
/// (`Command::for_tenant`, as the worker does) moves that tenant's `alice` only, on every
/// projection, after a reopen and under verify. The tenant `default` keeps its names.
async fn two_tenants_accounts_of_one_name_are_two_accounts(env: &Env) {
    let store = env.open().await;
    let shop = ClientId::parse("shop").unwrap();
    let other = ClientId::parse("other").unwrap();
    let send = |tenant: &ClientId, k: &str, command: Command| {
        let (store, tenant, k) = (store.clone(), tenant.clone(), key(k));
        async move {
            let sent = command.for_tenant(&tenant);
            executed(store.submit(&tenant, &k, sent, None).await.unwrap())
        }
    };
    let d = send(&shop, "d-1", deposit("alice", 1_000, rub())).await;
    assert_eq!(applied(&d).account.as_str(), "shop/alice");
    assert_eq!(applied(&d.seen_by(&shop)).account.as_str(), "alice");
    // `other` names `alice` and reaches its own, empty space: no such account.
    let w = send(&other, "w-1", withdraw("alice", 900, rub())).await;
    assert_eq!(w.rejection(), Some(Rejection::AccountNotFound));
    // Nor can a refund of `other` name a withdrawal of `shop`: keys are the tenant's too.
    send(&shop, "w-shop", withdraw("alice", 100, rub())).await;
    let r = send(&other, "r-1", refund("w-shop", 100)).await;
    assert_eq!(r.rejection(), Some(Rejection::WithdrawalNotFound));
    send(&other, "d-1", deposit("alice", 50, usd())).await;
    send(&client(), "d-1", deposit("alice", 7, rub())).await;
    let check = |store: Arc<dyn Store>| async move {
        assert_eq!(balance(&store, "shop/alice", rub()).await, Some(900));
        assert_eq!(balance(&store, "other/alice", usd()).await, Some(50));
        assert_eq!(balance(&store, "alice", rub()).await, Some(7));
        let shop_alice = Account::parse_any("shop/alice").unwrap();
        let statement = store.statement(&shop_alice, 0, 100).await.unwrap();
        assert_eq!(statement.len(), 2);
        assert!(statement.iter().all(|f| f.client.as_str() == "shop"));
        let seen: Vec<_> = statement
            .iter()
            .map(|f| {
                projection::statement_line(&f.seen_by_owner())
                    .unwrap()
                    .account
                    .clone()
            })
            .collect();
        assert_eq!(seen, [acct("alice"), acct("alice")]);
        let names: Vec<String> = store
            .balances()
            .await
            .unwrap()
            .accounts
            .keys()
            .map(|a| a.as_str().to_owned())
            .collect();
        for name in ["alice", "other/alice", "shop/alice"] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        assert_verified(&store).await;
    };
    check(store.clone()).await;
    close(store).await;
    check(env.open().await).await;
}

/// Replays and conflicts write nothing, yet their counts are ledger counters like the
/// others: a clean stop keeps them, however soon after them it comes, and a reopened store
/// goes on counting from them.
async fn replays_and_conflicts_are_counted_across_a_clean_restart(env: &Env) {
    let store = env.open().await;
    executed(submit(&store, "k-1", deposit("alice", 10, rub())).await);
    for _ in 0..5 {
        replayed(submit(&store, "k-1", deposit("alice", 10, rub())).await);
    }
    let reused = submit(&store, "k-1", deposit("alice", 11, rub())).await;
    assert!(matches!(reused, Submission::Reused), "{reused:?}");
    let before = store.stats().await.unwrap().observed;
    assert_eq!((before.replayed, before.conflicts_reused), (5, 1));
    close(store).await;

    let store = env.open().await;
    assert_eq!(store.stats().await.unwrap().observed, before);
    replayed(submit(&store, "k-1", deposit("alice", 10, rub())).await);
    assert_eq!(store.stats().await.unwrap().observed.replayed, 6);
    assert_verified(&store).await;
    close(store).await;
}

/// A user account's balance at a seq or a time: the balance after its last movement at
/// or before the point, naming that movement; 0 before its first; none for an account
/// that does not exist or a system account. The same after a reopen.
async fn a_balance_is_read_at_any_point_of_the_log(env: &Env) {
    let store = env.open().await;
    let seq_of = |o: &Outcome| o.seq();
    let d1 = executed(submit(&store, "d-1", deposit("alice", 1_000, rub())).await);
    executed(submit(&store, "d-bob", deposit("bob", 5, rub())).await);
    env.clock.advance_ms(HOUR_MS);
    let w1 = executed(submit(&store, "w-1", withdraw("alice", 300, rub())).await);
    executed(submit(&store, "w-no", withdraw("alice", 5_000, rub())).await);
    env.clock.advance_ms(HOUR_MS);
    let r1 = executed(submit(&store, "r-1", refund("w-1", 100)).await);
    let alice = acct("alice");
    let check = |store: Arc<dyn Store>| {
        let (alice, d1, w1, r1) = (alice.clone(), seq_of(&d1), seq_of(&w1), seq_of(&r1));
        async move {
            let at = |point| {
                let (store, alice) = (store.clone(), alice.clone());
                async move {
                    let b = store.balance_at(&alice, point).await.unwrap().unwrap();
                    assert_eq!(b.currency, rub());
                    (b.balance, b.movement)
                }
            };
            assert_eq!(at(AsOf::seq(0)).await, (0, None));
            assert_eq!(at(AsOf::seq(d1)).await, (1_000, Some(d1)));
            // A seq between two movements (bob's deposit, a rejection) reads the earlier.
            assert_eq!(at(AsOf::seq(w1 - 1)).await, (1_000, Some(d1)));
            assert_eq!(at(AsOf::seq(w1 + 1)).await, (700, Some(w1)));
            assert_eq!(at(AsOf::seq(r1)).await, (800, Some(r1)));
            assert_eq!(at(AsOf::seq(u64::MAX)).await, (800, Some(r1)));
            let time = |ms: i64| AsOf::time(Timestamp(START_MS + ms));
            assert_eq!(at(time(-1)).await, (0, None));
            assert_eq!(at(time(0)).await, (1_000, Some(d1)));
            assert_eq!(at(time(HOUR_MS - 1)).await, (1_000, Some(d1)));
            assert_eq!(at(time(HOUR_MS)).await, (700, Some(w1)));
            assert_eq!(at(time(10 * HOUR_MS)).await, (800, Some(r1)));
            // Both bounds: the earlier of the two.
            let both = |seq, ms| AsOf {
                seq: Some(seq),
                time: Some(Timestamp(START_MS + ms)),
            };
            assert_eq!(at(both(r1, HOUR_MS)).await, (700, Some(w1)));
            assert_eq!(at(both(d1, 10 * HOUR_MS)).await, (1_000, Some(d1)));
            for missing in ["ghost", "@world"] {
                let account = Account::parse_any(missing).unwrap();
                assert_eq!(
                    store.balance_at(&account, AsOf::seq(r1)).await.unwrap(),
                    None
                );
            }
        }
    };
    check(store.clone()).await;
    close(store).await;
    let store = env.open().await;
    check(store.clone()).await;
    // Past several statement runs (each holds at most a few dozen movements): every
    // movement's seq reads its own balance, and the seq before it the previous one.
    for i in 0..80 {
        executed(submit(&store, &format!("more-{i}"), deposit("alice", 1, rub())).await);
        executed(submit(&store, &format!("bob-{i}"), deposit("bob", 1, rub())).await);
    }
    let lines = store.statement(&alice, 0, 1_000).await.unwrap();
    assert_eq!(lines.len(), 83);
    let mut before = (0u128, None);
    for fact in &lines {
        let line = projection::statement_line(fact).unwrap();
        let at = |seq| {
            let (store, alice) = (store.clone(), alice.clone());
            async move {
                let b = store
                    .balance_at(&alice, AsOf::seq(seq))
                    .await
                    .unwrap()
                    .unwrap();
                (b.balance, b.movement)
            }
        };
        assert_eq!(at(fact.seq - 1).await, before);
        before = (line.balance_after, Some(fact.seq));
        assert_eq!(at(fact.seq).await, before);
    }
    close(store).await;
}
