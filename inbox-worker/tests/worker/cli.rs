//! The CLI client: exit codes of docs/cli.md, and retries against a worker that is down.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::support::{Worker, bin, run, scratch, wait_timeout};

fn submit(server: &str, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["submit"];
    all.extend_from_slice(&args[..1]);
    all.extend_from_slice(&["--server", server]);
    all.extend_from_slice(&args[1..]);
    let out = run(&all);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn submit_exit_codes() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let s = w.base.as_str();
    let dep = [
        "deposit",
        "--key",
        "dep-1",
        "--account",
        "alice",
        "--amount",
        "1000",
        "--currency",
        "RUB",
    ];
    let (code, out, _) = submit(s, &dep);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("applied: deposit 1000 RUB to alice"),
        "{out}"
    );
    assert!(out.contains("balance  alice 1000 RUB"), "{out}");
    let (code, out, _) = submit(s, &dep);
    assert_eq!(code, 0);
    assert!(out.starts_with("replayed:"), "{out}");
    let w1 = [
        "withdraw",
        "--key",
        "req-7f3a",
        "--account",
        "alice",
        "--amount",
        "300",
        "--currency",
        "RUB",
        "--json",
    ];
    let (code, out, _) = submit(s, &w1);
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(json["balance"], 700);
    // business rejection
    let (code, _, err) = submit(
        s,
        &[
            "withdraw",
            "--key",
            "big",
            "--account",
            "alice",
            "--amount",
            "9000",
            "--currency",
            "RUB",
        ],
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("insufficient_funds"), "{err}");
    // key reused with another command
    let (code, _, err) = submit(
        s,
        &[
            "withdraw",
            "--key",
            "req-7f3a",
            "--account",
            "alice",
            "--amount",
            "301",
            "--currency",
            "RUB",
        ],
    );
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("differs: amount"), "{err}");
    // invalid input, caught before sending
    for bad in [
        vec![
            "withdraw",
            "--key",
            "k",
            "--account",
            "alice",
            "--amount",
            "0",
            "--currency",
            "RUB",
        ],
        vec![
            "withdraw",
            "--key",
            "k",
            "--account",
            "@world",
            "--amount",
            "1",
            "--currency",
            "RUB",
        ],
        vec![
            "withdraw",
            "--key",
            "has space",
            "--account",
            "a",
            "--amount",
            "1",
            "--currency",
            "RUB",
        ],
        vec![
            "withdraw",
            "--key",
            "k",
            "--account",
            "a",
            "--amount",
            "1.5",
            "--currency",
            "RUB",
        ],
        vec!["withdraw", "--key", "k", "--account", "a", "--amount", "1"],
    ] {
        let (code, _, err) = submit(s, &bad);
        assert_eq!(code, 2, "{bad:?}: {err}");
    }
    // refund
    let (code, out, _) = submit(
        s,
        &[
            "refund",
            "--key",
            "ref-1",
            "--withdrawal",
            "req-7f3a",
            "--amount",
            "300",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("refunded 300 in total"), "{out}");
    // anything else: a wrong token against a worker with tokens
    drop(w);
    let (_dir2, db2) = scratch();
    let w = Worker::start(&db2, &["--token", "shop=right"]);
    let (code, _, err) = submit(
        &w.base,
        &[
            "deposit",
            "--key",
            "k",
            "--account",
            "a",
            "--amount",
            "1",
            "--currency",
            "RUB",
            "--token",
            "wrong",
        ],
    );
    assert_eq!(code, 1, "{err}");
    let (code, _, err) = submit(
        &w.base,
        &[
            "deposit",
            "--key",
            "k",
            "--account",
            "a",
            "--amount",
            "1",
            "--currency",
            "RUB",
            "--token",
            "right",
        ],
    );
    assert_eq!(code, 0, "{err}");
}

#[test]
fn submit_gives_up_with_exit_1_when_nobody_answers() {
    // Port 1 is never served here: a freed ephemeral port could be taken by another
    // test's worker and answer.
    let (code, _, err) = submit(
        "http://127.0.0.1:1",
        &[
            "deposit",
            "--key",
            "k",
            "--account",
            "a",
            "--amount",
            "1",
            "--currency",
            "RUB",
            "--retries",
            "2",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.matches("retrying in").count(), 2, "{err}");
}

#[test]
fn submit_retries_until_the_worker_is_back() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let http = w.http();
    http.deposit("dep", "lee", 1000);
    let (port, base) = (w.port, w.base.clone());
    assert_eq!(w.term().code(), Some(0));

    let mut child = Command::new(bin())
        .args([
            "submit",
            "withdraw",
            "--server",
            &base,
            "--key",
            "w-retry",
            "--account",
            "lee",
        ])
        .args(["--amount", "250", "--currency", "RUB", "--retries", "12"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // The first attempt fails while the worker is down; then it comes back.
    let line = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(line.contains("retrying in"), "{line}");
    let w = Worker::start_on(&db, &format!("127.0.0.1:{port}"), &[]);
    let status = wait_timeout(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(0));
    let http = w.http();
    assert_eq!(http.balance("lee"), 750);
    // The retry used the same key: one more submit is a replay.
    let r = http.withdraw("w-retry", "lee", 250);
    assert!(r.replayed);
    assert_eq!(http.balance("lee"), 750);
}
