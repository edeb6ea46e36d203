//! JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.

use serde_json::Value;

use crate::gvk::Gvk;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PatchError {
    /// The kind has no strategic merge schema (CRDs, unknown kinds): the API server answers 415.
    #[error("strategic merge patch is not supported for {0}")]
    StrategicNotSupported(String),
    #[error("{0}")]
    Invalid(String),
    #[error("doc is missing path: \"{0}\": missing value")]
    MissingPath(String),
    #[error("testing value {0} failed: test failed")]
    TestFailed(String),
}

/// RFC 7386 JSON merge patch.
pub fn json_merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                json_merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// RFC 6902 JSON patch.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let _ = (target, patch);
    Err(PatchError::Invalid("json patch not implemented yet".into()))
}

/// Strategic merge patch for built-in kinds.
pub fn strategic_merge_patch(
    gvk: &Gvk,
    original: &Value,
    patch: &Value,
) -> Result<Value, PatchError> {
    if crate::catalog::by_kind(&gvk.group, &gvk.kind).is_none() {
        return Err(PatchError::StrategicNotSupported(gvk.kind.clone()));
    }
    let mut out = original.clone();
    json_merge_patch(&mut out, patch);
    Ok(out)
}
