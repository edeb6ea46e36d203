//! The CPU manager's static policy on this machine's real CPUs: with `--reserved-cpus 0`, a
//! Guaranteed `cpu: 1` container gets a CPU of its own (its cgroup's `cpuset.cpus`, read
//! from inside the container), every other container runs on the rest (the shared pool,
//! CPU 0 on a 2-CPU machine) and Allocatable leaves the reserved CPU out; deleting the Guaranteed pod gives its CPU back to the pool and
//! the running container's cpuset grows (UpdateContainerResources); the state file is
//! upstream's; a kubelet started with another policy over that state file refuses to start
//! with upstream's message.

mod common;

use common::BareNode;
use common::kubelet::{Kubelet, NODE_NAME, exec, is_running, phase};
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(180);

fn full(name: &str) -> String {
    format!("{name}-{NODE_NAME}")
}

fn pod(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", \"exec sleep 3600\"]\n    resources: {resources}\n"
    )
}

/// A cpuset in the kernel's list format.
fn cpus(s: &str) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => {
                out.insert(part.parse::<u32>().unwrap());
            }
        }
    }
    out
}

/// The container's cgroup `cpuset.cpus`, as the container itself reads it.
async fn cpuset_inside(endpoint: &str, pod: &Value) -> BTreeSet<u32> {
    let file = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "/sys/fs/cgroup/cpuset.cpus"
    } else {
        "/sys/fs/cgroup/cpuset/cpuset.cpus"
    };
    cpus(&exec(endpoint, pod, "c", &["cat", file]).await)
}

async fn wait_cpuset(k: &Kubelet, endpoint: &str, name: &str, want: &BTreeSet<u32>) {
    let deadline = Instant::now() + T;
    loop {
        let p = k.wait_pod(&full(name), T, "running", |p| is_running(p, "c"));
        let got = cpuset_inside(endpoint, &p).await;
        if &got == want {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "{name}: cpuset.cpus {got:?}, want {want:?}\nkubelet log:\n{}",
                k.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn static_policy_pins_guaranteed_cpus_and_resizes_the_shared_pool() {
    if !common::have_root() {
        return;
    }
    let online = cpus(&std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap());
    if online.len() < 2 {
        assert!(
            std::env::var_os("NODUS_TEST_REQUIRE_ROOT").is_none(),
            "the CPU manager test needs 2 CPUs"
        );
        eprintln!("skipping: needs 2 CPUs");
        return;
    }
    let node = BareNode::new("10.88.41.0/24");
    node.cgroup.create();
    let root = node.cgroup.path();
    let endpoint = node.rt.endpoint();
    let mut k = Kubelet::start(
        node.netns.clone(),
        &endpoint,
        &root,
        &[
            "--cpu-manager-policy",
            "static",
            "--reserved-cpus",
            "0",
            "--cpu-manager-reconcile-period",
            "1s",
        ],
    );
    k.write_manifest("be.yaml", &pod("be", "{}"));
    k.write_manifest(
        "guar.yaml",
        &pod(
            "guar",
            "{requests: {cpu: 1, memory: 64Mi}, limits: {cpu: 1, memory: 64Mi}}",
        ),
    );
    let g = k.wait_pod(&full("guar"), T, "running", |p| is_running(p, "c"));
    let exclusive = cpuset_inside(&endpoint, &g).await;
    assert_eq!(exclusive.len(), 1, "{exclusive:?}");
    assert!(!exclusive.contains(&0), "the reserved CPU 0 was handed out");
    if online.len() == 2 {
        assert_eq!(exclusive, BTreeSet::from([1]));
    }
    let shared: BTreeSet<u32> = online.difference(&exclusive).copied().collect();
    wait_cpuset(&k, &endpoint, "be", &shared).await;
    // Allocatable leaves the reserved CPU out: with the exclusive one taken, nothing is left.
    if online.len() == 2 {
        k.write_manifest(
            "half.yaml",
            &pod(
                "half",
                "{requests: {cpu: 500m, memory: 64Mi}, limits: {cpu: 500m, memory: 64Mi}}",
            ),
        );
        let p = k.wait_pod(&full("half"), T, "refused", |p| phase(p) == "Failed");
        assert_eq!(p["status"]["reason"], "OutOfcpu");
        assert_eq!(
            p["status"]["message"],
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 500, used: 1000, capacity: 1000"
        );
        k.remove_manifest("half.yaml");
    }

    // The state file, in upstream's layout.
    let state: Value = serde_json::from_slice(
        &std::fs::read(k.root().join("cpu_manager_state")).expect("cpu_manager_state"),
    )
    .unwrap();
    let uid = g["metadata"]["uid"].as_str().unwrap();
    assert_eq!(state["policyName"], "static");
    assert_eq!(
        cpus(state["defaultCpuSet"].as_str().unwrap()),
        shared,
        "{state}"
    );
    assert_eq!(
        cpus(state["entries"][uid]["c"].as_str().unwrap()),
        exclusive,
        "{state}"
    );
    assert!(state["checksum"].as_u64().is_some(), "{state}");

    // Deleting the Guaranteed pod returns its CPU to the pool of the running containers.
    k.remove_manifest("guar.yaml");
    k.wait_gone(&full("guar"), T);
    wait_cpuset(&k, &endpoint, "be", &online).await;
    let state: Value =
        serde_json::from_slice(&std::fs::read(k.root().join("cpu_manager_state")).unwrap())
            .unwrap();
    assert_eq!(cpus(state["defaultCpuSet"].as_str().unwrap()), online);
    assert!(state["entries"].get(uid).is_none(), "{state}");

    // Another policy over the old state file: the kubelet refuses to start.
    k.kill();
    let mut cmd = node.netns.command(common::nodus_bin()).unwrap();
    cmd.arg("kubelet")
        .arg("--container-runtime-endpoint")
        .arg(&endpoint)
        .arg("--root-dir")
        .arg(k.root())
        .arg("--pod-manifest-path")
        .arg(k.manifests())
        .arg("--cgroup-root")
        .arg(&root)
        .arg("--hostname-override")
        .arg(NODE_NAME)
        .args(["--eviction-hard", common::EVICTION_HARD_DISK_OFF])
        .args(["--cpu-manager-policy", "none"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn nodus kubelet");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the kubelet started with a changed CPU manager policy");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    let want = format!(
        "start cpu manager error: could not restore state from checkpoint: configured policy \"none\" differs from state checkpoint policy \"static\", please drain this node and delete the CPU manager checkpoint file {:?} before restarting Kubelet",
        k.root().join("cpu_manager_state")
    );
    assert!(stderr.contains(&want), "stderr: {stderr}\nwant: {want}");
}
