//! A Deployment end to end with the real kubectl against a control plane and one real
//! `nodus node` (in its own network namespace and cgroup parent): created with `kubectl
//! create deployment`, its pods run and turn Ready on the node; `kubectl scale`, `set
//! image` + `rollout status`, `rollout history`, `rollout undo` (kubectl's client-side
//! rollback from the ReplicaSets), `rollout pause`/`resume` and `rollout restart` behave
//! as against a real cluster. A control plane killed (SIGKILL) in the middle of a rolling
//! update and restarted on its data dir finishes the rollout within replicas + maxSurge.

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

    // A burst of creates is correlated as upstream's recorder does: twelve pods (which no
    // node can take, so nothing runs) give nine "Created pod" events and one combined
    // event counting the other three.
    cp.apply(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: burst}\nspec:\n  replicas: 12\n  selector: {matchLabels: {app: burst}}\n  template:\n    metadata: {labels: {app: burst}}\n    spec:\n      nodeSelector: {nowhere: \"true\"}\n      containers: [{name: c, image: busybox}]\n",
    );
    let events = cp.wait_json(
        &["events", "--field-selector", "involvedObject.name=burst"],
        T,
        "a combined SuccessfulCreate event counting three",
        &logs,
        |l| {
            l["items"].as_array().is_some_and(|items| {
                items.iter().any(|e| {
                    e["message"].as_str().is_some_and(|m| {
                        m.starts_with("(combined from similar events): Created pod: burst-")
                    }) && e["count"] == 3
                })
            })
        },
    );
    let items = events["items"].as_array().cloned().unwrap_or_default();
    let plain = items
        .iter()
        .filter(|e| {
            e["reason"] == "SuccessfulCreate"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("Created pod: burst-"))
        })
        .count();
    assert_eq!(plain, 9, "{events:#}");
    assert_eq!(items.len(), 10, "{events:#}");
    drop(node);
}

/// Pods of `app=web` that count toward a rollout's bounds: not being deleted, not finished.
fn live_pods(cp: &ControlPlane) -> Option<Vec<Value>> {
    let l = cp.get_json(&["pods", "-l", "app=web"])?;
    Some(
        l["items"]
            .as_array()?
            .iter()
            .filter(|p| {
                p["metadata"]["deletionTimestamp"].is_null()
                    && !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
            })
            .cloned()
            .collect(),
    )
}

