//! The sled store: the only module that touches sled. One committer owns every write: it
//! gathers concurrent commands into one group, decides each with the pure core, writes the
//! group to the journal with one write and one fdatasync, applies it to sled's memory, and
//! only then answers. See ARCHITECTURE.md.
//!
//! - [`committer`]: the decider thread (deciding and staging groups), the syncer thread
//!   (journal, sled, publishing, answering), and the leader path that does both on a
//!   blocking caller's thread when they are idle.
//! - [`journal`]: the journal's record format, appends, checkpoints and recovery.
//! - [`keys`]: claims of keys in flight, the answers cache, and key listings.
//! - [`records`]: the layout of the records in sled's tree.
//! - [`statements`]: each user account's movements in order, for its statement.
//! - [`verify`]: the online verify, while commits go on.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use crossbeam_channel::Sender;
use parking_lot::{Mutex, RwLock};

use crate::clock::{Clock, SystemClock};
use crate::core::{self, Seen};
use crate::domain::{Account, ClientId, Command, Currency, Fingerprint, Key, MessageId, Timestamp};
use crate::fact::{DecodeError, Fact, Outcome};
use crate::memory::{self, Limit, MemoryUse, balances_use, use_of};
use crate::projection::{Balances, Observed, Stats};
use crate::store::verify::VerifyReport;
use crate::store::{
    AsOf, BalanceAt, CommitMetrics, KeyInfo, KeyPage, KeyQuery, LedgerError, OpenReport,
    Quarantined, Rules, Store, Submission,
};

// ---- crash points --------------------------------------------------------------------

/// A named point at a commit boundary where a test can make the process die, to check that
/// what was in flight there is all there or not there at all after reopening. With the
/// `failpoints` feature a point is armed by `fail::cfg(name, "3*off->return")` (die at the
/// fourth pass); without it the macro is nothing. The points, in a commit's order:
/// `journal.before_write` (sealed, nothing written), `journal.after_write` (written, not
/// synced), `journal.after_sync` (durable in the journal, not in sled), `sync.after_apply`
/// (in sled's memory, nobody told); in a compaction, with its base durable,
/// `compact.before_delete` and `compact.after_delete`; and in a rebuild of the index,
/// `rebuild.after_groups`.
macro_rules! crash_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        if fail::eval($name, |_| ()).is_some() {
            std::process::abort();
        }
    };
}

mod blocking;
mod committer;
// Public but hidden, as the journal: the deterministic simulation drives the decider over
// an index in memory.
#[doc(hidden)]
pub mod decider;
#[doc(hidden)]
pub mod index;
#[doc(hidden)]
pub mod readback;
// Public but hidden: the journal's format and recovery are the store's internals, reached
// from outside only by its tests and benchmarks.
#[doc(hidden)]
pub mod journal;
mod keys;
mod log;
mod rebuild;
mod records;
mod statements;
mod verify;

pub use blocking::Blocking;
use committer::{Committer, Lead, Queued, Request, Syncer};
use journal::JournalOptions;
use keys::{ACTIVITY_PER_SHARD, ANSWERS_PER_SHARD, Claim, Released, SHARDS, Shard};
use records::{
    GROUP_KEY, Held, KeyRecord, P_ACCOUNT, P_KEY, STATS_KEY, decode, decode_balance, io_err,
    scoped_key,
};

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// The journal's folder inside the ledger's.
pub const JOURNAL_DIR: &str = "journal";

/// How a ledger is opened.
#[derive(Debug, Clone)]
pub struct SledConfig {
    pub path: PathBuf,
    /// sled's page cache; its own default is 1 GiB, far more than a ledger needs.
    pub cache_capacity_bytes: u64,
    /// How long a done key keeps its stored response.
    pub retention: Duration,
    /// How long a claim on a key holds before another attempt may take it over.
    pub lease: Duration,
    /// Sync the journal on every group, and sled's data file at every checkpoint (see
    /// ARCHITECTURE.md, durability). Off only for tests and benchmarks that measure
    /// everything but the disk.
    pub fsync: bool,
    /// The most commands one group takes. Staging waits for a busy syncer only until this
    /// many.
    pub batch_max: usize,
    /// How the journal is written: segment size, sync call, preallocation.
    pub journal: JournalOptions,
    /// A checkpoint (sled flushed, the journal's older segments deleted) is taken once this
    /// many journal bytes were written since the last one began...
    pub checkpoint_bytes: u64,
    /// ...or once this much time passed with something written.
    pub checkpoint_interval: Duration,
    /// A checkpoint also compacts the journal (writes a new base of the index and deletes
    /// the segments below it) once the segments it would delete hold this many bytes, and
    /// at least as many as the last base: the journal then stays within about twice the
    /// index's size, and each byte of the index is rewritten at most once per byte of
    /// journal written.
    pub compact_bytes: u64,
    /// Told a line at each step of a rebuild of the index and of a base written at open,
    /// both of which can take a while on a large ledger.
    pub progress: Progress,
    /// `verify` reads the key records and statement entries on a second thread while it
    /// folds the log. On two cores both threads compete with the committer, so a serving
    /// ledger runs both at the lowest priority (nice 19): they take only the CPU the
    /// committer leaves. The offline `verify` command, with nothing else to serve, sets
    /// this to false and reads at full priority, folding on the calling thread.
    pub verify_yields: bool,
    /// How long an arrival that meets its twin in flight (a live claim of the same
    /// command, or any claim for a message) waits for the twin's durable answer before it
    /// answers `InProgress`: the twin usually commits within milliseconds, so its retry
    /// gets the replay instead of a 409. Zero: no wait.
    pub in_flight_wait: Duration,
    pub clock: Arc<dyn Clock>,
}

