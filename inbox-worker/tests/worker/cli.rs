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
            "write the amount as 1000.00 or 1,000.00",
        ),
        (
            "--account a --amount 1,0000 --currency RUB",
            "groups the digits before the point by threes",
        ),
        (
            "--account a --amount=-1 --currency RUB",
            "a withdrawal takes money out, give the amount without a sign",
        ),
        (
            "--account a --amount -1 --currency RUB",
            "a withdrawal takes money out, give the amount without a sign",
        ),
        (
            "--account a --amount 1e3 --currency RUB",
            "decimal number of major units",
        ),
        (
            "--account a --amount 12.50 --currency USS",
            "USS is not an ISO 4217 currency code",
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
        "serve",
        "submit",
        "consume",
        "verify",
        "demo",
        "deposit",
        "withdraw",
        "refund",
        "balance",
        "statement",
        "key",
        "accounts",
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

/// Runs `inbox-worker ARGS --server SERVER`: (exit code, stdout, stderr).
fn cli(server: &str, args: &[&str]) -> (i32, String, String) {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--server", server]);
    let out = run(&all);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A typo in a currency code is refused before anything is sent, so it can neither fix a
/// new account to a currency that does not exist nor spend the key; amounts are typed as
/// the output prints them, grouping commas included, and a misplaced comma or a sign gets a
/// sentence that says how to write the amount.
#[test]
fn submit_takes_iso_codes_and_amounts_as_printed() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let s = w.base.as_str();
    let http = w.http();
    let (code, _, err) = submit(
        s,
        &words("deposit --key dep-1 --account bob --amount 12.50 --currency USS"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("invalid --currency: USS is not an ISO 4217 currency code")
            && err.contains("nothing was sent")
            && !err.contains("minor unit"),
        "{err}"
    );
    assert_eq!(http.get("/v1/keys/dep-1").status, 404);
    assert_eq!(http.get("/v1/accounts/bob").status, 404);
    // The key is still free: the same key with the right code is a first execution.
    let (code, out, err) = submit(
        s,
        &words("deposit --key dep-1 --account bob --amount 1,000.50 --currency USD"),
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("applied: deposit 1,000.50 USD to bob\n"),
        "{out}"
    );
    assert_eq!(http.balance("bob"), 100_050);
    // What a receipt prints can be typed back: 1,000.50 is the balance shown above.
    let (code, out, err) = submit(
        s,
        &words("withdraw --key w-1 --account bob --amount 1,000.50 --currency USD"),
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(http.balance("bob"), 0);
    for (kind, says) in [
        (
            "deposit",
            "a deposit puts money in, give the amount without a sign",
        ),
        (
            "withdraw",
            "a withdrawal takes money out, give the amount without a sign",
        ),
    ] {
        let line = format!("{kind} --key signed --account bob --amount -5 --currency USD");
        let (code, _, err) = submit(s, &words(&line));
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(&format!("the amount must be more than zero: {says}")),
            "{err}"
        );
        assert!(!err.contains("unexpected argument"), "{err}");
    }
    let (code, _, err) = submit(
        s,
        &words("refund --key signed --withdrawal w-1 --amount -1"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a refund gives money back"), "{err}");
    let (code, _, err) = submit(
        s,
        &words("deposit --key signed --account bob --amount 1,00 --currency USD"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("as in 1,000.00"), "{err}");
    assert_eq!(http.get("/v1/keys/signed").status, 404);
    assert_eq!(http.last_seq(), 2);
}

/// A `--server` that is not a worker's address is a local mistake: refused at once with
/// what is expected (exit 2), without the retries and the "may or may not have been
/// applied" of a worker that does not answer. The worker here is real and its address
/// right but for the scheme or the path: nothing reaches it.
#[test]
fn a_malformed_server_is_refused_before_anything_is_sent() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let bare = format!("127.0.0.1:{}", w.port);
    let deposit = words("deposit --key dep-1 --account a --amount 1 --currency RUB");
    for (server, says) in [
        (bare.clone(), format!("{bare} has no scheme")),
        (
            format!("{}/v1", w.base),
            "has a path or query (/v1)".to_owned(),
        ),
        (
            format!("{}/v1/deposits?x=1", w.base),
            "has a path or query".to_owned(),
        ),
        (format!("https://{bare}"), "speak plain HTTP".to_owned()),
        (format!("ftp://{bare}"), "the scheme is ftp".to_owned()),
        ("http://".to_owned(), "names no host".to_owned()),
        (
            "http://127.0.0.1:99999".to_owned(),
            "the port must be a number from 1 to 65535".to_owned(),
        ),
        (
            format!("http://me:pw@{bare}"),
            "without user or password".to_owned(),
        ),
    ] {
        let (code, _, err) = submit(&server, &deposit);
        assert_eq!(code, 2, "{server}: {err}");
        assert!(
            err.starts_with("invalid --server: ")
                && err.contains(&says)
                && err.contains("http://HOST:PORT")
                && err.contains("nothing was sent"),
            "{server}: {err}"
        );
        assert!(!err.contains("retrying"), "{server}: {err}");
        let (code, _, err) = cli(&server, &["balance", "a"]);
        assert_eq!(code, 2, "{server}: {err}");
        assert!(err.starts_with("invalid --server: "), "{server}: {err}");
    }
    assert_eq!(w.http().last_seq(), 0);
    // A trailing slash is still the worker's address.
    let (code, out, err) = submit(&format!("{}/", w.base), &deposit);
    assert_eq!(code, 0, "{out}{err}");
}

/// `submit --json` prints the worker's body, which is the same bytes for the first answer
/// and its replays, and says which one it got in `replayed`; a rejection's receipt says
/// the key is spent and names a new key for the next attempt, which applies once the
/// money is there.
#[test]
fn json_marks_replays_and_a_rejection_names_the_next_key() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let s = w.base.as_str();
    let dep = words("deposit --key dep-1 --account alice --amount 10 --currency EUR --json");
    let parse = |out: &str| -> serde_json::Value { serde_json::from_str(out.trim()).unwrap() };
    let (code, first, _) = submit(s, &dep);
    assert_eq!(code, 0, "{first}");
    let (code, again, _) = submit(s, &dep);
    assert_eq!(code, 0, "{again}");
    let (mut first, mut again) = (parse(&first), parse(&again));
    assert_eq!(first["replayed"], false, "{first}");
    assert_eq!(again["replayed"], true, "{again}");
    // Apart from the mark, the same answer.
    first.as_object_mut().unwrap().remove("replayed");
    again.as_object_mut().unwrap().remove("replayed");
    assert_eq!(first, again);
    assert_eq!(first["amount"], 1000);

    let order = words("withdraw --key order-42 --account alice --amount 25 --currency EUR");
    let (code, _, err) = submit(s, &order);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("the rejection is final for this key: a retry with it gets the same answer")
            && err.contains("send it with a new key, such as order-42-attempt-2)"),
        "{err}"
    );
    let (code, out, _) = submit(
        s,
        &words("withdraw --key order-42 --account alice --amount 25 --currency EUR --json"),
    );
    assert_eq!(code, 3, "{out}");
    let rejected = parse(&out);
    assert_eq!(rejected["code"], "insufficient_funds", "{out}");
    assert_eq!(rejected["replayed"], true, "{out}");
    // A top-up does not change the key's answer; the advised new key applies.
    let (code, _, _) = submit(
        s,
        &words("deposit --key dep-2 --account alice --amount 20 --currency EUR"),
    );
    assert_eq!(code, 0);
    let (code, _, err) = submit(s, &order);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.starts_with("rejected (replayed): insufficient_funds"),
        "{err}"
    );
    let mut next = words("withdraw --account alice --amount 25 --currency EUR --key");
    next.push("order-42-attempt-2");
    let (code, out, err) = submit(s, &next);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(w.http().balance("alice"), 500);
    // With no answer there is no body to print: stdout stays empty for a script.
    let (code, out, _) = submit(
        "http://127.0.0.1:1",
        &words("deposit --key k --account alice --amount 1 --currency EUR --json --retries 0"),
    );
    assert_eq!((code, out.as_str()), (1, ""));
}

/// The reads print what the worker answers, money in major units, and with `--json` the
/// worker's body itself; an unknown account or key is exit 3 with a sentence, and a name
/// no account or key can have is refused before anything is sent.
#[test]
fn reads_show_balances_statements_and_keys() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &["--token", "shop=s1", "--token", "other=s2"]);
    let s = w.base.as_str();
    let shop = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--token", "s1"]);
        cli(s, &a)
    };
    for line in [
        "deposit --key dep-1 --account alice --amount 1000 --currency RUB",
        "withdraw --key w-1 --account alice --amount 300 --currency RUB",
        "withdraw --key w-big --account alice --amount 5000 --currency RUB",
        "deposit --key dep-2 --account kenji --amount 5000 --currency JPY",
        "withdraw --key w-jpy --account kenji --amount 1500 --currency JPY",
        "refund --key r-1 --withdrawal w-1 --amount 100",
        "refund --key r-jpy --withdrawal w-jpy --amount 2000",
    ] {
        let mut args = vec!["submit"];
        args.extend(words(line));
        let (code, out, err) = shop(&args);
        assert!(code == 0 || code == 3, "{line}: {out}{err}");
    }
    let http = w.http().with_token("s1");

    let (code, out, err) = shop(&["balance", "alice"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "alice  800.00 RUB\n");
    let (code, out, _) = shop(&["balance", "kenji", "--json"]);
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(json, http.get("/v1/accounts/kenji").json());
    assert_eq!(json["balance"], 3500);
    let (code, out, err) = shop(&["balance", "nobody"]);
    assert_eq!((code, out.as_str()), (3, ""), "{err}");
    assert!(
        err.starts_with("not found: there is no account nobody at http://127.0.0.1:"),
        "{err}"
    );
    let (code, _, err) = shop(&["balance", "no such"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.starts_with("invalid ACCOUNT:") && err.contains("nothing was sent"),
        "{err}"
    );
    // At a point of the log: dep-1 is seq 1, w-1 seq 2, w-big (rejected) seq 3.
    let (code, out, err) = shop(&["balance", "alice", "--as-of-seq", "3"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "alice  700.00 RUB  (as of seq 3: after its movement at seq 2)\n"
    );
    let (code, out, _) = shop(&["balance", "alice", "--as-of-seq", "0"]);
    assert_eq!(
        (code, out.as_str()),
        (
            0,
            "alice  0.00 RUB  (as of seq 0: before its first movement)\n"
        )
    );
    let (code, out, _) = shop(&["balance", "alice", "--as-of", "2000-01-01T00:00:00Z"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("0.00 RUB  (as of 2000-01-01T00:00:00.000Z: before"),
        "{out}"
    );
    let (code, _, err) = shop(&["balance", "alice", "--as-of", "yesterday"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("nothing was sent"), "{err}");
    let (code, _, err) = shop(&[
        "balance",
        "alice",
        "--as-of",
        "2000-01-01T00:00:00Z",
        "--as-of-seq",
        "1",
    ]);
    assert_eq!(code, 2, "{err}");
    // No token: the worker's 401, and how to pass one.
    let (code, _, err) = cli(s, &["balance", "alice"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("HTTP 401") && err.contains("--token SECRET"),
        "{err}"
    );

    // A statement, a page at a time.
    let (code, out, err) = shop(&["statement", "alice", "--limit", "2"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "alice holds 800.00 RUB", "{out}");
    assert!(
        lines[1].split_whitespace().collect::<Vec<_>>()
            == ["seq", "at", "command", "change", "balance", "key"],
        "{out}"
    );
    assert!(
        lines[2].starts_with("    1  ")
            && lines[2].contains("  deposit   +1,000.00  1,000.00  dep-1"),
        "{out}"
    );
    assert!(
        lines[3].starts_with("    2  ")
            && lines[3].contains("  withdraw    -300.00    700.00  w-1"),
        "{out}"
    );
    assert_eq!(
        lines[4], "next page: inbox-worker statement alice --after 2 --limit 2 (or --all)",
        "{out}"
    );
    assert_eq!(lines.len(), 5, "{out}");
    let (code, out, _) = shop(&["statement", "alice", "--after", "2"]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .nth(2)
            .is_some_and(|l| l.ends_with("+100.00   800.00  r-1 (of withdrawal w-1)")),
        "{out}"
    );
    assert!(!out.contains("next page"), "{out}");
    let (code, out, _) = shop(&["statement", "alice", "--limit", "1", "--all"]);
    assert_eq!(code, 0);
    for key in ["dep-1", "w-1", "r-1"] {
        assert_eq!(out.matches(&format!("  {key}")).count(), 1, "{key}: {out}");
    }
    assert!(!out.contains("w-big"), "a rejection moves nothing: {out}");
    let (code, out, _) = shop(&["statement", "alice", "--limit", "2", "--all", "--json"]);
    assert_eq!(code, 0);
    let pages: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(pages.len(), 2, "{out}");
    assert_eq!(
        pages[0],
        http.get("/v1/accounts/alice/facts?limit=2").json()
    );
    assert_eq!(
        pages[1],
        http.get("/v1/accounts/alice/facts?after=2&limit=2").json()
    );
    let (code, _, err) = shop(&["statement", "nobody"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.starts_with("not found: there is no account nobody"),
        "{err}"
    );

    // A key: its command and outcome in major units.
    let (code, out, err) = shop(&["key", "w-big"]);
    assert_eq!(code, 0, "{err}");
    for line in [
        "key w-big: done\n",
        "  command  withdraw 5,000.00 RUB from alice\n",
        "  outcome  rejected as seq 3: insufficient_funds - ",
        "  balance  alice 700.00 RUB when it was decided\n",
        "send it with a new key, such as w-big-attempt-2)\n",
        "  replays  0, conflicts 0\n",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    // A refund's amount is in its withdrawal's currency: JPY has no minor unit.
    let (code, out, err) = shop(&["key", "r-jpy"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("  command  refund 2,000 JPY of withdrawal w-jpy\n")
            && out.contains("refund_exceeds_withdrawal")
            && out.contains("  left     1,500 JPY of the withdrawal to refund\n"),
        "{out}"
    );
    let (code, out, err) = shop(&["key", "r-1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("  outcome  applied as seq 6; balance alice 800.00 RUB after it\n"),
        "{out}"
    );
    let (code, out, _) = shop(&["key", "r-1", "--json"]);
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(json["outcome"], http.get("/v1/keys/r-1").json()["outcome"]);
    // Another client has no such key.
    let (code, _, err) = cli(s, &["key", "r-1", "--token", "s2"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.starts_with("not found: this client has no key r-1"),
        "{err}"
    );
    let (code, out, _) = cli(s, &["key", "r-1", "--token", "s2", "--json"]);
    assert_eq!(code, 3);
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(json["code"], "key_not_found");
    let (code, _, err) = shop(&["key", "has space"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.starts_with("invalid KEY:"), "{err}");
}

/// `accounts` reads one page of `GET /v1/accounts` and says how to get the next, or
/// follows `next` to the end with `--all`; `--json` prints each page as the worker sent it.
#[test]
fn accounts_are_listed_a_page_at_a_time() {
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let s = w.base.as_str();
    let http = w.http();
    for (i, name) in ["carol", "alice", "bob", "dave"].iter().enumerate() {
        http.deposit(&format!("d-{i}"), name, 100 * (i as u64 + 1));
    }
    // @world, alice, bob, carol, dave, in name order.
    let (code, out, err) = cli(s, &["accounts", "--limit", "2"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "@world  -10.00 RUB\n\
         alice     2.00 RUB\n\
         next page: inbox-worker accounts --after alice --limit 2 (or --all)\n"
    );
    let (code, out, _) = cli(s, &["accounts", "--limit", "2", "--after", "alice"]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "bob    3.00 RUB\n\
         carol  1.00 RUB\n\
         next page: inbox-worker accounts --after carol --limit 2 (or --all)\n"
    );
    let (code, out, _) = cli(s, &["accounts", "--limit", "2", "--all"]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "@world  -10.00 RUB\n\
         alice     2.00 RUB\n\
         bob       3.00 RUB\n\
         carol     1.00 RUB\n\
         dave      4.00 RUB\n\
         sums: 0.00 RUB\n"
    );
    let (code, out, _) = cli(s, &["accounts", "--limit", "2", "--all", "--json"]);
    assert_eq!(code, 0);
    let pages: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(pages.len(), 3, "{out}");
    let listed: Vec<serde_json::Value> = pages
        .iter()
        .flat_map(|p| p["accounts"].as_array().unwrap().clone())
        .collect();
    let whole = http.get("/v1/accounts").json();
    assert_eq!(&listed, whole["accounts"].as_array().unwrap());
    assert_eq!(pages[2]["next"], serde_json::Value::Null);
    let (code, _, err) = cli(s, &["accounts", "--after", "no such"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("nothing was sent"), "{err}");
    let (code, _, err) = cli(s, &["accounts", "--limit", "0"]);
    assert_eq!(code, 2, "{err}");
}
