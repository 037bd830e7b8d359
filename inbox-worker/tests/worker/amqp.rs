//! The RabbitMQ inbox in-process against the real local broker and the PostgreSQL store:
//! duplicates absorbed, held deliveries redelivered after a consumer dies, poison messages
//! dead-lettered with their reasons, and a connection killed from the server side. After
//! each, one effect per distinct key, and `verify` passes on PostgreSQL.
//!
//! Each test uses fresh, uniquely named queues and deletes them afterwards (also when it
//! fails), and a fresh database, dropped afterwards (also when it fails). The broker is
//! `IDEM_TEST_AMQP_URL` (default the local guest account), the database server
//! `IDEM_TEST_PG_URL` (see `ledger::testing`); when either cannot be reached the tests say
//! SKIPPED on stderr and pass, unless `IDEM_REQUIRE_SERVICES=1` (CI) makes that a failure.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use inbox_worker::inbox::amqp::{self, AmqpOptions, AmqpStats, ConsumeReport};
use lapin::options::{
    BasicAckOptions, BasicGetOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};
use ledger::testing::PgTestDb;
use ledger::{
    Account, ClientId, Command, CommitMetrics, Fact, Key, KeyInfo, KeyPage, KeyQuery, LedgerError,
    MessageId, Quarantined, Rules, Stats, Store, Submission, VerifyReport,
};
use rand::SeedableRng as _;
use rand::seq::SliceRandom as _;
use tokio::task::JoinHandle;

const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

fn url() -> String {
    std::env::var("IDEM_TEST_AMQP_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// The broker's URL, or `None` (after saying so) when the test cannot run here.
async fn broker() -> Option<String> {
    let url = url();
    let why = match tokio::time::timeout(
        Duration::from_secs(5),
        Connection::connect(&url, ConnectionProperties::default()),
    )
    .await
    {
        Ok(Ok(conn)) => {
            let _ = conn.close(200, "probe").await;
            return Some(url);
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no answer within 5 s".to_owned(),
    };
    skip_or_fail(&format!("RabbitMQ at {}", amqp::redact(&url)), &why);
    None
}

/// The service rule, shared with the PostgreSQL tests (`ledger::testing`): with
/// `IDEM_REQUIRE_SERVICES=1` a missing service fails the test; otherwise the test says it
/// did not run and returns.
fn skip_or_fail(what: &str, why: &str) {
    ledger::testing::service_missing("amqp", what, why);
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("idem-test-{name}-{}-{nanos}", std::process::id())
}

/// Deletes a test's queues and exchange when dropped, also after a failed assertion. Runs
/// on its own thread and runtime: `Drop` cannot await, and may run inside a runtime.
struct Cleanup {
    url: String,
    opts: AmqpOptions,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let url = self.url.clone();
        let (queue, dead, dlx) = (
            self.opts.queue.clone(),
            self.opts.dead_letter_queue.clone(),
            self.opts.dead_letter_exchange.clone(),
        );
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let Ok(conn) = Connection::connect(&url, ConnectionProperties::default()).await
                else {
                    return;
                };
                if let Ok(ch) = conn.create_channel().await {
                    for q in [&queue, &dead] {
                        let _ = ch.queue_delete(q, QueueDeleteOptions::default()).await;
                    }
                    let _ = ch
                        .exchange_delete(&dlx, ExchangeDeleteOptions::default())
                        .await;
                }
                let _ = conn.close(200, "cleanup").await;
            });
        })
        .join();
    }
}

/// Options for a test: fresh names, short waits.
fn options(url: &str, name: &str) -> (AmqpOptions, Cleanup) {
    let mut opts = AmqpOptions::new(url, unique(name));
    opts.connection_name = format!("idem-test consumer {}", opts.queue);
    opts.reconnect_min = Duration::from_millis(50);
    opts.reconnect_max = Duration::from_millis(500);
    opts.requeue_delay = Duration::from_millis(20);
    opts.store_backoff_min = Duration::from_millis(10);
    opts.store_backoff_max = Duration::from_millis(50);
    let cleanup = Cleanup {
        url: url.to_owned(),
        opts: opts.clone(),
    };
    (opts, cleanup)
}

/// A fresh PostgreSQL database for `test` and the store on it, or `None` (after saying so)
/// when the server cannot be reached and services are not required. The database is
/// dropped when the guard is, also after a failed assertion; [`close`] does it in order.
async fn open_store(test: &str) -> Option<(PgTestDb, Arc<dyn Store>)> {
    let db = PgTestDb::create(test, "idem_amqp").await?;
    let rules = Rules {
        retention: Duration::from_secs(24 * 3600),
        lease: Duration::from_secs(10),
        clock: Arc::new(ledger::SystemClock),
    };
    let (store, _) = ledger::PgStore::open(&db.url, rules, ledger::PgConfig::default())
        .await
        .unwrap_or_else(|e| panic!("{test}: opening the store on {}: {e}", db.name));
    Some((db, Arc::new(store)))
}

/// The end of a test: the store shut down (its connections released), then its database
/// dropped.
async fn close(db: PgTestDb, store: Arc<dyn Store>) {
    store.shutdown().await;
    drop(store);
    db.drop_now().await;
}

