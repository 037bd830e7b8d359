//! The operator feed as the dashboard reads it (docs/FEED.md).
//!
//! Every string a client could have chosen is a [`Clean`], sanitised while parsing.
//! Every field defaults when it is absent: the feed is young and grows, and a missing
//! field should blank one cell, not the whole dashboard.

use std::collections::BTreeMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::sanitize::Clean;

/// `GET /v1/live/snapshot`: counters and the newest pending keys and conflicts.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    /// The worker's clock. The dashboard measures ages against it, never against its own.
    pub now: Clean,
    pub last_seq: u64,
    pub keys: KeyCounts,
    pub counters: Counters,
    /// One sample per second, oldest first.
    pub throughput: Vec<ThroughputSample>,
    pub commit: CommitStats,
    /// `null` when the worker could not measure it.
    pub size_on_disk_bytes: Option<u64>,
    pub verify: Option<VerifyResult>,
    /// Oldest first.
    pub pending: Vec<KeyRecord>,
    /// Newest first: the 409 and 422 answers this worker gave over HTTP since it
    /// started, at most 50. The counters count more (every front end, and on sled, runs
    /// before this one).
    pub conflicts: Vec<Conflict>,
    /// When this worker started: per-key replays and conflicts count from then.
    pub started_at: Option<Clean>,
    /// Whose the replay and conflict counters are.
    pub observed_scope: ObservedScope,
    /// sled: what the worker's start said when it found the ledger's index damaged and
    /// rebuilt it from the journal; `null` otherwise.
    pub index_rebuilt: Option<Clean>,
}

/// Whose the snapshot's replay and conflict counters are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObservedScope {
    /// The ledger's, across restarts (the sled store keeps them).
    Ledger,
    /// This worker's, since it started (a PostgreSQL worker counts its own).
    Worker,
    /// A worker that does not say.
    #[default]
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct KeyCounts {
    pub pending: u64,
    pub done: u64,
    pub expired: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Counters {
    pub applied: u64,
    pub rejected: u64,
    pub replayed: u64,
    pub conflicts_in_flight: u64,
    pub conflicts_reused: u64,
    pub expired: u64,
    pub rejections: BTreeMap<Clean, u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ThroughputSample {
    /// Unix seconds.
    pub t: i64,
    pub applied: u64,
    pub replayed: u64,
    pub conflicts: u64,
}

/// Latencies are measurements, not money, so floats are fine here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct CommitStats {
    /// `null` before the first commit.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub batch_size_avg: f64,
    pub batches: u64,
}

/// The last verify. The counts are absent from a worker that sends only the summary, and
/// from a run that could not read the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct VerifyResult {
    /// When the run began.
    pub at: Clean,
    /// `start` or `periodic`.
    pub run: Option<Clean>,
    /// The last seq of the log when the run began: every fact up to it was checked.
    pub up_to_seq: Option<u64>,
    pub ok: bool,
    pub facts: Option<u64>,
    pub violations: Option<u64>,
    /// When the next run begins.
    pub next_at: Option<Clean>,
    pub summary: Clean,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyStatus {
    Pending,
    Done,
    Expired,
    /// A status this dashboard does not know yet; shown, not fatal.
    #[default]
    #[serde(other)]
    Unknown,
}

impl KeyStatus {
    pub fn name(self) -> &'static str {
        match self {
            KeyStatus::Pending => "pending",
            KeyStatus::Done => "done",
            KeyStatus::Expired => "expired",
            KeyStatus::Unknown => "?",
        }
    }

    pub fn parse(word: &str) -> Option<KeyStatus> {
        match word.to_ascii_lowercase().as_str() {
            "pending" | "p" => Some(KeyStatus::Pending),
            "done" | "d" => Some(KeyStatus::Done),
            "expired" | "e" => Some(KeyStatus::Expired),
            _ => None,
        }
    }
}

