//! The HTTP listener: accepts connections, serves each with hyper, and keeps every one of
//! them bounded in time, so that no client — idle, slow or hostile — can hold a slot for
//! long or keep the worker from stopping.
//!
//! Each connection is in one [`Phase`], tracked from both sides: the socket wrapper sees
//! the first byte of a request head, the service sees the head complete and the response
//! body end, the request-body wrapper sees the body being read. One sweeper closes the
//! connections that overstay their phase:
//!
//! | phase | what the worker waits for | closed after |
//! |---|---|---|
//! | fresh (accepted, no byte yet) | a request head | `header_timeout` |
//! | head (part of a head read) | the rest of the head | `header_timeout` from its first byte |
//! | body (the handler reads the body) | the rest of the body | `body_timeout` (answered 408) |
//! | busy (deciding, answering) | nothing: the worker is working | never by the sweeper |
//! | idle (keep-alive, between requests) | the next request | `idle_timeout` |
//!
//! A response the client does not read (busy, writes stalled) is closed after
//! `idle_timeout` without a byte written.
//!
//! At `max_connections` a new connection is still accepted, and the connection that
//! wastes its slot the most is closed instead: the oldest idle one, else the oldest that
//! has not sent a whole head, else the oldest still sending a body. Connections that are
//! being answered are never closed for room; only when every slot is busy does a new
//! client wait in the kernel's backlog.
//!
//! Shutdown stops accepting, closes at once every connection that holds no request
//! already read (idle, fresh, half a head, half a body), lets the busy ones run to their
//! answer with keep-alive off, and after `shutdown_grace` closes whatever is left.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::time::Sleep;

pub use super::metrics::Closed;
use super::metrics::Metrics;

/// How long each phase of a connection may last, how many there may be, and how long a
/// stop waits for requests in flight.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    /// From accepting (or from the first byte of a request) to the end of its head.
    pub header_timeout: Duration,
    /// From the first read of a request body to its end.
    pub body_timeout: Duration,
    /// A keep-alive connection between requests; also a response whose writes stall.
    pub idle_timeout: Duration,
    /// How long a stop waits for requests already read before it closes them.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    /// Defaults in the range well-run servers use (nginx waits 60 s for a header or a
    /// body and keeps idle connections 75 s; Go's servers are told 5–30 s): short enough
    /// that a flood of silent sockets drains within seconds, long enough for a phone.
    fn default() -> Self {
        Self {
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// What a connection is doing. The order is the order of eviction: lower goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
enum Phase {
    Idle = 0,
    Fresh = 1,
    Head = 2,
    Body = 3,
    Busy = 4,
}

impl Phase {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Phase::Idle,
            1 => Phase::Fresh,
            2 => Phase::Head,
            3 => Phase::Body,
            _ => Phase::Busy,
        }
    }

    /// Holds no request already read: a stop closes it at once.
    fn holds_no_request(self) -> bool {
        self != Phase::Busy
    }
}

/// What the connection's task is told to do.
const KEEP: u8 = 0;
const GRACEFUL: u8 = 1;
const DROP: u8 = 2;

/// One connection's state, shared by its socket, its service, its body and the sweeper.
struct Conn {
    id: u64,
    epoch: Instant,
    phase: AtomicU8,
    /// When the phase began, in ms since `epoch`.
    since: AtomicU64,
    /// When a write last made progress, in ms since `epoch`.
    wrote: AtomicU64,
    /// The last write could not proceed: the client is not reading.
    write_blocked: AtomicBool,
    order: AtomicU8,
    reason: AtomicU8,
    wake: Notify,
}

impl Conn {
    fn now(&self) -> u64 {
        ms(self.epoch.elapsed())
    }

    fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    fn enter(&self, phase: Phase) {
        self.since.store(self.now(), Ordering::Release);
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// The first byte of a head: only from a phase that waits for one.
    fn bytes_arrived(&self) {
        for from in [Phase::Fresh, Phase::Idle] {
            if self
                .phase
                .compare_exchange(
                    from as u8,
                    Phase::Head as u8,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                self.since.store(self.now(), Ordering::Release);
                return;
            }
        }
    }

    fn closing(&self) -> bool {
        self.order.load(Ordering::Acquire) == DROP
    }

    /// Tells the task to close the connection now (or to stop keep-alive: `GRACEFUL`).
    /// The first reason given is the one counted.
    fn order(&self, order: u8, reason: Closed) {
        let _ = self
            .reason
            .compare_exchange(0, reason as u8, Ordering::AcqRel, Ordering::Acquire);
        if self.order.fetch_max(order, Ordering::AcqRel) < order {
            self.wake.notify_one();
        }
    }

    /// The reason it must close now, if it overstayed its phase.
    fn overdue(&self, limits: &Limits, now: u64) -> Option<Closed> {
        let since = self.since.load(Ordering::Acquire);
        let age = now.saturating_sub(since);
        match self.phase() {
            Phase::Fresh | Phase::Head if age > ms(limits.header_timeout) => {
                Some(Closed::HeaderTimeout)
            }
            // The body's own deadline answers 408 first; this only catches a handler that
            // never reads what the client keeps sending.
            Phase::Body if age > ms(limits.body_timeout) + 1000 => Some(Closed::BodyTimeout),
            Phase::Idle if age > ms(limits.idle_timeout) => Some(Closed::IdleTimeout),
            Phase::Busy => {
                let wrote = self.wrote.load(Ordering::Acquire).max(since);
                // A busy connection that is deciding has not tried to write: only one
                // whose last write could not proceed is the client's fault.
                let blocked = self.write_blocked.load(Ordering::Acquire);
                (blocked && now.saturating_sub(wrote) > ms(limits.idle_timeout))
                    .then_some(Closed::WriteStalled)
            }
            _ => None,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The connections of one listener.
struct Registry {
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Rung when a connection ends, for an accept that waits for a slot.
    freed: Notify,
    epoch: Instant,
    next_id: AtomicU64,
    stopping: AtomicBool,
}

impl Registry {
    /// Closes the connection that wastes its slot the most, if any may be closed.
    fn evict_one(&self) -> bool {
        let conns = self.conns.lock();
        let victim = conns
            .values()
            .filter(|c| !c.closing() && c.phase() != Phase::Busy)
            .min_by_key(|c| (c.phase(), c.since.load(Ordering::Acquire)));
        match victim {
            Some(c) => {
                c.order(DROP, Closed::Evicted);
                true
            }
            None => false,
        }
    }

    /// Connections not already told to close.
    fn live(&self) -> usize {
        self.conns.lock().values().filter(|c| !c.closing()).count()
    }
}

/// Serves `router` on `listener` until `stop` turns true, then shuts down as the module
/// doc says. Returns when every connection has ended.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let registry = Arc::new(Registry {
        conns: Mutex::new(HashMap::new()),
        freed: Notify::new(),
        epoch: Instant::now(),
        next_id: AtomicU64::new(0),
        stopping: AtomicBool::new(false),
    });
    let sweeper = tokio::spawn(sweep(registry.clone(), limits, stop.clone()));
    let max = limits.max_connections.max(1);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors and the like: free a wasted slot and retry soon.
                eprintln!("accept failed: {e}");
                registry.evict_one();
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Make room: close the worst-spent slot. When every slot is being answered, the
        // new client waits for one to end.
        while registry.live() >= max && !registry.evict_one() {
            tokio::select! {
                _ = registry.freed.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        if *stop.borrow() {
            break;
        }
        start(&registry, stream, router.clone(), limits, metrics.clone());
    }
    drop(listener);
    shut_down(&registry, limits).await;
    sweeper.abort();
}

fn start(
    registry: &Arc<Registry>,
    stream: TcpStream,
    router: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
) {
    // Small request/response pairs: waiting to coalesce writes only adds latency.
    let _ = stream.set_nodelay(true);
    let id = registry.next_id.fetch_add(1, Ordering::Relaxed);
    let conn = Arc::new(Conn {
        id,
        epoch: registry.epoch,
        phase: AtomicU8::new(Phase::Fresh as u8),
        since: AtomicU64::new(ms(registry.epoch.elapsed())),
        wrote: AtomicU64::new(0),
        write_blocked: AtomicBool::new(false),
        order: AtomicU8::new(KEEP),
        reason: AtomicU8::new(0),
        wake: Notify::new(),
    });
    registry.conns.lock().insert(id, conn.clone());
    metrics.open_connections.fetch_add(1, Ordering::Relaxed);
    metrics.connections_total.fetch_add(1, Ordering::Relaxed);
    let registry = registry.clone();
    tokio::spawn(async move {
        run(conn.clone(), stream, router, limits).await;
        registry.conns.lock().remove(&conn.id);
        metrics.open_connections.fetch_sub(1, Ordering::Relaxed);
        let reason = conn.reason.load(Ordering::Acquire);
        if let Some(r) = Closed::ALL.iter().find(|r| **r as u8 == reason) {
            metrics.closed(*r);
        }
        registry.freed.notify_one();
    });
}

/// Serves one connection until it ends or is told to close.
async fn run(conn: Arc<Conn>, stream: TcpStream, router: Router, limits: Limits) {
    let io = TokioIo::new(Watched {
        inner: stream,
        conn: conn.clone(),
    });
    let service_conn = conn.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let conn = service_conn.clone();
        let router = router.clone();
        async move {
            conn.enter(Phase::Busy);
            // Until the response body is dropped (sent, or the connection gone), the
            // connection is busy; then it is idle, waiting for the next request.
            let guard = BusyGuard(conn.clone());
            let read_whole = Arc::new(AtomicBool::new(req.body().is_end_stream()));
            let req = req.map(|body| {
                Body::new(TimedBody {
                    inner: body,
                    conn: conn.clone(),
                    timeout: limits.body_timeout,
                    deadline: None,
                    read_whole: read_whole.clone(),
                })
            });
            let response = tower::ServiceExt::oneshot(router, req).await;
            let Ok(mut response) = response;
            // An answer given before the body was read to its end (no token, an unknown
            // route, a refused coding) leaves bytes on the socket that cannot be told
            // from a next request, so hyper closes the connection after it unless the
            // rest is already buffered. Saying so in the answer keeps a client from
            // pooling the connection and sending its next request into a closed socket.
            if !read_whole.load(Ordering::Acquire) {
                response.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(Guarded {
                    inner: body,
                    _guard: guard,
                })
            }))
        }
    });
    let http = hyper::server::conn::http1::Builder::new()
        // A head may take 16 KiB (keys, tokens and a few proxies' headers fit many times);
        // the buffer bounds what a silent or flooding client costs in memory.
        .max_buf_size(16 * 1024)
        .serve_connection(io, service);
    tokio::pin!(http);
    loop {
        tokio::select! {
            _ = http.as_mut() => return,
            _ = conn.wake.notified() => match conn.order.load(Ordering::Acquire) {
                DROP => return,
                GRACEFUL => http.as_mut().graceful_shutdown(),
                _ => {}
            },
        }
    }
}

