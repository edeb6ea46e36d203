//! The remotecommand session shared by exec and attach: the client's streams gathered from a
//! SPDY connection or a WebSocket, whatever the transport (the kubelet's
//! `remotecommand/httpstream.go` and `websocket.go`).

use super::spdy;
use super::status::Outcome;
use super::ws::{self, WsConn};
use bytes::Bytes;
use std::collections::HashMap;
use std::io;
use std::time::Duration;
use tokio::sync::mpsc;

pub(crate) const STDIN: u8 = 0;
pub(crate) const STDOUT: u8 = 1;
pub(crate) const STDERR: u8 = 2;
pub(crate) const ERROR: u8 = 3;
pub(crate) const RESIZE: u8 = 4;

/// How long to wait for the client to close the connection after the outcome was sent.
const LINGER: Duration = Duration::from_secs(2);

/// Which streams the request asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Want {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// A terminal size as clients send it: `{"Width":80,"Height":24}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub(crate) struct TermSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// A stream towards the client.
#[derive(Clone)]
pub(crate) enum Output {
    Spdy(spdy::StreamWriter),
    Ws(WsConn, u8),
}

impl Output {
    pub(crate) async fn write(&self, data: &[u8]) -> io::Result<()> {
        match self {
            Output::Spdy(w) => w.write(data).await,
            Output::Ws(c, ch) => {
                if data.is_empty() {
                    return Ok(());
                }
                c.write(*ch, data).await
            }
        }
    }

    /// The end of this stream (SPDY FIN; WebSocket channels end with the connection).
    pub(crate) async fn close(&self) {
        if let Output::Spdy(w) = self {
            w.close().await;
        }
    }
}

enum Conn {
    Spdy(spdy::Connection),
    Ws(WsConn),
}

/// The error stream's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusFormat {
    /// v4 and v5: `metav1.Status` JSON.
    Json,
    /// v1–v3: the error text, nothing on success.
    Text,
}

/// An established session.
pub(crate) struct Session {
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    pub stdout: Option<Output>,
    pub stderr: Option<Output>,
    pub resize: Option<mpsc::Receiver<TermSize>>,
    error: Option<Output>,
    format: StatusFormat,
    conn: Conn,
}

impl Session {
    /// Resolves when the client closed the connection.
    pub(crate) async fn disconnected(&self) {
        match &self.conn {
            Conn::Spdy(c) => c.closed().await,
            Conn::Ws(c) => c.closed().await,
        }
    }

    /// Sends the outcome, ends every stream and closes the connection, giving the client
    /// a moment to read everything and close its side first.
    pub(crate) async fn finish(self, outcome: Outcome, what: &str) {
        for o in [&self.stdout, &self.stderr].into_iter().flatten() {
            o.close().await;
        }
        if let Some(e) = &self.error {
            let body = match self.format {
                StatusFormat::Json => outcome.v4_json(what),
                StatusFormat::Text => outcome.legacy_text(what),
            };
            if !body.is_empty() {
                let _ = e.write(&body).await;
            }
            e.close().await;
        }
        match &self.conn {
            Conn::Spdy(c) => {
                c.go_away().await;
                c.shutdown().await;
                let _ = tokio::time::timeout(LINGER, c.closed()).await;
            }
            Conn::Ws(c) => {
                c.close().await;
                let _ = tokio::time::timeout(LINGER, c.closed()).await;
            }
        }
    }
}

/// Turns a byte stream of concatenated JSON sizes (SPDY) or one size per message
/// (WebSocket) into sizes; stops at the first malformed document, as the kubelet does.
fn resize_decoder(mut raw: mpsc::Receiver<Bytes>) -> mpsc::Receiver<TermSize> {
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = raw.recv().await {
            buf.extend_from_slice(&chunk);
            let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<TermSize>();
            let mut consumed = 0;
            loop {
                match it.next() {
                    Some(Ok(size)) => {
                        consumed = it.byte_offset();
                        if tx.send(size).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(_)) => return,
                    None => {
                        consumed = buf.len();
                        break;
                    }
                }
            }
            buf.drain(..consumed);
        }
    });
    rx
}

