//! Persistent storage against the real API server with the PV controller running: the
//! default `local-path` class, admission defaults and finalizers, an Immediate claim bound
//! to a matching PV, a WaitForFirstConsumer claim that waits for its pod to be scheduled on
//! a (fake) node and is then provisioned there, pvc-protection while a pod uses the claim,
//! and the Delete and Retain reclaim policies; the scheduler's VolumeBinding filter keeping a
//! StatefulSet pod on the node of its bound local volume.

mod common;

use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use common::eventually;

fn claim(name: &str, class: Option<&str>, size: &str) -> PersistentVolumeClaim {
    let mut spec =
        json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}});
    if let Some(c) = class {
        spec["storageClassName"] = json!(c);
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("pvc")
}

fn volume(name: &str, size: &str, class: &str, policy: &str) -> PersistentVolume {
    serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": class, "persistentVolumeReclaimPolicy": policy,
            "hostPath": {"path": format!("/tmp/nodus-test-{name}")}}}))
    .expect("pv")
}

fn ready_node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": {"cpu": "4", "memory": "4Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "4Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
        }
    }))
    .expect("node")
}

fn pod_using(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "busybox", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}}))
    .expect("pod")
}

async fn phase_of_claim(api: &Api<PersistentVolumeClaim>, name: &str) -> String {
    api.get(name)
        .await
        .ok()
        .and_then(|c| c.status?.phase)
        .unwrap_or_default()
}

