//! Port-forward: each forwarded connection is a TCP connection to `localhost:<port>` inside
//! the sandbox's network namespace, opened from a thread that entered the namespace (so the
//! daemon's other threads never change namespace), then copied asynchronously — containerd's
//! `portForward` in `sandbox_portforward_linux.go`.
//!
//! Over SPDY the client opens an error and a data stream per connection (headers
//! `streamType`, `port`, `requestID`); over WebSocket the ports are fixed for the connection
//! and each has a data and an error channel.

use super::PortForwardRequest;
use super::spdy::{self, Stream, StreamWriter};
use super::ws::{self, WsConn};
use bytes::Bytes;
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// After the pod side closed, how long the client has to finish its side (containerd: 1s).
const GRACE: Duration = Duration::from_secs(1);
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to `localhost:port` in `netns` (the host's namespace when `None`): IPv4, then
/// IPv6, as containerd dials "tcp4" then "tcp6".
pub(crate) async fn dial(netns: Option<PathBuf>, port: u16) -> io::Result<tokio::net::TcpStream> {
    let std = tokio::task::spawn_blocking(move || dial_blocking(netns.as_deref(), port))
        .await
        .map_err(io::Error::other)??;
    std.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(std)
}

fn dial_blocking(netns: Option<&Path>, port: u16) -> io::Result<TcpStream> {
    let connect = move || -> io::Result<TcpStream> {
        let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
        match TcpStream::connect_timeout(&v4, DIAL_TIMEOUT) {
            Ok(s) => Ok(s),
            Err(e4) => TcpStream::connect_timeout(&v6, DIAL_TIMEOUT).map_err(|e6| {
                io::Error::new(
                    e4.kind(),
                    format!("failed to connect to localhost:{port}, IPv4: {e4} IPv6: {e6}"),
                )
            }),
        }
    };
    let Some(ns) = netns else {
        return connect();
    };
    let f = std::fs::File::open(ns)
        .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", ns.display())))?;
    // A thread of its own enters the namespace and ends with the connection made: the
    // socket stays in the namespace it was created in.
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setns on this thread only, with a namespace descriptor we hold.
                if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    let e = io::Error::last_os_error();
                    return Err(io::Error::new(
                        e.kind(),
                        format!("entering network namespace {}: {e}", ns.display()),
                    ));
                }
                connect()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("port-forward dialer thread panicked")))
    })
}

/// The kubelet's `portForwardErrResponse`, one JSON line on the error stream.
fn error_response(port: u16, sandbox: &str, err: &io::Error) -> Vec<u8> {
    let close = !matches!(
        err.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
    );
    let mut v = serde_json::to_vec(&serde_json::json!({
        "closeConnection": close,
        "message": format!("error forwarding port {port} to pod {sandbox}, uid : {err}"),
    }))
    .unwrap_or_default();
    v.push(b'\n');
    v
}

/// Copies between the pod connection and the client until both sides are done: the pod's
/// end of output ends the client's stream; the client's end (FIN) half-closes the pod
/// connection; after the pod side ended, the client gets [`GRACE`] to finish.
async fn pump<W, Fut>(
    conn: tokio::net::TcpStream,
    mut from_client: mpsc::Receiver<Bytes>,
    write: W,
    close: impl std::future::Future<Output = ()>,
    gone: impl std::future::Future<Output = ()>,
) -> io::Result<()>
where
    W: Fn(Bytes) -> Fut,
    Fut: std::future::Future<Output = io::Result<()>>,
{
    let (mut rd, mut wr) = conn.into_split();
    let upstream = async move {
        while let Some(chunk) = from_client.recv().await {
            wr.write_all(&chunk).await?;
        }
        wr.shutdown().await
    };
    let downstream = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = rd.read(&mut buf).await?;
            if n == 0 {
                close.await;
                return Ok::<_, io::Error>(());
            }
            write(Bytes::copy_from_slice(&buf[..n])).await?;
        }
    };
    tokio::pin!(upstream, downstream);
    tokio::select! {
        _ = gone => Ok(()),
        r = &mut downstream => {
            let _ = tokio::time::timeout(GRACE, &mut upstream).await;
            r
        }
        r = &mut upstream => {
            // The client is done sending; the pod may still answer.
            let d = downstream.await;
            r.and(d)
        }
    }
}

