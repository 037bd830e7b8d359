//! The worker's memory is bounded by its settings: with a million keys written over HTTP
//! (one in ten requests a replay of an earlier key, so the per-key counters fill too), its
//! peak resident memory stays under the bound `/metrics` reports, and every structure that
//! grows with use stays within its limit.
//!
//! A test binary of its own: cargo runs test binaries one after another, so the minutes of
//! load here do not slow the timing-sensitive worker tests that run side by side.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "worker/raw.rs"]
#[allow(dead_code)]
mod raw;
#[path = "worker/support.rs"]
#[allow(dead_code)]
mod support;

use raw::{RawClient, request};
use support::{Worker, scratch};

/// `(labels, value)` of every sample of a metric.
fn samples(text: &str, name: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (labels, value) = r.split_once('}')?;
                    (labels.to_owned(), value)
                }
                None if rest.starts_with(' ') => (String::new(), rest),
                None => return None,
            };
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

#[test]
fn a_million_keys_stay_under_the_memory_bound() {
    let keys: u64 = std::env::var("IDEM_MEMORY_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let (_dir, db) = scratch();
    let w = Worker::start(&db, &[]);
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..64)
        .map(|_| {
            let (next, port) = (next.clone(), w.port);
            std::thread::spawn(move || {
                let mut c = RawClient::new(port);
                c.timeout = Duration::from_secs(30);
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= keys {
                        break;
                    }
                    // Every tenth request repeats a key sent 5,000 requests earlier.
                    let (k, replay) = if n % 10 == 9 && n > 5_000 {
                        ((n - 5_000) / 10 * 10, true)
                    } else {
                        (n, false)
                    };
                    let body = format!(
                        r#"{{"account":"acct-{}","amount":1,"currency":"RUB"}}"#,
                        k % 1000
                    );
                    let key = format!("mem-{k:08}");
                    let bytes = request(
                        "POST",
                        "/v1/deposits",
                        &[
                            ("Idempotency-Key", key.as_bytes()),
                            ("Content-Type", b"application/json"),
                        ],
                        body.as_bytes(),
                    );
                    let reply = c.send(&bytes).unwrap();
                    // A repeat meets its first attempt done (its answer, replayed) or
                    // still in flight (409).
                    let replayed = reply.header("Idempotent-Replayed") == Some("true");
                    let ok = match reply.status {
                        201 => replayed == replay,
                        409 => replay,
                        _ => false,
                    };
                    assert!(
                        ok,
                        "key {key} (replay {replay}): {} {}",
                        reply.status,
                        reply.text()
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = started.elapsed();
    let metrics = w.http().get("/metrics").body;
    let one = |name: &str| {
        samples(&metrics, name)
            .first()
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    let bound = one("idem_memory_bound_bytes");
    let rss = one("idem_process_resident_bytes");
    let peak = peak_rss_bytes(w.pid());
    let last_seq = one("idem_last_seq");
    eprintln!(
        "memory: {keys} requests ({last_seq} facts) in {elapsed:.1?}; resident {} MiB, peak {} MiB, \
         bound {} MiB",
        rss >> 20,
        peak >> 20,
        bound >> 20
    );
    let max: std::collections::HashMap<_, _> = samples(&metrics, "idem_memory_entries_max")
        .into_iter()
        .collect();
    let entries = samples(&metrics, "idem_memory_entries");
    for (labels, n) in &entries {
        eprintln!("  {labels}: {n} entries (at most {:?})", max.get(labels));
        if let Some(m) = max.get(labels) {
            assert!(n <= m, "{labels}: {n} entries, more than its limit {m}");
        }
    }
    // The caches filled: the bound is exercised, not an idle process's.
    let answers = entries
        .iter()
        .find(|(l, _)| l.contains("\"answers\""))
        .unwrap()
        .1;
    let activity = entries
        .iter()
        .find(|(l, _)| l.contains("\"activity\""))
        .unwrap()
        .1;
    assert!(answers > 10_000 && activity > 10_000, "{entries:?}");
    assert!(
        last_seq >= keys * 9 / 10,
        "{last_seq} facts for {keys} requests"
    );
    assert!(
        peak <= bound,
        "peak resident memory {} MiB above the bound of {} MiB",
        peak >> 20,
        bound >> 20
    );
}
