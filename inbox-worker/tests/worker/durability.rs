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
