//! The RuntimeClass admission plugin (upstream's plugin/pkg/admission/runtimeclass), for
//! pod creates: a pod naming a class that does not exist is refused; the class's
//! `overhead.podFixed` becomes the pod's `spec.overhead` (which only this plugin may set:
//! a pod stating a different one, or one without a class that defines it, is refused);
//! the class's `scheduling` nodeSelector and tolerations are merged into the pod's.

use nodus_k8s::quantity::parse_quantity;
use nodus_k8s::status;
use serde_json::{Map, Value, json};

use crate::apiserver::rest::{ApiError, ApiResult, meta_str};
use crate::apiserver::state::ApiState;

/// Why a pod is refused; the texts are upstream's.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Rejection {
    NotFound(String),
    OverheadMismatch,
    OverheadWithoutClass,
    NodeSelectorConflict {
        key: String,
        class_value: String,
        pod_value: String,
    },
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::NotFound(n) => write!(f, "pod rejected: RuntimeClass {n:?} not found"),
            Rejection::OverheadMismatch => f.write_str(
                "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead",
            ),
            Rejection::OverheadWithoutClass => f.write_str(
                "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead",
            ),
            Rejection::NodeSelectorConflict {
                key,
                class_value,
                pod_value,
            } => write!(
                f,
                "conflict: runtimeClass.scheduling.nodeSelector[{key}] = {class_value}; pod.spec.nodeSelector[{key}] = {pod_value}"
            ),
        }
    }
}

/// Admits a pod being created: reads its RuntimeClass from the store and applies it.
pub(crate) fn admit(st: &ApiState, pod: &mut Value) -> ApiResult<()> {
    let class_name = pod
        .pointer("/spec/runtimeClassName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    let class = match &class_name {
        None => None,
        Some(n) => {
            let found = st
                .store
                .get(&format!("/node.k8s.io/runtimeclasses/{n}"))
                .map_err(crate::apiserver::rest::storage_failure)?;
            match found {
                Some(rc) => Some(rc.object),
                None => return Err(forbidden(pod, &Rejection::NotFound(n.clone()))),
            }
        }
    };
    apply(pod, class.as_deref()).map_err(|r| forbidden(pod, &r))
}

fn forbidden(pod: &Value, r: &Rejection) -> ApiError {
    ApiError(status::forbidden_with(
        "",
        "pods",
        meta_str(pod, "name").unwrap_or(""),
        &r.to_string(),
    ))
}

/// Upstream's Admit (setOverhead, setScheduling) and Validate (validateOverhead) in one
/// pass over the pod, with the class it names (`None`: it names none).
pub(crate) fn apply(pod: &mut Value, class: Option<&Value>) -> Result<(), Rejection> {
    let class_overhead = class
        .and_then(|c| c.pointer("/overhead/podFixed"))
        .and_then(Value::as_object);
    let pod_overhead = pod
        .pointer("/spec/overhead")
        .and_then(Value::as_object)
        .filter(|o| !o.is_empty());
    match (class_overhead, pod_overhead) {
        (Some(c), Some(p)) if !same_resources(c, p) => return Err(Rejection::OverheadMismatch),
        (None, Some(_)) => return Err(Rejection::OverheadWithoutClass),
        (Some(c), _) => {
            let c = Value::Object(c.clone());
            spec_mut(pod).insert("overhead".into(), c);
        }
        (None, None) => {}
    }
    let Some(scheduling) = class.and_then(|c| c.get("scheduling")) else {
        return Ok(());
    };
    if let Some(sel) = scheduling
        .get("nodeSelector")
        .and_then(Value::as_object)
        .filter(|s| !s.is_empty())
    {
        let spec = spec_mut(pod);
        let pod_sel = spec
            .entry("nodeSelector")
            .or_insert_with(|| json!({}))
            .as_object_mut();
        if let Some(pod_sel) = pod_sel {
            for (key, v) in sel {
                if let Some(pv) = pod_sel.get(key)
                    && pv != v
                {
                    return Err(Rejection::NodeSelectorConflict {
                        key: key.clone(),
                        class_value: v.as_str().unwrap_or_default().to_string(),
                        pod_value: pv.as_str().unwrap_or_default().to_string(),
                    });
                }
                pod_sel.insert(key.clone(), v.clone());
            }
        }
    }
    if let Some(tols) = scheduling.get("tolerations").and_then(Value::as_array) {
        let spec = spec_mut(pod);
        let mut all: Vec<Value> = spec
            .get("tolerations")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        all.extend(tols.iter().cloned());
        spec.insert("tolerations".into(), Value::Array(merge_tolerations(all)));
    }
    Ok(())
}

