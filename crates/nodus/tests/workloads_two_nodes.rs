//! Workloads on two real nodes, end to end: `nodus control-plane` in one network namespace
//! and two `nodus node` processes side by side, each in a namespace of its own linked to the
//! control plane's, driven by the real kubectl. A DaemonSet runs one Running pod on each
//! node; a Deployment's pods are spread over both. Then one node's process is killed by its
//! PID: with the control plane's node-monitor grace period and eviction rate shortened by
//! its own flags (and the pods tolerating the unreachable taint for 2 s, as a user would
//! set), the node goes Unknown and is tainted, its Deployment pods are evicted, and the
//! ReplicaSet's replacements are Running on the surviving node. The DaemonSet's pod there
//! tolerates the taint for good and stays.

mod common;

use common::cluster::{self, ControlPlane, NodeProcess};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(120);
/// The control plane's end of each node's link, and the node's own address there.
const LINKS: [(&str, &str, &str); 2] = [
    ("peer-a", "10.252.1.1", "10.252.1.2"),
    ("peer-b", "10.252.2.1", "10.252.2.2"),
];

const DAEMONSET: &str = "apiVersion: apps/v1
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
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: docker.io/library/busybox:latest
        imagePullPolicy: IfNotPresent
        command: [sleep, '3600']
";

/// Four replicas, at most one apart per node while both are usable (a tainted node is no
/// domain, so after the death all go to the survivor), evicted 2 s after their node becomes
/// unreachable.
const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 4
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: DoNotSchedule
        nodeTaintsPolicy: Honor
        labelSelector:
          matchLabels: {app: web}
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
      containers:
      - name: main
        image: docker.io/library/busybox:latest
        imagePullPolicy: IfNotPresent
        command: [sleep, '3600']
";

fn items(list: &Value) -> Vec<Value> {
    list["items"].as_array().cloned().unwrap_or_default()
}

