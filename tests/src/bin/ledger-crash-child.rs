//! The child of the crash test: opens the ledger and submits the workload from several
//! threads, printing one `ACK` line per durable answer, until it is killed.
//! Usage: ledger-crash-child DB_PATH SEED
//! With IDEM_CRASH_AT=POINT:N the process aborts itself at the N+1-th pass of the named
//! crash point (see the ledger's `crash_point!`) instead of waiting to be killed. The
//! ledger keeps a small journal (256 KiB segments, a checkpoint every 16 KiB written or 100 ms).

use std::io::Write;
use std::sync::Arc;

use ledger::{ClientId, SledConfig, SledStore, Submission, fact::json};
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
    // A small journal: segments fill, checkpoints delete them, and crashes land in the
    // middle of both within seconds.
    let mut config = SledConfig::new(path);
    config.journal.segment_size = 256 * 1024;
    config.checkpoint_bytes = 16 * 1024;
    config.checkpoint_interval = std::time::Duration::from_millis(100);
    let (ledger, report) = match SledStore::open(config) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("open failed: {e}");
            std::process::exit(1);
        }
    };
    eprintln!("{report}");
    let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (ledger, out) = (ledger.clone(), out.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed * 1000 + t);
                let client = ClientId::default_client();
                loop {
                    // A small key space: many keys repeat within and across runs.
                    let n = rng.random_range(0..3000u64);
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
