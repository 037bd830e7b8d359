//! PgStore's group commit: the commands of a lane that arrive while its previous group is
//! in flight are decided together, in one transaction with one commit (`idem_claim_group`,
//! then `idem_apply_group`, or `idem_apply_one` for a group of one fact, one statement per
//! write; `schema.sql` has them with what each step is for).
//!
//! Each process runs `PgConfig::lanes` lanes (one by default), each a task that runs one
//! group at a time on one connection. A command goes to the lane of the account it acts on
//! (a refund: of its withdrawal's key), so a hot account's commands meet in one lane and
//! its row is locked and written once per group. A lane takes the first command queued,
//! then every command queued behind it up to `PgConfig::group_max`, waiting for more only
//! while the first has waited less than `PgConfig::group_wait` (zero by default: a group
//! of one never waits). A command that finds its lane idle with nothing queued runs its
//! group of one on its own task, holding the lane meanwhile.
//!
//! Once a group is decided with writes to make, what queued behind it meanwhile is the
//! next group, and its BEGIN and claim go on the same connection right behind this
//! group's apply and COMMIT, sent together (`lane_turn`): the server runs the next claim
//! as soon as this group commits, without waiting for a round trip to the worker, and the
//! next group's first round trip is this group's last. Sent after the COMMIT, the claim
//! runs after it, so the two transactions are one after the other on the connection, as
//! every other lock taker sees them. If this group's transaction fails, the next group's
//! claim is rolled back before this group is tried again (its rows are locked by that
//! claim), and the next group claims again on its own.
//!
//! Within the group, commands are decided in arrival order, each seeing the balances and
//! refunded totals the earlier ones left. A business rejection is that command's fact; it
//! does not touch the others. A failure of the transaction answers nobody: a conflict
//! PostgreSQL resolves by rerunning (deadlock, serialization failure, a concurrent first
//! insert, a lost connection) reruns the whole group, which reads every key again, so a
//! group that did commit before its connection was lost is replayed, never applied twice;
//! an error a command of the group may have caused (a write that disagrees with the
//! decision, a stored fact that does not decode) splits the group in halves, until the
//! command at fault is answered with it alone.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;

use super::counters::counter_name;
use super::db::{P, Result, db_int, db_time, describe, get, ms_i32};
use super::lane::{Lane, Queued};
use super::shards::ShardSlot;
use super::state::{Inner, PgStore};
use super::tx::{Abort, OpenTx};
use crate::core::{self, AccountView, Inputs, Seen, WithdrawalView};
use crate::domain::{
    Account, Amount, ClientId, Command, Currency, Fingerprint, Key, MessageId, Timestamp,
};
use crate::fact::{Fact, FactBody, Outcome};
use crate::json;
use crate::projection;
use crate::store::{LedgerError, Submission, message_fingerprint};

/// Retry-After of a 409, as sled answers it: the commit usually takes milliseconds, and
/// the header is in whole seconds.
pub(super) const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How many times one command is run again after PostgreSQL aborted it for a conflict it
/// resolves that way (a deadlock, a serialization failure, a concurrent first insert of a
/// balance row).
const RETRIES: u32 = 5;

// The group's two statements (`idem_claim_group` and `idem_apply_group`, or
// `idem_apply_one` for a group of one fact; all in `schema.sql`), prepared once per
// connection (deadpool's cache) so that BEGIN and COMMIT ride beside them.
const SQL_CLAIM: &str = "SELECT r_i, r_state, r_message_claimed, r_hash, r_seq, \
     r_body, r_withdrawal_seq, r_withdrawal, r_client, r_name, r_currency, r_balance, r_total \
     FROM idem_claim_group($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
const SQL_APPLY: &str = "SELECT idem_apply_group($1, $2, $3, $4, $5, $6, $7, $8, \
     $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, \
     $27, $28, $29, $30, $31, $32, $33)";
/// The apply of a group of one fact, with the fact's values as scalars.
const SQL_APPLY_ONE: &str = "SELECT idem_apply_one($1, $2, $3, $4, $5, $6, $7, \
     $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)";
/// The SQLSTATE `idem_apply_group` and `idem_apply_one` raise when a write disagrees with
/// the decision.
const DISAGREE: &str = "IDM01";
/// What a quarantined reused message id is told, and kept with.
const MESSAGE_REUSED: &str = "message_id_reused: this message id was delivered before with \
     another payload";

/// Starts `n` lanes; each ends when the store is dropped (its sender with it).
pub(super) fn start_lanes(n: usize, store: &Weak<Inner>) -> Vec<Lane> {
    (0..n.max(1))
        .map(|_| {
            let (tx, rx) = mpsc::unbounded_channel();
            let lane = Lane {
                tx,
                queued: Arc::default(),
                busy: Arc::default(),
            };
            tokio::spawn(run_lane(
                store.clone(),
                rx,
                lane.queued.clone(),
                lane.busy.clone(),
            ));
            lane
        })
        .collect()
}

/// A lane's task: one group at a time, each group's claim sent behind the previous
/// group's COMMIT while commands are queued (see `lane_turn`). It holds the store only
/// while groups run, so a store that is dropped ends its lanes.
async fn run_lane(
    store: Weak<Inner>,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    queued: Arc<AtomicUsize>,
    busy: Arc<tokio::sync::Mutex<()>>,
) {
    while let Some(first) = rx.recv().await {
        let Some(inner) = store.upgrade() else {
            let _ = first.reply.send(Err(LedgerError::Closed));
            return;
        };
        let store = PgStore { inner };
        // A command running alone on its own task finishes first; what queued meanwhile
        // is gathered after it.
        let _busy = busy.lock().await;
        let group = store.gather(first, &mut rx).await;
        queued.fetch_sub(group.len(), Ordering::SeqCst);
        let mut turn = Some(Turn::new(group, None));
        while let Some(this) = turn {
            turn = store.lane_turn(this, &mut rx, &queued).await;
        }
    }
}

