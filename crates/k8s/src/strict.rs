//! Strict decoding: unknown fields, and normalisation through the k8s-openapi structs.
//!
//! The typed structs ignore fields they do not define, so a field of the input that is
//! missing after a round trip through its kind's struct is unknown to the kind. Kinds outside
//! the catalogue (CRDs) are not checked.
//!
//! [`normalize`] is what upstream's decoding does before anything else: a value of the wrong
//! type or a malformed quantity fails the request (400, see [`decode_error_message`]).

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::gvk::Gvk;

fn round_trip<T: DeserializeOwned + Serialize>(obj: &Value) -> Result<Value, String> {
    let typed: T = serde_path_to_error::deserialize(obj).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            inner.to_string()
        } else {
            format!("{path}: {inner}")
        }
    })?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// The typed round trip for catalogue kinds; `None` for kinds without a struct here.
fn typed_round_trip(gvk: &Gvk, obj: &Value) -> Option<Result<Value, String>> {
    use k8s_openapi::api::{
        apps, coordination, core, discovery, events, flowcontrol, networking, node, policy, rbac,
        scheduling,
    };
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration;
    let mut input = obj.clone();
    // The typed structs insist on their own apiVersion/kind; the caller has already routed
    // the object by its URL, so fill them in when the body omits them.
    if let Value::Object(m) = &mut input {
        m.entry("apiVersion")
            .or_insert_with(|| Value::from(gvk.api_version()));
        m.entry("kind")
            .or_insert_with(|| Value::from(gvk.kind.clone()));
    }
    let v = &input;
    Some(
        match (gvk.group.as_str(), gvk.version.as_str(), gvk.kind.as_str()) {
            ("", "v1", "Pod") => round_trip::<core::v1::Pod>(v),
            ("", "v1", "Node") => round_trip::<core::v1::Node>(v),
            ("", "v1", "Namespace") => round_trip::<core::v1::Namespace>(v),
            ("", "v1", "Service") => round_trip::<core::v1::Service>(v),
            ("", "v1", "Endpoints") => round_trip::<core::v1::Endpoints>(v),
            ("", "v1", "Event") => round_trip::<core::v1::Event>(v),
            ("", "v1", "ConfigMap") => round_trip::<core::v1::ConfigMap>(v),
            ("", "v1", "Secret") => round_trip::<core::v1::Secret>(v),
            ("", "v1", "ServiceAccount") => round_trip::<core::v1::ServiceAccount>(v),
            ("", "v1", "Binding") => round_trip::<core::v1::Binding>(v),
            ("coordination.k8s.io", "v1", "Lease") => round_trip::<coordination::v1::Lease>(v),
            ("discovery.k8s.io", "v1", "EndpointSlice") => {
                round_trip::<discovery::v1::EndpointSlice>(v)
            }
            ("events.k8s.io", "v1", "Event") => round_trip::<events::v1::Event>(v),
            ("node.k8s.io", "v1", "RuntimeClass") => round_trip::<node::v1::RuntimeClass>(v),
            ("networking.k8s.io", "v1", "Ingress") => round_trip::<networking::v1::Ingress>(v),
            ("networking.k8s.io", "v1", "IngressClass") => {
                round_trip::<networking::v1::IngressClass>(v)
            }
            ("networking.k8s.io", "v1", "NetworkPolicy") => {
                round_trip::<networking::v1::NetworkPolicy>(v)
            }
            ("flowcontrol.apiserver.k8s.io", "v1", "FlowSchema") => {
                round_trip::<flowcontrol::v1::FlowSchema>(v)
            }
            ("flowcontrol.apiserver.k8s.io", "v1", "PriorityLevelConfiguration") => {
                round_trip::<flowcontrol::v1::PriorityLevelConfiguration>(v)
            }
            ("apiregistration.k8s.io", "v1", "APIService") => {
                round_trip::<apiregistration::v1::APIService>(v)
            }
            ("policy", "v1", "PodDisruptionBudget") => {
                round_trip::<policy::v1::PodDisruptionBudget>(v)
            }
            ("policy", "v1", "Eviction") => round_trip::<policy::v1::Eviction>(v),
            ("scheduling.k8s.io", "v1", "PriorityClass") => {
                round_trip::<scheduling::v1::PriorityClass>(v)
            }
            ("apps", "v1", "Deployment") => round_trip::<apps::v1::Deployment>(v),
            ("apps", "v1", "ReplicaSet") => round_trip::<apps::v1::ReplicaSet>(v),
            ("apps", "v1", "DaemonSet") => round_trip::<apps::v1::DaemonSet>(v),
            ("apps", "v1", "ControllerRevision") => round_trip::<apps::v1::ControllerRevision>(v),
            ("apps", "v1", "StatefulSet") => round_trip::<apps::v1::StatefulSet>(v),
            ("rbac.authorization.k8s.io", "v1", "Role") => round_trip::<rbac::v1::Role>(v),
            ("rbac.authorization.k8s.io", "v1", "ClusterRole") => {
                round_trip::<rbac::v1::ClusterRole>(v)
            }
            ("rbac.authorization.k8s.io", "v1", "RoleBinding") => {
                round_trip::<rbac::v1::RoleBinding>(v)
            }
            ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding") => {
                round_trip::<rbac::v1::ClusterRoleBinding>(v)
            }
            _ => return None,
        },
    )
}

