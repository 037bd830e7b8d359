//! PgStore's quarantine: messages kept aside whole, written and read back by id.

use tokio_postgres::types::ToSql;

use super::db::{Result, db_time, from_db_time, get, pg_err};
use super::state::PgStore;
use crate::store::Quarantined;

pub(super) const SQL_QUARANTINE: &str = "INSERT INTO quarantine (at, message_id, reason, payload) \
     VALUES ($1, $2, $3, $4) RETURNING id";

impl PgStore {
    /// Runs a query of the quarantine's rows (id, at, message_id, reason, payload).
    pub(super) async fn select_quarantined(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Quarantined>> {
        let conn = self.conn().await?;
        let rows = conn.query(sql, params).await.map_err(|e| pg_err(&e))?;
        rows.iter()
            .map(|row| {
                Ok(Quarantined {
                    id: u64::try_from(get::<i64>(row, 0)?).unwrap_or(0),
                    at: from_db_time(get(row, 1)?),
                    message_id: get(row, 2)?,
                    reason: get(row, 3)?,
                    payload: get(row, 4)?,
                })
            })
            .collect()
    }

    pub(super) async fn insert_quarantine(
        &self,
        message_id: Option<String>,
        reason: String,
        payload: Vec<u8>,
    ) -> Result<u64> {
        let mut text = String::from_utf8_lossy(&payload).into_owned();
        if text.len() > 4096 {
            let mut cut = 4096;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        // PostgreSQL text cannot hold NUL.
        let text = text.replace('\0', "\u{FFFD}");
        let at = db_time(self.inner.rules.clock.now())?;
        let conn = self.conn().await?;
        let pg = |e: tokio_postgres::Error| pg_err(&e);
        let stmt = conn.prepare_cached(SQL_QUARANTINE).await.map_err(pg)?;
        let row = conn
            .query_one(&stmt, &[&at, &message_id, &reason, &text])
            .await
            .map_err(pg)?;
        let id: i64 = get(&row, 0)?;
        Ok(u64::try_from(id).unwrap_or(0))
    }
}
