//! The store interface: what a worker needs from wherever the facts live. Two
//! implementations pass one conformance suite (`ledger/tests/conformance.rs`): the embedded
//! sled [`Ledger`] (the default: one process, one disk) and [`crate::pg::PgStore`]
//! (PostgreSQL: any number of workers on many hosts). Every guarantee of the guarantees in README.md is the
//! store's to keep, inside its own commit; the worker above it only translates.
//!
//! The interface is async because PostgreSQL is reached over the network; the sled
//! implementation completes its futures from the committer's reply, so it adds no thread.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::Clock;
use crate::domain::{Account, ClientId, Command, Currency, Key, MessageId};
use crate::fact::Fact;
use crate::projection::{Balances, Stats};
use crate::store::{
    CommitMetrics, KeyInfo, KeyPage, KeyStatus, Ledger, LedgerError, Quarantined, Submission,
};
use crate::verify::VerifyReport;

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// The rules every store applies the same way.
#[derive(Clone)]
pub struct Rules {
    /// How long a done key keeps its stored response.
    pub retention: Duration,
    /// How long a claim on a key holds before another attempt may take it over.
    pub lease: Duration,
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field("retention", &self.retention)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// Which keys a listing wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyQuery {
    pub status: Option<KeyStatus>,
    pub client: Option<ClientId>,
    /// Start after this (client, key); `None` from the beginning.
    pub after: Option<(ClientId, Key)>,
    pub limit: usize,
}

/// Where the facts live. Object-safe, so a worker holds an `Arc<dyn Store>` chosen at start.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `sled` or `postgres`.
    fn kind(&self) -> &'static str;
    /// Where the data is, for logs and the dashboard (never a password).
    fn location(&self) -> String;
    fn rules(&self) -> &Rules;
    /// Whether `submit` itself waits a bounded time for an in-flight twin before it
    /// answers `InProgress` (PostgreSQL waits on the twin's uncommitted row). When it does,
    /// a caller adds no wait of its own, or a 409 would take two waits.
    fn waits_for_twins(&self) -> bool {
        false
    }

    /// Submits a command (`message` set: through the inbox, deduplicated by its id in the
    /// same commit as its effect) and answers once the outcome is durable.
    async fn submit(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
    ) -> Result<Submission>;
    /// Keeps an inbox message that could not be applied, with the reason, durably.
    async fn quarantine(
        &self,
        message_id: Option<String>,
        reason: String,
        payload: Vec<u8>,
    ) -> Result<u64>;
    /// The quarantined messages with ids above `after`, oldest first, at most `limit`:
    /// pass the last id of a page to read the next.
    async fn quarantined(&self, after: u64, limit: usize) -> Result<Vec<Quarantined>>;
    /// The newest `limit` quarantined messages, newest first: what an operator looks at.
    async fn quarantined_newest(&self, limit: usize) -> Result<Vec<Quarantined>>;
    /// Expires the stored responses of done keys older than the retention.
    async fn sweep(&self) -> Result<usize>;
    /// Rebuilds every projection from the log and checks the guarantees.
    async fn verify(&self) -> Result<VerifyReport>;

    async fn key(&self, client: &ClientId, key: &Key) -> Result<Option<KeyInfo>>;
    async fn keys(&self, query: KeyQuery) -> Result<KeyPage>;
    /// Facts with `seq > after`, in seq order, at most `limit`, durable ones only.
    async fn facts(&self, after: u64, limit: usize) -> Result<Vec<Fact>>;
    async fn fact(&self, seq: u64) -> Result<Option<Fact>>;
    async fn balances(&self) -> Result<Balances>;
    async fn account(&self, account: &Account) -> Result<Option<BTreeMap<Currency, i128>>>;
    async fn stats(&self) -> Result<Stats>;
    /// Keys this process has claimed and not yet answered, oldest first.
    fn pending(&self) -> Vec<KeyInfo>;
    /// The highest seq this process knows to be durable.
    fn durable_seq(&self) -> u64;
    fn commit_metrics(&self) -> CommitMetrics;
    /// What the store keeps in memory, structure by structure, with each one's bound.
    fn memory(&self) -> Vec<crate::memory::MemoryUse>;
    async fn size_on_disk(&self) -> Result<u64>;
    /// The reason the store stopped writing, if it did.
    fn failure(&self) -> Option<String>;
    /// Finishes and makes durable what was submitted before; later submissions answer
    /// [`LedgerError::Closed`].
    async fn shutdown(&self);
}

