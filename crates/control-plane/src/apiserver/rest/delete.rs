//! DELETE of objects and collections: preconditions, graceful deletion of pods bound to a
//! node, finalizers, and the propagation policy the garbage collector acts on.

use axum::response::Response;
use nodus_k8s::status;
use serde_json::{Value, json};

use super::list::Filter;
use super::{ApiError, ApiResult, Req, json_response, meta_str, output};
use crate::apiserver::rest::path::Target;
use crate::apiserver::state::ApiState;
use crate::storage::{Mutation, StoreError};

/// metav1.DeleteOptions, from the body or the query.
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub grace_period: Option<i64>,
    pub propagation: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry_run: bool,
}

impl DeleteOptions {
    /// The options as a client sends them in a DELETE's body.
    pub fn to_json(&self) -> Value {
        let mut o = json!({"kind": "DeleteOptions", "apiVersion": "v1"});
        if let Some(g) = self.grace_period {
            o["gracePeriodSeconds"] = json!(g);
        }
        if let Some(p) = &self.propagation {
            o["propagationPolicy"] = json!(p);
        }
        if let Some(u) = &self.uid {
            o["preconditions"]["uid"] = json!(u);
        }
        if let Some(rv) = &self.resource_version {
            o["preconditions"]["resourceVersion"] = json!(rv);
        }
        if self.dry_run {
            o["dryRun"] = json!(["All"]);
        }
        o
    }

    pub fn from_req(req: &Req) -> ApiResult<DeleteOptions> {
        let mut o = DeleteOptions::default();
        if !req.body.is_empty() {
            let b: Value = serde_json::from_slice(&req.body).map_err(|e| {
                ApiError(status::bad_request(&format!(
                    "error decoding DeleteOptions: {e}"
                )))
            })?;
            o.grace_period = b.get("gracePeriodSeconds").and_then(Value::as_i64);
            o.propagation = b
                .get("propagationPolicy")
                .and_then(Value::as_str)
                .map(str::to_string);
            if b.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
                o.propagation = Some("Orphan".into());
            }
            o.uid = b
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(str::to_string);
            o.resource_version = b
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string);
            o.dry_run = b
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v == "All"));
        }
        if let Some(g) = req.q("gracePeriodSeconds") {
            o.grace_period = Some(g.parse().map_err(|_| {
                ApiError(status::bad_request(&format!(
                    "invalid gracePeriodSeconds {g:?}"
                )))
            })?);
        }
        if let Some(p) = req.q("propagationPolicy") {
            o.propagation = Some(p.to_string());
        }
        if req.q_bool("orphanDependents") {
            o.propagation = Some("Orphan".into());
        }
        o.dry_run |= req.dry_run();
        if let Some(p) = &o.propagation
            && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
        {
            return Err(ApiError(status::invalid(
                "DeleteOptions",
                "",
                &[nodus_k8s::validation::FieldError::not_supported(
                    "propagationPolicy",
                    json!(p),
                    &["Foreground", "Background", "Orphan"],
                )],
            )));
        }
        Ok(o)
    }
}

