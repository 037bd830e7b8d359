//! Several worker processes on one PostgreSQL database keep every guarantee,
//! because all of them live in the database (unique indexes, guarded updates, one
//! transaction per command), none in a worker's memory. Needs the PostgreSQL server of
//! `IDEM_TEST_PG_URL`; without it the tests say they did not run, or fail when
//! `IDEM_REQUIRE_SERVICES=1` (CI).

use std::collections::BTreeMap;
use std::sync::Barrier;

use ledger::testing::PgTestDb;

use crate::support::{Http, Reply, Worker, verify_store};

/// A fresh database and two workers serving it.
struct Pair {
    db: Option<PgTestDb>,
    _dir: tempfile::TempDir,
    a: Worker,
    b: Worker,
    runtime: tokio::runtime::Runtime,
}

impl Pair {
    fn start(test: &str) -> Option<Pair> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let db = runtime.block_on(PgTestDb::create(test, "idem_workers"))?;
        let dir = tempfile::tempdir().unwrap();
        // Both start at once: the schema is created by exactly one of them.
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| Worker::start_store(&db.url, &dir.path().join("a.log"), &[]));
            let b = s.spawn(|| Worker::start_store(&db.url, &dir.path().join("b.log"), &[]));
            (a.join().unwrap(), b.join().unwrap())
        });
        Some(Pair {
            db: Some(db),
            _dir: dir,
            a,
            b,
            runtime,
        })
    }

    fn verify(&self) {
        verify_store(&self.db.as_ref().unwrap().url);
    }

    fn stop(self) {
        let Pair {
            db, a, b, runtime, ..
        } = self;
        assert_eq!(a.term().code(), Some(0));
        assert_eq!(b.term().code(), Some(0));
        runtime.block_on(db.unwrap().drop_now());
    }
}

/// Sends `n` requests at once, alternating between the two workers.
fn at_once(pair: &Pair, n: usize, send: impl Fn(&Http, usize) -> Reply + Sync) -> Vec<Reply> {
    let barrier = Barrier::new(n);
    let send = &send;
    let (a, b) = (pair.a.http(), pair.b.http());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let http = if i % 2 == 0 { &a } else { &b };
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

#[test]
fn concurrent_duplicates_across_two_workers_make_one_effect() {
    let Some(pair) = Pair::start("concurrent_duplicates_across_two_workers") else {
        return;
    };
    let a = pair.a.http();
    assert_eq!(a.deposit("pg-dep", "alice", 1000).status, 201);
    let replies = at_once(&pair, 48, |http, _| http.withdraw("pg-twin", "alice", 300));
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
    // Every twin that was told 409 gets the same answer on retry, from either worker.
    for http in [&pair.a.http(), &pair.b.http()] {
        let again = http.withdraw("pg-twin", "alice", 300);
        assert_eq!(again.status, 201);
        assert!(again.replayed);
        bodies.push(again.body);
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "{bodies:?}");
    for http in [&pair.a.http(), &pair.b.http()] {
        assert_eq!(http.balance("alice"), 700);
    }
    eprintln!("48 twins over two workers: {by_status:?}");
    pair.verify();
    pair.stop();
}

#[test]
fn an_overdraft_race_across_two_workers_never_overdraws() {
    let Some(pair) = Pair::start("an_overdraft_race_across_two_workers") else {
        return;
    };
    assert_eq!(pair.a.http().deposit("race-dep", "bob", 100).status, 201);
    let replies = at_once(&pair, 40, |http, i| {
        let key = format!("race-w{i}");
        // A 409 cannot happen (every key is distinct), but a retry loop keeps the test
        // honest if the store ever answered one.
        loop {
            let r = http.withdraw(&key, "bob", 10);
            if r.status != 409 {
                return r;
            }
        }
    });
    let applied = replies.iter().filter(|r| r.status == 201).count();
    let refused = replies
        .iter()
        .filter(|r| r.status == 422 && r.code() == "insufficient_funds")
        .count();
    assert_eq!((applied, refused), (10, 30), "{replies:?}");
    for http in [&pair.a.http(), &pair.b.http()] {
        assert_eq!(http.balance("bob"), 0);
    }
    pair.verify();
    pair.stop();
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
