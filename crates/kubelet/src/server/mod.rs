//! The kubelet's HTTP endpoints: the healthz server (127.0.0.1:10248, `/healthz` with the
//! ping, syncloop and pleg checks), the read-only server (`--read-only-port`, upstream's
//! unauthenticated port, off by default: `/pods`, `/metrics`, `/metrics/cadvisor`,
//! `/metrics/probes`, `/metrics/resource`, `/stats/summary`, `/healthz`), and the kubelet
//! API on `--port` (10250) over TLS with authentication and authorization ([`auth`]):
//! `/healthz`, `/pods`, `/runningpods/`, `/metrics`, `/metrics/probes`, `/metrics/cadvisor`,
//! `/metrics/resource` ([`resource_metrics`]),
//! `/stats/summary` ([`stats`]), `/containerLogs` ([`logs`]), `/exec`, `/attach`,
//! `/portForward`, `/run` ([`streaming`]), `/logs/` ([`syslogs`]).

pub mod auth;
pub mod logs;
pub mod resource_metrics;
pub mod stats;
pub mod streaming;
pub mod syslogs;

use crate::metrics::Metrics;
use crate::pleg::Health;
use crate::pod::PodManager;
use crate::status::StatusManager;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone)]
pub struct ServerState {
    pub pleg: Arc<Health>,
    pub last_iteration: Arc<Mutex<Instant>>,
    pub metrics: Arc<Metrics>,
    pub pods: PodManager,
    pub status: StatusManager,
    /// The runtime side: CRI clients and the kubelet's directories.
    pub kr: Arc<crate::kuberuntime::KubeRuntime>,
    pub node_name: String,
    /// When the kubelet started (nanoseconds since the epoch), the node's `startTime`.
    pub started_ns: i64,
    pub cpu: Arc<stats::CpuSampler>,
}

/// A plain-text answer with `code`.
pub fn text(code: StatusCode, body: String) -> axum::response::Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// upstream: the syncloop check fails when no iteration ran for a while.
const SYNCLOOP_THRESHOLD: Duration = Duration::from_secs(120);

/// `Ok` or every failing check, in upstream's healthz format.
pub fn health(s: &ServerState) -> Result<(), String> {
    let mut lines = vec!["[+]ping ok".to_string(), "[+]log ok".to_string()];
    let mut ok = true;
    let since = s
        .last_iteration
        .lock()
        .map(|t| t.elapsed())
        .unwrap_or_default();
    if since > SYNCLOOP_THRESHOLD {
        ok = false;
        lines.push(format!(
            "[-]syncloop failed: syncLoop took longer than {} (last iteration {} ago)",
            crate::pleg::go_duration(SYNCLOOP_THRESHOLD),
            crate::pleg::go_duration(since)
        ));
    } else {
        lines.push("[+]syncloop ok".into());
    }
    match s.pleg.check() {
        Ok(()) => lines.push("[+]pleg ok".into()),
        Err(e) => {
            ok = false;
            lines.push(format!("[-]pleg failed: {e}"));
        }
    }
    if ok {
        Ok(())
    } else {
        lines.push("healthz check failed".into());
        Err(lines.join("\n"))
    }
}

async fn healthz(State(s): State<ServerState>) -> impl IntoResponse {
    match health(&s) {
        Ok(()) => (StatusCode::OK, "ok".to_string()),
        Err(e) => {
            tracing::warn!(reason = %e.replace('\n', "; "), "healthz check failed");
            (StatusCode::INTERNAL_SERVER_ERROR, e)
        }
    }
}

async fn metrics(State(s): State<ServerState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            nodus_serving::prometheus::CONTENT_TYPE,
        )],
        s.metrics.encode(),
    )
}

/// The pods this kubelet runs, with their statuses, as a v1 PodList (upstream's `/pods`).
async fn pods(State(s): State<ServerState>) -> impl IntoResponse {
    let items: Vec<_> = s
        .pods
        .all()
        .into_iter()
        .map(|p| {
            let mut p = k8s_openapi::api::core::v1::Pod::clone(&p);
            if let Some(st) = s.status.get(p.metadata.uid.as_deref().unwrap_or_default()) {
                p.status = Some(st);
            }
            p
        })
        .collect();
    let list = serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": items,
    });
    axum::Json(list)
}

