//! The simulated store: the sled store's decider (`ledger`'s own
//! `store::sled::decider::Decider`) driven step by step over an index in memory instead of
//! sled, the product's journal over a simulated disk (`journal::simfs::SimFs`), and the
//! product's recovery (`store::sled::recover`) at every open, so that one seeded run can
//! cut the power between any two of the store's steps, or inside an append.
//!
//! What is the product's, not a copy: every decision (the compare on the key, the inbox's
//! ids, the refund bound, a refund whose withdrawal is in flight, the sweep), every group
//! (its records, their encodings and keys, its number and seqs, the checks before it is
//! sealed), every answer; the journal's appends, segments, bases and deletions; and every
//! step of an open (the journal's torn tail cut, damage followed by whole records refused,
//! its groups replayed after sled's checkpoint, the index rebuilt from the newest base and
//! the groups after it, the log's tail and balances checked, a base written when none
//! exists). What this file drives is what the sled store's threads do: the claims and the
//! answer cache of `SledStore::submit_with`, the queue, the syncer's turn (append, apply,
//! answer, in that order), the checkpoint (sled flushed and its group recorded, a base
//! written, the journal's segments below it dropped), and the open's choice to rebuild
//! when sled's files are damaged or the journal does not continue them.
//!
//! The commit path is the journal's: the decider stages at most `batch_max` commands and
//! seals them as one group with the next number (1, 2, 3, ..., no gap); it reads sled's
//! memory (the index the syncer applied groups to) and, before it, every sealed group not
//! applied yet. A blocking caller that finds the committer idle leads
//! (`committer::Lead`): the world's `Lead` step is one decider turn over the one queued
//! command, followed at once by the syncer's turn for it. sled is never flushed on the
//! commit path.
//!
//! Two files, each losing what was not synced, independently of the other:
//!
//! - the journal's disk is a `SimFs`: at a crash each unsynced write is lost, kept whole,
//!   torn, or kept with one bit flipped, and names are durable only once their folder was
//!   synced; a crash inside an append cuts the power at its write, its sync or the making
//!   of a new segment;
//! - sled's disk keeps what the last checkpoint flushed, and as sled writes its buffers in
//!   the background, possibly more: after a crash it holds any of the records of the
//!   groups applied to its memory since (none, all, or some of each group, at random), and
//!   records the last checkpoint's group. And one crash in four leaves sled's files
//!   damaged (a torn or reordered write that sled cannot open).
//!
//! `durable` is the journal's durable end: the fold of every group whose append returned
//! (and of a cut append that recovery found whole); after every crash the ledger must open
//! to exactly it, and the reference model checks after every step that every acknowledged
//! outcome is in it. `sled` is sled's memory and `view` the decider's working state,
//! decoded; a crash loses both, and the queue, the claims and the answer cache. A
//! submission answered at once (a replay, a conflict) reads sled's memory, which holds
//! only groups durable in the journal.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use ledger::core::{self, Seen};
use ledger::store::sled::decider::{Arrival, Decider, Reads, Sealed, Staged};
use ledger::store::sled::index::MemIndex;
use ledger::store::sled::journal::simfs::SimFs;
use ledger::store::sled::journal::{Fs as _, Group, Journal, JournalOptions, Op, SyncMode};
use ledger::store::sled::readback::{Decoded, InboxRecord, KeyRecord, decode_record};
use ledger::store::sled::recover::{self, Replayed};
use ledger::{
    Balances, ClientId, Command, Fact, Fingerprint, Key, LedgerError, MessageId, Observed, Outcome,
    Stats, Submission, Timestamp,
};

use super::Mutation;
use super::rng::Rng;

/// A key scoped by its client, as every record of the store is.
pub type Ck = (ClientId, Key);

/// Who is waiting for an answer: the simulation's own handle, opaque to the store.
pub type Ticket = u64;

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub batch_max: usize,
    pub lease_ms: i64,
    pub retention_ms: i64,
    /// The journal's own options: its segments' size (a few groups each, so that
    /// compactions delete some), its sync mode, how segments are made.
    pub journal: JournalOptions,
}

/// Where the simulated ledger's journal lives on the simulated disk.
const JOURNAL: &str = "/ledger/journal";
/// How the simulated ledger is named in the product's messages.
const SHOWN: &str = "the simulated ledger";
/// How many changing calls of an append the power may be cut before: its write, its
/// sync, and the making of a new segment (zeros, sync, rename, folder sync).
const APPEND_CALLS: u64 = 4;

