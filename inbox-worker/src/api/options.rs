//! What a worker is told at start: the API's options and, for `run_server`, where the store
//! lives and what else to run beside the API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ledger::{Currency, SledConfig};

use crate::access::Token;

use super::listener::Limits;
use crate::inbox::amqp::{AmqpOptions, AmqpStats};

/// How the API behaves, independent of where the ledger lives.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// Tenants' tokens. Empty: one tenant, `default`, with every right, loopback only.
    pub tokens: Vec<Token>,
    /// The operator's secret for the feed endpoints when client tokens are configured.
    pub admin_token: Option<String>,
    /// Listen on a non-loopback address without tokens: the operator said so.
    pub allow_no_tokens: bool,
    /// The currencies commands may name; empty: any ISO 4217 code.
    pub currencies: Vec<Currency>,
    /// How long a request waits for an in-flight twin before answering 409.
    pub in_flight_wait: Duration,
    /// How often the sweeper looks for keys past the retention.
    pub sweep_every: Duration,
    /// How often `verify` runs for the snapshot (it also runs at start).
    pub verify_every: Duration,
    /// The connection cap and each phase's timeout (see `listener`).
    pub limits: Limits,
    /// The RabbitMQ consumer's counters, for /metrics, when the worker runs one.
    pub amqp_stats: Option<Arc<AmqpStats>>,
}

impl Default for ApiOptions {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            admin_token: None,
            allow_no_tokens: false,
            currencies: Vec::new(),
            in_flight_wait: Duration::from_millis(20),
            sweep_every: Duration::from_secs(5),
            verify_every: Duration::from_secs(600),
            limits: Limits::default(),
            amqp_stats: None,
        }
    }
}

/// Everything `serve` needs: the ledger's folder and options, the address, the API.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub db: PathBuf,
    /// A PostgreSQL URL: the facts live there instead of the sled folder `db`.
    pub store_url: Option<String>,
    /// Connections to PostgreSQL (with `store_url`).
    pub pg_pool: usize,
    /// PostgreSQL groups in flight at once (lanes of commands).
    pub pg_lanes: usize,
    /// The most commands one PostgreSQL transaction decides together.
    pub pg_group_max: usize,
    /// How long a PostgreSQL group stays open for more commands, from its first's arrival.
    pub pg_group_wait: Duration,
    /// Open PostgreSQL even with fsync or full_page_writes off.
    pub pg_allow_unsafe_settings: bool,
    /// Consume inbox messages from RabbitMQ too.
    pub amqp: Option<AmqpOptions>,
    pub listen: SocketAddr,
    pub retention: Duration,
    pub lease: Duration,
    pub cache_bytes: u64,
    pub api: ApiOptions,
}

impl ServeConfig {
    pub fn new(db: impl Into<PathBuf>) -> Self {
        Self {
            db: db.into(),
            store_url: None,
            pg_pool: 16,
            pg_lanes: ledger::PgConfig::default().lanes,
            pg_group_max: ledger::PgConfig::default().group_max,
            pg_group_wait: Duration::ZERO,
            pg_allow_unsafe_settings: false,
            amqp: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 7420)),
            retention: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(10),
            cache_bytes: 64 * 1024 * 1024,
            api: ApiOptions::default(),
        }
    }

    pub fn ledger_config(&self) -> SledConfig {
        let mut c = SledConfig::new(&self.db)
            .retention(self.retention)
            .lease(self.lease);
        c.cache_capacity_bytes = self.cache_bytes;
        c.in_flight_wait = self.api.in_flight_wait;
        c.progress = ledger::Progress::new(|line| eprintln!("{line}"));
        c
    }
}

/// Refuses an open server on a non-loopback address: with no tokens, anyone who can reach
/// the port could move money.
pub fn check_exposure(listen: SocketAddr, api: &ApiOptions) -> anyhow::Result<()> {
    if api.tokens.is_empty() && !api.allow_no_tokens && !listen.ip().is_loopback() {
        anyhow::bail!(
            "refusing to listen on {listen} without tokens: with no --token or --tokens-file \
             the worker lets anyone who connects move the tenant `default`'s money, so it \
             only listens on loopback (e.g. 127.0.0.1:7420) unless told \
             --allow-no-tokens (for a network you trust end to end)"
        );
    }
    Ok(())
}
