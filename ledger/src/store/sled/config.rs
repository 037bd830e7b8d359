//! How a ledger is opened (`SledConfig`, with the `Progress` a long step reports to), and
//! sled's own settings made from it: the opening, the committer and a rebuild all read
//! them, so they sit below all three.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};

use super::journal::JournalOptions;

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
pub(super) fn sled_config(config: &SledConfig) -> sled::Config {
    sled::Config::new()
        .path(&config.path)
        .cache_capacity(config.cache_capacity_bytes)
        .mode(sled::Mode::HighThroughput)
        // Durability is the journal's: sled's buffers reach the disk when they fill and at
        // checkpoints, never on a timer of sled's own that would compete with the journal's
        // syncs.
        .flush_every_ms(None)
}

/// A duration of the config (the lease, the retention) in milliseconds, as timestamps count.
pub(super) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