/// The crash points of the real committer and journal, under their failpoint names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// The group is sealed, nothing of it is written.
    JournalBeforeWrite,
    /// The power goes during the group's append (its write, its sync, or the making of a
    /// new segment): what the disk keeps of it is lost, whole, torn or with a bit flipped.
    JournalAfterWrite,
    /// The group is durable in the journal, not applied to sled, and nobody has been told.
    JournalAfterSync,
    /// The group is in sled's memory too, and nobody has been told: no answer, no ack.
    SyncAfterApply,
    /// A checkpoint has flushed sled and written its base, and deleted nothing yet.
    CompactBeforeDelete,
    /// A checkpoint has deleted the journal's segments at or below its base.
    CompactAfterDelete,
}

impl Point {
    pub const ALL: [Point; 6] = [
        Point::JournalBeforeWrite,
        Point::JournalAfterWrite,
        Point::JournalAfterSync,
        Point::SyncAfterApply,
        Point::CompactBeforeDelete,
        Point::CompactAfterDelete,
    ];
    /// The points a turn of the syncer passes, for each group.
    pub const SYNC: [Point; 4] = [
        Point::JournalBeforeWrite,
        Point::JournalAfterWrite,
        Point::JournalAfterSync,
        Point::SyncAfterApply,
    ];
    /// The points a checkpoint passes.
    pub const CHECKPOINT: [Point; 2] = [Point::CompactBeforeDelete, Point::CompactAfterDelete];
    pub fn name(self) -> &'static str {
        match self {
            Point::JournalBeforeWrite => "journal.before_write",
            Point::JournalAfterWrite => "journal.after_write",
            Point::JournalAfterSync => "journal.after_sync",
            Point::SyncAfterApply => "sync.after_apply",
            Point::CompactBeforeDelete => "compact.before_delete",
            Point::CompactAfterDelete => "compact.after_delete",
        }
    }
}

/// An index decoded: what the reference model checks. Kept up to date group by group (each
/// record decoded by the product's own `decode_record`), and decoded whole after a
/// recovery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Data {
    /// The number of the last group applied.
    pub group: u64,
    pub facts: BTreeMap<u64, Fact>,
    pub keys: BTreeMap<Ck, KeyRecord>,
    pub balances: Balances,
    pub refunded: BTreeMap<Ck, u64>,
    pub inbox: BTreeMap<MessageId, InboxRecord>,
    /// The highest quarantine id, and how many quarantine records there are: a new id for
    /// each, 1, 2, 3, ..., so the two are equal.
    pub quarantined: u64,
    pub quarantines: u64,
    pub stats: Stats,
}

impl Data {
    /// Applies a group's records; an error names one that could not be read.
    fn apply(&mut self, group: &Group) -> Result<(), String> {
        for op in &group.ops {
            match op {
                Op::Put { key, value } => self.put(decode_record(key, value)?),
                Op::Remove { key } => {
                    return Err(format!("group {} removes {key:?}", group.number));
                }
            }
        }
        self.group = group.number;
        Ok(())
    }

    fn put(&mut self, record: Decoded) {
        match record {
            Decoded::Facts(facts) => {
                for f in facts {
                    self.facts.insert(f.seq, f);
                }
            }
            Decoded::Key(client, key, rec) => {
                self.keys.insert((client, key), rec);
            }
            Decoded::Balance(account, currency, b) => {
                self.balances
                    .accounts
                    .entry(account)
                    .or_default()
                    .insert(currency, b);
            }
            Decoded::Refunded(client, key, total) => {
                self.refunded.insert((client, key), total);
            }
            Decoded::Inbox(id, rec) => {
                self.inbox.insert(id, rec);
            }
            Decoded::Quarantined(id) => {
                self.quarantined = self.quarantined.max(id);
                self.quarantines += 1;
            }
            Decoded::Stats(s) => self.stats = s,
            Decoded::Derived => {}
        }
    }

    /// A whole index decoded, as an open finds it; `group` is the last group it holds.
    fn of(index: &MemIndex, group: u64) -> Result<Self, String> {
        let mut data = Data {
            group,
            ..Data::default()
        };
        for (k, v) in &index.map {
            data.put(decode_record(k, v)?);
        }
        Ok(data)
    }

    /// The key's answer, rendered from its fact; `None` when the fact is missing, which the
    /// real store reports as corruption.
    pub fn outcome(&self, rec: &KeyRecord) -> Option<Outcome> {
        self.facts.get(&rec.seq).map(Outcome::from_fact)
    }
}

/// An index with the number of the last group it holds.
#[derive(Debug, Clone, Default)]
struct Disk {
    index: MemIndex,
    group: u64,
}

impl Disk {
    fn apply(&mut self, group: &Group) {
        self.index.apply(group);
        self.group = group.number;
    }
}

