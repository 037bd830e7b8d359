//! The builders the rooms share: the names a test speaks in (client, key, account,
//! currency), the three commands, and the submit helpers on a `Store`.

use std::sync::Arc;

use ledger::*;

/// The default client.
pub fn client() -> ClientId {
    ClientId::default_client()
}
pub fn key(s: &str) -> Key {
    Key::parse(s).unwrap()
}
pub fn acct(s: &str) -> Account {
    Account::parse(s).unwrap()
}
pub fn rub() -> Currency {
    Currency::parse("RUB").unwrap()
}
pub fn usd() -> Currency {
    Currency::parse("USD").unwrap()
}
pub fn deposit(a: &str, n: u64, c: Currency) -> Command {
    Command::Deposit {
        account: acct(a),
        amount: Amount::new(n).unwrap(),
        currency: c,
    }
}
pub fn withdraw(a: &str, n: u64, c: Currency) -> Command {
    Command::Withdraw {
        account: acct(a),
        amount: Amount::new(n).unwrap(),
        currency: c,
    }
}
pub fn refund(w: &str, n: u64) -> Command {
    Command::Refund {
        withdrawal: key(w),
        amount: Amount::new(n).unwrap(),
    }
}

/// Submits `command` under key `k` for the default client.
pub async fn submit(store: &Arc<dyn Store>, k: &str, command: Command) -> Submission {
    store
        .submit(&client(), &key(k), command, None)
        .await
        .unwrap()
}

/// Delivers `command` as message `m` under key `k` for the default client.
pub async fn deliver(store: &Arc<dyn Store>, m: &str, k: &str, command: Command) -> Submission {
    let id = MessageId::parse(m).unwrap();
    store
        .submit(&client(), &key(k), command, Some(id))
        .await
        .unwrap()
}

/// Submits `command` under key `k` for the default client on a sled ledger, blocking.
pub fn submit_blocking(ledger: &SledStore, k: &str, command: Command) -> Submission {
    ledger
        .blocking()
        .submit(&client(), &key(k), command)
        .unwrap()
}

pub fn executed(s: Submission) -> Outcome {
    match s {
        Submission::Executed(o) => o,
        other => panic!("expected Executed, got {other:?}"),
    }
}
