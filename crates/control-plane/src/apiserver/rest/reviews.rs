//! The review APIs other components ask the API server's own authenticator and authorizer
//! through: `authentication.k8s.io/v1` TokenReview (the kubelet's
//! `--authentication-token-webhook`) and SelfSubjectReview (`kubectl auth whoami`), and
//! `authorization.k8s.io/v1` SubjectAccessReview, LocalSubjectAccessReview,
//! SelfSubjectAccessReview (the kubelet's `--authorization-mode=Webhook`, `kubectl auth
//! can-i`) and SelfSubjectRulesReview (`kubectl auth can-i --list`). They are create-only and
//! stored nowhere: the answer is the object sent back with its `status` filled in, as
//! upstream's. Who may create them is the authorizer's call, like any request
//! (`system:basic-user` grants the self reviews, `system:auth-delegator` the others).

use axum::Router;
use axum::extract::{Extension, Path, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use nodus_k8s::validation::FieldError;
use serde_json::{Value, json};

use crate::apiserver::authn::{self, User};
use crate::apiserver::authz::{Attributes, Request as AuthzRequest, ResourceAttrs};
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
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            post(self_subject_review),
        )
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(subject_access_review),
        )
        .route(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            post(self_subject_access_review),
        )
        .route(
            "/apis/authorization.k8s.io/v1/namespaces/{namespace}/localsubjectaccessreviews",
            post(local_subject_access_review),
        )
        .route(
            "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            post(self_subject_rules_review),
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
    /// SelfSubjectRulesReviewSpec.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RulesSpec {
        #[prost(string, optional, tag = "1")]
        pub namespace: Option<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RulesReview {
        #[prost(message, optional, tag = "2")]
        pub spec: Option<RulesSpec>,
    }
    /// (Self)SubjectAccessReview without its metadata and status.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Review {
        #[prost(message, optional, tag = "2")]
        pub spec: Option<Spec>,
    }
}

/// A protobuf review body (the access reviews, SelfSubjectRulesReview, SelfSubjectReview) as
/// its JSON form.
fn review_from_protobuf(body: &[u8]) -> Option<Value> {
    use prost::Message as _;
    let rest = body.strip_prefix(b"k8s\0")?;
    let u = pb::Unknown::decode(rest).ok()?;
    let tm = u.type_meta?;
    let (av, kind) = (tm.api_version?, tm.kind?);
    let raw = u.raw.unwrap_or_default();
    match (av.as_str(), kind.as_str()) {
        ("authentication.k8s.io/v1", "SelfSubjectReview") => {
            return Some(json!({"apiVersion": av, "kind": kind, "metadata": {}}));
        }
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => {
            let r = pb::RulesReview::decode(raw.as_slice()).ok()?;
            let ns = r.spec.unwrap_or_default().namespace.unwrap_or_default();
            return Some(
                json!({"apiVersion": av, "kind": kind, "metadata": {}, "spec": {"namespace": ns}}),
            );
        }
        ("authorization.k8s.io/v1", _) => {}
        _ => return None,
    }
    let r = pb::Review::decode(raw.as_slice()).ok()?;
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

/// The review kinds served here.
// The variants are upstream's kind names, which all end in Review.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    TokenReview,
    SelfSubjectReview,
    SubjectAccessReview,
    LocalSubjectAccessReview,
    SelfSubjectAccessReview,
    SelfSubjectRulesReview,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::TokenReview => "TokenReview",
            Kind::SelfSubjectReview => "SelfSubjectReview",
            Kind::SubjectAccessReview => "SubjectAccessReview",
            Kind::LocalSubjectAccessReview => "LocalSubjectAccessReview",
            Kind::SelfSubjectAccessReview => "SelfSubjectAccessReview",
            Kind::SelfSubjectRulesReview => "SelfSubjectRulesReview",
        }
    }

    fn group(self) -> &'static str {
        match self {
            Kind::TokenReview | Kind::SelfSubjectReview => "authentication.k8s.io",
            _ => "authorization.k8s.io",
        }
    }

    fn api_version(self) -> &'static str {
        match self.group() {
            "authentication.k8s.io" => "authentication.k8s.io/v1",
            _ => "authorization.k8s.io/v1",
        }
    }

    /// A 422 naming one field, as upstream's validation of the review.
    fn invalid(self, field: &str, value: Value, message: &str) -> ApiError {
        ApiError(nodus_k8s::status::invalid(
            &format!("{}.{}", self.name(), self.group()),
            "",
            &[FieldError::invalid(field, value, message)],
        ))
    }
}