impl SledConfig {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            cache_capacity_bytes: 64 * 1024 * 1024,
            retention: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(10),
            fsync: true,
            batch_max: 2048,
            journal: JournalOptions {
                segment_size: 16 * 1024 * 1024,
                ..JournalOptions::default()
            },
            checkpoint_bytes: 8 * 1024 * 1024,
            checkpoint_interval: Duration::from_secs(2),
            compact_bytes: 64 * 1024 * 1024,
            progress: Progress::default(),
            verify_yields: true,
            in_flight_wait: Duration::from_millis(20),
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
    pub fn in_flight_wait(mut self, wait: Duration) -> Self {
        self.in_flight_wait = wait;
        self
    }
}

/// Where a long step of opening reports its progress (nowhere by default).
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<Say>>);

/// What [`Progress`] calls with each line.
type Say = dyn Fn(&str) + Send + Sync;

impl Progress {
    pub fn new(say: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(say)))
    }

    pub(crate) fn say(&self, line: &str) {
        if let Some(say) = &self.0 {
            say(line);
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Progress(..)"
        } else {
            "Progress(none)"
        })
    }
}

/// sled's settings for a ledger's index.
fn sled_config(config: &SledConfig) -> sled::Config {
    sled::Config::new()
        .path(&config.path)
        .cache_capacity(config.cache_capacity_bytes)
        .mode(sled::Mode::HighThroughput)
        // Durability is the journal's: sled's buffers reach the disk when they fill and at
        // checkpoints, never on a timer of sled's own that would compete with the journal's
        // syncs.
        .flush_every_ms(None)
}

/// What reads sled opened as, with its checks passed.
struct Index {
    db: sled::Db,
    tree: sled::Tree,
    journal: journal::Journal,
    replayed_groups: u64,
    checkpoint_at_open: u64,
    stats: Option<Stats>,
    last_fact: Option<Fact>,
    balances: Balances,
}

/// Opens sled and replays the journal into it. An error that says sled's files cannot be
/// trusted (sled refuses them or panics on them, or they disagree with the journal) comes
/// back as `Err((e, true))`: the index can be rebuilt from the journal; any other (the
/// journal damaged in its middle, the folder locked, a failing disk) as `Err((e, false))`.
fn open_index(
    config: &SledConfig,
    shown: &str,
    released: &mut LockReleased,
) -> std::result::Result<Index, (LedgerError, bool)> {
    // sled 0.34 panics on some damage (a torn write of its log between two checkpoints):
    // that is a damaged index like any other, not a reason for the worker to die.
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let db = sled_config(config).open()?;
        let tree = db.open_tree("ledger")?;
        Ok::<_, sled::Error>((db, tree))
    }));
    let (db, tree) = match opened {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => return Err(heal(open_err(shown, e))),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            return Err((
                LedgerError::Corrupt {
                    path: shown.to_owned(),
                    detail: format!("sled panicked while opening: {what}"),
                },
                true,
            ));
        }
    };
    released.data_file = Some(config.path.join("db"));
    // An index with nothing in it beside a journal with a base is an index lost (its files
    // removed, or a backup of the journal alone): replaying the groups after its (absent)
    // checkpoint would miss the base's records.
    if tree.is_empty() && rebuild::log_is_complete(&config.path).map_err(|e| (e, false))? {
        return Err((
            LedgerError::Corrupt {
                path: shown.to_owned(),
                detail: "the index is empty, and the journal holds the ledger".into(),
            },
            true,
        ));
    }
    let (journal, replayed_groups, checkpoint_at_open) = replay_journal(&tree, config, shown)?;
    // sled writes its `conf` when it creates the folder's files and never syncs it (nor the
    // folder): without it, sled refuses the folder after a power loss, and an open would
    // then rebuild the index for nothing.
    if config.fsync {
        std::fs::File::open(config.path.join("conf"))
            .and_then(|f| f.sync_all())
            .map_err(|e| {
                (
                    LedgerError::Unavailable(format!("syncing sled's conf: {e}")),
                    false,
                )
            })?;
        rebuild::sync_dir(&config.path).map_err(|e| (e, false))?;
    }
    if replayed_groups > 0 {
        // The last stop was not clean: sled's unsynced writes may have reached its files in
        // part or out of order, and sled reads most of its pages only when asked for them.
        // Every record is read once (about a second a million facts) so that damage is met
        // here, where a rebuild heals it, and not by a reader later.
        read_every_record(&tree, shown)?;
    }
    let (stats, last_fact) = check_tail(&tree, shown).map_err(heal)?;
    if stats.is_some() {
        statements::complete(&db, &tree, shown).map_err(heal)?;
    }
    let balances = load_balances(&tree, shown).map_err(heal)?;
    Ok(Index {
        balances,
        db,
        tree,
        journal,
        replayed_groups,
        checkpoint_at_open,
        stats,
        last_fact,
    })
}

