//! PgStore's verify: the log folded in one snapshot and checked with the checks both
//! stores share.

use std::collections::HashMap;
use std::time::Duration;

use tokio_postgres::IsolationLevel;

use super::balances::SQL_BALANCES;
use super::copy::{CopyReader, CopyRow, RowBatch, copy_sql};
use super::counters::stats_from_counters;
use super::db::{Result, get, pg_err};
use super::state::PgStore;
use crate::domain::{Account, Currency, Fingerprint};
use crate::fact::Fact;
use crate::json;
use crate::projection::{Balances, Stats};
use crate::store::LedgerError;
use crate::store::verify::{self as checks, Report, VerifyReport};

/// The guarantee `verify` checks instead of sled's gapless log (see the module docs).
pub(super) const SEQ_ORDER: &str = "the log's sequence numbers are unique and increasing";

/// The settings of verify's snapshot (see `verify_now`). Public for the bench that reads
/// the same rows bare. The key rows are sorted by seq for the merge with the log: with
/// 64 MB a million of them (134 MB to sort in memory) spilled to disk, and the sort was
/// the server's larger part of the read; 256 MB keeps about two million in memory, and
/// the server takes it only for the sort, only while a verify runs.
#[doc(hidden)]
pub const VERIFY_SETTINGS: &str = "SET LOCAL statement_timeout = 0; \
     SET LOCAL work_mem = '256MB'; \
     SET LOCAL max_parallel_workers_per_gather = 0; \
     SET LOCAL enable_hashjoin = off; \
     SET LOCAL enable_nestloop = off; \
     SET LOCAL jit = off";

/// On one session: the log with each fact's key row, compared by the join, and the
/// account its statement files it under. The columns of `VERIFY_FACTS`, then whether a
/// key row points at the fact, whether it is the fact's own key's, and the key row's
/// status, fingerprint and answer's digest.
#[doc(hidden)]
pub const VERIFY_LOG: &str = "SELECT f.seq, f.client, f.key, f.body, \
        CASE WHEN f.kind <> 'CommandRejected' THEN f.doc ->> 'account' END, \
        k.seq IS NOT NULL, k.client = f.client AND k.key = f.key, \
        k.status, k.request_hash, k.response_digest \
     FROM facts f LEFT JOIN idempotency_keys k ON k.seq = f.seq \
     ORDER BY f.seq";

/// Where the key row's columns start in a row of `VERIFY_LOG`.
const JOINED: usize = 5;

/// On two sessions, the first: the log in seq order, with the account its statement
/// files each fact under (see `fold_fact`).
#[doc(hidden)]
pub const VERIFY_FACTS: &str = "SELECT seq, client, key, body, \
        CASE WHEN kind <> 'CommandRejected' THEN doc ->> 'account' END \
     FROM facts ORDER BY seq";

/// On two sessions, the second: the key rows sorted by the seq they point at, merged with
/// the log by the client (see `merge_keys`); a pending key (no seq) sorts last.
#[doc(hidden)]
pub const VERIFY_KEYS: &str = "SELECT seq, client, key, status, request_hash, response_digest \
     FROM idempotency_keys ORDER BY seq";

/// The log folded in seq order, and the report so far.
#[derive(Default)]
struct Fold {
    r: Report,
    /// The balances as the log is folded, then (`ordered`) once it is.
    balances: checks::HashedBalances,
    ordered: Balances,
    stats: Stats,
    withdrawals: checks::Withdrawals,
    facts: u64,
    /// The last seq folded.
    prev: Option<i64>,
}

/// What the key rows showed: checked on a thread of their own while the log is folded,
/// since a key's check (its fingerprint, its answer's digest) needs nothing of the fold.
#[derive(Default)]
struct KeyChecks {
    r: Report,
    /// Key rows read: with `keyed`, what tells a key row without its fact.
    rows: u64,
    /// Facts whose key row points at them.
    keyed: u64,
    expired: u64,
    /// A fact whose key row points elsewhere (or nowhere) was seen: look for keys with two
    /// facts, which is the one way a row can point at another fact of its own key.
    misfiled: bool,
    /// Reused for each rendered answer.
    text: String,
}

/// Rows handed on at a time, and batches in flight between the reads and the checks:
/// enough to keep both threads (and both sessions) busy, little enough to stay a few
/// megabytes.
const BATCH_ROWS: usize = 1024;

/// A batch of rows is sent on once its bytes reach this, however few its rows: the
/// offsets in it are 32-bit.
const BATCH_BYTES: usize = 4 << 20;

