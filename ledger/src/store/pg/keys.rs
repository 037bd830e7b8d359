//! PgStore's keys: what this process counts per key (replays, conflicts), a key's
//! committed row with its fact, pending keys of this process, listings of the stored
//! ones, and the sweep that expires old ones.

use tokio_postgres::Row;

use super::counters::{COUNTER_EXPIRED, SQL_COUNT};
use super::db::{Result, db_limit, db_time, get, ms_i64, pg_err};
use super::state::{Claim, PgStore};
use crate::domain::{ClientId, Fingerprint, Key};
use crate::fact::{Fact, Outcome};
use crate::store::{KEYS_SCAN_MAX, KeyInfo, KeyPage, KeyQuery, KeyStatus, Store};

/// How many keys the per-key replay/conflict counts remember before starting over.
pub(super) const ACTIVITY_MAX: usize = 65_536;

/// Keys expired per sweep transaction.
const SWEEP_BATCH: i64 = 10_000;

impl PgStore {
    pub(super) fn pending_info(&self, ck: &(ClientId, Key), claim: &Claim) -> KeyInfo {
        let now = self.inner.rules.clock.now();
        let (replays, conflicts) = self.activity(ck);
        KeyInfo {
            client: ck.0.clone(),
            key: ck.1.clone(),
            status: KeyStatus::Pending,
            command: claim.command.clone(),
            since: claim.since,
            outcome: None,
            lease_expired: now
                >= claim
                    .since
                    .saturating_add_ms(ms_i64(self.inner.rules.lease)),
            replays,
            conflicts,
        }
    }

    /// A done or expired key from its row: status and its fact.
    pub(super) fn key_info(
        &self,
        client: ClientId,
        key: Key,
        status: &str,
        fact: Option<Fact>,
    ) -> Result<KeyInfo> {
        let fact =
            fact.ok_or_else(|| self.corrupt(format!("key {key:?} of {client:?} has no fact")))?;
        let outcome = Outcome::from_fact(&fact);
        let command = fact.body.command();
        let ck = (client, key);
        let (replays, conflicts) = self.activity(&ck);
        Ok(KeyInfo {
            client: ck.0,
            key: ck.1,
            status: if status == "expired" {
                KeyStatus::Expired
            } else {
                KeyStatus::Done
            },
            command,
            since: fact.at,
            outcome: Some(outcome),
            lease_expired: false,
            replays,
            conflicts,
        })
    }

    pub(super) fn names(&self, client: String, key: String) -> Result<(ClientId, Key)> {
        let c = ClientId::parse(&client)
            .map_err(|_| self.corrupt(format!("a stored client name {client:?}")))?;
        let k = Key::parse(&key).map_err(|_| self.corrupt(format!("a stored key {key:?}")))?;
        Ok((c, k))
    }

    /// [`Store::keys`]: the sled store's semantics, except that `next` is the last key
    /// returned (or, when a filtered scan hit its cap, the last key read), so it is `None`
    /// exactly when nothing matching is left.
    pub(super) async fn keys_page(&self, q: KeyQuery) -> Result<KeyPage> {
        if q.status == Some(KeyStatus::Pending) {
            let keys = Store::pending(self)
                .into_iter()
                .filter(|k| q.client.as_ref().is_none_or(|c| *c == k.client))
                .take(q.limit)
                .collect();
            return Ok(KeyPage { keys, next: None });
        }
        if q.limit == 0 {
            return Ok(KeyPage {
                keys: Vec::new(),
                next: None,
            });
        }
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let (after_c, after_k) = match &q.after {
            Some((c, k)) => (c.as_str().to_owned(), k.as_str().to_owned()),
            None => (String::new(), String::new()),
        };
        let client = q.client.as_ref().map(|c| c.as_str().to_owned());
        let status = q.status.map(|s| s.as_str().to_owned());
        let scan = db_limit(KEYS_SCAN_MAX);
        let limit = q.limit.min(KEYS_SCAN_MAX);
        // Like sled, one call reads at most KEYS_SCAN_MAX keys, so a filter that matches
        // little cannot make one request walk a million rows; `next` then says where the
        // scan stopped.
        let stmt = conn
            .prepare_cached(
                "SELECT k.client, k.key, k.status, f.seq, f.body FROM ( \
                     SELECT client, key, status, seq FROM idempotency_keys \
                     WHERE (client, key) > ($1, $2) AND ($3::text IS NULL OR client = $3) \
                       AND status <> 'pending' \
                     ORDER BY client, key LIMIT $4) k \
                 LEFT JOIN facts f ON f.seq = k.seq \
                 WHERE ($5::text IS NULL OR k.status = $5) \
                 ORDER BY k.client, k.key LIMIT $6",
            )
            .await
            .map_err(pg)?;
        let rows = conn
            .query(
                &stmt,
                &[
                    &after_c,
                    &after_k,
                    &client,
                    &scan,
                    &status,
                    &db_limit(limit + 1),
                ],
            )
            .await
            .map_err(pg)?;
        let mut page = KeyPage {
            keys: Vec::with_capacity(rows.len().min(limit)),
            next: None,
        };
        let more = rows.len() > limit;
        for row in rows.iter().take(limit) {
            let (c, k) = self.names(get(row, 0)?, get(row, 1)?)?;
            let st: String = get(row, 2)?;
            let seq: Option<i64> = get(row, 3)?;
            let body: Option<&[u8]> = get(row, 4)?;
            let fact = match (seq, body) {
                (Some(seq), Some(body)) => Some(self.decode(seq, body)?),
                _ => None,
            };
            page.keys.push(self.key_info(c, k, &st, fact)?);
        }
        if more {
            page.next = page.keys.last().map(|k| (k.client.clone(), k.key.clone()));
        } else if status.is_some() || rows.len() >= KEYS_SCAN_MAX {
            // Fewer matches than asked for: either the end, or the scan stopped at its
            // cap; then go on after the last key it read.
            let last = conn
                .query_opt(
                    "SELECT client, key FROM idempotency_keys \
                     WHERE (client, key) > ($1, $2) AND ($3::text IS NULL OR client = $3) \
                       AND status <> 'pending' \
                     ORDER BY client, key OFFSET $4 LIMIT 1",
                    &[&after_c, &after_k, &client, &(scan - 1)],
                )
                .await
                .map_err(pg)?;
            if let Some(row) = last {
                page.next = Some(self.names(get(&row, 0)?, get(&row, 1)?)?);
            }
        }
        Ok(page)
    }

