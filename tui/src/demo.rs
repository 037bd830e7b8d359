//! `--demo`: a real worker, the `inbox-worker` binary started as a child process on a
//! loopback port and a fresh ledger in a temporary folder, with a storm of commands against
//! it so the dashboard has something to show: first deliveries, retries (replays), twins in
//! flight (409), reused keys with another amount (422), refunds and overdrafts
//! (rejections). The dashboard links no server code: it starts the worker and talks to it
//! over HTTP, as it does to any other.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};

/// How long the worker may take to open its ledger and listen.
const START_WAIT: Duration = Duration::from_secs(30);

/// The running demo. Dropping it stops the storm, kills the worker and deletes its
/// folder, also when the dashboard unwinds from a panic.
pub struct Demo {
    pub server: String,
    stop_storm: Arc<AtomicBool>,
    storm: Option<JoinHandle<()>>,
    worker: Option<Child>,
    // Deleted after `drop` has killed the worker (fields drop after it).
    _folder: tempfile::TempDir,
}

pub fn start() -> anyhow::Result<Demo> {
    let bin = worker_binary()?;
    let folder = tempfile::Builder::new()
        .prefix("idem-tui-demo-")
        .tempdir()?;
    let log = folder.path().join("worker.log");
    let mut command = Command::new(&bin);
    command
        .arg("serve")
        .arg("--db")
        .arg(folder.path().join("ledger"))
        .args(["--listen", "127.0.0.1:0"])
        // Duplicates sent at once get 409 at once instead of waiting for each other, so
        // the storm shows both kinds of conflict.
        .args(["--in-flight-wait", "0ms"])
        // The demo's worker is the default one on its own folder: no PostgreSQL store, no
        // broker and no tokens that the user's environment may hold for a real worker.
        .env_remove("IDEM_STORE")
        .env_remove("IDEM_AMQP")
        .env_remove("IDEM_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // Its own messages go to a file: on the terminal they would tear the dashboard.
        .stderr(std::fs::File::create(&log).context("creating the worker's log")?);
    let child = command
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut demo = Demo {
        server: String::new(),
        stop_storm: Arc::new(AtomicBool::new(false)),
        storm: None,
        worker: Some(child),
        _folder: folder,
    };
    demo.server = demo.wait_for_address(&log)?;
    let (server, stop) = (demo.server.clone(), demo.stop_storm.clone());
    demo.storm = Some(
        std::thread::Builder::new()
            .name("demo-storm".into())
            .spawn(move || storm(&server, &stop))?,
    );
    Ok(demo)
}

impl Demo {
    /// The worker's base URL, from the `listening on http://…` line it prints once it
    /// serves. Its stdout is read to the end on a thread of its own, so that it never
    /// blocks on a full pipe.
    fn wait_for_address(&mut self, log: &Path) -> anyhow::Result<String> {
        let stdout = self
            .worker
            .as_mut()
            .and_then(|w| w.stdout.take())
            .ok_or_else(|| anyhow!("no stdout from the worker"))?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("demo-worker-stdout".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(addr) = line.strip_prefix("listening on ") {
                        let _ = tx.send(addr.trim().to_owned());
                    }
                }
            })?;
        match rx.recv_timeout(START_WAIT) {
            Ok(server) => Ok(server),
            Err(_) => {
                self.stop_worker();
                bail!("the demo worker did not start: {}", log_tail(log))
            }
        }
    }

    fn stop_worker(&mut self) {
        if let Some(mut worker) = self.worker.take() {
            // The demo's ledger goes with its folder: there is nothing to flush, so no
            // need for the graceful stop.
            let _ = worker.kill();
            let _ = worker.wait();
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.stop_storm.store(true, Ordering::Relaxed);
        // The worker first: a storm request waiting on it then fails at once.
        self.stop_worker();
        if let Some(storm) = self.storm.take() {
            let _ = storm.join();
        }
    }
}

/// The last lines the worker wrote on stderr, for an error message.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" / ");
    if tail.is_empty() {
        "it printed nothing".to_owned()
    } else {
        tail
    }
}

