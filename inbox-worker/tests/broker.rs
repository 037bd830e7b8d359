//! The broker faults on a real RabbitMQ, against real worker processes on a
//! real PostgreSQL store: a worker killed after its commit and before its ack, and the
//! broker restarted mid-stream. After each, effects equal distinct keys and `verify`
//! passes on PostgreSQL.
//!
//! A test binary of its own: restarting the broker would cut the connections of the other
//! RabbitMQ tests, and cargo runs test binaries one after another. Inside it, one lock
//! keeps the scenarios apart. Without the services the tests say they did not run, or fail
//! when `IDEM_REQUIRE_SERVICES=1` (CI).

#![allow(clippy::unwrap_used)]

#[path = "worker/support.rs"]
#[allow(dead_code)]
mod support;

use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ledger::testing::{PgTestDb, redact, service_missing};
use ledger::{Account, Amount, ClientId, Currency, Key, MessageId};

use support::{Http, Worker, verify_store};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn amqp_url() -> String {
    std::env::var("IDEM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// Whether the broker answers on its port (the consumer itself reports anything finer).
fn broker(test: &str) -> Option<String> {
    let url = amqp_url();
    let host = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.rsplit('@').next())
        .and_then(|hp| hp.split('/').next())
        .unwrap_or("127.0.0.1:5672")
        .to_owned();
    let reachable = host
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| TcpStream::connect_timeout(&a, Duration::from_secs(3)));
    match reachable {
        Some(Ok(_)) => Some(url),
        Some(Err(e)) => {
            service_missing(
                test,
                &format!("RabbitMQ at {}", redact(&url)),
                &e.to_string(),
            );
            None
        }
        None => {
            service_missing(test, "RabbitMQ", &format!("cannot resolve {host}"));
            None
        }
    }
}

fn rabbitmqctl(args: &[&str]) {
    let out = Command::new("rabbitmqctl").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}.{}.{nanos}", std::process::id())
}

fn worker(store: &str, queue: &str, log: &Path, env: &[(&str, &str)]) -> Worker {
    let amqp = amqp_url();
    Worker::spawn_env(
        &[
            "serve",
            "--store",
            store,
            "--listen",
            "127.0.0.1:0",
            "--amqp",
            &amqp,
            "--queue",
            queue,
            "--prefetch",
            "16",
        ],
        log,
        env,
    )
}

/// `n` deposits of 10 into accounts `acct-0..`, one message id per key.
fn messages(n: usize) -> Vec<Vec<u8>> {
    let client = ClientId::default_client();
    (0..n)
        .map(|i| {
            let key = Key::parse(&format!("bk-{i}")).unwrap();
            let command = ledger::Command::Deposit {
                account: Account::parse(&format!("acct-{}", i % 7)).unwrap(),
                amount: Amount::new(10).unwrap(),
                currency: Currency::parse("RUB").unwrap(),
            };
            let id = MessageId::parse(&format!("m-{i}")).unwrap();
            inbox_worker::inbox::amqp::message_body(&id, Some(&client), &key, &command)
        })
        .collect()
}

