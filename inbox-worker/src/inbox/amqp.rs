//! The RabbitMQ inbox transport: consumes inbox messages (the same JSON as a `consume`
//! line, see [`crate::wire::parse_message`]) from a queue, has each decided by
//! [`super::handle`], and acks, requeues or dead-letters it per the [`Disposition`]; and
//! publishes messages with publisher confirms for `submit --via amqp://…`.
//!
//! # What is acknowledged, and when
//!
//! A delivery is acked only once its outcome is durable: after `submit` answered
//! `Executed` or `Replayed` (the store answers only after its commit is on disk), or after
//! its dead-letter copy was confirmed by the broker. Everything else is nacked with
//! requeue, or left unacked for the broker to redeliver when the channel dies. The ledger
//! deduplicates by message id and key in the same commit as the effect, so a redelivery of
//! something whose ack was lost is answered as a replay and moves no money.
//!
//! # Dead letters
//!
//! One design, used for every message that will never apply: the worker publishes a copy
//! to the dead-letter exchange (`<queue>.dlx`, fanout, bound to `<queue>.dead`) with the
//! original body and properties plus the header `x-idem-reason` (and `x-idem-queue`,
//! `x-idem-deliveries`, `x-idem-message-id` when known), waits for the broker's publisher
//! confirm, and only then acks the original. We chose this over `nack(requeue=false)` with
//! the queue's own dead-lettering because the broker cannot attach our reason to the copy
//! (its `x-death` header only says `rejected`), and because quorum queues dead-letter
//! at-most-once by default: a confirmed publish is at-least-once. A crash between the
//! confirm and the ack leaves two copies in the dead-letter queue, never none. Reasons never
//! quote the message (they come from `wire` and the ledger, written for logs).
//!
//! The reasons are: undecodable (not a valid inbox message), `message_id_reused` (the
//! id was seen with another payload; the ledger also keeps it in its quarantine, in the
//! commit that refused it), `idempotency_key_reused` (the key holds another command), and
//! the delivery limit (`delivered N times`: every attempt failed or crashed). Every one is
//! also kept in the store's quarantine, so that an operator finds every refusal in one place
//! (`/v1/live/quarantine`): the worker writes it there with its body as received before it
//! publishes the copy (a store that cannot keep it requeues the message, as any store error
//! does; at the delivery limit, where the store is usually what fails, the dead-letter copy
//! alone keeps it), and `message_id_reused` is kept by the ledger in the commit that refused
//! it. A message requeued after a failed copy, or redelivered after a crash before its ack,
//! may be kept twice: never not at all.
//!
//! # Order
//!
//! Deliveries are processed concurrently, up to the prefetch, so that the store can group
//! their commits; and a requeued message goes round again anyway. So the order of messages
//! in the queue is not the order of decisions: a withdrawal published right after the
//! deposit that funds it may be decided first, and its `insufficient_funds` is final for
//! its key. A producer whose commands depend on each other publishes the next one after the
//! effect of the first is visible (or runs a consumer with prefetch 1, which still does not
//! order requeued messages).
//!
//! # Why a quorum queue
//!
//! Classic queues only tell a consumer `redelivered`, a flag, so "more than N deliveries"
//! cannot be known. Quorum queues count returns per message and hand the count to the
//! consumer as `x-delivery-count`; the consumer enforces [`AmqpOptions::max_deliveries`]
//! from it, so the poison message is dead-lettered with a reason instead of looping. The
//! queue also names the dead-letter exchange (`x-dead-letter-exchange`): anything the broker
//! dead-letters itself (an operator's delivery-limit policy, RabbitMQ 4's default limit of
//! 20) lands in the same dead-letter queue instead of being dropped. The consumer does
//! not set `x-delivery-limit` itself: queue arguments must match at every redeclaration,
//! and a limit taken from a command-line option would make two workers started with
//! different options refuse each other.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use futures_util::{FutureExt as _, StreamExt as _};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use ledger::{ClientId, Command, Key, LedgerError, MessageId, Store};
use parking_lot::Mutex;
use tokio::task::JoinSet;

use super::{Disposition, Retry};

/// The header that carries why a message was dead-lettered.
pub const REASON_HEADER: &str = "x-idem-reason";
/// The quorum queue's count of earlier deliveries of a message (absent on the first).
pub const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// Where and how to consume. [`AmqpOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct AmqpOptions {
    /// `amqp://user:password@host:port/vhost`; never logged with its password.
    pub url: String,
    pub queue: String,
    /// Unacked deliveries the broker may hand this consumer at once (`basic.qos`); they are
    /// processed concurrently, so the store can batch their commits. Default 64 (0 is
    /// taken as 1).
    pub prefetch: u16,
    /// A delivery beyond this many is dead-lettered unprocessed. Default 20.
    pub max_deliveries: u32,
    /// Default `<queue>.dlx`.
    pub dead_letter_exchange: String,
    /// Default `<queue>.dead`.
    pub dead_letter_queue: String,
    /// The tenant its messages act for, and the currencies they may name.
    pub rules: super::InboxRules,
    /// Shown by `rabbitmqctl list_connections` (and how a test finds its connection).
    pub connection_name: String,
    /// How long one connection attempt may take before it counts as failed.
    pub connect_timeout: Duration,
    /// Back-off between reconnection attempts: doubles from `reconnect_min` up to
    /// `reconnect_max`, and starts over once consuming resumed. Every failed attempt is
    /// logged and counted in `connect_failures`; each lost connection once in `reconnects`.
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// How long a delivery whose key is in flight elsewhere is retried in place before it
    /// is requeued (each requeue spends one of `max_deliveries`).
    pub in_progress_wait: Duration,
    /// The pause before a nack with requeue: a quorum queue hands a requeued message
    /// straight back, so without it a failing message would spin.
    pub requeue_delay: Duration,
    /// Back-off after a store error, doubling per consecutive error up to the max, reset by
    /// the next success. The delivery is held meanwhile, which slows the whole consumer.
    pub store_backoff_min: Duration,
    pub store_backoff_max: Duration,
    /// How long deliveries in hand may take to finish when the consumer stops or loses its
    /// connection, before they are abandoned to the broker's redelivery.
    pub drain_timeout: Duration,
    /// The counters; share the `Arc` with whatever reports metrics.
    pub stats: Arc<AmqpStats>,
}

