//! Bodies captured from the real kubectl v1.32 (`testdata/*.pb`, the bytes it POSTs) must
//! decode to the JSON the same command prints with `--dry-run=client -o json`
//! (`testdata/*.json`), which is the JSON body kubectl would have sent; richer objects are
//! checked by encoding hand-written JSON and decoding it back.

use serde_json::{Value, json};

use super::*;

fn fixture(name: &str) -> (Vec<u8>, Value) {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/apiserver/protobuf/testdata");
    let pb = std::fs::read(dir.join(format!("{name}.pb"))).expect("fixture body");
    let json = std::fs::read(dir.join(format!("{name}.json"))).expect("fixture json");
    (
        pb,
        serde_json::from_slice(&json).expect("fixture json parses"),
    )
}

/// Every fixture name (`testdata/<name>.pb` with its `<name>.json`).
fn fixtures() -> Vec<String> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/apiserver/protobuf/testdata");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("testdata")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".pb")
                .map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

#[test]
fn kubectl_bodies_decode_to_kubectls_json() {
    let names = fixtures();
    assert!(names.len() >= 15, "{names:?}");
    for name in names {
        let (pb, expected) = fixture(&name);
        let got = decode(&pb).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, expected, "{name}: got {got:#}");
    }
}

#[test]
fn kubectl_bodies_re_encode_to_the_same_bytes() {
    // Go writes fields in number order and every non-pointer scalar even when zero; our
    // encoder writes what the JSON holds, so compare by decoding both again.
    for name in [
        "configmap",
        "deployment",
        "secret",
        "service-nodeport",
        "pdb",
    ] {
        let (pb, expected) = fixture(name);
        let again = encode(&expected).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(again.starts_with(b"k8s\0"));
        assert_eq!(
            decode(&again).expect("decodes"),
            decode(&pb).expect("decodes"),
            "{name}"
        );
    }
}

#[test]
fn replicas_zero_survives_because_the_field_is_a_pointer() {
    let (pb, _) = fixture("deployment");
    let got = decode(&pb).expect("decodes");
    assert_eq!(got["spec"]["replicas"], json!(0));
    // ObjectMeta.generation is a plain int64 written as 0 by Go: omitted, as in JSON.
    assert!(got["metadata"].get("generation").is_none(), "{got}");
    assert_eq!(got["metadata"]["creationTimestamp"], Value::Null);
}

fn round_trip(obj: Value) {
    let pb = encode(&obj).unwrap_or_else(|e| panic!("encode: {e}"));
    let back = decode(&pb).unwrap_or_else(|e| panic!("decode: {e}"));
    assert_eq!(back, obj, "round trip: got {back:#}");
}

#[test]
fn configmap_with_data_binary_data_and_immutable_false() {
    round_trip(json!({
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": "cm", "namespace": "default", "labels": {"a": "", "b": "x"}},
        "immutable": false,
        "data": {"empty": "", "k": "v"},
        "binaryData": {"bin": "AAEC/w=="}
    }));
}

#[test]
fn secret_bytes_are_base64_as_in_json() {
    let obj = json!({
        "kind": "Secret",
        "apiVersion": "v1",
        "metadata": {"name": "s", "creationTimestamp": "2024-05-06T07:08:09Z"},
        "data": {"k": "dg==", "raw": "/wAB"},
        "type": "Opaque"
    });
    round_trip(obj.clone());
    let pb = encode(&obj).expect("encodes");
    // The wire carries the raw bytes, not their base64 text.
    assert!(pb.windows(3).any(|w| w == [0xff, 0x00, 0x01]));
}

