//! `idem-bench stores`: one workload, run in one go against the worker on sled, the
//! worker on PostgreSQL (with its groups, and with one command per transaction), and
//! pgbench running the bare hand-written transaction (the floor: what PostgreSQL itself
//! does for one idempotent withdrawal, with no worker around it). With `--before`, another
//! build of the worker on PostgreSQL too (the previous release, say).
//!
//! For every concurrency and every target the bench starts from nothing: a fresh worker
//! process (the `inbox-worker` binary, `serve` on a temporary folder or on a fresh database
//! `idem_bench_<random>`, dropped after), seeded with deposits, then measured for the
//! duration with [`crate::load`], the engine `idem-bench load` uses too. pgbench gets the classic
//! tables in a fresh database. Concurrency is the outer loop, so the targets compared at
//! one concurrency are measured minutes apart, not a whole sweep apart, on a shared machine.
//!
//! Effects are counted twice: by the load generator (201 answers without
//! `Idempotent-Replayed`, one per key that executed) and by the store (the worker's
//! `idem_last_seq` before and after the run; pgbench's `ledger` rows). A disagreement with
//! no transport error in the run means a key executed twice or not at all: the bench says
//! so and exits 1.
//!
//! Outputs, in `--out`: `results.json` (every point, every ratio), `table.md` (also
//! printed on stdout) and `throughput.svg` (throughput against concurrency, one line per
//! target). A target that cannot run (no PostgreSQL, a worker that will not start) gets
//! its error in the table instead of numbers; the others still run.

use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use rand::Rng as _;
use serde::Serialize;

use crate::load::{self, Mode, RunConfig, Shape};
use crate::parse_duration;

/// What a bench point measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// `inbox-worker serve --db` (sled) in a temporary folder.
    Sled,
    /// `inbox-worker serve --store` on a fresh PostgreSQL database.
    Postgres,
    /// The same with `--pg-group-max 1` and a lane per connection: every command a
    /// transaction of its own, as many in flight as connections.
    #[serde(rename = "postgres-single")]
    PostgresSingle,
    /// The worker binary of `--before` (another build) on a fresh PostgreSQL database.
    #[serde(rename = "postgres-before")]
    PostgresBefore,
    /// pgbench running the bare hand-written transaction on a fresh database.
    Pgbench,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Sled => "sled",
            Target::Postgres => "postgres",
            Target::PostgresSingle => "postgres-single",
            Target::PostgresBefore => "postgres-before",
            Target::Pgbench => "pgbench",
        }
    }
}

/// `idem-bench stores`' flags.
#[derive(clap::Args, Clone, Debug)]
pub struct StoresArgs {
    /// What to measure, comma-separated: sled, postgres, postgres-single (one command
    /// per transaction), postgres-before (the build of --before), pgbench.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "sled,postgres,postgres-single,pgbench"
    )]
    pub targets: Vec<Target>,
    /// Concurrencies to measure, comma-separated: HTTP keep-alive connections with one
    /// request in flight each, or pgbench clients.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub concurrency: Vec<usize>,
    /// Measurement per point (pgbench rounds up to whole seconds).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Accounts withdrawals spread over.
    #[arg(long, default_value_t = 10_000)]
    pub accounts: u64,
    /// Every withdrawal on one account (the hot-row case).
    #[arg(long)]
    pub hot: bool,
    /// Fraction of requests (0 to 1) that re-send an earlier key with its body.
    #[arg(long, default_value_t = 0.0)]
    pub duplicates: f64,
    /// The PostgreSQL server for the postgres and pgbench targets; the bench creates and
    /// drops a database `idem_bench_<random>` on it for every point.
    #[arg(
        long,
        env = "IDEM_BENCH_PG",
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub pg_url: String,
    /// Folder for results.json, table.md and throughput.svg.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Runtime threads of the load generator.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Rounds per point: the targets are measured in turn, round after round, and each
    /// point is the round with the median throughput (all rounds are listed). On a shared
    /// machine one round can be slowed by a neighbour; alternating keeps the comparison
    /// side by side.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// The `inbox-worker` binary to measure (default: the one next to this binary, else
    /// `inbox-worker` on the PATH).
    #[arg(long, value_name = "PATH")]
    pub worker: Option<PathBuf>,
    /// Another `inbox-worker` binary, measured on PostgreSQL as the target
    /// postgres-before (added to --targets when given).
    #[arg(long, value_name = "PATH")]
    pub before: Option<PathBuf>,
}

/// Deposit per account: far more than any run can withdraw at 1 per request, so no
/// withdrawal is ever refused for funds (a refusal is an effect too, but not the workload).
const DEPOSIT: u64 = 1_000_000_000_000;
/// Connections the filling step uses, whatever the point's concurrency.
const SEED_CONNECTIONS: usize = 32;

