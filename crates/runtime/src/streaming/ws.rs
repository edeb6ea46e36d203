//! The Kubernetes channel protocols over WebSocket (`k8s.io/apimachinery/pkg/util/
//! httpstream/wsstream`): every message starts with its channel number (binary protocols)
//! or the channel as an ASCII digit followed by base64 (`base64.` protocols); with
//! `v5.channel.k8s.io` the client half-closes a channel with `[255, channel]`.

use base64::Engine as _;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::io;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// The v5 close signal's channel byte.
pub(crate) const CLOSE_CHANNEL: u8 = 255;
/// Largest payload written in one message.
const MAX_CHUNK: usize = 32 * 1024;

/// How a negotiated subprotocol frames its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Framing {
    pub base64: bool,
    /// `[255, n]` closes channel n (v5).
    pub close_signal: bool,
}

impl Framing {
    /// The framing of a remotecommand/port-forward subprotocol ("" = the binary default).
    pub(crate) fn of(protocol: &str) -> Framing {
        Framing {
            base64: protocol.contains("base64."),
            close_signal: protocol == "v5.channel.k8s.io",
        }
    }
}

enum WsOut {
    Data(u8, Bytes),
    Close(oneshot::Sender<()>),
}

/// The writing side of one connection; clones share it.
#[derive(Clone)]
pub(crate) struct WsConn {
    out: mpsc::Sender<WsOut>,
    closed: watch::Receiver<bool>,
}

/// Starts the reader and writer tasks. Messages for a channel in `readers` go to its
/// sender (dropped at the channel's close signal or the connection's end); messages for
/// other channels are ignored, as wsstream ignores them.
pub(crate) fn start<S>(
    ws: WebSocketStream<S>,
    framing: Framing,
    readers: HashMap<u8, mpsc::Sender<Bytes>>,
) -> WsConn
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sink, stream) = ws.split();
    let (out_tx, out_rx) = mpsc::channel(64);
    let (closed_tx, closed_rx) = watch::channel(false);
    tokio::spawn(writer(sink, out_rx, framing));
    tokio::spawn(reader(stream, framing, readers, closed_tx));
    WsConn {
        out: out_tx,
        closed: closed_rx,
    }
}

async fn writer<S>(
    mut sink: futures::stream::SplitSink<WebSocketStream<S>, Message>,
    mut rx: mpsc::Receiver<WsOut>,
    framing: Framing,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    while let Some(out) = rx.recv().await {
        match out {
            WsOut::Data(ch, data) => {
                let msg = if framing.base64 {
                    let mut s = String::with_capacity(1 + data.len() * 4 / 3 + 4);
                    s.push(char::from(b'0' + ch));
                    base64::engine::general_purpose::STANDARD.encode_string(&data, &mut s);
                    Message::text(s)
                } else {
                    let mut v = Vec::with_capacity(1 + data.len());
                    v.push(ch);
                    v.extend_from_slice(&data);
                    Message::binary(v)
                };
                if sink.send(msg).await.is_err() {
                    return;
                }
            }
            WsOut::Close(ack) => {
                // Go's client treats only a 1000 close as a clean end of every stream.
                let _ = sink
                    .send(Message::Close(Some(CloseFrame {
                        code: CloseCode::Normal,
                        reason: "".into(),
                    })))
                    .await;
                let _ = sink.flush().await;
                let _ = ack.send(());
                return;
            }
        }
    }
}

async fn reader<S>(
    mut stream: futures::stream::SplitStream<WebSocketStream<S>>,
    framing: Framing,
    mut readers: HashMap<u8, mpsc::Sender<Bytes>>,
    closed: watch::Sender<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    while let Some(msg) = stream.next().await {
        let (ch, data) = match msg {
            Ok(Message::Binary(b)) if !b.is_empty() => (b[0], b.slice(1..)),
            Ok(Message::Text(t)) if !t.is_empty() => {
                let b = Bytes::from(t);
                (b[0], b.slice(1..))
            }
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        };
        if framing.close_signal && ch == CLOSE_CHANNEL {
            if let Some(&target) = data.first() {
                readers.remove(&target);
            }
            continue;
        }
        let (ch, data) = if framing.base64 {
            let Some(ch) = ch.checked_sub(b'0') else {
                continue;
            };
            match base64::engine::general_purpose::STANDARD.decode(&data) {
                Ok(d) => (ch, Bytes::from(d)),
                Err(_) => continue,
            }
        } else {
            (ch, data)
        };
        if data.is_empty() {
            continue;
        }
        let tx = readers.get(&ch).cloned();
        if let Some(tx) = tx
            && tx.send(data).await.is_err()
        {
            readers.remove(&ch);
        }
    }
    drop(readers);
    let _ = closed.send(true);
}

impl WsConn {
    /// Writes `data` on `channel` (an empty `data` sends the bare channel byte, which
    /// tells clients the connection is ready).
    pub(crate) async fn write(&self, channel: u8, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return self
                .out
                .send(WsOut::Data(channel, Bytes::new()))
                .await
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe));
        }
        for chunk in data.chunks(MAX_CHUNK) {
            self.out
                .send(WsOut::Data(channel, Bytes::copy_from_slice(chunk)))
                .await
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        }
        Ok(())
    }

    /// Sends the close frame after everything queued; waits until it is written.
    pub(crate) async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.out.send(WsOut::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Resolves once the client closed the connection (or it failed).
    pub(crate) async fn closed(&self) {
        let mut rx = self.closed.clone();
        let _ = rx.wait_for(|c| *c).await;
    }
}
