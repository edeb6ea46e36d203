//! PodDisruptionBudgets against the real API server and the real kubectl: the disruption
//! controller's status (expectedPods, desiredHealthy, currentHealthy, disruptionsAllowed,
//! observedGeneration, the DisruptionAllowed condition), evictions that spend it, and
//! `kubectl drain` blocked by a budget ("Cannot evict pod as it would violate the pod's
//! disruption budget.", retried) until the budget allows it. Pods are bound to a fake node
//! and their Ready status set by the test; a stand-in for the kubelet finishes the
//! deletion of pods marked for deletion, as a kubelet's status manager does.

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use nodus_control_plane::controllers::ControllersConfig;
use serde_json::{Value, json};

use common::eventually;

/// A Running, Ready pod labelled `app` on the node, controlled by `owner` when given.
async fn ready_pod(pods: &Api<Pod>, name: &str, app: &str, owner: Option<Value>) {
    let mut p = json!({"metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}});
    if let Some(o) = owner {
        p["metadata"]["ownerReferences"] = json!([o]);
    }
    let p: Pod = serde_json::from_value(p).expect("pod");
    pods.create(&PostParams::default(), &p)
        .await
        .expect("create pod");
    set_ready(pods, name, true).await;
}

async fn set_ready(pods: &Api<Pod>, name: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": status}]}})),
    )
    .await
    .expect("pod status");
}

/// The PDB's status, once `pred` holds for it.
async fn pdb_status(c: &common::Cluster, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    eventually(what, || async {
        let out = c.kubectl(&["get", "pdb", "web", "-o", "json"]).await;
        let v: Value = serde_json::from_str(&out.stdout).ok()?;
        pred(&v["status"]).then(|| v["status"].clone())
    })
    .await
}

fn allowed_condition(status: &Value) -> (String, String) {
    let c = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionAllowed"))
        .cloned()
        .unwrap_or_default();
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["reason"].as_str().unwrap_or_default().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_respects_disruption_budgets() {
    // No heartbeats in this test: keep the node from going Unknown meanwhile.
    let c = common::start_with_controllers(ControllersConfig {
        node_monitor_grace_period: Duration::from_secs(3600),
        node_startup_grace_period: Duration::from_secs(3600),
        // The test plays the ReplicaSet controller: its pods are made by hand.
        disabled: vec!["replicaset".into()],
        ..Default::default()
    })
    .await;
    let client = c.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
        "status": {"allocatable": {"cpu": "2", "memory": "2Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}))
    .expect("node");
    nodes
        .create(&PostParams::default(), &n)
        .await
        .expect("node");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // The kubelet's part: a pod marked for deletion is removed once "stopped".
    let kubelet = {
        let pods = pods.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(list) = pods.list(&Default::default()).await {
                    for p in list
                        .items
                        .iter()
                        .filter(|p| p.metadata.deletion_timestamp.is_some())
                    {
                        let dp = DeleteParams {
                            grace_period_seconds: Some(0),
                            preconditions: Some(Preconditions {
                                uid: p.metadata.uid.clone(),
                                resource_version: None,
                            }),
                            ..Default::default()
                        };
                        let _ = pods
                            .delete(p.metadata.name.as_deref().unwrap_or(""), &dp)
                            .await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };

    c.apply(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: web\n  namespace: default\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - {name: c, image: busybox}\n",
    )
    .await
    .ok();
    let rs = c
        .kubectl(&["get", "rs", "web", "-o", "jsonpath={.metadata.uid}"])
        .await;
    let uid = rs.ok().to_string();
    let owner = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": uid, "controller": true, "blockOwnerDeletion": true});
    ready_pod(&pods, "web-1", "web", Some(owner.clone())).await;
    ready_pod(&pods, "web-2", "web", Some(owner)).await;
    ready_pod(&pods, "bare", "bare", None).await;
    c.apply(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\n  namespace: default\nspec:\n  minAvailable: 2\n  selector:\n    matchLabels: {app: web}\n",
    )
    .await
    .ok();
    let st = pdb_status(&c, "PDB status computed", |s| {
        s["observedGeneration"] == 1 && s["currentHealthy"] == 2
    })
    .await;
    assert_eq!(st["expectedPods"], 2, "{st}");
    assert_eq!(st["desiredHealthy"], 2, "{st}");
    assert_eq!(st["disruptionsAllowed"], 0, "{st}");
    assert_eq!(
        allowed_condition(&st),
        ("False".into(), "InsufficientPods".into())
    );

    // A pod without a controller needs --force, as kubectl says.
    let out = c.kubectl(&["drain", "n1", "--timeout=20s"]).await;
    assert!(
        out.fails().contains(
            "cannot delete Pods that declare no controller (use --force to override): default/bare"
        ),
        "{}",
        out.stderr
    );
    // With --force the bare pod goes; the budget holds the others, and kubectl retries.
    let out = c
        .kubectl(&["drain", "n1", "--force", "--timeout=12s"])
        .await;
    let err = out.fails();
    assert!(
        err.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{err}"
    );
    assert!(err.contains("will retry after 5s"), "{err}");
    eventually("bare pod gone", || async {
        pods.get_opt("bare").await.ok()?.is_none().then_some(())
    })
    .await;
    for name in ["web-1", "web-2"] {
        let p = pods.get(name).await.expect(name);
        assert!(
            p.metadata.deletion_timestamp.is_none(),
            "{name} evicted against the budget"
        );
    }
    // The node was cordoned by the first drain.
    let node = nodes.get("n1").await.expect("n1");
    assert_eq!(node.spec.and_then(|s| s.unschedulable), Some(true));

    // One disruption allowed: exactly one pod is evicted, the other is held.
    c.kubectl_stdin(
        &[
            "patch",
            "pdb",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"minAvailable":1}}"#,
        ],
        None,
    )
    .await
    .ok();
    let st = pdb_status(&c, "budget lowered", |s| s["observedGeneration"] == 2).await;
    assert_eq!(st["disruptionsAllowed"], 1, "{st}");
    assert_eq!(
        allowed_condition(&st),
        ("True".into(), "SufficientPods".into())
    );
    let out = c
        .kubectl(&["drain", "n1", "--force", "--timeout=12s"])
        .await;
    assert!(
        out.fails()
            .contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{}",
        out.stderr
    );
    let left = eventually("one web pod evicted and gone", || async {
        let l = pods.list(&Default::default()).await.ok()?;
        let names: Vec<String> = l
            .items
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        (names.len() == 1).then_some(names)
    })
    .await;
    let st = pdb_status(&c, "the evicted pod no longer counted", |s| {
        s["currentHealthy"] == 1 && s.get("disruptedPods").is_none()
    })
    .await;
    assert_eq!(st["disruptionsAllowed"], 0, "{st}");
    assert_eq!(st["expectedPods"], 1, "{st}");

    // The budget no longer asks for any: the drain completes.
    c.kubectl_stdin(
        &[
            "patch",
            "pdb",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"minAvailable":0}}"#,
        ],
        None,
    )
    .await
    .ok();
    pdb_status(&c, "budget allows it", |s| {
        s["observedGeneration"] == 3 && s["disruptionsAllowed"] == 1
    })
    .await;
    let out = c
        .kubectl(&["drain", "n1", "--force", "--timeout=60s"])
        .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains(&format!("pod/{} evicted", left[0])),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("node/n1 drained"), "{}", out.stdout);
    kubelet.abort();
}

/// The eviction subresource with a budget: refused with upstream's 429 and cause, a
/// not-Ready pod goes under IfHealthyBudget only while the budget is met, and always under
/// AlwaysAllow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_follow_the_unhealthy_pod_eviction_policy() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    c.apply(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\n  namespace: default\nspec:\n  minAvailable: 2\n  selector:\n    matchLabels: {app: web}\n",
    )
    .await
    .ok();
    for name in ["a", "b", "sick"] {
        ready_pod(&pods, name, "web", None).await;
    }
    set_ready(&pods, "sick", false).await;
    let st = pdb_status(&c, "two healthy of three", |s| {
        s["currentHealthy"] == 2 && s["expectedPods"] == 3
    })
    .await;
    assert_eq!(st["disruptionsAllowed"], 0, "{st}");
    let evict = |name: &str| {
        let pods = pods.clone();
        let name = name.to_string();
        async move { pods.evict(&name, &Default::default()).await }
    };
    // A healthy pod would break the budget.
    match evict("a").await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 429);
            assert_eq!(
                s.message,
                "Cannot evict pod as it would violate the pod's disruption budget."
            );
        }
        other => panic!("eviction of a healthy pod: {other:?}"),
    }
    let raw = c
        .kubectl(&["get", "--raw", "/api/v1/namespaces/default/pods/a"])
        .await;
    assert!(raw.ok().contains("\"name\":\"a\""));
    // The budget is met (2 healthy, 2 desired): the unhealthy pod may go.
    evict("sick")
        .await
        .expect("evict the unhealthy pod under IfHealthyBudget");
    let p = pods.get_opt("sick").await.expect("get");
    assert!(p.is_none_or(|p| p.metadata.deletion_timestamp.is_some()));
    // Now one healthy pod more is asked for than there are: IfHealthyBudget holds an
    // unhealthy pod, AlwaysAllow lets it go.
    c.kubectl_stdin(
        &[
            "patch",
            "pdb",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"minAvailable":3}}"#,
        ],
        None,
    )
    .await
    .ok();
    ready_pod(&pods, "sick2", "web", None).await;
    set_ready(&pods, "sick2", false).await;
    pdb_status(&c, "budget not met", |s| {
        s["observedGeneration"] == 2 && s["desiredHealthy"] == 3 && s["currentHealthy"] == 2
    })
    .await;
    match evict("sick2").await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429),
        other => panic!("IfHealthyBudget let an unhealthy pod go from an unmet budget: {other:?}"),
    }
    c.kubectl_stdin(
        &[
            "patch",
            "pdb",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"unhealthyPodEvictionPolicy":"AlwaysAllow"}}"#,
        ],
        None,
    )
    .await
    .ok();
    pdb_status(&c, "policy seen", |s| s["observedGeneration"] == 3).await;
    evict("sick2")
        .await
        .expect("AlwaysAllow evicts an unhealthy pod");
    // The healthy ones are still held.
    assert!(evict("b").await.is_err());
}
