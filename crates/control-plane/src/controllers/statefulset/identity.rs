//! A StatefulSet pod's sticky identity (upstream's stateful_set_utils.go): the name
//! `<set>-<ordinal>`, the hostname and subdomain that give it a stable DNS name under the
//! governing headless Service, the `statefulset.kubernetes.io/pod-name` and
//! `apps.kubernetes.io/pod-index` labels, and one PersistentVolumeClaim per claim template
//! named `<claim>-<set>-<ordinal>`, which outlives the pod.

use serde_json::{Map, Value, json};

use crate::controllers::controller_utils::{owner_ref, s};

pub(crate) const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub(crate) const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
pub(crate) const REVISION_LABEL: &str = "controller-revision-hash";

pub(crate) fn pod_name(set: &str, ordinal: i64) -> String {
    format!("{set}-{ordinal}")
}

/// The ordinal a pod's name gives it in `set`, as upstream's getParentNameAndOrdinal: the
/// name must be `<set>-<digits>`.
pub(crate) fn ordinal(set: &str, pod: &str) -> Option<i64> {
    let digits = pod.strip_prefix(set)?.strip_prefix('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub(crate) fn claim_name(claim_template: &str, set: &str, ordinal: i64) -> String {
    format!("{claim_template}-{set}-{ordinal}")
}

/// The claims a pod of `set` at `ordinal` uses, as upstream's getPersistentVolumeClaims:
/// each template with its per-ordinal name, the set's namespace, and the selector's labels
/// added so the claims can be found again.
pub(crate) fn claims(set: &Value, ordinal: i64) -> Vec<Value> {
    let name = s(set, "/metadata/name");
    let selector_labels = set
        .pointer("/spec/selector/matchLabels")
        .cloned()
        .unwrap_or_else(|| json!({}));
    set.pointer("/spec/volumeClaimTemplates")
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    let mut c = json!({
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "metadata": t.get("metadata").cloned().unwrap_or_else(|| json!({})),
                        "spec": t.get("spec").cloned().unwrap_or_else(|| json!({})),
                    });
                    let template = s(t, "/metadata/name");
                    c["metadata"] = json!({
                        "name": claim_name(template, name, ordinal),
                        "namespace": s(set, "/metadata/namespace"),
                        "labels": merged(c.pointer("/metadata/labels"), &selector_labels),
                        "annotations": c.pointer("/metadata/annotations").cloned().unwrap_or_else(|| json!({})),
                    });
                    c
                })
                .collect()
        })
        .unwrap_or_default()
}

fn merged(a: Option<&Value>, b: &Value) -> Value {
    let mut m: Map<String, Value> = a.and_then(Value::as_object).cloned().unwrap_or_default();
    if let Some(b) = b.as_object() {
        for (k, v) in b {
            m.insert(k.clone(), v.clone());
        }
    }
    Value::Object(m)
}

/// A new pod for `set` at `ordinal` from `template` (the template of the revision it is
/// made at), labelled with that revision, as upstream's newVersionedStatefulSetPod.
pub(crate) fn new_pod(set: &Value, template: &Value, ordinal: i64, revision: &str) -> Value {
    let name = s(set, "/metadata/name");
    let mut meta = template
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if let Value::Object(m) = &mut meta {
        m.remove("name");
        m.remove("generateName");
        m.remove("namespace");
    }
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": template.get("spec").cloned().unwrap_or_else(|| json!({})),
    });
    pod["metadata"]["name"] = json!(pod_name(name, ordinal));
    pod["metadata"]["namespace"] = json!(s(set, "/metadata/namespace"));
    pod["metadata"]["ownerReferences"] = json!([owner_ref("apps/v1", "StatefulSet", set)]);
    set_identity(set, &mut pod, ordinal);
    pod["metadata"]["labels"][REVISION_LABEL] = json!(revision);
    set_storage(set, &mut pod, ordinal);
    pod
}

/// Upstream's updateIdentity: name label, index label, hostname and subdomain.
pub(crate) fn set_identity(set: &Value, pod: &mut Value, ordinal: i64) {
    let name = pod_name(s(set, "/metadata/name"), ordinal);
    if !pod["metadata"]["labels"].is_object() {
        pod["metadata"]["labels"] = json!({});
    }
    pod["metadata"]["labels"][POD_NAME_LABEL] = json!(name);
    pod["metadata"]["labels"][POD_INDEX_LABEL] = json!(ordinal.to_string());
    pod["spec"]["hostname"] = json!(name);
    let service = s(set, "/spec/serviceName");
    if service.is_empty() {
        if let Some(spec) = pod["spec"].as_object_mut() {
            spec.remove("subdomain");
        }
    } else {
        pod["spec"]["subdomain"] = json!(service);
    }
}

