//! Health endpoints (upstream's pkg/proxy/healthcheck): the proxy's own `/healthz` and
//! `/livez` on healthzBindAddress (0.0.0.0:10256), and one HTTP server per
//! `healthCheckNodePort` of an externalTrafficPolicy: Local service, answering 200 while
//! this node has local endpoints and 503 otherwise, so a load balancer sends traffic only to
//! nodes that can serve it.

use crate::metrics::Metrics;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Shared between the sync loop (writer) and the health server (reader).
#[derive(Debug)]
pub struct ProxyHealth {
    inner: Mutex<HealthInner>,
    timeout: Duration,
}

#[derive(Debug, Default)]
struct HealthInner {
    last_updated: Option<SystemTime>,
    /// When a change was queued that no sync has applied yet.
    pending_since: Option<SystemTime>,
}

impl ProxyHealth {
    /// `timeout`: how long a queued change may wait for a sync before the proxy is
    /// unhealthy (upstream: 2 × syncPeriod).
    pub fn new(timeout: Duration) -> ProxyHealth {
        ProxyHealth {
            inner: Mutex::new(HealthInner::default()),
            timeout,
        }
    }

    pub fn queued(&self) {
        if let Ok(mut g) = self.inner.lock()
            && g.pending_since.is_none()
        {
            g.pending_since = Some(SystemTime::now());
        }
    }

    pub fn updated(&self) {
        if let Ok(mut g) = self.inner.lock() {
            g.last_updated = Some(SystemTime::now());
            g.pending_since = None;
        }
    }

    /// (healthy, lastUpdated)
    pub fn status(&self) -> (bool, Option<SystemTime>) {
        let Ok(g) = self.inner.lock() else {
            return (false, None);
        };
        let now = SystemTime::now();
        let stale = |t: SystemTime| now.duration_since(t).unwrap_or_default() > self.timeout;
        let healthy = match (g.last_updated, g.pending_since) {
            (None, None) => true,
            (_, Some(p)) => !stale(p),
            (Some(_), None) => true,
        };
        (healthy, g.last_updated)
    }
}

fn rfc3339(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn json(code: StatusCode, body: String) -> Response {
    let mut r = (code, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        "X-Content-Type-Options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

#[derive(Clone)]
struct ServerState {
    health: Arc<ProxyHealth>,
}

async fn healthz(State(s): State<ServerState>) -> Response {
    let (ok, last) = s.health.status();
    let body = serde_json::json!({
        "lastUpdated": last.map(rfc3339).unwrap_or_default(),
        "currentTime": rfc3339(SystemTime::now()),
        "nodeEligible": true,
    });
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(code, body.to_string())
}

/// Serves `/healthz` and `/livez` until the task is dropped.
pub async fn serve_healthz(addr: SocketAddr, health: Arc<ProxyHealth>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", axum::routing::get(healthz))
        .route("/livez", axum::routing::get(healthz))
        .with_state(ServerState { health });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(address = %addr, "healthz server listening");
    axum::serve(listener, app).await
}

/// Serves `/metrics` (and `/healthz`, as upstream's metrics server does).
pub async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<ProxyHealth>,
) -> std::io::Result<()> {
    let m = metrics.clone();
    let app = Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let m = m.clone();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        m.encode(),
                    )
                }
            }),
        )
        .route("/healthz", axum::routing::get(healthz))
        .with_state(ServerState { health });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(address = %addr, "metrics server listening");
    axum::serve(listener, app).await
}

/// One service's health answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceHealth {
    pub namespace: String,
    pub name: String,
    pub local_endpoints: usize,
}

type Shared = Arc<Mutex<ServiceHealth>>;

/// The per-service health check servers, started and stopped as services come and go.
#[derive(Default)]
pub struct ServiceHealthServers {
    servers: HashMap<u16, (Shared, tokio::task::JoinHandle<()>)>,
}

async fn service_health(State(s): State<Shared>) -> Response {
    let h = match s.lock() {
        Ok(g) => g.clone(),
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    let body = serde_json::json!({
        "service": {"namespace": h.namespace, "name": h.name},
        "localEndpoints": h.local_endpoints,
        "serviceProxyHealthy": true,
    });
    let code = if h.local_endpoints > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(code, body.to_string())
}

impl ServiceHealthServers {
    /// Makes the running servers match `wanted` (healthCheckNodePort → service).
    /// Must be called inside a tokio runtime.
    pub fn sync(&mut self, handle: &tokio::runtime::Handle, wanted: HashMap<u16, ServiceHealth>) {
        self.servers.retain(|port, (_, task)| {
            let keep = wanted.contains_key(port);
            if !keep {
                task.abort();
            }
            keep
        });
        for (port, h) in wanted {
            if let Some((shared, _)) = self.servers.get(&port) {
                if let Ok(mut g) = shared.lock() {
                    *g = h;
                }
                continue;
            }
            let shared: Shared = Arc::new(Mutex::new(h.clone()));
            let state = shared.clone();
            let task = handle.spawn(async move {
                let addr = SocketAddr::from(([0, 0, 0, 0], port));
                let app = Router::new()
                    .fallback(service_health)
                    .with_state(state);
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => {
                        tracing::info!(service = %format!("{}/{}", h.namespace, h.name), port, "health check node port listening");
                        if let Err(e) = axum::serve(l, app).await {
                            tracing::error!(port, error = %e, "health check server failed");
                        }
                    }
                    Err(e) => tracing::error!(
                        service = %format!("{}/{}", h.namespace, h.name), port, error = %e,
                        "cannot open the healthCheckNodePort"
                    ),
                }
            });
            self.servers.insert(port, (shared, task));
        }
    }
}
