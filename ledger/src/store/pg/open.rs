//! PgStore's opening: the pool and its sessions' settings, the migrations (applied once,
//! under an advisory lock), and what is checked before the store is handed out.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use parking_lot::Mutex;
use tokio_postgres::NoTls;

use super::config::PgConfig;
use super::counters::flush_observed_every;
use super::db::{Result, db_time, get, ms, pg_err, pool_err};
use super::group::start_lanes;
use super::shards::{ShardSlots, rand_offset};
use super::state::{Inner, PgStore};
use crate::projection::Observed;
use crate::store::{CommitMetrics, LedgerError, OpenReport, Rules};

/// The migrations, in order; version N is `MIGRATIONS[N - 1]`. `schema.sql` is the schema
/// they build, in one file (`tests/it/pg_schema.rs` checks that the two agree).
///
/// A database records the versions it applied by number and name (`schema_version`), with
/// no checksum of their text: a version runs once, when its number is above the database's,
/// and its text is not read again. A released migration is therefore never changed in what
/// it makes; a change of schema is the next version. Its text may be rewritten into text
/// that makes exactly the same: `v12.sql` writes out the two functions it makes, whose
/// definitions, as `pg_get_functiondef` prints them, are those of v8's and v11's apply
/// functions with the response as text, made from them by replacing the name and that
/// argument's type. So a database that applied version 12 holds the same functions
/// whichever text ran, and no checksum is needed to tell them apart.
const MIGRATIONS: &[(&str, &str)] = &[
    (
        "facts, keys, balances, inbox",
        include_str!("migrations/v1.sql"),
    ),
    (
        "the command as two functions",
        include_str!("migrations/v2.sql"),
    ),
    (
        "fewer executor starts per command",
        include_str!("migrations/v3.sql"),
    ),
    ("the rules as domains", include_str!("migrations/v4.sql")),
    (
        "a refund waits for its withdrawal in flight",
        include_str!("migrations/v5.sql"),
    ),
    (
        "each stored response carries its digest",
        include_str!("migrations/v6.sql"),
    ),
    ("account statements", include_str!("migrations/v7.sql")),
    (
        "a group of commands in one transaction",
        include_str!("migrations/v8.sql"),
    ),
    (
        "a group's keys read in one statement",
        include_str!("migrations/v9.sql"),
    ),
    (
        "the accounts locked by an index scan, a group of one claimed as one command",
        include_str!("migrations/v10.sql"),
    ),
    (
        "a group of one fact applied as one command",
        include_str!("migrations/v11.sql"),
    ),
    (
        "the stored response as text",
        include_str!("migrations/v12.sql"),
    ),
    (
        "the functions named by their role, each written out whole",
        include_str!("migrations/v13.sql"),
    ),
];

/// Why a server with these settings cannot keep what it acknowledges through a crash of
/// its machine, or `None` when both are on: `fsync` off, a commit may never reach the disk;
/// `full_page_writes` off, a page torn by a power loss cannot be restored from the WAL.
pub fn unsafe_settings(fsync: &str, full_page_writes: &str) -> Option<String> {
    let off: Vec<String> = [("fsync", fsync), ("full_page_writes", full_page_writes)]
        .into_iter()
        .filter(|(_, value)| *value != "on")
        .map(|(name, value)| format!("{name} = {value}"))
        .collect();
    (!off.is_empty()).then(|| {
        format!(
            "the PostgreSQL server runs with {}: a crash of its machine can lose or tear \
             commands it acknowledged, and Idem answers a command only once its commit is \
             durable. Set them on (postgresql.conf), or pass --pg-allow-unsafe-settings for \
             a throwaway test server",
            off.join(", ")
        )
    })
}

fn valid_schema(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && s.len() <= 63
}

/// Where a configuration points, without the password.
fn target(cfg: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let host = match cfg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let user = cfg.get_user().map(|u| format!("{u}@")).unwrap_or_default();
    let db = cfg.get_dbname().or(cfg.get_user()).unwrap_or("postgres");
    format!("postgres://{user}{host}:{port}/{db}")
}

