//! `verify` runs while commits go on: it reads the log with no lock and holds the
//! committer only for one short step at the end. The `verify.scanned` point (the
//! ledger's `failpoints` feature, enabled by this crate) holds a verify between its scan
//! and that step, so the test can commit, refund and sweep there, as a busy worker would.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use ledger::*;

fn rub() -> Currency {
    Currency::parse("RUB").unwrap()
}

fn submit(l: &SledStore, key: &str, command: Command) -> Submission {
    l.blocking()
        .submit(
            &ClientId::default_client(),
            &Key::parse(key).unwrap(),
            command,
        )
        .unwrap()
}

fn deposit(account: &str, amount: u64) -> Command {
    Command::Deposit {
        account: Account::parse(account).unwrap(),
        amount: Amount::new(amount).unwrap(),
        currency: rub(),
    }
}

fn withdraw(account: &str, amount: u64) -> Command {
    Command::Withdraw {
        account: Account::parse(account).unwrap(),
        amount: Amount::new(amount).unwrap(),
        currency: rub(),
    }
}

fn refund(withdrawal: &str, amount: u64) -> Command {
    Command::Refund {
        withdrawal: Key::parse(withdrawal).unwrap(),
        amount: Amount::new(amount).unwrap(),
    }
}

#[test]
fn commits_refunds_and_sweeps_go_on_while_verify_reads_the_log() {
    let scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp(1_800_000_000_000));
    let config = SledConfig::new(dir.path().join("ledger")).clock(Arc::new(clock.clone()));
    let (l, _) = SledStore::open(config).unwrap();
    submit(&l, "d-alice", deposit("alice", 1_000));
    submit(&l, "d-bob", deposit("bob", 500));
    for i in 0..200 {
        submit(&l, &format!("w-{i}"), withdraw("alice", 1));
    }
    submit(&l, "w-big", withdraw("bob", 300));
    submit(&l, "r-1", refund("w-big", 100));
    let before = l.blocking().stats().last_seq;

    fail::cfg("verify.scanned", "pause").unwrap();
    let verifying = {
        let l = l.clone();
        std::thread::spawn(move || l.blocking().verify())
    };
    // Give the verify time to read the log and reach the point.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!verifying.is_finished(), "verify did not stop at its point");

    // Commands commit while the verify holds its scan: it holds no lock on the ledger.
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let l = l.clone();
        std::thread::spawn(move || {
            let answers = vec![
                submit(&l, "d-carol", deposit("carol", 70)),
                submit(&l, "w-carol", withdraw("carol", 20)),
                submit(&l, "r-2", refund("w-big", 50)),
                submit(&l, "w-over", withdraw("bob", 1_000_000)),
                submit(&l, "w-0", withdraw("alice", 1)),
            ];
            // The retention passes for every key so far, and the sweep expires them.
            clock.advance_ms(25 * 3600 * 1000);
            let expired = l.blocking().sweep().unwrap();
            let _ = tx.send((answers, expired));
        });
    }
    let (answers, expired) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("commands and a sweep waited for the verify: it holds the committer");
    assert!(matches!(answers[0], Submission::Executed(_)));
    assert!(matches!(answers[4], Submission::Replayed(_)));
    assert!(expired > 200, "expired {expired}");
    assert!(!verifying.is_finished());

    fail::remove("verify.scanned");
    let report = verifying.join().unwrap().unwrap();
    assert!(report.ok(), "{report}");
    // The step folded what was written during the scan.
    assert_eq!(report.facts, before + 4, "{report}");
    assert_eq!(report.facts, l.blocking().stats().last_seq);
    assert_eq!(
        report.keys_expired,
        l.blocking().stats().keys_expired,
        "{report}"
    );
    // And a verify with nothing in between agrees.
    let again = l.blocking().verify().unwrap();
    assert!(again.ok(), "{again}");
    assert_eq!(again, report);
    scenario.teardown();
}