/// Publishes with confirms, retrying until the broker has taken every message (a retry of
/// a message it already had is a redelivery, which the inbox absorbs).
fn publish_all(runtime: &tokio::runtime::Runtime, queue: &str, bodies: &[Vec<u8>]) {
    let url = amqp_url();
    for body in bodies {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match runtime.block_on(inbox_worker::inbox::amqp::publish(
                &url,
                queue,
                [body.clone()],
            )) {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("publish: {e:#}; retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("publishing for 60 s failed: {e:#}"),
            }
        }
    }
}

fn metric(http: &Http, name: &str) -> u64 {
    let text = http.get("/metrics").body;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

fn applied(http: &Http) -> u64 {
    http.get("/v1/live/snapshot").json()["counters"]["applied"]
        .as_u64()
        .unwrap_or(0)
}

fn wait_applied(http: &Http, n: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while applied(http) < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} applied after {limit:?}",
            applied(http)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `verify --store` passes and counts exactly `facts` facts.
fn verify(url: &str, facts: usize) {
    let text = verify_store(url);
    assert!(text.contains(&format!("checked {facts} facts")), "{text}");
}

fn delete_queues(queue: &str) {
    for q in [queue.to_owned(), format!("{queue}.dead")] {
        let _ = Command::new("rabbitmqctl")
            .args(["delete_queue", &q])
            .output();
    }
}

#[test]
fn a_worker_killed_between_commit_and_ack_causes_no_second_effect() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let test = "a_worker_killed_between_commit_and_ack";
    let Some(_) = broker(test) else { return };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(db) = runtime.block_on(PgTestDb::create(test, "idem_broker")) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let queue = unique("idem.test.kill");
    // A dies (abort, as with kill -9) right after its 7th outcome is durable, before the
    // ack: its crash point passes six times, then aborts (the test binary is built with
    // the worker's `failpoints` feature). B, on the same database and queue, gets what A
    // held.
    let a = worker(
        &db.url,
        &queue,
        &dir.path().join("a.log"),
        &[("FAILPOINTS", "amqp.before_ack=6*off->return")],
    );
    let b = worker(&db.url, &queue, &dir.path().join("b.log"), &[]);
    let bodies = messages(120);
    publish_all(&runtime, &queue, &bodies);
    let status = a.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "worker A was to abort before an ack");
    let a_log = std::fs::read_to_string(dir.path().join("a.log")).unwrap_or_default();
    assert!(
        a_log.contains("failpoint amqp.before_ack"),
        "worker A died, but not at its crash point:\n{a_log}"
    );
    let http = b.http();
    wait_applied(&http, 120, Duration::from_secs(90));
    // Every message has its own key and id, so a replay can only be a redelivery of a
    // message whose outcome A made durable and never acked.
    let replayed = metric(&http, "idem_replays_total");
    assert!(
        replayed >= 1,
        "B replayed nothing: A's last commit was lost?"
    );
    assert_eq!(applied(&http), 120);
    eprintln!("kill before ack: 120 effects, {replayed} redelivered replays on the survivor");
    assert_eq!(b.term().code(), Some(0));
    verify(&db.url, 120);
    delete_queues(&queue);
    runtime.block_on(db.drop_now());
}

/// Starts the broker's application again even if the test fails midway.
struct RestartGuard;

impl Drop for RestartGuard {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl").arg("start_app").output();
    }
}

#[test]
fn the_broker_restarted_mid_stream_loses_and_repeats_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let test = "the_broker_restarted_mid_stream";
    let Some(_) = broker(test) else { return };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(db) = runtime.block_on(PgTestDb::create(test, "idem_broker")) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let queue = unique("idem.test.restart");
    let w = worker(&db.url, &queue, &dir.path().join("w.log"), &[]);
    let http = w.http();
    let bodies = messages(300);
    publish_all(&runtime, &queue, &bodies[..150]);
    wait_applied(&http, 20, Duration::from_secs(30));
    {
        let _guard = RestartGuard;
        rabbitmqctl(&["stop_app"]);
        std::thread::sleep(Duration::from_secs(1));
        rabbitmqctl(&["start_app"]);
    }
    rabbitmqctl(&["await_startup"]);
    // Half again (already published: redeliveries the inbox absorbs) and the rest.
    publish_all(&runtime, &queue, &bodies[100..]);
    wait_applied(&http, 300, Duration::from_secs(120));
    let reconnects = metric(&http, "idem_amqp_reconnects_total");
    assert!(reconnects >= 1, "the consumer never lost its connection?");
    assert_eq!(applied(&http), 300);
    eprintln!("broker restart: 300 effects, {reconnects} reconnects");
    assert_eq!(w.term().code(), Some(0));
    verify(&db.url, 300);
    delete_queues(&queue);
    runtime.block_on(db.drop_now());
}