    pub(super) fn note(&self, ck: &(ClientId, Key), replay: bool) {
        let mut activity = self.inner.activity.lock();
        if activity.len() >= ACTIVITY_MAX && !activity.contains_key(ck) {
            activity.clear();
        }
        let e = activity.entry(ck.clone()).or_default();
        if replay {
            e.0 = e.0.saturating_add(1);
        } else {
            e.1 = e.1.saturating_add(1);
        }
    }

    pub(super) fn activity(&self, ck: &(ClientId, Key)) -> (u32, u32) {
        self.inner
            .activity
            .lock()
            .get(ck)
            .copied()
            .unwrap_or_default()
    }

    /// A key's committed row with its fact: (status, fingerprint, fact), read without the
    /// row's lock; `None` for a key with no row.
    pub(super) async fn key_with_fact(
        &self,
        client: &ClientId,
        key: &Key,
    ) -> Result<Option<(String, Fingerprint, Option<Fact>)>> {
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let stmt = conn
            .prepare_cached(
                "SELECT k.status, k.request_hash, f.seq, f.body \
                 FROM idempotency_keys k LEFT JOIN facts f ON f.seq = k.seq \
                 WHERE k.client = $1 AND k.key = $2",
            )
            .await
            .map_err(pg)?;
        let Some(row) = conn
            .query_opt(&stmt, &[&client.as_str(), &key.as_str()])
            .await
            .map_err(pg)?
        else {
            return Ok(None);
        };
        let status: String = get(&row, 0)?;
        let (fingerprint, fact) = self.key_fact(&row, 1)?;
        Ok(Some((status, fingerprint, fact)))
    }

    /// A key's fingerprint, then its fact's seq and body, if it has one, from the row's
    /// column `from` on.
    fn key_fact(&self, row: &Row, from: usize) -> Result<(Fingerprint, Option<Fact>)> {
        let hash: &[u8] = get(row, from)?;
        let fingerprint = Fingerprint(
            hash.try_into()
                .map_err(|_| self.corrupt("a key's fingerprint of the wrong length".into()))?,
        );
        let seq: Option<i64> = get(row, from + 1)?;
        let body: Option<&[u8]> = get(row, from + 2)?;
        let fact = match (seq, body) {
            (Some(seq), Some(body)) => Some(self.decode(seq, body)?),
            _ => None,
        };
        Ok((fingerprint, fact))
    }

    pub(super) async fn sweep_now(&self) -> Result<usize> {
        let horizon = self
            .inner
            .rules
            .clock
            .now()
            .saturating_sub_ms(ms_i64(self.inner.rules.retention));
        let horizon = db_time(horizon)?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let mut total = 0usize;
        loop {
            let mut conn = self.conn().await?;
            let tx = conn.transaction().await.map_err(pg)?;
            // SKIP LOCKED: two workers sweeping at once take different keys.
            let row = tx
                .query_one(
                    "WITH old AS ( \
                         SELECT client, key FROM idempotency_keys \
                         WHERE status = 'done' AND created_at <= $1 \
                         ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
                     gone AS ( \
                         UPDATE idempotency_keys k SET status = 'expired', response = NULL \
                         FROM old WHERE k.client = old.client AND k.key = old.key \
                         RETURNING 1) \
                     SELECT count(*) FROM gone",
                    &[&horizon, &SWEEP_BATCH],
                )
                .await
                .map_err(pg)?;
            let n: i64 = get(&row, 0)?;
            if n > 0 {
                tx.execute(SQL_COUNT, &[&COUNTER_EXPIRED, &self.next_shard(), &n])
                    .await
                    .map_err(pg)?;
            }
            tx.commit().await.map_err(pg)?;
            total += usize::try_from(n).unwrap_or(0);
            if n < SWEEP_BATCH {
                return Ok(total);
            }
        }
    }
}