fn pod_grace(obj: &Value, requested: Option<i64>) -> i64 {
    let bound = obj
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let phase = obj
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !bound || phase == "Succeeded" || phase == "Failed" {
        return 0;
    }
    let grace = requested
        .or_else(|| {
            obj.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(30);
    // Upstream turns a requested 0 into 1 unless forced; kubectl --force sends 0 with
    // --grace-period=0, which means "now".
    grace.max(0)
}

fn add_finalizer(obj: &mut Value, f: &str) {
    let m = super::meta_mut(obj);
    let list = m.entry("finalizers").or_insert_with(|| json!([]));
    if let Some(a) = list.as_array_mut()
        && !a.iter().any(|x| x == f)
    {
        a.push(json!(f));
    }
}

/// Deletes (or starts deleting) one object. Returns the object as last seen.
pub fn delete_object(
    st: &ApiState,
    t: &Target,
    name: &str,
    opts: &DeleteOptions,
) -> ApiResult<Value> {
    if let Some(api) = st.store.remote() {
        return api
            .delete_object(t.info, t.namespace.as_deref(), name, opts.to_json())
            .map_err(|e| super::store_error(t, name, e));
    }
    let key = t.key_for(name);
    let mut failure: Option<ApiError> = None;
    let mut dry: Option<Value> = None;
    let out = st.store.mutate(&key, &mut |cur| {
        let Some(cur) = cur else {
            failure = Some(ApiError(status::not_found(t.info.group, t.info.plural, name)));
            return Err(StoreError::NotFound(key.clone()));
        };
        let obj = &*cur.object;
        let conflict = |cause: String| ApiError(status::conflict_with(t.info.group, t.info.plural, name, &cause));
        if let Some(uid) = &opts.uid {
            let have = meta_str(obj, "uid").unwrap_or("");
            if uid != have {
                failure = Some(conflict(format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                )));
                return Err(StoreError::Backend("aborted".into()));
            }
        }
        if let Some(rv) = &opts.resource_version {
            let have = meta_str(obj, "resourceVersion").unwrap_or("");
            if rv != have {
                failure = Some(conflict(format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}"
                )));
                return Err(StoreError::Backend("aborted".into()));
            }
        }
        let grace = if t.info.kind == "Pod" { pod_grace(obj, opts.grace_period) } else { 0 };
        let mut new = obj.clone();
        match opts.propagation.as_deref() {
            Some("Orphan") => add_finalizer(&mut new, "orphan"),
            Some("Foreground") => add_finalizer(&mut new, "foregroundDeletion"),
            _ => {}
        }
        let existing = obj.pointer("/metadata/deletionTimestamp").is_some();
        if crate::apiserver::crd::is_crd(t) && !existing {
            // Upstream's CRD storage: the CRD stays until its objects are deleted.
            add_finalizer(&mut new, crate::apiserver::crd::CLEANUP_FINALIZER);
        }
        if t.info.kind == "Namespace" {
            // The namespace controller empties it, then drops the `kubernetes` finalizer.
            new["status"]["phase"] = json!("Terminating");
        }
        let has_finalizers = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
            || (t.info.kind == "Namespace"
                && new.pointer("/spec/finalizers").and_then(Value::as_array).is_some_and(|a| !a.is_empty()));
        let existing_grace = obj.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64);
        if grace == 0 && !has_finalizers {
            if opts.dry_run {
                dry = Some(obj.clone());
                return Ok(Mutation::Keep);
            }
            return Ok(Mutation::Delete);
        }
        if existing && existing_grace.is_some_and(|g| g <= grace) && new == *obj {
            return Ok(Mutation::Keep);
        }
        let when = super::now_ts()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(grace))
            .unwrap_or_else(|_| super::now_ts());
        let m = super::meta_mut(&mut new);
        if !existing || existing_grace.is_some_and(|g| grace < g) {
            m.insert("deletionTimestamp".into(), json!(when.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()));
            m.insert("deletionGracePeriodSeconds".into(), json!(grace));
        }
        if opts.dry_run {
            dry = Some(new);
            return Ok(Mutation::Keep);
        }
        Ok(Mutation::Put(new))
    });
    if let Some(f) = failure {
        return Err(f);
    }
    let out = out.map_err(|e| super::store_error(t, name, e))?;
    if let Some(d) = dry {
        return Ok(d);
    }
    match (out.deleted, out.stored) {
        (Some(d), _) => Ok((*d.object).clone()),
        (None, Some(s)) => Ok((*s.object).clone()),
        (None, None) => Err(ApiError(status::not_found(
            t.info.group,
            t.info.plural,
            name,
        ))),
    }
}

pub async fn delete(req: &Req) -> ApiResult<Response> {
    let name = req.target.name.clone().unwrap_or_default();
    let opts = DeleteOptions::from_req(req)?;
    let obj = delete_object(&req.st, &req.target, &name, &opts)?;
    Ok(json_response(200, &output::object(req, &obj), &[]))
}

pub async fn delete_collection(req: &Req) -> ApiResult<Response> {
    let filter = Filter::from_req(req)?;
    let opts = DeleteOptions::from_req(req)?;
    let (items, rev) = req
        .st
        .store
        .list(&req.target.prefix())
        .map_err(|e| super::store_error(&req.target, "", e))?;
    let mut deleted = Vec::new();
    for s in items.iter().filter(|s| filter.matches(&s.object)) {
        let Some(name) = meta_str(&s.object, "name") else {
            continue;
        };
        let mut t = req.target.clone();
        t.namespace = meta_str(&s.object, "namespace")
            .map(str::to_string)
            .or(t.namespace);
        match delete_object(&req.st, &t, name, &opts) {
            Ok(o) => deleted.push(o),
            Err(e) if status::code(&e.0) == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(json_response(
        200,
        &output::list(req, deleted, json!({"resourceVersion": rev.to_string()})),
        &[],
    ))
}
