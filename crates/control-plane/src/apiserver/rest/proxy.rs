//! pods/log, exec, attach, portforward and nodes/proxy: forwarded to the node's kubelet
//! over HTTPS (the cluster CA verifies the kubelet; the API server presents its
//! kubelet-client certificate). Upgrade requests (SPDY or WebSocket streams) are tunnelled
//! once the kubelet answers 101 ([`super::tunnel`]).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use nodus_k8s::status;
use rustls::pki_types::ServerName;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, Req};

/// The kubelet endpoint of a node: its InternalIP and daemonEndpoints port (10250).
pub fn kubelet_address(node: &Value) -> Option<(String, u16)> {
    let addrs = node.pointer("/status/addresses")?.as_array()?;
    let ip = addrs
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .or_else(|| addrs.first())?
        .get("address")?
        .as_str()?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .unwrap_or(10250);
    Some((ip.to_string(), port))
}

fn failure(code: u16, reason: &str, msg: String) -> ApiError {
    ApiError(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": msg, "reason": reason, "code": code}),
    )
}

fn bad(msg: String) -> ApiError {
    ApiError(status::bad_request(&msg))
}

fn container_names(pod: &Value) -> Vec<String> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name")?.as_str().map(str::to_string))
        .collect()
}

/// The container a log/exec/attach request means: the named one, or the only one.
fn pick_container(req: &Req, pod_name: &str, pod: &Value) -> ApiResult<String> {
    if let Some(c) = req.q("container") {
        let all: Vec<String> = ["containers", "initContainers", "ephemeralContainers"]
            .iter()
            .flat_map(|k| pod["spec"][*k].as_array().into_iter().flatten())
            .filter_map(|c| c.get("name")?.as_str().map(str::to_string))
            .collect();
        if !all.iter().any(|n| n == c) {
            return Err(bad(format!(
                "container {c} is not valid for pod {pod_name}"
            )));
        }
        return Ok(c.to_string());
    }
    let names = container_names(pod);
    match names.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(bad(format!("pod {pod_name} has no containers"))),
        many => Err(bad(format!(
            "a container name must be specified for pod {pod_name}, choose one of: [{}]",
            many.join(" ")
        ))),
    }
}

fn encode_query(pairs: &[(&str, &str)]) -> String {
    let enc = nodus_serving::query::percent_encode;
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The kubelet path (with query) a subresource request maps to.
fn kubelet_path(req: &Req, sub: &str, pod: Option<&Value>) -> ApiResult<String> {
    let t = &req.target;
    let name = t.name.clone().unwrap_or_default();
    let ns = t.namespace.clone().unwrap_or_default();
    let passthrough = |keys: &[&str]| -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for (k, v) in &req.query {
            if keys.contains(&k.as_str()) {
                out.push((k.clone(), v.clone()));
            }
        }
        out.sort();
        out
    };
    let with_query = |path: String, q: Vec<(String, String)>| {
        if q.is_empty() {
            path
        } else {
            let pairs: Vec<(&str, &str)> =
                q.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            format!("{path}?{}", encode_query(&pairs))
        }
    };
    match sub {
        "log" => {
            let pod = pod.ok_or_else(|| bad("no pod".into()))?;
            let c = pick_container(req, &name, pod)?;
            let q = passthrough(&[
                "follow",
                "previous",
                "sinceSeconds",
                "sinceTime",
                "timestamps",
                "tailLines",
                "limitBytes",
                "insecureSkipTLSVerifyBackend",
            ]);
            Ok(with_query(format!("/containerLogs/{ns}/{name}/{c}"), q))
        }
        "exec" | "attach" => {
            let pod = pod.ok_or_else(|| bad("no pod".into()))?;
            let c = pick_container(req, &name, pod)?;
            // `command` repeats, so it is rebuilt from the raw query.
            let mut q: Vec<(String, String)> = passthrough(&["stdin", "stdout", "stderr", "tty"]);
            for cmd in req.query_all("command") {
                q.push(("command".into(), cmd));
            }
            Ok(with_query(format!("/{sub}/{ns}/{name}/{c}"), q))
        }
        "portforward" => {
            let q = passthrough(&["ports"]);
            Ok(with_query(format!("/portForward/{ns}/{name}"), q))
        }
        "proxy" => {
            let rest = t.rest.join("/");
            let raw = req.raw_query.clone().unwrap_or_default();
            let path = format!("/{rest}");
            Ok(if raw.is_empty() {
                path
            } else {
                format!("{path}?{raw}")
            })
        }
        _ => Err(bad(format!("unsupported subresource {sub}"))),
    }
}

const FORWARDED: &[&str] = &[
    "connection",
    "upgrade",
    "content-type",
    "accept",
    "x-stream-protocol-version",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
];

