//! `/exec`, `/attach`, `/portForward` and `/run`: the kubelet asks the CRI for a streaming
//! URL (Exec, Attach, PortForward) and proxies the client's request to it, upgrade and all,
//! as upstream's kubelet does since it stopped redirecting: SPDY and WebSocket sessions
//! pass through byte for byte after the runtime's streaming server answers 101.
//! `/run` is the one-shot form: ExecSync, answering the combined output.

use super::logs::find_pod;
use super::{ServerState, text};
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cri::runtime::v1 as pb;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;

use nodus_serving::query::query_all;

fn flag(raw: Option<&str>, key: &str) -> bool {
    nodus_serving::query::bool_value(query_all(raw, key).last().map(String::as_str))
}

/// Upstream's remotecommand options from the query.
#[derive(Debug, PartialEq, Eq)]
pub struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

pub fn stream_options(raw: Option<&str>) -> Result<StreamOptions, String> {
    let o = StreamOptions {
        stdin: flag(raw, "input") || flag(raw, "stdin"),
        stdout: flag(raw, "output") || flag(raw, "stdout"),
        stderr: flag(raw, "error") || flag(raw, "stderr"),
        tty: flag(raw, "tty"),
    };
    if !(o.stdin || o.stdout || o.stderr) {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    Ok(o)
}

/// An HTTP refusal: status and text (small, unlike a whole Response).
type Refused = (StatusCode, String);

fn refused((code, msg): Refused) -> Response {
    text(code, msg)
}

fn pod_or_404(s: &ServerState, ns: &str, name: &str, uid: Option<&str>) -> Result<Pod, Refused> {
    find_pod(s, ns, name)
        .filter(|p| uid.is_none_or(|u| p.metadata.uid.as_deref() == Some(u)))
        .ok_or_else(|| (StatusCode::NOT_FOUND, "pod does not exist".into()))
}

/// The running container `name` of the pod, or the error upstream's findContainer gives.
async fn container_id(s: &ServerState, pod: &Pod, name: &str) -> Result<String, Refused> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let rp = crate::kuberuntime::runtime_pod::pod_status(&s.kr.rt, &uid)
        .await
        .map_err(|e| grpc_code(&e))?;
    rp.latest(name).map(|c| c.id.clone()).ok_or_else(|| {
        (
            StatusCode::NOT_FOUND,
            format!("container not found ({name:?})"),
        )
    })
}

fn sandbox_id(rp: &crate::kuberuntime::RuntimePod) -> Option<String> {
    rp.sandboxes.iter().find(|s| s.ready).map(|s| s.id.clone())
}

/// A CRI error as upstream's streaming.WriteError maps gRPC codes to HTTP.
fn grpc_error(e: &tonic::Status) -> Response {
    refused(grpc_code(e))
}

