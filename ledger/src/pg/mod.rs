//! The PostgreSQL store: the same guarantees as the sled [`crate::Ledger`], kept by the
//! database, so any number of workers on any number of hosts can share one ledger.
//!
//! Every command is one transaction in the shape of a hand-written idempotent handler:
//!
//! 1. claim: a transaction-scoped advisory lock on the key (and on the message id), held
//!    to the commit, then read the key (and `INSERT INTO inbox … ON CONFLICT DO NOTHING`
//!    for a message). A concurrent twin waits on the advisory lock until the first
//!    commits or rolls back;
//!    `lock_timeout` bounds that wait alone, and a twin that runs out of it is told
//!    `InProgress` (409). Other waits (a table's extension lock under a burst of inserts)
//!    are bounded by the lease, so they never pass for a twin.
//! 2. if the key was there: same fingerprint → the answer rendered from its fact
//!    (`Outcome::from_fact`, byte-identical to the first answer), another → `Reused`.
//! 3. else lock what the decision reads (`SELECT … FOR UPDATE`), take the fact's number,
//!    decide with the pure core (`core::decide`, the same decision as sled's), and write
//!    the fact, the balances (guarded updates whose affected rows are checked), the key's
//!    row with its outcome, the counters and the inbox row; then COMMIT
//!    (synchronous_commit on) and only then answer.
//!
//! The statements run inside two PL/pgSQL functions (`v3.sql`), `idem_claim_v3` (steps
//! 1–3 up to the decision) and `idem_apply_v3` (the writes), with BEGIN and COMMIT
//! pipelined beside them: two round trips per command instead of one per dependent
//! statement.
//!
//! No correctness comes from this process's memory: the unique indexes, the guarded
//! updates, the row locks and the single transaction are all in the database. What is
//! kept here is observation (pending keys, counters of replays and conflicts) and a short
//! cut for a twin arriving at this same process while its first is running: it reads the
//! key's committed row instead of waiting on the first's lock, and that row decides, as
//! on sled (a done key is replayed, or refused for another command; only a key with
//! nothing committed is in flight).
//!
//! Differences from sled, all from sharing the database between writers:
//! - Sequence numbers come from a sequence: a rolled-back attempt leaves a gap, and two
//!   transactions may commit out of the order of their numbers. `facts(after)` returns
//!   what is committed, so a reader paging by the last seq it saw can miss a fact that
//!   commits later with a smaller number (re-read a little behind to be safe). `verify`
//!   checks the numbers are unique and increasing, not gapless.
//! - A fact's time is `max(clock, the latest time this process recorded or saw)`; across
//!   workers with skewed clocks the log's times are not monotonic in seq. The sweep does
//!   not depend on that order: it selects keys by their own time.
//! - A twin with another command while the first attempt is in flight in another process
//!   is told `InProgress` (the uncommitted fingerprint is invisible); its retry is `Reused`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use parking_lot::Mutex;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{IsolationLevel, NoTls, Row};

use crate::backend::{KeyQuery, Rules, Store};
use crate::core::{self, AccountView, Inputs, Seen, WithdrawalView};
use crate::domain::{
    Account, ClientId, Command, Currency, Fingerprint, Key, MessageId, Rejection, Timestamp,
};
use crate::fact::{self, Fact, FactBody, Outcome};
use crate::memory::{self, Limit, MemoryUse};
use crate::projection::{self, Balances, Observed, Stats};
use crate::store::{
    CommitMetrics, KEYS_SCAN_MAX, KeyInfo, KeyPage, KeyStatus, LATENCY_BUCKETS_US, LedgerError,
    OpenReport, Quarantined, Submission, message_fingerprint,
};
use crate::verify::{self, Report, VerifyReport};

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// A statement parameter.
type P<'a> = &'a (dyn ToSql + Sync);

/// Every balance as stored: user rows, and system accounts with their shards summed.
const SQL_BALANCES: &str = "SELECT account, currency, balance::text FROM accounts \
     UNION ALL \
     SELECT account, currency, sum(balance)::text FROM system_balances \
     GROUP BY account, currency";

/// The migrations, in order; version N is `MIGRATIONS[N - 1]`. Never edit a released one.
const MIGRATIONS: &[(&str, &str)] = &[
    ("facts, keys, balances, inbox", include_str!("v1.sql")),
    ("the command as two functions", include_str!("v2.sql")),
    ("fewer executor starts per command", include_str!("v3.sql")),
    ("the rules as domains", include_str!("v4.sql")),
    (
        "a refund waits for its withdrawal in flight",
        include_str!("v5.sql"),
    ),
];

/// Rows of `system_balances` and `counters` per name; a read sums at most this many rows
/// per name. A transaction holds its shard's row lock until it commits, so two
/// transactions on one shard queue behind each other's WAL flush: each transaction of a
/// process takes a shard no other transaction of the process holds (`ShardSlots`), and
/// processes start at random places among the shards, so a few workers rarely meet.
const SHARDS: u64 = 128;

/// Retry-After of a 409, as sled answers it: the commit usually takes milliseconds, and
/// the header is in whole seconds.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How many times one command is run again after PostgreSQL aborted it for a conflict it
/// resolves that way (a deadlock, a serialization failure, a concurrent first insert of a
/// balance row).
const RETRIES: u32 = 5;

/// Keys expired per sweep transaction.
const SWEEP_BATCH: i64 = 10_000;

/// Rows fetched per round trip when `verify` reads the whole log.
const VERIFY_CHUNK: i32 = 10_000;

/// How many keys the per-key replay/conflict counts remember before starting over.
const ACTIVITY_MAX: usize = 65_536;

/// The guarantee `verify` checks instead of sled's gapless log (see the module docs).
const SEQ_ORDER: &str = "the log's sequence numbers are unique and increasing";

/// How a [`PgStore`] connects and waits.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// Connections this process keeps; each runs one command's transaction at a time.
    pub pool_size: usize,
    /// How long a twin waits for the first attempt's claim before it is told 409.
    pub in_flight_wait: Duration,
    /// The schema that holds the tables, created if missing: lower-case letters, digits
    /// and `_`, not starting with a digit.
    pub schema: String,
    /// How long opening a connection may take, unless the URL says otherwise.
    pub connect_timeout: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            pool_size: 16,
            in_flight_wait: Duration::from_millis(5),
            schema: "idem".into(),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl PgOptions {
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n;
        self
    }
    pub fn in_flight_wait(mut self, wait: Duration) -> Self {
        self.in_flight_wait = wait;
        self
    }
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
}

/// A claim this process holds on a key while its transaction runs.
#[derive(Debug, Clone)]
struct Claim {
    fingerprint: Fingerprint,
    token: u64,
    since: Timestamp,
    command: Command,
}

struct Inner {
    pool: Pool,
    rules: Rules,
    options: PgOptions,
    location: String,
    claims: Mutex<HashMap<(ClientId, Key), Claim>>,
    /// (replays, conflicts) per key seen by this process, bounded.
    activity: Mutex<HashMap<(ClientId, Key), (u32, u32)>>,
    in_flight: AtomicUsize,
    idle: tokio::sync::Notify,
    closed: AtomicBool,
    durable_seq: AtomicU64,
    /// The latest fact time this process recorded or read, in ms: facts it records are
    /// never earlier (see the module docs for the limits of that across workers).
    last_at: AtomicI64,
    next_token: AtomicU64,
    next_shard: AtomicU64,
    shard_slots: ShardSlots,
    replayed: AtomicU64,
    conflicts_in_flight: AtomicU64,
    conflicts_reused: AtomicU64,
    metrics: Mutex<CommitMetrics>,
}

/// The ledger on PostgreSQL. Cheap to clone; see the module docs.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("location", &self.inner.location)
            .finish_non_exhaustive()
    }
}

// ---- errors --------------------------------------------------------------------------

/// Why one attempt at a command's transaction did not finish.
enum Abort {
    /// The key or the message id is claimed by a transaction that is still running.
    InFlight,
    /// PostgreSQL aborted the transaction over a conflict that a new attempt resolves.
    Retry(String),
    Fail(LedgerError),
}

impl From<LedgerError> for Abort {
    fn from(e: LedgerError) -> Self {
        Abort::Fail(e)
    }
}

impl From<tokio_postgres::Error> for Abort {
    fn from(e: tokio_postgres::Error) -> Self {
        let retry = [
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::T_R_SERIALIZATION_FAILURE,
            // Two first deposits to one new account (or first refunds of one withdrawal)
            // both found no row to lock; the second insert fails once the first commits,
            // and a new attempt finds the row and locks it.
            SqlState::UNIQUE_VIOLATION,
        ];
        match e.code() {
            Some(code) if retry.contains(code) => Abort::Retry(describe(&e)),
            _ => Abort::Fail(pg_err(&e)),
        }
    }
}

impl From<PoolError> for Abort {
    fn from(e: PoolError) -> Self {
        Abort::Fail(pool_err(e))
    }
}

/// A readable account of a PostgreSQL error: the driver's own Display says only "db
/// error" for errors the server reported.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("PostgreSQL {}: {}", db.code().code(), db.message()),
        None => format!("PostgreSQL: {e}"),
    }
}

fn pg_err(e: &tokio_postgres::Error) -> LedgerError {
    if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
        return LedgerError::Unavailable(format!(
            "a row lock was held longer than the lease ({}); nothing was recorded",
            describe(e)
        ));
    }
    LedgerError::Unavailable(describe(e))
}