/// Gathers the streams of a SPDY remotecommand session: the client opens one stream per
/// type and waits for each reply; `expected` counts them (the kubelet's waitForStreams).
pub(crate) async fn spdy_session(
    conn: spdy::Connection,
    mut incoming: spdy::Incoming,
    protocol: &str,
    want: Want,
) -> Result<Session, String> {
    let resizing = protocol != "v2.channel.k8s.io";
    let format = if matches!(protocol, "v4.channel.k8s.io" | "v5.channel.k8s.io") {
        StatusFormat::Json
    } else {
        StatusFormat::Text
    };
    let expected = 1
        + usize::from(want.stdin)
        + usize::from(want.stdout)
        + usize::from(want.stderr)
        + usize::from(want.tty && resizing);
    let mut s = Session {
        stdin: None,
        stdout: None,
        stderr: None,
        resize: None,
        error: None,
        format,
        conn: Conn::Spdy(conn),
    };
    let mut received = 0;
    let deadline = tokio::time::Instant::now() + super::STREAM_CREATION_TIMEOUT;
    while received < expected {
        let stream = match tokio::time::timeout_at(deadline, incoming.next()).await {
            Ok(Some(st)) => st,
            Ok(None) => return Err("the client closed the connection".into()),
            Err(_) => return Err("timed out waiting for client to create streams".into()),
        };
        let kind = stream.headers().get("streamtype").unwrap_or("").to_string();
        if stream.reply().await.is_err() {
            return Err("the client closed the connection".into());
        }
        let (rx, w) = stream.into_parts();
        match kind.as_str() {
            "error" => s.error = Some(Output::Spdy(w)),
            "stdin" => s.stdin = Some(rx),
            "stdout" => s.stdout = Some(Output::Spdy(w)),
            "stderr" => s.stderr = Some(Output::Spdy(w)),
            "resize" => s.resize = Some(resize_decoder(rx)),
            other => {
                tracing::warn!(stream_type = other, "unexpected stream type");
                continue;
            }
        }
        received += 1;
    }
    // Streams the client opens later are refused: the incoming queue closes here.
    drop(incoming);
    Ok(s)
}

/// Sets up the channels of a WebSocket remotecommand session and tells the client it is
/// ready (an empty message on the lowest writable channel, as the kubelet does).
pub(crate) async fn ws_session<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    protocol: &str,
    want: Want,
) -> Session
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut readers = HashMap::new();
    let (stdin_tx, stdin_rx) = mpsc::channel(64);
    if want.stdin {
        readers.insert(STDIN, stdin_tx);
    }
    let (resize_tx, resize_rx) = mpsc::channel(8);
    readers.insert(RESIZE, resize_tx);
    let conn = ws::start(ws, ws::Framing::of(protocol), readers);
    let out = |ch| Some(Output::Ws(conn.clone(), ch));
    let format = if matches!(protocol, "v4.channel.k8s.io" | "v4.base64.channel.k8s.io")
        || protocol == "v5.channel.k8s.io"
    {
        StatusFormat::Json
    } else {
        StatusFormat::Text
    };
    let ready = if want.stdout {
        STDOUT
    } else if want.stderr {
        STDERR
    } else {
        ERROR
    };
    let _ = conn.write(ready, &[]).await;
    Session {
        stdin: want.stdin.then_some(stdin_rx),
        stdout: if want.stdout { out(STDOUT) } else { None },
        stderr: if want.stderr { out(STDERR) } else { None },
        resize: Some(resize_decoder(resize_rx)),
        error: out(ERROR),
        format,
        conn: Conn::Ws(conn),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resize_documents_split_across_chunks() {
        let (tx, rx) = mpsc::channel(8);
        let mut sizes = resize_decoder(rx);
        tx.send(Bytes::from_static(b"{\"Width\":80,\"Hei"))
            .await
            .unwrap();
        tx.send(Bytes::from_static(
            b"ght\":24}\n{\"Width\":100,\"Height\":40}",
        ))
        .await
        .unwrap();
        assert_eq!(
            sizes.recv().await,
            Some(TermSize {
                width: 80,
                height: 24
            })
        );
        assert_eq!(
            sizes.recv().await,
            Some(TermSize {
                width: 100,
                height: 40
            })
        );
        drop(tx);
        assert_eq!(sizes.recv().await, None);
    }
}
