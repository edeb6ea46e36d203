//! The memory manager (issue 19 item 5) on this machine: with `--memory-manager-policy
//! Static` a Guaranteed pod's container is created pinned to NUMA node 0 (`cpuset_mems`
//! in the CRI config, `cpuset.mems` in its cgroup) and `memory_manager_state` records the
//! assignment in upstream's layout; a Burstable pod is not pinned; the assignment survives a
//! kubelet restart and goes back when the pod is removed. A `--reserved-memory` that does not
//! add up, and a changed policy with an old state file, refuse the start with upstream's
//! messages. The NUMA placement rules themselves are table-tested on fake 2-socket × 2-node
//! sysfs trees in the kubelet crate (cm::memorymanager::tests).

mod common;

use common::BareNode;
use common::kubelet::{Kubelet, NODE_NAME, container_status, exec, is_running};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// Generous: the VM lane runs this under emulation, where a first sandbox can take 40 s.
const T: Duration = Duration::from_secs(180);
const MI: u64 = 1 << 20;

fn full(name: &str) -> String {
    format!("{name}-{NODE_NAME}")
}

fn pod(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sleep\", \"3600\"]\n    resources: {resources}\n"
    )
}

/// `cpuset_mems` of the container's resources as the runtime reports them (what
/// `crictl inspect` shows).
async fn cri_cpuset_mems(endpoint: &str, pod: &Value, container: &str) -> String {
    let id = container_status(pod, container).expect("container status")["containerID"]
        .as_str()
        .expect("a container id")
        .split_once("://")
        .expect("<runtime>://<id>")
        .1
        .to_string();
    let c = common::connect(endpoint).await;
    let s = c
        .runtime
        .clone()
        .container_status(cri::runtime::v1::ContainerStatusRequest {
            container_id: id,
            verbose: false,
        })
        .await
        .expect("ContainerStatus")
        .into_inner();
    s.status
        .and_then(|s| s.resources)
        .and_then(|r| r.linux)
        .map(|l| l.cpuset_mems)
        .unwrap_or_default()
}

fn state(root: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(root.join("memory_manager_state")).expect("state file"))
        .expect("state JSON")
}

/// Runs `nodus kubelet` with `args` and a runtime that does not exist; it must refuse to
/// start. Returns its stderr.
fn refused(args: &[&str]) -> String {
    let out = std::process::Command::new(common::nodus_bin())
        .arg("kubelet")
        .args(["--container-runtime-endpoint", "unix:///nonexistent.sock"])
        .args(["--healthz-port", "0"])
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "started: {err}");
    err
}

