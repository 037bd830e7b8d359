//! The simulated store: the sled store's semantics (ledger/src/store/sled/) without sled,
//! threads or a disk, so that one seeded run can put a crash between any two of its steps.
//!
//! What it mirrors, record for record: key records `{seq, at, fingerprint, expired}`, the
//! gapless fact log, balances per (account, currency), refunded totals per withdrawal, the
//! inbox by message id, the stats record written with every batch; claims with a lease and
//! the answer cache in memory; the decider staging a batch of at most `batch_max` commands
//! with the compare-and-swap on the key, then one atomic apply, then one flush for every
//! batch applied since, and answers only after that flush (but for a refund whose
//! withdrawal is still in flight, told 409 at once with nothing staged). Decisions are the
//! real `ledger::core::classify` and `ledger::core::decide`, answers the real
//! `Outcome::from_fact`, so the code under test is the ledger's own.
//!
//! The state is split the way a crash splits it: `durable` is what the last flush wrote;
//! `tree` is what sled holds in memory (durable plus every batch applied since). A crash
//! keeps `durable` and loses everything else.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use ledger::core::{self, AccountView, Inputs, Seen, WithdrawalView};
use ledger::projection::legs;
use ledger::{
    Account, Balances, ClientId, Command, Currency, Fact, FactBody, Fingerprint, Key, MessageId,
    Outcome, Stats, Submission, Timestamp,
};

use super::Mutation;

/// A key scoped by its client, as every record of the store is.
pub type Ck = (ClientId, Key);

/// Who is waiting for an answer: the simulation's own handle, opaque to the store.
pub type Ticket = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    pub batch_max: usize,
    pub lease_ms: i64,
    pub retention_ms: i64,
}

/// The four crash points of the real committer (ARCHITECTURE.md, crash points).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// The batch is staged, nothing is written.
    BeforeApply,
    /// The batch is in sled's memory, not on disk.
    AfterApply,
    /// Every applied batch is in memory; the flush has not started.
    BeforeFlush,
    /// Durable, and nobody has been told: no answer, no ack.
    AfterFlush,
}