/// A group about to be decided by its lane, with its claim already answered when it
/// rode behind the previous group's COMMIT.
struct Turn<'a> {
    group: Vec<Queued>,
    /// How long its first command waited before the group's transaction began.
    waited: Duration,
    claimed: Option<Result<Claimed<'a>, Abort>>,
}

impl<'a> Turn<'a> {
    fn new(group: Vec<Queued>, claimed: Option<Result<Claimed<'a>, Abort>>) -> Self {
        let waited = group
            .first()
            .map_or(Duration::ZERO, |q| q.arrived.elapsed());
        Self {
            group,
            waited,
            claimed,
        }
    }
}

/// A group's transaction after its first round trip: BEGIN and the claim answered.
struct Claimed<'a> {
    /// Taken before the transaction and held to its end (see `SHARDS`).
    slot: ShardSlot<'a>,
    tx: OpenTx,
    at: Timestamp,
    /// The attempt's deadline, for both round trips.
    until: Instant,
    rows: Vec<Row>,
}

/// A group's transaction with every command decided, its writes not yet sent.
struct Staged<'a> {
    slot: ShardSlot<'a>,
    tx: OpenTx,
    at_db: DateTime<Utc>,
    until: Instant,
    work: Work,
    decided: Decided,
}

/// What one attempt at a group's transaction answers, once it has committed.
struct Decided {
    answers: Vec<Submission>,
    /// The latest fact number and time the group wrote or read.
    seq: u64,
    at: i64,
}

/// A command's row of `idem_claim_group`.
struct ClaimRow {
    state: String,
    message_claimed: bool,
    hash: Option<Vec<u8>>,
    seq: Option<i64>,
    body: Option<Vec<u8>>,
    withdrawal_seq: Option<i64>,
    withdrawal: Option<Vec<u8>>,
}

/// A user account as the group sees it: locked at the start, then changed by each
/// decided command.
struct AccountState {
    exists: bool,
    currency: Option<Currency>,
    start: u128,
    balance: u128,
    touched: bool,
}

impl AccountState {
    /// The group's net change to the account, as the apply's guard takes it.
    fn delta(&self) -> String {
        (i128::try_from(self.balance).unwrap_or(i128::MAX)
            - i128::try_from(self.start).unwrap_or(0))
        .to_string()
    }
}

/// A withdrawal's refunded total as the group sees it.
struct RefundedState {
    exists: bool,
    withdrawn: u64,
    start: u64,
    total: u64,
}

/// The group's working state and writes, in the making.
#[derive(Default)]
struct Work {
    accounts: HashMap<String, AccountState>,
    refunded: BTreeMap<(String, String), RefundedState>,
    /// Facts decided earlier in this group, by key: a refund may name one.
    decided: HashMap<(ClientId, Key), Fact>,
    facts: Vec<(Fact, Outcome, Fingerprint)>,
    system: BTreeMap<(String, Currency), i128>,
    counters: BTreeMap<String, i64>,
    /// Messages answered by a fact: (message id, seq).
    inbox: Vec<(String, i64)>,
    /// Messages claimed by a command that changed nothing (a 409, a reuse): their inbox
    /// row goes, so their redelivery is handled as new.
    forget: Vec<String>,
    /// Quarantined messages: (message id, payload).
    quarantine: Vec<(String, String)>,
}

impl Work {
    fn writes(&self) -> bool {
        !(self.facts.is_empty()
            && self.inbox.is_empty()
            && self.forget.is_empty()
            && self.quarantine.is_empty())
    }

    fn view(&self, account: &str) -> Option<AccountView> {
        let a = self.accounts.get(account)?;
        a.currency.map(|currency| AccountView {
            currency,
            balance: a.balance,
        })
    }
}

fn in_progress() -> Submission {
    Submission::InProgress {
        retry_after: RETRY_AFTER,
    }
}

/// A withdrawal fact as a refund reads it: (account, amount, currency).
fn withdrawal_of(fact: &Fact) -> Option<(Account, Amount, Currency)> {
    match &fact.body {
        FactBody::WithdrawalRecorded {
            account,
            amount,
            currency,
            ..
        } => Some((account.clone(), *amount, *currency)),
        _ => None,
    }
}

impl PgStore {
    /// Hands the command to its lane and waits for its group's answer.
    pub(super) async fn join_group(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        fingerprint: Fingerprint,
        message: Option<MessageId>,
    ) -> Result<Submission> {
        let lanes = &self.inner.lanes;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        match &command {
            Command::Deposit { account, .. } | Command::Withdraw { account, .. } => {
                account.as_str().hash(&mut h);
            }
            Command::Refund { withdrawal, .. } => {
                (client.as_str(), withdrawal.as_str()).hash(&mut h)
            }
        }
        let lane = usize::try_from(h.finish() % lanes.len().max(1) as u64).unwrap_or(0);
        let Some(lane) = lanes.get(lane) else {
            return Err(LedgerError::Closed);
        };
        let (reply, answer) = oneshot::channel();
        let queued = Queued {
            client: client.clone(),
            key: key.clone(),
            command,
            fingerprint,
            message,
            arrived: Instant::now(),
            reply,
        };
        // A lane that is idle with nothing queued would make a group of this command
        // alone: it runs here, on the command's own task, which saves the hand-over to
        // the lane's task and back (two wake-ups of another task, each a wait for a CPU
        // on a busy machine). Holding the lane keeps its groups one at a time; if this
        // task is dropped mid-group, only this command's transaction is rolled back.
        let idle = if lane.queued.load(Ordering::SeqCst) == 0 {
            lane.busy.try_lock().ok()
        } else {
            None
        };
        if let Some(_busy) = idle {
            self.run_group(vec![queued], None, Duration::ZERO).await;
        } else {
            lane.queued.fetch_add(1, Ordering::SeqCst);
            if let Err(unsent) = lane.tx.send(queued) {
                lane.queued.fetch_sub(1, Ordering::SeqCst);
                drop(unsent);
                return Err(LedgerError::Closed);
            }
        }
        answer.await.unwrap_or_else(|_| {
            Err(LedgerError::Unavailable(
                "the command's group ended without an answer; it may or may not be \
                 recorded: retry with the same key"
                    .into(),
            ))
        })
    }

