//! The bootstrap RBAC policy (upstream's `plugin/pkg/auth/authorizer/rbac/bootstrappolicy`
//! plus the bindings kubeadm creates for node join), reconciled at every start, and the
//! ClusterRole aggregation controller.
//!
//! Reconciliation creates what is missing; on objects annotated
//! `rbac.authorization.kubernetes.io/autoupdate: "true"` it adds missing rules, subjects,
//! labels and aggregation selectors, and never removes what users added.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::apiserver::bootstrap::ensure_object;
use crate::apiserver::rest::path::key;
use crate::apiserver::state::ApiState;
use crate::controllers::objects::target;
use crate::storage::{Mutation, Store, StoreError};

const GROUP: &str = "rbac.authorization.k8s.io";
const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";
const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];
const READ_WRITE: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "delete",
    "deletecollection",
    "patch",
    "update",
];

fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Value {
    json!({"verbs": verbs, "apiGroups": groups, "resources": resources})
}

fn urls(verbs: &[&str], paths: &[&str]) -> Value {
    json!({"verbs": verbs, "nonResourceURLs": paths})
}

fn bootstrap_meta(name: &str, labels: &[(&str, &str)], autoupdate: bool) -> Value {
    let mut l = Map::new();
    l.insert("kubernetes.io/bootstrapping".into(), json!("rbac-defaults"));
    for (k, v) in labels {
        l.insert((*k).into(), json!(v));
    }
    let mut m = json!({"name": name, "labels": l});
    if autoupdate {
        m["annotations"] = json!({AUTOUPDATE: "true"});
    }
    m
}

fn cluster_role(name: &str, labels: &[(&str, &str)], rules: Vec<Value>) -> Value {
    json!({"metadata": bootstrap_meta(name, labels, true), "rules": rules})
}

fn aggregated(name: &str, labels: &[(&str, &str)], selects: &str) -> Value {
    json!({"metadata": bootstrap_meta(name, labels, true), "rules": [],
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {selects: "true"}}]}})
}

fn subject(kind: &str, name: &str) -> Value {
    json!({"kind": kind, "apiGroup": GROUP, "name": name})
}

fn binding(name: &str, role: &str, subjects: Vec<Value>, autoupdate: bool) -> Value {
    let metadata = if autoupdate {
        bootstrap_meta(name, &[], true)
    } else {
        json!({"name": name})
    };
    json!({"metadata": metadata,
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
        "subjects": subjects})
}

const TO_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
const TO_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
const TO_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";

