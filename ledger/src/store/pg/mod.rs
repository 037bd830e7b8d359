//! The PostgreSQL store: the same guarantees as the sled store, kept by the
//! database, so any number of workers on any number of hosts can share one ledger.
//!
//! Commands are decided in groups (`group.rs`), each group one transaction; within it,
//! each command in arrival order takes the shape of a hand-written idempotent handler:
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
//!    decide with the pure core (`core::decide`, the same decision as sled's, on the
//!    balances the group's earlier commands left), and write the fact, the balances
//!    (updates checked against the decisions), the key's row with its outcome, the
//!    counters and the inbox row; then one COMMIT for the group (synchronous_commit on)
//!    and only then answer.
//!
//! The statements run inside two PL/pgSQL functions (`v8.sql`, the claim's body from
//! `v10.sql`, their plan settings from `v9.sql` and `v10.sql`; a group of one fact is
//! applied by `v11.sql`'s function of scalars) that take the group as
//! arrays, `idem_group_claim_v8` (steps 1–3 up to the decisions) and
//! `idem_group_apply_v8` (the writes), with BEGIN and COMMIT pipelined beside them: two
//! round trips per group instead of one per dependent statement of each command.
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

use crate::core::{self, AccountView, Inputs, Seen, WithdrawalView};
use crate::domain::{
    Account, ClientId, Command, Currency, Fingerprint, Key, MessageId, Rejection, Timestamp,
};
use crate::fact::{self, Fact, FactBody, Outcome};
use crate::memory::{self, Limit, MemoryUse};
use crate::projection::{self, Balances, Observed, Stats};
use crate::store::verify::{Report, VerifyReport};
use crate::store::{AsOf, BalanceAt, KeyQuery, Rules, Store};
use crate::store::{
    CommitMetrics, KEYS_SCAN_MAX, KeyInfo, KeyPage, KeyStatus, LATENCY_BUCKETS_US, LedgerError,
    OpenReport, Quarantined, Submission, message_fingerprint,
};

mod command;
mod copy;
mod group;
mod keys;
mod verify;
#[doc(hidden)]
pub use copy::{CopyReader, CopyRow, RowBatch, copy_sql};
#[doc(hidden)]
pub use verify::{VERIFY_FACTS, VERIFY_KEYS, VERIFY_LOG, VERIFY_SETTINGS};

use command::{SQL_COUNT, SQL_QUARANTINE, ShardSlots, rand_offset};

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
    (
        "facts, keys, balances, inbox",
        include_str!("migrations/v1.sql"),
    ),
    (
        "the command as two functions",
        include_str!("migrations/v2.sql"),
    ),
    (
        "fewer executor starts per command",
        include_str!("migrations/v3.sql"),
    ),
    ("the rules as domains", include_str!("migrations/v4.sql")),
    (
        "a refund waits for its withdrawal in flight",
        include_str!("migrations/v5.sql"),
    ),
    (
        "each stored response carries its digest",
        include_str!("migrations/v6.sql"),
    ),
    ("account statements", include_str!("migrations/v7.sql")),
    (
        "a group of commands in one transaction",
        include_str!("migrations/v8.sql"),
    ),
    (
        "a group's keys read in one statement",
        include_str!("migrations/v9.sql"),
    ),
    (
        "the accounts locked by an index scan, a group of one claimed as one command",
        include_str!("migrations/v10.sql"),
    ),
    (
        "a group of one fact applied as one command",
        include_str!("migrations/v11.sql"),
    ),
    (
        "the stored response as text",
        include_str!("migrations/v12.sql"),
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

/// How many keys the per-key replay/conflict counts remember before starting over.
const ACTIVITY_MAX: usize = 65_536;

/// How a [`PgStore`] connects, groups commands and waits.
#[derive(Debug, Clone)]
pub struct PgConfig {
    /// Connections this process keeps: one per lane, the others for reads.
    pub pool_size: usize,
    /// Lanes of commands (at most `pool_size`): each runs its groups one after the other
    /// on one connection, the next group's claim sent behind the previous group's COMMIT.
    /// Fewer lanes make larger groups, which cost PostgreSQL less per command; more keep
    /// more of a large server's cores and disks busy.
    pub lanes: usize,
    /// The most commands one group (one transaction, one commit) decides; 1 runs every
    /// command in a transaction of its own.
    pub group_max: usize,
    /// How long a group stays open for more commands, counted from its first command's
    /// arrival. Zero: a group takes what queued while the lane's previous group was in
    /// flight, and a command that finds its lane idle never waits.
    pub group_wait: Duration,
    /// How long a twin waits for the first attempt's claim before it is told 409.
    pub in_flight_wait: Duration,
    /// The schema that holds the tables, created if missing: lower-case letters, digits
    /// and `_`, not starting with a digit.
    pub schema: String,
    /// How long opening a connection may take, unless the URL says otherwise.
    pub connect_timeout: Duration,
    /// Sessions `verify` reads with. 1: one query merges the log with the key rows on the
    /// server, the least CPU in all. 2: the log and the key rows are read on two sessions
    /// in one snapshot and merged by the client, so the server works on two backends at
    /// once, which is faster when the server has cores of its own to spare and no faster
    /// when it shares the client's (BENCHMARKS.md, "Verify on PostgreSQL").
    pub verify_sessions: usize,
    /// Open even when the server's settings let it lose or tear commits it acknowledged
    /// after a crash of its machine (`fsync` or `full_page_writes` off): for throwaway
    /// test servers only. Refused otherwise.
    pub allow_unsafe_settings: bool,
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            pool_size: 16,
            lanes: 1,
            group_max: 128,
            group_wait: Duration::ZERO,
            in_flight_wait: Duration::from_millis(5),
            schema: "idem".into(),
            connect_timeout: Duration::from_secs(5),
            verify_sessions: 1,
            allow_unsafe_settings: false,
        }
    }
}

