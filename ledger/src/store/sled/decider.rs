//! The sled store's decider: takes commands, decides each against the ledger's working
//! state (claims, balances, refunds, keys, inbox ids), stages them into groups, and seals
//! each group as the journal record to write. It touches no file, thread, channel or clock
//! of its own: reads come through [`Reads`] (the index as the applied groups left it, and
//! the claims), the time is given, and what it decides comes out as values ([`Sealed`]
//! groups, answers). The committer drives it with its threads, its journal and sled; the
//! deterministic simulation drives the same code over an index in memory.
//!
//! The working state is the index plus every group sealed since that the index does not
//! hold yet (`unapplied`, read before the index), plus the group in the making
//! ([`Staged`], read before both). Balances and stats are kept whole in memory.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use crate::core::{self, AccountView, Inputs, Seen, WithdrawalView};
use crate::domain::{Account, ClientId, Command, Currency, Fingerprint, Key, MessageId, Timestamp};
use crate::fact::{DecodeError, Fact, FactBody, Outcome};
use crate::projection::{Balances, Observed, Stats};
use crate::store::{LedgerError, Quarantined, Submission, message_fingerprint};

use super::index::Index;
use super::journal::Group;
use super::records::{
    InboxRecord, KeyRecord, P_KEY, P_REFUNDED, STATS_KEY, account_key, decode, encode, inbox_key,
    io_err, quarantine_key, scoped_key,
};
use super::statements::Tail;

type Result<T> = std::result::Result<T, LedgerError>;

/// A key scoped by its client, as every record of the store is.
pub type Ck = (ClientId, Key);

/// What the decider reads and does not own.
pub trait Reads {
    type Index: Index;
    /// The index, holding every group applied so far (and perhaps none sealed after).
    fn index(&self) -> &Self::Index;
    /// Whether the key is claimed by a command on its way.
    fn claimed(&self, ck: &Ck) -> bool;
    /// The error a record that cannot be read is reported as.
    fn corrupt(&self, e: DecodeError) -> LedgerError;
}

/// One command as the decider takes it: its key, the command, the command's fingerprint,
/// and the inbox message that carried it, if any.
pub struct Arrival<'a> {
    pub ck: &'a Ck,
    pub command: &'a Command,
    pub fingerprint: Fingerprint,
    pub message: Option<MessageId>,
}

/// The most accounts whose last statement run the decider keeps.
pub const TAILS_MAX: usize = 16_384;

/// What a group writes that deciding reads back: done keys with their facts, refunded
/// totals, inbox records. (Balances and stats are in the working state already.)
#[derive(Default)]
struct Written {
    keys: HashMap<Ck, (Fingerprint, Fact)>,
    refunded: HashMap<Ck, u64>,
    inbox: HashMap<MessageId, Fingerprint>,
}

/// One group in the making, with the answers it holds back (`A`: whatever the driver
/// answers with). Nothing here reaches the working state until it is sealed.
pub struct Staged<A> {
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
    /// Commands staged (answered once the group is durable): what the leader counts.
    commands: usize,
    /// Every answer the group holds back, commands' and others'.
    pub answers: Vec<A>,
}

impl<A> Default for Staged<A> {
    fn default() -> Self {
        Self {
            group: Group::default(),
            facts: Vec::new(),
            written: Written::default(),
            accounts: HashMap::new(),
            tails: HashMap::new(),
            filled: Vec::new(),
            commands: 0,
            answers: Vec::new(),
        }
    }
}

/// A sealed group, on its way to the journal, then the index, then its answers.
pub struct Sealed<A> {
    /// `None`: nothing to write (a barrier).
    pub group: Option<Group>,
    pub answers: Vec<A>,
    /// The balances of the accounts the group moved, as it leaves them.
    pub accounts: HashMap<Account, BTreeMap<Currency, i128>>,
    pub stats: Stats,
}

/// A group the decider refused to seal: an invariant would break. Nothing of it is
/// written; the working state is as before it.
pub struct Broken<A> {
    pub reason: String,
    pub answers: Vec<A>,
}

