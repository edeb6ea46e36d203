//! The review APIs other components ask the API server's own authenticator and authorizer
//! through: `authentication.k8s.io/v1` TokenReview (the kubelet's
//! `--authentication-token-webhook`) and `authorization.k8s.io/v1` SubjectAccessReview and
//! SelfSubjectAccessReview (the kubelet's `--authorization-mode=Webhook`, `kubectl auth
//! can-i`). They are create-only and stored nowhere: the answer is the object sent back
//! with its `status` filled in, as upstream's.
//!
//! Creating them is open to every authenticated user: upstream grants it to nodes (the
//! Node authorizer's node rules) and to anyone with `system:auth-delegator`, and nodus has
//! no RBAC yet, under which every non-node user is allowed anyway.

use axum::Router;
use axum::extract::{Extension, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use nodus_k8s::validation::FieldError;
use serde_json::{Value, json};

use crate::apiserver::auth::{self, Attributes, User};
use crate::apiserver::protobuf;
use crate::apiserver::rest::path::Target;
use crate::apiserver::rest::{ApiError, json_response};
use crate::apiserver::state::SharedState;

/// The routes, merged into the API server's router ahead of the REST fallback.
pub fn router(st: SharedState) -> Router {
    Router::new()
        .route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            post(token_review),
        )
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(subject_access_review),
        )
        .route(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            post(self_subject_access_review),
        )
        .with_state(st)
}

/// The authorization.k8s.io/v1 review messages, for protobuf request bodies (kubectl's
/// `auth can-i` sends them so): the API server's schema set has no authorization package.
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Unknown {
        #[prost(message, optional, tag = "1")]
        pub type_meta: Option<TypeMeta>,
        #[prost(bytes = "vec", optional, tag = "2")]
        pub raw: Option<Vec<u8>>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeMeta {
        #[prost(string, optional, tag = "1")]
        pub api_version: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub kind: Option<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceAttributes {
        #[prost(string, optional, tag = "1")]
        pub namespace: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub verb: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub group: Option<String>,
        #[prost(string, optional, tag = "4")]
        pub version: Option<String>,
        #[prost(string, optional, tag = "5")]
        pub resource: Option<String>,
        #[prost(string, optional, tag = "6")]
        pub subresource: Option<String>,
        #[prost(string, optional, tag = "7")]
        pub name: Option<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NonResourceAttributes {
        #[prost(string, optional, tag = "1")]
        pub path: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub verb: Option<String>,
    }
    /// SubjectAccessReviewSpec; SelfSubjectAccessReviewSpec is its first two fields.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Spec {
        #[prost(message, optional, tag = "1")]
        pub resource_attributes: Option<ResourceAttributes>,
        #[prost(message, optional, tag = "2")]
        pub non_resource_attributes: Option<NonResourceAttributes>,
        #[prost(string, optional, tag = "3")]
        pub user: Option<String>,
        #[prost(string, repeated, tag = "4")]
        pub groups: Vec<String>,
        #[prost(string, optional, tag = "6")]
        pub uid: Option<String>,
    }
    /// (Self)SubjectAccessReview without its metadata and status.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Review {
        #[prost(message, optional, tag = "2")]
        pub spec: Option<Spec>,
    }
}

