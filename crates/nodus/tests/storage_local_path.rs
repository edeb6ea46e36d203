//! Persistent storage end to end, as on k3s: `nodus control-plane` (default `local-path`
//! class, PV controller, local-path provisioner) and one real `nodus node`, driven with
//! the real kubectl. A claim without a class gets `local-path`, waits for its first
//! consumer, is provisioned on the node the pod is scheduled to; the pod writes a file, is
//! deleted and re-created, and reads the file back; deleting the claim removes the PV and
//! the directory on the node.

mod common;

use common::cluster::{self, ControlPlane, NodeProcess};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);

const CLAIM: &str = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\n  namespace: default\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 64Mi\n";

fn pod(name: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts:\n    - {{name: data, mountPath: /data}}\n  volumes:\n  - name: data\n    persistentVolumeClaim:\n      claimName: data\n"
    )
}

fn wait_until(what: &str, timeout: Duration, logs: &dyn Fn() -> String, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out: {what}\n{}", logs());
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn a_local_path_claim_keeps_its_data_across_pods_and_is_deleted_with_the_claim() {
    if !common::have_root() {
        return;
    }
    let netns = Arc::new(testkit::Netns::new("nodus-storage").expect("netns"));
    let cgroup = testkit::CgroupParent::new("nodus-storage");
    cgroup.create();
    cluster::add_node_address(&netns);
    let storage = tempfile::Builder::new()
        .prefix("nodus-local-path-")
        .tempdir()
        .expect("tempdir");
    let storage_path = storage.path().to_string_lossy().into_owned();
    let cp = ControlPlane::start_with(
        netns.clone(),
        &["--default-local-storage-path", &storage_path],
    );
    let node = NodeProcess::start(&netns, &cp, "node-a", "10.99.65.0/24", &cgroup.path());
    let logs = || format!("{}\n--- control plane ---\n{}", node.log(), cp.log());
    cp.wait_json(&["node", "node-a"], T, "node-a Ready", &logs, |n| {
        cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True")
    });
    let (ok, out, _) = cp.kubectl(&["get", "storageclass"]);
    assert!(ok);
    assert!(
        out.contains("local-path (default)   rancher.io/local-path   Delete          WaitForFirstConsumer   false"),
        "{out}"
    );

    cp.apply(CLAIM);
    let claim = cp.wait_json(&["pvc", "data"], T, "claim waits", &logs, |c| {
        c["spec"]["storageClassName"] == "local-path"
    });
    assert_eq!(claim["status"]["phase"], "Pending", "{claim}");
    cp.wait_json(&["pvc", "data"], T, "WaitForFirstConsumer", &logs, |_| {
        cluster::events_for(&cp, "default", "data")
            .iter()
            .any(|(r, m)| {
                r == "WaitForFirstConsumer"
                    && m == "waiting for first consumer to be created before binding"
            })
    });

    cp.apply(&pod("writer", "echo kept > /data/file && sleep 3600"));
    cp.wait_json(&["pod", "writer"], T, "writer Running", &logs, |p| {
        p["status"]["phase"] == "Running"
    });
    let claim = cp.wait_json(&["pvc", "data"], T, "claim Bound", &logs, |c| {
        c["status"]["phase"] == "Bound"
    });
    let pv_name = claim["spec"]["volumeName"]
        .as_str()
        .expect("volumeName")
        .to_string();
    assert_eq!(
        claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"],
        "node-a"
    );
    let pv = cp.get_json(&["pv", &pv_name]).expect("pv");
    let dir = std::path::PathBuf::from(pv["spec"]["hostPath"]["path"].as_str().expect("path"));
    assert_eq!(dir, storage.path().join(format!("{pv_name}_default_data")));
    let (_, table, _) = cp.kubectl(&["get", "pvc", "data"]);
    assert!(
        table.contains(&format!(
            "data   Bound    {pv_name}   64Mi       RWO            local-path"
        )),
        "{table}"
    );
    wait_until("the file on the node", T, &logs, || {
        std::fs::read_to_string(dir.join("file")).is_ok_and(|s| s == "kept\n")
    });

    // The pod goes; a new one finds the file.
    let (ok, out, err) = cp.kubectl(&["delete", "pod", "writer", "--wait=true"]);
    assert!(ok, "{out}{err}");
    cp.apply(&pod("reader", "cat /data/file && sleep 3600"));
    cp.wait_json(&["pod", "reader"], T, "reader Running", &logs, |p| {
        p["status"]["phase"] == "Running"
    });
    wait_until("reader prints the file", T, &logs, || {
        let (ok, out, _) = cp.kubectl(&["logs", "reader"]);
        ok && out == "kept\n"
    });

    // The claim goes with the pod: the PV is deleted (reclaim policy Delete) and the node
    // removes the directory.
    let (ok, out, err) = cp.kubectl(&["delete", "pod", "reader", "--wait=true"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cp.kubectl(&["delete", "pvc", "data", "--wait=true"]);
    assert!(ok, "{out}{err}");
    wait_until("the PV is deleted", T, &logs, || {
        let (_, out, err) = cp.kubectl(&["get", "pv", &pv_name]);
        err.contains("NotFound") || err.contains("not found") && out.is_empty()
    });
    wait_until("the directory is removed", T, &logs, || !dir.exists());

    drop(node);
    drop(cp);
    drop(cgroup);
}
