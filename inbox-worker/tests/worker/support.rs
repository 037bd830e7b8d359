//! Starting the real binary on a free port, and a small HTTP client for the tests.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_inbox-worker")
}

/// A running `inbox-worker serve`.
pub struct Worker {
    child: Option<Child>,
    pub base: String,
    pub port: u16,
}

impl Worker {
    /// Starts on a port the kernel picks, and waits until it listens.
    pub fn start(db: &Path, extra: &[&str]) -> Worker {
        Self::start_on(db, "127.0.0.1:0", extra)
    }

    pub fn start_on(db: &Path, listen: &str, extra: &[&str]) -> Worker {
        let mut args = vec!["serve", "--db", db.to_str().unwrap(), "--listen", listen];
        args.extend_from_slice(extra);
        Self::spawn(&args, &db.with_extension("log"))
    }

    /// Starts on a PostgreSQL store; its stderr goes to `log`.
    pub fn start_store(url: &str, log: &Path, extra: &[&str]) -> Worker {
        let mut args = vec!["serve", "--store", url, "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        Self::spawn(&args, log)
    }

    /// Runs the binary with `args` and waits until it prints `listening on`.
    pub fn spawn(args: &[&str], log_path: &Path) -> Worker {
        Self::spawn_env(args, log_path, &[])
    }

    /// [`Worker::spawn`] with extra environment variables.
    pub fn spawn_env(args: &[&str], log_path: &Path, env: &[(&str, &str)]) -> Worker {
        let db = log_path;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .unwrap();
        let mut child = Command::new(bin())
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("listening on ") {
                    let _ = tx.send(addr.to_owned());
                }
            }
        });
        let base = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(b) => b,
            Err(_) => {
                let _ = child.kill();
                let log = std::fs::read_to_string(db).unwrap_or_default();
                panic!("the worker did not start:\n{log}");
            }
        };
        let port = base.rsplit(':').next().unwrap().parse().unwrap();
        Worker {
            child: Some(child),
            base,
            port,
        }
    }

    /// Waits for the process to end by itself.
    // Used by tests/broker.rs, which includes this module from another test binary.
    #[allow(dead_code)]
    pub fn wait_exit(mut self, limit: Duration) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        wait_timeout(&mut child, limit)
    }

    /// SIGTERM, then waits for the exit.
    pub fn term(mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        signal("TERM", child.id());
        wait_timeout(&mut child, Duration::from_secs(30))
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(mut self) {
        let mut child = self.child.take().unwrap();
        signal("KILL", child.id());
        let _ = child.wait();
    }

    // Used by the test binaries of their own (hostile, memory) that include this module.
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn http(&self) -> Http {
        Http::new(&self.base)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Spawns `inbox-worker serve` on a free port without waiting for it to listen: for
/// killing it while it starts. Its stdout is piped, so that after the kill the caller can
/// read whether it got as far as `listening on`.
pub fn spawn_serve(db: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(db.with_extension("log"))
        .unwrap();
    Command::new(bin())
        .args(["serve", "--db"])
        .arg(db)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap()
}

pub fn signal(name: &str, pid: u32) {
    let ok = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name} {pid}");
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `f` until it returns `Some`, or panics after `limit`.
pub fn eventually<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub replayed: bool,
    pub retry_after: Option<String>,
    /// `Idempotency-Expires`: until when a stored answer is kept.
    pub expires: Option<String>,
    pub content_type: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or("").to_owned()
    }
}

#[derive(Clone)]
pub struct Http {
    agent: ureq::Agent,
    pub base: String,
    pub token: Option<String>,
}

impl Http {
    pub fn new(base: &str) -> Http {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        Http {
            agent,
            base: base.to_owned(),
            token: None,
        }
    }

    pub fn with_token(&self, token: &str) -> Http {
        Http {
            token: Some(token.to_owned()),
            ..self.clone()
        }
    }

    pub fn post(&self, path: &str, key: Option<&str>, body: &str) -> Reply {
        self.try_post(path, key, body).unwrap()
    }

    pub fn try_post(
        &self,
        path: &str,
        key: Option<&str>,
        body: &str,
    ) -> Result<Reply, ureq::Error> {
        let mut r = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json");
        if let Some(k) = key {
            r = r.header("Idempotency-Key", k);
        }
        if let Some(t) = &self.token {
            r = r.header("Authorization", format!("Bearer {t}"));
        }
        r.send(body).map(reply)
    }

    pub fn get(&self, path: &str) -> Reply {
        let mut r = self.agent.get(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            r = r.header("Authorization", format!("Bearer {t}"));
        }
        reply(r.call().unwrap())
    }

    pub fn deposit(&self, key: &str, account: &str, amount: u64) -> Reply {
        self.post(
            "/v1/deposits",
            Some(key),
            &format!(r#"{{"account":"{account}","amount":{amount},"currency":"RUB"}}"#),
        )
    }

    pub fn withdraw(&self, key: &str, account: &str, amount: u64) -> Reply {
        self.post(
            "/v1/withdrawals",
            Some(key),
            &format!(r#"{{"account":"{account}","amount":{amount},"currency":"RUB"}}"#),
        )
    }

    pub fn balance(&self, account: &str) -> i64 {
        let r = self.get(&format!("/v1/accounts/{account}"));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["balance"].as_i64().unwrap()
    }

    pub fn last_seq(&self) -> u64 {
        self.get("/v1/facts?limit=1").json()["last_seq"]
            .as_u64()
            .unwrap()
    }
}

fn reply(mut r: ureq::http::Response<ureq::Body>) -> Reply {
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let retry_after = header("retry-after");
    let expires = header("idempotency-expires");
    let content_type = header("content-type").unwrap_or_default();
    let status = r.status().as_u16();
    let body = r.body_mut().read_to_string().unwrap();
    Reply {
        status,
        body,
        replayed,
        retry_after,
        expires,
        content_type,
    }
}

/// A fresh folder for one test's ledger.
pub fn scratch() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger");
    (dir, db)
}

/// `verify --store URL` passes; returns its report.
pub fn verify_store(url: &str) -> String {
    let out = run(&["verify", "--store", url]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("all guarantees hold"), "{text}");
    text
}

/// Runs the binary to completion.
pub fn run(args: &[&str]) -> std::process::Output {
    Command::new(bin()).args(args).output().unwrap()
}
