//! Subresources: status, namespaces/finalize, pods/binding (and the `bindings` resource),
//! pods/eviction with PodDisruptionBudgets, pods/ephemeralcontainers, scale, and the
//! kubelet-proxied streams.

use axum::http::Method;
use axum::response::Response;
use nodus_k8s::status;
use serde_json::{Value, json};

use super::delete::{DeleteOptions, delete_object};
use super::list::labels_of;
use super::update::{Part, apply_patch, patch_part, put_part, write};
use super::{ApiError, ApiResult, Req, json_response, meta_str, now_ts};
use crate::apiserver::rest::path::{self, Target};
use crate::apiserver::state::ApiState;
use crate::controllers::controller_utils::pod_ready;
use crate::controllers::disruption;
use crate::storage::{Mutation, StoreError};

pub async fn handle(req: Req, method: &Method, verb: &str, sub: &str) -> ApiResult<Response> {
    let info = req.target.info;
    let not_allowed = || {
        ApiError(status::method_not_allowed(
            info.group,
            &format!("{}/{sub}", info.plural),
            method.as_str(),
        ))
    };
    match (sub, verb) {
        ("status" | "approval", "get") => super::list::get(&req),
        ("ephemeralcontainers", _) if info.plural != "pods" => Err(not_allowed()),
        ("ephemeralcontainers", "get") => super::list::get(&req),
        ("ephemeralcontainers", "update") => put_part(&req, Part::EphemeralContainers).await,
        ("ephemeralcontainers", "patch") => patch_part(&req, Part::EphemeralContainers).await,
        ("approval", "update") => put_part(&req, Part::Approval).await,
        ("approval", "patch") => patch_part(&req, Part::Approval).await,
        ("status", "update") => put_part(&req, Part::Status).await,
        ("status", "patch") => patch_part(&req, Part::Status).await,
        ("finalize", "update") => finalize(&req),
        ("binding", "create") => {
            let body = req.json_body()?;
            let pod = req.target.name.clone().unwrap_or_default();
            bind(&req, &pod, &body)
        }
        ("eviction", "create") => evict(&req),
        ("token", "create") if info.plural == "serviceaccounts" => {
            super::tokenrequest::create(&req)
        }
        ("scale", "get" | "update" | "patch") => scale(&req, verb),
        ("log" | "exec" | "attach" | "portforward" | "proxy", _) => {
            super::proxy::handle(req, method, sub).await
        }
        _ => Err(not_allowed()),
    }
}

/// PUT namespaces/<ns>/finalize: replaces spec.finalizers; an emptied, terminating
/// namespace is then deleted.
fn finalize(req: &Req) -> ApiResult<Response> {
    let name = req.target.name.clone().unwrap_or_default();
    let body = req.json_body()?;
    let fins = body
        .pointer("/spec/finalizers")
        .cloned()
        .unwrap_or(json!([]));
    let key = req.target.key_for(&name);
    let t = &req.target;
    let out = req.st.store.mutate(&key, &mut |cur| {
        let Some(cur) = cur else {
            return Err(StoreError::NotFound(key.clone()));
        };
        let mut new = (*cur.object).clone();
        new["spec"]["finalizers"] = fins.clone();
        let empty = fins.as_array().is_none_or(|a| a.is_empty());
        let meta_fins_empty = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|a| a.is_empty());
        if empty && meta_fins_empty && new.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(Mutation::Delete);
        }
        Ok(Mutation::Put(new))
    });
    let out = out.map_err(|e| super::store_error(t, &name, e))?;
    let obj = out
        .stored
        .or(out.deleted)
        .map(|s| (*s.object).clone())
        .unwrap_or(Value::Null);
    Ok(json_response(200, &obj, &[]))
}

/// Sets spec.nodeName of an unbound pod (the scheduler's Binding).
pub fn bind(req: &Req, pod: &str, binding: &Value) -> ApiResult<Response> {
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError(status::invalid(
                "Binding",
                pod,
                &[nodus_k8s::validation::FieldError::required(
                    "target.name",
                    "",
                )],
            ))
        })?
        .to_string();
    let annotations = binding
        .pointer("/metadata/annotations")
        .and_then(Value::as_object);
    bind_pod(
        &req.st,
        req.target.namespace.as_deref().unwrap_or("default"),
        pod,
        &node,
        annotations,
        req.dry_run(),
    )?;
    Ok(json_response(
        201,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        &[],
    ))
}