#[tokio::test(flavor = "multi_thread")]
async fn static_policy_pins_guaranteed_memory_to_numa_node_0() {
    if !common::have_root() {
        return;
    }
    let node = BareNode::new("10.89.77.0/24");
    node.cgroup.create();
    let cgroup = node.cgroup.path();
    // The tests' hard eviction threshold holds back 100Mi: node 0 reserves it.
    let flags = [
        "--memory-manager-policy",
        "Static",
        "--reserved-memory",
        "0:memory=100Mi",
    ];
    let mut k = Kubelet::start(node.netns.clone(), &node.rt.endpoint(), &cgroup, &flags);
    let endpoint = node.rt.endpoint();
    k.write_manifest(
        "g.yaml",
        &pod(
            "g",
            "{requests: {cpu: 100m, memory: 32Mi}, limits: {cpu: 100m, memory: 32Mi}}",
        ),
    );
    k.write_manifest("b.yaml", &pod("b", "{requests: {memory: 32Mi}}"));
    let g = k.wait_pod(&full("g"), T, "c running", |p| is_running(p, "c"));
    let b = k.wait_pod(&full("b"), T, "c running", |p| is_running(p, "c"));

    // Guaranteed: pinned to node 0 at CreateContainer; Burstable: not pinned.
    assert_eq!(cri_cpuset_mems(&endpoint, &g, "c").await, "0");
    assert_eq!(cri_cpuset_mems(&endpoint, &b, "c").await, "");
    let mems = [
        "sh",
        "-c",
        "cat /sys/fs/cgroup/cpuset/cpuset.mems 2>/dev/null || cat /sys/fs/cgroup/cpuset.mems",
    ];
    assert_eq!(exec(&endpoint, &g, "c", &mems).await, "0");

    // The state file records the assignment in upstream's layout.
    let g_uid = g["metadata"]["uid"].as_str().unwrap().to_string();
    let b_uid = b["metadata"]["uid"].as_str().unwrap().to_string();
    let s = state(&k.root());
    assert_eq!(s["policyName"], "Static");
    assert_eq!(
        s["entries"][&g_uid]["c"],
        serde_json::json!([{"numaAffinity": [0], "type": "memory", "size": 32 * MI}]),
        "{s:#}"
    );
    assert!(s["entries"].get(&b_uid).is_none(), "{s:#}");
    let table = &s["machineState"]["0"]["memoryMap"]["memory"];
    assert_eq!(table["reserved"], 32 * MI, "{s:#}");
    assert_eq!(table["systemReserved"], 100 * MI, "{s:#}");
    assert_eq!(
        table["free"].as_u64().unwrap() + 32 * MI,
        table["allocatable"].as_u64().unwrap()
    );
    assert!(s["checksum"].as_u64().is_some());

    // A restarted kubelet keeps the assignment (the running pod is not placed again).
    let g_id = container_status(&g, "c").unwrap()["containerID"].clone();
    k.kill();
    k.start_again();
    let g = k.wait_pod(&full("g"), T, "c running", |p| is_running(p, "c"));
    assert_eq!(container_status(&g, "c").unwrap()["containerID"], g_id);
    assert_eq!(state(&k.root())["entries"][&g_uid]["c"][0]["size"], 32 * MI);

    // The old state file under another policy: refused at start, as upstream.
    k.kill();
    let root = k.root();
    let e = refused(&[
        "--root-dir",
        root.to_str().unwrap(),
        "--cgroup-root",
        &cgroup,
        "--memory-manager-policy",
        "None",
    ]);
    assert!(
        e.contains(&format!(
            "start memory manager error: could not restore state from checkpoint: [memorymanager] configured policy \"None\" differs from state checkpoint policy \"Static\", please drain this node and delete the memory manager checkpoint file {:?} before restarting Kubelet",
            root.join("memory_manager_state")
        )),
        "{e}"
    );
    k.start_again();

    // Removing the pod gives its memory back.
    k.remove_manifest("g.yaml");
    k.wait_gone(&full("g"), T);
    let deadline = Instant::now() + T;
    loop {
        let s = state(&k.root());
        if s["entries"].get(&g_uid).is_none() {
            assert_eq!(s["machineState"]["0"]["memoryMap"]["memory"]["reserved"], 0);
            assert_eq!(s["machineState"]["0"]["numberOfAssignments"], 0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "memory not released: {s:#}\n{}",
            k.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn bad_memory_manager_settings_refuse_start() {
    if !common::have_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let static_ = ["--root-dir", root, "--memory-manager-policy", "Static"];
    // Upstream's default hard eviction holds back 100Mi of memory.
    let e = refused(&[&static_[..], &["--reserved-memory", "0:memory=1Gi"][..]].concat());
    assert!(
        e.contains("the total amount \"1Gi\" of type \"memory\" is not equal to the value \"100Mi\" determined by Node Allocatable feature"),
        "{e}"
    );
    let e = refused(
        &[
            &static_[..],
            &[
                "--kube-reserved",
                "memory=500Mi",
                "--reserved-memory",
                "0:memory=500Mi",
            ][..],
        ]
        .concat(),
    );
    assert!(
        e.contains("the total amount \"500Mi\" of type \"memory\" is not equal to the value \"600Mi\" determined by Node Allocatable feature"),
        "{e}"
    );
    let e = refused(&static_);
    assert!(
        e.contains("the total amount \"0\" of type \"memory\" is not equal to the value \"100Mi\""),
        "{e}"
    );
    let e = refused(&[&static_[..], &["--reserved-memory", "9:memory=100Mi"][..]].concat());
    assert!(
        e.contains("the reserved memory configuration references a NUMA node 9 that does not exist on this machine"),
        "{e}"
    );
    let e = refused(&[&static_[..], &["--reserved-memory", "0memory=100Mi"][..]].concat());
    assert!(
        e.contains("invalid argument \"0memory=100Mi\" for \"--reserved-memory\" flag: the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...], got 0memory=100Mi"),
        "{e}"
    );
    let e = refused(&["--root-dir", root, "--memory-manager-policy", "static"]);
    assert!(e.contains("unknown policy: \"static\""), "{e}");
    // Nothing was started: no state file.
    assert!(!dir.path().join("memory_manager_state").exists());
}