pub struct Decider {
    next_quarantine: u64,
    /// The number the next sealed group gets: the journal's next.
    next_group: u64,
    /// The working state: the index's, plus every group sealed since.
    balances: Balances,
    stats: Stats,
    /// What the groups sealed but not yet in the index wrote that deciding reads back,
    /// oldest first; forgotten as the driver reports groups applied ([`Decider::applied`]).
    unapplied: VecDeque<(u64, Written)>,
    /// How many commands the last group sealed held (see `committer::Lead`).
    last_group: usize,
    /// The last statement run of recently moved accounts, extended by their next
    /// movements. Forgotten wholesale past [`TAILS_MAX`] accounts: an account not here
    /// starts a new run, which costs a record, not correctness.
    tails: HashMap<Account, Tail>,
    /// The heap bytes of the runs' values in `tails`.
    tails_heap: u64,
}

/// What is wrong with a group about to be sealed, if anything: its facts must take the
/// seqs right after `sealed_last` (the last sealed one), in order and without a gap, up to
/// `working_last` (the working stats' last seq); no user account may be left below zero;
/// and the balances it sets must move each currency by zero in all (double entry), from
/// `before`.
fn broken_group(
    sealed_last: u64,
    facts: &[(u64, Vec<u8>)],
    accounts: &HashMap<Account, BTreeMap<Currency, i128>>,
    before: &Balances,
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
    let mut moved: BTreeMap<Currency, i128> = BTreeMap::new();
    for (account, per) in accounts {
        if !account.is_system() && per.values().any(|b| *b < 0) {
            return Some(format!("{account} would be left below zero"));
        }
        let old = before.accounts.get(account);
        for (currency, balance) in per {
            let was = old.and_then(|o| o.get(currency)).copied().unwrap_or(0);
            let m = moved.entry(*currency).or_insert(0);
            *m = m.saturating_add(balance.saturating_sub(was));
        }
    }
    moved
        .into_iter()
        .find(|(_, m)| *m != 0)
        .map(|(currency, m)| format!("the group's balances move {currency} by {m} in all"))
}