impl AmqpOptions {
    pub fn new(url: impl Into<String>, queue: impl Into<String>) -> Self {
        let queue = queue.into();
        Self {
            url: url.into(),
            prefetch: 64,
            max_deliveries: 20,
            dead_letter_exchange: format!("{queue}.dlx"),
            dead_letter_queue: format!("{queue}.dead"),
            rules: super::InboxRules::default(),
            connection_name: format!("idem-inbox-worker {queue}"),
            connect_timeout: Duration::from_secs(10),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            in_progress_wait: Duration::from_secs(2),
            requeue_delay: Duration::from_millis(100),
            store_backoff_min: Duration::from_millis(100),
            store_backoff_max: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(30),
            stats: Arc::new(AmqpStats::default()),
            queue,
        }
    }
}

pub use super::DeadReason;

/// Live counters of a consumer, shared with the metrics endpoint and `/healthz`. All counts
/// are since the `AmqpStats` was created, across reconnections.
///
/// Every delivery ends in exactly one of `acked`, `requeued` and `acks_lost`, so at any
/// moment `consumed = acked + requeued + acks_lost + deliveries in hand` (at most the
/// prefetch, per connection; none once the consumer stopped).
#[derive(Debug, Default)]
pub struct AmqpStats {
    consumed: AtomicU64,
    redelivered: AtomicU64,
    acked: AtomicU64,
    executed: AtomicU64,
    replayed: AtomicU64,
    requeued: AtomicU64,
    ack_failures: AtomicU64,
    store_errors: AtomicU64,
    reconnects: AtomicU64,
    connect_failures: AtomicU64,
    dead_lettered: [AtomicU64; DeadReason::ALL.len()],
    quarantined: AtomicU64,
    connected: AtomicBool,
    /// Why the consumer is not consuming, while it is not: what `/healthz` reports.
    down: Mutex<Option<String>>,
}

/// The consumer's state, as `/healthz` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AmqpHealth {
    /// Connected, consuming.
    Consuming,
    /// Not consuming, with why: the last connection error, or that the first attempt is
    /// still under way.
    Down(String),
}

impl AmqpStats {
    pub fn snapshot(&self) -> ConsumeReport {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ConsumeReport {
            consumed: get(&self.consumed),
            redelivered: get(&self.redelivered),
            acked: get(&self.acked),
            executed: get(&self.executed),
            replayed: get(&self.replayed),
            requeued: get(&self.requeued),
            ack_failures: get(&self.ack_failures),
            store_errors: get(&self.store_errors),
            reconnects: get(&self.reconnects),
            connect_failures: get(&self.connect_failures),
            quarantined: get(&self.quarantined),
            dead_lettered: DeadReason::ALL
                .iter()
                .map(|r| (r.as_str(), get(&self.dead_lettered[r.index()])))
                .collect(),
        }
    }

    /// Whether the consumer is connected and consuming right now.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Consuming, or not and why. Before the first attempt has ended, the reason says the
    /// consumer is still connecting.
    pub fn health(&self) -> AmqpHealth {
        // Read under the lock that `set_down`/`set_consuming` write under, so the flag and
        // the reason are one state.
        let down = self.down.lock();
        if self.connected() {
            return AmqpHealth::Consuming;
        }
        AmqpHealth::Down(
            down.clone()
                .unwrap_or_else(|| "connecting to the broker (no attempt has ended yet)".into()),
        )
    }

    fn set_consuming(&self) {
        let mut down = self.down.lock();
        self.connected.store(true, Ordering::Relaxed);
        *down = None;
    }

    fn set_down(&self, why: String) {
        let mut down = self.down.lock();
        self.connected.store(false, Ordering::Relaxed);
        *down = Some(why);
    }