fn deposit(id: &str, key: &str, account: &str, amount: u64) -> Vec<u8> {
    serde_json::json!({
        "message_id": id,
        "key": key,
        "command": {"type": "deposit", "account": account, "amount": amount, "currency": "RUB"},
    })
    .to_string()
    .into_bytes()
}

/// The same message with its fields in another order: the ledger compares parsed
/// commands, so it is a duplicate, not a conflict.
fn deposit_reordered(id: &str, key: &str, account: &str, amount: u64) -> Vec<u8> {
    format!(
        r#"{{"command":{{"currency":"RUB","amount":{amount},"account":"{account}","type":"deposit"}},"key":"{key}","message_id":"{id}"}}"#
    )
    .into_bytes()
}

/// A consumer running in the background.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    handle: JoinHandle<anyhow::Result<ConsumeReport>>,
    stats: Arc<AmqpStats>,
}

fn start(store: Arc<dyn Store>, opts: AmqpOptions) -> Running {
    let stats = opts.stats.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(amqp::consume(store, opts, async move {
        let _ = stopped.await;
    }));
    Running {
        stop,
        handle,
        stats,
    }
}

impl Running {
    async fn stop(self) -> ConsumeReport {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.handle)
            .await
            .expect("the consumer did not stop within 30 s")
            .unwrap()
            .unwrap()
    }
}

/// Polls `done` until it holds, failing with `what` and the counters after `limit`.
async fn wait_for(
    what: &str,
    stats: &AmqpStats,
    limit: Duration,
    mut done: impl AsyncFnMut() -> bool,
) {
    let deadline = Instant::now() + limit;
    while !done().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}; {}",
            stats.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ready messages in a queue (a passive declare; unacked ones are not counted).
async fn ready(url: &str, queue: &str) -> u32 {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let q = ch
        .queue_declare(
            queue,
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = conn.close(200, "count").await;
    q.message_count()
}

/// Takes every message of the dead-letter queue: (reason header, all headers, body).
async fn drain_dead(url: &str, queue: &str) -> Vec<(String, FieldTable, Vec<u8>)> {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut out = Vec::new();
    while let Some(m) = ch
        .basic_get(queue, BasicGetOptions::default())
        .await
        .unwrap()
    {
        let headers = m.delivery.properties.headers().clone().unwrap_or_default();
        let reason = match headers.inner().get(amqp::REASON_HEADER) {
            Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            other => panic!("no {} header: {other:?}", amqp::REASON_HEADER),
        };
        m.delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
        out.push((reason, headers, m.delivery.data.clone()));
    }
    let _ = conn.close(200, "drained").await;
    out
}

async fn facts(store: &dyn Store) -> usize {
    store.facts(0, 100_000).await.unwrap().len()
}

async fn balance(store: &dyn Store, account: &str) -> i128 {
    let account = Account::parse(account).unwrap();
    store
        .account(&account)
        .await
        .unwrap()
        .and_then(|by_currency| by_currency.values().next().copied())
        .unwrap_or(0)
}

async fn assert_verified(store: &dyn Store) {
    let report = store.verify().await.unwrap();
    assert!(report.ok(), "{report}");
}

/// 200 messages: 140 distinct keys, 54 exact redeliveries (some with the fields
/// reordered) and 6 new message ids repeating a key with the same command. Every message is
/// acked, every key has one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_duplicates_make_one_effect_per_key() {
    let Some(url) = broker().await else { return };
    let started = Instant::now();
    let Some((db, store)) = open_store("amqp_duplicates_make_one_effect_per_key").await else {
        return;
    };
    let (opts, _cleanup) = options(&url, "dups");

    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let distinct = 140usize;
    let mut messages = Vec::new();
    let mut expected: BTreeMap<String, i128> = BTreeMap::new();
    for i in 0..distinct {
        let account = format!("acct-{}", i % 7);
        let amount = u64::try_from(i).unwrap() + 1;
        *expected.entry(account.clone()).or_default() += i128::from(amount);
        messages.push(deposit(
            &format!("m-{i}"),
            &format!("k-{i}"),
            &account,
            amount,
        ));
    }
    for d in 0..54usize {
        let i = (d * 37) % distinct;
        let (id, key, account) = (
            format!("m-{i}"),
            format!("k-{i}"),
            format!("acct-{}", i % 7),
        );
        let amount = u64::try_from(i).unwrap() + 1;
        messages.push(if d % 2 == 0 {
            deposit(&id, &key, &account, amount)
        } else {
            deposit_reordered(&id, &key, &account, amount)
        });
    }
    for r in 0..6usize {
        let i = r * 11;
        let amount = u64::try_from(i).unwrap() + 1;
        messages.push(deposit(
            &format!("m-again-{i}"),
            &format!("k-{i}"),
            &format!("acct-{}", i % 7),
            amount,
        ));
    }
    messages.shuffle(&mut rng);
    assert_eq!(messages.len(), 200);
    assert_eq!(
        amqp::publish(&url, &opts.queue, messages).await.unwrap(),
        200
    );

    let consumer = start(store.clone(), opts.clone());
    let stats = consumer.stats.clone();
    wait_for("200 acks", &stats, Duration::from_secs(60), async || {
        stats.snapshot().acked >= 200
    })
    .await;
    let report = consumer.stop().await;
    eprintln!("amqp dups: {report} in {:?}", started.elapsed());

    assert_eq!(report.acked, 200, "{report}");
    assert_eq!(report.executed, 140, "{report}");
    assert_eq!(report.replayed, 60, "{report}");
    assert_eq!(report.dead_lettered_total(), 0, "{report}");
    assert_eq!(facts(&*store).await, distinct);
    for (account, sum) in &expected {
        assert_eq!(balance(&*store, account).await, *sum, "{account}");
    }
    assert_verified(&*store).await;
    assert_eq!(ready(&url, &opts.queue).await, 0);
    assert_eq!(ready(&url, &opts.dead_letter_queue).await, 0);
    close(db, store).await;
}

