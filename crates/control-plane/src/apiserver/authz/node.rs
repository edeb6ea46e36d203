//! The Node authorizer: what a `system:node:<name>` identity may do, by upstream's graph of
//! relationships (a pod bound to the node → its secrets, configmaps, claims, volumes).

use serde_json::Value;

use super::{Attributes, Decision, Request};
use crate::apiserver::authn::User;
use crate::apiserver::rest::path::Target;
use crate::storage::Store;

const READ: &[&str] = &["get", "list", "watch"];

/// The Node authorizer's decision: no opinion for identities that are not nodes; for a
/// node, allow what its graph and upstream's NodeRules allow, else no opinion with why.
pub(super) fn authorize(user: &User, a: &Attributes<'_>, store: &dyn Store) -> Decision {
    if !user.in_group("system:nodes") {
        return Decision::NoOpinion(String::new());
    }
    let Some(node) = user.node_name().filter(|n| !n.is_empty()) else {
        return Decision::NoOpinion("unknown node".into());
    };
    let result = match a.request {
        Request::Served(t) => served(node, t, a, store),
        Request::Named(_) => node_rules(a),
        Request::NonResource(_) => Err(String::new()),
    };
    match result {
        Ok(()) => Decision::Allow,
        Err(why) => Decision::NoOpinion(why),
    }
}

/// Upstream's NodeRules for what has no graph edge: the review APIs the kubelet's
/// webhook authentication and authorization call, and its own CSRs.
fn node_rules(a: &Attributes<'_>) -> Result<(), String> {
    let Some(r) = a.resource() else {
        return Err(String::new());
    };
    let allowed = match (r.group, r.resource, r.subresource) {
        ("authentication.k8s.io", "tokenreviews", "")
        | (
            "authorization.k8s.io",
            "subjectaccessreviews" | "localsubjectaccessreviews" | "selfsubjectaccessreviews",
            "",
        ) => a.verb == "create",
        ("certificates.k8s.io", "certificatesigningrequests", "") => {
            matches!(a.verb, "create" | "get" | "list" | "watch")
        }
        _ => false,
    };
    if allowed { Ok(()) } else { Err(String::new()) }
}

