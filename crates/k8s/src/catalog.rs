//! The resource catalogue: every built-in resource the API server serves and discovery lists,
//! with upstream's plurals, short names, categories, verbs and subresources — plus the
//! custom resources the API server's CustomResourceDefinitions add at run time
//! ([`set_custom`]), which every lookup sees the same way.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use crate::gvk::Gvk;

/// One served resource, as `kubectl api-resources -o wide` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceInfo {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub verbs: &'static [&'static str],
    pub subresources: &'static [&'static str],
    /// Defined by a CustomResourceDefinition rather than built in.
    pub custom: bool,
}

impl ResourceInfo {
    pub fn gvk(&self) -> Gvk {
        Gvk::new(self.group, self.version, self.kind)
    }
}

/// Upstream's verb set for an ordinary resource (custom resources' too).
pub const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
/// Namespaces cannot be deleted as a collection upstream.
const NO_COLLECTION_DELETE: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];
/// The review APIs: answered, never stored.
const CREATE_ONLY: &[&str] = &["create"];
const ALL: &[&str] = &["all"];
const NONE: &[&str] = &[];

// One positional row per resource keeps the table readable; the fields are all needed.
#[allow(clippy::too_many_arguments)]
const fn entry(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    categories: &'static [&'static str],
    verbs: &'static [&'static str],
    subresources: &'static [&'static str],
) -> ResourceInfo {
    ResourceInfo {
        group,
        version,
        kind,
        plural,
        singular,
        namespaced,
        short_names,
        categories,
        verbs,
        subresources,
        custom: false,
    }
}