fn pool_err(e: PoolError) -> LedgerError {
    match e {
        PoolError::Closed => LedgerError::Closed,
        PoolError::Backend(e) => LedgerError::Unavailable(describe(&e)),
        PoolError::Timeout(t) => LedgerError::Unavailable(format!(
            "no PostgreSQL connection within the time allowed ({t:?})"
        )),
        other => LedgerError::Unavailable(format!("PostgreSQL connection pool: {other}")),
    }
}

fn get<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i)
        .map_err(|e| LedgerError::Unavailable(format!("unexpected column {i}: {e}")))
}

// ---- conversions ---------------------------------------------------------------------

fn db_int(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| LedgerError::Unavailable(format!("{v} is beyond bigint")))
}

fn db_limit(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn db_time(t: Timestamp) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(t.millis())
        .ok_or_else(|| LedgerError::Unavailable(format!("time {} out of range", t.millis())))
}

fn from_db_time(t: DateTime<Utc>) -> Timestamp {
    Timestamp(t.timestamp_millis())
}

fn ms(d: Duration) -> u128 {
    // 0 turns a PostgreSQL timeout off; every wait here is meant to be bounded.
    d.as_millis().max(1)
}

fn ms_i32(d: Duration) -> i32 {
    i32::try_from(ms(d)).unwrap_or(i32::MAX)
}

fn ms_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

// Statements of the command path, prepared once per connection (deadpool's cache) so
// they can be pipelined. The first four are functions of `v3.sql`, `v2.sql` and `v5.sql`.
const SQL_CLAIM: &str = "SELECT state, message_claimed, hash, seq, body, withdrawal_seq, \
     withdrawal, currency, balance \
     FROM idem_claim_v3($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
const SQL_LOCK: &str = "SELECT currency, balance, refunded, seq FROM idem_lock($1, $2, $3)";
const SQL_WITHDRAWAL: &str =
    "SELECT state, withdrawal_seq, withdrawal FROM idem_withdrawal_v5($1, $2, $3, $4)";
const SQL_APPLY: &str = "SELECT idem_apply_v3($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
     $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25)";
const SQL_INBOX_SEQ: &str = "UPDATE inbox SET seq = $2 WHERE message_id = $1";
const SQL_COUNT: &str = "INSERT INTO counters (name, shard, n) VALUES ($1, $2, $3) \
     ON CONFLICT (name, shard) DO UPDATE SET n = counters.n + EXCLUDED.n";
const SQL_QUARANTINE: &str = "INSERT INTO quarantine (at, message_id, reason, payload) \
     VALUES ($1, $2, $3, $4) RETURNING id";
/// The SQLSTATE `idem_apply_v3` raises when a write disagrees with the decision.
const DISAGREE: &str = "IDM01";

/// The shards no transaction of this process holds, taken and given back around each
/// command's transaction. With more transactions in flight than shards, the extra ones
/// share a shard (`None` from `take`, and the caller picks one round-robin): that only
/// makes them wait on each other, never double-counts.
struct ShardSlots {
    free: Mutex<Vec<i16>>,
}

impl ShardSlots {
    /// All shards, handed out from `offset` on.
    fn new(offset: u64) -> Self {
        let free = (0..SHARDS)
            .rev()
            .filter_map(|i| i16::try_from((offset + i) % SHARDS).ok())
            .collect();
        Self {
            free: Mutex::new(free),
        }
    }

    fn take(&self) -> Option<i16> {
        self.free.lock().pop()
    }

    fn give_back(&self, shard: i16) {
        self.free.lock().push(shard);
    }
}

/// A shard taken for one transaction; given back when dropped (also when the attempt is
/// cut short).
struct ShardSlot<'a> {
    slots: &'a ShardSlots,
    shard: Option<i16>,
}

impl Drop for ShardSlot<'_> {
    fn drop(&mut self) {
        if let Some(shard) = self.shard {
            self.slots.give_back(shard);
        }
    }
}

/// Where this process starts among the shards: different for workers started together.
fn rand_offset() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// The arguments of `idem_apply_v3`, in its order.
struct Apply<'a> {
    seq: i64,
    at: DateTime<Utc>,
    client: &'a str,
    key: &'a str,
    kind: &'static str,
    rejection: Option<&'static str>,
    body: Vec<u8>,
    doc: serde_json::Value,
    response: serde_json::Value,
    counter: String,
    shard: i16,
    account: Option<&'a str>,
    currency: Option<&'a str>,
    delta: Option<i64>,
    account_exists: bool,
    balance_after: Option<String>,
    system: Option<&'a str>,
    system_delta: Option<i64>,
    withdrawal: Option<&'a str>,
    refund: Option<i64>,
    withdrawn: Option<i64>,
    refunded_exists: bool,
    refunded_after: Option<i64>,
    message: Option<&'a str>,
    hash: &'a [u8],
}

impl Apply<'_> {
    fn params(&self) -> [P<'_>; 25] {
        [
            &self.seq,
            &self.at,
            &self.client,
            &self.key,
            &self.kind,
            &self.rejection,
            &self.body,
            &self.doc,
            &self.response,
            &self.counter,
            &self.shard,
            &self.account,
            &self.currency,
            &self.delta,
            &self.account_exists,
            &self.balance_after,
            &self.system,
            &self.system_delta,
            &self.withdrawal,
            &self.refund,
            &self.withdrawn,
            &self.refunded_exists,
            &self.refunded_after,
            &self.message,
            &self.hash,
        ]
    }
}

/// A pooled connection with a transaction begun by hand, so that BEGIN rides in the
/// first round trip and COMMIT in the last (a driver transaction spends a round trip on
/// BEGIN alone). Dropped while the transaction is open (an error path, or the attempt's
/// deadline), it rolls back before the connection goes back to the pool, or closes the
/// connection, which rolls back too.
struct OpenTx {
    conn: Option<deadpool_postgres::Object>,
    open: AtomicBool,
}

impl OpenTx {
    fn conn(&self) -> Result<&deadpool_postgres::Object, Abort> {
        self.conn
            .as_ref()
            .ok_or_else(|| Abort::Fail(LedgerError::Unavailable("connection lost".into())))
    }

    async fn rollback(&self) -> Result<(), Abort> {
        self.conn()?.batch_execute("ROLLBACK").await?;
        self.open.store(false, Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for OpenTx {
    fn drop(&mut self) {
        if !self.open.load(Ordering::Relaxed) {
            return;
        }
        let Some(conn) = self.conn.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if conn.batch_execute("ROLLBACK").await.is_err() {
                        drop(deadpool_postgres::Object::take(conn));
                    }
                });
            }
            Err(_) => drop(deadpool_postgres::Object::take(conn)),
        }
    }
}

/// The counter a fact adds one to.
fn counter_name(body: &FactBody) -> String {
    match body {
        FactBody::DepositRecorded { .. } => "applied.deposit".into(),
        FactBody::WithdrawalRecorded { .. } => "applied.withdraw".into(),
        FactBody::RefundRecorded { .. } => "applied.refund".into(),
        FactBody::CommandRejected { rejection, .. } => format!("rejected.{}", rejection.code()),
    }
}

const COUNTER_EXPIRED: &str = "expired";

/// Counts per name (summed over shards) as [`Stats`] holds them.
fn stats_from_counters(counts: &HashMap<String, i64>) -> Stats {
    let n = |name: &str| u64::try_from(counts.get(name).copied().unwrap_or(0)).unwrap_or(0);
    let mut stats = Stats {
        applied: [
            n("applied.deposit"),
            n("applied.withdraw"),
            n("applied.refund"),
        ],
        ..Stats::default()
    };
    for r in Rejection::ALL {
        stats.rejected[r.index()] = n(&format!("rejected.{}", r.code()));
    }
    let facts = stats.applied_total() + stats.rejected_total();
    stats.keys_expired = n(COUNTER_EXPIRED);
    stats.keys_done = facts.saturating_sub(stats.keys_expired);
    stats
}

/// Releases this process's claim and counts the command out, however it ends.
struct Flight<'a> {
    inner: &'a Inner,
    ck: (ClientId, Key),
    token: Option<u64>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if let Some(token) = self.token {
            let mut claims = self.inner.claims.lock();
            if claims.get(&self.ck).is_some_and(|c| c.token == token) {
                claims.remove(&self.ck);
            }
        }
        if self.inner.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

// ---- opening -------------------------------------------------------------------------

fn valid_schema(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && s.len() <= 63
}

/// Where a configuration points, without the password.
fn target(cfg: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let host = match cfg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let user = cfg.get_user().map(|u| format!("{u}@")).unwrap_or_default();
    let db = cfg.get_dbname().or(cfg.get_user()).unwrap_or("postgres");
    format!("postgres://{user}{host}:{port}/{db}")
}

