//! The bootstrap RBAC policy (upstream's `plugin/pkg/auth/authorizer/rbac/bootstrappolicy`
//! plus the bindings kubeadm creates for node join; the controllers' roles are in
//! `controller_policy`), reconciled at every start, and the ClusterRole aggregation
//! controller.
//!
//! Reconciliation creates what is missing; on objects annotated
//! `rbac.authorization.kubernetes.io/autoupdate: "true"` it adds missing rules, subjects,
//! labels and aggregation selectors, and never removes what users added.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::controller_policy;
use crate::apiserver::bootstrap::ensure_object;
use crate::apiserver::rest::path::key;
use crate::apiserver::state::ApiState;
use crate::controllers::objects::target;
use crate::storage::{Mutation, Store, StoreError};

const GROUP: &str = "rbac.authorization.k8s.io";
const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";
pub(super) const READ: &[&str] = &["get", "list", "watch"];
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

pub(super) fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Value {
    json!({"verbs": verbs, "apiGroups": groups, "resources": resources})
}

/// `rule` limited to the named objects.
pub(super) fn named(mut rule: Value, names: &[&str]) -> Value {
    rule["resourceNames"] = json!(names);
    rule
}

/// Upstream's `eventsRule`: recording events, in both event groups.
pub(super) fn events_rule() -> Value {
    rule(
        &["create", "patch", "update"],
        &["", "events.k8s.io"],
        &["events"],
    )
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

pub(super) fn cluster_role(name: &str, labels: &[(&str, &str)], rules: Vec<Value>) -> Value {
    json!({"metadata": bootstrap_meta(name, labels, true), "rules": rules})
}

fn aggregated(name: &str, labels: &[(&str, &str)], selects: &str) -> Value {
    json!({"metadata": bootstrap_meta(name, labels, true), "rules": [],
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {selects: "true"}}]}})
}

/// A binding's subject that is not a service account.
#[derive(Clone, Copy, Debug)]
enum Subject {
    User,
    Group,
}

fn subject(kind: Subject, name: &str) -> Value {
    let kind = match kind {
        Subject::User => "User",
        Subject::Group => "Group",
    };
    json!({"kind": kind, "apiGroup": GROUP, "name": name})
}

/// A service account subject: in the core group, so without `apiGroup`, as upstream writes it.
pub(super) fn service_account(namespace: &str, name: &str) -> Value {
    json!({"kind": "ServiceAccount", "namespace": namespace, "name": name})
}

pub(super) fn binding(name: &str, role: &str, subjects: Vec<Value>, autoupdate: bool) -> Value {
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
    let mut roles = vec![cluster_role(
        "cluster-admin",
        &[],
        vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])],
    )];
    roles.extend(
        PATH_READERS
            .iter()
            .map(|(name, paths)| cluster_role(name, &[], vec![urls(&["get"], paths)])),
    );
    roles.extend(NODE_JOIN_ROLES.iter().map(|(name, verbs, resource)| {
        cluster_role(name, &[], vec![rule(verbs, &[csr], &[resource])])
    }));
    roles.extend([
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
                events_rule(),
                rule(READ, &["discovery.k8s.io"], &["endpointslices"]),
            ],
        ),
        cluster_role(
            "system:kube-controller-manager",
            &[],
            vec![
                events_rule(),
                rule(&["create"], &["coordination.k8s.io"], &["leases"]),
                rule(&["get", "update"], &["coordination.k8s.io"], &["leases"]),
                rule(&["create"], &[""], &["secrets", "serviceaccounts"]),
                rule(&["delete"], &[""], &["secrets"]),
                rule(
                    &["get"],
                    &[""],
                    &["namespaces", "secrets", "serviceaccounts"],
                ),
                rule(&["update"], &[""], &["secrets", "serviceaccounts"]),
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
                rule(&["list", "watch"], &["*"], &["*"]),
                rule(&["create"], &[""], &["serviceaccounts/token"]),
                // Every control loop runs with the manager's own credentials (upstream's
                // default, --use-service-account-credentials=false), so this identity
                // holds what upstream's system:controller:* roles grant each loop.
                rule(
                    &[
                        "get",
                        "create",
                        "update",
                        "patch",
                        "delete",
                        "deletecollection",
                    ],
                    &["*"],
                    &["*"],
                ),
                // The ClusterRole aggregation controller's: aggregated roles carry rules
                // this identity does not hold itself.
                rule(
                    &["escalate"],
                    &["rbac.authorization.k8s.io"],
                    &["clusterroles"],
                ),
            ],
        ),
        cluster_role(
            "system:kube-scheduler",
            &[],
            vec![
                events_rule(),
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
                events_rule(),
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
    ]);
    roles
}

