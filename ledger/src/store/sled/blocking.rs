//! The blocking face of the sled store, for tools and tests that run no async runtime: the
//! operations of [`Store`] that wait (for a commit, a verify, a read of the tree), each on
//! the calling thread. A thin handle over the store ([`SledStore::blocking`]); the store's
//! one API is [`Store`], whose sled methods call these.
//!
//! A named facet of SledStore (its `blocking()`) and the owner of `Blocking`, whose key
//! listings are in `keys.rs`.

use std::collections::BTreeMap;

use crate::domain::{Account, ClientId, Command, Currency, Key, MessageId, Timestamp};
use crate::fact::Fact;
use crate::projection::{Balances, Stats};
use crate::store::verify::VerifyReport;
use crate::store::{AsOf, BalanceAt, LedgerError, Quarantined, Store, Submission};

use super::committer::Request;
use super::error::Result;
use super::handle::SledStore;
use super::records::{P_QUARANTINE, decode, io_err, quarantine_key};
use super::submit::{Attempt, Caller};
use super::verify;

/// A borrowed handle on a [`SledStore`] whose methods block; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct Blocking<'a> {
    pub(super) store: &'a SledStore,
}

impl SledStore {
    /// The blocking face of this store: see [`Blocking`].
    pub fn blocking(&self) -> Blocking<'_> {
        Blocking { store: self }
    }
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

impl Blocking<'_> {
    /// Submits a command and waits for its durable answer (a twin in flight is waited
    /// for as in [`Store::submit`]).
    pub fn submit(&self, client: &ClientId, key: &Key, command: Command) -> Result<Submission> {
        self.submit_waiting(client, key, command, None)
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
        self.submit_waiting(client, key, command, Some(message_id.clone()))
    }

    fn submit_waiting(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
    ) -> Result<Submission> {
        wait_for(|reply| {
            if let Attempt::Twin(twin) = self.store.attempt(
                client,
                key,
                command,
                message,
                reply,
                Caller {
                    wait: true,
                    lead: true,
                    gather: false,
                },
            ) {
                twin.released
                    .wait_blocking(self.store.shared.config.in_flight_wait);
                self.store.attempt(
                    client,
                    key,
                    twin.command,
                    twin.message,
                    twin.reply,
                    Caller {
                        wait: false,
                        lead: true,
                        gather: false,
                    },
                );
            }
        })
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
            self.store.request(Request::Quarantine {
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
        self.decode_quarantined(self.store.shared.tree.range(range).take(limit))
    }

    /// The newest `limit` quarantined messages, newest first.
    pub fn quarantined_newest(&self, limit: usize) -> Result<Vec<Quarantined>> {
        let records = self
            .store
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
            out.push(decode("quarantine", &v).map_err(|e| self.store.shared.corrupt(e))?);
        }
        Ok(out)
    }

    /// Expires the stored responses of done keys older than the retention, as of the
    /// clock's now. Returns how many keys expired.
    pub fn sweep(&self) -> Result<usize> {
        wait_for(|reply| self.store.request(Request::Sweep { reply }))
    }

    /// Rebuilds every projection from the log and checks the guarantees, while commits
    /// go on: the log up to the durable seq is read with no lock, and one short step
    /// between two batches checks what was written meanwhile (see `verify_online`).
    pub fn verify(&self) -> Result<VerifyReport> {
        verify::verify_online(
            &self.store.shared.tree,
            self.store.shared.config.verify_yields,
            &|| self.store.durable_seq(),
            // Every run held aside: the map holds statement runs only.
            &|| self.store.shared.deferred_runs(..),
            &|step| wait_for(|reply| self.store.request(Request::Verify { step, reply })),
        )
    }

    /// Facts with `seq > after`, in order, at most `limit`, durable ones only.
    pub fn facts(&self, after: u64, limit: usize) -> Result<Vec<Fact>> {
        let durable = self.store.durable_seq();
        let mut out = Vec::new();
        let shared = &self.store.shared;
        let facts = super::log::Facts::new(&shared.tree, after.saturating_add(1), durable);
        for item in facts.map_err(io_err)?.take(limit) {
            let entry = item.map_err(io_err)?.map_err(|d| shared.corrupt(d.error))?;
            out.push(entry.decode().map_err(|e| shared.corrupt(e))?);
        }
        Ok(out)
    }

    pub fn fact(&self, seq: u64) -> Result<Option<Fact>> {
        self.store.shared.fact(seq)
    }

    /// The user account's movements with `seq > after`, in order, at most `limit`, durable
    /// ones only: [`crate::Store::statement`].
    pub fn statement(&self, account: &Account, after: u64, limit: usize) -> Result<Vec<Fact>> {
        let durable = self.store.durable_seq();
        super::statements::read(&self.store.shared, account, after, durable, limit)
    }

    /// A user account's balance at a point of the log: [`crate::Store::balance_at`].
    pub fn balance_at(&self, account: &Account, point: AsOf) -> Result<Option<BalanceAt>> {
        if account.is_system() {
            return Ok(None);
        }
        let Some(currency) = self
            .account(account)
            .and_then(|per| per.keys().next().copied())
        else {
            return Ok(None);
        };
        let durable = self.store.durable_seq();
        let mut cut = point.seq.unwrap_or(u64::MAX).min(durable);
        if let Some(at) = point.time {
            cut = self.last_seq_at(at, cut)?;
        }
        let last = super::statements::last_at(&self.store.shared, account, cut)?;
        Ok(Some(match last {
            None => BalanceAt {
                currency,
                balance: 0,
                movement: None,
            },
            Some(fact) => BalanceAt {
                currency,
                balance: crate::projection::statement_line(&fact).map_or(0, |l| l.balance_after),
                movement: Some(fact.seq),
            },
        }))
    }

    /// The last seq, at most `durable`, whose fact was recorded at or before `at`: facts
    /// are numbered without gaps and their times never go back (the committer keeps them
    /// in order), so a bisection reads about log2(durable) facts.
    fn last_seq_at(&self, at: Timestamp, durable: u64) -> Result<u64> {
        let (mut low, mut high) = (0u64, durable);
        while low < high {
            let mid = low + (high - low).div_ceil(2);
            let fact = self.fact(mid)?.ok_or_else(|| {
                self.store.shared.corrupt(crate::fact::DecodeError::new(
                    "fact",
                    format!("seq {mid} is missing"),
                ))
            })?;
            if fact.at <= at {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        Ok(low)
    }

    /// Balances of one account, per currency (system accounts may hold several).
    pub fn account(&self, account: &Account) -> Option<BTreeMap<Currency, i128>> {
        self.store
            .shared
            .state
            .read()
            .balances
            .accounts
            .get(account)
            .cloned()
    }

    pub fn balances(&self) -> Balances {
        self.store.shared.state.read().balances.clone()
    }

    pub fn stats(&self) -> Stats {
        let mut stats = self.store.shared.state.read().stats.clone();
        stats.observed = self.store.shared.observed();
        stats
    }

    /// Bytes on disk of the ledger's folder.
    pub fn size_on_disk(&self) -> Result<u64> {
        self.store.shared.db.size_on_disk().map_err(io_err)
    }

    /// Finishes and flushes everything submitted before, then stops the committer.
    /// Later submissions answer [`crate::LedgerError::Closed`].
    pub fn shutdown(&self) {
        self.store.close();
    }
}
