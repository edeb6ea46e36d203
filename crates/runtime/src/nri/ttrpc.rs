//! containerd's ttrpc over one logical connection of the [`mux`](super::mux): each message
//! is a 10-byte header — payload length u32 BE, stream id u32 BE, type u8 (1 request,
//! 2 response), flags u8 — then a protobuf `ttrpc.Request` or `ttrpc.Response`. Clients use
//! odd stream ids from 1, one stream per unary call.

use super::mux::{Sink, Writer};
use bytes::{Bytes, BytesMut};
use prost::Message as _;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

pub(crate) const HEADER_LEN: usize = 10;
/// ttrpc's largest message payload.
pub(crate) const MAX_MESSAGE: usize = 4 << 20;

const TYPE_REQUEST: u8 = 1;
const TYPE_RESPONSE: u8 = 2;

/// `ttrpc.Request`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Request {
    #[prost(string, tag = "1")]
    pub service: String,
    #[prost(string, tag = "2")]
    pub method: String,
    #[prost(bytes = "bytes", tag = "3")]
    pub payload: Bytes,
    #[prost(int64, tag = "4")]
    pub timeout_nano: i64,
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// `ttrpc.Response`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Response {
    #[prost(message, optional, tag = "1")]
    pub status: Option<RpcStatus>,
    #[prost(bytes = "bytes", tag = "2")]
    pub payload: Bytes,
}

/// A header and payload as they go on the wire.
pub(crate) fn frame(stream_id: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.push(kind);
    out.push(0);
    out.extend_from_slice(payload);
    out
}

/// Reassembles one connection's byte stream into messages.
#[derive(Default)]
struct Messages {
    buf: BytesMut,
}

impl Messages {
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message: (stream id, type, payload).
    fn next(&mut self) -> std::io::Result<Option<(u32, u8, Bytes)>> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let h = &self.buf[..HEADER_LEN];
        let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let sid = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let kind = h[8];
        if len > MAX_MESSAGE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("ttrpc message of {len} bytes is over the {MAX_MESSAGE}-byte limit"),
            ));
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let _ = self.buf.split_to(HEADER_LEN);
        Ok(Some((sid, kind, self.buf.split_to(len).freeze())))
    }
}

/// Why a call did not return a response message.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CallError {
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("connection closed")]
    Closed,
    /// The peer answered with an error status (gRPC code and message).
    #[error("rpc error: code = {} desc = {message}", tonic::Code::from_i32(*.code).description())]
    Status { code: i32, message: String },
    #[error("protocol error: {0}")]
    Protocol(String),
}

type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<Result<Bytes, CallError>>>>>;

/// A ttrpc client on one logical connection.
#[derive(Clone)]
pub(crate) struct Client {
    writer: Writer,
    next: Arc<AtomicU32>,
    pending: Pending,
    closed: Arc<AtomicBool>,
    closed_tx: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Client {
    /// A client writing on `writer`; its answers arrive through the returned sink.
    pub(crate) fn new(writer: Writer) -> (Client, Box<dyn Sink>) {
        let pending: Pending = Default::default();
        let closed = Arc::new(AtomicBool::new(false));
        let (closed_tx, _) = tokio::sync::watch::channel(false);
        let closed_tx = Arc::new(closed_tx);
        let sink = Answers {
            messages: Messages::default(),
            pending: Arc::clone(&pending),
            closed: Arc::clone(&closed),
            closed_tx: Arc::clone(&closed_tx),
        };
        let client = Client {
            writer,
            next: Arc::new(AtomicU32::new(1)),
            pending,
            closed,
            closed_tx,
        };
        (client, Box::new(sink))
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Resolves when the connection is gone.
    pub(crate) async fn closed(&self) {
        let mut rx = self.closed_tx.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Closes the connection (the trunk, so both logical connections end).
    pub(crate) async fn close(&self) {
        self.writer.shutdown().await;
    }

    /// One unary call of `service`/`method`, answered within `timeout`.
    pub(crate) async fn call<Q: prost::Message, A: prost::Message + Default>(
        &self,
        service: &str,
        method: &str,
        req: &Q,
        timeout: Duration,
    ) -> Result<A, CallError> {
        if self.is_closed() {
            return Err(CallError::Closed);
        }
        let sid = self.next.fetch_add(2, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(sid, tx);
        let msg = Request {
            service: service.to_string(),
            method: method.to_string(),
            payload: req.encode_to_vec().into(),
            timeout_nano: timeout.as_nanos() as i64,
        }
        .encode_to_vec();
        if msg.len() > MAX_MESSAGE {
            self.forget(sid);
            return Err(CallError::Protocol(format!(
                "request of {} bytes is over the {MAX_MESSAGE}-byte limit",
                msg.len()
            )));
        }
        if self
            .writer
            .write(&frame(sid, TYPE_REQUEST, &msg))
            .await
            .is_err()
        {
            self.forget(sid);
            return Err(CallError::Closed);
        }
        match tokio::time::timeout(timeout, rx).await {
            Err(_) => {
                self.forget(sid);
                Err(CallError::Timeout(timeout))
            }
            Ok(Err(_)) => Err(CallError::Closed),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Ok(Ok(payload))) => {
                A::decode(payload).map_err(|e| CallError::Protocol(e.to_string()))
            }
        }
    }

    fn forget(&self, sid: u32) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&sid);
    }
}

/// A client's reading side: each answer goes straight to the call waiting for it.
struct Answers {
    messages: Messages,
    pending: Pending,
    closed: Arc<AtomicBool>,
    closed_tx: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Sink for Answers {
    fn data(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.messages.push(bytes);
        while let Some((sid, kind, payload)) = self.messages.next()? {
            if kind != TYPE_RESPONSE {
                continue;
            }
            let Some(tx) = self
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&sid)
            else {
                continue;
            };
            let result = match Response::decode(payload) {
                Ok(Response {
                    status: Some(s), ..
                }) if s.code != 0 => Err(CallError::Status {
                    code: s.code,
                    message: s.message,
                }),
                Ok(r) => Ok(r.payload),
                Err(e) => Err(CallError::Protocol(e.to_string())),
            };
            let _ = tx.send(result);
        }
        Ok(())
    }