fn deployment() -> Value {
    json!({
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "metadata": {
            "name": "web",
            "namespace": "prod",
            "uid": "0b5c9c1e-9d3f-4d1a-8f7e-0e6b1f1c2a3b",
            "resourceVersion": "42",
            "generation": 3,
            "creationTimestamp": "2024-05-06T07:08:09Z",
            "labels": {"app": "web"},
            "annotations": {"deployment.kubernetes.io/revision": "2"},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Namespace", "name": "prod",
                "uid": "u1", "controller": false, "blockOwnerDeletion": true
            }],
            "finalizers": ["example.com/keep"]
        },
        "spec": {
            "replicas": 3,
            "selector": {
                "matchLabels": {"app": "web"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]
            },
            "template": {
                "metadata": {"creationTimestamp": null, "labels": {"app": "web"}},
                "spec": {
                    "volumes": [
                        {"name": "cfg", "configMap": {"name": "web-cfg", "defaultMode": 420, "optional": false}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}
                    ],
                    "containers": [{
                        "name": "web",
                        "image": "nginx:1.27",
                        "args": ["-g", ""],
                        "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
                        "env": [
                            {"name": "EMPTY"},
                            {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "web-cfg", "key": "k"}}}
                        ],
                        "resources": {
                            "limits": {"cpu": "500m", "memory": "128Mi"},
                            "requests": {"cpu": "250m", "memory": "64Mi"}
                        },
                        "readinessProbe": {
                            "httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
                            "periodSeconds": 5
                        },
                        "livenessProbe": {
                            "tcpSocket": {"port": 80},
                            "initialDelaySeconds": 3
                        },
                        "securityContext": {
                            "runAsUser": 0,
                            "runAsNonRoot": false,
                            "allowPrivilegeEscalation": false
                        },
                        "imagePullPolicy": "IfNotPresent"
                    }],
                    "restartPolicy": "Always",
                    "terminationGracePeriodSeconds": 0,
                    "automountServiceAccountToken": false,
                    "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 0}]
                }
            },
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}
            },
            "revisionHistoryLimit": 0
        },
        "status": {
            "observedGeneration": 3,
            "replicas": 3,
            "conditions": [{
                "type": "Available",
                "status": "True",
                "lastUpdateTime": "2024-05-06T07:08:10Z",
                "lastTransitionTime": "2024-05-06T07:08:10Z",
                "reason": "MinimumReplicasAvailable",
                "message": "Deployment has minimum availability."
            }]
        }
    })
}

#[test]
fn deployment_with_pod_template_quantities_int_or_string_and_times() {
    round_trip(deployment());
}

#[test]
fn embedded_structs_are_inlined_like_json() {
    // Volume embeds VolumeSource and ConfigMapKeySelector embeds LocalObjectReference
    // (`json:",inline"`): the JSON has no `volumeSource` or `localObjectReference` level.
    let got = decode(&encode(&deployment()).expect("encodes")).expect("decodes");
    let spec = &got["spec"]["template"]["spec"];
    assert_eq!(spec["volumes"][0]["configMap"]["name"], json!("web-cfg"));
    assert_eq!(
        spec["containers"][0]["env"][1]["valueFrom"]["configMapKeyRef"]["name"],
        json!("web-cfg")
    );
    assert_eq!(
        spec["containers"][0]["readinessProbe"]["httpGet"]["port"],
        json!("http")
    );
}

#[test]
fn service_ports_with_int_and_named_target_ports() {
    round_trip(json!({
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"name": "svc", "namespace": "default"},
        "spec": {
            "ports": [
                {"name": "a", "protocol": "TCP", "port": 80, "targetPort": 8080},
                {"name": "b", "protocol": "UDP", "port": 53, "targetPort": "dns", "nodePort": 30053}
            ],
            "selector": {"app": "svc"},
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
            "type": "NodePort",
            "sessionAffinity": "None",
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "allocateLoadBalancerNodePorts": false,
            "internalTrafficPolicy": "Cluster"
        },
        "status": {"loadBalancer": {}}
    }));
}

#[test]
fn lease_micro_times_keep_microseconds() {
    round_trip(json!({
        "kind": "Lease",
        "apiVersion": "coordination.k8s.io/v1",
        "metadata": {"name": "node-a", "namespace": "kube-node-lease"},
        "spec": {
            "holderIdentity": "node-a",
            "leaseDurationSeconds": 40,
            "renewTime": "2024-05-06T07:08:09.123456Z",
            "leaseTransitions": 0
        }
    }));
}

#[test]
fn scale_and_eviction_subresource_bodies() {
    round_trip(json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": "d", "namespace": "default", "resourceVersion": "7"},
        "spec": {"replicas": 3},
        "status": {"replicas": 0}
    }));
    round_trip(json!({
        "kind": "Eviction",
        "apiVersion": "policy/v1",
        "metadata": {"name": "p", "namespace": "default"},
        "deleteOptions": {"gracePeriodSeconds": 0}
    }));
}

#[test]
fn delete_options_under_a_group_version() {
    let obj = json!({
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "gracePeriodSeconds": 0,
        "propagationPolicy": "Foreground",
        "preconditions": {"uid": "u"}
    });
    round_trip(obj);
}

