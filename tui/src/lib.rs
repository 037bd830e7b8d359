//! ledger-tui: a live dashboard for Idem's inbox-worker.
//!
//! Code map: [`model`] is the feed's JSON; [`sanitize`] makes client text safe to draw;
//! [`app`] holds the state and the one event handler; [`view`] draws (a module per view
//! under it: overview, keys, conflicts, balances, log, help; and what they share: panels,
//! tables, values as text), with [`fit`] fitting numbers into the room they have; [`feed`]
//! is the network thread.
//! Invariants: `view` mutates nothing; `app` does no I/O and reads no clock; nothing but
//! [`sanitize::Clean`] or sanitised text is drawn from the feed.

pub mod app;
pub mod feed;
pub mod fit;
pub mod model;
pub mod sanitize;
pub mod view;

pub use app::{App, Data, Event, View};
pub use sanitize::sanitize;
pub use view::draw;
