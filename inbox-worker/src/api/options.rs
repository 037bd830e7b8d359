//! What the API is told at start: who may call, what it takes, its limits, and what it
//! reads of a broker consumer the server runs beside it. Where the store lives and what
//! else runs is the server's (`crate::server::ServeConfig`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ledger::Currency;

use crate::access::Token;

use super::listener::Limits;

/// What `/healthz` and `/metrics` read of a broker consumer that runs beside the API (the
/// server's RabbitMQ consumer): whether it consumes, and its counters.
pub trait ConsumerStatus: std::fmt::Debug + Send + Sync {
    /// `Ok` while it consumes; else why not (the last connection error, or that the first
    /// attempt is under way).
    fn consuming(&self) -> Result<(), String>;
    /// Its counters in Prometheus' text format, appended to `out`.
    fn write_metrics(&self, out: &mut String);
}

/// How the API behaves, independent of where the ledger lives, with the pace of the
/// sweeper and the verifier the server runs beside it.
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
    /// The broker consumer's state, for /healthz and /metrics, when the worker runs one.
    pub consumer: Option<Arc<dyn ConsumerStatus>>,
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
            consumer: None,
        }
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
