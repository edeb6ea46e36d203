//! Node death, end to end (the lesson's flow): a real `nodus node` joined to `nodus
//! control-plane` stops; the node-lifecycle controller marks it Unknown and taints it
//! unreachable, and its pods are evicted after their tolerationSeconds while pods with the
//! default 300 s stay. Grace periods are shortened with the control plane's own flags. A
//! second node, whose Lease the test renews, keeps the zone from counting as fully down
//! (where upstream, and nodus, stop evicting).

mod common;

use common::cluster::{self, ControlPlane, NodeProcess};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

fn pod(name: &str, toleration_seconds: Option<i64>) -> String {
    let tol = match toleration_seconds {
        Some(s) => format!(
            "  tolerations:\n  - {{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: {s}}}\n"
        ),
        None => String::new(),
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  nodeName: node-a\n  terminationGracePeriodSeconds: 1\n{tol}  containers:\n  - name: main\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n"
    )
}

#[test]
fn a_dead_node_is_marked_unknown_tainted_and_its_pods_evicted() {
    if !common::have_root() {
        return;
    }
    let netns = Arc::new(testkit::Netns::new("nodus-death").expect("netns"));
    let cgroup = testkit::CgroupParent::new("nodus-death");
    cgroup.create();
    cluster::add_node_address(&netns);
    let cp = ControlPlane::start_with(
        netns.clone(),
        &[
            // Longer than the kubelet's 10 s Lease renewal, so a live node never flaps.
            "--node-monitor-grace-period",
            "20s",
            "--node-monitor-period",
            "500ms",
            "--node-eviction-rate",
            "100",
        ],
    );
    // The bystander: a node object whose Lease this test keeps renewing.
    cp.apply(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-b\nstatus:\n  allocatable: {cpu: '1', memory: 1Gi, pods: '10'}\n  conditions:\n  - {type: Ready, status: 'True', reason: KubeletReady, message: kubelet is posting ready status}\n",
    );
    let alive = Arc::new(AtomicBool::new(true));
    let renewer = {
        let alive = alive.clone();
        let netns = netns.clone();
        let kc = cp.admin_kubeconfig();
        let home = cp.dir.path().join("home");
        std::thread::spawn(move || {
            while alive.load(Ordering::Relaxed) {
                let now = std::process::Command::new("date")
                    .args(["-u", "+%Y-%m-%dT%H:%M:%S.000000Z"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                    .unwrap_or_default();
                let lease = format!(
                    "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: node-b\n  namespace: kube-node-lease\nspec:\n  holderIdentity: node-b\n  leaseDurationSeconds: 40\n  renewTime: \"{now}\"\n"
                );
                let _ = cluster::kubectl(&netns, &kc, &home, &["apply", "-f", "-"], Some(&lease));
                std::thread::sleep(Duration::from_millis(700));
            }
        })
    };
    let mut node = NodeProcess::start(&netns, &cp, "node-a", "10.99.64.0/24", &cgroup.path());
    let logs = || String::new();
    let ready = |n: &Value| cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True");
    cp.wait_json(&["node", "node-a"], T, "node-a Ready", &logs, ready);
    cp.apply(&pod("short", Some(3)));
    cp.apply(&pod("patient", None));
    for name in ["short", "patient"] {
        cp.wait_json(&["pod", name], T, "pod Running", &logs, |p| {
            p["status"]["phase"] == "Running"
        });
    }

    // The node dies.
    node.stop();
    let n = cp.wait_json(&["node", "node-a"], T, "node-a Ready=Unknown", &logs, |n| {
        cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "Unknown")
    });
    assert_eq!(
        cluster::condition(&n, "Ready").unwrap()["message"],
        "Kubelet stopped posting node status."
    );
    let n = cp.wait_json(
        &["node", "node-a"],
        T,
        "unreachable NoExecute taint",
        &logs,
        |n| {
            n["spec"]["taints"].as_array().is_some_and(|ts| {
                ts.iter().any(|t| {
                    t["key"] == "node.kubernetes.io/unreachable" && t["effect"] == "NoExecute"
                })
            })
        },
    );
    assert!(
        n["spec"]["taints"].as_array().unwrap().iter().any(|t| {
            t["key"] == "node.kubernetes.io/unreachable" && t["effect"] == "NoSchedule"
        }),
        "{n}"
    );
    // The pod tolerating 3 s is evicted: marked for deletion, with the reason.
    let short = cp.wait_json(&["pod", "short"], T, "short evicted", &logs, |p| {
        p["metadata"]["deletionTimestamp"].is_string()
    });
    assert!(
        cluster::condition(&short, "DisruptionTarget")
            .is_some_and(|c| c["reason"] == "DeletionByTaintManager"),
        "{short}"
    );
    let ev = cluster::events_for(&cp, "default", "short");
    assert!(
        ev.iter().any(|(r, _)| r == "TaintManagerEviction"),
        "{ev:?}"
    );
    // The pod with the default 300 s stays, and the bystander is untouched.
    let patient = cp.get_json(&["pod", "patient"]).expect("patient");
    assert!(
        patient["metadata"]["deletionTimestamp"].is_null(),
        "{patient}"
    );
    let b = cp.get_json(&["node", "node-b"]).expect("node-b");
    assert!(b["spec"]["taints"].is_null(), "{b}");

    alive.store(false, Ordering::Relaxed);
    let _ = renewer.join();
    drop(node);
    drop(cp);
    drop(cgroup);
}
