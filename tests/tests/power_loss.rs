//! Power loss under the sled store. A child process runs the ledger under concurrent load
//! (small journal segments, a checkpoint every 100 ms, compactions) and is killed with
//! SIGKILL, or dies in a checkpoint between sled's writes and their sync; then the index's files are cut as a power loss would leave them
//! (`idem_tests::power`): of everything sled wrote since its last synced checkpoint, each
//! page reached the disk or not, in any order, one page torn, unsynced creations and
//! removals undone or not. Some cycles also crash the next open in the middle of the
//! rebuild it starts. After each loss the ledger opens without help (rebuilding its index
//! from the journal when sled's files are damaged), every acknowledged answer is there
//! byte for byte, nothing is applied twice, and `verify` passes. IDEM_POWER_CYCLES sets the
//! least number of cycles (8; more until two losses needed a rebuild), SEED the random
//! stream.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use idem_tests::power::{copy_index, power_cut, synced_copy};
use idem_tests::{Child, check_after_crash, collect_acks};
use rand::{Rng, SeedableRng, rngs::StdRng};

#[test]
fn acknowledged_answers_survive_power_loss_and_a_crash_during_the_rebuild() {
    let cycles: u64 = std::env::var("IDEM_POWER_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(41);
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger");
    let synced = dir.path().join("synced");
    let child_bin = env!("CARGO_BIN_EXE_ledger-crash-child");
    let mut acked: HashMap<String, String> = HashMap::new();
    let (mut total_acks, mut rebuilds, mut rebuilds_crashed, mut torn) = (0usize, 0, 0, 0);
    // At least `cycles`, and on until two losses have needed a rebuild (whether a cut
    // damages what sled reads depends on where the kill fell), at most three times as many.
    let mut cycle = 0;
    while cycle < cycles || (rebuilds < 2 && cycle < cycles * 3) {
        // What the last cycle's clean shutdown left is synced.
        copy_index(&path, &synced).unwrap();
        let mut env = vec![
            ("IDEM_SYNCED_COPY", synced.display().to_string()),
            ("IDEM_KEY_SPACE", "1000000".to_owned()),
            (
                "IDEM_CHECKPOINT_KIB",
                std::env::var("IDEM_CHECKPOINT_KIB").unwrap_or_else(|_| "2048".into()),
            ),
        ];
        // Every other cycle the power goes in the middle of a checkpoint: sled has written
        // its buffers, and their sync has not returned. The others at a random moment.
        let in_checkpoint = cycle % 2 == 0;
        if in_checkpoint {
            let passes = rng.random_range(0..10);
            env.push(("IDEM_CRASH_AT", format!("checkpoint.before_sync:{passes}")));
        }
        let mut child = Child::start(child_bin, &path, seed * 10_000 + cycle, &env).unwrap();
        if !in_checkpoint {
            std::thread::sleep(Duration::from_millis(rng.random_range(100..350)));
            child.kill().unwrap();
        }
        let (status, lines, stderr, timed_out) = child.finish(Duration::from_secs(60)).unwrap();
        assert!(
            !timed_out,
            "cycle {cycle}: the crash point never fired:\n{stderr}"
        );
        assert!(!status.success(), "cycle {cycle}: the child must have died");
        assert!(
            !stderr.contains("failed"),
            "cycle {cycle}: the child reported a failure:\n{stderr}"
        );
        total_acks +=
            collect_acks(&lines, &mut acked).unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        let from = synced_copy(&synced).expect("a synced copy of the index");
        let cut = power_cut(&path, &from, &mut rng).unwrap();
        torn += usize::from(cut.torn);

        if cycle % 3 == 2 {
            // The next open dies in the middle of its rebuild, if it needs one; otherwise
            // it serves, and is killed (its own writes then synced or in the journal).
            let child = Child::start(
                child_bin,
                &path,
                seed * 10_000 + cycle + 5_000,
                &[("IDEM_CRASH_AT", "rebuild.after_groups:0".to_owned())],
            )
            .unwrap();
            let (status, lines, stderr, timed_out) =
                child.finish(Duration::from_millis(1500)).unwrap();
            if !timed_out {
                assert_eq!(
                    status.signal(),
                    Some(6),
                    "cycle {cycle}: the open must die at the crash point or serve:\n{stderr}"
                );
                rebuilds_crashed += 1;
            }
            collect_acks(&lines, &mut acked).unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        }

        let report = check_after_crash(&path, &acked)
            .unwrap_or_else(|e| panic!("cycle {cycle} after {cut:?}: {e}"));
        if let Some(rebuilt) = &report.rebuilt {
            rebuilds += 1;
            println!("cycle {cycle}: {rebuilt}");
        }
        cycle += 1;
    }
    println!(
        "{cycle} power losses ({torn} with a torn page), {rebuilds} index rebuilds \
         ({rebuilds_crashed} crashed once midway), {total_acks} acknowledgements, {} distinct \
         keys, all intact",
        acked.len()
    );
    assert!(total_acks > 0, "the children never acknowledged anything");
    assert!(
        rebuilds > 0,
        "no power loss damaged the index: the cuts do not reach what they must test"
    );
}

/// A crash in the middle of a rebuild: the ledger's index is damaged (a fact's record in
/// sled overwritten), the next open starts rebuilding it and dies once every group is
/// replayed; the open after that finds the rebuild unfinished, throws its partial index
/// away, rebuilds again, and every acknowledged answer is there.
#[test]
fn a_crash_in_the_middle_of_a_rebuild_is_finished_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger");
    let child_bin = env!("CARGO_BIN_EXE_ledger-crash-child");
    let mut child = Child::start(child_bin, &path, 7, &[]).unwrap();
    // Serving until it has acknowledged something; a kill at any moment is a crash test.
    std::thread::sleep(Duration::from_millis(400));
    child.kill().unwrap();
    let (_, lines, _, _) = child.finish(Duration::from_secs(30)).unwrap();
    let mut acked = HashMap::new();
    assert!(
        collect_acks(&lines, &mut acked).unwrap() > 0,
        "nothing acknowledged"
    );
    // Opened and closed once (the crash replayed), then the index damaged.
    check_after_crash(&path, &acked).unwrap();
    {
        let db = sled::open(&path).unwrap();
        let tree = db.open_tree("ledger").unwrap();
        let (k, _) = tree.scan_prefix(b"f").next_back().unwrap().unwrap();
        tree.insert(k, &[0xff_u8, 0x13][..]).unwrap();
        db.flush().unwrap();
    }
    ledger::store::sled::wait_until_released(&path);
    let child = Child::start(
        child_bin,
        &path,
        8,
        &[("IDEM_CRASH_AT", "rebuild.after_groups:0".to_owned())],
    )
    .unwrap();
    let (status, _, stderr, timed_out) = child.finish(Duration::from_secs(60)).unwrap();
    assert!(
        !timed_out,
        "the open did not reach the crash point:\n{stderr}"
    );
    assert_eq!(status.signal(), Some(6), "{stderr}");
    assert!(path.join("rebuilding").exists(), "the rebuild's mark stays");
    let report = check_after_crash(&path, &acked).unwrap();
    let rebuilt = report.rebuilt.expect("the open finishes the rebuild");
    assert!(
        rebuilt.reason.contains("did not finish (it began because")
            && rebuilt.reason.contains("undecodable fact"),
        "{rebuilt}"
    );
    assert!(!path.join("rebuilding").exists());
}
