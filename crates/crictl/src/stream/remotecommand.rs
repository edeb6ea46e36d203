//! The remotecommand client (exec and attach), as client-go's `tools/remotecommand`.
//!
//! [`start`] establishes the session and returns the local ends: a sender for stdin
//! (dropping it ends the remote stdin: SPDY FIN, or the v5 close signal), a sender for
//! terminal sizes, and a receiver of output. Read the output until it ends, then
//! [`Session::wait`] for the outcome.

use super::{StreamError, Transport, spdy};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

/// Protocols offered over SPDY, preferred first (client-go's order).
pub const SPDY_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
];
/// Protocols offered over WebSocket, preferred first.
pub const WS_PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io"];

const STREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// Which streams to open (they must match the Exec/Attach request).
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// A terminal size, serialised as client-go does: `{"Width":80,"Height":24}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TerminalSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// Output of the remote process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// An established session.
pub struct Session {
    /// The remote stdin, when asked for; drop it to end the remote stdin.
    pub stdin: Option<mpsc::Sender<Bytes>>,
    /// Terminal sizes (TTY sessions whose protocol supports resizing).
    pub resize: Option<mpsc::Sender<TerminalSize>>,
    /// Output until the remote side ends it.
    pub output: mpsc::Receiver<Output>,
    /// The negotiated protocol.
    pub protocol: String,
    done: oneshot::Receiver<Result<(), StreamError>>,
}

impl Session {
    /// The outcome; call after `output` ended.
    pub async fn wait(self) -> Result<(), StreamError> {
        self.done
            .await
            .unwrap_or_else(|_| Err(StreamError::Protocol("the session ended abruptly".into())))
    }
}

#[derive(serde::Deserialize, Default)]
struct Cause {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

#[derive(serde::Deserialize, Default)]
struct Details {
    #[serde(default)]
    causes: Vec<Cause>,
}

#[derive(serde::Deserialize)]
struct Status {
    #[serde(default)]
    status: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    details: Option<Details>,
}

/// Decodes the error stream (client-go's errorDecoderV4, or the plain text of older
/// protocols). An empty error stream is success.
pub fn decode_error_stream(protocol: &str, msg: &[u8]) -> Result<(), StreamError> {
    if msg.is_empty() {
        return Ok(());
    }
    if !matches!(protocol, "v4.channel.k8s.io" | "v5.channel.k8s.io") {
        return Err(StreamError::Remote(format!(
            "error executing remote command: {}",
            String::from_utf8_lossy(msg)
        )));
    }
    let st: Status = serde_json::from_slice(msg).map_err(|e| {
        StreamError::Protocol(format!(
            "error stream protocol error: {e} in {:?}",
            String::from_utf8_lossy(msg)
        ))
    })?;
    match st.status.as_str() {
        "Success" => Ok(()),
        "Failure" if st.reason == "NonZeroExitCode" => {
            let details = st.details.ok_or_else(|| {
                StreamError::Protocol("error stream protocol error: details must be set".into())
            })?;
            let cause = details
                .causes
                .iter()
                .find(|c| c.reason == "ExitCode")
                .ok_or_else(|| {
                    StreamError::Protocol(
                        "error stream protocol error: no ExitCode cause given".into(),
                    )
                })?;
            let code: u8 = cause.message.parse().map_err(|_| {
                StreamError::Protocol(format!(
                    "error stream protocol error: invalid exit code value {:?}",
                    cause.message
                ))
            })?;
            Err(StreamError::Exit(i32::from(code)))
        }
        "Failure" => Err(StreamError::Remote(st.message)),
        _ => Err(StreamError::Protocol(
            "error stream protocol error: unknown error".into(),
        )),
    }
}

/// Establishes a session over `io` (a connection to the URL's host, see
/// [`super::dial`]).
pub async fn start<S>(
    io: S,
    url: &str,
    transport: Transport,
    opts: StreamOptions,
) -> Result<Session, StreamError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let url = &super::parse_url(url)?;
    match transport {
        Transport::Spdy => start_spdy(io, url, opts).await,
        Transport::Websocket => start_ws(io, url, opts).await,
    }
}

async fn read_all(mut rx: mpsc::Receiver<Bytes>) -> Vec<u8> {
    let mut v = Vec::new();
    while let Some(c) = rx.recv().await {
        v.extend_from_slice(&c);
    }
    v
}

