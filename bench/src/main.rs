//! `idem-load`: a small HTTP/1.1 load generator for the Idem worker.
//!
//! - `seed`: deposits into N accounts and executes the replay keys once.
//! - `run --mode new-key|replay`: keep-alive connections, each with one request in
//!   flight; as fast as possible, or at a fixed total `--rate`. With a rate, every
//!   request has a scheduled send time and its latency is measured from that time, not
//!   from the moment it was actually sent, so a stall in the server is not hidden by
//!   the generator waiting for it (no coordinated omission).
//!
//! The run prints `key=value` lines on stdout (bench/http/run.sh turns them into a
//! table). A run stops issuing at the deadline and waits for the requests in flight, so
//! `first` (201 answers without `Idempotent-Replayed`) counts every effect this run
//! caused.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::{Parser, Subcommand, ValueEnum};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

#[derive(Parser)]
#[command(name = "idem-load", about = "HTTP load generator for the Idem worker")]
struct Cli {
    /// The worker's address, host:port.
    #[arg(long, global = true, default_value = "127.0.0.1:7420")]
    addr: String,
    /// Runtime threads of the generator.
    #[arg(long, global = true, default_value_t = 2)]
    threads: usize,
    /// Keep-alive connections, one request in flight on each.
    #[arg(long, global = true, default_value_t = 64)]
    connections: usize,
    /// Accounts acct-0 .. acct-(N-1).
    #[arg(long, global = true, default_value_t = 100)]
    accounts: u64,
    /// Replay keys rp-0 .. rp-(N-1): withdraw 1 RUB from acct-(i % accounts).
    #[arg(long, global = true, default_value_t = 10_000)]
    replay_keys: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Deposit into every account and execute every replay key once.
    Seed {
        /// Deposit per account, in minor units.
        #[arg(long, default_value_t = 1_000_000_000_000)]
        deposit: u64,
    },
    /// Measure.
    Run {
        #[arg(long, value_enum)]
        mode: Mode,
        /// Seconds of measurement.
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        /// Total requests per second over all connections; none = as fast as possible.
        #[arg(long)]
        rate: Option<u32>,
        /// Prefix of new keys; make it unique per run on one ledger.
        #[arg(long, default_value = "nk")]
        tag: String,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// POST /v1/withdrawals with a fresh Idempotency-Key every request.
    NewKey,
    /// POST /v1/withdrawals with the seeded keys and bodies: every answer a 201 replay.
    Replay,
}

/// One request to make.
struct Call {
    path: &'static str,
    key: String,
    body: String,
}

fn withdrawal(key: String, account: u64) -> Call {
    Call {
        path: "/v1/withdrawals",
        key,
        body: format!(r#"{{"account":"acct-{account}","amount":1,"currency":"RUB"}}"#),
    }
}

/// What one connection saw.
#[derive(Default)]
struct Tally {
    /// Microseconds, one per answered request.
    latencies: Vec<u32>,
    first: u64,
    replayed: u64,
    other_status: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.latencies.extend(other.latencies);
        self.first += other.first;
        self.replayed += other.replayed;
        self.other_status += other.other_status;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

struct Conn {
    sender: SendRequest<Full<Bytes>>,
    host: String,
}

impl Conn {
    async fn open(addr: &str) -> Result<Conn> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Conn {
            sender,
            host: addr.to_owned(),
        })
    }

    /// Sends one call; answers (status, replayed).
    async fn send(&mut self, call: &Call) -> Result<(u16, bool)> {
        self.sender.ready().await?;
        let request = Request::post(call.path)
            .header("host", &self.host)
            .header("idempotency-key", &call.key)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(call.body.clone())))?;
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        let replayed = response.headers().contains_key("idempotent-replayed");
        response.into_body().collect().await?;
        Ok((status, replayed))
    }
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn record(tally: &mut Tally, answer: Result<(u16, bool)>, latency: Duration) {
    match answer {
        Ok((status, replayed)) => {
            tally.latencies.push(micros(latency));
            match (status, replayed) {
                (201, false) => tally.first += 1,
                (201, true) => tally.replayed += 1,
                _ => tally.other_status += 1,
            }
        }
        Err(e) => {
            tally.errors += 1;
            if tally.first_error.is_none() {
                tally.first_error = Some(format!("{e:#}"));
            }
        }
    }
}

/// The accounts and replay keys a run uses.
#[derive(Clone, Copy)]
struct Shape {
    accounts: u64,
    replay_keys: u64,
}

/// Connection `index`'s `n`-th call.
fn next_call(mode: Mode, shape: Shape, tag: &str, index: usize, n: u64) -> Call {
    let index = index as u64;
    match mode {
        Mode::NewKey => withdrawal(
            format!("{tag}-{index}-{n}"),
            (index.wrapping_mul(7).wrapping_add(n)) % shape.accounts,
        ),
        Mode::Replay => {
            // Each connection walks all the keys from its own offset, so the
            // connections spread over the key space (replays of a done key never
            // conflict, so an occasional overlap is harmless).
            let i = (index
                .wrapping_mul(shape.replay_keys / 64 + 1)
                .wrapping_add(n))
                % shape.replay_keys;
            withdrawal(format!("rp-{i}"), i % shape.accounts)
        }
    }
}