/// What the store says when it cannot answer with a [`Submission`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The process is down: the connection is refused.
    Down,
    /// A record points at nothing; the real store answers `LedgerError::Corrupt`.
    Corrupt(String),
}

pub type Answer = Result<Submission, StoreError>;

#[derive(Debug, Clone)]
struct Claim {
    fingerprint: Fingerprint,
    token: u64,
    claimed_at: Timestamp,
}

#[derive(Debug, Clone)]
struct Request {
    ck: Ck,
    command: Command,
    fingerprint: Fingerprint,
    token: u64,
    message: Option<MessageId>,
    ticket: Ticket,
}

/// An answer a sealed group holds until it is durable and applied: a command's, or the
/// sweep's (which has nobody to tell here).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // Nearly every answer held is a command's.
enum Held {
    Command {
        ticket: Ticket,
        ck: Ck,
        token: u64,
        fingerprint: Fingerprint,
        answer: Answer,
    },
    Sweep,
}

/// What the decider reads: sled's memory, and the claims (hidden from it by the planted
/// bug that lets a refund overtake its withdrawal).
struct SimReads<'a> {
    index: &'a MemIndex,
    claims: &'a HashMap<Ck, Claim>,
    hide_claims: bool,
}

impl Reads for SimReads<'_> {
    type Index = MemIndex;

    fn index(&self) -> &MemIndex {
        self.index
    }

    fn claimed(&self, ck: &Ck) -> bool {
        !self.hide_claims && self.claims.contains_key(ck)
    }

    fn corrupt(&self, e: ledger::fact::DecodeError) -> LedgerError {
        LedgerError::Corrupt {
            path: "the simulated index".into(),
            detail: e.to_string(),
        }
    }
}

pub struct SimStore {
    config: StoreConfig,
    mutation: Mutation,
    /// Decides what each file keeps at a crash; seeded by the world, so a run replays.
    rng: Rng,
    up: bool,
    /// The journal's durable end: every group whose append returned, folded in order (and
    /// a group whose append a crash cut, when recovery finds it whole). After any crash
    /// the ledger must open to exactly this.
    durable: Data,
    /// The simulated disk the journal's files are on, and the product's journal over it
    /// (`None` while the process is down).
    fs: SimFs,
    journal: Option<Journal<SimFs>>,
    /// The group whose append the last crash cut: recovery may find it whole.
    cut: Option<Rc<Group>>,
    /// sled's disk as the last flush (a checkpoint's, or the state recovery found) left it.
    sled_disk: Disk,
    /// sled's files were damaged by the last crash: the next open rebuilds them.
    sled_damaged: bool,
    /// Operations applied to sled's memory since `sled_disk`, oldest first, by group: sled
    /// may have written any part of them by the time the process dies.
    unflushed: Vec<Rc<Group>>,
    /// sled's memory, which the decider reads, and the same decoded.
    sled: Disk,
    sled_data: Data,
    /// The decider's working state decoded: sled's memory plus every sealed group not yet
    /// applied.
    view: Data,
    /// The product's decider; a new one at each open, as the store makes.
    decider: Decider,
    /// Sealed groups not yet through the syncer, oldest first.
    sealed: VecDeque<Sealed<Held>>,
    queue: VecDeque<Request>,
    claims: HashMap<Ck, Claim>,
    /// The shard's cache of durable answers; dies with the process.
    answers: HashMap<Ck, (Fingerprint, Outcome)>,
    next_token: u64,
    /// An invariant the decider or a record broke; the world reports it as a violation.
    broken: Option<String>,
    /// What the files kept at the last crash, for the trace.
    fate: String,
    /// Cut appends that recovery found whole, and groups replayed by recoveries: the proof
    /// that the runs reach the cases where the two files differ.
    pub kept_whole: usize,
    pub replayed: usize,
    /// Opens that cut a torn or damaged tail off the journal.
    pub tails_cut: usize,
    /// Opens that rebuilt the index from the base and the journal.
    pub rebuilt: usize,
    /// Bumped on every change of `durable` / `view`, so the checker re-reads only changes.
    pub durable_version: u64,
    pub view_version: u64,
}

