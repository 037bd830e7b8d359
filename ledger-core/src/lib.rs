//! Idem's pure core: the values a command is made of, the decision that turns a command
//! into a fact, facts and their stored encoding, the JSON shapes answers are rendered in,
//! and the folds of the log, with what a store's memory is counted in. Nothing here does
//! I/O; the decision reads no clock (a store passes the time in, read from its [`Clock`])
//! and cannot fail. The `ledger` crate builds its stores on this one and re-exports every
//! module, so `ledger::fact::Fact` and `ledger_core::fact::Fact` are one type.
//!
//! The rule is Cargo's to check: this crate's dependencies include no storage, network,
//! runtime or thread crate (`ledger/tests/it/architecture.rs` reads its manifest).

pub mod clock;
pub mod core;
pub mod domain;
pub mod fact;
pub mod json;
pub mod memory;
pub mod projection;
pub mod tenant;

pub use clock::{Clock, ManualClock, SystemClock};
pub use domain::{
    Account, Amount, ClientId, Command, Currency, Fingerprint, InvalidInput, Key, MessageId,
    Rejection, RejectionDetail, Timestamp,
};
pub use fact::{Fact, FactBody, Outcome, Receipt, RejectionReceipt};
pub use memory::{Limit, MemoryUse};
pub use projection::{Balances, Observed, Stats};
