//! The reference model: what must be true, computed without the ledger's decision code.
//!
//! Per intent it keeps the first outcome anybody heard (that one is THE outcome: every
//! later answer for the key must be the same bytes, expired or not, because the contract
//! keeps the fact and answers retries from it after expiry). Over a store snapshot it
//! replays the log through its own small ledger, which decides every fact again from the
//! facts before it, so a wrong decision, a second fact for a key, a fact for another body
//! than the intent's, a lost acknowledged outcome, a negative user balance or a currency
//! not summing to zero each show up as a violation.

use std::collections::{BTreeMap, BTreeSet};

use ledger::json;
use ledger::{
    Account, ClientId, Command, Currency, Fact, FactBody, Fingerprint, Key, MessageId, Outcome,
    Rejection,
};

use super::store::{Ck, Data};

/// What the model knows of one intent.
#[derive(Debug, Clone)]
pub struct IntentSpec {
    pub ck: Ck,
    pub command: Command,
    pub fingerprint: Fingerprint,
}

/// Rendering JSON is the largest cost of a run in a debug build, and the bytes are a pure
/// function of the [`Outcome`], which every hearing compares in full. So the bytes of one
/// intent in [`BYTE_SAMPLE`] (which ones rotates with the RNG seed) are rendered at its first
/// hearing and compared at the end with the stored answer rendered after expiry. Over
/// 10,000 seeds that is tens of thousands of keys compared byte for byte.
const BYTE_SAMPLE: u64 = 3;

fn render(outcome: &Outcome) -> Result<Vec<u8>, String> {
    serde_json::to_vec(&json::outcome(outcome))
        .map_err(|e| format!("rendering an outcome failed: {e}"))
}

#[derive(Debug, Clone)]
struct Heard {
    outcome: Outcome,
    /// The first answer's bytes, for the sampled intents.
    bytes: Option<Vec<u8>>,
    /// Answers heard as a first execution (not marked replayed).
    executed: u32,
}

pub struct Model {
    specs: Vec<IntentSpec>,
    /// BTreeMaps: with a handful of short names, comparing is cheaper than SipHash.
    by_key: BTreeMap<ClientId, BTreeMap<Key, usize>>,
    heard: Vec<Option<Heard>>,
    /// Messages acknowledged with an outcome: the inbox must remember them durably.
    acked: Vec<(MessageId, usize)>,
    /// Keys seen expired on disk; an expiry is never undone.
    expired: BTreeSet<Ck>,
    /// The latest time the clock has shown: nothing may expire before `at + retention`.
    pub max_now: i64,
    retention_ms: i64,
    folded: Folded,
    /// Which intents have their bytes compared (see [`BYTE_SAMPLE`]).
    byte_sample: u64,
}

/// The reference fold of a log prefix, kept between checks.
#[derive(Clone, Default)]
struct Folded {
    /// Facts folded.
    n: usize,
    /// The last fact folded: while the log still holds it, the prefix is the same.
    tail: Option<Fact>,
    /// The intent of each folded fact, in log order.
    intents: Vec<usize>,
    last_at: ledger::Timestamp,
    reference: Reference,
}

impl Model {
    pub fn new(specs: Vec<IntentSpec>, retention_ms: i64, now: i64, seed: u64) -> Self {
        let mut by_key: BTreeMap<ClientId, BTreeMap<Key, usize>> = BTreeMap::new();
        for (i, s) in specs.iter().enumerate() {
            by_key
                .entry(s.ck.0.clone())
                .or_default()
                .insert(s.ck.1.clone(), i);
        }
        let heard = vec![None; specs.len()];
        Self {
            specs,
            by_key,
            heard,
            acked: Vec::new(),
            expired: BTreeSet::new(),
            max_now: now,
            retention_ms,
            folded: Folded::default(),
            byte_sample: seed % BYTE_SAMPLE,
        }
    }

    pub fn resolved(&self, intent: usize) -> bool {
        self.heard.get(intent).is_some_and(Option::is_some)
    }

