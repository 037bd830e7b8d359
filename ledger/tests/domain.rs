//! Table-driven domain tests: each case is a script of commands run through one `check`
//! helper against a real ledger on sled with a hand-moved clock; the transcript of
//! answers, balances and counters is an insta snapshot in the workspace's `snapshots/`.
#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::time::Duration;

use ledger::*;

const START_MS: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

struct Harness {
    dir: tempfile::TempDir,
    clock: ManualClock,
    ledger: Option<SledStore>,
    pause: Option<PauseGuard>,
    held: Vec<(
        String,
        crossbeam_channel::Receiver<Result<Submission, LedgerError>>,
    )>,
}

impl Harness {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Timestamp(START_MS));
        let mut h = Harness {
            dir,
            clock,
            ledger: None,
            pause: None,
            held: Vec::new(),
        };
        h.open();
        h
    }

    fn config(&self) -> SledConfig {
        SledConfig::new(self.dir.path().join("ledger"))
            .clock(std::sync::Arc::new(self.clock.clone()))
            .retention(Duration::from_secs(24 * 3600))
            .lease(Duration::from_secs(10))
    }

    fn open(&mut self) -> OpenReport {
        let (l, report) = SledStore::open(self.config()).unwrap();
        self.ledger = Some(l);
        report
    }

    fn ledger(&self) -> &SledStore {
        self.ledger.as_ref().unwrap()
    }
}

fn parse_command(words: &[&str]) -> Command {
    let amount = |s: &str| Amount::new(s.parse().unwrap()).unwrap();
    match words {
        ["deposit", account, n, cur] => Command::Deposit {
            account: Account::parse(account).unwrap(),
            amount: amount(n),
            currency: Currency::parse(cur).unwrap(),
        },
        ["withdraw", account, n, cur] => Command::Withdraw {
            account: Account::parse(account).unwrap(),
            amount: amount(n),
            currency: Currency::parse(cur).unwrap(),
        },
        ["refund", withdrawal, n] => Command::Refund {
            withdrawal: Key::parse(withdrawal).unwrap(),
            amount: amount(n),
        },
        other => panic!("unknown command {other:?}"),
    }
}

fn show_outcome(o: &Outcome) -> String {
    match o {
        Outcome::Applied(r) => {
            let mut s = format!(
                "applied seq={} {} {} balance={}",
                r.seq, r.account, r.currency, r.balance
            );
            if let Some(t) = r.refunded_total {
                write!(s, " refunded_total={t}").unwrap();
            }
            write!(s, " at={:?}", r.created_at).unwrap();
            s
        }
        Outcome::Rejected(r) => {
            let mut s = format!("rejected {}", r.rejection.code());
            if let Some(detail) = r.detail {
                write!(s, " {detail:?}").unwrap();
            }
            write!(s, " seq={} at={:?}", r.seq, r.created_at).unwrap();
            s
        }
    }
}

fn show(s: &Result<Submission, LedgerError>) -> String {
    match s {
        Ok(Submission::Executed(o)) => format!("executed: {}", show_outcome(o)),
        Ok(Submission::Replayed(o)) => format!("replayed: {}", show_outcome(o)),
        Ok(Submission::Reused) => "refused: idempotency_key_reused".into(),
        Ok(Submission::InProgress { retry_after }) => {
            format!("refused: request_in_progress retry_after={retry_after:?}")
        }
        Ok(Submission::Quarantined { reason }) => format!("quarantined: {reason}"),
        Err(e) => format!("error: {e}"),
    }
}