/// A protobuf (Self)SubjectAccessReview body as its JSON form.
fn review_from_protobuf(body: &[u8]) -> Option<Value> {
    use prost::Message as _;
    let rest = body.strip_prefix(b"k8s\0")?;
    let u = pb::Unknown::decode(rest).ok()?;
    let tm = u.type_meta?;
    let (av, kind) = (tm.api_version?, tm.kind?);
    if av != "authorization.k8s.io/v1" {
        return None;
    }
    let r = pb::Review::decode(u.raw.unwrap_or_default().as_slice()).ok()?;
    let spec = r.spec.unwrap_or_default();
    let mut out = json!({"apiVersion": av, "kind": kind, "metadata": {}, "spec": {}});
    if let Some(ra) = spec.resource_attributes {
        out["spec"]["resourceAttributes"] = json!({
            "namespace": ra.namespace, "verb": ra.verb, "group": ra.group,
            "version": ra.version, "resource": ra.resource,
            "subresource": ra.subresource, "name": ra.name,
        });
    }
    if let Some(nra) = spec.non_resource_attributes {
        out["spec"]["nonResourceAttributes"] = json!({"path": nra.path, "verb": nra.verb});
    }
    if let Some(u) = spec.user {
        out["spec"]["user"] = json!(u);
    }
    if !spec.groups.is_empty() {
        out["spec"]["groups"] = json!(spec.groups);
    }
    if let Some(uid) = spec.uid {
        out["spec"]["uid"] = json!(uid);
    }
    Some(out)
}

/// Reads the body (JSON, YAML or protobuf) and checks its kind.
async fn body_of(req: Request, kind: &str, api_version: &str) -> Result<Value, ApiError> {
    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .map_err(|e| ApiError(nodus_k8s::status::bad_request(&e.to_string())))?;
    let is_protobuf = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(protobuf::is_protobuf);
    if is_protobuf
        && api_version == "authorization.k8s.io/v1"
        && let Some(v) = review_from_protobuf(&bytes)
    {
        return check_kind(v, kind, api_version);
    }
    let bytes = protobuf::request_to_json(&mut headers, bytes)
        .map_err(|e| ApiError(nodus_k8s::status::bad_request(&e.to_string())))?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let v: Value = if ct.contains("yaml") {
        serde_yaml::from_slice(&bytes).map_err(|e| e.to_string())
    } else {
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    }
    .map_err(|e| {
        ApiError(nodus_k8s::status::bad_request(&format!(
            "couldn't get version/kind; json parse error: {e}"
        )))
    })?;
    check_kind(v, kind, api_version)
}

fn check_kind(v: Value, kind: &str, api_version: &str) -> Result<Value, ApiError> {
    let got_kind = v.get("kind").and_then(Value::as_str).unwrap_or(kind);
    let got_av = v
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or(api_version);
    if got_kind != kind || got_av != api_version {
        return Err(ApiError(nodus_k8s::status::bad_request(&format!(
            "the API version in the data ({got_av}) does not match the expected API version ({api_version}) or kind {got_kind:?} is not {kind:?}"
        ))));
    }
    Ok(v)
}

/// The created review: 201 with the object, in the client's accepted encoding.
async fn created(accept: Option<String>, mut obj: Value, kind: &str, av: &str) -> Response {
    obj["kind"] = json!(kind);
    obj["apiVersion"] = json!(av);
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"]["creationTimestamp"] = Value::Null;
    protobuf::negotiate_response(accept.as_deref(), json_response(201, &obj, &[])).await
}

