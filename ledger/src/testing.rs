//! Test support (feature `testing`): a fresh PostgreSQL database per test, and the one rule
//! for tests that need a service that is not there.
//!
//! The rule: the server's URL is `IDEM_TEST_PG_URL` (default [`DEFAULT_PG_URL`]). If it
//! cannot be reached, a test fails loudly when `IDEM_REQUIRE_SERVICES=1` (CI sets it), and
//! otherwise says plainly on stderr that it was skipped and returns. A skipped test is
//! never reported as a pass in disguise: the line names what was not run and why.

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_postgres::NoTls;

pub use crate::store::sled::wait_until_released;

/// Where the tests' PostgreSQL server is, unless `IDEM_TEST_PG_URL` says otherwise.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// The variable naming the tests' PostgreSQL server.
pub const PG_URL_ENV: &str = "IDEM_TEST_PG_URL";
/// Set to `1` to make an unreachable service a failure instead of a skip.
pub const REQUIRE_ENV: &str = "IDEM_REQUIRE_SERVICES";

/// The tests' PostgreSQL URL (the administrative database new ones are created from).
pub fn pg_url() -> String {
    std::env::var(PG_URL_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DEFAULT_PG_URL.to_owned())
}

/// Whether a missing service must fail the test (CI) rather than skip it.
pub fn services_required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
}

/// What to do when a service is missing: panic if required, else print the skip line.
/// `what` names the service and where it was looked for; `why` is the error.
pub fn service_missing(test: &str, what: &str, why: &str) {
    if services_required() {
        panic!("{test}: {what} not reachable: {why} ({REQUIRE_ENV}=1, so this is a failure)");
    }
    // Straight to the process's stderr: the test harness captures `eprintln!` and would
    // show the line only for a failing test.
    let _ = writeln!(
        std::io::stderr(),
        "{test}: SKIPPED (not run): {what} not reachable: {why}; \
         set {REQUIRE_ENV}=1 to make this a failure"
    );
}

/// Every file below `path` with its length, sorted: taken before and after opening a
/// damaged store, it shows that nothing was deleted or truncated.
pub fn listing(path: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(path) else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            out.extend(listing(&e.path()));
        } else {
            out.push((e.path().display().to_string(), m.len()));
        }
    }
    out.sort();
    out
}

/// Panics unless every data file of `before` (a [`listing`]) is still in `after`, at least
/// as long. sled rewrites its snapshot files (an index of its log) on every open, and the
/// journal remakes its spare segment (zeros made ahead, no data), so those are left out;
/// the logs themselves, the data, must neither disappear nor shrink.
pub fn assert_nothing_removed(before: &[(String, u64)], after: &[(String, u64)]) {
    for (file, len) in before
        .iter()
        .filter(|(f, _)| !f.contains("snap.") && !f.contains("spare."))
    {
        let now = after.iter().find(|(f, _)| f == file);
        assert!(
            now.is_some_and(|(_, l)| l >= len),
            "{file} was removed or shrank"
        );
    }
}

/// The URL without its password, for messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// `url` pointing at database `name` instead (URL or `key=value` form).
pub fn with_database(url: &str, name: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (before_query, query) = match rest.split_once('?') {
                Some((b, q)) => (b, Some(q)),
                None => (rest, None),
            };
            let authority = before_query.split('/').next().unwrap_or_default();
            let mut out = format!("{scheme}://{authority}/{name}");
            if let Some(q) = query {
                out.push('?');
                out.push_str(q);
            }
            out
        }
        None => format!("{url} dbname={name}"),
    }
}

/// A database created for one test and dropped after it (also when the test panics).
#[derive(Debug)]
pub struct PgTestDb {
    /// The URL of the new database, for `PgStore::open`.
    pub url: String,
    pub name: String,
    admin_url: String,
    dropped: bool,
}

fn unique_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // RandomState is seeded randomly per process; the counter and the time separate calls.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("{:016x}", h.finish())
}

/// An error with its causes: the driver's own Display leaves out why connecting failed.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let mut cfg: tokio_postgres::Config = url.parse().map_err(|e| format!("bad URL: {e}"))?;
    cfg.connect_timeout(Duration::from_secs(3));
    let (client, connection) = cfg.connect(NoTls).await.map_err(|e| chain(&e))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

impl PgTestDb {
    /// Creates `<prefix>_<random>` on the tests' server. `None` when the server is not
    /// reachable and services are not required (the skip line is printed); panics when
    /// they are.
    pub async fn create(test: &str, prefix: &str) -> Option<PgTestDb> {
        assert!(
            prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "a database prefix is lower-case letters, digits and '_'"
        );
        let admin_url = pg_url();
        let what = format!("PostgreSQL at {}", redact(&admin_url));
        let client = match connect(&admin_url).await {
            Ok(c) => c,
            Err(why) => {
                service_missing(test, &what, &why);
                return None;
            }
        };
        let name = format!("{prefix}_{}", unique_suffix());
        if let Err(e) = client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
        {
            // Reachable but refusing: that is a broken setup, never a skip.
            panic!("{test}: creating database {name} on {what}: {e:?}");
        }
        Some(PgTestDb {
            url: with_database(&admin_url, &name),
            name,
            admin_url,
            dropped: false,
        })
    }

    /// Drops the database now (waiting for it); the drop guard does the same otherwise.
    pub async fn drop_now(mut self) {
        self.dropped = true;
        drop_database(&self.admin_url, &self.name).await;
    }
}

async fn drop_database(admin_url: &str, name: &str) {
    if let Ok(client) = connect(admin_url).await {
        // FORCE ends sessions a test left open (PostgreSQL 13 and later).
        let _ = client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await;
    }
}

impl Drop for PgTestDb {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // Dropped without `drop_now` (a failed test): a thread of its own with its own
        // runtime, because this may run inside, or outside, a runtime.
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(drop_database(&admin_url, &name));
            }
        })
        .join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted_and_retargeted() {
        assert_eq!(
            redact("postgres://u:pw@h:5432/db?sslmode=disable"),
            "postgres://u@h:5432/db?sslmode=disable"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            with_database("postgres://u@h:5432/postgres?x=1", "t1"),
            "postgres://u@h:5432/t1?x=1"
        );
        assert_eq!(with_database("postgres://u@h", "t1"), "postgres://u@h/t1");
        assert_eq!(
            with_database("host=h user=u", "t1"),
            "host=h user=u dbname=t1"
        );
    }
}
