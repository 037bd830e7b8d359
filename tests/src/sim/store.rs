//! The simulated store: the sled store's semantics (ledger/src/store/sled/) without sled,
//! threads or a disk, so that one seeded run can put a crash between any two of its steps.
//!
//! What it mirrors, record for record: key records `{seq, at, fingerprint, expired}`, the
//! gapless fact log, balances per (account, currency), refunded totals per withdrawal, the
//! inbox by message id, the stats record written with every group; claims with a lease and
//! the answer cache in memory. Decisions are the real `ledger::core::classify` and
//! `ledger::core::decide`, answers the real `Outcome::from_fact`, so the code under test is
//! the ledger's own.
//!
//! The commit path is the journal's: the decider stages at most `batch_max` commands with
//! the compare-and-swap on the key against its working view, and seals them as one journal
//! group with the next group number (1, 2, 3, ..., no gap); its view is sled's memory plus
//! every sealed group not yet applied to sled (an overlay read before sled). The syncer,
//! for each sealed group in order, writes it to the journal, syncs the journal, applies the
//! group to sled's memory one insert at a time, and only then answers everyone in the group and releases their claims (but for a refund
//! whose withdrawal is still in flight, told 409 at once with nothing staged). A blocking
//! caller that finds the committer idle leads (`committer::Lead`): the world's `Lead` step
//! is one decider turn over the one queued command, with no sealed group unwritten,
//! followed at once by the syncer's turn for it. sled is
//! never flushed on the commit path. A checkpoint, now and then, takes the last group
//! applied to sled, flushes sled and records that group in it (`v.journal`), then compacts
//! the journal: it writes a base (sled's state at that group, durable before anything is
//! deleted) and deletes the journal's segments (of a few groups each, per seed) whose
//! groups are all at or below it, never the one appended to. The base and the journal
//! after it are the log of record.
//!
//! Two files, each losing what was not synced, independently of the other:
//!
//! - the journal keeps every synced record; a record written and not synced when the
//!   process dies survives whole, torn (cut off at recovery) or not at all;
//! - sled's disk keeps what the last checkpoint flushed, and as sled writes its buffers in
//!   the background, possibly more: after a crash it holds any of the writes of the groups
//!   applied to its memory since (none, all, or some of each group, at random), and
//!   records the last checkpoint's group. Here each fact is a write of its own; the sled
//!   store writes a group's facts as blocks of several, so every set of writes it can
//!   leave on disk is one this model leaves too. And one crash in four leaves sled's files
//!   damaged (a torn or reordered write that sled cannot open).
//!
//! Recovery opens sled's disk, reads the checkpoint's group it records and replays every
//! journal group after it (groups carry absolute values, so a replay is idempotent). When
//! sled's files are damaged, or the journal does not continue sled, it rebuilds the index
//! from the base and every journal group after it, as the sled store's open does; a
//! journal that does not continue its base is refused, and a ledger that opens to anything but the journal's
//! durable end is refused by the checker: `durable` is that end, the fold of every group
//! the journal holds durably, and it is what the reference model checks after every step
//! (every acknowledged outcome must be in it). `sled` is sled's memory and `view` the
//! decider's; a crash loses both, and the queue, the claims and the answer cache. A
//! submission answered at once (a replay, a conflict) reads sled's memory, which holds
//! only groups durable in the journal; the decider reads its view.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use ledger::core::{self, AccountView, Inputs, Seen, WithdrawalView};
use ledger::projection::legs;
use ledger::{
    Account, Balances, ClientId, Command, Currency, Fact, FactBody, Fingerprint, Key, MessageId,
    Outcome, Stats, Submission, Timestamp,
};

use super::Mutation;
use super::rng::Rng;

/// A key scoped by its client, as every record of the store is.
pub type Ck = (ClientId, Key);

/// Who is waiting for an answer: the simulation's own handle, opaque to the store.
pub type Ticket = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    pub batch_max: usize,
    pub lease_ms: i64,
    pub retention_ms: i64,
    /// Groups a journal segment holds; a checkpoint deletes whole segments.
    pub segment_groups: u64,
}

/// The crash points of the real committer and journal, under their failpoint names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// The group is sealed, nothing of it is written.
    JournalBeforeWrite,
    /// The group's record is written, not synced: it may survive whole, torn or not at all.
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub seq: u64,
    pub at: Timestamp,
    pub fingerprint: Fingerprint,
    pub expired: bool,
}