fn grpc_code(e: &tonic::Status) -> Refused {
    let code = match e.code() {
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (code, e.message().to_string())
}

/// `/exec/{ns}/{pod}/{container}` and `/exec/{ns}/{pod}/{uid}/{container}`.
pub async fn exec(
    State(s): State<ServerState>,
    Path(rest): Path<String>,
    req: Request,
) -> Response {
    remote_command(s, segments(&rest), req, false).await
}

/// `/attach/{ns}/{pod}/{container}` and `/attach/{ns}/{pod}/{uid}/{container}`.
pub async fn attach(
    State(s): State<ServerState>,
    Path(rest): Path<String>,
    req: Request,
) -> Response {
    remote_command(s, segments(&rest), req, true).await
}

/// The `/`-separated parts of a wildcard path capture.
fn segments(rest: &str) -> Vec<String> {
    rest.split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn split_pod_path(segs: &[String]) -> Option<(&str, &str, Option<&str>, &str)> {
    match segs {
        [ns, pod, c] => Some((ns, pod, None, c)),
        [ns, pod, uid, c] => Some((ns, pod, Some(uid.as_str()), c)),
        _ => None,
    }
}

async fn remote_command(s: ServerState, segs: Vec<String>, req: Request, attach: bool) -> Response {
    let Some((ns, name, uid, container)) = split_pod_path(&segs) else {
        return text(StatusCode::NOT_FOUND, "404 page not found".into());
    };
    let raw = req.uri().query().map(str::to_string);
    let opts = match stream_options(raw.as_deref()) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let pod = match pod_or_404(&s, ns, name, uid) {
        Ok(p) => p,
        Err(r) => return refused(r),
    };
    let id = match container_id(&s, &pod, container).await {
        Ok(id) => id,
        Err(r) => return refused(r),
    };
    let mut client = s.kr.rt.runtime.clone();
    let url = if attach {
        client
            .attach(pb::AttachRequest {
                container_id: id,
                stdin: opts.stdin,
                tty: opts.tty,
                stdout: opts.stdout,
                stderr: opts.stderr,
            })
            .await
            .map(|r| r.into_inner().url)
    } else {
        let cmd = query_all(raw.as_deref(), "command");
        if cmd.is_empty() {
            return text(StatusCode::BAD_REQUEST, "you must specify a command".into());
        }
        client
            .exec(pb::ExecRequest {
                container_id: id,
                cmd,
                tty: opts.tty,
                stdin: opts.stdin,
                stdout: opts.stdout,
                stderr: opts.stderr,
            })
            .await
            .map(|r| r.into_inner().url)
    };
    match url {
        Ok(u) => proxy_stream(&u, req).await,
        Err(e) => grpc_error(&e),
    }
}

/// `/portForward/{ns}/{pod}` and `/portForward/{ns}/{pod}/{uid}`.
pub async fn port_forward(
    State(s): State<ServerState>,
    Path(rest): Path<String>,
    req: Request,
) -> Response {
    let segs = segments(&rest);
    let (ns, name, uid) = match segs.as_slice() {
        [ns, pod] => (ns.as_str(), pod.as_str(), None),
        [ns, pod, uid] => (ns.as_str(), pod.as_str(), Some(uid.as_str())),
        _ => return text(StatusCode::NOT_FOUND, "404 page not found".into()),
    };
    let pod = match pod_or_404(&s, ns, name, None) {
        Ok(p) => p,
        Err(r) => return refused(r),
    };
    if uid.is_some_and(|u| pod.metadata.uid.as_deref() != Some(u)) {
        return text(StatusCode::NOT_FOUND, "pod not found".into());
    }
    let puid = pod.metadata.uid.clone().unwrap_or_default();
    let rp = match crate::kuberuntime::runtime_pod::pod_status(&s.kr.rt, &puid).await {
        Ok(rp) => rp,
        Err(e) => return grpc_error(&e),
    };
    let Some(sandbox) = sandbox_id(&rp) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {name:?} has no running sandbox"),
        );
    };
    // WebSocket clients name the ports in the query; SPDY clients name them per stream.
    let mut ports = Vec::new();
    for p in query_all(req.uri().query(), "ports")
        .iter()
        .flat_map(|v| v.split(',').map(str::to_string).collect::<Vec<_>>())
    {
        match p.trim().parse::<i32>() {
            Ok(n) if (1..=65535).contains(&n) => ports.push(n),
            _ => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("invalid port {p:?}: must be 1-65535"),
                );
            }
        }
    }
    match s
        .kr
        .rt
        .runtime
        .clone()
        .port_forward(pb::PortForwardRequest {
            pod_sandbox_id: sandbox,
            port: ports,
        })
        .await
    {
        Ok(r) => proxy_stream(&r.into_inner().url, req).await,
        Err(e) => grpc_error(&e),
    }
}

/// POST `/run/{ns}/{pod}/{container}` (and with the uid): runs `cmd` (split on spaces) and
/// answers its output.
pub async fn run(State(s): State<ServerState>, Path(rest): Path<String>, req: Request) -> Response {
    let segs = segments(&rest);
    let Some((ns, name, uid, container)) = split_pod_path(&segs) else {
        return text(StatusCode::NOT_FOUND, "404 page not found".into());
    };
    let (ns, name, container) = (ns.to_string(), name.to_string(), container.to_string());
    let uid = uid.map(str::to_string);
    let query = req.uri().query().map(str::to_string);
    let body = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let form = String::from_utf8_lossy(&body).into_owned();
    let cmd_line = query_all(query.as_deref(), "cmd")
        .pop()
        .or_else(|| query_all(Some(&form), "cmd").pop())
        .unwrap_or_default();
    // Split on single spaces, as upstream's /run does (legacy: no quoting).
    let cmd: Vec<String> = cmd_line.split(' ').map(str::to_string).collect();
    let pod = match pod_or_404(&s, &ns, &name, uid.as_deref()) {
        Ok(p) => p,
        Err(r) => return refused(r),
    };
    let id = match container_id(&s, &pod, &container).await {
        Ok(id) => id,
        Err(r) => return refused(r),
    };
    match s
        .kr
        .rt
        .runtime
        .clone()
        .exec_sync(pb::ExecSyncRequest {
            container_id: id,
            cmd,
            timeout: 0,
        })
        .await
    {
        Ok(r) => {
            let r = r.into_inner();
            let mut out = r.stdout;
            out.extend_from_slice(&r.stderr);
            // upstream writes the output with go-restful's JSON content type.
            (
                [(header::CONTENT_TYPE, "application/json")],
                Body::from(out),
            )
                .into_response()
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.message().to_string()),
    }
}

