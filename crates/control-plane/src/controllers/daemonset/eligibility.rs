//! Which nodes a DaemonSet's pod belongs on (upstream's `NodeShouldRunDaemonPod`), and the
//! pod it puts there: the template with the tolerations every daemon pod gets and a node
//! affinity pinning it to its node, so the scheduler binds it there and nowhere else.

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};
use nodus_k8s::scheduling;
use serde_json::{Value, json};

use crate::apiserver::rest::list::labels_of;

/// Where a daemon pod stands with a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fit {
    /// A pod should be there: created if missing, counted in desiredNumberScheduled.
    pub should_run: bool,
    /// A pod already there may stay (only NoSchedule taints stand in the way).
    pub should_continue_running: bool,
}

/// Tolerations upstream's DaemonSet controller adds to every daemon pod (`Exists`, no
/// tolerationSeconds): a daemon pod keeps running through the conditions that would evict
/// or keep out other pods. `network-unavailable` only for hostNetwork pods, which do not
/// need the pod network.
pub(crate) fn default_tolerations(host_network: bool) -> Vec<Toleration> {
    let mut out: Vec<(&str, &str)> = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if host_network {
        out.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    out.into_iter()
        .map(|(key, effect)| Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(effect.into()),
            ..Default::default()
        })
        .collect()
}

/// Upstream's AddOrUpdateTolerationInPodSpec for each default toleration: one matching in
/// key, operator, value and effect is replaced in place, otherwise it is appended.
fn add_default_tolerations(spec: &mut Value) {
    let host_network = spec.get("hostNetwork").and_then(Value::as_bool) == Some(true);
    let mut tols: Vec<Value> = spec
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for t in default_tolerations(host_network) {
        let t = serde_json::to_value(&t).unwrap_or_default();
        let same = |x: &Value| {
            ["key", "effect", "value"].iter().all(|f| {
                x.get(*f).and_then(Value::as_str).unwrap_or("") == t[*f].as_str().unwrap_or("")
            }) && x.get("operator").and_then(Value::as_str).unwrap_or("Equal") == "Exists"
        };
        match tols.iter_mut().find(|x| same(x)) {
            Some(x) => *x = t,
            None => tols.push(t),
        }
    }
    spec["tolerations"] = json!(tols);
}

/// Upstream's NewPod: the template as a pod for `node`, with the default tolerations.
fn template_pod(ds: &Value) -> Value {
    let mut template = ds
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if !template.get("spec").is_some_and(Value::is_object) {
        template["spec"] = json!({});
    }
    add_default_tolerations(&mut template["spec"]);
    template
}

/// Whether the DaemonSet's pod belongs on `node`: the template's nodeName (if set), its
/// nodeSelector and required node affinity must admit the node; an untolerated NoSchedule
/// taint keeps a new pod out but lets a running one stay, an untolerated NoExecute taint
/// does neither.
pub(crate) fn node_should_run(ds: &Value, node: &Value) -> Fit {
    const NO: Fit = Fit {
        should_run: false,
        should_continue_running: false,
    };
    let node_name = node
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let template = template_pod(ds);
    let wanted = template
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !wanted.is_empty() && wanted != node_name {
        return NO;
    }
    let Ok(pod) = serde_json::from_value::<Pod>(template) else {
        return NO;
    };
    if !scheduling::node_matches_pod(&pod, node_name, &labels_of(node)) {
        return NO;
    }
    let taints: Vec<Taint> = node
        .pointer("/spec/taints")
        .cloned()
        .and_then(|t| serde_json::from_value(t).ok())
        .unwrap_or_default();
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    if scheduling::untolerated_taint(&taints, &tolerations, &["NoSchedule", "NoExecute"]).is_none()
    {
        return Fit {
            should_run: true,
            should_continue_running: true,
        };
    }
    Fit {
        should_run: false,
        should_continue_running: scheduling::untolerated_taint(
            &taints,
            &tolerations,
            &["NoExecute"],
        )
        .is_none(),
    }
}

/// The daemon pod for `node`: the template with the default tolerations, the DaemonSet's
/// controller reference, the revision hash and template generation labels, and its
/// required node affinity replaced by `metadata.name In [node]` (upstream's
/// ReplaceDaemonSetPodNodeNameNodeAffinity; the user's terms were already checked here).
pub(crate) fn new_pod(
    ds: &Value,
    node: &str,
    hash: &str,
    template_generation: Option<i64>,
) -> Value {
    let mut pod = template_pod(ds);
    let name = ds
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let meta = pod
        .as_object_mut()
        .map(|o| o.entry("metadata").or_insert_with(|| json!({})))
        .filter(|m| m.is_object());
    let mut meta = meta.map(|m| m.take()).unwrap_or_else(|| json!({}));
    if let Some(m) = meta.as_object_mut() {
        m.remove("name");
        m.remove("namespace");
    }
    meta["generateName"] = json!(format!("{name}-"));
    if !meta.get("labels").is_some_and(Value::is_object) {
        meta["labels"] = json!({});
    }
    meta["labels"][crate::controllers::history::HASH_LABEL] = json!(hash);
    if let Some(g) = template_generation {
        meta["labels"][super::TEMPLATE_GENERATION_LABEL] = json!(g.to_string());
    }
    meta["ownerReferences"] = json!([crate::controllers::history::controller_ref(ds)]);
    pod["metadata"] = meta;
    let term =
        json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]});
    let spec = &mut pod["spec"];
    if !spec.get("affinity").is_some_and(Value::is_object) {
        spec["affinity"] = json!({});
    }
    if !spec["affinity"]
        .get("nodeAffinity")
        .is_some_and(Value::is_object)
    {
        spec["affinity"]["nodeAffinity"] = json!({});
    }
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] =
        json!({"nodeSelectorTerms": [term]});
    pod
}