/// One measured point.
#[derive(Clone, Debug, Serialize)]
pub struct Measured {
    /// Wall time of the measurement (to the last answer).
    pub seconds: f64,
    /// Answered requests (pgbench: transactions).
    pub requests: u64,
    /// Answered requests (pgbench: transactions) per second.
    pub throughput: f64,
    pub effects_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Keys that executed, as the load saw them: 201 answers without
    /// `Idempotent-Replayed` (pgbench: rows in `ledger`).
    pub effects: u64,
    /// What the store says it applied during the run: the worker's `idem_last_seq`
    /// after minus before (pgbench: rows in `idempotency_keys`).
    pub applied: u64,
    /// Distinct keys the run sent (HTTP targets).
    pub keys: Option<u64>,
    /// Requests that re-sent an earlier key.
    pub duplicates: u64,
    pub replayed: u64,
    /// 409 answers: a duplicate whose twin was still in flight.
    pub in_flight: u64,
    /// Other non-201 answers (pgbench: failed transactions).
    pub other: u64,
    /// Transport errors (no answer).
    pub errors: u64,
    /// Set when the counts disagree.
    pub check: Option<String>,
    /// Cores busy during the measurement with what is measured: the worker, the load
    /// generator and PostgreSQL (pgbench and PostgreSQL for the pgbench target).
    pub cpu_measured: f64,
    /// Cores busy with everything else on the machine meanwhile (another build, say): a
    /// high value marks a disturbed point.
    pub cpu_other: f64,
}

/// One point: a target at a concurrency, measured or failed.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub target: Target,
    pub concurrency: usize,
    /// The median round.
    pub measured: Option<Measured>,
    pub error: Option<String>,
    /// Throughput of every round that measured, in the order run.
    pub rounds: Vec<f64>,
    /// What the other rounds found wrong: an effects mismatch or a failure.
    pub other_rounds: Vec<String>,
}

/// Throughput ratios at one concurrency.
#[derive(Clone, Debug, Serialize)]
pub struct Ratios {
    pub concurrency: usize,
    pub sled_over_postgres: Option<f64>,
    pub postgres_over_pgbench: Option<f64>,
    pub sled_over_pgbench: Option<f64>,
    /// What groups gain: the worker on PostgreSQL over itself with one command per
    /// transaction.
    pub postgres_over_single: Option<f64>,
    pub postgres_over_before: Option<f64>,
    /// p99 of the PostgreSQL worker over pgbench's.
    pub postgres_p99_over_pgbench: Option<f64>,
}

/// The whole run, as written to results.json.
#[derive(Debug, Serialize)]
pub struct Results {
    pub workload: String,
    pub accounts: u64,
    pub hot: bool,
    pub duplicates: f64,
    pub duration_s: f64,
    pub generator_threads: usize,
    pub cpus: usize,
    pub load_average_at_start: String,
    pub started_unix: u64,
    pub points: Vec<Point>,
    pub ratios: Vec<Ratios>,
    /// The goals at 64 connections: postgres ≥ 3× pgbench, with a p99 no higher; at 1
    /// connection postgres ≥ 0.9× the build before.
    pub goal_postgres_over_pgbench: f64,
    pub goal_postgres_over_before_at_1: f64,
}

/// Runs the bench; answers the exit code: 0, or 1 when some point's effects disagree
/// with its store's count (exactly once broken, or the bench's counting is).
pub fn main(args: StoresArgs) -> Result<u8> {
    let worker = match &args.worker {
        Some(path) => path.clone(),
        None => crate::worker_binary()?,
    };
    let results = run(&args, &worker)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let table = render_table(&results);
    print!("{table}");
    let _ = std::io::stdout().flush();
    std::fs::write(args.out.join("table.md"), &table)?;
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    plot(&results, &args.out.join("throughput.svg"))?;
    eprintln!(
        "wrote {}/results.json, table.md, throughput.svg",
        args.out.display()
    );
    let broken = results.points.iter().any(|p| {
        let chosen = p.measured.as_ref().and_then(|m| m.check.as_deref());
        chosen
            .into_iter()
            .chain(p.other_rounds.iter().map(String::as_str))
            .any(|c| c.starts_with("MISMATCH"))
    });
    Ok(u8::from(broken))
}

/// Measures every point.
pub fn run(args: &StoresArgs, worker: &Path) -> Result<Results> {
    if args.targets.is_empty() || args.concurrency.is_empty() {
        bail!("say at least one --targets and one --concurrency");
    }
    if args.concurrency.contains(&0) {
        bail!("--concurrency: every value must be at least 1");
    }
    if !(0.0..=1.0).contains(&args.duplicates) {
        bail!("--duplicates: a ratio between 0 and 1");
    }
    if args.accounts == 0 {
        bail!("--accounts: at least 1");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .context("starting the load generator's runtime")?;
    let load_average = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned());
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut targets = args.targets.clone();
    if args.before.is_some() && !targets.contains(&Target::PostgresBefore) {
        targets.push(Target::PostgresBefore);
    }
    if targets.contains(&Target::PostgresBefore) && args.before.is_none() {
        bail!("--targets postgres-before needs --before PATH: the other build to measure");
    }
    let mut points = Vec::new();
    let repeat = args.repeat.max(1);
    for &concurrency in &args.concurrency {
        let mut rounds: Vec<Vec<Point>> = vec![Vec::new(); targets.len()];
        for round in 1..=repeat {
            for (i, &target) in targets.iter().enumerate() {
                let label = if repeat > 1 {
                    format!(
                        "{} at {concurrency} (round {round} of {repeat})",
                        target.name()
                    )
                } else {
                    format!("{} at {concurrency}", target.name())
                };
                rounds[i].push(measure_point(
                    args,
                    worker,
                    &runtime,
                    target,
                    concurrency,
                    &label,
                ));
            }
        }
        points.extend(rounds.into_iter().filter_map(median_point));
    }
    let ratios = args
        .concurrency
        .iter()
        .map(|&c| {
            let at = |t: Target| throughput(&points, t, c);
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            };
            let p99 = |t: Target| {
                points
                    .iter()
                    .find(|p| p.target == t && p.concurrency == c)
                    .and_then(|p| p.measured.as_ref())
                    .map(|m| m.p99_ms)
            };
            Ratios {
                concurrency: c,
                sled_over_postgres: ratio(at(Target::Sled), at(Target::Postgres)),
                postgres_over_pgbench: ratio(at(Target::Postgres), at(Target::Pgbench)),
                sled_over_pgbench: ratio(at(Target::Sled), at(Target::Pgbench)),
                postgres_over_single: ratio(at(Target::Postgres), at(Target::PostgresSingle)),
                postgres_over_before: ratio(at(Target::Postgres), at(Target::PostgresBefore)),
                postgres_p99_over_pgbench: ratio(p99(Target::Postgres), p99(Target::Pgbench)),
            }
        })
        .collect();
    Ok(Results {
        workload: workload(args),
        accounts: args.accounts,
        hot: args.hot,
        duplicates: args.duplicates,
        duration_s: args.duration.as_secs_f64(),
        generator_threads: args.threads.max(1),
        cpus: std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        load_average_at_start: load_average,
        started_unix,
        points,
        ratios,
        goal_postgres_over_pgbench: 3.0,
        goal_postgres_over_before_at_1: 0.9,
    })
}

