//! The scheduler against the real API server, with fake nodes created through the API:
//! fit on Allocatable, taints and tolerations, nodeSelector, required node affinity,
//! FailedScheduling with upstream's wording, and a pending pod placed once a node fits.

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

use common::eventually;

fn node(name: &str, cpu: &str, labels: Value, taints: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {
            "capacity": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
        }
    }))
    .expect("node")
}

fn pod(name: &str, cpu: &str, extra: Value) -> Pod {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("pod")
}

async fn bound_to(pods: &Api<Pod>, name: &str) -> String {
    eventually(&format!("{name} bound"), || async {
        pods.get(name).await.ok()?.spec?.node_name
    })
    .await
}

/// The FailedScheduling message of `name`, once the scheduler has given up on it.
async fn failed_scheduling(client: &kube::Client, pods: &Api<Pod>, name: &str) -> String {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let msg = eventually(&format!("FailedScheduling for {name}"), || async {
        let list = events
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedScheduling"))
            .and_then(|e| e.message)
    })
    .await;
    let p = pods.get(name).await.expect("pod");
    assert_eq!(
        p.spec.and_then(|s| s.node_name),
        None,
        "{name} stays unbound"
    );
    let cond = p
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .expect("PodScheduled condition");
    assert_eq!(cond.status, "False");
    assert_eq!(cond.reason.as_deref(), Some("Unschedulable"));
    assert_eq!(cond.message.as_deref(), Some(msg.as_str()));
    msg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_placed_on_allocatable_and_wait_when_nothing_fits() {
    let c = common::start().await;
    let client = c.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    for n in ["n1", "n2"] {
        nodes
            .create(&pp, &node(n, "1", json!({}), json!([])))
            .await
            .expect("node");
    }
    pods.create(&pp, &pod("a", "600m", json!({})))
        .await
        .expect("a");
    let first = bound_to(&pods, "a").await;
    pods.create(&pp, &pod("b", "600m", json!({})))
        .await
        .expect("b");
    let second = bound_to(&pods, "b").await;
    assert_ne!(first, second, "600m + 600m does not fit on one 1-CPU node");
    let p = pods.get("a").await.expect("a");
    let sched = p.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        sched
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "True")
    );

    pods.create(&pp, &pod("c", "600m", json!({})))
        .await
        .expect("c");
    let msg = failed_scheduling(&client, &pods, "c").await;
    assert_eq!(msg, "0/2 nodes are available: 2 Insufficient cpu.");
    // The Scheduled event names the node, as `kubectl describe pod` shows it.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let scheduled = events
        .list(&ListParams::default().fields("involvedObject.name=a"))
        .await
        .expect("events");
    assert!(
        scheduled
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Scheduled")
                && e.message.as_deref()
                    == Some(&format!("Successfully assigned default/a to {first}"))),
        "{:?}",
        scheduled
            .items
            .iter()
            .map(|e| &e.message)
            .collect::<Vec<_>>()
    );

    // Room appears: a bigger node joins, and the waiting pod goes there.
    nodes
        .create(&pp, &node("n3", "4", json!({}), json!([])))
        .await
        .expect("n3");
    assert_eq!(bound_to(&pods, "c").await, "n3");

    // Deleting a pod frees its share for the next one.
    pods.create(&pp, &pod("d", "3500m", json!({})))
        .await
        .expect("d");
    let msg = failed_scheduling(&client, &pods, "d").await;
    assert_eq!(msg, "0/3 nodes are available: 3 Insufficient cpu.");
    pods.delete("c", &Default::default())
        .await
        .expect("delete c");
    // c was bound, so deletion is graceful; force it as a kubelet would finish it.
    let _ = pods
        .delete(
            "c",
            &kube::api::DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(bound_to(&pods, "d").await, "n3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taints_selectors_and_affinity_decide_where_a_pod_may_go() {
    let c = common::start().await;
    let client = c.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    nodes
        .create(
            &pp,
            &node(
                "gpu",
                "4",
                json!({"disk": "ssd"}),
                json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
            ),
        )
        .await
        .expect("gpu");
    nodes
        .create(&pp, &node("plain", "4", json!({"disk": "hdd"}), json!([])))
        .await
        .expect("plain");

    // Wants ssd, does not tolerate the taint: nowhere, and the message says why per node.
    pods.create(
        &pp,
        &pod("picky", "100m", json!({"nodeSelector": {"disk": "ssd"}})),
    )
    .await
    .expect("picky");
    let msg = failed_scheduling(&client, &pods, "picky").await;
    assert_eq!(
        msg,
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {dedicated: gpu}."
    );
    // Tolerating it, the pod goes to the ssd node.
    pods.create(&pp, &pod("tolerant", "100m", json!({"nodeSelector": {"disk": "ssd"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]})))
        .await
        .expect("tolerant");
    assert_eq!(bound_to(&pods, "tolerant").await, "gpu");
    // Without a selector, only the untainted node fits.
    pods.create(&pp, &pod("anywhere", "100m", json!({})))
        .await
        .expect("anywhere");
    assert_eq!(bound_to(&pods, "anywhere").await, "plain");
    // Required node affinity on a label expression, and on the node's name.
    pods.create(&pp, &pod("affine", "100m", json!({"tolerations": [{"operator": "Exists"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "disk", "operator": "NotIn", "values": ["hdd"]}]}]}}}})))
        .await
        .expect("affine");
    assert_eq!(bound_to(&pods, "affine").await, "gpu");
    pods.create(&pp, &pod("named", "100m", json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["plain"]}]}]}}}})))
        .await
        .expect("named");
    assert_eq!(bound_to(&pods, "named").await, "plain");
    // A cordoned node takes nothing new.
    nodes
        .patch(
            "plain",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("cordon");
    pods.create(&pp, &pod("late", "100m", json!({})))
        .await
        .expect("late");
    let msg = failed_scheduling(&client, &pods, "late").await;
    assert_eq!(
        msg,
        "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 1 node(s) were unschedulable."
    );
    // A pod for another scheduler is left alone.
    pods.create(
        &pp,
        &pod("other", "100m", json!({"schedulerName": "someone-else"})),
    )
    .await
    .expect("other");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let p = pods.get("other").await.expect("other");
    assert_eq!(p.spec.and_then(|s| s.node_name), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_garbage_status_is_never_chosen() {
    let c = common::start().await;
    let client = c.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let bare: Node = serde_json::from_value(json!({"metadata": {"name": "bare"}})).expect("node");
    nodes.create(&pp, &bare).await.expect("bare node");
    pods.create(&pp, &pod("p", "100m", json!({})))
        .await
        .expect("p");
    let msg = failed_scheduling(&client, &pods, "p").await;
    assert_eq!(
        msg,
        "0/1 nodes are available: 1 Insufficient cpu, 1 Too many pods."
    );
    nodes
        .create(&pp, &node("good", "1", json!({}), json!([])))
        .await
        .expect("good");
    assert_eq!(bound_to(&pods, "p").await, "good");
}