impl SimStore {
    /// A new ledger, opened as the store opens one: an empty journal, and its first base.
    pub fn new(config: StoreConfig, mutation: Mutation, rng: Rng) -> Self {
        let mut store = Self {
            config,
            mutation,
            rng,
            up: false,
            durable: Data::default(),
            fs: SimFs::new(),
            journal: None,
            cut: None,
            sled_disk: Disk::default(),
            sled_damaged: false,
            unflushed: Vec::new(),
            sled: Disk::default(),
            sled_data: Data::default(),
            view: Data::default(),
            decider: Decider::new(1, 1, Balances::default(), Stats::default()),
            sealed: VecDeque::new(),
            queue: VecDeque::new(),
            claims: HashMap::new(),
            answers: HashMap::new(),
            next_token: 1,
            broken: None,
            fate: String::new(),
            kept_whole: 0,
            replayed: 0,
            tails_cut: 0,
            rebuilt: 0,
            durable_version: 0,
            view_version: 0,
        };
        // The ledger's folder, made durable as the store's `ensure_folder` makes it.
        let root = Path::new(JOURNAL).parent().unwrap_or(Path::new("/"));
        let made = store
            .fs
            .create_dir_all(root)
            .and_then(|()| store.fs.sync_dir(Path::new("/")));
        if let Err(e) = made {
            store.note_broken(format!("the ledger's folder was not made: {e}"));
        }
        if let Err(e) = store.restart() {
            store.note_broken(format!("a new ledger did not open: {e}"));
        }
        store
    }

    pub fn is_up(&self) -> bool {
        self.up
    }
    /// The journal's durable end.
    pub fn durable(&self) -> &Data {
        &self.durable
    }
    /// What the decider reads: sled's memory and the sealed groups over it.
    pub fn view(&self) -> &Data {
        &self.view
    }
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
    /// Sealed groups the syncer has not answered yet.
    pub fn unsynced(&self) -> usize {
        self.sealed.len()
    }
    pub fn claims(&self) -> usize {
        self.claims.len()
    }
    /// An invariant that broke: a group the decider refused to seal, or a record that
    /// could not be read back.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }
    /// Whether a checkpoint has anything to do: groups applied since the last flush, or
    /// journal segments a base at sled's group would let it delete.
    pub fn checkpoint_due(&self) -> bool {
        self.sled.group > self.sled_disk.group
            || self
                .journal
                .as_ref()
                .is_some_and(|j| j.bytes_through(self.sled.group) > 0)
    }

    /// What the two files kept at the last crash.
    pub fn fate(&self) -> &str {
        &self.fate
    }

    fn note_broken(&mut self, what: String) {
        if self.broken.is_none() {
            self.broken = Some(what);
        }
    }