/// Serves `app` over plain HTTP on `listener`, under the shared connection limits.
async fn serve_plain(listener: tokio::net::TcpListener, app: Router) {
    use tower::ServiceExt as _;
    let service = move |_cert: Option<rustls::pki_types::CertificateDer<'static>>| {
        let app = app.clone();
        move |req: hyper::Request<hyper::body::Incoming>| {
            app.clone().oneshot(req.map(axum::body::Body::new))
        }
    };
    let limits = nodus_serving::conn::Limits::default();
    nodus_serving::conn::serve(listener, None, limits, service, std::future::pending()).await;
}

pub async fn serve_healthz(addr: SocketAddr, state: ServerState) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(address = %addr, "healthz server listening");
    serve_plain(listener, app).await;
    Ok(())
}

pub async fn serve_read_only(addr: SocketAddr, state: ServerState) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        // upstream's default handlers; the debugging ones (logs, exec…) never go here.
        .route("/stats/summary", get(stats::summary))
        .route("/metrics/cadvisor", get(metrics_cadvisor))
        .route("/metrics/probes", get(metrics_probes))
        .route("/metrics/resource", get(resource_metrics::handler))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(address = %addr, "read-only server listening");
    serve_plain(listener, app).await;
    Ok(())
}

/// The pods the runtime has (upstream's `/runningpods/`): a PodList with each pod's
/// name, namespace and uid and its containers' names and images.
async fn running_pods(State(s): State<ServerState>) -> axum::response::Response {
    use cri::runtime::v1 as pb;
    let mut rt = s.kr.rt.runtime.clone();
    let (sandboxes, containers) = match (
        rt.list_pod_sandbox(pb::ListPodSandboxRequest { filter: None })
            .await,
        rt.list_containers(pb::ListContainersRequest { filter: None })
            .await,
    ) {
        (Ok(a), Ok(b)) => (a.into_inner().items, b.into_inner().containers),
        (Err(e), _) | (_, Err(e)) => {
            return text(StatusCode::INTERNAL_SERVER_ERROR, e.message().to_string());
        }
    };
    let uid_label = crate::kuberuntime::labels::POD_UID;
    let mut pods: std::collections::BTreeMap<String, serde_json::Value> = Default::default();
    for sb in sandboxes {
        let Some(uid) = sb.labels.get(uid_label) else {
            continue;
        };
        if sb.state != pb::PodSandboxState::SandboxReady as i32 {
            continue;
        }
        let m = sb.metadata.unwrap_or_default();
        pods.entry(uid.clone()).or_insert_with(|| {
            serde_json::json!({
                "metadata": {"name": m.name, "namespace": m.namespace, "uid": uid, "creationTimestamp": null},
                "spec": {"containers": []},
                "status": {},
            })
        });
    }
    for c in containers {
        if c.state != pb::ContainerState::ContainerRunning as i32 {
            continue;
        }
        let Some(p) = c.labels.get(uid_label).and_then(|u| pods.get_mut(u)) else {
            continue;
        };
        let name = c.metadata.map(|m| m.name).unwrap_or_default();
        let image = c.image.map(|i| i.image).unwrap_or_default();
        if let Some(list) = p["spec"]["containers"].as_array_mut() {
            list.push(serde_json::json!({"name": name, "image": image, "resources": {}}));
        }
    }
    axum::Json(serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": pods.into_values().collect::<Vec<_>>(),
    }))
    .into_response()
}

/// `/metrics/probes`: upstream's prober metrics (`prober_probe_total`,
/// `prober_probe_duration_seconds`), counted by the probe workers.
async fn metrics_probes(State(s): State<ServerState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            nodus_serving::prometheus::CONTENT_TYPE,
        )],
        s.kr.probes.metrics_text(),
    )
}

/// `/metrics/cadvisor`: per-container CPU and memory from the CRI stats, in cAdvisor's
/// metric names (a minimal subset: `container_cpu_usage_seconds_total`,
/// `container_memory_working_set_bytes`), and with KubeletPSI the pressure stall totals
/// (`container_pressure_{cpu,memory,io}_{waiting,stalled}_seconds_total`: `some` and
/// `full`).
async fn metrics_cadvisor(State(s): State<ServerState>) -> axum::response::Response {
    let summary = match stats::summary_json(&s).await {
        Ok(v) => v,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.message().to_string()),
    };
    (
        [(
            header::CONTENT_TYPE,
            nodus_serving::prometheus::CONTENT_TYPE,
        )],
        cadvisor_text(&summary),
    )
        .into_response()
}

