//! `idem-load`: the HTTP load generator for the Idem worker, a command line over
//! `inbox_worker::load` (the engine `inbox-worker bench` uses too).
//!
//! - `seed`: deposits into the accounts and executes the replay keys once.
//! - `run --mode new-key|replay`: keep-alive connections, each with one request in
//!   flight; as fast as possible, or at a fixed total `--rate` (latency from each
//!   request's scheduled send time: no coordinated omission).
//!
//! The run prints `key=value` lines on stdout (bench/http/run.sh turns them into a
//! table). A run waits for the requests in flight at its deadline, so `first` (201
//! answers without `Idempotent-Replayed`) counts every effect this run caused.

use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};
use inbox_worker::load::{self, Mode, RunConfig, Shape};

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
    /// Every withdrawal (seeded and run) on acct-0: one hot balance.
    #[arg(long, global = true)]
    hot: bool,
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
        /// Fraction of new-key requests that re-send an earlier key of the run (0 to 1).
        #[arg(long, default_value_t = 0.0)]
        duplicates: f64,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let shape = Shape {
        accounts: cli.accounts.max(1),
        replay_keys: cli.replay_keys,
        hot: cli.hot,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.cmd {
            Cmd::Seed { deposit } => {
                load::seed(&cli.addr, cli.connections, shape, deposit).await?;
                println!(
                    "seeded accounts={} replay_keys={}",
                    shape.used_accounts(),
                    shape.replay_keys
                );
                Ok(())
            }
            Cmd::Run {
                mode,
                duration,
                rate,
                tag,
                duplicates,
            } => {
                let duration = Duration::try_from_secs_f64(duration)
                    .map_err(|e| anyhow::anyhow!("--duration: {e}"))?;
                let mut report = load::run(&RunConfig {
                    addr: cli.addr.clone(),
                    connections: cli.connections,
                    duration,
                    rate,
                    mode,
                    tag,
                    shape,
                    duplicates,
                })
                .await?;
                report.write_kv(&mut std::io::stdout().lock())?;
                if let Some(e) = &report.tally.first_error {
                    eprintln!("first transport error: {e}");
                }
                Ok(())
            }
        }
    })
}
