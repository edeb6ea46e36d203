//! PUT and PATCH of objects and of their status: optimistic concurrency, what each
//! endpoint may change, finalizer-driven deletion.

use axum::http::header;
use axum::response::Response;
use nodus_k8s::{Gvk, status};
use serde_json::{Value, json};

use super::create::{check_type, field_validation, validate};
use super::{ApiError, ApiResult, Req, json_response, meta_mut, meta_str, output};
use crate::apiserver::admission::{self, Allocations};
use crate::apiserver::rest::path::Target;
use crate::storage::{Mutation, StoreError};

/// Which part of the object a write may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The main resource: everything but status, for kinds with a status subresource.
    Main,
    /// The status subresource: only status.
    Status,
    /// A CertificateSigningRequest's approval subresource: only its conditions.
    Approval,
    /// A pod's ephemeralcontainers subresource: only `spec.ephemeralContainers`.
    EphemeralContainers,
}

/// Carries server-owned fields from `old` into `new` and keeps each endpoint to its part.
pub fn prepare_for_update(t: &Target, old: &Value, new: &mut Value, part: Part) {
    if t.info.kind == super::certificates::KIND {
        super::certificates::prepare_for_update(old, new, part);
        if part == Part::Approval {
            return;
        }
    }
    let has_status_sub = t.info.subresources.contains(&"status");
    if part == Part::EphemeralContainers {
        // Everything but the ephemeral containers stays as stored (upstream's
        // dropNonEphemeralContainerUpdates); the revision is checked by the caller.
        let ephemeral = new.pointer("/spec/ephemeralContainers").cloned();
        let mut merged = old.clone();
        match ephemeral {
            Some(e) if !e.is_null() => merged["spec"]["ephemeralContainers"] = e,
            _ => {
                if let Some(spec) = merged.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.remove("ephemeralContainers");
                }
            }
        }
        *new = merged;
        return;
    }
    if part == Part::Status {
        let status = new.get("status").cloned();
        let mut merged = old.clone();
        match status {
            Some(s) => merged["status"] = s,
            None => {
                if let Some(o) = merged.as_object_mut() {
                    o.remove("status");
                }
            }
        }
        *new = merged;
        return;
    }
    if has_status_sub {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
    let old_meta = old.get("metadata").cloned().unwrap_or(json!({}));
    let m = meta_mut(new);
    for k in [
        "uid",
        "creationTimestamp",
        "namespace",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "generateName",
    ] {
        match old_meta.get(k) {
            Some(v) => {
                m.insert(k.into(), v.clone());
            }
            None => {
                m.remove(k);
            }
        }
    }
    m.remove("selfLink");
    // Upstream does not let an update add a finalizer... it does; but nothing may
    // resurrect an object being deleted by clearing deletionTimestamp, handled above.
    let spec_changed = {
        let strip = |v: &Value| {
            let mut v = v.clone();
            if let Some(o) = v.as_object_mut() {
                o.remove("metadata");
                o.remove("status");
            }
            v
        };
        strip(old) != strip(new)
    };
    if spec_changed && old_meta.get("generation").is_some() {
        let g = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta_mut(new).insert("generation".into(), json!(g + 1));
    }
    if t.info.kind == "Namespace"
        && let Some(f) = old.pointer("/spec/finalizers")
    {
        // spec.finalizers of a namespace only change through the finalize subresource.
        new["spec"]["finalizers"] = f.clone();
    }
}

/// apps/v1 keeps the DaemonSet's internal `spec.templateGeneration` in this annotation.
pub(crate) const TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";

/// Upstream's DaemonSet strategy for `spec.templateGeneration`: 1 on create (or what the
/// client set, if higher), then only the server moves it, by one whenever the pod
/// template changes. The controller labels its pods with it (`pod-template-generation`).
pub(crate) fn template_generation(new: &mut Value, old: Option<&Value>) {
    let read = |o: &Value| {
        o.pointer("/metadata/annotations")
            .and_then(|a| a.get(TEMPLATE_GENERATION))
            .and_then(Value::as_str)
            .and_then(|g| g.parse::<i64>().ok())
    };
    let generation = match old {
        None => read(new).unwrap_or(0).max(1),
        Some(old) => {
            let g = read(old).unwrap_or(1);
            if old.pointer("/spec/template") != new.pointer("/spec/template") {
                g + 1
            } else {
                g
            }
        }
    };
    let m = meta_mut(new);
    let ann = m.entry("annotations").or_insert_with(|| json!({}));
    if !ann.is_object() {
        *ann = json!({});
    }
    ann[TEMPLATE_GENERATION] = json!(generation.to_string());
}

/// Whether the object, being deleted, has nothing left holding it.
pub fn ready_to_delete(obj: &Value) -> bool {
    if obj.pointer("/metadata/deletionTimestamp").is_none() {
        return false;
    }
    let finalizers_empty = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(|a| a.is_empty());
    let grace = obj
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    finalizers_empty && grace == 0
}