/// Closes connections that overstayed their phase, a few times a second.
async fn sweep(registry: Arc<Registry>, limits: Limits, mut stop: watch::Receiver<bool>) {
    let tick = (limits.header_timeout.min(limits.body_timeout) / 20)
        .clamp(Duration::from_millis(10), Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => {}
        }
        let now = ms(registry.epoch.elapsed());
        for c in registry.conns.lock().values() {
            if c.closing() {
                continue;
            }
            if let Some(reason) = c.overdue(&limits, now) {
                c.order(DROP, reason);
            } else if registry.stopping.load(Ordering::Acquire) && c.phase().holds_no_request() {
                // A connection that turned idle after its last answer during the stop.
                c.order(DROP, Closed::Shutdown);
            }
        }
    }
}

async fn shut_down(registry: &Registry, limits: Limits) {
    registry.stopping.store(true, Ordering::Release);
    for c in registry.conns.lock().values() {
        if c.phase().holds_no_request() {
            c.order(DROP, Closed::Shutdown);
        } else {
            c.order(GRACEFUL, Closed::Shutdown);
        }
    }
    let deadline = tokio::time::Instant::now() + limits.shutdown_grace;
    while !registry.conns.lock().is_empty() {
        tokio::select! {
            _ = registry.freed.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            _ = tokio::time::sleep_until(deadline) => {
                let conns = registry.conns.lock();
                eprintln!(
                    "stopping: closing {} connection(s) still answering after the grace period",
                    conns.len()
                );
                for c in conns.values() {
                    c.order(DROP, Closed::Shutdown);
                }
                break;
            }
        }
    }
    // The tasks told to drop their connection end at their next poll.
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    while !registry.conns.lock().is_empty() && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Marks the connection idle when the response body is dropped.
struct BusyGuard(Arc<Conn>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.enter(Phase::Idle);
    }
}

/// A response body that holds its connection busy while it lives.
struct Guarded {
    inner: Body,
    _guard: BusyGuard,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The body of a request took longer than the body timeout to arrive.
#[derive(Debug)]
pub struct BodyTimeout;

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive in time")
    }
}

impl std::error::Error for BodyTimeout {}

/// A request body with a deadline from its first read, which also marks the connection
/// as reading a body until the body ends.
struct TimedBody {
    inner: Incoming,
    conn: Arc<Conn>,
    timeout: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
    /// Set once the body has been read to its end.
    read_whole: Arc<AtomicBool>,
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.deadline.is_none() {
            this.conn.enter(Phase::Body);
            this.deadline = Some(Box::pin(tokio::time::sleep(this.timeout)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.read_whole.store(true, Ordering::Release);
                this.conn.enter(Phase::Busy);
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => {
                if this.inner.is_end_stream() {
                    this.read_whole.store(true, Ordering::Release);
                }
                Poll::Ready(Some(frame.map_err(Into::into)))
            }
            Poll::Pending => match this.deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => {
                    // The handler answers 408 and the connection closes after it.
                    let _ = this.conn.reason.compare_exchange(
                        0,
                        Closed::BodyTimeout as u8,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    this.conn.enter(Phase::Busy);
                    Poll::Ready(Some(Err(Box::new(BodyTimeout))))
                }
                _ => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, reporting the first byte of a request head and write progress.
struct Watched {
    inner: TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.bytes_arrived();
        }
        polled
    }
}

impl Watched {
    fn wrote(&self, polled: &Poll<io::Result<usize>>) {
        match polled {
            Poll::Ready(Ok(n)) if *n > 0 => {
                self.conn.wrote.store(self.conn.now(), Ordering::Release);
                self.conn.write_blocked.store(false, Ordering::Release);
            }
            Poll::Pending => self.conn.write_blocked.store(true, Ordering::Release),
            _ => {}
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(&polled);
        polled
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(&polled);
        polled
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