/// The `inbox-worker` binary: the one next to this executable (where cargo builds both,
/// and where `cargo install` puts both), else the first on the PATH.
fn worker_binary() -> anyhow::Result<PathBuf> {
    let name = format!("inbox-worker{}", std::env::consts::EXE_SUFFIX);
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(&name)));
    if let Some(path) = &beside
        && path.is_file()
    {
        return Ok(path.clone());
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(&name))
            .find(|p| p.is_file())
    });
    on_path.ok_or_else(|| {
        let beside = beside.map_or_else(
            || "next to ledger-tui".to_owned(),
            |p| p.display().to_string(),
        );
        anyhow!(
            "the demo runs the worker, and there is no {beside} and no {name} on the PATH; \
             install it beside ledger-tui (`cargo install --path inbox-worker`)"
        )
    })
}

fn post(agent: &ureq::Agent, server: &str, path: &str, key: &str, body: &str) {
    // Answers do not matter here: the dashboard shows what the worker made of them.
    let _ = agent
        .post(format!("{server}{path}"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .send(body);
}

fn storm(server: &str, stop: &AtomicBool) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let accounts = ["alice", "bob", "carol", "dave"];
    for account in accounts {
        let body = format!(r#"{{"account":"{account}","amount":500000,"currency":"RUB"}}"#);
        post(
            &agent,
            server,
            "/v1/deposits",
            &format!("open-{account}"),
            &body,
        );
    }
    let mut round: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let account = accounts[usize::try_from(round % 4).unwrap_or(0)];
        storm_round(&agent, server, round, account);
        std::thread::sleep(Duration::from_millis(60));
    }
}

/// One round of the storm on `account`: a withdrawal, delivered twice at once every 7th
/// round, retried every 3rd, its key reused every 11th; and beside it a deposit every
/// 5th, a refund of the last round's withdrawal every 13th, a withdrawal too large every
/// 17th.
fn storm_round(agent: &ureq::Agent, server: &str, round: u64, account: &str) {
    let key = format!("ord-{round}");
    let amount = 100 + (round * 37) % 900;
    let body = format!(r#"{{"account":"{account}","amount":{amount},"currency":"RUB"}}"#);
    if round.is_multiple_of(7) {
        // Twins: two deliveries at once; one is applied, the other waits or gets 409.
        let twin = {
            let (agent, server, key, body) =
                (agent.clone(), server.to_string(), key.clone(), body.clone());
            std::thread::spawn(move || {
                post(&agent, &server, "/v1/withdrawals", &key, &body);
            })
        };
        post(agent, server, "/v1/withdrawals", &key, &body);
        let _ = twin.join();
    } else {
        post(agent, server, "/v1/withdrawals", &key, &body);
    }
    if round.is_multiple_of(3) {
        // A retry of the same intent: replayed, no second effect.
        post(agent, server, "/v1/withdrawals", &key, &body);
    }
    if round.is_multiple_of(11) {
        // The same key with another amount: refused as reused.
        let other = format!(
            r#"{{"account":"{account}","amount":{},"currency":"RUB"}}"#,
            amount + 1
        );
        post(agent, server, "/v1/withdrawals", &key, &other);
    }
    if round.is_multiple_of(5) {
        let body = format!(r#"{{"account":"{account}","amount":2500,"currency":"RUB"}}"#);
        post(
            agent,
            server,
            "/v1/deposits",
            &format!("dep-{round}"),
            &body,
        );
    }
    if round.is_multiple_of(13) {
        let body = format!(r#"{{"withdrawal":"ord-{}","amount":50}}"#, round - 1);
        post(agent, server, "/v1/refunds", &format!("ref-{round}"), &body);
    }
    if round.is_multiple_of(17) {
        let body = format!(r#"{{"account":"{account}","amount":900000000,"currency":"RUB"}}"#);
        post(
            agent,
            server,
            "/v1/withdrawals",
            &format!("big-{round}"),
            &body,
        );
    }
}
