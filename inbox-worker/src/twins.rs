//! The front end's wait for an in-flight twin: the one place where a caller of
//! [`Store::submit`] (an HTTP command, an inbox message) waits for another attempt on the
//! same key to finish instead of answering "in progress" at once.
//!
//! A store that waits for twins inside `submit` (PostgreSQL waits on the twin's
//! uncommitted row; `waits_for_twins()` is true) is not waited on twice. Once the sled
//! store waits inside `submit` as well, every store answers true and the wait below is
//! dead code: delete it then, and call `store.submit` directly.

use std::time::{Duration, Instant};

use ledger::{ClientId, Command, Key, KeyStatus, LedgerError, MessageId, Store, Submission};

/// Submits and waits for the durable answer. When the key is in flight and the store does
/// not wait for twins itself, polls the key for up to `wait` (reads only, so the poll adds
/// no conflicts; the twin usually commits within milliseconds) and submits once more when
/// it is no longer pending, so the caller gets the twin's outcome rather than "in
/// progress". The caller may go meanwhile (an HTTP client hung up): the outcome is durable
/// anyway, and a retry replays it.
pub async fn submit(
    store: &dyn Store,
    client: &ClientId,
    key: &Key,
    command: &Command,
    message: Option<&MessageId>,
    wait: Duration,
) -> Result<Submission, LedgerError> {
    let answer = store
        .submit(client, key, command.clone(), message.cloned())
        .await;
    if !matches!(answer, Ok(Submission::InProgress { .. })) || store.waits_for_twins() {
        return answer;
    }
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
        match store.key(client, key).await {
            Ok(Some(info)) if info.status == KeyStatus::Pending => continue,
            Ok(_) => {
                return store
                    .submit(client, key, command.clone(), message.cloned())
                    .await;
            }
            Err(_) => break,
        }
    }
    answer
}
