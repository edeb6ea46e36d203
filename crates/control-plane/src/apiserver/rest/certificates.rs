//! certificates.k8s.io CertificateSigningRequests as upstream's registry strategy treats
//! them: the requester's identity is recorded on create, the `approval` subresource alone
//! sets Approved/Denied, the `status` subresource alone sets the certificate, and condition
//! timestamps are filled in.

use nodus_k8s::validation::FieldError;
use nodus_k8s::validation::certificates::{CsrEndpoint, validate_csr_update};
use serde_json::{Value, json};

use super::update::Part;
use crate::apiserver::authn::User;

pub(crate) const KIND: &str = "CertificateSigningRequest";

/// Upstream's PrepareForCreate: who asked is the authenticated user, whatever the body says.
pub(crate) fn set_requester(obj: &mut Value, user: &User) {
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    spec["username"] = json!(user.name);
    spec["groups"] = json!(user.groups);
    if let Some(o) = spec.as_object_mut() {
        o.remove("uid");
        o.remove("extra");
    }
}

/// Keeps each endpoint to its part: approval changes only the conditions; status and
/// approval carry the spec over; conditions get upstream's timestamps.
pub(crate) fn prepare_for_update(old: &Value, new: &mut Value, part: Part) {
    if part == Part::Approval {
        let conditions = new
            .pointer("/status/conditions")
            .cloned()
            .unwrap_or(json!([]));
        let mut merged = old.clone();
        if !merged.get("status").is_some_and(Value::is_object) {
            merged["status"] = json!({});
        }
        merged["status"]["conditions"] = conditions;
        *new = merged;
    }
    let now = super::now_rfc3339();
    let old_conditions = old
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(cs) = new
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        for c in cs {
            let unchanged = old_conditions
                .iter()
                .any(|o| o["type"] == c["type"] && o["status"] == c["status"]);
            if c.get("lastUpdateTime").is_none_or(Value::is_null) {
                c["lastUpdateTime"] = json!(now);
            }
            if c.get("lastTransitionTime").is_none_or(Value::is_null) {
                let prev = old_conditions
                    .iter()
                    .find(|o| o["type"] == c["type"])
                    .and_then(|o| o.get("lastTransitionTime").cloned());
                c["lastTransitionTime"] = match (unchanged, prev) {
                    (true, Some(p)) => p,
                    _ => c["lastUpdateTime"].clone(),
                };
            }
        }
    }
}

/// The update rules of the endpoint `part` names (upstream's per-strategy validation).
pub(crate) fn validate_update(old: &Value, new: &Value, part: Part) -> Vec<FieldError> {
    let endpoint = match part {
        Part::Main | Part::EphemeralContainers => CsrEndpoint::Main,
        Part::Status => CsrEndpoint::Status,
        Part::Approval => CsrEndpoint::Approval,
    };
    validate_csr_update(new, old, endpoint)
}