/// Why a server with these settings cannot keep what it acknowledges through a crash of
/// its machine, or `None` when both are on: `fsync` off, a commit may never reach the disk;
/// `full_page_writes` off, a page torn by a power loss cannot be restored from the WAL.
pub fn unsafe_settings(fsync: &str, full_page_writes: &str) -> Option<String> {
    let off: Vec<String> = [("fsync", fsync), ("full_page_writes", full_page_writes)]
        .into_iter()
        .filter(|(_, value)| *value != "on")
        .map(|(name, value)| format!("{name} = {value}"))
        .collect();
    (!off.is_empty()).then(|| {
        format!(
            "the PostgreSQL server runs with {}: a crash of its machine can lose or tear \
             commands it acknowledged, and Idem answers a command only once its commit is \
             durable. Set them on (postgresql.conf), or pass --pg-allow-unsafe-settings for \
             a throwaway test server",
            off.join(", ")
        )
    })
}

impl PgConfig {
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n;
        self
    }
    pub fn verify_sessions(mut self, n: usize) -> Self {
        self.verify_sessions = n;
        self
    }
    pub fn in_flight_wait(mut self, wait: Duration) -> Self {
        self.in_flight_wait = wait;
        self
    }
    pub fn lanes(mut self, n: usize) -> Self {
        self.lanes = n;
        self
    }
    pub fn group_max(mut self, n: usize) -> Self {
        self.group_max = n;
        self
    }
    pub fn group_wait(mut self, wait: Duration) -> Self {
        self.group_wait = wait;
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
    /// Wakes the twins of this process that wait for this claim (see `submit_command`);
    /// set by the first such twin, so most claims cost no allocation.
    released: Option<Arc<tokio::sync::Notify>>,
}

