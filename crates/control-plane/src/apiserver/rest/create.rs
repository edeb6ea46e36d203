//! POST: create an object (generateName, uid, timestamps, admission, validation, dry run).

use axum::response::Response;
use nodus_k8s::{Gvk, status};
use serde_json::{Value, json};

use super::{
    ApiError, ApiResult, Req, json_response, meta_mut, meta_str, new_uid, now_rfc3339, output,
    store_error,
};
use crate::apiserver::admission;
use crate::apiserver::rest::path::Target;
use crate::apiserver::state::ApiState;

/// Checks `apiVersion`/`kind` against the URL and fills them when absent.
pub fn check_type(t: &Target, obj: &mut Value) -> ApiResult<()> {
    let gvk = t.gvk();
    let want_av = gvk.api_version();
    let av = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !av.is_empty() && av != want_av {
        return Err(ApiError(status::bad_request(&format!(
            "the API version in the data ({av}) does not match the expected API version ({want_av})"
        ))));
    }
    if !kind.is_empty() && kind != gvk.kind {
        return Err(ApiError(status::bad_request(&format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            gvk.kind
        ))));
    }
    obj["apiVersion"] = json!(want_av);
    obj["kind"] = json!(gvk.kind);
    Ok(())
}

/// Applies `fieldValidation` (Strict is what kubectl sends by default): unknown fields are
/// a 400 in Strict mode and warnings in Warn mode. Returns the warnings.
pub fn field_validation(req: &Req, gvk: &Gvk, obj: &Value) -> ApiResult<Vec<String>> {
    let mode = req.q("fieldValidation").unwrap_or("Warn");
    if mode == "Ignore" {
        return Ok(Vec::new());
    }
    let unknown = if req.target.info.custom {
        crate::apiserver::crd::unknown_fields(&req.target, obj)
    } else {
        nodus_k8s::strict::unknown_fields(gvk, obj)
    };
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    let msgs: Vec<String> = unknown
        .iter()
        .map(|f| {
            format!(
                "unknown field {}",
                status::go_quote(f.trim_start_matches('.'))
            )
        })
        .collect();
    if mode == "Strict" {
        let ct = req
            .headers
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // A whole object in the body fails in the decoder, which names the type; a patch
        // fails after merging, with the bare strict-decoding text.
        let prefix = if ct.contains("patch") {
            String::new()
        } else {
            format!(
                "{kind} in version {v} cannot be handled as a {kind}: ",
                kind = gvk.kind,
                v = status::go_quote(&gvk.version)
            )
        };
        return Err(ApiError(status::bad_request(&format!(
            "{prefix}strict decoding error: {}",
            msgs.join(", ")
        ))));
    }
    Ok(msgs)
}

/// Runs validation; a non-empty result is a 422 Invalid.
pub fn validate(t: &Target, obj: &Value, old: Option<&Value>) -> ApiResult<()> {
    let gvk = t.gvk();
    let mut errs = nodus_k8s::validation::validate_object(&gvk, obj, old);
    errs.extend(crate::apiserver::crd::validate(t, obj));
    if errs.is_empty() {
        return Ok(());
    }
    let name = meta_str(obj, "name").unwrap_or("");
    Err(ApiError(status::invalid(&gvk.kind, name, &errs)))
}

/// The namespace must exist and not be terminating.
pub fn check_namespace(st: &ApiState, ns: &str) -> ApiResult<()> {
    let ns_obj = st
        .listers
        .namespaces
        .get(&format!("/core/namespaces/{ns}"))
        .map_err(crate::apiserver::rest::storage_failure)?;
    match ns_obj {
        None => Err(ApiError(status::not_found("", "namespaces", ns))),
        Some(n) if n.object.pointer("/metadata/deletionTimestamp").is_some() => {
            Err(ApiError(status::forbidden_with(
                "",
                "",
                "",
                &format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
            )))
        }
        Some(_) => Ok(()),
    }
}