#[test]
fn endpoint_slice_conditions_keep_false() {
    // EndpointConditions are *bool upstream: `ready: false` means not ready, absent means
    // unknown (treated as ready), so the zero must survive.
    round_trip(json!({
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": "web-abc", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{
            "addresses": ["10.0.0.5"],
            "conditions": {"ready": false, "serving": true, "terminating": false},
            "nodeName": "n1",
            "targetRef": {"kind": "Pod", "namespace": "default", "name": "web-1", "uid": "u"}
        }],
        "ports": [{"name": "", "protocol": "TCP", "port": 80}]
    }));
}

#[test]
fn core_and_events_v1_events() {
    round_trip(json!({
        "kind": "Event",
        "apiVersion": "v1",
        "metadata": {"name": "web.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web", "apiVersion": "v1"},
        "reason": "Scheduled",
        "message": "Successfully assigned default/web to n1",
        "source": {"component": "default-scheduler"},
        "firstTimestamp": "2024-05-06T07:08:09Z",
        "lastTimestamp": "2024-05-06T07:08:09Z",
        "count": 1,
        "type": "Normal",
        // A non-pointer MicroTime: Go writes the zero one, which reads back as null.
        "eventTime": null
    }));
    round_trip(json!({
        "kind": "Event",
        "apiVersion": "events.k8s.io/v1",
        "metadata": {"name": "web.2", "namespace": "default"},
        "eventTime": "2024-05-06T07:08:09.000001Z",
        "series": {"count": 2, "lastObservedTime": "2024-05-06T07:09:00.500000Z"},
        "reportingController": "kubelet",
        "reportingInstance": "kubelet-n1",
        "action": "Pulling",
        "reason": "Pulling",
        "regarding": {"kind": "Pod", "name": "web"},
        "note": "Pulling image",
        "type": "Normal"
    }));
}

#[test]
fn pod_with_status_and_security_context() {
    round_trip(json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "p", "namespace": "default", "deletionGracePeriodSeconds": 0,
                     "deletionTimestamp": "2024-05-06T07:08:09Z"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "sleep 1"],
                            "lifecycle": {"preStop": {"sleep": {"seconds": 5}}}}],
            "securityContext": {"runAsUser": 1000, "runAsGroup": 0, "fsGroup": 2000,
                                "supplementalGroups": [0, 4, 5]},
            "nodeName": "n1",
            "priority": 0,
            "enableServiceLinks": true
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "lastProbeTime": null,
                            "lastTransitionTime": "2024-05-06T07:08:09Z"}],
            "hostIP": "10.0.0.1",
            "podIP": "10.244.0.5",
            "podIPs": [{"ip": "10.244.0.5"}],
            "startTime": "2024-05-06T07:08:00Z",
            "containerStatuses": [{
                "name": "c",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                         "startedAt": "2024-05-06T07:08:01Z",
                                         "finishedAt": "2024-05-06T07:08:02Z"}},
                "lastState": {},
                "ready": false,
                "restartCount": 0,
                "image": "busybox:latest",
                "imageID": "",
                "started": false
            }],
            "qosClass": "BestEffort"
        }
    }));
}

#[test]
fn lists_encode_with_typed_items() {
    let list = json!({
        "kind": "ConfigMapList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "9"},
        "items": [
            {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "a"}, "data": {"k": "v"}},
            {"metadata": {"name": "b"}}
        ]
    });
    let back = decode(&encode(&list).expect("encodes")).expect("decodes");
    assert_eq!(
        back,
        json!({
            "kind": "ConfigMapList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "9"},
            "items": [
                {"metadata": {"name": "a"}, "data": {"k": "v"}},
                {"metadata": {"name": "b"}}
            ]
        })
    );
}

