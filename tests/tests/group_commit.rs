//! Group commit on sled: while the syncer is busy, the decider stages what arrives and
//! writes it into sled in one `apply_batch` when the syncer is free (each apply costs sled
//! two log writes, each with its own `sync_file_range`). The syncer is held busy with the
//! `sync.before_flush` point armed to sleep, which needs the ledger's `failpoints`
//! feature: this crate enables it.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use ledger::*;

fn withdrawal(key: &str) -> (Key, Command) {
    (
        Key::parse(key).unwrap(),
        Command::Withdraw {
            account: Account::parse("alice").unwrap(),
            amount: Amount::new(1).unwrap(),
            currency: Currency::parse("RUB").unwrap(),
        },
    )
}

/// Waits until `n` keys are in flight (claimed, not yet answered).
fn wait_pending(l: &SledStore, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while l.pending().len() < n {
        assert!(Instant::now() < deadline, "{n} keys never got in flight");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn commands_that_arrive_while_the_syncer_is_busy_are_applied_in_one_write() {
    let scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let (l, _) = SledStore::open(SledConfig::new(dir.path().join("ledger"))).unwrap();
    let client = ClientId::default_client();
    l.blocking()
        .submit(
            &client,
            &Key::parse("d").unwrap(),
            Command::Deposit {
                account: Account::parse("alice").unwrap(),
                amount: Amount::new(1_000).unwrap(),
                currency: Currency::parse("RUB").unwrap(),
            },
        )
        .unwrap();
    let before = l.commit_metrics();

    // Every sync now sleeps before its flush: the first withdrawal is applied at once
    // and holds the syncer; the next twenty arrive one by one while it sleeps.
    fail::cfg("sync.before_flush", "sleep(3000)").unwrap();
    let armed = Instant::now();
    let mut threads = Vec::new();
    for i in 0..21 {
        let (ledger, client) = (l.clone(), client.clone());
        threads.push(std::thread::spawn(move || {
            let (key, command) = withdrawal(&format!("w-{i}"));
            ledger.blocking().submit(&client, &key, command)
        }));
        // One at a time, so that a decider that applied whatever it had would apply
        // them one by one.
        wait_pending(&l, i + 1);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        armed.elapsed() < Duration::from_millis(2500),
        "the machine was too slow to queue twenty commands within one sleeping sync"
    );
    for t in threads {
        assert!(matches!(t.join().unwrap(), Ok(Submission::Executed(_))));
    }
    fail::remove("sync.before_flush");

    let after = l.commit_metrics();
    // The first alone, then the twenty together.
    assert_eq!(after.applies - before.applies, 2, "{after:?}");
    assert_eq!(after.batches - before.batches, 2, "{after:?}");
    assert_eq!(after.commands - before.commands, 21, "{after:?}");
    assert_eq!(after.last_batch_size, 20);
    let balance = l
        .blocking()
        .account(&Account::parse("alice").unwrap())
        .and_then(|b| b.get(&Currency::parse("RUB").unwrap()).copied());
    assert_eq!(balance, Some(1_000 - 21));
    scenario.teardown();
}