/// The cAdvisor metrics of the Summary's containers.
fn cadvisor_text(summary: &serde_json::Value) -> String {
    use nodus_serving::prometheus;
    /// (metric, resource, PSI line, help) of the pressure counters.
    const PRESSURE: [(&str, &str, &str, &str); 6] = [
        (
            "container_pressure_cpu_waiting_seconds_total",
            "cpu",
            "some",
            "Total time duration tasks in the container have waited due to CPU congestion.",
        ),
        (
            "container_pressure_cpu_stalled_seconds_total",
            "cpu",
            "full",
            "Total time duration no tasks in the container could make progress due to CPU congestion.",
        ),
        (
            "container_pressure_memory_waiting_seconds_total",
            "memory",
            "some",
            "Total time duration tasks in the container have waited due to memory congestion.",
        ),
        (
            "container_pressure_memory_stalled_seconds_total",
            "memory",
            "full",
            "Total time duration no tasks in the container could make progress due to memory congestion.",
        ),
        (
            "container_pressure_io_waiting_seconds_total",
            "io",
            "some",
            "Total time duration tasks in the container have waited due to IO congestion.",
        ),
        (
            "container_pressure_io_stalled_seconds_total",
            "io",
            "full",
            "Total time duration no tasks in the container could make progress due to IO congestion.",
        ),
    ];
    let mut cpu = String::from(
        "# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.\n# TYPE container_cpu_usage_seconds_total counter\n",
    );
    let mut mem = String::from(
        "# HELP container_memory_working_set_bytes Current working set in bytes.\n# TYPE container_memory_working_set_bytes gauge\n",
    );
    let mut pressure = vec![String::new(); PRESSURE.len()];
    for p in summary["pods"].as_array().into_iter().flatten() {
        let ns = p["podRef"]["namespace"].as_str().unwrap_or_default();
        let pod = p["podRef"]["name"].as_str().unwrap_or_default();
        for c in p["containers"].as_array().into_iter().flatten() {
            let name = c["name"].as_str().unwrap_or_default();
            let labels = [("container", name), ("namespace", ns), ("pod", pod)];
            if let Some(ns_total) = c["cpu"]["usageCoreNanoSeconds"].as_u64() {
                prometheus::sample(
                    &mut cpu,
                    "container_cpu_usage_seconds_total",
                    &labels,
                    ns_total as f64 / 1e9,
                    None,
                );
            }
            if let Some(ws) = c["memory"]["workingSetBytes"].as_u64() {
                prometheus::sample(
                    &mut mem,
                    "container_memory_working_set_bytes",
                    &labels,
                    ws as f64,
                    None,
                );
            }
            for (out, (metric, resource, line, _)) in pressure.iter_mut().zip(PRESSURE) {
                // The kernel counts stall time in microseconds.
                if let Some(us) = c[resource]["psi"][line]["total"].as_u64() {
                    prometheus::sample(out, metric, &labels, us as f64 / 1e6, None);
                }
            }
        }
    }
    let mut out = format!("{cpu}{mem}");
    for (body, (metric, _, _, help)) in pressure.iter().zip(PRESSURE) {
        if !body.is_empty() {
            out.push_str(&format!(
                "# HELP {metric} {help}\n# TYPE {metric} counter\n{body}"
            ));
        }
    }
    out
}

/// The identity the TLS layer verified for a connection, if any.
#[derive(Clone)]
struct PeerUser(Option<auth::UserInfo>);

/// Authenticates and authorizes every request of the secure port.
async fn guard(
    State(a): State<Arc<auth::Auth>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let peer = req.extensions().get::<PeerUser>().and_then(|p| p.0.clone());
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    let refused = |r: auth::Refusal| match r {
        auth::Refusal::Unauthorized => text(StatusCode::UNAUTHORIZED, "Unauthorized".into()),
        auth::Refusal::Forbidden(m) => text(StatusCode::FORBIDDEN, m),
        auth::Refusal::Error(m) => text(StatusCode::INTERNAL_SERVER_ERROR, m),
    };
    let user = match a.authenticate(peer, bearer.as_deref()).await {
        Ok(u) => u,
        Err(r) => {
            tracing::debug!(path = %req.uri().path(), "kubelet API request not authenticated");
            return refused(r);
        }
    };
    let attrs = auth::attributes(req.method(), req.uri().path());
    if let Err(r) = a.authorize(&user, &attrs).await {
        return refused(r);
    }
    // Credentials meant for the kubelet are not passed on to the runtime.
    req.headers_mut().remove(header::AUTHORIZATION);
    next.run(req).await
}