/// What a test makes the store do on `submit`; everything else goes to the real store.
#[derive(Clone)]
enum Fault {
    /// Never answer: a consumer that hangs with its deliveries in hand.
    Stall,
    /// Fail with `Unavailable` for this key, always.
    FailKey(String),
    /// Hold every submission while the flag is set: a store that stalls for a while, so
    /// that a test knows what the consumer holds when it cuts the connection.
    Gate(Arc<AtomicBool>),
}

struct Faulty {
    inner: Arc<dyn Store>,
    fault: Fault,
}

#[async_trait]
impl Store for Faulty {
    fn kind(&self) -> &'static str {
        "faulty"
    }
    fn location(&self) -> String {
        self.inner.location()
    }
    fn rules(&self) -> &Rules {
        self.inner.rules()
    }
    async fn submit(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
    ) -> Result<Submission, LedgerError> {
        match &self.fault {
            Fault::Stall => std::future::pending().await,
            Fault::FailKey(k) if k == key.as_str() => {
                Err(LedgerError::Unavailable("injected for the test".into()))
            }
            Fault::FailKey(_) => self.inner.submit(client, key, command, message).await,
            Fault::Gate(closed) => {
                while closed.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                self.inner.submit(client, key, command, message).await
            }
        }
    }
    async fn quarantine(
        &self,
        message_id: Option<String>,
        reason: String,
        payload: Vec<u8>,
    ) -> Result<u64, LedgerError> {
        self.inner.quarantine(message_id, reason, payload).await
    }
    async fn quarantined(&self, after: u64, limit: usize) -> Result<Vec<Quarantined>, LedgerError> {
        self.inner.quarantined(after, limit).await
    }
    async fn quarantined_newest(&self, limit: usize) -> Result<Vec<Quarantined>, LedgerError> {
        self.inner.quarantined_newest(limit).await
    }
    async fn sweep(&self) -> Result<usize, LedgerError> {
        self.inner.sweep().await
    }
    async fn verify(&self) -> Result<VerifyReport, LedgerError> {
        self.inner.verify().await
    }
    async fn key(&self, client: &ClientId, key: &Key) -> Result<Option<KeyInfo>, LedgerError> {
        self.inner.key(client, key).await
    }
    async fn keys(&self, query: KeyQuery) -> Result<KeyPage, LedgerError> {
        self.inner.keys(query).await
    }
    async fn facts(&self, after: u64, limit: usize) -> Result<Vec<Fact>, LedgerError> {
        self.inner.facts(after, limit).await
    }
    async fn fact(&self, seq: u64) -> Result<Option<Fact>, LedgerError> {
        self.inner.fact(seq).await
    }
    async fn statement(
        &self,
        account: &Account,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Fact>, LedgerError> {
        self.inner.statement(account, after, limit).await
    }
    async fn balances(&self) -> Result<ledger::Balances, LedgerError> {
        self.inner.balances().await
    }
    async fn balance_at(
        &self,
        account: &Account,
        point: ledger::AsOf,
    ) -> Result<Option<ledger::BalanceAt>, LedgerError> {
        self.inner.balance_at(account, point).await
    }
    async fn account(
        &self,
        account: &Account,
    ) -> Result<Option<BTreeMap<ledger::Currency, i128>>, LedgerError> {
        self.inner.account(account).await
    }
    async fn stats(&self) -> Result<Stats, LedgerError> {
        self.inner.stats().await
    }
    fn pending(&self) -> Vec<KeyInfo> {
        self.inner.pending()
    }
    fn durable_seq(&self) -> u64 {
        self.inner.durable_seq()
    }
    fn commit_metrics(&self) -> CommitMetrics {
        self.inner.commit_metrics()
    }
    fn memory(&self) -> Vec<ledger::MemoryUse> {
        self.inner.memory()
    }
    async fn size_on_disk(&self) -> Result<u64, LedgerError> {
        self.inner.size_on_disk().await
    }
    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }
    async fn shutdown(&self) {
        self.inner.shutdown().await;
    }
}

fn faulty(store: &Arc<dyn Store>, fault: Fault) -> Arc<dyn Store> {
    Arc::new(Faulty {
        inner: store.clone(),
        fault,
    })
}

