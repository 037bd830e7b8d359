//! Projections: folds of the log. Applying a fact cannot fail; every projection here can
//! be rebuilt from the facts alone (see `verify`).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

use crate::core::AccountView;
use crate::domain::{Account, Currency, Rejection, Timestamp};
use crate::fact::{Fact, FactBody};

/// Double-entry balances: user accounts hold one currency each; the system accounts
/// `@world` and `@payouts` hold the other leg in every currency.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Balances {
    pub accounts: BTreeMap<Account, BTreeMap<Currency, i128>>,
}

/// The legs of a fact: (account, currency, signed change). Rejections move nothing.
/// Borrowed and without allocation: every commit and every verified fact folds them.
pub fn legs(fact: &Fact) -> impl Iterator<Item = (&Account, Currency, i128)> {
    static WORLD: LazyLock<Account> = LazyLock::new(Account::world);
    static PAYOUTS: LazyLock<Account> = LazyLock::new(Account::payouts);
    let pair = match &fact.body {
        FactBody::DepositRecorded {
            account,
            amount,
            currency,
            ..
        } => Some((&*WORLD, account, *currency, amount.units())),
        FactBody::WithdrawalRecorded {
            account,
            amount,
            currency,
            ..
        } => Some((account, &*PAYOUTS, *currency, amount.units())),
        FactBody::RefundRecorded {
            account,
            amount,
            currency,
            ..
        } => Some((&*PAYOUTS, account, *currency, amount.units())),
        FactBody::CommandRejected { .. } => None,
    };
    pair.map(|(from, to, currency, units)| {
        let a = i128::from(units);
        [(from, currency, -a), (to, currency, a)]
    })
    .into_iter()
    .flatten()
}

/// A movement as its user account's statement shows it: which account, in its currency,
/// by how much (signed minor units) and the balance after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatementLine<'a> {
    pub account: &'a Account,
    pub currency: Currency,
    pub change: i128,
    pub balance_after: u128,
}

/// The line a fact adds to its user account's statement; `None` for a rejection, which
/// moves nothing. The system accounts take the other leg of every movement and keep no
/// statement: their history is the log itself.
pub fn statement_line(fact: &Fact) -> Option<StatementLine<'_>> {
    let (account, currency, amount, sign, balance_after) = match &fact.body {
        FactBody::DepositRecorded {
            account,
            amount,
            currency,
            balance_after,
        } => (account, currency, amount, 1, balance_after),
        FactBody::WithdrawalRecorded {
            account,
            amount,
            currency,
            balance_after,
        } => (account, currency, amount, -1, balance_after),
        FactBody::RefundRecorded {
            account,
            amount,
            currency,
            balance_after,
            ..
        } => (account, currency, amount, 1, balance_after),
        FactBody::CommandRejected { .. } => return None,
    };
    Some(StatementLine {
        account,
        currency: *currency,
        change: sign * i128::from(amount.units()),
        balance_after: *balance_after,
    })
}

impl Balances {
    pub fn apply(&mut self, fact: &Fact) {
        for (account, currency, delta) in legs(fact) {
            // The account's name is copied only the first time it is seen.
            let per_currency = match self.accounts.get_mut(account) {
                Some(p) => p,
                None => self.accounts.entry(account.clone()).or_default(),
            };
            let balance = per_currency.entry(currency).or_insert(0);
            *balance = balance.saturating_add(delta);
        }
    }

    pub fn get(&self, account: &Account, currency: Currency) -> Option<i128> {
        self.accounts.get(account)?.get(&currency).copied()
    }

    /// A user account as a decision sees it; `None` if it never received a deposit.
    pub fn user_account(&self, account: &Account) -> Option<AccountView> {
        let (currency, balance) = self.accounts.get(account)?.iter().next()?;
        Some(AccountView {
            currency: *currency,
            balance: u128::try_from(*balance).unwrap_or(0),
        })
    }

    /// The sum of all balances per currency: zero for every currency, always.
    pub fn sums(&self) -> BTreeMap<Currency, i128> {
        let mut sums = BTreeMap::new();
        for per_currency in self.accounts.values() {
            for (currency, balance) in per_currency {
                *sums.entry(*currency).or_insert(0i128) += balance;
            }
        }
        sums
    }
}

/// Counters for the API and the dashboard. The first group is a fold of the facts and key
/// records and is checked by `verify`; the second counts observations that are not facts
/// (replays and conflicts write nothing) and is persisted with the next batch, best-effort.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub last_seq: u64,
    pub last_at: Timestamp,
    /// Applied deposits, withdrawals, refunds.
    pub applied: [u64; 3],
    /// Rejections, indexed like [`Rejection::ALL`].
    pub rejected: [u64; 5],
    pub keys_done: u64,
    pub keys_expired: u64,
    /// The last fact whose key the sweeper has looked at.
    pub sweep_cursor: u64,
    pub observed: Observed,
}

/// Counts of what happened without a fact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    pub replayed: u64,
    pub conflicts_in_flight: u64,
    pub conflicts_reused: u64,
}

impl Stats {
    /// Folds one new fact: its key is done.
    pub fn apply(&mut self, fact: &Fact) {
        self.last_seq = fact.seq;
        self.last_at = self.last_at.max(fact.at);
        self.keys_done += 1;
        match &fact.body {
            FactBody::DepositRecorded { .. } => self.applied[0] += 1,
            FactBody::WithdrawalRecorded { .. } => self.applied[1] += 1,
            FactBody::RefundRecorded { .. } => self.applied[2] += 1,
            FactBody::CommandRejected { rejection, .. } => {
                self.rejected[rejection.index()] += 1;
            }
        }
    }

    pub fn expire_one(&mut self) {
        self.keys_done = self.keys_done.saturating_sub(1);
        self.keys_expired += 1;
    }

    pub fn applied_total(&self) -> u64 {
        self.applied.iter().sum()
    }

    pub fn rejected_total(&self) -> u64 {
        self.rejected.iter().sum()
    }

    pub fn rejected_by_code(&self) -> Vec<(Rejection, u64)> {
        Rejection::ALL
            .iter()
            .map(|r| (*r, self.rejected[r.index()]))
            .collect()
    }
}