/// Headers that describe the stream and go to the runtime; credentials meant for the
/// kubelet do not.
fn forwarded(h: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (k, v) in h {
        if k == header::AUTHORIZATION || k == header::HOST || k == header::CONTENT_LENGTH {
            continue;
        }
        out.append(k.clone(), v.clone());
    }
    out
}

/// Sends the request to the runtime's streaming URL and splices the upgraded connections
/// together when it answers 101 (upstream's UpgradeAwareHandler).
pub async fn proxy_stream(url: &str, mut req: Request) -> Response {
    let fail = |e: &dyn std::fmt::Display| {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error proxying to the container runtime's streaming server {url}: {e}"),
        )
    };
    let Ok(uri) = url.parse::<http::Uri>() else {
        return fail(&"invalid URL");
    };
    let (Some(host), port) = (uri.host(), uri.port_u16().unwrap_or(80)) else {
        return fail(&"URL without a host");
    };
    if uri.scheme_str() != Some("http") {
        return fail(&"only http:// streaming URLs are supported");
    }
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let dial = tokio::net::TcpStream::connect((host.as_str(), port));
    let tcp = match tokio::time::timeout(std::time::Duration::from_secs(10), dial).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return fail(&e),
        Err(_) => return fail(&"connect timed out"),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(x) => x,
        Err(e) => return fail(&e),
    };
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let client_upgrade = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>();
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut out = http::Request::builder()
        .method(req.method().clone())
        .uri(path);
    for (k, v) in forwarded(req.headers()).iter() {
        out = out.header(k, v);
    }
    out = out.header(
        header::HOST,
        format!("{}:{port}", uri.host().unwrap_or_default()),
    );
    let is_upgrade = req.headers().contains_key(header::UPGRADE);
    let body = if is_upgrade {
        Body::empty()
    } else {
        req.into_body()
    };
    let Ok(out) = out.body(body) else {
        return fail(&"cannot build the request");
    };
    let resp = match sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_up) = client_upgrade else {
            return text(
                StatusCode::BAD_REQUEST,
                "the request asked for an upgrade the connection cannot make".into(),
            );
        };
        let mut reply = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
        for (k, v) in resp.headers() {
            reply = reply.header(k, v);
        }
        let runtime_up = hyper::upgrade::on(resp);
        tokio::spawn(async move {
            let (Ok(c), Ok(r)) = (client_up.await, runtime_up.await) else {
                return;
            };
            let mut c = TokioIo::new(c);
            let mut r = TokioIo::new(r);
            let _ = tokio::io::copy_bidirectional(&mut c, &mut r).await;
        });
        return reply.body(Body::empty()).unwrap_or_else(|e| fail(&e));
    }
    let (parts, incoming) = resp.into_parts();
    let mut reply = Response::new(Body::new(incoming));
    *reply.status_mut() = parts.status;
    *reply.headers_mut() = parts.headers;
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_command_and_stream_flags_parse() {
        let q = Some("command=sh&command=-c&command=echo%20hi+there&stdout=1&tty=true");
        assert_eq!(query_all(q, "command"), vec!["sh", "-c", "echo hi there"]);
        let o = stream_options(q).unwrap();
        assert!(o.stdout && o.tty && !o.stdin && !o.stderr);
        assert!(stream_options(Some("command=ls")).is_err());
        assert_eq!(query_all(Some("a=%zz"), "a"), vec!["%zz"]);
    }
}
