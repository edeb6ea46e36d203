//! The HTTP side: routing `/{exec,attach,portforward}/{token}`, protocol negotiation and the
//! upgrade to SPDY or WebSocket, with the kubelet's status codes and messages for requests
//! that cannot be served.

use super::remotecommand::{self, Want};
use super::{Request, Shared, spdy};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::Arc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;

const PROTOCOL_HEADER: &str = "x-stream-protocol-version";
const ACCEPTED_PROTOCOLS_HEADER: &str = "x-accepted-stream-protocol-versions";

/// Subprotocols for remotecommand over WebSocket ("" = none requested: binary channels).
const WS_REMOTECOMMAND_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
    "",
];
const WS_PORTFORWARD_PROTOCOLS: &[&str] = &["v4.channel.k8s.io", "v4.base64.channel.k8s.io", ""];

type Body = Full<Bytes>;

pub(super) async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "streaming server accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(handle(&shared, req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(sock), svc)
                .with_upgrades()
                .await
            {
                tracing::debug!(peer = %peer, error = %e, "streaming connection ended with an error");
            }
        });
    }
}

/// A plain-text response, as Go's `http.Error` writes it.
fn text(status: StatusCode, msg: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{msg}\n"))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn not_found() -> Response<Body> {
    text(StatusCode::NOT_FOUND, "404 page not found")
}

/// Every value of a header, comma-separated lists split, in order.
fn values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

fn header_has(headers: &HeaderMap, name: &str, token: &str) -> bool {
    values(headers, name)
        .iter()
        .any(|v| v.eq_ignore_ascii_case(token))
}

fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
        && header_has(headers, "connection", "upgrade")
}

async fn handle(shared: &Shared, mut req: hyper::Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let (kind, token) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if !matches!(kind, "exec" | "attach" | "portforward") || token.is_empty() || token.contains('/')
    {
        return not_found();
    }
    if req.method() != Method::GET && req.method() != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "405: Method Not Allowed");
    }
    // The token is used up by this attempt, whatever happens next.
    let Some(cached) = shared.cache.consume(token) else {
        return not_found();
    };
    match (kind, cached) {
        ("exec", Request::Exec(r)) => {
            let want = Want {
                stdin: r.stdin,
                stdout: r.stdout,
                stderr: r.stderr,
                tty: r.tty,
            };
            remote_command(&mut req, want, move |mut s| async move {
                let outcome = super::exec::run(&r.target, &r.cmd, r.tty, &mut s).await;
                s.finish(outcome, "executing command in container").await;
            })
        }
        ("attach", Request::Attach(r)) => {
            let want = Want {
                stdin: r.stdin,
                stdout: r.stdout,
                stderr: r.stderr,
                tty: r.tty,
            };
            remote_command(&mut req, want, move |mut s| async move {
                let outcome = super::attach::run(&r, &mut s).await;
                s.finish(outcome, "attaching to container").await;
            })
        }
        ("portforward", Request::PortForward(r)) => port_forward(&mut req, r),
        _ => not_found(),
    }
}

/// The WebSocket handshake answer for the first client subprotocol we allow, or 403.
fn ws_accept(
    req: &hyper::Request<Incoming>,
    allowed: &[&str],
) -> Result<(Response<Body>, String), Box<Response<Body>>> {
    let h = req.headers();
    let Some(key) = h.get("sec-websocket-key") else {
        return Err(Box::new(text(
            StatusCode::BAD_REQUEST,
            "missing Sec-WebSocket-Key header",
        )));
    };
    let mut offered = values(h, "sec-websocket-protocol");
    if offered.is_empty() {
        offered.push(String::new());
    }
    let Some(chosen) = offered
        .iter()
        .find(|p| allowed.contains(&p.as_str()))
        .cloned()
    else {
        return Err(Box::new(text(
            StatusCode::FORBIDDEN,
            &format!(
                "requested protocol(s) are not supported: {:?}; supports {:?}",
                offered, allowed
            ),
        )));
    };
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let hd = r.headers_mut();
    hd.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    hd.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(
        &tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()),
    ) {
        hd.insert("sec-websocket-accept", v);
    }
    if !chosen.is_empty()
        && let Ok(v) = HeaderValue::from_str(&chosen)
    {
        hd.insert("sec-websocket-protocol", v);
    }
    Ok((r, chosen))
}