impl Point {
    pub const ALL: [Point; 4] = [
        Point::BeforeApply,
        Point::AfterApply,
        Point::BeforeFlush,
        Point::AfterFlush,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Point::BeforeApply => "commit.before_apply",
            Point::AfterApply => "commit.after_apply",
            Point::BeforeFlush => "sync.before_flush",
            Point::AfterFlush => "sync.after_flush",
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

/// Everything sled holds, one map per record prefix.
#[derive(Debug, Clone, Default)]
pub struct Data {
    pub facts: BTreeMap<u64, Fact>,
    pub keys: BTreeMap<Ck, KeyRecord>,
    pub balances: Balances,
    pub refunded: BTreeMap<Ck, u64>,
    pub inbox: BTreeMap<MessageId, InboxRecord>,
    pub quarantined: u64,
    pub stats: Stats,
}

/// One record written by a batch.
#[derive(Debug, Clone)]
enum Write {
    Fact(Fact),
    Key(Ck, KeyRecord),
    /// Only [`Mutation::SweepForgetsKey`] writes this.
    ForgetKey(Ck),
    Balance(Account, Currency, i128),
    Refunded(Ck, u64),
    Inbox(MessageId, InboxRecord),
    Quarantine,
    Stats(Stats),
}

impl Data {
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
            Write::Quarantine => self.quarantined += 1,
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

/// An answer held until its batch is durable.
#[derive(Debug, Clone)]
struct Pending {
    ticket: Ticket,
    ck: Ck,
    token: u64,
    fingerprint: Fingerprint,
    answer: Answer,
}

#[derive(Debug, Default)]
struct Batch {
    writes: Vec<Write>,
    answers: Vec<Pending>,
}

/// One batch in the making: what its commands see of each other before it is applied.
#[derive(Default)]
struct Staged {
    writes: Vec<Write>,
    keys: HashMap<Ck, (Fingerprint, Fact)>,
    accounts: HashMap<Account, BTreeMap<Currency, i128>>,
    refunded: HashMap<Ck, u64>,
    inbox: HashMap<MessageId, InboxRecord>,
}

pub struct SimStore {
    config: StoreConfig,
    mutation: Mutation,
    up: bool,
    durable: Data,
    tree: Data,
    /// The durable state before the last flush, kept only for [`Mutation::LoseFlushedBatch`].
    before_last_flush: Option<Data>,
    /// Batches applied (in `tree`) and not yet flushed, oldest first.
    applied: Vec<Batch>,
    queue: VecDeque<Request>,
    claims: HashMap<Ck, Claim>,
    /// The shard's cache of durable answers; dies with the process.
    answers: HashMap<Ck, (Fingerprint, Outcome)>,
    next_token: u64,
    /// Bumped on every change of `durable` / `tree`, so the checker re-reads only changes.
    pub durable_version: u64,
    pub tree_version: u64,
}

impl SimStore {
    pub fn new(config: StoreConfig, mutation: Mutation) -> Self {
        Self {
            config,
            mutation,
            up: true,
            durable: Data::default(),
            tree: Data::default(),
            before_last_flush: None,
            applied: Vec::new(),
            queue: VecDeque::new(),
            claims: HashMap::new(),
            answers: HashMap::new(),
            next_token: 1,
            durable_version: 0,
            tree_version: 0,
        }
    }

    pub fn is_up(&self) -> bool {
        self.up
    }
    pub fn durable(&self) -> &Data {
        &self.durable
    }
    pub fn tree(&self) -> &Data {
        &self.tree
    }
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
    pub fn unflushed(&self) -> usize {
        self.applied.len()
    }
    pub fn claims(&self) -> usize {
        self.claims.len()
    }

    /// Under a live claim, what the key itself holds decides, as in
    /// `SledStore::submit_with`: a message → in flight (its id is checked first, by the
    /// committer); done with the arriving command and durable → its replay; done with it
    /// but not flushed → in flight; done with another command → reused; nothing yet →
    /// `None` (the claim decides).
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
        let rec = self.tree.keys.get(ck)?;
        if rec.fingerprint != fingerprint {
            return reused;
        }
        if self.durable.keys.get(ck).is_none_or(|d| d.seq != rec.seq) {
            return in_flight;
        }
        let outcome = self.tree.outcome(rec)?;
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

    /// `SledStore::submit_with`: answers at once (a conflict, a replay from the cache or the
    /// tree, or down), or claims the key, queues the command and returns `None`; the answer
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
            // No claim: the key is new or durably done, so a stored answer may be given.
            if let Some((stored, outcome)) = self.answers.get(ck) {
                return Some(Ok(match self.classify(*stored, fingerprint) {
                    Seen::Reused => Submission::Reused,
                    _ => Submission::Replayed(outcome.clone()),
                }));
            }
            if let Some(rec) = self.tree.keys.get(ck) {
                return Some(match self.classify(rec.fingerprint, fingerprint) {
                    Seen::Reused => Ok(Submission::Reused),
                    _ => match self.tree.outcome(rec) {
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

    /// The decider's turn: stages up to `batch_max` queued commands and applies them as one
    /// batch, or dies at `crash` on the way. Returns answers only for the mutant that
    /// answers before the flush.
    pub fn decide(&mut self, now: Timestamp, crash: Option<Point>) -> Vec<(Ticket, Answer)> {
        if !self.up || self.queue.is_empty() {
            return Vec::new();
        }
        let n = self.config.batch_max.max(1).min(self.queue.len());
        let requests: Vec<Request> = self.queue.drain(..n).collect();
        let mut staged = Staged::default();
        let mut stats = self.tree.stats.clone();
        let mut answers = Vec::with_capacity(requests.len());
        // Answers given while staging, before any crash point: a refund of a withdrawal
        // in flight, told 409 with nothing staged and its claim released at once.
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
        if crash == Some(Point::BeforeApply) {
            self.crash();
            return at_once;
        }
        staged.writes.push(Write::Stats(stats));
        self.apply(Batch {
            writes: staged.writes,
            answers,
        });
        if crash == Some(Point::AfterApply) {
            self.crash();
            return at_once;
        }
        if self.mutation == Mutation::AnswerBeforeFlush {
            let answers = self
                .applied
                .last_mut()
                .map(|b| std::mem::take(&mut b.answers))
                .unwrap_or_default();
            at_once.extend(self.publish(answers));
        }
        at_once
    }

    fn apply(&mut self, batch: Batch) {
        for w in &batch.writes {
            self.tree.write(w);
        }
        self.tree_version += 1;
        self.applied.push(batch);
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
            let seen = staged.inbox.get(id).or_else(|| self.tree.inbox.get(id));
            if seen.is_some_and(|r| r.ck != req.ck || r.fingerprint != req.fingerprint) {
                // Kept with the reason, in the same batch as the refusal.
                staged.writes.push(Write::Quarantine);
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
                    .tree
                    .keys
                    .get(&req.ck)
                    .map(|rec| (rec.fingerprint, self.tree.outcome(rec), rec.seq)),
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
                self.tree
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
    /// client) is claimed and holds nothing yet, in this batch or in the tree, is not
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
            && !self.tree.keys.contains_key(&wk)
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
    /// them (staged first, then the tree).
    fn inputs(&self, staged: &Staged, client: &ClientId, command: &Command) -> Inputs {
        let view = |account: &Account| -> Option<AccountView> {
            let per = match staged.accounts.get(account) {
                Some(per) => per,
                None => self.tree.balances.accounts.get(account)?,
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
                        .tree
                        .keys
                        .get(&wk)
                        .and_then(|rec| self.tree.facts.get(&rec.seq).cloned()),
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
                                .or_else(|| self.tree.refunded.get(&wk))
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

    /// The syncer's turn: one flush for every batch applied since the last, then the
    /// answers, or a death at `crash` on the way.
    pub fn sync(&mut self, crash: Option<Point>) -> Vec<(Ticket, Answer)> {
        if !self.up || self.applied.is_empty() {
            return Vec::new();
        }
        if crash == Some(Point::BeforeFlush) {
            self.crash();
            return Vec::new();
        }
        if self.mutation == Mutation::LoseFlushedBatch {
            self.before_last_flush = Some(self.durable.clone());
        }
        let batches = std::mem::take(&mut self.applied);
        for b in &batches {
            for w in &b.writes {
                self.durable.write(w);
            }
        }
        self.durable_version += 1;
        if crash == Some(Point::AfterFlush) {
            self.crash();
            return Vec::new();
        }
        let answers = batches.into_iter().flat_map(|b| b.answers).collect();
        self.publish(answers)
    }

    /// Releases the claims and hands out the answers of a durable batch.
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
    /// in its own batch, durable with the next flush.
    pub fn sweep(&mut self, now: Timestamp) -> usize {
        if !self.up {
            return 0;
        }
        let horizon = now.saturating_sub_ms(self.config.retention_ms);
        let mut stats = self.tree.stats.clone();
        let mut cursor = stats.sweep_cursor;
        let mut writes = Vec::new();
        let mut expired = 0;
        // sled reads an inverted range as empty; BTreeMap would panic on it.
        let range = (cursor < stats.last_seq).then_some(cursor + 1..=stats.last_seq);
        for (seq, fact) in range
            .map(|r| self.tree.facts.range(r))
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
            if let Some(rec) = self.tree.keys.get(&ck)
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
        self.apply(Batch {
            writes,
            answers: Vec::new(),
        });
        expired
    }

    /// The process dies: only what was flushed stays.
    pub fn crash(&mut self) {
        self.up = false;
        if let Some(before) = self.before_last_flush.take() {
            self.durable = before;
            self.durable_version += 1;
        }
        self.tree = self.durable.clone();
        self.tree_version += 1;
        self.applied.clear();
        self.queue.clear();
        self.claims.clear();
        self.answers.clear();
    }

    /// `SledStore::open`: refuses to start on a log tail and projections that disagree.
    pub fn restart(&mut self) -> Result<(), String> {
        let d = &self.durable;
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
        self.up = true;
        Ok(())
    }
}
