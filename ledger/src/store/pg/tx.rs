//! A group's transaction on one connection: begun by hand (`OpenTx`), and how an attempt
//! at it ends (`Abort`), which decides whether the group is run again, split, or failed
//! (`group.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use super::db::{describe, pg_err, pool_err};
use crate::store::LedgerError;

/// Why one attempt at a group's transaction did not finish.
pub(super) enum Abort {
    /// PostgreSQL aborted the transaction over a conflict that a new attempt resolves,
    /// or the connection was lost.
    Retry(String),
    /// An error one command of the group may have caused: the group is split to answer
    /// that command alone with it.
    Command(LedgerError),
    Fail(LedgerError),
}

impl From<LedgerError> for Abort {
    fn from(e: LedgerError) -> Self {
        Abort::Fail(e)
    }
}

impl From<tokio_postgres::Error> for Abort {
    fn from(e: tokio_postgres::Error) -> Self {
        let retry = [
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::T_R_SERIALIZATION_FAILURE,
            // Two first deposits to one new account (or first refunds of one withdrawal)
            // both found no row to lock; the second insert fails once the first commits,
            // and a new attempt finds the row and locks it.
            SqlState::UNIQUE_VIOLATION,
        ];
        // The session ended under the transaction (a backend terminated, the server
        // restarting, the socket closed): it did not commit, or did and the new attempt
        // reads its keys done.
        let lost = [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
        ];
        match e.code() {
            Some(code) if retry.contains(code) => Abort::Retry(describe(&e)),
            Some(code) if lost.contains(code) => Abort::Retry(describe(&e)),
            None if e.is_closed() => Abort::Retry(describe(&e)),
            // Bad data or a broken rule on a row: a command's, most likely.
            Some(code) if code.code().starts_with("22") || code.code().starts_with("23") => {
                Abort::Command(pg_err(&e))
            }
            _ => Abort::Fail(pg_err(&e)),
        }
    }
}

impl From<PoolError> for Abort {
    fn from(e: PoolError) -> Self {
        Abort::Fail(pool_err(e))
    }
}

/// A pooled connection with a transaction begun by hand, so that BEGIN rides in the
/// first round trip and COMMIT in the last (a driver transaction spends a round trip on
/// BEGIN alone). Dropped while the transaction is open (an error path, or the attempt's
/// deadline), it rolls back before the connection goes back to the pool, or closes the
/// connection, which rolls back too.
pub(super) struct OpenTx {
    conn: Option<deadpool_postgres::Object>,
    /// Transactions begun and not yet ended: two for a moment when a lane sends the next
    /// group's BEGIN behind this group's COMMIT, before the COMMIT's answer is read.
    open: AtomicUsize,
}

impl OpenTx {
    pub(super) fn new(conn: deadpool_postgres::Object) -> Self {
        Self {
            conn: Some(conn),
            open: AtomicUsize::new(0),
        }
    }

    /// Marks the transaction begun: from the BEGIN sent with the first statement.
    pub(super) fn opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    /// Marks the transaction ended: its COMMIT was sent (it commits or rolls back).
    pub(super) fn closed(&self) {
        let _ = self
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    pub(super) fn conn(&self) -> Result<&deadpool_postgres::Object, Abort> {
        self.conn
            .as_ref()
            .ok_or_else(|| Abort::Fail(LedgerError::Unavailable("connection lost".into())))
    }

    pub(super) async fn rollback(&self) -> Result<(), Abort> {
        self.conn()?.batch_execute("ROLLBACK").await?;
        self.closed();
        Ok(())
    }
}

impl Drop for OpenTx {
    fn drop(&mut self) {
        if self.open.load(Ordering::Relaxed) == 0 {
            return;
        }
        let Some(conn) = self.conn.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if conn.batch_execute("ROLLBACK").await.is_err() {
                        drop(deadpool_postgres::Object::take(conn));
                    }
                });
            }
            Err(_) => drop(deadpool_postgres::Object::take(conn)),
        }
    }
}
