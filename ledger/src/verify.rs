//! `verify`: rebuilds every projection from the log and checks each guarantee, reporting
//! every violation precisely rather than stopping at the first.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::domain::{ClientId, Key};
use crate::fact::{Fact, FactBody};
use crate::projection::{Balances, Stats};
use crate::store::{
    KeyRecord, LedgerError, P_ACCOUNT, P_FACT, P_KEY, P_REFUNDED, STATS_KEY, decode,
    decode_balance, scoped_key, seq_of, split_scoped,
};

/// One broken guarantee.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The guarantee, in the contract's words.
    pub guarantee: &'static str,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub facts: u64,
    pub keys_done: u64,
    pub keys_expired: u64,
    pub accounts: usize,
    pub currencies: usize,
    pub violations: Vec<Violation>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl std::fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "checked {} facts, {} keys done, {} expired, {} accounts in {} currencies",
            self.facts, self.keys_done, self.keys_expired, self.accounts, self.currencies
        )?;
        if self.violations.is_empty() {
            return write!(f, "all guarantees hold");
        }
        writeln!(f, "{} violations:", self.violations.len())?;
        for v in &self.violations {
            writeln!(f, "  [{}] {}", v.guarantee, v.detail)?;
        }
        Ok(())
    }
}

pub(crate) const ONE_EFFECT: &str = "one effect per key";
pub(crate) const KEY_FACT: &str = "every done key has its fact and every fact its key";
pub(crate) const SAME_ANSWER: &str = "every key answers with its own fact";
pub(crate) const DERIVED: &str = "balances equal the fold of the log";
pub(crate) const DOUBLE_ENTRY: &str = "sums are zero per currency";
pub(crate) const NO_OVERDRAFT: &str = "no user balance is negative";
pub(crate) const REFUNDS: &str = "refunds stay within their withdrawals";
pub(crate) const GAPLESS: &str = "the log is gapless";
pub(crate) const COUNTERS: &str = "counters equal the fold of the log";

/// At most this many violations of one kind are listed; the rest are counted.
const LIST_MAX: usize = 20;

/// Violations as they are found; shared with the PostgreSQL store's verify, so both report
/// the same guarantees in the same words.
#[derive(Default)]
pub(crate) struct Report {
    violations: Vec<Violation>,
    counts: BTreeMap<&'static str, usize>,
}

impl Report {
    /// The violations, with a count of those beyond the listed ones.
    pub(crate) fn finish(mut self) -> Vec<Violation> {
        for (guarantee, n) in &self.counts {
            if *n > LIST_MAX {
                self.violations.push(Violation {
                    guarantee,
                    detail: format!("… and {} more", n - LIST_MAX),
                });
            }
        }
        self.violations
    }

    pub(crate) fn add(&mut self, guarantee: &'static str, detail: String) {
        let n = self.counts.entry(guarantee).or_insert(0);
        *n += 1;
        if *n <= LIST_MAX {
            self.violations.push(Violation { guarantee, detail });
        }
    }
}