const BATCHES_IN_FLIGHT: usize = 4;

type Tx<'a> = deadpool_postgres::Transaction<'a>;
type Batches<B> = tokio::sync::mpsc::Receiver<B>;

/// Emptied batches handed back to the stage that fills them. A batch is a few hundred
/// kilobytes: made anew for each and freed on another thread, batches cost fresh pages
/// from the allocator (the kernel zeroing them) and cross-thread frees.
struct Spare<B>(crossbeam_channel::Sender<B>, crossbeam_channel::Receiver<B>);

/// A batch that can be emptied and filled again.
trait Reuse {
    fn empty() -> Self;
    fn clear(&mut self);
}

impl<T> Reuse for Vec<T> {
    fn empty() -> Self {
        Vec::with_capacity(BATCH_ROWS + 1)
    }
    fn clear(&mut self) {
        Vec::clear(self);
    }
}

impl Reuse for RowBatch {
    fn empty() -> Self {
        RowBatch::default()
    }
    fn clear(&mut self) {
        RowBatch::clear(self);
    }
}

impl<B: Reuse> Spare<B> {
    fn new() -> Self {
        let (give, take) = crossbeam_channel::bounded(BATCHES_IN_FLIGHT + 2);
        Self(give, take)
    }

    /// An empty batch: a spare one if there is one.
    fn take(&self) -> B {
        self.1.try_recv().unwrap_or_else(|_| B::empty())
    }

    fn give(&self, mut batch: B) {
        batch.clear();
        let _ = self.0.try_send(batch);
    }
}

impl<B> Clone for Spare<B> {
    fn clone(&self) -> Self {
        Self(self.0.clone(), self.1.clone())
    }
}

impl PgStore {
    /// Rebuilds every projection from the log, in one snapshot, and checks each guarantee
    /// with the same checks and words as the sled store's `verify`.
    pub(super) async fn verify_now(&self) -> Result<VerifyReport> {
        let mut conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let tx = snapshot(&mut conn, None).await?;
        // With two sessions, the key rows are read on the second in the same snapshot, so
        // the server reads and sends the log and the key rows on two backends at once.
        // Only a session free at once is taken: a verify never waits on the pool for it,
        // and without one it reads as on one session.
        let mut second = None;
        if self.inner.options.verify_sessions >= 2 {
            let mut timeouts = self.inner.pool.timeouts();
            timeouts.wait = Some(Duration::ZERO);
            second = self.inner.pool.timeout_get(&timeouts).await.ok();
        }
        let id: Option<String> = match second {
            Some(_) => Some(
                tx.query_one("SELECT pg_export_snapshot()", &[])
                    .await
                    .map_err(pg)
                    .and_then(|row| get(&row, 0))?,
            ),
            None => None,
        };
        let beside = match (second.as_mut(), id.as_deref()) {
            (Some(conn), Some(id)) => Some(snapshot(conn, Some(id)).await?),
            _ => None,
        };
        let mut fold = Fold::default();
        // The withdrawals' table is sized once for the log (see `WITHDRAWALS_RESERVED`).
        let last: Option<i64> = tx
            .query_one("SELECT max(seq) FROM facts", &[])
            .await
            .map_err(pg)
            .and_then(|row| get(&row, 0))?;
        let ahead = usize::try_from(last.unwrap_or(0)).unwrap_or(0);
        fold.withdrawals
            .reserve(ahead.min(checks::WITHDRAWALS_RESERVED));
        let mut keys = match &beside {
            Some(beside) => self.fold_beside(&tx, beside, &mut fold).await?,
            None => self.fold_joined(&tx, &mut fold).await?,
        };
        match beside {
            Some(beside) => {
                let _ = beside.rollback().await;
            }
            // The join met only the key rows that point at a fact; count them all.
            None => {
                let rows: i64 = tx
                    .query_one("SELECT count(*) FROM idempotency_keys", &[])
                    .await
                    .map_err(pg)
                    .and_then(|row| get(&row, 0))?;
                keys.rows = u64::try_from(rows).unwrap_or(0);
            }
        }
        fold.ordered = std::mem::take(&mut fold.balances).into_balances();
        self.check_key_rows(&tx, &mut fold, keys).await?;
        self.check_stored_balances(&tx, &mut fold).await?;
        self.check_refunded(&tx, &mut fold).await?;
        check_inbox(&tx, &mut fold.r).await?;
        check_counters(&tx, &mut fold).await?;
        let _ = tx.rollback().await;
        if let Some(last) = fold.prev {
            self.observe_seq(last);
        }
        let Fold {
            r,
            ordered: balances,
            stats,
            facts,
            ..
        } = fold;
        Ok(VerifyReport {
            facts,
            keys_done: stats.keys_done,
            keys_expired: stats.keys_expired,
            accounts: balances.accounts.keys().filter(|a| !a.is_system()).count(),
            currencies: balances.sums().len(),
            held: checks::held(&balances),
            violations: r.finish(),
        })
    }

