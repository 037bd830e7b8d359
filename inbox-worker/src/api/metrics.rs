//! What the worker counts beside the ledger: answers by code, open connections, recent
//! conflicts and per-second throughput; and the Prometheus text of `/metrics`.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use ledger::{CommitMetrics, Limit, MemoryUse, Rejection, Stats, Store};
use parking_lot::Mutex;
use serde_json::{Value, json};

/// How many recent conflicts the snapshot lists, newest first.
pub const CONFLICTS_MAX: usize = 50;
/// Seconds of throughput history the snapshot shows.
pub const THROUGHPUT_SECONDS: usize = 120;
/// Events the operator feed keeps for slow readers before they lag (and are told so).
pub const FEED_EVENTS: usize = 4096;

/// The worker's memory bound (docs/operations.md, "Memory") is the sum of these and of
/// each structure's own bound. The constants were measured on the release build with a
/// million keys at page caches of 1 to 256 MiB (BENCHMARKS.md, "Memory").
pub mod bound {
    /// Code, the runtime's threads, the allocator's reserve and sled's fixed buffers.
    pub const BASE_BYTES: u64 = 112 << 20;
    /// sled counts a cached page at its size on disk; in memory it takes up to this many
    /// times that.
    pub const PAGE_CACHE_FACTOR: u64 = 4;
    /// sled's page table and node overhead outside its cache, per key in the ledger.
    pub const INDEX_BYTES_PER_KEY: u64 = 48;
    /// What a running `verify` holds per fact: 64-bit digests of each fact's key and
    /// command, of each key record, of each withdrawal and its refunds, in tables sized
    /// for the ledger (the worker verifies every `--verify-every`).
    pub const VERIFY_BYTES_PER_FACT: u64 = 160;
    /// One open connection: hyper's buffers and its task (37 KiB measured with 3,100
    /// held connections).
    pub const CONNECTION_BYTES: u64 = 40 << 10;
    /// A feed event or a listed conflict: a small JSON object.
    pub const EVENT_BYTES: u64 = 1 << 10;
}

/// Why the listener closed a connection, as counted for `/metrics` (defined here so that
/// the counters need nothing from the listener).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Closed {
    HeaderTimeout = 1,
    BodyTimeout = 2,
    IdleTimeout = 3,
    WriteStalled = 4,
    Evicted = 5,
    Shutdown = 6,
}

impl Closed {
    pub const ALL: [Closed; 6] = [
        Closed::HeaderTimeout,
        Closed::BodyTimeout,
        Closed::IdleTimeout,
        Closed::WriteStalled,
        Closed::Evicted,
        Closed::Shutdown,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Closed::HeaderTimeout => "header_timeout",
            Closed::BodyTimeout => "body_timeout",
            Closed::IdleTimeout => "idle_timeout",
            Closed::WriteStalled => "write_stalled",
            Closed::Evicted => "evicted",
            Closed::Shutdown => "shutdown",
        }
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    /// HTTP answers by `code` (`applied`, `replayed`, `insufficient_funds`, ...).
    answers: Mutex<BTreeMap<&'static str, u64>>,
    pub open_connections: AtomicI64,
    pub connections_total: AtomicU64,
    /// Connections the listener closed, by reason (`Closed` as index, less one).
    closed: [AtomicU64; 6],
    conflicts: Mutex<VecDeque<Value>>,
    throughput: Mutex<VecDeque<Value>>,
    pub verify: Mutex<Option<Value>>,
    /// When this worker started serving: the counts kept in its memory begin here.
    pub started_at: ledger::Timestamp,
}

impl Metrics {
    pub fn new() -> Self {
        Self {
            conflicts: Mutex::new(VecDeque::with_capacity(CONFLICTS_MAX)),
            started_at: ledger::Timestamp(chrono::Utc::now().timestamp_millis()),
            ..Self::default()
        }
    }

    pub fn closed(&self, reason: Closed) {
        self.closed[reason as usize - 1].fetch_add(1, Ordering::Relaxed);
    }

    pub fn closed_count(&self, reason: Closed) -> u64 {
        self.closed[reason as usize - 1].load(Ordering::Relaxed)
    }

    pub fn answered(&self, code: &'static str) {
        *self.answers.lock().entry(code).or_insert(0) += 1;
    }

    pub fn conflict(&self, entry: Value) {
        let mut c = self.conflicts.lock();
        if c.len() >= CONFLICTS_MAX {
            c.pop_back();
        }
        c.push_front(entry);
    }

    pub fn conflicts(&self) -> Vec<Value> {
        self.conflicts.lock().iter().cloned().collect()
    }

    pub fn push_throughput(&self, entry: Value) {
        let mut t = self.throughput.lock();
        if t.len() >= THROUGHPUT_SECONDS {
            t.pop_front();
        }
        t.push_back(entry);
    }

