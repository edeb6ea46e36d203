//! A Deployment end to end with the real kubectl against a control plane and one real
//! `nodus node` (in its own network namespace and cgroup parent): created with `kubectl
//! create deployment`, its pods run and turn Ready on the node; `kubectl scale`, `set
//! image` + `rollout status`, `rollout history`, `rollout undo` (kubectl's client-side
//! rollback from the ReplicaSets), `rollout pause`/`resume` and `rollout restart` behave
//! as against a real cluster.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::{self, ControlPlane, NodeProcess};
use serde_json::Value;

const T: Duration = Duration::from_secs(180);
const IMAGE: &str = "docker.io/library/busybox:latest";
/// The same image by its short name: a different template, nothing to pull.
const IMAGE_SHORT: &str = "busybox";

/// `kubectl rollout status` until it reports success (each call bounded, the whole by `T`).
fn rollout_status(cp: &ControlPlane, node: &NodeProcess) -> String {
    let deadline = Instant::now() + T;
    loop {
        let (ok, out, err) = cp.kubectl(&["rollout", "status", "deployment/web", "--timeout=15s"]);
        if ok {
            assert!(
                out.contains("deployment \"web\" successfully rolled out"),
                "{out}"
            );
            return out;
        }
        if Instant::now() > deadline {
            panic!(
                "rollout status never succeeded: {out}{err}\n{}\nnode log:\n{}\ncontrol plane log:\n{}",
                cp.kubectl(&["get", "deploy,rs,pods", "-o", "wide"]).1,
                node.log(),
                cp.log()
            );
        }
    }
}

fn ready_pods(cp: &ControlPlane) -> Vec<Value> {
    cp.get_json(&["pods", "-l", "app=web"])
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| {
            p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["phase"] == "Running"
                && cluster::condition(p, "Ready").is_some_and(|c| c["status"] == "True")
        })
        .collect()
}