async fn start_spdy<S>(io: S, url: &url::Url, opts: StreamOptions) -> Result<Session, StreamError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (upgraded, protocol) = super::spdy_upgrade(io, url, SPDY_PROTOCOLS).await?;
    let (conn, _incoming) = spdy::start(upgraded, spdy::Role::Client);
    let open = |kind: &'static str| {
        let conn = conn.clone();
        async move {
            conn.open(
                spdy::Headers::new().with("streamType", kind),
                STREAM_TIMEOUT,
            )
            .await
            .map_err(StreamError::io(format!("creating the {kind} stream")))
        }
    };
    // The order client-go uses: error first, then the standard streams, then resize.
    let error = open("error").await?;
    let stdin = if opts.stdin {
        Some(open("stdin").await?)
    } else {
        None
    };
    let stdout = if opts.stdout {
        Some(open("stdout").await?)
    } else {
        None
    };
    let stderr = if opts.stderr && !opts.tty {
        Some(open("stderr").await?)
    } else {
        None
    };
    let resize = if opts.tty && protocol != "v2.channel.k8s.io" {
        Some(open("resize").await?)
    } else {
        None
    };
    // This side writes nothing on the error stream.
    let (error_rx, error_w) = error.into_parts();
    error_w.close().await;

    let (out_tx, out_rx) = mpsc::channel(64);
    let mut readers = Vec::new();
    for (s, is_err) in [(stdout, false), (stderr, true)] {
        let Some(s) = s else { continue };
        let tx = out_tx.clone();
        let (mut rx, _w) = s.into_parts();
        readers.push(tokio::spawn(async move {
            while let Some(c) = rx.recv().await {
                let o = if is_err {
                    Output::Stderr(c)
                } else {
                    Output::Stdout(c)
                };
                if tx.send(o).await.is_err() {
                    break;
                }
            }
        }));
    }
    drop(out_tx);
    let stdin_tx = stdin.map(|s| {
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        let (_, w) = s.into_parts();
        tokio::spawn(async move {
            while let Some(c) = rx.recv().await {
                if w.write(&c).await.is_err() {
                    return;
                }
            }
            w.close().await;
        });
        tx
    });
    let resize_tx = resize.map(|s| {
        let (tx, mut rx) = mpsc::channel::<TerminalSize>(4);
        let (_, w) = s.into_parts();
        tokio::spawn(async move {
            while let Some(size) = rx.recv().await {
                let mut j = serde_json::to_vec(&size).unwrap_or_default();
                j.push(b'\n');
                if w.write(&j).await.is_err() {
                    return;
                }
            }
        });
        tx
    });
    let (done_tx, done_rx) = oneshot::channel();
    let p = protocol.clone();
    tokio::spawn(async move {
        // As client-go: the output streams first, then the error stream's verdict.
        let errors = tokio::spawn(read_all(error_rx));
        for r in readers {
            let _ = r.await;
        }
        let msg = errors.await.unwrap_or_default();
        let _ = done_tx.send(decode_error_stream(&p, &msg));
        conn.shutdown().await;
    });
    Ok(Session {
        stdin: stdin_tx,
        resize: resize_tx,
        output: out_rx,
        protocol,
        done: done_rx,
    })
}

async fn start_ws<S>(io: S, url: &url::Url, opts: StreamOptions) -> Result<Session, StreamError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (ws, protocol) = super::ws_connect(io, url, WS_PROTOCOLS).await?;
    let (mut sink, mut stream) = ws.split();
    let (msg_tx, mut msg_rx) = mpsc::channel::<Message>(64);
    // One writer owns the sink.
    tokio::spawn(async move {
        while let Some(m) = msg_rx.recv().await {
            if sink.send(m).await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    });
    let frame = |ch: u8, data: &[u8]| {
        let mut v = Vec::with_capacity(data.len() + 1);
        v.push(ch);
        v.extend_from_slice(data);
        Message::binary(v)
    };
    let close_signal = protocol == "v5.channel.k8s.io";
    let stdin_tx = opts.stdin.then(|| {
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        let out = msg_tx.clone();
        tokio::spawn(async move {
            while let Some(c) = rx.recv().await {
                if out.send(frame(0, &c)).await.is_err() {
                    return;
                }
            }
            if close_signal {
                let _ = out.send(Message::binary(vec![255u8, 0])).await;
            }
        });
        tx
    });
    let resize_tx = opts.tty.then(|| {
        let (tx, mut rx) = mpsc::channel::<TerminalSize>(4);
        let out = msg_tx.clone();
        tokio::spawn(async move {
            while let Some(size) = rx.recv().await {
                let j = serde_json::to_vec(&size).unwrap_or_default();
                if out.send(frame(4, &j)).await.is_err() {
                    return;
                }
            }
        });
        tx
    });
    let (out_tx, out_rx) = mpsc::channel(64);
    let (done_tx, done_rx) = oneshot::channel();
    let p = protocol.clone();
    tokio::spawn(async move {
        let mut error = Vec::new();
        let mut abnormal = None;
        while let Some(m) = stream.next().await {
            let data = match m {
                Ok(Message::Binary(b)) => b,
                Ok(Message::Close(_)) => break,
                Ok(_) => continue,
                Err(e) => {
                    abnormal = Some(e.to_string());
                    break;
                }
            };
            if data.is_empty() {
                continue;
            }
            let payload = data.slice(1..);
            if payload.is_empty() {
                continue;
            }
            let o = match data[0] {
                1 => Output::Stdout(payload),
                2 => Output::Stderr(payload),
                3 => {
                    error.extend_from_slice(&payload);
                    continue;
                }
                _ => continue,
            };
            if out_tx.send(o).await.is_err() {
                break;
            }
        }
        drop(out_tx);
        let r = match (decode_error_stream(&p, &error), abnormal) {
            (Ok(()), Some(e)) if error.is_empty() => Err(StreamError::Protocol(format!(
                "the connection ended abnormally: {e}"
            ))),
            (r, _) => r,
        };
        let _ = done_tx.send(r);
        drop(msg_tx);
    });
    Ok(Session {
        stdin: stdin_tx,
        resize: resize_tx,
        output: out_rx,
        protocol,
        done: done_rx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_streams_decode_like_client_go() {
        let v4 = "v4.channel.k8s.io";
        assert!(decode_error_stream(v4, b"").is_ok());
        assert!(decode_error_stream(v4, br#"{"metadata":{},"status":"Success"}"#).is_ok());
        let e = decode_error_stream(
            v4,
            br#"{"metadata":{},"status":"Failure","message":"x","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#,
        )
        .unwrap_err();
        assert_eq!(e.exit_code(), Some(3));
        assert_eq!(e.to_string(), "command terminated with exit code 3");
        let e = decode_error_stream(
            v4,
            br#"{"metadata":{},"status":"Failure","message":"Internal error occurred: boom","reason":"InternalError","code":500}"#,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "Internal error occurred: boom");
        let e = decode_error_stream("v3.channel.k8s.io", b"it broke").unwrap_err();
        assert_eq!(e.to_string(), "error executing remote command: it broke");
    }
}
