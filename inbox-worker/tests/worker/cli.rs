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

/// `submit`'s arguments, written as on a command line.
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[test]
fn submit_exit_codes() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let s = w.base.as_str();
    let dep = words("deposit --key dep-1 --account alice --amount 1000 --currency RUB");
    let (code, out, _) = submit(s, &dep);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("applied: deposit 1,000.00 RUB to alice"),
        "{out}"
    );
    assert!(out.contains("balance  alice 1,000.00 RUB"), "{out}");
    let (code, out, _) = submit(s, &dep);
    assert_eq!(code, 0);
    assert!(out.starts_with("replayed:"), "{out}");
    let w1 = words("withdraw --key req-7f3a --account alice --amount 300 --currency RUB --json");
    let (code, out, _) = submit(s, &w1);
    assert_eq!(code, 0);
    // The body keeps minor units.
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(json["amount"], 30_000);
    assert_eq!(json["balance"], 70_000);
    // business rejection
    let (code, _, err) = submit(
        s,
        &words("withdraw --key big --account alice --amount 9000 --currency RUB"),
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("insufficient_funds"), "{err}");
    assert!(err.contains("withdraw 9,000.00 RUB from alice"), "{err}");
    // key reused with another command
    let (code, _, err) = submit(
        s,
        &words("withdraw --key req-7f3a --account alice --amount 301 --currency RUB"),
    );
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("differs: amount"), "{err}");
    // invalid input, caught before sending
    for (bad, says) in [
        (
            "--account alice --amount 0 --currency RUB",
            "more than zero",
        ),
        ("--account @world --amount 1 --currency RUB", "--account"),
        (
            "--account a --amount 1.505 --currency RUB",
            "RUB has 2 decimal places at most",
        ),
        (
            "--account a --amount 1.5 --currency JPY",
            "JPY has no minor unit",
        ),
        (
            "--account a --amount 1,5 --currency RUB",
            "plain decimal number",
        ),
        (
            "--account a --amount=-1 --currency RUB",
            "plain decimal number",
        ),
        (
            "--account a --amount 1e3 --currency RUB",
            "plain decimal number",
        ),
        (
            "--account a --amount 10000000000001 --currency RUB",
            "at most 10,000,000,000,000.00 RUB",
        ),
        ("--account a --amount 1 --currency rub", "--currency"),
        ("--account a --amount 1", "--currency"),
    ] {
        let mut args = words("withdraw --key k");
        args.extend(words(bad));
        let (code, _, err) = submit(s, &args);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains(says), "{bad}: {err}");
    }
    let mut spaced = words("withdraw --account a --amount 1 --currency RUB --key");
    spaced.push("has space");
    let (code, _, err) = submit(s, &spaced);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid --key"), "{err}");
    // Nothing was sent: the key is unused, and a valid command under it applies.
    assert_eq!(w.http().get("/v1/keys/k").status, 404);
    // refund: the amount is read in the withdrawal's currency, asked from the worker
    let (code, out, _) = submit(
        s,
        &words("refund --key ref-1 --withdrawal req-7f3a --amount 299.99"),
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("applied: refund 299.99 RUB of withdrawal req-7f3a"),
        "{out}"
    );
    assert!(out.contains("refunded 299.99 RUB in total"), "{out}");
    assert!(out.contains("balance  alice 999.99 RUB"), "{out}");
    // anything else: a wrong token against a worker with tokens
    drop(w);
    let (_dir2, db2) = scratch();
    let w = Worker::start(&db2, &["--token", "shop=right"]);
    let (code, _, err) = submit(
        &w.base,
        &words("deposit --key k --account a --amount 1 --currency RUB --token wrong"),
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("failed: HTTP 401 unauthorized"), "{err}");
    assert!(
        err.contains("pass your client's secret with --token SECRET, or set IDEM_TOKEN"),
        "{err}"
    );
    let (code, _, err) = submit(
        &w.base,
        &words("deposit --key k --account a --amount 1 --currency RUB --token right"),
    );
    assert_eq!(code, 0, "{err}");
}