pub(crate) fn verify(tree: &sled::Tree) -> Result<VerifyReport, LedgerError> {
    let io = |e: sled::Error| LedgerError::Unavailable(e.to_string());
    let mut r = Report::default();
    let mut balances = Balances::default();
    let mut stats = Stats::default();
    let mut seen: HashMap<(ClientId, Key), u64> = HashMap::new();
    // (client, withdrawal key) -> (amount withdrawn, refunded so far)
    let mut withdrawals: HashMap<(ClientId, Key), (u64, u64)> = HashMap::new();
    let mut expect_seq = 1u64;
    for item in tree.scan_prefix([P_FACT]) {
        let (k, v) = item.map_err(io)?;
        let Some(seq) = seq_of(&k) else {
            r.add(GAPLESS, "a log key of the wrong length".into());
            continue;
        };
        if seq != expect_seq {
            r.add(GAPLESS, format!("expected seq {expect_seq}, found {seq}"));
        }
        expect_seq = seq + 1;
        let fact = match Fact::decode(seq, &v) {
            Ok(f) => f,
            Err(e) => {
                r.add(KEY_FACT, e.to_string());
                continue;
            }
        };
        let ck = (fact.client.clone(), fact.key.clone());
        if let Some(first) = seen.insert(ck, seq) {
            r.add(
                ONE_EFFECT,
                format!(
                    "key {:?} of client {:?} has facts {first} and {seq}",
                    fact.key, fact.client
                ),
            );
        }
        check_fact(&mut r, tree, &fact, &balances, &mut withdrawals)?;
        balances.apply(&fact);
        stats.apply(&fact);
    }

    // Key records: each points at its own fact; count done and expired.
    let mut keys = 0u64;
    for item in tree.scan_prefix([P_KEY]) {
        let (k, v) = item.map_err(io)?;
        keys += 1;
        let Some((client, key)) = split_scoped(&k) else {
            r.add(KEY_FACT, "a key record with an unreadable name".into());
            continue;
        };
        match KeyRecord::decode(&v) {
            Err(e) => r.add(KEY_FACT, e.to_string()),
            Ok(rec) => {
                if rec.expired {
                    stats.expire_one();
                }
                match seen.get(&(client.clone(), key.clone())) {
                    Some(seq) if *seq == rec.seq => {}
                    Some(seq) => r.add(
                        KEY_FACT,
                        format!(
                            "key {key:?} of {client:?} points at seq {} but its fact is {seq}",
                            rec.seq
                        ),
                    ),
                    None => r.add(
                        KEY_FACT,
                        format!("key {key:?} of {client:?} is done but has no fact"),
                    ),
                }
            }
        }
    }
    if keys != seen.len() as u64 {
        r.add(
            KEY_FACT,
            format!("{} facts but {keys} key records", seen.len()),
        );
    }

    // Persisted balances against the fold.
    let mut stored = Balances::default();
    for item in tree.scan_prefix([P_ACCOUNT]) {
        let (k, v) = item.map_err(io)?;
        match decode_balance(&k, &v) {
            Some((a, c, b)) => {
                stored.accounts.entry(a).or_default().insert(c, b);
            }
            None => r.add(DERIVED, "an undecodable balance record".into()),
        }
    }
    check_balances(&mut r, &balances, &stored);

    // Refunded totals against the fold.
    for item in tree.scan_prefix([P_REFUNDED]) {
        let (k, v) = item.map_err(io)?;
        let total = <[u8; 8]>::try_from(v.as_ref()).map(u64::from_be_bytes).ok();
        let folded = split_scoped(&k).and_then(|ck| withdrawals.get(&ck).map(|w| w.1));
        if total.is_none() || total != folded {
            r.add(
                REFUNDS,
                format!("a stored refunded total {total:?} disagrees with the log's {folded:?}"),
            );
        }
    }

    // Counters against the fold.
    match tree.get(STATS_KEY).map_err(io)? {
        None => r.add(COUNTERS, "no stats record".into()),
        Some(v) => match decode::<Stats>("stats", &v) {
            Err(e) => r.add(COUNTERS, e.to_string()),
            Ok(s) => {
                let pairs = [
                    ("last seq", s.last_seq, stats.last_seq),
                    ("keys done", s.keys_done, stats.keys_done),
                    ("keys expired", s.keys_expired, stats.keys_expired),
                    ("applied", s.applied_total(), stats.applied_total()),
                    ("rejected", s.rejected_total(), stats.rejected_total()),
                ];
                for (name, stored, folded) in pairs {
                    if stored != folded {
                        r.add(
                            COUNTERS,
                            format!("{name}: stored {stored}, the log gives {folded}"),
                        );
                    }
                }
                if s.applied != stats.applied || s.rejected != stats.rejected {
                    r.add(COUNTERS, "per-kind counts differ from the log".into());
                }
            }
        },
    }

    Ok(VerifyReport {
        facts: stats.last_seq,
        keys_done: stats.keys_done,
        keys_expired: stats.keys_expired,
        accounts: balances.accounts.keys().filter(|a| !a.is_system()).count(),
        currencies: balances.sums().len(),
        violations: r.finish(),
    })
}