static CATALOG: &[ResourceInfo] = &[
    entry(
        "",
        "v1",
        "Binding",
        "bindings",
        "binding",
        true,
        NONE,
        NONE,
        &["create"],
        NONE,
    ),
    entry(
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        "configmap",
        true,
        &["cm"],
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "",
        "v1",
        "Endpoints",
        "endpoints",
        "endpoints",
        true,
        &["ep"],
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "",
        "v1",
        "Event",
        "events",
        "event",
        true,
        &["ev"],
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "",
        "v1",
        "Namespace",
        "namespaces",
        "namespace",
        false,
        &["ns"],
        NONE,
        NO_COLLECTION_DELETE,
        &["status", "finalize"],
    ),
    entry(
        "",
        "v1",
        "Node",
        "nodes",
        "node",
        false,
        &["no"],
        NONE,
        ALL_VERBS,
        &["status", "proxy"],
    ),
    entry(
        "",
        "v1",
        "Pod",
        "pods",
        "pod",
        true,
        &["po"],
        ALL,
        ALL_VERBS,
        &[
            "status",
            "binding",
            "log",
            "exec",
            "attach",
            "portforward",
            "eviction",
            "ephemeralcontainers",
        ],
    ),
    entry(
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        true,
        &["pvc"],
        NONE,
        ALL_VERBS,
        &["status"],
    ),
    entry(
        "",
        "v1",
        "PersistentVolume",
        "persistentvolumes",
        "persistentvolume",
        false,
        &["pv"],
        NONE,
        ALL_VERBS,
        &["status"],
    ),
    entry(
        "",
        "v1",
        "ReplicationController",
        "replicationcontrollers",
        "replicationcontroller",
        true,
        &["rc"],
        ALL,
        ALL_VERBS,
        &["status", "scale"],
    ),
    entry(
        "", "v1", "Secret", "secrets", "secret", true, NONE, NONE, ALL_VERBS, NONE,
    ),
    entry(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        true,
        &["sa"],
        NONE,
        ALL_VERBS,
        &["token"],
    ),
    entry(
        "",
        "v1",
        "Service",
        "services",
        "service",
        true,
        &["svc"],
        ALL,
        ALL_VERBS,
        &["status", "proxy"],
    ),
    entry(
        "certificates.k8s.io",
        "v1",
        "CertificateSigningRequest",
        "certificatesigningrequests",
        "certificatesigningrequest",
        false,
        &["csr"],
        NONE,
        ALL_VERBS,
        &["approval", "status"],
    ),
    entry(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        "lease",
        true,
        NONE,
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        "endpointslice",
        true,
        NONE,
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        "event",
        true,
        &["ev"],
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "networking.k8s.io",
        "v1",
        "IngressClass",
        "ingressclasses",
        "ingressclass",
        false,
        NONE,
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "networking.k8s.io",
        "v1",
        "Ingress",
        "ingresses",
        "ingress",
        true,
        &["ing"],
        NONE,
        ALL_VERBS,
        &["status"],
    ),
    entry(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        "networkpolicy",
        true,
        &["netpol"],
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "FlowSchema",
        "flowschemas",
        "flowschema",
        false,
        NONE,
        NONE,
        ALL_VERBS,
        &["status"],
    ),
    entry(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "PriorityLevelConfiguration",
        "prioritylevelconfigurations",
        "prioritylevelconfiguration",
        false,
        NONE,
        NONE,
        ALL_VERBS,
        &["status"],
    ),
    entry(
        "apiregistration.k8s.io",
        "v1",
        "APIService",
        "apiservices",
        "apiservice",
        false,
        NONE,
        &["api-extensions"],
        ALL_VERBS,
        &["status"],
    ),
    entry(
        "node.k8s.io",
        "v1",
        "RuntimeClass",
        "runtimeclasses",
        "runtimeclass",
        false,
        NONE,
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        true,
        &["pdb"],
        NONE,
        ALL_VERBS,
        &["status"],
    ),
    entry(
        "scheduling.k8s.io",
        "v1",
        "PriorityClass",
        "priorityclasses",
        "priorityclass",
        false,
        &["pc"],
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "authentication.k8s.io",
        "v1",
        "SelfSubjectReview",
        "selfsubjectreviews",
        "selfsubjectreview",
        false,
        NONE,
        NONE,
        CREATE_ONLY,
        NONE,
    ),
    entry(
        "authentication.k8s.io",
        "v1",
        "TokenReview",
        "tokenreviews",
        "tokenreview",
        false,
        NONE,
        NONE,
        CREATE_ONLY,
        NONE,
    ),
    entry(
        "authorization.k8s.io",
        "v1",
        "LocalSubjectAccessReview",
        "localsubjectaccessreviews",
        "localsubjectaccessreview",
        true,
        NONE,
        NONE,
        CREATE_ONLY,
        NONE,
    ),
    entry(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        false,
        NONE,
        NONE,
        CREATE_ONLY,
        NONE,
    ),
    entry(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectRulesReview",
        "selfsubjectrulesreviews",
        "selfsubjectrulesreview",
        false,
        NONE,
        NONE,
        CREATE_ONLY,
        NONE,
    ),
    entry(
        "authorization.k8s.io",
        "v1",
        "SubjectAccessReview",
        "subjectaccessreviews",
        "subjectaccessreview",
        false,
        NONE,
        NONE,
        CREATE_ONLY,
        NONE,
    ),
    entry(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        false,
        NONE,
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        false,
        NONE,
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        true,
        NONE,
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        "role",
        true,
        NONE,
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "storage.k8s.io",
        "v1",
        "StorageClass",
        "storageclasses",
        "storageclass",
        false,
        &["sc"],
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "apps",
        "v1",
        "ControllerRevision",
        "controllerrevisions",
        "controllerrevision",
        true,
        NONE,
        NONE,
        ALL_VERBS,
        NONE,
    ),
    entry(
        "apps",
        "v1",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        true,
        &["ds"],
        ALL,
        ALL_VERBS,
        &["status"],
    ),
    entry(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        "deployment",
        true,
        &["deploy"],
        ALL,
        ALL_VERBS,
        &["status", "scale"],
    ),
    entry(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        "statefulset",
        true,
        &["sts"],
        ALL,
        ALL_VERBS,
        &["status", "scale"],
    ),
    entry(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        true,
        &["rs"],
        ALL,
        ALL_VERBS,
        &["status", "scale"],
    ),
    entry(
        "batch",
        "v1",
        "CronJob",
        "cronjobs",
        "cronjob",
        true,
        &["cj"],
        ALL,
        ALL_VERBS,
        &["status"],
    ),
    entry(
        "batch",
        "v1",
        "Job",
        "jobs",
        "job",
        true,
        NONE,
        ALL,
        ALL_VERBS,
        &["status"],
    ),
    entry(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        "customresourcedefinition",
        false,
        &["crd", "crds"],
        &["api-extensions"],
        ALL_VERBS,
        &["status"],
    ),
];

