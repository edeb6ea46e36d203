//! The resource catalogue: every built-in resource the API server serves and discovery lists,
//! with upstream's plurals, short names, categories, verbs and subresources.

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
}

impl ResourceInfo {
    pub fn gvk(&self) -> Gvk {
        Gvk::new(self.group, self.version, self.kind)
    }
}

/// Upstream's verb set for an ordinary resource.
const ALL_VERBS: &[&str] = &[
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
];

/// Every served resource, core group first.
pub fn all() -> &'static [ResourceInfo] {
    CATALOG
}

/// Looks a resource up by its URL path segments.
pub fn by_plural(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    CATALOG
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Looks a resource up by group and kind (any served version).
pub fn by_kind(group: &str, kind: &str) -> Option<&'static ResourceInfo> {
    CATALOG.iter().find(|r| r.group == group && r.kind == kind)
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
