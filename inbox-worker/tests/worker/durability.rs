//! Durable before acknowledged: restarts, graceful and not.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::support::{Worker, eventually, run, scratch};

#[test]
fn sigterm_then_restart_replays_identically() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    let mut seen = vec![
        ("dep".to_owned(), http.deposit("dep", "kim", 1000)),
        ("w1".to_owned(), http.withdraw("w1", "kim", 300)),
        ("w2".to_owned(), http.withdraw("w2", "kim", 5000)),
    ];
    seen.push((
        "r1".to_owned(),
        http.post(
            "/v1/refunds",
            Some("r1"),
            r#"{"withdrawal":"w1","amount":100}"#,
        ),
    ));
    assert_eq!(w.term().code(), Some(0), "SIGTERM must exit 0");

    let w = Worker::start(&db, &[]);
    let http = w.http();
    for (key, before) in &seen {
        let path = match before.json()["command"].as_str().unwrap() {
            "deposit" => "/v1/deposits",
            "withdraw" => "/v1/withdrawals",
            _ => "/v1/refunds",
        };
        let body = match key.as_str() {
            "dep" => r#"{"account":"kim","amount":1000,"currency":"RUB"}"#,
            "w1" => r#"{"account":"kim","amount":300,"currency":"RUB"}"#,
            "w2" => r#"{"account":"kim","amount":5000,"currency":"RUB"}"#,
            _ => r#"{"withdrawal":"w1","amount":100}"#,
        };
        let after = http.post(path, Some(key), body);
        assert!(after.replayed, "{key}");
        assert_eq!(
            (after.status, &after.body),
            (before.status, &before.body),
            "{key}"
        );
    }
    assert_eq!(http.balance("kim"), 800);
}

#[test]
fn sigkill_under_load_loses_nothing_acknowledged() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    for c in 0..4 {
        assert_eq!(
            http.deposit(&format!("seed-{c}"), &format!("acct{c}"), 1_000_000)
                .status,
            201
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (http, stop) = (http.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut acknowledged = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = format!("c{c}-{i}");
                    let body = format!(
                        r#"{{"account":"acct{c}","amount":{},"currency":"RUB"}}"#,
                        1 + i % 7
                    );
                    // A request cut by the kill has no answer: it may or may not have
                    // applied, and the test does not count it.
                    if let Ok(r) = http.try_post("/v1/withdrawals", Some(&key), &body)
                        && r.status == 201
                    {
                        acknowledged.push((key, body, r.body));
                    }
                }
                acknowledged
            })
        })
        .collect();
    // Let the load run until a good number of commands are acknowledged.
    eventually(Duration::from_secs(30), "load", || {
        (http.last_seq() >= 200).then_some(())
    });
    w.kill9();
    stop.store(true, Ordering::Relaxed);
    let acknowledged: Vec<_> = clients
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(
        acknowledged.len() >= 150,
        "only {} acknowledged",
        acknowledged.len()
    );

    let w = Worker::start(&db, &[]);
    let http = w.http();
    for (key, body, first) in &acknowledged {
        let r = http.post("/v1/withdrawals", Some(key), body);
        assert!(
            r.replayed,
            "{key} was acknowledged but is not on disk: {}",
            r.body
        );
        assert_eq!(&r.body, first, "{key}");
    }
    assert_eq!(w.term().code(), Some(0));
    let out = run(&["verify", "--db", db.to_str().unwrap()]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("all guarantees hold"), "{report}");
}

/// Unmounts the small file system when the test ends, however it ends.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Storage unavailable, for real: the ledger's folder on a 40 MiB tmpfs (room for the
/// journal's 16 MiB segment, the one made ahead, and sled) that is then filled up. The
/// journal's segment is preallocated, so its appends go on; sled's writes and its
/// checkpoint's flush find no room. The first command that meets the failure (its journal
/// sync, or sled's own writer failing under its decision) is answered 503 `unavailable`
/// (never a false 201), `/healthz` turns 503 at once, and after space is freed and the worker restarted, every
/// acknowledged answer replays identically and the refused key runs exactly once.
#[test]
fn a_full_disk_answers_503_and_loses_nothing() {
    let (dir, _) = scratch();
    let mnt = dir.path().join("small");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=40m", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(
        mounted.success(),
        "this test mounts a small tmpfs to fill it up: run it as root (CI does)"
    );
    let _guard = Mounted(mnt.clone());
    let db = mnt.join("ledger");
    let w = Worker::start(&db, &[]);
    let http = w.http();
    let first = http.deposit("d0", "zed", 1_000_000);
    assert_eq!(first.status, 201);

    // Fill what is left of the file system.
    let filler = mnt.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }

    let mut acknowledged = vec![("d0".to_owned(), first)];
    let mut refused = None;
    for i in 0..2_000 {
        let key = format!("w{i}");
        let r = http.withdraw(&key, "zed", 1);
        match r.status {
            201 => acknowledged.push((key, r)),
            503 => {
                assert_eq!(r.code(), "unavailable", "{}", r.body);
                refused = Some(key);
                break;
            }
            other => panic!("unexpected {other}: {}", r.body),
        }
    }
    let refused = refused.expect("a full disk never made a command fail");
    assert_eq!(http.get("/healthz").status, 503);
    // Further commands are refused too: nothing is written until the worker is restarted.
    assert_eq!(http.withdraw("after", "zed", 1).status, 503);
    w.kill9();

    std::fs::remove_file(&filler).unwrap();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    for (key, before) in &acknowledged {
        let after = if key == "d0" {
            http.deposit(key, "zed", 1_000_000)
        } else {
            http.withdraw(key, "zed", 1)
        };
        assert!(after.replayed, "{key}");
        assert_eq!(
            (after.status, &after.body),
            (before.status, &before.body),
            "{key}"
        );
    }
    // The refused command may or may not have reached the disk before the failure; either
    // way a retry gets exactly one effect.
    let retry = http.withdraw(&refused, "zed", 1);
    assert_eq!(retry.status, 201, "{}", retry.body);
    let withdrawn = i64::try_from(acknowledged.len()).unwrap(); // d0 counts as one
    assert_eq!(http.balance("zed"), 1_000_000 - withdrawn);
    assert_eq!(w.term().code(), Some(0));
    let out = run(&["verify", "--db", db.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