    fn closed(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        for (_, tx) in self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            let _ = tx.send(Err(CallError::Closed));
        }
        let _ = self.closed_tx.send(true);
    }
}

/// What a served method answers: a response payload, or a gRPC code and message.
pub(crate) type Answer = Result<Vec<u8>, (tonic::Code, String)>;
pub(crate) type Handler = Arc<
    dyn Fn(String, String, Bytes) -> Pin<Box<dyn Future<Output = Answer> + Send>> + Send + Sync,
>;

/// A server's reading side: each request is handled in its own task (a slow one does not
/// hold the others up) and answered on the writer.
struct Requests {
    messages: Messages,
    handler: Handler,
    writer: Writer,
}

impl Sink for Requests {
    fn data(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.messages.push(bytes);
        while let Some((sid, kind, payload)) = self.messages.next()? {
            if kind != TYPE_REQUEST {
                continue;
            }
            let (handler, writer) = (Arc::clone(&self.handler), self.writer.clone());
            tokio::spawn(async move {
                let answer = match Request::decode(payload) {
                    Ok(r) => handler(r.service, r.method, r.payload).await,
                    Err(e) => Err((tonic::Code::InvalidArgument, e.to_string())),
                };
                let resp = match answer {
                    Ok(p) => Response {
                        status: None,
                        payload: p.into(),
                    },
                    Err((code, message)) => Response {
                        status: Some(RpcStatus {
                            code: code as i32,
                            message,
                        }),
                        payload: Bytes::new(),
                    },
                };
                let _ = writer
                    .write(&frame(sid, TYPE_RESPONSE, &resp.encode_to_vec()))
                    .await;
            });
        }
        Ok(())
    }

    fn closed(&mut self) {}
}

/// Serves requests arriving through the returned sink with `handler(service, method,
/// payload)`, answering on `writer`.
pub(crate) fn serve(writer: Writer, handler: Handler) -> Box<dyn Sink> {
    Box::new(Requests {
        messages: Messages::default(),
        handler,
        writer,
    })
}

/// Decodes a request payload for a handler, as a ttrpc server answers a malformed one.
pub(crate) fn decode<M: prost::Message + Default>(p: Bytes) -> Result<M, (tonic::Code, String)> {
    M::decode(p).map_err(|e| (tonic::Code::InvalidArgument, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_length_stream_type_flags_big_endian() {
        let f = frame(3, TYPE_REQUEST, b"xyz");
        assert_eq!(&f[..10], &[0, 0, 0, 3, 0, 0, 0, 3, 1, 0]);
        assert_eq!(&f[10..], b"xyz");
    }

    #[tokio::test]
    async fn unary_calls_errors_timeouts_and_close() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (a1, a2, a_demux) = super::super::mux::split(a);
        let (b1, b2, b_demux) = super::super::mux::split(b);
        let (client, answers) = Client::new(a1);
        a_demux.start(
            answers,
            serve(a2, Arc::new(|_, _, _| Box::pin(async { Ok(vec![]) }))),
        );
        let handler: Handler = Arc::new(|service, method, payload| {
            Box::pin(async move {
                match method.as_str() {
                    "Echo" => {
                        let mut r: RpcStatus = decode(payload)?;
                        r.message = format!("{service}/{}", r.message);
                        Ok(r.encode_to_vec())
                    }
                    "Slow" => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        Ok(Vec::new())
                    }
                    _ => Err((tonic::Code::Unimplemented, format!("{method} unknown"))),
                }
            })
        });
        let (b_client, b_answers) = Client::new(b2);
        b_demux.start(serve(b1, handler), b_answers);
        let t = Duration::from_secs(5);
        let req = RpcStatus {
            code: 1,
            message: "hi".into(),
        };
        let got: RpcStatus = client.call("svc", "Echo", &req, t).await.unwrap();
        assert_eq!(got.message, "svc/hi");
        // Concurrent calls use distinct odd stream ids and each gets its own answer.
        let (x, y) = tokio::join!(
            client.call::<_, RpcStatus>("a", "Echo", &req, t),
            client.call::<_, RpcStatus>("b", "Echo", &req, t)
        );
        assert_eq!(
            (x.unwrap().message, y.unwrap().message),
            ("a/hi".into(), "b/hi".into())
        );
        match client.call::<_, RpcStatus>("s", "Nope", &req, t).await {
            Err(CallError::Status { code, message }) => {
                assert_eq!(code, tonic::Code::Unimplemented as i32);
                assert_eq!(message, "Nope unknown");
            }
            other => panic!("{other:?}"),
        }
        let short = Duration::from_millis(50);
        assert!(matches!(
            client.call::<_, RpcStatus>("s", "Slow", &req, short).await,
            Err(CallError::Timeout(_))
        ));
        // The peer closing the trunk ends the connection: pending and later calls fail.
        b_client.close().await;
        client.closed().await;
        assert!(matches!(
            client.call::<_, RpcStatus>("s", "Echo", &req, t).await,
            Err(CallError::Closed)
        ));
    }
}
