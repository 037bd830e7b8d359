//! `cargo bench -p ledger --bench load`: durable throughput and latency percentiles with
//! 1, 8 and 64 concurrent submitters, for new keys and for replays, beside the disk's own
//! limit measured in the same run (a bare loop of 4 KiB `pwrite` + `fdatasync` on the same
//! file system, and beside the 8-submitter row a bare group commit of 8 threads), with
//! their ratios; then the cost of a ledger of many facts: bytes on disk
//! per fact, the time to open it after a clean shutdown and after a `kill -9` (with the
//! journal's replay), verify's speed, and the rebuild of the index from the journal.
//! IDEM_BENCH_SECS (default 3) sets each run's length, IDEM_BENCH_FACTS (1,000,000) the
//! size of the large ledger, IDEM_BENCH_JOURNAL_SYNC=dsync writes the journal with
//! `O_DSYNC` instead of `fdatasync`, IDEM_BENCH_CHECKPOINT_MS and IDEM_BENCH_CHECKPOINT_KIB
//! set how often checkpoints come. IDEM_BENCH_LEDGER=<folder> keeps the large ledger there
//! and reuses it when it is already filled; IDEM_BENCH_ONLY=large skips the first part.
// A measuring tool: lossy casts of counts and durations to print them are fine here.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ledger::*;

/// The worker allocates with mimalloc; so does this bench, to measure what it runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn withdraw(account: &Account) -> Command {
    Command::Withdraw {
        account: account.clone(),
        amount: Amount::new(1).unwrap(),
        currency: Currency::parse("RUB").unwrap(),
    }
}

fn bench_account(i: usize) -> Account {
    Account::parse(&format!("acct{i}")).unwrap()
}

fn seed_accounts(ledger: &SledStore, n: usize) -> Vec<Account> {
    let client = ClientId::default_client();
    (0..n)
        .map(|i| {
            let a = bench_account(i);
            ledger
                .blocking()
                .submit(
                    &client,
                    &Key::parse(&format!("seed-{i}")).unwrap(),
                    Command::Deposit {
                        account: a.clone(),
                        amount: Amount::new(1_000_000_000_000_000).unwrap(),
                        currency: Currency::parse("RUB").unwrap(),
                    },
                )
                .unwrap();
            a
        })
        .collect()
}

struct Run {
    ops: u64,
    secs: f64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
}