    fn dir() -> &'static Path {
        Path::new(JOURNAL)
    }

    /// The journal's options, or the planted bug's: a journal that never syncs.
    fn journal_options(&self) -> JournalOptions {
        let mut options = self.config.journal.clone();
        if self.mutation == Mutation::LoseSyncedGroup {
            options.sync = SyncMode::Never;
        }
        options
    }

    /// Under a live claim, what the key itself holds decides, as in
    /// `SledStore::submit_with`: a message → in flight (its id is checked first, by the
    /// committer); done with the arriving command and applied to sled (so durable in the
    /// journal) → its replay; done with it in a sealed group not yet through the syncer →
    /// in flight; done with another command → reused; nothing yet → `None` (the claim
    /// decides).
    fn held_by_key(&mut self, ck: &Ck, fingerprint: Fingerprint, message: bool) -> Option<Answer> {
        let in_flight = Some(Ok(Submission::InProgress {
            retry_after: Duration::from_secs(1),
        }));
        if message {
            return in_flight;
        }
        let reused = Some(Ok(Submission::Reused));
        if let Some((stored, outcome)) = self.answers.get(ck) {
            return if *stored != fingerprint {
                reused
            } else {
                Some(Ok(Submission::Replayed(outcome.clone())))
            };
        }
        let rec = self.view.keys.get(ck)?;
        if rec.fingerprint != fingerprint {
            return reused;
        }
        if self.sled_data.keys.get(ck).is_none_or(|d| d.seq != rec.seq) {
            return in_flight;
        }
        let outcome = self.view.outcome(rec)?;
        self.answers
            .insert(ck.clone(), (rec.fingerprint, outcome.clone()));
        Some(Ok(Submission::Replayed(outcome)))
    }

    /// The real compare, or the mutant that forgot the fingerprint.
    fn classify(&self, stored: Fingerprint, arriving: Fingerprint) -> Seen {
        match core::classify(Some(stored), arriving) {
            Seen::Reused if self.mutation == Mutation::ReuseIsReplay => Seen::Replay,
            seen => seen,
        }
    }

    /// `SledStore::submit_with`: answers at once (a conflict, a replay from the cache or
    /// sled, or down), or claims the key, queues the command and returns `None`; the answer
    /// then comes out of a later [`SimStore::sync`] under `ticket`.
    pub fn submit(
        &mut self,
        now: Timestamp,
        ck: &Ck,
        command: &Command,
        fingerprint: Fingerprint,
        message: Option<&MessageId>,
        ticket: Ticket,
    ) -> Option<Answer> {
        if !self.up {
            return Some(Err(StoreError::Down));
        }
        if let Some(claim) = self.claims.get(ck) {
            let ends = claim.claimed_at.saturating_add_ms(self.config.lease_ms);
            if now < ends {
                let reused = self.classify(claim.fingerprint, fingerprint) == Seen::Reused;
                // A claim of this very command may be a replay of a done key on its way
                // through the decider: the key answers for it too.
                if let Some(answer) = self.held_by_key(ck, fingerprint, message.is_some()) {
                    return Some(answer);
                }
                return Some(Ok(if reused {
                    Submission::Reused
                } else {
                    Submission::InProgress {
                        retry_after: Duration::from_secs(1),
                    }
                }));
            }
            // The lease ran out: the claim is taken over below, and the decider finds the
            // key done if the first attempt committed.
        } else if message.is_none() {
            // No claim: the key is new or durably done (claims are released only after the
            // group is applied to sled), so sled's answer may be given.
            if let Some((stored, outcome)) = self.answers.get(ck) {
                return Some(Ok(match self.classify(*stored, fingerprint) {
                    Seen::Reused => Submission::Reused,
                    _ => Submission::Replayed(outcome.clone()),
                }));
            }
            if let Some(rec) = self.sled_data.keys.get(ck) {
                return Some(match self.classify(rec.fingerprint, fingerprint) {
                    Seen::Reused => Ok(Submission::Reused),
                    _ => match self.sled_data.outcome(rec) {
                        Some(outcome) => {
                            self.answers
                                .insert(ck.clone(), (rec.fingerprint, outcome.clone()));
                            Ok(Submission::Replayed(outcome))
                        }
                        None => Err(StoreError::Corrupt(format!(
                            "the key record of {:?}/{:?} points at missing fact {}",
                            ck.0, ck.1, rec.seq
                        ))),
                    },
                });
            }
        }
        let token = self.next_token;
        self.next_token += 1;
        self.claims.insert(
            ck.clone(),
            Claim {
                fingerprint,
                token,
                claimed_at: now,
            },
        );
        self.queue.push_back(Request {
            ck: ck.clone(),
            command: command.clone(),
            fingerprint,
            token,
            message: message.cloned(),
            ticket,
        });
        None
    }

    /// The decider's turn: the product's decider stages up to `batch_max` queued commands
    /// and seals them as the next journal group. Returns only the answers given while
    /// staging (a refund of a withdrawal in flight, told 409 with its claim released; an
    /// error).
    pub fn decide(&mut self, now: Timestamp) -> Vec<(Ticket, Answer)> {
        if !self.up || self.queue.is_empty() {
            return Vec::new();
        }
        let n = self.config.batch_max.max(1).min(self.queue.len());
        let requests: Vec<Request> = self.queue.drain(..n).collect();
        let mut staged = Staged::<Held>::default();
        let mut stats = self.decider.stats().clone();
        let mut at_once = Vec::new();
        for req in requests {
            // As the committer does before each command: what sled holds is read there.
            self.decider.applied(self.sled.group);
            let reads = SimReads {
                index: &self.sled.index,
                claims: &self.claims,
                hide_claims: self.mutation == Mutation::RefundOvertakesWithdrawal,
            };
            let arrival = Arrival {
                ck: &req.ck,
                command: &req.command,
                fingerprint: req.fingerprint,
                message: req.message.clone(),
            };
            let decided = self
                .decider
                .decide(&reads, &mut staged, &mut stats, now, arrival);
            let answer = match decided {
                Ok(answer @ Submission::InProgress { .. }) => Ok(answer),
                Ok(answer) => {
                    staged.answers.push(Held::Command {
                        ticket: req.ticket,
                        ck: req.ck,
                        token: req.token,
                        fingerprint: req.fingerprint,
                        answer: Ok(answer),
                    });
                    continue;
                }
                Err(e) => Err(StoreError::Corrupt(e.to_string())),
            };
            self.release(&req.ck, req.token);
            at_once.push((req.ticket, answer));
        }
        self.seal(staged, &mut stats);
        at_once
    }

    /// Seals a group with the product's decider: numbered next, in the decider's view from
    /// now on, queued for the syncer. A group it refuses breaks an invariant.
    fn seal(&mut self, staged: Staged<Held>, stats: &mut Stats) {
        match self.decider.seal(staged, stats, Observed::default()) {
            Ok(Some(sealed)) => {
                if let Some(group) = &sealed.group
                    && let Err(e) = self.view.apply(group)
                {
                    self.note_broken(format!("a sealed group cannot be read back: {e}"));
                }
                // The decider's live projections are what its groups wrote, decoded.
                if self.decider.balances() != &self.view.balances {
                    self.note_broken(format!(
                        "the decider's balances {:?} are not its groups' {:?}",
                        self.decider.balances().accounts,
                        self.view.balances.accounts
                    ));
                }
                if self.decider.stats() != &self.view.stats {
                    self.note_broken(format!(
                        "the decider's stats {:?} are not its groups' {:?}",
                        self.decider.stats(),
                        self.view.stats
                    ));
                }
                self.view_version += 1;
                self.sealed.push_back(sealed);
            }
            Ok(None) => {}
            Err(broken) => self.note_broken(format!(
                "the decider refused to seal a group: {}",
                broken.reason
            )),
        }
    }

    fn release(&mut self, ck: &Ck, token: u64) {
        if self.claims.get(ck).is_some_and(|c| c.token == token) {
            self.claims.remove(ck);
        }
    }

    /// The syncer's turn: for each sealed group in order, the journal's append (one
    /// write, one sync), the apply to sled's memory, then the answers; or a death at
    /// `crash`, at the first group that passes it.
    pub fn sync(&mut self, crash: Option<Point>) -> Vec<(Ticket, Answer)> {
        let mut out = Vec::new();
        if !self.up {
            return out;
        }
        while let Some(Sealed {
            group, mut answers, ..
        }) = self.sealed.pop_front()
        {
            let Some(group) = group.map(Rc::new) else {
                out.extend(self.publish(answers));
                continue;
            };
            if crash == Some(Point::JournalBeforeWrite) {
                self.crash_in(None);
                return out;
            }
            let early = self.mutation == Mutation::ApplyBeforeJournalSync;
            if early {
                self.apply_to_sled(&group);
            }
            if self.mutation == Mutation::AnswerBeforeJournalSync {
                out.extend(self.publish(std::mem::take(&mut answers)));
            }
            if crash == Some(Point::JournalAfterWrite) {
                // The power goes during the append: at its write, its sync, or a new
                // segment's making; an append that needs fewer calls completes first.
                self.fs.power_off_after(self.rng.below(APPEND_CALLS));
            }
            let appended = match self.journal.as_mut() {
                Some(journal) => journal.append(&group).map_err(|e| e.to_string()),
                None => Err("no journal".into()),
            };
            if let Err(e) = appended {
                if !self.fs.is_off() {
                    self.note_broken(format!("the journal refused group {}: {e}", group.number));
                }
                self.crash_in(Some(group));
                return out;
            }
            self.appended(&group);
            if crash == Some(Point::JournalAfterWrite) {
                self.crash_in(None);
                return out;
            }
            if crash == Some(Point::JournalAfterSync) {
                self.crash_in(None);
                return out;
            }
            if !early {
                self.apply_to_sled(&group);
            }
            if crash == Some(Point::SyncAfterApply) {
                self.crash_in(None);
                return out;
            }
            out.extend(self.publish(answers));
        }
        out
    }

    /// A group's append returned: it is durable, and the durable end moves to it.
    fn appended(&mut self, group: &Group) {
        if let Err(e) = self.durable.apply(group) {
            self.note_broken(format!("a journal record cannot be read back: {e}"));
        }
        self.durable_version += 1;
    }

    /// The group's records into sled's memory.
    fn apply_to_sled(&mut self, group: &Rc<Group>) {
        self.sled.apply(group);
        if let Err(e) = self.sled_data.apply(group) {
            self.note_broken(format!("an applied group cannot be read back: {e}"));
        }
        self.unflushed.push(group.clone());
    }

    /// Releases the claims and hands out the answers of a durable group.
    fn publish(&mut self, answers: Vec<Held>) -> Vec<(Ticket, Answer)> {
        let mut out = Vec::with_capacity(answers.len());
        for held in answers {
            let Held::Command {
                ticket,
                ck,
                token,
                fingerprint,
                answer,
            } = held
            else {
                continue;
            };
            // Release before answering: a retry that follows the answer must find the key
            // done, not pending.
            if let Ok(Submission::Executed(outcome)) = &answer {
                self.answers
                    .insert(ck.clone(), (fingerprint, outcome.clone()));
            }
            self.release(&ck, token);
            out.push((ticket, answer));
        }
        out
    }

    /// `Store::sweep` on sled: the committer seals what came before, waits until sled holds
    /// every sealed group (the sweep reads sled's ranges), then the decider stages the
    /// expiry of keys older than the retention in a group of its own, durable once the
    /// syncer has passed it. Returns how many keys it expires and the answers of the
    /// groups synced first.
    pub fn sweep(&mut self, now: Timestamp) -> (usize, Vec<(Ticket, Answer)>) {
        if !self.up {
            return (0, Vec::new());
        }
        let drained = self.sync(None);
        self.decider.applied(self.sled.group);
        let mut staged = Staged::<Held>::default();
        let mut stats = self.decider.stats().clone();
        let reads = SimReads {
            index: &self.sled.index,
            claims: &self.claims,
            hide_claims: false,
        };
        let swept = self.decider.sweep(
            &reads,
            &mut staged,
            &mut stats,
            now,
            self.config.retention_ms,
        );
        match swept {
            Ok(expired) => {
                staged.answers.push(Held::Sweep);
                self.seal(staged, &mut stats);
                (expired, drained)
            }
            Err(e) => {
                self.note_broken(format!("the sweep failed: {e}"));
                (0, drained)
            }
        }
    }

    /// A checkpoint, as the store's: takes the last group applied to sled, flushes sled
    /// and records that group in it (its disk now holds at least that group), writes a
    /// base of sled at that group with the product's own code, then lets the journal drop
    /// the segments the base makes needless; or dies at `crash`. Returns the group and how
    /// many segments were deleted.
    pub fn checkpoint(&mut self, crash: Option<Point>) -> (u64, usize) {
        if !self.up {
            return (0, 0);
        }
        let group = self.sled.group;
        if let Err(e) = recover::mark_checkpoint(&mut self.sled.index, group) {
            self.note_broken(format!("the checkpoint was not recorded: {e}"));
        }
        self.sled_disk = self.sled.clone();
        self.unflushed.clear();
        let compact = self
            .journal
            .as_ref()
            .is_some_and(|j| j.bytes_through(group) > 0);
        if !compact {
            return (group, 0);
        }
        // The base is durable before any segment goes: the planted bug deletes segments
        // (and the older bases) with no base at this group.
        if self.mutation != Mutation::CheckpointDeletesNeeded
            && let Err(e) = recover::write_base(&self.fs, Self::dir(), &self.sled.index, group)
        {
            self.note_broken(format!("the base at group {group} was not written: {e}"));
            return (group, 0);
        }
        if crash == Some(Point::CompactBeforeDelete) {
            self.crash_in(None);
            return (group, 0);
        }
        if crash == Some(Point::CompactAfterDelete) {
            // The power goes during the deletions, or after them.
            self.fs.power_off_after(self.rng.below(4));
        }
        let dropped = self
            .journal
            .as_mut()
            .map_or(Ok(0), |j| j.drop_through(group));
        let deleted = match dropped {
            Ok(n) => n,
            Err(e) => {
                if !self.fs.is_off() {
                    self.note_broken(format!("the journal could not drop through {group}: {e}"));
                }
                0
            }
        };
        if crash == Some(Point::CompactAfterDelete) {
            self.crash_in(None);
        }
        (group, deleted)
    }

    /// The process dies between two commits.
    pub fn crash(&mut self) {
        self.crash_in(None);
    }

    /// The power goes, `cut` (if any) the group whose append it cut. What each file keeps
    /// is chosen here, independently: the journal's disk as the simulated file system's
    /// power cut leaves it (each unsynced write lost, kept whole, torn, or kept with a bit
    /// flipped; names durable only once their folder was synced); sled's disk at some
    /// point from its last flush to the last group applied to memory. Memory is lost:
    /// sled's, the decider's, the queue, the claims, the answer cache.
    fn crash_in(&mut self, cut: Option<Rc<Group>>) {
        self.up = false;
        self.journal = None;
        let mut fate = Vec::new();
        let rng = &mut self.rng;
        let ops = self.fs.ops();
        self.fs = self.fs.crash(|n| rng.below(n));
        fate.push(format!(
            "the journal's disk was cut after {ops} changing calls"
        ));
        if let Some(group) = &cut {
            fate.push(format!("during the append of group {}", group.number));
        }
        self.cut = cut;
        // sled writes its buffers when they fill, and the syncer applies a group one insert
        // at a time: its disk may hold any of the records applied since the last checkpoint
        // (none, all, or some of each group), while the group it records is still the
        // checkpoint's. A third of the groups keep nothing, a third everything.
        let low = self.sled_disk.group;
        let high = self.sled.group;
        let mut kept = 0usize;
        for group in std::mem::take(&mut self.unflushed) {
            let fate = self.rng.below(3);
            for op in &group.ops {
                if fate == 1 || (fate == 2 && self.rng.below(2) == 0) {
                    self.sled_disk.index.apply_op(op);
                    kept += 1;
                }
            }
        }
        fate.push(format!(
            "sled's disk holds {kept} records of the groups after its checkpoint, group {low} \
             (applied up to {high})"
        ));
        if self.rng.below(4) == 0 {
            self.sled_damaged = true;
            fate.push("sled's files were left damaged (a torn or reordered write)".into());
        }
        self.fate = fate.join("; ");
        self.sealed.clear();
        self.queue.clear();
        self.claims.clear();
        self.answers.clear();
    }

    /// `SledStore::open`, step for step with the product's recovery (`recover`): sled's
    /// disk, then the journal opened over the simulated disk (its torn tail cut, damage
    /// followed by whole records refused) and every group after sled's checkpoint
    /// replayed; when sled's files are damaged or the journal does not continue them, the
    /// index rebuilt from the newest base and the groups after it; then the log's tail and
    /// the balances checked, and the base written if none exists. The checker refuses a
    /// ledger that opens to anything but the journal's durable end.
    pub fn restart(&mut self) -> Result<(), String> {
        let fs = self.fs.clone();
        let dir = Self::dir();
        let options = self.journal_options();
        let refused = |e: ledger::LedgerError| format!("open refused: {e}");
        let mut index = self.sled_disk.index.clone();
        let first = if self.sled_damaged {
            Err((
                ledger::LedgerError::Corrupt {
                    path: SHOWN.into(),
                    detail: "sled cannot open its damaged files".into(),
                },
                true,
            ))
        } else {
            recover::lost_index(&fs, dir, &index, SHOWN)
                .and_then(|()| recover::replay(fs.clone(), dir, options.clone(), &mut index, SHOWN))
        };
        let Replayed {
            journal,
            groups,
            truncated,
            ..
        } = match first {
            Ok(replayed) => replayed,
            Err((e, true)) if recover::log_is_complete(&fs, dir).map_err(refused)? => {
                let mut fresh = MemIndex::default();
                let (plan, groups) =
                    recover::rebuild_into(&fs, dir, &mut fresh, &e.to_string(), SHOWN)
                        .map_err(refused)?;
                self.rebuilt += 1;
                self.replayed += usize::try_from(groups).unwrap_or(usize::MAX);
                self.sled_damaged = false;
                // A rebuild ends with the new index flushed and synced.
                self.sled_disk = Disk {
                    index: fresh.clone(),
                    group: plan.last_group,
                };
                index = fresh;
                recover::replay(fs.clone(), dir, options, &mut index, SHOWN)
                    .map_err(|(e, _)| refused(e))?
            }
            Err((e, _)) => return Err(refused(e)),
        };
        self.replayed += groups.len();
        if let Some(cut) = truncated {
            self.tails_cut += 1;
            self.fate.push_str(&format!(
                "; recovery cut {} at offset {} ({})",
                cut.segment.display(),
                cut.offset,
                cut.reason
            ));
        }
        self.unflushed.extend(groups.into_iter().map(Rc::new));
        let last = journal.next_group() - 1;
        // A group whose append the crash cut may have reached the disk whole: then it is
        // the journal's, and the ledger's.
        if let Some(cut) = self.cut.take()
            && last == cut.number
            && last == self.durable.group + 1
        {
            self.kept_whole += 1;
            self.appended(&cut);
        }
        let checked = recover::check(&index, SHOWN).map_err(refused)?;
        recover::ensure_base(&fs, dir, &index, last, || ()).map_err(refused)?;
        let d = Data::of(&index, last)
            .map_err(|e| format!("open refused: a record cannot be read: {e}"))?;
        if d != self.durable {
            return Err(format!(
                "after the crash the ledger opened to group {} with {} facts, not to the \
                 journal's durable end, group {} with {} facts{}",
                d.group,
                d.facts.len(),
                self.durable.group,
                self.durable.facts.len(),
                differs(&d, &self.durable)
            ));
        }
        // The store's open makes a new decider over what it recovered.
        self.decider = Decider::new(
            last + 1,
            d.quarantined + 1,
            checked.balances,
            checked.stats.unwrap_or_default(),
        );
        self.journal = Some(journal);
        self.sled = Disk { index, group: last };
        self.sled_data = d.clone();
        self.view = d;
        self.view_version += 1;
        self.up = true;
        Ok(())
    }
}

/// Which records of two states differ, for a refusal's message.
fn differs(a: &Data, b: &Data) -> String {
    let parts = [
        ("facts", a.facts != b.facts),
        ("key records", a.keys != b.keys),
        ("balances", a.balances != b.balances),
        ("refunded totals", a.refunded != b.refunded),
        ("inbox", a.inbox != b.inbox),
        ("quarantine", a.quarantined != b.quarantined),
        ("stats", a.stats != b.stats),
    ];
    let names: Vec<&str> = parts.iter().filter(|p| p.1).map(|p| p.0).collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(" ({} differ)", names.join(", "))
    }
}
