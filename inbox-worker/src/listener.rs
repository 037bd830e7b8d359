//! A TCP listener that counts open connections for `/metrics` and caps them: beyond the
//! cap, new connections wait in the kernel's backlog instead of exhausting the process.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;

pub struct CountedListener {
    inner: TcpListener,
    metrics: Arc<Metrics>,
    permits: Arc<Semaphore>,
}

impl CountedListener {
    pub fn new(inner: TcpListener, metrics: Arc<Metrics>, max_connections: usize) -> Self {
        Self {
            inner,
            metrics,
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
        }
    }
}

/// Decrements the gauge and frees the slot when the connection is dropped.
struct Slot {
    metrics: Arc<Metrics>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.metrics
            .open_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct CountedStream {
    inner: TcpStream,
    _slot: Slot,
}

impl axum::serve::Listener for CountedListener {
    type Io = CountedStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            // The semaphore is never closed, so acquiring only waits.
            let Ok(permit) = self.permits.clone().acquire_owned().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    // Small request/response pairs: waiting to coalesce writes only adds latency.
                    let _ = stream.set_nodelay(true);
                    self.metrics
                        .open_connections
                        .fetch_add(1, Ordering::Relaxed);
                    self.metrics
                        .connections_total
                        .fetch_add(1, Ordering::Relaxed);
                    let slot = Slot {
                        metrics: self.metrics.clone(),
                        _permit: permit,
                    };
                    return (
                        CountedStream {
                            inner: stream,
                            _slot: slot,
                        },
                        addr,
                    );
                }
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    eprintln!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
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

impl AsyncRead for CountedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
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
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
