//! The controllers' part of the bootstrap RBAC policy (upstream's
//! `bootstrappolicy/controller_policy.go`): a `system:controller:<name>` ClusterRole per
//! kube-controller-manager controller, bound by a ClusterRoleBinding of the same name to
//! the service account `kube-system/<name>`, the identity the controller acts as with
//! `--use-service-account-credentials`. Reconciled with the rest of the bootstrap policy by
//! [`super::policy::reconcile`], so they are created at start and restored if deleted.
//!
//! The set and the rules are upstream's with its default feature gates. Verbs, groups and
//! resources are listed sorted, as upstream's rule builder stores them, so that `kubectl get
//! -o yaml` reads as on a kube-apiserver and reconciliation compares equal rules as equal.

use serde_json::Value;

use super::policy::{READ, binding, cluster_role, events_rule, named, rule, service_account};

/// Upstream's prefix of a controller's role; the rest is the controller's service account.
const ROLE_PREFIX: &str = "system:controller:";
/// Where the controllers' service accounts live.
const NAMESPACE: &str = "kube-system";

const CORE: &[&str] = &[""];
const APPS: &[&str] = &["apps"];
/// Upstream's workload controller roles still name the retired `extensions` group.
const APPS_EXTENSIONS: &[&str] = &["apps", "extensions"];
const BATCH: &[&str] = &["batch"];
const CERTIFICATES: &[&str] = &["certificates.k8s.io"];
const DISCOVERY: &[&str] = &["discovery.k8s.io"];
const NETWORKING: &[&str] = &["networking.k8s.io"];
const RESOURCE: &[&str] = &["resource.k8s.io"];
const STORAGE: &[&str] = &["storage.k8s.io"];
const ADMISSION: &[&str] = &["admissionregistration.k8s.io"];
const ANY: &[&str] = &["*"];

const LIST_WATCH: &[&str] = &["list", "watch"];
const UPDATE: &[&str] = &["update"];
const PATCH_UPDATE: &[&str] = &["patch", "update"];
const GET_LIST_UPDATE_WATCH: &[&str] = &["get", "list", "update", "watch"];
/// Pods a workload controller creates, adopts or releases, and deletes.
const POD_OWNER: &[&str] = &["create", "delete", "list", "patch", "watch"];
/// Every verb on single objects (no `deletecollection`).
const MANAGE: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];
/// What the endpoints and EndpointSlice controllers do to the objects they maintain.
const MAINTAIN: &[&str] = &["create", "delete", "get", "list", "update", "watch"];

