//! Scenarios: a script of commands run against a real ledger (sled, in a fresh temporary
//! folder) with a hand-moved clock, giving a stable transcript of every answer, balance,
//! statement and key state. Snapshot-test your own flows with it:
//!
//! ```
//! let script = "
//!     ## a retry gets the stored answer
//!     shop/ord-1 deposit alice 1000 RUB
//!     shop/ord-1 deposit alice 1000 RUB
//!     balances
//! ";
//! let transcript = ledger::scenario::Scenario::parse(script)?.run()?;
//! assert!(transcript.starts_with("# a retry gets the stored answer\n"));
//! assert!(transcript.contains("replayed: applied seq=1 alice RUB balance=1000"));
//! // In a test: insta::assert_snapshot!(transcript);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The same transcript comes from `inbox-worker replay --script FILE`, for flows written
//! in other languages. The clock starts at 2026-01-01T00:00:00Z and moves only when the
//! script says so, so a transcript is the same on every run and machine.
//!
//! One step per line; `#` lines are copied to the transcript; amounts are minor units:
//!
//! | step | what it does |
//! | --- | --- |
//! | `TENANT/KEY deposit ACCOUNT AMOUNT CUR` | submits a deposit under the key, as the tenant |
//! | `TENANT/KEY withdraw ACCOUNT AMOUNT CUR` | a withdrawal |
//! | `TENANT/KEY refund WITHDRAWAL-KEY AMOUNT` | a refund of the tenant's withdrawal |
//! | `clock +5s`, `clock -1h`, `clock +2m` | moves the clock (s, m, h) |
//! | `sweep` | expires the stored answers past the retention (24h) |
//! | `pause`, `resume` | holds the committer; commands sent meanwhile are held and answered at `resume` |
//! | `restart` | closes the ledger and opens it again |
//! | `balances` | every account's balance (ledger-wide names, `shop/alice`) and the sums |
//! | `statement TENANT/ACCOUNT` | the account's movements with the balance after each |
//! | `key TENANT/KEY` | the key's state and outcome |
//! | `stats` | the ledger's counters |
//! | `verify` | rebuilds everything from the log and checks the guarantees |
//!
//! Accounts are the tenant's own, as over HTTP ([`crate::tenant`]): `shop/k deposit
//! alice` moves `shop`'s `alice`, and answers name it `alice`. A run ends with `verify`;
//! a broken guarantee is an error, never a transcript.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock as _, ManualClock};
use crate::domain::{Account, Amount, ClientId, Command, Currency, Key, Timestamp};
use crate::fact::Outcome;
use crate::store::sled::{PauseGuard, SledConfig, SledStore};
use crate::store::{LedgerError, Submission};

/// Where every scenario's clock starts: 2026-01-01T00:00:00Z.
pub const START_MS: i64 = 1_767_225_600_000;

/// A script that could not be read, with its line (from 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ScriptError {
    pub line: usize,
    pub message: String,
}

/// Why a scenario could not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("the ledger failed: {0}")]
    Ledger(#[from] LedgerError),
    #[error("the temporary folder could not be made: {0}")]
    Folder(#[from] std::io::Error),
    #[error("a guarantee is broken after line {line}:\n{report}")]
    Violated { line: usize, report: String },
    #[error("line {line}: a held command got no answer at resume")]
    NoAnswer { line: usize },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Comment,
    Submit {
        tenant: ClientId,
        key: Key,
        command: Command,
    },
    Clock(i64),
    Sweep,
    Pause,
    Resume,
    Restart,
    Balances,
    Statement(ClientId, Account),
    Key(ClientId, Key),
    Stats,
    Verify,
}

/// A parsed script: every line checked before anything runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// (line number, the line as written, its step)
    steps: Vec<(usize, String, Step)>,
}

