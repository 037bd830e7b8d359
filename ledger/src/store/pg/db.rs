//! Speaking to PostgreSQL, for every file of the store: the ledger's errors made from the
//! driver's, a column read, and values to and from PostgreSQL's types. It knows nothing
//! of the store, so that every other file can import it without a circle.

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::PoolError;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, ToSql};

use crate::domain::Timestamp;
use crate::store::LedgerError;

pub(super) type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// A statement parameter.
pub(super) type P<'a> = &'a (dyn ToSql + Sync);

// ---- errors --------------------------------------------------------------------------

/// A readable account of a PostgreSQL error: the driver's own Display says only "db
/// error" for errors the server reported.
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("PostgreSQL {}: {}", db.code().code(), db.message()),
        None => format!("PostgreSQL: {e}"),
    }
}

pub(super) fn pg_err(e: &tokio_postgres::Error) -> LedgerError {
    if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
        return LedgerError::Unavailable(format!(
            "a row lock was held longer than the lease ({}); nothing was recorded",
            describe(e)
        ));
    }
    LedgerError::Unavailable(describe(e))
}

pub(super) fn pool_err(e: PoolError) -> LedgerError {
    match e {
        PoolError::Closed => LedgerError::Closed,
        PoolError::Backend(e) => LedgerError::Unavailable(describe(&e)),
        PoolError::Timeout(t) => LedgerError::Unavailable(format!(
            "no PostgreSQL connection within the time allowed ({t:?})"
        )),
        other => LedgerError::Unavailable(format!("PostgreSQL connection pool: {other}")),
    }
}

pub(super) fn get<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i)
        .map_err(|e| LedgerError::Unavailable(format!("unexpected column {i}: {e}")))
}

// ---- conversions ---------------------------------------------------------------------

pub(super) fn db_int(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| LedgerError::Unavailable(format!("{v} is beyond bigint")))
}

pub(super) fn db_limit(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn db_time(t: Timestamp) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(t.millis())
        .ok_or_else(|| LedgerError::Unavailable(format!("time {} out of range", t.millis())))
}

pub(super) fn from_db_time(t: DateTime<Utc>) -> Timestamp {
    Timestamp(t.timestamp_millis())
}

pub(super) fn ms(d: Duration) -> u128 {
    // 0 turns a PostgreSQL timeout off; every wait here is meant to be bounded.
    d.as_millis().max(1)
}

pub(super) fn ms_i32(d: Duration) -> i32 {
    i32::try_from(ms(d)).unwrap_or(i32::MAX)
}

pub(super) fn ms_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
