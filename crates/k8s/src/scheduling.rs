//! Placement rules shared by the scheduler and the node-lifecycle controllers: taints
//! against tolerations, `nodeSelector` and required node affinity, with upstream's
//! matching semantics (`v1helper.TolerationsTolerateTaint`, `nodeaffinity.RequiredNodeAffinity`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration,
};

/// Whether `tol` tolerates `taint`: effects match (an empty toleration effect matches all),
/// keys match (an empty key with `Exists` matches every key), and the operator holds.
pub fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    if let Some(e) = tol.effect.as_deref().filter(|e| !e.is_empty())
        && e != taint.effect
    {
        return false;
    }
    let key = tol.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match tol.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "" | "Equal" => {
            !key.is_empty()
                && tol.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// The first taint with one of `effects` that none of `tolerations` tolerates.
pub fn untolerated_taint<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    effects: &[&str],
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| effects.contains(&t.effect.as_str()))
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// `{key: value}` as the scheduler prints an untolerated taint in FailedScheduling.
pub fn taint_display(t: &Taint) -> String {
    format!("{{{}: {}}}", t.key, t.value.as_deref().unwrap_or(""))
}

/// How long a pod may stay on a node carrying the NoExecute `taint`: `None` when it is not
/// tolerated at all (evict now), `Some(None)` when tolerated forever, `Some(Some(s))` when
/// tolerated for the smallest `tolerationSeconds` among the matching tolerations (a
/// negative value counts as zero, as upstream).
pub fn toleration_time(taint: &Taint, tolerations: &[Toleration]) -> Option<Option<i64>> {
    let matching: Vec<&Toleration> = tolerations.iter().filter(|t| tolerates(t, taint)).collect();
    if matching.is_empty() {
        return None;
    }
    let mut min: Option<i64> = None;
    for t in matching {
        match t.toleration_seconds {
            None => {}
            Some(s) => min = Some(min.map_or(s.max(0), |m: i64| m.min(s.max(0)))),
        }
    }
    Some(min)
}

fn requirement_matches(r: &NodeSelectorRequirement, get: &dyn Fn(&str) -> Option<String>) -> bool {
    let values = r.values.clone().unwrap_or_default();
    let v = get(&r.key);
    match r.operator.as_str() {
        "In" => v.is_some_and(|v| values.contains(&v)),
        "NotIn" => v.is_none_or(|v| !values.contains(&v)),
        "Exists" => v.is_some(),
        "DoesNotExist" => v.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (v, values.first()) else {
                return false;
            };
            let (Ok(v), Ok(bound)) = (v.parse::<i64>(), bound.parse::<i64>()) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// A node selector term matches when all its expressions (on labels) and fields (only
/// `metadata.name`) match; an empty term matches nothing, as upstream.
pub fn term_matches(
    term: &NodeSelectorTerm,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let by_label = |k: &str| labels.get(k).cloned();
    let by_field = |k: &str| (k == "metadata.name").then(|| node_name.to_string());
    exprs.iter().all(|r| requirement_matches(r, &by_label))
        && fields.iter().all(|r| requirement_matches(r, &by_field))
}

/// Whether the pod's `nodeSelector` and required node affinity (terms ORed) admit a node
/// with `node_name` and `labels`.
pub fn node_matches_pod(pod: &Pod, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    if let Some(sel) = &spec.node_selector
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        None => true,
        Some(ns) => ns
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, node_name, labels)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: (!value.is_empty()).then(|| value.into()),
            effect: effect.into(),
            time_added: None,
        }
    }
    fn tol(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn toleration_matching_follows_upstream() {
        let t = taint("dedicated", "gpu", "NoSchedule");
        assert!(tolerates(
            &tol(json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"})),
            &t
        ));
        assert!(tolerates(
            &tol(json!({"key": "dedicated", "operator": "Exists"})),
            &t
        ));
        assert!(tolerates(&tol(json!({"operator": "Exists"})), &t));
        assert!(!tolerates(
            &tol(json!({"key": "dedicated", "value": "cpu"})),
            &t
        ));
        assert!(!tolerates(
            &tol(json!({"key": "dedicated", "value": "gpu", "effect": "NoExecute"})),
            &t
        ));
        // An empty key with Equal tolerates nothing.
        assert!(!tolerates(&tol(json!({"value": "gpu"})), &t));
    }

    #[test]
    fn toleration_seconds_take_the_minimum() {
        let t = taint("node.kubernetes.io/unreachable", "", "NoExecute");
        assert_eq!(toleration_time(&t, &[]), None);
        let forever = tol(
            json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}),
        );
        assert_eq!(
            toleration_time(&t, std::slice::from_ref(&forever)),
            Some(None)
        );
        let s300 = tol(
            json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
        );
        let s5 = tol(json!({"operator": "Exists", "tolerationSeconds": 5}));
        assert_eq!(
            toleration_time(&t, &[forever, s300.clone(), s5]),
            Some(Some(5))
        );
        assert_eq!(toleration_time(&t, &[s300]), Some(Some(300)));
    }

    #[test]
    fn node_affinity_terms_are_ored_and_expressions_anded() {
        let pod: Pod = serde_json::from_value(json!({"spec": {"containers": [], "nodeSelector": {"disk": "ssd"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}, {"key": "cores", "operator": "Gt", "values": ["4"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["special"]}]}
            ]}}}}}))
        .unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(node_matches_pod(
            &pod,
            "n1",
            &labels(&[("disk", "ssd"), ("zone", "a"), ("cores", "8")])
        ));
        assert!(!node_matches_pod(
            &pod,
            "n1",
            &labels(&[("disk", "ssd"), ("zone", "a"), ("cores", "2")])
        ));
        assert!(!node_matches_pod(
            &pod,
            "n1",
            &labels(&[("disk", "hdd"), ("zone", "a"), ("cores", "8")])
        ));
        assert!(node_matches_pod(
            &pod,
            "special",
            &labels(&[("disk", "ssd")])
        ));
        assert!(!node_matches_pod(
            &pod,
            "other",
            &labels(&[("disk", "ssd")])
        ));
    }
}
