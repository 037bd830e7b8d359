//! The sled store's writer.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Mutex, MutexGuard};

use crate::core::{self, AccountView, Inputs, Seen, WithdrawalView};
use crate::domain::{Account, ClientId, Command, Currency, Fingerprint, Key, MessageId};
use crate::fact::{DecodeError, Fact, FactBody, Outcome};
use crate::projection::{Balances, Stats};
use crate::store::verify::VerifyReport;
use crate::store::{LATENCY_BUCKETS_US, LedgerError, Quarantined, Submission, message_fingerprint};

use super::journal::{Group, Journal, Op};
use super::records::{
    GROUP_KEY, InboxRecord, KeyRecord, P_ACCOUNT, P_KEY, P_QUARANTINE, P_REFUNDED, P_STATEMENT,
    STATEMENTS_READY_KEY, STATS_KEY, account_key, decode, encode, inbox_key, io_err,
    quarantine_key, scoped_key, seq_of,
};
use super::statements::Tail;
use super::{Reply, Result, Shared, duration_ms};

pub(super) enum Request {
    Command(Queued),
    /// Commands that async callers handed over together (see [`Lead::gather`]): what the
    /// runtime read in one wake, decided in one pass so that one group can hold them.
    Commands(Vec<Queued>),
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
    /// Holds the committer until the sender side is dropped (see [`SledStore::pause`]).
    Pause(Receiver<()>),
    Shutdown,
}

impl Request {
    /// How many requests this counts for while queued: a burst counts each command.
    pub(super) fn count(&self) -> usize {
        match self {
            Request::Commands(commands) => commands.len(),
            _ => 1,
        }
    }
}

// ---- the committer -------------------------------------------------------------------
//
// Two threads in a pipeline, and a third for checkpoints. The decider takes every queued
// request and decides each against its working state: sled's, plus every group it sealed
// that sled does not hold yet (kept in memory, `Committer::unapplied`). When the syncer is
// free, the decider seals what it staged as one journal group. The syncer writes each
// group to the journal with one `pwrite` and one `fdatasync`, then applies it to sled with
// one insert per record into sled's memory, publishes it to readers, releases its claims
// and answers. So while one group is being synced, the next is being decided: one sync
// covers everything that arrived meanwhile. A blocking caller that finds both idle takes
// both parts itself for its own command ([`Lead`]), and so pays no hand-off between
// threads. sled is never flushed on this path: the checkpointer flushes it from time to
// time and then lets the journal drop what sled now holds durably (ARCHITECTURE.md,
// durability).

/// The committer as the decider thread and blocking callers share it. The decider thread
/// holds `committer` whenever it has something in hand; the syncer thread holds `syncer`
/// while it writes. A blocking caller that finds both free, nothing queued, nothing sealed
/// but unwritten and the last group of at most one command leads: it decides its own
/// command, seals it as the next group, lets go of the decider (which may decide what
/// arrives meanwhile, as it does while the syncer syncs) and writes, syncs, applies and answers the group itself. So one submitter's
/// command costs no thread hand-off, and groups keep their order: a group is sealed only
/// with `committer` held, and written only with `syncer` held after every group sealed
/// before it.
pub(super) struct Lead {
    committer: Mutex<Committer>,
    /// `None` once the syncer has stopped: nothing more is written.
    syncer: Mutex<Option<Syncer>>,
    /// Requests sent to the decider and not yet in its hands (counted before they are sent,
    /// and taken off by the decider with `committer` held). A leader goes only when it is
    /// zero: a command, pause, sweep or verify queued before it is never overtaken.
    queued: AtomicUsize,
    /// One token: whoever writes is ready for the next group (its journal sync returned,
    /// or it has nothing left to write). The decider seals what it staged when it takes
    /// the token; a leader holds it while it writes, so that what is staged meanwhile
    /// waits to be one group.
    free: (Sender<()>, Receiver<()>),
    /// Commands from async callers, gathered until the runtime thread that took the first
    /// of them has run what else was ready ([`Lead::gather`]).
    gathered: Mutex<Vec<Queued>>,
}

impl Lead {
    pub(super) fn new(committer: Committer, syncer: Syncer) -> Self {
        Self {
            committer: Mutex::new(committer),
            syncer: Mutex::new(Some(syncer)),
            queued: AtomicUsize::new(0),
            free: crossbeam_channel::bounded(1),
            gathered: Mutex::new(Vec::new()),
        }
    }

    /// Counts `n` requests about to be sent to the decider; [`Lead::unsent`] if sending
    /// failed.
    pub(super) fn sending(&self, n: usize) {
        self.queued.fetch_add(n, Ordering::SeqCst);
    }

    pub(super) fn unsent(&self, n: usize) {
        self.taken(n);
    }

