//! What one open ledger holds for all its users (every handle, the committer's threads, the
//! checkpoint thread): sled's tree, the claims' shards, the published balances and stats,
//! the records left for the next checkpoint, the counters and the failure; and the reads
//! they all make of it (a fact, what a key holds). The committer and the handles sit above
//! it, the records and the shards below.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::domain::{Account, ClientId, Currency, Fingerprint, Key};
use crate::fact::{DecodeError, Fact, Outcome};
use crate::projection::{Balances, Observed, Stats};
use crate::store::{CommitMetrics, KeyInfo, KeyStatus, LedgerError, Rules, Submission};

use super::claims::{Claim, SHARDS, Shard};
use super::config::{SledConfig, duration_ms};
use super::error::Result;
use super::folder::LockReleased;
use super::journal::{Group, Op};
use super::log;
use super::records::{
    Held, KeyRecord, P_KEY, P_STATEMENT, STATS_KEY, account_key, encode, io_err, scoped_key,
};

/// One open ledger's state, shared by its handles and its threads.
pub(super) struct Shared {
    pub(super) path: PathBuf,
    pub(super) db: sled::Db,
    pub(super) tree: sled::Tree,
    pub(super) data_file: Option<File>,
    pub(super) config: SledConfig,
    pub(super) rules: Rules,
    pub(super) shards: Vec<Mutex<Shard>>,
    pub(super) state: RwLock<State>,
    pub(super) durable_seq: AtomicU64,
    /// The last journal group applied to sled (in sled's memory): set by the syncer, read
    /// by the decider to forget what sled now answers for, and by checkpoints.
    pub(super) applied_group: AtomicU64,
    /// The last group sled held durably when the ledger was opened (its `v.journal`).
    pub(super) checkpoint_at_open: u64,
    pub(super) next_token: AtomicU64,
    pub(super) replayed: AtomicU64,
    pub(super) conflicts_in_flight: AtomicU64,
    pub(super) conflicts_reused: AtomicU64,
    /// The committer's statement runs (`committer::TAILS_MAX`): how many, and their
    /// estimated bytes, for the memory metrics.
    pub(super) tails: AtomicU64,
    pub(super) tails_bytes: AtomicU64,
    /// Balances and stats applied groups left that sled takes at the next checkpoint.
    pub(super) deferred: Mutex<Deferred>,
    /// Set on the first storage failure: from then on nothing is written until reopened,
    /// because the journal may hold a group whose sync failed, or sled may lack one the
    /// journal holds.
    pub(super) failed: Mutex<Option<String>>,
    /// Commit latency and batch sizes, for the metrics.
    pub(super) metrics: Mutex<CommitMetrics>,
    /// Last, so that it drops after `db` and `tree`: see [`LockReleased`].
    pub(super) _released: LockReleased,
}

impl Shared {
    /// The committer's statement runs, for [`Store::memory`]: how many, and the heap
    /// bytes of their values (their names are estimated at [`memory::NAME_BYTES`]).
    pub(super) fn note_tails(&self, entries: usize, heap: u64) {
        self.tails.store(entries as u64, Ordering::Relaxed);
        self.tails_bytes.store(heap, Ordering::Relaxed);
    }

    pub(super) fn corrupt(&self, e: DecodeError) -> LedgerError {
        LedgerError::Corrupt {
            path: self.path.display().to_string(),
            detail: e.to_string(),
        }
    }

    pub(super) fn observed(&self) -> Observed {
        Observed {
            replayed: self.replayed.load(Ordering::Relaxed),
            conflicts_in_flight: self.conflicts_in_flight.load(Ordering::Relaxed),
            conflicts_reused: self.conflicts_reused.load(Ordering::Relaxed),
        }
    }

    pub(super) fn fact(&self, seq: u64) -> Result<Option<Fact>> {
        log::fact(&self.tree, seq)
            .map_err(io_err)?
            .map_err(|d| self.corrupt(d.error))
    }

    /// The key's answer, rendered from its fact.
    pub(super) fn stored_outcome(&self, seq: u64) -> Result<Outcome> {
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
    pub(super) fn failed_by(&self, e: LedgerError) -> LedgerError {
        match e {
            LedgerError::Unavailable(reason) => self.fail(reason),
            other => other,
        }
    }

    pub(super) fn fail(&self, reason: String) -> LedgerError {
        let mut failed = self.failed.lock();
        if failed.is_none() {
            *failed = Some(reason.clone());
        }
        LedgerError::Unavailable(reason)
    }

    pub(super) fn shard(&self, ck: &(ClientId, Key)) -> &Mutex<Shard> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        ck.hash(&mut h);
        let i = usize::try_from(h.finish() % SHARDS as u64).unwrap_or(0);
        &self.shards[i]
    }