    /// On one session: the log in seq order, each fact beside the row of its own key,
    /// as the join meets them: each fact decoded once (see `decode_rows`) and checked
    /// against the fold of the facts before it, then, with its key row, handed to the key
    /// checks on a thread of their own. Returns what the key checks found.
    async fn fold_joined(&self, tx: &Tx<'_>, fold: &mut Fold) -> Result<KeyChecks> {
        use tokio::sync::mpsc::channel;
        let (log_out, log) = channel::<RowBatch>(BATCHES_IN_FLIGHT);
        let (decoded_out, mut decoded) = channel::<Vec<Decoded>>(BATCHES_IN_FLIGHT);
        let (to_checks, mut checked) = channel::<Vec<Decoded>>(BATCHES_IN_FLIGHT);
        let (rows_spare, decoded_spare) = (Spare::new(), Spare::new());
        let store = self.clone();
        let (spares, done) = ((rows_spare.clone(), decoded_spare.clone()), decoded_spare);
        let decoder =
            tokio::task::spawn_blocking(move || store.decode_rows(log, decoded_out, spares));
        let checker = tokio::task::spawn_blocking(move || {
            let mut keys = KeyChecks::default();
            while let Some(batch) = checked.blocking_recv() {
                for d in &batch {
                    if let Some(fact) = d.checked_fact() {
                        check_key_row(KeyRow::joined(d.joined()?), fact, &mut keys)?;
                    }
                }
                done.give(batch);
            }
            Ok::<_, LedgerError>(keys)
        });
        let folding = async move {
            while let Some(mut rows) = decoded.recv().await {
                for d in &mut rows {
                    if fold.prev == Some(d.seq) && d.joined()?.is_some() {
                        // The join meets a fact once per key row pointing at it.
                        let detail = format!("two key rows point at seq {}", d.seq);
                        fold.r.add(checks::KEY_FACT, detail);
                        continue;
                    }
                    fold_fact(d, fold);
                }
                if to_checks.send(rows).await.is_err() {
                    // The checker stopped on an error, which its result below reports.
                    break;
                }
            }
            Ok::<_, LedgerError>(())
        };
        tokio::try_join!(pump(tx, VERIFY_LOG, log_out, rows_spare), folding)?;
        // The fold ends early only if the decoder stopped on an error: reported first.
        joined(decoder, "verify's decoding").await?;
        joined(checker, "verify's key checks").await
    }

    /// On two sessions: the log read on `tx`, each fact decoded once (see `decode_rows`)
    /// and checked against the fold of the facts before it, then handed to the key
    /// checks, which merge the facts with the key rows read on `beside` in the same
    /// order. Returns what the key checks found.
    async fn fold_beside(
        &self,
        tx: &Tx<'_>,
        beside: &Tx<'_>,
        fold: &mut Fold,
    ) -> Result<KeyChecks> {
        use tokio::sync::mpsc::channel;
        let (log_out, log) = channel::<RowBatch>(BATCHES_IN_FLIGHT);
        let (decoded_out, mut decoded) = channel::<Vec<Decoded>>(BATCHES_IN_FLIGHT);
        let (keys_out, keys) = channel::<RowBatch>(BATCHES_IN_FLIGHT);
        let (to_checks, checked) = channel::<Vec<Decoded>>(BATCHES_IN_FLIGHT);
        let (rows_spare, decoded_spare, keys_spare) = (Spare::new(), Spare::new(), Spare::new());
        let store = self.clone();
        let spares = (rows_spare.clone(), decoded_spare.clone());
        let decoder =
            tokio::task::spawn_blocking(move || store.decode_rows(log, decoded_out, spares));
        let keys_given = keys_spare.clone();
        let checker = tokio::task::spawn_blocking(move || {
            merge_keys(checked, decoded_spare, keys, keys_given)
        });
        let folding = async move {
            while let Some(mut rows) = decoded.recv().await {
                for d in &mut rows {
                    fold_fact(d, fold);
                }
                if to_checks.send(rows).await.is_err() {
                    // The checker stopped on an error, which its result below reports.
                    break;
                }
            }
            Ok::<_, LedgerError>(())
        };
        tokio::try_join!(
            pump(tx, VERIFY_FACTS, log_out, rows_spare),
            pump(beside, VERIFY_KEYS, keys_out, keys_spare),
            folding
        )?;
        joined(decoder, "verify's decoding").await?;
        joined(checker, "verify's key checks").await
    }