/// What the inbox remembers of a message: the real store keeps a hash of (client, key,
/// command); keeping the parts themselves compares the same and costs no hashing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxRecord {
    pub ck: Ck,
    pub fingerprint: Fingerprint,
    pub seq: u64,
}

/// Everything sled holds, one map per record prefix, and the last group applied to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Data {
    /// The number of the last group applied, recorded in the same atomic batch.
    pub group: u64,
    pub facts: BTreeMap<u64, Fact>,
    pub keys: BTreeMap<Ck, KeyRecord>,
    pub balances: Balances,
    pub refunded: BTreeMap<Ck, u64>,
    pub inbox: BTreeMap<MessageId, InboxRecord>,
    pub quarantined: u64,
    pub stats: Stats,
}

/// One record written by a group.
#[derive(Debug, Clone)]
enum Write {
    Fact(Fact),
    Key(Ck, KeyRecord),
    /// Only [`Mutation::SweepForgetsKey`] writes this.
    ForgetKey(Ck),
    Balance(Account, Currency, i128),
    Refunded(Ck, u64),
    Inbox(MessageId, InboxRecord),
    /// The count of quarantined messages, absolute like every value a group carries.
    Quarantine(u64),
    Stats(Stats),
}

impl Data {
    fn apply(&mut self, record: &Record) {
        for w in record.writes.iter() {
            self.write(w);
        }
        self.group = record.number;
    }

    fn write(&mut self, w: &Write) {
        match w {
            Write::Fact(f) => {
                self.facts.insert(f.seq, f.clone());
            }
            Write::Key(ck, rec) => {
                self.keys.insert(ck.clone(), rec.clone());
            }
            Write::ForgetKey(ck) => {
                self.keys.remove(ck);
            }
            Write::Balance(account, currency, b) => {
                self.balances
                    .accounts
                    .entry(account.clone())
                    .or_default()
                    .insert(*currency, *b);
            }
            Write::Refunded(ck, total) => {
                self.refunded.insert(ck.clone(), *total);
            }
            Write::Inbox(id, rec) => {
                self.inbox.insert(id.clone(), rec.clone());
            }
            Write::Quarantine(total) => self.quarantined = *total,
            Write::Stats(s) => self.stats = s.clone(),
        }
    }

