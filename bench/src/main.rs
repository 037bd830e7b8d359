//! `idem-bench`: the benchmark tools of the Idem worker, one binary.
//!
//! - `load seed`: deposits into the accounts and executes the replay keys once.
//! - `load run --mode new-key|replay`: keep-alive connections, each with one request in
//!   flight; as fast as possible, or at a fixed total `--rate` (latency from each
//!   request's scheduled send time: no coordinated omission). Prints `key=value` lines on
//!   stdout (bench/http/run.sh turns them into a table). A run waits for the requests in
//!   flight at its deadline, so `first` (201 answers without `Idempotent-Replayed`) counts
//!   every effect this run caused.
//! - `stores`: the worker on sled, the worker on PostgreSQL and pgbench running the bare
//!   transaction, measured with one workload at several concurrencies.
//! - `sync --rate R`: the disk's floor at that arrival rate: bare `pwrite` + `fdatasync`
//!   group commit on one thread, its latency from each arrival and its CPU.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use idem_bench::load::{self, Mode, RunConfig, Shape};
use idem_bench::stores::{self, StoresArgs};

#[derive(Parser)]
#[command(
    name = "idem-bench",
    version,
    about = "Benchmarks of the Idem worker: an HTTP load generator, and the stores compared"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The HTTP load generator: seed a running worker, then measure it at its maximum
    /// throughput or at a fixed rate.
    Load(LoadArgs),
    /// Measure the worker on sled, the worker on PostgreSQL, and pgbench running the bare
    /// idempotent transaction, at several concurrencies; print a table, write a plot.
    #[command(long_about = STORES_HELP)]
    Stores(StoresArgs),
    /// The disk's floor at a fixed arrival rate: arrivals at --rate on the load generator's
    /// 1 ms grid, one thread writing a 4 KiB page and `fdatasync`ing it for all that
    /// arrived; prints syncs/s, latency from each arrival and the syncing thread's CPU
    /// (cores) as key=value lines.
    Sync(SyncArgs),
}

#[derive(Args)]
struct SyncArgs {
    /// Arrivals per second.
    #[arg(long)]
    rate: u32,
    /// Seconds of measurement.
    #[arg(long, default_value_t = 8.0)]
    duration: f64,
    /// Folder for the synced file (the file system under test); removed after.
    #[arg(long, default_value = ".")]
    dir: std::path::PathBuf,
}

const STORES_HELP: &str = "One workload (withdrawals of 1 over many accounts or one hot \
    account, new keys, an optional ratio of duplicates) measured for --duration at each \
    --concurrency against: a fresh `inbox-worker serve --db` worker (sled), a fresh \
    `inbox-worker serve --store` worker on a new PostgreSQL database, and pgbench running \
    the bare transaction (claim the key, withdraw, write the ledger row, mark the key done) \
    on a new database. Prints throughput, p50/p99 and effects (checked against the store's \
    own count) with the ratios, and writes results.json, table.md and throughput.svg to \
    --out. Exit 1 if a point's effects disagree with its store.\n\nThe worker is the \
    `inbox-worker` binary next to this one (else the one on the PATH, or --worker).\n\n\
    Example:\n  idem-bench stores --concurrency 1,4,16,64 --duration 10s --hot";

#[derive(Args)]
struct LoadArgs {
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
    cmd: LoadCmd,
}

#[derive(Subcommand)]
enum LoadCmd {
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

fn main() -> ExitCode {
    let code = match Cli::parse().command {
        Cmd::Load(args) => load_main(args).map(|()| 0),
        Cmd::Stores(args) => stores::main(args),
        Cmd::Sync(args) => sync_main(&args).map(|()| 0),
    };
    match code {
        Ok(c) => ExitCode::from(c),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn sync_main(args: &SyncArgs) -> Result<()> {
    let duration = Duration::try_from_secs_f64(args.duration)
        .map_err(|e| anyhow::anyhow!("--duration: {e}"))?;
    let floor = idem_bench::sync::run(&args.dir, args.rate, duration)?;
    floor.write_kv(&mut std::io::stdout().lock())?;
    Ok(())
}

fn load_main(args: LoadArgs) -> Result<()> {
    let shape = Shape {
        accounts: args.accounts.max(1),
        replay_keys: args.replay_keys,
        hot: args.hot,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match args.cmd {
            LoadCmd::Seed { deposit } => {
                load::seed(&args.addr, args.connections, shape, deposit).await?;
                println!(
                    "seeded accounts={} replay_keys={}",
                    shape.used_accounts(),
                    shape.replay_keys
                );
                Ok(())
            }
            LoadCmd::Run {
                mode,
                duration,
                rate,
                tag,
                duplicates,
            } => {
                let duration = Duration::try_from_secs_f64(duration)
                    .map_err(|e| anyhow::anyhow!("--duration: {e}"))?;
                let mut report = load::run(&RunConfig {
                    addr: args.addr.clone(),
                    connections: args.connections,
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