/// What a Binding makes of the pod `cur`: the pod bound to `node` with `PodScheduled=True`,
/// or upstream's refusal (not found, being deleted, already assigned).
pub fn bound_pod(
    cur: Option<&crate::storage::Stored>,
    pod: &str,
    node: &str,
    annotations: Option<&serde_json::Map<String, Value>>,
) -> ApiResult<Value> {
    let Some(cur) = cur else {
        return Err(ApiError(status::not_found("", "pods", pod)));
    };
    if cur.object.pointer("/metadata/deletionTimestamp").is_some() {
        return Err(ApiError(status::conflict_with(
            "",
            "pods/binding",
            pod,
            &format!("pod {pod} is being deleted, cannot be assigned to a host"),
        )));
    }
    if let Some(existing) = cur
        .object
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        return Err(ApiError(status::conflict_with(
            "",
            "pods/binding",
            pod,
            &format!(
                "pod {pod} is already assigned to node {}",
                status::go_quote(existing)
            ),
        )));
    }
    let mut new = (*cur.object).clone();
    new["spec"]["nodeName"] = json!(node);
    if let Some(ann) = annotations {
        let m = super::meta_mut(&mut new);
        let a = m.entry("annotations").or_insert_with(|| json!({}));
        for (k, v) in ann {
            a[k] = v.clone();
        }
    }
    let now = super::now_rfc3339();
    let conds = new["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut conds: Vec<Value> = conds
        .into_iter()
        .filter(|c| c["type"] != "PodScheduled")
        .collect();
    conds.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now}));
    new["status"]["conditions"] = json!(conds);
    Ok(new)
}

/// Assigns an unbound pod to `node` (the Binding's effect, shared by the REST subresource
/// and the in-process scheduler): fails with upstream's Conflict when the pod is already
/// assigned or being deleted.
pub fn bind_pod(
    st: &ApiState,
    ns: &str,
    pod: &str,
    node: &str,
    annotations: Option<&serde_json::Map<String, Value>>,
    dry: bool,
) -> ApiResult<()> {
    let pods = nodus_k8s::catalog::by_plural("", "v1", "pods")
        .ok_or_else(|| ApiError(status::internal("pods are not in the catalogue")))?;
    let t = Target {
        info: pods,
        namespace: Some(ns.to_string()),
        name: Some(pod.to_string()),
        sub: None,
        watch_path: false,
        rest: Vec::new(),
    };
    let key = t.key_for(pod);
    let mut failure = None;
    let out = st.store.mutate(
        &key,
        &mut |cur| match bound_pod(cur, pod, node, annotations) {
            Ok(_) if dry => Ok(Mutation::Keep),
            Ok(new) => Ok(Mutation::Put(new)),
            Err(e) => {
                failure = Some(e);
                Err(StoreError::Backend("aborted".into()))
            }
        },
    );
    if let Some(f) = failure {
        return Err(f);
    }
    out.map_err(|e| super::store_error(&t, pod, e))?;
    Ok(())
}

/// POST pods/<name>/eviction (upstream's EvictionREST): a pod that is finished, Pending or
/// already terminating goes without a budget check; otherwise the one PodDisruptionBudget
/// matching it must allow a disruption, which is spent and the pod recorded in its
/// `disruptedPods` ([`disruption::check_and_decrement`]), unless the pod is not Ready and
/// the budget's `unhealthyPodEvictionPolicy` lets it go (then it is deleted only if it is
/// still the version that was judged).
fn evict(req: &Req) -> ApiResult<Response> {
    let pod_name = req.target.name.clone().unwrap_or_default();
    let eviction = req.json_body()?;
    let ns = req.ns().unwrap_or("default").to_string();
    let mut pod_t = req.target.clone();
    pod_t.sub = None;
    let pod = req
        .st
        .store
        .get(&pod_t.key_for(&pod_name))
        .map_err(|e| super::store_error(&pod_t, &pod_name, e))?
        .ok_or_else(|| ApiError(status::not_found("", "pods", &pod_name)))?;
    let labels = labels_of(&pod.object);
    let phase = pod
        .object
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    // upstream's canIgnorePDB.
    let ignore_budget = matches!(phase, "Succeeded" | "Failed" | "Pending")
        || pod.object.pointer("/metadata/deletionTimestamp").is_some();
    let mut only_this_version = false;
    if let (false, Some(pdbs)) = (
        ignore_budget,
        nodus_k8s::catalog::by_plural("policy", "v1", "poddisruptionbudgets"),
    ) {
        let (items, _) = req
            .st
            .store
            .list(&path::prefix(pdbs, Some(&ns)))
            .map_err(crate::apiserver::rest::storage_failure)?;
        let matching: Vec<_> = items
            .iter()
            .filter(|p| selector_matches(p.object.pointer("/spec/selector"), &labels))
            .collect();
        if matching.len() > 1 {
            return Err(ApiError(status::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            )));
        }
        if let Some(pdb) = matching.first() {
            if !pod_ready(&pod.object) && disruption::unhealthy_pod_may_go(&pdb.object) {
                only_this_version = true;
            } else {
                let mut t = pod_t.clone();
                t.info = pdbs;
                let key = t.key_for(meta_str(&pdb.object, "name").unwrap_or(""));
                let mut refused: Option<Value> = None;
                let dry_run = req.dry_run();
                req.st
                    .store
                    .mutate(&key, &mut |cur| {
                        // Judged on the budget as stored now, so two evictions never
                        // spend the same disruption.
                        let Some(cur) = cur else {
                            return Ok(Mutation::Keep);
                        };
                        let mut new = (*cur.object).clone();
                        match disruption::check_and_decrement(&mut new, &pod_name, now_ts()) {
                            Err(s) => {
                                refused = Some(s);
                                Ok(Mutation::Keep)
                            }
                            Ok(()) if dry_run => Ok(Mutation::Keep),
                            Ok(()) => Ok(Mutation::Put(new)),
                        }
                    })
                    .map_err(crate::apiserver::rest::storage_failure)?;
                if let Some(s) = refused {
                    return Err(ApiError(s));
                }
            }
        }
    }
    let mut opts = DeleteOptions {
        dry_run: req.dry_run(),
        ..Default::default()
    };
    if let Some(d) = eviction.get("deleteOptions") {
        opts.grace_period = d.get("gracePeriodSeconds").and_then(Value::as_i64);
        opts.uid = d
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        opts.resource_version = d
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if only_this_version && opts.resource_version.is_none() {
        opts.resource_version = meta_str(&pod.object, "resourceVersion").map(str::to_string);
    }
    delete_object(&req.st, &pod_t, &pod_name, &opts)?;
    Ok(json_response(
        201,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        &[],
    ))
}

