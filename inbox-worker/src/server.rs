//! The server, assembled in one place. [`run_server`] opens the store [`ServeConfig`]
//! names, binds its address and starts, on one stop signal, the HTTP API
//! ([`crate::api`]), the RabbitMQ consumer ([`crate::inbox::amqp`]), the sweeper and the
//! verifier; at shutdown it waits for each and shuts the store down. [`serve`] is the part
//! without the store's opening or the consumer: the API of an open store on a bound
//! listener with its sweeper and verifier, which is how a worker is embedded.
//!
//! The API and the inbox know nothing of each other: this module joins them, handing the
//! consumer's state to `/healthz` and `/metrics` as a [`ConsumerStatus`].

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ledger::{SledConfig, SledStore, Store, Timestamp};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::feed::VerifyRun;
use crate::api::{ApiOptions, ConsumerStatus, Http, check_exposure};
use crate::inbox::amqp::{self, AmqpHealth, AmqpOptions, AmqpStats};

/// Everything `run_server` needs: where the ledger lives and how it is opened, the address,
/// the API, and the RabbitMQ consumer to run beside it.
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

/// Opens the ledger, binds `config.listen`, starts the RabbitMQ consumer if `config.amqp`
/// names one and serves (with the sweeper and the verifier) until `shutdown` resolves or
/// the consumer fails; then finishes what is in flight and shuts the ledger down (flushing
/// it). Prints `listening on http://ADDR` on stdout once it accepts connections.
pub async fn run_server<F>(config: ServeConfig, shutdown: F) -> anyhow::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    check_exposure(config.listen, &config.api)?;
    let ledger = open_store(&config).await?;
    let listener = match TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            close(ledger).await;
            return Err(e).with_context(|| format!("binding {}", config.listen));
        }
    };
    let addr = listener.local_addr()?;
    // One shutdown for the HTTP server and the broker consumer.
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut api = config.api;
    let consumer = config.amqp.map(|opts| {
        api.consumer = Some(opts.stats.clone());
        // "consuming" is said by the consumer once the broker took it.
        eprintln!(
            "amqp: connecting to {} to consume queue {}",
            amqp::redact(&opts.url),
            opts.queue
        );
        let (store, stop, until) = (ledger.clone(), stop_tx.clone(), stopped(stop_rx.clone()));
        tokio::spawn(async move {
            let consumed = amqp::consume(store, opts, until).await;
            // A worker told to consume that cannot is not healthy: stop it all, loudly.
            if consumed.is_err() {
                let _ = stop.send(true);
            }
            consumed
        })
    });
    println!("listening on http://{addr}");
    let stop = stop_tx.clone();
    let trigger = tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    let served = serve(listener, ledger.clone(), api, stopped(stop_rx)).await;
    trigger.abort();
    let mut failed = None;
    if let Some(consumer) = consumer {
        // Stops taking deliveries and waits for those in hand: each is acked after its
        // outcome is durable, or left for the broker to redeliver.
        match consumer.await {
            Ok(Ok(report)) => eprintln!("amqp: {report}"),
            Ok(Err(e)) => failed = Some(e.context("the RabbitMQ consumer stopped")),
            Err(e) => failed = Some(anyhow::anyhow!("the RabbitMQ consumer panicked: {e}")),
        }
    }
    close(ledger).await;
    if let Some(e) = failed {
        return Err(e);
    }
    eprintln!("stopped: everything acknowledged is on disk");
    served
}

/// Opens the store `config` names: PostgreSQL when `store_url` is set, else the sled
/// folder `db`. Prints what opening found on stderr.
pub async fn open_store(config: &ServeConfig) -> anyhow::Result<Arc<dyn Store>> {
    if let Some(url) = &config.store_url {
        let rules = ledger::Rules {
            retention: config.retention,
            lease: config.lease,
            clock: Arc::new(ledger::SystemClock),
        };
        let options = ledger::PgConfig {
            in_flight_wait: config.api.in_flight_wait,
            pool_size: config.pg_pool,
            lanes: config.pg_lanes,
            group_max: config.pg_group_max,
            group_wait: config.pg_group_wait,
            allow_unsafe_settings: config.pg_allow_unsafe_settings,
            ..ledger::PgConfig::default()
        };
        let (store, report) = ledger::PgStore::open(url, rules, options)
            .await
            .context("opening the PostgreSQL store")?;
        let store: Arc<dyn Store> = Arc::new(store);
        eprintln!("ledger {}: {report}", store.location());
        return Ok(store);
    }
    let ledger_config = config.ledger_config();
    let (ledger, report) = tokio::task::spawn_blocking(move || SledStore::open(ledger_config))
        .await
        .context("opening the ledger")??;
    eprintln!("ledger {}: {report}", config.db.display());
    Ok(Arc::new(ledger))
}