fn accept_of(req: &Request) -> Option<String> {
    req.headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Who a bearer token is: the API server's own token authenticator (the static token
/// file; client certificates carry no token).
async fn token_review(State(st): State<SharedState>, req: Request) -> Response {
    let accept = accept_of(&req);
    let av = "authentication.k8s.io/v1";
    let mut obj = match body_of(req, "TokenReview", av).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let token = obj
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if token.is_empty() {
        return ApiError(nodus_k8s::status::invalid(
            "TokenReview.authentication.k8s.io",
            "",
            &[FieldError::required("spec.token", "")],
        ))
        .into_response();
    }
    let audiences = obj.pointer("/spec/audiences").cloned();
    obj["status"] = match st.tokens.get(&token) {
        Some(u) => json!({
            "authenticated": true,
            "user": {"username": u.name, "groups": u.groups},
            "audiences": audiences.unwrap_or(json!([])),
        }),
        None => json!({"authenticated": false, "user": {}}),
    };
    created(accept, obj, "TokenReview", av).await
}

/// What the authorizer says about `user` doing what `spec` describes.
fn review(st: &SharedState, user: &User, spec: &Value) -> (bool, String) {
    if let Some(ra) = spec.get("resourceAttributes").filter(|v| v.is_object()) {
        let s = |k: &str| ra.get(k).and_then(Value::as_str).unwrap_or("");
        let group = s("group");
        let resource = s("resource");
        let version = match s("version") {
            "" | "*" => None,
            v => Some(v),
        };
        let info = nodus_k8s::catalog::all().iter().find(|r| {
            r.group == group && r.plural == resource && version.is_none_or(|v| v == r.version)
        });
        let verb = match s("verb") {
            "" => "get",
            v => v,
        };
        let Some(info) = info else {
            // A resource the catalogue does not serve: only the identity decides.
            if user.in_group("system:masters") {
                return (true, String::new());
            }
            if user.is_anonymous() || user.in_group("system:nodes") {
                return (false, String::new());
            }
            return (true, String::new());
        };
        let nonempty = |k: &str| Some(s(k).to_string()).filter(|x| !x.is_empty());
        let target = Target {
            info,
            namespace: nonempty("namespace"),
            name: nonempty("name"),
            sub: nonempty("subresource"),
            watch_path: false,
            rest: Vec::new(),
        };
        let attrs = Attributes {
            verb,
            target: &target,
            body: None,
            field_selector: None,
        };
        return match auth::authorize(user, &attrs, st.store.as_ref()) {
            Ok(()) => (true, String::new()),
            Err(reason) => (false, reason),
        };
    }
    let path = spec
        .pointer("/nonResourceAttributes/path")
        .and_then(Value::as_str)
        .unwrap_or("");
    if user.in_group("system:masters") || auth::is_public_path(path) {
        return (true, String::new());
    }
    if user.is_anonymous() || user.in_group("system:nodes") {
        return (false, String::new());
    }
    (true, String::new())
}

fn status(allowed: bool, reason: String) -> Value {
    let mut s = json!({"allowed": allowed});
    if !reason.is_empty() {
        s["reason"] = json!(reason);
    }
    s
}

/// May the user named in the spec do this? Asked by the kubelet for every API request.
async fn subject_access_review(State(st): State<SharedState>, req: Request) -> Response {
    let accept = accept_of(&req);
    let av = "authorization.k8s.io/v1";
    let mut obj = match body_of(req, "SubjectAccessReview", av).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    let name = spec.get("user").and_then(Value::as_str).unwrap_or("");
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|g| g.as_str().map(str::to_string))
        .collect();
    if name.is_empty() && groups.is_empty() {
        return ApiError(nodus_k8s::status::invalid(
            "SubjectAccessReview.authorization.k8s.io",
            "",
            &[FieldError::invalid(
                "spec.user,spec.groups",
                json!(""),
                "at least one of user or group must be specified",
            )],
        ))
        .into_response();
    }
    let has_ra = spec.get("resourceAttributes").is_some_and(Value::is_object);
    let has_nra = spec
        .get("nonResourceAttributes")
        .is_some_and(Value::is_object);
    if has_ra == has_nra {
        return ApiError(nodus_k8s::status::invalid(
            "SubjectAccessReview.authorization.k8s.io",
            "",
            &[FieldError::invalid(
                "spec.resourceAttributes",
                json!(spec.get("resourceAttributes")),
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )],
        ))
        .into_response();
    }
    let user = User {
        name: name.to_string(),
        groups,
    };
    let (allowed, reason) = review(&st, &user, &spec);
    obj["status"] = status(allowed, reason);
    created(accept, obj, "SubjectAccessReview", av).await
}

/// May I do this? (`kubectl auth can-i`)
async fn self_subject_access_review(
    State(st): State<SharedState>,
    Extension(user): Extension<User>,
    req: Request,
) -> Response {
    let accept = accept_of(&req);
    let av = "authorization.k8s.io/v1";
    let mut obj = match body_of(req, "SelfSubjectAccessReview", av).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    let (allowed, reason) = review(&st, &user, &spec);
    obj["status"] = status(allowed, reason);
    created(accept, obj, "SelfSubjectAccessReview", av).await
}