/// The node a daemon pod is for: its nodeName once bound, before that the single
/// `metadata.name In [node]` term the controller gave it (upstream's GetTargetNodeName).
pub(crate) fn target_node(pod: &Value) -> Option<String> {
    if let Some(n) = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        return Some(n.to_string());
    }
    let terms = pod
        .pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")?
        .as_array()?;
    let [term] = terms.as_slice() else {
        return None;
    };
    let fields = term.get("matchFields")?.as_array()?;
    let [req] = fields.as_slice() else {
        return None;
    };
    let values = req.get("values")?.as_array()?;
    match (
        req["key"].as_str(),
        req["operator"].as_str(),
        values.as_slice(),
    ) {
        (Some("metadata.name"), Some("In"), [v]) => v.as_str().map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(spec: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "default", "uid": "u1"},
            "spec": {"template": {"metadata": {"labels": {"app": "a"}}, "spec": spec}}})
    }

    fn node(labels: Value, taints: Value) -> Value {
        json!({"metadata": {"name": "n1", "labels": labels}, "spec": {"taints": taints}})
    }

    const RUN: Fit = Fit {
        should_run: true,
        should_continue_running: true,
    };
    const STAY: Fit = Fit {
        should_run: false,
        should_continue_running: true,
    };
    const NO: Fit = Fit {
        should_run: false,
        should_continue_running: false,
    };

    #[test]
    fn eligibility_follows_selectors_affinity_and_taints() {
        let c = json!([{"name": "c", "image": "i"}]);
        let cases: Vec<(&str, Value, Value, Fit)> = vec![
            (
                "plain",
                ds(json!({"containers": c})),
                node(json!({}), json!([])),
                RUN,
            ),
            (
                "selector matches",
                ds(json!({"containers": c, "nodeSelector": {"role": "edge"}})),
                node(json!({"role": "edge"}), json!([])),
                RUN,
            ),
            (
                "selector misses",
                ds(json!({"containers": c, "nodeSelector": {"role": "edge"}})),
                node(json!({"role": "core"}), json!([])),
                NO,
            ),
            (
                "affinity misses",
                ds(
                    json!({"containers": c, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}}}),
                ),
                node(json!({}), json!([])),
                NO,
            ),
            (
                "affinity by name",
                ds(
                    json!({"containers": c, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}),
                ),
                node(json!({}), json!([])),
                RUN,
            ),
            (
                "other nodeName",
                ds(json!({"containers": c, "nodeName": "n2"})),
                node(json!({}), json!([])),
                NO,
            ),
            (
                "NoSchedule untolerated",
                ds(json!({"containers": c})),
                node(
                    json!({}),
                    json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
                ),
                STAY,
            ),
            (
                "NoExecute untolerated",
                ds(json!({"containers": c})),
                node(
                    json!({}),
                    json!([{"key": "dedicated", "value": "db", "effect": "NoExecute"}]),
                ),
                NO,
            ),
            (
                "PreferNoSchedule ignored",
                ds(json!({"containers": c})),
                node(
                    json!({}),
                    json!([{"key": "dedicated", "effect": "PreferNoSchedule"}]),
                ),
                RUN,
            ),
            (
                "tolerated",
                ds(
                    json!({"containers": c, "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}]}),
                ),
                node(
                    json!({}),
                    json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
                ),
                RUN,
            ),
            (
                "not-ready tolerated by default",
                ds(json!({"containers": c})),
                node(
                    json!({}),
                    json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
                    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"}]),
                ),
                RUN,
            ),
            (
                "network-unavailable keeps pod-network pods out",
                ds(json!({"containers": c})),
                node(
                    json!({}),
                    json!([{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]),
                ),
                STAY,
            ),
            (
                "network-unavailable tolerated with hostNetwork",
                ds(json!({"containers": c, "hostNetwork": true})),
                node(
                    json!({}),
                    json!([{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]),
                ),
                RUN,
            ),
        ];
        for (what, ds, node, want) in cases {
            assert_eq!(node_should_run(&ds, &node), want, "{what}");
        }
    }

    #[test]
    fn new_pod_is_pinned_labelled_and_owned() {
        let d = ds(json!({"containers": [{"name": "c", "image": "i"}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Exists"}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "b", "operator": "Exists"}]}}]}}}));
        let p = new_pod(&d, "n7", "h4sh", Some(3));
        assert_eq!(p["metadata"]["generateName"], "agent-");
        assert_eq!(
            p["metadata"]["labels"],
            json!({"app": "a", "controller-revision-hash": "h4sh", "pod-template-generation": "3"})
        );
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "DaemonSet");
        assert_eq!(p["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(target_node(&p).as_deref(), Some("n7"));
        assert_eq!(
            p["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
                [0]["weight"],
            1
        );
        let tols = p["spec"]["tolerations"].as_array().unwrap();
        // The user's not-ready toleration is replaced by the default one (no seconds).
        assert_eq!(tols.len(), 6, "{tols:?}");
        assert_eq!(
            tols[0],
            json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"})
        );
        let mut bound = p.clone();
        bound["spec"]["nodeName"] = json!("n8");
        assert_eq!(target_node(&bound).as_deref(), Some("n8"));
        assert_eq!(target_node(&json!({"spec": {}})), None);
    }
}