/// Measures one target at one concurrency once, and says so on stderr.
fn measure_point(
    args: &StoresArgs,
    worker: &Path,
    runtime: &tokio::runtime::Runtime,
    target: Target,
    concurrency: usize,
    label: &str,
) -> Point {
    eprintln!("bench: {label} ...");
    let measured = match target {
        Target::Pgbench => pgbench_point(args, concurrency),
        _ => http_point(args, worker, runtime, target, concurrency),
    };
    match measured {
        Ok(m) => {
            eprintln!(
                "bench: {label}: {:.0}/s, p50 {:.2} ms, p99 {:.2} ms, effects {} (store {}){}",
                m.throughput,
                m.p50_ms,
                m.p99_ms,
                m.effects,
                m.applied,
                m.check
                    .as_deref()
                    .map(|c| format!(", {c}"))
                    .unwrap_or_default()
            );
            Point {
                target,
                concurrency,
                rounds: vec![m.throughput],
                measured: Some(m),
                error: None,
                other_rounds: Vec::new(),
            }
        }
        Err(e) => {
            let error = format!("{e:#}");
            eprintln!("bench: {label}: {error}");
            Point {
                target,
                concurrency,
                measured: None,
                error: Some(error),
                rounds: Vec::new(),
                other_rounds: Vec::new(),
            }
        }
    }
}

/// The round with the median throughput (the lower middle of an even count), carrying
/// every round's throughput and what went wrong in the others, so that a mismatch in a
/// round not chosen still fails the run.
fn median_point(rounds: Vec<Point>) -> Option<Point> {
    let mut throughputs = Vec::new();
    let mut problems = Vec::new();
    let mut measured = Vec::new();
    let mut failed = None;
    for p in rounds {
        match &p.measured {
            Some(m) => {
                throughputs.push(m.throughput);
                measured.push(p);
            }
            None => {
                problems.push(p.error.clone().unwrap_or_default());
                failed.get_or_insert(p);
            }
        }
    }
    measured.sort_by(|a, b| throughput_of(a).total_cmp(&throughput_of(b)));
    let middle = measured.len().saturating_sub(1) / 2;
    let chosen = if measured.is_empty() {
        None
    } else {
        Some(measured.remove(middle))
    };
    for p in &measured {
        if let Some(c) = p.measured.as_ref().and_then(|m| m.check.clone()) {
            problems.push(c);
        }
    }
    let mut point = chosen.or(failed)?;
    point.rounds = throughputs;
    point.other_rounds = problems;
    Some(point)
}

fn throughput_of(p: &Point) -> f64 {
    p.measured.as_ref().map_or(0.0, |m| m.throughput)
}

fn workload(args: &StoresArgs) -> String {
    let accounts = if args.hot {
        format!("one hot account (of {})", args.accounts)
    } else {
        format!("{} accounts", args.accounts)
    };
    format!(
        "withdrawals of 1 from {accounts}, new keys, {:.0}% duplicates, {} per point",
        args.duplicates * 100.0,
        humantime(args.duration)
    )
}

