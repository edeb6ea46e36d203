//! `serviceaccounts/<name>/token` (authentication.k8s.io/v1 TokenRequest): issues a
//! service-account token for the requested audiences and lifetime, optionally bound to a
//! Pod or Secret, as upstream's TokenREST. Nothing is stored; the answer is the request
//! with `status.token` and `status.expirationTimestamp`.

use axum::response::Response;
use nodus_k8s::status;
use nodus_k8s::validation::FieldError;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, Req, json_response, now_ts};
use crate::apiserver::authn::serviceaccount::{Bound, ObjectRef, TokenSpec, new_claims};

/// Upstream's default `spec.expirationSeconds`.
const DEFAULT_EXPIRATION_SECS: i64 = 3600;
const MIN_EXPIRATION_SECS: i64 = 600;
const MAX_EXPIRATION_SECS: i64 = 1 << 32;

/// The kind of object a token may be bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BoundKind {
    Pod,
    Secret,
    /// upstream's ServiceAccountTokenNodeBinding (GA in 1.33).
    Node,
}

impl BoundKind {
    fn parse(api_version: &str, kind: &str) -> Option<BoundKind> {
        let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        match (group, kind) {
            ("", "Pod") => Some(BoundKind::Pod),
            ("", "Secret") => Some(BoundKind::Secret),
            ("", "Node") => Some(BoundKind::Node),
            _ => None,
        }
    }
    fn plural(self) -> &'static str {
        match self {
            BoundKind::Pod => "pods",
            BoundKind::Secret => "secrets",
            BoundKind::Node => "nodes",
        }
    }
}

fn invalid(errs: &[FieldError]) -> ApiError {
    ApiError(status::invalid(
        "TokenRequest.authentication.k8s.io",
        "",
        errs,
    ))
}

fn get(req: &Req, plural: &str, ns: Option<&str>, name: &str) -> ApiResult<Option<Value>> {
    let key = match ns {
        Some(ns) => format!("/core/{plural}/{ns}/{name}"),
        None => format!("/core/{plural}/{name}"),
    };
    req.st
        .store
        .get(&key)
        .map(|o| o.map(|s| (*s.object).clone()))
        .map_err(crate::apiserver::rest::storage_failure)
}

pub fn create(req: &Req) -> ApiResult<Response> {
    let ns = req.ns().unwrap_or("default").to_string();
    let name = req.target.name.clone().unwrap_or_default();
    let mut tr = req.json_body()?;
    let sa = get(req, "serviceaccounts", Some(&ns), &name)?
        .ok_or_else(|| ApiError(status::not_found("", "serviceaccounts", &name)))?;
    let cfg = &req.st.config;
    let audiences: Vec<String> = tr
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .filter(|a: &Vec<String>| !a.is_empty())
        .unwrap_or_else(|| cfg.api_audiences.clone());
    let expiration = match tr.pointer("/spec/expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECS,
        Some(v) => v.as_i64().ok_or_else(|| {
            invalid(&[FieldError::invalid(
                "spec.expirationSeconds",
                v.clone(),
                "must be an integer",
            )])
        })?,
    };
    if expiration < MIN_EXPIRATION_SECS {
        return Err(invalid(&[FieldError::invalid(
            "spec.expirationSeconds",
            json!(expiration),
            "may not specify a duration less than 10 minutes",
        )]));
    }
    if expiration > MAX_EXPIRATION_SECS {
        return Err(invalid(&[FieldError::invalid(
            "spec.expirationSeconds",
            json!(expiration),
            "may not specify a duration larger than 2^32 seconds",
        )]));
    }
    let (bound, node) = match tr.pointer("/spec/boundObjectRef").filter(|r| r.is_object()) {
        Some(r) => bind(req, &ns, &name, r)?,
        None => (None, None),
    };
    let now = now_ts().as_second();
    let kube_audiences = audiences.iter().all(|a| cfg.api_audiences.contains(a));
    let spec = TokenSpec {
        audiences: audiences.clone(),
        expiration_seconds: expiration,
        kube_audiences,
    };
    let claims = new_claims(
        &cfg.service_account_issuer,
        spec,
        &sa,
        bound.as_ref(),
        node,
        now,
    );
    let token = req.st.sa_keys.sign(&claims.to_json());
    let expires = k8s_openapi::jiff::Timestamp::from_second(now + expiration)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    tr["apiVersion"] = json!("authentication.k8s.io/v1");
    tr["kind"] = json!("TokenRequest");
    let meta = super::meta_mut(&mut tr);
    meta.insert("name".into(), json!(name));
    meta.insert("namespace".into(), json!(ns));
    meta.insert("creationTimestamp".into(), json!(super::now_rfc3339()));
    tr["spec"]["audiences"] = json!(audiences);
    tr["spec"]["expirationSeconds"] = json!(expiration);
    tr["status"] = json!({"token": token, "expirationTimestamp": expires});
    Ok(json_response(201, &tr, &[]))
}

/// The object `r` names, checked as upstream does (it exists, a pod runs as this service
/// account, the uid matches when given), and the node of a bound pod. A Node is
/// cluster-scoped: the token's namespace does not apply to it.
fn bind(
    req: &Req,
    ns: &str,
    sa_name: &str,
    r: &Value,
) -> ApiResult<(Option<Bound>, Option<ObjectRef>)> {
    let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
    let (api_version, kind, name, uid) = (s("apiVersion"), s("kind"), s("name"), s("uid"));
    let Some(bk) = BoundKind::parse(api_version, kind) else {
        let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        let version = api_version.rsplit('/').next().unwrap_or("");
        return Err(ApiError(status::bad_request(&format!(
            "cannot bind token to object of type {group}/{version}, Kind={kind}"
        ))));
    };
    let scope = (bk != BoundKind::Node).then_some(ns);
    let obj = get(req, bk.plural(), scope, name)?
        .ok_or_else(|| ApiError(status::not_found("", bk.plural(), name)))?;
    let obj_uid = obj
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut node = None;
    if bk == BoundKind::Pod {
        let pod_sa = obj
            .pointer("/spec/serviceAccountName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if pod_sa != sa_name {
            return Err(ApiError(status::bad_request(&format!(
                "cannot bind token for serviceaccount {} to pod running with different serviceaccount name.",
                status::go_quote(sa_name)
            ))));
        }
        let node_name = obj
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !node_name.is_empty() {
            // A missing node still names the node, without a uid, as upstream.
            let uid = get(req, "nodes", None, node_name)?
                .and_then(|n| {
                    n.pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })
                .unwrap_or_default();
            node = Some(ObjectRef {
                name: node_name.to_string(),
                uid,
            });
        }
    }
    if !uid.is_empty() && uid != obj_uid {
        return Err(ApiError(status::conflict_with(
            "",
            kind,
            name,
            &format!(
                "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        )));
    }
    let bound = match bk {
        BoundKind::Pod => Bound::Pod(obj),
        BoundKind::Secret => Bound::Secret(obj),
        BoundKind::Node => Bound::Node(obj),
    };
    Ok((Some(bound), node))
}
