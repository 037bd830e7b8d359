//! Black-box tests of `inbox-worker`: each starts the real binary (on a port the kernel
//! picks) and talks to it as a client would. One test binary, several modules.

#![allow(clippy::unwrap_used)]

mod amqp;
mod answers;
mod api;
mod bad_input;
mod cli;
mod crash_loop;
mod damaged;
mod durability;
mod feed;
mod inbox;
mod no_5xx;
mod openapi;
mod postgres;
mod raw;
mod replay;
mod support;
mod tenants;
mod tour;

#[test]
fn demo_tells_the_story() {
    let out = support::run(&["demo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "a fresh ledger in a temporary folder (deleted at the end)",
        "alice has 1,000.00 RUB; a client withdraws 300.00 RUB with key req-7f3a",
        "attempt 1: first execution                  balance=700.00 RUB",
        "attempt 2: replay (answer from the log)     balance=700.00 RUB",
        "attempt 3: replay (answer from the log)     balance=700.00 RUB",
        "new key:   first execution                  balance=500.00 RUB",
        "ok   bob's balance is 975.50 RUB (expected 975.50 RUB)",
        "ok   48 effects in the storm (expected 48: one per new key)",
        "verify: checked 51 facts, 51 keys done, 0 expired, 3 accounts in 1 currency\n\
         the accounts hold 1,625.50 RUB in total\n\
         all guarantees hold",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    for internal in ["FAIL", "twin", "projection", "seed"] {
        assert!(!text.contains(internal), "{internal:?} in\n{text}");
    }
}

/// `demo --db DIR` says where the ledger is kept, and told again on the same folder every
/// command is a replay: no new effect, the same balances, exit 0.
#[test]
fn demo_twice_on_one_folder_replays_the_whole_story() {
    let (_dir, db) = support::scratch();
    let path = db.to_str().unwrap();
    let first = support::run(&["demo", "--db", path]);
    let text = String::from_utf8_lossy(&first.stdout);
    assert_eq!(first.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!("Idem demo: the ledger in {path} (kept)")),
        "{text}"
    );
    assert!(!text.contains("temporary"), "{text}");
    assert!(
        text.contains("48 effects in the storm (expected 48"),
        "{text}"
    );

    let again = support::run(&["demo", "--db", path]);
    let text = String::from_utf8_lossy(&again.stdout);
    assert_eq!(
        again.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&again.stderr)
    );
    for line in [
        "This ledger already holds 51 keys of the story's 51, from an earlier demo",
        "attempt 1: replay (answer from the log)     balance=700.00 RUB",
        "new key:   replay (answer from the log)     balance=500.00 RUB",
        "-> 0 executed, 60 replayed",
        "Summary: 168 deliveries, 0 effects, 167 replays, 1 conflict (0 in flight, 1 reused key)",
        "ok   bob's balance is 975.50 RUB (expected 975.50 RUB)",
        "ok   0 effects in the storm (expected 0: one per new key)",
        "checked 51 facts, 51 keys done",
        "all guarantees hold",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(!text.contains("FAIL"), "{text}");
}

/// A folder holding other commands than the story's is refused before anything is sent:
/// the story's checks could not tell its effects from the others'.
#[test]
fn demo_refuses_a_ledger_that_is_not_its_own() {
    let (_dir, db) = support::scratch();
    let w = support::Worker::start(&db, &[]);
    w.http().deposit("dep-1", "alice", 1000);
    assert_eq!(w.term().code(), Some(0));
    let out = support::run(&["demo", "--db", db.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("holds other commands than the demo's: nothing was sent")
            && err.contains("fact 1 is key dep-1 of client default"),
        "{err}"
    );
    let verify = support::run(&["verify", "--db", db.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&verify.stdout);
    assert!(text.starts_with("checked 1 fact, 1 key done"), "{text}");
}