fn humantime(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

fn throughput(points: &[Point], target: Target, concurrency: usize) -> Option<f64> {
    points
        .iter()
        .find(|p| p.target == target && p.concurrency == concurrency)
        .and_then(|p| p.measured.as_ref())
        .map(|m| m.throughput)
}

fn millis(micros: u32) -> f64 {
    f64::from(micros) / 1000.0
}

// ---------------------------------------------------------------------------------------
// The worker targets

/// Measures the worker on sled or PostgreSQL at one concurrency, from a fresh store.
fn http_point(
    args: &StoresArgs,
    exe: &Path,
    runtime: &tokio::runtime::Runtime,
    target: Target,
    concurrency: usize,
) -> Result<Measured> {
    let dir = tempfile::Builder::new()
        .prefix("idem-bench-")
        .tempdir()
        .context("creating a temporary folder")?;
    // Declared before the worker, so that it is dropped after it: the database goes
    // once no worker holds connections to it.
    let database = match target {
        Target::Sled => None,
        _ => Some(Database::create(&args.pg_url)?),
    };
    let pool = concurrency.max(16).to_string();
    let (exe, extra): (&Path, Vec<&str>) = match target {
        Target::PostgresSingle => (exe, vec!["--pg-group-max", "1", "--pg-lanes", &pool]),
        Target::PostgresBefore => (args.before.as_deref().unwrap_or(exe), Vec::new()),
        _ => (exe, Vec::new()),
    };
    let worker = WorkerProcess::start(
        exe,
        dir.path(),
        database.as_ref().map(|d| d.url.as_str()),
        concurrency,
        &extra,
    )?;
    let shape = Shape {
        accounts: args.accounts,
        replay_keys: 0,
        hot: args.hot,
    };
    runtime
        .block_on(load::seed(&worker.addr, SEED_CONNECTIONS, shape, DEPOSIT))
        .context("seeding the accounts")?;
    let before = last_seq(&worker.addr)?;
    let cpu_before = Cpu::now(Some(worker.pid()));
    let report = runtime.block_on(load::run(&RunConfig {
        addr: worker.addr.clone(),
        connections: concurrency,
        duration: args.duration,
        rate: None,
        mode: Mode::NewKey,
        tag: "b".to_owned(),
        shape,
        duplicates: args.duplicates,
    }))?;
    let (cpu_measured, cpu_other) = Cpu::now(Some(worker.pid())).since(&cpu_before);
    let after = last_seq(&worker.addr)?;
    worker.stop()?;
    drop(database);
    let throughput = report.rps();
    let effects_per_s = report.effects_per_second();
    let seconds = report.elapsed.as_secs_f64();
    let mut t = report.tally;
    let applied = after.saturating_sub(before);
    let other = t.other_status - t.in_flight;
    let check = if t.errors > 0 {
        // A request without an answer may still have executed: the load's count is then
        // a lower bound, and only the store's count is exact.
        Some(format!(
            "{} transport errors (first: {}): effects seen are a lower bound",
            t.errors,
            t.first_error.as_deref().unwrap_or("?")
        ))
    } else if t.first != applied {
        Some(format!(
            "MISMATCH: the load saw {} first executions, the store applied {applied}",
            t.first
        ))
    } else if other == 0 && t.first != t.keys {
        Some(format!(
            "MISMATCH: {} distinct keys sent, {} executed",
            t.keys, t.first
        ))
    } else if other > 0 {
        Some(format!("{other} answers other than 201 and 409"))
    } else {
        None
    };
    Ok(Measured {
        seconds,
        requests: t.latencies.len(),
        throughput,
        effects_per_s,
        p50_ms: millis(t.latencies.percentile(500)),
        p99_ms: millis(t.latencies.percentile(990)),
        effects: t.first,
        applied,
        keys: Some(t.keys),
        duplicates: t.duplicates,
        replayed: t.replayed,
        in_flight: t.in_flight,
        other,
        errors: t.errors,
        check,
        cpu_measured,
        cpu_other,
    })
}

/// The worker's `idem_last_seq` from /metrics: the sequence number of its last durable
/// fact, so the difference over a run is the facts (effects) the run caused.
fn last_seq(addr: &str) -> Result<u64> {
    let url = format!("http://{addr}/metrics");
    let mut response = ureq::get(&url)
        .call()
        .with_context(|| format!("reading {url}"))?;
    let text = response.body_mut().read_to_string()?;
    text.lines()
        .find_map(|l| l.strip_prefix("idem_last_seq "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow!("no idem_last_seq in {url}"))
}

/// A worker process on a free loopback port, stopped with SIGTERM.
struct WorkerProcess {
    child: Option<Child>,
    addr: String,
    log: PathBuf,
}

impl WorkerProcess {
    fn start(
        exe: &Path,
        dir: &Path,
        store: Option<&str>,
        concurrency: usize,
        extra: &[&str],
    ) -> Result<WorkerProcess> {
        let log = dir.join("worker.log");
        let stderr = std::fs::File::create(&log)?;
        let mut command = Command::new(exe);
        command.arg("serve").args(["--listen", "127.0.0.1:0"]);
        match store {
            // Through the environment, so that a password in the URL stays out of `ps`.
            // As many PostgreSQL connections as pgbench gets at this concurrency (the
            // default pool of 16 would cap the worker below it), never fewer than 16.
            Some(url) => command
                .env("IDEM_STORE", url)
                .args(["--pg-pool", &concurrency.max(16).to_string()]),
            None => command
                .arg("--db")
                .arg(dir.join("ledger"))
                .env_remove("IDEM_STORE"),
        };
        let mut child = command
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no stdout from the worker"))?;
        let (tx, rx) = mpsc::channel();
        // Reads stdout to its end, so that the worker never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("listening on http://") {
                    let _ = tx.send(addr.trim().to_owned());
                }
            }
        });
        let mut worker = WorkerProcess {
            child: Some(child),
            addr: String::new(),
            log,
        };
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => {
                worker.addr = addr;
                Ok(worker)
            }
            Err(_) => {
                if let Some(mut child) = worker.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                bail!("the worker did not start: {}", worker.log_tail())
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The last lines of its stderr, for an error message.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(2)..].join(" / ");
        if tail.is_empty() {
            "(nothing on stderr)".to_owned()
        } else {
            tail
        }
    }

    /// SIGTERM, and waits (30 s at most) for a clean exit.
    fn stop(mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                bail!("the worker exited with {status}: {}", self.log_tail());
            }
            if !sent || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the worker did not stop on SIGTERM; killed it");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------
