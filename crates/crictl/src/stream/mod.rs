//! Clients of a CRI streaming server (the URLs that Exec, Attach and PortForward return),
//! speaking what client-go speaks to the kubelet's and containerd's streaming server:
//!
//! * remotecommand over SPDY/3.1 (`X-Stream-Protocol-Version: v4/v3/v2.channel.k8s.io`, one
//!   stream per `streamType`) or WebSocket (`v5.channel.k8s.io`, falling back to
//!   `v4.channel.k8s.io`; channel-prefixed messages) — [`remotecommand`];
//! * port-forward over SPDY (`portforward.k8s.io`: an error and a data stream per
//!   connection) or WebSocket (`?port=`, a data and an error channel) — [`portforward`].
//!
//! The outcome of a command arrives on the error stream as a `metav1.Status`; a non-zero
//! exit is [`StreamError::Exit`], displayed as kubectl displays it: "command terminated
//! with exit code N".

pub mod portforward;
pub mod remotecommand;
pub use nodus_spdy as spdy;
pub mod term;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use std::io;
use tokio::io::{AsyncRead, AsyncWrite};

pub use portforward::{SpdyPortForward, ws_port_forward};
pub use remotecommand::{Output, Session, StreamOptions, TerminalSize, start};

/// How to reach the streaming server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Transport {
    /// SPDY/3.1 (crictl's and kubectl's long-standing default).
    #[default]
    Spdy,
    /// WebSocket (`v5.channel.k8s.io`).
    Websocket,
}

/// Why a stream failed, or how the remote command ended.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The command exited non-zero.
    #[error("command terminated with exit code {0}")]
    Exit(i32),
    /// The server reported a failure on the error stream.
    #[error("{0}")]
    Remote(String),
    /// The server refused the upgrade.
    #[error("unable to upgrade connection: {status}: {body}")]
    Upgrade { status: u16, body: String },
    #[error("stream protocol error: {0}")]
    Protocol(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl StreamError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> StreamError {
        let context = context.into();
        move |source| StreamError::Io { context, source }
    }

    /// The remote command's exit code, when that is what ended it.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            StreamError::Exit(c) => Some(*c),
            _ => None,
        }
    }
}

/// Parses a streaming URL.
pub(crate) fn parse_url(url: &str) -> Result<url::Url, StreamError> {
    url::Url::parse(url)
        .map_err(|e| StreamError::Protocol(format!("invalid streaming URL {url:?}: {e}")))
}

/// Opens a TCP connection to the URL's host (`http://` only: the streaming servers of
/// nodus and containerd listen on plain HTTP on loopback by default).
pub async fn dial(url: &str) -> Result<tokio::net::TcpStream, StreamError> {
    let url = &parse_url(url)?;
    if url.scheme() != "http" {
        return Err(StreamError::Protocol(format!(
            "unsupported streaming URL scheme {:?} in {url} (only http is supported)",
            url.scheme()
        )));
    }
    let host = url
        .host_str()
        .ok_or_else(|| StreamError::Protocol(format!("streaming URL {url} has no host")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_or_known_default().unwrap_or(80);
    let s = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(StreamError::io(format!("dialing {url}")))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// The request target of `url` (path and query) and its `Host` header value.
fn target(url: &url::Url) -> (String, String) {
    let mut path = url.path().to_string();
    if let Some(q) = url.query() {
        path.push('?');
        path.push_str(q);
    }
    let host = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or("")),
        None => url.host_str().unwrap_or("").to_string(),
    };
    (path, host)
}

/// The SPDY upgrade: `POST` with `Upgrade: SPDY/3.1` and the protocols offered; returns the
/// upgraded connection and the protocol the server chose.
pub(crate) async fn spdy_upgrade<S>(
    io: S,
    url: &url::Url,
    protocols: &[&str],
) -> Result<(TokioIo<hyper::upgrade::Upgraded>, String), StreamError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| StreamError::Protocol(format!("HTTP handshake with {url}: {e}")))?;
    tokio::spawn(conn.with_upgrades());
    let (path, host) = target(url);
    let mut b = hyper::Request::post(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONNECTION, "Upgrade")
        .header(hyper::header::UPGRADE, spdy::UPGRADE_TOKEN);
    for p in protocols {
        b = b.header("X-Stream-Protocol-Version", *p);
    }
    let req = b
        .body(Empty::<Bytes>::new())
        .map_err(|e| StreamError::Protocol(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| StreamError::Protocol(format!("upgrade request to {url}: {e}")))?;
    if resp.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
        let status = resp.status().as_u16();
        let body = match resp.into_body().collect().await {
            Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_string(),
            Err(e) => e.to_string(),
        };
        return Err(StreamError::Upgrade { status, body });
    }
    let chosen = resp
        .headers()
        .get("x-stream-protocol-version")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let upgraded = hyper::upgrade::on(resp)
        .await
        .map_err(|e| StreamError::Protocol(format!("upgrading {url}: {e}")))?;
    Ok((TokioIo::new(upgraded), chosen))
}

/// The WebSocket handshake offering `protocols`; returns the socket and the chosen one.
pub(crate) async fn ws_connect<S>(
    io: S,
    url: &url::Url,
    protocols: &[&str],
) -> Result<(tokio_tungstenite::WebSocketStream<S>, String), StreamError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let mut ws_url = url.clone();
    let _ = ws_url.set_scheme("ws");
    let mut req = ws_url
        .as_str()
        .into_client_request()
        .map_err(|e| StreamError::Protocol(format!("websocket request for {url}: {e}")))?;
    if let Ok(v) = protocols.join(", ").parse() {
        req.headers_mut().insert("Sec-WebSocket-Protocol", v);
    }
    match tokio_tungstenite::client_async(req, io).await {
        Ok((ws, resp)) => {
            let chosen = resp
                .headers()
                .get("sec-websocket-protocol")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            Ok((ws, chosen))
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(StreamError::Upgrade {
            status: resp.status().as_u16(),
            body: resp
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).trim().to_string())
                .unwrap_or_default(),
        }),
        Err(e) => Err(StreamError::Protocol(format!(
            "websocket handshake with {url}: {e}"
        ))),
    }
}
