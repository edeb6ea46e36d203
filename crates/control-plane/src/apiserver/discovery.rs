//! API discovery: the documents kubectl reads to learn which groups, versions and resources
//! the server has (`/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`, and the
//! aggregated `apidiscovery.k8s.io/v2` form of `/api` and `/apis`).
//!
//! Everything is derived from `nodus_k8s::catalog`; the `/version` endpoint is not here.

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;

/// The discovery endpoints, stateless (`Router<()>`), ready to be merged into the API server.
pub fn router() -> Router {
    Router::new()
        .route("/api", get(not_ready))
        .route("/api/v1", get(not_ready))
        .route("/apis", get(not_ready))
        .route("/apis/{group}", get(not_ready))
        .route("/apis/{group}/{version}", get(not_ready))
}

async fn not_ready() -> StatusCode {
    StatusCode::NOT_IMPLEMENTED
}