impl Scenario {
    /// Reads a script; the first line that is not a step is the error.
    pub fn parse(script: &str) -> Result<Scenario, ScriptError> {
        let mut steps = Vec::new();
        for (i, line) in script.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let step = parse_step(line).map_err(|message| ScriptError {
                line: i + 1,
                message,
            })?;
            steps.push((i + 1, line.to_owned(), step));
        }
        Ok(Scenario { steps })
    }

    /// Runs the script on a fresh ledger in a temporary folder, removed afterwards.
    pub fn run(&self) -> Result<String, ScenarioError> {
        let dir = tempfile::tempdir()?;
        self.run_in(&dir.path().join("ledger"))
    }

    /// Runs the script on a fresh ledger made at `folder` (which must not hold one).
    pub fn run_in(&self, folder: &Path) -> Result<String, ScenarioError> {
        let mut run = Run::open(folder)?;
        let mut out = String::new();
        for (line_no, line, step) in &self.steps {
            if *step == Step::Comment {
                writeln!(out, "{line}").ok();
                continue;
            }
            writeln!(out, "> {line}").ok();
            let answer = run.step(*line_no, line, step)?;
            for l in answer.lines() {
                writeln!(out, "  {l}").ok();
            }
        }
        // Every scenario ends with the guarantees checked (held commands first).
        if run.pause.is_none() {
            run.verify(self.steps.last().map_or(0, |s| s.0))?;
        }
        Ok(out)
    }
}

type Held = crossbeam_channel::Receiver<Result<Submission, LedgerError>>;

struct Run {
    folder: std::path::PathBuf,
    clock: ManualClock,
    ledger: Option<SledStore>,
    pause: Option<PauseGuard>,
    held: Vec<(usize, String, Held)>,
}

impl Run {
    fn open(folder: &Path) -> Result<Run, ScenarioError> {
        let mut run = Run {
            folder: folder.to_owned(),
            clock: ManualClock::new(Timestamp(START_MS)),
            ledger: None,
            pause: None,
            held: Vec::new(),
        };
        run.reopen()?;
        Ok(run)
    }

    fn reopen(&mut self) -> Result<crate::store::OpenReport, ScenarioError> {
        let config = SledConfig::new(&self.folder)
            .clock(Arc::new(self.clock.clone()))
            .retention(Duration::from_secs(24 * 3600))
            .lease(Duration::from_secs(10));
        let (ledger, report) = SledStore::open(config)?;
        self.ledger = Some(ledger);
        Ok(report)
    }

    fn ledger(&self) -> Result<&SledStore, ScenarioError> {
        self.ledger
            .as_ref()
            .ok_or(ScenarioError::Ledger(LedgerError::Closed))
    }

    fn verify(&self, line: usize) -> Result<String, ScenarioError> {
        let report = self.ledger()?.blocking().verify()?;
        if !report.ok() {
            return Err(ScenarioError::Violated {
                line,
                report: report.to_string(),
            });
        }
        Ok(report.to_string())
    }

