//! Shared pieces of the end-to-end tests: the deterministic workload that crash children
//! run, so the parent can tell which command a key stands for.

pub mod power;
pub mod sim;

use ledger::{Account, Amount, Command, Currency, Key};

/// The command a workload key stands for. A key always maps to the same command, so a
/// repeated key is a retry (a replay), never a reuse.
pub fn workload_command(n: u64) -> Command {
    let accounts = ["alice", "bob", "carol", "dave", "erin"];
    let account = Account::parse(accounts[usize::try_from(n % 5).unwrap_or(0)])
        .unwrap_or_else(|_| unreachable_account());
    let currency = Currency::parse("RUB").unwrap_or_else(|_| unreachable_account_currency());
    let amount = Amount::new(n % 97 + 1).unwrap_or_else(|_| unreachable_amount());
    match n % 3 {
        0 => Command::Deposit {
            account,
            amount: Amount::new((n % 97 + 1) * 10).unwrap_or(amount),
            currency,
        },
        1 => Command::Withdraw {
            account,
            amount,
            currency,
        },
        _ => Command::Refund {
            withdrawal: workload_key(n.saturating_sub(1)),
            amount: Amount::new(n % 5 + 1).unwrap_or(amount),
        },
    }
}

pub fn workload_key(n: u64) -> Key {
    Key::parse(&format!("k{n}")).unwrap_or_else(|_| unreachable_key())
}

// The constants above are valid by construction; these exist only to avoid unwrap.
fn unreachable_account() -> Account {
    panic!("constant account name is valid")
}
fn unreachable_account_currency() -> Currency {
    panic!("constant currency is valid")
}
fn unreachable_amount() -> Amount {
    panic!("constant amount is valid")
}
fn unreachable_key() -> Key {
    panic!("generated key is valid")
}

/// A crash child that is running: its acknowledgements are collected as it prints them.
pub struct Child {
    process: std::process::Child,
    reader: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl Child {
    /// Starts `binary DB_PATH SEED` with the extra environment, stdout and stderr piped.
    pub fn start(
        binary: &str,
        path: &std::path::Path,
        seed: u64,
        env: &[(&str, String)],
    ) -> std::io::Result<Child> {
        use std::io::BufRead;
        let mut process = std::process::Command::new(binary)
            .arg(path)
            .arg(seed.to_string())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let stdout = process
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let reader = std::thread::spawn(move || {
            let mut lines = Vec::new();
            let mut r = std::io::BufReader::new(stdout);
            let mut buf = String::new();
            // Only complete lines count: a crash may cut the last one.
            while r.read_line(&mut buf).unwrap_or(0) > 0 {
                if buf.ends_with('\n') {
                    lines.push(buf.trim_end().to_owned());
                }
                buf.clear();
            }
            lines
        });
        Ok(Child {
            process,
            reader: Some(reader),
        })
    }

    pub fn kill(&mut self) -> std::io::Result<()> {
        self.process.kill()
    }

    /// Waits for the end (at most `limit`, then kills it and says so) and returns the exit
    /// status, the acknowledgement lines and what it wrote on stderr.
    pub fn finish(
        mut self,
        limit: std::time::Duration,
    ) -> std::io::Result<(std::process::ExitStatus, Vec<String>, String, bool)> {
        let deadline = std::time::Instant::now() + limit;
        let mut timed_out = false;
        let status = loop {
            if let Some(s) = self.process.try_wait()? {
                break s;
            }
            if std::time::Instant::now() > deadline {
                timed_out = true;
                self.process.kill()?;
                break self.process.wait()?;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let lines = self
            .reader
            .take()
            .map(|r| r.join().unwrap_or_default())
            .unwrap_or_default();
        let stderr = match self.process.stderr.take() {
            Some(e) => std::io::read_to_string(e)?,
            None => String::new(),
        };
        Ok((status, lines, stderr, timed_out))
    }
}

/// Adds a child's `ACK key body` lines to `acked`, checking that a key acknowledged twice
/// got the same answer both times. Returns how many lines there were.
pub fn collect_acks(
    lines: &[String],
    acked: &mut std::collections::HashMap<String, String>,
) -> Result<usize, String> {
    for line in lines {
        let mut parts = line.splitn(3, ' ');
        let (Some("ACK"), Some(key), Some(body)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("not an acknowledgement: {line}"));
        };
        if let Some(before) = acked.insert(key.to_owned(), body.to_owned())
            && before != body
        {
            return Err(format!(
                "key {key} was answered differently: {before} / {body}"
            ));
        }
    }
    Ok(lines.len())
}

/// Reopens the ledger and checks that every acknowledged answer is there, identical, and
/// that `verify` passes: nothing acknowledged was lost, and whatever was in flight at the
/// crash is wholly there or wholly absent.
pub fn check_after_crash(
    path: &std::path::Path,
    acked: &std::collections::HashMap<String, String>,
) -> Result<ledger::OpenReport, String> {
    use ledger::{ClientId, SledConfig, SledStore, json};
    let (ledger, report) = SledStore::open(SledConfig::new(path)).map_err(|e| e.to_string())?;
    let client = ClientId::default_client();
    for (key, body) in acked {
        let k = ledger::Key::parse(key).map_err(|e| e.to_string())?;
        let info = ledger
            .blocking()
            .key(&client, &k)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("acknowledged key {key} is gone"))?;
        let stored = info
            .outcome
            .as_ref()
            .map(|o| json::outcome(o).to_string())
            .unwrap_or_default();
        if &stored != body {
            return Err(format!("key {key} changed: {body} became {stored}"));
        }
    }
    let verify = ledger.blocking().verify().map_err(|e| e.to_string())?;
    if !verify.ok() {
        return Err(format!("{verify}\n{report}"));
    }
    ledger.blocking().shutdown();
    Ok(report)
}