/// A consumer dies holding a full prefetch of unacked deliveries: the broker hands all of
/// them to the next consumer, which applies each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_deliveries_held_by_a_dead_consumer_are_redelivered() {
    let Some(url) = broker().await else { return };
    let started = Instant::now();
    let Some((db, store)) =
        open_store("amqp_deliveries_held_by_a_dead_consumer_are_redelivered").await
    else {
        return;
    };
    let (mut opts, _cleanup) = options(&url, "held");
    opts.prefetch = 16;
    let messages: Vec<Vec<u8>> = (0..50)
        .map(|i| deposit(&format!("m-{i}"), &format!("k-{i}"), "alice", 10))
        .collect();
    assert_eq!(
        amqp::publish(&url, &opts.queue, messages).await.unwrap(),
        50
    );

    // The first consumer takes its prefetch and hangs in the store.
    let mut first_opts = opts.clone();
    first_opts.stats = Arc::new(AmqpStats::default());
    let first = start(faulty(&store, Fault::Stall), first_opts);
    let first_stats = first.stats.clone();
    wait_for(
        "the first consumer to hold 16",
        &first_stats,
        Duration::from_secs(30),
        async || first_stats.snapshot().consumed >= 16,
    )
    .await;
    // A little longer: the broker must not hand it more than its prefetch.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(first_stats.snapshot().consumed, 16);
    assert_eq!(first_stats.snapshot().acked, 0);
    assert_eq!(ready(&url, &opts.queue).await, 34);
    // It dies: its task, its tasks and its connection are dropped, nothing acked.
    first.handle.abort();
    let _ = first.handle.await;
    drop(first.stop);
    wait_for(
        "the 16 held deliveries to return to the queue",
        &first_stats,
        Duration::from_secs(30),
        async || ready(&url, &opts.queue).await == 50,
    )
    .await;

    let second = start(store.clone(), opts.clone());
    let stats = second.stats.clone();
    wait_for("50 acks", &stats, Duration::from_secs(60), async || {
        stats.snapshot().acked >= 50
    })
    .await;
    let report = second.stop().await;
    eprintln!("amqp held: {report} in {:?}", started.elapsed());
    assert_eq!(report.acked, 50, "{report}");
    assert_eq!(report.executed, 50, "{report}");
    assert_eq!(report.redelivered, 16, "{report}");
    assert_eq!(facts(&*store).await, 50);
    assert_eq!(balance(&*store, "alice").await, 500);
    assert_verified(&*store).await;
    assert_eq!(ready(&url, &opts.queue).await, 0);
    close(db, store).await;
}