/// Upstream's identityMatches: the pod still carries what [`set_identity`] gives it.
pub(crate) fn identity_matches(set: &str, service: &str, pod: &Value, ordinal: i64) -> bool {
    let name = pod_name(set, ordinal);
    let label = |k: &str| {
        pod.pointer("/metadata/labels")
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    s(pod, "/metadata/name") == name
        && label(POD_NAME_LABEL).as_deref() == Some(name.as_str())
        && label(POD_INDEX_LABEL) == Some(ordinal.to_string())
        && s(pod, "/spec/hostname") == name
        && s(pod, "/spec/subdomain") == service
}

/// Upstream's updateStorage: each claim template becomes a `persistentVolumeClaim` volume
/// of the same name (replacing a template volume of that name).
fn set_storage(set: &Value, pod: &mut Value, ordinal: i64) {
    let set_name = s(set, "/metadata/name");
    let templates: Vec<String> = set
        .pointer("/spec/volumeClaimTemplates")
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .map(|t| s(t, "/metadata/name").to_string())
                .collect()
        })
        .unwrap_or_default();
    if templates.is_empty() {
        return;
    }
    let mut volumes: Vec<Value> = pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    volumes.retain(|v| !templates.iter().any(|t| v["name"] == t.as_str()));
    for t in &templates {
        volumes.push(json!({"name": t, "persistentVolumeClaim": {
            "claimName": claim_name(t, set_name, ordinal)}}));
    }
    pod["spec"]["volumes"] = json!(volumes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u-1"},
            "spec": {
                "serviceName": "nginx",
                "selector": {"matchLabels": {"app": "nginx"}},
                "template": {
                    "metadata": {"labels": {"app": "nginx"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}],
                             "volumes": [{"name": "www", "emptyDir": {}}, {"name": "cfg", "emptyDir": {}}]},
                },
                "volumeClaimTemplates": [{"metadata": {"name": "www", "labels": {"tier": "data"}},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
            },
        })
    }

    #[test]
    fn ordinals_come_only_from_set_dash_digits() {
        let cases = [
            ("web-0", Some(0)),
            ("web-12", Some(12)),
            ("web-", None),
            ("web-1a", None),
            ("web-x-1", None),
            ("webs-1", None),
            ("web", None),
            ("other-1", None),
        ];
        for (pod, want) in cases {
            assert_eq!(ordinal("web", pod), want, "{pod}");
        }
    }

    #[test]
    fn a_new_pod_has_its_identity_revision_and_claims() {
        let set = set();
        let pod = new_pod(&set, &set["spec"]["template"], 2, "web-abc");
        assert_eq!(pod["metadata"]["name"], "web-2");
        assert_eq!(pod["metadata"]["labels"][POD_NAME_LABEL], "web-2");
        assert_eq!(pod["metadata"]["labels"][POD_INDEX_LABEL], "2");
        assert_eq!(pod["metadata"]["labels"][REVISION_LABEL], "web-abc");
        assert_eq!(pod["metadata"]["labels"]["app"], "nginx");
        assert_eq!(pod["spec"]["hostname"], "web-2");
        assert_eq!(pod["spec"]["subdomain"], "nginx");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "StatefulSet");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
        let vols = pod["spec"]["volumes"].as_array().unwrap();
        assert_eq!(vols.len(), 2, "{vols:?}");
        assert!(
            vols.iter()
                .any(|v| v["name"] == "cfg" && v.get("emptyDir").is_some())
        );
        assert!(
            vols.iter()
                .any(|v| v["name"] == "www"
                    && v["persistentVolumeClaim"]["claimName"] == "www-web-2")
        );
        assert!(identity_matches("web", "nginx", &pod, 2));
        assert!(!identity_matches("web", "nginx", &pod, 3));
        assert!(!identity_matches("web", "other", &pod, 2));
        let claims = claims(&set, 2);
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0]["metadata"]["name"], "www-web-2");
        assert_eq!(claims[0]["metadata"]["labels"]["app"], "nginx");
        assert_eq!(claims[0]["metadata"]["labels"]["tier"], "data");
        assert_eq!(claims[0]["spec"]["resources"]["requests"]["storage"], "1Gi");
    }
}