    pub fn throughput(&self) -> Vec<Value> {
        self.throughput.lock().iter().cloned().collect()
    }

    /// The worker's own structures that grow with use, beside the store's: connections,
    /// the conflicts list, the throughput history and the feed's event buffer.
    pub fn memory(&self, max_connections: usize, feed_queued: usize) -> Vec<MemoryUse> {
        let open = u64::try_from(self.open_connections.load(Ordering::Relaxed)).unwrap_or(0);
        let list = |structure, entries: usize, max: usize, each: u64| MemoryUse {
            structure,
            entries: entries as u64,
            limit: Limit::Entries(max as u64),
            bytes: entries as u64 * each,
            bound_bytes: Some(max as u64 * each),
        };
        vec![
            list(
                "connections",
                usize::try_from(open).unwrap_or(usize::MAX),
                max_connections,
                bound::CONNECTION_BYTES,
            ),
            list(
                "conflicts",
                self.conflicts.lock().len(),
                CONFLICTS_MAX,
                bound::EVENT_BYTES,
            ),
            list(
                "throughput",
                self.throughput.lock().len(),
                THROUGHPUT_SECONDS,
                bound::EVENT_BYTES,
            ),
            list("feed_events", feed_queued, FEED_EVENTS, bound::EVENT_BYTES),
        ]
    }

    /// The Prometheus text exposition of the worker and its ledger; `own` is
    /// [`Metrics::memory`]'s answer.
    pub fn render(&self, stats: &Stats, ledger: &dyn Store, own: Vec<MemoryUse>) -> String {
        let mut text = Exposition(String::with_capacity(4096));
        write_commands(&mut text, stats, ledger);
        self.write_http(&mut text);
        write_commits(&mut text, &ledger.commit_metrics(), ledger.kind());
        text.metric(
            "idem_up",
            "1 while the ledger accepts writes, 0 after a storage failure.",
            "gauge",
            one(u64::from(ledger.failure().is_none())),
        );
        write_memory(&mut text, stats, ledger, own);
        text.0
    }

    /// This process's HTTP answers and connections.
    fn write_http(&self, text: &mut Exposition) {
        text.metric(
            "idem_http_answers_total",
            "HTTP answers of this process, by code.",
            "counter",
            self.answers
                .lock()
                .iter()
                .map(|(code, v)| (format!("{{code=\"{code}\"}}"), v.to_string()))
                .collect(),
        );
        text.metric(
            "idem_open_connections",
            "Open HTTP connections.",
            "gauge",
            vec![(
                String::new(),
                self.open_connections.load(Ordering::Relaxed).to_string(),
            )],
        );
        text.metric(
            "idem_connections_total",
            "HTTP connections accepted.",
            "counter",
            one(self.connections_total.load(Ordering::Relaxed)),
        );
        text.metric(
            "idem_connections_closed_total",
            "HTTP connections the worker closed, by reason: a phase's timeout, room for a \
             new client (evicted), or a stop.",
            "counter",
            Closed::ALL
                .iter()
                .map(|r| {
                    (
                        format!("{{reason=\"{}\"}}", r.label()),
                        self.closed_count(*r).to_string(),
                    )
                })
                .collect(),
        );
    }
}

/// Prometheus text being written: one metric at a time, its help and type first.
struct Exposition(String);

type Rows = Vec<(String, String)>;

impl Exposition {
    fn metric(&mut self, name: &str, help: &str, kind: &str, rows: Rows) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in rows {
            let _ = writeln!(self.0, "{name}{labels} {value}");
        }
    }
}

/// One unlabelled value.
fn one(v: u64) -> Rows {
    vec![(String::new(), v.to_string())]
}

/// The ledger's commands, repeats and keys.
fn write_commands(text: &mut Exposition, stats: &Stats, ledger: &dyn Store) {
    let names = ["deposit", "withdraw", "refund"];
    text.metric(
        "idem_commands_applied_total",
        "Applied commands (facts), by command, since the ledger was created.",
        "counter",
        names
            .iter()
            .zip(stats.applied)
            .map(|(n, v)| (format!("{{command=\"{n}\"}}"), v.to_string()))
            .collect(),
    );
    text.metric(
        "idem_commands_rejected_total",
        "Business rejections (422, stored under the key), by code.",
        "counter",
        stats
            .rejected_by_code()
            .into_iter()
            .map(|(r, v): (Rejection, u64)| (format!("{{code=\"{}\"}}", r.code()), v.to_string()))
            .collect(),
    );
    text.metric(
        "idem_replays_total",
        "Repeats answered with the stored outcome.",
        "counter",
        one(stats.observed.replayed),
    );
    text.metric(
        "idem_conflicts_total",
        "Repeats refused: in_flight (409) and reused (422 idempotency_key_reused).",
        "counter",
        vec![
            (
                "{kind=\"in_flight\"}".into(),
                stats.observed.conflicts_in_flight.to_string(),
            ),
            (
                "{kind=\"reused\"}".into(),
                stats.observed.conflicts_reused.to_string(),
            ),
        ],
    );
    text.metric(
        "idem_keys",
        "Keys by status.",
        "gauge",
        vec![
            (
                "{status=\"pending\"}".into(),
                ledger.pending().len().to_string(),
            ),
            ("{status=\"done\"}".into(), stats.keys_done.to_string()),
            (
                "{status=\"expired\"}".into(),
                stats.keys_expired.to_string(),
            ),
        ],
    );
    text.metric(
        "idem_keys_expired_total",
        "Keys whose stored response the sweeper has dropped.",
        "counter",
        one(stats.keys_expired),
    );
    text.metric(
        "idem_last_seq",
        "The sequence number of the last durable fact.",
        "gauge",
        one(ledger.durable_seq()),
    );
}

