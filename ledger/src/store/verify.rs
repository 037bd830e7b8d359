//! `verify`: rebuilds every projection from the log and checks each guarantee, reporting
//! every violation precisely rather than stopping at the first. What both stores' verifies
//! share: the report, the guarantees' names, and the checks of the fold.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use serde::Serialize;

use crate::domain::{Account, ClientId, Currency, Key};
use crate::fact::{Fact, FactBody};
use crate::projection::Balances;

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
    /// Per currency, the minor units the user accounts hold together, by the fold of the
    /// log (what came in by deposits and refunds, less what went out).
    pub held: BTreeMap<Currency, i128>,
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
            "checked {}, {} done, {} expired, {} in {}",
            count(self.facts, "fact", "facts"),
            count(self.keys_done, "key", "keys"),
            self.keys_expired,
            count(self.accounts, "account", "accounts"),
            count(self.currencies, "currency", "currencies"),
        )?;
        if self.violations.is_empty() {
            return write!(f, "all guarantees hold");
        }
        writeln!(
            f,
            "{}:",
            count(self.violations.len(), "violation", "violations")
        )?;
        for v in &self.violations {
            writeln!(f, "  [{}] {}", v.guarantee, v.detail)?;
        }
        Ok(())
    }
}

/// `n` and the noun in its number: `1 fact`, `2 facts`.
pub(crate) fn count(n: impl TryInto<u64>, one: &str, many: &str) -> String {
    let n: u64 = n.try_into().unwrap_or(u64::MAX);
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Per currency, what the user accounts of `balances` hold together.
pub(crate) fn held(balances: &Balances) -> BTreeMap<Currency, i128> {
    let mut held = BTreeMap::new();
    for (account, per) in &balances.accounts {
        if account.is_system() {
            continue;
        }
        for (currency, balance) in per {
            *held.entry(*currency).or_insert(0) += balance;
        }
    }
    held
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
pub(crate) const STATEMENTS: &str = "each account's statement holds exactly its movements";

/// At most this many violations of one kind are listed; the rest are counted.
const LIST_MAX: usize = 20;

/// Violations as they are found; shared with the PostgreSQL store's verify, so both report
/// the same guarantees in the same words.
#[derive(Default)]
pub(crate) struct Report {
    violations: Vec<Violation>,
    pub(crate) counts: BTreeMap<&'static str, usize>,
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

    /// Takes in what another part of the same verify found, listed and counted as if it
    /// had been added here.
    pub(crate) fn absorb(&mut self, other: Report) {
        for v in other.violations {
            self.add(v.guarantee, v.detail);
        }
        for (guarantee, n) in other.counts {
            *self.counts.entry(guarantee).or_insert(0) += n.saturating_sub(LIST_MAX);
        }
    }

    pub(crate) fn add(&mut self, guarantee: &'static str, detail: String) {
        let n = self.counts.entry(guarantee).or_insert(0);
        *n += 1;
        if *n <= LIST_MAX {
            self.violations.push(Violation { guarantee, detail });
        }
    }
}

/// Withdrawals by the digest of (client, key) (see [`key_digest`]): (amount withdrawn,
/// refunded so far). Digests keep a million withdrawals at 16 bytes each instead of two
/// strings each.
pub(crate) type Withdrawals = DigestMap<(u64, u64)>;

/// The most withdrawals a verify reserves room for before it reads the log (24 bytes
/// each): 4,194,304, about 100 MB. A table grown by doubling to a million entries is
/// rehashed twenty times, each time into fresh pages the kernel zeroes; sized once for
/// the log's last seq (which bounds its withdrawals), it is built in place. The cap
/// bounds what is reserved ahead for a log of mostly deposits.
pub(crate) const WITHDRAWALS_RESERVED: usize = 1 << 22;

/// A map keyed by 64-bit digests. The key already is a hash, so it is used as its own:
/// hashing it again with SipHash was a tenth of a verify's time.
pub(crate) type DigestMap<V> = HashMap<u64, V, BuildHasherDefault<DigestHasher>>;

#[derive(Default, Clone, Copy)]
pub(crate) struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed here; bytes still mix, should anything else be.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Balances folded with account names hashed rather than ordered: the string comparisons
/// down an ordered map were a tenth of the client's time in a PostgreSQL verify. The
/// system accounts, which take the other leg of every movement, are kept apart and found
/// without hashing; a user account is looked up once per fact. Ordered once, at the end.
#[derive(Default)]
pub(crate) struct HashedBalances {
    accounts: HashMap<Account, BTreeMap<Currency, i128>>,
    system: Vec<(Account, BTreeMap<Currency, i128>)>,
}

impl HashedBalances {
    /// As [`Balances::apply`]; returns the balance the fact leaves on its user account,
    /// the balance before plus its change, for [`check_after`].
    pub(crate) fn apply(&mut self, fact: &Fact) -> Option<i128> {
        let mut after = None;
        for (account, currency, delta) in crate::projection::legs(fact) {
            let per_currency = if account.is_system() {
                let i = match self.system.iter().position(|(a, _)| a == account) {
                    Some(i) => i,
                    None => {
                        self.system.push((account.clone(), BTreeMap::new()));
                        self.system.len() - 1
                    }
                };
                &mut self.system[i].1
            } else {
                // The account's name is copied only the first time it is seen.
                match self.accounts.get_mut(account) {
                    Some(p) => p,
                    None => self.accounts.entry(account.clone()).or_default(),
                }
            };
            let balance = per_currency.entry(currency).or_insert(0);
            if !account.is_system() {
                after = Some(*balance + delta);
            }
            *balance = balance.saturating_add(delta);
        }
        after
    }

    pub(crate) fn get(&self, account: &Account, currency: Currency) -> Option<i128> {
        let per = if account.is_system() {
            &self.system.iter().find(|(a, _)| a == account)?.1
        } else {
            self.accounts.get(account)?
        };
        per.get(&currency).copied()
    }

    /// Every account with its balances, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Account, &BTreeMap<Currency, i128>)> {
        self.accounts
            .iter()
            .chain(self.system.iter().map(|(a, p)| (a, p)))
    }

    pub(crate) fn into_balances(self) -> Balances {
        Balances {
            accounts: self.accounts.into_iter().chain(self.system).collect(),
        }
    }
}

/// Checks one fact against the fold of the facts before it, given the balance it leaves
/// on its user account by the fold (`None` for a rejection, which moves nothing): the
/// balance it claims, no overdraft, and refund bounds. `withdrawals` maps (client,
/// withdrawal key) to (amount withdrawn, refunded so far).
pub(crate) fn check_after(
    r: &mut Report,
    fact: &Fact,
    after: Option<i128>,
    withdrawals: &mut Withdrawals,
) {
    let key = key_digest(&fact.client, &fact.key);
    check_after_keyed(r, fact, after, key, withdrawals);
}

/// [`check_after`] given the digest of the fact's own (client, key).
pub(crate) fn check_after_keyed(
    r: &mut Report,
    fact: &Fact,
    after: Option<i128>,
    key: u64,
    withdrawals: &mut Withdrawals,
) {
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
            withdrawals.insert(key, (amount.units(), 0));
        }
        FactBody::RefundRecorded {
            withdrawal,
            amount,
            refunded_total,
            ..
        } => match withdrawals.get_mut(&key_digest(&fact.client, withdrawal)) {
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

pub(crate) fn digest(parts: &[&[u8]]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in parts {
        p.hash(&mut h);
    }
    h.finish()
}

/// A 64-bit digest of (client, key); a verify confirms a digest match exactly wherever
/// it would report one.
pub(crate) fn key_digest(client: &ClientId, key: &Key) -> u64 {
    digest(&[client.as_str().as_bytes(), key.as_str().as_bytes()])
}
