//! The disk's floor at a fixed arrival rate (`idem-bench sync`): what any new key must cost
//! at least, measured beside the worker in the same run.
//!
//! Arrivals come at `--rate` a second on one thread (the stand-in for the network, not
//! counted), released on the load generator's grid of one millisecond (at 5,000/s, five at
//! each tick), so the floor meets the bursts the worker meets. One syncer thread takes every arrival so far, writes one 4 KiB page at the end
//! of a preallocated file and `fdatasync`s it, then takes the next: group commit with
//! nothing decided, indexed or answered. An arrival's latency runs from its arrival to the
//! return of the sync that covers it, so it includes waiting for the sync in flight, as a
//! command's does. The syncer thread's own CPU (from `/proc/thread-self/stat`) is what the
//! syncs cost the machine at this rate: the least a new key adds to a replay.

use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};

use crate::load::{Latencies, released_by};

/// Bytes each sync writes: one page, as the load bench's bare sync.
const PAGE: usize = 4096;
/// The file's preallocated size; writes wrap around it.
const FILE: u64 = 64 << 20;

/// What one run measured.
#[derive(Debug)]
pub struct Floor {
    pub arrivals: u64,
    pub syncs: u64,
    pub secs: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    /// The syncer thread's CPU over the run, in cores.
    pub syncer_cores: f64,
}

impl Floor {
    /// `key=value` lines, as `load run` prints them.
    pub fn write_kv(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        writeln!(
            out,
            "arrivals_per_s={:.0}",
            self.arrivals as f64 / self.secs
        )?;
        writeln!(out, "syncs_per_s={:.0}", self.syncs as f64 / self.secs)?;
        writeln!(out, "p50_us={}", self.p50_us)?;
        writeln!(out, "p99_us={}", self.p99_us)?;
        writeln!(out, "max_us={}", self.max_us)?;
        writeln!(out, "syncer_cores={:.3}", self.syncer_cores)
    }
}

#[derive(Default)]
struct Queue {
    arrived: Vec<Instant>,
    done: bool,
}

/// Runs arrivals at `rate` a second for `duration` against a syncer on a file in `dir`.
pub fn run(dir: &Path, rate: u32, duration: Duration) -> Result<Floor> {
    if rate == 0 {
        return Err(anyhow!("--rate must be at least 1"));
    }
    let path = dir.join("idem-bench-sync");
    let file = preallocated(&path, FILE)?;
    let queue = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
    let syncer = {
        let queue = queue.clone();
        std::thread::Builder::new()
            .name("bare-syncer".into())
            .spawn(move || sync_loop(&file, &queue))?
    };
    let started = Instant::now();
    let mut arrivals = 0u64;
    for tick in 0u32.. {
        let at = started + Duration::from_millis(u64::from(tick));
        if at >= started + duration {
            break;
        }
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        let due = released_by(tick, rate);
        let (lock, cv) = &*queue;
        let mut q = lock.lock().map_err(|_| anyhow!("syncer failed"))?;
        let now = Instant::now();
        while arrivals < due {
            q.arrived.push(now);
            arrivals += 1;
        }
        drop(q);
        cv.notify_one();
    }
    {
        let (lock, cv) = &*queue;
        lock.lock().map_err(|_| anyhow!("syncer failed"))?.done = true;
        cv.notify_one();
    }
    let (mut lat, syncs, cpu) = syncer
        .join()
        .map_err(|_| anyhow!("syncer panicked"))?
        .context("syncing")?;
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        lat.len() == arrivals,
        "{} arrivals, {} timed",
        arrivals,
        lat.len()
    );
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    Ok(Floor {
        arrivals,
        syncs,
        secs,
        p50_us: u64::from(lat.percentile(500)),
        p99_us: u64::from(lat.percentile(990)),
        max_us: u64::from(lat.max()),
        syncer_cores: cpu.as_secs_f64() / secs,
    })
}

/// The syncer: one write and one sync for everything that arrived, until told to stop and
/// nothing is left. Returns each arrival's latency, the number of syncs and its own CPU.
fn sync_loop(
    file: &std::fs::File,
    queue: &(Mutex<Queue>, Condvar),
) -> Result<(Latencies, u64, Duration)> {
    let cpu0 = thread_cpu()?;
    let page = vec![0x5au8; PAGE];
    let (lock, cv) = queue;
    let mut lat = Latencies::default();
    let mut syncs = 0u64;
    let mut at = 0u64;
    loop {
        let batch = {
            let mut q = lock.lock().map_err(|_| anyhow!("generator failed"))?;
            while q.arrived.is_empty() && !q.done {
                q = cv.wait(q).map_err(|_| anyhow!("generator failed"))?;
            }
            if q.arrived.is_empty() {
                break;
            }
            std::mem::take(&mut q.arrived)
        };
        file.write_all_at(&page, at)?;
        file.sync_data()?;
        let now = Instant::now();
        for t in &batch {
            lat.record(now.duration_since(*t));
        }
        syncs += 1;
        at = (at + PAGE as u64) % FILE;
    }
    Ok((lat, syncs, thread_cpu()? - cpu0))
}

/// The calling thread's CPU (user and system) so far, in clock ticks of 1/100 s turned into
/// time: what `/proc` counts for the worker's threads too.
fn thread_cpu() -> Result<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("unreadable /proc/thread-self/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are the 14th and 15th fields, the 12th and 13th after the name.
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .ok_or_else(|| anyhow!("short /proc/thread-self/stat"))?
            .parse::<u64>()
            .context("parsing /proc/thread-self/stat")
    };
    Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}

/// A file of `size` zeros, written and synced whole, so that a sync writes no size or
/// allocation metadata (as the journal's preallocated segments).
fn preallocated(path: &Path, size: u64) -> Result<std::fs::File> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..(size >> 20) {
        file.write_all(&zeros)?;
    }
    file.sync_all()?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_arrival_is_covered_by_a_sync_and_timed() {
        let dir = tempfile::tempdir().unwrap();
        let floor = run(dir.path(), 500, Duration::from_millis(400)).unwrap();
        // 500/s for 0.4 s on the grid of 1 ms: the ticks 0..400 release 200 arrivals,
        // each waited for, in at most as many syncs.
        assert_eq!(floor.arrivals, 200);
        assert!(
            floor.syncs >= 1 && floor.syncs <= floor.arrivals,
            "{floor:?}"
        );
        assert!(
            floor.p50_us <= floor.p99_us && floor.p99_us <= floor.max_us,
            "{floor:?}"
        );
        assert!(floor.max_us > 0, "{floor:?}");
        // The file is the run's own: removed after it.
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }

    #[test]
    fn arrivals_come_in_the_load_generator_s_bursts() {
        // 5,000/s on the 1 ms grid: one at the start, then five at each tick.
        assert_eq!(released_by(0, 5000), 1);
        assert_eq!(released_by(1, 5000), 6);
        assert_eq!(released_by(999, 5000) - released_by(998, 5000), 5);
        // Below one per tick, a tick may release none.
        assert_eq!(released_by(1, 500), released_by(0, 500));
    }

    #[test]
    fn a_rate_of_zero_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = run(dir.path(), 0, Duration::from_millis(10)).unwrap_err();
        assert!(err.to_string().contains("--rate"), "{err}");
    }
}