/// The pod's spec, made an empty object first when it is missing or not one (decoding
/// has already refused a pod that is not an object, so `pod` is one here).
fn spec_mut(pod: &mut Value) -> &mut Map<String, Value> {
    if !pod.is_object() {
        *pod = json!({});
    }
    let Value::Object(obj) = pod else {
        unreachable!("made an object above")
    };
    let spec = obj.entry("spec").or_insert_with(|| json!({}));
    if !spec.is_object() {
        *spec = json!({});
    }
    match spec {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

/// Semantic equality of two resource lists: the same names with equal quantities
/// (`1000m` equals `1`).
fn same_resources(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    let q = |v: &Value| v.as_str().and_then(|s| parse_quantity(s).ok());
    a.len() == b.len()
        && a.iter().all(|(k, v)| {
            b.get(k).is_some_and(|w| {
                q(v).is_some() && q(v).map(|x| x.nano_value()) == q(w).map(|x| x.nano_value())
            })
        })
}

/// Upstream's MergeTolerations: the pod's and the class's tolerations, without those
/// another one already tolerates (the first of two equal ones is kept).
fn merge_tolerations(all: Vec<Value>) -> Vec<Value> {
    let mut merged: Vec<Value> = Vec::new();
    for (i, t) in all.iter().enumerate() {
        if merged.iter().any(|m| is_superset(m, t)) {
            continue;
        }
        if all[i + 1..].iter().any(|t2| t2 != t && is_superset(t2, t)) {
            continue;
        }
        merged.push(t.clone());
    }
    merged
}

/// Whether toleration `ss` tolerates everything `t` does.
fn is_superset(ss: &Value, t: &Value) -> bool {
    if ss == t {
        return true;
    }
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let (ss_key, ss_op, ss_effect) = (s(ss, "key"), s(ss, "operator"), s(ss, "effect"));
    if s(t, "key") != ss_key && (!ss_key.is_empty() || ss_op != "Exists") {
        return false;
    }
    if s(t, "effect") != ss_effect && !ss_effect.is_empty() {
        return false;
    }
    if ss_effect == "NoExecute"
        && let Some(limit) = ss.get("tolerationSeconds").and_then(Value::as_i64)
    {
        match t.get("tolerationSeconds").and_then(Value::as_i64) {
            Some(ts) if ts <= limit => {}
            _ => return false,
        }
    }
    match ss_op.as_str() {
        "Equal" | "" => s(t, "operator") == "Equal" && s(t, "value") == s(ss, "value"),
        "Exists" => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class() -> Value {
        json!({
            "metadata": {"name": "gvisor"},
            "handler": "runsc",
            "overhead": {"podFixed": {"cpu": "250m", "memory": "120Mi"}},
            "scheduling": {
                "nodeSelector": {"runtime": "gvisor"},
                "tolerations": [{"key": "sandboxed", "operator": "Exists", "effect": "NoSchedule"}]
            }
        })
    }

    #[test]
    fn overhead_and_scheduling_come_from_the_class() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {
            "runtimeClassName": "gvisor",
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "sandboxed", "operator": "Equal", "value": "x", "effect": "NoSchedule"}]
        }});
        apply(&mut pod, Some(&class())).unwrap();
        assert_eq!(
            pod["spec"]["overhead"],
            json!({"cpu": "250m", "memory": "120Mi"})
        );
        assert_eq!(
            pod["spec"]["nodeSelector"],
            json!({"disk": "ssd", "runtime": "gvisor"})
        );
        // The class's Exists toleration covers the pod's Equal one.
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([{"key": "sandboxed", "operator": "Exists", "effect": "NoSchedule"}])
        );
    }

    #[test]
    fn an_equal_overhead_is_accepted_and_a_different_one_refused() {
        let mut same = json!({"spec": {"overhead": {"cpu": "0.25", "memory": "120Mi"}}});
        apply(&mut same, Some(&class())).unwrap();
        let mut other = json!({"spec": {"overhead": {"cpu": "1"}}});
        let e = apply(&mut other, Some(&class())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"
        );
        let mut no_class = json!({"spec": {"overhead": {"cpu": "1"}}});
        assert_eq!(
            apply(&mut no_class, None).unwrap_err(),
            Rejection::OverheadWithoutClass
        );
    }

    #[test]
    fn a_conflicting_node_selector_is_refused() {
        let mut pod = json!({"spec": {"nodeSelector": {"runtime": "runc"}}});
        let e = apply(&mut pod, Some(&class())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "conflict: runtimeClass.scheduling.nodeSelector[runtime] = gvisor; pod.spec.nodeSelector[runtime] = runc"
        );
        assert_eq!(
            Rejection::NotFound("x".into()).to_string(),
            "pod rejected: RuntimeClass \"x\" not found"
        );
    }
}
