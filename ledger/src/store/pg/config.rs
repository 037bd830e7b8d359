//! `PgConfig`: how a `PgStore` connects, groups commands and waits. A file of its own,
//! below the state that holds it (`state.rs`), so that no file of the store imports
//! `mod.rs`, which only re-exports it.

use std::time::Duration;

/// How a [`PgStore`](super::PgStore) connects, groups commands and waits.
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
