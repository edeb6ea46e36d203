//! The DaemonSet controller against the real API server, with fake Nodes made through the
//! API (the test plays the kubelet: it marks pods Ready, fails them, and finishes graceful
//! deletions): one pod per eligible node bound there by the scheduler, a node added later
//! gets its pod, a tainted node none, a failed pod is replaced, an image change rolls out
//! with ControllerRevisions that the real kubectl's `rollout history|undo|status` read.

mod common;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

async fn eventually<F, Fut, T>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    common::eventually_n(what, 600, f).await
}

async fn make_node(
    client: &kube::Client,
    name: &str,
    labels: serde_json::Value,
    taints: serde_json::Value,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
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

/// Keeps the fake nodes' Leases fresh, so the node-lifecycle controller leaves them Ready.
async fn renew_leases(client: &kube::Client) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(client.clone());
    for n in nodes
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items
    {
        let name = n.metadata.name.unwrap_or_default();
        let l: Lease = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
        }))
        .expect("lease");
        if leases.create(&PostParams::default(), &l).await.is_err() {
            let _ = leases
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"renewTime": now_micro()}})),
                )
                .await;
        }
    }
}

/// The DaemonSet's live pods by node (pods being deleted left out).
async fn pods_by_node(pods: &Api<Pod>) -> BTreeMap<String, Vec<Pod>> {
    let mut out: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for p in pods
        .list(&ListParams::default().labels("app=agent"))
        .await
        .expect("list pods")
        .items
    {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        out.entry(node).or_default().push(p);
    }
    out
}

/// What a kubelet would do: renew its Lease, pods bound to it become Ready, terminating
/// ones go away.
async fn play_kubelet(pods: &Api<Pod>) {
    renew_leases(&pods.clone().into_client()).await;
    for p in pods
        .list(&ListParams::default().labels("app=agent"))
        .await
        .expect("list pods")
        .items
    {
        let name = p.metadata.name.clone().unwrap_or_default();
        let bound = p.spec.as_ref().and_then(|s| s.node_name.clone()).is_some();
        if p.metadata.deletion_timestamp.is_some() {
            let _ = pods
                .delete(
                    &name,
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    },
                )
                .await;
            continue;
        }
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if bound && phase == "Pending" {
            let _ = pods
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
                )
                .await;
        }
    }
}