/// A review as sent: the client's Accept header and the object.
struct Incoming {
    kind: Kind,
    accept: Option<String>,
    obj: Value,
}

impl Incoming {
    /// Reads the review (JSON, YAML or protobuf); the error is the response to send.
    async fn read(req: Request, kind: Kind) -> Result<Incoming, Response> {
        let accept = accept_of(&req);
        let obj = body_of(req, kind.name(), kind.api_version())
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Incoming { kind, accept, obj })
    }

    fn spec(&self) -> Value {
        self.obj.get("spec").cloned().unwrap_or(json!({}))
    }

    /// 201 with the object and `status`, in the client's accepted encoding.
    async fn answer(mut self, status: Value) -> Response {
        self.obj["status"] = status;
        created(
            self.accept,
            self.obj,
            self.kind.name(),
            self.kind.api_version(),
        )
        .await
    }
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
        && kind != "TokenReview"
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

/// Who a bearer token is: the API server's own bearer-token chain, for the review's
/// audiences (default the API server's); a refusal carries the reason in `status.error`.
async fn token_review(State(st): State<SharedState>, req: Request) -> Response {
    let r = match Incoming::read(req, Kind::TokenReview).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    let token = r
        .obj
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
    let audiences: Option<Vec<String>> = r
        .obj
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .filter(|a: &Vec<String>| !a.is_empty());
    let status = match authn::review_token(&st, &token, audiences.as_deref()) {
        Ok(a) => {
            let mut user = json!({"username": a.user.name, "groups": a.user.groups});
            if !a.user.uid.is_empty() {
                user["uid"] = json!(a.user.uid);
            }
            if !a.user.extra.is_empty() {
                user["extra"] = json!(a.user.extra);
            }
            json!({"authenticated": true, "user": user, "audiences": a.audiences})
        }
        Err(e) => json!({"user": {}, "error": e}),
    };
    r.answer(status).await
}

/// What the authorizer chain says about `user` doing what `spec` describes.
fn review(st: &SharedState, user: &User, spec: &Value) -> (bool, String) {
    let s = |ptr: &str| spec.pointer(ptr).and_then(Value::as_str).unwrap_or("");
    let verb;
    let served;
    let request = if spec.get("resourceAttributes").is_some_and(Value::is_object) {
        let ra = |k: &str| s(&format!("/resourceAttributes/{k}"));
        verb = match ra("verb") {
            "" => "get",
            v => v,
        };
        let version = match ra("version") {
            "" | "*" => None,
            v => Some(v),
        };
        let info = nodus_k8s::catalog::served().into_iter().find(|r| {
            r.group == ra("group")
                && r.plural == ra("resource")
                && version.is_none_or(|v| v == r.version)
        });
        let nonempty = |k: &str| Some(ra(k).to_string()).filter(|x| !x.is_empty());
        match info {
            Some(info) => {
                served = Target {
                    info,
                    namespace: nonempty("namespace"),
                    name: nonempty("name"),
                    sub: nonempty("subresource"),
                    watch_path: false,
                    rest: Vec::new(),
                };
                AuthzRequest::Served(&served)
            }
            None => AuthzRequest::Named(ResourceAttrs {
                group: ra("group"),
                resource: ra("resource"),
                subresource: ra("subresource"),
                namespace: ra("namespace"),
                name: ra("name"),
            }),
        }
    } else {
        verb = s("/nonResourceAttributes/verb");
        AuthzRequest::NonResource(s("/nonResourceAttributes/path"))
    };
    let attrs = Attributes {
        verb,
        request,
        body: None,
        field_selector: None,
    };
    match st.authz.authorize(user, &attrs, st.store.as_ref()) {
        Ok(()) => (true, String::new()),
        Err(reason) => (false, reason),
    }
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
    let r = match Incoming::read(req, Kind::SubjectAccessReview).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    let spec = r.spec();
    let user = match user_of_spec(r.kind, &spec) {
        Ok(u) => u,
        Err(e) => return e.into_response(),
    };
    let has_ra = spec.get("resourceAttributes").is_some_and(Value::is_object);
    let has_nra = spec
        .get("nonResourceAttributes")
        .is_some_and(Value::is_object);
    if has_ra == has_nra {
        return r
            .kind
            .invalid(
                "spec.resourceAttributes",
                json!(spec.get("resourceAttributes")),
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )
            .into_response();
    }
    let (allowed, reason) = review(&st, &user, &spec);
    r.answer(status(allowed, reason)).await
}

