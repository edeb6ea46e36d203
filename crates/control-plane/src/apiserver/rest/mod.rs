//! The REST handlers: one module per verb over `serde_json::Value` objects, for every
//! resource in `nodus_k8s::catalog`.

pub mod apply;
pub mod certificates;
pub mod convert;
pub mod create;
pub mod delete;
pub mod list;
pub mod output;
pub mod path;
pub mod proxy;
pub mod reviews;
pub mod subresources;
pub mod tokenrequest;
mod tunnel;
pub mod update;
pub mod watch;

use nodus_serving::query;
use std::collections::HashMap;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use nodus_k8s::status;
use serde_json::Value;

use crate::apiserver::authn::User;
use crate::apiserver::authz::{self, Attributes};
use crate::apiserver::state::SharedState;
use crate::storage::StoreError;
use path::{Parsed, Target};

/// A metav1 Status error body; its `code` is the HTTP status.
#[derive(Debug, Clone)]
pub struct ApiError(pub Value);

/// The Status's message, as controllers quote a refusal in their events.
impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0["message"].as_str().unwrap_or("request refused"))
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(status::code(&self.0), &self.0, &[])
    }
}

impl From<Value> for ApiError {
    fn from(v: Value) -> Self {
        ApiError(v)
    }
}

/// Serialises `body` with `code` and the given `Warning` headers.
pub fn json_response(code: u16, body: &Value, warnings: &[String]) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Body::from(bytes));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for w in warnings {
        let text = format!("299 - {}", status::go_quote(w));
        if let Ok(v) = HeaderValue::from_str(&text) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

/// Maps a storage failure to the Status upstream returns for it.
pub fn store_error(t: &Target, name: &str, e: StoreError) -> ApiError {
    let g = t.info.group;
    let r = t.info.plural;
    ApiError(match e {
        StoreError::NotFound(_) => status::not_found(g, r, name),
        StoreError::AlreadyExists(_) => status::already_exists(g, r, name),
        StoreError::Conflict { .. } => status::conflict(g, r, name),
        StoreError::Compacted { requested, oldest } => {
            status::gone(&format!("too old resource version: {requested} ({oldest})"))
        }
        other => return storage_failure(other),
    })
}

/// A storage failure outside a request's own object: etcd unreachable is 503, too slow
/// 504, a compacted revision 410, anything else 500.
pub fn storage_failure(e: StoreError) -> ApiError {
    ApiError(match e {
        StoreError::Compacted { requested, oldest } => {
            status::gone(&format!("too old resource version: {requested} ({oldest})"))
        }
        e @ StoreError::Unavailable(_) => status::service_unavailable(&e.to_string()),
        e @ StoreError::Timeout => status::timeout(&e.to_string()),
        StoreError::Refused(status) => *status,
        other => status::internal(&other.to_string()),
    })
}

/// One API request, parsed.
pub struct Req {
    pub st: SharedState,
    pub user: User,
    pub target: Target,
    pub query: HashMap<String, String>,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The client connection's upgrade (exec, attach, port-forward tunnels).
    pub upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// The query string as sent (repeated keys such as exec's `command` kept).
    pub raw_query: Option<String>,
}

impl Req {
    pub fn q(&self, k: &str) -> Option<&str> {
        self.query
            .get(k)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
    /// Every value of a repeated query parameter, in order.
    pub fn query_all(&self, key: &str) -> Vec<String> {
        query::query_all(self.raw_query.as_deref(), key)
    }
    /// A boolean parameter as upstream reads it (`watch=True` is true).
    pub fn q_bool(&self, k: &str) -> bool {
        query::bool_value(self.query.get(k).map(String::as_str))
    }
    pub fn dry_run(&self) -> bool {
        self.query.get("dryRun").is_some_and(|v| v == "All")
    }
    pub fn ns(&self) -> Option<&str> {
        self.target.namespace.as_deref()
    }
    /// The JSON body, or the 400 upstream gives for undecodable input.
    pub fn json_body(&self) -> ApiResult<Value> {
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json");
        let parsed: Result<Value, String> = if ct.contains("yaml") {
            serde_yaml::from_slice(&self.body).map_err(|e| e.to_string())
        } else if ct.contains("protobuf") {
            return Err(ApiError(status::unsupported_media_type(&format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml; got {ct}"
            ))));
        } else {
            serde_json::from_slice(&self.body).map_err(|e| e.to_string())
        };
        let v = parsed.map_err(|e| {
            ApiError(status::bad_request(&format!(
                "couldn't get version/kind; json parse error: {e}"
            )))
        })?;
        if !v.is_object() {
            return Err(ApiError(status::bad_request(
                "couldn't get version/kind; json parse error: expected an object",
            )));
        }
        Ok(v)
    }
}

/// The verb of a request, as the authorizer names it.
pub fn verb_of(method: &Method, t: &Target, query: &HashMap<String, String>) -> &'static str {
    let watch = t.watch_path || query::bool_value(query.get("watch").map(String::as_str));
    match *method {
        Method::GET | Method::HEAD => match (&t.name, watch) {
            (_, true) => "watch",
            (Some(_), false) => "get",
            (None, false) => "list",
        },
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => {
            if t.name.is_some() {
                "delete"
            } else {
                "deletecollection"
            }
        }
        _ => "unknown",
    }
}

