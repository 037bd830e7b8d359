//! The PostgreSQL store: the same guarantees as the sled store, kept by the
//! database, so any number of workers on any number of hosts can share one ledger.
//!
//! Commands are decided in groups (`group.rs`), each group one transaction; within it,
//! each command in arrival order takes the shape of a hand-written idempotent handler:
//!
//! 1. claim: a transaction-scoped advisory lock on the key (and on the message id), held
//!    to the commit, then read the key (and `INSERT INTO inbox … ON CONFLICT DO NOTHING`
//!    for a message). A concurrent twin waits on the advisory lock until the first
//!    commits or rolls back;
//!    `lock_timeout` bounds that wait alone, and a twin that runs out of it is told
//!    `InProgress` (409). Other waits (a table's extension lock under a burst of inserts)
//!    are bounded by the lease, so they never pass for a twin.
//! 2. if the key was there: same fingerprint → the answer rendered from its fact
//!    (`Outcome::from_fact`, byte-identical to the first answer), another → `Reused`.
//! 3. else lock what the decision reads (`SELECT … FOR UPDATE`), take the fact's number,
//!    decide with the pure core (`core::decide`, the same decision as sled's, on the
//!    balances the group's earlier commands left), and write the fact, the balances
//!    (updates checked against the decisions), the key's row with its outcome, the
//!    counters and the inbox row; then one COMMIT for the group (synchronous_commit on)
//!    and only then answer.
//!
//! The statements run inside two PL/pgSQL functions that take the group as arrays,
//! `idem_claim_group` (steps 1–3 up to the decisions) and `idem_apply_group` (the writes;
//! `idem_apply_one` takes a group of one fact as scalars), with BEGIN and COMMIT pipelined
//! beside them: two round trips per group instead of one per dependent statement of each
//! command. `schema.sql` has every table and function of the schema in one file; the
//! migrations in `migrations/` build it.
//!
//! No correctness comes from this process's memory: the unique indexes, the guarded
//! updates, the row locks and the single transaction are all in the database. What is
//! kept here is observation (pending keys, counters of replays and conflicts) and a short
//! cut for a twin arriving at this same process while its first is running: it reads the
//! key's committed row instead of waiting on the first's lock, and that row decides, as
//! on sled (a done key is replayed, or refused for another command; only a key with
//! nothing committed is in flight).
//!
//! Differences from sled, all from sharing the database between writers:
//! - Sequence numbers come from a sequence: a rolled-back attempt leaves a gap, and two
//!   transactions may commit out of the order of their numbers. `facts(after)` returns
//!   what is committed, so a reader paging by the last seq it saw can miss a fact that
//!   commits later with a smaller number (re-read a little behind to be safe). `verify`
//!   checks the numbers are unique and increasing, not gapless.
//! - A fact's time is `max(clock, the latest time this process recorded or saw)`; across
//!   workers with skewed clocks the log's times are not monotonic in seq. The sweep does
//!   not depend on that order: it selects keys by their own time.
//! - A twin with another command while the first attempt is in flight in another process
//!   is told `InProgress` (the uncommitted fingerprint is invisible); its retry is `Reused`.
//!
//! The files, top-down: each imports only files listed after it (`tests/it/architecture.rs`
//! checks that no import circle forms among them). A command's route is `mod.rs`, then
//! `command.rs`, then `group.rs`.
//! - `mod.rs`: the facade: the `Store` impl and the public names.
//! - `open.rs`: PgStore's opening: the pool, the migrations, the checks at open.
//! - `command.rs`: PgStore's command path: the claim in this process, a twin's wait.
//! - `group.rs`: PgStore's group commit: lanes, a group's transaction in two round trips.
//! - `keys.rs`, `verify.rs`, `quarantine.rs`, `balances.rs`, `counters.rs`: PgStore's
//!   other facets, each an `impl PgStore` of its own.
//! - `state.rs`: `PgStore` itself and what it holds in this process.
//! - `lane.rs` (a lane's queue), `tx.rs` (a transaction begun by hand, and `Abort`),
//!   `shards.rs` (the counted rows' shards), `copy.rs` (verify's COPY reader),
//!   `config.rs` (`PgConfig`), `db.rs` (errors, column reads, conversions).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use async_trait::async_trait;

use crate::domain::{Account, ClientId, Command, Currency, Key, MessageId};
use crate::fact::Fact;
use crate::memory::{self, Limit, MemoryUse};
use crate::projection::{Balances, Stats};
use crate::store::verify::VerifyReport;
use crate::store::{
    AsOf, BalanceAt, CommitMetrics, KeyInfo, KeyPage, KeyQuery, Quarantined, Rules, Store,
    Submission,
};

mod balances;
mod command;
mod config;
mod copy;
mod counters;
mod db;
mod group;
mod keys;
mod lane;
mod open;
mod quarantine;
mod shards;
mod state;
mod tx;
mod verify;

pub use config::PgConfig;
#[doc(hidden)]
pub use copy::{CopyReader, CopyRow, RowBatch, copy_sql};
pub use open::unsafe_settings;
pub use state::PgStore;
#[doc(hidden)]
pub use verify::{VERIFY_FACTS, VERIFY_KEYS, VERIFY_LOG, VERIFY_SETTINGS};

