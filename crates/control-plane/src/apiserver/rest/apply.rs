//! Server-side apply (`PATCH` with `application/apply-patch+yaml`) and the managed fields
//! every write records, on top of [`nodus_k8s::managedfields`].

use axum::http::header;
use axum::response::Response;
use nodus_k8s::managedfields::{self, Writer};
use nodus_k8s::status;
use nodus_k8s::validation::FieldError;
use serde_json::{Value, json};

use super::update::{Part, write};
use super::{ApiError, ApiResult, Req, json_response, meta_mut, meta_str, output};
use crate::apiserver::admission;

/// The content type of an apply patch.
pub const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// Longest field manager upstream accepts.
const MAX_MANAGER_LEN: usize = 128;

/// Whether the request is an apply patch.
pub fn is_apply(req: &Req) -> bool {
    req.headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with(APPLY_PATCH))
}

/// The manager of a non-apply write: `?fieldManager=`, else the user agent's first
/// token (`kubectl/v1.33 (linux/amd64)` → `kubectl`), as upstream.
fn update_manager(req: &Req) -> String {
    if let Some(m) = req.q("fieldManager") {
        return m.to_string();
    }
    let ua = req
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let first = ua.split('/').next().unwrap_or("");
    first.chars().take(MAX_MANAGER_LEN).collect()
}

fn api_version(req: &Req) -> String {
    let gvk = req.target.gvk();
    if gvk.group.is_empty() {
        gvk.version
    } else {
        format!("{}/{}", gvk.group, gvk.version)
    }
}

fn subresource(part: Part) -> &'static str {
    match part {
        Part::Main => "",
        Part::Status => "status",
        Part::Approval => "approval",
        Part::EphemeralContainers => "ephemeralcontainers",
    }
}

/// Records a non-apply write of `new` (over `old`, absent on create) in its managed fields.
pub fn track_update(req: &Req, old: Option<&Value>, new: &mut Value, part: Part) {
    let manager = update_manager(req);
    let time = super::now_rfc3339();
    let version = api_version(req);
    let w = Writer {
        manager: &manager,
        api_version: &version,
        subresource: subresource(part),
        time: &time,
    };
    managedfields::track_update(old, new, managedfields::root_type(&req.target.gvk()), &w);
}

/// Upstream's PatchOptions validation: apply needs a field manager, only apply may force.
fn validate_options(req: &Req, apply: bool) -> ApiResult<()> {
    let mut errs = Vec::new();
    match req.q("fieldManager") {
        None if apply => errs.push(FieldError::required(
            "fieldManager",
            "is required for apply patch",
        )),
        Some(m) if m.chars().count() > MAX_MANAGER_LEN => {
            errs.push(FieldError::too_long("fieldManager", MAX_MANAGER_LEN))
        }
        _ => {}
    }
    if req.query.contains_key("force") && !apply {
        errs.push(FieldError::forbidden(
            "force",
            "may not be specified for non-apply patch",
        ));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError(status::invalid(
            "PatchOptions.meta.k8s.io",
            "",
            &errs,
        )))
    }
}

/// Checks the options of a non-apply patch (`force` is apply's alone).
pub fn validate_patch_options(req: &Req) -> ApiResult<()> {
    validate_options(req, false)
}

/// The applied configuration: YAML (JSON is YAML) naming no managed fields.
fn applied_config(req: &Req) -> ApiResult<Value> {
    let v: Value = serde_yaml::from_slice(&req.body)
        .map_err(|e| ApiError(status::bad_request(&format!("error decoding YAML: {e}"))))?;
    if !v.is_object() {
        return Err(ApiError(status::bad_request(
            "error decoding YAML: the applied configuration is not an object",
        )));
    }
    if v.pointer("/metadata/managedFields")
        .is_some_and(|m| !m.is_null())
    {
        return Err(ApiError(status::bad_request(
            "metadata.managedFields must be nil",
        )));
    }
    Ok(v)
}

/// What of the configuration an endpoint applies: the main resource ignores status when
/// the kind has a status subresource, the status subresource applies only status.
fn for_part(req: &Req, mut v: Value, part: Part) -> Value {
    let has_status_sub = req.target.info.subresources.contains(&"status");
    let Some(o) = v.as_object_mut() else {
        return v;
    };
    match part {
        Part::Main if has_status_sub => {
            o.remove("status");
        }
        Part::Status => o.retain(|k, _| matches!(k.as_str(), "status" | "apiVersion" | "kind")),
        _ => {}
    }
    v
}

/// `PATCH` with an apply patch: merge the configuration into the object, or create it.
pub async fn apply(req: &Req, part: Part) -> ApiResult<Response> {
    validate_options(req, true)?;
    let manager = req.q("fieldManager").unwrap_or_default().to_string();
    let force = req.q_bool("force");
    let name = req.target.name.clone().unwrap_or_default();
    let config = applied_config(req)?;
    if let Some(n) = meta_str(&config, "name").filter(|n| !n.is_empty() && *n != name) {
        return Err(ApiError(status::bad_request(&format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        ))));
    }
    let config = for_part(req, config, part);
    let gvk = req.target.gvk();
    let root = managedfields::root_type(&gvk);
    let version = api_version(req);
    let time = super::now_rfc3339();
    let w = Writer {
        manager: &manager,
        api_version: &version,
        subresource: subresource(part),
        time: &time,
    };
    let conflict = |c: managedfields::Conflicts| ApiError(status::apply_conflict(&c));
    let result = {
        let mut guard = admission::lock_for(&req.st, &req.target).await;
        let alloc = guard.as_mut().map(|g| &mut g.allocations);
        write(req, &name, part, alloc, &mut |cur| {
            let out =
                managedfields::apply(Some(cur), &config, root, &w, force).map_err(conflict)?;
            Ok((out, None))
        })
    };
    match result {
        Ok((obj, warnings)) => Ok(json_response(200, &output::object(req, &obj), &warnings)),
        Err(e) if status::code(&e.0) == 404 && part == Part::Main => {
            // Apply creates what does not exist yet, which takes the create verb too.
            super::authorize(req, "create", None)?;
            let mut obj = managedfields::apply(None, &config, root, &w, force).map_err(conflict)?;
            meta_mut(&mut obj).insert("name".into(), json!(name));
            super::create::create_object(req, obj, false).await
        }
        Err(e) => Err(e),
    }
}
