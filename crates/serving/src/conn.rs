//! The connection loop of an HTTP(S) server: accepting, the TLS handshake, serving HTTP/1.1
//! and HTTP/2 with upgrades, under limits an unauthenticated client cannot exhaust:
//!
//! - a TLS handshake timeout (upstream's 10 s); when more than `max_handshakes` connections
//!   are mid-handshake the oldest is dropped, so a flood of silent sockets delays nobody
//!   for longer than it takes to complete a handshake;
//! - a request-header read timeout (Go's `ReadHeaderTimeout`; hyper's `header_read_timeout`
//!   also closes an HTTP/1.1 keep-alive connection waiting that long for its next request);
//! - an idle timeout: a connection with no request in flight and no bytes either way for
//!   that long is closed (upstream's HTTP/2 `IdleTimeout`, 90 s);
//! - at most `max_connections` connections; one more is closed as soon as it is accepted.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinSet;

/// The limits of one listening server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub max_handshakes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(90),
            max_connections: 4096,
            max_handshakes: 1024,
        }
    }
}

/// A connection's request handler, given the client's certificate (TLS with one).
pub type Response = hyper::Response<Body>;

/// Serves connections accepted on `listener` (TLS when `tls` is given) until `shutdown`
/// resolves, then ends every connection. `service` makes the handler of one connection.
pub async fn serve<F, S, Fut>(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    service: F,
    shutdown: impl Future<Output = ()> + Send,
) where
    F: Fn(Option<CertificateDer<'static>>) -> S + Clone + Send + Sync + 'static,
    S: Fn(hyper::Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Response, Infallible>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let handshakes = Arc::new(Handshakes::default());
    let mut conns = JoinSet::new();
    let mut refused_logged = Instant::now() - Duration::from_secs(60);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of file descriptors or similar: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    if refused_logged.elapsed() > Duration::from_secs(10) {
                        refused_logged = Instant::now();
                        tracing::warn!(%peer, max = limits.max_connections, "connection limit reached: closing new connections");
                    }
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let tls = tls.clone();
                let service = service.clone();
                let handshakes = handshakes.clone();
                conns.spawn(async move {
                    let _permit = permit;
                    match tls {
                        None => drive(tcp, service(None), limits).await,
                        Some(acceptor) => {
                            let (id, evicted) = handshakes.begin(limits.max_handshakes);
                            let done = tokio::select! {
                                r = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)) => r,
                                _ = evicted => {
                                    tracing::debug!(%peer, "TLS handshake dropped: too many handshakes in progress");
                                    return;
                                }
                            };
                            handshakes.end(id);
                            let stream = match done {
                                Ok(Ok(s)) => s,
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "TLS handshake timed out");
                                    return;
                                }
                            };
                            let cert = stream
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .cloned();
                            drive(stream, service(cert), limits).await;
                        }
                    }
                });
            }
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Serves HTTP on one connection until it ends or stays idle too long.
async fn drive<I, S, Fut>(io: I, handler: S, limits: Limits)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Fn(hyper::Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Response, Infallible>> + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = Tracked {
        inner: io,
        activity: activity.clone(),
    };
    let handler = Arc::new(handler);
    let tracker = activity.clone();
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let busy = Busy::new(tracker.clone());
        let fut = handler(req);
        async move {
            let resp = fut.await?;
            // The request stays in flight until its body is sent: a quiet watch is not idle.
            Ok::<_, Infallible>(resp.map(|b| {
                Body::new(b.map_frame(move |f| {
                    let _ = &busy;
                    f
                }))
            }))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
    tokio::select! {
        r = conn => if let Err(e) = r {
            tracing::debug!(error = %e, "connection ended with an error");
        },
        _ = activity.idle(limits.idle_timeout) => {
            tracing::debug!("closing an idle connection");
        }
    }
}

/// The connections mid-handshake, oldest first, each with the sender that drops it.
#[derive(Default)]
struct Handshakes {
    next: AtomicU64,
    pending: Mutex<VecDeque<(u64, oneshot::Sender<()>)>>,
}

impl Handshakes {
    fn begin(&self, max: usize) -> (u64, oneshot::Receiver<()>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        while p.len() >= max.max(1) {
            if let Some((_, oldest)) = p.pop_front() {
                let _ = oldest.send(());
            }
        }
        p.push_back((id, tx));
        (id, rx)
    }

    fn end(&self, id: u64) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = p.iter().position(|(x, _)| *x == id) {
            p.remove(i);
        }
    }
}

/// When a connection last moved bytes, and how many of its requests are in flight.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }

    /// Resolves once the connection has been idle for `timeout`.
    async fn idle(&self, timeout: Duration) {
        loop {
            let idle = self.idle_for();
            if self.in_flight.load(Ordering::Relaxed) == 0 && idle >= timeout {
                return;
            }
            let wait = if self.in_flight.load(Ordering::Relaxed) > 0 {
                timeout
            } else {
                timeout - idle
            };
            tokio::time::sleep(wait.max(Duration::from_millis(50))).await;
        }
    }
}

/// A request in flight on a connection, until dropped.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(a: Arc<Activity>) -> Self {
        a.in_flight.fetch_add(1, Ordering::Relaxed);
        Busy(a)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// A connection's byte stream, noting each read and write in its [`Activity`].
struct Tracked<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Tracked<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Tracked<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    async fn server(limits: Limits) -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let make = |_cert: Option<CertificateDer<'static>>| {
            |_req: hyper::Request<Incoming>| async {
                Ok::<_, Infallible>(hyper::Response::new(Body::from("ok")))
            }
        };
        tokio::spawn(serve(l, None, limits, make, std::future::pending()));
        addr
    }

    /// Reads until the server closes the connection (or the bound passes).
    async fn closed_within(s: &mut tokio::net::TcpStream, bound: Duration) -> bool {
        let mut buf = [0u8; 1024];
        tokio::time::timeout(bound, async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }

    #[tokio::test]
    async fn a_half_sent_header_and_an_idle_connection_are_closed() {
        let addr = server(Limits {
            header_read_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(500),
            ..Limits::default()
        })
        .await;
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        assert!(closed_within(&mut slow, Duration::from_secs(30)).await);

        let mut ok = tokio::net::TcpStream::connect(addr).await.unwrap();
        ok.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = ok.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        // Kept alive, then closed once idle.
        assert!(closed_within(&mut ok, Duration::from_secs(30)).await);
    }

    #[tokio::test]
    async fn connections_over_the_limit_are_closed_at_once() {
        let addr = server(Limits {
            max_connections: 2,
            ..Limits::default()
        })
        .await;
        let _a = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut c, Duration::from_secs(30)).await);
    }
}