fn image_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .map(|s| s.containers[0].image.clone().unwrap_or_default())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemonset_runs_one_pod_per_eligible_node_and_rolls_out() {
    let c = common::start().await;
    let client = c.client().await;
    make_node(&client, "n1", json!({"role": "edge"}), json!([])).await;
    make_node(&client, "n2", json!({"role": "edge"}), json!([])).await;
    make_node(
        &client,
        "tainted",
        json!({"role": "edge"}),
        json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
    )
    .await;
    make_node(&client, "core", json!({"role": "core"}), json!([])).await;
    renew_leases(&client).await;

    c.apply(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
  namespace: default
spec:
  selector:
    matchLabels: {app: agent}
  template:
    metadata:
      labels: {app: agent}
    spec:
      nodeSelector: {role: edge}
      containers:
      - name: c
        image: busybox:1
"#,
    )
    .await
    .ok();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), "default");
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), "default");

    // One pod on each eligible node, bound there by the scheduler; none on the tainted
    // node or the one the selector leaves out.
    let placed = eventually("a pod bound on n1 and n2", || async {
        let m = pods_by_node(&pods).await;
        (m.keys().cloned().collect::<Vec<_>>() == ["n1", "n2"] && m.values().all(|v| v.len() == 1))
            .then_some(m)
    })
    .await;
    let ds = dss.get("agent").await.expect("ds");
    assert_eq!(
        ds.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("deprecated.daemonset.template.generation"))
            .map(String::as_str),
        Some("1")
    );
    let revs = revisions
        .list(&ListParams::default())
        .await
        .expect("revisions")
        .items;
    assert_eq!(revs.len(), 1, "{revs:?}");
    let rev1 = &revs[0];
    assert_eq!(rev1.revision, 1);
    let hash1 = rev1
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("controller-revision-hash"))
        .cloned()
        .expect("hash label");
    assert_eq!(
        rev1.metadata.name.as_deref(),
        Some(format!("agent-{hash1}").as_str())
    );
    let owner = &rev1.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("DaemonSet", "agent", Some(true))
    );
    for p in placed.values().flatten() {
        let name = p.metadata.name.clone().unwrap_or_default();
        assert!(
            name.starts_with("agent-") && name.len() == "agent-".len() + 5,
            "{name}"
        );
        let l = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(l.get("controller-revision-hash"), Some(&hash1));
        assert_eq!(
            l.get("pod-template-generation").map(String::as_str),
            Some("1")
        );
        let spec = p.spec.as_ref().expect("spec");
        let tols: Vec<String> = spec
            .tolerations
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|t| {
                format!(
                    "{}:{}",
                    t.key.clone().unwrap_or_default(),
                    t.effect.clone().unwrap_or_default()
                )
            })
            .collect();
        for want in [
            "node.kubernetes.io/not-ready:NoExecute",
            "node.kubernetes.io/unreachable:NoExecute",
            "node.kubernetes.io/disk-pressure:NoSchedule",
            "node.kubernetes.io/memory-pressure:NoSchedule",
            "node.kubernetes.io/pid-pressure:NoSchedule",
            "node.kubernetes.io/unschedulable:NoSchedule",
        ] {
            assert!(tols.contains(&want.to_string()), "{want} in {tols:?}");
        }
        let term = serde_json::to_value(spec.affinity.as_ref().expect("affinity")).expect("json");
        assert_eq!(
            term["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                [0]["matchFields"][0]["key"],
            "metadata.name"
        );
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    eventually("SuccessfulCreate events", || async {
        let evs = events.list(&ListParams::default()).await.ok()?.items;
        let created: Vec<_> = evs
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("SuccessfulCreate")
                    && e.involved_object.name.as_deref() == Some("agent")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.starts_with("Created pod: agent-"))
            })
            .collect();
        (created.len() == 2).then_some(())
    })
    .await;

    // A node added later gets its pod; the status counts it.
    make_node(&client, "n3", json!({"role": "edge"}), json!([])).await;
    eventually(
        "a pod on n3 and the status counting three ready nodes",
        || async {
            play_kubelet(&pods).await;
            let m = pods_by_node(&pods).await;
            let s = dss.get("agent").await.ok()?.status?;
            (m.keys().cloned().collect::<Vec<_>>() == ["n1", "n2", "n3"]
                && s.desired_number_scheduled == 3
                && s.current_number_scheduled == 3
                && s.number_ready == 3
                && s.number_available == Some(3)
                && s.updated_number_scheduled == Some(3)
                && s.number_misscheduled == 0
                && s.observed_generation == Some(1))
            .then_some(())
        },
    )
    .await;
    let get = c.kubectl(&["get", "ds", "agent", "--no-headers"]).await;
    let cols: Vec<&str> = get.ok().split_whitespace().collect();
    assert_eq!(&cols[..6], ["agent", "3", "3", "3", "3", "3"], "{cols:?}");

    // A failed pod is deleted (FailedDaemonPod) and replaced.
    let failed = pods_by_node(&pods).await["n1"][0]
        .metadata
        .name
        .clone()
        .expect("name");
    pods.patch_status(
        &failed,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Failed"}})),
    )
    .await
    .expect("fail pod");
    eventually("the failed pod replaced", || async {
        play_kubelet(&pods).await;
        let m = pods_by_node(&pods).await;
        let on = m.get("n1")?;
        (on.len() == 1 && on[0].metadata.name.as_deref() != Some(failed.as_str())).then_some(())
    })
    .await;
    let msg = format!("Found failed daemon pod default/{failed} on node n1, will try to kill it");
    eventually("a FailedDaemonPod event", || async {
        let evs = events.list(&ListParams::default()).await.ok()?.items;
        evs.iter()
            .any(|e| {
                e.reason.as_deref() == Some("FailedDaemonPod")
                    && e.message.as_deref() == Some(msg.as_str())
                    && e.type_.as_deref() == Some("Warning")
            })
            .then_some(())
    })
    .await;

    // An image change rolls out node by node; kubectl rollout status waits for it.
    c.kubectl(&["set", "image", "ds/agent", "c=busybox:2"])
        .await
        .ok();
    let status = {
        let kubeconfig = c.kubeconfig().to_path_buf();
        tokio::spawn(async move {
            common::kubectl_with(
                &kubeconfig,
                &["rollout", "status", "ds/agent", "--timeout=120s"],
                None,
            )
            .await
        })
    };
    eventually("every pod running busybox:2", || async {
        play_kubelet(&pods).await;
        let m = pods_by_node(&pods).await;
        let s = dss.get("agent").await.ok()?.status?;
        (m.len() == 3
            && m.values()
                .all(|v| v.len() == 1 && image_of(&v[0]) == "busybox:2")
            && s.updated_number_scheduled == Some(3)
            && s.number_available == Some(3)
            && s.observed_generation == Some(2))
        .then_some(())
    })
    .await;
    let out = status.await.expect("rollout status task");
    assert!(
        out.ok()
            .contains("daemon set \"agent\" successfully rolled out"),
        "{}",
        out.stdout
    );
    let ds = dss.get("agent").await.expect("ds");
    assert_eq!(
        ds.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("deprecated.daemonset.template.generation"))
            .map(String::as_str),
        Some("2")
    );
    for p in pods_by_node(&pods).await.values().flatten() {
        assert_eq!(
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("pod-template-generation"))
                .map(String::as_str),
            Some("2")
        );
    }

    // History: two revisions; undo goes back to busybox:1 and renumbers revision 1 as 3.
    let hist = c.kubectl(&["rollout", "history", "ds/agent"]).await;
    let hist = hist.ok();
    assert!(
        hist.contains("REVISION")
            && hist.lines().any(|l| l.trim_start().starts_with('1'))
            && hist.lines().any(|l| l.trim_start().starts_with('2')),
        "{hist}"
    );
    let one = c
        .kubectl(&["rollout", "history", "ds/agent", "--revision=1"])
        .await;
    assert!(one.ok().contains("busybox:1"), "{}", one.stdout);
    let get = c
        .kubectl(&["get", "controllerrevisions", "--no-headers"])
        .await;
    assert_eq!(get.ok().lines().count(), 2, "{}", get.stdout);
    assert!(
        get.stdout.contains("daemonset.apps/agent"),
        "{}",
        get.stdout
    );
    c.kubectl(&["rollout", "undo", "ds/agent"]).await.ok();
    eventually("the undo rolled out", || async {
        play_kubelet(&pods).await;
        let m = pods_by_node(&pods).await;
        (m.len() == 3
            && m.values()
                .all(|v| v.len() == 1 && image_of(&v[0]) == "busybox:1"))
        .then_some(())
    })
    .await;
    let revs = revisions
        .list(&ListParams::default())
        .await
        .expect("revisions")
        .items;
    let mut numbers: Vec<(i64, String)> = revs
        .iter()
        .map(|r| (r.revision, r.metadata.name.clone().unwrap_or_default()))
        .collect();
    numbers.sort();
    assert_eq!(
        numbers.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        [2, 3],
        "{numbers:?}"
    );
    assert_eq!(numbers[1].1, format!("agent-{hash1}"));

    // A node that stops fitting loses its pod.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "n3",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"role": "core"}}})),
        )
        .await
        .expect("relabel");
    eventually("n3's pod deleted", || async {
        play_kubelet(&pods).await;
        let m = pods_by_node(&pods).await;
        let s = dss.get("agent").await.ok()?.status?;
        (m.keys().cloned().collect::<Vec<_>>() == ["n1", "n2"] && s.desired_number_scheduled == 2)
            .then_some(())
    })
    .await;
}