fn pod_summary(pods: &[Value]) -> String {
    pods.iter()
        .map(|p| {
            format!(
                "{} ({}, hash {})",
                p["metadata"]["name"].as_str().unwrap_or("?"),
                p["status"]["phase"].as_str().unwrap_or("?"),
                p["metadata"]["labels"]["pod-template-hash"]
                    .as_str()
                    .unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The "Bad input": the control plane dies (SIGKILL) in the middle of a rolling
/// update and comes back on the same data dir. The rollout finishes, the Deployment never
/// has more than replicas + maxSurge pods at once, and every ReplicaSet ends with exactly
/// the pods it asks for.
#[test]
fn control_plane_restart_mid_rollout_finishes_without_extra_replicas() {
    if !common::have_root() {
        return;
    }
    const REPLICAS: usize = 4;
    const MAX_SURGE: usize = 1;
    let netns = Arc::new(testkit::Netns::new("nodus-deploy-rs").expect("netns"));
    let cgroup = testkit::CgroupParent::new("nodus-deploy-rs");
    cgroup.create();
    cluster::add_node_address(&netns);
    let mut cp = ControlPlane::start(netns.clone());
    let node = NodeProcess::start(&netns, &cp, "node-a", "10.99.65.0/24", &cgroup.path());
    let logs = || node.log();
    cp.wait_json(&["node", "node-a"], T, "node-a Ready", &logs, |n| {
        cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True")
    });

    // One pod at a time (maxSurge 1, maxUnavailable 0), each new pod held for
    // minReadySeconds before an old one goes: a rollout of several steps to interrupt.
    let deployment = |image: &str| {
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": REPLICAS,
                "minReadySeconds": 2,
                "strategy": {"type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": MAX_SURGE, "maxUnavailable": 0}},
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "busybox", "image": image,
                            "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"]}],
                    },
                },
            },
        })
        .to_string()
    };
    cp.apply(&deployment(IMAGE));
    rollout_status(&cp, &node);

    // From here on, every pod list the API server answers is checked against the bound.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let stop = Arc::clone(&stop);
        let netns = Arc::clone(&netns);
        let kubeconfig = cp.admin_kubeconfig();
        let home = cp.dir.path().join("home");
        std::thread::spawn(move || {
            let mut most: (usize, String) = (0, String::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (ok, out, _) = cluster::kubectl(
                    &netns,
                    &kubeconfig,
                    &home,
                    &["get", "pods", "-l", "app=web", "-o", "json"],
                    None,
                );
                // While the control plane is down kubectl fails: nothing to see then.
                let Some(list) = ok
                    .then(|| serde_json::from_str::<Value>(&out).ok())
                    .flatten()
                else {
                    continue;
                };
                let live: Vec<Value> = list["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| {
                        p["metadata"]["deletionTimestamp"].is_null()
                            && !matches!(
                                p["status"]["phase"].as_str(),
                                Some("Succeeded" | "Failed")
                            )
                    })
                    .cloned()
                    .collect();
                if live.len() > most.0 {
                    most = (live.len(), pod_summary(&live));
                }
            }
            most
        })
    };

    let (applied, o, e) = cluster::kubectl(
        &netns,
        &cp.admin_kubeconfig(),
        &cp.dir.path().join("home"),
        &["apply", "-f", "-"],
        Some(&deployment(IMAGE_SHORT)),
    );
    assert!(applied, "{o}{e}");
    // Mid-rollout: the new ReplicaSet has a Ready pod and the old one still has pods.
    cp.wait_json(
        &["rs", "-l", "app=web"],
        T,
        "a rollout half done",
        &logs,
        |l| {
            let sets = l["items"].as_array().cloned().unwrap_or_default();
            let new = sets
                .iter()
                .find(|r| r["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE_SHORT);
            let old = sets
                .iter()
                .find(|r| r["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE);
            new.is_some_and(|r| r["status"]["readyReplicas"].as_u64().unwrap_or(0) >= 1)
                && old.is_some_and(|r| r["spec"]["replicas"].as_u64().unwrap_or(0) >= 2)
        },
    );
    cp.kill();
    std::thread::sleep(Duration::from_secs(2));
    cp.start_again();

    rollout_status(&cp, &node);
    // Settled: the old pods are gone and exactly the replicas run the new template.
    let pods = cp.wait_json(&["pods", "-l", "app=web"], T, "old pods gone", &logs, |l| {
        l["items"].as_array().is_some_and(|items| {
            items.len() == REPLICAS
                && items
                    .iter()
                    .all(|p| p["spec"]["containers"][0]["image"] == IMAGE_SHORT)
        })
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (most, at_most) = watcher.join().expect("watcher");
    assert!(
        most <= REPLICAS + MAX_SURGE,
        "{most} pods at once (replicas {REPLICAS} + maxSurge {MAX_SURGE}): {at_most}"
    );
    assert_eq!(revisions(&cp), ["1", "2"]);

    // Every ReplicaSet has exactly the pods it asks for, by its pod-template-hash.
    let live = live_pods(&cp).expect("pods");
    let sets = cp.get_json(&["rs", "-l", "app=web"]).expect("rs");
    let sets = sets["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(sets.len(), 2, "{sets:?}");
    for rs in &sets {
        let hash = rs["metadata"]["labels"]["pod-template-hash"]
            .as_str()
            .unwrap_or("");
        let want = rs["spec"]["replicas"].as_u64().unwrap_or(u64::MAX) as usize;
        let have = live
            .iter()
            .filter(|p| p["metadata"]["labels"]["pod-template-hash"] == hash)
            .count();
        assert_eq!(
            have,
            want,
            "ReplicaSet {}: {}",
            rs["metadata"]["name"],
            pod_summary(&live)
        );
        assert_eq!(rs["status"]["replicas"].as_u64(), Some(want as u64), "{rs}");
    }
    assert_eq!(pods["items"].as_array().map(Vec::len), Some(REPLICAS));

    ok(&cp, &["delete", "deployment", "web"]);
    cp.wait_json(&["pods", "-l", "app=web"], T, "pods gone", &logs, |l| {
        l["items"].as_array().is_some_and(Vec::is_empty)
    });
    drop(node);
}