    /// The log's rows decoded on a thread of their own, ahead of the fold: decoding and
    /// the checks that need only the row and its fact were half of the fold's thread,
    /// which the whole verify waits on.
    fn decode_rows(
        &self,
        mut rows: Batches<RowBatch>,
        out: tokio::sync::mpsc::Sender<Vec<Decoded>>,
        (rows_spare, decoded_spare): (Spare<RowBatch>, Spare<Vec<Decoded>>),
    ) -> Result<()> {
        while let Some(batch) = rows.blocking_recv() {
            let mut decoded = decoded_spare.take();
            for i in 0..batch.len() {
                decoded.push(self.decode_row(batch.row(i))?);
            }
            rows_spare.give(batch);
            if out.blocking_send(decoded).is_err() {
                // The fold stopped on an error of its own.
                break;
            }
        }
        Ok(())
    }

    /// One row of the log with its fact decoded and what is found of the row alone.
    fn decode_row(&self, row: CopyRow<'_>) -> Result<Decoded> {
        let seq = row.i64(0)?;
        let fact = match self.decode(seq, row.bytes(3)?) {
            Ok(f) => f,
            Err(e) => {
                return Ok(Decoded {
                    key: JoinedKey::read(row)?,
                    seq,
                    fact: Err(e.to_string()),
                    misfiled: None,
                    unlisted: None,
                    checked: false,
                });
            }
        };
        let (c, k) = (row.text(1)?, row.text(2)?);
        let misfiled = (fact.client.as_str() != c || fact.key.as_str() != k).then(|| {
            format!(
                "seq {seq} is filed under ({c:?}, {k:?}) but is the fact of ({:?}, {:?})",
                fact.client, fact.key
            )
        });
        // The statements' index (schema.sql) files a fact under its `doc`'s account unless
        // its `kind` is a rejection: a row whose columns disagree with its body would be
        // missing from its account's statement, or listed in another's.
        let filed = row.opt_text(4)?;
        let line = crate::projection::statement_line(&fact);
        let unlisted = (filed != line.map(|l| l.account.as_str())).then(|| {
            format!(
                "seq {seq} is in the statement of {filed:?} but moves {:?}",
                line.map(|l| l.account.as_str())
            )
        });
        Ok(Decoded {
            key: JoinedKey::read(row)?,
            seq,
            fact: Ok(fact),
            misfiled,
            unlisted,
            checked: false,
        })
    }

    /// Key rows the log's stream did not meet: a key row is met once, beside the fact it
    /// points at, so fewer meetings than rows mean rows without their fact. And keys
    /// with two facts, looked for only when a fact was found without its key row.
    async fn check_key_rows(&self, tx: &Tx<'_>, fold: &mut Fold, keys: KeyChecks) -> Result<()> {
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let rows = keys.rows;
        fold.r.absorb(keys.r);
        for _ in 0..keys.expired {
            fold.stats.expire_one();
        }
        if rows != keys.keyed {
            let orphans = tx
                .query(
                    "SELECT k.client, k.key, k.status, k.seq FROM idempotency_keys k \
                     WHERE NOT EXISTS (SELECT 1 FROM facts f WHERE f.seq = k.seq \
                       AND f.client = k.client AND f.key = k.key) \
                     ORDER BY k.client, k.key LIMIT 100",
                    &[],
                )
                .await
                .map_err(pg)?;
            for row in &orphans {
                let (c, k): (&str, &str) = (get(row, 0)?, get(row, 1)?);
                let (status, seq): (&str, Option<i64>) = (get(row, 2)?, get(row, 3)?);
                fold.r.add(
                    checks::KEY_FACT,
                    match seq {
                        None => format!("key {k:?} of {c:?} is {status} but has no fact"),
                        Some(seq) => {
                            format!("key {k:?} of {c:?} points at seq {seq}, which is not its fact")
                        }
                    },
                );
            }
        }
        if keys.misfiled {
            let twice = tx
                .query(
                    "SELECT client, key, min(seq), max(seq) FROM facts \
                     GROUP BY client, key HAVING count(*) > 1 ORDER BY 3 LIMIT 100",
                    &[],
                )
                .await
                .map_err(pg)?;
            for row in &twice {
                let (c, k): (&str, &str) = (get(row, 0)?, get(row, 1)?);
                let (first, last): (i64, i64) = (get(row, 2)?, get(row, 3)?);
                fold.r.add(
                    checks::ONE_EFFECT,
                    format!("key {k:?} of client {c:?} has facts {first} and {last}"),
                );
            }
        }
        Ok(())
    }