    pub(super) fn release(&self, ck: &(ClientId, Key), token: u64) {
        self.shard(ck).lock().unclaim(ck, token);
    }

    /// What a done key holds, with its fingerprint; `None` for a key never done. The
    /// answer is rendered only when it is replayed.
    pub(super) fn held(
        &self,
        shard: &Shard,
        ck: &(ClientId, Key),
    ) -> Result<Option<(Fingerprint, Held)>> {
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
    pub(super) fn replay(
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

    pub(super) fn pending_info(
        &self,
        shard: &Shard,
        ck: &(ClientId, Key),
        claim: &Claim,
    ) -> KeyInfo {
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

    pub(super) fn key_info(&self, client: &ClientId, key: &Key, bytes: &[u8]) -> Result<KeyInfo> {
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

    /// Notes what an applied group left of the deferred records.
    pub(super) fn defer(
        &self,
        accounts: &HashMap<Account, BTreeMap<Currency, i128>>,
        stats: &Stats,
        group: &Group,
    ) {
        let mut d = self.deferred.lock();
        for (account, per) in accounts {
            d.balances.insert(account.clone(), per.clone());
        }
        d.stats = Some(stats.clone());
        for op in &group.ops {
            if let Op::Put { key, value } = op
                && key.first() == Some(&P_STATEMENT)
            {
                d.runs.insert(key.clone(), value.as_slice().into());
            }
        }
    }

    /// The deferred statement runs whose keys are in `range`, in key order. A reader takes
    /// them before it reads sled's: a run that leaves for sled in between is in sled by
    /// then, since [`Shared::write_deferred`] inserts it before letting go of the lock.
    pub(super) fn deferred_runs(
        &self,
        range: impl std::ops::RangeBounds<Vec<u8>>,
    ) -> Vec<(Vec<u8>, sled::IVec)> {
        let d = self.deferred.lock();
        d.runs
            .range(range)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Puts the deferred records into sled's memory: before a checkpoint flushes sled for
    /// the last applied group, and before a verify's step reads them.
    pub(super) fn write_deferred(&self) -> Result<()> {
        let mut d = self.deferred.lock();
        for (account, per) in std::mem::take(&mut d.balances) {
            for (currency, balance) in per {
                self.tree
                    .insert(account_key(&account, currency), &balance.to_be_bytes()[..])
                    .map_err(io_err)?;
            }
        }
        if let Some(stats) = d.stats.take() {
            self.tree
                .insert(STATS_KEY, encode(&stats))
                .map_err(io_err)?;
        }
        for (key, run) in std::mem::take(&mut d.runs) {
            self.tree.insert(key, run).map_err(io_err)?;
        }
        Ok(())
    }
}

/// What readers see: only what is durable.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) balances: Balances,
    pub(super) stats: Stats,
}

/// The balances, stats and statement runs that groups applied since sled last took them
/// left, kept out of sled's tree until a checkpoint (or a verify's step) needs them there.
/// Every group's journal record carries them as absolute values, so recovery replays them
/// with the rest. Readers take balances and stats from the published state, never from
/// sled, and read statement runs here before sled (`statements::merged`). Each group
/// touches its accounts' balance records, their last statement runs and the stats record:
/// left to the checkpoint, those are one insert per account every few seconds instead of
/// most of sled's inserts on the commit path, whose thread also syncs the journal.
#[derive(Default)]
pub(super) struct Deferred {
    pub(super) balances: HashMap<Account, BTreeMap<Currency, i128>>,
    pub(super) stats: Option<Stats>,
    /// Statement runs by their record's key, as the last group that extended each left it.
    pub(super) runs: BTreeMap<Vec<u8>, sled::IVec>,
}

impl Deferred {
    pub(super) fn memory(&self) -> Vec<crate::memory::MemoryUse> {
        let runs = self
            .runs
            .iter()
            .map(|(k, v)| {
                // A B-tree's entry takes its slot, about half again for the nodes' slack,
                // and the two heap buffers.
                let slot = std::mem::size_of::<(Vec<u8>, sled::IVec)>() as u64 * 3 / 2;
                slot + crate::memory::heap_str(k.len()) + crate::memory::heap_str(v.len())
            })
            .sum();
        vec![
            crate::memory::balances_use_of("deferred_balances", &self.balances),
            crate::memory::MemoryUse {
                structure: "deferred_runs",
                entries: self.runs.len() as u64,
                limit: crate::memory::Limit::Accounts,
                bytes: runs,
                bound_bytes: None,
            },
        ]
    }
}