impl PgStore {
    /// Connects, applies the migrations this build knows (once, under an advisory lock,
    /// so workers starting together do not race), checks that the balances sum to zero,
    /// and returns the store with what it found.
    pub async fn open(
        url: &str,
        rules: Rules,
        options: PgConfig,
    ) -> Result<(PgStore, OpenReport), LedgerError> {
        let started = Instant::now();
        if !valid_schema(&options.schema) {
            return Err(LedgerError::Unavailable(format!(
                "invalid schema name {:?}: use lower-case letters, digits and '_'",
                options.schema
            )));
        }
        let mut cfg: tokio_postgres::Config = url.parse().map_err(|e| {
            LedgerError::Unavailable(format!("the PostgreSQL URL does not parse: {e}"))
        })?;
        let location = format!("{} (schema {})", target(&cfg), options.schema);
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(options.connect_timeout);
        }
        if cfg.get_application_name().is_none() {
            cfg.application_name("idem");
        }
        // Session settings, sent with the startup packet so they cost no round trip:
        // - synchronous_commit on: COMMIT returns once the commit is flushed to the WAL,
        //   whatever the server's default, because an answer follows the COMMIT.
        // - idle_in_transaction_session_timeout and statement_timeout = the lease: a worker
        //   that hangs inside a transaction (stopped, partitioned) loses its session, and
        //   with it its uncommitted claim, once the lease runs out, so the key can be
        //   claimed again. A worker that dies outright loses it when the socket closes.
        // - lock_timeout = the lease: no wait on a row lock outlasts a lease; the claim
        //   lowers it to the in-flight wait for its advisory locks only.
        let lease = ms(rules.lease);
        let ours = format!(
            "-c synchronous_commit=on -c search_path={} -c idle_in_transaction_session_timeout={lease} \
             -c statement_timeout={lease} -c lock_timeout={lease}",
            options.schema
        );
        let opts = match cfg.get_options() {
            Some(theirs) if !theirs.is_empty() => format!("{theirs} {ours}"),
            _ => ours,
        };
        cfg.options(opts);
        let manager = Manager::from_config(
            cfg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(rules.lease))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .build()
            .map_err(|e| LedgerError::Unavailable(format!("PostgreSQL connection pool: {e}")))?;
        let lanes = options.lanes.clamp(1, options.pool_size.max(1));
        let store = PgStore {
            inner: Arc::new_cyclic(|weak| Inner {
                lanes: start_lanes(lanes, weak),
                pool,
                options,
                location,
                claims: Mutex::new(HashMap::new()),
                activity: Mutex::new(HashMap::new()),
                in_flight: AtomicUsize::new(0),
                idle: tokio::sync::Notify::new(),
                closed: AtomicBool::new(false),
                durable_seq: AtomicU64::new(0),
                last_at: AtomicI64::new(i64::MIN),
                next_token: AtomicU64::new(1),
                next_shard: AtomicU64::new(std::process::id().into()),
                shard_slots: ShardSlots::new(rand_offset()),
                replayed: AtomicU64::new(0),
                conflicts_in_flight: AtomicU64::new(0),
                conflicts_reused: AtomicU64::new(0),
                observed_flushed: tokio::sync::Mutex::new(Observed::default()),
                metrics: Mutex::new(CommitMetrics::default()),
                rules,
            }),
        };
        tokio::spawn(flush_observed_every(Arc::downgrade(&store.inner)));
        let fresh = store.migrate().await?;
        let mut report = store.check_on_open(fresh).await?;
        report.open_ms = started.elapsed().as_millis();
        Ok((store, report))
    }

    /// Applies the migrations this build knows and has not applied. Returns whether the
    /// schema was created now.
    async fn migrate(&self) -> Result<bool> {
        let inner = &self.inner;
        let mut conn = inner.pool.get().await.map_err(pool_err)?;
        let tx = conn.transaction().await.map_err(|e| pg_err(&e))?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        // One migrator at a time per database and schema; the lock ends with the
        // transaction, so a migrator that dies releases it.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('idem.migrate'), hashtext($1))",
            &[&inner.options.schema],
        )
        .await
        .map_err(pg)?;
        tx.batch_execute(&format!(
            "SET LOCAL statement_timeout = 0; \
             CREATE SCHEMA IF NOT EXISTS {schema}; \
             CREATE TABLE IF NOT EXISTS {schema}.schema_version ( \
                 version integer PRIMARY KEY, \
                 name text NOT NULL, \
                 applied_at timestamptz NOT NULL)",
            schema = inner.options.schema
        ))
        .await
        .map_err(pg)?;
        let current: i32 = tx
            .query_one("SELECT coalesce(max(version), 0) FROM schema_version", &[])
            .await
            .map_err(pg)
            .and_then(|row| get(&row, 0))?;
        let known = i32::try_from(MIGRATIONS.len()).unwrap_or(i32::MAX);
        if current > known {
            return Err(LedgerError::Unavailable(format!(
                "the database is at schema version {current}, newer than this build's {known}; \
                 run a newer Idem"
            )));
        }
        let now = db_time(inner.rules.clock.now())?;
        for (version, (name, sql)) in (1..).zip(MIGRATIONS) {
            if version <= current {
                continue;
            }
            tx.batch_execute(sql).await.map_err(pg)?;
            tx.execute(
                "INSERT INTO schema_version (version, name, applied_at) VALUES ($1, $2, $3)",
                &[&version, name, &now],
            )
            .await
            .map_err(pg)?;
        }
        tx.commit().await.map_err(pg)?;
        Ok(current == 0)
    }

    /// What sled's open checks, as far as it is cheap here: the balances sum to zero per
    /// currency. The rest is `verify`'s.
    async fn check_on_open(&self, fresh: bool) -> Result<OpenReport> {
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        // A commit is acknowledged once PostgreSQL says it is durable, which holds only with
        // these on (this process's sessions set synchronous_commit on themselves).
        let settings = conn
            .query_one(
                "SELECT current_setting('fsync'), current_setting('full_page_writes')",
                &[],
            )
            .await
            .map_err(pg)?;
        let (fsync, full_page_writes): (String, String) = (settings.get(0), settings.get(1));
        if let Some(refusal) = unsafe_settings(&fsync, &full_page_writes)
            && !self.inner.options.allow_unsafe_settings
        {
            return Err(LedgerError::Unavailable(refusal));
        }
        let sums = conn
            .query(
                "SELECT currency, sum(balance)::text FROM ( \
                     SELECT currency, balance FROM accounts \
                     UNION ALL SELECT currency, balance FROM system_balances) b \
                 GROUP BY currency HAVING sum(balance) <> 0",
                &[],
            )
            .await
            .map_err(pg)?;
        if let Some(row) = sums.first() {
            let currency: String = get(row, 0)?;
            let sum: String = get(row, 1)?;
            return Err(self.corrupt(format!("balances in {currency} sum to {sum}, not 0")));
        }
        let stats = self.stats_now(&conn).await?;
        let accounts: i64 = conn
            .query_one("SELECT count(*) FROM accounts", &[])
            .await
            .map_err(pg)
            .and_then(|row| get(&row, 0))?;
        // The newest fact by number (an index lookup, not a scan): its time is where this
        // process's facts start from.
        let mut last_fact_at = None;
        if stats.last_seq > 0 {
            let at = stats.last_at;
            self.inner.last_at.fetch_max(at.millis(), Ordering::SeqCst);
            last_fact_at = Some(at.to_rfc3339());
        }
        Ok(OpenReport {
            fresh,
            facts: stats.applied_total() + stats.rejected_total(),
            keys_done: stats.keys_done,
            keys_expired: stats.keys_expired,
            accounts: usize::try_from(accounts).unwrap_or(0),
            last_fact_at,
            replayed_groups: 0,
            rebuilt: None,
            open_ms: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{target, valid_schema};

    #[test]
    fn schema_names_are_plain_identifiers() {
        assert!(valid_schema("idem"));
        assert!(valid_schema("idem_2"));
        assert!(!valid_schema("2idem"));
        assert!(!valid_schema("Idem"));
        assert!(!valid_schema("idem; drop table x"));
        assert!(!valid_schema(""));
    }

    #[test]
    fn the_location_never_shows_a_password() {
        let cfg: tokio_postgres::Config = "postgres://u:secret@db.example:6543/ledger"
            .parse()
            .unwrap_or_else(|_| tokio_postgres::Config::new());
        let shown = target(&cfg);
        assert_eq!(shown, "postgres://u@db.example:6543/ledger");
    }
}