    /// Stored balances (user rows, system shards summed) against the fold.
    async fn check_stored_balances(&self, tx: &Tx<'_>, fold: &mut Fold) -> Result<()> {
        let rows = tx.query(SQL_BALANCES, &[]).await.map_err(|e| pg_err(&e))?;
        let mut stored = Balances::default();
        for row in &rows {
            let name: String = get(row, 0)?;
            let parsed = Account::parse_any(&name)
                .ok()
                .zip(Currency::parse(&get::<String>(row, 1)?).ok());
            let balance: Option<i128> = get::<String>(row, 2)?.parse().ok();
            match (parsed, balance) {
                (Some((a, cur)), Some(b)) => {
                    stored.accounts.entry(a).or_default().insert(cur, b);
                }
                _ => fold.r.add(
                    checks::DERIVED,
                    format!("an unreadable balance row of {name:?}"),
                ),
            }
        }
        checks::check_balances(&mut fold.r, &fold.ordered, &stored);
        Ok(())
    }

    /// Refunded totals against the fold, both ways.
    async fn check_refunded(&self, tx: &Tx<'_>, fold: &mut Fold) -> Result<()> {
        let rows = tx
            .query(
                "SELECT client, withdrawal, withdrawn, total FROM refunded",
                &[],
            )
            .await
            .map_err(|e| pg_err(&e))?;
        let mut refunded_rows = 0usize;
        for row in &rows {
            refunded_rows += 1;
            let stored = (get::<i64>(row, 2)?, get::<i64>(row, 3)?);
            let names = self.names(get(row, 0)?, get(row, 1)?).ok();
            let folded = names
                .as_ref()
                .and_then(|ck| fold.withdrawals.get(&checks::key_digest(&ck.0, &ck.1)))
                .copied();
            let folded_i =
                folded.and_then(|(w, t)| Some((i64::try_from(w).ok()?, i64::try_from(t).ok()?)));
            if folded_i != Some(stored) {
                fold.r.add(
                    checks::REFUNDS,
                    format!(
                        "a stored refunded total {stored:?} of {names:?} disagrees with the log's {folded:?}"
                    ),
                );
            }
        }
        let refunded_folded = fold.withdrawals.values().filter(|(_, t)| *t > 0).count();
        if refunded_rows != refunded_folded {
            fold.r.add(
                checks::REFUNDS,
                format!(
                    "{refunded_folded} withdrawals were refunded, {refunded_rows} refunded rows"
                ),
            );
        }
        Ok(())
    }
}

/// A row of the log as the fold takes it from the decoder: its seq, its fact (or why its
/// body does not decode), and what its columns were found to say against its body.
struct Decoded {
    /// On one session, what the row says of the key row pointing at the fact.
    key: Option<JoinedKey>,
    seq: i64,
    fact: std::result::Result<Fact, String>,
    /// Filed under names that are not its fact's.
    misfiled: Option<String>,
    /// In the statement of another account than the one it moves.
    unlisted: Option<String>,
    /// Set by the fold: the fact goes on to the key checks (it decoded, and is not a
    /// second meeting of the same fact).
    checked: bool,
}

/// The columns of a row of `VERIFY_LOG` (one session) that come from the key row the
/// join met, kept as values so the row's batch goes back to the read at once.
struct JoinedKey {
    /// `None`: no key row points at the fact.
    row: Option<KeyCols>,
}

struct KeyCols {
    same_key: bool,
    status: Status,
    /// The fingerprint, if it is as long as one (any other is compared as empty).
    hash: Option<Fingerprint>,
    /// The answer's digest: `None` for NULL, `Some(None)` for one of another length.
    stored: Option<Option<[u8; 16]>>,
}

/// A key row's status: the two a fact's key can have, or what else it says.
enum Status {
    Done,
    Expired,
    Other(String),
}

impl Status {
    fn as_str(&self) -> &str {
        match self {
            Status::Done => "done",
            Status::Expired => "expired",
            Status::Other(s) => s,
        }
    }
}

