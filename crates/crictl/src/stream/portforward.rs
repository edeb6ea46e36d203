//! Port-forward clients.
//!
//! SPDY (`portforward.k8s.io`, client-go's `tools/portforward`): one connection serves any
//! number of forwarded connections; each gets an error and a data stream carrying `port`
//! and a fresh `requestID`. WebSocket (`v4.channel.k8s.io` with `?port=`): one connection
//! per forwarded connection, data on channel 0 and errors on channel 1, each channel's
//! first two bytes being the port (little endian).

use super::{StreamError, spdy};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

const STREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// The message of an error-stream document: the kubelet's `{"closeConnection":…,
/// "message":…}` JSON, or plain text from older servers.
fn error_message(raw: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Resp {
        #[serde(default)]
        message: String,
    }
    match serde_json::from_slice::<Resp>(raw) {
        Ok(r) if !r.message.is_empty() => r.message,
        _ => String::from_utf8_lossy(raw).trim().to_string(),
    }
}

/// A SPDY port-forward connection.
pub struct SpdyPortForward {
    conn: spdy::Connection,
    next_request: AtomicU64,
}

impl SpdyPortForward {
    /// Upgrades `io` (a connection to the URL's host, see [`super::dial`]).
    pub async fn connect<S>(io: S, url: &str) -> Result<SpdyPortForward, StreamError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let url = &super::parse_url(url)?;
        let (upgraded, _) = super::spdy_upgrade(io, url, &["portforward.k8s.io"]).await?;
        let (conn, _incoming) = spdy::start(upgraded, spdy::Role::Client);
        Ok(SpdyPortForward {
            conn,
            next_request: AtomicU64::new(0),
        })
    }

    /// Whether the server closed the connection.
    pub fn is_closed(&self) -> bool {
        self.conn.is_closed()
    }

    /// Forwards one local connection to `port` in the pod until both sides are done.
    pub async fn forward<L>(&self, port: u16, local: L) -> Result<(), StreamError>
    where
        L: AsyncRead + AsyncWrite + Send + 'static,
    {
        let id = self.next_request.fetch_add(1, Ordering::SeqCst).to_string();
        let headers = |kind: &str| {
            spdy::Headers::new()
                .with("streamType", kind)
                .with("port", port.to_string())
                .with("requestID", id.clone())
        };
        let error = self
            .conn
            .open(headers("error"), STREAM_TIMEOUT)
            .await
            .map_err(StreamError::io(format!(
                "creating the error stream for port {port}"
            )))?;
        let (mut error_rx, error_w) = error.into_parts();
        // Nothing is written on the error stream by this side.
        error_w.close().await;
        let data = self
            .conn
            .open(headers("data"), STREAM_TIMEOUT)
            .await
            .map_err(StreamError::io(format!(
                "creating the data stream for port {port}"
            )))?;
        let (mut from_pod, to_pod) = data.into_parts();
        let errors = tokio::spawn(async move {
            let mut v = Vec::new();
            while let Some(c) = error_rx.recv().await {
                v.extend_from_slice(&c);
            }
            v
        });
        let (mut lr, mut lw) = tokio::io::split(local);
        let w = to_pod.clone();
        let upload = tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match lr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if w.write(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
            w.close().await;
        });
        // The pod's data until its end, then the verdict of the error stream.
        while let Some(c) = from_pod.recv().await {
            if lw.write_all(&c).await.is_err() {
                break;
            }
        }
        let _ = lw.shutdown().await;
        let msg = errors.await.unwrap_or_default();
        upload.abort();
        to_pod.reset(spdy::RST_CANCEL).await;
        if msg.is_empty() {
            Ok(())
        } else {
            Err(StreamError::Remote(format!(
                "an error occurred forwarding {port}: {}",
                error_message(&msg)
            )))
        }
    }
}

/// Forwards one local connection to `port` over its own WebSocket connection (`io` to the
/// URL's host; the port is added to the URL as `?port=`).
pub async fn ws_port_forward<S, L>(io: S, url: &str, port: u16, local: L) -> Result<(), StreamError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    L: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut url = super::parse_url(url)?;
    url.query_pairs_mut().append_pair("port", &port.to_string());
    let (ws, _) = super::ws_connect(io, &url, &["v4.channel.k8s.io"]).await?;
    let (mut sink, mut stream) = ws.split();
    let (mut lr, mut lw) = tokio::io::split(local);
    let upload = tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match lr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut m = Vec::with_capacity(n + 1);
                    m.push(0u8);
                    m.extend_from_slice(&buf[..n]);
                    if sink.send(Message::binary(m)).await.is_err() {
                        return;
                    }
                }
            }
        }
        // v4 has no way to end one direction: the connection stays open until the pod
        // side ends it.
        std::future::pending::<()>().await;
    });
    // Each channel starts with the port (two bytes, possibly split across messages).
    let mut prefix = [0usize; 2];
    let mut error = Vec::new();
    while let Some(m) = stream.next().await {
        let data: Bytes = match m {
            Ok(Message::Binary(b)) => b,
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        };
        if data.is_empty() {
            continue;
        }
        let ch = usize::from(data[0]);
        if ch > 1 {
            continue;
        }
        let mut payload = data.slice(1..);
        let skip = (2 - prefix[ch]).min(payload.len());
        prefix[ch] += skip;
        payload = payload.slice(skip..);
        if payload.is_empty() {
            continue;
        }
        if ch == 0 {
            if lw.write_all(&payload).await.is_err() {
                break;
            }
        } else {
            error.extend_from_slice(&payload);
        }
    }
    let _ = lw.shutdown().await;
    upload.abort();
    if error.is_empty() {
        Ok(())
    } else {
        Err(StreamError::Remote(format!(
            "an error occurred forwarding {port}: {}",
            error_message(&error)
        )))
    }
}
