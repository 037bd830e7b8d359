//! Idem's ledger: money commands recorded exactly once as facts keyed by the client's
//! idempotency key, on sled or PostgreSQL. See ARCHITECTURE.md for the map and the invariants.
//!
//! The pure modules (`domain`, `core`, `fact`, `json`, `projection`, `clock`, `memory`,
//! `tenant`) are the `ledger-core` crate's, re-exported here: they know no storage, and
//! Cargo holds them to it. [`store`] holds the [`Store`] interface with its vocabulary and
//! its two implementations, [`SledStore`] and [`PgStore`], each depending on the interface
//! and the pure modules only.

pub use ledger_core::{clock, core, domain, fact, json, memory, projection, tenant};
pub mod scenario;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use clock::{Clock, ManualClock, SystemClock};
pub use domain::{
    Account, Amount, ClientId, Command, Currency, Fingerprint, InvalidInput, Key, MessageId,
    Rejection, RejectionDetail, Timestamp,
};
pub use fact::{Fact, FactBody, Outcome, Receipt, RejectionReceipt};
pub use memory::{Limit, MemoryUse};
pub use projection::{Balances, Observed, Stats};
pub use store::pg::{PgConfig, PgStore};
pub use store::sled::{Blocking, PauseGuard, Progress, SledConfig, SledStore};
pub use store::verify::{VerifyReport, Violation};
pub use store::{
    AsOf, BalanceAt, CommitMetrics, IndexRebuild, KEYS_SCAN_MAX, KeyInfo, KeyPage, KeyQuery,
    KeyStatus, LedgerError, OpenReport, Quarantined, Rules, Store, Submission,
};
