//! The one integration-test binary of the `ledger` crate, one room per module. The rooms
//! share their builders in `support`. No room needs a process of its own: none sets an
//! environment variable, a failpoint or a global allocator; the few that time a wait
//! (`conformance`, `recovery`) bound it loosely (2 s, 5 s) or from below.
#![allow(clippy::unwrap_used)]

mod support;

mod architecture;
mod concurrency;
mod conformance;
mod domain;
mod listing;
mod model;
mod pg_groups;
mod pg_schema;
mod recovery;