// PostgreSQL: fresh databases, psql, pgbench

/// A database `idem_bench_<random>` created for one point and dropped after it.
struct Database {
    admin_url: String,
    name: String,
    url: String,
}

impl Database {
    fn create(admin_url: &str) -> Result<Database> {
        let name = format!("idem_bench_{:08x}", rand::rng().random::<u32>());
        psql(admin_url, &format!("CREATE DATABASE {name}"))
            .with_context(|| format!("creating the database {name}"))?;
        Ok(Database {
            admin_url: admin_url.to_owned(),
            url: with_database(admin_url, &name)?,
            name,
        })
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        // FORCE ends whatever still holds a connection (a worker that was killed).
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        if let Err(e) = psql(&self.admin_url, &sql) {
            eprintln!("bench: could not drop the database {}: {e:#}", self.name);
        }
    }
}

/// `url` with its database (the path) replaced by `name`.
fn with_database(url: &str, name: &str) -> Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| anyhow!("--pg-url: expected postgres://user@host:port/database"))?;
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let authority = before_query.split('/').next().unwrap_or(before_query);
    let mut out = format!("{scheme}://{authority}/{name}");
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Ok(out)
}

/// Runs SQL through `psql` (the client pgbench comes with); answers its unaligned output.
fn psql(url: &str, sql: &str) -> Result<String> {
    let mut child = Command::new("psql")
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url])
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running psql (apt-get install postgresql-client)")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(sql.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "psql: {}",
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .replace('\n', " / ")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn count(url: &str, table: &str) -> Result<u64> {
    let text = psql(url, &format!("SELECT count(*) FROM {table}"))?;
    text.parse()
        .with_context(|| format!("counting {table}: {text:?}"))
}