/// Runs blocking sled work off the async threads when a runtime is there to take it.
async fn off_thread<T: Send + 'static>(
    ledger: &Ledger,
    f: impl FnOnce(&Ledger) -> Result<T> + Send + 'static,
) -> Result<T> {
    let ledger = ledger.clone();
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(move || f(&ledger))
            .await
            .unwrap_or(Err(LedgerError::Closed)),
        Err(_) => f(&ledger),
    }
}

#[async_trait]
impl Store for Ledger {
    fn kind(&self) -> &'static str {
        "sled"
    }
    fn location(&self) -> String {
        self.path().display().to_string()
    }
    fn rules(&self) -> &Rules {
        self.rules_ref()
    }

    async fn submit(
        &self,
        client: &ClientId,
        key: &Key,
        command: Command,
        message: Option<MessageId>,
    ) -> Result<Submission> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit_with(
            client,
            key,
            command,
            message,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.await.unwrap_or(Err(LedgerError::Closed))
    }
    async fn quarantine(
        &self,
        message_id: Option<String>,
        reason: String,
        payload: Vec<u8>,
    ) -> Result<u64> {
        off_thread(self, move |l| l.quarantine(message_id, reason, &payload)).await
    }
    async fn quarantined(&self, after: u64, limit: usize) -> Result<Vec<Quarantined>> {
        Ledger::quarantined(self, after, limit)
    }
    async fn quarantined_newest(&self, limit: usize) -> Result<Vec<Quarantined>> {
        Ledger::quarantined_newest(self, limit)
    }
    async fn sweep(&self) -> Result<usize> {
        off_thread(self, Ledger::sweep).await
    }
    async fn verify(&self) -> Result<VerifyReport> {
        off_thread(self, Ledger::verify).await
    }
    async fn key(&self, client: &ClientId, key: &Key) -> Result<Option<KeyInfo>> {
        Ledger::key(self, client, key)
    }
    async fn keys(&self, q: KeyQuery) -> Result<KeyPage> {
        let after = q.after.as_ref().map(|(c, k)| (c, k));
        Ledger::keys(self, q.status, q.client.as_ref(), after, q.limit)
    }
    async fn facts(&self, after: u64, limit: usize) -> Result<Vec<Fact>> {
        Ledger::facts(self, after, limit)
    }
    async fn fact(&self, seq: u64) -> Result<Option<Fact>> {
        Ledger::fact(self, seq)
    }
    async fn balances(&self) -> Result<Balances> {
        Ok(Ledger::balances(self))
    }
    async fn account(&self, account: &Account) -> Result<Option<BTreeMap<Currency, i128>>> {
        Ok(Ledger::account(self, account))
    }
    async fn stats(&self) -> Result<Stats> {
        Ok(Ledger::stats(self))
    }
    fn pending(&self) -> Vec<KeyInfo> {
        Ledger::pending(self)
    }
    fn durable_seq(&self) -> u64 {
        Ledger::durable_seq(self)
    }
    fn commit_metrics(&self) -> CommitMetrics {
        Ledger::commit_metrics(self)
    }
    fn memory(&self) -> Vec<crate::memory::MemoryUse> {
        Ledger::memory(self)
    }
    async fn size_on_disk(&self) -> Result<u64> {
        Ledger::size_on_disk(self)
    }
    fn failure(&self) -> Option<String> {
        Ledger::failure(self)
    }
    async fn shutdown(&self) {
        let _ = off_thread(self, |l| {
            l.shutdown();
            Ok(())
        })
        .await;
    }
}
