//! The crash loop on the real binary. One ledger folder, N cycles; each cycle starts
//! `inbox-worker serve` (one cycle in five is first killed while it starts), replays what
//! the clients were answered before, runs load from four client threads for a random
//! 100–400 ms (about 30 % repeats of earlier keys, and pairs of threads sending one key at
//! once), and SIGKILLs the worker. Every answer a client saw (201, or 422 with its body)
//! must come back byte for byte, marked as a replay; a key is executed at most once; at
//! the end `verify` passes and the log holds one fact per answered key and none for a key
//! nobody sent.
//!
//! `IDEM_WORKER_CRASH_CYCLES` sets the number of cycles (50), `SEED` the schedule (7).

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::support::{Http, Reply, Worker, run, scratch, signal, spawn_serve};

const CLIENTS: u64 = 4;
/// Older answers replayed after each restart, besides all of the previous cycle's.
const SAMPLE: usize = 100;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// SplitMix64: key `i`'s command is a pure function of the RNG seed and `i`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Key `i` and its one command (path and body): a repeat of a key is always a retry,
/// never a reuse. Deposits and withdrawals over three accounts; withdrawals are often
/// refused (`insufficient_funds`, `account_not_found`), which are answers like any other.
struct Workload {
    seed: u64,
}

impl Workload {
    fn key(&self, i: u64) -> String {
        format!("s{}-k{i}", self.seed)
    }

    fn command(&self, i: u64) -> (&'static str, String) {
        let m = mix(self.seed.wrapping_mul(1_000_003) ^ i);
        let account = m % 3;
        let amount = 1 + (m >> 8) % 400;
        let path = if (m >> 32) % 5 < 2 {
            "/v1/deposits"
        } else {
            "/v1/withdrawals"
        };
        let body = format!(r#"{{"account":"acct{account}","amount":{amount},"currency":"RUB"}}"#);
        (path, body)
    }

    fn send(&self, http: &Http, i: u64) -> Result<Reply, ureq::Error> {
        let (path, body) = self.command(i);
        http.try_post(path, Some(&self.key(i)), &body)
    }
}

/// The first answer seen for a key.
struct Answer {
    status: u16,
    body: String,
    cycle: u64,
}

#[derive(Default)]
struct Book {
    answers: HashMap<u64, Answer>,
    /// Keys answered without `Idempotent-Replayed`: executed by that request.
    executed: HashSet<u64>,
    total: u64,
    first_executions: u64,
    replays: u64,
    conflicts: u64,
    cut: u64,
    violations: Vec<String>,
}

impl Book {
    /// Records what a request for key `i` got back, and checks it against what earlier
    /// requests for the key got.
    fn record(&mut self, w: &Workload, i: u64, cycle: u64, got: Result<Reply, ureq::Error>) {
        let key = w.key(i);
        let r = match got {
            // Cut by the kill (or refused by a dead worker): not an answer.
            Err(_) => {
                self.cut += 1;
                return;
            }
            Ok(r) => r,
        };
        match r.status {
            409 => {
                self.conflicts += 1;
                return;
            }
            201 | 422 if !r.body.contains("idempotency_key_reused") => {}
            _ => {
                self.violations.push(format!(
                    "cycle {cycle}: {key} answered {} {}",
                    r.status, r.body
                ));
                return;
            }
        }
        self.total += 1;
        if r.replayed {
            self.replays += 1;
        } else {
            self.first_executions += 1;
            if !self.executed.insert(i) {
                self.violations.push(format!(
                    "cycle {cycle}: {key} was executed twice; second answer {} {}",
                    r.status, r.body
                ));
            }
        }
        match self.answers.get(&i) {
            None => {
                self.answers.insert(
                    i,
                    Answer {
                        status: r.status,
                        body: r.body,
                        cycle,
                    },
                );
            }
            Some(a) if (a.status, a.body.as_str()) == (r.status, r.body.as_str()) => {}
            Some(a) => self.violations.push(format!(
                "cycle {cycle}: {key} first answered {} {} (cycle {}), now {} {}",
                a.status, a.body, a.cycle, r.status, r.body
            )),
        }
    }
}

/// Load from `CLIENTS` threads until `stop`: new keys, repeats of earlier keys (about
/// 30 %, half of them among the newest), and pairs of threads sending one new key at once.
fn load(
    w: &Workload,
    http: &Http,
    seed: u64,
    cycle: u64,
    next: &AtomicU64,
    stop: &AtomicBool,
    book: &Mutex<Book>,
) {
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(mix(seed ^ (cycle << 8) ^ c));
                while !stop.load(Ordering::Relaxed) {
                    let roll = rng.random_range(0..100);
                    let issued = next.load(Ordering::Relaxed);
                    if roll < 30 && issued > 0 {
                        let i = if rng.random_bool(0.5) {
                            issued - 1 - rng.random_range(0..issued.min(32))
                        } else {
                            rng.random_range(0..issued)
                        };
                        let got = w.send(http, i);
                        book.lock().unwrap().record(w, i, cycle, got);
                    } else if roll < 40 {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let barrier = Barrier::new(2);
                        let twin = std::thread::scope(|s| {
                            let t = s.spawn(|| {
                                barrier.wait();
                                w.send(http, i)
                            });
                            barrier.wait();
                            let mine = w.send(http, i);
                            (mine, t.join().unwrap())
                        });
                        let mut b = book.lock().unwrap();
                        b.record(w, i, cycle, twin.0);
                        b.record(w, i, cycle, twin.1);
                    } else {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let got = w.send(http, i);
                        book.lock().unwrap().record(w, i, cycle, got);
                    }
                }
            });
        }
    });
}