/// A new key's command executed now; a replay answered with the stored, applied outcome.
fn done_as_asked(s: &Submission, replay: bool) -> bool {
    match s {
        Submission::Executed(o) => !replay && o.is_applied(),
        Submission::Replayed(o) => replay && o.is_applied(),
        _ => false,
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// `submitters` threads, each submitting one command at a time for `secs`: replays of
/// the prepared keys, or new keys `{prefix}-n`, executed, every one (a prefix of its own
/// per row: a key another row did would be a replay, cheaper than the row's figure claims).
fn run(
    ledger: &SledStore,
    accounts: &[Account],
    submitters: usize,
    replay: bool,
    prefix: &str,
    secs: u64,
) -> Run {
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..submitters)
        .map(|t| {
            let (ledger, stop, next, accounts, prefix) = (
                ledger.clone(),
                stop.clone(),
                next.clone(),
                accounts.to_vec(),
                prefix.to_owned(),
            );
            std::thread::spawn(move || {
                let client = ClientId::default_client();
                let mut lat = Vec::with_capacity(1 << 16);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (key, account) = if replay {
                        // Replays of keys that are done: the prepared ones below.
                        let n = (i * 7919 + t as u64) % 10_000;
                        (
                            format!("replay-{n}"),
                            &accounts[(n as usize) % accounts.len()],
                        )
                    } else {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        (
                            format!("{prefix}-{n}"),
                            &accounts[(n as usize) % accounts.len()],
                        )
                    };
                    let key = Key::parse(&key).unwrap();
                    let t0 = Instant::now();
                    let s = ledger
                        .blocking()
                        .submit(&client, &key, withdraw(account))
                        .unwrap();
                    lat.push(t0.elapsed().as_micros() as u64);
                    assert!(done_as_asked(&s, replay), "{s:?}");
                    i += 1;
                }
                lat
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let all: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    run_of(all, started.elapsed().as_secs_f64())
}

/// The same load from `submitters` concurrent requests driven by one thread through
/// `submit_with` callbacks: how an async caller (the worker's HTTP handlers) uses the
/// ledger, without one OS thread parked per request.
/// New keys are `{prefix}-n`, as in [`run`].
fn run_async(
    ledger: &SledStore,
    accounts: &[Account],
    submitters: usize,
    replay: bool,
    prefix: &str,
    secs: u64,
) -> Run {
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<(Instant, bool)>();
    let client = ClientId::default_client();
    let mut next = 0u64;
    let submit_one = |next: &mut u64| {
        let n = *next;
        *next += 1;
        let (key, account) = if replay {
            let r = (n * 7919) % 10_000;
            (
                format!("replay-{r}"),
                &accounts[(r as usize) % accounts.len()],
            )
        } else {
            (
                format!("{prefix}-{n}"),
                &accounts[(n as usize) % accounts.len()],
            )
        };
        let tx = done_tx.clone();
        let t0 = Instant::now();
        ledger.submit_with(
            &client,
            &Key::parse(&key).unwrap(),
            withdraw(account),
            None,
            Box::new(move |r| {
                let ok = matches!(&r, Ok(s) if done_as_asked(s, replay));
                let _ = tx.send((t0, ok));
            }),
        );
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    for _ in 0..submitters {
        submit_one(&mut next);
    }
    let mut lat = Vec::with_capacity(1 << 20);
    let mut outstanding = submitters;
    while outstanding > 0 {
        let (t0, ok) = done_rx.recv().unwrap();
        assert!(
            ok,
            "a command was not done as asked (executed, or replayed)"
        );
        lat.push(t0.elapsed().as_micros() as u64);
        outstanding -= 1;
        if Instant::now() < deadline {
            submit_one(&mut next);
            outstanding += 1;
        }
    }
    run_of(lat, started.elapsed().as_secs_f64())
}

/// A file of `size` bytes preallocated with written zeros, as the journal's segments are.
fn preallocated(path: &std::path::Path, size: u64) -> std::fs::File {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..(size >> 20) {
        file.write_all(&zeros).unwrap();
    }
    file.sync_all().unwrap();
    file
}

/// A run's figures from its latencies (µs, in any order) and its length.
fn run_of(mut lat: Vec<u64>, secs: f64) -> Run {
    lat.sort_unstable();
    Run {
        ops: lat.len() as u64,
        secs,
        p50_us: percentile(&lat, 0.50),
        p99_us: percentile(&lat, 0.99),
        max_us: lat.last().copied().unwrap_or(0),
    }
}

/// The disk's own limit: one thread writing 4 KiB at the end of a preallocated file and
/// syncing it, for `secs`. What one journal append costs at the least.
fn bare_sync(dir: &std::path::Path, secs: u64) -> Run {
    use std::os::unix::fs::FileExt as _;
    let path = dir.join("bare-sync");
    let size: u64 = 256 << 20;
    let file = preallocated(&path, size);
    let page = vec![0x5au8; 4096];
    let mut lat = Vec::with_capacity(1 << 16);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut at = 0u64;
    while Instant::now() < deadline {
        let t0 = Instant::now();
        file.write_all_at(&page, at).unwrap();
        file.sync_data().unwrap();
        lat.push(t0.elapsed().as_micros() as u64);
        at = (at + 4096) % size;
    }
    let secs = started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path).unwrap();
    run_of(lat, secs)
}

/// The least any group commit can do for `threads` submitters on this disk and these
/// cores: each submitter takes a ticket; whoever finds no sync in flight writes one 4 KiB
/// page and `fdatasync`s it for every ticket taken so far, the others wait on a condition
/// variable until a sync covers theirs. Nothing is decided or indexed: a command waits for
/// the sync in flight and then its own, and for a core to wake on, as the ledger's do.
fn bare_group_commit(dir: &std::path::Path, threads: usize, secs: u64) -> Run {
    use std::os::unix::fs::FileExt as _;
    use std::sync::{Condvar, Mutex};
    #[derive(Default)]
    struct Log {
        taken: u64,
        durable: u64,
        syncing: bool,
        at: u64,
    }
    let path = dir.join("bare-group");
    let size: u64 = 256 << 20;
    let file = preallocated(&path, size);
    let shared = Arc::new((Mutex::new(Log::default()), Condvar::new()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let shared = shared.clone();
            let file = file.try_clone().unwrap();
            std::thread::spawn(move || {
                let (log, cv) = &*shared;
                let page = vec![0x5au8; 4096];
                let mut lat = Vec::with_capacity(1 << 16);
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    let mut g = log.lock().unwrap();
                    g.taken += 1;
                    let mine = g.taken;
                    while g.durable < mine {
                        if g.syncing {
                            g = cv.wait(g).unwrap();
                            continue;
                        }
                        g.syncing = true;
                        let (upto, at) = (g.taken, g.at);
                        g.at = (g.at + 4096) % size;
                        drop(g);
                        file.write_all_at(&page, at).unwrap();
                        file.sync_data().unwrap();
                        g = log.lock().unwrap();
                        g.durable = upto;
                        g.syncing = false;
                        cv.notify_all();
                    }
                    drop(g);
                    lat.push(t0.elapsed().as_micros() as u64);
                }
                lat
            })
        })
        .collect();
    let lat: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let secs = started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path).unwrap();
    run_of(lat, secs)
}

fn bench_config(path: &std::path::Path) -> SledConfig {
    let mut config = SledConfig::new(path);
    config.fsync = env("IDEM_BENCH_FSYNC", 1) == 1;
    if let Ok(ms) = std::env::var("IDEM_BENCH_CHECKPOINT_MS") {
        config.checkpoint_interval = Duration::from_millis(ms.parse().unwrap());
    }
    if let Ok(kib) = std::env::var("IDEM_BENCH_CHECKPOINT_KIB") {
        config.checkpoint_bytes = kib.parse::<u64>().unwrap() * 1024;
    }
    if std::env::var("IDEM_BENCH_JOURNAL_SYNC").is_ok_and(|v| v == "dsync") {
        config.journal.sync = ledger::store::sled::journal::SyncMode::Dsync;
    }
    config
}

/// 64 threads submitting withdrawals of new keys `PREFIX-n` (n = 0, 1, ... below `until`)
/// over `accounts`, round robin.
fn spawn_writers(
    ledger: &SledStore,
    accounts: &[Account],
    prefix: &'static str,
    until: u64,
) -> Vec<std::thread::JoinHandle<()>> {
    let next = Arc::new(AtomicU64::new(0));
    (0..64)
        .map(|_| {
            let (ledger, next, accounts) = (ledger.clone(), next.clone(), accounts.to_vec());
            std::thread::spawn(move || {
                let client = ClientId::default_client();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= until {
                        break;
                    }
                    let key = Key::parse(&format!("{prefix}-{n:08}")).unwrap();
                    ledger
                        .blocking()
                        .submit(
                            &client,
                            &key,
                            withdraw(&accounts[(n as usize) % accounts.len()]),
                        )
                        .unwrap();
                }
            })
        })
        .collect()
}

/// The child of the crash-reopen measurement: fills the ledger at `path` with new keys
/// from 64 threads until it is killed.
fn crash_child(path: &str) {
    let (ledger, _) = SledStore::open(bench_config(std::path::Path::new(path))).unwrap();
    let accounts: Vec<Account> = (0..1000).map(bench_account).collect();
    println!("ready");
    let _writers = spawn_writers(&ledger, &accounts, "crash", u64::MAX);
    // The writers run until the parent kills the process.
    loop {
        std::thread::park();
    }
}

fn main() {
    if let Ok(path) = std::env::var("IDEM_BENCH_CRASH_CHILD") {
        crash_child(&path);
        return;
    }
    // `cargo bench` passes --bench; `cargo test --benches` does not: then do a tiny run.
    let quick = !std::env::args().any(|a| a == "--bench");
    let secs = if quick { 1 } else { env("IDEM_BENCH_SECS", 3) };
    let only = std::env::var("IDEM_BENCH_ONLY").ok();
    if !matches!(only.as_deref(), Some("large" | "rebuild")) {
        durable_commands(secs, only.as_deref());
    }
    large_ledger(quick, only.as_deref() == Some("rebuild"));
}

/// One row of the first part's table.
fn print_row(kind: &str, submitters_are: &str, submitters: usize, r: &Run) {
    println!(
        "| {kind} | {submitters_are} | {submitters} | {:.0} | {} | {} | {} |",
        r.ops as f64 / r.secs,
        r.p50_us,
        r.p99_us,
        r.max_us
    );
}

/// Whether `IDEM_BENCH_ONLY` (unset: every row; else row names, comma-separated) asks for
/// the row `name`.
fn wanted(only: Option<&str>, name: &str) -> bool {
    only.is_none_or(|o| o.split(',').any(|r| r == name))
}

/// The first part: commands/s and latency beside the disk's bare sync.
fn durable_commands(secs: u64, only: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let bare = bare_sync(dir.path(), secs);
    // Eight submitters' physical limit, beside their row.
    let group8 = wanted(only, "new:threads:8").then(|| bare_group_commit(dir.path(), 8, secs));
    let (ledger, _) = SledStore::open(bench_config(&dir.path().join("l"))).unwrap();
    let accounts = seed_accounts(&ledger, 100);
    let client = ClientId::default_client();
    for n in 0..10_000u64 {
        let key = Key::parse(&format!("replay-{n}")).unwrap();
        ledger
            .blocking()
            .submit(
                &client,
                &key,
                withdraw(&accounts[(n as usize) % accounts.len()]),
            )
            .unwrap();
    }
    println!(
        "durable commands (flushed{} before the answer), {secs} s per row",
        if env("IDEM_BENCH_FSYNC", 1) == 1 {
            " and fdatasynced"
        } else {
            ", no fdatasync"
        }
    );
    println!("| kind | submitters are | submitters | commands/s | p50 µs | p99 µs | max µs |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    print_row("bare 4 KiB pwrite + fdatasync", "one thread", 1, &bare);
    if let Some(g) = &group8 {
        print_row(
            "bare group commit: 4 KiB pwrite + fdatasync for all waiting",
            "threads",
            8,
            g,
        );
    }
    let mut new_one = 0.0;
    let mut new_eight_p99 = 0u64;
    // IDEM_BENCH_ONLY=new:async:64 runs one row (for profiling); a comma-separated list
    // runs those rows, in the table's order.
    for replay in [false, true] {
        if replay {
            // The new-key rows pushed the prepared keys out of the shards' answer cache.
            // A replay that misses it goes to the decider and holds a claim meanwhile,
            // so a concurrent twin would be told 409: replay each once first, as a
            // client's first retry would.
            for n in 0..10_000u64 {
                let key = Key::parse(&format!("replay-{n}")).unwrap();
                let account = &accounts[(n as usize) % accounts.len()];
                ledger
                    .blocking()
                    .submit(&client, &key, withdraw(account))
                    .unwrap();
            }
        }
        for (mode, submitters) in [
            ("threads", 1usize),
            ("threads", 8),
            ("threads", 64),
            ("async", 8),
            ("async", 64),
        ] {
            let name = format!(
                "{}:{mode}:{submitters}",
                if replay { "replay" } else { "new" }
            );
            if !wanted(only, &name) {
                continue;
            }
            // Each row's new keys are its own.
            let prefix = format!("new-{mode}-{submitters}");
            let r = if mode == "async" {
                run_async(&ledger, &accounts, submitters, replay, &prefix, secs)
            } else {
                run(&ledger, &accounts, submitters, replay, &prefix, secs)
            };
            if !replay && mode == "threads" && submitters == 1 {
                new_one = r.ops as f64 / r.secs;
            }
            if !replay && mode == "threads" && submitters == 8 {
                new_eight_p99 = r.p99_us;
            }
            let kind = if replay { "replay" } else { "new key" };
            print_row(kind, mode, submitters, &r);
        }
    }
    let m = ledger.commit_metrics();
    println!(
        "batches {}, commands {}, mean batch {:.1}, largest batch {}",
        m.batches,
        m.commands,
        m.commands as f64 / m.batches.max(1) as f64,
        m.batch_size_max
    );
    if only.is_none() {
        println!(
            "ratios: one submitter's new keys/s to bare syncs/s {:.2}; p99 at 8 submitters \
             to a bare sync's p99 {:.1}x",
            new_one / (bare.ops as f64 / bare.secs),
            new_eight_p99 as f64 / bare.p99_us.max(1) as f64
        );
    }
    if let Some(g) = group8.filter(|_| new_eight_p99 > 0) {
        println!(
            "p99 at 8 submitters to the bare group commit's at 8: {:.1}x (the bare group \
             commit's own p99 is {:.1}x a bare sync's)",
            new_eight_p99 as f64 / g.p99_us.max(1) as f64,
            g.p99_us as f64 / bare.p99_us.max(1) as f64
        );
    }
    ledger.blocking().shutdown();
    drop(ledger);
}

/// The second part: a large ledger's bytes per fact, its opening, and verify's speed.
fn large_ledger(quick: bool, rebuild_only: bool) {
    let facts = if quick {
        20_000
    } else {
        env("IDEM_BENCH_FACTS", 1_000_000)
    };
    let dir = tempfile::tempdir().unwrap();
    let path = std::env::var_os("IDEM_BENCH_LEDGER")
        .map_or_else(|| dir.path().join("big"), std::path::PathBuf::from);
    let (ledger, _) = SledStore::open(SledConfig::new(&path)).unwrap();
    let have = ledger.blocking().stats().last_seq;
    let accounts = if have == 0 {
        seed_accounts(&ledger, 1000)
    } else {
        // Filled by an earlier run: the same accounts, and no more keys.
        (0..1000).map(bench_account).collect()
    };
    let fill = Instant::now();
    let target = if have == 0 {
        facts.saturating_sub(accounts.len() as u64)
    } else {
        0
    };
    let handles = spawn_writers(&ledger, &accounts, "ord", target);
    for h in handles {
        h.join().unwrap();
    }
    let fill_secs = fill.elapsed().as_secs_f64();
    let n = ledger.blocking().stats().last_seq;
    ledger.blocking().shutdown();
    drop(ledger);
    let bytes = dir_size(&path);
    println!(
        "filled {} facts in {fill_secs:.1} s ({:.0}/s), {n} in all; on disk {:.1} MiB = {:.0} bytes per fact",
        n - have,
        (n - have) as f64 / fill_secs,
        bytes as f64 / 1048576.0,
        bytes as f64 / n as f64
    );
    let mut opens = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let (l, report) = SledStore::open(SledConfig::new(&path)).unwrap();
        opens.push(t.elapsed().as_millis());
        assert_eq!(report.facts, n);
        drop(l);
    }
    opens.sort_unstable();
    println!("open {n} facts: median {} ms (runs {:?})", opens[1], opens);
    if rebuild_only {
        rebuild_beside_verify(&path);
        return;
    }

    // After a kill -9: a child process writes new keys into the same ledger with 64
    // threads and is killed mid-write; the open then replays what sled did not hold.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .env("IDEM_BENCH_CRASH_CHILD", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::BufRead as _;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
    }
    std::thread::sleep(Duration::from_millis(if quick { 500 } else { 3000 }));
    child.kill().unwrap();
    child.wait().unwrap();
    let t = Instant::now();
    let (l, report) = SledStore::open(SledConfig::new(&path)).unwrap();
    let crash_open = t.elapsed();
    println!(
        "open after kill -9 mid-write: {} ms, {} groups replayed from the journal, {} facts",
        crash_open.as_millis(),
        report.replayed_groups,
        report.facts
    );
    drop(l);

    // Verify while commits go on: its speed, and how long a commit waits meanwhile,
    // beside the same prober with no verify running, in the same run.
    let (l, opened) = SledStore::open(SledConfig::new(&path)).unwrap();
    let account = accounts[0].clone();
    // New keys in every run, also on a ledger kept from an earlier run.
    let run = opened.facts;
    let probe = move |l: &SledStore, tag: &str, until: &dyn Fn() -> bool| {
        let client = ClientId::default_client();
        let mut worst = Duration::ZERO;
        let mut count = 0u64;
        while !until() {
            let key = Key::parse(&format!("probe-{run}-{tag}-{count}")).unwrap();
            let t = Instant::now();
            l.blocking()
                .submit(&client, &key, withdraw(&account))
                .unwrap();
            worst = worst.max(t.elapsed());
            count += 1;
        }
        (count, worst)
    };
    // The online verify of a serving ledger (its threads at nice 19) with nothing else
    // running: its own speed, beside which the run with commits shows what sharing the
    // two cores costs it.
    println!(
        "verify while serving, nothing committing: {}",
        timed_verify(&l)
    );
    let quiet_until = Instant::now() + Duration::from_secs(3);
    let (quiet_n, quiet_worst) = probe(&l, "quiet", &|| Instant::now() > quiet_until);
    let done = Arc::new(AtomicBool::new(false));
    let prober = {
        let (l, done) = (l.clone(), done.clone());
        let probe = probe.clone();
        std::thread::spawn(move || probe(&l, "busy", &|| done.load(Ordering::Relaxed)))
    };
    let verified = timed_verify(&l);
    done.store(true, Ordering::Relaxed);
    let (busy_n, busy_worst) = prober.join().unwrap();
    println!(
        "verify while committing: {verified}; {busy_n} commits meanwhile, the slowest \
         {:.1} ms (with no verify, 3 s: {quiet_n} commits, the slowest {:.1} ms)",
        busy_worst.as_secs_f64() * 1e3,
        quiet_worst.as_secs_f64() * 1e3,
    );
    l.blocking().shutdown();
    drop(l);

    // The offline `verify` command (nothing else running, its threads at full priority),
    // and the rebuild of the index beside it.
    rebuild_beside_verify(&path);

    // The floor under that: sled's own iteration over the same facts, key records and
    // statement records, reading nothing but the bytes, on one thread and on two (as
    // verify splits them: the facts on one, the key records then the entries on the other).
    let db = sled::Config::new()
        .path(&path)
        .cache_capacity(SledConfig::new(&path).cache_capacity_bytes)
        .mode(sled::Mode::HighThroughput)
        .open()
        .unwrap();
    let tree = db.open_tree("ledger").unwrap();
    let scan = |prefix: u8| {
        tree.scan_prefix([prefix]).fold(0usize, |n, i| {
            // Touch the bytes, as a reader would.
            std::hint::black_box(i.unwrap().1.len());
            n + 1
        })
    };
    let t = Instant::now();
    // A fact record holds one fact or a group's block of them; every fact has a key record;
    // a statement record holds a run of an account's movements.
    let (records_n, keys_n, runs_n) = (scan(b'f'), scan(b'k'), scan(b'h'));
    let one = t.elapsed().as_secs_f64();
    let t = Instant::now();
    std::thread::scope(|s| {
        let index = s.spawn(|| (scan(b'k'), scan(b'h')));
        scan(b'f');
        index.join().unwrap();
    });
    let two = t.elapsed().as_secs_f64();
    println!(
        "bare sled scan of {keys_n} facts in {records_n} records, {keys_n} key records and \
         {runs_n} statement records: {one:.2} s on one thread ({:.0} facts/s), {two:.2} s \
         on two ({:.0} facts/s)",
        keys_n as f64 / one,
        keys_n as f64 / two,
    );
}