    fn step(&mut self, line_no: usize, line: &str, step: &Step) -> Result<String, ScenarioError> {
        Ok(match step {
            Step::Comment => String::new(),
            Step::Clock(ms) => {
                self.clock.advance_ms(*ms);
                format!("now {:?}", self.clock.now())
            }
            Step::Sweep => format!("expired {}", self.ledger()?.blocking().sweep()?),
            Step::Pause => {
                self.pause = Some(self.ledger()?.pause());
                "committer paused".into()
            }
            Step::Resume => {
                self.pause = None;
                let mut s = String::from("committer resumed");
                for (held_line, what, rx) in self.held.drain(..) {
                    let r = rx
                        .recv_timeout(Duration::from_secs(30))
                        .map_err(|_| ScenarioError::NoAnswer { line: held_line })?;
                    write!(s, "\n  {what} -> {}", show(&r)).ok();
                }
                s
            }
            Step::Restart => {
                if let Some(l) = self.ledger.take() {
                    l.blocking().shutdown();
                }
                let r = self.reopen()?;
                format!(
                    "reopened: {} facts, {} done, {} expired, {} accounts",
                    r.facts, r.keys_done, r.keys_expired, r.accounts
                )
            }
            Step::Balances => self.balances()?,
            Step::Statement(tenant, account) => self.statement(tenant, account)?,
            Step::Key(tenant, key) => match self.ledger()?.blocking().key(tenant, key)? {
                None => "unknown".into(),
                Some(info) => {
                    let info = info.seen_by_owner();
                    format!(
                        "{} {} lease_expired={} outcome={}",
                        info.status.as_str(),
                        info.command.name(),
                        info.lease_expired,
                        info.outcome.as_ref().map_or("-".into(), show_outcome)
                    )
                }
            },
            Step::Stats => {
                let s = self.ledger()?.blocking().stats();
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
            Step::Verify => self.verify(line_no)?,
            Step::Submit {
                tenant,
                key,
                command,
            } => self.submit(line_no, line, tenant, key, command)?,
        })
    }

    fn submit(
        &mut self,
        line_no: usize,
        line: &str,
        tenant: &ClientId,
        key: &Key,
        command: &Command,
    ) -> Result<String, ScenarioError> {
        let command = command.for_tenant(tenant);
        let ledger = self.ledger()?;
        if self.pause.is_none() {
            let answer = ledger.blocking().submit(tenant, key, command);
            return Ok(show(&seen_by(answer, tenant)));
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        let owner = tenant.clone();
        ledger.submit_with(
            tenant,
            key,
            command,
            None,
            Box::new(move |r| {
                let _ = tx.send(seen_by(r, &owner));
            }),
        );
        // An answer that needs no commit (a replay, a refusal) comes at once; one that
        // needs the paused committer is held until `resume`.
        Ok(match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(r) => show(&r),
            Err(_) => {
                self.held.push((line_no, line.to_owned(), rx));
                "held (pending)".into()
            }
        })
    }

    fn balances(&self) -> Result<String, ScenarioError> {
        let b = self.ledger()?.blocking().balances();
        let mut s = String::new();
        for (account, per) in &b.accounts {
            for (currency, balance) in per {
                write!(s, "{account} {currency} {balance}; ").ok();
            }
        }
        let sums: Vec<String> = b.sums().iter().map(|(c, v)| format!("{c}={v}")).collect();
        write!(s, "sums {}", sums.join(" ")).ok();
        Ok(s)
    }

    fn statement(&self, tenant: &ClientId, account: &Account) -> Result<String, ScenarioError> {
        let ledger_wide = crate::tenant::scoped(tenant, account);
        let facts = self
            .ledger()?
            .blocking()
            .statement(&ledger_wide, 0, usize::MAX)?;
        let mut s = String::new();
        for fact in &facts {
            if let Some(line) = crate::projection::statement_line(fact) {
                writeln!(
                    s,
                    "seq={} {} {} change={} balance={}",
                    fact.seq,
                    fact.key,
                    fact.body.persisted_name(),
                    line.change,
                    line.balance_after
                )
                .ok();
            }
        }
        if facts.is_empty() {
            s.push_str("no movements");
        }
        Ok(s)
    }
}

fn seen_by(
    r: Result<Submission, LedgerError>,
    tenant: &ClientId,
) -> Result<Submission, LedgerError> {
    r.map(|s| match s {
        Submission::Executed(o) => Submission::Executed(o.seen_by(tenant)),
        Submission::Replayed(o) => Submission::Replayed(o.seen_by(tenant)),
        other => other,
    })
}

fn parse_step(line: &str) -> Result<Step, String> {
    if line.starts_with('#') {
        return Ok(Step::Comment);
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    Ok(match words.as_slice() {
        ["clock", delta] => Step::Clock(parse_delta(delta)?),
        ["sweep"] => Step::Sweep,
        ["pause"] => Step::Pause,
        ["resume"] => Step::Resume,
        ["restart"] => Step::Restart,
        ["balances"] => Step::Balances,
        ["stats"] => Step::Stats,
        ["verify"] => Step::Verify,
        ["key", target] => {
            let (tenant, key) = tenant_key(target)?;
            Step::Key(tenant, key)
        }
        ["statement", target] => {
            let (tenant, account) = target
                .split_once('/')
                .ok_or("a statement names TENANT/ACCOUNT")?;
            Step::Statement(
                ClientId::parse(tenant).map_err(|e| e.to_string())?,
                Account::parse(account).map_err(|e| e.to_string())?,
            )
        }
        [target, command @ ..] if target.contains('/') => {
            let (tenant, key) = tenant_key(target)?;
            Step::Submit {
                tenant,
                key,
                command: parse_command(command)?,
            }
        }
        _ => {
            return Err(
                "not a step: expected TENANT/KEY deposit|withdraw|refund ..., clock, sweep, \
                 pause, resume, restart, balances, statement, key, stats or verify"
                    .into(),
            );
        }
    })
}

fn tenant_key(target: &str) -> Result<(ClientId, Key), String> {
    let (tenant, key) = target.split_once('/').ok_or("expected TENANT/KEY")?;
    Ok((
        ClientId::parse(tenant).map_err(|e| e.to_string())?,
        Key::parse(key).map_err(|e| e.to_string())?,
    ))
}

fn parse_command(words: &[&str]) -> Result<Command, String> {
    let amount = |s: &str| {
        s.parse::<u64>()
            .ok()
            .and_then(|n| Amount::new(n).ok())
            .ok_or_else(|| crate::domain::InvalidInput::Amount.to_string())
    };
    let account = |s: &str| Account::parse(s).map_err(|e| e.to_string());
    let currency = |s: &str| Currency::parse(s).map_err(|e| e.to_string());
    Ok(match words {
        ["deposit", a, n, c] => Command::Deposit {
            account: account(a)?,
            amount: amount(n)?,
            currency: currency(c)?,
        },
        ["withdraw", a, n, c] => Command::Withdraw {
            account: account(a)?,
            amount: amount(n)?,
            currency: currency(c)?,
        },
        ["refund", w, n] => Command::Refund {
            withdrawal: Key::parse(w).map_err(|e| e.to_string())?,
            amount: amount(n)?,
        },
        _ => {
            return Err(
                "a command is deposit ACCOUNT AMOUNT CUR, withdraw ACCOUNT AMOUNT \
                        CUR, or refund WITHDRAWAL-KEY AMOUNT (amounts in minor units)"
                    .into(),
            );
        }
    })
}

fn parse_delta(delta: &str) -> Result<i64, String> {
    let bad = || "a clock step is +N or -N with s, m or h: clock +5s".to_owned();
    let sign = match delta.as_bytes().first() {
        Some(b'+') => 1,
        Some(b'-') => -1,
        _ => return Err(bad()),
    };
    let rest = &delta[1..];
    let unit_ms = match rest.as_bytes().last() {
        Some(b's') => 1_000,
        Some(b'm') => 60_000,
        Some(b'h') => 3_600_000,
        _ => return Err(bad()),
    };
    let n: i64 = rest[..rest.len() - 1].parse().map_err(|_| bad())?;
    n.checked_mul(unit_ms)
        .and_then(|ms| ms.checked_mul(sign))
        .ok_or_else(bad)
}

/// An outcome in one line, as a transcript shows it.
pub fn show_outcome(o: &Outcome) -> String {
    match o {
        Outcome::Applied(r) => {
            let mut s = format!(
                "applied seq={} {} {} balance={}",
                r.seq, r.account, r.currency, r.balance
            );
            if let Some(t) = r.refunded_total {
                write!(s, " refunded_total={t}").ok();
            }
            write!(s, " at={:?}", r.created_at).ok();
            s
        }
        Outcome::Rejected(r) => {
            let mut s = format!("rejected {}", r.rejection.code());
            if let Some(detail) = r.detail {
                write!(s, " {detail:?}").ok();
            }
            write!(s, " seq={} at={:?}", r.seq, r.created_at).ok();
            s
        }
    }
}

/// A submission's answer in one line, as a transcript shows it.
pub fn show(s: &Result<Submission, LedgerError>) -> String {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_line_is_named_by_its_number_before_anything_runs() {
        let e = Scenario::parse("shop/k deposit alice 10 RUB\n\nshop/k deposit alice ten RUB")
            .unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("amount"), "{e}");
        for bad in [
            "clock 5s",
            "clock +5d",
            "deposit alice 10 RUB",
            "shop/k transfer a b 1",
            "statement alice",
            "sh op/k deposit alice 1 RUB",
        ] {
            assert!(Scenario::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_delta("-2h"), Ok(-7_200_000));
    }

    #[test]
    fn a_transcript_is_the_same_on_every_run() {
        let script = "
            # two tenants, one name
            shop/d-1 deposit alice 1000 RUB
            other/d-1 deposit alice 5 RUB
            shop/w-1 withdraw alice 300 RUB
            other/w-1 withdraw alice 300 RUB
            shop/r-1 refund w-1 100
            clock +1h
            shop/w-1 withdraw alice 300 RUB
            statement shop/alice
            key other/w-1
            balances
        ";
        let s = Scenario::parse(script).unwrap();
        let first = s.run().unwrap();
        assert_eq!(s.run().unwrap(), first);
        for want in [
            "# two tenants, one name",
            "  executed: applied seq=1 alice RUB balance=1000 at=2026-01-01T00:00:00.000Z",
            "  executed: rejected insufficient_funds Balance(5) seq=4",
            "  replayed: applied seq=3 alice RUB balance=700",
            "  seq=5 r-1 RefundRecorded change=100 balance=800",
            "  done withdraw lease_expired=false outcome=rejected insufficient_funds",
            "other/alice RUB 5; shop/alice RUB 800;",
        ] {
            assert!(first.contains(want), "{want}\n{first}");
        }
    }
}