impl PgStore {
    /// Connects, applies the migrations this build knows (once, under an advisory lock,
    /// so workers starting together do not race), checks that the balances sum to zero,
    /// and returns the store with what it found.
    pub async fn open(
        url: &str,
        rules: Rules,
        options: PgOptions,
    ) -> Result<(PgStore, OpenReport), LedgerError> {
        let started = Instant::now();
        if !valid_schema(&options.schema) {
            return Err(LedgerError::Unavailable(format!(
                "invalid schema name {:?}: use lower-case letters, digits and '_'",
                options.schema
            )));
        }
        let mut cfg: tokio_postgres::Config = url.parse().map_err(|e| {
            LedgerError::Unavailable(format!("the PostgreSQL URL does not parse: {e}"))
        })?;
        let location = format!("{} (schema {})", target(&cfg), options.schema);
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(options.connect_timeout);
        }
        if cfg.get_application_name().is_none() {
            cfg.application_name("idem");
        }
        // Session settings, sent with the startup packet so they cost no round trip:
        // - synchronous_commit on: COMMIT returns once the commit is flushed to the WAL,
        //   whatever the server's default, because an answer follows the COMMIT.
        // - idle_in_transaction_session_timeout and statement_timeout = the lease: a worker
        //   that hangs inside a transaction (stopped, partitioned) loses its session, and
        //   with it its uncommitted claim, once the lease runs out, so the key can be
        //   claimed again. A worker that dies outright loses it when the socket closes.
        // - lock_timeout = the lease: no wait on a row lock outlasts a lease; the claim
        //   lowers it to the in-flight wait for its advisory locks only.
        let lease = ms(rules.lease);
        let ours = format!(
            "-c synchronous_commit=on -c search_path={} -c idle_in_transaction_session_timeout={lease} \
             -c statement_timeout={lease} -c lock_timeout={lease}",
            options.schema
        );
        let opts = match cfg.get_options() {
            Some(theirs) if !theirs.is_empty() => format!("{theirs} {ours}"),
            _ => ours,
        };
        cfg.options(opts);
        let manager = Manager::from_config(
            cfg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(rules.lease))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .build()
            .map_err(|e| LedgerError::Unavailable(format!("PostgreSQL connection pool: {e}")))?;
        let store = PgStore {
            inner: Arc::new(Inner {
                pool,
                options,
                location,
                claims: Mutex::new(HashMap::new()),
                activity: Mutex::new(HashMap::new()),
                in_flight: AtomicUsize::new(0),
                idle: tokio::sync::Notify::new(),
                closed: AtomicBool::new(false),
                durable_seq: AtomicU64::new(0),
                last_at: AtomicI64::new(i64::MIN),
                next_token: AtomicU64::new(1),
                next_shard: AtomicU64::new(std::process::id().into()),
                shard_slots: ShardSlots::new(rand_offset()),
                replayed: AtomicU64::new(0),
                conflicts_in_flight: AtomicU64::new(0),
                conflicts_reused: AtomicU64::new(0),
                metrics: Mutex::new(CommitMetrics::default()),
                rules,
            }),
        };
        let fresh = store.migrate().await?;
        let mut report = store.check_on_open(fresh).await?;
        report.open_ms = started.elapsed().as_millis();
        Ok((store, report))
    }

    /// Applies the migrations this build knows and has not applied. Returns whether the
    /// schema was created now.
    async fn migrate(&self) -> Result<bool> {
        let inner = &self.inner;
        let mut conn = inner.pool.get().await.map_err(pool_err)?;
        let tx = conn.transaction().await.map_err(|e| pg_err(&e))?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        // One migrator at a time per database and schema; the lock ends with the
        // transaction, so a migrator that dies releases it.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('idem.migrate'), hashtext($1))",
            &[&inner.options.schema],
        )
        .await
        .map_err(pg)?;
        tx.batch_execute(&format!(
            "SET LOCAL statement_timeout = 0; \
             CREATE SCHEMA IF NOT EXISTS {schema}; \
             CREATE TABLE IF NOT EXISTS {schema}.schema_version ( \
                 version integer PRIMARY KEY, \
                 name text NOT NULL, \
                 applied_at timestamptz NOT NULL)",
            schema = inner.options.schema
        ))
        .await
        .map_err(pg)?;
        let current: i32 = tx
            .query_one("SELECT coalesce(max(version), 0) FROM schema_version", &[])
            .await
            .map_err(pg)
            .and_then(|row| get(&row, 0))?;
        let known = i32::try_from(MIGRATIONS.len()).unwrap_or(i32::MAX);
        if current > known {
            return Err(LedgerError::Unavailable(format!(
                "the database is at schema version {current}, newer than this build's {known}; \
                 run a newer Idem"
            )));
        }
        let now = db_time(inner.rules.clock.now())?;
        for (version, (name, sql)) in (1..).zip(MIGRATIONS) {
            if version <= current {
                continue;
            }
            tx.batch_execute(sql).await.map_err(pg)?;
            tx.execute(
                "INSERT INTO schema_version (version, name, applied_at) VALUES ($1, $2, $3)",
                &[&version, name, &now],
            )
            .await
            .map_err(pg)?;
        }
        tx.commit().await.map_err(pg)?;
        Ok(current == 0)
    }

    /// What sled's open checks, as far as it is cheap here: the balances sum to zero per
    /// currency. The rest is `verify`'s.
    async fn check_on_open(&self, fresh: bool) -> Result<OpenReport> {
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let sums = conn
            .query(
                "SELECT currency, sum(balance)::text FROM ( \
                     SELECT currency, balance FROM accounts \
                     UNION ALL SELECT currency, balance FROM system_balances) b \
                 GROUP BY currency HAVING sum(balance) <> 0",
                &[],
            )
            .await
            .map_err(pg)?;
        if let Some(row) = sums.first() {
            let currency: String = get(row, 0)?;
            let sum: String = get(row, 1)?;
            return Err(self.corrupt(format!("balances in {currency} sum to {sum}, not 0")));
        }
        let stats = self.stats_now(&conn).await?;
        let accounts: i64 = conn
            .query_one("SELECT count(*) FROM accounts", &[])
            .await
            .map_err(pg)
            .and_then(|row| get(&row, 0))?;
        // The newest fact by number (an index lookup, not a scan): its time is where this
        // process's facts start from.
        let mut last_fact_at = None;
        if stats.last_seq > 0 {
            let at = stats.last_at;
            self.inner.last_at.fetch_max(at.millis(), Ordering::SeqCst);
            last_fact_at = Some(at.to_rfc3339());
        }
        Ok(OpenReport {
            fresh,
            facts: stats.applied_total() + stats.rejected_total(),
            keys_done: stats.keys_done,
            keys_expired: stats.keys_expired,
            accounts: usize::try_from(accounts).unwrap_or(0),
            last_fact_at,
            open_ms: 0,
        })
    }

    pub fn options(&self) -> &PgOptions {
        &self.inner.options
    }

    fn corrupt(&self, detail: String) -> LedgerError {
        LedgerError::Corrupt {
            path: self.inner.location.clone(),
            detail,
        }
    }

    async fn conn(&self) -> Result<deadpool_postgres::Object> {
        self.inner.pool.get().await.map_err(pool_err)
    }

    fn observe_seq(&self, seq: i64) {
        if let Ok(seq) = u64::try_from(seq) {
            self.inner.durable_seq.fetch_max(seq, Ordering::SeqCst);
        }
    }

    /// The time a new fact is recorded with: never earlier than one this process saw.
    fn record_time(&self) -> Timestamp {
        let now = self.inner.rules.clock.now().millis();
        Timestamp(now.max(self.inner.last_at.load(Ordering::SeqCst)))
    }

    fn next_shard(&self) -> i16 {
        let n = self.inner.next_shard.fetch_add(1, Ordering::Relaxed) % SHARDS;
        i16::try_from(n).unwrap_or(0)
    }

    fn note(&self, ck: &(ClientId, Key), replay: bool) {
        let mut activity = self.inner.activity.lock();
        if activity.len() >= ACTIVITY_MAX && !activity.contains_key(ck) {
            activity.clear();
        }
        let e = activity.entry(ck.clone()).or_default();
        if replay {
            e.0 = e.0.saturating_add(1);
        } else {
            e.1 = e.1.saturating_add(1);
        }
    }

    fn activity(&self, ck: &(ClientId, Key)) -> (u32, u32) {
        self.inner
            .activity
            .lock()
            .get(ck)
            .copied()
            .unwrap_or_default()
    }

    fn observed(&self) -> Observed {
        Observed {
            replayed: self.inner.replayed.load(Ordering::Relaxed),
            conflicts_in_flight: self.inner.conflicts_in_flight.load(Ordering::Relaxed),
            conflicts_reused: self.inner.conflicts_reused.load(Ordering::Relaxed),
        }
    }

    fn record_latency(&self, started: Instant) {
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut m = self.inner.metrics.lock();
        let i = LATENCY_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(LATENCY_BUCKETS_US.len() - 1);
        m.latency_buckets[i] += 1;
        m.latency_sum_us = m.latency_sum_us.saturating_add(us);
        // Each command is its own transaction and its own commit: a "batch" of one.
        m.batches += 1;
        m.commands += 1;
        m.batch_size_max = m.batch_size_max.max(1);
        m.last_batch_size = 1;
    }

    /// How long one attempt may take before the answer is "unavailable": the server ends
    /// a session idle in a transaction after the lease; this also covers a network that
    /// went silent.
    fn attempt_deadline(&self) -> Duration {
        self.inner.rules.lease + self.inner.options.connect_timeout
    }

    // ---- the command path ------------------------------------------------------------

    async fn submit_command(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
    ) -> Result<Submission> {
        let inner = &*self.inner;
        let ck = (client.clone(), key.clone());
        inner.in_flight.fetch_add(1, Ordering::SeqCst);
        let mut flight = Flight {
            inner,
            ck: ck.clone(),
            token: None,
        };
        if inner.closed.load(Ordering::SeqCst) {
            return Err(LedgerError::Closed);
        }
        let fingerprint = command.fingerprint();
        let now = inner.rules.clock.now();
        let live = {
            let mut claims = inner.claims.lock();
            match claims.get(&ck) {
                Some(claim) if now < claim.since.saturating_add_ms(ms_i64(inner.rules.lease)) => {
                    Some(claim.fingerprint)
                }
                // No claim, or one past its lease: the database decides (the server has
                // ended a session that hung that long, so its claim is gone).
                _ => {
                    let token = inner.next_token.fetch_add(1, Ordering::Relaxed);
                    claims.insert(
                        ck.clone(),
                        Claim {
                            fingerprint,
                            token,
                            since: now,
                            command: command.clone(),
                        },
                    );
                    flight.token = Some(token);
                    None
                }
            }
        };
        if let Some(claimed) = live {
            return self
                .answer_under_claim(&ck, claimed, fingerprint, message.is_some())
                .await;
        }
        let started = Instant::now();
        let deadline = self.attempt_deadline();
        let mut attempt = 0;
        let answer = loop {
            let run = self.execute(client, key, &command, fingerprint, message.as_ref());
            match tokio::time::timeout(deadline, run).await {
                Err(_) => {
                    break Err(LedgerError::Unavailable(format!(
                        "PostgreSQL did not answer within {deadline:?}; the command may or \
                         may not be recorded: retry with the same key"
                    )));
                }
                Ok(Ok(answer)) => break Ok(answer),
                Ok(Err(Abort::InFlight)) => {
                    inner.conflicts_in_flight.fetch_add(1, Ordering::Relaxed);
                    self.note(&ck, false);
                    break Ok(Submission::InProgress {
                        retry_after: RETRY_AFTER,
                    });
                }
                Ok(Err(Abort::Retry(why))) => {
                    attempt += 1;
                    if attempt > RETRIES {
                        break Err(LedgerError::Unavailable(format!(
                            "gave up after {RETRIES} retries: {why}"
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 2)).await;
                }
                Ok(Err(Abort::Fail(e))) => break Err(e),
            }
        };
        self.record_latency(started);
        drop(flight);
        answer
    }

    /// An arrival that meets a live claim of this process on its key (a twin running
    /// here). What the key durably holds decides, as on sled, not the claim: the claim may
    /// be a retry of a key done long ago on its way through the database, or another
    /// command under a done key, and a true retry is then answered with its replay rather
    /// than told 409 or refused. Only a key with nothing committed is in flight. One read
    /// of the key's row, without its lock: a done row never changes its answer, and
    /// waiting on the twin's lock would turn a slow replay into a 409.
    async fn answer_under_claim(
        &self,
        ck: &(ClientId, Key),
        claimed: Fingerprint,
        fingerprint: Fingerprint,
        message: bool,
    ) -> Result<Submission> {
        let inner = &*self.inner;
        let in_flight = Submission::InProgress {
            retry_after: RETRY_AFTER,
        };
        // A message comes again once the twin is done: the inbox rule checks its id before
        // the key (refusing it here for the key would report a reused message id as a
        // reused key), and it is recorded in the inbox with the key's fact, which takes a
        // transaction of its own.
        let answer = if message {
            in_flight
        } else {
            match self.done_key(ck).await? {
                Some((stored, _)) if stored != fingerprint => Submission::Reused,
                Some((_, fact)) => {
                    inner.durable_seq.fetch_max(fact.seq, Ordering::SeqCst);
                    inner.last_at.fetch_max(fact.at.millis(), Ordering::SeqCst);
                    Submission::Replayed(Outcome::from_fact(&fact))
                }
                None if claimed == fingerprint => in_flight,
                None => Submission::Reused,
            }
        };
        let counter = match &answer {
            Submission::Replayed(_) => &inner.replayed,
            Submission::Reused => &inner.conflicts_reused,
            _ => &inner.conflicts_in_flight,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.note(ck, matches!(answer, Submission::Replayed(_)));
        Ok(answer)
    }

    /// Whether this process holds a live claim on the key: a command of it is under way.
    fn claimed_here(&self, client: &ClientId, key: &Key) -> bool {
        let now = self.inner.rules.clock.now();
        let lease = ms_i64(self.inner.rules.lease);
        self.inner
            .claims
            .lock()
            .get(&(client.clone(), key.clone()))
            .is_some_and(|claim| now < claim.since.saturating_add_ms(lease))
    }

    /// A done (or expired) key's fingerprint and fact, read as committed; `None` for a key
    /// with no row.
    async fn done_key(
        &self,
        (client, key): &(ClientId, Key),
    ) -> Result<Option<(Fingerprint, Fact)>> {
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let stmt = conn
            .prepare_cached(
                "SELECT k.request_hash, f.seq, f.body \
                 FROM idempotency_keys k LEFT JOIN facts f ON f.seq = k.seq \
                 WHERE k.client = $1 AND k.key = $2",
            )
            .await
            .map_err(pg)?;
        let Some(row) = conn
            .query_opt(&stmt, &[&client.as_str(), &key.as_str()])
            .await
            .map_err(pg)?
        else {
            return Ok(None);
        };
        let (stored, fact) = self.key_fact(&row, 0)?;
        let fact = fact.ok_or_else(|| {
            self.corrupt(format!(
                "key {key:?} of {client:?} is committed without its fact"
            ))
        })?;
        Ok(Some((stored, fact)))
    }

    /// One attempt: the whole command in one transaction, in two round trips (see
    /// `v3.sql`): BEGIN + `idem_claim_v3`, then `idem_apply_v3` + COMMIT. A refund takes one
    /// more, `idem_lock`, since the account it locks is read from the withdrawal's fact.
    async fn execute(
        &self,
        client: &ClientId,
        key: &Key,
        command: &Command,
        fingerprint: Fingerprint,
        message: Option<&MessageId>,
    ) -> Result<Submission, Abort> {
        let inner = &*self.inner;
        // Taken before the transaction and held to its end (see `SHARDS`).
        let slot = ShardSlot {
            slots: &inner.shard_slots,
            shard: inner.shard_slots.take(),
        };
        let tx = OpenTx {
            conn: Some(inner.pool.get().await?),
            open: AtomicBool::new(false),
        };
        let conn = tx.conn()?;
        let claim = conn.prepare_cached(SQL_CLAIM).await?;
        let at = self.record_time();
        let at_db = db_time(at)?;
        let (c, k) = (client.as_str(), key.as_str());
        let fp: &[u8] = &fingerprint.0;
        let message_fp = message.map(|_| message_fingerprint(client, key, command));
        let message_fp_bytes = message_fp.map(|f| f.0.to_vec());
        let message_id = message.map(MessageId::as_str);
        let (withdrawal_key, claim_account) = match command {
            Command::Refund { withdrawal, .. } => (Some(withdrawal.as_str()), None),
            Command::Deposit { account, .. } | Command::Withdraw { account, .. } => {
                (None, Some(account.as_str()))
            }
        };
        let wait_ms = ms_i32(inner.options.in_flight_wait);
        let lease_ms = ms_i32(inner.rules.lease);

        // Round trip 1: BEGIN, then claim the message id and the key (waiting at most the
        // in-flight wait for a twin's claim), read what they hold if they were taken, and
        // for a deposit or a withdrawal lock the account and take the fact's number.
        let claim_p: [P; 10] = [
            &c,
            &k,
            &fp,
            &at_db,
            &wait_ms,
            &message_id,
            &message_fp_bytes,
            &withdrawal_key,
            &claim_account,
            &lease_ms,
        ];
        tx.open.store(true, Ordering::Relaxed);
        let (begun, row) = tokio::join!(
            conn.batch_execute("BEGIN"),
            conn.query_one(&claim, &claim_p)
        );
        begun?;
        let row = row?;
        let state: &str = get(&row, 0)?;
        let message_claimed: bool = get(&row, 1)?;
        let ck = (client.clone(), key.clone());
        match state {
            "claimed" => {}
            "in_flight" => return Err(Abort::InFlight),
            "vanished" => return Err(Abort::Retry("a claimed row vanished".into())),
            "message_reused" => {
                // Rolled back first: this attempt may hold a new key's claim.
                tx.rollback().await?;
                let reason = "message_id_reused: this message id was delivered before with \
                              another payload";
                let payload = format!(
                    "{{\"key\":{:?},\"command\":{:?}}}",
                    key.as_str(),
                    command.name()
                );
                let conn = tx.conn()?;
                let stmt = conn.prepare_cached(SQL_QUARANTINE).await?;
                conn.query_one(&stmt, &[&at_db, &message_id, &reason, &payload.as_str()])
                    .await?;
                return Ok(Submission::Quarantined {
                    reason: reason.into(),
                });
            }
            "seen" => {
                let (stored, existing) = self.key_fact(&row, 2)?;
                if core::classify(Some(stored), fingerprint) == Seen::Reused {
                    tx.rollback().await?;
                    inner.conflicts_reused.fetch_add(1, Ordering::Relaxed);
                    self.note(&ck, false);
                    return Ok(Submission::Reused);
                }
                let fact = existing.ok_or_else(|| {
                    self.corrupt(format!("key {k:?} of {c:?} is committed without its fact"))
                })?;
                if message_claimed && let Some(m) = message_id {
                    // A new message for a done key: remember the message with the key's
                    // fact, as sled does, so its redelivery is known by id too.
                    let seq = db_int(fact.seq)?;
                    let stmt = conn.prepare_cached(SQL_INBOX_SEQ).await?;
                    let set_p: [P; 2] = [&m, &seq];
                    let (set, commit) =
                        tokio::join!(conn.execute(&stmt, &set_p), conn.batch_execute("COMMIT"));
                    tx.open.store(false, Ordering::Relaxed);
                    one_row(set?, "the inbox record")?;
                    commit?;
                } else {
                    tx.rollback().await?;
                }
                inner.replayed.fetch_add(1, Ordering::Relaxed);
                self.note(&ck, true);
                inner.durable_seq.fetch_max(fact.seq, Ordering::SeqCst);
                inner.last_at.fetch_max(fact.at.millis(), Ordering::SeqCst);
                return Ok(Submission::Replayed(Outcome::from_fact(&fact)));
            }
            other => {
                return Err(Abort::Fail(LedgerError::Unavailable(format!(
                    "idem_claim_v3 answered {other:?}"
                ))));
            }
        }

        // A refund whose withdrawal has no row may have overtaken it: the withdrawal may be
        // in flight, its transaction holding the key's claim and not committed yet, or
        // claimed in this process and not yet there. Decided now, the refund would be
        // withdrawal_not_found for ever, so it waits for the key's lock as a twin would
        // (at most the in-flight wait) and reads the withdrawal again (`v5.sql`); still
        // missing while this process holds a live claim on it, or the wait ran out, the
        // refund is told 409 with nothing stored. A refund that names its own key holds
        // that claim itself. An extra round trip, only for a withdrawal that was not there.
        let settled;
        let (withdrawal_seq, withdrawal_body): (Option<i64>, Option<&[u8]>) = match command {
            Command::Refund { withdrawal, .. }
                if withdrawal != key && get::<Option<i64>>(&row, 5)?.is_none() =>
            {
                let stmt = conn.prepare_cached(SQL_WITHDRAWAL).await?;
                let w = withdrawal.as_str();
                let p: [P; 4] = [&c, &w, &wait_ms, &lease_ms];
                settled = conn.query_one(&stmt, &p).await?;
                let seq: Option<i64> = get(&settled, 1)?;
                if get::<&str>(&settled, 0)? == "in_flight"
                    || (seq.is_none() && self.claimed_here(client, withdrawal))
                {
                    return Err(Abort::InFlight);
                }
                (seq, get(&settled, 2)?)
            }
            _ => (get(&row, 5)?, get(&row, 6)?),
        };
        // A refund: the withdrawal's fact names the account; lock it and the withdrawal's
        // refunded total, then take the number (round trip 1b).
        let withdrawal = match (withdrawal_seq, withdrawal_body) {
            (Some(seq), Some(body)) => match self.decode(seq, body)?.body {
                FactBody::WithdrawalRecorded {
                    account,
                    amount,
                    currency,
                    ..
                } => Some((account, amount, currency)),
                _ => None,
            },
            _ => None,
        };
        let (currency, balance, seq, refunded): (Option<String>, Option<String>, i64, Option<i64>) =
            if withdrawal_key.is_some() {
                let lock = conn.prepare_cached(SQL_LOCK).await?;
                let account = withdrawal.as_ref().map(|w| w.0.as_str());
                let refund_of = withdrawal.as_ref().and(withdrawal_key);
                let locked = conn.query_one(&lock, &[&account, &c, &refund_of]).await?;
                (
                    get(&locked, 0)?,
                    get(&locked, 1)?,
                    get(&locked, 3)?,
                    get(&locked, 2)?,
                )
            } else {
                (get(&row, 7)?, get(&row, 8)?, get(&row, 3)?, None)
            };
        let seq_u = u64::try_from(seq).map_err(|_| self.corrupt(format!("seq {seq}")))?;
        let refunded_before = refunded.map_or(0, |t| u64::try_from(t).unwrap_or(0));
        let refunded_exists = refunded.is_some();
        let account_view = match (currency, balance) {
            (Some(currency), Some(balance)) => Some(AccountView {
                currency: self.currency(currency)?,
                balance: self.number(balance)?,
            }),
            _ => None,
        };
        let account_exists = account_view.is_some();
        let inputs = Inputs {
            account: account_view,
            withdrawal: withdrawal
                .as_ref()
                .map(|(account, amount, currency)| WithdrawalView {
                    account: account.clone(),
                    currency: *currency,
                    amount: *amount,
                    refunded: refunded_before,
                }),
        };
        let fact = core::decide(client, key, command, &inputs, seq_u, at);
        let outcome = Outcome::from_fact(&fact);

        // Round trip 2: the effect and the COMMIT. idem_apply_v3 checks every write against
        // the decision and raises if one disagrees, which turns the COMMIT into a
        // rollback.
        let mut user = None;
        let mut system = None;
        for (leg_account, currency, delta) in projection::legs(&fact) {
            let delta = i64::try_from(delta)
                .map_err(|_| LedgerError::Unavailable(format!("a change of {delta}")))?;
            if leg_account.is_system() {
                system = Some((leg_account, currency, delta));
            } else {
                user = Some((leg_account, currency, delta));
            }
        }
        let refund = match &fact.body {
            FactBody::RefundRecorded {
                amount,
                refunded_total,
                ..
            } => Some((
                db_int(amount.units())?,
                db_int(*refunded_total)?,
                withdrawal_amount(&inputs)?,
            )),
            _ => None,
        };
        let apply = Apply {
            seq,
            at: at_db,
            client: c,
            key: k,
            kind: fact.body.persisted_name(),
            rejection: match &fact.body {
                FactBody::CommandRejected { rejection, .. } => Some(rejection.code()),
                _ => None,
            },
            body: fact.encode(),
            doc: fact::json::fact(&fact),
            response: fact::json::outcome(&outcome),
            counter: counter_name(&fact.body),
            shard: slot.shard.unwrap_or_else(|| self.next_shard()),
            account: user.as_ref().map(|u| u.0.as_str()),
            currency: user.as_ref().or(system.as_ref()).map(|l| l.1.as_str()),
            delta: user.as_ref().map(|u| u.2),
            account_exists,
            balance_after: balance_after(&fact.body).map(|b| b.to_string()),
            system: system.as_ref().map(|s| s.0.as_str()),
            system_delta: system.as_ref().map(|s| s.2),
            withdrawal: refund.as_ref().and(withdrawal_key),
            refund: refund.map(|r| r.0),
            withdrawn: refund.map(|r| r.2),
            refunded_exists,
            refunded_after: refund.map(|r| r.1),
            message: message_id.filter(|_| message_claimed),
            hash: fp,
        };
        let stmt = conn.prepare_cached(SQL_APPLY).await?;
        let apply_p = apply.params();
        let (applied, commit) =
            tokio::join!(conn.execute(&stmt, &apply_p), conn.batch_execute("COMMIT"));
        tx.open.store(false, Ordering::Relaxed);
        if let Err(e) = applied {
            if e.code().map(SqlState::code) == Some(DISAGREE) {
                return Err(self.disagree(describe(&e)));
            }
            return Err(e.into());
        }
        commit?;
        inner.durable_seq.fetch_max(seq_u, Ordering::SeqCst);
        inner.last_at.fetch_max(at.millis(), Ordering::SeqCst);
        Ok(Submission::Executed(outcome))
    }

    fn disagree(&self, detail: String) -> Abort {
        Abort::Fail(LedgerError::Unavailable(format!(
            "the tables disagree with the decision, nothing was recorded: {detail}; run verify"
        )))
    }

    fn currency(&self, s: String) -> Result<Currency> {
        Currency::parse(&s).map_err(|_| self.corrupt(format!("a stored currency {s:?}")))
    }

    fn number(&self, s: String) -> Result<u128> {
        s.parse()
            .map_err(|_| self.corrupt(format!("a stored balance {s:?}")))
    }

    fn signed(&self, s: String) -> Result<i128> {
        s.parse()
            .map_err(|_| self.corrupt(format!("a stored balance {s:?}")))
    }

    /// A key as `idem_claim_v3` answers it when seen (from column 2) or a plain read of its
    /// row (from column 0): its fingerprint, then its fact's seq and body, if it has one.
    fn key_fact(&self, row: &Row, from: usize) -> Result<(Fingerprint, Option<Fact>)> {
        let hash: &[u8] = get(row, from)?;
        let fingerprint = Fingerprint(
            hash.try_into()
                .map_err(|_| self.corrupt("a key's fingerprint of the wrong length".into()))?,
        );
        let seq: Option<i64> = get(row, from + 1)?;
        let body: Option<&[u8]> = get(row, from + 2)?;
        let fact = match (seq, body) {
            (Some(seq), Some(body)) => Some(self.decode(seq, body)?),
            _ => None,
        };
        Ok((fingerprint, fact))
    }

    fn decode(&self, seq: i64, body: &[u8]) -> Result<Fact> {
        let seq = u64::try_from(seq).map_err(|_| self.corrupt(format!("seq {seq}")))?;
        Fact::decode(seq, body).map_err(|e| self.corrupt(e.to_string()))
    }

    /// Runs a query of the quarantine's rows (id, at, message_id, reason, payload).
    async fn select_quarantined(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Quarantined>> {
        let conn = self.conn().await?;
        let rows = conn.query(sql, params).await.map_err(|e| pg_err(&e))?;
        rows.iter()
            .map(|row| {
                Ok(Quarantined {
                    id: u64::try_from(get::<i64>(row, 0)?).unwrap_or(0),
                    at: from_db_time(get(row, 1)?),
                    message_id: get(row, 2)?,
                    reason: get(row, 3)?,
                    payload: get(row, 4)?,
                })
            })
            .collect()
    }

    async fn insert_quarantine(
        &self,
        message_id: Option<String>,
        reason: String,
        payload: Vec<u8>,
    ) -> Result<u64> {
        let mut text = String::from_utf8_lossy(&payload).into_owned();
        if text.len() > 4096 {
            let mut cut = 4096;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        // PostgreSQL text cannot hold NUL.
        let text = text.replace('\0', "\u{FFFD}");
        let at = db_time(self.inner.rules.clock.now())?;
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let stmt = conn.prepare_cached(SQL_QUARANTINE).await.map_err(pg)?;
        let row = conn
            .query_one(&stmt, &[&at, &message_id, &reason, &text])
            .await
            .map_err(pg)?;
        let id: i64 = get(&row, 0)?;
        Ok(u64::try_from(id).unwrap_or(0))
    }

    // ---- reads -----------------------------------------------------------------------

    async fn stats_now(&self, conn: &deadpool_postgres::Object) -> Result<Stats> {
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let (counts, last) = tokio::join!(
            conn.query(
                "SELECT name, sum(n)::bigint FROM counters GROUP BY name",
                &[]
            ),
            conn.query_opt("SELECT seq, at FROM facts ORDER BY seq DESC LIMIT 1", &[]),
        );
        let mut by_name = HashMap::new();
        for row in counts.map_err(pg)? {
            by_name.insert(get::<String>(&row, 0)?, get::<i64>(&row, 1)?);
        }
        let mut stats = stats_from_counters(&by_name);
        if let Some(row) = last.map_err(pg)? {
            let seq: i64 = get(&row, 0)?;
            self.observe_seq(seq);
            stats.last_seq = u64::try_from(seq).unwrap_or(0);
            stats.last_at = from_db_time(get(&row, 1)?);
        }
        stats.observed = self.observed();
        Ok(stats)
    }

    fn pending_info(&self, ck: &(ClientId, Key), claim: &Claim) -> KeyInfo {
        let now = self.inner.rules.clock.now();
        let (replays, conflicts) = self.activity(ck);
        KeyInfo {
            client: ck.0.clone(),
            key: ck.1.clone(),
            status: KeyStatus::Pending,
            command: claim.command.clone(),
            since: claim.since,
            outcome: None,
            lease_expired: now
                >= claim
                    .since
                    .saturating_add_ms(ms_i64(self.inner.rules.lease)),
            replays,
            conflicts,
        }
    }

    /// A done or expired key from its row: status and its fact.
    fn key_info(
        &self,
        client: ClientId,
        key: Key,
        status: &str,
        fact: Option<Fact>,
    ) -> Result<KeyInfo> {
        let fact =
            fact.ok_or_else(|| self.corrupt(format!("key {key:?} of {client:?} has no fact")))?;
        let outcome = Outcome::from_fact(&fact);
        let command = fact.body.command();
        let ck = (client, key);
        let (replays, conflicts) = self.activity(&ck);
        Ok(KeyInfo {
            client: ck.0,
            key: ck.1,
            status: if status == "expired" {
                KeyStatus::Expired
            } else {
                KeyStatus::Done
            },
            command,
            since: fact.at,
            outcome: Some(outcome),
            lease_expired: false,
            replays,
            conflicts,
        })
    }

    fn names(&self, client: String, key: String) -> Result<(ClientId, Key)> {
        let c = ClientId::parse(&client)
            .map_err(|_| self.corrupt(format!("a stored client name {client:?}")))?;
        let k = Key::parse(&key).map_err(|_| self.corrupt(format!("a stored key {key:?}")))?;
        Ok((c, k))
    }

    /// [`Store::keys`]: the sled store's semantics, except that `next` is the last key
    /// returned (or, when a filtered scan hit its cap, the last key read), so it is `None`
    /// exactly when nothing matching is left.
    async fn keys_page(&self, q: KeyQuery) -> Result<KeyPage> {
        if q.status == Some(KeyStatus::Pending) {
            let keys = Store::pending(self)
                .into_iter()
                .filter(|k| q.client.as_ref().is_none_or(|c| *c == k.client))
                .take(q.limit)
                .collect();
            return Ok(KeyPage { keys, next: None });
        }
        if q.limit == 0 {
            return Ok(KeyPage {
                keys: Vec::new(),
                next: None,
            });
        }
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let (after_c, after_k) = match &q.after {
            Some((c, k)) => (c.as_str().to_owned(), k.as_str().to_owned()),
            None => (String::new(), String::new()),
        };
        let client = q.client.as_ref().map(|c| c.as_str().to_owned());
        let status = q.status.map(|s| s.as_str().to_owned());
        let scan = db_limit(KEYS_SCAN_MAX);
        let limit = q.limit.min(KEYS_SCAN_MAX);
        // Like sled, one call reads at most KEYS_SCAN_MAX keys, so a filter that matches
        // little cannot make one request walk a million rows; `next` then says where the
        // scan stopped.
        let stmt = conn
            .prepare_cached(
                "SELECT k.client, k.key, k.status, f.seq, f.body FROM ( \
                     SELECT client, key, status, seq FROM idempotency_keys \
                     WHERE (client, key) > ($1, $2) AND ($3::text IS NULL OR client = $3) \
                       AND status <> 'pending' \
                     ORDER BY client, key LIMIT $4) k \
                 LEFT JOIN facts f ON f.seq = k.seq \
                 WHERE ($5::text IS NULL OR k.status = $5) \
                 ORDER BY k.client, k.key LIMIT $6",
            )
            .await
            .map_err(pg)?;
        let rows = conn
            .query(
                &stmt,
                &[
                    &after_c,
                    &after_k,
                    &client,
                    &scan,
                    &status,
                    &db_limit(limit + 1),
                ],
            )
            .await
            .map_err(pg)?;
        let mut page = KeyPage {
            keys: Vec::with_capacity(rows.len().min(limit)),
            next: None,
        };
        let more = rows.len() > limit;
        for row in rows.iter().take(limit) {
            let (c, k) = self.names(get(row, 0)?, get(row, 1)?)?;
            let st: String = get(row, 2)?;
            let seq: Option<i64> = get(row, 3)?;
            let body: Option<&[u8]> = get(row, 4)?;
            let fact = match (seq, body) {
                (Some(seq), Some(body)) => Some(self.decode(seq, body)?),
                _ => None,
            };
            page.keys.push(self.key_info(c, k, &st, fact)?);
        }
        if more {
            page.next = page.keys.last().map(|k| (k.client.clone(), k.key.clone()));
        } else if status.is_some() || rows.len() >= KEYS_SCAN_MAX {
            // Fewer matches than asked for: either the end, or the scan stopped at its
            // cap; then go on after the last key it read.
            let last = conn
                .query_opt(
                    "SELECT client, key FROM idempotency_keys \
                     WHERE (client, key) > ($1, $2) AND ($3::text IS NULL OR client = $3) \
                       AND status <> 'pending' \
                     ORDER BY client, key OFFSET $4 LIMIT 1",
                    &[&after_c, &after_k, &client, &(scan - 1)],
                )
                .await
                .map_err(pg)?;
            if let Some(row) = last {
                page.next = Some(self.names(get(&row, 0)?, get(&row, 1)?)?);
            }
        }
        Ok(page)
    }

    async fn all_balances(&self) -> Result<Balances> {
        let conn = self.conn().await?;
        let rows = conn
            .query(SQL_BALANCES, &[])
            .await
            .map_err(|e| pg_err(&e))?;
        let mut balances = Balances::default();
        for row in rows {
            let name: String = get(&row, 0)?;
            let account = Account::parse_any(&name)
                .map_err(|_| self.corrupt(format!("a stored account name {name:?}")))?;
            let currency = self.currency(get(&row, 1)?)?;
            let balance = self.signed(get(&row, 2)?)?;
            balances
                .accounts
                .entry(account)
                .or_default()
                .insert(currency, balance);
        }
        Ok(balances)
    }

    // ---- sweep and verify ------------------------------------------------------------

    async fn sweep_now(&self) -> Result<usize> {
        let horizon = self
            .inner
            .rules
            .clock
            .now()
            .saturating_sub_ms(ms_i64(self.inner.rules.retention));
        let horizon = db_time(horizon)?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let mut total = 0usize;
        loop {
            let mut conn = self.conn().await?;
            let tx = conn.transaction().await.map_err(pg)?;
            // SKIP LOCKED: two workers sweeping at once take different keys.
            let row = tx
                .query_one(
                    "WITH old AS ( \
                         SELECT client, key FROM idempotency_keys \
                         WHERE status = 'done' AND created_at <= $1 \
                         ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
                     gone AS ( \
                         UPDATE idempotency_keys k SET status = 'expired', response = NULL \
                         FROM old WHERE k.client = old.client AND k.key = old.key \
                         RETURNING 1) \
                     SELECT count(*) FROM gone",
                    &[&horizon, &SWEEP_BATCH],
                )
                .await
                .map_err(pg)?;
            let n: i64 = get(&row, 0)?;
            if n > 0 {
                tx.execute(SQL_COUNT, &[&COUNTER_EXPIRED, &self.next_shard(), &n])
                    .await
                    .map_err(pg)?;
            }
            tx.commit().await.map_err(pg)?;
            total += usize::try_from(n).unwrap_or(0);
            if n < SWEEP_BATCH {
                return Ok(total);
            }
        }
    }

    /// Rebuilds every projection from the log, in one snapshot, and checks each guarantee
    /// with the same checks and words as the sled store's `verify`.
    async fn verify_now(&self) -> Result<VerifyReport> {
        let mut conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let tx = conn
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(pg)?;
        tx.batch_execute("SET LOCAL statement_timeout = 0")
            .await
            .map_err(pg)?;
        let mut r = Report::default();
        let mut balances = Balances::default();
        let mut stats = Stats::default();
        let mut seen: HashMap<(ClientId, Key), u64> = HashMap::new();
        let mut withdrawals = verify::Withdrawals::default();
        let mut facts = 0u64;

        // The log, in seq order, a chunk per round trip.
        let portal = tx
            .bind("SELECT seq, client, key, body FROM facts ORDER BY seq", &[])
            .await
            .map_err(pg)?;
        let mut prev: Option<i64> = None;
        loop {
            let rows = tx.query_portal(&portal, VERIFY_CHUNK).await.map_err(pg)?;
            if rows.is_empty() {
                break;
            }
            for row in &rows {
                let seq: i64 = get(row, 0)?;
                if prev.is_some_and(|p| seq <= p) || seq < 1 {
                    r.add(SEQ_ORDER, format!("seq {seq} after {prev:?}"));
                }
                prev = Some(seq);
                facts += 1;
                let fact = match self.decode(seq, get(row, 3)?) {
                    Ok(f) => f,
                    Err(e) => {
                        r.add(verify::KEY_FACT, e.to_string());
                        continue;
                    }
                };
                let (c, k): (&str, &str) = (get(row, 1)?, get(row, 2)?);
                if fact.client.as_str() != c || fact.key.as_str() != k {
                    r.add(
                        verify::KEY_FACT,
                        format!("seq {seq} is filed under ({c:?}, {k:?}) but is the fact of ({:?}, {:?})", fact.client, fact.key),
                    );
                }
                let ck = (fact.client.clone(), fact.key.clone());
                if let Some(first) = seen.insert(ck, fact.seq) {
                    r.add(
                        verify::ONE_EFFECT,
                        format!(
                            "key {:?} of client {:?} has facts {first} and {seq}",
                            fact.key, fact.client
                        ),
                    );
                }
                verify::check_fold(&mut r, &fact, &balances, &mut withdrawals);
                balances.apply(&fact);
                stats.apply(&fact);
            }
        }

        // Keys: each points at its own fact, remembers its command, and holds the answer
        // its fact gives (or none, once expired).
        let portal = tx
            .bind(
                "SELECT k.client, k.key, k.request_hash, k.status, k.seq, k.response, f.body \
                 FROM idempotency_keys k LEFT JOIN facts f ON f.seq = k.seq",
                &[],
            )
            .await
            .map_err(pg)?;
        let mut keys = 0u64;
        loop {
            let rows = tx.query_portal(&portal, VERIFY_CHUNK).await.map_err(pg)?;
            if rows.is_empty() {
                break;
            }
            for row in &rows {
                keys += 1;
                let (client, key): (String, String) = (get(row, 0)?, get(row, 1)?);
                let status: String = get(row, 3)?;
                let seq: Option<i64> = get(row, 4)?;
                let response: Option<serde_json::Value> = get(row, 5)?;
                let body: Option<&[u8]> = get(row, 6)?;
                if status == "expired" {
                    stats.expire_one();
                }
                let Ok((c, k)) = self.names(client.clone(), key.clone()) else {
                    r.add(
                        verify::KEY_FACT,
                        format!("a key row with an unreadable name {client:?} {key:?}"),
                    );
                    continue;
                };
                let (Some(seq), Some(body)) = (seq, body) else {
                    r.add(
                        verify::KEY_FACT,
                        format!("key {k:?} of {c:?} is {status} but has no fact"),
                    );
                    continue;
                };
                match seen.get(&(c.clone(), k.clone())) {
                    Some(s) if i64::try_from(*s).ok() == Some(seq) => {}
                    Some(s) => r.add(
                        verify::KEY_FACT,
                        format!("key {k:?} of {c:?} points at seq {seq} but its fact is {s}"),
                    ),
                    None => r.add(
                        verify::KEY_FACT,
                        format!("key {k:?} of {c:?} points at seq {seq}, a fact of another key"),
                    ),
                }
                let Ok(fact) = self.decode(seq, body) else {
                    continue;
                };
                let hash: &[u8] = get(row, 2)?;
                if hash != fact.body.command_fingerprint().0 {
                    r.add(
                        verify::SAME_ANSWER,
                        format!("seq {seq}: the key's fingerprint is not its fact's command"),
                    );
                }
                let answer = fact::json::outcome(&Outcome::from_fact(&fact));
                match (status.as_str(), response) {
                    ("done", Some(stored)) if stored == answer => {}
                    ("expired", None) => {}
                    ("done", _) => r.add(
                        verify::SAME_ANSWER,
                        format!("key {k:?} of {c:?}: the stored response is not its fact's"),
                    ),
                    ("expired", Some(_)) => r.add(
                        verify::SAME_ANSWER,
                        format!("key {k:?} of {c:?} is expired but keeps its response"),
                    ),
                    (other, _) => r.add(
                        verify::KEY_FACT,
                        format!("key {k:?} of {c:?} is committed as {other}"),
                    ),
                }
            }
        }
        if keys != u64::try_from(seen.len()).unwrap_or(u64::MAX) {
            r.add(
                verify::KEY_FACT,
                format!("{} facts but {keys} key rows", seen.len()),
            );
        }

        // Stored balances (user rows, system shards summed) against the fold.
        let rows = tx.query(SQL_BALANCES, &[]).await.map_err(pg)?;
        let mut stored = Balances::default();
        for row in &rows {
            let name: String = get(row, 0)?;
            let parsed = Account::parse_any(&name)
                .ok()
                .zip(Currency::parse(&get::<String>(row, 1)?).ok());
            let balance: Option<i128> = get::<String>(row, 2)?.parse().ok();
            match (parsed, balance) {
                (Some((a, cur)), Some(b)) => {
                    stored.accounts.entry(a).or_default().insert(cur, b);
                }
                _ => r.add(
                    verify::DERIVED,
                    format!("an unreadable balance row of {name:?}"),
                ),
            }
        }
        verify::check_balances(&mut r, &balances, &stored);

        // Refunded totals against the fold, both ways.
        let rows = tx
            .query(
                "SELECT client, withdrawal, withdrawn, total FROM refunded",
                &[],
            )
            .await
            .map_err(pg)?;
        let mut refunded_rows = 0usize;
        for row in &rows {
            refunded_rows += 1;
            let stored = (get::<i64>(row, 2)?, get::<i64>(row, 3)?);
            let names = self.names(get(row, 0)?, get(row, 1)?).ok();
            let folded = names
                .as_ref()
                .and_then(|ck| withdrawals.get(&verify::key_digest(&ck.0, &ck.1)))
                .copied();
            let folded_i =
                folded.and_then(|(w, t)| Some((i64::try_from(w).ok()?, i64::try_from(t).ok()?)));
            if folded_i != Some(stored) {
                r.add(
                    verify::REFUNDS,
                    format!(
                        "a stored refunded total {stored:?} of {names:?} disagrees with the log's {folded:?}"
                    ),
                );
            }
        }
        let refunded_folded = withdrawals.values().filter(|(_, t)| *t > 0).count();
        if refunded_rows != refunded_folded {
            r.add(
                verify::REFUNDS,
                format!(
                    "{refunded_folded} withdrawals were refunded, {refunded_rows} refunded rows"
                ),
            );
        }

        // Every inbox record was written with the fact that answered its message.
        let unanswered: i64 = tx
            .query_one("SELECT count(*) FROM inbox WHERE seq IS NULL", &[])
            .await
            .map_err(pg)
            .and_then(|row| get(&row, 0))?;
        if unanswered > 0 {
            r.add(
                verify::KEY_FACT,
                format!("{unanswered} inbox records have no fact"),
            );
        }

        // Counters against the fold.
        let rows = tx
            .query(
                "SELECT name, sum(n)::bigint FROM counters GROUP BY name",
                &[],
            )
            .await
            .map_err(pg)?;
        let mut by_name = HashMap::new();
        for row in &rows {
            by_name.insert(get::<String>(row, 0)?, get::<i64>(row, 1)?);
        }
        let counted = stats_from_counters(&by_name);
        let pairs = [
            ("keys done", counted.keys_done, stats.keys_done),
            ("keys expired", counted.keys_expired, stats.keys_expired),
            ("applied", counted.applied_total(), stats.applied_total()),
            ("rejected", counted.rejected_total(), stats.rejected_total()),
        ];
        for (name, stored, folded) in pairs {
            if stored != folded {
                r.add(
                    verify::COUNTERS,
                    format!("{name}: stored {stored}, the log gives {folded}"),
                );
            }
        }
        if counted.applied != stats.applied || counted.rejected != stats.rejected {
            r.add(
                verify::COUNTERS,
                "per-kind counts differ from the log".into(),
            );
        }
        let _ = tx.rollback().await;
        if let Some(last) = prev {
            self.observe_seq(last);
        }
        Ok(VerifyReport {
            facts,
            keys_done: stats.keys_done,
            keys_expired: stats.keys_expired,
            accounts: balances.accounts.keys().filter(|a| !a.is_system()).count(),
            currencies: balances.sums().len(),
            violations: r.finish(),
        })
    }
}

/// The user balance a fact records after it, if it moved money.
fn balance_after(body: &FactBody) -> Option<u128> {
    match body {
        FactBody::DepositRecorded { balance_after, .. }
        | FactBody::WithdrawalRecorded { balance_after, .. }
        | FactBody::RefundRecorded { balance_after, .. } => Some(*balance_after),
        FactBody::CommandRejected { .. } => None,
    }
}

/// The amount of the withdrawal a refund decision read.
fn withdrawal_amount(inputs: &Inputs) -> Result<i64> {
    let amount = inputs.withdrawal.as_ref().map_or(0, |w| w.amount.units());
    db_int(amount)
}

fn one_row(n: u64, what: &str) -> Result<(), Abort> {
    if n == 1 {
        Ok(())
    } else {
        Err(Abort::Fail(LedgerError::Unavailable(format!(
            "writing {what} changed {n} rows, not 1; nothing was recorded"
        ))))
    }
}

#[async_trait]
impl Store for PgStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }
    fn location(&self) -> String {
        self.inner.location.clone()
    }
    fn rules(&self) -> &Rules {
        &self.inner.rules
    }

    fn waits_for_twins(&self) -> bool {
        true
    }

    async fn submit(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
    ) -> Result<Submission> {
        self.submit_command(client, key, command, message).await
    }

    async fn quarantine(
        &self,
        message_id: Option<String>,
        reason: String,
        payload: Vec<u8>,
    ) -> Result<u64> {
        self.insert_quarantine(message_id, reason, payload).await
    }

    async fn quarantined(&self, after: u64, limit: usize) -> Result<Vec<Quarantined>> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        self.select_quarantined(
            "SELECT id, at, message_id, reason, payload FROM quarantine WHERE id > $1 \
             ORDER BY id LIMIT $2",
            &[&after, &db_limit(limit)],
        )
        .await
    }

    async fn quarantined_newest(&self, limit: usize) -> Result<Vec<Quarantined>> {
        self.select_quarantined(
            "SELECT id, at, message_id, reason, payload FROM quarantine ORDER BY id DESC LIMIT $1",
            &[&db_limit(limit)],
        )
        .await
    }

    async fn sweep(&self) -> Result<usize> {
        self.sweep_now().await
    }

    async fn verify(&self) -> Result<VerifyReport> {
        self.verify_now().await
    }

    async fn key(&self, client: &ClientId, key: &Key) -> Result<Option<KeyInfo>> {
        let ck = (client.clone(), key.clone());
        if let Some(claim) = self.inner.claims.lock().get(&ck).cloned() {
            return Ok(Some(self.pending_info(&ck, &claim)));
        }
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let stmt = conn
            .prepare_cached(
                "SELECT k.status, f.seq, f.body FROM idempotency_keys k \
                 LEFT JOIN facts f ON f.seq = k.seq WHERE k.client = $1 AND k.key = $2",
            )
            .await
            .map_err(pg)?;
        let Some(row) = conn
            .query_opt(&stmt, &[&client.as_str(), &key.as_str()])
            .await
            .map_err(pg)?
        else {
            return Ok(None);
        };
        let status: String = get(&row, 0)?;
        let seq: Option<i64> = get(&row, 1)?;
        let body: Option<&[u8]> = get(&row, 2)?;
        let fact = match (seq, body) {
            (Some(seq), Some(body)) => Some(self.decode(seq, body)?),
            _ => None,
        };
        self.key_info(ck.0, ck.1, &status, fact).map(Some)
    }

    async fn keys(&self, query: KeyQuery) -> Result<KeyPage> {
        self.keys_page(query).await
    }

    async fn facts(&self, after: u64, limit: usize) -> Result<Vec<Fact>> {
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let stmt = conn
            .prepare_cached("SELECT seq, body FROM facts WHERE seq > $1 ORDER BY seq LIMIT $2")
            .await
            .map_err(pg)?;
        let rows = conn
            .query(&stmt, &[&after, &db_limit(limit)])
            .await
            .map_err(pg)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(self.decode(get(row, 0)?, get(row, 1)?)?);
        }
        if let Some(last) = out.last() {
            self.inner.durable_seq.fetch_max(last.seq, Ordering::SeqCst);
        }
        Ok(out)
    }

    async fn fact(&self, seq: u64) -> Result<Option<Fact>> {
        let Ok(seq) = i64::try_from(seq) else {
            return Ok(None);
        };
        let conn = self.conn().await?;
        let row = conn
            .query_opt("SELECT body FROM facts WHERE seq = $1", &[&seq])
            .await
            .map_err(|e| pg_err(&e))?;
        match row {
            None => Ok(None),
            Some(row) => Ok(Some(self.decode(seq, get(&row, 0)?)?)),
        }
    }

    async fn balances(&self) -> Result<Balances> {
        self.all_balances().await
    }

    async fn account(&self, account: &Account) -> Result<Option<BTreeMap<Currency, i128>>> {
        let conn = self.conn().await?;
        let sql = if account.is_system() {
            "SELECT currency, sum(balance)::text FROM system_balances WHERE account = $1 \
             GROUP BY currency"
        } else {
            "SELECT currency, balance::text FROM accounts WHERE account = $1"
        };
        let rows = conn
            .query(sql, &[&account.as_str()])
            .await
            .map_err(|e| pg_err(&e))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut out = BTreeMap::new();
        for row in &rows {
            out.insert(self.currency(get(row, 0)?)?, self.signed(get(row, 1)?)?);
        }
        Ok(Some(out))
    }

    async fn stats(&self) -> Result<Stats> {
        let conn = self.conn().await?;
        self.stats_now(&conn).await
    }

    fn pending(&self) -> Vec<KeyInfo> {
        let claims: Vec<_> = self
            .inner
            .claims
            .lock()
            .iter()
            .map(|(ck, c)| (ck.clone(), c.clone()))
            .collect();
        let mut out: Vec<KeyInfo> = claims
            .iter()
            .map(|(ck, claim)| self.pending_info(ck, claim))
            .collect();
        out.sort_by(|a, b| (a.since, &a.client, &a.key).cmp(&(b.since, &b.client, &b.key)));
        out
    }

    fn durable_seq(&self) -> u64 {
        self.inner.durable_seq.load(Ordering::SeqCst)
    }

    fn commit_metrics(&self) -> CommitMetrics {
        self.inner.metrics.lock().clone()
    }

    fn memory(&self) -> Vec<MemoryUse> {
        type Ck = (ClientId, Key);
        let claims = self.inner.claims.lock();
        let claims = MemoryUse {
            structure: "claims",
            entries: claims.len() as u64,
            limit: Limit::InFlight,
            bound_bytes: None,
            bytes: claims
                .iter()
                .map(|(ck, claim)| {
                    memory::slot(std::mem::size_of::<(Ck, Claim)>())
                        + memory::key_heap(&ck.0, &ck.1)
                        + memory::command_heap(&claim.command)
                })
                .sum(),
        };
        let activity = self.inner.activity.lock();
        let activity = MemoryUse {
            structure: "activity",
            entries: activity.len() as u64,
            limit: Limit::Entries(ACTIVITY_MAX as u64),
            bound_bytes: Some(memory::at_limit(
                ACTIVITY_MAX as u64,
                std::mem::size_of::<(Ck, (u32, u32))>(),
                2,
            )),
            bytes: activity
                .keys()
                .map(|ck| {
                    memory::slot(std::mem::size_of::<(Ck, (u32, u32))>())
                        + memory::key_heap(&ck.0, &ck.1)
                })
                .sum(),
        };
        vec![claims, activity]
    }

    async fn size_on_disk(&self) -> Result<u64> {
        let conn = self.conn().await?;
        let row = conn
            .query_one(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relkind IN ('r', 'S')",
                &[&self.inner.options.schema],
            )
            .await
            .map_err(|e| pg_err(&e))?;
        Ok(u64::try_from(get::<i64>(&row, 0)?).unwrap_or(0))
    }

    fn failure(&self) -> Option<String> {
        // Every command is its own transaction: a failed one leaves nothing behind that
        // would stop the next, so the store never stops writing as sled's does.
        None
    }

    async fn shutdown(&self) {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::SeqCst);
        loop {
            let idle = inner.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if inner.in_flight.load(Ordering::SeqCst) == 0 {
                break;
            }
            idle.await;
        }
        inner.pool.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        assert!(valid_schema("idem"));
        assert!(valid_schema("idem_2"));
        assert!(!valid_schema("2idem"));
        assert!(!valid_schema("Idem"));
        assert!(!valid_schema("idem; drop table x"));
        assert!(!valid_schema(""));
    }

    #[test]
    fn the_location_never_shows_a_password() {
        let cfg: tokio_postgres::Config = "postgres://u:secret@db.example:6543/ledger"
            .parse()
            .unwrap_or_else(|_| tokio_postgres::Config::new());
        let shown = target(&cfg);
        assert_eq!(shown, "postgres://u@db.example:6543/ledger");
    }
}
