//! The validation entry points: dispatch per kind to the topic modules (`meta`, `pod`,
//! `network`, `workloads`, `cluster`, `config`), each following upstream's
//! `pkg/apis/*/validation` for the checks it implements.
//!
//! Objects are validated after defaulting, as the API server does; the kubelet applies
//! [`crate::defaults::default_pod`] to static pods before [`validate_pod_spec_for_kubelet`].

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::batch::{validate_cronjob, validate_job};
use super::cluster::{
    validate_binding, validate_event, validate_lease, validate_namespace, validate_node,
    validate_priority_class, validate_runtime_class,
};
use super::config::{validate_config_map, validate_secret};
use super::meta::{is_namespaced, validate_meta, validate_meta_update};
use super::network::{validate_endpoint_slice, validate_endpoints, validate_service};
use super::pod::{validate_pod_spec, validate_pod_update};
use super::rbac::{validate_binding_object, validate_role_object};
use super::storage::{
    validate_persistent_volume, validate_persistent_volume_claim, validate_storage_class,
};
use super::workloads::{validate_controller_revision, validate_pdb, validate_workload};
use super::{FieldError, Path};
use crate::gvk::Gvk;

/// Validates an object (create when `old` is `None`, update otherwise) as the API server
/// does after defaulting. Kinds outside the catalogue get metadata validation only.
pub fn validate_object(gvk: &Gvk, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    // Upstream rejects a value of the wrong type while decoding (400). Callers that validate
    // raw JSON without `strict::normalize` still must not store it.
    if let Some((field, msg)) = crate::strict::decode_error(gvk, obj) {
        errs.push(FieldError {
            kind: super::ErrorType::Invalid,
            field,
            value: None,
            detail: msg,
        });
        return errs;
    }
    validate_meta(&mut errs, gvk, obj, is_namespaced(gvk));
    if let Some(old) = old {
        validate_meta_update(&mut errs, obj, old);
    }
    match (gvk.group.as_str(), gvk.kind.as_str()) {
        ("", "Pod") => {
            let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
            validate_pod_spec(&mut errs, &spec, &Path::new("spec"), true);
            match old {
                Some(old) => validate_pod_update(&mut errs, obj, old),
                // Added only through the ephemeralcontainers subresource (ValidatePodCreate).
                None if spec
                    .get("ephemeralContainers")
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty()) =>
                {
                    errs.push(FieldError::forbidden(
                        Path::new("spec").child("ephemeralContainers"),
                        "cannot be set on create",
                    ));
                }
                None => {}
            }
        }
        ("", "Service") => validate_service(&mut errs, obj, old),
        ("", "Node") => validate_node(&mut errs, obj, old),
        ("", "Endpoints") => validate_endpoints(&mut errs, obj),
        ("", "Binding") => validate_binding(&mut errs, obj),
        ("policy", "PodDisruptionBudget") => validate_pdb(&mut errs, obj),
        ("", "Namespace") => validate_namespace(&mut errs, obj),
        ("", "ConfigMap") => validate_config_map(&mut errs, obj, old),
        ("", "Secret") => validate_secret(&mut errs, obj, old),
        ("", "Event") => validate_event(&mut errs, obj),
        ("coordination.k8s.io", "Lease") => validate_lease(&mut errs, obj),
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            super::certificates::validate_csr(&mut errs, obj)
        }
        ("discovery.k8s.io", "EndpointSlice") => validate_endpoint_slice(&mut errs, obj, old),
        ("apps", "Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet")
        | ("", "ReplicationController") => validate_workload(&mut errs, gvk, obj, old),
        ("batch", "Job") => validate_job(&mut errs, obj, old),
        ("batch", "CronJob") => validate_cronjob(&mut errs, obj),
        ("apps", "ControllerRevision") => validate_controller_revision(&mut errs, obj, old),
        ("scheduling.k8s.io", "PriorityClass") => validate_priority_class(&mut errs, obj, old),
        ("node.k8s.io", "RuntimeClass") => validate_runtime_class(&mut errs, obj, old),
        ("networking.k8s.io", "Ingress") => {
            super::networking::validate_ingress(&mut errs, obj, old)
        }
        ("networking.k8s.io", "IngressClass") => {
            super::networking::validate_ingress_class(&mut errs, obj, old)
        }
        ("networking.k8s.io", "NetworkPolicy") => {
            super::networking::validate_network_policy(&mut errs, obj, old)
        }
        ("flowcontrol.apiserver.k8s.io", "FlowSchema") => {
            super::flowcontrol::validate_flow_schema(&mut errs, obj)
        }
        ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration") => {
            super::flowcontrol::validate_priority_level(&mut errs, obj)
        }
        ("apiregistration.k8s.io", "APIService") => {
            super::apiregistration::validate_api_service(&mut errs, obj)
        }
        ("", "PersistentVolume") => validate_persistent_volume(&mut errs, obj, old),
        ("", "PersistentVolumeClaim") => validate_persistent_volume_claim(&mut errs, obj, old),
        ("storage.k8s.io", "StorageClass") => validate_storage_class(&mut errs, obj, old),
        ("rbac.authorization.k8s.io", "Role" | "ClusterRole") => {
            validate_role_object(&mut errs, gvk, obj)
        }
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
            validate_binding_object(&mut errs, gvk, obj, old)
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            super::apiextensions::validate_crd(&mut errs, obj)
        }
        _ => {}
    }
    errs
}