/// The classic tables (its `idempotency_keys` verbatim; `accounts` and `ledger` with the
/// columns its transaction uses), and `accounts` rows 1..=N with the deposit.
fn schema(accounts: u64) -> String {
    format!(
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
INSERT INTO accounts SELECT g, {DEPOSIT} FROM generate_series(1, {accounts}) g;
CREATE TABLE idempotency_keys (
    key          TEXT PRIMARY KEY,
    request_hash TEXT NOT NULL,
    status       TEXT NOT NULL,
    response     JSONB,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE ledger (
    id              BIGSERIAL PRIMARY KEY,
    account_id      BIGINT NOT NULL,
    amount          BIGINT NOT NULL,
    idempotency_key TEXT NOT NULL
);
VACUUM ANALYZE;
"
    )
}

/// The classic transaction as a pgbench script: claim the key (INSERT … ON CONFLICT DO
/// NOTHING RETURNING), and only if the row came back, withdraw (guarded against going
/// negative), write the ledger row and mark the key done with its response; otherwise read
/// the stored response (the replay). `n` counts each client's transactions, so
/// `client_id * 10^9 + n` is a key no other transaction of the run uses; a duplicate
/// re-sends one of the client's last 64 keys. `\aset` leaves `claimed` alone when no row
/// comes back, so `claimed = n` holds exactly when this transaction inserted the key.
fn pgbench_script(hot: bool, duplicates: f64) -> String {
    let account = if hot {
        "\\set aid 1\n".to_owned()
    } else {
        "\\set aid random(1, :accounts)\n".to_owned()
    };
    // The ratio in parts per million, for pgbench's integer expressions; in 0..=10^6 by
    // the check on --duplicates, so the cast neither truncates nor wraps.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let ppm = (duplicates * 1_000_000.0).round() as u64;
    let duplicate = if ppm > 0 {
        format!(
            "\\set draw random(1, 1000000)\n\
             \\if :draw <= {ppm} and :n > 1\n\
             \\set key :client_id * 1000000000 + random(greatest(:n - 64, 1), :n - 1)\n\
             \\endif\n"
        )
    } else {
        String::new()
    };
    format!(
        "\\set n :n + 1
\\set key :client_id * 1000000000 + :n
{account}{duplicate}BEGIN;
INSERT INTO idempotency_keys (key, request_hash, status) VALUES (:key, 'h', 'in_progress') ON CONFLICT (key) DO NOTHING RETURNING CAST(:n AS bigint) AS claimed \\aset
\\if :claimed = :n
UPDATE accounts SET balance = balance - 1 WHERE id = :aid AND balance >= 1;
INSERT INTO ledger (account_id, amount, idempotency_key) VALUES (:aid, -1, :key);
UPDATE idempotency_keys SET status = 'done', response = '{{\"ok\": true}}' WHERE key = :key;
\\else
SELECT status, response FROM idempotency_keys WHERE key = :key;
\\endif
COMMIT;
"
    )
}

/// Runs pgbench with the classic transaction at one concurrency, on a fresh database.
fn pgbench_point(args: &StoresArgs, concurrency: usize) -> Result<Measured> {
    let dir = tempfile::Builder::new()
        .prefix("idem-pgbench-")
        .tempdir()
        .context("creating a temporary folder")?;
    let database = Database::create(&args.pg_url)?;
    psql(&database.url, &schema(args.accounts)).context("creating the classic tables")?;
    let script = dir.path().join("withdraw.sql");
    std::fs::write(&script, pgbench_script(args.hot, args.duplicates))?;
    let secs = args.duration.as_secs() + u64::from(args.duration.subsec_nanos() > 0);
    let secs = secs.max(1);
    let prefix = dir.path().join("tx");
    let cpu_before = Cpu::now(None);
    let out = Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-l"])
        .args(["-c", &concurrency.to_string()])
        // Two threads, as the HTTP load generator has; pgbench wants no more threads
        // than clients.
        .args(["-j", &concurrency.min(2).to_string()])
        .args(["-T", &secs.to_string()])
        .arg("-f")
        .arg(&script)
        .args(["-D", &format!("accounts={}", args.accounts)])
        .args(["-D", "n=0", "-D", "claimed=0"])
        .arg(format!("--log-prefix={}", prefix.display()))
        .arg(&database.url)
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .output()
        .context("running pgbench (apt-get install postgresql-client)")?;
    // pgbench has been waited for, so its CPU is in this process's children's time.
    let (cpu_measured, cpu_other) = Cpu::now(None).since(&cpu_before);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "pgbench failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .replace('\n', " / ")
        );
    }
    let field = |label: &str| -> Option<&str> {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(label))
            .map(str::trim)
    };
    let requests: u64 = field("number of transactions actually processed:")
        .and_then(|v| v.split_whitespace().next()?.split('/').next()?.parse().ok())
        .ok_or_else(|| anyhow!("no transaction count in pgbench's output:\n{stdout}"))?;
    let failed: u64 = field("number of failed transactions:")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let tps: f64 = field("tps =")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow!("no tps in pgbench's output:\n{stdout}"))?;
    let mut latencies = pgbench_latencies(dir.path())?;
    let effects = count(&database.url, "ledger")?;
    let keys = count(&database.url, "idempotency_keys")?;
    drop(database);
    // pgbench's tps leaves out connection time; effects per second are scaled the same
    // way so the two columns agree when every transaction executes.
    #[allow(clippy::cast_precision_loss)] // counts far below 2^53
    let effects_per_s = if requests > 0 {
        tps * effects as f64 / requests as f64
    } else {
        0.0
    };
    let check = (effects != keys).then(|| {
        format!("MISMATCH: {keys} keys claimed in idempotency_keys, {effects} ledger rows")
    });
    #[allow(clippy::cast_precision_loss)] // counts far below 2^53
    let seconds = if tps > 0.0 {
        requests as f64 / tps
    } else {
        0.0
    };
    Ok(Measured {
        seconds,
        requests,
        throughput: tps,
        effects_per_s,
        p50_ms: millis(latencies.percentile(500)),
        p99_ms: millis(latencies.percentile(990)),
        effects,
        applied: keys,
        keys: None,
        duplicates: 0,
        replayed: requests.saturating_sub(effects),
        in_flight: 0,
        other: failed,
        errors: 0,
        check,
        cpu_measured,
        cpu_other,
    })
}

/// Latencies from pgbench's per-transaction logs (`-l`): one file per thread, one line
/// per transaction, `client_id transaction_no time_us script_no epoch epoch_us`.
fn pgbench_latencies(dir: &Path) -> Result<load::Latencies> {
    let mut latencies = load::Latencies::default();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let is_log = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("tx."));
        if !is_log {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            if let Some(us) = line
                .split_whitespace()
                .nth(2)
                .and_then(|v| v.parse::<u64>().ok())
            {
                latencies.record(Duration::from_micros(us));
            }
        }
    }
    Ok(latencies)
}

// ---------------------------------------------------------------------------------------
// CPU accounting: the machine is shared (other builds run on it), so each point says how
// much CPU went to what it measures and how much to everything else.

/// Clock ticks per second of /proc's times: Linux reports them in USER_HZ, which is 100
/// on every architecture it runs on (sysconf(_SC_CLK_TCK) would say so, at the price of
/// an unsafe call).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time so far, in ticks: the whole machine's busy time, and the part of it spent
/// by what a point measures.
struct Cpu {
    at: Instant,
    machine: u64,
    measured: u64,
}

impl Cpu {
    /// `worker`: the worker process, when there is one. This process (the load generator
    /// and its waited-for children, pgbench among them) and every `postgres` process (with
    /// the reaped backends the postmaster accounts as its children) always count.
    fn now(worker: Option<u32>) -> Cpu {
        let machine = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|text| {
                let line = text.lines().find(|l| l.starts_with("cpu "))?;
                let f: Vec<u64> = line
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|v| v.parse().ok())
                    .collect();
                // user nice system idle iowait irq softirq steal: all but idle and iowait.
                Some([0, 1, 2, 5, 6, 7].iter().filter_map(|&i| f.get(i)).sum())
            })
            .unwrap_or(0);
        let mut measured = proc_ticks("self").map_or(0, |(_, t)| t);
        if let Some(pid) = worker {
            measured += proc_ticks(&pid.to_string()).map_or(0, |(_, t)| t);
        }
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                else {
                    continue;
                };
                if let Some((comm, ticks)) = proc_ticks(pid)
                    && comm == "postgres"
                {
                    measured += ticks;
                }
            }
        }
        Cpu {
            at: Instant::now(),
            machine,
            measured,
        }
    }

    /// Cores busy since `before`: (with what is measured, with everything else).
    fn since(&self, before: &Cpu) -> (f64, f64) {
        let secs = self.at.duration_since(before.at).as_secs_f64().max(1e-3);
        #[allow(clippy::cast_precision_loss)] // tick counts far below 2^53
        let cores = |ticks: u64| ticks as f64 / TICKS_PER_SECOND / secs;
        let machine = self.machine.saturating_sub(before.machine);
        let measured = self.measured.saturating_sub(before.measured);
        (cores(measured), cores(machine.saturating_sub(measured)))
    }
}