/// metav1.LabelSelector matching (matchLabels and matchExpressions).
pub fn selector_matches(
    sel: Option<&Value>,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let Some(sel) = sel else { return false };
    let Ok(ls) = serde_json::from_value::<
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    >(sel.clone()) else {
        return false;
    };
    match nodus_k8s::selector::from_metav1(&ls) {
        Ok(s) => s.matches(labels),
        Err(_) => false,
    }
}

fn scale_of(obj: &Value) -> Value {
    let meta = obj.get("metadata").cloned().unwrap_or(json!({}));
    // A ReplicationController's selector is the label map itself.
    let labels_at = if obj.get("kind").and_then(Value::as_str) == Some("ReplicationController") {
        "/spec/selector"
    } else {
        "/spec/selector/matchLabels"
    };
    let selector = obj
        .pointer(labels_at)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                     "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"]},
        "spec": {"replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(1))},
        "status": {"replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)), "selector": selector},
    })
}

fn scale(req: &Req, verb: &str) -> ApiResult<Response> {
    let name = req.target.name.clone().unwrap_or_default();
    let mut t = req.target.clone();
    t.sub = None;
    // A custom resource's scale lives wherever its CRD's scale subresource points.
    let custom = crate::apiserver::crd::scale_paths(&t);
    let scale_of = |o: &Value| match &custom {
        Some(p) => crate::apiserver::crd::scale_of(p, o),
        None => scale_of(o),
    };
    if verb == "get" {
        let s = req
            .st
            .store
            .get(&t.key_for(&name))
            .map_err(|e| super::store_error(&t, &name, e))?
            .ok_or_else(|| ApiError(status::not_found(t.info.group, t.info.plural, &name)))?;
        return Ok(json_response(200, &scale_of(&s.object), &[]));
    }
    let body: Value = serde_json::from_slice(&req.body)
        .map_err(|e| ApiError(status::bad_request(&format!("error decoding Scale: {e}"))))?;
    let ct = req
        .headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let scale_gvk = nodus_k8s::Gvk::new("autoscaling", "v1", "Scale");
    let inner = Req {
        st: req.st.clone(),
        user: req.user.clone(),
        target: t,
        query: req.query.clone(),
        headers: req.headers.clone(),
        body: req.body.clone(),
        upgrade: None,
        raw_query: req.raw_query.clone(),
    };
    let (obj, _) = write(&inner, &name, Part::Main, None, &mut |cur| {
        let current_scale = scale_of(cur);
        let new_scale = if verb == "patch" {
            let ct = if ct.starts_with("application/strategic-merge-patch+json") {
                "application/merge-patch+json"
            } else {
                ct.as_str()
            };
            apply_patch(ct, &scale_gvk, &current_scale, &body)?
        } else {
            body.clone()
        };
        let replicas = new_scale
            .pointer("/spec/replicas")
            .cloned()
            .unwrap_or(json!(0));
        let mut new = cur.clone();
        match &custom {
            Some(p) => nodus_k8s::structural::set_value_at(&mut new, &p.spec_replicas, replicas),
            None => new["spec"]["replicas"] = replicas,
        }
        let expected = match meta_str(&new_scale, "resourceVersion").filter(|s| !s.is_empty()) {
            Some(rv) if verb == "update" => rv.parse().ok(),
            _ => None,
        };
        Ok((new, expected))
    })?;
    Ok(json_response(200, &scale_of(&obj), &[]))
}