/// Each controller (its service account's name) and the rules of its role.
fn controllers() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        (
            "attachdetach-controller",
            vec![
                rule(
                    LIST_WATCH,
                    CORE,
                    &["persistentvolumeclaims", "persistentvolumes"],
                ),
                rule(READ, CORE, &["nodes"]),
                rule(PATCH_UPDATE, CORE, &["nodes/status"]),
                rule(LIST_WATCH, CORE, &["pods"]),
                events_rule(),
                rule(
                    &["create", "delete", "get", "list", "watch"],
                    STORAGE,
                    &["volumeattachments"],
                ),
                rule(READ, STORAGE, &["csidrivers"]),
                rule(READ, STORAGE, &["csinodes"]),
            ],
        ),
        (
            "certificate-controller",
            vec![
                rule(
                    &["delete", "get", "list", "watch"],
                    CERTIFICATES,
                    &["certificatesigningrequests"],
                ),
                rule(
                    UPDATE,
                    CERTIFICATES,
                    &[
                        "certificatesigningrequests/approval",
                        "certificatesigningrequests/status",
                    ],
                ),
                named(
                    rule(&["approve"], CERTIFICATES, &["signers"]),
                    &["kubernetes.io/kube-apiserver-client-kubelet"],
                ),
                named(
                    rule(&["sign"], CERTIFICATES, &["signers"]),
                    &[
                        "kubernetes.io/kube-apiserver-client",
                        "kubernetes.io/kube-apiserver-client-kubelet",
                        "kubernetes.io/kubelet-serving",
                        "kubernetes.io/legacy-unknown",
                    ],
                ),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
                events_rule(),
            ],
        ),
        (
            "clusterrole-aggregation-controller",
            // `escalate`: it writes into aggregated roles rules it does not itself hold.
            vec![rule(
                &["escalate", "get", "list", "patch", "update", "watch"],
                &["rbac.authorization.k8s.io"],
                &["clusterroles"],
            )],
        ),
        (
            "cronjob-controller",
            vec![
                rule(GET_LIST_UPDATE_WATCH, BATCH, &["cronjobs"]),
                rule(MANAGE, BATCH, &["jobs"]),
                rule(UPDATE, BATCH, &["cronjobs/status"]),
                rule(UPDATE, BATCH, &["cronjobs/finalizers"]),
                rule(&["delete", "list", "watch"], CORE, &["pods"]),
                events_rule(),
            ],
        ),
        (
            "daemon-set-controller",
            vec![
                rule(READ, APPS_EXTENSIONS, &["daemonsets"]),
                rule(UPDATE, APPS_EXTENSIONS, &["daemonsets/status"]),
                rule(UPDATE, APPS_EXTENSIONS, &["daemonsets/finalizers"]),
                rule(LIST_WATCH, CORE, &["nodes"]),
                rule(POD_OWNER, CORE, &["pods"]),
                rule(&["create"], CORE, &["pods/binding"]),
                rule(MANAGE, APPS, &["controllerrevisions"]),
                events_rule(),
            ],
        ),
        (
            "deployment-controller",
            vec![
                rule(GET_LIST_UPDATE_WATCH, APPS_EXTENSIONS, &["deployments"]),
                rule(UPDATE, APPS_EXTENSIONS, &["deployments/status"]),
                rule(UPDATE, APPS_EXTENSIONS, &["deployments/finalizers"]),
                rule(MANAGE, APPS_EXTENSIONS, &["replicasets"]),
                rule(GET_LIST_UPDATE_WATCH, CORE, &["pods"]),
                events_rule(),
            ],
        ),
        (
            "device-taint-eviction-controller",
            vec![
                rule(&["delete", "get", "list", "watch"], CORE, &["pods"]),
                rule(PATCH_UPDATE, CORE, &["pods/status"]),
                rule(READ, RESOURCE, &["resourceclaims"]),
                rule(READ, RESOURCE, &["resourceslices"]),
                rule(READ, RESOURCE, &["deviceclasses"]),
                events_rule(),
            ],
        ),
        (
            "disruption-controller",
            vec![
                rule(READ, APPS_EXTENSIONS, &["deployments"]),
                rule(READ, APPS_EXTENSIONS, &["replicasets"]),
                rule(READ, CORE, &["replicationcontrollers"]),
                rule(READ, &["policy"], &["poddisruptionbudgets"]),
                rule(READ, APPS, &["statefulsets"]),
                rule(UPDATE, &["policy"], &["poddisruptionbudgets/status"]),
                rule(PATCH_UPDATE, CORE, &["pods/status"]),
                // The scale of any workload a budget's pods belong to.
                rule(&["get"], ANY, &["*/scale"]),
                events_rule(),
            ],
        ),
        (
            "endpoint-controller",
            vec![
                rule(READ, CORE, &["pods", "services"]),
                rule(MAINTAIN, CORE, &["endpoints"]),
                rule(&["create"], CORE, &["endpoints/restricted"]),
                events_rule(),
            ],
        ),
        (
            "endpointslice-controller",
            vec![
                rule(READ, CORE, &["nodes", "pods", "services"]),
                // Slices it owns block their Service's deletion (blockOwnerDeletion).
                rule(UPDATE, CORE, &["services/finalizers"]),
                rule(MAINTAIN, DISCOVERY, &["endpointslices"]),
                events_rule(),
            ],
        ),
        (
            "endpointslicemirroring-controller",
            vec![
                rule(READ, CORE, &["endpoints", "services"]),
                rule(UPDATE, CORE, &["services/finalizers"]),
                rule(UPDATE, CORE, &["endpoints/finalizers"]),
                rule(MAINTAIN, DISCOVERY, &["endpointslices"]),
                events_rule(),
            ],
        ),
        (
            "ephemeral-volume-controller",
            vec![
                rule(READ, CORE, &["pods"]),
                rule(UPDATE, CORE, &["pods/finalizers"]),
                rule(
                    &["create", "get", "list", "watch"],
                    CORE,
                    &["persistentvolumeclaims"],
                ),
                events_rule(),
            ],
        ),
        (
            "expand-controller",
            vec![
                rule(
                    &["get", "list", "patch", "update", "watch"],
                    CORE,
                    &["persistentvolumes"],
                ),
                rule(PATCH_UPDATE, CORE, &["persistentvolumeclaims/status"]),
                rule(READ, CORE, &["persistentvolumeclaims"]),
                events_rule(),
            ],
        ),
        (
            "generic-garbage-collector",
            // Owner references may point at any resource.
            vec![
                rule(
                    &["delete", "get", "list", "patch", "update", "watch"],
                    ANY,
                    &["*"],
                ),
                events_rule(),
            ],
        ),
        (
            "horizontal-pod-autoscaler",
            vec![
                rule(READ, &["autoscaling"], &["horizontalpodautoscalers"]),
                rule(
                    UPDATE,
                    &["autoscaling"],
                    &["horizontalpodautoscalers/status"],
                ),
                rule(&["get", "update"], ANY, &["*/scale"]),
                rule(LIST_WATCH, CORE, &["pods"]),
                rule(LIST_WATCH, &["metrics.k8s.io"], &["pods"]),
                rule(READ, &["custom.metrics.k8s.io"], &["*"]),
                rule(READ, &["external.metrics.k8s.io"], &["*"]),
                events_rule(),
            ],
        ),
        (
            "job-controller",
            vec![
                rule(
                    &["get", "list", "patch", "update", "watch"],
                    BATCH,
                    &["jobs"],
                ),
                rule(UPDATE, BATCH, &["jobs/status"]),
                rule(UPDATE, BATCH, &["jobs/finalizers"]),
                rule(POD_OWNER, CORE, &["pods"]),
                events_rule(),
            ],
        ),
        (
            "legacy-service-account-token-cleaner",
            vec![
                named(
                    rule(&["get"], CORE, &["configmaps"]),
                    &["kube-apiserver-legacy-service-account-token-tracking"],
                ),
                rule(&["delete", "patch"], CORE, &["secrets"]),
            ],
        ),
        (
            "namespace-controller",
            vec![
                rule(&["delete", "get", "list", "watch"], CORE, &["namespaces"]),
                rule(UPDATE, CORE, &["namespaces/finalize", "namespaces/status"]),
                // A terminating namespace's content, of every resource.
                rule(
                    &["delete", "deletecollection", "get", "list", "watch"],
                    ANY,
                    &["*"],
                ),
            ],
        ),
        (
            "node-controller",
            vec![
                rule(
                    &["delete", "get", "list", "patch", "update", "watch"],
                    CORE,
                    &["nodes"],
                ),
                rule(PATCH_UPDATE, CORE, &["nodes/status"]),
                // Pods of unreachable nodes are marked not ready, then evicted.
                rule(PATCH_UPDATE, CORE, &["pods/status"]),
                rule(&["delete", "get", "list", "watch"], CORE, &["pods"]),
                events_rule(),
            ],
        ),
        (
            "persistent-volume-binder",
            vec![
                rule(MAINTAIN, CORE, &["persistentvolumes"]),
                rule(UPDATE, CORE, &["persistentvolumes/status"]),
                rule(GET_LIST_UPDATE_WATCH, CORE, &["persistentvolumeclaims"]),
                rule(UPDATE, CORE, &["persistentvolumeclaims/status"]),
                // Recycler pods.
                rule(
                    &["create", "delete", "get", "list", "watch"],
                    CORE,
                    &["pods"],
                ),
                rule(READ, STORAGE, &["storageclasses"]),
                rule(LIST_WATCH, CORE, &["nodes"]),
                events_rule(),
                // The recycler follows its pod's events.
                rule(&["watch"], CORE, &["events"]),
            ],
        ),
        (
            "pod-garbage-collector",
            vec![
                rule(&["delete", "list", "watch"], CORE, &["pods"]),
                rule(READ, CORE, &["nodes"]),
                rule(&["patch"], CORE, &["pods/status"]),
            ],
        ),
        (
            "pv-protection-controller",
            vec![
                rule(GET_LIST_UPDATE_WATCH, CORE, &["persistentvolumes"]),
                events_rule(),
            ],
        ),
        (
            "pvc-protection-controller",
            vec![
                rule(GET_LIST_UPDATE_WATCH, CORE, &["persistentvolumeclaims"]),
                rule(UPDATE, CORE, &["persistentvolumeclaims/status"]),
                rule(READ, CORE, &["pods"]),
                events_rule(),
            ],
        ),
        (
            "replicaset-controller",
            vec![
                rule(GET_LIST_UPDATE_WATCH, APPS_EXTENSIONS, &["replicasets"]),
                rule(UPDATE, APPS_EXTENSIONS, &["replicasets/status"]),
                rule(UPDATE, APPS_EXTENSIONS, &["replicasets/finalizers"]),
                rule(POD_OWNER, CORE, &["pods"]),
                events_rule(),
            ],
        ),
        (
            "replication-controller",
            vec![
                rule(GET_LIST_UPDATE_WATCH, CORE, &["replicationcontrollers"]),
                rule(UPDATE, CORE, &["replicationcontrollers/status"]),
                rule(UPDATE, CORE, &["replicationcontrollers/finalizers"]),
                rule(POD_OWNER, CORE, &["pods"]),
                events_rule(),
            ],
        ),
        (
            "resource-claim-controller",
            vec![
                rule(READ, CORE, &["pods"]),
                rule(UPDATE, CORE, &["pods/finalizers"]),
                rule(
                    &["create", "delete", "get", "list", "watch"],
                    RESOURCE,
                    &["resourceclaims"],
                ),
                rule(
                    PATCH_UPDATE,
                    RESOURCE,
                    &["resourceclaims", "resourceclaims/status"],
                ),
                rule(PATCH_UPDATE, CORE, &["pods/status"]),
                events_rule(),
                rule(PATCH_UPDATE, RESOURCE, &["resourceclaims/binding"]),
            ],
        ),
        (
            "resourcequota-controller",
            // Quota counts objects of any resource.
            vec![
                rule(LIST_WATCH, ANY, &["*"]),
                rule(UPDATE, CORE, &["resourcequotas/status"]),
                events_rule(),
            ],
        ),
        (
            "root-ca-cert-publisher",
            vec![
                rule(&["create", "update"], CORE, &["configmaps"]),
                events_rule(),
            ],
        ),
        (
            "route-controller",
            vec![
                rule(LIST_WATCH, CORE, &["nodes"]),
                rule(&["patch"], CORE, &["nodes/status"]),
                events_rule(),
            ],
        ),
        (
            "selinux-warning-controller",
            vec![
                events_rule(),
                rule(READ, CORE, &["persistentvolumes"]),
                rule(READ, CORE, &["persistentvolumeclaims"]),
                rule(READ, CORE, &["pods"]),
                rule(READ, STORAGE, &["csidrivers"]),
            ],
        ),
        (
            "service-account-controller",
            vec![rule(&["create"], CORE, &["serviceaccounts"]), events_rule()],
        ),
        (
            "service-cidrs-controller",
            vec![
                rule(
                    &["get", "list", "patch", "update", "watch"],
                    NETWORKING,
                    &["servicecidrs"],
                ),
                rule(PATCH_UPDATE, NETWORKING, &["servicecidrs/finalizers"]),
                rule(PATCH_UPDATE, NETWORKING, &["servicecidrs/status"]),
                rule(READ, NETWORKING, &["ipaddresses"]),
                events_rule(),
            ],
        ),
        (
            "service-controller",
            vec![
                rule(READ, CORE, &["services"]),
                rule(PATCH_UPDATE, CORE, &["services/status"]),
                rule(LIST_WATCH, CORE, &["nodes"]),
                events_rule(),
            ],
        ),
        (
            "statefulset-controller",
            vec![
                rule(LIST_WATCH, CORE, &["pods"]),
                rule(READ, APPS, &["statefulsets"]),
                rule(UPDATE, APPS, &["statefulsets/status"]),
                rule(UPDATE, APPS, &["statefulsets/finalizers"]),
                rule(
                    &["create", "delete", "get", "patch", "update"],
                    CORE,
                    &["pods"],
                ),
                rule(MANAGE, APPS, &["controllerrevisions"]),
                rule(
                    &["create", "get", "list", "watch"],
                    CORE,
                    &["persistentvolumeclaims"],
                ),
                // persistentVolumeClaimRetentionPolicy: claims are released or deleted.
                rule(&["delete", "update"], CORE, &["persistentvolumeclaims"]),
                rule(UPDATE, CORE, &["pods/finalizers"]),
                events_rule(),
            ],
        ),
        (
            "ttl-after-finished-controller",
            vec![
                rule(&["delete", "get", "list", "watch"], BATCH, &["jobs"]),
                events_rule(),
            ],
        ),
        (
            "ttl-controller",
            vec![
                rule(&["list", "patch", "update", "watch"], CORE, &["nodes"]),
                events_rule(),
            ],
        ),
        (
            "validatingadmissionpolicy-status-controller",
            vec![
                rule(READ, ADMISSION, &["validatingadmissionpolicies"]),
                rule(
                    &["get", "patch", "update"],
                    ADMISSION,
                    &["validatingadmissionpolicies/status"],
                ),
                events_rule(),
            ],
        ),
        (
            "volumeattributesclass-protection-controller",
            vec![
                rule(READ, CORE, &["persistentvolumeclaims"]),
                rule(READ, CORE, &["persistentvolumes"]),
                rule(GET_LIST_UPDATE_WATCH, STORAGE, &["volumeattributesclasses"]),
                events_rule(),
            ],
        ),
    ]
}