async fn seed(cli: &Cli, deposit: u64) -> Result<()> {
    let mut calls: Vec<Call> = (0..cli.accounts)
        .map(|a| Call {
            path: "/v1/deposits",
            key: format!("dep-acct-{a}"),
            body: format!(r#"{{"account":"acct-{a}","amount":{deposit},"currency":"RUB"}}"#),
        })
        .collect();
    // Deposits first, so that no seeded withdrawal finds its account missing.
    let deposits = std::mem::take(&mut calls);
    run_calls(cli, deposits).await?;
    let withdrawals: Vec<Call> = (0..cli.replay_keys)
        .map(|i| withdrawal(format!("rp-{i}"), i % cli.accounts))
        .collect();
    run_calls(cli, withdrawals).await?;
    println!(
        "seeded accounts={} replay_keys={}",
        cli.accounts, cli.replay_keys
    );
    Ok(())
}

/// Runs every call once over the connections; fails unless every answer is a 201.
async fn run_calls(cli: &Cli, calls: Vec<Call>) -> Result<()> {
    let connections = cli.connections.max(1);
    let mut shares: Vec<Vec<Call>> = (0..connections).map(|_| Vec::new()).collect();
    for (i, call) in calls.into_iter().enumerate() {
        shares[i % connections].push(call);
    }
    let mut tasks = Vec::new();
    for share in shares {
        let addr = cli.addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(&addr).await?;
            for call in &share {
                let (status, _) = conn.send(call).await?;
                if status != 201 {
                    bail!("seeding {}: status {status}", call.key);
                }
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn run(cli: &Cli, mode: Mode, duration: f64, rate: Option<u32>, tag: &str) -> Result<()> {
    let connections = cli.connections.max(1);
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(Conn::open(&cli.addr).await?);
    }
    let start = Instant::now() + Duration::from_millis(50);
    let length = Duration::from_secs_f64(duration);
    let end = start + length;
    let mut tasks = Vec::with_capacity(connections);
    for (index, mut conn) in conns.into_iter().enumerate() {
        let tag = tag.to_owned();
        let shape = Shape {
            accounts: cli.accounts.max(1),
            replay_keys: cli.replay_keys.max(1),
        };
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            tokio::time::sleep_until(start.into()).await;
            let mut n: u64 = 0;
            loop {
                let call = next_call(mode, shape, &tag, index, n);
                let scheduled = match rate {
                    Some(rate) => {
                        // The k-th request of the whole run is due at k / rate;
                        // connection `index` takes k = n * connections + index.
                        let k = n * connections as u64 + index as u64;
                        #[allow(clippy::cast_precision_loss)]
                        let at = start + Duration::from_secs_f64(k as f64 / f64::from(rate));
                        if at >= end {
                            break;
                        }
                        tokio::time::sleep_until(at.into()).await;
                        at
                    }
                    None => {
                        let now = Instant::now();
                        if now >= end {
                            break;
                        }
                        now
                    }
                };
                let answer = conn.send(&call).await;
                record(&mut tally, answer, scheduled.elapsed());
                n += 1;
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for task in tasks {
        total.merge(task.await?);
    }
    let elapsed = start.elapsed().max(length);
    report(mode, rate, connections, elapsed, total);
    Ok(())
}

fn percentile(sorted: &[u32], p: u64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let len = sorted.len() as u64;
    let rank = (len * p).div_ceil(1000).clamp(1, len) - 1;
    usize::try_from(rank)
        .ok()
        .and_then(|r| sorted.get(r).copied())
        .unwrap_or(0)
}

fn report(mode: Mode, rate: Option<u32>, connections: usize, elapsed: Duration, mut t: Tally) {
    t.latencies.sort_unstable();
    let answered = t.latencies.len() as u64;
    #[allow(clippy::cast_precision_loss)]
    let rps = answered as f64 / elapsed.as_secs_f64();
    let kind = match mode {
        Mode::NewKey => "new-key",
        Mode::Replay => "replay",
    };
    println!("kind={kind}");
    println!("connections={connections}");
    println!(
        "rate={}",
        rate.map_or_else(|| "max".to_owned(), |r| r.to_string())
    );
    println!("seconds={:.2}", elapsed.as_secs_f64());
    println!("requests={answered}");
    println!("rps={rps:.0}");
    println!("p50_us={}", percentile(&t.latencies, 500));
    println!("p90_us={}", percentile(&t.latencies, 900));
    println!("p99_us={}", percentile(&t.latencies, 990));
    println!("p999_us={}", percentile(&t.latencies, 999));
    println!("max_us={}", t.latencies.last().copied().unwrap_or(0));
    println!("first={}", t.first);
    println!("replayed={}", t.replayed);
    println!("non201={}", t.other_status);
    println!("errors={}", t.errors);
    if let Some(e) = t.first_error {
        eprintln!("first transport error: {e}");
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match &cli.cmd {
            Cmd::Seed { deposit } => seed(&cli, *deposit).await,
            Cmd::Run {
                mode,
                duration,
                rate,
                tag,
            } => run(&cli, *mode, *duration, *rate, tag).await,
        }
    })
}