use db::{Result, db_limit, db_time, get, pg_err};
use keys::ACTIVITY_MAX;
use state::Claim;

#[async_trait]
impl Store for PgStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }
    fn location(&self) -> String {
        self.inner.location.clone()
    }
    fn rules(&self) -> &Rules {
        &self.inner.rules
    }

    async fn submit(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
    ) -> Result<Submission> {
        self.submit_command(client, key, command, message).await
    }

    async fn quarantine(
        &self,
        message_id: Option<String>,
        reason: String,
        payload: Vec<u8>,
    ) -> Result<u64> {
        self.insert_quarantine(message_id, reason, payload).await
    }

    async fn quarantined(&self, after: u64, limit: usize) -> Result<Vec<Quarantined>> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        self.select_quarantined(
            "SELECT id, at, message_id, reason, payload FROM quarantine WHERE id > $1 \
             ORDER BY id LIMIT $2",
            &[&after, &db_limit(limit)],
        )
        .await
    }

    async fn quarantined_newest(&self, limit: usize) -> Result<Vec<Quarantined>> {
        self.select_quarantined(
            "SELECT id, at, message_id, reason, payload FROM quarantine ORDER BY id DESC LIMIT $1",
            &[&db_limit(limit)],
        )
        .await
    }

    async fn sweep(&self) -> Result<usize> {
        self.sweep_now().await
    }

    async fn verify(&self) -> Result<VerifyReport> {
        self.verify_now().await
    }

    async fn key(&self, client: &ClientId, key: &Key) -> Result<Option<KeyInfo>> {
        let ck = (client.clone(), key.clone());
        if let Some(claim) = self.inner.claims.lock().get(&ck).cloned() {
            return Ok(Some(self.pending_info(&ck, &claim)));
        }
        let Some((status, _, fact)) = self.key_with_fact(client, key).await? else {
            return Ok(None);
        };
        self.key_info(ck.0, ck.1, &status, fact).map(Some)
    }

    async fn keys(&self, query: KeyQuery) -> Result<KeyPage> {
        self.keys_page(query).await
    }

    async fn facts(&self, after: u64, limit: usize) -> Result<Vec<Fact>> {
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let stmt = conn
            .prepare_cached("SELECT seq, body FROM facts WHERE seq > $1 ORDER BY seq LIMIT $2")
            .await
            .map_err(pg)?;
        let rows = conn
            .query(&stmt, &[&after, &db_limit(limit)])
            .await
            .map_err(pg)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(self.decode(get(row, 0)?, get(row, 1)?)?);
        }
        if let Some(last) = out.last() {
            self.inner.durable_seq.fetch_max(last.seq, Ordering::SeqCst);
        }
        Ok(out)
    }

    async fn statement(&self, account: &Account, after: u64, limit: usize) -> Result<Vec<Fact>> {
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        // The expression and the predicate are the index's (schema.sql), so the planner
        // reads the account's range of `facts_by_account` and nothing else.
        let stmt = conn
            .prepare_cached(
                "SELECT seq, body FROM facts \
                 WHERE (doc ->> 'account') = $1 AND kind <> 'CommandRejected' AND seq > $2 \
                 ORDER BY seq LIMIT $3",
            )
            .await
            .map_err(pg)?;
        let rows = conn
            .query(&stmt, &[&account.as_str(), &after, &db_limit(limit)])
            .await
            .map_err(pg)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let fact = self.decode(get(row, 0)?, get(row, 1)?)?;
            if crate::projection::statement_line(&fact).is_none_or(|l| l.account != account) {
                return Err(self.corrupt(format!(
                    "seq {} is filed in {account}'s statement but is not its movement",
                    fact.seq
                )));
            }
            out.push(fact);
        }
        if let Some(last) = out.last() {
            self.inner.durable_seq.fetch_max(last.seq, Ordering::SeqCst);
        }
        Ok(out)
    }

    async fn fact(&self, seq: u64) -> Result<Option<Fact>> {
        let Ok(seq) = i64::try_from(seq) else {
            return Ok(None);
        };
        let conn = self.conn().await?;
        let row = conn
            .query_opt("SELECT body FROM facts WHERE seq = $1", &[&seq])
            .await
            .map_err(|e| pg_err(&e))?;
        match row {
            None => Ok(None),
            Some(row) => Ok(Some(self.decode(seq, get(&row, 0)?)?)),
        }
    }

    async fn balances(&self) -> Result<Balances> {
        self.all_balances().await
    }

    async fn balance_at(&self, account: &Account, point: AsOf) -> Result<Option<BalanceAt>> {
        if account.is_system() {
            return Ok(None);
        }
        let Some(currency) = self
            .account(account)
            .await?
            .and_then(|per| per.keys().next().copied())
        else {
            return Ok(None);
        };
        let cut = point
            .seq
            .map_or(i64::MAX, |seq| i64::try_from(seq).unwrap_or(i64::MAX));
        let at = point.time.map(db_time).transpose()?;
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        // The account's range of `facts_by_account` (schema.sql), read backwards from the
        // cut: one row for a seq; for a time, the account's movements after it are passed
        // over, never the rest of the log.
        let stmt = conn
            .prepare_cached(
                "SELECT seq, body FROM facts \
                 WHERE (doc ->> 'account') = $1 AND kind <> 'CommandRejected' AND seq <= $2 \
                 AND ($3::timestamptz IS NULL OR at <= $3) \
                 ORDER BY seq DESC LIMIT 1",
            )
            .await
            .map_err(pg)?;
        let row = conn
            .query_opt(&stmt, &[&account.as_str(), &cut, &at])
            .await
            .map_err(pg)?;
        let Some(row) = row else {
            return Ok(Some(BalanceAt {
                currency,
                balance: 0,
                movement: None,
            }));
        };
        let fact = self.decode(get(&row, 0)?, get(&row, 1)?)?;
        let Some(line) = crate::projection::statement_line(&fact).filter(|l| l.account == account)
        else {
            return Err(self.corrupt(format!(
                "seq {} is filed in {account}'s statement but is not its movement",
                fact.seq
            )));
        };
        Ok(Some(BalanceAt {
            currency,
            balance: line.balance_after,
            movement: Some(fact.seq),
        }))
    }

    async fn account(&self, account: &Account) -> Result<Option<BTreeMap<Currency, i128>>> {
        let conn = self.conn().await?;
        let sql = if account.is_system() {
            "SELECT currency, sum(balance)::text FROM system_balances WHERE account = $1 \
             GROUP BY currency"
        } else {
            "SELECT currency, balance::text FROM accounts WHERE account = $1"
        };
        let rows = conn
            .query(sql, &[&account.as_str()])
            .await
            .map_err(|e| pg_err(&e))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut out = BTreeMap::new();
        for row in &rows {
            out.insert(self.currency(get(row, 0)?)?, self.signed(get(row, 1)?)?);
        }
        Ok(Some(out))
    }

    async fn stats(&self) -> Result<Stats> {
        let conn = self.conn().await?;
        self.stats_now(&conn).await
    }

    fn pending(&self) -> Vec<KeyInfo> {
        let claims: Vec<_> = self
            .inner
            .claims
            .lock()
            .iter()
            .map(|(ck, c)| (ck.clone(), c.clone()))
            .collect();
        let mut out: Vec<KeyInfo> = claims
            .iter()
            .map(|(ck, claim)| self.pending_info(ck, claim))
            .collect();
        out.sort_by(|a, b| (a.since, &a.client, &a.key).cmp(&(b.since, &b.client, &b.key)));
        out
    }

    fn durable_seq(&self) -> u64 {
        self.inner.durable_seq.load(Ordering::SeqCst)
    }

    fn commit_metrics(&self) -> CommitMetrics {
        self.inner.metrics.lock().clone()
    }

    fn memory(&self) -> Vec<MemoryUse> {
        type Ck = (ClientId, Key);
        let claims = self.inner.claims.lock();
        let claims = MemoryUse {
            structure: "claims",
            entries: claims.len() as u64,
            limit: Limit::InFlight,
            bound_bytes: None,
            bytes: claims
                .iter()
                .map(|(ck, claim)| {
                    memory::slot(std::mem::size_of::<(Ck, Claim)>())
                        + memory::key_heap(&ck.0, &ck.1)
                        + memory::command_heap(&claim.command)
                })
                .sum(),
        };
        let activity = self.inner.activity.lock();
        let activity = MemoryUse {
            structure: "activity",
            entries: activity.len() as u64,
            limit: Limit::Entries(ACTIVITY_MAX as u64),
            bound_bytes: Some(memory::at_limit(
                ACTIVITY_MAX as u64,
                std::mem::size_of::<(Ck, (u32, u32))>(),
                2,
            )),
            bytes: activity
                .keys()
                .map(|ck| {
                    memory::slot(std::mem::size_of::<(Ck, (u32, u32))>())
                        + memory::key_heap(&ck.0, &ck.1)
                })
                .sum(),
        };
        vec![claims, activity]
    }

    async fn size_on_disk(&self) -> Result<u64> {
        let conn = self.conn().await?;
        let row = conn
            .query_one(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relkind IN ('r', 'S')",
                &[&self.inner.options.schema],
            )
            .await
            .map_err(|e| pg_err(&e))?;
        Ok(u64::try_from(get::<i64>(&row, 0)?).unwrap_or(0))
    }

    fn failure(&self) -> Option<String> {
        // Every group is its own transaction: a failed one leaves nothing behind that
        // would stop the next, so the store never stops writing as sled's does.
        None
    }

    async fn shutdown(&self) {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::SeqCst);
        loop {
            let idle = inner.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if inner.in_flight.load(Ordering::SeqCst) == 0 {
                break;
            }
            idle.await;
        }
        // Nothing more is counted: the last counts are saved before the pool closes (a
        // PostgreSQL that is unreachable now loses them, as a crash would).
        let _ = self.flush_observed().await;
        inner.pool.close();
    }
}
