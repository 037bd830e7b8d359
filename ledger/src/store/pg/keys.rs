//! Keys on PostgreSQL: pending keys of this process and listings of the stored ones.

// The store's helpers (errors, conversions, claims) and what it imports.
use super::*;
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
}