    /// The key's answer, rendered from its fact; `None` when the fact is missing, which the
    /// real store reports as corruption.
    pub fn outcome(&self, rec: &KeyRecord) -> Option<Outcome> {
        self.facts.get(&rec.seq).map(Outcome::from_fact)
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

/// An answer held until its group is durable and applied.
#[derive(Debug, Clone)]
struct Pending {
    ticket: Ticket,
    ck: Ck,
    token: u64,
    fingerprint: Fingerprint,
    answer: Answer,
}

/// What a group writes: the payload of its journal record, and the batch sled applies.
/// Shared between the overlay, the journal and sled's unflushed groups.
#[derive(Debug, Clone)]
struct Record {
    number: u64,
    writes: Rc<[Write]>,
}

/// A sealed group on its way through the syncer, with the answers it holds back.
#[derive(Debug)]
struct Group {
    record: Record,
    answers: Vec<Pending>,
}

/// One group in the making: what its commands see of each other before it is sealed.
#[derive(Default)]
struct Staged {
    writes: Vec<Write>,
    keys: HashMap<Ck, (Fingerprint, Fact)>,
    accounts: HashMap<Account, BTreeMap<Currency, i128>>,
    refunded: HashMap<Ck, u64>,
    inbox: HashMap<MessageId, InboxRecord>,
    quarantined: Option<u64>,
}

pub struct SimStore {
    config: StoreConfig,
    mutation: Mutation,
    /// Decides what each file keeps at a crash; seeded by the world, so a run replays.
    rng: Rng,
    up: bool,
    /// The journal's durable end: every group it ever synced, folded in order. After any
    /// crash the ledger must open to exactly this.
    durable: Data,
    /// The journal's records on disk, in order, from the oldest segment not deleted.
    journal: VecDeque<Record>,
    /// sled's disk as the last flush (a checkpoint's, or the state recovery found) left it.
    sled_disk: Data,
    /// sled's files were damaged by the last crash: the next open rebuilds them.
    sled_damaged: bool,
    /// The journal's base: the state the groups up to its group left, durable; with the
    /// journal's groups after it, the log of record.
    base: Data,
    /// Groups applied to sled's memory since `sled_disk`, oldest first: sled may have
    /// written any prefix of them by the time the process dies.
    unflushed: Vec<Record>,
    /// sled's memory: `sled_disk` plus `unflushed`.
    sled: Data,
    /// The decider's view: sled's memory plus every sealed group not yet applied.
    view: Data,
    /// Sealed groups not yet through the syncer, oldest first: the overlay of `view`.
    sealed: VecDeque<Group>,
    next_group: u64,
    queue: VecDeque<Request>,
    claims: HashMap<Ck, Claim>,
    /// The shard's cache of durable answers; dies with the process.
    answers: HashMap<Ck, (Fingerprint, Outcome)>,
    next_token: u64,
    /// What the files kept at the last crash, for the trace.
    fate: String,
    /// Unsynced journal records a crash left whole, and groups replayed by recoveries: the
    /// proof that the runs reach the cases where the two files differ.
    pub kept_whole: usize,
    pub replayed: usize,
    /// Opens that rebuilt the index from the base and the journal.
    pub rebuilt: usize,
    /// Bumped on every change of `durable` / `view`, so the checker re-reads only changes.
    pub durable_version: u64,
    pub view_version: u64,
}

impl SimStore {
    pub fn new(config: StoreConfig, mutation: Mutation, rng: Rng) -> Self {
        Self {
            config,
            mutation,
            rng,
            up: true,
            durable: Data::default(),
            journal: VecDeque::new(),
            sled_disk: Data::default(),
            sled_damaged: false,
            base: Data::default(),
            unflushed: Vec::new(),
            sled: Data::default(),
            view: Data::default(),
            sealed: VecDeque::new(),
            next_group: 1,
            queue: VecDeque::new(),
            claims: HashMap::new(),
            answers: HashMap::new(),
            next_token: 1,
            fate: String::new(),
            kept_whole: 0,
            replayed: 0,
            rebuilt: 0,
            durable_version: 0,
            view_version: 0,
        }
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
    /// Whether a checkpoint has anything to do: groups applied since the last flush, or
    /// journal segments it may delete.
    pub fn checkpoint_due(&self) -> bool {
        self.sled.group > self.sled_disk.group || self.deletable(self.sled_disk.group) > 0
    }

    /// How many journal records, from the oldest, lie in segments whose groups are all at
    /// or below `group` and that are not the segment appended to.
    fn deletable(&self, group: u64) -> usize {
        let k = self.config.segment_groups.max(1);
        let segment = |n: u64| (n - 1) / k;
        let Some(current) = self.journal.back().map(|r| segment(r.number)) else {
            return 0;
        };
        self.journal
            .iter()
            .take_while(|r| segment(r.number) < current && (segment(r.number) + 1) * k <= group)
            .count()
    }
    /// What the two files kept at the last crash.
    pub fn fate(&self) -> &str {
        &self.fate
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
        if self.sled.keys.get(ck).is_none_or(|d| d.seq != rec.seq) {
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
            if let Some(rec) = self.sled.keys.get(ck) {
                return Some(match self.classify(rec.fingerprint, fingerprint) {
                    Seen::Reused => Ok(Submission::Reused),
                    _ => match self.sled.outcome(rec) {
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

    /// The decider's turn: stages up to `batch_max` queued commands against its view and
    /// seals them as the next journal group. Returns only the answers given while staging.
    pub fn decide(&mut self, now: Timestamp) -> Vec<(Ticket, Answer)> {
        if !self.up || self.queue.is_empty() {
            return Vec::new();
        }
        let n = self.config.batch_max.max(1).min(self.queue.len());
        let requests: Vec<Request> = self.queue.drain(..n).collect();
        let mut staged = Staged::default();
        let mut stats = self.view.stats.clone();
        let mut answers = Vec::with_capacity(requests.len());
        // Answers given while staging: a refund of a withdrawal in flight, told 409 with
        // nothing staged and its claim released at once.
        let mut at_once = Vec::new();
        for req in requests {
            let answer = self.stage(&mut staged, &mut stats, now, &req);
            if matches!(answer, Ok(Submission::InProgress { .. })) {
                if self
                    .claims
                    .get(&req.ck)
                    .is_some_and(|c| c.token == req.token)
                {
                    self.claims.remove(&req.ck);
                }
                at_once.push((req.ticket, answer));
                continue;
            }
            answers.push(Pending {
                ticket: req.ticket,
                ck: req.ck,
                token: req.token,
                fingerprint: req.fingerprint,
                answer,
            });
        }
        staged.writes.push(Write::Stats(stats));
        self.seal(staged.writes, answers);
        at_once
    }

    /// Seals a group: numbered next, in the decider's view from now on, queued for the
    /// syncer.
    fn seal(&mut self, writes: Vec<Write>, answers: Vec<Pending>) {
        let record = Record {
            number: self.next_group,
            writes: writes.into(),
        };
        self.next_group += 1;
        self.view.apply(&record);
        self.view_version += 1;
        self.sealed.push_back(Group { record, answers });
    }

    /// `Committer::stage`: the compare-and-swap on the key, then the pure decision.
    fn stage(
        &self,
        staged: &mut Staged,
        stats: &mut Stats,
        now: Timestamp,
        req: &Request,
    ) -> Answer {
        let (client, key) = &req.ck;
        if let Some(id) = &req.message {
            let seen = staged.inbox.get(id).or_else(|| self.view.inbox.get(id));
            if seen.is_some_and(|r| r.ck != req.ck || r.fingerprint != req.fingerprint) {
                // Kept with the reason, in the same batch as the refusal.
                let total = staged.quarantined.unwrap_or(self.view.quarantined) + 1;
                staged.quarantined = Some(total);
                staged.writes.push(Write::Quarantine(total));
                return Ok(Submission::Quarantined {
                    reason: "message_id_reused".into(),
                });
            }
        }
        let skip_compare =
            self.mutation == Mutation::RedeliveryExecutesAgain && req.message.is_some();
        let existing = if skip_compare {
            None
        } else {
            match staged.keys.get(&req.ck) {
                Some((f, fact)) => Some((*f, Some(Outcome::from_fact(fact)), 0)),
                None => self
                    .view
                    .keys
                    .get(&req.ck)
                    .map(|rec| (rec.fingerprint, self.view.outcome(rec), rec.seq)),
            }
        };
        if let Some((stored, outcome, seq)) = existing {
            return match self.classify(stored, req.fingerprint) {
                Seen::Reused => Ok(Submission::Reused),
                _ => match outcome {
                    Some(outcome) => {
                        self.note_message(staged, req, outcome.seq());
                        Ok(Submission::Replayed(outcome))
                    }
                    None => Err(StoreError::Corrupt(format!(
                        "the key record of {:?}/{:?} points at missing fact {seq}",
                        client, key
                    ))),
                },
            };
        }
        if self.withdrawal_in_flight(staged, req) {
            return Ok(Submission::InProgress {
                retry_after: Duration::from_secs(1),
            });
        }
        let inputs = self.inputs(staged, client, &req.command);
        let seq = stats.last_seq + 1;
        let at = if self.mutation == Mutation::ClockNotClamped {
            now
        } else {
            now.max(stats.last_at)
        };
        let fact = core::decide(client, key, &req.command, &inputs, seq, at);
        let outcome = Outcome::from_fact(&fact);
        staged.writes.push(Write::Fact(fact.clone()));
        staged.writes.push(Write::Key(
            req.ck.clone(),
            KeyRecord {
                seq,
                at,
                fingerprint: req.fingerprint,
                expired: false,
            },
        ));
        for (account, currency, delta) in legs(&fact) {
            let entry = staged.accounts.entry(account.clone()).or_insert_with(|| {
                self.view
                    .balances
                    .accounts
                    .get(account)
                    .cloned()
                    .unwrap_or_default()
            });
            let b = entry.entry(currency).or_insert(0);
            *b = b.saturating_add(delta);
            staged
                .writes
                .push(Write::Balance(account.clone(), currency, *b));
        }
        if let FactBody::RefundRecorded {
            withdrawal,
            refunded_total,
            ..
        } = &fact.body
        {
            let wk = (client.clone(), withdrawal.clone());
            staged.refunded.insert(wk.clone(), *refunded_total);
            staged.writes.push(Write::Refunded(wk, *refunded_total));
        }
        stats.apply(&fact);
        self.note_message(staged, req, seq);
        staged.keys.insert(req.ck.clone(), (req.fingerprint, fact));
        Ok(Submission::Executed(outcome))
    }

    /// `Committer::withdrawal_in_flight`: a refund whose withdrawal's key (the refund's
    /// client) is claimed and holds nothing yet, in this batch or in the view, is not
    /// decided now. The mutant decides it anyway.
    fn withdrawal_in_flight(&self, staged: &Staged, req: &Request) -> bool {
        let Command::Refund { withdrawal, .. } = &req.command else {
            return false;
        };
        let wk = (req.ck.0.clone(), withdrawal.clone());
        self.mutation != Mutation::RefundOvertakesWithdrawal
            && wk != req.ck
            && self.claims.contains_key(&wk)
            && !staged.keys.contains_key(&wk)
            && !self.view.keys.contains_key(&wk)
    }

    fn note_message(&self, staged: &mut Staged, req: &Request, seq: u64) {
        if let Some(id) = &req.message {
            let rec = InboxRecord {
                ck: req.ck.clone(),
                fingerprint: req.fingerprint,
                seq,
            };
            staged.writes.push(Write::Inbox(id.clone(), rec.clone()));
            staged.inbox.insert(id.clone(), rec);
        }
    }

    /// `Committer::inputs`: the account, and for a refund its withdrawal, as the batch sees
    /// them (staged first, then the view).
    fn inputs(&self, staged: &Staged, client: &ClientId, command: &Command) -> Inputs {
        let view = |account: &Account| -> Option<AccountView> {
            let per = match staged.accounts.get(account) {
                Some(per) => per,
                None => self.view.balances.accounts.get(account)?,
            };
            per.iter().next().map(|(c, b)| AccountView {
                currency: *c,
                balance: u128::try_from(*b).unwrap_or(0),
            })
        };
        match command {
            Command::Deposit { account, .. } | Command::Withdraw { account, .. } => Inputs {
                account: view(account),
                withdrawal: None,
            },
            Command::Refund { withdrawal, .. } => {
                let wk = (client.clone(), withdrawal.clone());
                let fact = match staged.keys.get(&wk) {
                    Some((_, fact)) => Some(fact.clone()),
                    None => self
                        .view
                        .keys
                        .get(&wk)
                        .and_then(|rec| self.view.facts.get(&rec.seq).cloned()),
                };
                let w = match fact.map(|f| f.body) {
                    Some(FactBody::WithdrawalRecorded {
                        account,
                        amount,
                        currency,
                        ..
                    }) => {
                        let refunded = if self.mutation == Mutation::ForgetRefunds {
                            0
                        } else {
                            staged
                                .refunded
                                .get(&wk)
                                .or_else(|| self.view.refunded.get(&wk))
                                .copied()
                                .unwrap_or(0)
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
                    account: w.as_ref().and_then(|w| view(&w.account)),
                    withdrawal: w,
                }
            }
        }
    }

    /// The syncer's turn: for each sealed group in order, one journal write, one journal
    /// sync, the apply to sled's memory, then the answers; or a death at `crash`, at the
    /// first group that passes it.
    pub fn sync(&mut self, crash: Option<Point>) -> Vec<(Ticket, Answer)> {
        let mut out = Vec::new();
        if !self.up {
            return out;
        }
        while let Some(Group {
            record,
            mut answers,
        }) = self.sealed.pop_front()
        {
            if crash == Some(Point::JournalBeforeWrite) {
                self.crash_in(None);
                return out;
            }
            // Written from here on, not yet synced.
            let applied_early = self.mutation == Mutation::ApplyBeforeJournalSync;
            if applied_early {
                self.apply_to_sled(&record);
            }
            if self.mutation == Mutation::AnswerBeforeJournalSync {
                out.extend(self.publish(std::mem::take(&mut answers)));
            }
            if crash == Some(Point::JournalAfterWrite) {
                self.crash_in(Some(record));
                return out;
            }
            self.journal_synced(record.clone());
            if crash == Some(Point::JournalAfterSync) {
                self.crash_in(None);
                return out;
            }
            if !applied_early {
                self.apply_to_sled(&record);
            }
            if crash == Some(Point::SyncAfterApply) {
                self.crash_in(None);
                return out;
            }
            out.extend(self.publish(answers));
        }
        out
    }

    /// A record is durable in the journal: the durable end moves to its group.
    fn journal_synced(&mut self, record: Record) {
        self.durable.apply(&record);
        self.durable_version += 1;
        self.journal.push_back(record);
    }

    /// One atomic sled batch: the group's writes and its number, in memory only.
    fn apply_to_sled(&mut self, record: &Record) {
        self.sled.apply(record);
        self.unflushed.push(record.clone());
    }

    /// Releases the claims and hands out the answers of a durable group.
    fn publish(&mut self, answers: Vec<Pending>) -> Vec<(Ticket, Answer)> {
        let mut out = Vec::with_capacity(answers.len());
        for p in answers {
            // Release before answering: a retry that follows the answer must find the key
            // done, not pending.
            if let Ok(Submission::Executed(outcome)) = &p.answer {
                self.answers
                    .insert(p.ck.clone(), (p.fingerprint, outcome.clone()));
            }
            if self.claims.get(&p.ck).is_some_and(|c| c.token == p.token) {
                self.claims.remove(&p.ck);
            }
            out.push((p.ticket, p.answer));
        }
        out
    }

    /// `Store::sweep` on sled: marks expired the keys whose facts are older than the retention,
    /// in a group of its own, durable once the syncer has passed it.
    pub fn sweep(&mut self, now: Timestamp) -> usize {
        if !self.up {
            return 0;
        }
        let horizon = now.saturating_sub_ms(self.config.retention_ms);
        let mut stats = self.view.stats.clone();
        let mut cursor = stats.sweep_cursor;
        let mut writes = Vec::new();
        let mut expired = 0;
        // sled reads an inverted range as empty; BTreeMap would panic on it.
        let range = (cursor < stats.last_seq).then_some(cursor + 1..=stats.last_seq);
        for (seq, fact) in range
            .map(|r| self.view.facts.range(r))
            .into_iter()
            .flatten()
            .take(10_000)
        {
            // Facts are recorded with non-decreasing time: the first one inside the
            // retention ends the sweep.
            if fact.at > horizon {
                break;
            }
            let ck = (fact.client.clone(), fact.key.clone());
            if let Some(rec) = self.view.keys.get(&ck)
                && !rec.expired
            {
                if self.mutation == Mutation::SweepForgetsKey {
                    writes.push(Write::ForgetKey(ck));
                } else {
                    let mut rec = rec.clone();
                    rec.expired = true;
                    writes.push(Write::Key(ck, rec));
                }
                stats.expire_one();
                expired += 1;
            }
            cursor = *seq;
        }
        stats.sweep_cursor = cursor;
        writes.push(Write::Stats(stats));
        self.seal(writes, Vec::new());
        expired
    }

    /// A checkpoint: takes the last group applied to sled, flushes sled (its disk now holds
    /// at least that group), then deletes the journal's segments whose groups are all at
    /// or below it, never the one appended to; or dies at `crash`. Returns the group and
    /// how many journal records went with the deleted segments.
    pub fn checkpoint(&mut self, crash: Option<Point>) -> (u64, usize) {
        if !self.up {
            return (0, 0);
        }
        let group = self.sled.group;
        self.sled_disk = self.sled.clone();
        self.unflushed.clear();
        // The base is durable before any segment goes: the planted bug deletes segments
        // that no base holds.
        if self.mutation != Mutation::CheckpointDeletesNeeded {
            self.base = self.sled.clone();
        }
        if crash == Some(Point::CompactBeforeDelete) {
            self.crash_in(None);
            return (group, 0);
        }
        let deleted = self.deletable(group);
        self.journal.drain(..deleted);
        if crash == Some(Point::CompactAfterDelete) {
            self.crash_in(None);
        }
        (group, deleted)
    }

    /// The process dies between two commits.
    pub fn crash(&mut self) {
        self.crash_in(None);
    }

    /// The process dies, `written` (if any) written to the journal and not synced. What
    /// each file keeps is chosen here, independently: the unsynced record whole, torn or
    /// lost; sled's disk at some group from its last flush to the last applied to memory.
    /// Memory is lost: sled's, the overlay, the queue, the claims, the answer cache.
    fn crash_in(&mut self, written: Option<Record>) {
        self.up = false;
        let mut fate = Vec::new();
        if let Some(record) = written {
            let number = record.number;
            match self.rng.below(3) {
                0 => {
                    fate.push(format!("the journal kept unsynced group {number} whole"));
                    self.kept_whole += 1;
                    self.journal_synced(record);
                }
                1 => fate.push(format!(
                    "the journal's unsynced group {number} was torn (cut off at recovery)"
                )),
                _ => fate.push(format!("the journal lost unsynced group {number}")),
            }
        }
        if self.mutation == Mutation::LoseSyncedGroup
            && let Some(lost) = self.journal.pop_back()
        {
            fate.push(format!("the journal lost SYNCED group {}", lost.number));
        }
        // sled writes its buffers when they fill, and the syncer applies a group one insert
        // at a time: its disk may hold any of the writes applied since the last checkpoint
        // (none, all, or some of each group), while the group it records is still the
        // checkpoint's. A third of the groups keep nothing, a third everything.
        let low = self.sled_disk.group;
        let high = self.sled.group;
        let mut kept = 0usize;
        for record in self.unflushed.drain(..) {
            let fate = self.rng.below(3);
            for w in record.writes.iter() {
                if fate == 1 || (fate == 2 && self.rng.below(2) == 0) {
                    self.sled_disk.write(w);
                    kept += 1;
                }
            }
        }
        fate.push(format!(
            "sled's disk holds {kept} writes of the groups after its checkpoint, group {low} \
             (applied up to {high})"
        ));
        if self.rng.below(4) == 0 {
            self.sled_damaged = true;
            fate.push("sled's files were left damaged (a torn or reordered write)".into());
        }
        self.fate = fate.join("; ");
        self.sled = self.durable.clone();
        self.view = self.durable.clone();
        self.view_version += 1;
        self.sealed.clear();
        self.queue.clear();
        self.claims.clear();
        self.answers.clear();
    }

    /// `SledStore::open`: sled's disk, then every journal group after the group it records;
    /// refuses a journal that does not continue sled, and a log tail and projections that
    /// disagree. The checker refuses a ledger that opens to anything but the journal's
    /// durable end.
    pub fn restart(&mut self) -> Result<(), String> {
        let g = self.sled_disk.group;
        let first = self.journal.front().map(|r| r.number);
        let last = self.journal.back().map_or(g, |r| r.number);
        let continues_sled = first.is_none_or(|f| f <= g + 1) && last >= g;
        let rebuild = self.sled_damaged || !continues_sled;
        let (mut recovered, from) = if rebuild {
            // The index is rebuilt from the log of record: the base, then every group after
            // it.
            let b = self.base.group;
            if let Some(first) = first
                && first > b + 1
            {
                return Err(format!(
                    "open refused: the index must be rebuilt, but the journal begins at group \
                     {first} and its base holds groups up to {b}: groups {} to {} are missing",
                    b + 1,
                    first - 1
                ));
            }
            self.sled_damaged = false;
            self.rebuilt += 1;
            (self.base.clone(), b)
        } else {
            (self.sled_disk.clone(), g)
        };
        for record in self.journal.iter().filter(|r| r.number > from) {
            recovered.apply(record);
            self.unflushed.push(record.clone());
            self.replayed += 1;
        }
        if rebuild {
            // A rebuild ends with the new index flushed and synced.
            self.sled_disk = recovered.clone();
            self.unflushed.clear();
        }
        let last = self.journal.back().map_or(recovered.group, |r| r.number);
        if recovered != self.durable {
            return Err(format!(
                "after the crash the ledger opened to group {} with {} facts, not to the \
                 journal's durable end, group {} with {} facts{}",
                recovered.group,
                recovered.facts.len(),
                self.durable.group,
                self.durable.facts.len(),
                differs(&recovered, &self.durable)
            ));
        }
        let d = &recovered;
        let tail = d.facts.keys().next_back().copied().unwrap_or(0);
        if tail != d.stats.last_seq {
            return Err(format!(
                "open refused: the log ends at seq {tail} but the stats say {}",
                d.stats.last_seq
            ));
        }
        if let Some(fact) = d.facts.values().next_back() {
            let ck = (fact.client.clone(), fact.key.clone());
            match d.keys.get(&ck) {
                Some(rec) if rec.seq == fact.seq => {}
                Some(rec) => {
                    return Err(format!(
                        "open refused: the last fact (seq {tail}) and its key record (seq {}) \
                         disagree",
                        rec.seq
                    ));
                }
                None => {
                    return Err(format!(
                        "open refused: the last fact (seq {tail}) has no key record"
                    ));
                }
            }
        }
        for (currency, sum) in d.balances.sums() {
            if sum != 0 {
                return Err(format!("open refused: balances in {currency} sum to {sum}"));
            }
        }
        self.next_group = last + 1;
        self.sled = recovered.clone();
        self.view = recovered;
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
