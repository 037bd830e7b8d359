//! `--demo`: a real worker on a loopback port inside this process, on a fresh ledger in a
//! temporary folder, with a storm of commands against it so the dashboard has something
//! to show: first deliveries, retries (replays), twins in flight (409), reused keys with
//! another amount (422), refunds and overdrafts (rejections).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context as _;
use inbox_worker::{ApiOptions, serve};
use ledger::Ledger;

/// The running demo. Dropping it stops the storm and the worker.
pub struct Demo {
    pub server: String,
    stop_storm: Arc<AtomicBool>,
    storm: Option<JoinHandle<()>>,
    stop_server: Option<tokio::sync::oneshot::Sender<()>>,
    server_task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    runtime: tokio::runtime::Runtime,
    ledger: Ledger,
    // Kept for its Drop, which deletes the folder.
    _folder: tempfile::TempDir,
}

pub fn start() -> anyhow::Result<Demo> {
    let folder = tempfile::Builder::new()
        .prefix("idem-tui-demo-")
        .tempdir()?;
    let (ledger, _) = Ledger::open(ledger::Config::new(folder.path().join("ledger")))
        .context("opening the demo ledger")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let server = format!("http://{}", listener.local_addr()?);
    let (stop_server, stopped) = tokio::sync::oneshot::channel::<()>();
    let server_task = runtime.spawn(serve(
        listener,
        Arc::new(ledger.clone()),
        ApiOptions::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let stop_storm = Arc::new(AtomicBool::new(false));
    let storm = {
        let (server, stop) = (server.clone(), stop_storm.clone());
        std::thread::Builder::new()
            .name("demo-storm".into())
            .spawn(move || storm(&server, &stop))?
    };
    Ok(Demo {
        server,
        stop_storm,
        storm: Some(storm),
        stop_server: Some(stop_server),
        server_task: Some(server_task),
        runtime,
        ledger,
        _folder: folder,
    })
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.stop_storm.store(true, Ordering::Relaxed);
        if let Some(storm) = self.storm.take() {
            let _ = storm.join();
        }
        if let Some(stop) = self.stop_server.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.server_task.take() {
            let _ = self.runtime.block_on(task);
        }
        self.ledger.shutdown();
    }
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
            &format!("seed-{account}"),
            &body,
        );
    }
    let mut round: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let account = accounts[usize::try_from(round % 4).unwrap_or(0)];
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
            post(&agent, server, "/v1/withdrawals", &key, &body);
            let _ = twin.join();
        } else {
            post(&agent, server, "/v1/withdrawals", &key, &body);
        }
        if round.is_multiple_of(3) {
            // A retry of the same intent: replayed, no second effect.
            post(&agent, server, "/v1/withdrawals", &key, &body);
        }
        if round.is_multiple_of(11) {
            // The same key with another amount: refused as reused.
            let other = format!(
                r#"{{"account":"{account}","amount":{},"currency":"RUB"}}"#,
                amount + 1
            );
            post(&agent, server, "/v1/withdrawals", &key, &other);
        }
        if round.is_multiple_of(5) {
            let body = format!(r#"{{"account":"{account}","amount":2500,"currency":"RUB"}}"#);
            post(
                &agent,
                server,
                "/v1/deposits",
                &format!("dep-{round}"),
                &body,
            );
        }
        if round.is_multiple_of(13) {
            let body = format!(r#"{{"withdrawal":"ord-{}","amount":50}}"#, round - 1);
            post(
                &agent,
                server,
                "/v1/refunds",
                &format!("ref-{round}"),
                &body,
            );
        }
        if round.is_multiple_of(17) {
            let body = format!(r#"{{"account":"{account}","amount":900000000,"currency":"RUB"}}"#);
            post(
                &agent,
                server,
                "/v1/withdrawals",
                &format!("big-{round}"),
                &body,
            );
        }
        std::thread::sleep(Duration::from_millis(60));
    }
}
