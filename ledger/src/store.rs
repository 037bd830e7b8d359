//! The sled store: the only module that touches sled. One committer thread owns every
//! write: it gathers concurrent commands into one batch on one tree, decides each with the
//! pure core, writes facts, key records and projections in one atomic `apply_batch`,
//! flushes (plus an fdatasync), and only then answers. See ARCHITECTURE.md.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::clock::{Clock, SystemClock};
use crate::core::{self, AccountView, Inputs, Seen, WithdrawalView};
use crate::domain::{Account, ClientId, Command, Currency, Fingerprint, Key, MessageId, Timestamp};
use crate::fact::{DecodeError, Fact, FactBody, Outcome};
use crate::memory::{self, Limit, MemoryUse};
use crate::projection::{Balances, Observed, Stats};
use crate::verify::{self, VerifyReport};

/// How a ledger is opened.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    /// sled's page cache; its own default is 1 GiB, far more than a ledger needs.
    pub cache_capacity_bytes: u64,
    /// How long a done key keeps its stored response.
    pub retention: Duration,
    /// How long a claim on a key holds before another attempt may take it over.
    pub lease: Duration,
    /// fdatasync the data file after sled's flush (see ARCHITECTURE.md, durability).
    pub fsync: bool,
    /// The most commands one `apply_batch` takes. Staging waits for a busy syncer only
    /// until this many; a sync then covers every batch applied meanwhile.
    pub batch_max: usize,
    /// `verify` reads the key records on a second thread while it folds the log: a fifth
    /// faster on an idle machine, but on two cores that thread takes CPU from the
    /// committer, whose slowest commit grew several times in the load bench. So a
    /// serving ledger verifies on one thread and the offline `verify` command on two.
    pub verify_in_parallel: bool,
    pub clock: Arc<dyn Clock>,
}

impl Config {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            cache_capacity_bytes: 64 * 1024 * 1024,
            retention: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(10),
            fsync: true,
            batch_max: 2048,
            verify_in_parallel: false,
            clock: Arc::new(SystemClock),
        }
    }
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
}

/// An operational failure. Business refusals are never errors: they are outcomes.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerError {
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error(
        "the ledger at {path} is corrupt: {detail}. Nothing was changed or deleted. \
         Keep the folder as it is, restore the latest backup into a new folder, \
         and run `inbox-worker verify` on both"
    )]
    Corrupt { path: String, detail: String },
    #[error("the ledger at {path} is in use by another process")]
    Locked { path: String },
    #[error("the ledger is shut down")]
    Closed,
}

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// What happened to one submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submission {
    /// This arrival executed the command; the outcome is durable.
    Executed(Outcome),
    /// The key was done before: its stored outcome.
    Replayed(Outcome),
    /// The key holds another command; nothing changed.
    Reused,
    /// Another attempt with this key is in flight; try again after the given time.
    InProgress { retry_after: Duration },
    /// The inbox had seen this message id with another payload: it is quarantined.
    Quarantined { reason: String },
}

impl Submission {
    pub fn outcome(&self) -> Option<&Outcome> {
        match self {
            Submission::Executed(o) | Submission::Replayed(o) => Some(o),
            _ => None,
        }
    }
}

/// What opening found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpenReport {
    pub fresh: bool,
    pub facts: u64,
    pub keys_done: u64,
    pub keys_expired: u64,
    pub accounts: usize,
    pub last_fact_at: Option<String>,
    pub open_ms: u128,
}

impl std::fmt::Display for OpenReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.fresh {
            return write!(f, "created a new ledger ({} ms)", self.open_ms);
        }
        write!(
            f,
            "recovered {} facts ({} keys done, {} expired), {} accounts, last fact at {}; \
             log tail and projections agree ({} ms)",
            self.facts,
            self.keys_done,
            self.keys_expired,
            self.accounts,
            self.last_fact_at.as_deref().unwrap_or("-"),
            self.open_ms
        )
    }
}

/// The state of a key as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyStatus {
    Pending,
    Done,
    Expired,
}

impl KeyStatus {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "done" => Some(Self::Done),
            "expired" => Some(Self::Expired),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Done => "done",
            Self::Expired => "expired",
        }
    }
}

/// The most key records one call of [`Ledger::keys`] reads, so that a filter that matches
/// little cannot make one request scan a million keys.
pub const KEYS_SCAN_MAX: usize = 20_000;

/// A page of keys, and where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPage {
    pub keys: Vec<KeyInfo>,
    /// Pass as `after` to go on; `None` when the listing is complete.
    pub next: Option<(ClientId, Key)>,
}

/// One key, for listings and the dashboard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub client: ClientId,
    pub key: Key,
    pub status: KeyStatus,
    pub command: Command,
    /// When the key was claimed (pending) or its fact recorded.
    pub since: Timestamp,
    /// Set once the key is done or expired.
    pub outcome: Option<Outcome>,
    /// Pending: whether the claim's lease has run out.
    pub lease_expired: bool,
    /// Replays and conflicts seen for this key since the process started.
    pub replays: u32,
    pub conflicts: u32,
}

/// A message the inbox refused to apply, kept with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantined {
    pub id: u64,
    pub at: Timestamp,
    pub message_id: Option<String>,
    pub reason: String,
    /// The message as received (lossy UTF-8, at most 4 KiB).
    pub payload: String,
}

// ---- crash points --------------------------------------------------------------------

/// A named point at a commit boundary where a test can make the process die, to check that
/// what was in flight there is all there or not there at all after reopening. With the
/// `failpoints` feature a point is armed by `fail::cfg(name, "3*off->return")` (die at the
/// fourth pass); without it the macro is nothing. The points: `commit.before_apply`,
/// `commit.after_apply`, `sync.before_flush`, `sync.after_flush`.
macro_rules! crash_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        if fail::eval($name, |_| ()).is_some() {
            std::process::abort();
        }
    };
}

// ---- record layout -------------------------------------------------------------------

pub(crate) const P_FACT: u8 = b'f';
pub(crate) const P_KEY: u8 = b'k';
pub(crate) const P_ACCOUNT: u8 = b'a';
pub(crate) const P_REFUNDED: u8 = b'r';
const P_INBOX: u8 = b'i';
const P_QUARANTINE: u8 = b'q';
pub(crate) const STATS_KEY: &[u8] = b"s";
const RECORD_VERSION: u8 = 1;

