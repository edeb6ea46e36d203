//! Per-kind object validation.

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use super::{FieldError, Path};
use crate::gvk::Gvk;

/// Validates an object (create when `old` is `None`, update otherwise).
pub fn validate_object(gvk: &Gvk, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let _ = (gvk, old);
    let mut errs = Vec::new();
    let meta = Path::new("metadata");
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if name.is_empty() {
        errs.push(FieldError::required(
            meta.child("name"),
            "name or generateName is required",
        ));
    }
    errs
}

/// The API server's pod validation, for static pod manifests read by the kubelet.
pub fn validate_pod_spec_for_kubelet(pod: &Pod) -> Vec<FieldError> {
    match serde_json::to_value(pod) {
        Ok(v) => validate_object(&Gvk::new("", "v1", "Pod"), &v, None),
        Err(e) => vec![FieldError::internal("", e.to_string())],
    }
}