/// Poison: an undecodable message, a message id seen before with another payload, a key
/// reused for another command, and a message the store fails every time. Each ends in the
/// dead-letter queue with its reason; nothing else moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_poison_messages_are_dead_lettered_with_their_reason() {
    let Some(url) = broker().await else { return };
    let started = Instant::now();
    let Some((db, store)) =
        open_store("amqp_poison_messages_are_dead_lettered_with_their_reason").await
    else {
        return;
    };
    let (mut opts, _cleanup) = options(&url, "poison");
    opts.max_deliveries = 3;
    let consumer = start(
        faulty(&store, Fault::FailKey("k-poison".into())),
        opts.clone(),
    );
    let stats = consumer.stats.clone();

    // First the original, alone, so that the conflicting copies below come second.
    let original = deposit("m-1", "k-1", "alice", 100);
    amqp::publish(&url, &opts.queue, [original]).await.unwrap();
    wait_for(
        "the original",
        &stats,
        Duration::from_secs(30),
        async || stats.snapshot().acked >= 1,
    )
    .await;

    let undecodable = b"this is not json".to_vec();
    let same_id_other_payload = deposit("m-1", "k-1", "alice", 999);
    let same_key_other_command = deposit("m-2", "k-1", "alice", 999);
    let failing = deposit("m-3", "k-poison", "alice", 5);
    let poison = [
        undecodable.clone(),
        same_id_other_payload.clone(),
        same_key_other_command.clone(),
        failing.clone(),
    ];
    amqp::publish(&url, &opts.queue, poison).await.unwrap();
    wait_for(
        "4 dead letters",
        &stats,
        Duration::from_secs(60),
        async || stats.snapshot().dead_lettered_total() >= 4,
    )
    .await;
    let report = consumer.stop().await;
    eprintln!("amqp poison: {report} in {:?}", started.elapsed());

    let dead = drain_dead(&url, &opts.dead_letter_queue).await;
    assert_eq!(dead.len(), 4, "{dead:?}");
    let by_body: BTreeMap<Vec<u8>, (String, FieldTable)> =
        dead.into_iter().map(|(r, h, b)| (b, (r, h))).collect();
    let reason = |body: &Vec<u8>| by_body.get(body).map(|(r, _)| r.clone()).unwrap();
    assert!(reason(&undecodable).starts_with("undecodable: "));
    assert!(reason(&same_id_other_payload).starts_with("message_id_reused"));
    assert!(reason(&same_key_other_command).starts_with("idempotency_key_reused"));
    let limit = reason(&failing);
    assert!(limit.starts_with("delivered 4 times"), "{limit}");
    let (_, headers) = by_body.get(&failing).unwrap();
    assert_eq!(
        headers.inner().get("x-idem-deliveries"),
        Some(&AMQPValue::LongLongInt(4))
    );
    assert_eq!(
        headers.inner().get("x-idem-message-id"),
        Some(&AMQPValue::LongString("m-3".into()))
    );
    // No reason quotes the message.
    for (r, _) in by_body.values() {
        assert!(!r.contains("999") && !r.contains("this is not"), "{r}");
    }

    assert_eq!(report.dead_lettered["undecodable"], 1, "{report}");
    assert_eq!(report.dead_lettered["message_id_reused"], 1, "{report}");
    assert_eq!(
        report.dead_lettered["idempotency_key_reused"], 1,
        "{report}"
    );
    assert_eq!(report.dead_lettered["delivery_limit"], 1, "{report}");
    assert_eq!(report.store_errors, 3, "{report}");
    assert_eq!(report.requeued, 3, "{report}");
    assert_eq!(report.acked, 5, "{report}");
    assert_eq!(
        report.consumed,
        report.acked + report.requeued + report.ack_failures,
        "{report:?}"
    );
    // One effect: the original deposit.
    assert_eq!(facts(&*store).await, 1);
    assert_eq!(balance(&*store, "alice").await, 100);
    // Every refusal is also in the store's quarantine, where an operator reads them all:
    // the reused id kept by the ledger in the commit that refused it, the others with
    // their body as received.
    assert_eq!(report.quarantined, 4, "{report}");
    let kept = store.quarantined(0, 10).await.unwrap();
    assert_eq!(kept.len(), 4, "{kept:?}");
    let find = |reason: &str| {
        kept.iter()
            .find(|q| q.reason.starts_with(reason))
            .unwrap_or_else(|| panic!("no {reason} in {kept:?}"))
    };
    let reused = find("message_id_reused");
    assert_eq!(reused.message_id.as_deref(), Some("m-1"));
    // Kept as the store decoded it: the whole message, its tenant named.
    let mut as_sent: serde_json::Value = serde_json::from_slice(&same_id_other_payload).unwrap();
    as_sent["client"] = "default".into();
    let kept_message: serde_json::Value = serde_json::from_str(&reused.payload).unwrap();
    assert_eq!(kept_message, as_sent);
    for (reason, body, id) in [
        ("undecodable", &undecodable, None),
        (
            "idempotency_key_reused",
            &same_key_other_command,
            Some("m-2"),
        ),
        ("delivered 4 times", &failing, Some("m-3")),
    ] {
        let q = find(reason);
        assert_eq!(q.payload.as_bytes(), &body[..], "{q:?}");
        assert_eq!(q.message_id.as_deref(), id, "{q:?}");
    }
    assert_verified(&*store).await;
    assert_eq!(ready(&url, &opts.queue).await, 0);
    close(db, store).await;
}

/// A mistake only an operator can fix fails at once, with the broker's reason; a broker
/// that is not up yet is waited for instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_refused_credentials_fail_at_once() {
    let Some(url) = broker().await else { return };
    let Some((db, store)) = open_store("amqp_refused_credentials_fail_at_once").await else {
        return;
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        panic!("not a URL: {url}")
    };
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let wrong = format!("{scheme}://idem-nobody:wrong@{host}");
    let (opts, _cleanup) = options(&wrong, "refused");
    let started = Instant::now();
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        amqp::consume(store.clone(), opts, std::future::pending()),
    )
    .await
    .expect("refused credentials must not be retried")
    .unwrap_err();
    let text = format!("{e:#}");
    assert!(text.contains("ACCESS_REFUSED"), "{text}");
    assert!(!text.contains("wrong"), "the password leaked: {text}");
    let e = amqp::consume(store.clone(), AmqpOptions::new("http://x", "q"), async {})
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains("not valid"), "{e:#}");
    eprintln!("amqp refused: failed in {:?}: {text}", started.elapsed());
    close(db, store).await;
}