/// The SPDY handshake (httpstream.Handshake + the upgrade check): the negotiated protocol
/// and the 101 answer, or the error response.
fn spdy_accept(
    req: &hyper::Request<Incoming>,
    supported: &[&'static str],
) -> Result<(Response<Body>, String), Box<Response<Body>>> {
    let h = req.headers();
    let offered = values(h, PROTOCOL_HEADER);
    if offered.is_empty() {
        return Err(Box::new(text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: X-Stream-Protocol-Version is required",
        )));
    }
    let Some(chosen) = offered
        .iter()
        .find(|p| supported.contains(&p.as_str()))
        .cloned()
    else {
        let mut r = text(
            StatusCode::FORBIDDEN,
            &format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {supported:?}"
            ),
        );
        for p in supported {
            r.headers_mut()
                .append(ACCEPTED_PROTOCOLS_HEADER, HeaderValue::from_static(p));
        }
        return Err(Box::new(r));
    };
    let upgrade_ok = header_has(h, "connection", "upgrade")
        && values(h, "upgrade")
            .iter()
            .any(|v| v.eq_ignore_ascii_case(spdy::UPGRADE_TOKEN));
    if !upgrade_ok {
        return Err(Box::new(text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing upgrade headers in request",
        )));
    }
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let hd = r.headers_mut();
    hd.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    hd.insert(
        header::UPGRADE,
        HeaderValue::from_static(spdy::UPGRADE_TOKEN),
    );
    if let Ok(v) = HeaderValue::from_str(&chosen) {
        hd.insert(PROTOCOL_HEADER, v);
    }
    Ok((r, chosen))
}

/// Upgrades to a remotecommand session and runs `body` on it in a task of its own.
fn remote_command<F, Fut>(req: &mut hyper::Request<Incoming>, want: Want, body: F) -> Response<Body>
where
    F: FnOnce(remotecommand::Session) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let upgrade = hyper::upgrade::on(&mut *req);
    if is_websocket(req.headers()) {
        let (resp, protocol) = match ws_accept(req, WS_REMOTECOMMAND_PROTOCOLS) {
            Ok(a) => a,
            Err(r) => return *r,
        };
        tokio::spawn(async move {
            let io = match upgrade.await {
                Ok(u) => TokioIo::new(u),
                Err(e) => {
                    tracing::warn!(error = %e, "websocket upgrade failed");
                    return;
                }
            };
            let socket = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
            let session = remotecommand::ws_session(socket, &protocol, want).await;
            body(session).await;
        });
        return resp;
    }
    let (resp, protocol) = match spdy_accept(req, super::SPDY_REMOTECOMMAND_PROTOCOLS) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    tokio::spawn(async move {
        let io = match upgrade.await {
            Ok(u) => TokioIo::new(u),
            Err(e) => {
                tracing::warn!(error = %e, "SPDY upgrade failed");
                return;
            }
        };
        let (conn, incoming) = spdy::start(io, spdy::Role::Server);
        match remotecommand::spdy_session(conn.clone(), incoming, &protocol, want).await {
            Ok(session) => body(session).await,
            Err(e) => {
                tracing::warn!(error = %e, "remotecommand session not established");
                conn.go_away().await;
                conn.shutdown().await;
            }
        }
    });
    resp
}

/// The WebSocket port list: `?port=` values (comma lists allowed), else the CRI request's.
fn ws_ports(req: &hyper::Request<Incoming>, fallback: &[i32]) -> Result<Vec<u16>, String> {
    let mut raw: Vec<String> = Vec::new();
    if let Some(q) = req.uri().query() {
        for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
            if k == "port" || k == "ports" {
                if v.is_empty() {
                    return Err("query parameter \"port\" cannot be empty".into());
                }
                raw.push(v.into_owned());
            }
        }
    }
    if raw.is_empty() {
        if fallback.is_empty() {
            return Err("query parameter \"port\" is required".into());
        }
        return fallback
            .iter()
            .map(|p| {
                u16::try_from(*p)
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("port \"{p}\" must be > 0"))
            })
            .collect();
    }
    let mut ports = Vec::new();
    for s in raw {
        for p in s.split(',') {
            let port: u16 = p
                .parse()
                .map_err(|e| format!("unable to parse {s:?} as a port: {e}"))?;
            if port < 1 {
                return Err(format!("port {s:?} must be > 0"));
            }
            ports.push(port);
        }
    }
    Ok(ports)
}

fn port_forward(
    req: &mut hyper::Request<Incoming>,
    r: super::PortForwardRequest,
) -> Response<Body> {
    let upgrade = hyper::upgrade::on(&mut *req);
    if is_websocket(req.headers()) {
        let ports = match ws_ports(req, &r.ports) {
            Ok(p) => p,
            Err(e) => return text(StatusCode::BAD_REQUEST, &e),
        };
        let (resp, protocol) = match ws_accept(req, WS_PORTFORWARD_PROTOCOLS) {
            Ok(a) => a,
            Err(resp) => return *resp,
        };
        tokio::spawn(async move {
            let io = match upgrade.await {
                Ok(u) => TokioIo::new(u),
                Err(e) => {
                    tracing::warn!(error = %e, "websocket upgrade failed");
                    return;
                }
            };
            let socket = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
            super::portforward::serve_ws(r, ports, socket, &protocol).await;
        });
        return resp;
    }
    let (resp, _protocol) = match spdy_accept(req, super::SPDY_PORTFORWARD_PROTOCOLS) {
        Ok(a) => a,
        Err(resp) => return *resp,
    };
    tokio::spawn(async move {
        let io = match upgrade.await {
            Ok(u) => TokioIo::new(u),
            Err(e) => {
                tracing::warn!(error = %e, "SPDY upgrade failed");
                return;
            }
        };
        let (conn, incoming) = spdy::start(io, spdy::Role::Server);
        super::portforward::serve_spdy(r, conn, incoming).await;
    });
    resp
}