/// Paths of fields the kind does not define, as `.spec.containers[0].imagee` (sorted).
/// Fields whose value is `null` are not reported; an object that does not decode at all
/// yields no paths here (see [`normalize`] for its error).
pub fn unknown_fields(gvk: &Gvk, obj: &Value) -> Vec<String> {
    let Some(Ok(typed)) = typed_round_trip(gvk, obj) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    diff(obj, &typed, "", &mut out);
    out.sort();
    out
}

fn diff(input: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (input, typed) {
        (Value::Object(i), Value::Object(t)) => {
            for (k, v) in i {
                if v.is_null() {
                    continue;
                }
                let p = format!("{path}.{k}");
                match t.get(k) {
                    Some(tv) => diff(v, tv, &p, out),
                    None => out.push(p),
                }
            }
        }
        (Value::Array(i), Value::Array(t)) => {
            for (n, (iv, tv)) in i.iter().zip(t).enumerate() {
                diff(iv, tv, &format!("{path}[{n}]"), out);
            }
        }
        _ => {}
    }
}

/// Upstream's 400 message for a create or update rejected by `fieldValidation=Strict`:
/// `Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "spec.x"`.
pub fn strict_decoding_message(gvk: &Gvk, unknown: &[String]) -> String {
    let fields: Vec<String> = unknown
        .iter()
        .map(|p| format!("unknown field \"{}\"", p.trim_start_matches('.')))
        .collect();
    format!(
        "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
        gvk.kind,
        gvk.version,
        gvk.kind,
        fields.join(", ")
    )
}

/// The warning text upstream sends for each unknown field under `fieldValidation=Warn`.
pub fn unknown_field_warning(path: &str) -> String {
    format!("unknown field \"{}\"", path.trim_start_matches('.'))
}

/// Round-trips the object through its typed struct: unknown fields are dropped and values
/// take their canonical form. A value of the wrong type is an error naming the field, e.g.
/// `spec.containers: invalid type: string "x", expected a sequence`. Kinds without a struct
/// (CRDs) come back unchanged.
pub fn normalize(gvk: &Gvk, obj: &Value) -> Result<Value, String> {
    check_quantities(obj)?;
    match typed_round_trip(gvk, obj) {
        Some(r) => r,
        None => Ok(obj.clone()),
    }
}