impl Decider {
    /// A decider over a ledger whose index holds `balances` and `stats` and every group
    /// before `next_group`; `next_quarantine` is the next free quarantine id.
    pub fn new(next_group: u64, next_quarantine: u64, balances: Balances, stats: Stats) -> Self {
        Self {
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

    /// The number the next sealed group gets.
    pub fn next_group(&self) -> u64 {
        self.next_group
    }

    /// The working stats, as the last sealed group leaves them.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The working balances, as the last sealed group leaves them.
    pub fn balances(&self) -> &Balances {
        &self.balances
    }

    /// How many commands the last group sealed held.
    pub fn last_group(&self) -> usize {
        self.last_group
    }

    /// The statement runs kept: how many, and their values' heap bytes.
    pub fn tails_use(&self) -> (usize, u64) {
        (self.tails.len(), self.tails_heap)
    }

    /// Sealed groups the index does not hold yet.
    pub fn unapplied(&self) -> usize {
        self.unapplied.len()
    }

    /// The index holds every group up to `group`: what they wrote is read there from now.
    pub fn applied(&mut self, group: u64) {
        while self.unapplied.front().is_some_and(|(n, _)| *n <= group) {
            self.unapplied.pop_front();
        }
    }

    /// What the group in the making, or the newest sealed group not yet in the index,
    /// wrote under one record (`get` picks it out of a group's writes); `None`: the index
    /// decides.
    fn written<'a, A, T>(
        &'a self,
        staged: &'a Staged<A>,
        get: impl Fn(&'a Written) -> Option<T>,
    ) -> Option<T> {
        get(&staged.written).or_else(|| self.unapplied.iter().rev().find_map(|(_, w)| get(w)))
    }

    /// Decides one command into the group in the making: the compare-and-swap on its key,
    /// then the pure decision, then its fact, key record and projections. A command whose
    /// answer is `InProgress` (a refund of a withdrawal in flight) stages nothing; any
    /// other answer is held until the group is durable.
    pub fn decide<A>(
        &mut self,
        reads: &impl Reads,
        staged: &mut Staged<A>,
        stats: &mut Stats,
        now: Timestamp,
        arrival: Arrival<'_>,
    ) -> Result<Submission> {
        let answer = self.stage(reads, staged, stats, now, arrival)?;
        if !matches!(answer, Submission::InProgress { .. }) {
            staged.commands += 1;
        }
        Ok(answer)
    }

    fn stage<A>(
        &mut self,
        reads: &impl Reads,
        staged: &mut Staged<A>,
        stats: &mut Stats,
        now: Timestamp,
        arrival: Arrival<'_>,
    ) -> Result<Submission> {
        let Arrival {
            ck,
            command,
            fingerprint,
            message,
        } = arrival;
        let (client, key) = ck;
        if let Some(message_id) = &message
            && let Some(refused) =
                self.reused_message(reads, staged, now, message_id, client, key, command)?
        {
            return Ok(refused);
        }
        // The compare: is the key taken, in this batch or on disk?
        if let Some((stored, outcome)) = self.existing(reads, staged, ck)? {
            return Ok(match core::classify(Some(stored), fingerprint) {
                Seen::Reused => Submission::Reused,
                _ => {
                    self.note_message(staged, message, client, key, command, outcome.seq());
                    Submission::Replayed(outcome)
                }
            });
        }
        if self.withdrawal_in_flight(reads, staged, ck, command)? {
            return Ok(Submission::InProgress {
                retry_after: Duration::from_secs(1),
            });
        }
        // The swap: decide and stage the fact with everything it changes.
        let inputs = self.inputs(reads, staged, client, command)?;
        let seq = stats.last_seq + 1;
        let at = now.max(stats.last_at);
        let fact = core::decide(client, key, command, &inputs, seq, at);
        let outcome = Outcome::from_fact(&fact);
        self.stage_fact(staged, &fact, fingerprint);
        stats.apply(&fact);
        self.note_message(staged, message, client, key, command, seq);
        staged.written.keys.insert(ck.clone(), (fingerprint, fact));
        Ok(Submission::Executed(outcome))
    }

    /// The refusal of a message whose id the inbox saw with another payload, kept in
    /// quarantine with the reason in the same group; `None` for a new id or a redelivery.
    #[allow(clippy::too_many_arguments)]
    fn reused_message<A>(
        &mut self,
        reads: &impl Reads,
        staged: &mut Staged<A>,
        now: Timestamp,
        message_id: &MessageId,
        client: &ClientId,
        key: &Key,
        command: &Command,
    ) -> Result<Option<Submission>> {
        let mfp = message_fingerprint(client, key, command);
        let seen = match self.written(staged, |w| w.inbox.get(message_id).copied()) {
            Some(f) => Some(f),
            None => match reads.index().get(&inbox_key(message_id)).map_err(io_err)? {
                Some(v) => Some(
                    decode::<InboxRecord>("inbox record", &v)
                        .map_err(|e| reads.corrupt(e))?
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
        let payload = crate::json::inbox_message(message_id, client, key, command);
        self.quarantine(
            staged,
            now,
            Some(message_id.as_str().to_owned()),
            reason.into(),
            payload,
        );
        Ok(Some(Submission::Quarantined {
            reason: reason.into(),
        }))
    }

    /// Keeps a message the inbox refused in quarantine, in the group in the making; returns
    /// its id.
    pub fn quarantine<A>(
        &mut self,
        staged: &mut Staged<A>,
        now: Timestamp,
        message_id: Option<String>,
        reason: String,
        payload: String,
    ) -> u64 {
        let id = self.next_quarantine;
        self.next_quarantine += 1;
        let record = Quarantined {
            id,
            at: now,
            message_id,
            reason,
            payload,
        };
        staged.group.put(quarantine_key(id), encode(&record));
        id
    }

    /// What the key holds, in a group not yet in the index or in the index: its command's
    /// fingerprint and its answer; `None` for a key not done.
    fn existing<A>(
        &self,
        reads: &impl Reads,
        staged: &Staged<A>,
        ck: &Ck,
    ) -> Result<Option<(Fingerprint, Outcome)>> {
        if let Some((f, fact)) = self.written(staged, |w| w.keys.get(ck)) {
            return Ok(Some((*f, Outcome::from_fact(fact))));
        }
        let Some(bytes) = reads
            .index()
            .get(&scoped_key(P_KEY, &ck.0, ck.1.as_str()))
            .map_err(io_err)?
        else {
            return Ok(None);
        };
        let rec = KeyRecord::decode(&bytes).map_err(|e| reads.corrupt(e))?;
        let fact = fact(reads, rec.seq)?.ok_or_else(|| {
            reads.corrupt(DecodeError::new(
                "key record",
                format!("its fact {} is missing", rec.seq),
            ))
        })?;
        Ok(Some((rec.fingerprint, Outcome::from_fact(&fact))))
    }

    /// Stages a decided fact with its key record, balances and refunded total.
    fn stage_fact<A>(&self, staged: &mut Staged<A>, fact: &Fact, fingerprint: Fingerprint) {
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
            // a system account too, whose balance would be put once per command.
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

    fn note_message<A>(
        &self,
        staged: &mut Staged<A>,
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
    /// group not yet in the index or in the index. That happens when the refund overtook
    /// its withdrawal: the withdrawal was claimed, but queued after the refund. Deciding
    /// now would store `withdrawal_not_found` for ever under the refund's key, so the
    /// refund is told to come again instead. A refund that names its own key sees its own
    /// claim, which is no withdrawal. The claim is looked at first: a withdrawal that is
    /// not in flight costs no read.
    fn withdrawal_in_flight<A>(
        &self,
        reads: &impl Reads,
        staged: &Staged<A>,
        ck: &Ck,
        command: &Command,
    ) -> Result<bool> {
        let Command::Refund { withdrawal, .. } = command else {
            return Ok(false);
        };
        let wk = (ck.0.clone(), withdrawal.clone());
        if wk == *ck || !reads.claimed(&wk) {
            return Ok(false);
        }
        if self.written(staged, |w| w.keys.get(&wk)).is_some() {
            return Ok(false);
        }
        let on_disk = reads
            .index()
            .get(&scoped_key(P_KEY, &wk.0, wk.1.as_str()))
            .map_err(io_err)?
            .is_some();
        Ok(!on_disk)
    }

    /// Loads what the decision reads: the account, and for a refund its withdrawal.
    fn inputs<A>(
        &self,
        reads: &impl Reads,
        staged: &Staged<A>,
        client: &ClientId,
        command: &Command,
    ) -> Result<Inputs> {
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
                    None => match reads
                        .index()
                        .get(&scoped_key(P_KEY, client, withdrawal.as_str()))
                        .map_err(io_err)?
                    {
                        None => None,
                        Some(bytes) => {
                            let rec = KeyRecord::decode(&bytes).map_err(|e| reads.corrupt(e))?;
                            fact(reads, rec.seq)?
                        }
                    },
                };
                let view = match fact.map(|f| f.body) {
                    Some(FactBody::WithdrawalRecorded {
                        account,
                        amount,
                        currency,
                        ..
                    }) => Some(WithdrawalView {
                        account,
                        currency,
                        amount,
                        refunded: self.refunded(reads, staged, &wk)?,
                    }),
                    _ => None,
                };
                Inputs {
                    account: view.as_ref().and_then(|w| account_view(&w.account)),
                    withdrawal: view,
                }
            }
        })
    }

    /// What the withdrawal under `wk` has had refunded so far.
    fn refunded<A>(&self, reads: &impl Reads, staged: &Staged<A>, wk: &Ck) -> Result<u64> {
        if let Some(r) = self.written(staged, |w| w.refunded.get(wk).copied()) {
            return Ok(r);
        }
        let stored = reads
            .index()
            .get(&scoped_key(P_REFUNDED, &wk.0, wk.1.as_str()))
            .map_err(io_err)?;
        match stored {
            None => Ok(0),
            Some(v) => Ok(u64::from_be_bytes(v.as_ref().try_into().map_err(|_| {
                reads.corrupt(DecodeError::new("refunded total", "length"))
            })?)),
        }
    }

    /// Seals the staged group as the next journal group; `Ok(None)`: nothing to write.
    /// The working state takes the group at once: the next decisions build on it, reading
    /// what the index does not hold yet from `unapplied`. What the group is about to make
    /// durable is checked first, in release builds too: a broken invariant refuses the
    /// group (the driver stops writing, as on a storage failure) rather than writing a
    /// wrong ledger, and `stats` goes back to the working state's.
    pub fn seal<A>(
        &mut self,
        staged: Staged<A>,
        stats: &mut Stats,
        observed: Observed,
    ) -> std::result::Result<Option<Sealed<A>>, Broken<A>> {
        if staged.answers.is_empty() {
            return Ok(None);
        }
        let Staged {
            mut group,
            facts,
            written,
            accounts,
            tails,
            filled,
            commands,
            answers,
        } = staged;
        let broken = broken_group(
            self.stats.last_seq,
            &facts,
            &accounts,
            &self.balances,
            stats.last_seq,
        );
        if let Some(reason) = broken {
            *stats = self.stats.clone();
            return Err(Broken { reason, answers });
        }
        stats.observed = observed;
        self.last_group = commands;
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
        for (account, per) in &accounts {
            self.balances.accounts.insert(account.clone(), per.clone());
        }
        self.stats = stats.clone();
        self.unapplied.push_back((group.number, written));
        Ok(Some(Sealed {
            group: Some(group),
            answers,
            accounts,
            stats: stats.clone(),
        }))
    }

    /// A barrier: a sealed "group" that writes nothing and holds `answers` until every
    /// group sealed before it is through.
    pub fn barrier<A>(&self, answers: Vec<A>) -> Sealed<A> {
        Sealed {
            group: None,
            answers,
            accounts: HashMap::new(),
            stats: self.stats.clone(),
        }
    }

    /// Stages the expiry of keys whose answers are older than the retention (at most
    /// 10,000 facts' worth per call). Reads the index's ranges: the driver calls it only
    /// when the index holds every sealed group.
    pub fn sweep<A>(
        &mut self,
        reads: &impl Reads,
        staged: &mut Staged<A>,
        stats: &mut Stats,
        now: Timestamp,
        retention_ms: i64,
    ) -> Result<usize> {
        let horizon = now.saturating_sub_ms(retention_ms);
        let mut expired = 0usize;
        let mut cursor = stats.sweep_cursor;
        let facts = super::log::Facts::new(reads.index(), cursor + 1, stats.last_seq);
        for item in facts.map_err(io_err)?.take(10_000) {
            let entry = item.map_err(io_err)?.map_err(|d| reads.corrupt(d.error))?;
            let seq = entry.seq;
            let fact = entry.decode().map_err(|e| reads.corrupt(e))?;
            // Facts are recorded with non-decreasing time, so the first one inside the
            // retention ends the sweep.
            if fact.at > horizon {
                break;
            }
            let kk = scoped_key(P_KEY, &fact.client, fact.key.as_str());
            if let Some(bytes) = reads.index().get(&kk).map_err(io_err)? {
                let mut rec = KeyRecord::decode(&bytes).map_err(|e| reads.corrupt(e))?;
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

/// The fact numbered `seq`, if the log holds it.
fn fact(reads: &impl Reads, seq: u64) -> Result<Option<Fact>> {
    super::log::fact(reads.index(), seq)
        .map_err(io_err)?
        .map_err(|d| reads.corrupt(d.error))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashSet;

    use super::*;
    use crate::domain::Amount;
    use crate::store::sled::index::MemIndex;

    /// The index in memory and the claims: all the decider reads.
    #[derive(Default)]
    struct Mem {
        index: MemIndex,
        claims: HashSet<Ck>,
    }

    impl Reads for Mem {
        type Index = MemIndex;
        fn index(&self) -> &MemIndex {
            &self.index
        }
        fn claimed(&self, ck: &Ck) -> bool {
            self.claims.contains(ck)
        }
        fn corrupt(&self, e: DecodeError) -> LedgerError {
            LedgerError::Corrupt {
                path: "memory".into(),
                detail: e.to_string(),
            }
        }
    }

    fn ck(key: &str) -> Ck {
        (ClientId::default_client(), Key::parse(key).unwrap())
    }

    fn deposit(account: &str, units: u64) -> Command {
        Command::Deposit {
            account: Account::parse(account).unwrap(),
            amount: Amount::new(units).unwrap(),
            currency: Currency::parse("RUB").unwrap(),
        }
    }

    fn refund(withdrawal: &str, units: u64) -> Command {
        Command::Refund {
            withdrawal: Key::parse(withdrawal).unwrap(),
            amount: Amount::new(units).unwrap(),
        }
    }

    /// Decides `command` under `key` into `staged`, holding its answer as the driver does.
    fn decide(
        d: &mut Decider,
        mem: &Mem,
        staged: &mut Staged<Submission>,
        stats: &mut Stats,
        key: &str,
        command: &Command,
    ) -> Submission {
        let arrival = Arrival {
            ck: &ck(key),
            command,
            fingerprint: command.fingerprint(),
            message: None,
        };
        let answer = d
            .decide(mem, staged, stats, Timestamp(1_000), arrival)
            .unwrap();
        if !matches!(answer, Submission::InProgress { .. }) {
            staged.answers.push(answer.clone());
        }
        answer
    }

    fn seal(d: &mut Decider, staged: Staged<Submission>, stats: &mut Stats) -> Group {
        let sealed = d.seal(staged, stats, Observed::default());
        let sealed = sealed.ok().unwrap().unwrap();
        sealed.group.unwrap()
    }

    #[test]
    fn a_group_counts_its_commands_and_is_read_before_the_index_until_applied() {
        let mut mem = Mem::default();
        let mut d = Decider::new(1, 1, Balances::default(), Stats::default());
        let mut staged = Staged::default();
        let mut stats = d.stats().clone();
        let d1 = deposit("alice", 100);
        assert!(matches!(
            decide(&mut d, &mem, &mut staged, &mut stats, "d-1", &d1),
            Submission::Executed(_)
        ));
        // A replay in the same group counts as a command too: it waits for the group.
        assert!(matches!(
            decide(&mut d, &mem, &mut staged, &mut stats, "d-1", &d1),
            Submission::Replayed(_)
        ));
        // A refund of a claimed withdrawal not decided yet stages nothing.
        mem.claims.insert(ck("w-1"));
        assert!(matches!(
            decide(
                &mut d,
                &mem,
                &mut staged,
                &mut stats,
                "r-1",
                &refund("w-1", 5)
            ),
            Submission::InProgress { .. }
        ));
        let group = seal(&mut d, staged, &mut stats);
        assert_eq!((group.number, group.seqs.clone()), (1, 1..2));
        assert_eq!((d.next_group(), d.last_group(), d.unapplied()), (2, 2, 1));
        assert_eq!(d.stats().last_seq, 1);
        let alice = Account::parse("alice").unwrap();
        assert_eq!(d.balances().user_account(&alice).unwrap().balance, 100);

        // Not in the index yet: the sealed group answers for the key.
        let mut staged = Staged::default();
        let mut stats = d.stats().clone();
        assert!(matches!(
            decide(&mut d, &mem, &mut staged, &mut stats, "d-1", &d1),
            Submission::Replayed(_)
        ));
        // Once the index holds the group, the decider lets go of it and reads the index.
        mem.index.apply(&group);
        d.applied(1);
        assert_eq!(d.unapplied(), 0);
        assert!(matches!(
            decide(&mut d, &mem, &mut staged, &mut stats, "d-1", &d1),
            Submission::Replayed(_)
        ));
        // Forgetting the group without the index holding it would lose the key.
        let mut forgetful = Decider::new(1, 1, Balances::default(), Stats::default());
        let mut staged = Staged::default();
        let mut stats = Stats::default();
        decide(
            &mut forgetful,
            &Mem::default(),
            &mut staged,
            &mut stats,
            "d-1",
            &d1,
        );
        seal(&mut forgetful, staged, &mut stats);
        forgetful.applied(1);
        let mut staged = Staged::default();
        let mut stats = forgetful.stats().clone();
        assert!(matches!(
            decide(
                &mut forgetful,
                &Mem::default(),
                &mut staged,
                &mut stats,
                "d-1",
                &d1
            ),
            Submission::Executed(_)
        ));
    }

    #[test]
    fn quarantine_ids_follow_one_another_and_go_into_the_group() {
        let mut d = Decider::new(1, 5, Balances::default(), Stats::default());
        let mut staged: Staged<Submission> = Staged::default();
        let ids: Vec<u64> = (0..3)
            .map(|i| d.quarantine(&mut staged, Timestamp(i), None, "why".into(), "{}".into()))
            .collect();
        assert_eq!(ids, vec![5, 6, 7]);
        let keys: Vec<Vec<u8>> = staged
            .group
            .ops
            .iter()
            .map(|op| match op {
                super::super::journal::Op::Put { key, .. } => key.clone(),
                super::super::journal::Op::Remove { key } => key.clone(),
            })
            .collect();
        let expected: Vec<Vec<u8>> = ids.iter().map(|id| quarantine_key(*id).to_vec()).collect();
        assert_eq!(keys, expected);
    }

    #[test]
    fn a_key_expires_once_its_retention_has_run_out_to_the_millisecond() {
        let mut mem = Mem::default();
        let mut d = Decider::new(1, 1, Balances::default(), Stats::default());
        let mut staged = Staged::default();
        let mut stats = d.stats().clone();
        // Decided at 1,000 ms.
        decide(
            &mut d,
            &mem,
            &mut staged,
            &mut stats,
            "d-1",
            &deposit("alice", 1),
        );
        let group = seal(&mut d, staged, &mut stats);
        mem.index.apply(&group);
        d.applied(group.number);
        let sweep = |d: &mut Decider, now: i64| {
            let mut staged: Staged<Submission> = Staged::default();
            let mut stats = d.stats().clone();
            let n = d.sweep(&mem, &mut staged, &mut stats, Timestamp(now), 500);
            (n.unwrap(), stats.sweep_cursor)
        };
        // One millisecond short of the retention: kept, and the sweep stops before it.
        assert_eq!(sweep(&mut d, 1_499), (0, 0));
        // The retention has run out exactly: expired.
        assert_eq!(sweep(&mut d, 1_500), (1, 1));
    }

    #[test]
    fn statement_runs_are_kept_per_account_with_their_bytes() {
        let mem = Mem::default();
        let mut d = Decider::new(1, 1, Balances::default(), Stats::default());
        assert_eq!(d.tails_use(), (0, 0));
        let mut staged = Staged::default();
        let mut stats = d.stats().clone();
        decide(
            &mut d,
            &mem,
            &mut staged,
            &mut stats,
            "a-1",
            &deposit("alice", 1),
        );
        decide(
            &mut d,
            &mem,
            &mut staged,
            &mut stats,
            "a-2",
            &deposit("alice", 2),
        );
        decide(
            &mut d,
            &mem,
            &mut staged,
            &mut stats,
            "b-1",
            &deposit("bob", 3),
        );
        seal(&mut d, staged, &mut stats);
        let (entries, heap) = d.tails_use();
        // alice's run holds two movements (bytes on the heap), bob's one (none yet).
        assert_eq!(entries, 2);
        assert!(heap > 1, "{heap}");
    }

    /// Every movement of an account is in its statement, also when the run carried over
    /// from the last group is full at the account's first movement of a new group.
    #[test]
    fn a_statement_run_full_at_a_group_s_start_is_followed_by_a_new_one() {
        use crate::store::sled::records::{P_STATEMENT, split_statement};
        use crate::store::sled::statements::{RUN_SEQS, run_seqs};
        let mut mem = Mem::default();
        let mut d = Decider::new(1, 1, Balances::default(), Stats::default());
        // The first group fills alice's run exactly; each later group moves her once, and
        // the first of them finds the run it carries over full.
        let full = RUN_SEQS as u64;
        let movements = full + 3;
        let mut n = 0;
        for in_group in [full, 1, 1, 1] {
            let mut staged = Staged::default();
            let mut stats = d.stats().clone();
            for _ in 0..in_group {
                n += 1;
                decide(
                    &mut d,
                    &mem,
                    &mut staged,
                    &mut stats,
                    &format!("a-{n}"),
                    &deposit("alice", n),
                );
            }
            let group = seal(&mut d, staged, &mut stats);
            mem.index.apply(&group);
            d.applied(group.number);
        }
        assert_eq!(n, movements);
        let mut seqs = Vec::new();
        for (key, value) in &mem.index.map {
            if key.first() != Some(&P_STATEMENT) {
                continue;
            }
            let (account, first) = split_statement(key).unwrap();
            assert_eq!(account, b"alice");
            seqs.extend(run_seqs(first, value).unwrap());
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=movements).collect::<Vec<_>>());
    }

    #[test]
    fn a_group_is_sealed_only_with_its_seqs_in_order_and_no_balance_below_zero() {
        let facts = |seqs: &[u64]| -> Vec<(u64, Vec<u8>)> {
            seqs.iter().map(|s| (*s, Vec::new())).collect()
        };
        let rub = Currency::parse("RUB").unwrap();
        let balances = |pairs: &[(&str, i128)]| -> HashMap<Account, BTreeMap<Currency, i128>> {
            pairs
                .iter()
                .map(|(name, b)| {
                    (
                        Account::parse_any(name).unwrap(),
                        BTreeMap::from([(rub, *b)]),
                    )
                })
                .collect()
        };
        let none = HashMap::new();
        let zero = Balances::default();
        // Whole: the next seqs, or no fact at all (a quarantine, a sweep).
        assert_eq!(broken_group(7, &facts(&[8, 9, 10]), &none, &zero, 10), None);
        assert_eq!(broken_group(7, &[], &none, &zero, 7), None);
        let deposit = balances(&[("@world", -5), ("alice", 5)]);
        assert_eq!(broken_group(7, &facts(&[8]), &deposit, &zero, 8), None);
        assert_eq!(
            broken_group(0, &facts(&[1]), &balances(&[("alice", 0)]), &zero, 1),
            None
        );
        // Broken: a gap, a repeat, out of order, a seq already sealed, stats that disagree,
        // a user account below zero, money made or lost.
        for (sealed, seqs, working) in [
            (7, &[8, 10][..], 10),
            (7, &[8, 8][..], 9),
            (7, &[9, 8][..], 9),
            (7, &[7][..], 8),
            (7, &[8, 9][..], 10),
            (7, &[][..], 8),
        ] {
            assert!(
                broken_group(sealed, &facts(seqs), &none, &zero, working).is_some(),
                "{sealed} {seqs:?} {working}"
            );
        }
        let below = broken_group(
            7,
            &facts(&[8]),
            &balances(&[("alice", -1), ("@world", 1)]),
            &zero,
            8,
        );
        assert_eq!(below.unwrap(), "alice would be left below zero");
        let made = broken_group(7, &facts(&[8]), &balances(&[("alice", 5)]), &zero, 8);
        assert_eq!(made.unwrap(), "the group's balances move RUB by 5 in all");
        // Moved from where the working state had it: alice 10 → 4, @payouts 0 → 6.
        let mut before = Balances::default();
        before.accounts.insert(
            Account::parse_any("alice").unwrap(),
            BTreeMap::from([(rub, 10)]),
        );
        let withdrawal = balances(&[("alice", 4), ("@payouts", 6)]);
        assert_eq!(broken_group(7, &facts(&[8]), &withdrawal, &before, 8), None);
        assert!(broken_group(7, &facts(&[8]), &withdrawal, &zero, 8).is_some());
    }
}