fn image_of(cp: &ControlPlane) -> String {
    cp.get_json(&["deployment", "web"])
        .map(|d| {
            d["spec"]["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default()
}

fn revisions(cp: &ControlPlane) -> Vec<String> {
    let (ok, out, err) = cp.kubectl(&["rollout", "history", "deployment/web"]);
    assert!(ok, "{out}{err}");
    // "REVISION  CHANGE-CAUSE" then one line per revision.
    let mut lines = out.lines().skip_while(|l| !l.starts_with("REVISION"));
    lines.next();
    lines
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

fn ok(cp: &ControlPlane, args: &[&str]) -> String {
    let (ok, out, err) = cp.kubectl(args);
    assert!(ok, "kubectl {args:?}: {out}{err}");
    out
}

#[test]
fn deployment_lifecycle_with_kubectl() {
    if !common::have_root() {
        return;
    }
    let netns = Arc::new(testkit::Netns::new("nodus-deploy").expect("netns"));
    let cgroup = testkit::CgroupParent::new("nodus-deploy");
    cgroup.create();
    cluster::add_node_address(&netns);
    let cp = ControlPlane::start(netns.clone());
    let node = NodeProcess::start(&netns, &cp, "node-a", "10.99.65.0/24", &cgroup.path());
    let logs = || node.log();
    cp.wait_json(&["node", "node-a"], T, "node-a Ready", &logs, |n| {
        cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True")
    });

    // kubectl create deployment (its object, made client-side, given IfNotPresent and a
    // short grace period so the offline node never pulls and rollouts are quick).
    let out = ok(
        &cp,
        &[
            "create",
            "deployment",
            "web",
            &format!("--image={IMAGE}"),
            "--replicas=2",
            "--dry-run=client",
            "-o",
            "json",
            "--",
            "sleep",
            "3600",
        ],
    );
    let mut d: Value = serde_json::from_str(&out).expect("deployment json");
    d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent".into();
    d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1.into();
    let (created, o, e) = cluster::kubectl(
        &netns,
        &cp.admin_kubeconfig(),
        &cp.dir.path().join("home"),
        &["create", "-f", "-"],
        Some(&d.to_string()),
    );
    assert!(created, "{o}{e}");
    rollout_status(&cp, &node);
    assert_eq!(ready_pods(&cp).len(), 2);
    let (_, table, _) = cp.kubectl(&["get", "deployment", "web", "--no-headers"]);
    let cols: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(cols.get(1..4), Some(&["2/2", "2", "2"][..]), "{table}");

    // kubectl scale.
    ok(&cp, &["scale", "deployment", "web", "--replicas=3"]);
    rollout_status(&cp, &node);
    cp.wait_json(&["deployment", "web"], T, "3 available", &logs, |d| {
        d["status"]["availableReplicas"] == 3
    });
    assert_eq!(ready_pods(&cp).len(), 3);

    // kubectl set image: a second revision, rolled out.
    ok(
        &cp,
        &[
            "set",
            "image",
            "deployment/web",
            &format!("busybox={IMAGE_SHORT}"),
        ],
    );
    rollout_status(&cp, &node);
    assert_eq!(revisions(&cp), ["1", "2"]);
    let pods = ready_pods(&cp);
    assert_eq!(pods.len(), 3);
    assert!(
        pods.iter()
            .all(|p| p["spec"]["containers"][0]["image"] == IMAGE_SHORT),
        "{pods:?}"
    );
    let evs = cluster::events_for(&cp, "default", "web");
    assert!(
        evs.iter()
            .any(|(r, m)| r == "ScalingReplicaSet" && m.starts_with("Scaled up replica set web-")),
        "{evs:?}"
    );
    assert!(evs.iter().any(|(r, m)| r == "ScalingReplicaSet" && m.starts_with("Scaled down replica set web-")), "{evs:?}");

    // kubectl rollout undo: back to the first template, which becomes revision 3.
    ok(&cp, &["rollout", "undo", "deployment/web"]);
    rollout_status(&cp, &node);
    assert_eq!(image_of(&cp), IMAGE);
    assert_eq!(revisions(&cp), ["2", "3"]);
    let rs = cp.get_json(&["rs", "-l", "app=web"]).expect("rs");
    assert_eq!(
        rs["items"].as_array().map(Vec::len),
        Some(2),
        "the undo reuses the first set"
    );

    // Paused: a template change makes no new ReplicaSet until resumed.
    ok(&cp, &["rollout", "pause", "deployment/web"]);
    cp.wait_json(&["deployment", "web"], T, "paused condition", &logs, |d| {
        cluster::condition(d, "Progressing").is_some_and(|c| c["reason"] == "DeploymentPaused")
    });
    ok(
        &cp,
        &[
            "set",
            "image",
            "deployment/web",
            &format!("busybox={IMAGE_SHORT}"),
        ],
    );
    cp.wait_json(
        &["deployment", "web"],
        T,
        "paused change observed",
        &logs,
        |d| d["status"]["observedGeneration"] == d["metadata"]["generation"],
    );
    let rs = cp.get_json(&["rs", "-l", "app=web"]).expect("rs");
    assert_eq!(
        rs["items"].as_array().map(Vec::len),
        Some(2),
        "no rollout while paused"
    );
    ok(&cp, &["rollout", "resume", "deployment/web"]);
    rollout_status(&cp, &node);
    assert_eq!(revisions(&cp), ["3", "4"]);

    // kubectl rollout restart: a new template annotation, a new revision.
    ok(&cp, &["rollout", "restart", "deployment/web"]);
    rollout_status(&cp, &node);
    assert_eq!(revisions(&cp).last().map(String::as_str), Some("5"));
    let pods = ready_pods(&cp);
    assert_eq!(pods.len(), 3);
    assert!(
        pods.iter()
            .all(|p| p["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"].is_string()),
        "{pods:?}"
    );

    ok(&cp, &["delete", "deployment", "web"]);
    cp.wait_json(&["pods", "-l", "app=web"], T, "pods gone", &logs, |l| {
        l["items"].as_array().is_some_and(Vec::is_empty)
    });
    drop(node);
}