/// Upstream's bootstrap ClusterRoles that apply to what nodus serves.
pub fn cluster_roles() -> Vec<Value> {
    let csr = "certificates.k8s.io";
    vec![
        cluster_role(
            "cluster-admin",
            &[],
            vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])],
        ),
        cluster_role(
            "system:discovery",
            &[],
            vec![urls(
                &["get"],
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
            )],
        ),
        cluster_role(
            "system:public-info-viewer",
            &[],
            vec![urls(
                &["get"],
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
            )],
        ),
        cluster_role(
            "system:monitoring",
            &[],
            vec![urls(
                &["get"],
                &[
                    "/healthz",
                    "/healthz/*",
                    "/livez",
                    "/livez/*",
                    "/metrics",
                    "/metrics/slis",
                    "/readyz",
                    "/readyz/*",
                ],
            )],
        ),
        cluster_role(
            "system:basic-user",
            &[],
            vec![
                rule(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
            ],
        ),
        aggregated("admin", &[], TO_ADMIN),
        aggregated("edit", &[(TO_ADMIN, "true")], TO_EDIT),
        aggregated("view", &[(TO_EDIT, "true")], TO_VIEW),
        cluster_role(
            "system:aggregate-to-admin",
            &[(TO_ADMIN, "true")],
            vec![
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["localsubjectaccessreviews"],
                ),
                rule(READ_WRITE, &[GROUP], &["rolebindings", "roles"]),
            ],
        ),
        cluster_role(
            "system:aggregate-to-edit",
            &[(TO_EDIT, "true")],
            edit_rules(),
        ),
        cluster_role(
            "system:aggregate-to-view",
            &[(TO_VIEW, "true")],
            view_rules(),
        ),
        cluster_role(
            "system:auth-delegator",
            &[],
            vec![
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
            ],
        ),
        cluster_role(
            "system:node-proxier",
            &[],
            vec![
                rule(READ, &[""], &["endpoints", "services"]),
                rule(&["get", "list", "watch"], &[""], &["nodes"]),
                rule(
                    &["create", "patch", "update"],
                    &["", "events.k8s.io"],
                    &["events"],
                ),
                rule(READ, &["discovery.k8s.io"], &["endpointslices"]),
            ],
        ),
        cluster_role(
            "system:kube-scheduler",
            &[],
            vec![
                rule(
                    &["create", "patch", "update"],
                    &["", "events.k8s.io"],
                    &["events"],
                ),
                rule(&["create"], &["coordination.k8s.io"], &["leases"]),
                rule(&["get", "update"], &["coordination.k8s.io"], &["leases"]),
                rule(&["delete", "get", "list", "watch"], &[""], &["pods"]),
                rule(READ, &[""], &["nodes"]),
                rule(&["create"], &[""], &["bindings", "pods/binding"]),
                rule(&["patch", "update"], &[""], &["pods/status"]),
                rule(
                    READ,
                    &[""],
                    &[
                        "replicationcontrollers",
                        "services",
                        "namespaces",
                        "persistentvolumeclaims",
                        "persistentvolumes",
                    ],
                ),
                rule(READ, &["apps"], &["replicasets", "statefulsets"]),
                rule(READ, &["policy"], &["poddisruptionbudgets"]),
                rule(
                    READ,
                    &["storage.k8s.io"],
                    &[
                        "storageclasses",
                        "csinodes",
                        "csidrivers",
                        "csistoragecapacities",
                    ],
                ),
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
            ],
        ),
        cluster_role(
            "system:node",
            &[],
            vec![
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews", "localsubjectaccessreviews"],
                ),
                rule(
                    &[
                        "create", "get", "list", "watch", "patch", "update", "delete",
                    ],
                    &[""],
                    &["nodes"],
                ),
                rule(&["patch", "update"], &[""], &["nodes/status"]),
                rule(
                    &["create", "patch", "update"],
                    &["", "events.k8s.io"],
                    &["events"],
                ),
                rule(READ, &[""], &["pods"]),
                rule(&["create", "delete"], &[""], &["pods"]),
                rule(&["patch", "update"], &[""], &["pods/status"]),
                rule(&["create"], &[""], &["pods/eviction"]),
                rule(&["get"], &[""], &["configmaps", "secrets"]),
                rule(
                    &["get"],
                    &[""],
                    &["persistentvolumeclaims", "persistentvolumes"],
                ),
                rule(READ, &[""], &["services", "endpoints"]),
                rule(
                    &["create", "get", "list", "watch"],
                    &[csr],
                    &["certificatesigningrequests"],
                ),
                rule(
                    &["get", "create", "update", "patch", "delete"],
                    &["coordination.k8s.io"],
                    &["leases"],
                ),
                rule(&["create"], &[""], &["serviceaccounts/token"]),
            ],
        ),
        cluster_role(
            "system:node-bootstrapper",
            &[],
            vec![rule(
                &["create", "get", "list", "watch"],
                &[csr],
                &["certificatesigningrequests"],
            )],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            &[],
            vec![rule(
                &["create"],
                &[csr],
                &["certificatesigningrequests/nodeclient"],
            )],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            &[],
            vec![rule(
                &["create"],
                &[csr],
                &["certificatesigningrequests/selfnodeclient"],
            )],
        ),
        cluster_role(
            "system:service-account-issuer-discovery",
            &[],
            vec![urls(
                &["get"],
                &[
                    "/.well-known/openid-configuration",
                    "/.well-known/openid-configuration/",
                    "/openid/v1/jwks",
                    "/openid/v1/jwks/",
                ],
            )],
        ),
    ]
}

fn view_rules() -> Vec<Value> {
    vec![
        rule(
            READ,
            &[""],
            &[
                "pods",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "persistentvolumeclaims",
                "persistentvolumeclaims/status",
                "configmaps",
                "endpoints",
                "services",
                "services/status",
                "serviceaccounts",
            ],
        ),
        rule(
            READ,
            &[""],
            &[
                "limitranges",
                "resourcequotas",
                "bindings",
                "events",
                "pods/status",
                "resourcequotas/status",
                "namespaces/status",
                "replicationcontrollers/status",
                "pods/log",
            ],
        ),
        rule(READ, &[""], &["namespaces"]),
        rule(READ, &["discovery.k8s.io"], &["endpointslices"]),
        rule(
            READ,
            &["apps"],
            &[
                "controllerrevisions",
                "statefulsets",
                "statefulsets/scale",
                "statefulsets/status",
                "daemonsets",
                "daemonsets/status",
                "deployments",
                "deployments/scale",
                "deployments/status",
                "replicasets",
                "replicasets/scale",
                "replicasets/status",
            ],
        ),
        rule(
            READ,
            &["autoscaling"],
            &[
                "horizontalpodautoscalers",
                "horizontalpodautoscalers/status",
            ],
        ),
        rule(
            READ,
            &["batch"],
            &["jobs", "cronjobs", "cronjobs/status", "jobs/status"],
        ),
        rule(
            READ,
            &["policy"],
            &["poddisruptionbudgets", "poddisruptionbudgets/status"],
        ),
        rule(
            READ,
            &["networking.k8s.io"],
            &["networkpolicies", "ingresses", "ingresses/status"],
        ),
    ]
}