pub async fn handle(mut req: Req, method: &Method, sub: &str) -> ApiResult<Response> {
    let t = req.target.clone();
    let name = t.name.clone().unwrap_or_default();
    let obj = req
        .st
        .store
        .get(&t.key_for(&name))
        .map_err(|e| super::store_error(&t, &name, e))?
        .ok_or_else(|| ApiError(status::not_found(t.info.group, t.info.plural, &name)))?;
    let (node_name, pod) = match t.info.kind {
        "Node" => (name.clone(), None),
        "Pod" => (
            obj.object
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            Some(obj.object.clone()),
        ),
        _ => {
            return Err(failure(
                503,
                "ServiceUnavailable",
                format!("{sub} of {} is not supported", t.info.plural),
            ));
        }
    };
    if node_name.is_empty() {
        return Err(bad(format!("pod {name} does not have a host assigned")));
    }
    let path = kubelet_path(&req, sub, pod.as_deref())?;
    let node = req
        .st
        .store
        .get(&format!("/core/nodes/{node_name}"))
        .ok()
        .flatten();
    let Some((ip, port)) = node.as_ref().and_then(|n| kubelet_address(&n.object)) else {
        return Err(failure(
            503,
            "ServiceUnavailable",
            format!("no preferred addresses found; known addresses: [] for node {node_name:?}"),
        ));
    };
    let Some(mut tls) = req.st.kubelet_tls.clone() else {
        return Err(failure(
            503,
            "ServiceUnavailable",
            "the API server has no kubelet client credentials".into(),
        ));
    };
    // `kubectl logs --insecure-skip-tls-verify-backend`: reach a kubelet whose serving
    // certificate the cluster CA did not sign (upstream honours it for logs only).
    if sub == "log" && req.q_bool("insecureSkipTLSVerifyBackend") {
        let mut cfg = (*tls).clone();
        cfg.dangerous()
            .set_certificate_verifier(Arc::new(SkipBackendVerify::new()));
        tls = Arc::new(cfg);
    }
    let host = if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    };
    let unreachable = |e: &dyn std::fmt::Display| {
        failure(
            502,
            "",
            format!(
                "error dialing backend: cannot reach the kubelet of node {node_name:?} at https://{host}: {e}"
            ),
        )
    };
    let sender = connect(&ip, port, tls).await.map_err(|e| unreachable(&e))?;
    let mut sender = sender;
    let mut out = http::Request::builder().method(method.clone()).uri(&path);
    for (k, v) in req.headers.iter() {
        if FORWARDED.contains(&k.as_str()) {
            out = out.header(k, v);
        }
    }
    out = out.header(header::HOST, host.as_str());
    let is_upgrade = req.headers.get(header::UPGRADE).is_some();
    let body = if is_upgrade {
        bytes::Bytes::new()
    } else {
        req.body.clone()
    };
    let out = out
        .body(Body::from(body))
        .map_err(|e| failure(500, "InternalError", e.to_string()))?;
    let resp = sender
        .send_request(out)
        .await
        .map_err(|e| unreachable(&e))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_up) = req.upgrade.take() else {
            return Err(bad(
                "the request asked for an upgrade the connection cannot make".into(),
            ));
        };
        let mut reply = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
        for (k, v) in resp.headers() {
            reply = reply.header(k, v);
        }
        let websocket = resp
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        let kubelet_up = hyper::upgrade::on(resp);
        tokio::spawn(async move {
            let (Ok(c), Ok(k)) = (client_up.await, kubelet_up.await) else {
                return;
            };
            super::tunnel::run(TokioIo::new(c), TokioIo::new(k), websocket).await;
        });
        return reply
            .body(Body::empty())
            .map_err(|e| failure(500, "InternalError", e.to_string()));
    }
    let (parts, incoming) = resp.into_parts();
    // As upstream's pods/log response checker: a refusal from the kubelet becomes a Status,
    // so clients print "Error from server (BadRequest): <the kubelet's words>".
    if sub == "log" && !(200..=206).contains(&parts.status.as_u16()) {
        let text = axum::body::to_bytes(Body::new(incoming), 64 * 1024)
            .await
            .map(|b| String::from_utf8_lossy(&b).trim().to_string())
            .unwrap_or_default();
        return Err(match parts.status.as_u16() {
            400 => bad(text),
            500 => failure(
                500,
                "InternalError",
                format!("Internal error occurred: {text}"),
            ),
            404 => failure(404, "NotFound", text),
            code => failure(code, "", text),
        });
    }
    let mut reply = Response::new(Body::new(incoming));
    *reply.status_mut() = parts.status;
    let mut headers = HeaderMap::new();
    for (k, v) in parts.headers.iter() {
        if k != header::CONNECTION && k != header::TRANSFER_ENCODING {
            headers.insert(k.clone(), v.clone());
        }
    }
    if !headers.contains_key(header::CONTENT_TYPE) {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    }
    *reply.headers_mut() = headers;
    Ok(reply)
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("invalid address {0}")]
    Address(String),
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

pub(crate) async fn connect(
    ip: &str,
    port: u16,
    tls: Arc<rustls::ClientConfig>,
) -> Result<hyper::client::conn::http1::SendRequest<Body>, DialError> {
    let addr: std::net::IpAddr = ip.parse().map_err(|_| DialError::Address(ip.to_string()))?;
    let tcp = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio::net::TcpStream::connect((addr, port)),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::IpAddress(addr.into()), tcp)
        .await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

/// Accepts any kubelet serving certificate while still checking the handshake's signatures
/// (the peer holds the key of the certificate it showed).
#[derive(Debug)]
struct SkipBackendVerify(Arc<rustls::crypto::CryptoProvider>);

impl SkipBackendVerify {
    fn new() -> Self {
        SkipBackendVerify(Arc::new(rustls::crypto::ring::default_provider()))
    }
}

impl rustls::client::danger::ServerCertVerifier for SkipBackendVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