    /// The group that starts with `first`: what is queued behind it, up to the size, and
    /// what arrives while the first has waited less than the group wait.
    async fn gather(&self, first: Queued, rx: &mut mpsc::UnboundedReceiver<Queued>) -> Vec<Queued> {
        let options = &self.inner.options;
        let max = options.group_max.max(1);
        let until = first.arrived + options.group_wait;
        let mut group = vec![first];
        while group.len() < max {
            match rx.try_recv() {
                Ok(q) => group.push(q),
                Err(_) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match tokio::time::timeout(left, rx.recv()).await {
                        Ok(Some(q)) => group.push(q),
                        _ => break,
                    }
                }
            }
        }
        group
    }

    /// Decides a group and answers each of its commands: again after a conflict, in
    /// halves after an error one of them may have caused. `first` is the outcome of an
    /// attempt at the whole group already made.
    async fn run_group(
        &self,
        group: Vec<Queued>,
        mut first: Option<Result<Decided, Abort>>,
        waited: Duration,
    ) {
        let mut todo = vec![group];
        while let Some(mut group) = todo.pop() {
            match self.group_attempts(&group, first.take()).await {
                Ok(decided) => self.answer_group(group, decided, waited),
                Err((_, true)) if group.len() > 1 => {
                    let second = group.split_off(group.len() / 2);
                    // The first half first: arrival order is kept.
                    todo.push(second);
                    todo.push(group);
                }
                Err((e, _)) => {
                    for q in group {
                        let _ = q.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Runs the group's transaction until it commits, within the attempt deadline each
    /// (`first`, when given, is the first attempt's outcome). An error comes with whether
    /// splitting the group may get past it.
    async fn group_attempts(
        &self,
        group: &[Queued],
        mut first: Option<Result<Decided, Abort>>,
    ) -> Result<Decided, (LedgerError, bool)> {
        let mut attempt = 0;
        loop {
            let outcome = match first.take() {
                Some(outcome) => outcome,
                None => self.group_attempt(group).await,
            };
            match outcome {
                Ok(decided) => return Ok(decided),
                Err(Abort::Retry(why)) => {
                    attempt += 1;
                    if attempt > RETRIES {
                        return Err((
                            LedgerError::Unavailable(format!(
                                "gave up after {RETRIES} retries: {why}"
                            )),
                            false,
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 2)).await;
                }
                Err(Abort::Command(e)) => return Err((e, true)),
                Err(Abort::Fail(e)) => return Err((e, false)),
            }
        }
    }

    /// How long one attempt may take before the answer is "unavailable": the server ends
    /// a session idle in a transaction after the lease; this also covers a network that
    /// went silent.
    fn attempt_deadline(&self) -> Duration {
        self.inner.rules.lease + self.inner.options.connect_timeout
    }

    /// Awaits one round trip of an attempt, within the attempt's deadline.
    async fn within<T>(
        &self,
        until: Instant,
        round_trip: impl Future<Output = Result<T, Abort>>,
    ) -> Result<T, Abort> {
        tokio::time::timeout_at(until.into(), round_trip)
            .await
            .unwrap_or_else(|_| {
                Err(Abort::Fail(LedgerError::Unavailable(format!(
                    "PostgreSQL did not answer within {:?}; the command may or may not be \
                     recorded: retry with the same key",
                    self.attempt_deadline()
                ))))
            })
    }

    /// One of the lane's groups. Once it is decided with writes to make, the commands
    /// queued behind it meanwhile become the next group, and that group's BEGIN and claim
    /// are sent on the same connection right behind this group's apply and COMMIT: the
    /// next group's first round trip rides in this group's last, and this group is
    /// answered as soon as its COMMIT is. Returns the next group, if there is one.
    async fn lane_turn<'s>(
        &'s self,
        turn: Turn<'s>,
        rx: &mut mpsc::UnboundedReceiver<Queued>,
        queued: &AtomicUsize,
    ) -> Option<Turn<'s>> {
        let Turn {
            group,
            waited,
            claimed,
        } = turn;
        let claimed = match claimed {
            Some(claimed) => claimed,
            None => self.begin(&group).await,
        };
        let staged = match claimed.and_then(|c| self.decide(&group, c)) {
            Ok(staged) if staged.work.writes() => staged,
            outcome => {
                let first = match outcome {
                    Ok(staged) => self.finish(staged).await,
                    Err(e) => Err(e),
                };
                self.run_group(group, Some(first), waited).await;
                return None;
            }
        };
        let max = self.inner.options.group_max.max(1);
        let mut next = Vec::new();
        while next.len() < max {
            match rx.try_recv() {
                Ok(q) => next.push(q),
                Err(_) => break,
            }
        }
        queued.fetch_sub(next.len(), Ordering::SeqCst);
        if next.is_empty() {
            let first = self.finish(staged).await;
            self.run_group(group, Some(first), waited).await;
            return None;
        }
        Some(self.pipeline(group, waited, staged, next).await)
    }

    /// This group's apply and COMMIT, then the next group's BEGIN and claim, all sent
    /// before any answer is read. If this group's transaction fails, the next group's
    /// claim is rolled back first (it may hold rows this group's next attempt must lock),
    /// and the next group starts over once this one is answered.
    async fn pipeline<'s>(
        &'s self,
        group: Vec<Queued>,
        waited: Duration,
        staged: Staged<'s>,
        next: Vec<Queued>,
    ) -> Turn<'s> {
        let Staged {
            slot,
            tx,
            at_db,
            until,
            work,
            decided,
        } = staged;
        // Both apply statements prepared beforehand, so that nothing waits for a
        // statement's description between the sends (each is prepared once per
        // connection; afterwards this is a lookup).
        let prepared = self
            .within(until, async {
                let conn = tx.conn()?;
                conn.prepare_cached(SQL_APPLY).await?;
                conn.prepare_cached(SQL_APPLY_ONE).await?;
                Ok(())
            })
            .await;
        if let Err(e) = prepared {
            drop((tx, slot));
            self.run_group(group, Some(Err(e)), waited).await;
            return Turn::new(next, None);
        }
        let shard = slot.shard().unwrap_or_else(|| self.next_shard());
        let next_slot = ShardSlot::take(&self.inner.shard_slots);
        // Never before this group's time, which is not yet published to `last_at`.
        let next_at = Timestamp(self.record_time().millis().max(decided.at));
        let next_until = Instant::now() + self.attempt_deadline();
        let next_waited = next.first().map_or(Duration::ZERO, |q| q.arrived.elapsed());
        let apply = async {
            match self
                .within(until, self.apply_round_trip(&tx, &work, at_db, shard))
                .await
            {
                Ok(()) => {
                    self.answer_group(group, decided, waited);
                    None
                }
                Err(e) => Some((group, e)),
            }
        };
        let claim = async {
            let at_db = db_time(next_at)?;
            self.within(next_until, self.claim_round_trip(&tx, &next, at_db))
                .await
        };
        self.inner.metrics.lock().pipelined += 1;
        let (failed, rows) = tokio::join!(apply, claim);
        drop(slot);
        match failed {
            None => {
                let claimed = rows.map(|rows| Claimed {
                    slot: next_slot,
                    tx,
                    at: next_at,
                    until: next_until,
                    rows,
                });
                Turn {
                    group: next,
                    waited: next_waited,
                    claimed: Some(claimed),
                }
            }
            Some((group, e)) => {
                if rows.is_ok() {
                    let _ = self.within(next_until, tx.rollback()).await;
                }
                drop((tx, next_slot));
                self.run_group(group, Some(Err(e)), waited).await;
                Turn::new(next, None)
            }
        }
    }

    /// Counts a committed group, then answers its commands (counted first, so that what
    /// a client reads in the metrics after its answer includes its group).
    fn answer_group(&self, group: Vec<Queued>, decided: Decided, waited: Duration) {
        let inner = &*self.inner;
        inner.durable_seq.fetch_max(decided.seq, Ordering::SeqCst);
        inner.last_at.fetch_max(decided.at, Ordering::SeqCst);
        {
            let n = group.len() as u64;
            let mut m = inner.metrics.lock();
            m.batches += 1;
            m.commands += n;
            m.batch_size_max = m.batch_size_max.max(n);
            m.last_batch_size = n;
            let waited = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
            m.batch_wait_sum_us = m.batch_wait_sum_us.saturating_add(waited);
            m.batch_wait_max_us = m.batch_wait_max_us.max(waited);
        }
        for (q, answer) in group.into_iter().zip(decided.answers) {
            let ck = (q.client, q.key);
            match &answer {
                Submission::Replayed(_) => {
                    inner.replayed.fetch_add(1, Ordering::Relaxed);
                    self.note(&ck, true);
                }
                Submission::Reused => {
                    inner.conflicts_reused.fetch_add(1, Ordering::Relaxed);
                    self.note(&ck, false);
                }
                Submission::InProgress { .. } => {
                    inner.conflicts_in_flight.fetch_add(1, Ordering::Relaxed);
                    self.note(&ck, false);
                }
                Submission::Executed(_) | Submission::Quarantined { .. } => {}
            }
            let _ = q.reply.send(Ok(answer));
        }
    }

    /// One attempt: the whole group in one transaction, in two round trips: BEGIN +
    /// `idem_claim_group`, the decisions here, then `idem_apply_group` + COMMIT (or
    /// ROLLBACK when nothing is written: every command was a replay or a 409).
    async fn group_attempt(&self, group: &[Queued]) -> Result<Decided, Abort> {
        let claimed = self.begin(group).await?;
        let staged = self.decide(group, claimed)?;
        self.finish(staged).await
    }

    /// The first round trip of an attempt, on a connection from the pool.
    async fn begin(&self, group: &[Queued]) -> Result<Claimed<'_>, Abort> {
        let inner = &*self.inner;
        let until = Instant::now() + self.attempt_deadline();
        let slot = ShardSlot::take(&inner.shard_slots);
        let tx = self
            .within(until, async { Ok(OpenTx::new(inner.pool.get().await?)) })
            .await?;
        let at = self.record_time();
        let rows = self
            .within(until, self.claim_round_trip(&tx, group, db_time(at)?))
            .await?;
        Ok(Claimed {
            slot,
            tx,
            at,
            until,
            rows,
        })
    }

    /// Every command of the group decided, in arrival order, from its claim.
    fn decide<'s>(&self, group: &[Queued], claimed: Claimed<'s>) -> Result<Staged<'s>, Abort> {
        let Claimed {
            slot,
            tx,
            at,
            until,
            rows,
        } = claimed;
        let (mut work, claimed) = self.read_claim(group.len(), &rows)?;
        let mut decided = Decided {
            answers: Vec::with_capacity(group.len()),
            seq: 0,
            at: at.millis(),
        };
        for (q, row) in group.iter().zip(claimed) {
            let answer = self.decide_one(q, row, at, &mut work, &mut decided)?;
            decided.answers.push(answer);
        }
        Ok(Staged {
            slot,
            tx,
            at_db: db_time(at)?,
            until,
            work,
            decided,
        })
    }

    /// The last round trip of an attempt: its writes and COMMIT, or a ROLLBACK when it
    /// has nothing to write.
    async fn finish(&self, staged: Staged<'_>) -> Result<Decided, Abort> {
        let Staged {
            slot,
            tx,
            at_db,
            until,
            work,
            decided,
        } = staged;
        if work.writes() {
            let shard = slot.shard().unwrap_or_else(|| self.next_shard());
            self.within(until, self.apply_round_trip(&tx, &work, at_db, shard))
                .await?;
        } else {
            self.within(until, tx.rollback()).await?;
        }
        Ok(decided)
    }

    /// Round trip 1: BEGIN, then the group's claims, reads and locks.
    async fn claim_round_trip(
        &self,
        tx: &OpenTx,
        group: &[Queued],
        at_db: DateTime<Utc>,
    ) -> Result<Vec<Row>, Abort> {
        let inner = &*self.inner;
        let conn = tx.conn()?;
        let stmt = conn.prepare_cached(SQL_CLAIM).await?;
        let clients: Vec<&str> = group.iter().map(|q| q.client.as_str()).collect();
        let keys: Vec<&str> = group.iter().map(|q| q.key.as_str()).collect();
        let hashes: Vec<&[u8]> = group.iter().map(|q| &q.fingerprint.0[..]).collect();
        let messages: Vec<Option<&str>> = group
            .iter()
            .map(|q| q.message.as_ref().map(MessageId::as_str))
            .collect();
        let message_fps: Vec<Option<Vec<u8>>> = group
            .iter()
            .map(|q| {
                q.message.as_ref().map(|_| {
                    message_fingerprint(&q.client, &q.key, &q.command)
                        .0
                        .to_vec()
                })
            })
            .collect();
        let (withdrawals, accounts): (Vec<Option<&str>>, Vec<Option<&str>>) = group
            .iter()
            .map(|q| match &q.command {
                Command::Refund { withdrawal, .. } => (Some(withdrawal.as_str()), None),
                Command::Deposit { account, .. } | Command::Withdraw { account, .. } => {
                    (None, Some(account.as_str()))
                }
            })
            .unzip();
        let wait_ms = ms_i32(inner.options.in_flight_wait);
        let lease_ms = ms_i32(inner.rules.lease);
        let params: [P; 10] = [
            &clients,
            &keys,
            &hashes,
            &at_db,
            &wait_ms,
            &messages,
            &message_fps,
            &withdrawals,
            &accounts,
            &lease_ms,
        ];
        tx.opened();
        let (begun, rows) = tokio::join!(conn.batch_execute("BEGIN"), conn.query(&stmt, &params));
        begun?;
        Ok(rows?)
    }

    /// The claim's rows: the locked accounts and refunded totals as the group's starting
    /// state, and each command's row in arrival order.
    fn read_claim(&self, n: usize, rows: &[Row]) -> Result<(Work, Vec<ClaimRow>), Abort> {
        let mut work = Work::default();
        let mut claimed: Vec<Option<ClaimRow>> = (0..n).map(|_| None).collect();
        for row in rows {
            let i: i32 = get(row, 0)?;
            let state: String = get(row, 1)?;
            match (i, state.as_str()) {
                (0, "account") => {
                    let name: String = get(row, 9)?;
                    let currency = self.currency(get(row, 10)?)?;
                    let balance = self.number(get(row, 11)?)?;
                    work.accounts.insert(
                        name,
                        AccountState {
                            exists: true,
                            currency: Some(currency),
                            start: balance,
                            balance,
                            touched: false,
                        },
                    );
                }
                (0, "refunded") => {
                    let total = u64::try_from(get::<i64>(row, 12)?).unwrap_or(0);
                    work.refunded.insert(
                        (get(row, 8)?, get(row, 9)?),
                        RefundedState {
                            exists: true,
                            // Read from the withdrawal's fact when a refund is decided.
                            withdrawn: 0,
                            start: total,
                            total,
                        },
                    );
                }
                _ => {
                    let slot = usize::try_from(i - 1)
                        .ok()
                        .and_then(|i| claimed.get_mut(i))
                        .ok_or_else(|| self.unexpected(format!("a row for command {i}")))?;
                    *slot = Some(ClaimRow {
                        state,
                        message_claimed: get(row, 2)?,
                        hash: get(row, 3)?,
                        seq: get(row, 4)?,
                        body: get(row, 5)?,
                        withdrawal_seq: get(row, 6)?,
                        withdrawal: get(row, 7)?,
                    });
                }
            }
        }
        let claimed = claimed
            .into_iter()
            .enumerate()
            .map(|(i, row)| row.ok_or_else(|| self.unexpected(format!("no row for command {i}"))))
            .collect::<Result<_, _>>()?;
        Ok((work, claimed))
    }

    fn unexpected(&self, what: String) -> Abort {
        Abort::Fail(LedgerError::Unavailable(format!(
            "idem_claim_group answered {what}"
        )))
    }

    /// One command's answer from its claim row, deciding it against the group's working
    /// state if it claimed its key.
    fn decide_one(
        &self,
        q: &Queued,
        row: ClaimRow,
        at: Timestamp,
        work: &mut Work,
        decided: &mut Decided,
    ) -> Result<Submission, Abort> {
        let message = q.message.as_ref().map(|m| m.as_str().to_owned());
        let claimed_message = message.filter(|_| row.message_claimed);
        match row.state.as_str() {
            "claimed" => {}
            "in_flight" => return Ok(in_progress()),
            "vanished" => return Err(Abort::Retry("a claimed row vanished".into())),
            "message_reused" => {
                let Some(id) = q.message.as_ref() else {
                    return Err(self.unexpected("a reused message id with no message".into()));
                };
                let payload = crate::json::inbox_message(id, &q.client, &q.key, &q.command);
                work.quarantine.push((id.as_str().to_owned(), payload));
                return Ok(Submission::Quarantined {
                    reason: MESSAGE_REUSED.into(),
                });
            }
            "seen" => return self.answer_seen(q, row, claimed_message, work, decided),
            other => return Err(self.unexpected(format!("{other:?}"))),
        }
        let seq = row
            .seq
            .ok_or_else(|| self.unexpected("a claimed key without a number".into()))?;
        let seq_u = u64::try_from(seq).map_err(|_| self.corrupt(format!("seq {seq}")))?;
        let inputs = match &q.command {
            Command::Deposit { account, .. } | Command::Withdraw { account, .. } => Inputs {
                account: work.view(account.as_str()),
                withdrawal: None,
            },
            Command::Refund { withdrawal, .. } => {
                let wk = (q.client.clone(), withdrawal.clone());
                let found = match (work.decided.get(&wk), row.withdrawal_seq, &row.withdrawal) {
                    (Some(fact), _, _) => Some(withdrawal_of(fact)),
                    (None, Some(s), Some(body)) => Some(withdrawal_of(&self.decode(s, body)?)),
                    _ => None,
                };
                // No withdrawal committed, none decided earlier in this group, and this
                // process holds its claim: it is in flight here (maybe later in this very
                // group), and the refund is not decided against its absence.
                if found.is_none()
                    && withdrawal != &q.key
                    && self.claimed_here(&q.client, withdrawal)
                {
                    work.forget.extend(claimed_message);
                    return Ok(in_progress());
                }
                let w = found.flatten();
                let refunded = w.as_ref().map_or(0, |_| {
                    work.refunded
                        .get(&(q.client.as_str().to_owned(), withdrawal.as_str().to_owned()))
                        .map_or(0, |r| r.total)
                });
                Inputs {
                    account: w.as_ref().and_then(|w| work.view(w.0.as_str())),
                    withdrawal: w.map(|(account, amount, currency)| WithdrawalView {
                        account,
                        currency,
                        amount,
                        refunded,
                    }),
                }
            }
        };
        let fact = core::decide(&q.client, &q.key, &q.command, &inputs, seq_u, at);
        self.stage(work, &fact, &inputs)?;
        if let Some(m) = claimed_message {
            work.inbox.push((m, seq));
        }
        let outcome = Outcome::from_fact(&fact);
        decided.seq = decided.seq.max(seq_u);
        work.decided
            .insert((q.client.clone(), q.key.clone()), fact.clone());
        work.facts.push((fact, outcome.clone(), q.fingerprint));
        Ok(Submission::Executed(outcome))
    }

    /// A done key: its replay, or `Reused` for another command. A new message for a done
    /// key is remembered with the key's fact, so its redelivery is known by id too.
    fn answer_seen(
        &self,
        q: &Queued,
        row: ClaimRow,
        claimed_message: Option<String>,
        work: &mut Work,
        decided: &mut Decided,
    ) -> Result<Submission, Abort> {
        let hash = row.hash.unwrap_or_default();
        let stored = Fingerprint(
            hash.as_slice()
                .try_into()
                .map_err(|_| self.corrupt("a key's fingerprint of the wrong length".into()))
                .map_err(Abort::Command)?,
        );
        if core::classify(Some(stored), q.fingerprint) == Seen::Reused {
            work.forget.extend(claimed_message);
            return Ok(Submission::Reused);
        }
        let fact = match (row.seq, row.body) {
            (Some(seq), Some(body)) => self.decode(seq, &body).map_err(Abort::Command)?,
            _ => {
                return Err(Abort::Command(self.corrupt(format!(
                    "key {:?} of {:?} is committed without its fact",
                    q.key.as_str(),
                    q.client.as_str()
                ))));
            }
        };
        if let Some(m) = claimed_message {
            work.inbox.push((m, db_int(fact.seq)?));
        }
        decided.seq = decided.seq.max(fact.seq);
        decided.at = decided.at.max(fact.at.millis());
        Ok(Submission::Replayed(Outcome::from_fact(&fact)))
    }

    fn disagree(&self, detail: String) -> Abort {
        Abort::Fail(LedgerError::Unavailable(format!(
            "the tables disagree with the decision, nothing was recorded: {detail}; run verify"
        )))
    }

    /// A decided fact's changes, carried into the group's working state and writes.
    fn stage(&self, work: &mut Work, fact: &Fact, inputs: &Inputs) -> Result<(), Abort> {
        for (account, currency, delta) in projection::legs(fact) {
            if account.is_system() {
                *work
                    .system
                    .entry((account.as_str().to_owned(), currency))
                    .or_insert(0) += delta;
                continue;
            }
            let a = work
                .accounts
                .entry(account.as_str().to_owned())
                .or_insert(AccountState {
                    exists: false,
                    currency: None,
                    start: 0,
                    balance: 0,
                    touched: false,
                });
            let after = i128::try_from(a.balance)
                .ok()
                .and_then(|b| b.checked_add(delta))
                .and_then(|b| u128::try_from(b).ok())
                .ok_or_else(|| {
                    self.disagree(format!("{account}'s balance would leave its range"))
                })?;
            a.balance = after;
            a.currency.get_or_insert(currency);
            a.touched = true;
        }
        if let FactBody::RefundRecorded {
            withdrawal,
            refunded_total,
            ..
        } = &fact.body
        {
            let withdrawn = inputs.withdrawal.as_ref().map_or(0, |w| w.amount.units());
            let r = work
                .refunded
                .entry((
                    fact.client.as_str().to_owned(),
                    withdrawal.as_str().to_owned(),
                ))
                .or_insert(RefundedState {
                    exists: false,
                    withdrawn,
                    start: 0,
                    total: 0,
                });
            r.withdrawn = withdrawn;
            r.total = *refunded_total;
        }
        *work.counters.entry(counter_name(&fact.body)).or_insert(0) += 1;
        Ok(())
    }

    /// Round trip 2: every write of the group and the COMMIT. `idem_apply_group`
    /// (or, for a group of one fact, `idem_apply_one`) checks each against the
    /// decisions and raises if one disagrees, which turns the COMMIT into a rollback.
    async fn apply_round_trip(
        &self,
        tx: &OpenTx,
        work: &Work,
        at_db: DateTime<Utc>,
        shard: i16,
    ) -> Result<(), Abort> {
        if let Some(one) = One::of(work) {
            return self.apply_one(tx, &one, at_db, shard).await;
        }
        let facts = &work.facts;
        let seqs = facts
            .iter()
            .map(|(f, ..)| db_int(f.seq))
            .collect::<Result<Vec<_>>>()?;
        let clients: Vec<&str> = facts.iter().map(|(f, ..)| f.client.as_str()).collect();
        let keys: Vec<&str> = facts.iter().map(|(f, ..)| f.key.as_str()).collect();
        let kinds: Vec<&str> = facts
            .iter()
            .map(|(f, ..)| f.body.persisted_name())
            .collect();
        let rejections: Vec<Option<&str>> = facts
            .iter()
            .map(|(f, ..)| match &f.body {
                FactBody::CommandRejected { rejection, .. } => Some(rejection.code()),
                _ => None,
            })
            .collect();
        let bodies: Vec<Vec<u8>> = facts.iter().map(|(f, ..)| f.encode()).collect();
        let docs: Vec<serde_json::Value> = facts.iter().map(|(f, ..)| json::fact(f)).collect();
        // Written as jsonb would print it (see `stored_response`).
        let responses: Vec<String> = facts.iter().map(|(_, o, _)| stored_response(o)).collect();
        let hashes: Vec<&[u8]> = facts.iter().map(|(.., fp)| &fp.0[..]).collect();
        // Accounts in name order (byte order, as the claim locked them).
        let accounts: BTreeMap<&str, &AccountState> = work
            .accounts
            .iter()
            .filter(|(_, a)| a.touched)
            .map(|(name, a)| (name.as_str(), a))
            .collect();
        let names: Vec<&str> = accounts.keys().copied().collect();
        let currencies: Vec<Option<&str>> = accounts
            .values()
            .map(|a| a.currency.as_ref().map(Currency::as_str))
            .collect();
        let deltas: Vec<String> = accounts.values().map(|a| a.delta()).collect();
        let exists: Vec<bool> = accounts.values().map(|a| a.exists).collect();
        let afters: Vec<String> = accounts.values().map(|a| a.balance.to_string()).collect();
        let refunded: Vec<(&(String, String), &RefundedState)> = work
            .refunded
            .iter()
            .filter(|(_, r)| r.total != r.start)
            .collect();
        let r_clients: Vec<&str> = refunded.iter().map(|((c, _), _)| c.as_str()).collect();
        let r_withdrawals: Vec<&str> = refunded.iter().map(|((_, w), _)| w.as_str()).collect();
        let r_refunds = refunded
            .iter()
            .map(|(_, r)| db_int(r.total - r.start))
            .collect::<Result<Vec<_>>>()?;
        let r_withdrawn = refunded
            .iter()
            .map(|(_, r)| db_int(r.withdrawn))
            .collect::<Result<Vec<_>>>()?;
        let r_exists: Vec<bool> = refunded.iter().map(|(_, r)| r.exists).collect();
        let r_afters = refunded
            .iter()
            .map(|(_, r)| db_int(r.total))
            .collect::<Result<Vec<_>>>()?;
        let system: Vec<(&(String, Currency), &i128)> =
            work.system.iter().filter(|(_, d)| **d != 0).collect();
        let s_accounts: Vec<&str> = system.iter().map(|((a, _), _)| a.as_str()).collect();
        let s_currencies: Vec<&str> = system.iter().map(|((_, c), _)| c.as_str()).collect();
        let s_deltas: Vec<String> = system.iter().map(|(_, d)| d.to_string()).collect();
        let c_names: Vec<&str> = work.counters.keys().map(String::as_str).collect();
        let c_counts: Vec<i64> = work.counters.values().copied().collect();
        let i_messages: Vec<&str> = work.inbox.iter().map(|(m, _)| m.as_str()).collect();
        let i_seqs: Vec<i64> = work.inbox.iter().map(|(_, s)| *s).collect();
        let forget: Vec<&str> = work.forget.iter().map(String::as_str).collect();
        let q_messages: Vec<&str> = work.quarantine.iter().map(|(m, _)| m.as_str()).collect();
        let q_reasons: Vec<&str> = work.quarantine.iter().map(|_| MESSAGE_REUSED).collect();
        let q_payloads: Vec<&str> = work.quarantine.iter().map(|(_, p)| p.as_str()).collect();
        let params: [P; 33] = [
            &at_db,
            &shard,
            &seqs,
            &clients,
            &keys,
            &kinds,
            &rejections,
            &bodies,
            &docs,
            &responses,
            &hashes,
            &names,
            &currencies,
            &deltas,
            &exists,
            &afters,
            &r_clients,
            &r_withdrawals,
            &r_refunds,
            &r_withdrawn,
            &r_exists,
            &r_afters,
            &s_accounts,
            &s_currencies,
            &s_deltas,
            &c_names,
            &c_counts,
            &i_messages,
            &i_seqs,
            &forget,
            &q_messages,
            &q_reasons,
            &q_payloads,
        ];
        self.apply_and_commit(tx, SQL_APPLY, &params).await
    }

    /// Round trip 2 for a group of one fact (see `One`): its writes as scalars, where the
    /// group's function takes 33 arrays.
    async fn apply_one(
        &self,
        tx: &OpenTx,
        one: &One<'_>,
        at_db: DateTime<Utc>,
        shard: i16,
    ) -> Result<(), Abort> {
        let (fact, outcome, fp) = one.fact;
        let seq = db_int(fact.seq)?;
        let (client, key, kind) = (
            fact.client.as_str(),
            fact.key.as_str(),
            fact.body.persisted_name(),
        );
        let rejection = match &fact.body {
            FactBody::CommandRejected { rejection, .. } => Some(rejection.code()),
            _ => None,
        };
        let body = fact.encode();
        let doc = json::fact(fact);
        let response = stored_response(outcome);
        let hash: &[u8] = &fp.0;
        let (name, currency, delta, exists, after) = match one.account {
            Some((name, a)) => (
                Some(name.as_str()),
                a.currency.as_ref().map(Currency::as_str),
                Some(a.delta()),
                a.exists,
                Some(a.balance.to_string()),
            ),
            None => (None, None, None, false, None),
        };
        let (s_name, s_currency, s_delta) = match one.system {
            Some(((a, c), d)) => (Some(a.as_str()), Some(c.as_str()), Some(d.to_string())),
            None => (None, None, None),
        };
        let (c_name, c_count) = (one.counter.0.as_str(), *one.counter.1);
        let params: [P; 21] = [
            &at_db,
            &shard,
            &seq,
            &client,
            &key,
            &kind,
            &rejection,
            &body,
            &doc,
            &response,
            &hash,
            &name,
            &currency,
            &delta,
            &exists,
            &after,
            &s_name,
            &s_currency,
            &s_delta,
            &c_name,
            &c_count,
        ];
        self.apply_and_commit(tx, SQL_APPLY_ONE, &params).await
    }

    /// Runs an apply statement with the COMMIT pipelined behind it: a disagreement with
    /// the decisions fails the command (its COMMIT rolled back), any other error the group.
    async fn apply_and_commit(
        &self,
        tx: &OpenTx,
        sql: &str,
        params: &[P<'_>],
    ) -> Result<(), Abort> {
        let conn = tx.conn()?;
        let stmt = conn.prepare_cached(sql).await?;
        let (applied, commit) =
            tokio::join!(conn.execute(&stmt, params), conn.batch_execute("COMMIT"));
        tx.closed();
        if let Err(e) = applied {
            if e.code().map(SqlState::code) == Some(DISAGREE) {
                return Err(match self.disagree(describe(&e)) {
                    Abort::Fail(e) => Abort::Command(e),
                    other => other,
                });
            }
            return Err(e.into());
        }
        commit?;
        Ok(())
    }
}