/// The committer: latency histogram and batches.
fn write_commits(text: &mut Exposition, commit: &CommitMetrics, kind: &str) {
    // The ledger's buckets are cumulative-free counts in microseconds; Prometheus
    // wants cumulative counts with upper bounds in seconds.
    let mut rows = Vec::new();
    let mut cumulative = 0u64;
    for (bound, n) in ledger::store::LATENCY_BUCKETS_US
        .iter()
        .zip(commit.latency_buckets)
    {
        cumulative += n;
        let le = if *bound == u64::MAX {
            "+Inf".to_owned()
        } else {
            format!("{}", Seconds(*bound))
        };
        rows.push((format!("_bucket{{le=\"{le}\"}}"), cumulative.to_string()));
    }
    rows.push(("_sum".into(), format!("{}", Seconds(commit.latency_sum_us))));
    rows.push(("_count".into(), cumulative.to_string()));
    text.metric(
        "idem_commit_latency_seconds",
        "From a command's arrival at the committer to its durable answer.",
        "histogram",
        rows,
    );
    text.metric(
        "idem_commit_batches_total",
        "Durable batches written (on sled one journal write and sync each, on PostgreSQL \
         one commit).",
        "counter",
        one(commit.batches),
    );
    text.metric(
        "idem_commit_commands_total",
        "Commands committed in batches; divided by batches, the mean batch size.",
        "counter",
        one(commit.commands),
    );
    text.metric(
        "idem_commit_applies_total",
        "Groups of staged commands written (on sled one journal record each, then \
         applied to sled); at most one per durable batch while the decider keeps up.",
        "counter",
        one(commit.applies),
    );
    if kind == "postgres" {
        text.metric(
            "idem_commit_pipelined_total",
            "Groups whose BEGIN and claim were sent behind the previous group's COMMIT on \
             one connection, in its round trip.",
            "counter",
            one(commit.pipelined),
        );
    }
    if kind == "sled" {
        text.metric(
            "idem_journal_bytes",
            "The sled store's journal: its segment files' size, preallocated space included.",
            "gauge",
            one(commit.journal_bytes),
        );
        text.metric(
            "idem_journal_segments",
            "The sled store's journal: segment files.",
            "gauge",
            one(commit.journal_segments),
        );
        text.metric(
            "idem_journal_base_bytes",
            "The sled store's journal: its base, the index as of one group, where the log of \
             record starts.",
            "gauge",
            one(commit.journal_base_bytes),
        );
        text.metric(
            "idem_checkpoints_total",
            "Checkpoints of the sled store: sled flushed and synced.",
            "counter",
            one(commit.checkpoints),
        );
        text.metric(
            "idem_compactions_total",
            "Compactions of the sled store's journal: a new base written, the segments below \
             it deleted.",
            "counter",
            one(commit.compactions),
        );
        text.metric(
            "idem_index_rebuilt",
            "1 when the sled store's index was found damaged at this start and rebuilt from \
             the journal (the damaged files kept aside).",
            "gauge",
            one(u64::from(commit.index_rebuilt.is_some())),
        );
    }
    text.metric(
        "idem_commit_batch_size_max",
        "The largest batch so far.",
        "gauge",
        one(commit.batch_size_max),
    );
    text.metric(
        "idem_commit_batch_size_last",
        "The size of the last batch.",
        "gauge",
        one(commit.last_batch_size),
    );
    text.metric(
        "idem_commit_batch_wait_seconds_total",
        "How long each batch's first command waited before its batch began (sled: its \
         sync; PostgreSQL: its group's transaction), summed over batches; divided by \
         batches, the mean wait.",
        "counter",
        vec![(
            String::new(),
            format!("{}", Seconds(commit.batch_wait_sum_us)),
        )],
    );
    text.metric(
        "idem_commit_batch_wait_seconds_max",
        "The longest wait of a batch's first command so far.",
        "gauge",
        vec![(
            String::new(),
            format!("{}", Seconds(commit.batch_wait_max_us)),
        )],
    );
}

