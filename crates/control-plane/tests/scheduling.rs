//! The scheduler against the real API server, with fake nodes created through the API:
//! fit on Allocatable, taints and tolerations, nodeSelector, required node affinity,
//! FailedScheduling with upstream's wording, and a pending pod placed once a node fits;
//! inter-pod affinity and anti-affinity, topology spread constraints, and the default
//! spreading of a ReplicaSet's pods; preemption of lower-priority pods by a pending
//! higher-priority one.

mod common;

use std::time::Duration;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ReplicaSet;
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
    assert_eq!(
        msg,
        "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
    );
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
    assert_eq!(
        msg,
        "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
    );
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
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {dedicated: gpu}. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
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
        "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 1 node(s) were unschedulable. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
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
        "0/1 nodes are available: 1 Insufficient cpu, 1 Too many pods. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
    );
    nodes
        .create(&pp, &node("good", "1", json!({}), json!([])))
        .await
        .expect("good");
    assert_eq!(bound_to(&pods, "p").await, "good");
}

const HOSTNAME: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

/// A node labelled with its hostname (as a kubelet registers it) and `labels`.
fn host(name: &str, cpu: &str, labels: Value) -> Node {
    let mut labels = labels;
    labels[HOSTNAME] = json!(name);
    node(name, cpu, labels, json!([]))
}

/// A 100m pod with `labels` and extra spec fields.
fn labeled_pod(name: &str, labels: Value, spec: Value) -> Pod {
    let mut p = pod(name, "100m", spec);
    p.metadata.labels = serde_json::from_value(labels).expect("labels");
    p
}

