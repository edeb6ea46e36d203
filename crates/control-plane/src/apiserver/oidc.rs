//! Service-account issuer discovery: the OpenID Connect provider configuration and the
//! JWKS with the token signing key, so other systems can verify service-account tokens
//! (upstream's `/.well-known/openid-configuration` and `/openid/v1/jwks`). Who may read
//! them is the authorizer's (`system:service-account-issuer-discovery`).

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use axum::routing::get;
use serde_json::{Value, json};

use crate::apiserver::rest::json_response;
use crate::apiserver::state::{ApiState, SharedState};

pub const CONFIGURATION_PATH: &str = "/.well-known/openid-configuration";
pub const JWKS_PATH: &str = "/openid/v1/jwks";

pub fn router(st: SharedState) -> Router {
    Router::new()
        .route(CONFIGURATION_PATH, get(configuration))
        .route(JWKS_PATH, get(jwks))
        .with_state(st)
}

/// The discovery document; the JWKS is named at the API server's advertised address, as
/// upstream does without `--service-account-jwks-uri`.
pub fn configuration_document(st: &ApiState) -> Value {
    let addr = std::net::SocketAddr::new(st.config.advertise_address, st.config.secure_port);
    json!({
        "issuer": st.config.service_account_issuer,
        "jwks_uri": format!("https://{addr}{JWKS_PATH}"),
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["ES256"],
    })
}

fn cacheable(mut r: Response, content_type: &'static str) -> Response {
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    r
}

async fn configuration(State(st): State<SharedState>) -> Response {
    cacheable(
        json_response(200, &configuration_document(&st), &[]),
        "application/json",
    )
}

async fn jwks(State(st): State<SharedState>) -> Response {
    cacheable(
        json_response(200, &st.sa_keys.jwks(), &[]),
        "application/jwk-set+json",
    )
}
