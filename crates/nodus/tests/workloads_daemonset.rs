//! A DaemonSet end to end, with the real kubectl: `nodus control-plane` and a real
//! `nodus node` in one private network namespace. The node gets a Running daemon pod, a
//! tainted node (a Node object without a kubelet) gets none, an image change rolls out
//! (`kubectl rollout status`), and a second real node, started after the first one and its
//! Node object are gone (two kubelets cannot share the namespace's ports), gets its own
//! Running pod.

mod common;

use common::cluster::{self, ControlPlane, NodeProcess};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(120);

const DS: &str = r#"apiVersion: apps/v1
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
        command: ["sleep", "3600"]
"#;

/// The DaemonSet's pods not being deleted: (name, node, phase, image).
fn agent_pods(cp: &ControlPlane) -> Vec<(String, String, String, String)> {
    cp.get_json(&["pods", "-l", "app=agent"])
        .and_then(|v| v["items"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&p["metadata"]["name"]),
                s(&p["spec"]["nodeName"]),
                s(&p["status"]["phase"]),
                s(&p["spec"]["containers"][0]["image"]),
            )
        })
        .collect()
}

fn wait_pods(
    cp: &ControlPlane,
    what: &str,
    logs: &dyn Fn() -> String,
    pred: impl Fn(&[(String, String, String, String)]) -> bool,
) -> Vec<(String, String, String, String)> {
    let deadline = std::time::Instant::now() + T;
    loop {
        let pods = agent_pods(cp);
        if pred(&pods) {
            return pods;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "{what}: not within {T:?}\nlast: {pods:?}\n{}\ncontrol plane log:\n{}",
                logs(),
                cp.log()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn a_daemonset_runs_on_every_node_but_the_tainted_one_and_rolls_out() {
    if !common::have_root() {
        return;
    }
    let netns = Arc::new(testkit::Netns::new("nodus-ds").expect("netns"));
    let cgroup = testkit::CgroupParent::new("nodus-ds");
    cgroup.create();
    cluster::add_node_address(&netns);
    let cp = ControlPlane::start(netns.clone());
    cp.apply(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: tainted\nspec:\n  taints:\n  - {key: dedicated, value: db, effect: NoSchedule}\nstatus:\n  allocatable: {cpu: '1', memory: 1Gi, pods: '10'}\n  conditions:\n  - {type: Ready, status: 'True', reason: KubeletReady, message: kubelet is posting ready status}\n",
    );
    let node = NodeProcess::start(&netns, &cp, "node-a", "10.99.66.0/24", &cgroup.path());
    let logs = || node.log();
    let ready = |n: &Value| cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True");
    cp.wait_json(&["node", "node-a"], T, "node-a Ready", &logs, ready);

    cp.apply(DS);
    let pods = wait_pods(&cp, "a Running pod on node-a", &logs, |p| {
        p.len() == 1 && p[0].1 == "node-a" && p[0].2 == "Running"
    });
    let first = pods[0].0.clone();
    let ds = cp.wait_json(&["ds", "agent"], T, "status counts node-a", &logs, |d| {
        d["status"]["desiredNumberScheduled"] == 1
            && d["status"]["numberReady"] == 1
            && d["status"]["numberAvailable"] == 1
    });
    // The tainted node is not counted, and has no pod.
    assert_eq!(ds["status"]["currentNumberScheduled"], 1, "{ds}");
    assert!(agent_pods(&cp).iter().all(|p| p.1 != "tainted"));
    let ev = cluster::events_for(&cp, "default", "agent");
    assert!(
        ev.iter()
            .any(|(r, m)| r == "SuccessfulCreate" && *m == format!("Created pod: {first}")),
        "{ev:?}"
    );

    // An image change (the same image under its short name) rolls out.
    let (ok, out, err) = cp.kubectl(&["set", "image", "ds/agent", "main=busybox:latest"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cp.kubectl(&["rollout", "status", "ds/agent", "--timeout=120s"]);
    assert!(ok, "rollout status: {out}{err}\n{}", node.log());
    assert!(
        out.contains("daemon set \"agent\" successfully rolled out"),
        "{out}"
    );
    let pods = wait_pods(&cp, "the new pod Running", &logs, |p| {
        p.len() == 1 && p[0].3 == "busybox:latest" && p[0].2 == "Running"
    });
    assert_ne!(pods[0].0, first);
    let (ok, out, err) = cp.kubectl(&["rollout", "history", "ds/agent"]);
    assert!(
        ok && out
            .lines()
            .filter(|l| l.trim_start().starts_with(['1', '2']))
            .count()
            == 2,
        "{out}{err}"
    );

    // The first node goes away; a second one started later gets its own pod.
    drop(node);
    // Its Node object goes too (otherwise it would turn unreachable and still count).
    let (ok, out, err) = cp.kubectl(&["delete", "node", "node-a"]);
    assert!(ok, "{out}{err}");
    let node_b = NodeProcess::start(&netns, &cp, "node-b", "10.99.66.0/24", &cgroup.path());
    let logs_b = || node_b.log();
    cp.wait_json(&["node", "node-b"], T, "node-b Ready", &logs_b, ready);
    wait_pods(&cp, "a Running pod on node-b", &logs_b, |p| {
        p.iter()
            .any(|(_, n, phase, _)| n == "node-b" && phase == "Running")
    });
    let ds = cp.wait_json(&["ds", "agent"], T, "status counts node-b", &logs_b, |d| {
        d["status"]["desiredNumberScheduled"] == 1
            && d["status"]["currentNumberScheduled"] == 1
            && d["status"]["numberReady"] == 1
    });
    assert_eq!(ds["status"]["numberMisscheduled"], 0, "{ds}");
    let (ok, out, _) = cp.kubectl(&["delete", "ds", "agent", "--wait=false"]);
    assert!(ok, "{out}");
    drop(node_b);
    drop(cp);
    drop(cgroup);
}