/// How many of `names` are bound to each node.
async fn placement(pods: &Api<Pod>, names: &[String]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for n in names {
        *out.entry(bound_to(pods, n).await).or_default() += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_anti_affinity_spreads_one_per_node_and_affinity_co_locates() {
    let c = common::start().await;
    let client = c.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    for n in ["n1", "n2", "n3"] {
        nodes
            .create(&pp, &host(n, "4", json!({})))
            .await
            .expect("node");
    }
    // Four replicas that refuse to share a node, created at once (decided in one batch).
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": HOSTNAME}]}}});
    let names: Vec<String> = (0..4).map(|i| format!("web-{i}")).collect();
    for n in &names {
        pods.create(&pp, &labeled_pod(n, json!({"app": "web"}), anti.clone()))
            .await
            .expect("web pod");
    }
    // Three are bound, one per node; the fourth waits with upstream's message.
    let (bound, waiting) = eventually("three web pods bound", || async {
        let mut bound = BTreeMap::new();
        let mut waiting = None;
        for n in &names {
            match pods.get(n).await.ok()?.spec?.node_name {
                Some(node) => *bound.entry(node).or_insert(0) += 1,
                None => waiting = Some(n.clone()),
            }
        }
        (bound.len() == 3).then_some((bound, waiting))
    })
    .await;
    assert!(bound.values().all(|c| *c == 1), "one per node: {bound:?}");
    let waiting = waiting.expect("one pod left over");
    assert_eq!(
        failed_scheduling(&client, &pods, &waiting).await,
        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
    );

    // Existing pods' anti-affinity holds against a pod without terms of its own.
    pods.create(
        &pp,
        &labeled_pod("plain-web", json!({"app": "web"}), json!({})),
    )
    .await
    .expect("plain-web");
    assert_eq!(
        failed_scheduling(&client, &pods, "plain-web").await,
        "0/3 nodes are available: 3 node(s) didn't satisfy existing pods anti-affinity rules. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
    );

    // Required affinity: followers go where their leader is.
    pods.create(
        &pp,
        &labeled_pod("cache", json!({"app": "cache"}), json!({})),
    )
    .await
    .expect("cache");
    let leader = bound_to(&pods, "cache").await;
    let follow = |target: &str| {
        json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": target}}, "topologyKey": HOSTNAME}]}}})
    };
    for i in 0..3 {
        pods.create(
            &pp,
            &labeled_pod(
                &format!("follower-{i}"),
                json!({"app": "client"}),
                follow("cache"),
            ),
        )
        .await
        .expect("follower");
    }
    for i in 0..3 {
        assert_eq!(bound_to(&pods, &format!("follower-{i}")).await, leader);
    }
    // Affinity to pods that exist nowhere (and that the pod is not itself) cannot be met.
    pods.create(
        &pp,
        &labeled_pod("lonely", json!({"app": "client"}), follow("nothing")),
    )
    .await
    .expect("lonely");
    assert_eq!(
        failed_scheduling(&client, &pods, "lonely").await,
        "0/3 nodes are available: 3 node(s) didn't match pod affinity rules. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    );
    // Once such a pod is bound, the waiting one is retried (not left for the 5-minute
    // flush) and joins it.
    pods.create(
        &pp,
        &labeled_pod("target", json!({"app": "nothing"}), json!({})),
    )
    .await
    .expect("target");
    let target = bound_to(&pods, "target").await;
    assert_eq!(bound_to(&pods, "lonely").await, target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_spread_keeps_zones_within_max_skew() {
    let c = common::start().await;
    let client = c.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    // Zone a has two nodes (and more room), zone b one; "plain" has no zone.
    for (n, cpu, zone) in [("za1", "8", "a"), ("za2", "8", "a"), ("zb1", "2", "b")] {
        nodes
            .create(&pp, &host(n, cpu, json!({ZONE: zone})))
            .await
            .expect("node");
    }
    nodes
        .create(&pp, &host("plain", "8", json!({})))
        .await
        .expect("plain");
    let spread = |extra: Value| {
        let mut c = json!({"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "spread"}}});
        for (k, v) in extra.as_object().expect("object") {
            c[k] = v.clone();
        }
        json!({"topologySpreadConstraints": [c]})
    };
    let names: Vec<String> = (0..6).map(|i| format!("s-{i}")).collect();
    for n in &names {
        pods.create(
            &pp,
            &labeled_pod(n, json!({"app": "spread"}), spread(json!({}))),
        )
        .await
        .expect("spread pod");
    }
    let by_node = placement(&pods, &names).await;
    let zone_a = by_node.get("za1").unwrap_or(&0) + by_node.get("za2").unwrap_or(&0);
    let zone_b = *by_node.get("zb1").unwrap_or(&0);
    assert_eq!((zone_a, zone_b), (3, 3), "{by_node:?}");
    assert!(!by_node.contains_key("plain"), "{by_node:?}");

    // One more in zone b is within the skew; a second is not. (nodeAffinityPolicy Ignore:
    // zone a counts although the pod's selector rules it out.)
    let pinned = |node: &str| {
        let mut s = spread(json!({"nodeAffinityPolicy": "Ignore"}));
        s["nodeSelector"] = json!({HOSTNAME: node});
        s
    };
    pods.create(
        &pp,
        &labeled_pod("b-1", json!({"app": "spread"}), pinned("zb1")),
    )
    .await
    .expect("b-1");
    assert_eq!(bound_to(&pods, "b-1").await, "zb1");
    pods.create(
        &pp,
        &labeled_pod("b-2", json!({"app": "spread"}), pinned("zb1")),
    )
    .await
    .expect("b-2");
    assert_eq!(
        failed_scheduling(&client, &pods, "b-2").await,
        "0/4 nodes are available: 1 node(s) didn't match pod topology spread constraints, 3 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes are available: 1 No preemption victims found for incoming pod, 3 Preemption is not helpful for scheduling."
    );
    pods.create(
        &pp,
        &labeled_pod("nozone", json!({"app": "spread"}), pinned("plain")),
    )
    .await
    .expect("nozone");
    assert_eq!(
        failed_scheduling(&client, &pods, "nozone").await,
        "0/4 nodes are available: 1 node(s) didn't match pod topology spread constraints (missing required label), 3 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_sets_pods_are_spread_by_default() {
    // The test makes the ReplicaSet's pods itself, as its controller would.
    let c = common::start_with_controllers(nodus_control_plane::controllers::ControllersConfig {
        disabled: vec!["replicaset".into()],
        ..Default::default()
    })
    .await;
    let client = c.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    // One big node: on free resources alone (LeastAllocated) every pod would go there.
    for (n, cpu, memory) in [
        ("big", "32", "64Gi"),
        ("small-1", "2", "4Gi"),
        ("small-2", "2", "4Gi"),
    ] {
        let mut v = host(n, cpu, json!({}));
        let status = v.status.as_mut().expect("status");
        for list in [&mut status.capacity, &mut status.allocatable] {
            list.as_mut().expect("resources").insert(
                "memory".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(memory.into()),
            );
        }
        nodes.create(&pp, &v).await.expect("node");
    }
    let replicas = 6;
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "rs-web"}},
            "template": {"metadata": {"labels": {"app": "rs-web"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .expect("replicaset");
    let rs = sets.create(&pp, &rs).await.expect("create replicaset");
    let uid = rs.metadata.uid.expect("uid");
    // The pods a ReplicaSet controller would create: its labels, it as controller.
    let names: Vec<String> = (0..replicas).map(|i| format!("web-{i}")).collect();
    for n in &names {
        let mut p = labeled_pod(n, json!({"app": "rs-web"}), json!({}));
        p.metadata.owner_references = Some(
            serde_json::from_value(json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "web", "uid": uid, "controller": true, "blockOwnerDeletion": true}]))
            .expect("owner"),
        );
        pods.create(&pp, &p).await.expect("pod");
    }
    // Spreading by hostname (weight 2) outweighs the big node's free room (weight 1).
    let by_node = placement(&pods, &names).await;
    assert_eq!(by_node.len(), 3, "every node takes some: {by_node:?}");
    assert!(by_node.values().all(|c| *c <= 3), "{by_node:?}");

    // A pod that belongs to nothing is placed on resources alone: the big node.
    pods.create(
        &pp,
        &labeled_pod("loner", json!({"app": "rs-web-not"}), json!({})),
    )
    .await
    .expect("loner");
    assert_eq!(bound_to(&pods, "loner").await, "big");
}

/// Events of `reason` about `name`, their messages.
async fn events_of(client: &kube::Client, name: &str, reason: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter_map(|e| e.message)
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_pod_preempts_the_least_important_pods() {
    let c = common::start().await;
    let client = c.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let classes = c.apply(
        r#"
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: low}
value: 10
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: mid}
value: 50
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 100
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: polite}
value: 100
preemptionPolicy: Never
"#,
    );
    classes.await.ok();
    for n in ["n1", "n2"] {
        nodes
            .create(&pp, &node(n, "2", json!({}), json!([])))
            .await
            .expect("node");
    }
    // n1 holds a low-priority pod, n2 a mid-priority one; each fills its node.
    pods.create(
        &pp,
        &pod("low", "1500m", json!({"priorityClassName": "low"})),
    )
    .await
    .expect("low");
    assert_eq!(bound_to(&pods, "low").await, "n1");
    pods.create(
        &pp,
        &pod("mid", "1500m", json!({"priorityClassName": "mid"})),
    )
    .await
    .expect("mid");
    assert_eq!(bound_to(&pods, "mid").await, "n2");

    // preemptionPolicy: Never waits instead of preempting.
    pods.create(
        &pp,
        &pod("polite", "1500m", json!({"priorityClassName": "polite"})),
    )
    .await
    .expect("polite");
    assert_eq!(
        failed_scheduling(&client, &pods, "polite").await,
        "0/2 nodes are available: 2 Insufficient cpu. preemption: not eligible due to preemptionPolicy=Never."
    );
    let p = pods.get("polite").await.expect("polite");
    assert_eq!(p.status.and_then(|s| s.nominated_node_name), None);
    for name in ["low", "mid"] {
        let v = pods.get(name).await.expect("still there");
        assert!(v.metadata.deletion_timestamp.is_none(), "{name} kept");
    }
    pods.delete(
        "polite",
        &kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("delete polite");

    // A high-priority pod preempts the lowest-priority victim: low on n1.
    let urgent = pods
        .create(
            &pp,
            &pod("urgent", "1500m", json!({"priorityClassName": "high"})),
        )
        .await
        .expect("urgent");
    let uid = urgent.metadata.uid.expect("uid");
    let nominated = eventually("urgent nominated", || async {
        pods.get("urgent").await.ok()?.status?.nominated_node_name
    })
    .await;
    assert_eq!(nominated, "n1");
    let victim = eventually("low terminating", || async {
        let p = pods.get("low").await.ok()?;
        p.metadata.deletion_timestamp.is_some().then_some(p)
    })
    .await;
    let cond = victim
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("DisruptionTarget condition");
    assert_eq!(
        (
            cond.status.as_str(),
            cond.reason.as_deref(),
            cond.message.as_deref()
        ),
        (
            "True",
            Some("PreemptionByScheduler"),
            Some("default-scheduler: preempting to accommodate a higher priority pod")
        )
    );
    assert_eq!(
        events_of(&client, "low", "Preempted").await,
        vec![format!("Preempted by pod {uid} on node n1")]
    );
    let kept = pods.get("mid").await.expect("mid");
    assert!(kept.metadata.deletion_timestamp.is_none(), "mid is spared");
    assert_eq!(
        pods.get("urgent")
            .await
            .expect("urgent")
            .spec
            .and_then(|s| s.node_name),
        None,
        "urgent waits for its victim to go"
    );
    // The victim's kubelet finishes it; the preemptor takes its place.
    pods.delete(
        "low",
        &kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("finish low");
    assert_eq!(bound_to(&pods, "urgent").await, "n1");
    let out = c.kubectl(&["describe", "pod", "urgent"]).await;
    assert!(out.ok().contains("n1"), "{}", out.stdout);

    // Too big even for an emptied node: preemption was tried and says why per node (n1
    // holds only its peer urgent, n2 would still be short with mid gone); nothing is deleted.
    pods.create(&pp, &pod("huge", "3", json!({"priorityClassName": "high"})))
        .await
        .expect("huge");
    assert_eq!(
        failed_scheduling(&client, &pods, "huge").await,
        "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: \
         1 Insufficient cpu, 1 No preemption victims found for incoming pod."
    );
    let p = pods.get("huge").await.expect("huge");
    assert_eq!(p.status.and_then(|s| s.nominated_node_name), None);
    let kept = pods.get("mid").await.expect("mid");
    assert!(kept.metadata.deletion_timestamp.is_none(), "mid is spared");
    let out = c.kubectl(&["describe", "pod", "huge"]).await;
    assert!(
        out.ok().contains("preemption: 0/2 nodes are available"),
        "{}",
        out.stdout
    );
}