/// Every built-in resource, core group first.
pub fn all() -> &'static [ResourceInfo] {
    CATALOG
}

/// The custom resources currently served; entries live for the process (a CRD's resource
/// may be re-registered many times, but each distinct entry is leaked once).
static CUSTOM: RwLock<Vec<&'static ResourceInfo>> = RwLock::new(Vec::new());
static INTERNED: Mutex<Vec<&'static ResourceInfo>> = Mutex::new(Vec::new());
static STRINGS: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A `'static` copy of `s`, shared by every caller asking for the same text.
pub fn intern(s: &str) -> &'static str {
    let mut g = STRINGS.lock().unwrap_or_else(|e| e.into_inner());
    let set = g.get_or_insert_with(HashSet::new);
    if let Some(found) = set.get(s) {
        return found;
    }
    let leaked: &'static str = Box::leak(s.to_string().into_boxed_str());
    set.insert(leaked);
    leaked
}

/// A `'static` list of interned strings.
pub fn intern_list(items: &[String]) -> &'static [&'static str] {
    if items.is_empty() {
        return NONE;
    }
    let v: Vec<&'static str> = items.iter().map(|s| intern(s)).collect();
    Box::leak(v.into_boxed_slice())
}

fn intern_info(info: ResourceInfo) -> &'static ResourceInfo {
    let mut g = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = g.iter().find(|i| ***i == info) {
        return found;
    }
    let leaked: &'static ResourceInfo = Box::leak(Box::new(info));
    g.push(leaked);
    leaked
}

/// Replaces the custom resources served (one entry per served version of each CRD).
pub fn set_custom(list: Vec<ResourceInfo>) {
    let list: Vec<&'static ResourceInfo> = list
        .into_iter()
        .map(|mut i| {
            i.custom = true;
            intern_info(i)
        })
        .collect();
    let mut g = CUSTOM.write().unwrap_or_else(|e| e.into_inner());
    if *g != list {
        *g = list;
        GENERATION.fetch_add(1, Ordering::SeqCst);
    }
}

/// The custom resources currently served.
pub fn custom() -> Vec<&'static ResourceInfo> {
    CUSTOM.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Moves whenever the custom resources change (discovery re-renders its documents).
pub fn generation() -> u64 {
    GENERATION.load(Ordering::SeqCst)
}

/// Built-in and custom resources.
pub fn served() -> Vec<&'static ResourceInfo> {
    let mut v: Vec<&'static ResourceInfo> = CATALOG.iter().collect();
    v.extend(custom());
    v
}

/// Looks a resource up by its URL path segments.
pub fn by_plural(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    let hit = |r: &&ResourceInfo| r.group == group && r.version == version && r.plural == plural;
    CATALOG
        .iter()
        .find(hit)
        .or_else(|| custom().into_iter().find(hit))
}

