//! PgStore's counters: the `counters` table (a count per name, in shards), what a fact
//! adds to it, and the counts of what happened without a fact (replays, conflicts), kept
//! in this process and flushed to the table; read back as `Stats`.

use std::collections::HashMap;
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::db::{Result, from_db_time, get, pg_err};
use super::state::{Inner, PgStore};
use crate::domain::Rejection;
use crate::fact::FactBody;
use crate::projection::{Observed, Stats};

pub(super) const SQL_COUNT: &str = "INSERT INTO counters (name, shard, n) VALUES ($1, $2, $3) \
     ON CONFLICT (name, shard) DO UPDATE SET n = counters.n + EXCLUDED.n";

/// The counter a fact adds one to.
pub(super) fn counter_name(body: &FactBody) -> String {
    match body {
        FactBody::DepositRecorded { .. } => "applied.deposit".into(),
        FactBody::WithdrawalRecorded { .. } => "applied.withdraw".into(),
        FactBody::RefundRecorded { .. } => "applied.refund".into(),
        FactBody::CommandRejected { rejection, .. } => format!("rejected.{}", rejection.code()),
    }
}

pub(super) const COUNTER_EXPIRED: &str = "expired";
/// The counters of what happened without a fact (`Observed`): replays and conflicts write
/// nothing, so each worker adds its counts here in a transaction of their own, at most
/// [`OBSERVED_FLUSH_EVERY`] after they happened and at its clean stop. A crash loses at
/// most that last interval of them; they are observations, not money.
const COUNTER_REPLAYED: &str = "observed.replayed";
const COUNTER_IN_FLIGHT: &str = "observed.conflicts_in_flight";
const COUNTER_REUSED: &str = "observed.conflicts_reused";
const OBSERVED_FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Flushes the observed counts every [`OBSERVED_FLUSH_EVERY`] while the store lives and is
/// open. Holds the store only for a flush, so a dropped store ends it.
pub(super) async fn flush_observed_every(store: Weak<Inner>) {
    loop {
        tokio::time::sleep(OBSERVED_FLUSH_EVERY).await;
        let Some(inner) = store.upgrade() else {
            return;
        };
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        let store = PgStore { inner };
        // A failed flush keeps the counts in memory for the next turn: nothing is lost but
        // to a crash before a flush succeeds. Not reported: the store's own commands fail
        // and say so while PostgreSQL is unreachable.
        let _ = store.flush_observed().await;
    }
}

/// The observed counts the `counters` table holds (every worker's flushes).
fn observed_from_counters(counts: &HashMap<String, i64>) -> Observed {
    let n = |name: &str| u64::try_from(counts.get(name).copied().unwrap_or(0)).unwrap_or(0);
    Observed {
        replayed: n(COUNTER_REPLAYED),
        conflicts_in_flight: n(COUNTER_IN_FLIGHT),
        conflicts_reused: n(COUNTER_REUSED),
    }
}

/// Counts per name (summed over shards) as [`Stats`] holds them.
pub(super) fn stats_from_counters(counts: &HashMap<String, i64>) -> Stats {
    let n = |name: &str| u64::try_from(counts.get(name).copied().unwrap_or(0)).unwrap_or(0);
    let mut stats = Stats {
        applied: [
            n("applied.deposit"),
            n("applied.withdraw"),
            n("applied.refund"),
        ],
        ..Stats::default()
    };
    for r in Rejection::ALL {
        stats.rejected[r.index()] = n(&format!("rejected.{}", r.code()));
    }
    let facts = stats.applied_total() + stats.rejected_total();
    stats.keys_expired = n(COUNTER_EXPIRED);
    stats.keys_done = facts.saturating_sub(stats.keys_expired);
    stats
}

impl PgStore {
    fn observed(&self) -> Observed {
        Observed {
            replayed: self.inner.replayed.load(Ordering::Relaxed),
            conflicts_in_flight: self.inner.conflicts_in_flight.load(Ordering::Relaxed),
            conflicts_reused: self.inner.conflicts_reused.load(Ordering::Relaxed),
        }
    }

    /// Adds the observed counts not yet in the `counters` table to it, in one transaction.
    pub(super) async fn flush_observed(&self) -> Result<()> {
        let mut flushed = self.inner.observed_flushed.lock().await;
        let now = self.observed();
        let deltas = [
            (COUNTER_REPLAYED, now.replayed - flushed.replayed),
            (
                COUNTER_IN_FLIGHT,
                now.conflicts_in_flight - flushed.conflicts_in_flight,
            ),
            (
                COUNTER_REUSED,
                now.conflicts_reused - flushed.conflicts_reused,
            ),
        ];
        if deltas.iter().all(|(_, d)| *d == 0) {
            return Ok(());
        }
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(pg)?;
        let shard = self.next_shard();
        for (name, delta) in deltas {
            if delta > 0 {
                let n = i64::try_from(delta).unwrap_or(i64::MAX);
                tx.execute(SQL_COUNT, &[&name, &shard, &n])
                    .await
                    .map_err(pg)?;
            }
        }
        tx.commit().await.map_err(pg)?;
        *flushed = now;
        Ok(())
    }

    pub(super) async fn stats_now(&self, conn: &deadpool_postgres::Object) -> Result<Stats> {
        // Under the flush's lock: the table and what is still unflushed are read as one.
        let flushed = self.inner.observed_flushed.lock().await;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let (counts, last) = tokio::join!(
            conn.query(
                "SELECT name, sum(n)::bigint FROM counters GROUP BY name",
                &[]
            ),
            conn.query_opt("SELECT seq, at FROM facts ORDER BY seq DESC LIMIT 1", &[]),
        );
        let mut by_name = HashMap::new();
        for row in counts.map_err(pg)? {
            by_name.insert(get::<String>(&row, 0)?, get::<i64>(&row, 1)?);
        }
        let mut stats = stats_from_counters(&by_name);
        if let Some(row) = last.map_err(pg)? {
            let seq: i64 = get(&row, 0)?;
            self.observe_seq(seq);
            stats.last_seq = u64::try_from(seq).unwrap_or(0);
            stats.last_at = from_db_time(get(&row, 1)?);
        }
        let saved = observed_from_counters(&by_name);
        let counted = self.observed();
        stats.observed = Observed {
            replayed: saved.replayed + (counted.replayed - flushed.replayed),
            conflicts_in_flight: saved.conflicts_in_flight
                + (counted.conflicts_in_flight - flushed.conflicts_in_flight),
            conflicts_reused: saved.conflicts_reused
                + (counted.conflicts_reused - flushed.conflicts_reused),
        };
        Ok(stats)
    }
}