/// Each structure that grows with use, and the bound of the whole.
fn write_memory(text: &mut Exposition, stats: &Stats, ledger: &dyn Store, own: Vec<MemoryUse>) {
    let mut uses = ledger.memory();
    uses.extend(own);
    let by = |f: &dyn Fn(&MemoryUse) -> Option<u64>| -> Vec<(String, String)> {
        uses.iter()
            .filter_map(|u| {
                Some((
                    format!("{{structure=\"{}\"}}", u.structure),
                    f(u)?.to_string(),
                ))
            })
            .collect()
    };
    text.metric(
        "idem_memory_entries",
        "Entries held by each in-memory structure that grows with use.",
        "gauge",
        by(&|u| (!matches!(u.limit, Limit::Bytes(_))).then_some(u.entries)),
    );
    text.metric(
        "idem_memory_entries_max",
        "The most entries a structure keeps; past it, it forgets.",
        "gauge",
        by(&|u| match u.limit {
            Limit::Entries(n) => Some(n),
            _ => None,
        }),
    );
    text.metric(
        "idem_memory_estimated_bytes",
        "Estimated bytes each structure holds now (the page cache: its setting).",
        "gauge",
        by(&|u| Some(u.bytes)),
    );
    text.metric(
        "idem_memory_bound_bytes",
        "What the worker's memory stays under at its settings, its keys and accounts \
         (docs/operations.md, \"Memory\").",
        "gauge",
        one(memory_bound(
            &uses,
            stats.keys_done + stats.keys_expired,
            stats.last_seq,
        )),
    );
    if let Some(rss) = resident_bytes() {
        text.metric(
            "idem_process_resident_bytes",
            "The worker's resident memory, as the kernel counts it.",
            "gauge",
            one(rss),
        );
    }
}

/// Microseconds shown as seconds, exactly (no float rounding).
struct Seconds(u64);

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (s, us) = (self.0 / 1_000_000, self.0 % 1_000_000);
        if us == 0 {
            write!(f, "{s}")
        } else {
            let frac = format!("{us:06}");
            write!(f, "{s}.{}", frac.trim_end_matches('0'))
        }
    }
}

/// Commit latency percentiles, estimated from the histogram as the bucket's upper bound.
pub fn commit_summary(ledger: &dyn Store) -> Value {
    let m = ledger.commit_metrics();
    let total: u64 = m.latency_buckets.iter().sum();
    let quantile = |q: f64| -> Value {
        if total == 0 {
            return Value::Null;
        }
        // Counts are far below 2^52, so the float is exact enough for a rank.
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let rank = ((total as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (bound, n) in ledger::store::LATENCY_BUCKETS_US
            .iter()
            .zip(m.latency_buckets)
        {
            seen += n;
            if seen >= rank.max(1) {
                let us = if *bound == u64::MAX {
                    1_000_000
                } else {
                    *bound
                };
                #[allow(clippy::cast_precision_loss)]
                return json!(us as f64 / 1000.0);
            }
        }
        Value::Null
    };
    #[allow(clippy::cast_precision_loss)]
    let avg = if m.batches == 0 {
        0.0
    } else {
        m.commands as f64 / m.batches as f64
    };
    json!({
        "p50_ms": quantile(0.5),
        "p99_ms": quantile(0.99),
        "batch_size_avg": avg,
        "batches": m.batches,
    })
}

/// The worker's memory bound: a base, the page cache at what it really takes in memory,
/// sled's index per key, a verify's digests per fact, every structure at its limit, and
/// what grows with accounts or requests in flight at its present size.
pub fn memory_bound(uses: &[MemoryUse], keys: u64, facts: u64) -> u64 {
    let mut total = bound::BASE_BYTES + facts * bound::VERIFY_BYTES_PER_FACT;
    let mut sled = false;
    for u in uses {
        total += match (u.limit, u.bound_bytes) {
            (Limit::Bytes(cache), _) => {
                sled = true;
                cache * bound::PAGE_CACHE_FACTOR
            }
            (_, Some(b)) => b,
            (_, None) => u.bytes,
        };
    }
    if sled {
        total += keys * bound::INDEX_BYTES_PER_KEY;
    }
    total
}

/// Resident set size from `/proc/self/status` (Linux); `None` elsewhere.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::Seconds;

    #[test]
    fn seconds_are_exact() {
        assert_eq!(Seconds(100).to_string(), "0.0001");
        assert_eq!(Seconds(2_500).to_string(), "0.0025");
        assert_eq!(Seconds(1_000_000).to_string(), "1");
        assert_eq!(Seconds(250_000).to_string(), "0.25");
    }
}