impl JoinedKey {
    /// The key row's columns of a row of `VERIFY_LOG`; `None` for a row of `VERIFY_FACTS`
    /// (two sessions), which has none.
    fn read(row: CopyRow<'_>) -> Result<Option<Self>> {
        if row.len() <= JOINED {
            return Ok(None);
        }
        if !row.bool(JOINED)? {
            return Ok(Some(Self { row: None }));
        }
        let status = match row.text(JOINED + 2)? {
            "done" => Status::Done,
            "expired" => Status::Expired,
            other => Status::Other(other.to_owned()),
        };
        Ok(Some(Self {
            row: Some(KeyCols {
                same_key: row.opt_bool(JOINED + 1)? == Some(true),
                status,
                hash: row.bytes(JOINED + 3)?.try_into().ok().map(Fingerprint),
                stored: row.opt_bytes(JOINED + 4)?.map(|b| b.try_into().ok()),
            }),
        }))
    }
}

impl Decoded {
    /// The fact, if the fold handed it on to the key checks.
    fn checked_fact(&self) -> Option<&Fact> {
        self.fact.as_ref().ok().filter(|_| self.checked)
    }

    /// What the row of `VERIFY_LOG` this was decoded from said of the key row: `None`
    /// if no key row points at the fact.
    fn joined(&self) -> Result<Option<&KeyCols>> {
        match &self.key {
            Some(k) => Ok(k.row.as_ref()),
            None => Err(LedgerError::Unavailable(format!(
                "seq {}: the key row's columns are missing",
                self.seq
            ))),
        }
    }
}

/// Folds one decoded row's fact, reporting what was found of it in the log's order, and
/// marks it for the key checks unless the row was reported instead (a body that does not
/// decode). The fact stays where it is: moved into a batch of its own, a fact and its row
/// were copied once more per fact.
fn fold_fact(d: &mut Decoded, fold: &mut Fold) {
    let r = &mut fold.r;
    let seq = d.seq;
    let prev = fold.prev;
    if prev.is_some_and(|p| seq <= p) || seq < 1 {
        r.add(SEQ_ORDER, format!("seq {seq} after {prev:?}"));
    }
    fold.prev = Some(seq);
    fold.facts += 1;
    let fact = match &d.fact {
        Ok(f) => f,
        Err(e) => {
            r.add(checks::KEY_FACT, e.clone());
            return;
        }
    };
    if let Some(detail) = d.misfiled.take() {
        r.add(checks::KEY_FACT, detail);
    }
    if let Some(detail) = d.unlisted.take() {
        r.add(checks::STATEMENTS, detail);
    }
    let after = fold.balances.apply(fact);
    checks::check_after(r, fact, after, &mut fold.withdrawals);
    fold.stats.apply(fact);
    d.checked = true;
}

/// The result of one of verify's threads.
async fn joined<T>(task: tokio::task::JoinHandle<Result<T>>, what: &str) -> Result<T> {
    task.await
        .map_err(|e| LedgerError::Unavailable(format!("{what}: {e}")))?
}

/// Starts verify's read-only snapshot on `conn`: a new one, or the one another session
/// exported (`id`), so that two sessions read the same instant.
async fn snapshot<'a>(conn: &'a mut deadpool_postgres::Object, id: Option<&str>) -> Result<Tx<'a>> {
    let pg = |e: tokio_postgres::Error| pg_err(&e);
    let tx = conn
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg)?;
    if let Some(id) = id {
        // The id comes from the server's pg_export_snapshot; quoted as a literal anyway.
        let id = id.replace('\'', "''");
        tx.batch_execute(&format!("SET TRANSACTION SNAPSHOT '{id}'"))
            .await
            .map_err(pg)?;
    }
    tx.batch_execute(VERIFY_SETTINGS).await.map_err(pg)?;
    Ok(tx)
}

/// Streams the rows of `sql` into `out` in batches, until they end or `out` is closed:
/// read with a binary COPY (see `copy.rs`), each row a slice of the stream.
async fn pump(
    tx: &Tx<'_>,
    sql: &str,
    out: tokio::sync::mpsc::Sender<RowBatch>,
    spare: Spare<RowBatch>,
) -> Result<()> {
    use futures_util::TryStreamExt as _;
    let pg = |e: tokio_postgres::Error| pg_err(&e);
    let chunks = tx.copy_out(&copy_sql(sql)).await.map_err(pg)?;
    let mut chunks = std::pin::pin!(chunks);
    let mut reader = CopyReader::default();
    let mut batch = spare.take();
    while let Some(chunk) = chunks.try_next().await.map_err(pg)? {
        reader.push(&chunk, &mut batch)?;
        drop(chunk);
        // A row not yet whole moves to the next batch: with at least one whole row here,
        // a long row moves once, not once per chunk.
        if batch.len() >= BATCH_ROWS || (batch.bytes() >= BATCH_BYTES && !batch.is_empty()) {
            let mut next = spare.take();
            reader.carry(&mut batch, &mut next);
            let full = std::mem::replace(&mut batch, next);
            if out.send(full).await.is_err() {
                // The reader stopped on an error of its own.
                return Ok(());
            }
        }
    }
    reader.finish(&batch)?;
    if !batch.is_empty() {
        let _ = out.send(batch).await;
    }
    Ok(())
}