/// Runs a script and returns its transcript.
fn run(script: &str) -> String {
    let mut h = Harness::new();
    let mut out = String::new();
    for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with('#') {
            writeln!(out, "{line}").unwrap();
            continue;
        }
        writeln!(out, "> {line}").unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["clock", delta] => {
                let (sign, rest) = delta.split_at(1);
                let (n, unit) = rest.split_at(rest.len() - 1);
                let n: i64 = n.parse().unwrap();
                let ms = n * match unit {
                    "s" => 1000,
                    "m" => 60_000,
                    "h" => 3_600_000,
                    u => panic!("unit {u}"),
                };
                h.clock.advance_ms(if sign == "-" { -ms } else { ms });
                format!("now {:?}", h.clock.now())
            }
            ["sweep"] => format!("expired {}", h.ledger().blocking().sweep().unwrap()),
            ["pause"] => {
                h.pause = Some(h.ledger().pause());
                "committer paused".into()
            }
            ["resume"] => {
                h.pause = None;
                let mut s = String::from("committer resumed");
                for (what, rx) in h.held.drain(..) {
                    let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
                    write!(s, "\n  {what} -> {}", show(&r)).unwrap();
                }
                s
            }
            ["restart"] => {
                let l = h.ledger.take().unwrap();
                l.blocking().shutdown();
                drop(l);
                let r = h.open();
                format!(
                    "reopened: {} facts, {} done, {} expired, {} accounts",
                    r.facts, r.keys_done, r.keys_expired, r.accounts
                )
            }
            ["balances"] => {
                let b = h.ledger().blocking().balances();
                let mut s = String::new();
                for (account, per) in &b.accounts {
                    for (currency, balance) in per {
                        write!(s, "{account} {currency} {balance}; ").unwrap();
                    }
                }
                let sums: Vec<String> = b.sums().iter().map(|(c, v)| format!("{c}={v}")).collect();
                write!(s, "sums {}", sums.join(" ")).unwrap();
                s
            }
            ["stats"] => {
                let s = h.ledger().blocking().stats();
                format!(
                    "last_seq={} applied={:?} rejected={:?} done={} expired={} replayed={} in_flight={} reused={}",
                    s.last_seq,
                    s.applied,
                    s.rejected,
                    s.keys_done,
                    s.keys_expired,
                    s.observed.replayed,
                    s.observed.conflicts_in_flight,
                    s.observed.conflicts_reused
                )
            }
            ["verify"] => {
                let r = h.ledger().blocking().verify().unwrap();
                assert!(r.ok(), "verify failed:\n{r}");
                r.to_string()
            }
            ["key", target] => {
                let (c, k) = target.split_once('/').unwrap();
                match h
                    .ledger()
                    .blocking()
                    .key(&ClientId::parse(c).unwrap(), &Key::parse(k).unwrap())
                    .unwrap()
                {
                    None => "unknown".into(),
                    Some(info) => format!(
                        "{} {} lease_expired={} outcome={}",
                        info.status.as_str(),
                        info.command.name(),
                        info.lease_expired,
                        info.outcome.as_ref().map_or("-".into(), show_outcome)
                    ),
                }
            }
            [target, cmd @ ..] if target.contains('/') => {
                let (c, k) = target.split_once('/').unwrap();
                let (client, key) = (ClientId::parse(c).unwrap(), Key::parse(k).unwrap());
                let command = parse_command(cmd);
                if h.pause.is_some() {
                    let (tx, rx) = crossbeam_channel::bounded(1);
                    h.ledger().submit_with(
                        &client,
                        &key,
                        command,
                        None,
                        Box::new(move |r| {
                            let _ = tx.send(r);
                        }),
                    );
                    // An answer that needs no commit comes at once; others are held.
                    match rx.recv_timeout(Duration::from_millis(200)) {
                        Ok(r) => show(&r),
                        Err(_) => {
                            h.held.push((line.to_owned(), rx));
                            "held (pending)".into()
                        }
                    }
                } else {
                    show(&h.ledger().blocking().submit(&client, &key, command))
                }
            }
            other => panic!("unknown step {other:?}"),
        };
        for l in answer.lines() {
            writeln!(out, "  {l}").unwrap();
        }
    }
    // Every script ends with the guarantees checked.
    if h.pause.is_none() {
        let r = h.ledger().blocking().verify().unwrap();
        assert!(r.ok(), "verify failed at the end:\n{r}\n{out}");
    }
    out
}

fn check(name: &str, script: &str) {
    let transcript = run(script);
    insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!(format!("ledger_{name}"), transcript);
    });
}

#[test]
fn seed_scenario() {
    check(
        "seed_scenario",
        "
        default/dep-1 deposit alice 1000 RUB
        # the client retries req-7f3a twice: one withdrawal, three identical answers
        default/req-7f3a withdraw alice 300 RUB
        default/req-7f3a withdraw alice 300 RUB
        default/req-7f3a withdraw alice 300 RUB
        # another key is another withdrawal
        default/req-91bc withdraw alice 200 RUB
        balances
        stats
        ",
    );
}

#[test]
fn every_rejection_code_is_final_and_replayed() {
    check(
        "rejections",
        "
        default/w-ghost withdraw ghost 10 RUB
        default/d-1 deposit alice 100 RUB
        default/d-2 deposit alice 100 USD
        default/w-cur withdraw alice 10 USD
        default/w-big withdraw alice 101 RUB
        default/r-none refund w-nothing 10
        default/w-ok withdraw alice 60 RUB
        default/r-over refund w-ok 61
        # rejections are replayed: a retry never turns a failure into a success
        default/d-3 deposit alice 1000 RUB
        default/w-big withdraw alice 101 RUB
        default/r-none refund w-nothing 10
        balances
        stats
        ",
    );
}