/// Reads every record of the index, so that sled checks each page it holds: its error,
/// or its panic, says the index is damaged.
fn read_every_record(
    tree: &sled::Tree,
    shown: &str,
) -> std::result::Result<(), (LedgerError, bool)> {
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for item in tree.iter() {
            item?;
        }
        Ok::<_, sled::Error>(())
    }));
    match read {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(heal(open_err(shown, e))),
        Err(_) => Err((
            LedgerError::Corrupt {
                path: shown.to_owned(),
                detail: "sled panicked while reading its records".into(),
            },
            true,
        )),
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
    config: SledConfig,
    rules: Rules,
    shards: Vec<Mutex<Shard>>,
    state: RwLock<State>,
    durable_seq: AtomicU64,
    /// The last journal group applied to sled (in sled's memory): set by the syncer, read
    /// by the decider to forget what sled now answers for, and by checkpoints.
    applied_group: AtomicU64,
    /// The last group sled held durably when the ledger was opened (its `v.journal`).
    checkpoint_at_open: u64,
    next_token: AtomicU64,
    replayed: AtomicU64,
    conflicts_in_flight: AtomicU64,
    conflicts_reused: AtomicU64,
    /// The committer's statement runs (`committer::TAILS_MAX`): how many, and their
    /// estimated bytes, for the memory metrics.
    tails: AtomicU64,
    tails_bytes: AtomicU64,
    /// Balances and stats applied groups left that sled takes at the next checkpoint.
    deferred: Mutex<committer::Deferred>,
    /// Set on the first storage failure: from then on nothing is written until reopened,
    /// because the journal may hold a group whose sync failed, or sled may lack one the
    /// journal holds.
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
        if let Some(folder) = self.data_file.as_deref().and_then(Path::parent) {
            wait_until_released(folder);
            // sled renames its snapshot into place as it closes and never syncs the folder.
            // The journal needs none of sled's files, so this is for a quicker next open
            // only: best effort.
            let _ = rebuild::sync_dir(folder);
        }
    }
}

/// Waits until sled's lock on the ledger folder `path` is free, for at most 10 s. Bounded,
/// so that a stuck sled thread cannot hang the caller: a reopen after the deadline answers
/// `Locked`, which says what is wrong. Anything that drops a raw sled handle on a ledger
/// folder and reopens it in the same process (a test that tampers with the tree) needs
/// this wait too.
#[doc(hidden)]
pub fn wait_until_released(path: &Path) {
    use fs2::FileExt as _;
    let Ok(file) = File::open(path.join("db")) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while file.try_lock_exclusive().is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Closing `file` releases the lock if it was taken.
}

/// Keeps the committer paused while alive.
#[derive(Debug)]
pub struct PauseGuard {
    _tx: Sender<()>,
}

/// Called exactly once with the answer, from the committer thread (keep it short) or
/// from the submitting thread when no write is needed.
pub type Reply = Box<dyn FnOnce(Result<Submission>) + Send>;

/// A handle to an open ledger. Cheap to clone; the committer stops on [`Store::shutdown`]
/// or when the last handle is dropped.
#[derive(Clone)]
pub struct SledStore {
    shared: Arc<Shared>,
    tx: Sender<Request>,
    /// The committer's state, for a blocking caller that finds it idle and leads.
    lead: Arc<Lead>,
    committer: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.shared.path)
            .finish()
    }
}

