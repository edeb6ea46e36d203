//! The kubelet with `--cgroup-driver systemd` and the runtime with `systemd-cgroup = true`
//! (kubeadm's and containerd's defaults) on a cgroup v2 host run by systemd: `kubepods` and
//! its tiers are slices, each pod a `kubepods[-<tier>]-pod<uid>.slice` whose limits systemd
//! holds too, each container a `cri-nodus-<id>.scope` in its pod's slice; the limit is read
//! back inside the container, and an OOM kill is reported as OOMKilled.
//!
//! Runs where systemd is init (the VM lane's guest); on a machine without systemd it
//! returns at once, because the driver cannot work there (kubelet_qos.rs checks the error).
//! The kubelet's cgroup root is `/`, as kubeadm's: the guest is a fresh machine per run;
//! the slices are stopped at the end.

mod common;

use common::BareNode;
use common::kubelet::{Kubelet, NODE_NAME, container_status, exec, is_running, phase};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(90);

fn full(name: &str) -> String {
    format!("{name}-{NODE_NAME}")
}

fn pod(name: &str, resources: &str, command: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", \"{command}\"]\n    resources: {resources}\n"
    )
}

fn cg(path: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup").join(path)
}

fn read(path: &str, file: &str) -> String {
    let p = cg(path).join(file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .trim()
        .to_string()
}

/// `systemctl show <unit> -p <prop> --value`.
fn show(unit: &str, prop: &str) -> String {
    let out = std::process::Command::new("systemctl")
        .args(["show", unit, "-p", prop, "--value"])
        .output()
        .expect("systemctl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Stops the kubelet's slices (and whatever is left in them) when the test ends.
struct StopSlices;

impl Drop for StopSlices {
    fn drop(&mut self) {
        let _ = std::process::Command::new("systemctl")
            .args(["stop", "kubepods.slice"])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_in_slices_containers_in_scopes_limits_and_oom() {
    if !Path::new("/run/systemd/system").is_dir() {
        eprintln!(
            "skipped: systemd is not the running init on this machine (no /run/systemd/system)"
        );
        return;
    }
    if !common::have_root() {
        return;
    }
    let _stop = StopSlices;
    let node = BareNode::with_runtime_config("10.88.21.0/24", "systemd-cgroup = true\n");
    let k = Kubelet::start(
        node.netns.clone(),
        &node.rt.endpoint(),
        "/",
        &["--cgroup-driver", "systemd"],
    );

    // The QoS hierarchy as slices, kubepods capped at Allocatable in systemd as well.
    let cap = read("kubepods.slice", "memory.max");
    assert_ne!(cap, "max", "kubepods is capped at Allocatable");
    assert_eq!(show("kubepods.slice", "MemoryMax"), cap);
    for tier in ["burstable", "besteffort"] {
        let dir = format!("kubepods.slice/kubepods-{tier}.slice");
        assert!(cg(&dir).is_dir(), "{dir}\n{}", k.log());
    }

    k.write_manifest(
        "burst.yaml",
        &pod(
            "burst",
            "{requests: {cpu: 100m, memory: 32Mi}}",
            "exec sleep 3600",
        ),
    );
    k.write_manifest(
        "guar.yaml",
        &pod(
            "guar",
            "{requests: {cpu: 100m, memory: 64Mi}, limits: {cpu: 100m, memory: 64Mi}}",
            "exec sleep 3600",
        ),
    );
    let mut slices = Vec::new();
    let mut guar = None;
    for (name, qos, parent, prefix) in [
        (
            "burst",
            "Burstable",
            "kubepods.slice/kubepods-burstable.slice",
            "kubepods-burstable",
        ),
        ("guar", "Guaranteed", "kubepods.slice", "kubepods"),
    ] {
        let p = k.wait_pod(&full(name), T, "running", |p| is_running(p, "c"));
        assert_eq!(p["status"]["qosClass"], qos, "{name}");
        let uid = p["metadata"]["uid"].as_str().unwrap().replace('-', "_");
        let unit = format!("{prefix}-pod{uid}.slice");
        let slice = format!("{parent}/{unit}");
        assert!(cg(&slice).is_dir(), "{name}: {slice} missing\n{}", k.log());
        assert_eq!(show(&unit, "ActiveState"), "active", "{unit}");
        // The container is a scope of the runtime's in the pod's slice.
        let id = container_status(&p, "c").unwrap()["containerID"]
            .as_str()
            .unwrap()
            .rsplit("://")
            .next()
            .unwrap()
            .to_string();
        let scope = format!("{slice}/cri-nodus-{id}.scope");
        assert!(cg(&scope).is_dir(), "{name}: {scope} missing");
        assert!(!read(&scope, "cgroup.procs").is_empty(), "{scope} is empty");
        slices.push(slice.clone());
        if name == "guar" {
            // Pod-level limits in the files and in systemd.
            assert_eq!(read(&slice, "memory.max"), "67108864");
            assert_eq!(show(&unit, "MemoryMax"), "67108864");
            assert_eq!(read(&slice, "cpu.max"), "10000 100000");
            // The container's own limit, on its scope.
            assert_eq!(read(&scope, "memory.max"), "67108864");
            guar = Some(p);
        }
    }

    // The limit read back from inside the container (its cgroup namespace root is the scope).
    let inside = exec(
        &node.rt.endpoint(),
        guar.as_ref().unwrap(),
        "c",
        &["cat", "/sys/fs/cgroup/memory.max"],
    )
    .await;
    assert_eq!(inside, "67108864");

    // Over its memory limit: OOM-killed and reported so (the shim finds the scope's
    // memory.events).
    k.write_manifest(
        "oom.yaml",
        &pod(
            "oom",
            "{limits: {memory: 16Mi}}",
            "x=a; while :; do x=$x$x; done",
        ),
    );
    let p = k.wait_pod(&full("oom"), T, "OOMKilled", |p| {
        let c = container_status(p, "c");
        c.is_some_and(|c| {
            c["state"]["terminated"]["reason"] == "OOMKilled"
                || c["lastState"]["terminated"]["reason"] == "OOMKilled"
        })
    });
    assert_eq!(phase(&p), "Running", "restartPolicy Always restarts it");

    // Removing the pods stops their slices.
    for f in ["burst.yaml", "guar.yaml", "oom.yaml"] {
        k.remove_manifest(f);
    }
    let deadline = Instant::now() + T;
    while slices.iter().any(|s| cg(s).exists()) {
        assert!(
            Instant::now() < deadline,
            "pod slice left behind\n{}",
            k.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