/// May I do this? (`kubectl auth can-i`)
async fn self_subject_access_review(
    State(st): State<SharedState>,
    Extension(user): Extension<User>,
    req: Request,
) -> Response {
    let r = match Incoming::read(req, Kind::SelfSubjectAccessReview).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    let (allowed, reason) = review(&st, &user, &r.spec());
    r.answer(status(allowed, reason)).await
}

/// May this user do this in this namespace? (`kubectl auth can-i` through a namespace admin's
/// eyes; granted by `admin`.)
async fn local_subject_access_review(
    State(st): State<SharedState>,
    Path(namespace): Path<String>,
    req: Request,
) -> Response {
    let mut r = match Incoming::read(req, Kind::LocalSubjectAccessReview).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    let obj = &mut r.obj;
    let meta_ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if meta_ns.is_empty() {
        obj["metadata"]["namespace"] = json!(namespace);
    } else if meta_ns != namespace {
        return ApiError(nodus_k8s::status::bad_request(&format!(
            "spec.resourceAttributes.namespace must match namespace: {namespace}"
        )))
        .into_response();
    }
    let spec_ns = obj
        .pointer("/spec/resourceAttributes/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    if obj
        .pointer("/spec/resourceAttributes")
        .is_some_and(Value::is_object)
    {
        if !spec_ns.is_empty() && spec_ns != namespace {
            return r
                .kind
                .invalid(
                    "spec.resourceAttributes.namespace",
                    json!(spec_ns),
                    "must match metadata.namespace",
                )
                .into_response();
        }
        obj["spec"]["resourceAttributes"]["namespace"] = json!(namespace);
    }
    let spec = r.spec();
    let user = match user_of_spec(r.kind, &spec) {
        Ok(u) => u,
        Err(e) => return e.into_response(),
    };
    let (allowed, reason) = review(&st, &user, &spec);
    r.answer(status(allowed, reason)).await
}

/// The user a (Local)SubjectAccessReview asks about; a 422 when it names none.
fn user_of_spec(kind: Kind, spec: &Value) -> Result<User, ApiError> {
    let name = spec.get("user").and_then(Value::as_str).unwrap_or("");
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|g| g.as_str().map(str::to_string))
        .collect();
    if name.is_empty() && groups.is_empty() {
        return Err(kind.invalid(
            "spec.user,spec.groups",
            json!(""),
            "at least one of user or group must be specified",
        ));
    }
    Ok(User {
        name: name.to_string(),
        groups,
        ..Default::default()
    })
}

/// What may I do in this namespace? (`kubectl auth can-i --list`): the RBAC rules bound to
/// the caller there, as upstream's rule resolver lists them.
async fn self_subject_rules_review(
    State(st): State<SharedState>,
    Extension(user): Extension<User>,
    req: Request,
) -> Response {
    let r = match Incoming::read(req, Kind::SelfSubjectRulesReview).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    let ns = r
        .obj
        .pointer("/spec/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let index = st.authz.rbac().index();
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for rule_of in index.rules_for(&user, &ns) {
        if rule_of.non_resource_urls.is_empty() {
            let mut rule = json!({"verbs": rule_of.verbs, "apiGroups": rule_of.api_groups,
                "resources": rule_of.resources});
            if !rule_of.resource_names.is_empty() {
                rule["resourceNames"] = json!(rule_of.resource_names);
            }
            resource_rules.push(rule);
        } else {
            non_resource_rules.push(json!({"verbs": rule_of.verbs,
                "nonResourceURLs": rule_of.non_resource_urls}));
        }
    }
    r.answer(json!({
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": false,
    }))
    .await
}

/// Who am I? (`kubectl auth whoami`)
async fn self_subject_review(Extension(user): Extension<User>, req: Request) -> Response {
    let r = match Incoming::read(req, Kind::SelfSubjectReview).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    r.answer(json!({"userInfo": {"username": user.name, "groups": user.groups}}))
        .await
}
