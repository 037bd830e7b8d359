//! Failpoints at the commit boundaries: the crash child arms one named crash point and
//! aborts itself there, mid-commit, under concurrent load. After each crash the parent
//! reopens the ledger: every acknowledged answer is there, identical, and `verify` passes,
//! so the group caught at the point is wholly there or wholly absent. The child keeps a
//! small journal (segments of 256 KiB, a checkpoint every 16 KiB or 100 ms, a compaction
//! every 512 KiB), so that checkpoints and compactions come often enough to be caught too.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use idem_tests::{Child, check_after_crash, collect_acks};

/// Sealed but not written; written but not synced; durable in the journal but not in
/// sled; in sled's memory but nobody told; a checkpoint with sled's writes made and not
/// synced; and a compaction with its base durable, before and after the journal's
/// segments below it are deleted.
const POINTS: [&str; 7] = [
    "journal.before_write",
    "journal.after_write",
    "journal.after_sync",
    "sync.after_apply",
    "checkpoint.before_sync",
    "compact.before_delete",
    "compact.after_delete",
];

#[test]
fn every_commit_boundary_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Acknowledgements per ledger folder.
    let mut ledgers: HashMap<std::path::PathBuf, HashMap<String, String>> = HashMap::new();
    let mut fired = 0;
    for (i, point) in POINTS.iter().enumerate() {
        // Early (the first groups), and later, with many groups behind. A checkpoint
        // comes once in tens of groups, and the workload's keys run out as they are done
        // (a done key's replay writes no group), so its points are caught earlier.
        // A compaction comes only once the journal since the last one weighs as much as its
        // base, so they grow apart as the ledger grows: its points are caught at the first
        // few.
        let passes_list = if point.starts_with("compact.") {
            [0u64, 1, 3]
        } else if point.starts_with("checkpoint.") {
            [0u64, 2, 5]
        } else {
            [0u64, 3, 40]
        };
        // A compaction comes once the journal holds as much as the last base: each of its
        // points starts on a new ledger of its own, whose base is small.
        let path = if point.starts_with("compact.") {
            dir.path().join(point)
        } else {
            dir.path().join("ledger")
        };
        let acked = ledgers.entry(path.clone()).or_default();
        // New keys all along for the points that need the journal to keep growing.
        let space = if point.starts_with("journal.") || point.starts_with("sync.") {
            "3000"
        } else {
            "1000000"
        };
        for (j, passes) in passes_list.into_iter().enumerate() {
            let seed = u64::try_from(i * 10 + j).unwrap();
            let child = Child::start(
                env!("CARGO_BIN_EXE_ledger-crash-child"),
                &path,
                seed,
                &[
                    ("IDEM_CRASH_AT", format!("{point}:{passes}")),
                    ("IDEM_KEY_SPACE", space.to_owned()),
                ],
            )
            .unwrap();
            let (status, lines, stderr, timed_out) =
                child.finish(Duration::from_secs(120)).unwrap();
            assert!(
                !timed_out,
                "{point} after {passes} passes never fired:\n{stderr}"
            );
            assert_eq!(
                status.signal(),
                Some(libc_sigabrt()),
                "{point}: the child must die at the crash point, not otherwise: {status:?}\n{stderr}"
            );
            fired += 1;
            collect_acks(&lines, acked).unwrap_or_else(|e| panic!("{point}: {e}"));
            check_after_crash(&path, acked)
                .unwrap_or_else(|e| panic!("{point} after {passes}: {e}"));
        }
    }
    let acked: usize = ledgers.values().map(HashMap::len).sum();
    assert_eq!(fired, POINTS.len() * 3);
    assert!(acked > 0, "nothing was acknowledged before the crashes");
    println!(
        "{fired} crashes at {} points, {} acknowledged keys intact",
        POINTS.len(),
        acked
    );
}

/// SIGABRT, which `std::process::abort` raises.
fn libc_sigabrt() -> i32 {
    6
}