/// Roles that only read non-resource paths: discovery, health, metrics, the issuer's
/// documents.
const PATH_READERS: &[(&str, &[&str])] = &[
    (
        "system:discovery",
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
    ),
    (
        "system:public-info-viewer",
        &["/healthz", "/livez", "/readyz", "/version", "/version/"],
    ),
    (
        "system:monitoring",
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
    ),
    (
        "system:service-account-issuer-discovery",
        &[
            "/.well-known/openid-configuration",
            "/.well-known/openid-configuration/",
            "/openid/v1/jwks",
            "/openid/v1/jwks/",
        ],
    ),
];

/// The CertificateSigningRequest roles of node join: name, verbs, resource.
const NODE_JOIN_ROLES: &[(&str, &[&str], &str)] = &[
    (
        "system:node-bootstrapper",
        &["create", "get", "list", "watch"],
        "certificatesigningrequests",
    ),
    (
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        &["create"],
        "certificatesigningrequests/nodeclient",
    ),
    (
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        &["create"],
        "certificatesigningrequests/selfnodeclient",
    ),
];

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

/// Upstream's bootstrap ClusterRoleBindings, each of the ClusterRole of its own name.
const BINDINGS: &[(&str, &[(Subject, &str)])] = &[
    ("cluster-admin", &[(Subject::Group, "system:masters")]),
    (
        "system:discovery",
        &[(Subject::Group, "system:authenticated")],
    ),
    (
        "system:basic-user",
        &[(Subject::Group, "system:authenticated")],
    ),
    (
        "system:public-info-viewer",
        &[
            (Subject::Group, "system:authenticated"),
            (Subject::Group, "system:unauthenticated"),
        ],
    ),
    (
        "system:monitoring",
        &[(Subject::Group, "system:monitoring")],
    ),
    (
        "system:node-proxier",
        &[(Subject::User, "system:kube-proxy")],
    ),
    (
        "system:kube-controller-manager",
        &[(Subject::User, "system:kube-controller-manager")],
    ),
    (
        "system:kube-scheduler",
        &[(Subject::User, "system:kube-scheduler")],
    ),
    // Upstream keeps this binding empty: nodes are authorized by the Node authorizer.
    ("system:node", &[]),
    (
        "system:service-account-issuer-discovery",
        &[(Subject::Group, "system:serviceaccounts")],
    ),
];

/// kubeadm's node-join bindings (not auto-updated, as kubeadm creates them): name, role,
/// group.
const KUBEADM_BINDINGS: &[(&str, &str, &str)] = &[
    (
        "kubeadm:kubelet-bootstrap",
        "system:node-bootstrapper",
        "system:bootstrappers:kubeadm:default-node-token",
    ),
    (
        "kubeadm:node-autoapprove-bootstrap",
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        "system:bootstrappers:kubeadm:default-node-token",
    ),
    (
        "kubeadm:node-autoapprove-certificate-rotation",
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        "system:nodes",
    ),
];

/// Upstream's bootstrap ClusterRoleBindings and the ones kubeadm adds for node join.
pub fn cluster_role_bindings() -> Vec<Value> {
    let upstream = BINDINGS.iter().map(|(name, subjects)| {
        let subjects = subjects.iter().map(|(k, n)| subject(*k, n)).collect();
        binding(name, name, subjects, true)
    });
    let kubeadm = KUBEADM_BINDINGS.iter().map(|(name, role, group)| {
        binding(name, role, vec![subject(Subject::Group, group)], false)
    });
    upstream.chain(kubeadm).collect()
}

/// Creates what is missing and tops up auto-updated objects; run at every start.
pub fn reconcile(st: &ApiState) -> Result<(), StoreError> {
    for role in cluster_roles()
        .into_iter()
        .chain(controller_policy::cluster_roles())
    {
        reconcile_one(st, "clusterroles", None, role)?;
    }
    for b in cluster_role_bindings()
        .into_iter()
        .chain(controller_policy::cluster_role_bindings())
    {
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
            "subjects": [subject(Subject::User, "system:anonymous")]}),
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
