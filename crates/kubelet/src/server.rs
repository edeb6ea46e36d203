//! The kubelet's local HTTP endpoints: the healthz server (127.0.0.1:10248, `/healthz` with
//! the ping, syncloop and pleg checks) and the read-only server (`--read-only-port`,
//! upstream's unauthenticated port, off by default: `/pods`, `/metrics`, `/healthz`).

use crate::metrics::Metrics;
use crate::pleg::Health;
use crate::status::StatusManager;
use crate::syncloop::PodManager;
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
            "text/plain; version=0.0.4; charset=utf-8",
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
        .map(|mut p| {
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

pub async fn serve_healthz(addr: SocketAddr, state: ServerState) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(address = %addr, "healthz server listening");
    axum::serve(listener, app).await
}

pub async fn serve_read_only(addr: SocketAddr, state: ServerState) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(address = %addr, "read-only server listening");
    axum::serve(listener, app).await
}
