//! NodeRestriction admission: what a node identity (`system:node:<name>`) may write beyond
//! what the Node authorizer lets through, as upstream's plugin limits it. Mirror pods only,
//! bound to the node and referencing no secrets, configmaps, service accounts, claims or
//! ephemeral volumes; no writes to a pod's spec or metadata; and only its own Node object,
//! without the labels reserved for the cluster's administrators.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::apiserver::authn::User;
use crate::apiserver::rest::path::Target;
use crate::apiserver::rest::{ApiError, ApiResult};

/// Admits (or refuses with upstream's 403) a create (`old` = None) or update by a node.
pub(crate) fn admit(user: &User, t: &Target, obj: &Value, old: Option<&Value>) -> ApiResult<()> {
    let Some(node) = user.node_name() else {
        return Ok(());
    };
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let refuse = |msg: String| {
        Err(ApiError(nodus_k8s::status::forbidden_with(
            t.info.group,
            t.info.plural,
            name,
            &msg,
        )))
    };
    match (t.info.group, t.info.plural, t.sub.as_deref()) {
        ("", "pods", None) => match old {
            None => admit_mirror_pod(node, obj).or_else(refuse),
            Some(_) => refuse(format!(
                "unexpected operation \"UPDATE\", node {} can only create and delete mirror pods",
                q(node)
            )),
        },
        ("", "nodes", None | Some("status")) => {
            if name != node {
                return refuse(format!(
                    "node {} is not allowed to modify node {}",
                    q(node),
                    q(name)
                ));
            }
            let new_labels = labels(obj);
            let old_labels = old.map(labels).unwrap_or_default();
            let mut changed: Vec<&str> = new_labels
                .iter()
                .filter(|(k, v)| old_labels.get(*k) != Some(*v))
                .map(|(k, _)| k.as_str())
                .chain(
                    old_labels
                        .keys()
                        .filter(|k| !new_labels.contains_key(*k))
                        .map(String::as_str),
                )
                .filter(|k| is_restricted_label(k))
                .collect();
            changed.sort_unstable();
            changed.dedup();
            if changed.is_empty() {
                return Ok(());
            }
            let what = if old.is_none() {
                "set the following labels"
            } else {
                "modify labels"
            };
            refuse(format!(
                "node {} is not allowed to {what}: {}",
                q(node),
                changed.join(", ")
            ))
        }
        _ => Ok(()),
    }
}

fn q(s: &str) -> String {
    nodus_k8s::status::go_quote(s)
}

fn labels(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// The labels a kubelet may set on its Node in the kubernetes.io and k8s.io namespaces
/// (upstream's `kubeletapis.KubeletLabels` and label namespaces).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "node.kubernetes.io/instance-type",
];
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// Whether a node may not set or change this label on itself: anything under
/// `node-restriction.kubernetes.io/`, and labels in the kubernetes.io or k8s.io namespaces
/// that are not the kubelet's own (e.g. `node-role.kubernetes.io/*`).
fn is_restricted_label(key: &str) -> bool {
    let Some((domain, _)) = key.split_once('/') else {
        return false;
    };
    let in_ns = |ns: &str| domain == ns || domain.ends_with(&format!(".{ns}"));
    if in_ns("node-restriction.kubernetes.io") {
        return true;
    }
    if !(in_ns("kubernetes.io") || in_ns("k8s.io")) {
        return false;
    }
    !(KUBELET_LABELS.contains(&key) || KUBELET_LABEL_NAMESPACES.iter().any(|ns| in_ns(ns)))
}

/// Upstream's checks on a node's pod create.
fn admit_mirror_pod(node: &str, pod: &Value) -> Result<(), String> {
    if pod
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_none()
    {
        return Err(format!(
            "pod does not have \"kubernetes.io/config.mirror\" annotation, node {} can only create mirror pods",
            q(node)
        ));
    }
    if pod.pointer("/spec/nodeName").and_then(Value::as_str) != Some(node) {
        return Err(format!(
            "node {} can only create pods with spec.nodeName set to itself",
            q(node)
        ));
    }
    let cannot = |what: &str| Err(format!("node {} can not create pods that {what}", q(node)));
    let spec = &pod["spec"];
    if spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return cannot("reference a service account");
    }
    let volumes: Vec<&Value> = spec["volumes"].as_array().into_iter().flatten().collect();
    let projected = || {
        volumes.iter().flat_map(|v| {
            v.pointer("/projected/sources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
    };
    let containers = || {
        ["containers", "initContainers", "ephemeralContainers"]
            .iter()
            .flat_map(|k| spec[*k].as_array().into_iter().flatten())
    };
    let env_refs = |key: &str, from_key: &str| {
        containers().any(|c| {
            c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e.pointer(&format!("/valueFrom/{key}")).is_some())
                || c["envFrom"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|e| e.get(from_key).is_some())
        })
    };
    let secrets = volumes.iter().any(|v| v.get("secret").is_some())
        || projected().any(|s| s.get("secret").is_some())
        || env_refs("secretKeyRef", "secretRef")
        || spec["imagePullSecrets"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
    if secrets {
        return cannot("reference secrets");
    }
    if volumes.iter().any(|v| v.get("configMap").is_some())
        || projected().any(|s| s.get("configMap").is_some())
        || env_refs("configMapKeyRef", "configMapRef")
    {
        return cannot("reference configmaps");
    }
    if projected().any(|s| s.get("serviceAccountToken").is_some()) {
        return cannot("use service account token volume projections");
    }
    if volumes
        .iter()
        .any(|v| v.get("persistentVolumeClaim").is_some())
    {
        return cannot("reference persistentvolumeclaims");
    }
    if volumes.iter().any(|v| v.get("ephemeral").is_some()) {
        return cannot("use generic ephemeral volumes");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mirror_pods_reference_nothing_secret() {
        let base = json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "h"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}});
        assert_eq!(admit_mirror_pod("n1", &base), Ok(()));
        let table = [
            (
                json!({"volumes": [{"name": "v", "secret": {"secretName": "s"}}]}),
                "reference secrets",
            ),
            (
                json!({"volumes": [{"name": "v", "configMap": {"name": "c"}}]}),
                "reference configmaps",
            ),
            (
                json!({"volumes": [{"name": "v", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}),
                "use service account token volume projections",
            ),
            (
                json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}),
                "reference persistentvolumeclaims",
            ),
            (
                json!({"volumes": [{"name": "v", "ephemeral": {}}]}),
                "use generic ephemeral volumes",
            ),
            (
                json!({"serviceAccountName": "x"}),
                "reference a service account",
            ),
        ];
        for (extra, want) in table {
            let mut pod = base.clone();
            for (k, v) in extra.as_object().unwrap() {
                pod["spec"][k] = v.clone();
            }
            let err = admit_mirror_pod("n1", &pod).unwrap_err();
            assert_eq!(err, format!("node \"n1\" can not create pods that {want}"));
        }
        let mut other = base.clone();
        other["spec"]["nodeName"] = json!("n2");
        assert!(admit_mirror_pod("n1", &other).is_err());
    }

    #[test]
    fn restricted_labels_as_upstream() {
        for (k, restricted) in [
            ("node-restriction.kubernetes.io/pool", true),
            ("node-role.kubernetes.io/control-plane", true),
            ("example.k8s.io/x", true),
            ("kubernetes.io/hostname", false),
            (
                "node.kubernetes.io/exclude-from-external-load-balancers",
                false,
            ),
            ("topology.kubernetes.io/zone", false),
            ("example.com/team", false),
            ("plain", false),
        ] {
            assert_eq!(is_restricted_label(k), restricted, "{k}");
        }
    }
}
