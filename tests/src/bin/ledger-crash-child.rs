//! The child of the crash test: opens the ledger and submits the workload from several
//! threads, printing one `ACK` line per durable answer, until it is killed.
//! Usage: ledger-crash-child DB_PATH SEED
//! With IDEM_CRASH_AT=POINT:N the process aborts itself at the N+1-th pass of the named
//! crash point (see the ledger's `crash_point!`) instead of waiting to be killed. The
//! ledger keeps a small journal (256 KiB segments, a checkpoint every 16 KiB written or 100 ms).

use std::io::Write;
use std::sync::Arc;

use ledger::{ClientId, SledConfig, SledStore, Submission, json};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(seed)) = (args.next(), args.next()) else {
        eprintln!("usage: ledger-crash-child DB_PATH SEED");
        std::process::exit(2);
    };
    let seed: u64 = seed.parse().unwrap_or(0);
    if let Ok(at) = std::env::var("IDEM_CRASH_AT") {
        let Some((point, passes)) = at.split_once(':') else {
            eprintln!("IDEM_CRASH_AT must be POINT:N");
            std::process::exit(2);
        };
        if let Err(e) = fail::cfg(point, &format!("{passes}*off->return")) {
            eprintln!("arming {point} failed: {e}");
            std::process::exit(2);
        }
    }
    // With IDEM_SYNCED_COPY=DIR, each checkpoint copies the index's files to DIR once
    // they are synced: the state a power loss falls back to (`idem_tests::power`).
    if let Ok(to) = std::env::var("IDEM_SYNCED_COPY") {
        let ledger = std::path::PathBuf::from(&path);
        let copied = fail::cfg_callback("checkpoint.synced", move || {
            if let Err(e) = idem_tests::power::copy_index(&ledger, std::path::Path::new(&to)) {
                eprintln!("copying the synced index failed: {e}");
            }
        });
        if let Err(e) = copied {
            eprintln!("arming checkpoint.synced failed: {e}");
            std::process::exit(2);
        }
    }
    // A small journal: segments fill, checkpoints and compactions come often, and crashes
    // land in the middle of all of them within seconds.
    let mut config = SledConfig::new(path);
    config.journal.segment_size = 256 * 1024;
    // IDEM_CHECKPOINT_KIB: the journal written between checkpoints (16 KiB, and one every
    // 100 ms). Larger, sled writes its buffers in larger pieces at each checkpoint.
    let checkpoint_kib: u64 = std::env::var("IDEM_CHECKPOINT_KIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    config.checkpoint_bytes = checkpoint_kib * 1024;
    config.checkpoint_interval =
        std::time::Duration::from_millis(100.max(checkpoint_kib.min(2000)));
    config.compact_bytes = 512 * 1024;
    let (ledger, report) = match SledStore::open(config) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("open failed: {e}");
            std::process::exit(1);
        }
    };
    eprintln!("{report}");
    // IDEM_KEY_SPACE: how many distinct keys the workload draws from (3000). A small space
    // makes most commands retries; a large one keeps groups, and checkpoints, coming.
    let space: u64 = std::env::var("IDEM_KEY_SPACE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (ledger, out) = (ledger.clone(), out.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed * 1000 + t);
                let client = ClientId::default_client();
                loop {
                    // A small key space: many keys repeat within and across runs.
                    let n = rng.random_range(0..space);
                    let key = idem_tests::workload_key(n);
                    let command = idem_tests::workload_command(n);
                    match ledger.blocking().submit(&client, &key, command) {
                        Ok(Submission::Executed(o)) | Ok(Submission::Replayed(o)) => {
                            let line = format!("ACK {} {}\n", key, json::outcome(&o));
                            let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
                            // One write per line, so a kill leaves at most one partial line.
                            let _ = out.write_all(line.as_bytes());
                            let _ = out.flush();
                        }
                        Ok(_) => {}
                        Err(e) => {
                            eprintln!("submit failed: {e}");
                            std::process::exit(1);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}