    /// Prometheus text for these counters, in the style of `metrics.rs`.
    pub fn write_prometheus(&self, out: &mut String) {
        use std::fmt::Write as _;
        let r = self.snapshot();
        let mut one = |name: &str, kind: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        one(
            "idem_amqp_consumed_total",
            "counter",
            "Deliveries received from RabbitMQ, redeliveries included.",
            r.consumed,
        );
        one(
            "idem_amqp_redelivered_total",
            "counter",
            "Deliveries the broker marked as redelivered.",
            r.redelivered,
        );
        one(
            "idem_amqp_acked_total",
            "counter",
            "Deliveries acknowledged after their outcome was durable.",
            r.acked,
        );
        one(
            "idem_amqp_requeued_total",
            "counter",
            "Deliveries nacked with requeue (key in flight, store error).",
            r.requeued,
        );
        one(
            "idem_amqp_acks_lost_total",
            "counter",
            "Deliveries left unsettled to the broker, which redelivers them: their ack or \
             nack could not be sent (the channel was gone), or they were abandoned at a stop. \
             consumed = acked + requeued + acks_lost + deliveries in hand.",
            r.ack_failures,
        );
        one(
            "idem_amqp_quarantined_total",
            "counter",
            "Refused messages kept in the store's quarantine (each is also dead-lettered).",
            r.quarantined,
        );
        one(
            "idem_amqp_reconnects_total",
            "counter",
            "Outages: times the consumer lost its connection after consuming, each counted \
             once however many attempts the reconnection took.",
            r.reconnects,
        );
        one(
            "idem_amqp_connect_failures_total",
            "counter",
            "Attempts to connect and start consuming that failed (each retried after a \
             back-off).",
            r.connect_failures,
        );
        one(
            "idem_amqp_connected",
            "gauge",
            "1 while consuming.",
            u64::from(self.connected()),
        );
        let name = "idem_amqp_dead_lettered_total";
        let _ = writeln!(
            out,
            "# HELP {name} Messages dead-lettered, by reason.\n# TYPE {name} counter"
        );
        for (reason, n) in &r.dead_lettered {
            let _ = writeln!(out, "{name}{{reason=\"{reason}\"}} {n}");
        }
    }

    fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a consumer did: a snapshot of its [`AmqpStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumeReport {
    /// Deliveries received, redeliveries included.
    pub consumed: u64,
    /// Deliveries the broker flagged `redelivered`.
    pub redelivered: u64,
    /// Acks the broker took: applied, replayed and dead-lettered messages.
    pub acked: u64,
    /// Submissions this consumer executed (applied or rejected: both are outcomes).
    pub executed: u64,
    /// Submissions answered with a stored outcome (duplicates, redeliveries).
    pub replayed: u64,
    pub requeued: u64,
    /// Deliveries left unsettled: their ack or nack could not be sent (the channel was
    /// gone), or they were abandoned at a stop; the broker redelivers them.
    pub ack_failures: u64,
    pub store_errors: u64,
    /// Outages: connections lost after consuming (each counted once).
    pub reconnects: u64,
    /// Attempts to connect and start consuming that failed.
    pub connect_failures: u64,
    /// Refused messages kept in the store's quarantine.
    pub quarantined: u64,
    /// By [`DeadReason::as_str`], every reason present.
    pub dead_lettered: BTreeMap<&'static str, u64>,
}

impl ConsumeReport {
    pub fn dead_lettered_total(&self) -> u64 {
        self.dead_lettered.values().sum()
    }
}

impl std::fmt::Display for ConsumeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} deliveries ({} redelivered): {} acked ({} executed, {} replayed), {} requeued, \
             {} dead-lettered",
            self.consumed,
            self.redelivered,
            self.acked,
            self.executed,
            self.replayed,
            self.requeued,
            self.dead_lettered_total()
        )?;
        let reasons: Vec<String> = self
            .dead_lettered
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        if !reasons.is_empty() {
            write!(f, " ({})", reasons.join(", "))?;
        }
        if self.quarantined > 0 {
            write!(f, ", {} quarantined", self.quarantined)?;
        }
        write!(
            f,
            ", {} reconnects ({} failed attempts)",
            self.reconnects, self.connect_failures
        )?;
        if self.store_errors > 0 {
            write!(f, ", {} store errors", self.store_errors)?;
        }
        if self.ack_failures > 0 {
            write!(f, ", {} acks lost with their channel", self.ack_failures)?;
        }
        Ok(())
    }
}

/// The URL without its password, for logs.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => match authority[..at].split_once(':') {
            Some((user, _password)) => {
                format!("{}{user}:***@{}", &url[..scheme_end + 3], &rest[at + 1..])
            }
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// The inbox message for one command, in the form [`crate::wire::parse_message`] reads (the same
/// as a `consume` line), for publishing with [`publish`] (`submit --via amqp://…`). The
/// message id is what deduplicates a republished message; reuse it for every retry.
pub fn message_body(
    message_id: &MessageId,
    client: Option<&ClientId>,
    key: &Key,
    command: &Command,
) -> Vec<u8> {
    let mut fields = serde_json::Map::new();
    ledger::json::command_fields(command, &mut fields);
    // The receipt's `command` names the kind; the message's command object calls it `type`.
    fields.remove("command");
    fields.insert("type".into(), command.name().into());
    let mut line = serde_json::Map::new();
    line.insert("message_id".into(), message_id.as_str().into());
    line.insert("key".into(), key.as_str().into());
    if let Some(client) = client {
        line.insert("client".into(), client.as_str().into());
    }
    line.insert("command".into(), fields.into());
    serde_json::Value::Object(line).to_string().into_bytes()
}

fn quorum_args() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args
}

/// Declares the queue, the dead-letter exchange and the dead-letter queue (all durable,
/// both queues quorum queues). Idempotent while the arguments match.
async fn declare_topology(channel: &Channel, opts: &AmqpOptions) -> lapin::Result<()> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .exchange_declare(
            &opts.dead_letter_exchange,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_declare(&opts.dead_letter_queue, durable, quorum_args())
        .await?;
    channel
        .queue_bind(
            &opts.dead_letter_queue,
            &opts.dead_letter_exchange,
            "",
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut args = quorum_args();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(opts.dead_letter_exchange.as_str().into()),
    );
    channel.queue_declare(&opts.queue, durable, args).await?;
    Ok(())
}

/// Parses the URL up front, so that a malformed one fails at once instead of being retried.
fn parse_url(url: &str) -> anyhow::Result<AMQPUri> {
    url.parse::<AMQPUri>()
        .map_err(|e| anyhow!("the AMQP URL {} is not valid: {e}", redact(url)))
}

async fn connect(
    uri: &AMQPUri,
    url: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<Connection> {
    let props = ConnectionProperties::default().with_connection_name(name.into());
    match tokio::time::timeout(timeout, Connection::connect_uri(uri.clone(), props)).await {
        Ok(r) => r.with_context(|| format!("connecting to {}", redact(url))),
        Err(_) => bail!(
            "connecting to {}: no answer within {timeout:?}",
            redact(url)
        ),
    }
}

/// Whether retrying cannot help: refused credentials or vhost, or a queue that exists with
/// other arguments. Everything else (refused or reset connections, timeouts, the broker's
/// INTERNAL_ERROR when two clients declare one new quorum queue at once) is retried.
fn permanent(error: &anyhow::Error) -> bool {
    error
        .chain()
        .any(|cause| match cause.downcast_ref::<lapin::Error>() {
            // ACCESS_REFUSED, INVALID_PATH, PRECONDITION_FAILED, NOT_ALLOWED.
            Some(lapin::Error::ProtocolError(e)) => matches!(e.get_id(), 403 | 402 | 406 | 530),
            _ => false,
        })
}

/// Publishes each message to `queue` (through the default exchange) as a persistent
/// message and waits for the broker to confirm every one. Declares the queue (with the
/// consumer's default topology) when it does not exist yet, so nothing is published into
/// the void. A message the broker nacks or returns (a quorum queue that is still starting
/// does both) is published again, up to 5 times in all: republishing is safe, the
/// consumer deduplicates by message id. Fails on anything else, or when the attempts run
/// out; a rerun of the whole input is safe for the same reason. Returns the number
/// confirmed. The error is flat (each cause said once, see [`describe`]), so `{:#}` prints
/// it without lapin's repetitions.
pub async fn publish(
    url: &str,
    queue: &str,
    messages: impl IntoIterator<Item = Vec<u8>>,
) -> anyhow::Result<u64> {
    publish_all(url, queue, messages)
        .await
        .map_err(|e| anyhow!(describe(&e)))
}

async fn publish_all(
    url: &str,
    queue: &str,
    messages: impl IntoIterator<Item = Vec<u8>>,
) -> anyhow::Result<u64> {
    /// Confirms awaited at most this far behind the publishes: pipelined, yet bounded.
    const WINDOW: usize = 512;
    const ATTEMPTS: u32 = 5;
    let uri = parse_url(url)?;
    let mut attempt = 0;
    let (conn, channel) = loop {
        attempt += 1;
        match publish_channel(&uri, url, queue).await {
            Ok(parts) => break parts,
            Err(e) if attempt < ATTEMPTS && !permanent(&e) => {
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into());
    let options = BasicPublishOptions {
        // An unroutable message comes back instead of vanishing; see `settle`.
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let send = async |n: usize, body: &[u8]| {
        channel
            .basic_publish("", queue, options, body, properties.clone())
            .await
            .with_context(|| format!("publishing message {n}"))
    };
    let mut pending = VecDeque::new();
    let mut confirmed = 0u64;
    let mut messages = messages.into_iter().enumerate();
    loop {
        if pending.len() < WINDOW
            && let Some((i, body)) = messages.next()
        {
            let confirm = send(i + 1, &body).await?;
            pending.push_back((i + 1, body, 1, confirm));
            continue;
        }
        let Some((n, body, tries, confirm)) = pending.pop_front() else {
            break;
        };
        match settle(n, confirm).await? {
            None => confirmed += 1,
            Some(_) if tries < ATTEMPTS => {
                tokio::time::sleep(Duration::from_millis(100 << tries)).await;
                let confirm = send(n, &body).await?;
                pending.push_back((n, body, tries + 1, confirm));
            }
            Some(why) => bail!("message {n}: {why}, {ATTEMPTS} times; nothing after it was sent"),
        }
    }
    let _ = channel.close(200, "done").await;
    let _ = conn.close(200, "done").await;
    Ok(confirmed)
}

/// A connection and a confirm-mode channel on which `queue` exists.
async fn publish_channel(
    uri: &AMQPUri,
    url: &str,
    queue: &str,
) -> anyhow::Result<(Connection, Channel)> {
    let conn = connect(
        uri,
        url,
        "idem-inbox-worker publish",
        Duration::from_secs(10),
    )
    .await?;
    let mut channel = conn.create_channel().await?;
    // A passive declare fails (and closes the channel) if the queue is missing; an active
    // one with our arguments would fail against a queue a consumer declared with others.
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    if channel
        .queue_declare(queue, passive, FieldTable::default())
        .await
        .is_err()
    {
        channel = conn.create_channel().await?;
        declare_topology(&channel, &AmqpOptions::new(url, queue))
            .await
            .with_context(|| format!("declaring the queue {queue}"))?;
    }
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok((conn, channel))
}

/// Waits for one publisher confirm: `None` once the broker has the message, or why it
/// does not (worth another try); an error if the channel failed.
async fn settle(
    n: usize,
    confirm: lapin::publisher_confirm::PublisherConfirm,
) -> anyhow::Result<Option<&'static str>> {
    match confirm
        .await
        .with_context(|| format!("waiting for the confirm of message {n}"))?
    {
        Confirmation::Ack(None) => Ok(None),
        Confirmation::Ack(Some(_)) => Ok(Some("returned by the broker: no queue took it")),
        Confirmation::Nack(_) => Ok(Some("refused by the broker (nack)")),
        Confirmation::NotRequested => bail!("message {n}: publisher confirms are not on"),
    }
}

/// How a consuming session ended.
enum Ended {
    Shutdown,
    Lost(anyhow::Error),
}

/// Consumes `opts.queue` until `shutdown` completes, reconnecting with back-off whenever
/// the connection or channel drops or cannot be opened (each attempt is logged to stderr),
/// including at start: a broker that is still starting is waited for. Fails only when the
/// first session cannot start for a reason retrying cannot fix (a malformed URL, refused
/// credentials or vhost, a queue declared with other arguments): those are for an operator,
/// and better said at once. After consuming once it never gives up.
///
/// On shutdown it stops taking deliveries, lets the ones in hand finish (each is acked or
/// nacked), closes the connection and returns the counters. Unprocessed prefetched
/// deliveries go back to the queue when the channel closes.
pub async fn consume(
    store: Arc<dyn Store>,
    opts: AmqpOptions,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<ConsumeReport> {
    let uri = parse_url(&opts.url)?;
    let opts = Arc::new(opts);
    let stats = opts.stats.clone();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = opts.reconnect_min;
    let mut ever_consumed = false;
    loop {
        let mut started = false;
        let ended = session(&uri, &store, &opts, shutdown.as_mut(), &mut started).await;
        let error = match ended {
            Ended::Shutdown => break,
            Ended::Lost(e) => e,
        };
        if !ever_consumed && !started && permanent(&error) {
            // Flattened: lapin's errors repeat their cause, which `{:#}` would print twice.
            bail!("consuming from queue {}: {}", opts.queue, describe(&error));
        }
        if started {
            // An outage begins: counted once, however many attempts it takes to end it.
            ever_consumed = true;
            backoff = opts.reconnect_min;
            AmqpStats::inc(&stats.reconnects);
        } else {
            AmqpStats::inc(&stats.connect_failures);
        }
        let why = format!(
            "{} {} (queue {}): {}",
            if started {
                "lost"
            } else if ever_consumed {
                "cannot reconnect to"
            } else {
                "cannot consume from"
            },
            redact(&opts.url),
            opts.queue,
            describe(&error),
        );
        eprintln!("amqp: {why}; retrying in {} ms", backoff.as_millis());
        stats.set_down(why);
        tokio::select! {
            () = shutdown.as_mut() => break,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(opts.reconnect_max);
    }
    stats.set_down("the consumer stopped".into());
    Ok(stats.snapshot())
}

/// An error with its causes, each said once: lapin's errors repeat their source in their
/// own message, so anyhow's `{:#}` would print the broker's reason twice.
fn describe(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// What every delivery's task needs.
struct Ctx {
    store: Arc<dyn Store>,
    opts: Arc<AmqpOptions>,
    /// A channel in confirm mode, for dead-letter copies.
    dead: Channel,
    /// Consecutive store errors, for the back-off.
    store_failures: AtomicU32,
}

/// One connection: declare, consume, process until shutdown or a failure.
async fn session(
    uri: &AMQPUri,
    store: &Arc<dyn Store>,
    opts: &Arc<AmqpOptions>,
    mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    started: &mut bool,
) -> Ended {
    let setup = async {
        let conn = connect(uri, &opts.url, &opts.connection_name, opts.connect_timeout).await?;
        let channel = conn.create_channel().await?;
        declare_topology(&channel, opts)
            .await
            .context("declaring the queues")?;
        let dead = conn.create_channel().await?;
        dead.confirm_select(ConfirmSelectOptions::default()).await?;
        channel
            // 0 would mean "no limit" to the broker, and so no bound on concurrent tasks.
            .basic_qos(opts.prefetch.max(1), BasicQosOptions::default())
            .await?;
        let consumer = channel
            .basic_consume(
                &opts.queue,
                "",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        anyhow::Ok((conn, channel, dead, consumer))
    };
    let (conn, channel, dead, mut consumer) = tokio::select! {
        () = shutdown.as_mut() => return Ended::Shutdown,
        r = setup => match r {
            Ok(parts) => parts,
            Err(e) => return Ended::Lost(e),
        },
    };
    *started = true;
    // Said once the broker took the consumer, not before: until then nothing is consumed.
    eprintln!(
        "amqp: consuming queue {} from {} (prefetch {})",
        opts.queue,
        redact(&opts.url),
        opts.prefetch.max(1)
    );
    opts.stats.set_consuming();
    let ctx = Arc::new(Ctx {
        store: store.clone(),
        opts: opts.clone(),
        dead,
        store_failures: AtomicU32::new(0),
    });
    let mut tasks = JoinSet::new();
    let ended = loop {
        tokio::select! {
            biased;
            () = shutdown.as_mut() => break Ended::Shutdown,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            next = consumer.next() => match next {
                Some(Ok(delivery)) => {
                    AmqpStats::inc(&opts.stats.consumed);
                    if delivery.redelivered {
                        AmqpStats::inc(&opts.stats.redelivered);
                    }
                    tasks.spawn(guarded(ctx.clone(), delivery));
                }
                Some(Err(e)) => break Ended::Lost(anyhow!(e).context("consuming")),
                None => break Ended::Lost(anyhow!("the broker cancelled the consumer")),
            },
        }
    };
    if matches!(ended, Ended::Shutdown) {
        opts.stats.set_down("the consumer is stopping".into());
    } else {
        // `consume` replaces this with the error once it has logged it.
        opts.stats
            .set_down("the connection to the broker was lost".into());
    }
    settle_in_hand(&ended, &channel, consumer.tag().as_str(), tasks, opts).await;
    let _ = channel.close(200, "shutting down").await;
    let _ = ctx.dead.close(200, "shutting down").await;
    let _ = conn.close(200, "shutting down").await;
    ended
}

/// What becomes of the deliveries in hand when a session ends.
async fn settle_in_hand(
    ended: &Ended,
    channel: &Channel,
    consumer_tag: &str,
    mut tasks: JoinSet<()>,
    opts: &AmqpOptions,
) {
    match ended {
        Ended::Shutdown => {
            // Stop the flow first, so that nothing new arrives while the tasks finish and
            // ack. They end on their own unless the store hangs: a task still waiting on it
            // after `drain_timeout` is abandoned unacked, so the broker hands its delivery
            // out again once this channel is closed below (and if its commit lands after
            // all, the redelivery is a replay).
            let _ = channel
                .basic_cancel(consumer_tag, BasicCancelOptions::default())
                .await;
            let drained = tokio::time::timeout(opts.drain_timeout, async {
                while tasks.join_next().await.is_some() {}
            })
            .await;
            if drained.is_err() {
                eprintln!(
                    "amqp: {} deliveries still waiting on the store after {} s; leaving \
                     them to the broker",
                    tasks.len(),
                    opts.drain_timeout.as_secs()
                );
                tasks.abort_all();
                // Left unsettled, like a delivery whose ack was lost: counted with them, so
                // that consumed = acked + requeued + acks_lost once the consumer stopped.
                // Only the tasks the abort ended: one may have finished meanwhile.
                while let Some(joined) = tasks.join_next().await {
                    if joined.is_err_and(|e| e.is_cancelled()) {
                        AmqpStats::inc(&opts.stats.ack_failures);
                    }
                }
            }
        }
        Ended::Lost(_) => {
            // The channel is gone, so nothing in hand can be acked any more: the broker has
            // requeued it all already. The tasks finish in the background (their commits
            // stand, their acks fail and count as `ack_failures`) while we reconnect at once
            // rather than wait on the store.
            tasks.detach_all();
        }
    }
}

/// Handles one delivery; a panic in handling it requeues it, so a message that crashes the
/// handler ends in the dead-letter queue through the delivery limit instead of being held
/// unacked (and its prefetch slot lost) until the connection closes.
async fn guarded(ctx: Arc<Ctx>, delivery: Delivery) {
    let acker = delivery.acker.clone();
    let stats = ctx.opts.stats.clone();
    if AssertUnwindSafe(process(&ctx, delivery))
        .catch_unwind()
        .await
        .is_err()
    {
        eprintln!("amqp: handling a delivery panicked; requeueing it");
        let requeue = BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        };
        match acker.nack(requeue).await {
            Ok(()) => AmqpStats::inc(&stats.requeued),
            Err(_) => AmqpStats::inc(&stats.ack_failures),
        }
    }
}

/// How many times this message has been delivered, this time included.
fn deliveries(properties: &BasicProperties) -> u64 {
    let earlier = properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(DELIVERY_COUNT_HEADER))
        .and_then(|v| match v {
            AMQPValue::ShortShortInt(n) => u64::try_from(*n).ok(),
            AMQPValue::ShortShortUInt(n) => Some(u64::from(*n)),
            AMQPValue::ShortInt(n) => u64::try_from(*n).ok(),
            AMQPValue::ShortUInt(n) => Some(u64::from(*n)),
            AMQPValue::LongInt(n) => u64::try_from(*n).ok(),
            AMQPValue::LongUInt(n) => Some(u64::from(*n)),
            AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
            _ => None,
        })
        .unwrap_or(0);
    earlier.saturating_add(1)
}

/// Moves one delivery on per its disposition. Nothing here decides about the message
/// itself but the delivery limit, which only the broker's count can tell.
async fn process(ctx: &Ctx, delivery: Delivery) {
    let n = deliveries(&delivery.properties);
    if n > u64::from(ctx.opts.max_deliveries) {
        let id = super::message_id_of(&delivery.data);
        let reason = format!(
            "delivered {n} times, more than max_deliveries {}: every attempt failed",
            ctx.opts.max_deliveries
        );
        let why = DeadReason::DeliveryLimit;
        // Every attempt failing usually means the store is failing too: then the
        // dead-letter queue alone keeps the message, rather than it going round for ever.
        let kept = keep(ctx, &delivery, &reason, id.clone()).await.ok();
        let id = id.unwrap_or_default();
        return dead_letter(ctx, &delivery, why, &reason, &id, n, kept).await;
    }
    // When the key was first found in flight: measured from that answer, not from the first
    // submission, which may itself have waited long on a slow store.
    let mut in_flight_since = None;
    loop {
        let disposition = super::handle(&*ctx.store, &delivery.data, &ctx.opts.rules).await;
        if disposition.decided_by_store() {
            ctx.store_failures.store(0, Ordering::Relaxed);
        }
        match disposition {
            Disposition::Executed(_) => {
                AmqpStats::inc(&ctx.opts.stats.executed);
                return ack_durable(ctx, &delivery).await;
            }
            Disposition::Replayed(_) => {
                AmqpStats::inc(&ctx.opts.stats.replayed);
                return ack_durable(ctx, &delivery).await;
            }
            Disposition::Quarantined { message_id, reason } => {
                // The store kept it in its quarantine, in the commit that refused it.
                AmqpStats::inc(&ctx.opts.stats.quarantined);
                let why = DeadReason::MessageIdReused;
                return dead_letter(ctx, &delivery, why, &reason, &message_id, n, None).await;
            }
            Disposition::DeadLetter {
                why,
                reason,
                message_id,
            } => {
                // Kept in the store's quarantine first, so that every refusal is in one
                // place an operator reads (`/v1/live/quarantine`); a store that cannot
                // keep it is a store error like any other: the message is requeued.
                let kept = match keep(ctx, &delivery, &reason, message_id.clone()).await {
                    Ok(id) => id,
                    Err(error) => return store_failed(ctx, &delivery, &error).await,
                };
                let id = message_id.unwrap_or_default();
                return dead_letter(ctx, &delivery, why, &reason, &id, n, Some(kept)).await;
            }
            Disposition::RetryLater(Retry::InProgress { retry_after }) => {
                // Usually a duplicate of this very message in the same prefetch window: its
                // twin commits within milliseconds, and the retry here is then a replay.
                // Waiting in place keeps the message's place and spends no delivery.
                let since = *in_flight_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() < ctx.opts.in_progress_wait {
                    tokio::time::sleep(retry_after.min(Duration::from_millis(20))).await;
                    continue;
                }
                tokio::time::sleep(ctx.opts.requeue_delay).await;
                return requeue(ctx, &delivery).await;
            }
            Disposition::RetryLater(Retry::Store(error)) => {
                return store_failed(ctx, &delivery, &error).await;
            }
        }
    }
}

/// Acks a delivery whose outcome is durable: only now may the broker forget the message.
async fn ack_durable(ctx: &Ctx, delivery: &Delivery) {
    // The crash window the broker crash test aims at: durable here, not yet acked, so the
    // broker must redeliver and the store must answer a replay. With the `failpoints`
    // feature, `FAILPOINTS=amqp.before_ack=6*off->return` aborts the process, as `kill -9`
    // would, at the point's seventh pass. Only the `return` action aborts: `panic` would
    // end this task alone, with the process and its connection to the broker still up.
    #[cfg(feature = "failpoints")]
    if fail::eval("amqp.before_ack", |_| ()).is_some() {
        eprintln!("amqp: failpoint amqp.before_ack: aborting before the ack");
        std::process::abort();
    }
    ack(ctx, delivery).await;
}

/// A store error: backs off (doubling per consecutive error), then requeues.
async fn store_failed(ctx: &Ctx, delivery: &Delivery, error: &LedgerError) {
    AmqpStats::inc(&ctx.opts.stats.store_errors);
    let failures = ctx.store_failures.fetch_add(1, Ordering::Relaxed);
    let delay = ctx
        .opts
        .store_backoff_min
        .saturating_mul(1 << failures.min(16))
        .min(ctx.opts.store_backoff_max);
    if failures == 0 || matches!(error, LedgerError::Corrupt { .. }) {
        eprintln!(
            "amqp: the store failed ({error}); requeueing deliveries, \
             backing off up to {} ms",
            ctx.opts.store_backoff_max.as_millis()
        );
    }
    tokio::time::sleep(delay.max(ctx.opts.requeue_delay)).await;
    requeue(ctx, delivery).await;
}

async fn ack(ctx: &Ctx, delivery: &Delivery) {
    match delivery.acker.ack(BasicAckOptions::default()).await {
        Ok(()) => AmqpStats::inc(&ctx.opts.stats.acked),
        // The channel is gone: the broker redelivers, and the ledger replays.
        Err(_) => AmqpStats::inc(&ctx.opts.stats.ack_failures),
    }
}

async fn requeue(ctx: &Ctx, delivery: &Delivery) {
    let requeue = BasicNackOptions {
        requeue: true,
        ..BasicNackOptions::default()
    };
    match delivery.acker.nack(requeue).await {
        Ok(()) => AmqpStats::inc(&ctx.opts.stats.requeued),
        Err(_) => AmqpStats::inc(&ctx.opts.stats.ack_failures),
    }
}

/// Keeps a refused delivery in the store's quarantine with its reason and its body as
/// received (the store keeps the first 4 KiB); returns the record's id.
async fn keep(
    ctx: &Ctx,
    delivery: &Delivery,
    reason: &str,
    message_id: Option<String>,
) -> Result<u64, LedgerError> {
    let kept = ctx
        .store
        .quarantine(message_id, reason.to_owned(), delivery.data.clone())
        .await;
    match &kept {
        Ok(_) => AmqpStats::inc(&ctx.opts.stats.quarantined),
        Err(e) => eprintln!("amqp: the store could not quarantine a refused message: {e}"),
    }
    kept
}

/// Publishes the dead-letter copy with its reason, waits for the broker's confirm, then
/// acks the original. If the copy is not confirmed, the original is requeued: a message is
/// never acked before it is kept somewhere durable. `quarantined` is the store's record of
/// it, when this delivery wrote one.
async fn dead_letter(
    ctx: &Ctx,
    delivery: &Delivery,
    why: DeadReason,
    reason: &str,
    message_id: &str,
    deliveries: u64,
    quarantined: Option<u64>,
) {
    // The original headers travel along, less the source queue's delivery count (the
    // dead-letter queue keeps its own; ours is in `x-idem-deliveries`).
    let mut headers: FieldTable = delivery
        .properties
        .headers()
        .as_ref()
        .map(|h| {
            h.inner()
                .iter()
                .filter(|(k, _)| k.as_str() != DELIVERY_COUNT_HEADER)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<BTreeMap<_, _>>()
                .into()
        })
        .unwrap_or_default();
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    headers.insert(REASON_HEADER.into(), text(reason));
    headers.insert("x-idem-queue".into(), text(&ctx.opts.queue));
    headers.insert(
        "x-idem-deliveries".into(),
        AMQPValue::LongLongInt(i64::try_from(deliveries).unwrap_or(i64::MAX)),
    );
    if !message_id.is_empty() {
        headers.insert("x-idem-message-id".into(), text(message_id));
    }
    let properties = delivery
        .properties
        .clone()
        .with_headers(headers)
        .with_delivery_mode(2);
    let routing_key = ShortString::from(ctx.opts.queue.as_str());
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let published = async {
        let confirm = ctx
            .dead
            .basic_publish(
                &ctx.opts.dead_letter_exchange,
                routing_key.as_str(),
                options,
                &delivery.data,
                properties,
            )
            .await?;
        anyhow::Ok(confirm.await?)
    }
    .await;
    let what = match published {
        Ok(Confirmation::Ack(None)) => {
            ctx.opts.stats.dead_lettered[why.index()].fetch_add(1, Ordering::Relaxed);
            // Said when it happens, for the operator who watches the log; the reason never
            // quotes the message.
            eprintln!(
                "amqp: dead-lettered message {} to {}{}: {reason}",
                if message_id.is_empty() {
                    "(no readable id)"
                } else {
                    message_id
                },
                ctx.opts.dead_letter_queue,
                quarantined
                    .map(|id| format!(" (quarantine #{id})"))
                    .unwrap_or_default(),
            );
            return ack(ctx, delivery).await;
        }
        Ok(Confirmation::Ack(Some(_))) => {
            "no queue is bound to the dead-letter exchange".to_owned()
        }
        Ok(Confirmation::Nack(_)) => "the broker refused it".to_owned(),
        Ok(Confirmation::NotRequested) => "confirms are off".to_owned(),
        Err(e) => describe(&e),
    };
    eprintln!(
        "amqp: could not dead-letter a message to {} ({what}); requeueing it",
        ctx.opts.dead_letter_exchange
    );
    tokio::time::sleep(ctx.opts.requeue_delay).await;
    requeue(ctx, delivery).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact("amqp://localhost"), "amqp://localhost");
        assert_eq!(redact("amqp://u@h/v"), "amqp://u@h/v");
        assert_eq!(redact("amqp://u:p@ss@h/v"), "amqp://u:***@h/v");
    }

    #[test]
    fn message_bodies_parse_back() {
        let id = MessageId::parse("m-1").unwrap();
        let key = Key::parse("ord-1").unwrap();
        let client = ClientId::parse("shop").unwrap();
        for body in [
            r#"{"account":"alice","amount":300,"currency":"RUB"}"#,
            r#"{"withdrawal":"req-7f3a","amount":5}"#,
        ] {
            let kind = if body.contains("withdrawal") {
                wire::CommandKind::Refund
            } else {
                wire::CommandKind::Withdraw
            };
            let command = wire::parse_body(kind, body.as_bytes()).unwrap();
            for c in [None, Some(&client)] {
                let line = message_body(&id, c, &key, &command);
                let m = wire::parse_message(&line).unwrap();
                assert_eq!(m.message_id, id);
                assert_eq!(m.key, key);
                assert_eq!(m.client.as_ref(), c);
                assert_eq!(m.command, command);
            }
        }
    }

    #[test]
    fn counts_deliveries_from_the_header() {
        assert_eq!(deliveries(&BasicProperties::default()), 1);
        let mut h = FieldTable::default();
        h.insert(DELIVERY_COUNT_HEADER.into(), AMQPValue::LongLongInt(3));
        assert_eq!(deliveries(&BasicProperties::default().with_headers(h)), 4);
    }

    #[test]
    fn reports_every_reason() {
        let stats = AmqpStats::default();
        stats.dead_lettered[DeadReason::KeyReused.index()].fetch_add(2, Ordering::Relaxed);
        let r = stats.snapshot();
        assert_eq!(r.dead_lettered.len(), DeadReason::ALL.len());
        assert_eq!(r.dead_lettered_total(), 2);
        assert!(r.to_string().contains("idempotency_key_reused 2"), "{r}");
        let mut out = String::new();
        stats.write_prometheus(&mut out);
        assert!(out.contains("idem_amqp_dead_lettered_total{reason=\"undecodable\"} 0"));
        stats.ack_failures.fetch_add(3, Ordering::Relaxed);
        stats.connect_failures.fetch_add(5, Ordering::Relaxed);
        let mut out = String::new();
        stats.write_prometheus(&mut out);
        for line in [
            "idem_amqp_acks_lost_total 3",
            "idem_amqp_connect_failures_total 5",
            "idem_amqp_reconnects_total 0",
            "idem_amqp_quarantined_total 0",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in {out}");
        }
    }

    #[test]
    fn health_says_why_it_is_down() {
        let stats = AmqpStats::default();
        let AmqpHealth::Down(why) = stats.health() else {
            panic!("consuming before any attempt")
        };
        assert!(why.contains("connecting"), "{why}");
        stats.set_consuming();
        assert_eq!(stats.health(), AmqpHealth::Consuming);
        stats.set_down("lost it".into());
        assert_eq!(stats.health(), AmqpHealth::Down("lost it".into()));
    }

    #[test]
    fn describes_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(111);
        let text = io.to_string();
        let e = anyhow::Error::new(lapin::Error::IOError(Arc::new(io))).context("connecting");
        let said = describe(&e);
        assert_eq!(said.matches(&text).count(), 1, "{said}");
        assert!(said.starts_with("connecting: "), "{said}");
    }
}
