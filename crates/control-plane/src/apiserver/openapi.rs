//! OpenAPI documents for kubectl: `/openapi/v2` (JSON) and `/openapi/v3` (the index and one
//! document per group-version), generated from the k8s-openapi types' JSON schemas under
//! upstream's definition names and extensions.

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;

/// The OpenAPI endpoints, stateless (`Router<()>`), ready to be merged into the API server.
pub fn router() -> Router {
    Router::new()
        .route("/openapi/v2", get(not_ready))
        .route("/openapi/v3", get(not_ready))
        .route("/openapi/v3/{*path}", get(not_ready))
}

async fn not_ready() -> StatusCode {
    StatusCode::NOT_IMPLEMENTED
}
