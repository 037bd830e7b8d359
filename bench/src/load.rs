//! The HTTP load engine behind `idem-bench load` and `idem-bench stores`: one engine, so that
//! every figure the project publishes about the worker over HTTP comes from the same code.
//!
//! - [`seed`]: deposits into the accounts a run will withdraw from, and executes the
//!   replay keys once.
//! - [`run`]: keep-alive HTTP/1.1 connections (hyper's client connection, no pool), each
//!   with one request in flight; as fast as possible, or at a fixed total rate. With a
//!   rate, every request has a scheduled send time (on a 1 ms grid, see `pace`) and its
//!   latency is measured from that time, not from the moment it was actually sent, so a
//!   stall in the server is not hidden by the generator waiting for it (no coordinated
//!   omission). The latency from the actual send and the send's lag behind the schedule
//!   are reported beside it, so that a late generator can be told from a slow server.
//!
//! A run stops issuing at the deadline and waits for the requests in flight, so `first`
//! (201 answers without `Idempotent-Replayed`) counts every effect the run caused.
//!
//! Every request is a withdrawal of 1 minor unit (RUB) from `acct-N`: from one of
//! `accounts` accounts, or always `acct-0` with [`Shape::hot`], which puts every command
//! on one balance (the case where a database serialises on one row lock).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::Request;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::net::TcpStream;

/// What a run sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// POST /v1/withdrawals with a fresh Idempotency-Key every request (or, with
    /// duplicates, an earlier key of the run again).
    NewKey,
    /// POST /v1/withdrawals with the keys and bodies `seed` wrote: every answer a 201 replay.
    Replay,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::NewKey => "new-key",
            Mode::Replay => "replay",
        }
    }
}

/// The accounts and replay keys a seed and a run share.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Accounts `acct-0` .. `acct-(accounts-1)`.
    pub accounts: u64,
    /// Replay keys `rp-0` .. `rp-(replay_keys-1)`.
    pub replay_keys: u64,
    /// Every withdrawal on `acct-0`.
    pub hot: bool,
}

impl Shape {
    /// The account of the `i`-th command.
    pub fn account(&self, i: u64) -> u64 {
        if self.hot {
            0
        } else {
            i % self.accounts.max(1)
        }
    }

    /// How many accounts withdrawals touch (and so need a deposit).
    pub fn used_accounts(&self) -> u64 {
        if self.hot { 1 } else { self.accounts.max(1) }
    }
}

/// One request to make. Cheap to clone: a duplicate is a clone of an earlier call.
#[derive(Clone, Debug)]
pub struct Call {
    pub path: &'static str,
    pub key: String,
    pub body: Bytes,
}

/// A withdrawal of 1 RUB from `acct-{account}` under `key`.
pub fn withdrawal(key: String, account: u64) -> Call {
    Call {
        path: "/v1/withdrawals",
        key,
        body: Bytes::from(format!(
            r#"{{"account":"acct-{account}","amount":1,"currency":"RUB"}}"#
        )),
    }
}

/// A deposit of `amount` into `acct-{account}`, under a key named after the account.
pub fn deposit(account: u64, amount: u64) -> Call {
    Call {
        path: "/v1/deposits",
        key: format!("dep-acct-{account}"),
        body: Bytes::from(format!(
            r#"{{"account":"acct-{account}","amount":{amount},"currency":"RUB"}}"#
        )),
    }
}

/// Latencies in microseconds, one per answered request; percentiles are exact (nearest
/// rank on the sorted samples), which a 10 s run at tens of thousands per second affords.
#[derive(Clone, Debug, Default)]
pub struct Latencies {
    micros: Vec<u32>,
    sorted: bool,
}

impl Latencies {
    pub fn record(&mut self, d: Duration) {
        self.micros
            .push(u32::try_from(d.as_micros()).unwrap_or(u32::MAX));
        self.sorted = false;
    }

    pub fn extend(&mut self, other: Latencies) {
        self.micros.extend(other.micros);
        self.sorted = false;
    }

    pub fn len(&self) -> u64 {
        self.micros.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.micros.is_empty()
    }

