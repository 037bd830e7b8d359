//! Crash test: a child process runs the ledger under concurrent load and is killed with
//! SIGKILL at random moments, sometimes while it opens. After each kill the parent reopens
//! the ledger: every answer the child printed (only after it was durable) is there with the
//! same outcome, and `verify` passes. IDEM_CRASH_CYCLES sets the number of cycles (20).
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use ledger::{ClientId, Config, Key, Ledger, fact::json};
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
        let mut child = Command::new(env!("CARGO_BIN_EXE_ledger-crash-child"))
            .arg(&path)
            .arg((seed * 10_000 + cycle).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut lines = Vec::new();
            let mut r = BufReader::new(stdout);
            let mut buf = String::new();
            // Only complete lines count: a kill may cut the last one.
            while r.read_line(&mut buf).unwrap_or(0) > 0 {
                if buf.ends_with('\n') {
                    lines.push(buf.trim_end().to_owned());
                }
                buf.clear();
            }
            lines
        });
        // One cycle in four is killed within the first few milliseconds: during open.
        let delay = if rng.random_range(0..4) == 0 {
            rng.random_range(0..15)
        } else {
            rng.random_range(50..400)
        };
        std::thread::sleep(Duration::from_millis(delay));
        child.kill().unwrap(); // SIGKILL on Unix
        let status = child.wait().unwrap();
        assert!(!status.success(), "the child must have been killed");
        let lines = reader.join().unwrap();
        let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
        assert!(
            !stderr.contains("failed"),
            "cycle {cycle}: the child reported a failure:\n{stderr}"
        );
        for line in &lines {
            let mut parts = line.splitn(3, ' ');
            assert_eq!(parts.next(), Some("ACK"));
            let (key, body) = (parts.next().unwrap(), parts.next().unwrap());
            total_acks += 1;
            if let Some(before) = acked.insert(key.to_owned(), body.to_owned()) {
                assert_eq!(
                    before, body,
                    "cycle {cycle}: key {key} was answered differently"
                );
            }
        }

        // Reopen: every acknowledged answer is there, identical.
        let (ledger, report) = Ledger::open(Config::new(&path)).unwrap();
        let client = ClientId::default_client();
        for (key, body) in &acked {
            let info = ledger
                .key(&client, &Key::parse(key).unwrap())
                .unwrap()
                .unwrap_or_else(|| panic!("cycle {cycle}: acknowledged key {key} is gone"));
            let stored = json::outcome(info.outcome.as_ref().unwrap()).to_string();
            assert_eq!(&stored, body, "cycle {cycle}: key {key} changed");
        }
        let verify = ledger.verify().unwrap();
        assert!(verify.ok(), "cycle {cycle}: {verify}\n{report}");
        ledger.shutdown();
    }
    println!(
        "{cycles} kill cycles, {total_acks} acknowledgements, {} distinct keys, all intact",
        acked.len()
    );
    assert!(total_acks > 0, "the children never acknowledged anything");
}