/// Entry point for every `/api/...` and `/apis/...` path that discovery does not serve.
pub async fn handle(
    st: SharedState,
    user: User,
    method: Method,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
    upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Response {
    let target = match path::parse(uri.path()) {
        Parsed::Resource(t) => t,
        Parsed::NotFound => {
            return ApiError(not_found_path()).into_response();
        }
    };
    let query = query::parse_query(uri.query());
    let verb = verb_of(&method, &target, &query);
    let req = Req {
        st,
        user,
        target,
        query,
        headers,
        body,
        upgrade,
        raw_query: uri.query().map(str::to_string),
    };
    match dispatch(req, &method, verb).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

pub fn not_found_path() -> Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "the server could not find the requested resource", "reason": "NotFound",
        "details": {}, "code": 404})
}

pub(crate) fn authorize(req: &Req, verb: &str, body: Option<&Value>) -> ApiResult<()> {
    let attrs = Attributes {
        verb,
        request: authz::Request::Served(&req.target),
        body,
        field_selector: req.q("fieldSelector"),
    };
    req.st
        .authz
        .authorize(&req.user, &attrs, req.st.store.as_ref())
        .map_err(|reason| ApiError(authz::forbidden(&req.user, &attrs, &reason)))
}

async fn dispatch(req: Req, method: &Method, verb: &'static str) -> ApiResult<Response> {
    let info = req.target.info;
    if !info.namespaced && req.target.namespace.is_some() {
        return Err(ApiError(not_found_path()));
    }
    let body_for_authz = if matches!(verb, "create" | "update") && !req.body.is_empty() {
        serde_json::from_slice::<Value>(&req.body).ok()
    } else {
        None
    };
    authorize(&req, verb, body_for_authz.as_ref())?;
    if req.target.sub.is_none() && !info.verbs.contains(&verb) {
        return Err(ApiError(status::method_not_allowed(
            info.group,
            info.plural,
            method.as_str(),
        )));
    }
    if let Some(sub) = req.target.sub.clone() {
        return subresources::handle(req, method, verb, &sub).await;
    }
    match verb {
        "get" => list::get(&req),
        "list" => list::list(&req),
        "watch" => watch::watch(req).await,
        "create" if info.plural == "bindings" => {
            let body = req.json_body()?;
            let pod = meta_str(&body, "name").unwrap_or("").to_string();
            subresources::bind(&req, &pod, &body)
        }
        "create" => create::create(&req).await,
        "update" => update::put(&req).await,
        "patch" => update::patch(&req).await,
        "delete" => delete::delete(&req).await,
        "deletecollection" => delete::delete_collection(&req).await,
        _ => Err(ApiError(status::method_not_allowed(
            info.group,
            info.plural,
            method.as_str(),
        ))),
    }
}

/// RFC 3339 time in seconds, as metav1.Time serialises.
pub fn now_rfc3339() -> String {
    now_ts().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The current time (jiff's `now` needs a feature k8s-openapi does not enable).
pub fn now_ts() -> k8s_openapi::jiff::Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    k8s_openapi::jiff::Timestamp::new(d.as_secs() as i64, d.subsec_nanos() as i32)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

/// A random RFC 4122 version 4 UUID.
pub fn new_uid() -> String {
    let b: [u8; 16] = rand::random();
    let mut b = b;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Upstream's name generator: 5 characters from an alphabet without vowels or confusables.
pub fn generate_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

pub fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = Value::Object(Default::default());
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}
