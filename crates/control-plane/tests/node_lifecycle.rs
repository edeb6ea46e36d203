//! The node-lifecycle and taint-eviction controllers against the real API server, with
//! fake nodes whose Leases the test renews by hand, and grace periods shortened: a node
//! whose Lease stops is marked Unknown, tainted unreachable, and its pods are deleted
//! after their tolerationSeconds; pods that tolerate the taint stay; a node that comes
//! back loses the taints.

mod common;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use nodus_control_plane::controllers::ControllersConfig;
use serde_json::json;

async fn eventually<F, Fut, T>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    common::eventually_n(what, 400, f).await
}

fn now_micro() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock");
    let ts =
        k8s_openapi::jiff::Timestamp::new(d.as_secs() as i64, (d.subsec_micros() * 1000) as i32)
            .expect("ts");
    ts.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

async fn make_node(client: &kube::Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {
            "allocatable": {"cpu": "2", "memory": "2Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}],
        }
    }))
    .expect("node");
    nodes
        .create(&PostParams::default(), &n)
        .await
        .expect("create node");
    renew(client, name).await;
}

async fn renew(client: &kube::Client, name: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let l: Lease = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
    }))
    .expect("lease");
    if leases.create(&PostParams::default(), &l).await.is_err() {
        leases
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"renewTime": now_micro()}})),
            )
            .await
            .expect("renew lease");
    }
}

fn pod_on(name: &str, node: &str, tolerations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}], "tolerations": tolerations}}))
    .expect("pod")
}