/// Computes the new object from the current one, with an optional expected revision.
pub type Compute<'a> = dyn FnMut(&Value) -> ApiResult<(Value, Option<u64>)> + 'a;

/// The shared write path: read the current object, compute the new one with `compute`
/// (which sees the current object), run admission and validation, and store it with
/// optimistic concurrency — all under the store's write lock.
pub fn write(
    req: &Req,
    name: &str,
    part: Part,
    mut alloc: Option<&mut Allocations>,
    compute: &mut Compute<'_>,
) -> ApiResult<(std::sync::Arc<Value>, Vec<String>)> {
    let t = &req.target;
    let key = t.key_for(name);
    let mut failure: Option<ApiError> = None;
    let mut warnings = Vec::new();
    let mut dry: Option<Value> = None;
    let dry_run = req.dry_run();
    let apply_request = super::apply::is_apply(req);
    let outcome = req.st.store.mutate(&key, &mut |cur| {
        let Some(cur) = cur else {
            failure = Some(ApiError(status::not_found(
                t.info.group,
                t.info.plural,
                name,
            )));
            return Err(StoreError::NotFound(key.clone()));
        };
        let step = (|| -> ApiResult<Option<Mutation>> {
            let cur_view = super::convert::present(t, &cur.object);
            let (mut new, expected) = compute(&cur_view)?;
            if let Some(e) = expected
                && e != cur.revision
            {
                return Err(ApiError(status::conflict(
                    t.info.group,
                    t.info.plural,
                    name,
                )));
            }
            check_type(t, &mut new)?;
            warnings = field_validation(req, &t.gvk(), &new)?;
            if meta_str(&new, "name").is_some_and(|n| n != name) {
                return Err(ApiError(status::bad_request(&format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    meta_str(&new, "name").unwrap_or("")
                ))));
            }
            meta_mut(&mut new).insert("name".into(), json!(name));
            // metadata.uid is immutable (upstream's ValidateObjectMetaUpdate): an update or
            // patch naming another uid — a client that means an object since deleted and
            // recreated under the same name — is refused, never applied to the new one.
            if let Some(uid) = meta_str(&new, "uid").filter(|u| !u.is_empty())
                && meta_str(&cur_view, "uid").is_some_and(|cur| cur != uid)
            {
                return Err(ApiError(status::invalid(
                    &t.gvk().kind,
                    name,
                    &[nodus_k8s::validation::FieldError::invalid(
                        "metadata.uid",
                        json!(uid),
                        "field is immutable",
                    )],
                )));
            }
            // An apply computed the managed fields already; the status subresource's
            // preparation would put back the stored ones.
            let applied_fields = apply_request
                .then(|| new.pointer("/metadata/managedFields").cloned())
                .flatten();
            prepare_for_update(t, &cur_view, &mut new, part);
            crate::apiserver::crd::normalize(t, &mut new);
            if matches!(part, Part::Main | Part::EphemeralContainers) {
                nodus_k8s::defaults::default_object(&t.gvk(), &mut new);
                // Compared once both templates carry their defaults.
                if t.info.kind == "DaemonSet" {
                    template_generation(&mut new, Some(&cur_view));
                }
            }
            admission::update(&req.st, t, &cur_view, &mut new, alloc.as_deref_mut())?;
            admission::admit_user(&req.user, t, &new, Some(&cur_view))?;
            crate::apiserver::authz::escalation::check(&req.st, &req.user, t, &new)
                .map_err(ApiError)?;
            if part == Part::EphemeralContainers {
                let errs = nodus_k8s::validation::validate_pod_ephemeral_containers_update(
                    &new, &cur_view,
                );
                if !errs.is_empty() {
                    return Err(ApiError(status::invalid(&t.gvk().kind, name, &errs)));
                }
            } else {
                validate(t, &new, Some(&cur_view))?;
            }
            if t.info.kind == super::certificates::KIND {
                let errs = super::certificates::validate_update(&cur_view, &new, part);
                if !errs.is_empty() {
                    return Err(ApiError(status::invalid(&t.gvk().kind, name, &errs)));
                }
            }
            if !apply_request {
                super::apply::track_update(req, Some(&cur_view), &mut new, part);
            } else if let Some(f) = applied_fields {
                meta_mut(&mut new).insert("managedFields".into(), f);
            }
            let mut new = super::convert::events_to_core(new);
            if dry_run {
                dry = Some(new);
                return Ok(None);
            }
            if ready_to_delete(&new) {
                return Ok(Some(Mutation::Delete));
            }
            // An update that changes nothing is not written, as upstream skips no-op writes.
            // The store gives a written object its new revision whatever it carries.
            crate::storage::set_resource_version(&mut new, cur.revision);
            if new == *cur.object {
                return Ok(Some(Mutation::Keep));
            }
            Ok(Some(Mutation::Put(new)))
        })();
        match step {
            Ok(Some(m)) => Ok(m),
            Ok(None) => Ok(Mutation::Keep),
            Err(e) => {
                failure = Some(e);
                Err(StoreError::Backend("aborted".into()))
            }
        }
    });
    if let Some(f) = failure {
        return Err(f);
    }
    let outcome = outcome.map_err(|e| super::store_error(t, name, e))?;
    if let Some(d) = dry {
        return Ok((std::sync::Arc::new(d), warnings));
    }
    // The stored object itself: the response only serializes it.
    let obj = match (outcome.stored, outcome.deleted) {
        (Some(s), _) => s.object,
        (None, Some(d)) => d.object,
        (None, None) => {
            return Err(ApiError(status::not_found(
                t.info.group,
                t.info.plural,
                name,
            )));
        }
    };
    Ok((obj, warnings))
}

