//! Shared pieces of the end-to-end tests: the deterministic workload that crash children
//! run, so the parent can tell which command a key stands for.

use ledger::{Account, Amount, Command, Currency, Key};

/// The command a workload key stands for. A key always maps to the same command, so a
/// repeated key is a retry (a replay), never a reuse.
pub fn workload_command(n: u64) -> Command {
    let accounts = ["alice", "bob", "carol", "dave", "erin"];
    let account = Account::parse(accounts[usize::try_from(n % 5).unwrap_or(0)])
        .unwrap_or_else(|_| unreachable_account());
    let currency = Currency::parse("RUB").unwrap_or_else(|_| unreachable_account_currency());
    let amount = Amount::new(n % 97 + 1).unwrap_or_else(|_| unreachable_amount());
    match n % 3 {
        0 => Command::Deposit {
            account,
            amount: Amount::new((n % 97 + 1) * 10).unwrap_or(amount),
            currency,
        },
        1 => Command::Withdraw {
            account,
            amount,
            currency,
        },
        _ => Command::Refund {
            withdrawal: workload_key(n.saturating_sub(1)),
            amount: Amount::new(n % 5 + 1).unwrap_or(amount),
        },
    }
}

pub fn workload_key(n: u64) -> Key {
    Key::parse(&format!("k{n}")).unwrap_or_else(|_| unreachable_key())
}

// The constants above are valid by construction; these exist only to avoid unwrap.
fn unreachable_account() -> Account {
    panic!("constant account name is valid")
}
fn unreachable_account_currency() -> Currency {
    panic!("constant currency is valid")
}
fn unreachable_amount() -> Amount {
    panic!("constant amount is valid")
}
fn unreachable_key() -> Key {
    panic!("generated key is valid")
}