/// A group whose writes are one fact's: one fact that moves at most one user account and
/// one system account, with no refund, no message and nothing to quarantine (every group
/// at 1 connection). `idem_apply_one` writes it with one statement per row.
struct One<'a> {
    fact: &'a (Fact, Outcome, Fingerprint),
    account: Option<(&'a String, &'a AccountState)>,
    system: Option<(&'a (String, Currency), &'a i128)>,
    counter: (&'a String, &'a i64),
}

impl<'a> One<'a> {
    fn of(work: &'a Work) -> Option<Self> {
        let [fact] = work.facts.as_slice() else {
            return None;
        };
        let mut accounts = work.accounts.iter().filter(|(_, a)| a.touched);
        let mut system = work.system.iter().filter(|(_, d)| **d != 0);
        let mut counters = work.counters.iter();
        let one = Self {
            fact,
            account: accounts.next(),
            system: system.next(),
            counter: counters.next()?,
        };
        let more =
            accounts.next().is_some() || system.next().is_some() || counters.next().is_some();
        let other = work.refunded.values().any(|r| r.total != r.start)
            || !work.inbox.is_empty()
            || !work.forget.is_empty()
            || !work.quarantine.is_empty();
        (!more && !other).then_some(one)
    }
}

/// The key row's copy of an outcome's body: its JSON as PostgreSQL prints jsonb, the form
/// rows written as jsonb took when the column became text (`v12.sql`), so every row reads
/// alike and `verify` renders one form. Text rather than jsonb spares the server parsing
/// it and printing it again to digest it.
fn stored_response(outcome: &Outcome) -> String {
    let mut text = String::with_capacity(256);
    json::outcome_jsonb(outcome, &mut text);
    text
}