/// Upstream decodes every quantity and fails the whole request on a malformed one, with the
/// quantity error's own text (no field path). The typed structs keep quantities as strings,
/// so the resource lists of pods, pod templates, nodes and runtime classes are checked here.
pub fn check_quantities(obj: &Value) -> Result<(), String> {
    let mut lists: Vec<&Value> = Vec::new();
    let specs = [obj.get("spec"), obj.pointer("/spec/template/spec")];
    for spec in specs.into_iter().flatten() {
        for list in ["containers", "initContainers", "ephemeralContainers"] {
            for c in spec
                .get(list)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                lists.extend(c.pointer("/resources/requests"));
                lists.extend(c.pointer("/resources/limits"));
            }
        }
        lists.extend(spec.get("overhead"));
        lists.extend(spec.pointer("/resources/requests"));
        lists.extend(spec.pointer("/resources/limits"));
    }
    lists.extend(obj.pointer("/status/capacity"));
    lists.extend(obj.pointer("/status/allocatable"));
    lists.extend(obj.pointer("/overhead/podFixed"));
    for list in lists {
        for v in list.as_object().into_iter().flat_map(|m| m.values()) {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Null => continue,
                _ => return Err(crate::quantity::QuantityError::FormatWrong.to_string()),
            };
            crate::quantity::parse_quantity(text.trim()).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The field path and message of the first value of the wrong type, if the object does not
/// decode into its kind's struct (`None` for kinds without a struct here).
pub fn decode_error(gvk: &Gvk, obj: &Value) -> Option<(String, String)> {
    let err = typed_round_trip(gvk, obj)?.err()?;
    Some(match err.split_once(": ") {
        Some((path, msg)) if !path.contains(' ') => (path.to_string(), msg.to_string()),
        _ => (String::new(), err),
    })
}

/// Upstream's 400 message for a body that does not decode into the kind.
pub fn decode_error_message(gvk: &Gvk, err: &str) -> String {
    format!(
        "{} in version \"{}\" cannot be handled as a {}: {err}",
        gvk.kind, gvk.version, gvk.kind
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Gvk {
        Gvk::new("", "v1", "Pod")
    }

    #[test]
    fn finds_unknown_fields_with_paths() {
        let obj = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"any": "thing"}, "bogus": 1},
            "spec": {"containers": [{"name": "c", "image": "x"}, {"name": "d", "imagee": "y"}], "nodeSelector": {"k": "v"}},
            "extra": {"a": 1}});
        assert_eq!(
            unknown_fields(&pod(), &obj),
            vec![".extra", ".metadata.bogus", ".spec.containers[1].imagee"]
        );
        let clean = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpu": "1"}}}]}});
        assert!(unknown_fields(&pod(), &clean).is_empty());
        let cm = json!({"metadata": {"name": "c"}, "data": {"a": "b"}, "dta": {}});
        assert_eq!(
            unknown_fields(&Gvk::new("", "v1", "ConfigMap"), &cm),
            vec![".dta"]
        );
        assert!(unknown_fields(&Gvk::new("example.com", "v1", "Widget"), &cm).is_empty());
    }

    #[test]
    fn upstream_strict_message() {
        assert_eq!(
            strict_decoding_message(&pod(), &[".spec.containers[0].imagee".to_string()]),
            "Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"spec.containers[0].imagee\""
        );
        assert_eq!(unknown_field_warning(".spec.x"), "unknown field \"spec.x\"");
    }

    #[test]
    fn malformed_quantities_fail_like_upstream_decoding() {
        let bad = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"limits": {"memory": "1Gb"}}}]}});
        let err = normalize(&pod(), &bad).err().unwrap_or_default();
        assert_eq!(
            decode_error_message(&pod(), &err),
            "Pod in version \"v1\" cannot be handled as a Pod: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        );
        let numeric = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": 1}}}]}});
        assert_eq!(
            normalize(&pod(), &numeric)
                .map(|v| v["spec"]["containers"][0]["resources"]["limits"]["cpu"].clone()),
            Ok(json!("1"))
        );
    }

    #[test]
    fn normalize_drops_unknown_and_names_bad_fields() {
        let obj = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "imagee": "x"}]}});
        let n = normalize(&pod(), &obj);
        assert_eq!(
            n.as_ref()
                .map(|v| v["spec"]["containers"][0].get("imagee").is_none()),
            Ok(true)
        );
        assert_eq!(n.as_ref().map(|v| v["kind"].clone()), Ok(json!("Pod")));
        let bad = json!({"metadata": {"name": "p"}, "spec": {"containers": "nope"}});
        let err = normalize(&pod(), &bad).err().unwrap_or_default();
        assert!(
            err.starts_with("spec.containers: invalid type: string \"nope\""),
            "{err}"
        );
        let bad = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "ports": [{"containerPort": "80"}]}]}});
        let err = normalize(&pod(), &bad).err().unwrap_or_default();
        assert!(
            err.starts_with("spec.containers[0].ports[0].containerPort: invalid type"),
            "{err}"
        );
    }
}