    pub fn all_resolved(&self) -> bool {
        self.heard.iter().all(Option::is_some)
    }

    pub fn unresolved(&self) -> Vec<usize> {
        (0..self.heard.len())
            .filter(|i| !self.resolved(*i))
            .collect()
    }

    /// An outcome reached a client or the consumer: after its journal sync, so it is
    /// acknowledged.
    pub fn heard(
        &mut self,
        intent: usize,
        outcome: &Outcome,
        executed: bool,
    ) -> Result<(), String> {
        let spec = &self.specs[intent];
        let sampled = u64::try_from(intent).is_ok_and(|i| i % BYTE_SAMPLE == self.byte_sample);
        match &mut self.heard[intent] {
            slot @ None => {
                let (key, command) = match outcome {
                    Outcome::Applied(r) => (&r.key, &r.command),
                    Outcome::Rejected(r) => (&r.key, &r.command),
                };
                if *key != spec.ck.1 || *command != spec.command {
                    return Err(format!(
                        "intent {intent} ({:?}/{:?}) was answered for another command or key: \
                         {outcome:?}",
                        spec.ck.0, spec.ck.1
                    ));
                }
                *slot = Some(Heard {
                    outcome: outcome.clone(),
                    bytes: if sampled {
                        Some(render(outcome)?)
                    } else {
                        None
                    },
                    executed: u32::from(executed),
                });
            }
            Some(h) => {
                if h.outcome != *outcome {
                    return Err(format!(
                        "intent {intent} ({:?}/{:?}): the answer changed.\n  first: {}\n  now:   \
                         {}",
                        spec.ck.0,
                        spec.ck.1,
                        String::from_utf8_lossy(&render(&h.outcome)?),
                        String::from_utf8_lossy(&render(outcome)?)
                    ));
                }
                if executed {
                    h.executed += 1;
                    if h.executed > 1 {
                        return Err(format!(
                            "intent {intent} ({:?}/{:?}) was executed twice (two first-execution \
                             answers)",
                            spec.ck.0, spec.ck.1
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn message_acked(&mut self, id: MessageId, intent: usize) {
        self.acked.push((id, intent));
    }

    fn intent_of(&self, client: &ClientId, key: &Key) -> Option<usize> {
        self.by_key.get(client)?.get(key).copied()
    }

    /// Checks one snapshot of the store. `durable` snapshots must also hold everything that
    /// was acknowledged; the decider's view in memory need only be consistent.
    pub fn check(&mut self, data: &Data, durable: bool) -> Result<(), String> {
        let what = if durable { "on disk" } else { "in memory" };
        let stats = &data.stats;
        let n = u64::try_from(data.facts.len()).unwrap_or(u64::MAX);
        if n != stats.last_seq {
            return Err(format!(
                "{what}: {n} facts but the stats say the log ends at {}",
                stats.last_seq
            ));
        }
        // The journal's durable end only grows and the decider's view is that end plus the
        // groups sealed since, so the fold of the last durable check is reused while the
        // fact it ended at is still there, unchanged. The final check folds from scratch.
        let reusable = self.folded.n <= data.facts.len()
            && self
                .folded
                .tail
                .as_ref()
                .is_none_or(|t| data.facts.get(&t.seq) == Some(t));
        let mut folded = match (reusable, durable) {
            (true, true) => std::mem::take(&mut self.folded),
            (true, false) => self.folded.clone(),
            (false, _) => Folded::default(),
        };
        let after = u64::try_from(folded.n).unwrap_or(u64::MAX);
        for (seq, fact) in data.facts.range(after + 1..) {
            let expected_seq = u64::try_from(folded.intents.len()).unwrap_or(u64::MAX) + 1;
            if *seq != expected_seq || fact.seq != *seq {
                return Err(format!(
                    "{what}: the log has a gap or a misplaced fact at seq {seq}"
                ));
            }
            let Some(intent) = self.intent_of(&fact.client, &fact.key) else {
                return Err(format!(
                    "{what}: fact {seq} is for {:?}/{:?}, which no intent owns",
                    fact.client, fact.key
                ));
            };
            if folded.intents.contains(&intent) {
                return Err(format!(
                    "{what}: a second fact (seq {seq}) for intent {intent} ({:?}/{:?}): the \
                     command took effect twice",
                    fact.client, fact.key
                ));
            }
            folded.intents.push(intent);
            let spec = &self.specs[intent];
            if !answers_command(&fact.body, &spec.command) {
                return Err(format!(
                    "{what}: fact {seq} for {:?}/{:?} holds {:?}, not its intent's {:?}: a \
                     reused key executed another command",
                    fact.client,
                    fact.key,
                    fact.body.command(),
                    spec.command
                ));
            }
            if fact.at < folded.last_at {
                return Err(format!(
                    "{what}: fact {seq} is recorded before the fact ahead of it"
                ));
            }
            folded.last_at = fact.at;
            folded.reference.decide_and_apply(fact, &spec.command)?;
        }
        if folded.n != data.facts.len() {
            folded.n = data.facts.len();
            folded.tail = data.facts.values().next_back().cloned();
        }
        // Key records change after their fact (the sweep), so all are checked every time.
        for ((seq, fact), intent) in data.facts.iter().zip(&folded.intents) {
            let spec = &self.specs[*intent];
            let Some(rec) = data.keys.get(&spec.ck) else {
                return Err(format!(
                    "{what}: fact {seq} ({:?}/{:?}) has no key record: a retry would execute \
                     again",
                    fact.client, fact.key
                ));
            };
            if rec.seq != *seq || rec.fingerprint != spec.fingerprint || rec.at != fact.at {
                return Err(format!(
                    "{what}: the key record of {:?}/{:?} does not match its fact {seq}",
                    fact.client, fact.key
                ));
            }
            if rec.expired && fact.at.millis().saturating_add(self.retention_ms) > self.max_now {
                return Err(format!(
                    "{what}: {:?}/{:?} expired before its retention ran out",
                    fact.client, fact.key
                ));
            }
        }
        if data.keys.len() != data.facts.len() {
            return Err(format!(
                "{what}: {} key records for {} facts",
                data.keys.len(),
                data.facts.len()
            ));
        }
        let reference = &folded.reference;
        if reference.balances != data.balances.accounts {
            return Err(format!(
                "{what}: the balances differ from the log's.\n  store: {:?}\n  model: {:?}",
                data.balances.accounts, reference.balances
            ));
        }
        for (account, per) in &data.balances.accounts {
            for (currency, b) in per {
                if !account.is_system() && *b < 0 {
                    return Err(format!("{what}: {account} holds {b} {currency}"));
                }
            }
        }
        for (currency, sum) in data.balances.sums() {
            if sum != 0 {
                return Err(format!("{what}: {currency} sums to {sum}, not 0"));
            }
        }
        if reference.refunded != data.refunded {
            return Err(format!(
                "{what}: refunded totals differ from the log's: store {:?}, model {:?}",
                data.refunded, reference.refunded
            ));
        }
        if durable {
            self.folded = folded;
            self.check_acknowledged(data)?;
        }
        Ok(())
    }

    fn check_acknowledged(&mut self, data: &Data) -> Result<(), String> {
        for (intent, heard) in self.heard.iter().enumerate() {
            let Some(h) = heard else { continue };
            let spec = &self.specs[intent];
            let fact = data
                .keys
                .get(&spec.ck)
                .and_then(|rec| data.facts.get(&rec.seq));
            if !fact.is_some_and(|f| fact_gives(f, &h.outcome)) {
                return Err(format!(
                    "on disk: the acknowledged outcome of intent {intent} ({:?}/{:?}) is lost \
                     or changed: acknowledged {:?}, on disk {fact:?}",
                    spec.ck.0, spec.ck.1, h.outcome
                ));
            }
        }
        for (id, intent) in &self.acked {
            // The inbox record names the fact that answers the message: its key's.
            let answered_by = |r: &ledger::store::sled::readback::InboxRecord| {
                data.facts
                    .get(&r.seq)
                    .map(|f| (f.client.clone(), f.key.clone()))
            };
            if data
                .inbox
                .get(id)
                .is_none_or(|r| answered_by(r).as_ref() != Some(&self.specs[*intent].ck))
            {
                return Err(format!(
                    "on disk: acknowledged message {id} is not in the inbox: a redelivery \
                     would not be recognised by its id"
                ));
            }
        }
        for (ck, rec) in &data.keys {
            if rec.expired && !self.expired.contains(ck) {
                self.expired.insert(ck.clone());
            }
        }
        for ck in &self.expired {
            if data.keys.get(ck).is_none_or(|r| !r.expired) {
                return Err(format!(
                    "on disk: {:?}/{:?} was expired and is not any more",
                    ck.0, ck.1
                ));
            }
        }
        Ok(())
    }

    /// Checks what one turn of the decider wrote to `data` (the facts after seq `after`),
    /// given the keys that held a claim when it began (`claimed`: every key with a request
    /// taken and not yet answered). A refund must not be decided while its withdrawal is
    /// in flight: rejected as `withdrawal_not_found` with the withdrawal's key claimed
    /// and no fact for it earlier in the log, its key holds a final answer the client
    /// never asked for, where it must be told 409 and come again.
    pub fn check_decided(
        &self,
        data: &Data,
        after: u64,
        claimed: &BTreeSet<Ck>,
    ) -> Result<(), String> {
        for (seq, fact) in data.facts.range(after.saturating_add(1)..) {
            let FactBody::CommandRejected {
                command: Command::Refund { withdrawal, .. },
                rejection: Rejection::WithdrawalNotFound,
                ..
            } = &fact.body
            else {
                continue;
            };
            let wk = (fact.client.clone(), withdrawal.clone());
            let is_withdrawal = self
                .intent_of(&wk.0, &wk.1)
                .is_some_and(|i| matches!(self.specs[i].command, Command::Withdraw { .. }));
            if !is_withdrawal || !claimed.contains(&wk) {
                continue;
            }
            let decided_before = data
                .facts
                .range(..*seq)
                .any(|(_, f)| f.client == wk.0 && f.key == wk.1);
            if !decided_before {
                return Err(format!(
                    "fact {seq}: the refund {:?}/{:?} was rejected as withdrawal_not_found, \
                     final, while its withdrawal {:?} was claimed and not yet decided: it \
                     must be told 409 and retried",
                    fact.client, fact.key, wk.1
                ));
            }
        }
        Ok(())
    }

    /// The end: every intent has exactly one fact, and its answer is the one first heard.
    pub fn check_final(&mut self, data: &Data) -> Result<(), String> {
        self.folded = Folded::default();
        self.check(data, true)?;
        let missing = self.unresolved();
        if !missing.is_empty() {
            return Err(format!(
                "intents {missing:?} are unresolved after the final phase"
            ));
        }
        if data.facts.len() != self.specs.len() {
            return Err(format!(
                "{} facts on disk for {} intents: not exactly one effect each",
                data.facts.len(),
                self.specs.len()
            ));
        }
        for (intent, spec) in self.specs.iter().enumerate() {
            let fact = data
                .keys
                .get(&spec.ck)
                .and_then(|rec| data.facts.get(&rec.seq));
            let Some(fact) = fact else {
                return Err(format!("intent {intent} has no fact on disk"));
            };
            let Some(h) = &self.heard[intent] else {
                continue;
            };
            if !fact_gives(fact, &h.outcome) {
                return Err(format!(
                    "intent {intent}: the stored fact does not give the answer heard"
                ));
            }
            if let Some(first) = &h.bytes
                && *first != render(&Outcome::from_fact(fact))?
            {
                return Err(format!(
                    "intent {intent}: the stored answer renders differently from the one heard \
                     first:\n  first:  {}\n  stored: {}",
                    String::from_utf8_lossy(first),
                    String::from_utf8_lossy(&render(&Outcome::from_fact(fact))?)
                ));
            }
        }
        Ok(())
    }
}

/// Whether `outcome` is the answer `fact` stands for, written from the contract's receipt
/// fields rather than with `Outcome::from_fact`, and without allocating.
fn fact_gives(fact: &Fact, outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Applied(r) => {
            let same = r.seq == fact.seq
                && r.created_at == fact.at
                && r.key == fact.key
                && answers_command(&fact.body, &r.command);
            same && match &fact.body {
                FactBody::DepositRecorded {
                    account,
                    currency,
                    balance_after,
                    ..
                }
                | FactBody::WithdrawalRecorded {
                    account,
                    currency,
                    balance_after,
                    ..
                } => {
                    r.account == *account
                        && r.currency == *currency
                        && r.balance == *balance_after
                        && r.refunded_total.is_none()
                }
                FactBody::RefundRecorded {
                    account,
                    currency,
                    balance_after,
                    refunded_total,
                    ..
                } => {
                    r.account == *account
                        && r.currency == *currency
                        && r.balance == *balance_after
                        && r.refunded_total == Some(*refunded_total)
                }
                FactBody::CommandRejected { .. } => false,
            }
        }
        Outcome::Rejected(r) => {
            r.seq == fact.seq
                && r.created_at == fact.at
                && r.key == fact.key
                && matches!(&fact.body, FactBody::CommandRejected { command, rejection, detail }
                    if *command == r.command && *rejection == r.rejection && *detail == r.detail)
        }
    }
}

/// `body.command() == command`, without building the command.
fn answers_command(body: &FactBody, command: &Command) -> bool {
    match (body, command) {
        (
            FactBody::DepositRecorded {
                account,
                amount,
                currency,
                ..
            },
            Command::Deposit {
                account: a,
                amount: m,
                currency: c,
            },
        )
        | (
            FactBody::WithdrawalRecorded {
                account,
                amount,
                currency,
                ..
            },
            Command::Withdraw {
                account: a,
                amount: m,
                currency: c,
            },
        ) => account == a && amount == m && currency == c,
        (
            FactBody::RefundRecorded {
                withdrawal, amount, ..
            },
            Command::Refund {
                withdrawal: w,
                amount: m,
            },
        ) => withdrawal == w && amount == m,
        (FactBody::CommandRejected { command: c, .. }, command) => c == command,
        _ => false,
    }
}

/// What a fact should say, decided by the model from the facts before it.
#[derive(Debug, PartialEq, Eq)]
enum Expected {
    Applied {
        account: Account,
        currency: Currency,
        balance_after: u128,
        refunded_total: Option<u64>,
    },
    Rejected(Rejection),
}

/// A deliberately plain ledger: maps of numbers, written from the contract, not from
/// `ledger::core`.
#[derive(Clone, Default)]
struct Reference {
    balances: BTreeMap<Account, BTreeMap<Currency, i128>>,
    /// Applied withdrawals by (client, key): account, currency, amount.
    withdrawals: BTreeMap<Ck, (Account, Currency, u64)>,
    refunded: BTreeMap<Ck, u64>,
}

impl Reference {
    /// A user account's currency and balance; it has one currency, fixed by its first
    /// deposit.
    fn user(&self, account: &Account) -> Result<Option<(Currency, i128)>, String> {
        match self.balances.get(account) {
            None => Ok(None),
            Some(per) if per.len() == 1 => Ok(per.iter().next().map(|(c, b)| (*c, *b))),
            Some(per) => Err(format!("{account} holds several currencies: {per:?}")),
        }
    }

    fn add(&mut self, account: &Account, currency: Currency, delta: i128) {
        match self.balances.get_mut(account) {
            Some(per) => *per.entry(currency).or_insert(0) += delta,
            None => {
                self.balances
                    .insert(account.clone(), BTreeMap::from([(currency, delta)]));
            }
        }
    }

    fn expect(&self, client: &ClientId, command: &Command) -> Result<Expected, String> {
        let after = |b: i128, delta: i128| u128::try_from(b + delta).unwrap_or(0);
        Ok(match command {
            Command::Deposit {
                account,
                amount,
                currency,
            } => match self.user(account)? {
                Some((c, _)) if c != *currency => Expected::Rejected(Rejection::CurrencyMismatch),
                held => Expected::Applied {
                    account: account.clone(),
                    currency: *currency,
                    balance_after: after(held.map_or(0, |(_, b)| b), i128::from(amount.units())),
                    refunded_total: None,
                },
            },
            Command::Withdraw {
                account,
                amount,
                currency,
            } => match self.user(account)? {
                None => Expected::Rejected(Rejection::AccountNotFound),
                Some((c, _)) if c != *currency => Expected::Rejected(Rejection::CurrencyMismatch),
                Some((_, b)) if b < i128::from(amount.units()) => {
                    Expected::Rejected(Rejection::InsufficientFunds)
                }
                Some((_, b)) => Expected::Applied {
                    account: account.clone(),
                    currency: *currency,
                    balance_after: after(b, -i128::from(amount.units())),
                    refunded_total: None,
                },
            },
            Command::Refund { withdrawal, amount } => {
                let wk = (client.clone(), withdrawal.clone());
                match self.withdrawals.get(&wk) {
                    None => Expected::Rejected(Rejection::WithdrawalNotFound),
                    Some((account, currency, withdrawn)) => {
                        let refunded = self.refunded.get(&wk).copied().unwrap_or(0);
                        if amount.units() > withdrawn.saturating_sub(refunded) {
                            Expected::Rejected(Rejection::RefundExceedsWithdrawal)
                        } else {
                            let held = self.user(account)?.map_or(0, |(_, b)| b);
                            Expected::Applied {
                                account: account.clone(),
                                currency: *currency,
                                balance_after: after(held, i128::from(amount.units())),
                                refunded_total: Some(refunded + amount.units()),
                            }
                        }
                    }
                }
            }
        })
    }

    fn decide_and_apply(&mut self, fact: &Fact, command: &Command) -> Result<(), String> {
        let expected = self.expect(&fact.client, command)?;
        let got = match &fact.body {
            FactBody::DepositRecorded {
                account,
                currency,
                balance_after,
                ..
            }
            | FactBody::WithdrawalRecorded {
                account,
                currency,
                balance_after,
                ..
            } => Expected::Applied {
                account: account.clone(),
                currency: *currency,
                balance_after: *balance_after,
                refunded_total: None,
            },
            FactBody::RefundRecorded {
                account,
                currency,
                balance_after,
                refunded_total,
                ..
            } => Expected::Applied {
                account: account.clone(),
                currency: *currency,
                balance_after: *balance_after,
                refunded_total: Some(*refunded_total),
            },
            FactBody::CommandRejected { rejection, .. } => Expected::Rejected(*rejection),
        };
        if got != expected {
            return Err(format!(
                "fact {} ({:?}/{:?}, {command:?}) decided {got:?}; from the facts before it the \
                 model expects {expected:?}",
                fact.seq, fact.client, fact.key
            ));
        }
        let Expected::Applied { .. } = expected else {
            return Ok(());
        };
        let world = Account::world();
        let payouts = Account::payouts();
        match command {
            Command::Deposit {
                account,
                amount,
                currency,
            } => {
                let a = i128::from(amount.units());
                self.add(&world, *currency, -a);
                self.add(account, *currency, a);
            }
            Command::Withdraw {
                account,
                amount,
                currency,
            } => {
                let a = i128::from(amount.units());
                self.add(account, *currency, -a);
                self.add(&payouts, *currency, a);
                self.withdrawals.insert(
                    (fact.client.clone(), fact.key.clone()),
                    (account.clone(), *currency, amount.units()),
                );
            }
            Command::Refund { withdrawal, amount } => {
                let wk = (fact.client.clone(), withdrawal.clone());
                let Some((account, currency, _)) = self.withdrawals.get(&wk).cloned() else {
                    return Ok(());
                };
                let a = i128::from(amount.units());
                self.add(&payouts, currency, -a);
                self.add(&account, currency, a);
                *self.refunded.entry(wk).or_insert(0) += amount.units();
            }
        }
        Ok(())
    }
}
