//! The sled store's writer: the requests it takes (`Request`; a command is `Queued` with
//! its `Reply`), the decider's thread and the leader that drive the decider, the syncer
//! that writes, applies and answers the sealed groups, and the checkpoints. The decider
//! reads sled through `Reads`, implemented here for `Shared`: this file is where the two
//! meet, and the decider knows nothing of `Shared`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Mutex, MutexGuard};

use crate::domain::{ClientId, Command, Fingerprint, Key, MessageId};
use crate::fact::DecodeError;
use crate::projection::Stats;
use crate::store::verify::VerifyReport;
use crate::store::{LATENCY_BUCKETS_US, LedgerError, Submission};

use super::config::duration_ms;
use super::decider::{self, Arrival, Decider, Reads};
use super::error::Result;
use super::folder::flush_sled;
use super::journal::{Group, Journal, Op};
use super::rebuild;
use super::records::{
    GROUP_KEY, P_ACCOUNT, P_QUARANTINE, P_STATEMENT, STATEMENTS_READY_KEY, STATS_KEY, encode,
    io_err, seq_of,
};
use super::shared::Shared;

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
        if committer.decider.last_group() > 1 || self.queued.load(Ordering::SeqCst) != 0 {
            return Some(queued);
        }
        let Some(mut syncer) = self.syncer.try_lock() else {
            return Some(queued);
        };
        let Some(syncer) = syncer
            .as_mut()
            .filter(|s| s.journal.next_group() == committer.decider.next_group())
        else {
            return Some(queued);
        };
        let shared = committer.shared.clone();
        let mut staged = Staged::default();
        let mut stats = committer.decider.stats().clone();
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

/// Called exactly once with the answer, from the committer thread (keep it short) or
/// from the submitting thread when no write is needed.
pub type Reply = Box<dyn FnOnce(Result<Submission>) + Send>;

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

pub(super) struct Committer {
    shared: Arc<Shared>,
    decider: Decider,
}

type Staged = decider::Staged<Pending>;
type Sealed = decider::Sealed<Pending>;

/// The decider reads sled's tree, which holds every group the syncer applied, and the
/// claims of the shards.
impl Reads for Shared {
    type Index = sled::Tree;

    fn index(&self) -> &sled::Tree {
        &self.tree
    }

    fn claimed(&self, ck: &(ClientId, Key)) -> bool {
        self.shard(ck).lock().claims.contains_key(ck)
    }

    fn corrupt(&self, e: DecodeError) -> LedgerError {
        Shared::corrupt(self, e)
    }
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
            decider: Decider::new(next_group, next_quarantine, balances, stats),
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
        tree.insert(STATS_KEY, encode(self.decider.stats()))
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
        let mut stats = me.decider.stats().clone();
        loop {
            let first = if staged.answers.is_empty() {
                // Idle: a leader may commit meanwhile, so the working stats are read
                // again once a request is in hand.
                let r = MutexGuard::unlocked(&mut me, || rx.recv());
                let Ok(r) = r else { break };
                lead.taken(r.count());
                stats = me.decider.stats().clone();
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
        if me.shared.observed() != me.decider.stats().observed {
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
        let barrier = self.decider.barrier(vec![Pending::Barrier(done_tx)]);
        if to_syncer.send(barrier).is_ok() {
            let _ = done_rx.recv();
        }
        self.trim();
    }

    /// Tells the decider which groups sled now holds: sled answers for them from here on.
    fn trim(&mut self) {
        let applied = self.shared.applied_group.load(Ordering::Acquire);
        self.decider.applied(applied);
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
                let now = self.shared.config.clock.now();
                let id = self
                    .decider
                    .quarantine(staged, now, message_id, reason, payload);
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
            None => {
                self.trim();
                let now = self.shared.config.clock.now();
                let shared = &*self.shared;
                let arrival = Arrival {
                    ck: &ck,
                    command: &command,
                    fingerprint,
                    message,
                };
                let answer = self.decider.decide(shared, staged, stats, now, arrival);
                match &answer {
                    Ok(Submission::Reused) => {
                        shared.conflicts_reused.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Submission::Replayed(_)) => {
                        shared.replayed.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
                answer
            }
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
    /// (nothing staged, or the store failed and the staged commands were told so).
    fn seal_group(&mut self, staged: Staged, stats: &mut Stats) -> Option<Sealed> {
        if staged.answers.is_empty() {
            return None;
        }
        if let Some(reason) = self.shared.failed.lock().clone() {
            // Nothing more is written: the working state stays as it was, and the staged
            // commands are told the store failed.
            *stats = self.decider.stats().clone();
            answer_all(
                &self.shared,
                staged.answers,
                &LedgerError::Unavailable(reason),
            );
            return None;
        }
        match self.decider.seal(staged, stats, self.shared.observed()) {
            Ok(sealed) => {
                let (entries, heap) = self.decider.tails_use();
                self.shared.note_tails(entries, heap);
                sealed
            }
            Err(broken) => {
                // A broken invariant stops the writes as a storage failure does.
                let e = self.shared.fail(format!(
                    "invariant broken, nothing written: {}",
                    broken.reason
                ));
                answer_all(&self.shared, broken.answers, &e);
                None
            }
        }
    }

    /// Stages the expiry of keys whose answers are older than the retention.
    fn sweep(&mut self, staged: &mut Staged, stats: &mut Stats) -> Result<usize> {
        if let Some(reason) = self.shared.failed.lock().clone() {
            return Err(LedgerError::Unavailable(reason));
        }
        let now = self.shared.config.clock.now();
        let retention = duration_ms(self.shared.config.retention);
        let shared = &*self.shared;
        self.decider.sweep(shared, staged, stats, now, retention)
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
            // Each group reaches sled once, right after the one before it, and only once
            // its journal sync returned (it is here only without an error).
            let applied = shared.applied_group.load(Ordering::Acquire);
            if applied + 1 != group.number {
                *error = Some(shared.fail(format!(
                    "invariant broken, nothing applied: group {} follows group {applied} in sled",
                    group.number
                )));
                continue;
            }
            match apply_live(group, &shared.tree) {
                Ok(()) => {
                    shared.defer(&s.accounts, &s.stats, group);
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
                                .then(|| rebuild::write_base(&tree, &path, ask.group).ok())
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