/// One key: a row of `GET /v1/live/keys`, a `pending` entry of the snapshot, or
/// `GET /v1/live/keys/{client}/{key}` (which adds `fact`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct KeyRecord {
    pub client: Clean,
    pub key: Clean,
    pub status: KeyStatus,
    pub command: Clean,
    pub account: Clean,
    /// For a refund: the withdrawal's key.
    pub withdrawal: Option<Clean>,
    pub amount: Option<u64>,
    pub currency: Clean,
    pub since: Clean,
    /// Until when a done key's stored answer is kept; `None` while pending.
    pub expires_at: Option<Clean>,
    pub age_ms: u64,
    pub lease_expired: bool,
    pub replays: u64,
    pub conflicts: u64,
    /// The stored answer body; drawn through [`crate::view::json_text`], which sanitises.
    pub outcome: Option<Value>,
    pub fact: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct KeysPage {
    pub keys: Vec<KeyRecord>,
    /// Cursor of the next page; `None` on the last one.
    pub next: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConflictKind {
    /// 409 `request_in_progress`.
    InFlight,
    /// 422 `idempotency_key_reused`.
    Reused,
    #[default]
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Conflict {
    pub at: Clean,
    pub client: Clean,
    pub key: Clean,
    pub kind: ConflictKind,
    pub command: Clean,
    pub differs: Vec<Clean>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Account {
    pub account: Clean,
    pub currency: Clean,
    /// Minor units; system accounts go negative by design.
    pub balance: Units,
    pub system: bool,
}

impl Account {
    /// The feed marks system accounts; the `@` prefix is the contract's name rule and
    /// a fallback for a feed that does not.
    pub fn is_system(&self) -> bool {
        self.system || self.account.as_str().starts_with('@')
    }
}

/// `GET /v1/accounts`: one page, or the pages the dashboard read joined.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct AccountsPage {
    pub accounts: Vec<Account>,
    /// Over every account, not only the page.
    pub sums: BTreeMap<Clean, Units>,
    /// The name to read the next page after; `None` on the last page.
    pub next: Option<Clean>,
}

/// `GET /v1/live/quarantine?order=newest`: what the inbox kept instead of applying.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct QuarantinePage {
    /// Newest first.
    pub quarantined: Vec<Quarantined>,
}

/// One quarantined message: the payload is the client's text, as received.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Quarantined {
    pub id: u64,
    pub at: Clean,
    /// `null` when the message could not be read at all.
    pub message_id: Option<Clean>,
    pub reason: Clean,
    pub payload: Clean,
}

/// One fact of `GET /v1/facts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct FactRow {
    pub seq: u64,
    pub at: Clean,
    pub client: Clean,
    pub key: Clean,
    #[serde(rename = "type")]
    pub name: Clean,
    pub version: u32,
    pub command: Clean,
    pub account: Clean,
    pub withdrawal: Option<Clean>,
    pub amount: Option<u64>,
    pub currency: Clean,
    pub balance_after: Option<Units>,
    /// The rejection code of a recorded rejection.
    #[serde(alias = "reason", alias = "rejection")]
    pub code: Option<Clean>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct FactsPage {
    pub facts: Vec<FactRow>,
    pub last_seq: u64,
}

/// An amount of minor units as the worker writes it: a JSON number when it fits 64 bits,
/// a decimal string when it does not (sums and system balances can outgrow an i64).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Units(pub i128);

impl<'de> Deserialize<'de> for Units {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Units, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Signed(i64),
            Unsigned(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Signed(units) => Ok(Units(i128::from(units))),
            Raw::Unsigned(units) => Ok(Units(i128::from(units))),
            Raw::Text(text) => text
                .parse()
                .map(Units)
                .map_err(|_| D::Error::custom("an amount is an integer of minor units")),
        }
    }
}

impl std::fmt::Display for Units {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_amounts_parse_from_numbers_and_strings() {
        let page: AccountsPage = serde_json::from_str(
            r#"{"accounts": [{"account": "@world", "currency": "RUB",
                              "balance": "-170141183460469231731687303715884105728"}],
                "sums": {"RUB": 0}}"#,
        )
        .unwrap_or_default();
        assert_eq!(page.accounts[0].balance, Units(i128::MIN));
        assert_eq!(page.sums.values().next(), Some(&Units(0)));
    }

    #[test]
    fn nulls_from_a_young_worker_are_absent_values() {
        let snapshot: Snapshot = serde_json::from_str(
            r#"{"size_on_disk_bytes": null, "verify": null,
                "commit": {"p50_ms": null, "p99_ms": null, "batch_size_avg": 0.0, "batches": 0}}"#,
        )
        .unwrap_or_default();
        assert_eq!(snapshot.size_on_disk_bytes, None);
        assert_eq!(snapshot.commit.p50_ms, None);
    }
}