fn expected_rv(obj: &Value) -> ApiResult<Option<u64>> {
    match meta_str(obj, "resourceVersion").filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) => s.parse().map(Some).map_err(|_| {
            ApiError(status::bad_request(&format!(
                "invalid resourceVersion {s:?}"
            )))
        }),
    }
}

pub async fn put(req: &Req) -> ApiResult<Response> {
    put_part(req, Part::Main).await
}

pub async fn put_part(req: &Req, part: Part) -> ApiResult<Response> {
    let name = req.target.name.clone().unwrap_or_default();
    let body = req.json_body()?;
    let expected = expected_rv(&body)?;
    let mut guard = admission::lock_for(&req.st, &req.target).await;
    let alloc = guard.as_mut().map(|g| &mut g.allocations);
    let (obj, warnings) = write(req, &name, part, alloc, &mut |_| {
        Ok((body.clone(), expected))
    })?;
    Ok(json_response(200, &output::object(req, &obj), &warnings))
}

pub async fn patch(req: &Req) -> ApiResult<Response> {
    patch_part(req, Part::Main).await
}

/// Applies a patch of the request's content type to `current`.
pub fn apply_patch(ct: &str, gvk: &Gvk, current: &Value, patch: &Value) -> ApiResult<Value> {
    let bad = |e: nodus_k8s::patch::PatchError| ApiError(status::bad_request(&e.to_string()));
    if ct.starts_with("application/json-patch+json") {
        let mut out = current.clone();
        nodus_k8s::patch::json_patch(&mut out, patch).map_err(|e| match e {
            nodus_k8s::patch::PatchError::JsonPatch(m) => ApiError(json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": m, "reason": "Invalid", "details": {}, "code": 422})),
            other => bad(other),
        })?;
        Ok(out)
    } else if ct.starts_with("application/merge-patch+json") {
        let mut out = current.clone();
        nodus_k8s::patch::json_merge_patch(&mut out, patch);
        Ok(out)
    } else if ct.starts_with("application/strategic-merge-patch+json") {
        nodus_k8s::patch::strategic_merge_patch(gvk, current, patch).map_err(|e| match e {
            nodus_k8s::patch::PatchError::StrategicNotSupported(_) => {
                ApiError(status::unsupported_media_type(&format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml; {e}")))
            }
            other => bad(other),
        })
    } else if ct.starts_with(super::apply::APPLY_PATCH) {
        // Apply patches of objects go through `apply::apply`; what reaches here is a
        // subresource (scale) that nodus does not apply to.
        Err(ApiError(status::unsupported_media_type(
            "server-side apply is not supported for this subresource: use a merge, strategic merge or JSON patch",
        )))
    } else {
        Err(ApiError(status::unsupported_media_type(&format!(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json; got {ct}"
        ))))
    }
}

pub async fn patch_part(req: &Req, part: Part) -> ApiResult<Response> {
    if super::apply::is_apply(req) && matches!(part, Part::Main | Part::Status) {
        return super::apply::apply(req, part).await;
    }
    super::apply::validate_patch_options(req)?;
    let name = req.target.name.clone().unwrap_or_default();
    let ct = req
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let patch: Value = serde_json::from_slice(&req.body)
        .map_err(|e| ApiError(status::bad_request(&format!("error decoding patch: {e}"))))?;
    let gvk = req.target.gvk();
    let mut guard = admission::lock_for(&req.st, &req.target).await;
    let alloc = guard.as_mut().map(|g| &mut g.allocations);
    let (obj, warnings) = write(req, &name, part, alloc, &mut |cur| {
        let out = apply_patch(&ct, &gvk, cur, &patch)?;
        // A resourceVersion in the patch is a precondition; otherwise the patch applies to
        // whatever is current, as upstream retries patches on conflict.
        let expected = match patch
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
        {
            Some(rv) if !rv.is_empty() => Some(rv.parse().map_err(|_| {
                ApiError(status::bad_request(&format!(
                    "invalid resourceVersion {rv:?}"
                )))
            })?),
            _ => None,
        };
        Ok((out, expected))
    })?;
    Ok(json_response(200, &output::object(req, &obj), &warnings))
}