/// Looks a resource up by group and kind (any served version).
pub fn by_kind(group: &str, kind: &str) -> Option<&'static ResourceInfo> {
    let hit = |r: &&ResourceInfo| r.group == group && r.kind == kind;
    CATALOG
        .iter()
        .find(hit)
        .or_else(|| custom().into_iter().find(hit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_agree() {
        for r in all() {
            assert_eq!(by_plural(r.group, r.version, r.plural), Some(r));
            assert_eq!(by_kind(r.group, r.kind), Some(r));
            assert_eq!(r.gvk().kind, r.kind);
        }
    }

    #[test]
    fn custom_resources_join_the_lookups_until_replaced() {
        let gizmo = |version: &'static str| ResourceInfo {
            group: "gizmos.test.nodus.dev",
            version,
            kind: "Gizmo",
            plural: "gizmos",
            singular: "gizmo",
            namespaced: true,
            short_names: &["gz"],
            categories: NONE,
            verbs: ALL_VERBS,
            subresources: &["status"],
            custom: false,
        };
        let before = generation();
        set_custom(vec![gizmo("v1"), gizmo("v2")]);
        assert!(generation() > before);
        let found = by_plural("gizmos.test.nodus.dev", "v2", "gizmos");
        assert_eq!(found.map(|r| (r.kind, r.custom)), Some(("Gizmo", true)));
        assert!(by_kind("gizmos.test.nodus.dev", "Gizmo").is_some());
        assert!(served().iter().any(|r| r.plural == "gizmos"));
        // The same entry registered again is the same leaked value, not a new one.
        let again = generation();
        set_custom(vec![gizmo("v1"), gizmo("v2")]);
        assert_eq!(generation(), again);
        assert!(std::ptr::eq(
            found.unwrap(),
            by_plural("gizmos.test.nodus.dev", "v2", "gizmos").unwrap()
        ));
        set_custom(Vec::new());
        assert_eq!(by_plural("gizmos.test.nodus.dev", "v1", "gizmos"), None);
        assert_eq!(intern("gizmos"), intern(&String::from("gizmos")));
    }

    #[test]
    fn upstream_short_names_and_scopes() {
        let pods = by_plural("", "v1", "pods").map(|r| (r.short_names, r.categories, r.namespaced));
        assert_eq!(pods, Some((&["po"][..], &["all"][..], true)));
        let nodes = by_kind("", "Node").map(|r| (r.short_names, r.namespaced));
        assert_eq!(nodes, Some((&["no"][..], false)));
        let pc =
            by_kind("scheduling.k8s.io", "PriorityClass").map(|r| (r.short_names, r.namespaced));
        assert_eq!(pc, Some((&["pc"][..], false)));
        assert_eq!(
            by_kind("", "Binding").map(|r| r.verbs),
            Some(&["create"][..])
        );
        assert!(by_kind("", "Namespace").is_some_and(|r| !r.verbs.contains(&"deletecollection")));
        assert!(
            by_plural("apps", "v1", "deployments")
                .is_some_and(|r| r.subresources.contains(&"scale"))
        );
        assert_eq!(by_plural("apps", "v2", "deployments"), None);
        let storage: Vec<_> = [
            ("", "PersistentVolume"),
            ("", "PersistentVolumeClaim"),
            ("storage.k8s.io", "StorageClass"),
        ]
        .iter()
        .filter_map(|(g, k)| by_kind(g, k).map(|r| (r.short_names, r.namespaced)))
        .collect();
        assert_eq!(
            storage,
            vec![
                (&["pv"][..], false),
                (&["pvc"][..], true),
                (&["sc"][..], false)
            ]
        );
        let cr = by_plural("apps", "v1", "controllerrevisions").map(|r| {
            (
                r.kind,
                r.short_names,
                r.categories,
                r.namespaced,
                r.verbs.len(),
            )
        });
        assert_eq!(cr, Some(("ControllerRevision", &[][..], &[][..], true, 8)));
        let rc = by_plural("", "v1", "replicationcontrollers")
            .map(|r| (r.short_names, r.categories, r.subresources));
        assert_eq!(
            rc,
            Some((&["rc"][..], &["all"][..], &["status", "scale"][..]))
        );
    }
}
