//! Idem's ledger: money commands recorded exactly once as facts keyed by the client's
//! idempotency key, on sled or PostgreSQL. See ARCHITECTURE.md for the map and the invariants.

pub mod backend;
pub mod clock;
pub mod core;
pub mod domain;
pub mod fact;
pub mod memory;
pub mod pg;
pub mod projection;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod verify;

pub use backend::{KeyQuery, Rules, Store};
pub use clock::{Clock, ManualClock, SystemClock};
pub use domain::{
    Account, Amount, ClientId, Command, Currency, Fingerprint, InvalidInput, Key, MessageId,
    Rejection, Timestamp,
};
pub use fact::{Fact, FactBody, Outcome, Receipt, RejectionReceipt};
pub use memory::{Limit, MemoryUse};
pub use pg::{PgOptions, PgStore};
pub use projection::{Balances, Observed, Stats};
pub use store::{
    CommitMetrics, Config, KEYS_SCAN_MAX, KeyInfo, KeyPage, KeyStatus, Ledger, LedgerError,
    OpenReport, PauseGuard, Quarantined, Submission,
};
pub use verify::{VerifyReport, Violation};