/// Fills in what the server owns on create.
pub fn prepare_for_create(t: &Target, obj: &mut Value) {
    let kind = t.info.kind;
    let has_status_sub = t.info.subresources.contains(&"status");
    let now = now_rfc3339();
    let m = meta_mut(obj);
    m.insert("uid".into(), json!(new_uid()));
    m.insert("creationTimestamp".into(), json!(now));
    for k in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "selfLink",
    ] {
        m.remove(k);
    }
    if obj.get("spec").is_some() {
        meta_mut(obj).insert("generation".into(), json!(1));
    }
    if has_status_sub
        && kind != "Node"
        && let Some(o) = obj.as_object_mut()
    {
        o.remove("status");
    }
    match kind {
        "Pod" => {
            let qos = obj
                .get("spec")
                .cloned()
                .and_then(|s| serde_json::from_value::<k8s_openapi::api::core::v1::PodSpec>(s).ok())
                .map(|s| nodus_k8s::qos::pod_qos_class(&s).as_str().to_string());
            let mut st = json!({"phase": "Pending"});
            if let Some(q) = qos {
                st["qosClass"] = json!(q);
            }
            obj["status"] = st;
        }
        "DaemonSet" => super::update::template_generation(obj, None),
        "Namespace" => {
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
        }
        "Job" if t.info.group == "batch" => nodus_k8s::defaults::generate_job_selector(obj),
        _ => {}
    }
}

pub async fn create(req: &Req) -> ApiResult<Response> {
    let obj = req.json_body()?;
    create_object(req, obj, true).await
}

/// Creates `obj`; `track` records the write as an Update in its managed fields (an apply
/// that creates has recorded itself already).
pub async fn create_object(req: &Req, mut obj: Value, track: bool) -> ApiResult<Response> {
    let t = &req.target;
    check_type(t, &mut obj)?;
    let gvk = t.gvk();
    let warnings = field_validation(req, &gvk, &obj)?;
    if t.info.namespaced {
        let url_ns = req.ns().unwrap_or("");
        match meta_str(&obj, "namespace") {
            Some(ns) if !ns.is_empty() && ns != url_ns => {
                return Err(ApiError(status::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                )));
            }
            _ => {}
        }
        if url_ns.is_empty() {
            return Err(ApiError(status::bad_request(
                "the server could not find the requested resource",
            )));
        }
        meta_mut(&mut obj).insert("namespace".into(), json!(url_ns));
    } else {
        meta_mut(&mut obj).remove("namespace");
    }
    let name = match meta_str(&obj, "name").filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => match meta_str(&obj, "generateName").filter(|n| !n.is_empty()) {
            Some(g) => {
                let n = format!("{g}{}", super::generate_suffix());
                meta_mut(&mut obj).insert("name".into(), json!(n));
                n
            }
            None => {
                let errs = vec![nodus_k8s::validation::FieldError::required(
                    "metadata.name",
                    "name or generateName is required",
                )];
                return Err(ApiError(status::invalid(&gvk.kind, "", &errs)));
            }
        },
    };
    if let Some(ns) = req.ns() {
        check_namespace(&req.st, ns)?;
    }
    prepare_for_create(t, &mut obj);
    if t.info.kind == super::certificates::KIND {
        super::certificates::set_requester(&mut obj, &req.user);
    }
    nodus_k8s::defaults::default_object(&gvk, &mut obj);
    crate::apiserver::crd::normalize(t, &mut obj);
    let _alloc = admission::create(&req.st, t, &mut obj, req.dry_run()).await?;
    admission::admit_user(&req.user, t, &obj, None)?;
    crate::apiserver::authz::escalation::check(&req.st, &req.user, t, &obj).map_err(ApiError)?;
    validate(t, &obj, None)?;
    if track {
        super::apply::track_update(req, None, &mut obj, super::update::Part::Main);
    }
    let obj = super::convert::events_to_core(obj);
    if req.dry_run() {
        return Ok(json_response(201, &output::object(req, &obj), &warnings));
    }
    let stored = req
        .st
        .store
        .create(&t.key_for(&name), obj)
        .map_err(|e| store_error(t, &name, e))?;
    Ok(json_response(
        201,
        &output::object(req, &stored.object),
        &warnings,
    ))
}
