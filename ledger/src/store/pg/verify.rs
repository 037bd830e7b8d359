//! `verify` on PostgreSQL: the log folded in one snapshot and checked with the checks
//! both stores share.

// The store's helpers (errors, conversions, claims) and what it imports.
use super::*;
use crate::store::verify as checks;

/// The guarantee `verify` checks instead of sled's gapless log (see the module docs).
pub(super) const SEQ_ORDER: &str = "the log's sequence numbers are unique and increasing";

/// The settings of verify's snapshot (see `verify_now`). Public for the bench that reads
/// the same rows bare.
#[doc(hidden)]
pub const VERIFY_SETTINGS: &str = "SET LOCAL statement_timeout = 0; \
     SET LOCAL work_mem = '64MB'; \
     SET LOCAL max_parallel_workers_per_gather = 0; \
     SET LOCAL enable_hashjoin = off; \
     SET LOCAL enable_nestloop = off";

/// The log with each fact's key row and the account its statement files it under (see
/// `fold_log`).
#[doc(hidden)]
pub const VERIFY_LOG: &str = "SELECT f.seq, f.client, f.key, f.body, k.seq IS NOT NULL, \
        k.client = f.client AND k.key = f.key, \
        k.status, k.request_hash, k.response_digest, \
        CASE WHEN f.kind <> 'CommandRejected' THEN f.doc ->> 'account' END \
     FROM facts f LEFT JOIN idempotency_keys k ON k.seq = f.seq \
     ORDER BY f.seq";

/// The log folded in seq order, and the report so far.
#[derive(Default)]
struct Fold {
    r: Report,
    balances: Balances,
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
    /// Facts whose key row points at them: with the count of key rows, what tells a key
    /// row without its fact.
    keyed: u64,
    expired: u64,
    /// A fact whose key row points elsewhere (or nowhere) was seen: look for keys with two
    /// facts, which is the one way a row can point at another fact of its own key.
    misfiled: bool,
    /// Reused for each rendered answer.
    text: String,
}

/// Facts handed to the key checks at a time, and batches in flight: enough to keep both
/// threads busy, little enough to stay a few megabytes.
const KEY_BATCH: usize = 512;
const KEY_BATCHES_IN_FLIGHT: usize = 8;

type Tx<'a> = deadpool_postgres::Transaction<'a>;

impl PgStore {
    /// Rebuilds every projection from the log, in one snapshot, and checks each guarantee
    /// with the same checks and words as the sled store's `verify`.
    pub(super) async fn verify_now(&self) -> Result<VerifyReport> {
        let mut conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let tx = conn
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(pg)?;
        // The log is read in seq order beside the key rows sorted by the seq they point at:
        // a merge of two ordered inputs that yields its first row once the key rows are
        // sorted, in memory where they fit. A hash join would need the whole result sorted
        // again; parallel workers would take the core the fold runs on.
        tx.batch_execute(VERIFY_SETTINGS).await.map_err(pg)?;
        let mut fold = Fold::default();
        let keys = self.fold_log(&tx, &mut fold).await?;
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
            balances,
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

    /// The log in seq order, each fact beside the row of its own key, streamed as the
    /// server sends it: each fact decoded once, checked against its key row and against
    /// the fold of the facts before it. Returns what the key checks found.
    async fn fold_log(&self, tx: &Tx<'_>, fold: &mut Fold) -> Result<KeyChecks> {
        use futures_util::TryStreamExt as _;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let rows = tx
            .query_raw(VERIFY_LOG, std::iter::empty::<i64>())
            .await
            .map_err(pg)?;
        let (to_checks, mut batches) =
            tokio::sync::mpsc::channel::<Vec<(Row, Fact)>>(KEY_BATCHES_IN_FLIGHT);
        let checker = tokio::task::spawn_blocking(move || {
            let mut keys = KeyChecks::default();
            while let Some(batch) = batches.blocking_recv() {
                for (row, fact) in &batch {
                    check_key_row(row, fact, &mut keys)?;
                }
            }
            Ok::<_, LedgerError>(keys)
        });
        let mut rows = std::pin::pin!(rows);
        let mut batch = Vec::with_capacity(KEY_BATCH);
        while let Some(row) = rows.try_next().await.map_err(pg)? {
            if let Some(fact) = self.fold_fact(&row, fold)? {
                batch.push((row, fact));
            }
            if batch.len() >= KEY_BATCH {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(KEY_BATCH));
                if to_checks.send(full).await.is_err() {
                    // The checker stopped on an error, which its result below reports.
                    break;
                }
            }
        }
        if !batch.is_empty() {
            let _ = to_checks.send(batch).await;
        }
        drop(to_checks);
        checker
            .await
            .map_err(|e| LedgerError::Unavailable(format!("verify's key checks: {e}")))?
    }