/// A process's name and its CPU ticks with its reaped children's (utime + stime + cutime
/// + cstime), from /proc/PID/stat.
fn proc_ticks(pid: &str) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name is in parentheses and may hold spaces: the fields start after the last ')'.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // Fields 14 to 17 of proc(5), counting from the pid as 1; here the state (3) is at 0.
    let ticks = (11..=14)
        .filter_map(|i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Some((comm, ticks))
}

// ---------------------------------------------------------------------------------------
// Output

/// The table printed on stdout and written to table.md.
pub fn render_table(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## idem-bench stores: {}\n", r.workload);
    let _ = writeln!(
        s,
        "{} CPUs, load average at start {}; load generator: {} threads on the same machine. \
         CPU columns: cores busy during the measurement with what is measured (worker, \
         generator, PostgreSQL, pgbench) and with everything else (a high value marks a \
         disturbed point).\n",
        r.cpus, r.load_average_at_start, r.generator_threads
    );
    let _ = writeln!(
        s,
        "| target | conc | throughput/s | effects/s | p50 ms | p99 ms | effects | store applied | CPU measured | CPU other | note |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for p in &r.points {
        match (&p.measured, &p.error) {
            (Some(m), _) => {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {} | {} | {:.2} | {:.2} | {} |",
                    p.target.name(),
                    p.concurrency,
                    m.throughput,
                    m.effects_per_s,
                    m.p50_ms,
                    m.p99_ms,
                    m.effects,
                    m.applied,
                    m.cpu_measured,
                    m.cpu_other,
                    note(p, m)
                );
            }
            (None, error) => {
                let _ = writeln!(
                    s,
                    "| {} | {} | – | – | – | – | – | – | – | – | error: {} |",
                    p.target.name(),
                    p.concurrency,
                    error.as_deref().unwrap_or("?").replace('|', "/")
                );
            }
        }
    }
    let _ = writeln!(
        s,
        "\n| conc | sled / postgres | postgres / pgbench | sled / pgbench | postgres / postgres-single | postgres / postgres-before | p99 postgres / pgbench |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|");
    let x = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}×"));
    for q in &r.ratios {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            q.concurrency,
            x(q.sled_over_postgres),
            x(q.postgres_over_pgbench),
            x(q.sled_over_pgbench),
            x(q.postgres_over_single),
            x(q.postgres_over_before),
            x(q.postgres_p99_over_pgbench)
        );
    }
    let goal = |v: Option<f64>, at_least: f64| match v {
        Some(v) if v >= at_least => format!("{v:.2}×, met"),
        Some(v) => format!("{v:.2}×, missed"),
        None => "not measured".to_owned(),
    };
    let at64 = r.ratios.iter().find(|q| q.concurrency == 64);
    let at1 = r.ratios.iter().find(|q| q.concurrency == 1);
    let _ = writeln!(s, "\nGoals:");
    let _ = writeln!(
        s,
        "- postgres ≥ {}× pgbench at 64 connections ({}): {}",
        r.goal_postgres_over_pgbench,
        if r.hot {
            "one hot account"
        } else {
            "many accounts"
        },
        goal(
            at64.and_then(|q| q.postgres_over_pgbench),
            r.goal_postgres_over_pgbench
        )
    );
    let _ = writeln!(
        s,
        "- postgres p99 ≤ pgbench p99 at 64 connections: {}",
        match at64.and_then(|q| q.postgres_p99_over_pgbench) {
            Some(v) if v <= 1.0 => format!("{v:.2}×, met"),
            Some(v) => format!("{v:.2}×, missed"),
            None => "not measured".to_owned(),
        }
    );
    let _ = writeln!(
        s,
        "- postgres ≥ {}× postgres-before at 1 connection: {}",
        r.goal_postgres_over_before_at_1,
        goal(
            at1.and_then(|q| q.postgres_over_before),
            r.goal_postgres_over_before_at_1
        )
    );
    s
}

fn note(p: &Point, m: &Measured) -> String {
    let mut parts = Vec::new();
    if p.rounds.len() > 1 {
        let all: Vec<String> = p.rounds.iter().map(|t| format!("{t:.0}")).collect();
        parts.push(format!("median of {}/s", all.join(", ")));
    }
    parts.extend(p.other_rounds.iter().map(|c| format!("another round: {c}")));
    if m.duplicates > 0 {
        parts.push(format!("{} duplicates", m.duplicates));
    }
    if m.replayed > 0 {
        parts.push(format!("{} replayed", m.replayed));
    }
    if m.in_flight > 0 {
        parts.push(format!("{} × 409", m.in_flight));
    }
    if let Some(c) = &m.check {
        parts.push(c.replace('|', "/"));
    }
    parts.join("; ")
}