    fn sort(&mut self) {
        if !self.sorted {
            self.micros.sort_unstable();
            self.sorted = true;
        }
    }

    /// The `per_mille`-th per-mille (500 = median, 990 = p99), 0 without samples.
    pub fn percentile(&mut self, per_mille: u64) -> u32 {
        self.sort();
        let len = self.len();
        if len == 0 {
            return 0;
        }
        let rank = (len * per_mille).div_ceil(1000).clamp(1, len) - 1;
        usize::try_from(rank)
            .ok()
            .and_then(|r| self.micros.get(r).copied())
            .unwrap_or(0)
    }

    pub fn max(&mut self) -> u32 {
        self.sort();
        self.micros.last().copied().unwrap_or(0)
    }
}

/// What a run (or one of its connections) saw.
#[derive(Debug, Default)]
pub struct Tally {
    pub latencies: Latencies,
    /// The same answers' latencies from the moment each request was actually sent.
    pub from_send: Latencies,
    /// With a rate: how late each request was sent after its scheduled time (the
    /// generator's timer, or the connection still busy with the previous answer).
    pub send_lag: Latencies,
    /// 201 without `Idempotent-Replayed`: first executions, one per effect.
    pub first: u64,
    /// 201 with `Idempotent-Replayed`.
    pub replayed: u64,
    /// 409: a duplicate that found its twin still in flight.
    pub in_flight: u64,
    /// Any other status (409s included in this count too, as before).
    pub other_status: u64,
    /// Transport failures (no answer).
    pub errors: u64,
    pub first_error: Option<String>,
    /// Distinct new keys this run sent (each at least once).
    pub keys: u64,
    /// Requests that re-sent an earlier key of the run.
    pub duplicates: u64,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.latencies.extend(other.latencies);
        self.from_send.extend(other.from_send);
        self.send_lag.extend(other.send_lag);
        self.first += other.first;
        self.replayed += other.replayed;
        self.in_flight += other.in_flight;
        self.other_status += other.other_status;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.keys += other.keys;
        self.duplicates += other.duplicates;
    }

    fn record(&mut self, answer: Result<(u16, bool)>, scheduled: Instant, sent: Instant) {
        let latency = scheduled.elapsed();
        match answer {
            Ok((status, replayed)) => {
                self.latencies.record(latency);
                self.from_send.record(sent.elapsed());
                self.send_lag
                    .record(sent.saturating_duration_since(scheduled));
                match (status, replayed) {
                    (201, false) => self.first += 1,
                    (201, true) => self.replayed += 1,
                    (409, _) => {
                        self.in_flight += 1;
                        self.other_status += 1;
                    }
                    _ => self.other_status += 1,
                }
            }
            Err(e) => {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(format!("{e:#}"));
                }
            }
        }
    }
}

/// One keep-alive connection with one request in flight at a time.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    host: String,
}

impl Conn {
    pub async fn open(addr: &str) -> Result<Conn> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // The connection's end (the server closing it) shows up as an error on the
            // next send, where it is counted.
            let _ = connection.await;
        });
        Ok(Conn {
            sender,
            host: addr.to_owned(),
        })
    }

    /// Sends one call; answers (status, replayed).
    pub async fn send(&mut self, call: &Call) -> Result<(u16, bool)> {
        self.sender.ready().await?;
        let request = Request::post(call.path)
            .header("host", &self.host)
            .header("idempotency-key", &call.key)
            .header("content-type", "application/json")
            .body(Full::new(call.body.clone()))?;
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        let replayed = response.headers().contains_key("idempotent-replayed");
        response.into_body().collect().await?;
        Ok((status, replayed))
    }
}

/// Deposits `deposit` into every account withdrawals will touch, then executes every
/// replay key once, over `connections` connections. Fails unless every answer is a 201.
pub async fn seed(addr: &str, connections: usize, shape: Shape, deposit_each: u64) -> Result<()> {
    let deposits: Vec<Call> = (0..shape.used_accounts())
        .map(|a| deposit(a, deposit_each))
        .collect();
    // Deposits first, so that no seeded withdrawal finds its account missing.
    run_calls(addr, connections, deposits).await?;
    let withdrawals: Vec<Call> = (0..shape.replay_keys)
        .map(|i| withdrawal(format!("rp-{i}"), shape.account(i)))
        .collect();
    run_calls(addr, connections, withdrawals).await
}