/// A refund's amount is in its withdrawal's currency, which `submit` reads from the
/// worker: 100 is 100 JPY (no minor unit) and 1.250 KWD is 1250 fils. A key that holds no
/// withdrawal of this client, or a stated currency that is not the withdrawal's, is
/// refused before anything is sent.
#[test]
fn refund_amounts_are_read_in_the_withdrawals_currency() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &["--token", "shop=s1", "--token", "other=s2"]);
    let s = w.base.as_str();
    let shop = |line: &str| {
        let mut args = words(line);
        args.extend(["--token", "s1"]);
        submit(s, &args)
    };
    for line in [
        "deposit --key d-jpy --account kenji --amount 5000 --currency JPY",
        "withdraw --key w-jpy --account kenji --amount 1500 --currency JPY",
        "deposit --key d-kwd --account fahad --amount 10.5 --currency KWD",
        "withdraw --key w-kwd --account fahad --amount 2.125 --currency KWD",
        // A key is any visible ASCII: the lookup escapes it in the path.
        "withdraw --key w/1%3F?#x --account kenji --amount 10 --currency JPY",
    ] {
        let (code, out, err) = shop(line);
        assert_eq!(code, 0, "{line}: {out}{err}");
    }
    let (code, out, err) = shop("refund --key r-jpy --withdrawal w-jpy --amount 100");
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("applied: refund 100 JPY of withdrawal w-jpy"),
        "{out}"
    );
    assert!(out.contains("balance  kenji 3,590 JPY"), "{out}");
    let (code, out, err) = shop("refund --key r-odd --withdrawal w/1%3F?#x --amount 10");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("refunded 10 JPY in total"), "{out}");
    let (code, out, err) = shop("refund --key r-kwd --withdrawal w-kwd --amount 1.250 --json");
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(json["amount"], 1250);
    assert_eq!(json["refunded_total"], 1250);

    let http = w.http().with_token("s1");
    for (line, says) in [
        (
            "refund --key r-bad --withdrawal w-jpy --amount 1.5",
            "JPY has no minor unit",
        ),
        (
            "refund --key r-bad --withdrawal w-jpy --amount 1 --currency RUB",
            "the withdrawal w-jpy is in JPY, not RUB",
        ),
        (
            "refund --key r-bad --withdrawal d-jpy --amount 1",
            "the key d-jpy holds a deposit, not a withdrawal",
        ),
        (
            "refund --key r-bad --withdrawal nowhere --amount 1",
            "this client has no key nowhere",
        ),
    ] {
        let (code, _, err) = shop(line);
        assert_eq!(code, 2, "{line}: {err}");
        assert!(
            err.contains(says) && err.contains("nothing was sent"),
            "{line}: {err}"
        );
        assert_eq!(http.get("/v1/keys/r-bad").status, 404, "{line}");
    }
    // Another client's withdrawal is not this client's key.
    let (code, _, err) = submit(
        s,
        &words("refund --key r-bad --withdrawal w-jpy --amount 1 --token s2"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("this client has no key w-jpy"), "{err}");
    // Without a token the lookup is refused (401), and the answer says how to pass one.
    let (code, _, err) = submit(
        s,
        &words("refund --key r-bad --withdrawal w-jpy --amount 1"),
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--token SECRET, or set IDEM_TOKEN"), "{err}");
    // With --via no worker is asked: the currency must be stated.
    let (code, _, err) = submit(
        s,
        &words("refund --key r-via --withdrawal w-jpy --amount 1 --via amqp://127.0.0.1:1/%2f"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--currency is needed with --via"), "{err}");
    assert_eq!(http.last_seq(), 8);
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
    assert_eq!(
        err.matches("retrying with the same key in").count(),
        2,
        "{err}"
    );
    assert!(
        err.contains("failed: no worker answers at http://127.0.0.1:1 (")
            && err.contains("3 attempts")
            && err.contains("Start one with `inbox-worker serve --db ./idem-data`"),
        "{err}"
    );
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
        .args(["--amount", "2.50", "--currency", "RUB", "--retries", "12"])
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
    assert!(line.contains("retrying with the same key in"), "{line}");
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

/// The help a person reads: no values of environment variables (set or not), each
/// command's own arguments before the connection's, and no words of the code.
#[test]
fn help_texts_put_the_command_first_and_show_no_env_values() {
    let help = |args: &[&str]| {
        let out = std::process::Command::new(bin())
            .args(args)
            .env("IDEM_TOKEN", "s3cret-in-env")
            .env_remove("IDEM_SERVER")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut all = String::new();
    for command in [
        "serve", "submit", "consume", "verify", "demo", "deposit", "withdraw", "refund",
    ] {
        let args: Vec<&str> = match command {
            "deposit" | "withdraw" | "refund" => vec!["submit", command],
            _ => vec![command],
        };
        for flag in ["-h", "--help"] {
            let mut a = args.clone();
            a.push(flag);
            all.push_str(&help(&a));
        }
    }
    all.push_str(&help(&["--help"]));
    assert!(all.contains("[env: IDEM_SERVER]"), "{all}");
    assert!(all.contains("[env: IDEM_LISTEN]"), "{all}");
    for hidden in ["=]", "s3cret-in-env"] {
        assert!(!all.contains(hidden), "{hidden:?} in the help:\n{all}");
    }
    for internal in ["twin", "projection", "seed"] {
        assert!(
            !all.to_lowercase().contains(internal),
            "{internal:?} in the help:\n{all}"
        );
    }
    let withdraw = help(&["submit", "withdraw", "--help"]);
    let at = |flag: &str| {
        withdraw
            .find(flag)
            .unwrap_or_else(|| panic!("no {flag} in\n{withdraw}"))
    };
    assert!(at("--key") < at("--account"), "{withdraw}");
    assert!(at("--currency") < at("Connection:"), "{withdraw}");
    assert!(at("Connection:") < at("--server"), "{withdraw}");
    assert!(at("--server") < at("--via"), "{withdraw}");
}