/// `submit --via` takes amounts in major units like the HTTP path, and publishes minor
/// units: 12.50 RUB is `"amount":1250` on the queue. A refund states its currency, since
/// no worker is asked for its withdrawal's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_via_publishes_minor_units() {
    let Some(url) = broker().await else { return };
    let (opts, _cleanup) = options(&url, "via");
    let queue = opts.queue.as_str();
    let cli = |args: &[&str]| {
        std::process::Command::new(crate::support::bin())
            .arg("submit")
            .args(args)
            .args(["--via", &url, "--queue", queue])
            .env_remove("IDEM_VIA")
            .output()
            .unwrap()
    };
    let out = cli(&[
        "deposit",
        "--key",
        "via-1",
        "--account",
        "alice",
        "--amount",
        "12.50",
        "--currency",
        "RUB",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with(&format!(
            "published: deposit 12.50 RUB (key via-1, message via-1) to queue {queue}"
        )),
        "{text}"
    );
    // The broker's confirm is not the outcome: the line says so, and where to read it.
    assert!(text.contains("not an outcome"), "{text}");
    assert!(text.contains("GET /v1/keys/via-1"), "{text}");
    assert!(text.contains("/v1/live/quarantine"), "{text}");
    let out = cli(&[
        "refund",
        "--key",
        "via-2",
        "--withdrawal",
        "w-1",
        "--amount",
        "1.5",
        "--currency",
        "RUB",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&[
        "deposit",
        "--key",
        "via-3",
        "--account",
        "alice",
        "--amount",
        "1.505",
        "--currency",
        "RUB",
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut commands = Vec::new();
    while let Some(m) = ch
        .basic_get(queue, BasicGetOptions::default())
        .await
        .unwrap()
    {
        let body: serde_json::Value = serde_json::from_slice(&m.delivery.data).unwrap();
        m.delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
        commands.push(body["command"].clone());
    }
    let _ = conn.close(200, "drained").await;
    assert_eq!(
        commands,
        [
            serde_json::json!({"type": "deposit", "account": "alice", "amount": 1250, "currency": "RUB"}),
            serde_json::json!({"type": "refund", "withdrawal": "w-1", "amount": 150}),
        ]
    );
}

/// A broker that refuses the connection is reported with each cause once: lapin's errors
/// repeat their source in their own text, which a plain `{:#}` would print twice. Needs
/// no broker: the port is one nothing listens on.
#[test]
fn submit_via_an_unreachable_broker_says_each_cause_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = std::process::Command::new(crate::support::bin())
        .args(["submit", "deposit", "--key", "k-1", "--account", "alice"])
        .args(["--amount", "1", "--currency", "RUB", "--queue", "q"])
        .args([
            "--via",
            &format!("amqp://guest:secret@127.0.0.1:{port}/%2f"),
        ])
        .env_remove("IDEM_VIA")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let refused = "Connection refused";
    assert_eq!(err.matches(refused).count(), 1, "{err}");
    assert!(!err.contains("secret"), "the password leaked: {err}");
}

/// `rabbitmqctl` as root, or `None` where it cannot run.
fn rabbitmqctl(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "rabbitmqctl {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The broker's ids of the connections whose client-given name contains `name`: only this
/// test's, as the other tests run at the same time.
fn connection_pids(name: &str) -> Option<Vec<String>> {
    // The table output, one connection a line: `<rabbit@host.1.2.3>\t[{"connection_name",…}]`.
    // (The JSON formatter prints pids as `#PID<…>`, which close_connection refuses.)
    let listing = rabbitmqctl(&["list_connections", "pid", "client_properties", "-s"])?;
    listing
        .lines()
        .filter(|l| l.contains(name))
        .map(|l| l.split('\t').next().map(|pid| pid.trim().to_owned()))
        .collect()
}

/// The broker closes the consumer's connection in the middle of a stream: the consumer
/// reconnects and the stream completes, one effect per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_consumer_reconnects_after_the_broker_kills_its_connection() {
    let Some(url) = broker().await else { return };
    if rabbitmqctl(&["list_connections", "-q", "pid"]).is_none() {
        skip_or_fail("rabbitmqctl", "it needs root and the broker's cookie");
        return;
    }
    let started = Instant::now();
    let Some((db, store)) =
        open_store("amqp_consumer_reconnects_after_the_broker_kills_its_connection").await
    else {
        return;
    };
    let (mut opts, _cleanup) = options(&url, "killed");
    opts.prefetch = 8;
    // A store the test can stall: the consumer then holds a full prefetch, unacked, while
    // rabbitmqctl (which takes seconds to start) cuts its connection.
    let gate = Arc::new(AtomicBool::new(false));

    let distinct = 450usize;
    let mut messages: Vec<Vec<u8>> = (0..distinct)
        .map(|i| deposit(&format!("m-{i}"), &format!("k-{i}"), "bob", 1))
        .collect();
    messages.extend((0..150).map(|d| {
        let i = (d * 3) % distinct;
        deposit(&format!("m-{i}"), &format!("k-{i}"), "bob", 1)
    }));
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    messages.shuffle(&mut rng);
    let total = messages.len();

    let consumer = start(faulty(&store, Fault::Gate(gate.clone())), opts.clone());
    let stats = consumer.stats.clone();
    wait_for(
        "the consumer to connect",
        &stats,
        Duration::from_secs(30),
        async || stats.connected(),
    )
    .await;
    // Found before the stream starts: rabbitmqctl takes a second or two to answer.
    let name = opts.queue.clone();
    let pids = tokio::task::spawn_blocking(move || connection_pids(&name))
        .await
        .unwrap()
        .expect("rabbitmqctl list_connections failed");
    assert_eq!(
        pids.len(),
        1,
        "expected the consumer's one connection: {pids:?}"
    );
    let (first_half, second_half) = messages.split_at(total / 2);
    amqp::publish(&url, &opts.queue, first_half.to_vec())
        .await
        .unwrap();
    wait_for("60 acks", &stats, Duration::from_secs(60), async || {
        stats.snapshot().acked >= 60
    })
    .await;
    gate.store(true, Ordering::SeqCst);
    wait_for(
        "the consumer to hold a full prefetch",
        &stats,
        Duration::from_secs(30),
        async || {
            let s = stats.snapshot();
            s.consumed - s.acked - s.requeued - s.ack_failures == 8
        },
    )
    .await;
    let pid = pids[0].clone();
    tokio::task::spawn_blocking(move || {
        rabbitmqctl(&["close_connection", &pid, "idem test: connection killed"])
    })
    .await
    .unwrap()
    .expect("rabbitmqctl close_connection failed");
    let at_kill = stats.snapshot();
    eprintln!("amqp killed: connection closed holding 8, at {at_kill}");
    assert!(
        usize::try_from(at_kill.acked).unwrap() < total / 2,
        "the first half had already been consumed when the connection was cut: {at_kill}"
    );
    // The consumer notices and reconnects while the 8 it held are still in the store.
    wait_for("a reconnect", &stats, Duration::from_secs(30), async || {
        stats.snapshot().reconnects >= 1 && stats.connected()
    })
    .await;
    gate.store(false, Ordering::SeqCst);
    amqp::publish(&url, &opts.queue, second_half.to_vec())
        .await
        .unwrap();

    wait_for(
        "every key applied and the queue drained",
        &stats,
        Duration::from_secs(120),
        async || {
            let s = stats.snapshot();
            let in_hand = s.consumed - s.acked - s.requeued - s.ack_failures;
            s.reconnects >= 1
                && in_hand == 0
                && facts(&*store).await == distinct
                && ready(&url, &opts.queue).await == 0
        },
    )
    .await;
    let report = consumer.stop().await;
    eprintln!("amqp killed: {report} in {:?}", started.elapsed());
    // One connection killed is one outage, however many attempts reconnecting took.
    assert_eq!(report.reconnects, 1, "{report}");
    // Every delivery is acked, requeued, or left to the broker with its channel.
    assert_eq!(
        report.consumed,
        report.acked + report.requeued + report.ack_failures,
        "{report:?}"
    );
    // What the consumer held when its connection died came back and was replayed; the
    // commits of the 8 it held stand, their acks failed on the dead channel.
    assert!(report.redelivered >= 8, "{report}");
    assert!(report.ack_failures >= 8, "{report}");
    // Every delivery, the held ones on the dead channel included, got its outcome.
    assert_eq!(
        report.executed + report.replayed,
        report.consumed,
        "{report:?}"
    );
    assert_eq!(
        usize::try_from(report.executed).unwrap(),
        distinct,
        "{report}"
    );
    assert!(usize::try_from(report.acked).unwrap() >= total, "{report}");
    assert_eq!(report.dead_lettered_total(), 0, "{report}");
    assert_eq!(facts(&*store).await, distinct);
    assert_eq!(
        balance(&*store, "bob").await,
        i128::try_from(distinct).unwrap()
    );
    assert_verified(&*store).await;
    assert_eq!(ready(&url, &opts.queue).await, 0);
    close(db, store).await;
}

/// A TCP relay to the broker that the test can cut: a real connection path with a switch
/// in it. While it is down it accepts and closes at once, so every attempt to connect
/// fails as on a broker that went away; cutting it also closes the connections it
/// relays.
struct Relay {
    port: u16,
    up: Arc<AtomicBool>,
    relayed: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: JoinHandle<()>,
}

impl Relay {
    async fn start(broker: &str) -> Relay {
        let target = broker.to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(false));
        let relayed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (up2, relayed2) = (up.clone(), relayed.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    continue;
                }
                let target = target.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                relayed2.lock().unwrap().push(task.abort_handle());
            }
        });
        Relay {
            port,
            up,
            relayed,
            accept,
        }
    }

    fn open(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    /// Refuses new connections and drops the ones it relays: an outage.
    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for task in self.relayed.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

/// The broker's `host:port` in an AMQP URL, and the URL with another port.
fn via_port(url: &str, port: u16) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (auth, rest) = rest.rsplit_once('@').map_or(("", rest), |(a, r)| (a, r));
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let broker = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5672")
    };
    let at = if auth.is_empty() { "" } else { "@" };
    let name = broker.rsplit_once(':').unwrap().0;
    (
        broker.clone(),
        format!("{scheme}://{auth}{at}{name}:{port}/{path}"),
    )
}

