//! The catalogue's rows that are about the store rather than one request: a
//! corrupt record in sled's files (the worker rebuilds its index from the journal, keeps
//! the damaged files aside, says so, and serves every answer as before; with no log of
//! record to rebuild from it refuses to start, says so plainly, deletes nothing), a torn
//! data file (it opens consistent), and the clock going backwards across the retention
//! (expired stays expired, nothing runs twice).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ledger::testing::{assert_nothing_removed, listing};
use ledger::{ManualClock, SledConfig, SledStore, Store, Timestamp};

use crate::support::{Http, Worker, bin, eventually, scratch};

fn fill(db: &Path, n: usize) -> Vec<(String, u16, String)> {
    let w = Worker::start(db, &[]);
    let http = w.http();
    let mut seen = Vec::new();
    let first = http.deposit("fill-dep", "fay", 1_000_000);
    seen.push(("fill-dep".to_owned(), first.status, first.body));
    for i in 0..n {
        let k = format!("fill-w{i}");
        let r = http.withdraw(&k, "fay", 10);
        seen.push((k, r.status, r.body));
    }
    assert_eq!(w.term().code(), Some(0));
    seen
}

/// Runs `serve` and expects it to refuse: a non-zero exit before listening, with `expect`
/// in what it printed.
fn serve_refuses(db: &Path) -> String {
    let out = Command::new(bin())
        .args(["serve", "--db"])
        .arg(db)
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "serve started on a damaged ledger");
    assert!(!stdout.contains("listening on"), "{stdout}");
    stderr
}

/// The last fact's bytes in sled replaced with garbage, as a bad sector or a stray write
/// would.
fn corrupt_last_fact(db: &Path) {
    {
        let sled_db = sled::open(db).unwrap();
        let tree = sled_db.open_tree("ledger").unwrap();
        let (k, _) = tree.scan_prefix(b"f").next_back().unwrap().unwrap();
        tree.insert(k, &[0xff_u8, 0x13, 0x37][..]).unwrap();
        sled_db.flush().unwrap();
    }
    // sled's I/O threads hold the folder's lock a moment after the last handle drops.
    ledger::testing::wait_until_released(db);
}

