//! An HTTP proxy in front of a registry that injects faults into selected responses, for
//! pull failure tests ("wrong digest", "truncated layer", "registry down", "stalled").
//!
//! Point the client at [`FaultyProxy::host`] instead of the registry's host. Requests are
//! forwarded unchanged (including `Host`, so upload `Location`s point back at the proxy);
//! responses to requests matching the [`FaultRule`] are damaged as its [`Fault`] says.
//!
//! ```no_run
//! # async fn t() -> anyhow::Result<()> {
//! use testkit::{Fault, FaultyProxy, Registry};
//! let registry = Registry::start()?;
//! let proxy = FaultyProxy::start(registry.addr(), Fault::FlipByte { offset: 100 })?;
//! // pull `{proxy.host()}/repo:tag`: every blob body arrives with one byte flipped.
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::http_server::{BackgroundServer, Body, BoxError, Handler, full, respond};

/// What happens to a matching response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward unchanged.
    PassThrough,
    /// Send the headers (with the full `Content-Length`) and the first `after` body bytes,
    /// then abort the connection: the client sees a truncated body / unexpected EOF.
    TruncateBody { after: usize },
    /// Send only the first `len` bytes with a matching `Content-Length`: a well-formed but
    /// short body, caught only by digest or size verification.
    ShortBody { len: usize },
    /// XOR the body byte at `offset` (modulo the length) with 0xff: same size, wrong digest.
    FlipByte { offset: usize },
    /// Answer with this status and a distribution-style JSON error, without asking upstream.
    Status(u16),
    /// Accept the request and never answer.
    Hang,
    /// Send the headers and the first `after` body bytes, then stall forever.
    StallBody { after: usize },
}

/// Which requests a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultTarget {
    /// `GET`/`HEAD /v2/<name>/blobs/<digest>` (not uploads).
    Blobs,
    /// `GET`/`HEAD /v2/<name>/manifests/<reference>`.
    Manifests,
    /// Every request.
    All,
}

/// A fault, its target, and how many matching requests to damage.
///
/// Body faults apply to `GET` only; `Status` and `Hang` also to `HEAD`. Only successful
/// upstream responses (2xx) get body faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultRule {
    pub fault: Fault,
    pub target: FaultTarget,
    /// Damage only the first `n` matching requests (then pass through); `None`: all.
    pub times: Option<usize>,
}

impl FaultRule {
    /// `fault` on every blob request.
    pub fn blobs(fault: Fault) -> FaultRule {
        FaultRule {
            fault,
            target: FaultTarget::Blobs,
            times: None,
        }
    }

    /// `fault` on every manifest request.
    pub fn manifests(fault: Fault) -> FaultRule {
        FaultRule {
            fault,
            target: FaultTarget::Manifests,
            times: None,
        }
    }

    /// Limits the rule to the first `n` matching requests.
    pub fn times(mut self, n: usize) -> FaultRule {
        self.times = Some(n);
        self
    }
}

impl From<Fault> for FaultRule {
    fn from(fault: Fault) -> FaultRule {
        FaultRule::blobs(fault)
    }
}

struct State {
    upstream: SocketAddr,
    rule: Mutex<FaultRule>,
    injected: AtomicUsize,
    requests: AtomicUsize,
    client: Client<HttpConnector, Incoming>,
}

/// The proxy. Stopped (all connections dropped) on drop.
pub struct FaultyProxy {
    server: BackgroundServer,
    state: Arc<State>,
}

impl FaultyProxy {
    /// Starts a proxy on `127.0.0.1:<free port>` forwarding to `upstream`. A bare [`Fault`]
    /// applies to every blob request.
    pub fn start(upstream: SocketAddr, rule: impl Into<FaultRule>) -> Result<FaultyProxy> {
        let state = Arc::new(State {
            upstream,
            rule: Mutex::new(rule.into()),
            injected: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            client: Client::builder(TokioExecutor::new()).build_http(),
        });
        let s = state.clone();
        let handler: Handler = Arc::new(move |req| {
            let s = s.clone();
            Box::pin(async move { handle(&s, req).await })
        });
        let server = BackgroundServer::start("faulty-proxy", handler)?;
        Ok(FaultyProxy { server, state })
    }

    /// Replaces the rule (and resets the injected count).
    pub fn set_rule(&self, rule: impl Into<FaultRule>) {
        *self.state.rule.lock().unwrap() = rule.into();
        self.state.injected.store(0, Ordering::SeqCst);
    }