/// Outages are counted once each, however many attempts reconnecting takes (those are
/// counted apart), and the consumer's state says why it is down while it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_outages_are_counted_once_and_reported_while_they_last() {
    let Some(url) = broker().await else { return };
    let Some((db, store)) =
        open_store("amqp_outages_are_counted_once_and_reported_while_they_last").await
    else {
        return;
    };
    let (broker_addr, _) = via_port(&url, 0);
    let relay = Relay::start(&broker_addr).await;
    let (_, relayed_url) = via_port(&url, relay.port);
    let (mut opts, _cleanup) = options(&url, "outages");
    opts.url = relayed_url;
    let consumer = start(store.clone(), opts.clone());
    let stats = consumer.stats.clone();
    let down = |stats: &AmqpStats| match stats.health() {
        amqp::AmqpHealth::Down(reason) => Some(reason),
        amqp::AmqpHealth::Consuming => None,
    };

    // Down from the start: failed attempts, no outage yet, and the reason.
    wait_for(
        "3 failed attempts",
        &stats,
        Duration::from_secs(30),
        async || stats.snapshot().connect_failures >= 3,
    )
    .await;
    let reason = down(&stats).expect("not consuming yet");
    assert!(reason.starts_with("cannot consume from"), "{reason}");
    assert_eq!(stats.snapshot().reconnects, 0);

    let mut published = 0;
    for outage in 1..=2u64 {
        relay.open();
        wait_for("consuming", &stats, Duration::from_secs(30), async || {
            stats.connected()
        })
        .await;
        assert_eq!(stats.health(), amqp::AmqpHealth::Consuming);
        let batch: Vec<Vec<u8>> = (published..published + 20)
            .map(|i| deposit(&format!("m-{i}"), &format!("k-{i}"), "alice", 1))
            .collect();
        published += 20;
        amqp::publish(&url, &opts.queue, batch).await.unwrap();
        wait_for(
            "the batch acked",
            &stats,
            Duration::from_secs(60),
            async || stats.snapshot().acked >= published,
        )
        .await;

        let failed_before = stats.snapshot().connect_failures;
        relay.cut();
        wait_for(
            "3 failed attempts in the outage",
            &stats,
            Duration::from_secs(30),
            async || stats.snapshot().connect_failures >= failed_before + 3,
        )
        .await;
        let reason = down(&stats).expect("down during the outage");
        assert!(reason.starts_with("cannot reconnect to"), "{reason}");
        assert_eq!(stats.snapshot().reconnects, outage, "{}", stats.snapshot());
    }
    relay.open();
    wait_for(
        "consuming again",
        &stats,
        Duration::from_secs(30),
        async || stats.connected(),
    )
    .await;
    let report = consumer.stop().await;
    eprintln!("amqp outages: {report}");
    assert_eq!(report.reconnects, 2, "{report}");
    assert!(report.connect_failures >= 9, "{report}");
    assert_eq!(
        report.consumed,
        report.acked + report.requeued + report.ack_failures,
        "{report:?}"
    );
    assert_eq!(facts(&*store).await, 40);
    assert!(matches!(stats.health(), amqp::AmqpHealth::Down(_)));
    drop(relay);
    close(db, store).await;
}