pub(crate) fn fact_key(seq: u64) -> [u8; 9] {
    let mut k = [P_FACT; 9];
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn quarantine_key(id: u64) -> [u8; 9] {
    let mut k = fact_key(id);
    k[0] = P_QUARANTINE;
    k
}

pub(crate) fn scoped_key(prefix: u8, client: &ClientId, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + client.as_str().len() + key.len());
    k.push(prefix);
    k.extend_from_slice(client.as_str().as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

pub(crate) fn account_key(account: &Account, currency: Currency) -> Vec<u8> {
    let mut k = Vec::with_capacity(5 + account.as_str().len());
    k.push(P_ACCOUNT);
    k.extend_from_slice(account.as_str().as_bytes());
    k.push(0);
    k.extend_from_slice(currency.as_str().as_bytes());
    k
}

/// What a key holds once done: where its fact is, and what command it answered.
///
/// The stored answer is the fact itself: `Outcome::from_fact` renders it the same way every
/// time, so a replay is byte-identical without a second copy of the answer (which would
/// cost a third of the bytes per fact and could disagree with the fact). The sweep marks
/// the key expired; the fingerprint stays, so a reuse of an expired key is still refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeyRecord {
    pub seq: u64,
    pub at: Timestamp,
    pub fingerprint: Fingerprint,
    pub expired: bool,
}

/// What a done key holds, as a repeat arriving outside the committer finds it.
enum Held {
    /// Its durable answer, from the shard's cache.
    Cached(Outcome),
    /// Durable in the log: the answer is its fact's, at this seq.
    Logged(u64),
    /// Applied but not flushed yet: nothing may be answered from it.
    Unflushed,
}

impl KeyRecord {
    fn encode(&self) -> Vec<u8> {
        let mut out = vec![RECORD_VERSION];
        out.extend(postcard::to_stdvec(self).unwrap_or_default());
        out
    }
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        match bytes.split_first() {
            Some((&RECORD_VERSION, rest)) => {
                postcard::from_bytes(rest).map_err(|e| DecodeError::new("key record", e))
            }
            _ => Err(DecodeError::new("key record", "unknown version")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct InboxRecord {
    fingerprint: Fingerprint,
    seq: u64,
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![RECORD_VERSION];
    out.extend(postcard::to_stdvec(v).unwrap_or_default());
    out
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, DecodeError> {
    match bytes.split_first() {
        Some((&RECORD_VERSION, rest)) => {
            postcard::from_bytes(rest).map_err(|e| DecodeError::new(what, e))
        }
        _ => Err(DecodeError::new(what, "unknown version")),
    }
}

pub(crate) fn message_fingerprint(client: &ClientId, key: &Key, command: &Command) -> Fingerprint {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(client.as_str().as_bytes());
    h.update([0]);
    h.update(key.as_str().as_bytes());
    h.update([0]);
    h.update(command.canonical_bytes());
    let mut f = [0u8; 16];
    f.copy_from_slice(&h.finalize()[..16]);
    Fingerprint(f)
}

// ---- shared state --------------------------------------------------------------------

fn use_of(structure: &'static str, limit: Limit, bound_bytes: Option<u64>) -> MemoryUse {
    MemoryUse {
        structure,
        entries: 0,
        limit,
        bytes: 0,
        bound_bytes,
    }
}

/// The balances every store keeps in memory: one entry per (account, currency), in
/// B-trees whose nodes hold eleven entries and are about two thirds full.
pub(crate) fn balances_use(balances: &Balances) -> MemoryUse {
    let mut entries = 0;
    let mut bytes = 0;
    for (account, by_currency) in &balances.accounts {
        entries += by_currency.len() as u64;
        bytes += (std::mem::size_of::<(Account, BTreeMap<Currency, i128>)>() as u64) * 3 / 2
            + memory::heap_str(account.as_str().len())
            + (std::mem::size_of::<(Currency, i128)>() as u64) * 3 / 2 * by_currency.len() as u64;
    }
    MemoryUse {
        structure: "balances",
        entries,
        limit: Limit::Accounts,
        bytes,
        bound_bytes: None,
    }
}

const SHARDS: usize = 64;
const ACTIVITY_PER_SHARD: usize = 4096;
const ANSWERS_PER_SHARD: usize = 1024;

#[derive(Debug, Clone)]
struct Claim {
    fingerprint: Fingerprint,
    token: u64,
    claimed_at: Timestamp,
    command: Command,
}

#[derive(Default)]
struct Shard {
    claims: HashMap<(ClientId, Key), Claim>,
    /// Durable answers of recently done keys, so most replays touch no storage. An
    /// answer never changes once durable, so this cache cannot go stale; it is bounded
    /// by being forgotten wholesale when full.
    answers: HashMap<(ClientId, Key), (Fingerprint, Outcome)>,
    /// (replays, conflicts) per key, bounded: forgotten wholesale when full.
    activity: HashMap<(ClientId, Key), (u32, u32)>,
}

impl Shard {
    fn remember(&mut self, ck: &(ClientId, Key), fingerprint: Fingerprint, outcome: &Outcome) {
        if self.answers.len() >= ANSWERS_PER_SHARD {
            self.answers.clear();
        }
        self.answers
            .insert(ck.clone(), (fingerprint, outcome.clone()));
    }

    fn note(&mut self, ck: &(ClientId, Key), replay: bool) {
        if self.activity.len() >= ACTIVITY_PER_SHARD && !self.activity.contains_key(ck) {
            self.activity.clear();
        }
        let e = self.activity.entry(ck.clone()).or_default();
        if replay {
            e.0 = e.0.saturating_add(1);
        } else {
            e.1 = e.1.saturating_add(1);
        }
    }
}

/// What readers see: only what is durable.
#[derive(Debug, Default)]
struct State {
    balances: Balances,
    stats: Stats,
}

struct Shared {
    path: PathBuf,
    db: sled::Db,
    tree: sled::Tree,
    data_file: Option<File>,
    config: Config,
    rules: crate::backend::Rules,
    shards: Vec<Mutex<Shard>>,
    state: RwLock<State>,
    durable_seq: AtomicU64,
    next_token: AtomicU64,
    replayed: AtomicU64,
    conflicts_in_flight: AtomicU64,
    conflicts_reused: AtomicU64,
    /// Set on the first storage failure: from then on nothing is written until reopened,
    /// because sled's memory may hold a batch whose flush failed.
    failed: Mutex<Option<String>>,
    /// Commit latency and batch sizes, for the metrics.
    metrics: Mutex<CommitMetrics>,
    /// Last, so that it drops after `db` and `tree`: see [`LockReleased`].
    _released: LockReleased,
}

/// Waits, when dropped, until sled's lock on the folder is free again. Dropping sled's
/// last handle does not quite release the folder: its last buffer writes and file
/// truncations finish on sled's own I/O threads, which hold the data file (and with it the
/// lock) a moment longer. A reopen in the same process right after the drop (a restart in
/// tests, or after a storage failure) would then meet `Locked` now and then. Declared
/// before the sled handles in `open` and after them in `Shared`, so that it drops after.
struct LockReleased {
    /// Set once sled holds the lock: a lock held by someone else is not ours to wait for.
    data_file: Option<PathBuf>,
}

impl Drop for LockReleased {
    fn drop(&mut self) {
        use fs2::FileExt as _;
        let Some(Ok(file)) = self.data_file.as_ref().map(File::open) else {
            return;
        };
        // Bounded, so that a stuck sled thread cannot hang the drop: a reopen after the
        // deadline answers `Locked`, which says what is wrong.
        let deadline = Instant::now() + Duration::from_secs(10);
        while file.try_lock_exclusive().is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Closing `file` releases the lock if it was taken.
    }
}

/// Histogram buckets (upper bounds, microseconds) of commit latency.
pub const LATENCY_BUCKETS_US: [u64; 12] = [
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    u64::MAX,
];

/// Counts for the commit path: how long each command took from submission to its durable
/// answer, and how many commands each sync (one flush, one fdatasync) made durable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitMetrics {
    pub latency_buckets: [u64; 12],
    pub latency_sum_us: u64,
    pub batches: u64,
    pub commands: u64,
    pub batch_size_max: u64,
    pub last_batch_size: u64,
    /// `apply_batch` calls that carried commands: at most one per sync when the decider
    /// keeps up, more when a batch reaches `batch_max` first.
    pub applies: u64,
}

fn io_err(e: sled::Error) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}

enum Request {
    Command {
        client: ClientId,
        key: Key,
        command: Command,
        fingerprint: Fingerprint,
        token: u64,
        message: Option<MessageId>,
        arrived: Instant,
        reply: Reply,
    },
    Quarantine {
        message_id: Option<String>,
        reason: String,
        payload: String,
        reply: Box<dyn FnOnce(Result<u64>) + Send>,
    },
    Sweep {
        reply: Box<dyn FnOnce(Result<usize>) + Send>,
    },
    /// The last step of an online verify, run between two batches.
    Verify {
        step: Box<dyn FnOnce() -> Result<VerifyReport> + Send>,
        reply: Box<dyn FnOnce(Result<VerifyReport>) + Send>,
    },
    /// Holds the committer until the sender side is dropped (see [`Ledger::pause`]).
    Pause(Receiver<()>),
    Shutdown,
}

/// Keeps the committer paused while alive.
#[derive(Debug)]
pub struct PauseGuard {
    _tx: Sender<()>,
}

/// Called exactly once with the answer, from the committer thread (keep it short) or
/// from the submitting thread when no write is needed.
pub type Reply = Box<dyn FnOnce(Result<Submission>) + Send>;

/// A handle to an open ledger. Cheap to clone; the committer stops on [`Ledger::shutdown`]
/// or when the last handle is dropped.
#[derive(Clone)]
pub struct Ledger {
    shared: Arc<Shared>,
    tx: Sender<Request>,
    committer: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.shared.path)
            .finish()
    }
}

impl Ledger {
    /// Opens (or creates) the ledger at `config.path`: recovers sled, checks the log tail
    /// against the projections, and refuses to start on any disagreement. Never deletes.
    pub fn open(config: Config) -> Result<(Ledger, OpenReport)> {
        let started = Instant::now();
        let path = config.path.clone();
        let shown = path.display().to_string();
        // Dropped after `db`, also when opening fails below once sled has opened.
        let mut released = LockReleased { data_file: None };
        let db = sled::Config::new()
            .path(&path)
            .cache_capacity(config.cache_capacity_bytes)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|e| open_err(&shown, e))?;
        released.data_file = Some(path.join("db"));
        let tree = db.open_tree("ledger").map_err(|e| open_err(&shown, e))?;
        let corrupt = |detail: String| LedgerError::Corrupt {
            path: shown.clone(),
            detail,
        };

        let stats: Option<Stats> = match tree.get(STATS_KEY).map_err(|e| open_err(&shown, e))? {
            None => None,
            Some(v) => Some(decode("stats", &v).map_err(|e| corrupt(e.to_string()))?),
        };
        let last = tree
            .scan_prefix([P_FACT])
            .next_back()
            .transpose()
            .map_err(|e| open_err(&shown, e))?;
        let last_fact = match &last {
            None => None,
            Some((k, v)) => {
                let seq =
                    seq_of(k).ok_or_else(|| corrupt("a log key of the wrong length".into()))?;
                Some(Fact::decode(seq, v).map_err(|e| corrupt(e.to_string()))?)
            }
        };
        let fresh = stats.is_none();
        let stats = stats.unwrap_or_default();
        let tail = last_fact.as_ref().map_or(0, |f| f.seq);
        if tail != stats.last_seq {
            return Err(corrupt(format!(
                "the log ends at seq {tail} but the projections were written at seq {}",
                stats.last_seq
            )));
        }
        if let Some(fact) = &last_fact {
            let rec = tree
                .get(scoped_key(P_KEY, &fact.client, fact.key.as_str()))
                .map_err(|e| open_err(&shown, e))?
                .ok_or_else(|| corrupt(format!("the last fact (seq {tail}) has no key record")))?;
            let rec = KeyRecord::decode(&rec).map_err(|e| corrupt(e.to_string()))?;
            if rec.seq != fact.seq {
                return Err(corrupt(format!(
                    "the last fact (seq {tail}) and its key record (seq {}) disagree",
                    rec.seq
                )));
            }
        }
        let mut balances = Balances::default();
        for item in tree.scan_prefix([P_ACCOUNT]) {
            let (k, v) = item.map_err(|e| open_err(&shown, e))?;
            let (account, currency, balance) =
                decode_balance(&k, &v).ok_or_else(|| corrupt("an undecodable balance".into()))?;
            balances
                .accounts
                .entry(account)
                .or_default()
                .insert(currency, balance);
        }
        for (currency, sum) in balances.sums() {
            if sum != 0 {
                return Err(corrupt(format!(
                    "balances in {currency} sum to {sum}, not 0"
                )));
            }
        }
        let data_file = if config.fsync {
            Some(File::open(path.join("db")).map_err(|e| {
                LedgerError::Unavailable(format!("opening the data file for fdatasync: {e}"))
            })?)
        } else {
            None
        };
        let report = OpenReport {
            fresh,
            facts: stats.last_seq,
            keys_done: stats.keys_done,
            keys_expired: stats.keys_expired,
            accounts: balances.accounts.keys().filter(|a| !a.is_system()).count(),
            last_fact_at: last_fact.as_ref().map(|f| f.at.to_rfc3339()),
            open_ms: started.elapsed().as_millis(),
        };
        let observed = stats.observed;
        let shared = Arc::new(Shared {
            path,
            db,
            tree,
            data_file,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            durable_seq: AtomicU64::new(stats.last_seq),
            next_token: AtomicU64::new(1),
            replayed: AtomicU64::new(observed.replayed),
            conflicts_in_flight: AtomicU64::new(observed.conflicts_in_flight),
            conflicts_reused: AtomicU64::new(observed.conflicts_reused),
            state: RwLock::new(State { balances, stats }),
            failed: Mutex::new(None),
            metrics: Mutex::new(CommitMetrics::default()),
            rules: crate::backend::Rules {
                retention: config.retention,
                lease: config.lease,
                clock: config.clock.clone(),
            },
            config,
            _released: released,
        });
        if fresh {
            // Write the stats record now, so that a later open can tell a new ledger from
            // one whose stats vanished.
            let committer = Committer::new(shared.clone());
            committer
                .write_stats_now()
                .map_err(|e| open_err_l(&shown, e))?;
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let committer_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name("idem-committer".into())
            .spawn(move || Committer::new(committer_shared).run(rx))
            .map_err(|e| LedgerError::Unavailable(format!("starting the committer: {e}")))?;
        Ok((
            Ledger {
                shared,
                tx,
                committer: Arc::new(Mutex::new(Some(handle))),
            },
            report,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    pub(crate) fn rules_ref(&self) -> &crate::backend::Rules {
        &self.shared.rules
    }

    /// Submits a command and waits for its durable answer.
    pub fn submit(&self, client: &ClientId, key: &Key, command: Command) -> Result<Submission> {
        wait_for(|reply| self.submit_with(client, key, command, None, reply))
    }

    /// Submits a message through the inbox: deduplicated by its id in the same commit as
    /// its effect, and by its key like any command.
    pub fn deliver(
        &self,
        message_id: &MessageId,
        client: &ClientId,
        key: &Key,
        command: Command,
    ) -> Result<Submission> {
        wait_for(|reply| self.submit_with(client, key, command, Some(message_id.clone()), reply))
    }

    /// Submits without waiting: `reply` is called once with the answer. This is the
    /// entry point for async callers, which complete a future from the reply.
    pub fn submit_with(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
        reply: Reply,
    ) {
        let shared = &self.shared;
        if let Some(reason) = shared.failed.lock().clone() {
            return reply(Err(LedgerError::Unavailable(reason)));
        }
        let fingerprint = command.fingerprint();
        let now = shared.config.clock.now();
        let ck = (client.clone(), key.clone());
        let mut shard = shared.shard(&ck).lock();
        let live = shard.claims.get(&ck).map(|claim| {
            let ends = claim
                .claimed_at
                .saturating_add_ms(duration_ms(shared.config.lease));
            (claim.fingerprint, ends)
        });
        // What the key durably holds answers a repeat of its own command (a replay) and
        // refuses another (reused). A message is never decided here: its id must reach the
        // committer, to be checked against the inbox before its key and recorded with its
        // answer.
        let answer = match live {
            // A live claim. What the key durably holds decides, not the claim: a claim of
            // another command may be an intruder on a key already done with this one (an
            // inbox message reusing the key, or a takeover), and a claim of this very
            // command may be a replay on its way through the committer (a done key whose
            // answer had left the cache), so a true retry is answered meanwhile instead of
            // being refused or told 409. Only a key that holds nothing durable yet is in
            // flight. This reads the key on the caller's thread, but only for an arrival
            // that meets a live claim (a duplicate in flight), never for a first attempt.
            Some((claimed, ends)) if now < ends => {
                let left = u64::try_from(ends.millis() - now.millis()).unwrap_or(0);
                // Retry-After is in whole seconds; the commit usually takes milliseconds.
                let in_flight = Submission::InProgress {
                    retry_after: Duration::from_millis(left.clamp(1, 1000))
                        .max(Duration::from_secs(1)),
                };
                // A message comes again instead: refusing it here for the key would report
                // a reused message id as a reused key.
                Some(if message.is_some() {
                    Ok(in_flight)
                } else {
                    match shared.held(&shard, &ck) {
                        Err(e) => Err(e),
                        Ok(Some((stored, held))) if stored == fingerprint => match held {
                            Held::Cached(_) | Held::Logged(_) => {
                                shared.replay(&mut shard, &ck, stored, held)
                            }
                            // Done with this command but not flushed yet (a takeover while the
                            // first attempt's batch is in flight): come again.
                            _ => Ok(in_flight),
                        },
                        Ok(Some(_)) => Ok(Submission::Reused),
                        Ok(None) if claimed == fingerprint => Ok(in_flight),
                        Ok(None) => Ok(Submission::Reused),
                    }
                })
            }
            // The lease ran out: take the claim over. The committer decides whether the
            // key is done by now, so this arrival cannot cause a second effect.
            Some(_) => None,
            // No claim: the key is new or durably done (claims are released only after
            // the flush), so a cached answer may be given from here. A key not in the
            // cache goes to the committer, which reads it between its writes: read here,
            // sled's reads wait on the global lock every batch write holds, and most keys
            // that miss the cache are new.
            None if message.is_none() => match shard.answers.get(&ck).cloned() {
                None => None,
                Some((stored, _)) if core::classify(Some(stored), fingerprint) == Seen::Reused => {
                    Some(Ok(Submission::Reused))
                }
                Some((_, outcome)) => Some(Ok(Submission::Replayed(outcome))),
            },
            None => None,
        };
        if let Some(answer) = answer {
            let counter = match &answer {
                Ok(Submission::Replayed(_)) => Some(&shared.replayed),
                Ok(Submission::Reused) => Some(&shared.conflicts_reused),
                Ok(Submission::InProgress { .. }) => Some(&shared.conflicts_in_flight),
                _ => None,
            };
            if let Some(counter) = counter {
                shard.note(&ck, matches!(answer, Ok(Submission::Replayed(_))));
                counter.fetch_add(1, Ordering::Relaxed);
            }
            drop(shard);
            return reply(answer);
        }
        let token = shared.next_token.fetch_add(1, Ordering::Relaxed);
        shard.claims.insert(
            ck,
            Claim {
                fingerprint,
                token,
                claimed_at: now,
                command: command.clone(),
            },
        );
        drop(shard);
        let request = Request::Command {
            client: client.clone(),
            key: key.clone(),
            command,
            fingerprint,
            token,
            message,
            arrived: Instant::now(),
            reply,
        };
        if let Err(crossbeam_channel::SendError(Request::Command {
            client,
            key,
            token,
            reply,
            ..
        })) = self.tx.send(request)
        {
            shared.release(&(client, key), token);
            reply(Err(LedgerError::Closed));
        }
    }

    /// Keeps an inbox message that could not be applied, with the reason, durably.
    pub fn quarantine(
        &self,
        message_id: Option<String>,
        reason: String,
        payload: &[u8],
    ) -> Result<u64> {
        let mut text = String::from_utf8_lossy(payload).into_owned();
        if text.len() > 4096 {
            let mut cut = 4096;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        wait_for(|reply| {
            self.request(Request::Quarantine {
                message_id,
                reason,
                payload: text,
                reply,
            });
        })
    }

    /// The quarantined messages with ids above `after`, oldest first, at most `limit`.
    pub fn quarantined(&self, after: u64, limit: usize) -> Result<Vec<Quarantined>> {
        let from = quarantine_key(after.saturating_add(1));
        let range = from..=quarantine_key(u64::MAX);
        self.decode_quarantined(self.shared.tree.range(range).take(limit))
    }

    /// The newest `limit` quarantined messages, newest first.
    pub fn quarantined_newest(&self, limit: usize) -> Result<Vec<Quarantined>> {
        let records = self
            .shared
            .tree
            .scan_prefix([P_QUARANTINE])
            .rev()
            .take(limit);
        self.decode_quarantined(records)
    }

    fn decode_quarantined(
        &self,
        records: impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>,
    ) -> Result<Vec<Quarantined>> {
        let mut out = Vec::new();
        for item in records {
            let (_, v) = item.map_err(io_err)?;
            out.push(decode("quarantine", &v).map_err(|e| self.shared.corrupt(e))?);
        }
        Ok(out)
    }

    /// Expires the stored responses of done keys older than the retention, as of the
    /// clock's now. Returns how many keys expired.
    pub fn sweep(&self) -> Result<usize> {
        wait_for(|reply| self.request(Request::Sweep { reply }))
    }

    /// Rebuilds every projection from the log and checks the guarantees, while commits
    /// go on: the log up to the durable seq is read with no lock, and one short step
    /// between two batches checks what was written meanwhile (see `verify_online`).
    pub fn verify(&self) -> Result<VerifyReport> {
        let parallel = self.shared.config.verify_in_parallel;
        verify::verify_online(
            &self.shared.tree,
            parallel,
            &|| self.durable_seq(),
            &|step| wait_for(|reply| self.request(Request::Verify { step, reply })),
        )
    }

    /// Queues a request for the committer. If it has stopped, the request (and its reply)
    /// is dropped, which its waiter reads as `Closed`.
    fn request(&self, request: Request) {
        let _ = self.tx.send(request);
    }

    /// Stops the committer after what was submitted before, until the guard is dropped:
    /// commands submitted meanwhile stay pending. For tests of in-flight duplicates and
    /// lease takeover, and for taking a consistent copy of the folder.
    pub fn pause(&self) -> PauseGuard {
        let (tx, rx) = crossbeam_channel::bounded(0);
        let _ = self.tx.send(Request::Pause(rx));
        PauseGuard { _tx: tx }
    }

    /// Finishes and flushes everything submitted before, then stops the committer.
    /// Later submissions answer [`LedgerError::Closed`].
    pub fn shutdown(&self) {
        let _ = self.tx.send(Request::Shutdown);
        if let Some(handle) = self.committer.lock().take() {
            let _ = handle.join();
        }
    }

    // ---- reads ---------------------------------------------------------------------

    /// The sequence number of the last durable fact.
    pub fn durable_seq(&self) -> u64 {
        self.shared.durable_seq.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> Stats {
        let mut stats = self.shared.state.read().stats.clone();
        stats.observed = self.shared.observed();
        stats
    }

    pub fn commit_metrics(&self) -> CommitMetrics {
        self.shared.metrics.lock().clone()
    }

    /// What this store keeps in memory besides sled's page cache, structure by structure;
    /// the page cache is bounded by [`Config::cache_capacity_bytes`].
    pub fn memory(&self) -> Vec<MemoryUse> {
        type Ck = (ClientId, Key);
        let shards = SHARDS as u64;
        let answers_max = shards * ANSWERS_PER_SHARD as u64;
        let activity_max = shards * ACTIVITY_PER_SHARD as u64;
        let answer_slot = std::mem::size_of::<(Ck, (Fingerprint, Outcome))>();
        let activity_slot = std::mem::size_of::<(Ck, (u32, u32))>();
        let mut claims = use_of("claims", Limit::InFlight, None);
        // An answer owns the key's client and name, the receipt's key, and an account
        // (or a withdrawal's key) in the command and the receipt.
        let mut answers = use_of(
            "answers",
            Limit::Entries(answers_max),
            Some(memory::at_limit(answers_max, answer_slot, 5)),
        );
        let mut activity = use_of(
            "activity",
            Limit::Entries(activity_max),
            Some(memory::at_limit(activity_max, activity_slot, 2)),
        );
        for shard in &self.shared.shards {
            let shard = shard.lock();
            for (ck, claim) in &shard.claims {
                claims.entries += 1;
                claims.bytes += memory::slot(std::mem::size_of::<(Ck, Claim)>())
                    + memory::key_heap(&ck.0, &ck.1)
                    + memory::command_heap(&claim.command);
            }
            for (ck, (_, outcome)) in &shard.answers {
                answers.entries += 1;
                answers.bytes += memory::slot(answer_slot)
                    + memory::key_heap(&ck.0, &ck.1)
                    + memory::outcome_heap(outcome);
            }
            for ck in shard.activity.keys() {
                activity.entries += 1;
                activity.bytes += memory::slot(activity_slot) + memory::key_heap(&ck.0, &ck.1);
            }
        }
        let cache = self.shared.config.cache_capacity_bytes;
        let page_cache = MemoryUse {
            structure: "page_cache",
            entries: 0,
            limit: Limit::Bytes(cache),
            bytes: cache,
            bound_bytes: None,
        };
        let balances = balances_use(&self.shared.state.read().balances);
        vec![claims, answers, activity, balances, page_cache]
    }

    /// Balances of one account, per currency (system accounts may hold several).
    pub fn account(&self, account: &Account) -> Option<BTreeMap<Currency, i128>> {
        self.shared
            .state
            .read()
            .balances
            .accounts
            .get(account)
            .cloned()
    }

    pub fn balances(&self) -> Balances {
        self.shared.state.read().balances.clone()
    }

    /// Facts with `seq > after`, in order, at most `limit`, durable ones only.
    pub fn facts(&self, after: u64, limit: usize) -> Result<Vec<Fact>> {
        let durable = self.durable_seq();
        let mut out = Vec::new();
        let start = fact_key(after.saturating_add(1));
        for item in self
            .shared
            .tree
            .range(start..=fact_key(durable))
            .take(limit)
        {
            let (k, v) = item.map_err(io_err)?;
            let seq = seq_of(&k)
                .ok_or_else(|| self.shared.corrupt(DecodeError::new("log key", "length")))?;
            out.push(Fact::decode(seq, &v).map_err(|e| self.shared.corrupt(e))?);
        }
        Ok(out)
    }

    pub fn fact(&self, seq: u64) -> Result<Option<Fact>> {
        self.shared.fact(seq)
    }

    /// Pending keys (claimed, not yet durable), oldest first.
    pub fn pending(&self) -> Vec<KeyInfo> {
        let mut out = Vec::new();
        for shard in &self.shared.shards {
            let shard = shard.lock();
            out.extend(
                shard
                    .claims
                    .iter()
                    .map(|(ck, claim)| self.shared.pending_info(&shard, ck, claim)),
            );
        }
        out.sort_by(|a, b| (a.since, &a.client, &a.key).cmp(&(b.since, &b.client, &b.key)));
        out
    }

    /// One key: pending, done or expired; `None` if never seen.
    pub fn key(&self, client: &ClientId, key: &Key) -> Result<Option<KeyInfo>> {
        let ck = (client.clone(), key.clone());
        {
            let shard = self.shared.shard(&ck).lock();
            if let Some(claim) = shard.claims.get(&ck) {
                return Ok(Some(self.shared.pending_info(&shard, &ck, claim)));
            }
        }
        match self
            .shared
            .tree
            .get(scoped_key(P_KEY, client, key.as_str()))
            .map_err(io_err)?
        {
            None => Ok(None),
            Some(bytes) => Ok(Some(self.shared.key_info(client, key, &bytes)?)),
        }
    }

    /// Done and expired keys in (client, key) order after `after`, filtered, at most
    /// `limit`. `KeyPage::next` says where to go on, also when a filtered scan stopped
    /// (it reads at most [`KEYS_SCAN_MAX`] records a call) before finding `limit` keys;
    /// `None` means the end. Pending keys (`status` pending) come from memory, in one page.
    pub fn keys(
        &self,
        status: Option<KeyStatus>,
        client: Option<&ClientId>,
        after: Option<(&ClientId, &Key)>,
        limit: usize,
    ) -> Result<KeyPage> {
        if status == Some(KeyStatus::Pending) {
            let keys = self
                .pending()
                .into_iter()
                .filter(|k| client.is_none_or(|c| *c == k.client))
                .take(limit)
                .collect();
            return Ok(KeyPage { keys, next: None });
        }
        let prefix = match client {
            Some(c) => scoped_key(P_KEY, c, ""),
            None => vec![P_KEY],
        };
        let iter = match after {
            Some((c, k)) => {
                let mut start = scoped_key(P_KEY, c, k.as_str());
                start.push(0);
                self.shared.tree.range(start..)
            }
            None => self.shared.tree.range(prefix.clone()..),
        };
        let mut page = KeyPage {
            keys: Vec::new(),
            next: None,
        };
        let mut last = None;
        for (scanned, item) in iter.enumerate() {
            let (k, v) = item.map_err(io_err)?;
            if !k.starts_with(&prefix) {
                return Ok(page);
            }
            if page.keys.len() >= limit || scanned >= KEYS_SCAN_MAX {
                page.next = last;
                return Ok(page);
            }
            let Some((c, key)) = split_scoped(&k) else {
                return Err(self
                    .shared
                    .corrupt(DecodeError::new("key record key", "shape")));
            };
            last = Some((c.clone(), key.clone()));
            if let Some(want) = status {
                // Only the status is needed to filter: skipped keys cost one decode.
                let rec = KeyRecord::decode(&v).map_err(|e| self.shared.corrupt(e))?;
                let is = if rec.expired {
                    KeyStatus::Expired
                } else {
                    KeyStatus::Done
                };
                if is != want {
                    continue;
                }
            }
            page.keys.push(self.shared.key_info(&c, &key, &v)?);
        }
        Ok(page)
    }

    /// Bytes on disk of the ledger's folder.
    pub fn size_on_disk(&self) -> Result<u64> {
        self.shared.db.size_on_disk().map_err(io_err)
    }

    /// The reason the ledger stopped writing, if it did.
    pub fn failure(&self) -> Option<String> {
        self.shared.failed.lock().clone()
    }
}

impl Drop for Ledger {
    /// The last handle closes the ledger deterministically, so that the folder can be
    /// reopened as soon as the drop returns.
    fn drop(&mut self) {
        if Arc::strong_count(&self.committer) == 1 {
            self.shutdown();
        }
    }
}

/// Calls `start` with a reply callback and waits for the answer: the blocking face of
/// every callback-based entry point. A reply dropped unanswered (the committer stopped)
/// reads as `Closed`.
fn wait_for<T: Send + 'static>(start: impl FnOnce(Box<dyn FnOnce(Result<T>) + Send>)) -> Result<T> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    start(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    rx.recv().unwrap_or(Err(LedgerError::Closed))
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn seq_of(k: &[u8]) -> Option<u64> {
    let b: [u8; 8] = k.get(1..9)?.try_into().ok()?;
    (k.len() == 9).then(|| u64::from_be_bytes(b))
}

pub(crate) fn split_scoped(k: &[u8]) -> Option<(ClientId, Key)> {
    let rest = k.get(1..)?;
    let nul = rest.iter().position(|b| *b == 0)?;
    let client = std::str::from_utf8(&rest[..nul]).ok()?;
    let key = std::str::from_utf8(&rest[nul + 1..]).ok()?;
    Some((ClientId::parse(client).ok()?, Key::parse(key).ok()?))
}

pub(crate) fn decode_balance(k: &[u8], v: &[u8]) -> Option<(Account, Currency, i128)> {
    let rest = k.get(1..)?;
    let nul = rest.iter().position(|b| *b == 0)?;
    let account = Account::parse_any(std::str::from_utf8(&rest[..nul]).ok()?).ok()?;
    let currency = Currency::parse(std::str::from_utf8(&rest[nul + 1..]).ok()?).ok()?;
    let balance = i128::from_be_bytes(v.try_into().ok()?);
    Some((account, currency, balance))
}

fn open_err(path: &str, e: sled::Error) -> LedgerError {
    match e {
        sled::Error::Corruption { .. } => LedgerError::Corrupt {
            path: path.to_owned(),
            detail: format!("sled reports {e}"),
        },
        sled::Error::Io(ref io)
            if io.kind() == std::io::ErrorKind::WouldBlock || io.to_string().contains("lock") =>
        {
            LedgerError::Locked {
                path: path.to_owned(),
            }
        }
        other => LedgerError::Unavailable(format!("opening {path}: {other}")),
    }
}

fn open_err_l(path: &str, e: LedgerError) -> LedgerError {
    match e {
        LedgerError::Unavailable(m) => LedgerError::Unavailable(format!("opening {path}: {m}")),
        other => other,
    }
}

impl Shared {
    fn shard(&self, ck: &(ClientId, Key)) -> &Mutex<Shard> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        ck.hash(&mut h);
        let i = usize::try_from(h.finish() % SHARDS as u64).unwrap_or(0);
        &self.shards[i]
    }

    fn release(&self, ck: &(ClientId, Key), token: u64) {
        let mut shard = self.shard(ck).lock();
        if shard.claims.get(ck).is_some_and(|c| c.token == token) {
            shard.claims.remove(ck);
        }
    }

    fn corrupt(&self, e: DecodeError) -> LedgerError {
        LedgerError::Corrupt {
            path: self.path.display().to_string(),
            detail: e.to_string(),
        }
    }

    fn observed(&self) -> Observed {
        Observed {
            replayed: self.replayed.load(Ordering::Relaxed),
            conflicts_in_flight: self.conflicts_in_flight.load(Ordering::Relaxed),
            conflicts_reused: self.conflicts_reused.load(Ordering::Relaxed),
        }
    }

    fn fact(&self, seq: u64) -> Result<Option<Fact>> {
        match self.tree.get(fact_key(seq)).map_err(io_err)? {
            None => Ok(None),
            Some(v) => Ok(Some(Fact::decode(seq, &v).map_err(|e| self.corrupt(e))?)),
        }
    }

    /// What a done key holds, with its fingerprint; `None` for a key never done. The
    /// answer is rendered only when it is replayed.
    fn held(&self, shard: &Shard, ck: &(ClientId, Key)) -> Result<Option<(Fingerprint, Held)>> {
        if let Some((stored, outcome)) = shard.answers.get(ck) {
            return Ok(Some((*stored, Held::Cached(outcome.clone()))));
        }
        let Some(bytes) = self
            .tree
            .get(scoped_key(P_KEY, &ck.0, ck.1.as_str()))
            .map_err(io_err)?
        else {
            return Ok(None);
        };
        let rec = KeyRecord::decode(&bytes).map_err(|e| self.corrupt(e))?;
        let held = if rec.seq > self.durable_seq.load(Ordering::Acquire) {
            Held::Unflushed
        } else {
            Held::Logged(rec.seq)
        };
        Ok(Some((rec.fingerprint, held)))
    }

    /// The replay of a done key, remembered in the shard's answer cache.
    fn replay(
        &self,
        shard: &mut Shard,
        ck: &(ClientId, Key),
        fingerprint: Fingerprint,
        held: Held,
    ) -> Result<Submission> {
        let outcome = match held {
            Held::Cached(outcome) => outcome,
            Held::Logged(seq) => {
                let outcome = self.stored_outcome(seq)?;
                shard.remember(ck, fingerprint, &outcome);
                outcome
            }
            // Not reachable without a claim (claims outlive the flush); not an answer yet.
            Held::Unflushed => {
                return Ok(Submission::InProgress {
                    retry_after: Duration::from_secs(1),
                });
            }
        };
        Ok(Submission::Replayed(outcome))
    }

    /// The key's answer, rendered from its fact.
    fn stored_outcome(&self, seq: u64) -> Result<Outcome> {
        let fact = self.fact(seq)?.ok_or_else(|| {
            self.corrupt(DecodeError::new(
                "key record",
                format!("its fact {seq} is missing"),
            ))
        })?;
        Ok(Outcome::from_fact(&fact))
    }

    fn pending_info(&self, shard: &Shard, ck: &(ClientId, Key), claim: &Claim) -> KeyInfo {
        let now = self.config.clock.now();
        let lease = duration_ms(self.config.lease);
        let (replays, conflicts) = shard.activity.get(ck).copied().unwrap_or_default();
        KeyInfo {
            client: ck.0.clone(),
            key: ck.1.clone(),
            status: KeyStatus::Pending,
            command: claim.command.clone(),
            since: claim.claimed_at,
            outcome: None,
            lease_expired: now >= claim.claimed_at.saturating_add_ms(lease),
            replays,
            conflicts,
        }
    }

    fn key_info(&self, client: &ClientId, key: &Key, bytes: &[u8]) -> Result<KeyInfo> {
        let rec = KeyRecord::decode(bytes).map_err(|e| self.corrupt(e))?;
        let outcome = self.stored_outcome(rec.seq)?;
        let command = match &outcome {
            Outcome::Applied(r) => r.command.clone(),
            Outcome::Rejected(r) => r.command.clone(),
        };
        let (replays, conflicts) = {
            let ck = (client.clone(), key.clone());
            self.shard(&ck)
                .lock()
                .activity
                .get(&ck)
                .copied()
                .unwrap_or_default()
        };
        Ok(KeyInfo {
            client: client.clone(),
            key: key.clone(),
            status: if !rec.expired {
                KeyStatus::Done
            } else {
                KeyStatus::Expired
            },
            command,
            since: rec.at,
            outcome: Some(outcome),
            lease_expired: false,
            replays,
            conflicts,
        })
    }

    fn fail(&self, reason: String) -> LedgerError {
        let mut failed = self.failed.lock();
        if failed.is_none() {
            *failed = Some(reason.clone());
        }
        LedgerError::Unavailable(reason)
    }
}

// ---- the committer -------------------------------------------------------------------
//
// Two threads in a pipeline. The decider takes every queued request, decides each against
// its own working state (the durable state plus every batch it applied since), and writes
// the batch with one atomic `apply_batch`. The syncer takes every batch applied since its
// last sync, makes them durable with one flush and one fdatasync, publishes them to
// readers, releases their claims and answers. So while one group is being synced, the
// next is being decided: one fsync covers everything that arrived meanwhile.

/// An answer held until its batch is durable.
#[allow(clippy::large_enum_variant)] // Commands are nearly all of them; boxing would cost more.
enum Pending {
    Command {
        ck: (ClientId, Key),
        token: u64,
        fingerprint: Fingerprint,
        reply: Reply,
        answer: Submission,
        arrived: Instant,
    },
    Quarantine {
        reply: Box<dyn FnOnce(Result<u64>) + Send>,
        id: u64,
    },
    Sweep {
        reply: Box<dyn FnOnce(Result<usize>) + Send>,
        expired: usize,
    },
    /// Signalled once everything before it is durable.
    Barrier(Sender<()>),
}

/// A batch that is written (atomically, in sled's memory) and waits for durability.
struct Applied {
    answers: Vec<Pending>,
    accounts: HashMap<Account, BTreeMap<Currency, i128>>,
    stats: Stats,
    /// The batch did not reach sled: answer with this error, publish nothing.
    error: Option<LedgerError>,
}

struct Committer {
    shared: Arc<Shared>,
    next_quarantine: u64,
    /// The decider's working state: durable state plus batches applied since.
    balances: Balances,
    stats: Stats,
}

/// One batch in the making. Nothing here reaches the working state until sled has
/// accepted the batch, so a failed write leaves memory as it was.
#[derive(Default)]
struct Staged {
    batch: sled::Batch,
    keys: HashMap<(ClientId, Key), (Fingerprint, Fact)>,
    accounts: HashMap<Account, BTreeMap<Currency, i128>>,
    refunded: HashMap<(ClientId, Key), u64>,
    inbox: HashMap<MessageId, Fingerprint>,
    answers: Vec<Pending>,
}

fn durable(shared: &Shared) -> Result<()> {
    durable_then(shared, || ())
}

/// [`durable`], calling `flushed` between sled's flush and the fdatasync: from then on
/// sled's lock is free, so the decider can apply the next batch while the disk syncs.
fn durable_then(shared: &Shared, flushed: impl FnOnce()) -> Result<()> {
    // sled's flush syncs with `sync_file_range`, which neither flushes the drive's write
    // cache nor the file's size; fdatasync does both (ARCHITECTURE.md, durability).
    shared.db.flush().map_err(io_err)?;
    flushed();
    if let Some(f) = &shared.data_file {
        f.sync_data()
            .map_err(|e| LedgerError::Unavailable(format!("fdatasync: {e}")))?;
    }
    Ok(())
}

impl Committer {
    fn new(shared: Arc<Shared>) -> Self {
        let next_quarantine = shared
            .tree
            .scan_prefix([P_QUARANTINE])
            .next_back()
            .and_then(|r| r.ok())
            .and_then(|(k, _)| seq_of(&k))
            .map_or(1, |s| s + 1);
        let (balances, stats) = {
            let state = shared.state.read();
            (state.balances.clone(), state.stats.clone())
        };
        Self {
            shared,
            next_quarantine,
            balances,
            stats,
        }
    }

    fn write_stats_now(&self) -> Result<()> {
        self.shared
            .tree
            .insert(STATS_KEY, encode(&self.stats))
            .map_err(io_err)?;
        durable(&self.shared)
    }

    /// The decider's loop; starts the syncer and stops it on shutdown.
    fn run(mut self, rx: Receiver<Request>) {
        let (to_syncer, from_decider) = crossbeam_channel::unbounded::<Applied>();
        // One token: the syncer is ready for the next batch (its flush returned, or it has
        // nothing left to sync).
        let (free_tx, syncer_free) = crossbeam_channel::bounded::<()>(1);
        let syncer_shared = self.shared.clone();
        let syncer = std::thread::Builder::new()
            .name("idem-syncer".into())
            .spawn(move || sync_loop(&syncer_shared, &from_decider, &free_tx));
        let Ok(syncer) = syncer else {
            let _ = self.shared.fail("could not start the syncer thread".into());
            return;
        };
        let max = self.shared.config.batch_max.max(1);
        // What is staged waits for the syncer's token, and is applied then in one
        // `apply_batch`: each apply costs sled two log writes (the data and the batch's
        // manifest), each with a `sync_file_range` and a wake-up of sled's I/O pool, while
        // the flush that makes them durable is one per sync whatever the applies.
        // Deciding goes on meanwhile, so nothing waits that would not wait anyway.
        let mut staged = Staged::default();
        let mut stats = self.stats.clone();
        loop {
            let first = if staged.answers.is_empty() {
                match rx.recv() {
                    Ok(r) => r,
                    Err(_) => break,
                }
            } else {
                // The syncer is busy: stage what arrives until its token comes. Requests
                // come first, so a batch takes everything that arrived before the token.
                crossbeam_channel::select_biased! {
                    recv(rx) -> r => match r {
                        Ok(r) => r,
                        Err(_) => break,
                    },
                    recv(syncer_free) -> _ => {
                        self.apply(std::mem::take(&mut staged), &mut stats, &to_syncer);
                        continue;
                    }
                }
            };
            let mut requests = vec![first];
            // What is staged counts too: a batch never takes more than `batch_max`.
            while staged.answers.len() + requests.len() < max {
                match rx.try_recv() {
                    Ok(r) => requests.push(r),
                    Err(_) => break,
                }
            }
            let mut stop = false;
            for request in requests {
                match request {
                    Request::Shutdown => stop = true,
                    Request::Pause(until) => {
                        self.apply(std::mem::take(&mut staged), &mut stats, &to_syncer);
                        // Returns when the guard is dropped.
                        let _ = until.recv();
                    }
                    Request::Sweep { reply } => {
                        // Apply what came before, then sweep in its own batch.
                        self.apply(std::mem::take(&mut staged), &mut stats, &to_syncer);
                        match self.sweep(&mut staged, &mut stats) {
                            Ok(expired) => staged.answers.push(Pending::Sweep { reply, expired }),
                            Err(e) => reply(Err(e)),
                        }
                        self.apply(std::mem::take(&mut staged), &mut stats, &to_syncer);
                    }
                    Request::Verify { step, reply } => {
                        // The step reads the tree with every batch before it applied and
                        // none running: one consistent state.
                        self.apply(std::mem::take(&mut staged), &mut stats, &to_syncer);
                        reply(step());
                    }
                    Request::Quarantine {
                        message_id,
                        reason,
                        payload,
                        reply,
                    } => {
                        let id = self.next_quarantine;
                        self.next_quarantine += 1;
                        let record = Quarantined {
                            id,
                            at: self.shared.config.clock.now(),
                            message_id,
                            reason,
                            payload,
                        };
                        staged
                            .batch
                            .insert(&quarantine_key(id)[..], encode(&record));
                        staged.answers.push(Pending::Quarantine { reply, id });
                    }
                    Request::Command {
                        client,
                        key,
                        command,
                        fingerprint,
                        token,
                        message,
                        arrived,
                        reply,
                    } => {
                        let ck = (client, key);
                        let failed = self.shared.failed.lock().clone();
                        let answer = match failed {
                            Some(reason) => Err(LedgerError::Unavailable(reason)),
                            None => self.stage(
                                &mut staged,
                                &mut stats,
                                &ck,
                                command,
                                fingerprint,
                                message,
                            ),
                        };
                        match answer {
                            // Nothing was staged for it (a refund of a withdrawal in
                            // flight): answered now, and its claim released, so that its
                            // retry is not told 409 by its own claim.
                            Ok(answer @ Submission::InProgress { .. }) => {
                                self.shared.release(&ck, token);
                                self.shared.shard(&ck).lock().note(&ck, false);
                                self.shared
                                    .conflicts_in_flight
                                    .fetch_add(1, Ordering::Relaxed);
                                reply(Ok(answer));
                            }
                            Ok(answer) => staged.answers.push(Pending::Command {
                                ck,
                                token,
                                fingerprint,
                                reply,
                                answer,
                                arrived,
                            }),
                            Err(e) => {
                                self.shared.release(&ck, token);
                                reply(Err(e));
                            }
                        }
                    }
                }
            }
            if stop {
                break;
            }
            // The token is taken only with something to apply: a token used on nothing
            // would leave staged commands waiting for a syncer with nothing to sync.
            if !staged.answers.is_empty()
                && (staged.answers.len() >= max || syncer_free.try_recv().is_ok())
            {
                self.apply(std::mem::take(&mut staged), &mut stats, &to_syncer);
            }
        }
        self.apply(std::mem::take(&mut staged), &mut stats, &to_syncer);
        // Everything applied becomes durable and is answered before the threads end.
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let barrier = Applied {
            answers: vec![Pending::Barrier(done_tx)],
            accounts: HashMap::new(),
            stats: self.stats.clone(),
            error: None,
        };
        if to_syncer.send(barrier).is_ok() {
            let _ = done_rx.recv();
        }
        drop(to_syncer);
        let _ = syncer.join();
    }

    /// Decides one command into the staged batch: the compare-and-swap on its key, then
    /// the pure decision, then its fact, key record and projections.
    fn stage(
        &mut self,
        staged: &mut Staged,
        stats: &mut Stats,
        ck: &(ClientId, Key),
        command: Command,
        fingerprint: Fingerprint,
        message: Option<MessageId>,
    ) -> Result<Submission> {
        let (client, key) = ck;
        if let Some(message_id) = &message {
            let mfp = message_fingerprint(client, key, &command);
            let seen = match staged.inbox.get(message_id) {
                Some(f) => Some(*f),
                None => match self
                    .shared
                    .tree
                    .get(inbox_key(message_id))
                    .map_err(io_err)?
                {
                    Some(v) => Some(
                        decode::<InboxRecord>("inbox record", &v)
                            .map_err(|e| self.shared.corrupt(e))?
                            .fingerprint,
                    ),
                    None => None,
                },
            };
            if seen.is_some_and(|f| f != mfp) {
                let reason = "message_id_reused: this message id was delivered before with \
                              another payload";
                // Kept with the reason, in the same batch as the answer.
                let id = self.next_quarantine;
                self.next_quarantine += 1;
                let record = Quarantined {
                    id,
                    at: self.shared.config.clock.now(),
                    message_id: Some(message_id.as_str().to_owned()),
                    reason: reason.into(),
                    payload: format!(
                        "{{\"key\":{:?},\"command\":{:?}}}",
                        key.as_str(),
                        command.name()
                    ),
                };
                staged
                    .batch
                    .insert(&quarantine_key(id)[..], encode(&record));
                return Ok(Submission::Quarantined {
                    reason: reason.into(),
                });
            }
        }
        // The compare: is the key taken, in this batch or on disk?
        let existing = match staged.keys.get(ck) {
            Some((f, fact)) => Some((*f, Outcome::from_fact(fact))),
            None => match self
                .shared
                .tree
                .get(scoped_key(P_KEY, client, key.as_str()))
                .map_err(io_err)?
            {
                None => None,
                Some(bytes) => {
                    let rec = KeyRecord::decode(&bytes).map_err(|e| self.shared.corrupt(e))?;
                    Some((rec.fingerprint, self.shared.stored_outcome(rec.seq)?))
                }
            },
        };
        if let Some((stored, outcome)) = existing {
            return Ok(match core::classify(Some(stored), fingerprint) {
                Seen::Reused => {
                    self.shared.conflicts_reused.fetch_add(1, Ordering::Relaxed);
                    Submission::Reused
                }
                _ => {
                    self.note_message(staged, message, client, key, &command, outcome.seq());
                    self.shared.replayed.fetch_add(1, Ordering::Relaxed);
                    Submission::Replayed(outcome)
                }
            });
        }
        if self.withdrawal_in_flight(staged, ck, &command)? {
            return Ok(Submission::InProgress {
                retry_after: Duration::from_secs(1),
            });
        }
        // The swap: decide and stage the fact with everything it changes.
        let inputs = self.inputs(staged, client, &command)?;
        let seq = stats.last_seq + 1;
        let at = self.shared.config.clock.now().max(stats.last_at);
        let fact = core::decide(client, key, &command, &inputs, seq, at);
        let outcome = Outcome::from_fact(&fact);
        staged.batch.insert(&fact_key(seq)[..], fact.encode());
        let record = KeyRecord {
            seq,
            at,
            fingerprint,
            expired: false,
        };
        staged
            .batch
            .insert(scoped_key(P_KEY, client, key.as_str()), record.encode());
        for (account, currency, delta) in crate::projection::legs(&fact) {
            // Copy the account's balances from the working state only on its first touch
            // in this batch; later commands on it reuse the staged copy.
            let entry = staged.accounts.entry(account.clone()).or_insert_with(|| {
                self.balances
                    .accounts
                    .get(account)
                    .cloned()
                    .unwrap_or_default()
            });
            let b = entry.entry(currency).or_insert(0);
            *b = b.saturating_add(delta);
            staged
                .batch
                .insert(account_key(account, currency), b.to_be_bytes().to_vec());
        }
        if let FactBody::RefundRecorded {
            withdrawal,
            refunded_total,
            ..
        } = &fact.body
        {
            let wk = (client.clone(), withdrawal.clone());
            staged.refunded.insert(wk, *refunded_total);
            staged.batch.insert(
                scoped_key(P_REFUNDED, client, withdrawal.as_str()),
                refunded_total.to_be_bytes().to_vec(),
            );
        }
        stats.apply(&fact);
        self.note_message(staged, message, client, key, &command, seq);
        staged.keys.insert(ck.clone(), (fingerprint, fact));
        Ok(Submission::Executed(outcome))
    }

    fn note_message(
        &self,
        staged: &mut Staged,
        message: Option<MessageId>,
        client: &ClientId,
        key: &Key,
        command: &Command,
        seq: u64,
    ) {
        if let Some(message_id) = message {
            let fingerprint = message_fingerprint(client, key, command);
            staged.batch.insert(
                inbox_key(&message_id),
                encode(&InboxRecord { fingerprint, seq }),
            );
            staged.inbox.insert(message_id, fingerprint);
        }
    }

    /// Whether `command` is a refund whose withdrawal is claimed and not decided yet: its
    /// key (the refund's client, the withdrawal's key) has a claim but no record, in this
    /// batch or on disk. That happens when the refund overtook its withdrawal: the
    /// withdrawal was claimed, but queued after the refund. Deciding now would store
    /// `withdrawal_not_found` for ever under the refund's key, so the refund is told to
    /// come again instead. A refund that names its own key sees its own claim, which is
    /// no withdrawal. The claim is looked at first: a withdrawal that is not in flight
    /// costs no read.
    fn withdrawal_in_flight(
        &self,
        staged: &Staged,
        ck: &(ClientId, Key),
        command: &Command,
    ) -> Result<bool> {
        let Command::Refund { withdrawal, .. } = command else {
            return Ok(false);
        };
        let wk = (ck.0.clone(), withdrawal.clone());
        if wk == *ck || !self.shared.shard(&wk).lock().claims.contains_key(&wk) {
            return Ok(false);
        }
        if staged.keys.contains_key(&wk) {
            return Ok(false);
        }
        let on_disk = self
            .shared
            .tree
            .contains_key(scoped_key(P_KEY, &wk.0, wk.1.as_str()))
            .map_err(io_err)?;
        Ok(!on_disk)
    }

    /// Loads what the decision reads: the account, and for a refund its withdrawal.
    fn inputs(&self, staged: &Staged, client: &ClientId, command: &Command) -> Result<Inputs> {
        let account_view = |account: &Account| -> Option<AccountView> {
            match staged.accounts.get(account) {
                Some(per) => per.iter().next().map(|(c, b)| AccountView {
                    currency: *c,
                    balance: u128::try_from(*b).unwrap_or(0),
                }),
                None => self.balances.user_account(account),
            }
        };
        Ok(match command {
            Command::Deposit { account, .. } | Command::Withdraw { account, .. } => Inputs {
                account: account_view(account),
                withdrawal: None,
            },
            Command::Refund { withdrawal, .. } => {
                let wk = (client.clone(), withdrawal.clone());
                let fact = match staged.keys.get(&wk) {
                    Some((_, fact)) => Some(fact.clone()),
                    None => match self
                        .shared
                        .tree
                        .get(scoped_key(P_KEY, client, withdrawal.as_str()))
                        .map_err(io_err)?
                    {
                        None => None,
                        Some(bytes) => {
                            let rec =
                                KeyRecord::decode(&bytes).map_err(|e| self.shared.corrupt(e))?;
                            self.shared.fact(rec.seq)?
                        }
                    },
                };
                let view = match fact.map(|f| f.body) {
                    Some(FactBody::WithdrawalRecorded {
                        account,
                        amount,
                        currency,
                        ..
                    }) => {
                        let refunded = match staged.refunded.get(&wk) {
                            Some(r) => *r,
                            None => match self
                                .shared
                                .tree
                                .get(scoped_key(P_REFUNDED, client, withdrawal.as_str()))
                                .map_err(io_err)?
                            {
                                None => 0,
                                Some(v) => {
                                    u64::from_be_bytes(v.as_ref().try_into().map_err(|_| {
                                        self.shared
                                            .corrupt(DecodeError::new("refunded total", "length"))
                                    })?)
                                }
                            },
                        };
                        Some(WithdrawalView {
                            account,
                            currency,
                            amount,
                            refunded,
                        })
                    }
                    _ => None,
                };
                Inputs {
                    account: view.as_ref().and_then(|w| account_view(&w.account)),
                    withdrawal: view,
                }
            }
        })
    }

    /// Writes the staged batch with one atomic `apply_batch` and hands it to the syncer.
    fn apply(&mut self, staged: Staged, stats: &mut Stats, to_syncer: &Sender<Applied>) {
        if staged.answers.is_empty() {
            return;
        }
        stats.observed = self.shared.observed();
        let Staged {
            mut batch,
            accounts,
            answers,
            ..
        } = staged;
        batch.insert(STATS_KEY, encode(&*stats));
        let failed = self.shared.failed.lock().clone();
        crash_point!("commit.before_apply");
        let error = match failed {
            Some(reason) => Some(LedgerError::Unavailable(reason)),
            None => self
                .shared
                .tree
                .apply_batch(batch)
                .err()
                .map(|e| self.shared.fail(e.to_string())),
        };
        crash_point!("commit.after_apply");
        if error.is_some() {
            // The working state stays as it was before this batch.
            *stats = self.stats.clone();
        } else {
            for (account, per) in &accounts {
                self.balances.accounts.insert(account.clone(), per.clone());
            }
            self.stats = stats.clone();
            if answers.iter().any(|a| matches!(a, Pending::Command { .. })) {
                self.shared.metrics.lock().applies += 1;
            }
        }
        let applied = Applied {
            answers,
            accounts,
            stats: stats.clone(),
            error,
        };
        if let Err(crossbeam_channel::SendError(applied)) = to_syncer.send(applied) {
            answer_all(&self.shared, applied.answers, &LedgerError::Closed);
        }
    }

    /// Stages the expiry of keys whose answers are older than the retention.
    fn sweep(&mut self, staged: &mut Staged, stats: &mut Stats) -> Result<usize> {
        if let Some(reason) = self.shared.failed.lock().clone() {
            return Err(LedgerError::Unavailable(reason));
        }
        let now = self.shared.config.clock.now();
        let horizon = now.saturating_sub_ms(duration_ms(self.shared.config.retention));
        let mut expired = 0usize;
        let mut cursor = stats.sweep_cursor;
        let range = fact_key(cursor + 1)..=fact_key(stats.last_seq);
        for item in self.shared.tree.range(range).take(10_000) {
            let (k, v) = item.map_err(io_err)?;
            let seq = seq_of(&k)
                .ok_or_else(|| self.shared.corrupt(DecodeError::new("log key", "length")))?;
            let fact = Fact::decode(seq, &v).map_err(|e| self.shared.corrupt(e))?;
            // Facts are recorded with non-decreasing time, so the first one inside the
            // retention ends the sweep.
            if fact.at > horizon {
                break;
            }
            let kk = scoped_key(P_KEY, &fact.client, fact.key.as_str());
            if let Some(bytes) = self.shared.tree.get(&kk).map_err(io_err)? {
                let mut rec = KeyRecord::decode(&bytes).map_err(|e| self.shared.corrupt(e))?;
                if !rec.expired {
                    rec.expired = true;
                    staged.batch.insert(kk, rec.encode());
                    stats.expire_one();
                    expired += 1;
                }
            }
            cursor = seq;
        }
        stats.sweep_cursor = cursor;
        Ok(expired)
    }
}

/// The syncer's loop: one flush and one fdatasync for every batch applied since the last.
fn sync_loop(shared: &Shared, rx: &Receiver<Applied>, free: &Sender<()>) {
    loop {
        if rx.is_empty() {
            // Full already means the decider has not used the last token yet.
            let _ = free.try_send(());
        }
        let Ok(first) = rx.recv() else {
            break;
        };
        let mut group = vec![first];
        while let Ok(more) = rx.try_recv() {
            group.push(more);
        }
        let failed = shared.failed.lock().clone();
        let synced = match failed {
            Some(reason) => Err(LedgerError::Unavailable(reason)),
            None => {
                crash_point!("sync.before_flush");
                // Flushed: the decider may apply the next batch now, overlapping our
                // fdatasync and the answering (sled's flush and apply exclude each other).
                let synced = durable_then(shared, || {
                    let _ = free.try_send(());
                })
                .map_err(|e| shared.fail(e.to_string()));
                crash_point!("sync.after_flush");
                synced
            }
        };
        // A "batch" in the metrics is what one sync made durable.
        let commands = group
            .iter()
            .flat_map(|a| &a.answers)
            .filter(|a| matches!(a, Pending::Command { .. }))
            .count();
        if commands > 0 && synced.is_ok() {
            let size = u64::try_from(commands).unwrap_or(u64::MAX);
            let mut m = shared.metrics.lock();
            m.batches += 1;
            m.commands += size;
            m.batch_size_max = m.batch_size_max.max(size);
            m.last_batch_size = size;
        }
        for mut applied in group {
            let error = match (&synced, applied.error.take()) {
                (_, Some(e)) => Some(e),
                (Err(e), None) => Some(e.clone()),
                (Ok(()), None) => None,
            };
            match error {
                Some(e) => answer_all(shared, applied.answers, &e),
                None => publish(shared, applied),
            }
        }
    }
}

/// Makes a durable batch visible to readers, then answers it.
fn publish(shared: &Shared, applied: Applied) {
    {
        let mut state = shared.state.write();
        for (account, per) in applied.accounts {
            state.balances.accounts.insert(account, per);
        }
        state.stats = applied.stats;
        shared
            .durable_seq
            .store(state.stats.last_seq, Ordering::Release);
    }
    let now = Instant::now();
    for answer in applied.answers {
        match answer {
            Pending::Command {
                ck,
                token,
                fingerprint,
                reply,
                answer,
                arrived,
            } => {
                let us = u64::try_from(now.duration_since(arrived).as_micros()).unwrap_or(u64::MAX);
                {
                    let mut m = shared.metrics.lock();
                    let i = LATENCY_BUCKETS_US
                        .iter()
                        .position(|b| us <= *b)
                        .unwrap_or(LATENCY_BUCKETS_US.len() - 1);
                    m.latency_buckets[i] += 1;
                    m.latency_sum_us = m.latency_sum_us.saturating_add(us);
                }
                // Release before answering: a retry that follows the answer must find the
                // key done, not pending.
                {
                    let mut shard = shared.shard(&ck).lock();
                    if let Submission::Executed(outcome) | Submission::Replayed(outcome) = &answer {
                        shard.remember(&ck, fingerprint, outcome);
                    }
                    if shard.claims.get(&ck).is_some_and(|c| c.token == token) {
                        shard.claims.remove(&ck);
                    }
                }
                reply(Ok(answer));
            }
            Pending::Quarantine { reply, id } => reply(Ok(id)),
            Pending::Sweep { reply, expired } => reply(Ok(expired)),
            Pending::Barrier(tx) => {
                let _ = tx.send(());
            }
        }
    }
}

fn answer_all(shared: &Shared, answers: Vec<Pending>, e: &LedgerError) {
    for answer in answers {
        match answer {
            Pending::Command {
                ck, token, reply, ..
            } => {
                shared.release(&ck, token);
                reply(Err(e.clone()));
            }
            Pending::Quarantine { reply, .. } => reply(Err(e.clone())),
            Pending::Sweep { reply, .. } => reply(Err(e.clone())),
            Pending::Barrier(tx) => {
                let _ = tx.send(());
            }
        }
    }
}

fn inbox_key(message_id: &MessageId) -> Vec<u8> {
    let mut k = vec![P_INBOX];
    k.extend_from_slice(message_id.as_str().as_bytes());
    k
}
