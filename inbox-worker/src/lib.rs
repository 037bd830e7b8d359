//! Idem's worker: serves a store (sled or PostgreSQL) over HTTP (docs/api.md) with the operator feed
//! (docs/FEED.md), feeds inbox files through the ledger, and holds the CLI client and
//! the demo. The ledger decides every outcome; this crate parses, transports, reports.
//!
//! Embedding a worker (the dashboard's demo mode does this):
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use ledger::Store as _;
//! // Any store: the sled folder here, or ledger::PgStore for PostgreSQL.
//! let (ledger, _) = ledger::SledStore::open(ledger::SledConfig::new("idem-demo"))?;
//! let store: Arc<dyn ledger::Store> = Arc::new(ledger);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let server = tokio::spawn(inbox_worker::serve(
//!     listener,
//!     store.clone(),
//!     inbox_worker::ApiOptions::default(),
//!     async move { let _ = stopped.await; },
//! ));
//! // ... talk to http://{addr} ...
//! let _ = stop.send(());
//! server.await??;
//! store.shutdown().await;
//! # Ok(()) }
//! ```

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod access;
pub mod api;
pub mod client;
pub mod demo;
pub mod inbox;
pub mod server;
pub mod text;
pub mod wire;

pub use api::{ApiOptions, Limits};
pub use server::{ServeConfig, run_server, serve};