    /// Folds one row's fact; returns it for the key checks, or `None` when the row was
    /// reported instead (a second key row for one fact, a body that does not decode).
    fn fold_fact(&self, row: &Row, fold: &mut Fold) -> Result<Option<Fact>> {
        let r = &mut fold.r;
        let seq: i64 = get(row, 0)?;
        let prev = fold.prev;
        if prev == Some(seq) && get::<bool>(row, 4)? {
            // The join meets a fact once per key row pointing at it.
            r.add(checks::KEY_FACT, format!("two key rows point at seq {seq}"));
            return Ok(None);
        }
        if prev.is_some_and(|p| seq <= p) || seq < 1 {
            r.add(SEQ_ORDER, format!("seq {seq} after {prev:?}"));
        }
        fold.prev = Some(seq);
        fold.facts += 1;
        let fact = match self.decode(seq, get(row, 3)?) {
            Ok(f) => f,
            Err(e) => {
                r.add(checks::KEY_FACT, e.to_string());
                return Ok(None);
            }
        };
        let (c, k): (&str, &str) = (get(row, 1)?, get(row, 2)?);
        if fact.client.as_str() != c || fact.key.as_str() != k {
            r.add(
                checks::KEY_FACT,
                format!(
                    "seq {seq} is filed under ({c:?}, {k:?}) but is the fact of ({:?}, {:?})",
                    fact.client, fact.key
                ),
            );
        }
        // The statements' index (v7.sql) files a fact under its `doc`'s account unless its
        // `kind` is a rejection: a row whose columns disagree with its body would be
        // missing from its account's statement, or listed in another's.
        let filed: Option<&str> = get(row, 9)?;
        let line = crate::projection::statement_line(&fact);
        if filed != line.map(|l| l.account.as_str()) {
            fold.r.add(
                checks::STATEMENTS,
                format!(
                    "seq {seq} is in the statement of {filed:?} but moves {:?}",
                    line.map(|l| l.account.as_str())
                ),
            );
        }
        checks::check_fold(&mut fold.r, &fact, &fold.balances, &mut fold.withdrawals);
        fold.balances.apply(&fact);
        fold.stats.apply(&fact);
        Ok(Some(fact))
    }

    /// Key rows the log's stream did not meet: a key row is met once, beside the fact it
    /// points at, so fewer meetings than rows mean rows without their fact. And keys
    /// with two facts, looked for only when a fact was found without its key row.
    async fn check_key_rows(&self, tx: &Tx<'_>, fold: &mut Fold, keys: KeyChecks) -> Result<()> {
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let rows: i64 = tx
            .query_one("SELECT count(*) FROM idempotency_keys", &[])
            .await
            .map_err(pg)
            .and_then(|row| get(&row, 0))?;
        fold.r.absorb(keys.r);
        for _ in 0..keys.expired {
            fold.stats.expire_one();
        }
        if u64::try_from(rows).ok() != Some(keys.keyed) {
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
        checks::check_balances(&mut fold.r, &fold.balances, &stored);
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

/// A fact against the row of its key, read beside it: the row points at this fact,
/// remembers its command, and holds the answer the fact gives (or none, once expired).
fn check_key_row(row: &Row, fact: &Fact, keys: &mut KeyChecks) -> Result<()> {
    let r = &mut keys.r;
    let (c, k) = (&fact.client, &fact.key);
    if !get::<bool>(row, 4)? {
        keys.misfiled = true;
        r.add(
            checks::KEY_FACT,
            format!(
                "seq {} is the fact of key {k:?} of {c:?}, but no key row points at it",
                fact.seq
            ),
        );
        return Ok(());
    }
    if get::<Option<bool>>(row, 5)? != Some(true) {
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
    let status: &str = get(row, 6)?;
    keys.keyed += 1;
    let hash: &[u8] = get(row, 7)?;
    if hash != fact.body.command_fingerprint().0 {
        r.add(
            checks::SAME_ANSWER,
            format!(
                "seq {}: the key's fingerprint is not its fact's command",
                fact.seq
            ),
        );
    }
    let stored: Option<&[u8]> = get(row, 8)?;
    match (status, stored) {
        ("done", Some(stored)) => {
            if stored != response_digest(&Outcome::from_fact(fact), &mut keys.text) {
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
/// 6): the first 16 bytes of SHA-256 over `jsonb_send`, a version byte and then the text
/// PostgreSQL prints for the document. That text is written here as PostgreSQL writes it,
/// so a response is compared by 16 bytes instead of being read and parsed.
fn response_digest(outcome: &Outcome, text: &mut String) -> [u8; 16] {
    use sha2::Digest as _;
    text.clear();
    fact::json::outcome_jsonb(outcome, text);
    let mut h = sha2::Sha256::new();
    h.update([1u8]);
    h.update(text.as_bytes());
    let full = h.finalize();
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
