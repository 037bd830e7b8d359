//! `verify` on PostgreSQL: the log folded in one snapshot and checked with the checks
//! both stores share.

// The store's helpers (errors, conversions, claims) and what it imports.
use super::*;
use crate::store::verify as checks;

/// Rows fetched per round trip when `verify` reads the whole log.
pub(super) const VERIFY_CHUNK: i32 = 10_000;

/// The guarantee `verify` checks instead of sled's gapless log (see the module docs).
pub(super) const SEQ_ORDER: &str = "the log's sequence numbers are unique and increasing";

/// The log folded in seq order, and the report so far.
#[derive(Default)]
struct Fold {
    r: Report,
    balances: Balances,
    stats: Stats,
    /// Each key's fact, by (client, key).
    seen: HashMap<(ClientId, Key), u64>,
    withdrawals: checks::Withdrawals,
    facts: u64,
    /// The last seq folded.
    prev: Option<i64>,
}

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
        tx.batch_execute("SET LOCAL statement_timeout = 0")
            .await
            .map_err(pg)?;
        let mut fold = Fold::default();
        self.fold_log(&tx, &mut fold).await?;
        self.check_keys(&tx, &mut fold).await?;
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
            violations: r.finish(),
        })
    }

    /// The log, in seq order, a chunk per round trip: each fact filed under its own key,
    /// one per key, and checked against the fold of those before it.
    async fn fold_log(&self, tx: &Tx<'_>, fold: &mut Fold) -> Result<()> {
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let portal = tx
            .bind("SELECT seq, client, key, body FROM facts ORDER BY seq", &[])
            .await
            .map_err(pg)?;
        loop {
            let rows = tx.query_portal(&portal, VERIFY_CHUNK).await.map_err(pg)?;
            if rows.is_empty() {
                return Ok(());
            }
            for row in &rows {
                self.fold_fact(row, fold)?;
            }
        }
    }

    fn fold_fact(&self, row: &Row, fold: &mut Fold) -> Result<()> {
        let r = &mut fold.r;
        let seq: i64 = get(row, 0)?;
        let prev = fold.prev;
        if prev.is_some_and(|p| seq <= p) || seq < 1 {
            r.add(SEQ_ORDER, format!("seq {seq} after {prev:?}"));
        }
        fold.prev = Some(seq);
        fold.facts += 1;
        let fact = match self.decode(seq, get(row, 3)?) {
            Ok(f) => f,
            Err(e) => {
                r.add(checks::KEY_FACT, e.to_string());
                return Ok(());
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
        let ck = (fact.client.clone(), fact.key.clone());
        if let Some(first) = fold.seen.insert(ck, fact.seq) {
            r.add(
                checks::ONE_EFFECT,
                format!(
                    "key {:?} of client {:?} has facts {first} and {seq}",
                    fact.key, fact.client
                ),
            );
        }
        checks::check_fold(r, &fact, &fold.balances, &mut fold.withdrawals);
        fold.balances.apply(&fact);
        fold.stats.apply(&fact);
        Ok(())
    }

    /// Keys: each points at its own fact, remembers its command, and holds the answer
    /// its fact gives (or none, once expired).
    async fn check_keys(&self, tx: &Tx<'_>, fold: &mut Fold) -> Result<()> {
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let portal = tx
            .bind(
                "SELECT k.client, k.key, k.request_hash, k.status, k.seq, k.response, f.body \
                 FROM idempotency_keys k LEFT JOIN facts f ON f.seq = k.seq",
                &[],
            )
            .await
            .map_err(pg)?;
        let mut keys = 0u64;
        loop {
            let rows = tx.query_portal(&portal, VERIFY_CHUNK).await.map_err(pg)?;
            if rows.is_empty() {
                break;
            }
            for row in &rows {
                keys += 1;
                self.check_key(row, fold)?;
            }
        }
        if keys != u64::try_from(fold.seen.len()).unwrap_or(u64::MAX) {
            fold.r.add(
                checks::KEY_FACT,
                format!("{} facts but {keys} key rows", fold.seen.len()),
            );
        }
        Ok(())
    }

    fn check_key(&self, row: &Row, fold: &mut Fold) -> Result<()> {
        let r = &mut fold.r;
        let (client, key): (String, String) = (get(row, 0)?, get(row, 1)?);
        let status: String = get(row, 3)?;
        let seq: Option<i64> = get(row, 4)?;
        let response: Option<serde_json::Value> = get(row, 5)?;
        let body: Option<&[u8]> = get(row, 6)?;
        if status == "expired" {
            fold.stats.expire_one();
        }
        let Ok((c, k)) = self.names(client.clone(), key.clone()) else {
            r.add(
                checks::KEY_FACT,
                format!("a key row with an unreadable name {client:?} {key:?}"),
            );
            return Ok(());
        };
        let (Some(seq), Some(body)) = (seq, body) else {
            r.add(
                checks::KEY_FACT,
                format!("key {k:?} of {c:?} is {status} but has no fact"),
            );
            return Ok(());
        };
        match fold.seen.get(&(c.clone(), k.clone())) {
            Some(s) if i64::try_from(*s).ok() == Some(seq) => {}
            Some(s) => r.add(
                checks::KEY_FACT,
                format!("key {k:?} of {c:?} points at seq {seq} but its fact is {s}"),
            ),
            None => r.add(
                checks::KEY_FACT,
                format!("key {k:?} of {c:?} points at seq {seq}, a fact of another key"),
            ),
        }
        let Ok(fact) = self.decode(seq, body) else {
            return Ok(());
        };
        let hash: &[u8] = get(row, 2)?;
        if hash != fact.body.command_fingerprint().0 {
            r.add(
                checks::SAME_ANSWER,
                format!("seq {seq}: the key's fingerprint is not its fact's command"),
            );
        }
        let answer = fact::json::outcome(&Outcome::from_fact(&fact));
        match (status.as_str(), response) {
            ("done", Some(stored)) if stored == answer => {}
            ("expired", None) => {}
            ("done", _) => r.add(
                checks::SAME_ANSWER,
                format!("key {k:?} of {c:?}: the stored response is not its fact's"),
            ),
            ("expired", Some(_)) => r.add(
                checks::SAME_ANSWER,
                format!("key {k:?} of {c:?} is expired but keeps its response"),
            ),
            (other, _) => r.add(
                checks::KEY_FACT,
                format!("key {k:?} of {c:?} is committed as {other}"),
            ),
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
