//! The pure core: given what the ledger knows, a command and the time, decide the fact to
//! record. No I/O, no clock, no failure: every input has an answer.

use crate::domain::{
    Account, Amount, ClientId, Command, Currency, Fingerprint, Key, Rejection, RejectionDetail,
    Timestamp,
};
use crate::fact::{Fact, FactBody};

/// A user account as the decision needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountView {
    pub currency: Currency,
    pub balance: u128,
}

/// An applied withdrawal as a refund needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WithdrawalView {
    pub account: Account,
    pub currency: Currency,
    pub amount: Amount,
    /// The sum of the refunds recorded against it so far.
    pub refunded: u64,
}

/// Everything a decision reads, loaded by the shell before deciding: for a deposit or a
/// withdrawal the account; for a refund the withdrawal and the account it came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inputs {
    pub account: Option<AccountView>,
    pub withdrawal: Option<WithdrawalView>,
}

/// What a key already holds, seen by a new arrival of the same (client, key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Nothing: this arrival may execute.
    New,
    /// The same command: answer with the stored outcome.
    Replay,
    /// Another command under the same key: refuse, change nothing.
    Reused,
}

/// The compare in compare-and-swap: the key's stored fingerprint against the arrival's.
pub fn classify(stored: Option<Fingerprint>, arriving: Fingerprint) -> Seen {
    match stored {
        None => Seen::New,
        Some(f) if f == arriving => Seen::Replay,
        Some(_) => Seen::Reused,
    }
}

/// Decides the fact for a new key. `seq` and `at` are assigned by the committer.
pub fn decide(
    client: &ClientId,
    key: &Key,
    command: &Command,
    inputs: &Inputs,
    seq: u64,
    at: Timestamp,
) -> Fact {
    let body = match decide_body(command, inputs) {
        Ok(body) => body,
        Err((rejection, detail)) => FactBody::CommandRejected {
            command: command.clone(),
            rejection,
            detail,
        },
    };
    Fact {
        seq,
        at,
        client: client.clone(),
        key: key.clone(),
        body,
    }
}

/// A rejection and what it tells the client beyond its code.
type Refusal = (Rejection, Option<RejectionDetail>);

fn decide_body(command: &Command, inputs: &Inputs) -> Result<FactBody, Refusal> {
    match command {
        Command::Deposit {
            account,
            amount,
            currency,
        } => {
            let balance = match inputs.account {
                None => 0,
                Some(view) if view.currency != *currency => {
                    return Err(mismatch(view.currency));
                }
                Some(view) => view.balance,
            };
            Ok(FactBody::DepositRecorded {
                account: account.clone(),
                amount: *amount,
                currency: *currency,
                // 2^128 minor units are beyond any sum of amounts of at most 10^15.
                balance_after: balance.saturating_add(u128::from(amount.units())),
            })
        }
        Command::Withdraw {
            account,
            amount,
            currency,
        } => {
            let view = inputs.account.ok_or((Rejection::AccountNotFound, None))?;
            if view.currency != *currency {
                return Err(mismatch(view.currency));
            }
            let balance_after = view
                .balance
                .checked_sub(u128::from(amount.units()))
                .ok_or((
                    Rejection::InsufficientFunds,
                    Some(RejectionDetail::Balance(view.balance)),
                ))?;
            Ok(FactBody::WithdrawalRecorded {
                account: account.clone(),
                amount: *amount,
                currency: *currency,
                balance_after,
            })
        }
        Command::Refund { withdrawal, amount } => {
            let w = inputs
                .withdrawal
                .as_ref()
                .ok_or((Rejection::WithdrawalNotFound, None))?;
            let room = w.amount.units().saturating_sub(w.refunded);
            if amount.units() > room {
                return Err((
                    Rejection::RefundExceedsWithdrawal,
                    Some(RejectionDetail::Refundable(room)),
                ));
            }
            // The account exists: the withdrawal was taken from it.
            let balance = inputs.account.map_or(0, |a| a.balance);
            Ok(FactBody::RefundRecorded {
                withdrawal: withdrawal.clone(),
                account: w.account.clone(),
                amount: *amount,
                currency: w.currency,
                balance_after: balance.saturating_add(u128::from(amount.units())),
                refunded_total: w.refunded + amount.units(),
            })
        }
    }
}

fn mismatch(held: Currency) -> Refusal {
    (
        Rejection::CurrencyMismatch,
        Some(RejectionDetail::AccountCurrency(held)),
    )
}