/// Runs every call once over the connections; fails unless every answer is a 201.
async fn run_calls(addr: &str, connections: usize, calls: Vec<Call>) -> Result<()> {
    let connections = connections.max(1);
    let mut shares: Vec<Vec<Call>> = (0..connections).map(|_| Vec::new()).collect();
    for (i, call) in calls.into_iter().enumerate() {
        shares[i % connections].push(call);
    }
    let mut tasks = Vec::new();
    for share in shares.into_iter().filter(|s| !s.is_empty()) {
        let addr = addr.to_owned();
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

/// A measured run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The worker, host:port.
    pub addr: String,
    /// Keep-alive connections, one request in flight on each.
    pub connections: usize,
    pub duration: Duration,
    /// Total requests per second over all connections; `None` = as fast as possible.
    pub rate: Option<u32>,
    pub mode: Mode,
    /// Prefix of new keys; unique per run on one ledger.
    pub tag: String,
    pub shape: Shape,
    /// The fraction of new-key requests (0.0 to 1.0) that re-send an earlier key of the
    /// run with its body instead of a new one.
    pub duplicates: f64,
}

/// What a run measured.
#[derive(Debug)]
pub struct Report {
    pub mode: Mode,
    pub connections: usize,
    pub rate: Option<u32>,
    /// From the start of the run to the last answer (at least the duration).
    pub elapsed: Duration,
    pub tally: Tally,
}

impl Report {
    /// Answered requests per second.
    pub fn rps(&self) -> f64 {
        per_second(self.tally.latencies.len(), self.elapsed)
    }

    /// First executions (effects) per second.
    pub fn effects_per_second(&self) -> f64 {
        per_second(self.tally.first, self.elapsed)
    }

    /// The `key=value` lines `idem-bench load run` prints (bench/http/run.sh reads them).
    pub fn write_kv(&mut self, out: &mut dyn Write) -> std::io::Result<()> {
        let rate = self
            .rate
            .map_or_else(|| "max".to_owned(), |r| r.to_string());
        let rps = self.rps();
        let t = &mut self.tally;
        writeln!(out, "kind={}", self.mode.name())?;
        writeln!(out, "connections={}", self.connections)?;
        writeln!(out, "rate={rate}")?;
        writeln!(out, "seconds={:.2}", self.elapsed.as_secs_f64())?;
        writeln!(out, "requests={}", t.latencies.len())?;
        writeln!(out, "rps={rps:.0}")?;
        for (name, per_mille) in [("p50", 500), ("p90", 900), ("p99", 990), ("p999", 999)] {
            writeln!(out, "{name}_us={}", t.latencies.percentile(per_mille))?;
        }
        writeln!(out, "max_us={}", t.latencies.max())?;
        for (name, per_mille) in [("p50", 500), ("p99", 990)] {
            writeln!(
                out,
                "{name}_from_send_us={}",
                t.from_send.percentile(per_mille)
            )?;
            writeln!(
                out,
                "{name}_send_lag_us={}",
                t.send_lag.percentile(per_mille)
            )?;
        }
        writeln!(out, "first={}", t.first)?;
        writeln!(out, "replayed={}", t.replayed)?;
        writeln!(out, "in_flight={}", t.in_flight)?;
        writeln!(out, "non201={}", t.other_status)?;
        writeln!(out, "errors={}", t.errors)?;
        writeln!(out, "keys={}", t.keys)?;
        writeln!(out, "duplicates={}", t.duplicates)?;
        Ok(())
    }
}

/// `count / elapsed`; a count beyond 2^53 would lose precision, far past any run.
#[allow(clippy::cast_precision_loss)]
pub fn per_second(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 { count as f64 / secs } else { 0.0 }
}

/// Recent calls of the run, shared by its connections: duplicates are drawn from here.
/// The window is a few times the connections, so that some duplicates find their twin
/// still in flight on another connection (the concurrent case) and most find it done
/// (the replay case).
struct Recent {
    calls: Mutex<VecDeque<Call>>,
    window: usize,
}

impl Recent {
    fn push(&self, call: &Call) {
        // A poisoned lock means another connection panicked; the run fails there.
        if let Ok(mut calls) = self.calls.lock() {
            if calls.len() == self.window {
                calls.pop_front();
            }
            calls.push_back(call.clone());
        }
    }

    fn pick(&self, rng: &mut StdRng) -> Option<Call> {
        let calls = self.calls.lock().ok()?;
        if calls.is_empty() {
            return None;
        }
        calls.get(rng.random_range(0..calls.len())).cloned()
    }
}

/// The fixed-rate schedule, on a grid of one millisecond: the k-th request of the run is
/// released at the first tick at or after `start + k / rate`, on connection
/// `k % connections`, and its latency is measured from that tick. A thread of its own
/// sleeps to each tick (to within the operating system's sleep precision, about 0.1 ms
/// here) and releases what is due; the connection's task sends it as soon as it is free.
///
/// Sleeping in each task instead (tokio's timers, which round up to the next millisecond)
/// sent each request up to a millisecond after the time its latency was measured from:
/// about 0.9 ms added to every figure, none of it the server's. Releasing each request
/// at its exact time instead woke this thread 10,000 times a second on the two cores
/// the worker shares, disturbing what it measures more than the grid does.
fn pace(
    rate: u32,
    connections: usize,
    start: Instant,
    end: Instant,
) -> Result<Vec<tokio::sync::mpsc::UnboundedReceiver<Instant>>> {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..connections.max(1))
        .map(|_| tokio::sync::mpsc::unbounded_channel())
        .unzip();
    std::thread::Builder::new()
        .name("load-pacer".into())
        .spawn(move || {
            let mut k: u64 = 0;
            for tick in 0u32.. {
                let at = start + Duration::from_millis(u64::from(tick));
                if at >= end {
                    break;
                }
                let now = Instant::now();
                if at > now {
                    std::thread::sleep(at - now);
                }
                while k < released_by(tick, rate) {
                    let index = usize::try_from(k % senders.len() as u64).unwrap_or(0);
                    if let Some(tx) = senders.get(index) {
                        // A connection whose task ended (its server went away) drops it.
                        let _ = tx.send(at);
                    }
                    k += 1;
                }
            }
            // Dropping the senders ends every connection's schedule.
        })
        .context("starting the pacer thread")?;
    Ok(receivers)
}

