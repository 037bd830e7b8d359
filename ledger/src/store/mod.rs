//! The store interface: what a worker needs from wherever the facts live, and the
//! vocabulary it speaks (submissions, errors, keys, quarantine, metrics). Two
//! implementations pass one conformance suite (`ledger/tests/it/conformance.rs`): the embedded
//! [`sled::SledStore`] (the default: one process, one disk) and [`pg::PgStore`]
//! (PostgreSQL: any number of workers on many hosts). Every guarantee of docs/contract.md
//! is the store's to keep, inside its own commit; the worker above it only
//! translates. This module depends on neither store; each store depends on it and on the
//! pure modules, never on the other.
//!
//! The interface is async because PostgreSQL is reached over the network; the sled
//! implementation completes its futures from the committer's reply, so it adds no thread.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use serde::{Deserialize, Serialize};

use crate::clock::Clock;
use crate::domain::{Account, ClientId, Command, Currency, Fingerprint, Key, MessageId, Timestamp};
use crate::fact::{Fact, Outcome};
use crate::projection::{Balances, Stats};
use verify::VerifyReport;

pub mod pg;
pub mod sled;
pub mod verify;

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
    /// A user account's statement: its movements (deposits, withdrawals, refunds to it)
    /// with `seq > after`, in seq order, at most `limit`, durable ones only. Read from the
    /// account's own index, never by scanning the log; rejections are not movements and
    /// are not in it. Paging by the last seq read misses nothing on either store: on
    /// PostgreSQL, where seqs are not gapless, a movement takes its seq while it holds its
    /// account's row lock, so no movement of the account can commit later with a lower seq.
    async fn statement(&self, account: &Account, after: u64, limit: usize) -> Result<Vec<Fact>>;
    /// A user account's balance after its last durable movement at or before `point`,
    /// read from the account's statement index, so its cost does not grow with the log.
    /// `None` when no such user account exists (now); a balance of 0 with no movement
    /// when the account had none by then. System accounts keep no statement: `None`.
    async fn balance_at(&self, account: &Account, point: AsOf) -> Result<Option<BalanceAt>>;
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

/// A point of the log a balance is read at: after every fact with a seq at most `seq`
/// and recorded at or before `time` (a bound left out does not bound).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AsOf {
    pub seq: Option<u64>,
    pub time: Option<Timestamp>,
}

impl AsOf {
    /// After every fact with this seq or a lower one.
    pub fn seq(seq: u64) -> Self {
        Self {
            seq: Some(seq),
            time: None,
        }
    }
    /// After every fact recorded at or before this time.
    pub fn time(at: Timestamp) -> Self {
        Self {
            seq: None,
            time: Some(at),
        }
    }
}

/// A user account's balance at a point of the log ([`Store::balance_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalanceAt {
    pub currency: Currency,
    pub balance: u128,
    /// The seq of the movement whose balance this is: the account's last one at or
    /// before the point; `None` before its first.
    pub movement: Option<u64>,
}

/// An operational failure. Business refusals are never errors: they are outcomes.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerError {
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error(
        "the ledger at {path} is corrupt: {detail}. Nothing was changed or deleted. \
         Keep the folder as it is, restore the latest backup into a new folder, \
         and run `inbox-worker verify` on both"
    )]
    Corrupt { path: String, detail: String },
    #[error("the ledger at {path} is in use by another process")]
    Locked { path: String },
    #[error("the ledger is shut down")]
    Closed,
}

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// What happened to one submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submission {
    /// This arrival executed the command; the outcome is durable.
    Executed(Outcome),
    /// The key was done before: its stored outcome.
    Replayed(Outcome),
    /// The key holds another command; nothing changed.
    Reused,
    /// Another attempt with this key is in flight; try again after the given time.
    InProgress { retry_after: Duration },
    /// The inbox had seen this message id with another payload: it is quarantined.
    Quarantined { reason: String },
}

impl Submission {
    pub fn outcome(&self) -> Option<&Outcome> {
        match self {
            Submission::Executed(o) | Submission::Replayed(o) => Some(o),
            _ => None,
        }
    }
}

/// What opening found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpenReport {
    pub fresh: bool,
    pub facts: u64,
    pub keys_done: u64,
    pub keys_expired: u64,
    pub accounts: usize,
    pub last_fact_at: Option<String>,
    /// Journal groups replayed into the index at this open (sled store; 0 after a clean
    /// shutdown).
    pub replayed_groups: u64,
    /// sled store: the index was found damaged and rebuilt from the journal at this open.
    pub rebuilt: Option<IndexRebuild>,
    pub open_ms: u128,
}

/// A rebuild of the sled store's index (sled's files) from the log of record (the
/// journal's base and every group after it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IndexRebuild {
    /// Why: what opening the index met.
    pub reason: String,
    /// Where the damaged files were moved (`None` when the rebuild finished one that a
    /// crash interrupted, whose damaged files were moved then).
    pub aside: Option<String>,
    /// The group of the base it started from, and how many groups were replayed after it.
    pub base_group: u64,
    pub groups: u64,
    /// The facts the rebuilt index holds (its last seq).
    pub facts: u64,
    pub ms: u128,
}