async fn event_reasons(client: &kube::Client, name: &str) -> Vec<(String, String)> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_class_admission_and_validation() {
    let c = common::start().await;
    let client = c.client().await;
    let classes: Api<StorageClass> = Api::all(client.clone());
    let sc = classes.get("local-path").await.expect("local-path class");
    assert_eq!(sc.provisioner, "rancher.io/local-path");
    assert_eq!(
        sc.volume_binding_mode.as_deref(),
        Some("WaitForFirstConsumer")
    );
    assert_eq!(sc.reclaim_policy.as_deref(), Some("Delete"));
    let out = c.kubectl(&["get", "sc"]).await;
    let text = out.ok();
    assert!(
        text.contains("local-path (default)   rancher.io/local-path   Delete          WaitForFirstConsumer   false"),
        "{text}"
    );

    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let made = pvcs
        .create(&PostParams::default(), &claim("plain", None, "1Gi"))
        .await
        .expect("create pvc");
    let spec = made.spec.clone().expect("spec");
    assert_eq!(spec.storage_class_name.as_deref(), Some("local-path"));
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(
        made.metadata.finalizers,
        Some(vec!["kubernetes.io/pvc-protection".to_string()])
    );
    assert_eq!(
        made.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    // An explicit "" means no class: admission leaves it.
    let none = pvcs
        .create(&PostParams::default(), &claim("classless", Some(""), "1Gi"))
        .await
        .expect("create pvc");
    assert_eq!(
        none.spec.and_then(|s| s.storage_class_name).as_deref(),
        Some("")
    );

    let bad: PersistentVolumeClaim =
        serde_json::from_value(json!({"metadata": {"name": "bad"}, "spec": {}})).expect("pvc");
    let err = pvcs
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("invalid claim");
    let kube::Error::Api(status) = err else {
        panic!("not an API error: {err}")
    };
    assert_eq!(status.code, 422);
    assert_eq!(
        status.message,
        "PersistentVolumeClaim \"bad\" is invalid: [spec.accessModes: Required value: at least 1 access mode is required, spec.resources[storage]: Required value]"
    );

    let out = c.kubectl(&["get", "pvc", "plain"]).await;
    let text = out.ok();
    assert!(text.starts_with("NAME    STATUS    VOLUME   CAPACITY   ACCESS MODES   STORAGECLASS   VOLUMEATTRIBUTESCLASS   AGE"), "{text}");
    assert!(
        text.contains(
            "plain   Pending                                      local-path     <unset>"
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_claim_binds_smallest_matching_volume_and_retain_keeps_it_released() {
    let c = common::start().await;
    let client = c.client().await;
    let classes: Api<StorageClass> = Api::all(client.clone());
    let manual: StorageClass = serde_json::from_value(
        json!({"metadata": {"name": "manual"}, "provisioner": "kubernetes.io/no-provisioner"}),
    )
    .expect("sc");
    classes
        .create(&PostParams::default(), &manual)
        .await
        .expect("create sc");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for (n, size) in [("big", "10Gi"), ("small", "2Gi"), ("tiny", "500Mi")] {
        pvs.create(&PostParams::default(), &volume(n, size, "manual", "Retain"))
            .await
            .expect("create pv");
    }
    eventually("volumes Available", || async {
        let list = pvs.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .all(|v| v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available"))
            .then_some(())
    })
    .await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    pvcs.create(
        &PostParams::default(),
        &claim("data", Some("manual"), "1Gi"),
    )
    .await
    .expect("create pvc");
    eventually("claim bound", || async {
        (phase_of_claim(&pvcs, "data").await == "Bound").then_some(())
    })
    .await;
    let bound = pvcs.get("data").await.expect("pvc");
    assert_eq!(
        bound.spec.as_ref().and_then(|s| s.volume_name.as_deref()),
        Some("small")
    );
    let ann = bound.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("pv.kubernetes.io/bind-completed")
            .map(String::as_str),
        Some("yes")
    );
    assert_eq!(
        ann.get("pv.kubernetes.io/bound-by-controller")
            .map(String::as_str),
        Some("yes")
    );
    let status = bound.status.expect("status");
    assert_eq!(
        status
            .capacity
            .and_then(|c| c.get("storage").map(|q| q.0.clone())),
        Some("2Gi".into())
    );
    let pv = eventually("pv bound", || async {
        let pv = pvs.get("small").await.ok()?;
        (pv.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(pv)
    })
    .await;
    let cref = pv.spec.and_then(|s| s.claim_ref).expect("claimRef");
    assert_eq!(cref.name.as_deref(), Some("data"));
    assert_eq!(cref.uid, bound.metadata.uid);
    assert_eq!(
        pv.metadata.finalizers,
        Some(vec!["kubernetes.io/pv-protection".to_string()])
    );
    let out = c.kubectl(&["get", "pv", "small"]).await;
    let text = out.ok();
    assert!(
        text.contains(
            "small   2Gi        RWO            Retain           Bound    default/data   manual"
        ),
        "{text}"
    );

    // Retain: the claim goes, the volume stays Released with its claimRef.
    pvcs.delete("data", &DeleteParams::default())
        .await
        .expect("delete pvc");
    eventually("pv released", || async {
        let pv = pvs.get("small").await.ok()?;
        (pv.status?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await;
    eventually("claim gone", || async {
        pvcs.get("data").await.is_err().then_some(())
    })
    .await;
    // A released volume is not bound again.
    pvcs.create(
        &PostParams::default(),
        &claim("again", Some("manual"), "1500Mi"),
    )
    .await
    .expect("create pvc");
    eventually("second claim bound", || async {
        let c = pvcs.get("again").await.ok()?;
        c.spec?.volume_name.filter(|v| !v.is_empty())
    })
    .await;
    assert_eq!(
        pvcs.get("again")
            .await
            .expect("pvc")
            .spec
            .and_then(|s| s.volume_name)
            .as_deref(),
        Some("big")
    );
    assert_eq!(
        pvs.get("small")
            .await
            .expect("pv")
            .status
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Released")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_first_consumer_provisions_on_the_scheduled_node_and_delete_reclaims() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("storage");
    let c = common::start_with_controllers(nodus_control_plane::controllers::ControllersConfig {
        local_storage_path: storage.clone(),
        ..Default::default()
    })
    .await;
    let client = c.client().await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let made = pvcs
        .create(&PostParams::default(), &claim("data", None, "1Gi"))
        .await
        .expect("create pvc");
    let uid = made.metadata.uid.clone().expect("uid");
    let waiting = eventually("WaitForFirstConsumer event", || async {
        event_reasons(&client, "data")
            .await
            .into_iter()
            .find(|(r, _)| r == "WaitForFirstConsumer")
    })
    .await;
    assert_eq!(
        waiting.1,
        "waiting for first consumer to be created before binding"
    );
    assert_eq!(phase_of_claim(&pvcs, "data").await, "Pending");
    assert!(
        pvs.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );

    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &ready_node("n1"))
        .await
        .expect("node");
    pods.create(&PostParams::default(), &pod_using("app", "data"))
        .await
        .expect("pod");
    eventually("claim bound", || async {
        (phase_of_claim(&pvcs, "data").await == "Bound").then_some(())
    })
    .await;
    let bound = pvcs.get("data").await.expect("pvc");
    let ann = bound.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("volume.kubernetes.io/selected-node")
            .map(String::as_str),
        Some("n1")
    );
    assert_eq!(
        ann.get("volume.kubernetes.io/storage-provisioner")
            .map(String::as_str),
        Some("rancher.io/local-path")
    );
    let pv_name = format!("pvc-{uid}");
    assert_eq!(
        bound.spec.and_then(|s| s.volume_name).as_deref(),
        Some(pv_name.as_str())
    );
    let pv = pvs.get(&pv_name).await.expect("provisioned pv");
    let pv_json: Value = serde_json::to_value(&pv).expect("json");
    assert_eq!(
        pv_json["spec"]["hostPath"]["path"],
        json!(
            storage
                .join(format!("{pv_name}_default_data"))
                .to_string_lossy()
        )
    );
    assert_eq!(pv_json["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    assert_eq!(
        pv_json["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
            ["values"],
        json!(["n1"])
    );
    let reasons = event_reasons(&client, "data").await;
    assert!(
        reasons.contains(&(
            "ProvisioningSucceeded".into(),
            format!("Successfully provisioned volume {pv_name}")
        )),
        "{reasons:?}"
    );

    // pvc-protection: the claim stays while its pod exists.
    pvcs.delete("data", &DeleteParams::default())
        .await
        .expect("delete pvc");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let held = pvcs.get("data").await.expect("claim still there");
    assert!(held.metadata.deletion_timestamp.is_some());
    let out = c.kubectl(&["get", "pvc", "data"]).await;
    assert!(out.ok().contains("data   Terminating"), "{}", out.stdout);
    pods.delete("app", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
    // Delete: claim gone → volume released → PV object deleted.
    eventually("claim gone", || async {
        pvcs.get("data").await.is_err().then_some(())
    })
    .await;
    eventually("pv gone", || async {
        pvs.get(&pv_name).await.is_err().then_some(())
    })
    .await;
}

/// The FailedScheduling message of `name`, once the scheduler has given up on it.
async fn failed_scheduling(client: &kube::Client, name: &str) -> String {
    eventually(&format!("FailedScheduling for {name}"), || async {
        event_reasons(client, name)
            .await
            .into_iter()
            .find(|(r, _)| r == "FailedScheduling")
            .map(|(_, m)| m)
    })
    .await
}

async fn node_of(pods: &Api<Pod>, name: &str) -> String {
    eventually(&format!("{name} bound"), || async {
        pods.get(name).await.ok()?.spec?.node_name
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_local_volumes_pin_their_pods_to_the_volumes_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = common::start_with_controllers(nodus_control_plane::controllers::ControllersConfig {
        local_storage_path: dir.path().join("storage"),
        ..Default::default()
    })
    .await;
    let client = c.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    // n1 starts cordoned, so the first placements land on n2.
    let mut cordoned = ready_node("n1");
    cordoned.spec = Some(serde_json::from_value(json!({"unschedulable": true})).expect("spec"));
    nodes
        .create(&PostParams::default(), &cordoned)
        .await
        .expect("n1");
    nodes
        .create(&PostParams::default(), &ready_node("n2"))
        .await
        .expect("n2");

    // A claim that does not exist yet keeps the pod pending with upstream's words; the
    // claim's creation brings it back.
    pods.create(&PostParams::default(), &pod_using("early", "late"))
        .await
        .expect("pod");
    assert_eq!(
        failed_scheduling(&client, "early").await,
        "0/2 nodes are available: persistentvolumeclaim \"late\" not found. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    );
    pvcs.create(&PostParams::default(), &claim("late", None, "1Gi"))
        .await
        .expect("pvc");
    assert_eq!(node_of(&pods, "early").await, "n2");

    c.apply(
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers:
      - name: c
        image: busybox
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Gi}}
"#,
    )
    .await
    .ok();
    assert_eq!(node_of(&pods, "db-0").await, "n2");
    eventually("data-db-0 bound", || async {
        (phase_of_claim(&pvcs, "data-db-0").await == "Bound").then_some(())
    })
    .await;

    // With n1 open and emptier, only the volume's node affinity brings db-0 back to n2.
    let open: Node = serde_json::from_value(json!({"spec": {"unschedulable": false}})).unwrap();
    nodes
        .patch(
            "n1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&open),
        )
        .await
        .expect("uncordon");
    // The node lifecycle controller lifts the `unschedulable` taint after the uncordon;
    // until then n1 would be refused for the taint, not for the volume.
    eventually("n1's unschedulable taint lifted", || async {
        let n = nodes.get("n1").await.ok()?;
        let tainted = n.spec.and_then(|s| s.taints).is_some_and(|t| {
            t.iter()
                .any(|t| t.key == "node.kubernetes.io/unschedulable")
        });
        (!tainted).then_some(())
    })
    .await;
    let first_uid = pods.get("db-0").await.expect("db-0").metadata.uid;
    pods.delete("db-0", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete db-0");
    eventually("db-0 made again", || async {
        let p = pods.get("db-0").await.ok()?;
        (p.metadata.uid != first_uid).then_some(())
    })
    .await;
    assert_eq!(node_of(&pods, "db-0").await, "n2");
    // A pod with the same claim that may only go to n1 fits nowhere, and says why.
    let mut pinned = pod_using("elsewhere", "data-db-0");
    pinned.spec.as_mut().expect("spec").node_selector =
        Some([("kubernetes.io/hostname".to_string(), "n1".to_string())].into());
    pods.create(&PostParams::default(), &pinned)
        .await
        .expect("pod");
    assert_eq!(
        failed_scheduling(&client, "elsewhere").await,
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
         1 node(s) had volume node affinity conflict. preemption: 0/2 nodes are available: \
         2 Preemption is not helpful for scheduling."
    );
    let out = c.kubectl(&["describe", "pod", "elsewhere"]).await;
    assert!(
        out.ok().contains("volume node affinity conflict"),
        "{}",
        out.stdout
    );
}
