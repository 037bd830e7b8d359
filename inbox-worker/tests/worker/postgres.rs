//! Several worker processes on one PostgreSQL database keep every guarantee,
//! because all of them live in the database (unique indexes, guarded updates, each group
//! of commands one transaction), none in a worker's memory. Each scenario runs with two
//! and with four workers. Needs the PostgreSQL server of `IDEM_TEST_PG_URL`; without it
//! the tests say they did not run, or fail when `IDEM_REQUIRE_SERVICES=1` (CI).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use ledger::testing::PgTestDb;

use crate::support::{Http, Reply, Worker, verify_store};

/// A fresh database and `n` workers serving it.
struct Fleet {
    db: Option<PgTestDb>,
    _dir: tempfile::TempDir,
    workers: Vec<Option<Worker>>,
    runtime: tokio::runtime::Runtime,
}

impl Fleet {
    fn start(test: &str, n: usize) -> Option<Fleet> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let db = runtime.block_on(PgTestDb::create(test, "idem_workers"))?;
        let dir = tempfile::tempdir().unwrap();
        // All start at once: the schema is created by exactly one of them.
        let workers = std::thread::scope(|s| {
            let started: Vec<_> = (0..n)
                .map(|i| {
                    let (url, log) = (&db.url, dir.path().join(format!("w{i}.log")));
                    s.spawn(move || Worker::start_store(url, &log, &[]))
                })
                .collect();
            started
                .into_iter()
                .map(|h| Some(h.join().unwrap()))
                .collect()
        });
        Some(Fleet {
            db: Some(db),
            _dir: dir,
            workers,
            runtime,
        })
    }

    fn url(&self) -> &str {
        &self.db.as_ref().unwrap().url
    }

    /// The HTTP clients of the workers still running.
    fn https(&self) -> Vec<Http> {
        self.workers.iter().flatten().map(Worker::http).collect()
    }

    fn verify(&self) {
        verify_store(self.url());
    }

    fn stop(self) {
        let Fleet {
            db,
            workers,
            runtime,
            ..
        } = self;
        for w in workers.into_iter().flatten() {
            assert_eq!(w.term().code(), Some(0));
        }
        runtime.block_on(db.unwrap().drop_now());
    }

    /// A session of the test's own on the database.
    fn session(&self) -> tokio_postgres::Client {
        let url = self.url().to_owned();
        self.runtime.block_on(async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            client
        })
    }
}