/// How many requests the fixed-rate schedule has released by its tick `tick` (ms from the
/// start): every k with k / rate <= tick ms, that is k * 1000 <= tick * rate. The disk's
/// floor (`idem-bench sync`) releases its arrivals on the same grid, so that it sees the
/// worker's bursts.
pub(crate) fn released_by(tick: u32, rate: u32) -> u64 {
    u64::from(tick) * u64::from(rate) / 1000 + 1
}

/// Connection `index`'s `n`-th call of a run without duplicates.
fn next_call(config: &RunConfig, index: usize, n: u64) -> Call {
    let index = index as u64;
    let shape = config.shape;
    match config.mode {
        Mode::NewKey => withdrawal(
            format!("{}-{index}-{n}", config.tag),
            shape.account(index.wrapping_mul(7).wrapping_add(n)),
        ),
        Mode::Replay => {
            // Each connection walks all the keys from its own offset, so the
            // connections spread over the key space (replays of a done key never
            // conflict, so an occasional overlap is harmless).
            let keys = shape.replay_keys.max(1);
            let i = (index.wrapping_mul(keys / 64 + 1).wrapping_add(n)) % keys;
            withdrawal(format!("rp-{i}"), shape.account(i))
        }
    }
}

/// Measures one run: opens the connections, sends until the deadline, waits for the
/// requests in flight.
pub async fn run(config: &RunConfig) -> Result<Report> {
    let connections = config.connections.max(1);
    if !(0.0..=1.0).contains(&config.duplicates) {
        bail!("the duplicate ratio must be between 0 and 1");
    }
    if config.mode == Mode::Replay && config.shape.replay_keys == 0 {
        bail!("a replay run needs seeded replay keys");
    }
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(Conn::open(&config.addr).await?);
    }
    let recent = Arc::new(Recent {
        calls: Mutex::new(VecDeque::new()),
        window: connections * 4,
    });
    let start = Instant::now() + Duration::from_millis(50);
    let end = start + config.duration;
    let mut schedules = match config.rate {
        Some(rate) => pace(rate, connections, start, end)?
            .into_iter()
            .map(Some)
            .collect(),
        None => (0..connections).map(|_| None).collect::<Vec<_>>(),
    };
    let mut tasks = Vec::with_capacity(connections);
    for (index, mut conn) in conns.into_iter().enumerate() {
        let config = config.clone();
        let recent = recent.clone();
        let mut schedule = schedules.get_mut(index).and_then(Option::take);
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut rng = StdRng::seed_from_u64(index as u64);
            tokio::time::sleep_until(start.into()).await;
            let mut n: u64 = 0;
            loop {
                let scheduled = match &mut schedule {
                    // The pacer closes the schedule at the deadline.
                    Some(due) => match due.recv().await {
                        Some(at) => at,
                        None => break,
                    },
                    None => {
                        let now = Instant::now();
                        if now >= end {
                            break;
                        }
                        now
                    }
                };
                let duplicate = config.mode == Mode::NewKey
                    && config.duplicates > 0.0
                    && rng.random_bool(config.duplicates);
                let call = match duplicate.then(|| recent.pick(&mut rng)).flatten() {
                    Some(call) => {
                        tally.duplicates += 1;
                        call
                    }
                    None => {
                        let call = next_call(&config, index, n);
                        if config.mode == Mode::NewKey {
                            tally.keys += 1;
                            if config.duplicates > 0.0 {
                                // Published before it is sent, so a duplicate may even
                                // overtake it: whichever arrives first executes.
                                recent.push(&call);
                            }
                        }
                        call
                    }
                };
                let sent = Instant::now();
                let answer = conn.send(&call).await;
                tally.record(answer, scheduled, sent);
                n += 1;
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for task in tasks {
        total.merge(task.await?);
    }
    let elapsed = start.elapsed().max(config.duration);
    Ok(Report {
        mode: config.mode,
        connections,
        rate: config.rate,
        elapsed,
        tally: total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pacer releases the k-th request at the first millisecond tick at or after
    /// k / rate, never before that tick, round-robin over the connections, and ends
    /// every schedule at the deadline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_pacer_releases_each_request_on_its_tick_and_never_early() {
        let (rate, connections, millis) = (7_000u32, 3usize, 40u64);
        let start = Instant::now() + Duration::from_millis(5);
        let end = start + Duration::from_millis(millis);
        let receivers = pace(rate, connections, start, end).unwrap();
        let mut per_connection = Vec::new();
        for mut rx in receivers {
            let mut got = Vec::new();
            while let Some(at) = rx.recv().await {
                got.push((at, Instant::now()));
            }
            per_connection.push(got);
        }
        // Request k went to connection k % 3 as its (k / 3)-th release.
        let total: usize = per_connection.iter().map(Vec::len).sum();
        // Every k with k * 1000 <= tick * rate for a tick before the deadline.
        let expected = usize::try_from((millis - 1) * u64::from(rate) / 1000 + 1).unwrap();
        assert_eq!(total, expected);
        for k in 0..total {
            let (at, received) = per_connection[k % connections][k / connections];
            let tick = at.duration_since(start).as_micros();
            assert_eq!(tick % 1000, 0, "request {k} is scheduled off the grid");
            let tick_ms = u64::try_from(tick / 1000).unwrap();
            let k = u64::try_from(k).unwrap();
            // The first tick at or after k / rate.
            assert!(
                k * 1000 <= tick_ms * u64::from(rate),
                "request {k} released early"
            );
            assert!(
                tick_ms == 0 || k * 1000 > (tick_ms - 1) * u64::from(rate),
                "request {k} held back a tick"
            );
            assert!(received >= at, "request {k} arrived before its tick");
        }
    }
}