    /// How many responses were damaged since start or the last [`FaultyProxy::set_rule`].
    pub fn injected(&self) -> usize {
        self.state.injected.load(Ordering::SeqCst)
    }

    /// How many requests the proxy received.
    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `127.0.0.1:PORT` of the proxy: use it as the registry host.
    pub fn host(&self) -> String {
        self.server.addr().to_string()
    }
}

fn matches(target: FaultTarget, path: &str) -> bool {
    let blob =
        path.starts_with("/v2/") && path.contains("/blobs/") && !path.contains("/blobs/uploads");
    let manifest = path.starts_with("/v2/") && path.contains("/manifests/");
    match target {
        FaultTarget::Blobs => blob,
        FaultTarget::Manifests => manifest,
        FaultTarget::All => true,
    }
}

fn stream_body(
    frames: impl futures::Stream<Item = Result<Frame<Bytes>, BoxError>> + Send + 'static,
) -> Body {
    BodyExt::boxed_unsync(StreamBody::new(frames))
}

async fn handle(state: &State, mut req: Request<Incoming>) -> Response<Body> {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let rule = *state.rule.lock().unwrap();
    let is_get = req.method() == Method::GET;
    let is_head = req.method() == Method::HEAD;
    let body_fault = !matches!(
        rule.fault,
        Fault::PassThrough | Fault::Status(_) | Fault::Hang
    );
    let applies = matches(rule.target, req.uri().path())
        && if body_fault {
            is_get
        } else {
            is_get || is_head
        }
        && !matches!(rule.fault, Fault::PassThrough);
    // Claim one of the `times` slots atomically.
    let inject = applies
        && match rule.times {
            None => {
                state.injected.fetch_add(1, Ordering::SeqCst);
                true
            }
            Some(n) => state
                .injected
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| {
                    (k < n).then_some(k + 1)
                })
                .is_ok(),
        };
    if inject {
        match rule.fault {
            Fault::Status(code) => {
                return respond(
                    code,
                    "application/json",
                    format!(
                        r#"{{"errors":[{{"code":"UNKNOWN","message":"testkit injected status {code}"}}]}}"#
                    ),
                );
            }
            Fault::Hang => std::future::pending::<()>().await,
            _ => {}
        }
    }

    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    *req.uri_mut() = format!("http://{}{}", state.upstream, path_and_query)
        .parse()
        .expect("upstream URI");
    for h in ["connection", "keep-alive", "proxy-connection"] {
        req.headers_mut().remove(h);
    }
    let upstream = match state.client.request(req).await {
        Ok(r) => r,
        Err(e) => {
            return respond(
                502,
                "text/plain",
                format!("testkit proxy: upstream error: {e}"),
            );
        }
    };
    let (mut parts, body) = upstream.into_parts();
    if !inject || !parts.status.is_success() {
        if inject {
            // Not a body we may damage: give the slot back.
            state.injected.fetch_sub(1, Ordering::SeqCst);
        }
        return Response::from_parts(
            parts,
            body.map_err(|e| Box::new(e) as BoxError).boxed_unsync(),
        );
    }
    let data = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return respond(
                502,
                "text/plain",
                format!("testkit proxy: upstream body: {e}"),
            );
        }
    };
    let head = |n: usize| data.slice(..n.min(data.len()));
    let body = match rule.fault {
        Fault::TruncateBody { after } => {
            use futures::StreamExt;
            // Pause before failing so hyper flushes headers and the partial body first.
            let fail = futures::stream::once(async {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                Err(BoxError::from("testkit: injected truncation"))
            });
            stream_body(futures::stream::iter([Ok(Frame::data(head(after)))]).chain(fail))
        }
        Fault::ShortBody { len } => {
            let short = head(len);
            parts.headers.insert("content-length", short.len().into());
            full(short)
        }
        Fault::FlipByte { offset } => {
            let mut v = data.to_vec();
            if !v.is_empty() {
                let i = offset % v.len();
                v[i] ^= 0xff;
            }
            full(v)
        }
        Fault::StallBody { after } => {
            use futures::StreamExt;
            stream_body(
                futures::stream::iter([Ok(Frame::data(head(after)))])
                    .chain(futures::stream::pending()),
            )
        }
        Fault::PassThrough | Fault::Status(_) | Fault::Hang => full(data),
    };
    Response::from_parts(parts, body)
}
