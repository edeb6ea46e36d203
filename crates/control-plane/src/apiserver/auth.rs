//! Authentication (client certificates, static bearer tokens, anonymous) and authorization
//! (`system:masters`, the Node authorizer with NodeRestriction, everyone else allowed: there
//! is no RBAC yet).

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::apiserver::rest::path::Target;
use crate::storage::Store;

/// An authenticated (or anonymous) identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }
    pub fn is_anonymous(&self) -> bool {
        self.name == "system:anonymous"
    }
    pub fn in_group(&self, g: &str) -> bool {
        self.groups.iter().any(|x| x == g)
    }
    /// `Some(node)` for a `system:node:<node>` identity in `system:nodes`.
    pub fn node_name(&self) -> Option<&str> {
        if !self.in_group("system:nodes") {
            return None;
        }
        self.name.strip_prefix("system:node:")
    }
}

/// Who the TLS client certificate says the peer is: CN is the user, each O a group.
pub fn user_from_cert(der: &[u8]) -> Option<User> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    groups.push("system:authenticated".into());
    Some(User { name, groups })
}

/// Reads a kube-apiserver `--token-auth-file`: `token,user,uid,"group1,group2"` per line.
pub fn load_token_file(path: &Path) -> std::io::Result<HashMap<String, User>> {
    let mut out = HashMap::new();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = split_csv(line);
        if fields.len() < 2 || fields[0].is_empty() {
            continue;
        }
        let mut groups: Vec<String> = fields
            .get(3)
            .map(|g| {
                g.split(',')
                    .map(str::trim)
                    .filter(|g| !g.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        groups.push("system:authenticated".into());
        out.insert(
            fields[0].clone(),
            User {
                name: fields[1].clone(),
                groups,
            },
        );
    }
    Ok(out)
}

fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Paths anyone may read, as upstream's `system:public-info-viewer` role allows.
pub fn is_public_path(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/livez" | "/readyz" | "/version" | "/version/"
    ) || path.starts_with("/healthz/")
        || path.starts_with("/livez/")
        || path.starts_with("/readyz/")
}

/// The request as the authorizer sees it.
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub target: &'a Target,
    /// The request body for create/update/patch (after patching for patch), if any.
    pub body: Option<&'a Value>,
    pub field_selector: Option<&'a str>,
}

/// `Err(reason)` when the user may not do this. `reason` follows the authorizer's message.
pub fn authorize(user: &User, attrs: &Attributes<'_>, store: &dyn Store) -> Result<(), String> {
    if user.in_group("system:masters") {
        return Ok(());
    }
    if user.is_anonymous() {
        return Err(String::new());
    }
    if let Some(node) = user.node_name() {
        return node_authorize(node, attrs, store);
    }
    if user.in_group("system:nodes") {
        return Err("unknown node".into());
    }
    Ok(())
}

const READ: &[&str] = &["get", "list", "watch"];

fn node_authorize(node: &str, a: &Attributes<'_>, store: &dyn Store) -> Result<(), String> {
    let t = a.target;
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
        _ => deny(&format!(
            "no relationship found between node {node:?} and this object"
        )),
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
    fn token_file_lines_parse_like_kube_apiserver() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens.csv");
        std::fs::write(&p, "abc,alice,1,\"dev,ops\"\n\n# comment\nxyz,bob,2\n").unwrap();
        let t = load_token_file(&p).unwrap();
        assert_eq!(t["abc"].name, "alice");
        assert_eq!(t["abc"].groups, vec!["dev", "ops", "system:authenticated"]);
        assert_eq!(t["xyz"].groups, vec!["system:authenticated"]);
    }

    #[test]
    fn pods_reference_their_configmaps_and_secrets() {
        let pod = serde_json::json!({"spec": {"volumes": [{"configMap": {"name": "cm"}}],
            "containers": [{"envFrom": [{"secretRef": {"name": "s"}}]}]}});
        assert!(pod_references(&pod, "configmaps", "cm"));
        assert!(pod_references(&pod, "secrets", "s"));
        assert!(!pod_references(&pod, "secrets", "cm"));
    }
}