fn served(node: &str, t: &Target, a: &Attributes<'_>, store: &dyn Store) -> Result<(), String> {
    let res = t.info.plural;
    let group = t.info.group;
    let sub = t.sub.as_deref().unwrap_or("");
    let name = t
        .name
        .as_deref()
        .or_else(|| a.body.and_then(|b| b.pointer("/metadata/name")?.as_str()));
    let ns = t.namespace.as_deref().unwrap_or("");
    let verb = a.verb;
    let own_name = name == Some(node);
    let deny = |why: &str| Err(why.to_string());
    match (group, res, sub) {
        ("", "nodes", "") => {
            if READ.contains(&verb) {
                return Ok(());
            }
            if own_name && matches!(verb, "create" | "update" | "patch" | "delete") {
                return Ok(());
            }
            deny(&format!(
                "node {node:?} is not allowed to modify node {:?}",
                name.unwrap_or("")
            ))
        }
        ("", "nodes", "status") => {
            if own_name && matches!(verb, "get" | "update" | "patch") {
                return Ok(());
            }
            deny(&format!(
                "node {node:?} is not allowed to modify node {:?}",
                name.unwrap_or("")
            ))
        }
        ("coordination.k8s.io", "leases", "") => {
            if ns == "kube-node-lease"
                && (own_name || (verb == "list" || verb == "watch") && name.is_none())
            {
                return Ok(());
            }
            deny("can only access node lease with the same name as the requesting node")
        }
        ("", "pods", "") => {
            if READ.contains(&verb) {
                return Ok(());
            }
            match verb {
                "create" => {
                    let body = a.body.cloned().unwrap_or(Value::Null);
                    let mirror = body
                        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
                        .is_some();
                    let bound =
                        body.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node);
                    if mirror && bound {
                        Ok(())
                    } else if !mirror {
                        deny(
                            "pod does not have \"kubernetes.io/config.mirror\" annotation, node can only create mirror pods",
                        )
                    } else {
                        deny(&format!(
                            "node {node:?} can only create pods with spec.nodeName set to itself"
                        ))
                    }
                }
                "delete" | "update" | "patch" => {
                    if pod_bound_to(store, t, node) {
                        Ok(())
                    } else {
                        deny(&format!(
                            "node {node:?} can only modify pods bound to itself"
                        ))
                    }
                }
                _ => deny("not allowed for nodes"),
            }
        }
        ("", "pods", "status") => {
            if matches!(verb, "get" | "update" | "patch") && pod_bound_to(store, t, node) {
                return Ok(());
            }
            deny(&format!(
                "node {node:?} can only update the status of pods bound to itself"
            ))
        }
        ("", "pods", "eviction") => {
            if pod_bound_to(store, t, node) {
                return Ok(());
            }
            deny("can only evict pods bound to the node")
        }
        ("", "events", "") | ("events.k8s.io", "events", "") => {
            if matches!(verb, "create" | "update" | "patch") {
                return Ok(());
            }
            deny("nodes may only write events")
        }
        ("", "services", "")
        | ("", "endpoints", "")
        | ("discovery.k8s.io", "endpointslices", "")
        | ("node.k8s.io", "runtimeclasses", "")
        | ("storage.k8s.io", "csidrivers", "")
        | ("storage.k8s.io", "csinodes", "") => {
            if READ.contains(&verb) {
                return Ok(());
            }
            deny("nodes may only read this resource")
        }
        ("", "configmaps", "")
        | ("", "secrets", "")
        | ("", "persistentvolumeclaims", "")
        | ("", "serviceaccounts", "") => {
            let wanted = name.map(str::to_string).or_else(|| {
                a.field_selector.and_then(|fs| {
                    fs.split(',')
                        .find_map(|p| p.strip_prefix("metadata.name=").map(str::to_string))
                })
            });
            if READ.contains(&verb)
                && let Some(w) = wanted
                && referenced_by_node_pod(store, node, ns, res, &w)
            {
                return Ok(());
            }
            deny(&format!(
                "no relationship found between node {node:?} and this object"
            ))
        }
        ("", "serviceaccounts", "token") => {
            // The kubelet's TokenRequest for a pod's projected token.
            if verb == "create"
                && let Some(sa) = name
                && referenced_by_node_pod(store, node, ns, "serviceaccounts", sa)
            {
                return Ok(());
            }
            deny(&format!(
                "no relationship found between node {node:?} and this object"
            ))
        }
        ("", "persistentvolumes", "") => {
            if verb == "get"
                && let Some(pv) = name
                && volume_visible_to_node(store, node, pv)
            {
                return Ok(());
            }
            deny(&format!(
                "no relationship found between node {node:?} and this object"
            ))
        }
        _ => node_rules(a).or_else(|_| {
            deny(&format!(
                "no relationship found between node {node:?} and this object"
            ))
        }),
    }
}

/// Whether the node may read the PersistentVolume `pv`: upstream's graph edge (a pod on
/// the node → its claim → the claim's volume), and, as a nodus addition for node-local
/// storage, a volume pinned to this node by `kubernetes.io/hostname` or one that no longer
/// exists (the kubelet learns from the 404 that it may remove a local-path directory).
fn volume_visible_to_node(store: &dyn Store, node: &str, pv: &str) -> bool {
    let obj = match store.get(&format!("/core/persistentvolumes/{pv}")) {
        Ok(None) => return true,
        Ok(Some(s)) => s.object,
        Err(_) => return false,
    };
    let pinned = obj
        .pointer("/spec/nodeAffinity/required/nodeSelectorTerms")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|t| t["matchExpressions"].as_array().into_iter().flatten())
        .any(|e| {
            e["key"] == "kubernetes.io/hostname"
                && e["operator"] == "In"
                && e["values"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x == node))
        });
    if pinned {
        return true;
    }
    let (Some(ns), Some(claim)) = (
        obj.pointer("/spec/claimRef/namespace")
            .and_then(Value::as_str),
        obj.pointer("/spec/claimRef/name").and_then(Value::as_str),
    ) else {
        return false;
    };
    let claimed = store
        .get(&format!("/core/persistentvolumeclaims/{ns}/{claim}"))
        .ok()
        .flatten()
        .is_some_and(|c| c.object.pointer("/spec/volumeName").and_then(Value::as_str) == Some(pv));
    claimed && referenced_by_node_pod(store, node, ns, "persistentvolumeclaims", claim)
}

