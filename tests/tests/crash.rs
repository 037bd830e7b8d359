//! Crash test: a child process runs the ledger under concurrent load and is killed with
//! SIGKILL at random moments, sometimes while it opens. After each kill the parent reopens
//! the ledger: every answer the child printed (only after it was durable) is there with the
//! same outcome, and `verify` passes. IDEM_CRASH_CYCLES sets the number of cycles (20).
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use idem_tests::{Child, check_after_crash, collect_acks};
use rand::{Rng, SeedableRng, rngs::StdRng};

#[test]
fn acknowledged_answers_survive_sigkill() {
    let cycles: u64 = std::env::var("IDEM_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger");
    let mut acked: HashMap<String, String> = HashMap::new();
    let mut total_acks = 0usize;
    for cycle in 0..cycles {
        let mut child = Child::start(
            env!("CARGO_BIN_EXE_ledger-crash-child"),
            &path,
            seed * 10_000 + cycle,
            &[],
        )
        .unwrap();
        // One cycle in four is killed within the first few milliseconds: during open.
        let delay = if rng.random_range(0..4) == 0 {
            rng.random_range(0..15)
        } else {
            rng.random_range(50..400)
        };
        std::thread::sleep(Duration::from_millis(delay));
        child.kill().unwrap(); // SIGKILL on Unix
        let (status, lines, stderr, _) = child.finish(Duration::from_secs(30)).unwrap();
        assert!(!status.success(), "the child must have been killed");
        assert!(
            !stderr.contains("failed"),
            "cycle {cycle}: the child reported a failure:\n{stderr}"
        );
        total_acks +=
            collect_acks(&lines, &mut acked).unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        check_after_crash(&path, &acked).unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
    }
    println!(
        "{cycles} kill cycles, {total_acks} acknowledgements, {} distinct keys, all intact",
        acked.len()
    );
    assert!(total_acks > 0, "the children never acknowledged anything");
}