/// Replays `keys` against a fresh worker from `CLIENTS` threads: each must get its
/// recorded answer, byte for byte, marked as a replay.
fn check_replays(w: &Workload, http: &Http, book: &Book, keys: &[u64], when: &str) -> usize {
    let failures = Mutex::new(Vec::new());
    let chunk = keys
        .len()
        .div_ceil(usize::try_from(CLIENTS).unwrap())
        .max(1);
    std::thread::scope(|s| {
        for part in keys.chunks(chunk) {
            let failures = &failures;
            s.spawn(move || {
                for &i in part {
                    let first = &book.answers[&i];
                    let r = w.send(http, i).unwrap_or_else(|e| {
                        panic!("{when}: replaying {}: {e}", w.key(i));
                    });
                    if !r.replayed || r.status != first.status || r.body != first.body {
                        failures.lock().unwrap().push(format!(
                            "{when}: {} was answered {} {} (cycle {}), replay gave {} {} \
                             (replayed: {})",
                            w.key(i),
                            first.status,
                            first.body,
                            first.cycle,
                            r.status,
                            r.body,
                            r.replayed
                        ));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} answers not replayed identically:\n{}",
        failures.len(),
        failures.join("\n")
    );
    keys.len()
}

#[test]
fn crash_loop_on_the_real_worker() {
    let cycles = env_u64("IDEM_WORKER_CRASH_CYCLES", 50);
    let seed = env_u64("SEED", 7);
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let (_dir, db) = scratch();
    let w = Workload { seed };
    let next = AtomicU64::new(0);
    let book = Mutex::new(Book::default());
    let mut startup_kills = 0u64;
    let mut startup_attempts = 0u64;
    let mut checked = 0usize;

    for cycle in 0..cycles {
        let context = format!("seed {seed}, cycle {cycle}");
        // One cycle in five: SIGKILL while the worker starts (often before it listens);
        // the start right after must still work.
        if rng.random_range(0..5) == 0 {
            startup_attempts += 1;
            let mut child = spawn_serve(&db);
            std::thread::sleep(Duration::from_millis(rng.random_range(0..60)));
            signal("KILL", child.id());
            let _ = child.wait();
            let mut out = String::new();
            let _ = child.stdout.take().unwrap().read_to_string(&mut out);
            if !out.contains("listening on") {
                startup_kills += 1;
            }
        }

        let worker = Worker::start(&db, &[]);
        let http = worker.http();
        {
            // Everything answered in the previous cycle, and a sample of older answers.
            let b = book.lock().unwrap();
            let mut keys: Vec<u64> = b
                .answers
                .iter()
                .filter(|(_, a)| a.cycle + 1 == cycle)
                .map(|(&i, _)| i)
                .collect();
            let older: Vec<u64> = b
                .answers
                .iter()
                .filter(|(_, a)| a.cycle + 1 < cycle)
                .map(|(&i, _)| i)
                .collect();
            // Its own RNG, so that the kill schedule does not depend on how many answers
            // the load got.
            let mut pick = StdRng::seed_from_u64(mix(seed ^ (cycle << 32)));
            keys.extend(older.choose_multiple(&mut pick, SAMPLE));
            checked += check_replays(&w, &http, &b, &keys, &context);
        }

        let stop = AtomicBool::new(false);
        let run_for = Duration::from_millis(rng.random_range(100..400));
        std::thread::scope(|s| {
            s.spawn(|| load(&w, &http, seed, cycle, &next, &stop, &book));
            std::thread::sleep(run_for);
            worker.kill9();
            stop.store(true, Ordering::Relaxed);
        });
        let b = book.lock().unwrap();
        assert!(
            b.violations.is_empty(),
            "{context}:\n{}",
            b.violations.join("\n")
        );
    }

    // The end: every answer ever given replays identically, then a graceful stop and an
    // offline `verify`.
    let book = book.into_inner().unwrap();
    let worker = Worker::start(&db, &[]);
    let http = worker.http();
    let mut all: Vec<u64> = book.answers.keys().copied().collect();
    all.sort_unstable();
    checked += check_replays(&w, &http, &book, &all, &format!("seed {seed}, final"));

    // One fact per answered key, of the answered kind; no fact for a key nobody sent, no
    // key with two facts. Keys whose every attempt died unanswered may have one or none.
    let sent = next.load(Ordering::Relaxed);
    let mut facts: HashMap<u64, String> = HashMap::new();
    let mut after = 0u64;
    loop {
        let page = http.get(&format!("/v1/facts?after={after}&limit=1000"));
        assert_eq!(page.status, 200, "{}", page.body);
        let page = page.json();
        let list = page["facts"].as_array().unwrap();
        if list.is_empty() {
            break;
        }
        for f in list {
            let key = f["key"].as_str().unwrap();
            let i: u64 = key
                .strip_prefix(&format!("s{seed}-k"))
                .and_then(|n| n.parse().ok())
                .filter(|&i| i < sent)
                .unwrap_or_else(|| panic!("a fact for a key nobody sent: {f}"));
            let kind = f["type"].as_str().unwrap().to_owned();
            assert!(facts.insert(i, kind).is_none(), "two facts for {key}");
        }
        after = page["next_after"].as_u64().unwrap();
    }
    assert_eq!(http.last_seq(), u64::try_from(facts.len()).unwrap());
    for (i, a) in &book.answers {
        let kind = facts
            .get(i)
            .unwrap_or_else(|| panic!("{} was answered {} but has no fact", w.key(*i), a.status));
        assert_eq!(
            kind == "CommandRejected",
            a.status == 422,
            "{}: answered {} {}, fact {kind}",
            w.key(*i),
            a.status,
            a.body
        );
    }
    assert!(facts.len() >= book.answers.len());

    assert_eq!(worker.term().code(), Some(0), "SIGTERM must exit 0");
    let out = run(&["verify", "--db", db.to_str().unwrap()]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "seed {seed}: {report}");
    assert!(report.contains("all guarantees hold"), "{report}");

    println!(
        "crash loop: {cycles} cycles (seed {seed}), {startup_kills} of {startup_attempts} \
         early kills before `listening on`; \
         {} answers ({} first executions, {} replays) over {} distinct keys of {sent} sent; \
         {} facts ({} for keys never answered); {} 409s, {} requests cut by a kill; \
         {checked} replay checks after restarts; verify clean; {:.1} s",
        book.total,
        book.first_executions,
        book.replays,
        book.answers.len(),
        facts.len(),
        facts.len() - book.answers.len(),
        book.conflicts,
        book.cut,
        started.elapsed().as_secs_f64()
    );
    assert!(book.total > 0, "the clients were never answered");
    assert!(startup_kills > 0 || cycles < 10, "no kill hit a start-up");
}
