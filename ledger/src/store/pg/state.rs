//! `PgStore` and what it holds in this process (`Inner`: the pool, the lanes, the claims,
//! the counts), with the few helpers every facet uses: a connection, stored values read
//! back, the time of a new fact. The store's other `impl PgStore` blocks are its facets,
//! one file each (`open.rs`, `command.rs`, `group.rs`, `keys.rs`, `counters.rs`,
//! `quarantine.rs`, `balances.rs`, `verify.rs`); `mod.rs` implements `Store` on top.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};

use deadpool_postgres::Pool;
use parking_lot::Mutex;

use super::config::PgConfig;
use super::db::{Result, pool_err};
use super::lane::Lane;
use super::shards::{SHARDS, ShardSlots};
use crate::domain::{ClientId, Command, Currency, Fingerprint, Key, Timestamp};
use crate::fact::Fact;
use crate::projection::Observed;
use crate::store::{CommitMetrics, LedgerError, Rules};

/// A claim this process holds on a key while its transaction runs.
#[derive(Debug, Clone)]
pub(super) struct Claim {
    pub(super) fingerprint: Fingerprint,
    pub(super) token: u64,
    pub(super) since: Timestamp,
    pub(super) command: Command,
    /// Wakes the twins of this process that wait for this claim (see `submit_command`);
    /// set by the first such twin, so most claims cost no allocation.
    pub(super) released: Option<Arc<tokio::sync::Notify>>,
}

pub(super) struct Inner {
    pub(super) pool: Pool,
    /// Where commands queue for their group (see `group.rs`).
    pub(super) lanes: Vec<Lane>,
    pub(super) rules: Rules,
    pub(super) options: PgConfig,
    pub(super) location: String,
    pub(super) claims: Mutex<HashMap<(ClientId, Key), Claim>>,
    /// (replays, conflicts) per key seen by this process, bounded.
    pub(super) activity: Mutex<HashMap<(ClientId, Key), (u32, u32)>>,
    pub(super) in_flight: AtomicUsize,
    pub(super) idle: tokio::sync::Notify,
    pub(super) closed: AtomicBool,
    pub(super) durable_seq: AtomicU64,
    /// The latest fact time this process recorded or read, in ms: facts it records are
    /// never earlier (see the module docs for the limits of that across workers).
    pub(super) last_at: AtomicI64,
    pub(super) next_token: AtomicU64,
    pub(super) next_shard: AtomicU64,
    pub(super) shard_slots: ShardSlots,
    pub(super) replayed: AtomicU64,
    pub(super) conflicts_in_flight: AtomicU64,
    pub(super) conflicts_reused: AtomicU64,
    /// What of the three counts above is in the `counters` table already. Held while a
    /// flush writes and while a read adds the table to the unflushed rest, so that a read
    /// never counts a flush twice or not at all (a Prometheus counter must not go down).
    pub(super) observed_flushed: tokio::sync::Mutex<Observed>,
    pub(super) metrics: Mutex<CommitMetrics>,
}

/// The ledger on PostgreSQL. Cheap to clone; see the module docs.
#[derive(Clone)]
pub struct PgStore {
    pub(super) inner: Arc<Inner>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("location", &self.inner.location)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    pub fn options(&self) -> &PgConfig {
        &self.inner.options
    }

    pub(super) fn corrupt(&self, detail: String) -> LedgerError {
        LedgerError::Corrupt {
            path: self.inner.location.clone(),
            detail,
        }
    }

    pub(super) async fn conn(&self) -> Result<deadpool_postgres::Object> {
        self.inner.pool.get().await.map_err(pool_err)
    }

    pub(super) fn observe_seq(&self, seq: i64) {
        if let Ok(seq) = u64::try_from(seq) {
            self.inner.durable_seq.fetch_max(seq, Ordering::SeqCst);
        }
    }

    /// The time a new fact is recorded with: never earlier than one this process saw.
    pub(super) fn record_time(&self) -> Timestamp {
        let now = self.inner.rules.clock.now().millis();
        Timestamp(now.max(self.inner.last_at.load(Ordering::SeqCst)))
    }

    pub(super) fn next_shard(&self) -> i16 {
        let n = self.inner.next_shard.fetch_add(1, Ordering::Relaxed) % SHARDS;
        i16::try_from(n).unwrap_or(0)
    }

    pub(super) fn currency(&self, s: String) -> Result<Currency> {
        Currency::parse(&s).map_err(|_| self.corrupt(format!("a stored currency {s:?}")))
    }

    pub(super) fn number(&self, s: String) -> Result<u128> {
        s.parse()
            .map_err(|_| self.corrupt(format!("a stored balance {s:?}")))
    }

    pub(super) fn signed(&self, s: String) -> Result<i128> {
        s.parse()
            .map_err(|_| self.corrupt(format!("a stored balance {s:?}")))
    }

    pub(super) fn decode(&self, seq: i64, body: &[u8]) -> Result<Fact> {
        let seq = u64::try_from(seq).map_err(|_| self.corrupt(format!("seq {seq}")))?;
        Fact::decode(seq, body).map_err(|e| self.corrupt(e.to_string()))
    }
}