impl SledStore {
    /// Opens (or creates) the ledger at `config.path`: recovers sled, checks the log tail
    /// against the projections, and refuses to start on any disagreement. Never deletes.
    pub fn open(config: SledConfig) -> Result<(SledStore, OpenReport)> {
        let started = Instant::now();
        let path = config.path.clone();
        let shown = path.display().to_string();
        rebuild::ensure_folder(&path)?;
        let mut rebuilt = None;
        if path.join(rebuild::REBUILDING).exists() {
            let began = std::fs::read_to_string(path.join(rebuild::REBUILDING)).unwrap_or_default();
            rebuilt = Some(rebuild::rebuild(
                &config,
                &format!("a rebuild of the index did not finish (it began because {began})"),
            )?);
        }
        // Dropped after `db`, also when opening fails below once sled has opened.
        let mut released = LockReleased { data_file: None };
        let index = match open_index(&config, &shown, &mut released) {
            Ok(index) => index,
            Err((e, true)) if rebuilt.is_none() && rebuild::log_is_complete(&path)? => {
                drop(released);
                wait_until_released(&path);
                let reason = match &e {
                    LedgerError::Corrupt { detail, .. } => detail.clone(),
                    other => other.to_string(),
                };
                rebuilt = Some(rebuild::rebuild(&config, &reason)?);
                released = LockReleased { data_file: None };
                open_index(&config, &shown, &mut released).map_err(|(e, _)| e)?
            }
            Err((e, _)) => return Err(e),
        };
        let Index {
            db,
            tree,
            journal,
            replayed_groups,
            checkpoint_at_open,
            stats,
            last_fact,
            balances,
        } = index;
        let fresh = stats.is_none();
        let stats = stats.unwrap_or_default();
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
            replayed_groups,
            rebuilt,
            open_ms: 0,
        };
        let next_group = journal.next_group();
        let observed = stats.observed;
        let shared = Arc::new(Shared {
            path,
            db,
            tree,
            data_file,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            durable_seq: AtomicU64::new(stats.last_seq),
            applied_group: AtomicU64::new(next_group - 1),
            checkpoint_at_open,
            next_token: AtomicU64::new(1),
            replayed: AtomicU64::new(observed.replayed),
            conflicts_in_flight: AtomicU64::new(observed.conflicts_in_flight),
            conflicts_reused: AtomicU64::new(observed.conflicts_reused),
            tails: AtomicU64::new(0),
            tails_bytes: AtomicU64::new(0),
            deferred: Mutex::new(committer::Deferred::default()),
            state: RwLock::new(State { balances, stats }),
            failed: Mutex::new(None),
            metrics: Mutex::new(CommitMetrics::default()),
            rules: Rules {
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
            let committer = Committer::new(shared.clone(), next_group);
            committer
                .write_new_ledger()
                .map_err(|e| open_err_l(&shown, e))?;
        }
        // The log of record starts at a base. A new ledger's is its first records; a
        // ledger last opened by a build that deleted old segments gets one of its whole
        // index now, once, before anything else is written.
        let base_bytes = match journal::list_bases(&shared.path.join(JOURNAL_DIR))?.pop() {
            Some((_, _, bytes)) => bytes,
            None => {
                if !fresh {
                    shared.config.progress.say(&format!(
                        "writing the journal's base from the index of {shown} (once)"
                    ));
                }
                rebuild::write_base(&shared.tree, &shared.path, next_group - 1)?
            }
        };
        {
            let mut m = shared.metrics.lock();
            m.journal_base_bytes = base_bytes;
            m.index_rebuilt = report.rebuilt.as_ref().map(ToString::to_string);
        }
        let mut report = report;
        report.open_ms = started.elapsed().as_millis();
        let (tx, rx) = crossbeam_channel::unbounded();
        let lead = Arc::new(Lead::new(
            Committer::new(shared.clone(), next_group),
            Syncer::new(&shared, journal),
        ));
        let committer_lead = lead.clone();
        let handle = std::thread::Builder::new()
            .name("idem-committer".into())
            .spawn(move || Committer::run(&committer_lead, rx))
            .map_err(|e| LedgerError::Unavailable(format!("starting the committer: {e}")))?;
        Ok((
            SledStore {
                shared,
                tx,
                lead,
                committer: Arc::new(Mutex::new(Some(handle))),
            },
            report,
        ))
    }

    /// Rebuilds the index of the ledger at `config.path` from its journal on demand, as an
    /// open does when it finds the index damaged: sled's files are moved aside into a
    /// `damaged-<time>` folder and a new index is built from the journal's base and every
    /// group after it. The ledger must not be open (`Locked` otherwise); a journal damaged
    /// in its middle, or one with no base, refuses and changes nothing.
    pub fn repair(config: &SledConfig) -> Result<crate::store::IndexRebuild> {
        if !config.path.join(JOURNAL_DIR).is_dir() {
            return Err(LedgerError::Unavailable(format!(
                "there is no ledger at {} (no journal folder)",
                config.path.display()
            )));
        }
        rebuild::rebuild(config, "a repair was asked for")
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    pub fn config(&self) -> &SledConfig {
        &self.shared.config
    }

    pub(crate) fn rules_ref(&self) -> &Rules {
        &self.shared.rules
    }

    /// Submits without waiting: `reply` is called once with the answer. One attempt: an
    /// arrival that meets a twin in flight is answered `InProgress` at once, without the
    /// bounded wait of [`Blocking::submit`] and [`Store::submit`].
    pub fn submit_with(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
        reply: Reply,
    ) {
        self.attempt(client, key, command, message, reply, Caller::ONCE);
    }

    /// One attempt at a submission: answered here when the key's claim or cache decides,
    /// else claimed and sent to the committer (or, for a blocking caller that finds the
    /// committer idle, committed on its own thread; for an async caller, gathered with
    /// the others of its burst). With `caller.wait`, an arrival that would be told
    /// `InProgress` because a twin holds the key is not answered: it gets back what it
    /// needs to wait for the twin's claim and try once more.
    fn attempt(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
        reply: Reply,
        caller: Caller,
    ) -> Attempt {
        let shared = &self.shared;
        if let Some(reason) = shared.failed.lock().clone() {
            reply(Err(LedgerError::Unavailable(reason)));
            return Attempt::Done;
        }
        let fingerprint = command.fingerprint();
        let now = shared.config.clock.now();
        let ck = (client.clone(), key.clone());
        let mut shard = shared.shard(&ck).lock();
        let answer = self.answer_at_once(&mut shard, &ck, fingerprint, message.is_some(), now);
        if caller.wait
            && !shared.config.in_flight_wait.is_zero()
            && matches!(answer, Some(Ok(Submission::InProgress { .. })))
            && let Some(claim) = shard.claims.get_mut(&ck)
        {
            let released = claim.released.get_or_insert_with(Default::default).clone();
            return Attempt::Twin(Twin {
                released,
                command,
                message,
                reply,
            });
        }
        match answer {
            Some(answer) => {
                count_answer(shared, &mut shard, &ck, &answer);
                drop(shard);
                reply(answer);
                Attempt::Done
            }
            None => {
                let token = shared.next_token.fetch_add(1, Ordering::Relaxed);
                let claim = Claim {
                    fingerprint,
                    token,
                    claimed_at: now,
                    command: command.clone(),
                    released: None,
                };
                // A claim whose lease ran out is taken over: its twins stop waiting.
                if let Some(old) = shard.claims.insert(ck, claim) {
                    old.wake();
                }
                drop(shard);
                let queued = Queued {
                    ck: (client.clone(), key.clone()),
                    command,
                    fingerprint,
                    token,
                    message,
                    arrived: Instant::now(),
                    reply,
                };
                self.send_command(queued, caller)
            }
        }
    }

    /// The answer an arrival gets without the committer, from the key's live claim or
    /// the answers cache; `None` when the committer must decide (and the arrival claims
    /// the key).
    fn answer_at_once(
        &self,
        shard: &mut Shard,
        ck: &(ClientId, Key),
        fingerprint: Fingerprint,
        message: bool,
        now: Timestamp,
    ) -> Option<Result<Submission>> {
        let shared = &self.shared;
        let live = shard.claims.get(ck).map(|claim| {
            let ends = claim
                .claimed_at
                .saturating_add_ms(duration_ms(shared.config.lease));
            (claim.fingerprint, ends)
        });
        // What the key durably holds answers a repeat of its own command (a replay) and
        // refuses another (reused). A message is never decided here: its id must reach the
        // committer, to be checked against the inbox before its key and recorded with its
        // answer.
        match live {
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
                Some(if message {
                    Ok(in_flight)
                } else {
                    match shared.held(shard, ck) {
                        Err(e) => Err(e),
                        Ok(Some((stored, held))) if stored == fingerprint => match held {
                            Held::Cached(_) | Held::Logged(_) => {
                                shared.replay(shard, ck, stored, held)
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
            None if !message => match shard.answers.get(ck).cloned() {
                None => None,
                Some((stored, _)) if core::classify(Some(stored), fingerprint) == Seen::Reused => {
                    Some(Ok(Submission::Reused))
                }
                Some((_, outcome)) => Some(Ok(Submission::Replayed(outcome))),
            },
            None => None,
        }
    }

    /// Queues a claimed command for the committer; a stopped committer answers `Closed`.
    /// With `caller.lead`, a caller that may block commits it itself when the committer is
    /// idle; with `caller.gather`, an async caller's command waits with the others of its
    /// burst, and the first of them is told to hand them over ([`SledStore::hand_over`]).
    fn send_command(&self, queued: Queued, caller: Caller) -> Attempt {
        if caller.gather {
            return if self.lead.gather(queued) {
                Attempt::HandOver
            } else {
                Attempt::Done
            };
        }
        let queued = if caller.lead {
            match self.lead.try_lead(queued) {
                None => return Attempt::Done,
                Some(queued) => queued,
            }
        } else {
            queued
        };
        if let Some(Request::Command(queued)) = self.send(Request::Command(queued)) {
            self.closed(queued);
        }
        Attempt::Done
    }

    /// Answers a command the stopped committer will never take.
    fn closed(&self, queued: Queued) {
        self.shared.release(&queued.ck, queued.token);
        (queued.reply)(Err(LedgerError::Closed));
    }

    /// Hands the commands gathered from async callers to the decider as one request, once
    /// the runtime thread of the first of them has run the other tasks that were ready:
    /// a yield lets it, and tokio resumes a yielded task only when its thread has no other
    /// task to run and has polled for I/O once more. So the requests of a burst read in
    /// one wake are gathered without waiting for any time. Handed over also when this
    /// future is dropped meanwhile (its caller went away), so no command is left behind.
    async fn hand_over(&self) {
        struct OnDrop<'a>(&'a SledStore);
        impl Drop for OnDrop<'_> {
            fn drop(&mut self) {
                let store = self.0;
                let commands = store.lead.gathered();
                if commands.is_empty() {
                    return;
                }
                if let Some(Request::Commands(unsent)) = store.send(Request::Commands(commands)) {
                    unsent.into_iter().for_each(|queued| store.closed(queued));
                }
            }
        }
        let _hand_over = OnDrop(self);
        tokio::task::yield_now().await;
    }

    /// Queues a request for the committer. If it has stopped, the request (and its reply)
    /// is dropped, which its waiter reads as `Closed`.
    fn request(&self, request: Request) {
        let _ = self.send(request);
    }

    /// Sends to the decider, counted while queued: a leader never overtakes a request
    /// queued before it. Gives the request back when the committer has stopped.
    fn send(&self, request: Request) -> Option<Request> {
        let n = request.count();
        self.lead.sending(n);
        let crossbeam_channel::SendError(unsent) = self.tx.send(request).err()?;
        self.lead.unsent(n);
        Some(unsent)
    }

    /// Requests waiting for the committer (commands, and a pause not yet taken up): for
    /// tests that must know what is queued behind a pause rather than sleep on it.
    #[doc(hidden)]
    pub fn queued(&self) -> usize {
        self.lead.queued()
    }

    /// Whether the committer is idle as a leader would find it: nothing queued, and
    /// neither the decider nor the syncer busy. For tests that must know the syncer thread
    /// has parked rather than sleep on it.
    #[doc(hidden)]
    pub fn committer_idle(&self) -> bool {
        self.lead.idle()
    }

    /// Stops the committer after what was submitted before, until the guard is dropped:
    /// commands submitted meanwhile stay pending. For tests of in-flight duplicates and
    /// lease takeover, and for taking a consistent copy of the folder.
    pub fn pause(&self) -> PauseGuard {
        let (tx, rx) = crossbeam_channel::bounded(0);
        let _ = self.send(Request::Pause(rx));
        PauseGuard { _tx: tx }
    }

    /// Finishes and flushes everything submitted before, then stops the committer.
    /// Later submissions answer [`LedgerError::Closed`].
    fn close(&self) {
        let _ = self.send(Request::Shutdown);
        if let Some(handle) = self.committer.lock().take() {
            let _ = handle.join();
        }
    }

    // ---- reads ---------------------------------------------------------------------
}

impl Drop for SledStore {
    /// The last handle closes the ledger deterministically, so that the folder can be
    /// reopened as soon as the drop returns.
    fn drop(&mut self) {
        if Arc::strong_count(&self.committer) == 1 {
            self.close();
        }
    }
}

/// Opens the ledger's journal and replays into sled every group after the last checkpoint
/// (`v.journal`, the last group sled holds durably): after a crash sled may hold any part
/// of them, or none. Returns the journal, ready for the next group, how many groups were
/// replayed, and the checkpoint. A torn tail is cut off. Damage in the journal followed by
/// valid records refuses to open (`Err((e, false))`); a journal that does not continue
/// sled's checkpoint says sled is not to be trusted (`Err((e, true))`).
fn replay_journal(
    tree: &sled::Tree,
    config: &SledConfig,
    shown: &str,
) -> std::result::Result<(journal::Journal, u64, u64), (LedgerError, bool)> {
    let held = match tree.get(GROUP_KEY).map_err(|e| heal(open_err(shown, e)))? {
        None => 0,
        Some(v) => u64::from_be_bytes(v.as_ref().try_into().map_err(|_| {
            heal(LedgerError::Corrupt {
                path: shown.to_owned(),
                detail: "the journal group record has the wrong length".into(),
            })
        })?),
    };
    let mut options = config.journal.clone();
    if !config.fsync {
        options.sync = journal::SyncMode::Never;
    }
    let (journal, recovery) = journal::Journal::open(&config.path.join(JOURNAL_DIR), options, held)
        .map_err(|e| {
            let sled_is_wrong = matches!(e, journal::JournalError::Discontinuous { .. });
            (LedgerError::from(e), sled_is_wrong)
        })?;
    for group in &recovery.groups {
        group.apply(tree).map_err(|e| heal(open_err(shown, e)))?;
    }
    Ok((journal, recovery.groups.len() as u64, held))
}

/// An error met while opening the index, marked as one a rebuild from the journal heals
/// when it says sled's files are damaged.
fn heal(e: LedgerError) -> (LedgerError, bool) {
    let damaged = matches!(e, LedgerError::Corrupt { .. });
    (e, damaged)
}

/// Reads the stats record (`None`: a new ledger) and the log's last fact, and checks that
/// they agree with each other and with the fact's key record.
fn check_tail(tree: &sled::Tree, shown: &str) -> Result<(Option<Stats>, Option<Fact>)> {
    let corrupt = |detail: String| LedgerError::Corrupt {
        path: shown.to_owned(),
        detail,
    };
    let stats: Option<Stats> = match tree.get(STATS_KEY).map_err(|e| open_err(shown, e))? {
        None => None,
        Some(v) => Some(decode("stats", &v).map_err(|e| corrupt(e.to_string()))?),
    };
    let last_fact = log::last(tree)
        .map_err(|e| open_err(shown, e))?
        .map_err(|d| corrupt(d.error.to_string()))?
        .map(|e| e.decode())
        .transpose()
        .map_err(|e| corrupt(e.to_string()))?;
    let tail = last_fact.as_ref().map_or(0, |f| f.seq);
    let last_seq = stats.as_ref().map_or(0, |s| s.last_seq);
    if tail != last_seq {
        return Err(corrupt(format!(
            "the log ends at seq {tail} but the balances and key records were written at seq {last_seq}"
        )));
    }
    if let Some(fact) = &last_fact {
        let rec = tree
            .get(scoped_key(P_KEY, &fact.client, fact.key.as_str()))
            .map_err(|e| open_err(shown, e))?
            .ok_or_else(|| corrupt(format!("the last fact (seq {tail}) has no key record")))?;
        let rec = KeyRecord::decode(&rec).map_err(|e| corrupt(e.to_string()))?;
        if rec.seq != fact.seq {
            return Err(corrupt(format!(
                "the last fact (seq {tail}) and its key record (seq {}) disagree",
                rec.seq
            )));
        }
    }
    Ok((stats, last_fact))
}

/// Reads the stored balances and checks that they sum to zero per currency.
fn load_balances(tree: &sled::Tree, shown: &str) -> Result<Balances> {
    let corrupt = |detail: String| LedgerError::Corrupt {
        path: shown.to_owned(),
        detail,
    };
    let mut balances = Balances::default();
    for item in tree.scan_prefix([P_ACCOUNT]) {
        let (k, v) = item.map_err(|e| open_err(shown, e))?;
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
    Ok(balances)
}

/// Calls `start` with a reply callback and waits for the answer: the blocking face of
/// every callback-based entry point. A reply dropped unanswered (the committer stopped)
/// reads as `Closed`.
fn wait_for<T: Send + 'static>(start: impl FnOnce(Box<dyn FnOnce(Result<T>) + Send>)) -> Result<T> {
    // The standard channel, not crossbeam's: a caller waits a journal sync or two, and
    // crossbeam's receive calls `sched_yield` several times before it sleeps, which on two
    // cores hands the CPU to the other waiting callers instead of the committer's threads
    // (eight submitters' p99 measured lower with this one, BENCHMARKS.md).
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    start(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    rx.recv().unwrap_or(Err(LedgerError::Closed))
}

/// How a submission's caller may wait.
#[derive(Debug, Clone, Copy)]
struct Caller {
    /// Wait (up to the in-flight wait) for a twin in flight instead of answering
    /// `InProgress` at once.
    wait: bool,
    /// The caller is a thread that may block on the journal's sync, so it may commit its
    /// command itself when the committer is idle. Never an async task: the sync would
    /// hold its runtime's thread.
    lead: bool,
    /// The caller is an async task on a runtime: its command is gathered with the others
    /// of its burst, and the caller told to hand them over when it is the first.
    gather: bool,
}

impl Caller {
    /// One attempt from a callback.
    const ONCE: Caller = Caller {
        wait: false,
        lead: false,
        gather: false,
    };
}

/// What an attempt left its caller to do.
enum Attempt {
    /// Nothing: answered, or on its way to the committer.
    Done,
    /// Wait for the twin in flight, then try once more.
    Twin(Twin),
    /// Hand the gathered commands over: this one opened the gathering.
    HandOver,
}

/// An arrival that waits for its twin: what it needs to try once more.
struct Twin {
    released: Arc<Released>,
    command: Command,
    message: Option<MessageId>,
    reply: Reply,
}

/// Counts an answer given without the committer in the observed counters and the key's
/// activity.
fn count_answer(
    shared: &Shared,
    shard: &mut Shard,
    ck: &(ClientId, Key),
    answer: &Result<Submission>,
) {
    let counter = match answer {
        Ok(Submission::Replayed(_)) => &shared.replayed,
        Ok(Submission::Reused) => &shared.conflicts_reused,
        Ok(Submission::InProgress { .. }) => &shared.conflicts_in_flight,
        _ => return,
    };
    shard.note(ck, matches!(answer, Ok(Submission::Replayed(_))));
    counter.fetch_add(1, Ordering::Relaxed);
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
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
    /// The committer's statement runs, for [`Store::memory`]: how many, and the heap
    /// bytes of their values (their names are estimated at [`memory::NAME_BYTES`]).
    fn note_tails(&self, entries: usize, heap: u64) {
        self.tails.store(entries as u64, Ordering::Relaxed);
        self.tails_bytes.store(heap, Ordering::Relaxed);
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
        log::fact(&self.tree, seq)
            .map_err(io_err)?
            .map_err(|d| self.corrupt(d.error))
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

    /// An error met while deciding or sweeping: a storage failure under it (sled's own
    /// writer hit a full disk, say) leaves what sled holds unknown, so it stops the store's
    /// writes and turns `/healthz` as a failed journal sync does.
    fn failed_by(&self, e: LedgerError) -> LedgerError {
        match e {
            LedgerError::Unavailable(reason) => self.fail(reason),
            other => other,
        }
    }

    fn fail(&self, reason: String) -> LedgerError {
        let mut failed = self.failed.lock();
        if failed.is_none() {
            *failed = Some(reason.clone());
        }
        LedgerError::Unavailable(reason)
    }
}

/// Runs blocking sled work off the async threads when a runtime is there to take it.
async fn off_thread<T: Send + 'static>(
    ledger: &SledStore,
    f: impl FnOnce(&SledStore) -> Result<T> + Send + 'static,
) -> Result<T> {
    let ledger = ledger.clone();
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(move || f(&ledger))
            .await
            .unwrap_or(Err(LedgerError::Closed)),
        Err(_) => f(&ledger),
    }
}

#[async_trait]
impl Store for SledStore {
    fn kind(&self) -> &'static str {
        "sled"
    }
    fn location(&self) -> String {
        self.path().display().to_string()
    }
    fn rules(&self) -> &Rules {
        self.rules_ref()
    }

    async fn submit(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
    ) -> Result<Submission> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let reply: Reply = Box::new(move |r| {
            let _ = tx.send(r);
        });
        // A twin in flight is waited for on this task, never on a thread.
        let caller = Caller {
            wait: true,
            lead: false,
            gather: true,
        };
        let mut attempt = self.attempt(client, key, command, message, reply, caller);
        if let Attempt::Twin(twin) = attempt {
            twin.released.wait(self.shared.config.in_flight_wait).await;
            let again = Caller {
                wait: false,
                ..caller
            };
            attempt = self.attempt(client, key, twin.command, twin.message, twin.reply, again);
        }
        if let Attempt::HandOver = attempt {
            self.hand_over().await;
        }
        rx.await.unwrap_or(Err(LedgerError::Closed))
    }
    async fn quarantine(
        &self,
        message_id: Option<String>,
        reason: String,
        payload: Vec<u8>,
    ) -> Result<u64> {
        off_thread(self, move |l| {
            l.blocking().quarantine(message_id, reason, &payload)
        })
        .await
    }
    async fn quarantined(&self, after: u64, limit: usize) -> Result<Vec<Quarantined>> {
        self.blocking().quarantined(after, limit)
    }
    async fn quarantined_newest(&self, limit: usize) -> Result<Vec<Quarantined>> {
        self.blocking().quarantined_newest(limit)
    }
    async fn sweep(&self) -> Result<usize> {
        off_thread(self, |l| l.blocking().sweep()).await
    }
    async fn verify(&self) -> Result<VerifyReport> {
        off_thread(self, |l| l.blocking().verify()).await
    }
    async fn key(&self, client: &ClientId, key: &Key) -> Result<Option<KeyInfo>> {
        self.blocking().key(client, key)
    }
    async fn keys(&self, q: KeyQuery) -> Result<KeyPage> {
        let after = q.after.as_ref().map(|(c, k)| (c, k));
        self.blocking()
            .keys(q.status, q.client.as_ref(), after, q.limit)
    }
    async fn facts(&self, after: u64, limit: usize) -> Result<Vec<Fact>> {
        self.blocking().facts(after, limit)
    }
    async fn fact(&self, seq: u64) -> Result<Option<Fact>> {
        self.blocking().fact(seq)
    }
    async fn statement(&self, account: &Account, after: u64, limit: usize) -> Result<Vec<Fact>> {
        self.blocking().statement(account, after, limit)
    }
    async fn balance_at(&self, account: &Account, point: AsOf) -> Result<Option<BalanceAt>> {
        self.blocking().balance_at(account, point)
    }
    async fn balances(&self) -> Result<Balances> {
        Ok(self.blocking().balances())
    }
    async fn account(&self, account: &Account) -> Result<Option<BTreeMap<Currency, i128>>> {
        Ok(self.blocking().account(account))
    }
    async fn stats(&self) -> Result<Stats> {
        Ok(self.blocking().stats())
    }
    fn pending(&self) -> Vec<KeyInfo> {
        self.pending_keys()
    }
    fn durable_seq(&self) -> u64 {
        self.shared.durable_seq.load(Ordering::Acquire)
    }
    fn commit_metrics(&self) -> CommitMetrics {
        self.shared.metrics.lock().clone()
    }
    fn memory(&self) -> Vec<crate::memory::MemoryUse> {
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
        // A run: its account (name on the heap) and its value, of at most `RUN_BYTES`.
        let tail_slot = std::mem::size_of::<(Account, statements::Tail)>();
        let tails_max = decider::TAILS_MAX as u64;
        let tails_n = self.shared.tails.load(Ordering::Relaxed);
        let mut tails = use_of(
            "statement_tails",
            Limit::Entries(tails_max),
            Some(
                memory::at_limit(tails_max, tail_slot, 1)
                    + tails_max * memory::heap_str(statements::RUN_BYTES),
            ),
        );
        tails.entries = tails_n;
        tails.bytes = tails_n * (memory::slot(tail_slot) + memory::heap_str(memory::NAME_BYTES))
            + self.shared.tails_bytes.load(Ordering::Relaxed);
        let mut uses = vec![claims, answers, activity, balances];
        uses.extend(self.shared.deferred.lock().memory());
        uses.extend([tails, page_cache]);
        uses
    }
    async fn size_on_disk(&self) -> Result<u64> {
        self.blocking().size_on_disk()
    }
    fn failure(&self) -> Option<String> {
        self.shared.failed.lock().clone()
    }
    async fn shutdown(&self) {
        let _ = off_thread(self, |l| {
            l.close();
            Ok(())
        })
        .await;
    }
}