fn edit_rules() -> Vec<Value> {
    vec![
        rule(
            READ,
            &[""],
            &[
                "pods/attach",
                "pods/proxy",
                "pods/exec",
                "pods/portforward",
                "secrets",
                "services/proxy",
            ],
        ),
        rule(&["impersonate"], &[""], &["serviceaccounts"]),
        rule(
            WRITE,
            &[""],
            &[
                "pods",
                "pods/attach",
                "pods/proxy",
                "pods/exec",
                "pods/portforward",
            ],
        ),
        rule(&["create"], &[""], &["pods/eviction"]),
        rule(
            WRITE,
            &[""],
            &[
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "serviceaccounts",
                "services",
                "services/proxy",
                "persistentvolumeclaims",
                "configmaps",
                "secrets",
                "events",
            ],
        ),
        rule(&["create"], &[""], &["serviceaccounts/token"]),
        rule(
            WRITE,
            &["apps"],
            &[
                "statefulsets",
                "statefulsets/scale",
                "daemonsets",
                "deployments",
                "deployments/scale",
                "deployments/rollback",
                "replicasets",
                "replicasets/scale",
            ],
        ),
        rule(WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
        rule(WRITE, &["batch"], &["jobs", "cronjobs"]),
        rule(WRITE, &["policy"], &["poddisruptionbudgets"]),
        rule(
            WRITE,
            &["networking.k8s.io"],
            &["networkpolicies", "ingresses"],
        ),
        rule(READ_WRITE, &["coordination.k8s.io"], &["leases"]),
    ]
}

/// Upstream's bootstrap ClusterRoleBindings and the ones kubeadm adds for node join.
pub fn cluster_role_bindings() -> Vec<Value> {
    let group = |n: &str| subject("Group", n);
    let user = |n: &str| subject("User", n);
    vec![
        binding(
            "cluster-admin",
            "cluster-admin",
            vec![group("system:masters")],
            true,
        ),
        binding(
            "system:discovery",
            "system:discovery",
            vec![group("system:authenticated")],
            true,
        ),
        binding(
            "system:basic-user",
            "system:basic-user",
            vec![group("system:authenticated")],
            true,
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            vec![
                group("system:authenticated"),
                group("system:unauthenticated"),
            ],
            true,
        ),
        binding(
            "system:monitoring",
            "system:monitoring",
            vec![group("system:monitoring")],
            true,
        ),
        binding(
            "system:node-proxier",
            "system:node-proxier",
            vec![user("system:kube-proxy")],
            true,
        ),
        binding(
            "system:kube-scheduler",
            "system:kube-scheduler",
            vec![user("system:kube-scheduler")],
            true,
        ),
        // Upstream keeps this binding empty: nodes are authorized by the Node authorizer.
        binding("system:node", "system:node", vec![], true),
        binding(
            "system:service-account-issuer-discovery",
            "system:service-account-issuer-discovery",
            vec![group("system:serviceaccounts")],
            true,
        ),
        binding(
            "kubeadm:kubelet-bootstrap",
            "system:node-bootstrapper",
            vec![group("system:bootstrappers:kubeadm:default-node-token")],
            false,
        ),
        binding(
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            vec![group("system:bootstrappers:kubeadm:default-node-token")],
            false,
        ),
        binding(
            "kubeadm:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            vec![group("system:nodes")],
            false,
        ),
    ]
}

/// Creates what is missing and tops up auto-updated objects; run at every start.
pub fn reconcile(st: &ApiState) -> Result<(), StoreError> {
    for role in cluster_roles() {
        reconcile_one(st, "clusterroles", None, role)?;
    }
    for b in cluster_role_bindings() {
        reconcile_one(st, "clusterrolebindings", None, b)?;
    }
    // kubeadm's cluster-info access for joining nodes, before they have credentials.
    let ns = Some("kube-public");
    reconcile_one(
        st,
        "roles",
        ns,
        json!({"metadata": {"name": "kubeadm:bootstrap-signer-clusterinfo"},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": ["cluster-info"]}]}),
    )?;
    reconcile_one(
        st,
        "rolebindings",
        ns,
        json!({"metadata": {"name": "kubeadm:bootstrap-signer-clusterinfo"},
            "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "kubeadm:bootstrap-signer-clusterinfo"},
            "subjects": [subject("User", "system:anonymous")]}),
    )?;
    aggregate(st.store.as_ref())
}

fn reconcile_one(
    st: &ApiState,
    plural: &str,
    ns: Option<&str>,
    want: Value,
) -> Result<(), StoreError> {
    ensure_object(st, GROUP, plural, ns, want.clone())?;
    if want.pointer(&format!(
        "/metadata/annotations/{}",
        AUTOUPDATE.replace('/', "~1")
    )) != Some(&json!("true"))
    {
        return Ok(());
    }
    let Some(t) = target(GROUP, plural, ns) else {
        return Ok(());
    };
    let name = want["metadata"]["name"].as_str().unwrap_or("");
    st.store.mutate(&key(t.info, ns, name), &mut |cur| {
        let Some(cur) = cur else {
            return Ok(Mutation::Keep);
        };
        let auto = cur
            .object
            .pointer(&format!(
                "/metadata/annotations/{}",
                AUTOUPDATE.replace('/', "~1")
            ))
            .and_then(Value::as_str);
        if auto != Some("true") {
            return Ok(Mutation::Keep);
        }
        let mut new = (*cur.object).clone();
        for field in ["labels", "annotations"] {
            if let Some(w) = want["metadata"][field].as_object() {
                for (k, v) in w {
                    if new["metadata"][field].get(k).is_none() {
                        new["metadata"][field][k] = v.clone();
                    }
                }
            }
        }
        // An aggregated role's rules are the controller's; only its selectors are topped up.
        let aggregated = want.get("aggregationRule").is_some();
        let lists: &[&str] = if aggregated {
            &["/aggregationRule/clusterRoleSelectors"]
        } else {
            &["/rules", "/subjects"]
        };
        for ptr in lists {
            let Some(wanted) = want.pointer(ptr).and_then(Value::as_array) else {
                continue;
            };
            let have = new.pointer(ptr).and_then(Value::as_array).cloned();
            let mut have = have.unwrap_or_default();
            for w in wanted {
                if !have.contains(w) {
                    have.push(w.clone());
                }
            }
            set_pointer(&mut new, ptr, Value::Array(have));
        }
        if new == *cur.object {
            Ok(Mutation::Keep)
        } else {
            Ok(Mutation::Put(new))
        }
    })?;
    Ok(())
}

fn set_pointer(obj: &mut Value, ptr: &str, v: Value) {
    let mut cur = obj;
    let parts: Vec<&str> = ptr.trim_start_matches('/').split('/').collect();
    for (i, p) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        if i + 1 == parts.len() {
            cur[*p] = v;
            return;
        }
        cur = &mut cur[*p];
    }
}

fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// The aggregation controller's pass: each ClusterRole with an aggregationRule gets the
/// rules of every ClusterRole its selectors match (in name order, without duplicates).
pub fn aggregate(store: &dyn Store) -> Result<(), StoreError> {
    let prefix = format!("/{GROUP}/clusterroles/");
    let (roles, _) = store.list(&prefix)?;
    for r in &roles {
        let Some(selectors) = r
            .object
            .pointer("/aggregationRule/clusterRoleSelectors")
            .and_then(Value::as_array)
        else {
            continue;
        };
        let sels: Vec<_> = selectors
            .iter()
            .filter_map(crate::controllers::controller_utils::label_selector)
            .collect();
        let me = r.object.pointer("/metadata/name").and_then(Value::as_str);
        let mut rules: Vec<Value> = Vec::new();
        for other in &roles {
            if other
                .object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                == me
            {
                continue;
            }
            let labels = labels_of(&other.object);
            if !sels.iter().any(|s| s.matches(&labels)) {
                continue;
            }
            for rule in other.object["rules"].as_array().into_iter().flatten() {
                if !rules.contains(rule) {
                    rules.push(rule.clone());
                }
            }
        }
        if r.object.get("rules") == Some(&Value::Array(rules.clone())) {
            continue;
        }
        store.mutate(&r.key, &mut |cur| {
            let Some(cur) = cur else {
                return Ok(Mutation::Keep);
            };
            let mut new = (*cur.object).clone();
            new["rules"] = Value::Array(rules.clone());
            Ok(Mutation::Put(new))
        })?;
    }
    Ok(())
}

/// Keeps aggregated ClusterRoles up to date while the server runs.
pub async fn run_aggregation(store: std::sync::Arc<dyn Store>) {
    let prefix = format!("/{GROUP}/clusterroles/");
    loop {
        let Ok(mut rx) = store.watch(&prefix, store.revision()) else {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            continue;
        };
        if let Err(e) = aggregate(store.as_ref()) {
            tracing::warn!(error = %e, "ClusterRole aggregation");
        }
        while rx.recv().await.is_some() {
            while rx.try_recv().is_ok() {}
            if let Err(e) = aggregate(store.as_ref()) {
                tracing::warn!(error = %e, "ClusterRole aggregation");
            }
        }
    }
}