/// The kubelet API's routes (upstream's server.go InstallDefaultHandlers,
/// InstallDebuggingHandlers).
pub fn secure_router(state: ServerState, auth: Arc<auth::Auth>) -> Router {
    use axum::routing::{any, post};
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route("/runningpods/", get(running_pods))
        .route("/runningpods", get(running_pods))
        .route("/metrics", get(metrics))
        .route("/metrics/probes", get(metrics_probes))
        .route("/metrics/cadvisor", get(metrics_cadvisor))
        .route("/metrics/resource", get(resource_metrics::handler))
        .route("/stats/summary", get(stats::summary))
        .route("/stats/summary/", get(stats::summary))
        .route(
            "/containerLogs/{ns}/{pod}/{container}",
            get(logs::container_logs),
        )
        .route("/exec/{*rest}", any(streaming::exec))
        .route("/attach/{*rest}", any(streaming::attach))
        .route("/portForward/{*rest}", any(streaming::port_forward))
        .route("/run/{*rest}", post(streaming::run))
        .route("/logs/", get(syslogs::index))
        .route("/logs/{*path}", get(syslogs::file))
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(auth, guard))
}

/// Serves the kubelet API over TLS on `addr` until the task is dropped, under the shared
/// handshake and header timeouts and connection limit.
pub async fn serve_secure(
    addr: SocketAddr,
    state: ServerState,
    auth: Arc<auth::Auth>,
    tls: Arc<rustls::ServerConfig>,
) -> std::io::Result<()> {
    use tower::ServiceExt as _;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(address = %addr, "kubelet API (secure port) listening");
    let app = secure_router(state, auth);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let service = move |cert: Option<rustls::pki_types::CertificateDer<'static>>| {
        let user = PeerUser(cert.as_ref().and_then(|c| auth::user_from_cert(c)));
        let app = app.clone();
        move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(user.clone());
            app.clone().oneshot(req.map(axum::body::Body::new))
        }
    };
    let limits = nodus_serving::conn::Limits::default();
    nodus_serving::conn::serve(
        listener,
        Some(acceptor),
        limits,
        service,
        std::future::pending(),
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cadvisor_metrics_carry_pressure_totals_in_seconds() {
        let summary = serde_json::json!({"pods": [{
            "podRef": {"name": "web", "namespace": "default"},
            "containers": [{
                "name": "app",
                "cpu": {"usageCoreNanoSeconds": 2_500_000_000u64, "psi": {
                    "some": {"total": 1_500_000, "avg10": 0.0, "avg60": 0.0, "avg300": 0.0},
                    "full": {"total": 0, "avg10": 0.0, "avg60": 0.0, "avg300": 0.0}}},
                "memory": {"workingSetBytes": 4096},
                "io": {"psi": {
                    "some": {"total": 250_000, "avg10": 0.0, "avg60": 0.0, "avg300": 0.0},
                    "full": {"total": 125_000, "avg10": 0.0, "avg60": 0.0, "avg300": 0.0}}}
            }]
        }]});
        let text = cadvisor_text(&summary);
        let labels = r#"{container="app",namespace="default",pod="web"}"#;
        for line in [
            format!("container_cpu_usage_seconds_total{labels} 2.5"),
            format!("container_memory_working_set_bytes{labels} 4096"),
            format!("container_pressure_cpu_waiting_seconds_total{labels} 1.5"),
            format!("container_pressure_cpu_stalled_seconds_total{labels} 0"),
            format!("container_pressure_io_waiting_seconds_total{labels} 0.25"),
            format!("container_pressure_io_stalled_seconds_total{labels} 0.125"),
            "# TYPE container_pressure_io_stalled_seconds_total counter".to_string(),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
        // No memory pressure file, no memory pressure series (nor their header).
        assert!(!text.contains("container_pressure_memory"), "{text}");
    }
}