/// Sends `n` requests at once, spread over the workers in turn.
fn at_once(fleet: &Fleet, n: usize, send: impl Fn(&Http, usize) -> Reply + Sync) -> Vec<Reply> {
    let barrier = Barrier::new(n);
    let send = &send;
    let https = fleet.https();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let http = &https[i % https.len()];
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    send(http, i)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Sends until the answer is not 409 (a twin of it is still in flight somewhere).
fn settled(send: impl Fn() -> Reply) -> Reply {
    for _ in 0..1000 {
        let r = send();
        if r.status != 409 {
            return r;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("stayed in progress");
}

fn refund(http: &Http, key: &str, withdrawal: &str, amount: u64) -> Reply {
    http.post(
        "/v1/refunds",
        Some(key),
        &format!(r#"{{"withdrawal":"{withdrawal}","amount":{amount}}}"#),
    )
}

#[test]
fn concurrent_duplicates_across_two_workers_make_one_effect() {
    concurrent_duplicates_make_one_effect("concurrent_duplicates_across_two_workers", 2);
}

#[test]
fn concurrent_duplicates_across_four_workers_make_one_effect() {
    concurrent_duplicates_make_one_effect("concurrent_duplicates_across_four_workers", 4);
}

/// 48 twins of one withdrawal, split over the workers: one execution, the others its
/// replay or 409, and every retry the first's bytes.
fn concurrent_duplicates_make_one_effect(test: &str, n: usize) {
    let Some(fleet) = Fleet::start(test, n) else {
        return;
    };
    let https = fleet.https();
    assert_eq!(https[0].deposit("pg-dep", "alice", 1000).status, 201);
    let replies = at_once(&fleet, 48, |http, _| http.withdraw("pg-twin", "alice", 300));
    let mut by_status: BTreeMap<(u16, bool), usize> = BTreeMap::new();
    let mut bodies = Vec::new();
    for r in &replies {
        *by_status.entry((r.status, r.replayed)).or_default() += 1;
        match r.status {
            201 => bodies.push(r.body.clone()),
            409 => {
                assert_eq!(r.code(), "request_in_progress", "{}", r.body);
                assert!(r.retry_after.is_some());
            }
            s => panic!("unexpected {s}: {}", r.body),
        }
    }
    let first = by_status.get(&(201, false)).copied().unwrap_or(0);
    assert_eq!(first, 1, "exactly one first execution: {by_status:?}");
    // Every twin that was told 409 gets the same answer on retry, from any worker.
    for http in &https {
        let again = http.withdraw("pg-twin", "alice", 300);
        assert_eq!(again.status, 201);
        assert!(again.replayed);
        bodies.push(again.body);
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "{bodies:?}");
    for http in &https {
        assert_eq!(http.balance("alice"), 700);
    }
    eprintln!("48 twins over {n} workers: {by_status:?}");
    fleet.verify();
    fleet.stop();
}

#[test]
fn an_overdraft_race_across_two_workers_never_overdraws() {
    an_overdraft_race_never_overdraws("an_overdraft_race_across_two_workers", 2);
}

#[test]
fn an_overdraft_race_across_four_workers_never_overdraws() {
    an_overdraft_race_never_overdraws("an_overdraft_race_across_four_workers", 4);
}

/// 40 withdrawals of 10 from a balance of 100, at once over the workers: ten apply, thirty
/// are refused, the balance ends at zero and never goes below.
fn an_overdraft_race_never_overdraws(test: &str, n: usize) {
    let Some(fleet) = Fleet::start(test, n) else {
        return;
    };
    assert_eq!(fleet.https()[0].deposit("race-dep", "bob", 100).status, 201);
    let replies = at_once(&fleet, 40, |http, i| {
        // A 409 cannot happen (every key is distinct), but a retry loop keeps the test
        // honest if the store ever answered one.
        settled(|| http.withdraw(&format!("race-w{i}"), "bob", 10))
    });
    let applied = replies.iter().filter(|r| r.status == 201).count();
    let refused = replies
        .iter()
        .filter(|r| r.status == 422 && r.code() == "insufficient_funds")
        .count();
    assert_eq!((applied, refused), (10, 30), "{replies:?}");
    for http in fleet.https() {
        assert_eq!(http.balance("bob"), 0);
    }
    fleet.verify();
    fleet.stop();
}

#[test]
fn a_refund_racing_its_withdrawal_across_two_workers_stays_bounded() {
    a_refund_racing_its_withdrawal_stays_bounded("a_refund_racing_its_withdrawal_two", 2);
}

#[test]
fn a_refund_racing_its_withdrawal_across_four_workers_stays_bounded() {
    a_refund_racing_its_withdrawal_stays_bounded("a_refund_racing_its_withdrawal_four", 4);
}

/// A withdrawal of 300 and twelve refunds of 50 against it, all at once over the workers
/// (the withdrawal's twins among them). A refund is told 409 while the withdrawal is in
/// flight, `withdrawal_not_found` if it was decided before the withdrawal existed
/// anywhere, or applies; never more than the withdrawal is refunded. A second wave of
/// refunds, after the withdrawal is done, fills it to exactly 300. Every answer replays
/// byte for byte from any worker.
fn a_refund_racing_its_withdrawal_stays_bounded(test: &str, n: usize) {
    let Some(fleet) = Fleet::start(test, n) else {
        return;
    };
    let https = fleet.https();
    assert_eq!(https[0].deposit("rr-dep", "carol", 1000).status, 201);
    let replies = at_once(&fleet, 24, |http, i| {
        if i % 2 == 0 {
            settled(|| http.withdraw("rr-w", "carol", 300))
        } else {
            settled(|| refund(http, &format!("rr-r{i}"), "rr-w", 50))
        }
    });
    let mut refunded = 0;
    let mut answers = Vec::new();
    for (i, r) in replies.iter().enumerate() {
        if i % 2 == 0 {
            assert_eq!(r.status, 201, "{}", r.body);
            continue;
        }
        match (r.status, r.code().as_str()) {
            (201, _) => refunded += 50,
            (422, "withdrawal_not_found" | "refund_exceeds_withdrawal") => {}
            other => panic!("{other:?}: {}", r.body),
        }
        answers.push((format!("rr-r{i}"), r.clone()));
    }
    assert!(refunded <= 300, "{refunded} refunded of 300");
    let mut second = 0;
    for i in 0..12 {
        let r = settled(|| refund(&https[i % https.len()], &format!("rr-s{i}"), "rr-w", 50));
        match (r.status, r.code().as_str()) {
            (201, _) => second += 50,
            (422, "refund_exceeds_withdrawal") => {}
            other => panic!("{other:?}: {}", r.body),
        }
    }
    assert_eq!(
        refunded + second,
        300,
        "the withdrawal is refunded in full, not more"
    );
    for (i, (key, first)) in answers.iter().enumerate() {
        let again = refund(&https[i % https.len()], key, "rr-w", 50);
        assert_eq!(
            (again.status, again.replayed),
            (first.status, true),
            "{key}"
        );
        assert_eq!(again.body, first.body, "{key}");
    }
    for http in &https {
        assert_eq!(http.balance("carol"), 1000);
    }
    fleet.verify();
    fleet.stop();
}

#[test]
fn a_worker_killed_and_backends_terminated_mid_group_under_load_lose_no_answer() {
    let Some(fleet) = Fleet::start("killed_mid_group_under_load", 2) else {
        return;
    };
    crash_under_load(fleet);
}

#[test]
fn four_workers_one_killed_and_backends_terminated_mid_group_lose_no_answer() {
    let Some(fleet) = Fleet::start("four_killed_mid_group_under_load", 4) else {
        return;
    };
    crash_under_load(fleet);
}

/// The request a load thread sends for its `i`-th key: deposits and withdrawals over a
/// few accounts, one of them hot.
fn load_request(http: &Http, thread: usize, i: usize) -> Result<Reply, ureq::Error> {
    let key = format!("L{thread}-{i}");
    let account = if i.is_multiple_of(2) {
        "hot".to_owned()
    } else {
        format!("acc{}", thread % 5)
    };
    let (path, amount) = if i % 3 == 2 {
        ("/v1/withdrawals", 7)
    } else {
        ("/v1/deposits", 5)
    };
    http.try_post(
        path,
        Some(&key),
        &format!(r#"{{"account":"{account}","amount":{amount},"currency":"RUB"}}"#),
    )
}

/// Sixteen threads send new keys to every worker as fast as they are answered. Meanwhile
/// the test terminates the backends that are running a group (`pg_terminate_backend`),
/// several times, then kills the first worker with `kill -9`. Afterwards every answer a
/// client saw (201 or 422) is sent again to a surviving worker and must come back as its
/// replay, byte for byte; each answered key has exactly one fact; a key whose request got
/// no answer (the killed worker, a 503) is sent again until it is answered, once; and
/// `verify --store` passes.
fn crash_under_load(mut fleet: Fleet) {
    let https = fleet.https();
    for (k, http) in https.iter().enumerate() {
        assert_eq!(http.deposit(&format!("seed-{k}"), "hot", 1_000).status, 201);
    }
    let stop = AtomicBool::new(false);
    let seen: Mutex<HashMap<(usize, usize), Reply>> = Mutex::new(HashMap::new());
    let unanswered: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let admin = fleet.session();
    let mut terminated = 0;
    std::thread::scope(|s| {
        for thread in 0..16 {
            let (https, stop, seen, unanswered) = (&https, &stop, &seen, &unanswered);
            s.spawn(move || {
                let http = &https[thread % https.len()];
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    match load_request(http, thread, i) {
                        Ok(r) if r.status == 201 || r.status == 422 => {
                            seen.lock().unwrap().insert((thread, i), r);
                        }
                        Ok(r) if r.status == 409 => continue,
                        // The killed worker, or a 503: no answer was given.
                        _ => {
                            unanswered.lock().unwrap().push((thread, i));
                            if http.base == https[0].base {
                                // This thread's worker is gone: it stops.
                                return;
                            }
                        }
                    }
                    i += 1;
                }
            });
        }
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(300));
            let n: i64 = fleet
                .runtime
                .block_on(admin.query_one(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                     AND (query LIKE '%idem_claim_group%' OR query LIKE '%idem_apply_group%') \
                     AND state <> 'idle'",
                    &[],
                ))
                .unwrap()
                .get(0);
            terminated += n;
        }
        fleet.workers[0].take().unwrap().kill9();
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
    });
    assert!(terminated > 0, "no backend was caught running a group");
    let seen = seen.into_inner().unwrap();
    let unanswered = unanswered.into_inner().unwrap();
    eprintln!(
        "{} answers seen, {} unanswered, {terminated} backends terminated mid-group",
        seen.len(),
        unanswered.len()
    );
    assert!(seen.len() > 100, "too little load: {}", seen.len());
    let survivors = fleet.https();
    // The load kept lanes busy, so groups were claimed behind their predecessors'
    // COMMITs: the terminations met that path too.
    let pipelined: u64 = survivors
        .iter()
        .map(|http| {
            let body = http.get("/metrics").body;
            body.lines()
                .find_map(|l| l.strip_prefix("idem_commit_pipelined_total "))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no idem_commit_pipelined_total in:\n{body}"))
        })
        .sum();
    assert!(pipelined > 0, "no group was claimed behind a COMMIT");
    for (n, ((thread, i), first)) in seen.iter().enumerate() {
        let again = load_request(&survivors[n % survivors.len()], *thread, *i).unwrap();
        assert_eq!(
            (again.status, again.replayed),
            (first.status, true),
            "L{thread}-{i}"
        );
        assert_eq!(again.body, first.body, "L{thread}-{i}");
    }
    for (thread, i) in &unanswered {
        let r = settled(|| load_request(&survivors[0], *thread, *i).unwrap());
        assert!(
            r.status == 201 || r.status == 422,
            "L{thread}-{i}: {}",
            r.body
        );
    }
    let admin = fleet.session();
    let rows = fleet
        .runtime
        .block_on(admin.query(
            "SELECT key, count(*) FROM idem.facts WHERE key LIKE 'L%' GROUP BY key",
            &[],
        ))
        .unwrap();
    let facts: HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    for (thread, i) in seen.keys().chain(&unanswered) {
        assert_eq!(
            facts.get(&format!("L{thread}-{i}")),
            Some(&1),
            "L{thread}-{i}"
        );
    }
    assert_eq!(
        facts.len(),
        seen.len() + unanswered.len(),
        "a fact for a key never sent"
    );
    fleet.verify();
    fleet.stop();
}

/// On PostgreSQL the store itself waits `--in-flight-wait` on a twin's uncommitted claim;
/// the HTTP handler then answers 409 at once instead of waiting a second time. The twin
/// here is a session that claimed the key and hangs; the answer must come after about one
/// wait (600 ms), well before two.
#[test]
fn a_409_on_postgres_costs_one_in_flight_wait_not_two() {
    // A worker thread of its own, so the hung session's connection stays served while
    // this thread waits on HTTP.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let Some(db) = runtime.block_on(PgTestDb::create(
        "a_409_on_postgres_costs_one_in_flight_wait",
        "idem_workers",
    )) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let worker = Worker::start_store(
        &db.url,
        &dir.path().join("w.log"),
        &["--in-flight-wait", "600ms"],
    );
    let http = worker.http();
    assert_eq!(http.deposit("wait-dep", "alice", 1000).status, 201);
    let hung = runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(
                "BEGIN; \
                 SELECT pg_advisory_xact_lock(idem.idem_claim_lock('k', 'default', 'wait-w')); \
                 INSERT INTO idem.idempotency_keys \
                 (client, key, request_hash, status, created_at) \
                 VALUES ('default', 'wait-w', '\\x00', 'pending', now())",
            )
            .await
            .unwrap();
        client
    });
    let started = std::time::Instant::now();
    let reply = http.withdraw("wait-w", "alice", 100);
    let took = started.elapsed();
    assert_eq!(reply.status, 409, "{}", reply.body);
    assert_eq!(reply.code(), "request_in_progress");
    assert!(
        took >= std::time::Duration::from_millis(550)
            && took < std::time::Duration::from_millis(1100),
        "one wait of 600 ms expected, took {took:?}"
    );
    runtime.block_on(hung.batch_execute("ROLLBACK")).unwrap();
    let reply = http.withdraw("wait-w", "alice", 100);
    assert_eq!(reply.status, 201, "{}", reply.body);
    verify_store(&db.url);
    assert_eq!(worker.term().code(), Some(0));
    runtime.block_on(db.drop_now());
}
