//! Races on a real ledger: many threads, one key; many threads, one account.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Barrier};

use ledger::*;

/// A fresh ledger where alice holds 1,000 RUB.
fn open_with_alice() -> (tempfile::TempDir, Ledger, ClientId, Account) {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _) = Ledger::open(Config::new(dir.path().join("l"))).unwrap();
    let client = ClientId::default_client();
    let alice = Account::parse("alice").unwrap();
    let deposit = Command::Deposit {
        account: alice.clone(),
        amount: Amount::new(1_000).unwrap(),
        currency: rub(),
    };
    ledger
        .submit(&client, &Key::parse("d").unwrap(), deposit)
        .unwrap();
    (dir, ledger, client, alice)
}

fn rub() -> Currency {
    Currency::parse("RUB").unwrap()
}

#[test]
fn sixty_four_threads_one_key_one_effect() {
    let (_dir, ledger, client, alice) = open_with_alice();
    let barrier = Arc::new(Barrier::new(64));
    let handles: Vec<_> = (0..64)
        .map(|_| {
            let (ledger, barrier, client, alice) = (
                ledger.clone(),
                barrier.clone(),
                client.clone(),
                alice.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                ledger
                    .submit(
                        &client,
                        &Key::parse("pay-1").unwrap(),
                        Command::Withdraw {
                            account: alice,
                            amount: Amount::new(300).unwrap(),
                            currency: rub(),
                        },
                    )
                    .unwrap()
            })
        })
        .collect();
    let answers: Vec<Submission> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let executed = answers
        .iter()
        .filter(|a| matches!(a, Submission::Executed(_)))
        .count();
    assert_eq!(executed, 1, "{answers:?}");
    let first = answers.iter().find_map(|a| match a {
        Submission::Executed(o) => Some(o.clone()),
        _ => None,
    });
    for a in &answers {
        match a {
            Submission::Executed(_) | Submission::InProgress { .. } => {}
            Submission::Replayed(o) => assert_eq!(Some(o), first.as_ref()),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ledger.account(&alice).unwrap()[&rub()], 700);
    assert_eq!(ledger.stats().applied, [1, 1, 0]);
    assert!(ledger.verify().unwrap().ok());
}

#[test]
fn thirty_two_threads_racing_withdrawals_never_overdraw() {
    let (_dir, ledger, client, alice) = open_with_alice();
    let barrier = Arc::new(Barrier::new(32));
    let handles: Vec<_> = (0..32)
        .map(|t| {
            let (ledger, barrier, client, alice) = (
                ledger.clone(),
                barrier.clone(),
                client.clone(),
                alice.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                let mut applied = 0u64;
                for i in 0..20 {
                    let key = Key::parse(&format!("w-{t}-{i}")).unwrap();
                    let s = ledger
                        .submit(
                            &client,
                            &key,
                            Command::Withdraw {
                                account: alice.clone(),
                                amount: Amount::new(7).unwrap(),
                                currency: rub(),
                            },
                        )
                        .unwrap();
                    match s {
                        Submission::Executed(o) if o.is_applied() => applied += 1,
                        Submission::Executed(o) => {
                            assert_eq!(o.rejection(), Some(Rejection::InsufficientFunds));
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
                applied
            })
        })
        .collect();
    let applied: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    // 1000 / 7 = 142 withdrawals fit, and all of them must have gone through.
    assert_eq!(applied, 142);
    let balance = ledger.account(&alice).unwrap()[&rub()];
    assert_eq!(balance, 1_000 - 142 * 7);
    assert_eq!(ledger.balances().sums()[&rub()], 0);
    let report = ledger.verify().unwrap();
    assert!(report.ok(), "{report}");
}