/// The key rows in the order of the seq they point at, read where they are in their
/// batch; a batch read through is handed back to the read.
struct KeyRows {
    batches: Batches<RowBatch>,
    spare: Spare<RowBatch>,
    batch: RowBatch,
    /// The next row's place in `batch`.
    at: usize,
}

impl KeyRows {
    /// The seq the next row points at: `None` when the rows are done, `Some(None)` for a
    /// pending key's row (they sort last).
    fn peek(&mut self) -> Result<Option<Option<i64>>> {
        while self.at >= self.batch.len() {
            let Some(next) = self.batches.blocking_recv() else {
                return Ok(None);
            };
            self.spare.give(std::mem::replace(&mut self.batch, next));
            self.at = 0;
        }
        self.batch.row(self.at).opt_i64(0).map(Some)
    }

    /// The next row, once `peek` has found there is one.
    fn row(&self) -> Option<CopyRow<'_>> {
        (self.at < self.batch.len()).then(|| self.batch.row(self.at))
    }

    /// Past the next row, counting it.
    fn skip(&mut self, keys: &mut KeyChecks) {
        if self.at < self.batch.len() {
            keys.rows += 1;
            self.at += 1;
        }
    }
}

/// The facts the fold hands over, in seq order, merged with the key rows sorted by the
/// seq they point at: each fact meets the key rows pointing at it. A key row that meets
/// no fact is counted and found again by `check_key_rows`.
fn merge_keys(
    mut facts: Batches<Vec<Decoded>>,
    facts_spare: Spare<Vec<Decoded>>,
    batches: Batches<RowBatch>,
    spare: Spare<RowBatch>,
) -> Result<KeyChecks> {
    let mut keys = KeyChecks::default();
    let mut rows = KeyRows {
        batches,
        spare,
        batch: RowBatch::default(),
        at: 0,
    };
    while let Some(batch) = facts.blocking_recv() {
        for d in &batch {
            let Some(fact) = d.checked_fact() else {
                continue;
            };
            let seq = i64::try_from(fact.seq).unwrap_or(i64::MAX);
            while matches!(rows.peek()?, Some(Some(s)) if s < seq) {
                rows.skip(&mut keys);
            }
            let met = matches!(rows.peek()?, Some(Some(s)) if s == seq);
            let row = match rows.row() {
                Some(row) if met => Some(KeyRow::read(row, fact)?),
                _ => None,
            };
            check_key_row(row, fact, &mut keys)?;
            if met {
                rows.skip(&mut keys);
            }
            while rows.peek()? == Some(Some(seq)) {
                rows.skip(&mut keys);
                keys.r
                    .add(checks::KEY_FACT, format!("two key rows point at seq {seq}"));
            }
        }
        facts_spare.give(batch);
    }
    while rows.peek()?.is_some() {
        rows.skip(&mut keys);
    }
    Ok(keys)
}

/// A key row as its checks read it, from either read.
struct KeyRow<'a> {
    /// The row is the fact's own key's.
    same_key: bool,
    status: &'a str,
    hash: &'a [u8],
    stored: Option<&'a [u8]>,
}

impl<'a> KeyRow<'a> {
    /// A row of `VERIFY_KEYS`, whose key is compared with the fact's here.
    fn read(row: CopyRow<'a>, fact: &Fact) -> Result<Self> {
        let (client, key) = (row.text(1)?, row.text(2)?);
        Ok(Self {
            same_key: client == fact.client.as_str() && key == fact.key.as_str(),
            status: row.text(3)?,
            hash: row.bytes(4)?,
            stored: row.opt_bytes(5)?,
        })
    }

    /// The key row in a row of `VERIFY_LOG`, compared by the join; `None` if no key row
    /// points at the fact.
    fn joined(cols: Option<&'a KeyCols>) -> Option<Self> {
        cols.map(|c| Self {
            same_key: c.same_key,
            status: c.status.as_str(),
            hash: c.hash.as_ref().map_or(&[][..], |h| &h.0[..]),
            stored: c
                .stored
                .as_ref()
                .map(|d| d.as_ref().map_or(&[][..], |d| &d[..])),
        })
    }
}