#[test]
fn same_key_other_command_is_refused_and_changes_nothing() {
    check(
        "reuse",
        "
        default/d-1 deposit alice 1000 RUB
        default/w-1 withdraw alice 300 RUB
        default/w-1 withdraw alice 301 RUB
        default/w-1 withdraw bob 300 RUB
        default/w-1 withdraw alice 300 USD
        default/w-1 deposit alice 300 RUB
        default/w-1 refund d-1 300
        default/w-1 withdraw alice 300 RUB
        balances
        stats
        ",
    );
}

#[test]
fn refunds_partial_over_unknown_and_of_rejections() {
    check(
        "refunds",
        "
        default/d-1 deposit alice 1000 RUB
        default/w-1 withdraw alice 300 RUB
        default/r-1 refund w-1 100
        default/r-1 refund w-1 100
        default/r-2 refund w-1 150
        default/r-3 refund w-1 51
        default/r-4 refund w-1 50
        default/r-5 refund w-1 1
        # a rejected withdrawal cannot be refunded
        default/w-2 withdraw alice 5000 RUB
        default/r-6 refund w-2 10
        # nor can a deposit, or another client's withdrawal
        default/r-7 refund d-1 10
        other/r-8 refund w-1 10
        balances
        stats
        ",
    );
}

#[test]
fn clients_never_see_each_others_keys() {
    check(
        "clients",
        "
        shop/d-1 deposit alice 1000 RUB
        bank/d-1 deposit bob 500 RUB
        shop/d-1 deposit alice 1000 RUB
        bank/d-1 deposit bob 500 RUB
        bank/d-1 deposit alice 1000 RUB
        balances
        ",
    );
}

#[test]
fn currencies_are_fixed_by_the_first_deposit() {
    check(
        "currencies",
        "
        default/d-1 deposit alice 1000 EUR
        default/d-2 deposit alice 1000 USD
        default/d-3 deposit bob 70 USD
        default/w-1 withdraw bob 70 USD
        default/w-2 withdraw alice 1 USD
        default/d-4 deposit carol 1000000000000000 JPY
        default/d-5 deposit carol 1000000000000000 JPY
        balances
        ",
    );
}

#[test]
fn keys_expire_but_effects_do_not() {
    check(
        "retention",
        "
        default/d-1 deposit alice 1000 RUB
        default/w-1 withdraw alice 300 RUB
        clock +23h
        sweep
        default/w-2 withdraw alice 100 RUB
        clock +2h
        sweep
        key default/w-1
        key default/w-2
        # after expiry the answer is rebuilt from the fact, and no money moves
        default/w-1 withdraw alice 300 RUB
        default/w-1 withdraw alice 999 RUB
        default/r-1 refund w-1 300
        restart
        default/w-1 withdraw alice 300 RUB
        clock +24h
        sweep
        sweep
        balances
        stats
        ",
    );
}

#[test]
fn clock_going_backwards_keeps_the_log_in_order() {
    check(
        "clock_backwards",
        "
        default/d-1 deposit alice 1000 RUB
        clock -2h
        default/w-1 withdraw alice 1 RUB
        clock +25h
        sweep
        clock -30h
        sweep
        default/w-1 withdraw alice 1 RUB
        stats
        ",
    );
}

#[test]
fn in_flight_duplicates_get_409_and_a_dead_lease_is_taken_over() {
    check(
        "in_flight",
        "
        default/d-1 deposit alice 1000 RUB
        pause
        default/w-1 withdraw alice 300 RUB
        default/w-1 withdraw alice 300 RUB
        default/w-1 withdraw alice 999 RUB
        key default/w-1
        clock +11s
        key default/w-1
        # the first attempt's lease ran out: this one takes the claim over
        default/w-1 withdraw alice 300 RUB
        resume
        default/w-1 withdraw alice 300 RUB
        balances
        stats
        ",
    );
}

#[test]
fn answers_survive_a_restart() {
    check(
        "restart",
        "
        default/d-1 deposit alice 1000 RUB
        default/w-1 withdraw alice 300 RUB
        default/w-2 withdraw alice 3000 RUB
        restart
        default/w-1 withdraw alice 300 RUB
        default/w-2 withdraw alice 3000 RUB
        default/w-3 withdraw alice 700 RUB
        restart
        balances
        stats
        ",
    );
}
