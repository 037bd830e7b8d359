//! Idem's benchmark tools, outside the product: they drive a running worker over HTTP and
//! start `inbox-worker` processes, and link none of the worker's code.
//!
//! - [`load`]: the HTTP load engine (`idem-bench load`, and every HTTP figure in
//!   BENCHMARKS.md).
//! - [`stores`]: the worker on sled against the worker on PostgreSQL against pgbench
//!   (`idem-bench stores`).
//! - [`sync`]: the disk's floor at a fixed arrival rate, bare group commit (`idem-bench
//!   sync`, beside the worker in bench/http/fixed-rate.sh).

#![cfg_attr(test, allow(clippy::unwrap_used))]

use std::path::PathBuf;

use anyhow::{Result, anyhow};

pub mod load;
pub mod stores;
pub mod sync;

/// The name of the worker's binary on this platform.
fn worker_file_name() -> String {
    format!("inbox-worker{}", std::env::consts::EXE_SUFFIX)
}

/// The `inbox-worker` binary to start: the one next to this executable (where cargo
/// builds both, and where `cargo install` puts both), else the first on the PATH.
pub fn worker_binary() -> Result<PathBuf> {
    let name = worker_file_name();
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(&name)));
    if let Some(path) = &beside
        && path.is_file()
    {
        return Ok(path.clone());
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(&name))
                .find(|p| p.is_file())
        })
        .unwrap_or_default();
    on_path.ok_or_else(|| {
        let beside = beside.map_or_else(
            || "next to this binary".to_owned(),
            |p| p.display().to_string(),
        );
        anyhow!(
            "cannot find the worker: no {beside}, and no {name} on the PATH \
             (build it with `cargo build --release -p inbox-worker`, or say --worker PATH)"
        )
    })
}

/// A duration as the worker's flags take it: a whole number and a unit, one of ms, s, m,
/// h, d (`250ms`, `10s`, `24h`).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| "a duration needs a unit: ms, s, m, h or d (e.g. 10s)".to_owned())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| "a duration starts with a whole number (e.g. 10s)".to_owned())?;
    let per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err("the unit must be one of ms, s, m, h, d".to_owned()),
    };
    n.checked_mul(per_unit)
        .map(std::time::Duration::from_millis)
        .ok_or_else(|| "the duration is too long".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_workers_units() {
        assert_eq!(parse_duration("10s").unwrap().as_secs(), 10);
        assert_eq!(parse_duration(" 250ms ").unwrap().as_millis(), 250);
        assert_eq!(parse_duration("2m").unwrap().as_secs(), 120);
        assert_eq!(parse_duration("1d").unwrap().as_secs(), 86_400);
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("1y").is_err());
        assert!(parse_duration(&format!("{}d", u64::MAX)).is_err());
    }
}
