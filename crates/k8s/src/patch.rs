//! JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch with
//! upstream's semantics for built-in kinds.

use serde_json::{Map, Value};

use crate::gvk::Gvk;

mod json_patch;
pub mod schema;
mod strategic;

pub use json_patch::json_patch;
pub use strategic::strategic_merge_patch;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PatchError {
    /// The kind has no strategic merge schema (CRDs, unknown kinds): the API server answers
    /// 415 with this text.
    #[error("strategic merge patch is not supported for {0}")]
    StrategicNotSupported(String),
    /// A malformed patch document; the text follows upstream's where it has one.
    #[error("{0}")]
    Invalid(String),
    /// A JSON patch operation that does not apply (upstream's json-patch library texts).
    #[error("{0}")]
    JsonPatch(String),
}

/// RFC 7386 JSON merge patch: objects merge recursively, `null` deletes, anything else replaces.
pub fn json_merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
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

/// The schema root of a kind for patches and apply: catalogue kinds by name, anything
/// else (custom resources) with only ObjectMeta known.
pub fn root_type(gvk: &Gvk) -> schema::Ty {
    let kind: &'static str = crate::catalog::by_kind(&gvk.group, &gvk.kind)
        .filter(|r| !r.custom)
        .map_or("", |r| r.kind);
    schema::Ty::Root(kind)
}

/// Built-in kinds served only through subresources, which upstream also patches strategically.
const SUBRESOURCE_KINDS: [(&str, &str); 3] = [
    ("autoscaling", "Scale"),
    ("policy", "Eviction"),
    ("authentication.k8s.io", "TokenRequest"),
];

/// Whether strategic merge patch knows the kind: every built-in kind of the catalogue and
/// the subresource kinds (Scale, Eviction, TokenRequest); never custom resources.
pub fn supports_strategic(gvk: &Gvk) -> bool {
    // Custom resources have no patch strategies: upstream answers 415.
    crate::catalog::by_kind(&gvk.group, &gvk.kind).is_some_and(|r| !r.custom)
        || SUBRESOURCE_KINDS.contains(&(gvk.group.as_str(), gvk.kind.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386_examples() {
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ];
        for (mut target, patch, want) in cases {
            json_merge_patch(&mut target, &patch);
            assert_eq!(target, want, "patch {patch}");
        }
    }
}