struct Inner {
    pool: Pool,
    /// Where commands queue for their group (see `group.rs`).
    lanes: Vec<group::Lane>,
    rules: Rules,
    options: PgConfig,
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
    /// What of the three counts above is in the `counters` table already. Held while a
    /// flush writes and while a read adds the table to the unflushed rest, so that a read
    /// never counts a flush twice or not at all (a Prometheus counter must not go down).
    observed_flushed: tokio::sync::Mutex<Observed>,
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

/// Why one attempt at a group's transaction did not finish.
enum Abort {
    /// PostgreSQL aborted the transaction over a conflict that a new attempt resolves,
    /// or the connection was lost.
    Retry(String),
    /// An error one command of the group may have caused: the group is split to answer
    /// that command alone with it.
    Command(LedgerError),
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
        // The session ended under the transaction (a backend terminated, the server
        // restarting, the socket closed): it did not commit, or did and the new attempt
        // reads its keys done.
        let lost = [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
        ];
        match e.code() {
            Some(code) if retry.contains(code) => Abort::Retry(describe(&e)),
            Some(code) if lost.contains(code) => Abort::Retry(describe(&e)),
            None if e.is_closed() => Abort::Retry(describe(&e)),
            // Bad data or a broken rule on a row: a command's, most likely.
            Some(code) if code.code().starts_with("22") || code.code().starts_with("23") => {
                Abort::Command(pg_err(&e))
            }
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
/// The counters of what happened without a fact (`Observed`): replays and conflicts write
/// nothing, so each worker adds its counts here in a transaction of their own, at most
/// [`OBSERVED_FLUSH_EVERY`] after they happened and at its clean stop. A crash loses at
/// most that last interval of them; they are observations, not money.
const COUNTER_REPLAYED: &str = "observed.replayed";
const COUNTER_IN_FLIGHT: &str = "observed.conflicts_in_flight";
const COUNTER_REUSED: &str = "observed.conflicts_reused";
const OBSERVED_FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Flushes the observed counts every [`OBSERVED_FLUSH_EVERY`] while the store lives and is
/// open. Holds the store only for a flush, so a dropped store ends it.
async fn flush_observed_every(store: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(OBSERVED_FLUSH_EVERY).await;
        let Some(inner) = store.upgrade() else {
            return;
        };
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        let store = PgStore { inner };
        // A failed flush keeps the counts in memory for the next turn: nothing is lost but
        // to a crash before a flush succeeds. Not reported: the store's own commands fail
        // and say so while PostgreSQL is unreachable.
        let _ = store.flush_observed().await;
    }
}

/// The observed counts the `counters` table holds (every worker's flushes).
fn observed_from_counters(counts: &HashMap<String, i64>) -> Observed {
    let n = |name: &str| u64::try_from(counts.get(name).copied().unwrap_or(0)).unwrap_or(0);
    Observed {
        replayed: n(COUNTER_REPLAYED),
        conflicts_in_flight: n(COUNTER_IN_FLIGHT),
        conflicts_reused: n(COUNTER_REUSED),
    }
}

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
        options: PgConfig,
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
        let lanes = options.lanes.clamp(1, options.pool_size.max(1));
        let store = PgStore {
            inner: Arc::new_cyclic(|weak| Inner {
                lanes: group::start_lanes(lanes, weak),
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
                observed_flushed: tokio::sync::Mutex::new(Observed::default()),
                metrics: Mutex::new(CommitMetrics::default()),
                rules,
            }),
        };
        tokio::spawn(flush_observed_every(Arc::downgrade(&store.inner)));
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
        // A commit is acknowledged once PostgreSQL says it is durable, which holds only with
        // these on (this process's sessions set synchronous_commit on themselves).
        let settings = conn
            .query_one(
                "SELECT current_setting('fsync'), current_setting('full_page_writes')",
                &[],
            )
            .await
            .map_err(pg)?;
        let (fsync, full_page_writes): (String, String) = (settings.get(0), settings.get(1));
        if let Some(refusal) = unsafe_settings(&fsync, &full_page_writes)
            && !self.inner.options.allow_unsafe_settings
        {
            return Err(LedgerError::Unavailable(refusal));
        }
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
            replayed_groups: 0,
            rebuilt: None,
            open_ms: 0,
        })
    }

    pub fn options(&self) -> &PgConfig {
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
    }

    /// How long one attempt may take before the answer is "unavailable": the server ends
    /// a session idle in a transaction after the lease; this also covers a network that
    /// went silent.
    fn attempt_deadline(&self) -> Duration {
        self.inner.rules.lease + self.inner.options.connect_timeout
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
    /// A key's committed row with its fact: (status, fingerprint, fact), read without the
    /// row's lock; `None` for a key with no row.
    pub(super) async fn key_with_fact(
        &self,
        client: &ClientId,
        key: &Key,
    ) -> Result<Option<(String, Fingerprint, Option<Fact>)>> {
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let stmt = conn
            .prepare_cached(
                "SELECT k.status, k.request_hash, f.seq, f.body \
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
        let status: String = get(&row, 0)?;
        let (fingerprint, fact) = self.key_fact(&row, 1)?;
        Ok(Some((status, fingerprint, fact)))
    }

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

    /// Adds the observed counts not yet in the `counters` table to it, in one transaction.
    async fn flush_observed(&self) -> Result<()> {
        let mut flushed = self.inner.observed_flushed.lock().await;
        let now = self.observed();
        let deltas = [
            (COUNTER_REPLAYED, now.replayed - flushed.replayed),
            (
                COUNTER_IN_FLIGHT,
                now.conflicts_in_flight - flushed.conflicts_in_flight,
            ),
            (
                COUNTER_REUSED,
                now.conflicts_reused - flushed.conflicts_reused,
            ),
        ];
        if deltas.iter().all(|(_, d)| *d == 0) {
            return Ok(());
        }
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(pg)?;
        let shard = self.next_shard();
        for (name, delta) in deltas {
            if delta > 0 {
                let n = i64::try_from(delta).unwrap_or(i64::MAX);
                tx.execute(SQL_COUNT, &[&name, &shard, &n])
                    .await
                    .map_err(pg)?;
            }
        }
        tx.commit().await.map_err(pg)?;
        *flushed = now;
        Ok(())
    }

    async fn stats_now(&self, conn: &deadpool_postgres::Object) -> Result<Stats> {
        // Under the flush's lock: the table and what is still unflushed are read as one.
        let flushed = self.inner.observed_flushed.lock().await;
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
        let saved = observed_from_counters(&by_name);
        let counted = self.observed();
        stats.observed = Observed {
            replayed: saved.replayed + (counted.replayed - flushed.replayed),
            conflicts_in_flight: saved.conflicts_in_flight
                + (counted.conflicts_in_flight - flushed.conflicts_in_flight),
            conflicts_reused: saved.conflicts_reused
                + (counted.conflicts_reused - flushed.conflicts_reused),
        };
        Ok(stats)
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
        let Some((status, _, fact)) = self.key_with_fact(client, key).await? else {
            return Ok(None);
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

    async fn statement(&self, account: &Account, after: u64, limit: usize) -> Result<Vec<Fact>> {
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        // The expression and the predicate are the index's (v7.sql), so the planner reads
        // the account's range of `facts_by_account` and nothing else.
        let stmt = conn
            .prepare_cached(
                "SELECT seq, body FROM facts \
                 WHERE (doc ->> 'account') = $1 AND kind <> 'CommandRejected' AND seq > $2 \
                 ORDER BY seq LIMIT $3",
            )
            .await
            .map_err(pg)?;
        let rows = conn
            .query(&stmt, &[&account.as_str(), &after, &db_limit(limit)])
            .await
            .map_err(pg)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let fact = self.decode(get(row, 0)?, get(row, 1)?)?;
            if crate::projection::statement_line(&fact).is_none_or(|l| l.account != account) {
                return Err(self.corrupt(format!(
                    "seq {} is filed in {account}'s statement but is not its movement",
                    fact.seq
                )));
            }
            out.push(fact);
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

    async fn balance_at(&self, account: &Account, point: AsOf) -> Result<Option<BalanceAt>> {
        if account.is_system() {
            return Ok(None);
        }
        let Some(currency) = self
            .account(account)
            .await?
            .and_then(|per| per.keys().next().copied())
        else {
            return Ok(None);
        };
        let cut = point
            .seq
            .map_or(i64::MAX, |seq| i64::try_from(seq).unwrap_or(i64::MAX));
        let at = point.time.map(db_time).transpose()?;
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        // The account's range of `facts_by_account` (v7.sql), read backwards from the cut:
        // one row for a seq; for a time, the account's movements after it are passed over,
        // never the rest of the log.
        let stmt = conn
            .prepare_cached(
                "SELECT seq, body FROM facts \
                 WHERE (doc ->> 'account') = $1 AND kind <> 'CommandRejected' AND seq <= $2 \
                 AND ($3::timestamptz IS NULL OR at <= $3) \
                 ORDER BY seq DESC LIMIT 1",
            )
            .await
            .map_err(pg)?;
        let row = conn
            .query_opt(&stmt, &[&account.as_str(), &cut, &at])
            .await
            .map_err(pg)?;
        let Some(row) = row else {
            return Ok(Some(BalanceAt {
                currency,
                balance: 0,
                movement: None,
            }));
        };
        let fact = self.decode(get(&row, 0)?, get(&row, 1)?)?;
        let Some(line) = crate::projection::statement_line(&fact).filter(|l| l.account == account)
        else {
            return Err(self.corrupt(format!(
                "seq {} is filed in {account}'s statement but is not its movement",
                fact.seq
            )));
        };
        Ok(Some(BalanceAt {
            currency,
            balance: line.balance_after,
            movement: Some(fact.seq),
        }))
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
        // Every group is its own transaction: a failed one leaves nothing behind that
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
        // Nothing more is counted: the last counts are saved before the pool closes (a
        // PostgreSQL that is unreachable now loses them, as a crash would).
        let _ = self.flush_observed().await;
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
