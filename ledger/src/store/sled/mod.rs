//! The sled store: the only module that touches sled. One committer owns every write: it
//! gathers concurrent commands into one group, decides each with the pure core, writes the
//! group to the journal with one write and one fdatasync, applies it to sled's memory, and
//! only then answers. See ARCHITECTURE.md.
//!
//! The files, top-down: each imports only files listed after it (`tests/it/architecture.rs`
//! checks that no import circle forms among them). A command's route is `mod.rs`, then
//! `submit.rs`, then `committer.rs` (the decider's thread, or a leader) and `decider.rs`,
//! and back in `committer.rs` the syncer, which appends the group to `journal.rs`.
//! - `mod.rs`: the facade: the `Store` impl and the public names.
//! - `open.rs`: SledStore's opening: sled, the journal's replay, the checks at open, a
//!   rebuild of a damaged index, the committer started.
//! - `keys.rs`: the key listings (`Blocking::key`, `Blocking::keys`, the pending keys).
//! - `blocking.rs`: SledStore's blocking face, `Blocking`, for callers with no runtime.
//! - `submit.rs`: SledStore's submit path: the claims, the answers cache, a twin's bounded
//!   wait, the hand-over to the committer.
//! - `handle.rs`: `SledStore` itself: the shared state, the committer's queue and thread.
//! - `committer.rs`: the decider thread (deciding and staging groups), the syncer thread
//!   (journal, sled, publishing, answering), the leader path that does both on a blocking
//!   caller's thread when they are idle, and the checkpoints.
//! - `rebuild.rs`: the index rebuilt from the journal; bases written from the index.
//! - `verify.rs`: the online verify, while commits go on.
//! - `decider.rs`: commands decided and groups sealed, with no I/O; `readback.rs`: the
//!   records decoded for the simulation.
//! - `statements.rs`: each user account's movements in order, for its statement.
//! - `shared.rs`: `Shared`, what one open ledger holds for its handles and threads.
//! - `claims.rs`: the claims of keys in flight, the answers cache, keys' activity.
//! - `log.rs` (the log's records), `index.rs` (the seam the decider reads), `folder.rs`
//!   (the ledger's folder: syncs, sled's lock, sled's flush), `config.rs` (`SledConfig`),
//!   `error.rs` (`Result`, sled's errors at open), `records.rs` (the records' layout in
//!   sled's tree), `journal.rs` (the journal's format, appends, checkpoints, recovery).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use async_trait::async_trait;

use crate::domain::{Account, ClientId, Command, Currency, Fingerprint, Key, MessageId};
use crate::fact::{Fact, Outcome};
use crate::memory::{self, Limit, MemoryUse, balances_use, use_of};
use crate::projection::{Balances, Stats};
use crate::store::verify::VerifyReport;
use crate::store::{
    AsOf, BalanceAt, CommitMetrics, KeyInfo, KeyPage, KeyQuery, LedgerError, Quarantined, Rules,
    Store, Submission,
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
mod claims;
mod committer;
mod config;
// Public but hidden, as the journal: the deterministic simulation drives the decider over
// an index in memory.
#[doc(hidden)]
pub mod decider;
mod error;
mod folder;
mod handle;
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
mod open;
mod rebuild;
mod records;
// Public but hidden: the deterministic simulation recovers its index in memory with these
// steps, after every crash it makes.
#[doc(hidden)]
pub mod recover;
mod shared;
mod statements;
mod submit;
mod verify;

pub use blocking::Blocking;
pub use committer::Reply;
pub use config::{Progress, SledConfig};
pub use folder::JOURNAL_DIR;
#[doc(hidden)]
pub use folder::wait_until_released;
pub use handle::{PauseGuard, SledStore};

use claims::{ACTIVITY_PER_SHARD, ANSWERS_PER_SHARD, Claim, SHARDS};
use error::Result;
use submit::{Attempt, Caller};

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