fn taints(n: &Node) -> Vec<(String, String)> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_goes_unknown_is_tainted_and_its_pods_are_evicted() {
    let c = common::start_with_controllers(ControllersConfig {
        node_monitor_period: Duration::from_millis(200),
        node_monitor_grace_period: Duration::from_secs(3),
        node_startup_grace_period: Duration::from_secs(3),
        node_eviction_rate: 100.0,
        ..Default::default()
    })
    .await;
    let client = c.client().await;
    make_node(&client, "alive").await;
    make_node(&client, "silent").await;
    // The alive node keeps renewing; the silent one never does again.
    let keep = {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                renew(&client, "alive").await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let unreachable = |secs: Option<i64>| json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": secs}]);
    pods.create(&pp, &pod_on("short", "silent", unreachable(Some(2))))
        .await
        .expect("short");
    pods.create(&pp, &pod_on("forever", "silent", unreachable(None)))
        .await
        .expect("forever");
    // No tolerations of its own: admission gives it upstream's 300 s ones.
    pods.create(&pp, &pod_on("default", "silent", json!([])))
        .await
        .expect("default");
    let p = pods.get("default").await.expect("default");
    let tols = p.spec.and_then(|s| s.tolerations).unwrap_or_default();
    assert!(tols.iter().any(
        |t| t.key.as_deref() == Some("node.kubernetes.io/unreachable")
            && t.toleration_seconds == Some(300)
    ));

    let nodes: Api<Node> = Api::all(client.clone());
    let ready = eventually("silent node Ready=Unknown", || async {
        let n = nodes.get("silent").await.ok()?;
        let c = n
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (c.status == "Unknown").then_some(c)
    })
    .await;
    assert_eq!(ready.reason.as_deref(), Some("NodeStatusUnknown"));
    assert_eq!(
        ready.message.as_deref(),
        Some("Kubelet stopped posting node status.")
    );
    let n = eventually("unreachable taints", || async {
        let n = nodes.get("silent").await.ok()?;
        (taints(&n).len() == 2).then_some(n)
    })
    .await;
    assert_eq!(
        taints(&n),
        vec![
            (
                "node.kubernetes.io/unreachable".to_string(),
                "NoSchedule".to_string()
            ),
            (
                "node.kubernetes.io/unreachable".to_string(),
                "NoExecute".to_string()
            ),
        ]
    );
    // The renewing node is untouched.
    let alive = nodes.get("alive").await.expect("alive");
    assert!(taints(&alive).is_empty());

    // The pod tolerating 2 s is deleted (gracefully: it stays Terminating, as no kubelet
    // is there to finish it) and says why.
    let short = eventually("short evicted", || async {
        let p = pods.get("short").await.ok()?;
        p.metadata.deletion_timestamp.is_some().then_some(p)
    })
    .await;
    let cond = short.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        cond.iter().any(|c| c.type_ == "DisruptionTarget"
            && c.reason.as_deref() == Some("DeletionByTaintManager"))
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let evs = events
        .list(&ListParams::default().fields("involvedObject.name=short"))
        .await
        .expect("events");
    assert!(
        evs.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("TaintManagerEviction")
                && e.message.as_deref() == Some("Marking for deletion Pod default/short"))
    );
    let node_evs = events
        .list(&ListParams::default().fields("involvedObject.name=silent"))
        .await
        .expect("events");
    assert!(
        node_evs
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("NodeNotReady"))
    );
    // Pods tolerating forever, or for 300 s, stay.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["forever", "default"] {
        let p = pods.get(name).await.expect(name);
        assert!(p.metadata.deletion_timestamp.is_none(), "{name} must stay");
    }
    // The scheduler no longer places pods there.
    let fresh: Pod = serde_json::from_value(json!({"metadata": {"name": "fresh"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
    .expect("pod");
    pods.create(&pp, &fresh).await.expect("fresh");
    let node = eventually("fresh bound", || async {
        pods.get("fresh").await.ok()?.spec?.node_name
    })
    .await;
    assert_eq!(node, "alive");

    // The kubelet comes back and posts Ready: the taints go.
    renew(&client, "silent").await;
    nodes
        .patch_status(
            "silent",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status", "lastHeartbeatTime": "2026-01-02T00:00:00Z"}]}})),
        )
        .await
        .expect("ready again");
    eventually("taints removed", || async {
        let n = nodes.get("silent").await.ok()?;
        taints(&n).is_empty().then_some(())
    })
    .await;
    keep.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_node_is_silent_nothing_is_evicted() {
    // A whole zone down looks like the control plane's own outage: upstream stops evicting.
    let c = common::start_with_controllers(ControllersConfig {
        node_monitor_period: Duration::from_millis(200),
        node_monitor_grace_period: Duration::from_secs(2),
        node_eviction_rate: 100.0,
        ..Default::default()
    })
    .await;
    let client = c.client().await;
    make_node(&client, "only").await;
    let nodes: Api<Node> = Api::all(client.clone());
    let n = eventually("Ready=Unknown and NoSchedule taint", || async {
        let n = nodes.get("only").await.ok()?;
        (!taints(&n).is_empty()).then_some(n)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let n2 = nodes.get("only").await.expect("node");
    assert_eq!(taints(&n), taints(&n2));
    assert_eq!(
        taints(&n2),
        vec![(
            "node.kubernetes.io/unreachable".to_string(),
            "NoSchedule".to_string()
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_upstream_defaults_a_silent_node_goes_unknown() {
    // Real timings: node-monitor-grace-period 50 s, node-monitor-period 5 s.
    let c = common::start().await;
    let client = c.client().await;
    make_node(&client, "alive").await;
    make_node(&client, "silent").await;
    let keep = {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                renew(&client, "alive").await;
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        })
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let started = std::time::Instant::now();
    for _ in 0..240 {
        let n = nodes.get("silent").await.expect("node");
        let unknown = n
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "Unknown");
        if unknown {
            // Never before the grace period has passed.
            assert!(
                started.elapsed() >= Duration::from_secs(45),
                "marked Unknown after {:?}",
                started.elapsed()
            );
            let alive = nodes.get("alive").await.expect("alive");
            assert!(taints(&alive).is_empty());
            keep.abort();
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the silent node was not marked Unknown within 120 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_a_deleted_node_are_garbage_collected() {
    let c = common::start_with_controllers(ControllersConfig {
        pod_gc_quarantine: Duration::from_secs(1),
        ..Default::default()
    })
    .await;
    let client = c.client().await;
    make_node(&client, "gone").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod_on("orphan", "gone", json!([])))
        .await
        .expect("pod");
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .delete("gone", &Default::default())
        .await
        .expect("delete node");
    eventually("orphan removed", || async {
        pods.get_opt("orphan").await.ok()?.is_none().then_some(())
    })
    .await;
}

/// upstream's MarkPodsNotReady: the pods of a node that goes Unknown stop being Ready at
/// once, with a NodeNotReady warning, so their endpoints stop receiving traffic long
/// before the 300 s tolerations run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_a_silent_node_turn_not_ready_and_leave_their_endpoints() {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let c = common::start_with_controllers(ControllersConfig {
        node_monitor_period: Duration::from_millis(200),
        node_monitor_grace_period: Duration::from_secs(3),
        node_eviction_rate: 100.0,
        ..Default::default()
    })
    .await;
    let client = c.client().await;
    make_node(&client, "alive").await;
    make_node(&client, "silent").await;
    let keep = {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                renew(&client, "alive").await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}))
    .expect("svc");
    svcs.create(&PostParams::default(), &svc)
        .await
        .expect("svc");
    for (name, node, ip) in [
        ("on-silent", "silent", "10.0.0.1"),
        ("on-alive", "alive", "10.0.0.2"),
    ] {
        let p: Pod =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}))
            .expect("pod");
        pods.create(&PostParams::default(), &p).await.expect("pod");
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                "conditions": [
                    {"type": "ContainersReady", "status": "True"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .expect("pod status");
    }
    let ready_endpoints = || async {
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await
            .ok()?;
        let mut out: Vec<(String, bool)> = list
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .map(|e| {
                let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
                (e.addresses[0].clone(), ready)
            })
            .collect();
        out.sort();
        Some(out)
    };
    eventually("both endpoints ready", || async {
        let e = ready_endpoints().await?;
        (e == vec![
            ("10.0.0.1".to_string(), true),
            ("10.0.0.2".to_string(), true),
        ])
        .then_some(())
    })
    .await;

    // The silent node goes Unknown: its pod's Ready turns False, the other pod's stays.
    let p = eventually("on-silent Ready=False", || async {
        let p = pods.get("on-silent").await.ok()?;
        let ready = p
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "Ready")?
            .clone();
        (ready.status == "False").then_some(p)
    })
    .await;
    let conds = p.status.and_then(|s| s.conditions).unwrap_or_default();
    let ready = conds.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_ne!(
        ready.last_transition_time.as_ref().map(|t| t.0.to_string()),
        Some("2026-01-01T00:00:00Z".to_string())
    );
    // Only Ready, as upstream: ContainersReady is the kubelet's to say.
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "ContainersReady" && c.status == "True")
    );
    // Not evicted: the default 300 s tolerations still run.
    assert!(p.metadata.deletion_timestamp.is_none());
    eventually("the silent node's endpoint not ready", || async {
        let e = ready_endpoints().await?;
        (e == vec![
            ("10.0.0.1".to_string(), false),
            ("10.0.0.2".to_string(), true),
        ])
        .then_some(())
    })
    .await;
    let alive = pods.get("on-alive").await.expect("on-alive");
    assert!(
        alive
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let evs = eventually("NodeNotReady event on the pod", || async {
        let evs = events
            .list(&ListParams::default().fields("involvedObject.name=on-silent"))
            .await
            .ok()?;
        evs.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("NodeNotReady"))
    })
    .await;
    assert_eq!(evs.type_.as_deref(), Some("Warning"));
    assert_eq!(evs.message.as_deref(), Some("Node is not ready"));
    keep.abort();
}

/// A toleration's tolerationSeconds counts from when the taint manager first sees the pod
/// on the tainted node, as upstream's timed workers, not from the taint's timeAdded: a pod
/// bound to a node tainted long ago still gets its full toleration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toleration_seconds_count_from_when_the_pod_is_seen() {
    let c = common::start_with_controllers(ControllersConfig {
        node_monitor_period: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let client = c.client().await;
    make_node(&client, "tainted").await;
    let keep = {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                renew(&client, "tainted").await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "tainted",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"taints": [{"key": "example.com/maintenance",
                "effect": "NoExecute", "timeAdded": "2020-01-01T00:00:00Z"}]}}),
            ),
        )
        .await
        .expect("taint");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let tol = |secs: i64| json!([{"key": "example.com/maintenance", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": secs}]);
    pods.create(
        &PostParams::default(),
        &pod_on("untolerated", "tainted", json!([])),
    )
    .await
    .expect("pod");
    pods.create(
        &PostParams::default(),
        &pod_on("patient", "tainted", tol(6)),
    )
    .await
    .expect("pod");
    // The pod that does not tolerate the taint goes at once …
    eventually("untolerated evicted", || async {
        let p = pods.get("untolerated").await.ok()?;
        p.metadata.deletion_timestamp.is_some().then_some(())
    })
    .await;
    // … the one tolerating 6 s is still there (the taint's timeAdded is six years old) …
    let p = pods.get("patient").await.expect("patient");
    assert!(
        p.metadata.deletion_timestamp.is_none(),
        "evicted at once: tolerationSeconds counted from timeAdded"
    );
    // … and goes once its own 6 s have passed.
    eventually("patient evicted", || async {
        let p = pods.get("patient").await.ok()?;
        p.metadata.deletion_timestamp.is_some().then_some(())
    })
    .await;
    keep.abort();
}