impl std::fmt::Display for OpenReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.fresh {
            return write!(f, "created a new ledger ({} ms)", self.open_ms);
        }
        write!(
            f,
            "recovered {} ({} done, {} expired), {}, last fact at {}",
            verify::count(self.facts, "fact", "facts"),
            verify::count(self.keys_done, "key", "keys"),
            self.keys_expired,
            verify::count(self.accounts, "account", "accounts"),
            self.last_fact_at.as_deref().unwrap_or("-"),
        )?;
        if let Some(rebuilt) = &self.rebuilt {
            write!(f, "; {rebuilt}")?;
        }
        if self.replayed_groups > 0 {
            write!(
                f,
                " ({} replayed from the journal)",
                verify::count(self.replayed_groups, "group", "groups")
            )?;
        }
        write!(
            f,
            "; the log's tail and the balances agree ({} ms)",
            self.open_ms
        )
    }
}

/// The state of a key as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyStatus {
    Pending,
    Done,
    Expired,
}

impl KeyStatus {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "done" => Some(Self::Done),
            "expired" => Some(Self::Expired),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Done => "done",
            Self::Expired => "expired",
        }
    }
}

/// The most key records one call of [`Store::keys`] reads, so that a filter that matches
/// little cannot make one request scan a million keys.
pub const KEYS_SCAN_MAX: usize = 20_000;

/// A page of keys, and where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPage {
    pub keys: Vec<KeyInfo>,
    /// Pass as `after` to go on; `None` when the listing is complete.
    pub next: Option<(ClientId, Key)>,
}

/// One key, for listings and the dashboard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub client: ClientId,
    pub key: Key,
    pub status: KeyStatus,
    pub command: Command,
    /// When the key was claimed (pending) or its fact recorded.
    pub since: Timestamp,
    /// Set once the key is done or expired.
    pub outcome: Option<Outcome>,
    /// Pending: whether the claim's lease has run out.
    pub lease_expired: bool,
    /// Replays and conflicts seen for this key since the process started.
    pub replays: u32,
    pub conflicts: u32,
}

impl KeyInfo {
    /// The key as its own tenant reads it (see [`crate::tenant`]).
    pub fn seen_by_owner(&self) -> KeyInfo {
        let mut info = self.clone();
        info.command = self.command.seen_by(&self.client);
        info.outcome = self.outcome.as_ref().map(|o| o.seen_by(&self.client));
        info
    }
}

/// A message the inbox refused to apply, kept with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantined {
    pub id: u64,
    pub at: Timestamp,
    pub message_id: Option<String>,
    pub reason: String,
    /// The message as received (lossy UTF-8, at most 4 KiB).
    pub payload: String,
}

/// What the inbox remembers of a message: its client, key and command, so that an id
/// delivered again with another payload is told apart from a true redelivery.
pub(crate) fn message_fingerprint(client: &ClientId, key: &Key, command: &Command) -> Fingerprint {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(client.as_str().as_bytes());
    h.update([0]);
    h.update(key.as_str().as_bytes());
    h.update([0]);
    h.update(command.canonical_bytes());
    let mut f = [0u8; 16];
    f.copy_from_slice(&h.finalize()[..16]);
    Fingerprint(f)
}

/// Histogram buckets (upper bounds, microseconds) of commit latency.
pub const LATENCY_BUCKETS_US: [u64; 12] = [
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    u64::MAX,
];

/// Counts for the commit path: how long each command took from submission to its durable
/// answer, and how many commands each sync (one journal write and sync on sled, one
/// commit on PostgreSQL) made durable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitMetrics {
    pub latency_buckets: [u64; 12],
    pub latency_sum_us: u64,
    pub batches: u64,
    pub commands: u64,
    pub batch_size_max: u64,
    pub last_batch_size: u64,
    /// Groups of commands written (sled: one journal record, then its inserts into sled,
    /// each): at most one per sync when the decider keeps up, more when a group reaches
    /// `batch_max` first.
    pub applies: u64,
    /// sled: the journal's segment files, in bytes (preallocated space included), and
    /// how many there are.
    pub journal_bytes: u64,
    pub journal_segments: u64,
    /// sled: the journal's base (the index as a group left it, the start of the log of
    /// record), in bytes.
    pub journal_base_bytes: u64,
    /// sled: checkpoints taken (sled flushed and synced).
    pub checkpoints: u64,
    /// sled: compactions (a new base written, the journal's segments below it deleted).
    pub compactions: u64,
    /// sled: what the rebuild of the index from the journal at this open said, if the
    /// open found the index damaged.
    pub index_rebuilt: Option<String>,
    /// How long each batch's first command waited before its batch began (sled: its
    /// sync; PostgreSQL: its group's transaction), summed over batches, and the longest.
    pub batch_wait_sum_us: u64,
    pub batch_wait_max_us: u64,
    /// PostgreSQL: groups whose BEGIN and claim were sent behind the previous group's
    /// COMMIT on the same connection, saving a round trip each (when that COMMIT fails,
    /// the claim is rolled back and the group claims again on its own).
    pub pipelined: u64,
}