fn running_on(list: &Value, node: &str) -> Vec<String> {
    items(list)
        .iter()
        .filter(|p| {
            p["spec"]["nodeName"] == node
                && p["status"]["phase"] == "Running"
                && p["metadata"]["deletionTimestamp"].is_null()
        })
        .map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn a_dead_nodes_replica_set_pods_come_back_on_the_surviving_node() {
    if !common::have_root() {
        return;
    }
    // Declared in this order so that on a panic the nodes (and their containers) go first,
    // then the control plane, the cgroup parents and last the namespaces.
    let cp_ns = Arc::new(testkit::Netns::new("nodus-2n-cp").expect("netns"));
    let node_ns: Vec<Arc<testkit::Netns>> = ["nodus-2n-a", "nodus-2n-b"]
        .iter()
        .map(|n| Arc::new(testkit::Netns::new(n).expect("netns")))
        .collect();
    for ((cp_if, cp_ip, node_ip), ns) in LINKS.iter().zip(&node_ns) {
        cluster::link_namespaces_via(&cp_ns, cp_if, cp_ip, ns, node_ip);
    }
    let cgroups: Vec<testkit::CgroupParent> = ["nodus-2n-a", "nodus-2n-b"]
        .iter()
        .map(|n| {
            let c = testkit::CgroupParent::new(n);
            c.create();
            c
        })
        .collect();
    let cp = ControlPlane::start_bound(
        cp_ns.clone(),
        LINKS[0].1.parse().expect("ip"),
        // Above the kubelet's 10 s Lease renewal (a quarter of its 40 s duration), so a
        // live node never looks stale between two renewals.
        &[
            "--node-monitor-grace-period",
            "20s",
            "--node-monitor-period",
            "500ms",
            "--node-eviction-rate",
            "100",
        ],
    );
    let nodes: Vec<NodeProcess> = ["node-a", "node-b"]
        .iter()
        .zip(&node_ns)
        .zip(&cgroups)
        .zip(["10.99.71.0/24", "10.99.72.0/24"])
        .map(|(((name, ns), cg), subnet)| NodeProcess::start(ns, &cp, name, subnet, &cg.path()))
        .collect();
    let logs = || {
        format!(
            "node-a log:\n{}\nnode-b log:\n{}",
            nodes[0].log(),
            nodes[1].log()
        )
    };
    for (name, (_, _, node_ip)) in ["node-a", "node-b"].iter().zip(LINKS) {
        let node = cp.wait_json(&["node", name], T, &format!("{name} Ready"), &logs, |n| {
            cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True")
        });
        assert!(
            node["status"]["addresses"]
                .as_array()
                .is_some_and(|a| a.iter().any(|a| a["address"] == node_ip)),
            "{node}"
        );
    }

    // One DaemonSet pod Running on each node.
    cp.apply(DAEMONSET);
    let agents = cp.wait_json(
        &["pods", "-l", "app=agent"],
        T,
        "an agent Running on each node",
        &logs,
        |l| {
            ["node-a", "node-b"]
                .iter()
                .all(|n| running_on(l, n).len() == 1)
        },
    );
    assert_eq!(items(&agents).len(), 2, "{agents}");
    let ds = cp.wait_json(&["ds", "agent"], T, "agent ready on both", &logs, |d| {
        d["status"]["numberReady"] == 2
    });
    assert_eq!(ds["status"]["desiredNumberScheduled"], 2, "{ds}");
    let agent_a = running_on(&agents, "node-a").remove(0);

    // The Deployment's pods, two on each node.
    cp.apply(DEPLOYMENT);
    let web = cp.wait_json(
        &["pods", "-l", "app=web"],
        T,
        "web Running two per node",
        &logs,
        |l| {
            ["node-a", "node-b"]
                .iter()
                .all(|n| running_on(l, n).len() == 2)
        },
    );
    let on_a = running_on(&web, "node-a");
    let on_b = running_on(&web, "node-b");
    cp.wait_json(&["deploy", "web"], T, "web available", &logs, |d| {
        d["status"]["availableReplicas"] == 4
    });

    // node-a's process dies.
    nodes[0].kill();
    let n = cp.wait_json(&["node", "node-a"], T, "node-a Ready=Unknown", &logs, |n| {
        cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "Unknown")
    });
    assert_eq!(
        cluster::condition(&n, "Ready").expect("Ready")["message"],
        "Kubelet stopped posting node status."
    );
    let n = cp.wait_json(&["node", "node-a"], T, "node-a tainted", &logs, |n| {
        n["spec"]["taints"].as_array().is_some_and(|ts| {
            ["NoSchedule", "NoExecute"].iter().all(|e| {
                ts.iter()
                    .any(|t| t["key"] == "node.kubernetes.io/unreachable" && t["effect"] == *e)
            })
        })
    });
    let b = cp.get_json(&["node", "node-b"]).expect("node-b");
    assert!(
        cluster::condition(&b, "Ready").is_some_and(|c| c["status"] == "True"),
        "{b}"
    );
    assert!(b["spec"]["taints"].is_null(), "{b} ({n})");

    // node-a's web pods are evicted; the ReplicaSet's replacements run on node-b.
    for name in &on_a {
        let p = cp.wait_json(&["pod", name], T, &format!("{name} evicted"), &logs, |p| {
            p["metadata"]["deletionTimestamp"].is_string()
        });
        assert!(
            cluster::condition(&p, "DisruptionTarget")
                .is_some_and(|c| c["reason"] == "DeletionByTaintManager"),
            "{p}"
        );
    }
    let web = cp.wait_json(
        &["pods", "-l", "app=web"],
        T,
        "four web pods Running on node-b",
        &logs,
        |l| running_on(l, "node-b").len() == 4,
    );
    let now_b = running_on(&web, "node-b");
    for name in &on_b {
        assert!(now_b.contains(name), "{name} stayed on node-b: {now_b:?}");
    }
    let replacements: Vec<&String> = now_b.iter().filter(|n| !on_b.contains(n)).collect();
    assert_eq!(replacements.len(), 2, "{now_b:?} (before: {on_b:?})");
    for name in replacements {
        assert!(!on_a.contains(name), "{name}");
        let p = cp.get_json(&["pod", name]).expect("replacement");
        let owner = &p["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "ReplicaSet", "{p}");
        assert!(
            owner["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("web-")),
            "{p}"
        );
    }
    let d = cp.wait_json(&["deploy", "web"], T, "web available again", &logs, |d| {
        d["status"]["availableReplicas"] == 4 && d["status"]["readyReplicas"] == 4
    });
    assert_eq!(d["status"]["replicas"], 4, "{d}");
    let (ok, table, err) = cp.kubectl(&["get", "deploy", "web"]);
    assert!(ok && table.contains("4/4"), "{table}{err}");

    // The DaemonSet's pod on node-a tolerates the unreachable taint without a limit: kept.
    let agent = cp.get_json(&["pod", &agent_a]).expect("agent on node-a");
    assert!(agent["metadata"]["deletionTimestamp"].is_null(), "{agent}");
    assert_eq!(agent["spec"]["nodeName"], "node-a", "{agent}");

    drop(nodes);
    drop(cp);
    drop(cgroups);
}