fn pod_bound_to(store: &dyn Store, t: &Target, node: &str) -> bool {
    let Some(name) = t.name.as_deref() else {
        return false;
    };
    let key = t.key_for(name);
    matches!(store.get(&key), Ok(Some(s)) if s.object.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node))
}

/// Whether a pod bound to `node` in `ns` references the object (volumes, env, image pull
/// secrets, service account), as the Node authorizer's graph does.
fn referenced_by_node_pod(store: &dyn Store, node: &str, ns: &str, res: &str, name: &str) -> bool {
    let Ok((pods, _)) = store.list(&format!("/core/pods/{ns}/")) else {
        return false;
    };
    pods.iter()
        .filter(|p| p.object.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node))
        .any(|p| pod_references(&p.object, res, name))
}

fn pod_references(pod: &Value, res: &str, name: &str) -> bool {
    let spec = &pod["spec"];
    let is = |v: Option<&Value>| v.and_then(Value::as_str) == Some(name);
    match res {
        "serviceaccounts" => is(spec.get("serviceAccountName")),
        "persistentvolumeclaims" => {
            volumes(spec).any(|v| is(v.pointer("/persistentVolumeClaim/claimName")))
        }
        "configmaps" | "secrets" => {
            let (vol_ptr, proj_key, env_key, envfrom_key) = if res == "configmaps" {
                (
                    "/configMap/name",
                    "configMap",
                    "configMapKeyRef",
                    "configMapRef",
                )
            } else {
                ("/secret/secretName", "secret", "secretKeyRef", "secretRef")
            };
            if res == "secrets"
                && spec["imagePullSecrets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| is(s.get("name")))
            {
                return true;
            }
            let in_volumes = volumes(spec).any(|v| {
                is(v.pointer(vol_ptr))
                    || v.pointer("/projected/sources")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .any(|s| is(s.get(proj_key).and_then(|x| x.get("name"))))
            });
            let containers = ["containers", "initContainers", "ephemeralContainers"]
                .iter()
                .flat_map(|k| spec[*k].as_array().into_iter().flatten());
            let mut in_env = false;
            for c in containers {
                for e in c["env"].as_array().into_iter().flatten() {
                    if is(e.pointer(&format!("/valueFrom/{env_key}/name"))) {
                        in_env = true;
                    }
                }
                for e in c["envFrom"].as_array().into_iter().flatten() {
                    if is(e.pointer(&format!("/{envfrom_key}/name"))) {
                        in_env = true;
                    }
                }
            }
            in_volumes || in_env
        }
        _ => false,
    }
}

fn volumes(spec: &Value) -> impl Iterator<Item = &Value> {
    spec["volumes"].as_array().into_iter().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_reference_their_configmaps_and_secrets() {
        let pod = serde_json::json!({"spec": {"volumes": [{"configMap": {"name": "cm"}}],
            "containers": [{"envFrom": [{"secretRef": {"name": "s"}}]}]}});
        assert!(pod_references(&pod, "configmaps", "cm"));
        assert!(pod_references(&pod, "secrets", "s"));
        assert!(!pod_references(&pod, "secrets", "cm"));
    }
}