    /// The decider took `n` requests off the queue.
    fn taken(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::SeqCst);
    }

    /// Requests sent to the decider and not yet taken, a burst's commands each.
    pub(super) fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Keeps an async caller's command with the others gathered; true when it is the
    /// first, and its caller must hand them all over ([`Lead::gathered`]) once its runtime
    /// thread has run the other tasks that were ready.
    ///
    /// Why: the HTTP runtime reads a burst of requests in one wake and runs their tasks
    /// one after the other. Sent one by one, the first reaches an idle decider, which seals
    /// it alone while the syncer is free, and the rest of the burst waits for that sync
    /// and then its own. Handed over together, the burst is one group and one sync.
    pub(super) fn gather(&self, queued: Queued) -> bool {
        let mut gathered = self.gathered.lock();
        gathered.push(queued);
        gathered.len() == 1
    }

    /// Everything gathered so far, to be sent to the decider as one request.
    pub(super) fn gathered(&self) -> Vec<Queued> {
        std::mem::take(&mut *self.gathered.lock())
    }

    /// Nothing queued and both the decider and the syncer waiting: what [`Lead::try_lead`]
    /// needs, looked at without taking anything.
    pub(super) fn idle(&self) -> bool {
        self.queued.load(Ordering::SeqCst) == 0
            && self.committer.try_lock().is_some()
            && self.syncer.try_lock().is_some()
    }

    /// Commits `queued` on the calling thread when the committer is idle (see [`Lead`]),
    /// answering it before returning; gives it back when the committer is busy, for the
    /// queue. Only for callers that may block on the journal's sync.
    pub(super) fn try_lead(&self, queued: Queued) -> Option<Queued> {
        let Some(mut committer) = self.committer.try_lock() else {
            return Some(queued);
        };
        if committer.last_group > 1 || self.queued.load(Ordering::SeqCst) != 0 {
            return Some(queued);
        }
        let Some(mut syncer) = self.syncer.try_lock() else {
            return Some(queued);
        };
        let Some(syncer) = syncer
            .as_mut()
            .filter(|s| s.journal.next_group() == committer.next_group)
        else {
            return Some(queued);
        };
        let shared = committer.shared.clone();
        let mut staged = Staged::default();
        let mut stats = committer.stats.clone();
        committer.take_command(queued, &mut staged, &mut stats);
        let sealed = committer.seal_group(staged, &mut stats);
        if sealed.is_some() {
            // The token is here (nothing sealed is unwritten, and the syncer thread gives
            // it back after each write) unless the syncer thread has not started yet. It
            // is taken before the decider is let go: a decider that took it in between
            // would seal the first command to arrive as a group of one, while this group
            // is still to be written, instead of staging it with the others behind it.
            let _ = self.free.1.try_recv();
        }
        // Sealed: the decider may take what arrives meanwhile into the next group.
        drop(committer);
        if let Some(sealed) = sealed {
            syncer.write(&shared, vec![sealed], &self.free.0);
        }
        None
    }
}

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

impl Pending {
    /// A command's answer: what the commit metrics and the leader count.
    fn is_command(&self) -> bool {
        matches!(self, Pending::Command { .. })
    }
}

/// A command as the committer takes it from the queue.
pub(super) struct Queued {
    pub ck: (ClientId, Key),
    pub command: Command,
    pub fingerprint: Fingerprint,
    pub token: u64,
    pub message: Option<MessageId>,
    pub arrived: Instant,
    pub reply: Reply,
}