#[test]
fn a_corrupt_record_is_rebuilt_from_the_journal_and_every_answer_stays() {
    let (_dir, db) = scratch();
    let seen = fill(&db, 20);
    corrupt_last_fact(&db);
    let w = Worker::start(&db, &[]);
    let log = std::fs::read_to_string(db.with_extension("log")).unwrap();
    assert!(
        log.contains("the index was rebuilt from the journal"),
        "{log}"
    );
    assert!(log.contains("undecodable fact"), "{log}");
    let http = w.http();
    for (key, status, body) in &seen {
        let again = if key == "fill-dep" {
            http.deposit(key, "fay", 1_000_000)
        } else {
            http.withdraw(key, "fay", 10)
        };
        assert_eq!((again.status, &again.body), (*status, body), "{key}");
    }
    assert_eq!(http.balance("fay"), 1_000_000 - 20 * 10);
    let metrics = http.get("/metrics").body;
    assert!(metrics.contains("idem_index_rebuilt 1"), "{metrics}");
    assert_eq!(w.term().code(), Some(0));
    let aside: Vec<_> = std::fs::read_dir(&db)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "the damaged files are kept, once");
    assert!(aside[0].path().join("db").is_file());
    let out = crate::support::run(&["verify", "--db", db.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_corrupt_record_with_no_log_of_record_stops_the_worker_and_deletes_nothing() {
    let (_dir, db) = scratch();
    fill(&db, 20);
    // A ledger whose journal holds no base cannot be rebuilt from it.
    for (_, base, _) in ledger::store::sled::journal::list_bases(&db.join("journal")).unwrap() {
        std::fs::remove_file(base).unwrap();
    }
    corrupt_last_fact(&db);
    let before = listing(&db);
    let stderr = serve_refuses(&db);
    assert!(stderr.contains("is corrupt"), "{stderr}");
    assert!(
        stderr.contains("Nothing was changed or deleted"),
        "{stderr}"
    );
    assert!(stderr.contains("restore the latest backup"), "{stderr}");
    // verify refuses the same way, with the same words.
    let out = crate::support::run(&["verify", "--db", db.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is corrupt"));
    assert_nothing_removed(&before, &listing(&db));
}

/// `repair` rebuilds on demand: exit 0, the old files aside, every fact there.
#[test]
fn repair_rebuilds_the_index_on_demand() {
    let (_dir, db) = scratch();
    fill(&db, 5);
    let out = crate::support::run(&["repair", "--db", db.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("the index was rebuilt from the journal"),
        "{stdout}"
    );
    assert!(
        stdout.contains("because a repair was asked for"),
        "{stdout}"
    );
    let out = crate::support::run(&["verify", "--db", db.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("checked 6 facts"));
    // In use: refused, nothing moved.
    let w = Worker::start(&db, &[]);
    let before = listing(&db);
    let out = crate::support::run(&["repair", "--db", db.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
    assert_nothing_removed(&before, &listing(&db));
    assert_eq!(w.term().code(), Some(0));
}

#[test]
fn a_torn_tail_opens_consistent_or_refuses_clearly() {
    for cut in [1u64, 512, 8192] {
        let (_dir, db) = scratch();
        let seen = fill(&db, 50);
        let file = db.join("db");
        let len = std::fs::metadata(&file).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.set_len(len.saturating_sub(cut)).unwrap();
        drop(f);
        let out = crate::support::run(&["verify", "--db", db.to_str().unwrap()]);
        if !out.status.success() {
            // A refusal must say what is wrong, not panic.
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("corrupt") || stderr.contains("unavailable"),
                "cut {cut}: {stderr}"
            );
            assert!(!stderr.contains("panicked"), "cut {cut}: {stderr}");
            serve_refuses(&db);
            continue;
        }
        // It opened: it must be consistent, and every key it still knows answers as before.
        let w = Worker::start(&db, &[]);
        let http = w.http();
        for (key, status, body) in &seen {
            let r = http.get(&format!("/v1/keys/{key}"));
            if r.status == 404 {
                continue;
            }
            assert_eq!(r.status, 200, "cut {cut}: {}", r.body);
            let again = if key == "fill-dep" {
                http.deposit(key, "fay", 1_000_000)
            } else {
                http.withdraw(key, "fay", 10)
            };
            assert_eq!(
                (again.status, &again.body),
                (*status, body),
                "cut {cut}: {key}"
            );
        }
        assert_eq!(w.term().code(), Some(0));
        let out = crate::support::run(&["verify", "--db", db.to_str().unwrap()]);
        assert!(out.status.success(), "cut {cut}");
    }
}

/// The worker in this process on a manual clock, served over real HTTP on a free port.
struct InProcess {
    runtime: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    store: Arc<dyn Store>,
    base: String,
}

impl InProcess {
    fn start(db: &Path, clock: ManualClock, retention: Duration) -> InProcess {
        let (ledger, _) = SledStore::open(
            SledConfig::new(db)
                .clock(Arc::new(clock))
                .retention(retention),
        )
        .unwrap();
        let store: Arc<dyn Store> = Arc::new(ledger);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let options = inbox_worker::ApiOptions {
            sweep_every: Duration::from_millis(20),
            ..inbox_worker::ApiOptions::default()
        };
        let task = runtime.spawn(inbox_worker::serve(
            listener,
            store.clone(),
            options,
            async {
                let _ = stopped.await;
            },
        ));
        InProcess {
            runtime,
            stop: Some(stop),
            task: Some(task),
            store,
            base,
        }
    }

    fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let task = self.task.take().unwrap();
        self.runtime.block_on(task).unwrap().unwrap();
        let store = self.store.clone();
        self.runtime.block_on(store.shutdown());
    }
}

#[test]
fn the_clock_going_backwards_across_the_retention_changes_nothing() {
    let (_dir, db) = scratch();
    let clock = ManualClock::new(Timestamp(1_800_000_000_000));
    let retention = Duration::from_secs(3600);
    let w = InProcess::start(&db, clock.clone(), retention);
    let http = Http::new(&w.base);
    let dep = http.deposit("cb-dep", "cole", 1000);
    assert_eq!(dep.status, 201, "{}", dep.body);
    let wd = http.withdraw("cb-w", "cole", 300);
    assert_eq!(wd.status, 201, "{}", wd.body);
    let seq = http.last_seq();

    // Past the retention: the sweeper expires both keys.
    clock.advance_ms(2 * 3600 * 1000);
    for k in ["cb-dep", "cb-w"] {
        eventually(Duration::from_secs(10), "the key to expire", || {
            let r = http.get(&format!("/v1/keys/{k}"));
            (r.status == 200 && r.json()["status"] == "expired").then_some(())
        });
    }
    // Back to before the keys were even written, then to just after: an expired key must
    // not come back as done, must not run again, and still answers as it did.
    for back_ms in [3 * 3600 * 1000, 1800 * 1000] {
        clock.advance_ms(-back_ms);
        std::thread::sleep(Duration::from_millis(100));
        for k in ["cb-dep", "cb-w"] {
            let r = http.get(&format!("/v1/keys/{k}"));
            assert_eq!(r.json()["status"], "expired", "{}", r.body);
        }
        let again = http.withdraw("cb-w", "cole", 300);
        assert_eq!((again.status, &again.body), (wd.status, &wd.body));
        assert!(again.replayed);
        let again = http.deposit("cb-dep", "cole", 1000);
        assert_eq!((again.status, &again.body), (dep.status, &dep.body));
        assert_eq!(http.last_seq(), seq);
        assert_eq!(http.balance("cole"), 700);
        // New keys still work while the clock is behind.
        clock.advance_ms(1);
    }
    let fresh = http.withdraw("cb-after", "cole", 100);
    assert_eq!(fresh.status, 201, "{}", fresh.body);
    assert_eq!(http.balance("cole"), 600);
    let report = w.runtime.block_on(w.store.verify()).unwrap();
    assert!(report.ok(), "{report}");
    w.stop();
}