/// Checks one fact against the fold so far: its key record, its stored answer, the
/// balance it claims, and refund bounds.
fn check_fact(
    r: &mut Report,
    tree: &sled::Tree,
    fact: &Fact,
    before: &Balances,
    withdrawals: &mut HashMap<(ClientId, Key), (u64, u64)>,
) -> Result<(), LedgerError> {
    let io = |e: sled::Error| LedgerError::Unavailable(e.to_string());
    let record = tree
        .get(scoped_key(P_KEY, &fact.client, fact.key.as_str()))
        .map_err(io)?
        .and_then(|bytes| KeyRecord::decode(&bytes).ok());
    if record.is_some_and(|rec| rec.fingerprint != fact.body.command().fingerprint()) {
        r.add(
            SAME_ANSWER,
            format!(
                "seq {}: the key's fingerprint is not its fact's command",
                fact.seq
            ),
        );
    }
    check_fold(r, fact, before, withdrawals);
    Ok(())
}

/// Checks one fact against the fold of the facts before it: the balance it claims, no
/// overdraft, and refund bounds. `withdrawals` maps (client, withdrawal key) to (amount
/// withdrawn, refunded so far).
pub(crate) fn check_fold(
    r: &mut Report,
    fact: &Fact,
    before: &Balances,
    withdrawals: &mut HashMap<(ClientId, Key), (u64, u64)>,
) {
    let mut after = None;
    for (account, currency, delta) in crate::projection::legs(fact) {
        if !account.is_system() {
            after = Some(before.get(&account, currency).unwrap_or(0) + delta);
        }
    }
    let claimed = match &fact.body {
        FactBody::DepositRecorded { balance_after, .. }
        | FactBody::WithdrawalRecorded { balance_after, .. }
        | FactBody::RefundRecorded { balance_after, .. } => Some(*balance_after),
        FactBody::CommandRejected { .. } => None,
    };
    if let (Some(claimed), Some(after)) = (claimed, after) {
        if i128::try_from(claimed).ok() != Some(after) {
            r.add(
                DERIVED,
                format!(
                    "seq {}: records balance {claimed}, the fold gives {after}",
                    fact.seq
                ),
            );
        }
        if after < 0 {
            r.add(
                NO_OVERDRAFT,
                format!("seq {} leaves a balance of {after}", fact.seq),
            );
        }
    }
    match &fact.body {
        FactBody::WithdrawalRecorded { amount, .. } => {
            withdrawals.insert((fact.client.clone(), fact.key.clone()), (amount.units(), 0));
        }
        FactBody::RefundRecorded {
            withdrawal,
            amount,
            refunded_total,
            ..
        } => match withdrawals.get_mut(&(fact.client.clone(), withdrawal.clone())) {
            None => r.add(
                REFUNDS,
                format!(
                    "seq {} refunds {withdrawal:?}, which is no earlier withdrawal",
                    fact.seq
                ),
            ),
            Some((withdrawn, refunded)) => {
                *refunded += amount.units();
                if *refunded > *withdrawn || *refunded != *refunded_total {
                    r.add(
                        REFUNDS,
                        format!(
                            "seq {}: refunded {refunded} of {withdrawn} (recorded total {refunded_total})",
                            fact.seq
                        ),
                    );
                }
            }
        },
        _ => {}
    }
}

/// Compares the stored balances with the fold of the log: equal, none negative for a user,
/// every currency summing to zero.
pub(crate) fn check_balances(r: &mut Report, balances: &Balances, stored: &Balances) {
    for (account, per) in &balances.accounts {
        for (currency, b) in per {
            let s = stored.get(account, *currency);
            if s != Some(*b) {
                r.add(
                    DERIVED,
                    format!("{account} {currency}: stored {s:?}, the log gives {b}"),
                );
            }
            if !account.is_system() && *b < 0 {
                r.add(NO_OVERDRAFT, format!("{account} {currency} is {b}"));
            }
        }
    }
    for (account, per) in &stored.accounts {
        for currency in per.keys() {
            if balances.get(account, *currency).is_none() {
                r.add(
                    DERIVED,
                    format!("{account} {currency} is stored but no fact touches it"),
                );
            }
        }
    }
    for (currency, sum) in stored.sums() {
        if sum != 0 {
            r.add(DOUBLE_ENTRY, format!("{currency} sums to {sum}"));
        }
    }
}