async fn close(ledger: Arc<dyn Store>) {
    ledger.shutdown().await;
}

/// Serves the API of an open ledger on an already-bound listener, with the sweeper and the
/// verifier, until `shutdown` resolves, then waits for in-flight requests. The caller owns
/// the ledger and shuts it down; this is how a worker is embedded (bind `127.0.0.1:0`,
/// read `local_addr`, spawn this).
pub async fn serve<F>(
    listener: TcpListener,
    ledger: Arc<dyn Store>,
    options: ApiOptions,
    shutdown: F,
) -> anyhow::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    check_exposure(listener.local_addr()?, &options)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let sweep_every = options.sweep_every;
    let http = Http::new(ledger.clone(), options, stop_rx.clone());
    let mut background = vec![
        tokio::spawn(sweeper(ledger.clone(), sweep_every, stop_rx.clone())),
        tokio::spawn(verifier(ledger, http.clone(), stop_rx)),
    ];
    background.extend(http.spawn_feed());
    let stop = stop_tx.clone();
    let trigger = tokio::spawn(async move {
        shutdown.await;
        // Ends the event streams too, which would otherwise hold the shutdown open.
        let _ = stop.send(true);
    });
    http.serve(listener, stop_tx.subscribe()).await;
    trigger.abort();
    let _ = stop_tx.send(true);
    for task in background {
        let _ = task.await;
    }
    Ok(())
}

/// Sleeps for `d`; false once the server is stopping.
async fn tick(stop: &watch::Receiver<bool>, d: Duration) -> bool {
    let mut stop = stop.clone();
    if *stop.borrow() {
        return false;
    }
    tokio::select! {
        () = tokio::time::sleep(d) => !*stop.borrow(),
        _ = stop.changed() => false,
    }
}

/// Marks the keys past the retention expired, every `every`, and again at once while a
/// sweep finds some: each takes a bounded number of facts.
async fn sweeper(store: Arc<dyn Store>, every: Duration, stop: watch::Receiver<bool>) {
    let mut wait = every;
    while tick(&stop, wait).await {
        match store.sweep().await {
            Ok(expired) => {
                wait = if expired > 0 {
                    Duration::from_millis(10)
                } else {
                    every
                };
            }
            Err(e) => eprintln!("sweep failed: {e}"),
        }
    }
}

/// Verifies the ledger at start and every `verify_every`, each result recorded for the
/// feed's snapshot and violations printed on stderr.
async fn verifier(store: Arc<dyn Store>, http: Http, stop: watch::Receiver<bool>) {
    let every = http.options().verify_every;
    let mut first = true;
    loop {
        if !first && !tick(&stop, every).await {
            return;
        }
        let run = if first { "start" } else { "periodic" };
        first = false;
        // Verify reads the log while commits go on (the sled store holds them only for
        // its last step, PostgreSQL reads one snapshot), so every ledger is verified.
        // What it covers is the log as it stood when it began: every fact up to this seq
        // (facts committed meanwhile may be checked too). An operator reads "up to seq N"
        // against the ledger's last seq to see how much is not verified yet.
        let up_to_seq = store.durable_seq();
        let started = Instant::now();
        let at = Timestamp(chrono::Utc::now().timestamp_millis());
        let report = store.verify().await;
        let took = started.elapsed();
        if let Ok(report) = &report
            && !report.ok()
        {
            eprintln!("verify found violations:\n{report}");
        }
        http.verified(VerifyRun {
            at,
            run,
            up_to_seq,
            took,
            report,
        });
    }
}

/// The RabbitMQ consumer as `/healthz` and `/metrics` read it.
impl ConsumerStatus for AmqpStats {
    fn consuming(&self) -> Result<(), String> {
        match self.health() {
            AmqpHealth::Consuming => Ok(()),
            AmqpHealth::Down(why) => Err(why),
        }
    }

    fn write_metrics(&self, out: &mut String) {
        self.write_prometheus(out);
    }
}
