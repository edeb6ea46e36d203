//! `nodus up` bootstraps its control plane as kubeadm does: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler are static pods of the node's kubelet, seen
//! in kube-system as mirror pods (the lesson's lab step 3 and challenge 4), repaired by
//! the kubelet when killed, restarted when their manifest changes, and left running when
//! the manifest is edited into something invalid.

mod common;

use common::up::Up;
use serde_json::Value;

const COMPONENTS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

fn mirror(up: &Up, component: &str) -> String {
    format!("{component}-{}", up.node)
}

fn running_and_ready(p: &Value) -> bool {
    p["status"]["phase"] == "Running"
        && p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// The static pod's container as crictl lists it, and its host PID.
fn container_pid(up: &Up, name: &str) -> i32 {
    let crictl = |args: &[&str]| common::up::crictl(&up.netns, up.d(), args);
    let id = crictl(&["ps", "--name", name, "--state", "running", "-q"]);
    let id = id
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no running {name} container"));
    let info: Value = serde_json::from_str(&crictl(&["inspect", id])).expect("inspect json");
    info["info"]["pid"]
        .as_i64()
        .unwrap_or_else(|| panic!("no pid in {info}")) as i32
}

#[test]
fn up_runs_the_control_plane_as_static_pods_with_mirror_pods() {
    if !common::have_root() {
        return;
    }
    let up = Up::start("nodus-sp", "10.99.71.0/24", "sp-node");

    // Lab step 3: `kubectl get pods -n kube-system` lists the four, named after the node.
    let list = up.wait(
        &["get", "pods", "-n", "kube-system", "-o", "json"],
        "the control plane's mirror pods Running",
        |l| {
            COMPONENTS.iter().all(|c| {
                l["items"].as_array().is_some_and(|items| {
                    items
                        .iter()
                        .any(|p| p["metadata"]["name"] == mirror(&up, c) && running_and_ready(p))
                })
            })
        },
    );
    for c in COMPONENTS {
        let p = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["metadata"]["name"] == mirror(&up, c))
            .unwrap();
        assert_eq!(p["metadata"]["labels"]["tier"], "control-plane", "{p}");
        assert_eq!(p["metadata"]["labels"]["component"], c, "{p}");
        assert!(
            p.pointer("/metadata/annotations/kubernetes.io~1config.mirror")
                .is_some(),
            "{c} is not a mirror pod: {p}"
        );
        assert_eq!(p["spec"]["nodeName"], up.node.as_str());
        assert_eq!(p["spec"]["hostNetwork"], true);
        assert_eq!(p["spec"]["priorityClassName"], "system-node-critical");
        // kubeadm's probes; `started` turns true only once the startup probe has passed, so
        // each component answers its health endpoint (10257, 10259, /livez, etcd's /health).
        let c0 = &p["spec"]["containers"][0];
        let port = c0["livenessProbe"]["httpGet"]["port"].clone();
        let want = match c {
            "kube-controller-manager" => 10257,
            "kube-scheduler" => 10259,
            "kube-apiserver" => 6443,
            _ => port.as_u64().unwrap_or(0),
        };
        assert_eq!(port, want, "{c}'s liveness probe: {c0}");
        assert!(c0["startupProbe"]["httpGet"].is_object(), "{c0}");
        assert_eq!(p["status"]["containerStatuses"][0]["started"], true, "{p}");
        // kubeadm's split: only the API server talks to etcd; the other two reach the
        // objects through it with their own kubeconfigs.
        let command: Vec<&str> = c0["command"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let own = match c {
            "kube-controller-manager" => Some("controller-manager.conf"),
            "kube-scheduler" => Some("scheduler.conf"),
            _ => None,
        };
        if let Some(file) = own {
            assert!(
                command
                    .iter()
                    .any(|a| a.starts_with("--kubeconfig=") && a.ends_with(file)),
                "{c}: {command:?}"
            );
            assert!(
                !command.iter().any(|a| a.starts_with("--etcd-")),
                "{c}: {command:?}"
            );
        } else if c == "kube-apiserver" {
            assert!(
                command.iter().any(|a| a.starts_with("--etcd-servers=")),
                "{command:?}"
            );
        }
    }
    let (ok, table, err) = up.k(&["get", "pods", "-n", "kube-system"]);
    assert!(ok, "{err}");
    for c in COMPONENTS {
        assert!(table.contains(&mirror(&up, c)), "{table}");
    }

    // The controllers and the scheduler work from their own pods: a Deployment's pod is
    // created by the ReplicaSet controller, placed by the scheduler and run.
    up.apply(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - {name: web, image: busybox, imagePullPolicy: IfNotPresent, command: [sleep, '3600']}\n",
    );
    up.wait(
        &["get", "deployment", "web", "-o", "json"],
        "the Deployment available",
        |d| d["status"]["availableReplicas"] == 1,
    );
    for lease in ["kube-controller-manager", "kube-scheduler"] {
        let l = up.wait(
            &["get", "lease", "-n", "kube-system", lease, "-o", "json"],
            &format!("the {lease} Lease held"),
            |l| {
                l["spec"]["holderIdentity"]
                    .as_str()
                    .is_some_and(|h| !h.is_empty())
            },
        );
        assert!(l["spec"]["leaseDurationSeconds"] == 15, "{l}");
    }

    // Challenge 4: deleting a mirror pod through the API does not remove it.
    let etcd = mirror(&up, "etcd");
    let before = up.wait(
        &["get", "pod", "-n", "kube-system", &etcd, "-o", "json"],
        "etcd's mirror pod",
        |_| true,
    );
    let (ok, out, err) = up.k(&["delete", "pod", "-n", "kube-system", &etcd, "--wait=false"]);
    assert!(ok, "delete {etcd}: {out}{err}");
    up.wait(
        &["get", "pod", "-n", "kube-system", &etcd, "-o", "json"],
        "etcd's mirror pod back",
        |p| {
            p["metadata"]["uid"] != before["metadata"]["uid"]
                && p["metadata"]["deletionTimestamp"].is_null()
        },
    );

    // The API server's process killed: the kubelet restarts its container.
    let pid = container_pid(&up, "kube-apiserver");
    // SAFETY: a plain kill(2) of the container process this test's node started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let api = mirror(&up, "kube-apiserver");
    up.wait(
        &["get", "pod", "-n", "kube-system", &api, "-o", "json"],
        "kube-apiserver restarted",
        |p| {
            p["status"]["containerStatuses"][0]["restartCount"]
                .as_i64()
                .is_some_and(|n| n >= 1)
                && running_and_ready(p)
        },
    );

    // A manifest edited into something invalid: the scheduler keeps running.
    let manifest = up.d().join("up/manifests/kube-scheduler.yaml");
    let good = std::fs::read_to_string(&manifest).expect("kube-scheduler.yaml");
    assert!(good.contains("--leader-elect-retry-period=2s"), "{good}");
    let sched = mirror(&up, "kube-scheduler");
    let running = up.wait(
        &["get", "pod", "-n", "kube-system", &sched, "-o", "json"],
        "kube-scheduler",
        |_| true,
    );
    std::fs::write(&manifest, "apiVersion: v1\nkind: Pod\nmetadata: [\n").unwrap();
    let log = up.d().join("up.log");
    for _ in 0..200 {
        if std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("keep running until it is valid again")
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("keep running until it is valid again"),
        "{}",
        up.log()
    );
    let still = up.wait(
        &["get", "pod", "-n", "kube-system", &sched, "-o", "json"],
        "kube-scheduler",
        |_| true,
    );
    assert_eq!(still["metadata"]["uid"], running["metadata"]["uid"]);
    assert!(running_and_ready(&still), "{still}");

    // Edited into something valid and different: that component restarts on the new flags.
    std::fs::write(
        &manifest,
        good.replace(
            "--leader-elect-retry-period=2s",
            "--leader-elect-retry-period=3s",
        ),
    )
    .unwrap();
    let restarted = up.wait(
        &["get", "pod", "-n", "kube-system", &sched, "-o", "json"],
        "kube-scheduler on its new manifest",
        |p| {
            p["spec"]["containers"][0]["command"]
                .as_array()
                .is_some_and(|c| c.iter().any(|a| a == "--leader-elect-retry-period=3s"))
                && running_and_ready(p)
        },
    );
    assert_ne!(
        restarted.pointer("/metadata/annotations/kubernetes.io~1config.hash"),
        running.pointer("/metadata/annotations/kubernetes.io~1config.hash")
    );
}