/// A write of the `pods/ephemeralcontainers` subresource (upstream's
/// ValidatePodEphemeralContainersUpdate): the pod as a whole is valid, and the ephemeral
/// containers it had are all still there, unchanged.
pub fn validate_pod_ephemeral_containers_update(obj: &Value, old: &Value) -> Vec<FieldError> {
    let gvk = Gvk::new("", "v1", "Pod");
    let mut errs = Vec::new();
    if let Some((field, msg)) = crate::strict::decode_error(&gvk, obj) {
        errs.push(FieldError {
            kind: super::ErrorType::Invalid,
            field,
            value: None,
            detail: msg,
        });
        return errs;
    }
    validate_meta(&mut errs, &gvk, obj, true);
    validate_meta_update(&mut errs, obj, old);
    let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
    validate_pod_spec(&mut errs, &spec, &Path::new("spec"), true);
    super::pod::validate_ephemeral_containers_update(&mut errs, obj, old);
    errs
}

/// The API server's pod validation, for static pod manifests read by the kubelet (after
/// [`crate::defaults::default_pod`]).
pub fn validate_pod_spec_for_kubelet(pod: &Pod) -> Vec<FieldError> {
    match serde_json::to_value(pod) {
        Ok(v) => validate_object(&Gvk::new("", "v1", "Pod"), &v, None),
        Err(e) => vec![FieldError::internal("", e.to_string())],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults::default_object;
    use crate::validation::aggregate_messages;
    use crate::validation::pod::POD_UPDATABLE;

    fn check(kind: &str, group: &str, mut obj: Value, old: Option<Value>) -> Vec<String> {
        let gvk = Gvk::new(group, "v1", kind);
        default_object(&gvk, &mut obj);
        let old = old.map(|mut o| {
            default_object(&gvk, &mut o);
            o
        });
        validate_object(&gvk, &obj, old.as_ref())
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn valid_pod_has_no_errors() {
        let p = pod(
            json!({"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 80, "name": "http"}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "resources": {"limits": {"cpu": "1", "memory": "64Mi"}},
            "livenessProbe": {"httpGet": {"port": "http"}}}],
            "volumes": [{"name": "data", "emptyDir": {}}]}),
        );
        assert_eq!(check("Pod", "", p, None), Vec::<String>::new());
    }

    #[test]
    fn host_users_false_forbids_host_namespaces() {
        let c = json!([{"name": "c", "image": "busybox"}]);
        assert_eq!(
            check(
                "Pod",
                "",
                pod(json!({"hostUsers": false, "containers": c})),
                None
            ),
            Vec::<String>::new(),
            "a user namespace alone is fine"
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"hostUsers": false, "hostNetwork": true, "hostPID": true, "hostIPC": true, "containers": c}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.hostNetwork: Forbidden: when `pod.Spec.HostUsers` is false",
                "spec.HostPID: Forbidden: when `pod.Spec.HostUsers` is false",
                "spec.HostIPC: Forbidden: when `pod.Spec.HostUsers` is false",
            ]
        );
        for hu in [json!(true), Value::Null] {
            let mut spec = json!({"hostNetwork": true, "hostPID": true, "containers": c});
            if !hu.is_null() {
                spec["hostUsers"] = hu.clone();
            }
            assert_eq!(
                check("Pod", "", pod(spec), None),
                Vec::<String>::new(),
                "hostUsers {hu}: host namespaces are allowed"
            );
        }
        // The same rule holds in a workload's pod template.
        let d = json!({"metadata": {"name": "d", "namespace": "default"}, "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}},
                "spec": {"hostUsers": false, "hostIPC": true, "containers": c}}}});
        assert_eq!(
            check("Deployment", "apps", d, None),
            vec!["spec.template.spec.HostIPC: Forbidden: when `pod.Spec.HostUsers` is false"]
        );
    }

    #[test]
    fn unmasked_proc_needs_a_user_namespace() {
        let unmasked = json!([{"name": "c", "image": "busybox", "securityContext": {"procMount": "Unmasked"}}]);
        assert_eq!(
            check("Pod", "", pod(json!({"containers": unmasked})), None),
            vec![
                "spec.containers[0].securityContext.procMount: Invalid value: \"Unmasked\": `hostUsers` must be false to use `Unmasked`"
            ]
        );
        assert_eq!(
            check(
                "Pod",
                "",
                pod(json!({"hostUsers": false, "containers": unmasked})),
                None
            ),
            Vec::<String>::new()
        );
    }

    #[test]
    fn pod_errors_with_upstream_texts() {
        assert_eq!(
            check("Pod", "", pod(json!({})), None),
            vec!["spec.containers: Required value"]
        );
        let errs = check(
            "Pod",
            "",
            pod(json!({"restartPolicy": "Sometimes", "containers": [{"name": "c", "image": "x"}]})),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\""
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(json!({"containers": [{"name": "", "image": ""}]})),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.containers[0].name: Required value",
                "spec.containers[0].image: Required value"
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"initContainers": [{"name": "c", "image": "x"}], "containers": [{"name": "c", "image": "x"}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec!["spec.initContainers[0].name: Duplicate value: \"c\""]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x", "volumeMounts": [{"name": "data", "mountPath": "/d"}]}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec!["spec.containers[0].volumeMounts[0].name: Not found: \"data\""]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "2"}}}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1"
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpus": "1"}}}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.containers[0].resources.limits[cpus]: Invalid value: cpus: must be a standard resource for containers",
                "spec.containers[0].resources.requests[cpus]: Invalid value: cpus: must be a standard resource for containers",
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(json!({"containers": [{"name": "c", "image": "x",
            "readinessProbe": {"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}}}]})),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.containers[0].readinessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type"
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 70000, "protocol": "TCPX"}]}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
                "spec.containers[0].ports[0].protocol: Unsupported value: \"TCPX\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x"}], "volumes": [{"name": "v", "emptyDir": {}, "hostPath": {"path": "/x"}}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec!["spec.volumes[0].hostPath: Forbidden: may not specify more than 1 volume type"]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x"}], "terminationGracePeriodSeconds": -1}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.terminationGracePeriodSeconds: Invalid value: -1: must be greater than or equal to 0"
            ]
        );
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x"}], "tolerations": [{"key": "", "operator": "Equal"}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.tolerations[0].operator: Invalid value: \"Equal\": operator must be Exists when `key` is empty, which means \"match all values and all keys\""
            ]
        );
    }

    #[test]
    fn metadata_errors() {
        let errs = check(
            "Pod",
            "",
            json!({"metadata": {"name": "Foo_Bar", "namespace": "default"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "metadata.name: Invalid value: \"Foo_Bar\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
        let errs = check("Namespace", "", json!({"metadata": {"name": "a.b"}}), None);
        assert_eq!(
            errs,
            vec!["metadata.name: Invalid value: \"a.b\": must not contain dots"]
        );
        let errs = check(
            "Namespace",
            "",
            json!({"metadata": {"name": "a", "namespace": "x"}}),
            None,
        );
        assert_eq!(
            errs,
            vec!["metadata.namespace: Forbidden: not allowed on this type"]
        );
        let errs = check("ConfigMap", "", json!({"metadata": {"name": "c"}}), None);
        assert_eq!(errs, vec!["metadata.namespace: Required value"]);
        let errs = check(
            "ConfigMap",
            "",
            json!({"metadata": {"name": "c", "namespace": "d", "labels": {"a": "-x"}}}),
            None,
        );
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].starts_with("metadata.labels: Invalid value: \"-x\": a valid label must be")
        );
        let errs = check("ConfigMap", "", json!({"metadata": {"name": ""}}), None);
        assert_eq!(
            errs[0],
            "metadata.name: Required value: name or generateName is required"
        );
        let errs = check(
            "Service",
            "",
            json!({"metadata": {"name": "1svc", "namespace": "d"}, "spec": {"ports": [{"port": 80}]}}),
            None,
        );
        assert!(errs[0].starts_with(
            "metadata.name: Invalid value: \"1svc\": a DNS-1035 label must consist of"
        ));
    }

    #[test]
    fn pod_updates() {
        let old = pod(
            json!({"containers": [{"name": "c", "image": "busybox:1", "command": ["sleep", "1"]}]}),
        );
        let new_image = pod(
            json!({"containers": [{"name": "c", "image": "busybox:2", "command": ["sleep", "1"]}]}),
        );
        assert_eq!(
            check("Pod", "", new_image, Some(old.clone())),
            Vec::<String>::new()
        );
        let new_cmd = pod(
            json!({"containers": [{"name": "c", "image": "busybox:1", "command": ["sleep", "2"]}]}),
        );
        let errs = check("Pod", "", new_cmd, Some(old.clone()));
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].starts_with(&format!("spec: Forbidden: {POD_UPDATABLE}\n")),
            "{}",
            errs[0]
        );
        assert!(errs[0].contains("spec.containers[0].command[1]"));
        let spelled_differently = pod(
            json!({"containers": [{"name": "c", "image": "busybox:1", "command": ["sleep", "1"],
            "args": [], "workingDir": ""}], "nodeName": null}),
        );
        assert_eq!(
            check("Pod", "", spelled_differently, Some(old.clone())),
            Vec::<String>::new()
        );
        let more_tolerations = pod(
            json!({"containers": [{"name": "c", "image": "busybox:1", "command": ["sleep", "1"]}],
            "tolerations": [{"key": "k", "operator": "Exists"}]}),
        );
        assert_eq!(
            check("Pod", "", more_tolerations, Some(old)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn ephemeral_containers() {
        let gvk = Gvk::new("", "v1", "Pod");
        let app = json!([{"name": "app", "image": "busybox"}]);
        let dbg = json!({"name": "debugger", "image": "busybox", "targetContainerName": "app"});
        let with = |list: Value| pod(json!({"containers": app, "ephemeralContainers": list}));
        let ephemeral_update = |new: Value, old: Value| {
            let (mut new, mut old) = (new, old);
            default_object(&gvk, &mut new);
            default_object(&gvk, &mut old);
            validate_pod_ephemeral_containers_update(&new, &old)
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
        };
        let none = pod(json!({"containers": app}));
        // Only through the subresource: not on create, not in an update of the pod.
        assert_eq!(
            check("Pod", "", with(json!([dbg])), None),
            vec!["spec.ephemeralContainers: Forbidden: cannot be set on create"]
        );
        let errs = check("Pod", "", with(json!([dbg])), Some(none.clone()));
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].starts_with(&format!("spec: Forbidden: {POD_UPDATABLE}\n")),
            "{}",
            errs[0]
        );
        // Added through the subresource.
        assert_eq!(
            ephemeral_update(with(json!([dbg])), none.clone()),
            Vec::<String>::new()
        );
        // Once added, neither removed nor changed.
        assert_eq!(
            ephemeral_update(none.clone(), with(json!([dbg]))),
            vec![
                "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"debugger\" may not be removed\n"
            ]
        );
        let mut changed = dbg.clone();
        changed["image"] = json!("busybox:2");
        let errs = ephemeral_update(with(json!([changed])), with(json!([dbg])));
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].starts_with("spec.ephemeralContainers: Forbidden: existing ephemeral containers \"debugger\" may not be changed\n"),
            "{}",
            errs[0]
        );
        assert!(errs[0].contains("debugger.image"), "{}", errs[0]);
        // The rules every ephemeral container follows.
        let mut bad = dbg.clone();
        bad["targetContainerName"] = json!("nope");
        bad["ports"] = json!([{"containerPort": 80}]);
        bad["name"] = json!("app");
        let errs = ephemeral_update(with(json!([bad])), none.clone());
        assert!(
            errs.contains(
                &"spec.ephemeralContainers[0].name: Duplicate value: \"app\"".to_string()
            ),
            "{errs:?}"
        );
        assert!(
            errs.contains(
                &"spec.ephemeralContainers[0].targetContainerName: Not found: \"nope\"".to_string()
            ),
            "{errs:?}"
        );
        assert!(
            errs.contains(&"spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container".to_string()),
            "{errs:?}"
        );
        // A static pod's mirror takes none.
        let mut mirror = none.clone();
        mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
        let mut mirror_new = with(json!([dbg]));
        mirror_new["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
        assert_eq!(
            ephemeral_update(mirror_new, mirror),
            vec![": Forbidden: static pods do not support ephemeral containers"]
        );
    }

    #[test]
    fn services() {
        let svc = |spec: Value| json!({"metadata": {"name": "s", "namespace": "d"}, "spec": spec});
        assert_eq!(
            check("Service", "", svc(json!({})), None),
            vec!["spec.ports: Required value"]
        );
        assert_eq!(
            check("Service", "", svc(json!({"clusterIP": "None"})), None),
            Vec::<String>::new()
        );
        assert_eq!(
            check(
                "Service",
                "",
                svc(json!({"type": "Foo", "ports": [{"port": 80}]})),
                None
            ),
            vec![
                "spec.type: Unsupported value: \"Foo\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""
            ]
        );
        assert_eq!(
            check(
                "Service",
                "",
                svc(json!({"ports": [{"port": 80}, {"port": 81}]})),
                None
            ),
            vec![
                "spec.ports[0].name: Required value",
                "spec.ports[1].name: Required value"
            ]
        );
        assert_eq!(
            check(
                "Service",
                "",
                svc(json!({"externalTrafficPolicy": "Local", "ports": [{"port": 80}]})),
                None
            ),
            vec![
                "spec.externalTrafficPolicy: Invalid value: \"Local\": may only be set for externally-accessible services"
            ]
        );
        assert_eq!(
            check(
                "Service",
                "",
                svc(
                    json!({"type": "NodePort", "externalTrafficPolicy": "Global", "ports": [{"port": 80}]})
                ),
                None
            ),
            vec![
                "spec.externalTrafficPolicy: Unsupported value: \"Global\": supported values: \"Cluster\", \"Local\""
            ]
        );
        assert_eq!(
            check(
                "Pod",
                "",
                pod(
                    json!({"containers": [{"name": "c", "image": "x"}], "dnsConfig": {"nameservers": ["1.1.1.1", "dns"]}})
                ),
                None
            ),
            vec![
                "spec.dnsConfig.nameservers[1]: Invalid value: \"dns\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
            ]
        );
        let old = svc(
            json!({"clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1"], "ports": [{"port": 80}]}),
        );
        let new = svc(
            json!({"clusterIP": "10.0.0.2", "clusterIPs": ["10.0.0.2"], "ports": [{"port": 80}]}),
        );
        assert_eq!(
            check("Service", "", new, Some(old)),
            vec![
                "spec.clusterIPs[0]: Invalid value: []string{\"10.0.0.2\"}: may not change once set"
            ]
        );
    }

    #[test]
    fn workloads() {
        let d = json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {"selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "other"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        assert_eq!(
            check("Deployment", "apps", d, None),
            vec![
                "spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"other\"}: `selector` does not match template `labels`"
            ]
        );
        let d = json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}});
        assert_eq!(
            check("Deployment", "apps", d, None),
            vec![
                "spec.selector: Required value",
                "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"",
            ]
        );
        let ok = json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {"selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        assert_eq!(
            check("ReplicaSet", "apps", ok.clone(), None),
            Vec::<String>::new()
        );
        assert_eq!(check("DaemonSet", "apps", ok, None), Vec::<String>::new());
    }

    #[test]
    fn controller_revision_data_is_mandatory_and_immutable() {
        let cr = |data: Value, rev: i64| json!({"metadata": {"name": "ds-abc", "namespace": "default"}, "data": data, "revision": rev});
        let ok = cr(json!({"spec": {}}), 1);
        assert_eq!(
            check("ControllerRevision", "apps", ok.clone(), None),
            Vec::<String>::new()
        );
        assert_eq!(
            check(
                "ControllerRevision",
                "apps",
                json!({"metadata": {"name": "ds-abc", "namespace": "default"}, "revision": 1}),
                None
            ),
            vec!["data: Required value: data is mandatory"]
        );
        assert_eq!(
            check("ControllerRevision", "apps", cr(json!({}), -1), None),
            vec!["revision: Invalid value: -1: must be greater than or equal to 0"]
        );
        // A rollback moves the revision number; the data stays.
        assert_eq!(
            check(
                "ControllerRevision",
                "apps",
                cr(json!({"spec": {}}), 4),
                Some(ok.clone())
            ),
            Vec::<String>::new()
        );
        let errs = check(
            "ControllerRevision",
            "apps",
            cr(json!({"spec": {"x": 1}}), 1),
            Some(ok),
        );
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("data: Invalid value: ") && errs[0].ends_with("field is immutable"),
            "{errs:?}"
        );
    }

    #[test]
    fn workload_selector_is_immutable() {
        let d = |sel: Value, app: &str| {
            json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {"selector": sel,
            "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}})
        };
        let old = d(json!({"matchLabels": {"app": "web"}}), "web");
        let same = d(
            json!({"matchLabels": {"app": "web"}, "matchExpressions": []}),
            "web",
        );
        assert_eq!(
            check("Deployment", "apps", same, Some(old.clone())),
            Vec::<String>::new()
        );
        let changed = d(json!({"matchLabels": {"app": "other"}}), "other");
        let errs = check("Deployment", "apps", changed, Some(old));
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].starts_with("spec.selector: Invalid value: ")
                && errs[0].ends_with(": field is immutable"),
            "{}",
            errs[0]
        );
    }

    #[test]
    fn other_kinds() {
        assert_eq!(
            check(
                "PriorityClass",
                "scheduling.k8s.io",
                json!({"metadata": {"name": "high"}, "value": 2_000_000_000}),
                None
            ),
            vec![
                "value: Forbidden: maximum allowed value of a user defined priority is 1000000000"
            ]
        );
        assert_eq!(
            check(
                "PriorityClass",
                "scheduling.k8s.io",
                json!({"metadata": {"name": "system-foo"}, "value": 1}),
                None
            ),
            vec![
                "metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use only. error: system-foo is not a known system priority class"
            ]
        );
        let cm = check(
            "ConfigMap",
            "",
            json!({"metadata": {"name": "c", "namespace": "d"}, "data": {"a b": "1"}}),
            None,
        );
        assert_eq!(
            cm,
            vec![
                "data[a b]: Invalid value: \"a b\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
            ]
        );
        assert_eq!(
            check(
                "EndpointSlice",
                "discovery.k8s.io",
                json!({"metadata": {"name": "e", "namespace": "d"}, "addressType": "IPv5"}),
                None
            ),
            vec![
                "addressType: Unsupported value: \"IPv5\": supported values: \"FQDN\", \"IPv4\", \"IPv6\""
            ]
        );
        assert_eq!(
            check(
                "EndpointSlice",
                "discovery.k8s.io",
                json!({"metadata": {"name": "e", "namespace": "d"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.300"]}]}),
                None
            ),
            vec![
                "endpoints[0].addresses[0]: Invalid value: \"10.0.0.300\": must be a valid IPv4 address"
            ]
        );
        let rc = check(
            "RuntimeClass",
            "node.k8s.io",
            json!({"metadata": {"name": "r"}, "handler": "Run_C"}),
            None,
        );
        assert!(rc[0].starts_with("handler: Invalid value: \"Run_C\": a lowercase RFC 1123 label"));
        assert_eq!(
            check(
                "Event",
                "",
                json!({"metadata": {"name": "e", "namespace": "a"}, "involvedObject": {"namespace": "b"}}),
                None
            ),
            vec!["involvedObject.namespace: Invalid value: \"b\": does not match event.namespace"]
        );
        assert_eq!(
            check(
                "Secret",
                "",
                json!({"metadata": {"name": "s", "namespace": "d"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "eA=="}}),
                None
            ),
            vec!["data[tls.key]: Required value"]
        );
        assert_eq!(
            check(
                "Lease",
                "coordination.k8s.io",
                json!({"metadata": {"name": "n", "namespace": "kube-node-lease"}, "spec": {"leaseDurationSeconds": 0}}),
                None
            ),
            vec!["spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"]
        );
        let node = check(
            "Node",
            "",
            json!({"metadata": {"name": "n"}, "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "a", "effect": "NoSchedule"}]}}),
            None,
        );
        assert_eq!(node.len(), 1);
        assert!(node[0].ends_with(": taints must be unique by key and effect pair"));
        let msg = aggregate_messages(&validate_object(
            &Gvk::new("", "v1", "Pod"),
            &json!({"metadata": {"name": "p", "namespace": "d"}, "spec": {"containers": []}}),
            None,
        ));
        assert_eq!(
            msg.as_deref(),
            Some(
                "[spec.terminationGracePeriodSeconds: Required value, spec.containers: Required value, spec.restartPolicy: Required value, spec.dnsPolicy: Required value]"
            )
        );
    }

    #[test]
    fn more_kinds() {
        let old = json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": ["10.244.0.0/24"]}});
        let new = json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": ["10.244.1.0/24"]}});
        assert_eq!(
            check("Node", "", new, Some(old)),
            vec!["spec.podCIDRs: Forbidden: may not change once set"]
        );
        assert_eq!(
            check(
                "Node",
                "",
                json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": ["10.244.0.0/33"]}}),
                None
            ),
            vec![
                "spec.podCIDRs[0]: Invalid value: \"10.244.0.0/33\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
            ]
        );
        let ep = json!({"metadata": {"name": "e", "namespace": "d"}, "subsets": [{"addresses": [{"ip": "nope"}], "ports": [{"port": 80}]}]});
        assert_eq!(
            check("Endpoints", "", ep, None),
            vec!["subsets[0].addresses[0].ip: Invalid value: \"nope\": must be a valid IP address"]
        );
        let pdb =
            json!({"metadata": {"name": "p", "namespace": "d"}, "spec": {"minAvailable": "150%"}});
        assert_eq!(
            check("PodDisruptionBudget", "policy", pdb, None),
            vec!["spec.minAvailable: Invalid value: 150%: must not be greater than 100%"]
        );
        let d = json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {"selector": {"matchLabels": {"app": "web"}},
            "strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        assert_eq!(
            check("Deployment", "apps", d, None),
            vec![
                "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0%: may not be 0 when `maxSurge` is 0"
            ]
        );
        let b = json!({"metadata": {"name": "p", "namespace": "d"}, "target": {"kind": "Pod", "name": ""}});
        assert_eq!(
            check("Binding", "", b, None),
            vec![
                "target.name: Required value",
                "target.kind: Unsupported value: \"Pod\": supported values: \"Node\", \"<empty>\"",
            ]
        );
        let ds = json!({"metadata": {"name": "d", "namespace": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}},
            "updateStrategy": {"type": "Sometimes"},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        assert_eq!(
            check("DaemonSet", "apps", ds, None),
            vec![
                "spec.updateStrategy.type: Unsupported value: \"Sometimes\": supported values: \"OnDelete\", \"RollingUpdate\""
            ]
        );
    }

    #[test]
    fn wrong_types_are_invalid() {
        let p = json!({"metadata": {"name": "p", "namespace": "d", "labels": {"version": 1}},
            "spec": {"containers": [{"name": "c", "image": "x"}]}});
        let errs = check("Pod", "", p, None);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("metadata.labels.version: Invalid value: invalid type: integer `1`, expected a string"), "{}", errs[0]);
    }

    #[test]
    fn affinity_and_spread() {
        let errs = check(
            "Pod",
            "",
            pod(json!({"containers": [{"name": "c", "image": "x"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "disktype", "operator": "In"}, {"key": "zone", "operator": "Near", "values": ["a"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]},
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "web"}}}]}},
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"},
                {"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]})),
            None,
        );
        let na = "spec.affinity.nodeAffinity";
        assert_eq!(errs, vec![
            format!("{na}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'"),
            format!("{na}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[1].operator: Invalid value: \"Near\": not a valid selector operator"),
            format!("{na}.preferredDuringSchedulingIgnoredDuringExecution[0].weight: Invalid value: 0: must be in the range 1-100"),
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: Required value: can not be empty".to_string(),
            "spec.topologySpreadConstraints[0].{topologyKey, whenUnsatisfiable}: Duplicate value: \"{zone, DoNotSchedule}\"".to_string(),
            "spec.topologySpreadConstraints[1].maxSkew: Invalid value: 0: must be greater than zero".to_string(),
        ]);
    }

    #[test]
    fn volume_items() {
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"containers": [{"name": "c", "image": "x"}], "volumes": [
            {"name": "cfg", "configMap": {"name": "c", "defaultMode": 1000, "items": [{"key": "a", "path": "../etc/passwd"}, {"key": "", "path": "/abs"}]}}]}),
            ),
            None,
        );
        assert_eq!(
            errs,
            vec![
                "spec.volumes[0].configMap.defaultMode: Invalid value: 1000: must be a number between 0 and 0777 (octal), both inclusive",
                "spec.volumes[0].configMap.items[0].path: Invalid value: \"../etc/passwd\": must not contain '..'",
                "spec.volumes[0].configMap.items[1].key: Required value",
                "spec.volumes[0].configMap.items[1].path: Invalid value: \"/abs\": must be a relative path",
            ]
        );
    }

    #[test]
    fn security_contexts() {
        let errs = check(
            "Pod",
            "",
            pod(
                json!({"securityContext": {"runAsUser": -1, "seccompProfile": {"type": "Localhost"}},
            "containers": [{"name": "c", "image": "x", "securityContext": {"runAsGroup": 2147483648_i64,
                "seccompProfile": {"type": "Bogus"}, "allowPrivilegeEscalation": false, "privileged": true}}]}),
            ),
            None,
        );
        assert_eq!(errs.len(), 5, "{errs:?}");
        assert_eq!(
            errs[0],
            "spec.containers[0].securityContext.runAsGroup: Invalid value: 2147483648: must be between 0 and 2147483647, inclusive"
        );
        assert_eq!(
            errs[1],
            "spec.containers[0].securityContext.seccompProfile.type: Unsupported value: \"Bogus\": supported values: \"Localhost\", \"RuntimeDefault\", \"Unconfined\""
        );
        assert!(
            errs[2].starts_with("spec.containers[0].securityContext: Invalid value: "),
            "{}",
            errs[2]
        );
        assert!(errs[2].ends_with(
            ": cannot set `allowPrivilegeEscalation` to false and `privileged` to true"
        ));
        assert_eq!(
            errs[3],
            "spec.securityContext.runAsUser: Invalid value: -1: must be between 0 and 2147483647, inclusive"
        );
        assert_eq!(
            errs[4],
            "spec.securityContext.seccompProfile.localhostProfile: Required value: must be set when seccomp type is Localhost"
        );
    }

    #[test]
    fn malformed_quantity_is_invalid() {
        let errs = check(
            "Pod",
            "",
            pod(json!({"containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"memory": "1Gb"}, "requests": {"memory": "1Gb"}}}]})),
            None,
        );
        let quantity_err = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
        assert_eq!(
            errs,
            vec![
                format!(
                    "spec.containers[0].resources.limits[memory]: Invalid value: \"1Gb\": {quantity_err}"
                ),
                format!(
                    "spec.containers[0].resources.requests[memory]: Invalid value: \"1Gb\": {quantity_err}"
                ),
            ]
        );
    }

    #[test]
    fn new_style_events_need_reporting_fields() {
        let ev = json!({"metadata": {"name": "e", "namespace": "default"}, "eventTime": "2024-01-01T00:00:00.000000Z",
            "involvedObject": {"kind": "Node", "name": "n1"}, "reason": "Starting"});
        assert_eq!(
            check("Event", "", ev, None),
            vec![
                "reportingComponent: Required value",
                "reportingComponent: Invalid value: \"\": name part must be non-empty",
                "reportingComponent: Invalid value: \"\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                "reportingInstance: Required value",
                "action: Required value",
            ]
        );
    }

    #[test]
    fn kubelet_static_pod() {
        let mut p: Pod = serde_json::from_value(json!({"metadata": {"name": "static-web", "namespace": "default"},
            "spec": {"containers": [{"name": "web", "image": "nginx:1", "ports": [{"containerPort": 80}]}]}})).unwrap_or_default();
        crate::defaults::default_pod(&mut p);
        assert!(validate_pod_spec_for_kubelet(&p).is_empty());
        let mut bad: Pod = serde_json::from_value(json!({"metadata": {"name": "Bad", "namespace": "default"}, "spec": {"containers": []}})).unwrap_or_default();
        crate::defaults::default_pod(&mut bad);
        let errs: Vec<String> = validate_pod_spec_for_kubelet(&bad)
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[1], "spec.containers: Required value");
    }
}