/// Writes throughput against concurrency (log scale), one line per target.
pub fn plot(r: &Results, path: &Path) -> Result<()> {
    use plotters::prelude::*;

    let series: Vec<(Target, Vec<(f64, f64)>)> = [
        Target::Sled,
        Target::Postgres,
        Target::PostgresSingle,
        Target::PostgresBefore,
        Target::Pgbench,
    ]
    .into_iter()
    .map(|t| {
        let points = r
            .points
            .iter()
            .filter(|p| p.target == t)
            .filter_map(|p| {
                #[allow(clippy::cast_precision_loss)] // a concurrency is small
                let c = p.concurrency as f64;
                p.measured.as_ref().map(|m| (c, m.throughput))
            })
            .collect();
        (t, points)
    })
    .collect();
    #[allow(clippy::cast_precision_loss)] // a concurrency is small
    let concurrencies: Vec<f64> = {
        let mut c: Vec<usize> = r.points.iter().map(|p| p.concurrency).collect();
        c.sort_unstable();
        c.dedup();
        c.into_iter().map(|c| c as f64).collect()
    };
    // A little room either side of the measured concurrencies, on the log scale.
    let x_min = concurrencies
        .iter()
        .copied()
        .fold(f64::MAX, f64::min)
        .max(1.0)
        / 1.25;
    let x_max = concurrencies.iter().copied().fold(2.0, f64::max) * 1.25;
    let y_max = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|&(_, y)| y))
        .fold(1.0, f64::max)
        * 1.1;
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("Idem: {}", r.workload), ("sans-serif", 16))
            .margin(20)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (x_min..x_max)
                    .log_scale()
                    .with_key_points(concurrencies.clone()),
                0.0..y_max,
            )?;
        chart
            .configure_mesh()
            .x_desc("concurrency (HTTP connections / pgbench clients)")
            .y_desc("throughput per second")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        let colors = [
            RGBColor(0x1f, 0x77, 0xb4),
            RGBColor(0xd6, 0x27, 0x28),
            RGBColor(0xff, 0x7f, 0x0e),
            RGBColor(0x94, 0x67, 0xbd),
            RGBColor(0x2c, 0xa0, 0x2c),
        ];
        for ((target, points), color) in series.iter().zip(colors) {
            if points.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(target.name())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart.draw_series(
                points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.9))
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow!("drawing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_database_of_a_url() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "x").unwrap(),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://u:p@h/db?sslmode=disable", "x").unwrap(),
            "postgres://u:p@h/x?sslmode=disable"
        );
        assert_eq!(
            with_database("postgresql://h:5433", "x").unwrap(),
            "postgresql://h:5433/x"
        );
        assert!(with_database("host=h dbname=d", "x").is_err());
    }

    #[test]
    fn the_script_branches_on_the_claim() {
        let s = pgbench_script(true, 0.0);
        assert!(s.contains("\\set aid 1\n"));
        assert!(!s.contains("draw"));
        let s = pgbench_script(false, 0.25);
        assert!(s.contains("random(1, :accounts)"));
        assert!(s.contains(":draw <= 250000"));
        assert!(s.contains("\\aset\n\\if :claimed = :n\n"));
    }

    fn round(throughput: f64, check: Option<&str>) -> Point {
        Point {
            target: Target::Postgres,
            concurrency: 64,
            measured: Some(Measured {
                seconds: 1.0,
                requests: 1,
                throughput,
                effects_per_s: throughput,
                p50_ms: 1.0,
                p99_ms: 1.0,
                effects: 1,
                applied: 1,
                keys: None,
                duplicates: 0,
                replayed: 0,
                in_flight: 0,
                other: 0,
                errors: 0,
                check: check.map(str::to_owned),
                cpu_measured: 1.0,
                cpu_other: 0.0,
            }),
            error: None,
            rounds: vec![throughput],
            other_rounds: Vec::new(),
        }
    }

    #[test]
    fn a_point_is_its_median_round_and_keeps_the_others_problems() {
        let failed = Point {
            measured: None,
            error: Some("worker did not start".into()),
            rounds: Vec::new(),
            ..round(0.0, None)
        };
        let p = median_point(vec![
            round(300.0, None),
            round(100.0, Some("MISMATCH: 5 effects, store 4")),
            failed,
            round(200.0, None),
        ])
        .unwrap();
        assert_eq!(throughput_of(&p), 200.0);
        assert_eq!(p.rounds, vec![300.0, 100.0, 200.0]);
        assert_eq!(
            p.other_rounds,
            vec![
                "worker did not start".to_owned(),
                "MISMATCH: 5 effects, store 4".to_owned()
            ]
        );
        let only = median_point(vec![round(50.0, None)]).unwrap();
        assert_eq!((throughput_of(&only), only.rounds.len()), (50.0, 1));
        let none = median_point(vec![Point {
            measured: None,
            error: Some("no pgbench".into()),
            ..round(0.0, None)
        }])
        .unwrap();
        assert_eq!(none.error.as_deref(), Some("no pgbench"));
        assert!(none.rounds.is_empty());
    }
}