/// The offline verify of the ledger at `path`, then the rebuild of its index from the
/// journal (as an open does when sled's files are damaged), with the rebuild's rate as a
/// ratio to verify's, and the bytes on disk of the log of record and of the index.
fn rebuild_beside_verify(path: &std::path::Path) {
    let (l, opened) = SledStore::open(SledConfig {
        verify_yields: false,
        ..SledConfig::new(path)
    })
    .unwrap();
    let n = opened.facts;
    let t = Instant::now();
    let alone = timed_verify(&l);
    let verify_rate = n as f64 / t.elapsed().as_secs_f64();
    println!("verify alone, at full priority: {alone}");
    l.blocking().shutdown();
    drop(l);

    // The index rebuilt from the log of record (the journal's base and the groups after
    // it), as an open does when sled's files are damaged, beside verify's reading rate.
    let journal_bytes = dir_size(&path.join(ledger::store::sled::JOURNAL_DIR));
    let all_bytes = dir_size(path);
    println!(
        "on disk: the journal (the log of record) {:.1} MiB = {:.0} bytes per fact, the \
         index (sled) {:.1} MiB = {:.0} bytes per fact, {:.0} bytes per fact in all",
        journal_bytes as f64 / 1048576.0,
        journal_bytes as f64 / n as f64,
        (all_bytes - journal_bytes) as f64 / 1048576.0,
        (all_bytes - journal_bytes) as f64 / n as f64,
        all_bytes as f64 / n as f64,
    );
    let t = Instant::now();
    let mut config = SledConfig::new(path);
    config.progress = Progress::new(move |line| {
        println!("  {:>6.2} s  {line}", t.elapsed().as_secs_f64());
    });
    let rebuilt = SledStore::repair(&config).unwrap();
    let secs = t.elapsed().as_secs_f64();
    println!(
        "rebuild of the index from the journal: {n} facts in {secs:.2} s ({:.0} facts/s, \
         {:.2}x verify alone's rate); the base at group {} and {} groups after it",
        n as f64 / secs,
        n as f64 / secs / verify_rate,
        rebuilt.base_group,
        rebuilt.groups,
    );
    if let Some(aside) = rebuilt.aside {
        std::fs::remove_dir_all(aside).unwrap();
    }
}

/// Runs a verify and says how it went: "N facts in S s (R facts/s), ok".
fn timed_verify(l: &SledStore) -> String {
    let t = Instant::now();
    let report = l.blocking().verify().unwrap();
    let secs = t.elapsed().as_secs_f64();
    format!(
        "{} facts in {secs:.2} s ({:.0} facts/s), {}",
        report.facts,
        report.facts as f64 / secs,
        if report.ok() { "ok" } else { "VIOLATIONS" },
    )
}

fn dir_size(path: &std::path::Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(path).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            dir_size(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}