/// A group the decider sealed, on its way to the journal, then sled, then its answers.
struct Sealed {
    /// `None`: nothing to write (a barrier).
    group: Option<Group>,
    answers: Vec<Pending>,
    accounts: HashMap<Account, BTreeMap<Currency, i128>>,
    stats: Stats,
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
    balances: HashMap<Account, BTreeMap<Currency, i128>>,
    stats: Option<Stats>,
    /// Statement runs by their record's key, as the last group that extended each left it.
    runs: BTreeMap<Vec<u8>, sled::IVec>,
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

/// A record the commit path leaves to [`Deferred`]: a balance, a statement run, or the
/// stats.
fn deferred_key(key: &[u8]) -> bool {
    matches!(key.first(), Some(&(P_ACCOUNT | P_STATEMENT))) || key == STATS_KEY
}

/// A group's operations but the deferred ones, into sled's memory (see [`Group::apply`]).
fn apply_live(group: &Group, tree: &sled::Tree) -> sled::Result<()> {
    for op in &group.ops {
        match op {
            Op::Put { key, .. } if deferred_key(key) => {}
            Op::Put { key, value } => {
                tree.insert(key.as_slice(), value.as_slice())?;
            }
            Op::Remove { key } => {
                tree.remove(key.as_slice())?;
            }
        }
    }
    Ok(())
}

impl Shared {
    /// Notes what an applied group left of the deferred records.
    fn defer(&self, applied: &Sealed, group: &Group) {
        let mut d = self.deferred.lock();
        for (account, per) in &applied.accounts {
            d.balances.insert(account.clone(), per.clone());
        }
        d.stats = Some(applied.stats.clone());
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

pub(super) struct Committer {
    shared: Arc<Shared>,
    next_quarantine: u64,
    /// The number the next sealed group gets: the journal's next.
    next_group: u64,
    /// The decider's working state: sled's, plus every group sealed since.
    balances: Balances,
    stats: Stats,
    /// What the groups sealed but not yet applied to sled wrote that deciding reads back,
    /// oldest first. Trimmed as the syncer reports groups applied
    /// (`Shared::applied_group`): until then sled does not have them.
    unapplied: VecDeque<(u64, Written)>,
    /// How many commands the last group sealed held. A caller leads only after a group of
    /// at most one: then it is likely alone, and nobody's command would have joined its
    /// group. After a larger group others are submitting too, and a leader would write its
    /// command as a group of one while theirs queue behind it for the next sync: more
    /// syncs per command and a longer wait for them than the decider's groups, which take
    /// everything that arrived during the sync in flight.
    last_group: usize,
    /// The last statement run of recently moved accounts, extended by their next
    /// movements. Forgotten wholesale past [`TAILS_MAX`] accounts: an account not here
    /// starts a new run, which costs a record, not correctness.
    tails: HashMap<Account, Tail>,
    /// The heap bytes of the runs' values in `tails`.
    tails_heap: u64,
}

/// The most accounts whose last statement run the committer keeps.
pub(super) const TAILS_MAX: usize = 16_384;

/// What a group writes that deciding reads back: done keys with their facts, refunded
/// totals, inbox records. (Balances and stats are in the working state already.)
#[derive(Default)]
struct Written {
    keys: HashMap<(ClientId, Key), (Fingerprint, Fact)>,
    refunded: HashMap<(ClientId, Key), u64>,
    inbox: HashMap<MessageId, Fingerprint>,
}

/// One group in the making. Nothing here reaches the working state until it is sealed.
#[derive(Default)]
struct Staged {
    group: Group,
    /// The group's facts, by seq: put at the seal, as blocks ahead of the group's other
    /// operations (`log::put_facts`).
    facts: Vec<(u64, Vec<u8>)>,
    written: Written,
    accounts: HashMap<Account, BTreeMap<Currency, i128>>,
    /// The statement runs the group extends or starts, as the group leaves them, and the
    /// records of those it filled: each is put once, at the seal.
    tails: HashMap<Account, Tail>,
    filled: Vec<(Vec<u8>, Vec<u8>)>,
    answers: Vec<Pending>,
}

/// What is wrong with a group about to be sealed, if anything: its facts must take the
/// seqs right after `sealed_last` (the last sealed one), in order and without a gap, up to
/// `working_last` (the working stats' last seq); no user account may be left below zero.
fn broken_group(
    sealed_last: u64,
    facts: &[(u64, Vec<u8>)],
    accounts: &HashMap<Account, BTreeMap<Currency, i128>>,
    working_last: u64,
) -> Option<String> {
    let first = sealed_last + 1;
    let seqs_follow = facts
        .iter()
        .enumerate()
        .all(|(i, (seq, _))| Some(*seq) == first.checked_add(i as u64));
    if !seqs_follow || sealed_last + facts.len() as u64 != working_last {
        return Some(format!(
            "the group's facts are not seqs {first}..={working_last} (got {} facts, first {:?})",
            facts.len(),
            facts.first().map(|f| f.0)
        ));
    }
    accounts.iter().find_map(|(account, per)| {
        let negative = !account.is_system() && per.values().any(|b| *b < 0);
        negative.then(|| format!("{account} would be left below zero"))
    })
}

/// Makes everything applied to sled so far durable in sled's own files: sled's flush, then
/// an fdatasync of its data file (`None`: syncs are off). sled's flush syncs with
/// `sync_file_range`, which flushes neither the drive's write cache nor the file's size;
/// fdatasync does both (ARCHITECTURE.md, durability).
pub(super) fn flush_sled(db: &sled::Db, data_file: Option<&std::fs::File>) -> Result<()> {
    db.flush().map_err(io_err)?;
    // sled has written, nothing is synced: a power loss here leaves its files holding any
    // part of those writes (the power-loss test cuts them so).
    crash_point!("checkpoint.before_sync");
    if let Some(f) = data_file {
        f.sync_data()
            .map_err(|e| LedgerError::Unavailable(format!("fdatasync: {e}")))?;
    }
    Ok(())
}

impl Committer {
    pub(super) fn new(shared: Arc<Shared>, next_group: u64) -> Self {
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
            next_group,
            balances,
            stats,
            unapplied: VecDeque::new(),
            last_group: 0,
            tails: HashMap::new(),
            tails_heap: 0,
        }
    }

    /// Writes what a new ledger starts with: its stats record, and the mark that its
    /// statements are complete (it has no movement yet).
    pub(super) fn write_new_ledger(&self) -> Result<()> {
        // Inserts, not a batch: a tree that has seen an `apply_batch` guards every read with
        // a process-wide lock from then on. A crash before the flush leaves no stats record,
        // and the next open creates the ledger again.
        let tree = &self.shared.tree;
        tree.insert(STATEMENTS_READY_KEY, &[][..]).map_err(io_err)?;
        tree.insert(STATS_KEY, encode(&self.stats))
            .map_err(io_err)?;
        flush_sled(&self.shared.db, self.shared.data_file.as_ref())
    }

    /// The decider's loop; starts the syncer and stops it on shutdown. It holds the
    /// committer's lock whenever it has something in hand, and lets go of it only while
    /// it waits for a request with nothing staged: then a blocking caller may lead
    /// ([`Lead::try_lead`]).
    pub(super) fn run(lead: &Arc<Lead>, rx: Receiver<Request>) {
        let (to_syncer, from_decider) = crossbeam_channel::unbounded::<Sealed>();
        let (free_tx, syncer_free) = (lead.free.0.clone(), lead.free.1.clone());
        let mut me = lead.committer.lock();
        let syncer_lead = lead.clone();
        let syncer_shared = me.shared.clone();
        let syncer = std::thread::Builder::new()
            .name("idem-syncer".into())
            .spawn(move || sync_loop(&syncer_shared, &syncer_lead, &from_decider, &free_tx));
        let Ok(syncer) = syncer else {
            let _ = me.shared.fail("could not start the syncer thread".into());
            return;
        };
        let max = me.shared.config.batch_max.max(1);
        // What is staged waits for the syncer's token, and is sealed then as one group:
        // one journal record and one sync, however many commands it holds. Deciding goes
        // on meanwhile, so nothing waits that would not wait anyway.
        let mut staged = Staged::default();
        let mut stats = me.stats.clone();
        loop {
            let first = if staged.answers.is_empty() {
                // Idle: a leader may commit meanwhile, so the working stats are read
                // again once a request is in hand.
                let r = MutexGuard::unlocked(&mut me, || rx.recv());
                let Ok(r) = r else { break };
                lead.taken(r.count());
                stats = me.stats.clone();
                r
            } else {
                // The syncer is busy: stage what arrives until its token comes. Requests
                // come first, so a batch takes everything that arrived before the token.
                crossbeam_channel::select_biased! {
                    recv(rx) -> r => match r {
                        Ok(r) => {
                            lead.taken(r.count());
                            r
                        }
                        Err(_) => break,
                    },
                    recv(syncer_free) -> _ => {
                        me.seal(std::mem::take(&mut staged), &mut stats, &to_syncer);
                        continue;
                    }
                }
            };
            let first_count = first.count();
            let mut requests = vec![first];
            // What is staged counts too: a batch never takes more than `batch_max` (a
            // burst larger than what is left is sealed in parts, `take`).
            let mut taking = staged.answers.len() + first_count;
            while taking < max {
                match rx.try_recv() {
                    Ok(r) => {
                        let n = r.count();
                        lead.taken(n);
                        taking += n;
                        requests.push(r);
                    }
                    Err(_) => break,
                }
            }
            let mut stop = false;
            for request in requests {
                stop |= me.take(request, &mut staged, &mut stats, &to_syncer);
            }
            if stop {
                break;
            }
            // The token is taken only with something to seal: a token used on nothing
            // would leave staged commands waiting for a syncer with nothing to sync.
            if !staged.answers.is_empty()
                && (staged.answers.len() >= max || syncer_free.try_recv().is_ok())
            {
                me.seal(std::mem::take(&mut staged), &mut stats, &to_syncer);
            }
        }
        // Replays and conflicts write nothing: their counts ride with the next group. At a
        // clean stop the ones counted since the last group get a group of their own (the
        // stats record alone), so that a restart finds them.
        if me.shared.observed() != me.stats.observed {
            let (tx, _) = crossbeam_channel::bounded(1);
            staged.answers.push(Pending::Barrier(tx));
        }
        me.seal(std::mem::take(&mut staged), &mut stats, &to_syncer);
        me.stop_syncer(to_syncer, syncer);
    }

    /// Waits until everything sealed is durable, applied to sled and answered, then ends
    /// the syncer (which checkpoints on its way out).
    fn stop_syncer(&mut self, to_syncer: Sender<Sealed>, syncer: JoinHandle<()>) {
        self.drain(&to_syncer);
        drop(to_syncer);
        let _ = syncer.join();
    }

    /// Waits until every group sealed so far is in sled (or answered with an error), so
    /// that sled alone is the working state: for what reads sled's ranges (a sweep, the
    /// last step of a verify).
    fn drain(&mut self, to_syncer: &Sender<Sealed>) {
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let barrier = Sealed {
            group: None,
            answers: vec![Pending::Barrier(done_tx)],
            accounts: HashMap::new(),
            stats: self.stats.clone(),
        };
        if to_syncer.send(barrier).is_ok() {
            let _ = done_rx.recv();
        }
        self.trim();
    }

    /// Forgets what the groups sled now holds wrote: sled answers for them from here on.
    fn trim(&mut self) {
        let applied = self.shared.applied_group.load(Ordering::Acquire);
        while self.unapplied.front().is_some_and(|(n, _)| *n <= applied) {
            self.unapplied.pop_front();
        }
    }

    /// What the group in the making, or the newest sealed group not yet in sled, wrote
    /// under one record (`get` picks it out of a group's writes); `None`: sled decides.
    fn written<'a, T>(
        &'a self,
        staged: &'a Staged,
        get: impl Fn(&'a Written) -> Option<T>,
    ) -> Option<T> {
        get(&staged.written).or_else(|| self.unapplied.iter().rev().find_map(|(_, w)| get(w)))
    }

    /// Takes one request into the batch in the making, or runs it between two batches.
    /// Returns whether it asks the committer to stop.
    fn take(
        &mut self,
        request: Request,
        staged: &mut Staged,
        stats: &mut Stats,
        to_syncer: &Sender<Sealed>,
    ) -> bool {
        match request {
            Request::Shutdown => return true,
            Request::Pause(until) => {
                self.seal(std::mem::take(staged), stats, to_syncer);
                // Returns when the guard is dropped.
                let _ = until.recv();
            }
            Request::Sweep { reply } => {
                // Seal what came before, wait until sled holds it (the sweep reads sled's
                // ranges), then sweep in a group of its own.
                self.seal(std::mem::take(staged), stats, to_syncer);
                self.drain(to_syncer);
                match self.sweep(staged, stats) {
                    Ok(expired) => staged.answers.push(Pending::Sweep { reply, expired }),
                    Err(e) => reply(Err(self.shared.failed_by(e))),
                }
                self.seal(std::mem::take(staged), stats, to_syncer);
            }
            Request::Verify { step, reply } => {
                // The step reads the tree with every group before it applied and none
                // running: one consistent state.
                self.seal(std::mem::take(staged), stats, to_syncer);
                self.drain(to_syncer);
                // The step compares sled's balances and stats with the log: sled takes
                // the deferred ones first.
                match self.shared.write_deferred() {
                    Ok(()) => reply(step()),
                    Err(e) => reply(Err(self.shared.failed_by(e))),
                }
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
                staged.group.put(quarantine_key(id), encode(&record));
                staged.answers.push(Pending::Quarantine { reply, id });
            }
            Request::Command(queued) => self.take_command(queued, staged, stats),
            Request::Commands(commands) => {
                let max = self.shared.config.batch_max.max(1);
                for queued in commands {
                    self.take_command(queued, staged, stats);
                    // Full: sealed without waiting, as a full batch is.
                    if staged.answers.len() >= max {
                        self.seal(std::mem::take(staged), stats, to_syncer);
                    }
                }
            }
        }
        false
    }

    /// Stages a command, or answers it at once when nothing is staged for it.
    fn take_command(&mut self, queued: Queued, staged: &mut Staged, stats: &mut Stats) {
        let Queued {
            ck,
            command,
            fingerprint,
            token,
            message,
            arrived,
            reply,
        } = queued;
        let failed = self.shared.failed.lock().clone();
        let answer = match failed {
            Some(reason) => Err(LedgerError::Unavailable(reason)),
            None => self.stage(staged, stats, &ck, command, fingerprint, message),
        };
        match answer {
            // Nothing was staged for it (a refund of a withdrawal in flight): answered
            // now, and its claim released, so that its retry is not told 409 by its own
            // claim.
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
                reply(Err(self.shared.failed_by(e)));
            }
        }
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
        self.trim();
        if let Some(message_id) = &message
            && let Some(refused) = self.reused_message(staged, message_id, client, key, &command)?
        {
            return Ok(refused);
        }
        // The compare: is the key taken, in this batch or on disk?
        if let Some((stored, outcome)) = self.existing(staged, ck)? {
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
        self.stage_fact(staged, &fact, fingerprint);
        stats.apply(&fact);
        self.note_message(staged, message, client, key, &command, seq);
        staged.written.keys.insert(ck.clone(), (fingerprint, fact));
        Ok(Submission::Executed(outcome))
    }

    /// The refusal of a message whose id the inbox saw with another payload, kept in
    /// quarantine with the reason in the same batch; `None` for a new id or a redelivery.
    fn reused_message(
        &mut self,
        staged: &mut Staged,
        message_id: &MessageId,
        client: &ClientId,
        key: &Key,
        command: &Command,
    ) -> Result<Option<Submission>> {
        let mfp = message_fingerprint(client, key, command);
        let seen = match self.written(staged, |w| w.inbox.get(message_id).copied()) {
            Some(f) => Some(f),
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
        if !seen.is_some_and(|f| f != mfp) {
            return Ok(None);
        }
        let reason = "message_id_reused: this message id was delivered before with \
                      another payload";
        let id = self.next_quarantine;
        self.next_quarantine += 1;
        let record = Quarantined {
            id,
            at: self.shared.config.clock.now(),
            message_id: Some(message_id.as_str().to_owned()),
            reason: reason.into(),
            payload: crate::fact::json::inbox_message(message_id, client, key, command),
        };
        staged.group.put(quarantine_key(id), encode(&record));
        Ok(Some(Submission::Quarantined {
            reason: reason.into(),
        }))
    }

    /// What the key holds, in a group not yet in sled or in sled: its command's
    /// fingerprint and its answer; `None` for a key not done.
    fn existing(
        &self,
        staged: &Staged,
        ck: &(ClientId, Key),
    ) -> Result<Option<(Fingerprint, Outcome)>> {
        if let Some((f, fact)) = self.written(staged, |w| w.keys.get(ck)) {
            return Ok(Some((*f, Outcome::from_fact(fact))));
        }
        let Some(bytes) = self
            .shared
            .tree
            .get(scoped_key(P_KEY, &ck.0, ck.1.as_str()))
            .map_err(io_err)?
        else {
            return Ok(None);
        };
        let rec = KeyRecord::decode(&bytes).map_err(|e| self.shared.corrupt(e))?;
        Ok(Some((
            rec.fingerprint,
            self.shared.stored_outcome(rec.seq)?,
        )))
    }

    /// Stages a decided fact with its key record, balances and refunded total.
    fn stage_fact(&self, staged: &mut Staged, fact: &Fact, fingerprint: Fingerprint) {
        let (client, key, seq) = (&fact.client, &fact.key, fact.seq);
        staged.facts.push((seq, fact.encode()));
        let record = KeyRecord {
            seq,
            at: fact.at,
            fingerprint,
            expired: false,
        };
        staged
            .group
            .put(scoped_key(P_KEY, client, key.as_str()), record.encode());
        if let Some(line) = crate::projection::statement_line(fact) {
            let account = line.account;
            match staged.tails.get_mut(account) {
                Some(tail) => {
                    if !tail.push(seq) {
                        let full = std::mem::replace(tail, Tail::start(seq));
                        staged.filled.push(full.record(account));
                    }
                }
                None => {
                    // The account's run as the working state has it, copied on its first
                    // movement in this group.
                    let tail = match self.tails.get(account) {
                        Some(tail) => {
                            let mut tail = tail.clone();
                            if !tail.push(seq) {
                                tail = Tail::start(seq);
                            }
                            tail
                        }
                        None => Tail::start(seq),
                    };
                    staged.tails.insert(account.clone(), tail);
                }
            }
        }
        for (account, currency, delta) in crate::projection::legs(fact) {
            // Copy the account's balances from the working state only on its first touch
            // in this group; later commands on it reuse the staged copy.
            let entry = staged.accounts.entry(account.clone()).or_insert_with(|| {
                self.balances
                    .accounts
                    .get(account)
                    .cloned()
                    .unwrap_or_default()
            });
            let b = entry.entry(currency).or_insert(0);
            *b = b.saturating_add(delta);
            // Its record is put once per group, at the seal: nearly every command moves
            // a system account too, whose balance would be put (and inserted into sled)
            // once per command.
        }
        if let FactBody::RefundRecorded {
            withdrawal,
            refunded_total,
            ..
        } = &fact.body
        {
            let wk = (client.clone(), withdrawal.clone());
            staged.written.refunded.insert(wk, *refunded_total);
            staged.group.put(
                scoped_key(P_REFUNDED, client, withdrawal.as_str()),
                refunded_total.to_be_bytes().to_vec(),
            );
        }
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
            staged.group.put(
                inbox_key(&message_id),
                encode(&InboxRecord { fingerprint, seq }),
            );
            staged.written.inbox.insert(message_id, fingerprint);
        }
    }

    /// Whether `command` is a refund whose withdrawal is claimed and not decided yet: its
    /// key (the refund's client, the withdrawal's key) has a claim but no record, in a
    /// group not yet in sled or in sled. That happens when the refund overtook its withdrawal: the
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
        if self.written(staged, |w| w.keys.get(&wk)).is_some() {
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
                let fact = match self.written(staged, |w| w.keys.get(&wk)) {
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
                        let refunded = match self.written(staged, |w| w.refunded.get(&wk).copied())
                        {
                            Some(r) => r,
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

    /// Seals the staged commands as the next journal group and hands it to the syncer.
    fn seal(&mut self, staged: Staged, stats: &mut Stats, to_syncer: &Sender<Sealed>) {
        let Some(sealed) = self.seal_group(staged, stats) else {
            return;
        };
        if let Err(crossbeam_channel::SendError(sealed)) = to_syncer.send(sealed) {
            answer_all(&self.shared, sealed.answers, &LedgerError::Closed);
        }
    }

    /// Seals the staged commands as the next journal group; `None`: nothing to write
    /// (nothing staged, or the store failed and the staged commands were told so). The
    /// working state takes the group at once: the next decisions build on it, reading
    /// what sled does not hold yet from `unapplied`.
    fn seal_group(&mut self, staged: Staged, stats: &mut Stats) -> Option<Sealed> {
        if staged.answers.is_empty() {
            return None;
        }
        let Staged {
            mut group,
            facts,
            written,
            accounts,
            tails,
            filled,
            answers,
        } = staged;
        // What the group is about to make durable is checked first, in release builds
        // too: a broken invariant stops the writes as a storage failure does, rather than
        // writing a wrong ledger.
        if let Some(broken) = broken_group(self.stats.last_seq, &facts, &accounts, stats.last_seq) {
            self.shared
                .fail(format!("invariant broken, nothing written: {broken}"));
        }
        if let Some(reason) = self.shared.failed.lock().clone() {
            // Nothing more is written: the working state stays as it was, and the staged
            // commands are told the store failed.
            *stats = self.stats.clone();
            answer_all(&self.shared, answers, &LedgerError::Unavailable(reason));
            return None;
        }
        stats.observed = self.shared.observed();
        self.last_group = answers.iter().filter(|a| a.is_command()).count();
        group.number = self.next_group;
        group.seqs = self.stats.last_seq + 1..stats.last_seq + 1;
        super::log::put_facts(&mut group, facts);
        // Each account's balances as the group leaves them, once: values are absolute, so
        // one put per account holds what a put per movement would.
        for (account, per) in &accounts {
            for (currency, balance) in per {
                group.put(
                    account_key(account, *currency),
                    balance.to_be_bytes().to_vec(),
                );
            }
        }
        // Each statement run as the group leaves it, once, and those it filled.
        for (key, value) in filled {
            group.put(key, value);
        }
        for (account, tail) in &tails {
            let (key, value) = tail.record(account);
            group.put(key, value);
        }
        group.put(STATS_KEY, encode(&*stats));
        self.next_group += 1;
        if self.tails.len() + tails.len() > TAILS_MAX {
            self.tails.clear();
            self.tails_heap = 0;
        }
        for (account, tail) in tails {
            let heap = tail.heap() as u64;
            match self.tails.insert(account, tail) {
                Some(old) => self.tails_heap = self.tails_heap - old.heap() as u64 + heap,
                None => self.tails_heap += heap,
            }
        }
        self.shared.note_tails(self.tails.len(), self.tails_heap);
        for (account, per) in &accounts {
            self.balances.accounts.insert(account.clone(), per.clone());
        }
        self.stats = stats.clone();
        self.unapplied.push_back((group.number, written));
        Some(Sealed {
            group: Some(group),
            answers,
            accounts,
            stats: stats.clone(),
        })
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
        let facts = super::log::Facts::new(&self.shared.tree, cursor + 1, stats.last_seq);
        for item in facts.map_err(io_err)?.take(10_000) {
            let entry = item
                .map_err(io_err)?
                .map_err(|d| self.shared.corrupt(d.error))?;
            let seq = entry.seq;
            let fact = entry.decode().map_err(|e| self.shared.corrupt(e))?;
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
                    staged.group.put(kk, rec.encode());
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

/// The syncer's loop: takes every group sealed since its last turn and writes them
/// ([`Syncer::write`]) under the syncer's lock, which a leader holds while it writes its own
/// group; on shutdown takes the journal out, so that no leader writes after, and
/// checkpoints.
fn sync_loop(shared: &Shared, lead: &Lead, rx: &Receiver<Sealed>, free: &Sender<()>) {
    loop {
        {
            // Under the syncer's lock: a leader writing holds the token, and gives it back.
            let syncer = lead.syncer.lock();
            if rx.is_empty() && syncer.is_some() {
                // Full already means the decider has not used the last token yet.
                let _ = free.try_send(());
            }
        }
        let Ok(first) = rx.recv() else {
            break;
        };
        let mut sealed = vec![first];
        while let Ok(more) = rx.try_recv() {
            sealed.push(more);
        }
        let mut syncer = lead.syncer.lock();
        match syncer.as_mut() {
            Some(syncer) => syncer.write(shared, sealed, free),
            None => {
                for s in sealed {
                    answer_all(shared, s.answers, &LedgerError::Closed);
                }
            }
        }
    }
    let last = lead.syncer.lock().take();
    if let Some(Syncer {
        mut journal,
        checkpoints,
    }) = last
    {
        checkpoints.finish(shared, &mut journal);
    }
}

/// What writes groups: the journal, and the checkpoints that bound it. Used under
/// [`Lead::syncer`] by the syncer thread, or by a leader.
pub(super) struct Syncer {
    journal: Journal,
    checkpoints: Checkpoints,
}

impl Syncer {
    pub(super) fn new(shared: &Shared, journal: Journal) -> Self {
        Self {
            checkpoints: Checkpoints::start(shared),
            journal,
        }
    }

    /// For each sealed group in order: one journal write and sync, then its inserts into
    /// sled's memory, then its answers; a checkpoint tick after. `free` gets the token as
    /// soon as the syncs returned, so that the decider seals the next group while these
    /// are applied and answered.
    fn write(&mut self, shared: &Shared, sealed: Vec<Sealed>, free: &Sender<()>) {
        // How long the batch's first command waited for this sync to start.
        let sync_start = Instant::now();
        let waited = sealed
            .iter()
            .flat_map(|s| &s.answers)
            .filter_map(|a| match a {
                Pending::Command { arrived, .. } => Some(sync_start.duration_since(*arrived)),
                _ => None,
            })
            .max()
            .unwrap_or_default();
        let mut errors: Vec<Option<LedgerError>> = Vec::with_capacity(sealed.len());
        for s in &sealed {
            // Read apart from the match: a guard in its scrutinee would be held through the
            // journal's write and sync, and every arrival checks `failed` first.
            let failed = shared.failed.lock().clone();
            let error = match (&s.group, failed) {
                (None, _) => None,
                (Some(_), Some(reason)) => Some(LedgerError::Unavailable(reason)),
                // Groups reach the journal in the order they were sealed, each once.
                (Some(group), None) if group.number != self.journal.next_group() => {
                    Some(shared.fail(format!(
                        "invariant broken, nothing written: group {} sealed where the \
                         journal expects group {}",
                        group.number,
                        self.journal.next_group()
                    )))
                }
                (Some(group), None) => match self.journal.append(group) {
                    Ok(()) => {
                        self.checkpoints.written(group.record_len());
                        None
                    }
                    Err(e) => Some(shared.fail(e.to_string())),
                },
            };
            errors.push(error);
        }
        // Durable: the decider may seal the next group while this one is applied and
        // answered.
        let _ = free.try_send(());
        for (s, error) in sealed.iter().zip(errors.iter_mut()) {
            let Some(group) = s.group.as_ref().filter(|_| error.is_none()) else {
                continue;
            };
            match apply_live(group, &shared.tree) {
                Ok(()) => {
                    shared.defer(s, group);
                    crash_point!("sync.after_apply");
                    shared.applied_group.store(group.number, Ordering::Release);
                }
                Err(e) => *error = Some(shared.fail(e.to_string())),
            }
        }
        note_groups(shared, &self.journal, &sealed, &errors, waited);
        for (s, error) in sealed.into_iter().zip(errors) {
            match error {
                Some(e) => answer_all(shared, s.answers, &e),
                None => publish(shared, s),
            }
        }
        self.checkpoints.tick(shared, &mut self.journal);
    }
}

/// The metrics of one turn of writing: a "batch" is what one journal sync made durable.
fn note_groups(
    shared: &Shared,
    journal: &Journal,
    sealed: &[Sealed],
    errors: &[Option<LedgerError>],
    waited: Duration,
) {
    let commands = sealed
        .iter()
        .zip(errors)
        .filter(|(_, e)| e.is_none())
        .flat_map(|(s, _)| &s.answers)
        .filter(|a| a.is_command())
        .count();
    let journal_size = journal.stats();
    let mut m = shared.metrics.lock();
    m.journal_bytes = journal_size.bytes;
    m.journal_segments = journal_size.segments as u64;
    if commands > 0 {
        let size = u64::try_from(commands).unwrap_or(u64::MAX);
        m.batches += 1;
        m.commands += size;
        m.batch_size_max = m.batch_size_max.max(size);
        m.last_batch_size = size;
        m.applies += sealed
            .iter()
            .zip(errors)
            .filter(|(s, e)| {
                e.is_none() && s.group.is_some() && s.answers.iter().any(Pending::is_command)
            })
            .count() as u64;
        let waited = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        m.batch_wait_sum_us = m.batch_wait_sum_us.saturating_add(waited);
        m.batch_wait_max_us = m.batch_wait_max_us.max(waited);
    }
}

/// The journal's size, for the metrics.
fn note_journal(shared: &Shared, journal: &Journal) {
    let stats = journal.stats();
    let mut m = shared.metrics.lock();
    m.journal_bytes = stats.bytes;
    m.journal_segments = stats.segments as u64;
}

/// Checkpoints: from time to time sled is flushed on a thread of its own, so that a reopen
/// replays at most what was written since. Some checkpoints also compact the journal: once
/// sled is flushed, the same thread writes a new base of the index at the checkpoint's
/// group, and once that is durable the journal deletes its segments below it. The journal
/// keeps every group after its base, the log of record the index can be rebuilt from.
struct Checkpoints {
    /// Journal bytes written since the last checkpoint was asked for.
    bytes: u64,
    asked_at: Instant,
    /// The group the flush in progress covers.
    in_progress: Option<u64>,
    /// The last group sled holds durably.
    durable: u64,
    /// The size of the journal's newest base.
    base_bytes: u64,
    ask: Option<Sender<Ask>>,
    done: Receiver<Result<Done>>,
    thread: Option<JoinHandle<()>>,
}

/// A checkpoint asked of the checkpoint thread: the group it covers, and whether a base is
/// to be written at it.
struct Ask {
    group: u64,
    compact: bool,
}

/// A checkpoint done: its group, and the size of the base written at it, if one was (a
/// base that could not be written leaves the journal as it was, and is tried again later).
struct Done {
    group: u64,
    base: Option<u64>,
}

impl Checkpoints {
    fn start(shared: &Shared) -> Self {
        let (ask, asked) = crossbeam_channel::bounded::<Ask>(1);
        let (done_tx, done) = crossbeam_channel::bounded::<Result<Done>>(1);
        let (db, tree) = (shared.db.clone(), shared.tree.clone());
        let path = shared.path.clone();
        let data_file = shared.data_file.as_ref().and_then(|f| f.try_clone().ok());
        let thread = std::thread::Builder::new()
            .name("idem-checkpoint".into())
            .spawn(move || {
                loop {
                    let ask = match asked.recv_timeout(WRITEBACK_EVERY) {
                        Ok(ask) => ask,
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                            if let Some(f) = &data_file {
                                start_writeback(f);
                            }
                            continue;
                        }
                        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                    };
                    let flushed =
                        checkpoint_sled(&db, &tree, data_file.as_ref(), ask.group).map(|()| Done {
                            group: ask.group,
                            base: ask
                                .compact
                                .then(|| super::rebuild::write_base(&tree, &path, ask.group).ok())
                                .flatten(),
                        });
                    if done_tx.send(flushed).is_err() {
                        break;
                    }
                }
            })
            .ok();
        let base_bytes = shared.metrics.lock().journal_base_bytes;
        Self {
            bytes: 0,
            asked_at: Instant::now(),
            in_progress: None,
            durable: shared.checkpoint_at_open,
            base_bytes,
            ask: thread.is_some().then_some(ask),
            done,
            thread,
        }
    }

    fn written(&mut self, bytes: usize) {
        self.bytes += bytes as u64;
    }

    /// Takes a finished checkpoint (and drops the journal's segments below its base, if it
    /// wrote one), and asks for the next one when enough was written or enough time
    /// passed.
    fn tick(&mut self, shared: &Shared, journal: &mut Journal) {
        if let Ok(flushed) = self.done.try_recv() {
            self.in_progress = None;
            self.finished(shared, journal, flushed);
        }
        let applied = shared.applied_group.load(Ordering::Acquire);
        let due = self.bytes >= shared.config.checkpoint_bytes
            || self.asked_at.elapsed() >= shared.config.checkpoint_interval;
        if self.in_progress.is_none()
            && applied > self.durable
            && due
            && let Some(ask) = &self.ask
        {
            // sled takes the balances and stats of the groups up to `applied` before it is
            // flushed for them.
            if let Err(e) = shared.write_deferred() {
                shared.fail(e.to_string());
                return;
            }
            let compact =
                journal.bytes_through(applied) >= shared.config.compact_bytes.max(self.base_bytes);
            if ask
                .try_send(Ask {
                    group: applied,
                    compact,
                })
                .is_ok()
            {
                self.in_progress = Some(applied);
                self.bytes = 0;
                self.asked_at = Instant::now();
            }
        }
    }

    fn finished(&mut self, shared: &Shared, journal: &mut Journal, flushed: Result<Done>) {
        match flushed {
            Ok(done) => {
                self.durable = done.group;
                let mut compacted = false;
                if let Some(bytes) = done.base {
                    self.base_bytes = bytes;
                    if let Err(e) = journal.drop_through(done.group) {
                        shared.fail(e.to_string());
                    }
                    compacted = true;
                }
                {
                    let mut m = shared.metrics.lock();
                    m.checkpoints += 1;
                    if compacted {
                        m.compactions += 1;
                        m.journal_base_bytes = self.base_bytes;
                    }
                }
                note_journal(shared, journal);
            }
            Err(e) => {
                shared.fail(e.to_string());
            }
        }
    }

    /// On shutdown: waits for a checkpoint in progress, then makes sled hold every group,
    /// so that the next open replays nothing.
    fn finish(mut self, shared: &Shared, journal: &mut Journal) {
        drop(self.ask.take());
        if self.in_progress.is_some()
            && let Ok(flushed) = self.done.recv()
        {
            self.finished(shared, journal, flushed);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let applied = shared.applied_group.load(Ordering::Acquire);
        if applied > self.durable && shared.failed.lock().is_none() {
            let flushed = shared
                .write_deferred()
                .and_then(|()| {
                    checkpoint_sled(&shared.db, &shared.tree, shared.data_file.as_ref(), applied)
                })
                .map(|()| Done {
                    group: applied,
                    base: None,
                });
            self.finished(shared, journal, flushed);
        }
    }
}

/// How often the checkpoint thread starts the writeback of what sled wrote since.
const WRITEBACK_EVERY: Duration = Duration::from_millis(100);

/// Starts writing sled's dirty pages out, without waiting: `sync_file_range` with
/// `SYNC_FILE_RANGE_WRITE`. sled writes its buffers without syncing them, so between
/// checkpoints they pile up in the page cache, and the checkpoint's fdatasync would then
/// write them all at once while the journal's syncs queue behind it on the same disk. Started
/// every 100 ms, the writeback goes out in small pieces and the checkpoint finds little
/// left. Best effort: an error here changes nothing, the checkpoint's fdatasync decides.
/// No safe wrapper of the call exists in the crates we use, hence the one `unsafe` here.
#[allow(unsafe_code)]
fn start_writeback(file: &std::fs::File) {
    use std::os::fd::AsRawFd as _;
    // SAFETY: the descriptor is open for the call's duration (borrowed from `file`), and
    // the call only reads its arguments.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Makes sled hold every group up to `group` durably and records that it does: sled's
/// flush and an fdatasync of its data file (everything applied before the flush began is
/// then on disk), then `v.journal` = `group`, flushed and synced the same way. Recovery
/// replays the journal from the group after the `v.journal` it finds, which is therefore
/// never ahead of what sled holds.
fn checkpoint_sled(
    db: &sled::Db,
    tree: &sled::Tree,
    data_file: Option<&std::fs::File>,
    group: u64,
) -> Result<()> {
    flush_sled(db, data_file)?;
    tree.insert(GROUP_KEY, &group.to_be_bytes()[..])
        .map_err(io_err)?;
    flush_sled(db, data_file)?;
    // Where the power-loss test copies the index as synced.
    #[cfg(feature = "failpoints")]
    fail::fail_point!("checkpoint.synced");
    Ok(())
}

/// Makes a durable group visible to readers, then answers it.
fn publish(shared: &Shared, applied: Sealed) {
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
                    shard.unclaim(&ck, token);
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_sealed_only_with_its_seqs_in_order_and_no_balance_below_zero() {
        let facts = |seqs: &[u64]| -> Vec<(u64, Vec<u8>)> {
            seqs.iter().map(|s| (*s, Vec::new())).collect()
        };
        let rub = Currency::parse("RUB").unwrap();
        let balance = |name: &str, b: i128| {
            HashMap::from([(
                Account::parse_any(name).unwrap(),
                BTreeMap::from([(rub, b)]),
            )])
        };
        let none = HashMap::new();
        // Whole: the next seqs, or no fact at all (a quarantine, a sweep).
        assert_eq!(broken_group(7, &facts(&[8, 9, 10]), &none, 10), None);
        assert_eq!(broken_group(7, &[], &none, 7), None);
        assert_eq!(
            broken_group(7, &facts(&[8]), &balance("@world", -5), 8),
            None
        );
        assert_eq!(broken_group(0, &facts(&[1]), &balance("alice", 0), 1), None);
        // Broken: a gap, a repeat, out of order, a seq already sealed, stats that disagree,
        // a user account below zero.
        for (sealed, seqs, working) in [
            (7, &[8, 10][..], 10),
            (7, &[8, 8][..], 9),
            (7, &[9, 8][..], 9),
            (7, &[7][..], 8),
            (7, &[8, 9][..], 10),
            (7, &[][..], 8),
        ] {
            assert!(
                broken_group(sealed, &facts(seqs), &none, working).is_some(),
                "{sealed} {seqs:?} {working}"
            );
        }
        let below = broken_group(7, &facts(&[8]), &balance("alice", -1), 8).unwrap();
        assert_eq!(below, "alice would be left below zero");
    }
}