/// A fact against the row of its key: the row points at this fact, remembers its
/// command, and holds the answer the fact gives (or none, once expired).
fn check_key_row(row: Option<KeyRow<'_>>, fact: &Fact, keys: &mut KeyChecks) -> Result<()> {
    let r = &mut keys.r;
    let (c, k) = (&fact.client, &fact.key);
    let Some(row) = row else {
        keys.misfiled = true;
        r.add(
            checks::KEY_FACT,
            format!(
                "seq {} is the fact of key {k:?} of {c:?}, but no key row points at it",
                fact.seq
            ),
        );
        return Ok(());
    };
    if !row.same_key {
        keys.misfiled = true;
        r.add(
            checks::KEY_FACT,
            format!(
                "seq {} is the fact of key {k:?} of {c:?}, but another key points at it",
                fact.seq
            ),
        );
        return Ok(());
    }
    let status = row.status;
    keys.keyed += 1;
    if row.hash != fact.body.command_fingerprint().0 {
        r.add(
            checks::SAME_ANSWER,
            format!(
                "seq {}: the key's fingerprint is not its fact's command",
                fact.seq
            ),
        );
    }
    match (status, row.stored) {
        ("done", Some(stored)) => {
            if stored != response_digest(fact, &mut keys.text) {
                r.add(
                    checks::SAME_ANSWER,
                    format!("key {k:?} of {c:?}: the stored response is not its fact's"),
                );
            }
        }
        ("expired", None) => keys.expired += 1,
        ("done", None) => r.add(
            checks::SAME_ANSWER,
            format!("key {k:?} of {c:?}: the stored response is not its fact's"),
        ),
        ("expired", Some(_)) => {
            keys.expired += 1;
            r.add(
                checks::SAME_ANSWER,
                format!("key {k:?} of {c:?} is expired but keeps its response"),
            );
        }
        (other, _) => r.add(
            checks::KEY_FACT,
            format!("key {k:?} of {c:?} is committed as {other}"),
        ),
    }
    Ok(())
}

/// The digest PostgreSQL keeps of a stored response (`response_digest`, schema version
/// 12) if it is the answer `fact` gives: the first 16 bytes of SHA-256 over the text
/// stored, which is the answer as PostgreSQL prints jsonb (`json::answer_jsonb`).
/// A response is compared by 16 bytes instead of being read and parsed.
fn response_digest(fact: &Fact, text: &mut String) -> [u8; 16] {
    use sha2::Digest as _;
    text.clear();
    json::answer_jsonb(fact, text);
    let full = sha2::Sha256::digest(text.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// Every inbox record was written with the fact that answered its message.
async fn check_inbox(tx: &Tx<'_>, r: &mut Report) -> Result<()> {
    let unanswered: i64 = tx
        .query_one("SELECT count(*) FROM inbox WHERE seq IS NULL", &[])
        .await
        .map_err(|e| pg_err(&e))
        .and_then(|row| get(&row, 0))?;
    if unanswered > 0 {
        r.add(
            checks::KEY_FACT,
            format!("{unanswered} inbox records have no fact"),
        );
    }
    Ok(())
}

/// Counters against the fold.
async fn check_counters(tx: &Tx<'_>, fold: &mut Fold) -> Result<()> {
    let rows = tx
        .query(
            "SELECT name, sum(n)::bigint FROM counters GROUP BY name",
            &[],
        )
        .await
        .map_err(|e| pg_err(&e))?;
    let mut by_name = HashMap::new();
    for row in &rows {
        by_name.insert(get::<String>(row, 0)?, get::<i64>(row, 1)?);
    }
    let counted = stats_from_counters(&by_name);
    let stats = &fold.stats;
    let pairs = [
        ("keys done", counted.keys_done, stats.keys_done),
        ("keys expired", counted.keys_expired, stats.keys_expired),
        ("applied", counted.applied_total(), stats.applied_total()),
        ("rejected", counted.rejected_total(), stats.rejected_total()),
    ];
    for (name, stored, folded) in pairs {
        if stored != folded {
            fold.r.add(
                checks::COUNTERS,
                format!("{name}: stored {stored}, the log gives {folded}"),
            );
        }
    }
    if counted.applied != stats.applied || counted.rejected != stats.rejected {
        fold.r.add(
            checks::COUNTERS,
            "per-kind counts differ from the log".into(),
        );
    }
    Ok(())
}