/// A port nothing listens on, for a broker that refuses connections.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `/healthz` of a worker whose consumer cannot reach its broker: 200, since the HTTP API
/// still serves, with `degraded` and the connection error said once; `/metrics` counts
/// the failed attempts and no outage. Needs no broker: nothing listens on the port.
#[test]
fn healthz_is_degraded_while_the_consumer_cannot_connect() {
    let (_dir, db) = crate::support::scratch();
    let amqp = format!("amqp://guest:secret@127.0.0.1:{}/%2f", closed_port());
    let w = crate::support::Worker::start(&db, &["--amqp", &amqp, "--queue", "idem.health"]);
    let http = w.http();
    let health = crate::support::eventually(
        Duration::from_secs(30),
        "a failed attempt in /healthz",
        || {
            let r = http.get("/healthz");
            assert_eq!(r.status, 200, "{}", r.body);
            let body = r.json();
            body["amqp"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("Connection refused"))
                .then_some(body)
        },
    );
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(health["amqp"]["status"], "disconnected", "{health}");
    let reason = health["amqp"]["reason"].as_str().unwrap();
    assert_eq!(reason.matches("Connection refused").count(), 1, "{reason}");
    assert!(!reason.contains("secret"), "the password leaked: {reason}");
    assert!(health["last_seq"].is_u64(), "{health}");
    // The worker still serves commands.
    assert_eq!(http.deposit("dep-1", "alice", 100).status, 201);
    let metrics = http.get("/metrics").body;
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    assert_eq!(value("idem_amqp_connected"), 0);
    assert!(value("idem_amqp_connect_failures_total") >= 1);
    assert_eq!(value("idem_amqp_reconnects_total"), 0);
    assert_eq!(value("idem_amqp_acks_lost_total"), 0);
    assert_eq!(w.term().code(), Some(0));
    // Never said to consume: it never did.
    let log = std::fs::read_to_string(db.with_extension("log")).unwrap();
    assert!(!log.contains("consuming queue"), "{log}");
}

/// With its consumer connected, `/healthz` is `ok` and says the consumer is consuming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_ok_while_the_consumer_consumes() {
    let Some(url) = broker().await else { return };
    let (opts, _cleanup) = options(&url, "health-ok");
    let (_dir, db) = crate::support::scratch();
    let (queue, db2) = (opts.queue.clone(), db.clone());
    let w = tokio::task::spawn_blocking(move || {
        crate::support::Worker::start(&db2, &["--amqp", &url, "--queue", &queue])
    })
    .await
    .unwrap();
    let http = w.http();
    let health = tokio::task::spawn_blocking(move || {
        crate::support::eventually(Duration::from_secs(30), "ok in /healthz", || {
            let body = http.get("/healthz").json();
            (body["status"] == "ok").then_some(body)
        })
    })
    .await
    .unwrap();
    assert_eq!(health["amqp"]["status"], "consuming", "{health}");
    assert_eq!(
        tokio::task::spawn_blocking(move || w.term().code())
            .await
            .unwrap(),
        Some(0)
    );
    let log = std::fs::read_to_string(db.with_extension("log")).unwrap();
    assert_eq!(log.matches("amqp: consuming queue").count(), 1, "{log}");
}
