//! Group commit on sled: while the syncer is busy, the decider stages what arrives and
//! seals it as one journal group when the syncer is free: one journal write and sync, then
//! its inserts into sled, for all of it. The syncer is held busy with the
//! `journal.before_write` point armed to sleep (and, to see who writes, to call back),
//! which needs the ledger's `failpoints` feature: this crate enables it.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::task::Poll;
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

/// A fresh ledger in a folder of its own (kept while the handle lives) where alice holds
/// 1,000 RUB.
fn ledger_with_alice() -> (tempfile::TempDir, SledStore) {
    let dir = tempfile::tempdir().unwrap();
    let (l, _) = SledStore::open(SledConfig::new(dir.path().join("ledger"))).unwrap();
    let deposit = Command::Deposit {
        account: Account::parse("alice").unwrap(),
        amount: Amount::new(1_000).unwrap(),
        currency: Currency::parse("RUB").unwrap(),
    };
    l.blocking()
        .submit(
            &ClientId::default_client(),
            &Key::parse("d").unwrap(),
            deposit,
        )
        .unwrap();
    (dir, l)
}

/// Waits until `n` keys are in flight (claimed, not yet answered).
fn wait_pending(l: &SledStore, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while l.pending().len() < n {
        assert!(
            Instant::now() < deadline,
            "{n} keys never got in flight: {:?}",
            l.pending()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until exactly `n` requests wait for the committer (after a pause: once it has
/// taken the pause up, the commands queued behind it).
fn wait_queued(l: &SledStore, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while l.queued() != n {
        assert!(
            Instant::now() < deadline,
            "{n} requests never queued: {}",
            l.queued()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until the committer is idle as a leader finds it: the syncer thread has
/// finished its turn and parked. (A caller meeting it mid-turn finds it busy.)
fn wait_idle(l: &SledStore) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !l.committer_idle() {
        assert!(Instant::now() < deadline, "the committer never went idle");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn commands_that_arrive_while_the_syncer_is_busy_are_written_as_one_group() {
    let scenario = fail::FailScenario::setup();
    let (_dir, l) = ledger_with_alice();
    let client = ClientId::default_client();
    let before = l.commit_metrics();

    // Every journal write now sleeps first: the first withdrawal is sealed at once and
    // holds the syncer; the next twenty arrive one by one while it sleeps.
    fail::cfg("journal.before_write", "sleep(3000)").unwrap();
    let armed = Instant::now();
    let mut threads = Vec::new();
    for i in 0..21 {
        let (ledger, client) = (l.clone(), client.clone());
        threads.push(std::thread::spawn(move || {
            let (key, command) = withdrawal(&format!("w-{i}"));
            ledger.blocking().submit(&client, &key, command)
        }));
        // One at a time, so that a decider that sealed whatever it had would seal them
        // one by one.
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
    fail::remove("journal.before_write");

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

/// The names of the threads that passed `journal.before_write` while `f` ran: who wrote
/// each group to the journal.
fn writers(f: impl FnOnce()) -> Vec<String> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    fail::cfg_callback("journal.before_write", move || {
        let name = std::thread::current().name().unwrap_or("?").to_owned();
        log.lock().unwrap().push(name);
    })
    .unwrap();
    f();
    fail::remove("journal.before_write");
    seen.lock().unwrap().clone()
}

#[test]
fn a_blocking_caller_that_finds_the_committer_idle_writes_its_own_group() {
    let scenario = fail::FailScenario::setup();
    let (_dir, l) = ledger_with_alice();
    let client = ClientId::default_client();

    wait_idle(&l);

    // One blocking submitter, one command at a time: each is written by its own thread,
    // never handed to the committer's threads.
    let ledger = l.clone();
    let names = writers(|| {
        std::thread::Builder::new()
            .name("the-caller".into())
            .spawn(move || {
                for i in 0..5 {
                    wait_idle(&ledger);
                    let (key, command) = withdrawal(&format!("w-{i}"));
                    let answer = ledger.blocking().submit(&client, &key, command);
                    assert!(matches!(answer, Ok(Submission::Executed(_))), "{answer:?}");
                }
            })
            .unwrap()
            .join()
            .unwrap();
    });
    assert_eq!(names, vec!["the-caller"; 5]);

    // A callback caller never leads: the sync would hold its thread (an async runtime's).
    let names = writers(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        let (key, command) = withdrawal("w-async");
        l.submit_with(
            &ClientId::default_client(),
            &key,
            command,
            None,
            Box::new(move |r| tx.send(r).unwrap()),
        );
        assert!(matches!(rx.recv().unwrap(), Ok(Submission::Executed(_))));
    });
    assert_eq!(names, vec!["idem-syncer"]);

    // Nor does a caller that finds the committer busy: paused, its command waits in the
    // queue behind the pause and is written by the syncer.
    let names = writers(|| {
        let pause = l.pause();
        let ledger = l.clone();
        let waiting = std::thread::Builder::new()
            .name("the-caller".into())
            .spawn(move || {
                let (key, command) = withdrawal("w-paused");
                ledger
                    .blocking()
                    .submit(&ClientId::default_client(), &key, command)
            })
            .unwrap();
        wait_pending(&l, 1);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(l.commit_metrics().commands, 7, "committed while paused");
        drop(pause);
        assert!(matches!(
            waiting.join().unwrap(),
            Ok(Submission::Executed(_))
        ));
    });
    assert_eq!(names, vec!["idem-syncer"]);
    let balance = l
        .blocking()
        .account(&Account::parse("alice").unwrap())
        .and_then(|b| b.get(&Currency::parse("RUB").unwrap()).copied());
    assert_eq!(balance, Some(1_000 - 7));
    scenario.teardown();
}

#[test]
fn after_a_group_of_several_a_blocking_caller_queues_instead_of_leading() {
    let scenario = fail::FailScenario::setup();
    let (_dir, l) = ledger_with_alice();
    let client = ClientId::default_client();

    // Three callers queued behind a pause are decided and written as one group: others
    // are submitting.
    let pause = l.pause();
    wait_queued(&l, 0);
    let callers: Vec<_> = (0..3)
        .map(|i| {
            let (ledger, client) = (l.clone(), client.clone());
            std::thread::spawn(move || {
                let (key, command) = withdrawal(&format!("w-{i}"));
                ledger.blocking().submit(&client, &key, command)
            })
        })
        .collect();
    wait_pending(&l, 3);
    // A key is claimed just before its command is queued: wait for the last one to reach
    // the queue (a fixed sleep split them into two groups on a loaded machine).
    wait_queued(&l, 3);
    let before = l.commit_metrics();
    drop(pause);
    for c in callers {
        assert!(matches!(c.join().unwrap(), Ok(Submission::Executed(_))));
    }
    let after = l.commit_metrics();
    assert_eq!(after.batches - before.batches, 1, "{after:?}");
    assert_eq!(after.last_batch_size, 3);

    // So the next caller does not lead, though it finds the committer idle: it would
    // write a group of one while the others' next commands queued behind it.
    let one = |key: &'static str| {
        wait_idle(&l);
        let ledger = l.clone();
        writers(move || {
            std::thread::Builder::new()
                .name("the-caller".into())
                .spawn(move || {
                    let (key, command) = withdrawal(key);
                    let answer =
                        ledger
                            .blocking()
                            .submit(&ClientId::default_client(), &key, command);
                    assert!(matches!(answer, Ok(Submission::Executed(_))), "{answer:?}");
                })
                .unwrap()
                .join()
                .unwrap();
        })
    };
    assert_eq!(one("w-3"), vec!["idem-syncer"]);
    // That group was of one: the caller after it is likely alone, and leads.
    assert_eq!(one("w-4"), vec!["the-caller"]);
    assert_eq!(one("w-5"), vec!["the-caller"]);
    scenario.teardown();
}

/// Works on the calling thread for `d` without yielding it, as a runtime thread parsing an
/// HTTP request does.
fn busy(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

#[test]
fn async_submissions_run_in_one_wake_of_the_runtime_are_written_as_one_group() {
    // Every test of this file holds the scenario: the crash point's callback in
    // `writers` is the process's, and would count another test's groups.
    let scenario = fail::FailScenario::setup();
    let (_dir, l) = ledger_with_alice();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The syncer thread is free when the first command reaches the decider.
    wait_idle(&l);
    let before = l.commit_metrics();
    let answers = runtime.block_on(async {
        // Ten tasks ready at once on the runtime's one thread, each working 2 ms before it
        // submits: a decider handed each command alone would have sealed the first as a
        // group of one long before the last arrives.
        let tasks: Vec<_> = (0..10)
            .map(|i| {
                let l = l.clone();
                tokio::spawn(async move {
                    busy(Duration::from_millis(2));
                    let (key, command) = withdrawal(&format!("b-{i}"));
                    l.submit(&ClientId::default_client(), &key, command, None)
                        .await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        answers
    });
    for answer in &answers {
        assert!(matches!(answer, Ok(Submission::Executed(_))), "{answer:?}");
    }
    let after = l.commit_metrics();
    assert_eq!(after.batches - before.batches, 1, "{after:?}");
    assert_eq!(after.last_batch_size, 10, "{after:?}");
    scenario.teardown();
}

#[test]
fn a_gathering_whose_first_caller_went_away_is_still_committed() {
    let scenario = fail::FailScenario::setup();
    let (_dir, l) = ledger_with_alice();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = ClientId::default_client();
    let (key, command) = withdrawal("gone");
    runtime.block_on(async {
        // Polled once, the submission gathers its command and yields; then it is dropped,
        // as a runtime drops the task of a client that hung up.
        let mut gone = Box::pin(l.submit(&client, &key, command.clone(), None));
        let polled = std::future::poll_fn(|cx| Poll::Ready(gone.as_mut().poll(cx))).await;
        assert!(polled.is_pending(), "answered at once: {polled:?}");
        drop(gone);
    });
    // Its command was handed over all the same: its claim is released once it is
    // durable, and a retry is answered with its outcome.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !l.pending().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the gathered command was never committed: {:?}",
            l.pending()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let retry = l.blocking().submit(&client, &key, command).unwrap();
    assert!(matches!(retry, Submission::Replayed(_)), "{retry:?}");
    let balance = l
        .blocking()
        .account(&Account::parse("alice").unwrap())
        .and_then(|b| b.get(&Currency::parse("RUB").unwrap()).copied());
    assert_eq!(balance, Some(1_000 - 1));
    scenario.teardown();
}

/// The commit metrics count commands: a group that holds none (a quarantined message, a
/// sweep) is written and synced, but is no batch of commands, and a leader after it is
/// told by the commands of the last group, not by its other answers.
#[test]
fn groups_without_commands_are_not_counted_as_batches() {
    let scenario = fail::FailScenario::setup();
    let (_dir, l) = ledger_with_alice();
    let before = l.commit_metrics();
    let id = l
        .blocking()
        .quarantine(Some("m-1".into()), "undecodable: test".into(), b"x")
        .unwrap();
    assert_eq!(id, 1);
    l.blocking().sweep().unwrap();
    let after = l.commit_metrics();
    assert_eq!(l.blocking().quarantined(0, 10).unwrap().len(), 1);
    assert_eq!(
        (
            after.batches,
            after.commands,
            after.applies,
            after.last_batch_size
        ),
        (
            before.batches,
            before.commands,
            before.applies,
            before.last_batch_size
        ),
        "{after:?}"
    );
    // One command after them: one batch of one.
    let (key, command) = withdrawal("w-after");
    let answer = l
        .blocking()
        .submit(&ClientId::default_client(), &key, command);
    assert!(matches!(answer, Ok(Submission::Executed(_))), "{answer:?}");
    let last = l.commit_metrics();
    assert_eq!(
        (last.batches - after.batches, last.commands - after.commands),
        (1, 1)
    );
    assert_eq!(last.last_batch_size, 1);
    scenario.teardown();
}

/// The committer is idle only when a leader could lead: not while the decider holds a
/// pause, and again once it is let go and its last group is answered.
#[test]
fn the_committer_is_idle_only_when_nothing_holds_it() {
    let scenario = fail::FailScenario::setup();
    let (_dir, l) = ledger_with_alice();
    wait_idle(&l);
    let pause = l.pause();
    wait_queued(&l, 0);
    // Nothing is queued and the syncer waits, but the decider is held.
    assert!(!l.committer_idle());
    drop(pause);
    wait_idle(&l);
    scenario.teardown();
}