/// Serves one SPDY port-forward connection until the client closes it.
pub(crate) async fn serve_spdy(
    req: PortForwardRequest,
    conn: spdy::Connection,
    mut incoming: spdy::Incoming,
) {
    struct Pair {
        data: Option<Stream>,
        error: Option<Stream>,
        created: tokio::time::Instant,
    }
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    loop {
        let stream = tokio::select! {
            s = incoming.next() => match s {
                Some(s) => s,
                None => break,
            },
            _ = sweep.tick() => {
                // Pairs the client never completed (the kubelet's monitorStreamPair).
                let now = tokio::time::Instant::now();
                let stale: Vec<String> = pairs
                    .iter()
                    .filter(|(_, p)| now - p.created > super::STREAM_CREATION_TIMEOUT)
                    .map(|(k, _)| k.clone())
                    .collect();
                for id in stale {
                    if let Some(p) = pairs.remove(&id) {
                        if let Some(e) = p.error {
                            let w = e.writer();
                            let _ = w.write(format!("timed out waiting for streams (request {id})").as_bytes()).await;
                            w.close().await;
                        }
                        if let Some(d) = p.data {
                            d.writer().reset(spdy::RST_CANCEL).await;
                        }
                    }
                }
                continue;
            }
        };
        // The kubelet's httpStreamReceived: a valid port and stream type, or the stream is
        // refused.
        let h = stream.headers();
        let port_ok = h
            .get("port")
            .and_then(|p| p.parse::<u16>().ok())
            .is_some_and(|p| p > 0);
        let kind = h.get("streamtype").unwrap_or("").to_string();
        if !port_ok || !matches!(kind.as_str(), "data" | "error") {
            tracing::warn!(
                port = h.get("port").unwrap_or(""),
                stream_type = %kind,
                "port-forward stream refused"
            );
            stream.writer().reset(spdy::RST_REFUSED_STREAM).await;
            continue;
        }
        let request_id = match h.get("requestid") {
            Some(r) if !r.is_empty() => r.to_string(),
            // Old clients: error and data streams of one connection have consecutive ids.
            _ if kind == "error" => stream.id().to_string(),
            _ => stream.id().saturating_sub(2).to_string(),
        };
        if stream.reply().await.is_err() {
            break;
        }
        let pair = pairs.entry(request_id.clone()).or_insert_with(|| Pair {
            data: None,
            error: None,
            created: tokio::time::Instant::now(),
        });
        let slot = if kind == "data" {
            &mut pair.data
        } else {
            &mut pair.error
        };
        if slot.is_some() {
            let msg = format!(
                "error processing stream for request {request_id}: {kind} stream already assigned"
            );
            tracing::warn!("{msg}");
            if let Some(e) = &pair.error {
                let _ = e.writer().write(msg.as_bytes()).await;
            }
            stream.writer().reset(spdy::RST_PROTOCOL_ERROR).await;
            continue;
        }
        *slot = Some(stream);
        if pair.data.is_some()
            && pair.error.is_some()
            && let Some(Pair {
                data: Some(data),
                error: Some(error),
                ..
            }) = pairs.remove(&request_id)
        {
            tokio::spawn(forward_spdy(req.clone(), data, error, conn.clone()));
        }
    }
    drop(conn);
}

async fn forward_spdy(
    req: PortForwardRequest,
    data: Stream,
    error: Stream,
    conn_gone: spdy::Connection,
) {
    let port = data
        .headers()
        .get("port")
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(0);
    let (from_client, to_client) = data.into_parts();
    let err_w: StreamWriter = error.writer();
    tracing::debug!(sandbox = %req.sandbox_id, port, "port-forward connection");
    let result = match dial(req.netns.clone(), port).await {
        Ok(conn) => {
            let w = to_client.clone();
            let c = to_client.clone();
            pump(
                conn,
                from_client,
                move |b| {
                    let w = w.clone();
                    async move { w.write(&b).await }
                },
                async move { c.close().await },
                conn_gone.closed(),
            )
            .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        tracing::warn!(sandbox = %req.sandbox_id, port, error = %e, "port-forward failed");
        let _ = err_w
            .write(&error_response(port, &req.sandbox_id, &e))
            .await;
    }
    to_client.close().await;
    err_w.close().await;
}

/// Serves a WebSocket port-forward: a data and an error channel per port, each opened by
/// the port as two little-endian bytes; the connection ends when every forward has.
pub(crate) async fn serve_ws<S>(
    req: PortForwardRequest,
    ports: Vec<u16>,
    socket: tokio_tungstenite::WebSocketStream<S>,
    protocol: &str,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut readers = HashMap::new();
    let mut inputs = Vec::new();
    for i in 0..ports.len() {
        let (tx, rx) = mpsc::channel(64);
        readers.insert((2 * i) as u8, tx);
        inputs.push(rx);
    }
    let conn = ws::start(socket, ws::Framing::of(protocol), readers);
    for (i, port) in ports.iter().enumerate() {
        let le = port.to_le_bytes();
        let _ = conn.write((2 * i) as u8, &le).await;
        let _ = conn.write((2 * i + 1) as u8, &le).await;
    }
    let mut tasks = Vec::new();
    for (i, (port, input)) in ports.into_iter().zip(inputs).enumerate() {
        let conn: WsConn = conn.clone();
        let req = req.clone();
        tasks.push(tokio::spawn(async move {
            let data_ch = (2 * i) as u8;
            let result = match dial(req.netns.clone(), port).await {
                Ok(c) => {
                    let w = conn.clone();
                    pump(
                        c,
                        input,
                        move |b| {
                            let w = w.clone();
                            async move { w.write(data_ch, &b).await }
                        },
                        async {},
                        conn.closed(),
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::warn!(sandbox = %req.sandbox_id, port, error = %e, "port-forward failed");
                let _ = conn
                    .write(data_ch + 1, &error_response(port, &req.sandbox_id, &e))
                    .await;
            }
        }));
    }
    tokio::select! {
        _ = futures::future::join_all(tasks.iter_mut()) => {}
        _ = conn.closed() => {}
    }
    for t in &tasks {
        t.abort();
    }
    conn.close().await;
    let _ = tokio::time::timeout(Duration::from_secs(2), conn.closed()).await;
}