/// The controllers' ClusterRoles.
pub(crate) fn cluster_roles() -> Vec<Value> {
    controllers()
        .into_iter()
        .map(|(name, rules)| cluster_role(&format!("{ROLE_PREFIX}{name}"), &[], rules))
        .collect()
}

/// Each controller role bound to its controller's service account.
pub(crate) fn cluster_role_bindings() -> Vec<Value> {
    controllers()
        .into_iter()
        .map(|(name, _)| {
            let role = format!("{ROLE_PREFIX}{name}");
            binding(&role, &role, vec![service_account(NAMESPACE, name)], true)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::*;

    fn name(obj: &Value) -> &str {
        obj["metadata"]["name"].as_str().unwrap_or("")
    }

    #[test]
    fn every_role_is_bound_to_its_controllers_service_account() {
        let roles = cluster_roles();
        let bindings = cluster_role_bindings();
        assert_eq!(roles.len(), bindings.len());
        let names: BTreeSet<&str> = roles.iter().map(name).collect();
        assert_eq!(names.len(), roles.len(), "a role is registered twice");
        for role in &roles {
            let role_name = name(role);
            let controller = role_name
                .strip_prefix(ROLE_PREFIX)
                .unwrap_or_else(|| panic!("{role_name} lacks {ROLE_PREFIX}"));
            let b = bindings
                .iter()
                .find(|b| b["roleRef"]["name"] == role_name)
                .unwrap_or_else(|| panic!("no binding of {role_name}"));
            assert_eq!(name(b), role_name);
            assert_eq!(b["roleRef"]["kind"], "ClusterRole");
            assert_eq!(
                b["subjects"],
                json!([{"kind": "ServiceAccount", "namespace": "kube-system", "name": controller}]),
                "{role_name}"
            );
            for obj in [role, b] {
                assert_eq!(
                    obj["metadata"]["labels"]["kubernetes.io/bootstrapping"], "rbac-defaults",
                    "{role_name}"
                );
                assert_eq!(
                    obj["metadata"]["annotations"]["rbac.authorization.kubernetes.io/autoupdate"],
                    "true",
                    "{role_name}"
                );
            }
        }
    }

    #[test]
    fn rules_are_listed_as_upstream_stores_them() {
        for role in cluster_roles() {
            let rules = role["rules"].as_array().expect("rules");
            assert!(!rules.is_empty(), "{} has no rules", name(&role));
            for r in rules {
                for field in ["verbs", "apiGroups", "resources", "resourceNames"] {
                    let Some(list) = r.get(field).and_then(Value::as_array) else {
                        continue;
                    };
                    let list: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
                    let mut sorted = list.clone();
                    sorted.sort_unstable();
                    sorted.dedup();
                    assert_eq!(list, sorted, "{} {field}", name(&role));
                }
            }
        }
    }

    #[test]
    fn controllers_hold_what_they_need_and_no_more() {
        let rules_of = |controller: &str| -> Vec<super::super::rbac::Rule> {
            let role = cluster_roles()
                .into_iter()
                .find(|r| name(r) == format!("{ROLE_PREFIX}{controller}"))
                .unwrap_or_else(|| panic!("no role for {controller}"));
            role["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(super::super::rbac::Rule::from_json)
                .collect()
        };
        let allows = |controller: &str, verb: &str, group: &str, resource: &str, sub: &str| {
            let attrs = super::super::ResourceAttrs {
                group,
                resource,
                subresource: sub,
                namespace: "default",
                name: "x",
            };
            rules_of(controller)
                .iter()
                .any(|r| r.allows_resource(verb, &attrs))
        };
        assert!(allows("replicaset-controller", "create", "", "pods", ""));
        assert!(allows(
            "replicaset-controller",
            "update",
            "apps",
            "replicasets",
            "status"
        ));
        assert!(!allows("replicaset-controller", "get", "", "secrets", ""));
        assert!(allows(
            "job-controller",
            "update",
            "batch",
            "jobs",
            "finalizers"
        ));
        assert!(allows(
            "disruption-controller",
            "get",
            "apps",
            "deployments",
            "scale"
        ));
        assert!(!allows(
            "disruption-controller",
            "update",
            "apps",
            "deployments",
            "scale"
        ));
        assert!(allows(
            "namespace-controller",
            "deletecollection",
            "apps",
            "deployments",
            ""
        ));
        assert!(!allows(
            "generic-garbage-collector",
            "create",
            "",
            "pods",
            ""
        ));
        // resourceNames: only the named signers.
        let sign = |signer: &str| {
            rules_of("certificate-controller").iter().any(|r| {
                r.allows_resource(
                    "sign",
                    &super::super::ResourceAttrs {
                        group: "certificates.k8s.io",
                        resource: "signers",
                        name: signer,
                        ..Default::default()
                    },
                )
            })
        };
        assert!(sign("kubernetes.io/kubelet-serving"));
        assert!(!sign("example.com/other"));
    }
}