#[test]
fn errors_name_what_is_wrong() {
    let e = decode(b"{\"kind\":\"ConfigMap\"}").expect_err("json is not protobuf");
    assert!(matches!(e, ProtobufError::BadMagic));
    assert!(e.to_string().contains("k8s\\0"), "{e}");

    let e = decode(b"k8s\0\xff\xff").expect_err("garbage envelope");
    assert!(
        e.to_string().starts_with("malformed protobuf envelope"),
        "{e}"
    );

    let widget = encode(&json!({"kind": "ConfigMap", "apiVersion": "v1"}))
        .expect("encodes")
        .into_iter()
        .collect::<Vec<u8>>();
    let renamed = String::from_utf8_lossy(&widget).replace("ConfigMap", "Widget1X!");
    let e = decode(renamed.as_bytes()).expect_err("unknown kind");
    assert_eq!(
        e.to_string(),
        "no kind \"Widget1X!\" is registered for version \"v1\" in the protobuf schemas"
    );

    let (mut pb, _) = fixture("configmap");
    // Cut the object short inside a field: the kind is named in the error.
    let at = pb.len() - 10;
    pb.truncate(at);
    let e = decode(&pb).expect_err("truncated");
    assert!(!e.to_string().is_empty());

    let e = encode(&json!({"kind": "ConfigMap", "apiVersion": "v1", "data": {"k": 1}}))
        .expect_err("data values are strings");
    assert_eq!(e.to_string(), "data[\"k\"]: expected a string, found 1");
    let e = encode(&json!({"kind": "Pod", "metadata": {}})).expect_err("no apiVersion");
    assert_eq!(
        e.to_string(),
        "apiVersion: required to encode an object as protobuf"
    );
    let e = encode(&json!({"kind": "Pod", "apiVersion": "v1", "spec": {"bogus": 1}}))
        .expect_err("unknown field");
    assert_eq!(e.to_string(), "spec.bogus: unknown field");
}

#[test]
fn media_types() {
    assert!(is_protobuf("application/vnd.kubernetes.protobuf"));
    assert!(is_protobuf(
        "application/vnd.kubernetes.protobuf; charset=utf-8"
    ));
    assert!(!is_protobuf("application/json"));
    // What client-go sends: JSON is acceptable, so the server may answer JSON.
    assert!(!requires_protobuf(
        "application/vnd.kubernetes.protobuf,application/json"
    ));
    assert!(requires_protobuf("application/vnd.kubernetes.protobuf"));
    assert!(!requires_protobuf("application/json, */*"));
    assert!(requires_protobuf(
        "application/vnd.kubernetes.protobuf, application/json;q=0"
    ));
}

#[test]
fn job_with_zero_pointers_and_indexed_status() {
    // parallelism 0 (a paused Job), suspend false and ready 0 are Go pointers: kept.
    round_trip(json!({
        "kind": "Job",
        "apiVersion": "batch/v1",
        "metadata": {"name": "idx", "namespace": "default", "uid": "u1",
            "labels": {"batch.kubernetes.io/job-name": "idx"}},
        "spec": {
            "parallelism": 0, "completions": 3, "backoffLimit": 6, "completionMode": "Indexed",
            "suspend": false, "manualSelector": false, "podReplacementPolicy": "TerminatingOrFailed",
            "ttlSecondsAfterFinished": 0,
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u1"}},
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
            ]},
            "template": {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": "u1"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox",
                    "command": ["sh", "-c", "echo $JOB_COMPLETION_INDEX"]}]}}
        },
        "status": {
            "startTime": "2024-01-01T00:00:00Z", "completionTime": "2024-01-01T00:00:42Z",
            "succeeded": 3, "ready": 0, "terminating": 0, "completedIndexes": "0-2",
            "uncountedTerminatedPods": {},
            "conditions": [{"type": "Complete", "status": "True", "reason": "CompletionsReached",
                "message": "Reached expected number of succeeded pods",
                "lastProbeTime": "2024-01-01T00:00:42Z", "lastTransitionTime": "2024-01-01T00:00:42Z"}]
        }
    }));
}

#[test]
fn cronjob_with_history_limits_zero_and_active_refs() {
    round_trip(json!({
        "kind": "CronJob",
        "apiVersion": "batch/v1",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {
            "schedule": "*/1 * * * *", "timeZone": "Etc/UTC", "startingDeadlineSeconds": 0,
            "concurrencyPolicy": "Forbid", "suspend": false,
            "successfulJobsHistoryLimit": 0, "failedJobsHistoryLimit": 0,
            "jobTemplate": {"metadata": {"labels": {"app": "hello"}},
                "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "OnFailure",
                    "containers": [{"name": "c", "image": "busybox"}]}}}}
        },
        "status": {
            "active": [{"kind": "Job", "namespace": "default", "name": "hello-28401121",
                "uid": "u2", "apiVersion": "batch/v1", "resourceVersion": "7"}],
            "lastScheduleTime": "2024-01-01T00:01:00Z"
        }
    }));
}

#[test]
fn storage_class_with_pointer_fields() {
    round_trip(json!({
        "kind": "StorageClass",
        "apiVersion": "storage.k8s.io/v1",
        "metadata": {"name": "local"},
        "provisioner": "kubernetes.io/no-provisioner",
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": false,
        "volumeBindingMode": "WaitForFirstConsumer"
    }));
}
