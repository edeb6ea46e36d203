//! The lesson's lab steps 5 and 6 against a nodus node: QoS classes derived from requests
//! and limits, each pod in its QoS tier's cgroup, a memory limit read back from inside the
//! container, CPU throttling without a kill, an OOM kill reported as OOMKilled, pods beyond
//! Allocatable rejected, and `kubepods` capped at Allocatable. The same checks hold on a
//! cgroup v1 host (this machine) and on a cgroup v2 host (the VM lane): `Files` names each
//! value's file in the hierarchy found.

mod common;

use common::BareNode;
use common::kubelet::{Kubelet, NODE_NAME, container_status, exec, is_running, phase};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Generous: the VM lane runs this under emulation, where a first sandbox can take 40 s.
const T: Duration = Duration::from_secs(180);

fn full(name: &str) -> String {
    format!("{name}-{NODE_NAME}")
}

fn v2() -> bool {
    std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// A cgroup's directory for `controller`: per controller on v1, one tree on v2.
fn cg(controller: &str, path: &str) -> PathBuf {
    let base = PathBuf::from("/sys/fs/cgroup");
    let base = if v2() { base } else { base.join(controller) };
    base.join(path.trim_start_matches('/'))
}

/// Where each value the test reads lives, and how it is written, in this host's hierarchy.
struct Files;

impl Files {
    fn memory_limit() -> (&'static str, &'static str) {
        if v2() {
            ("memory", "memory.max")
        } else {
            ("memory", "memory.limit_in_bytes")
        }
    }
    /// The quota of a 100m limit with upstream's 100 ms period.
    fn cpu_quota_100m() -> (&'static str, &'static str, &'static str) {
        if v2() {
            ("cpu", "cpu.max", "10000 100000")
        } else {
            ("cpu", "cpu.cfs_quota_us", "10000")
        }
    }
    /// The relative CPU weight file and the value for `shares` (v2 converts shares to
    /// cpu.weight as the kubelet's libcontainer does).
    fn cpu_weight(shares: u64) -> (&'static str, &'static str, String) {
        if v2() {
            let weight = nodus_cgroups::shares_to_weight(shares);
            ("cpu", "cpu.weight", weight.to_string())
        } else {
            ("cpu", "cpu.shares", shares.to_string())
        }
    }
    /// The limit as a process inside the container reads it (cgroup namespace).
    fn memory_limit_inside() -> &'static str {
        if v2() {
            "/sys/fs/cgroup/memory.max"
        } else {
            "/sys/fs/cgroup/memory/memory.limit_in_bytes"
        }
    }
}

fn pod(name: &str, resources: &str, command: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", \"{command}\"]\n    resources: {resources}\n"
    )
}

fn mem_total() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap()
        * 1024
}

#[tokio::test(flavor = "multi_thread")]
async fn qos_classes_tiers_limits_throttling_oom_and_allocatable() {
    if !common::have_root() {
        return;
    }
    let node = BareNode::new("10.88.20.0/24");
    node.cgroup.create();
    let root = node.cgroup.path();
    let k = Kubelet::start(node.netns.clone(), &node.rt.endpoint(), &root, &[]);

    // kubepods is capped at Allocatable: MemTotal minus the default hard eviction 100Mi.
    let kubepods = format!("{root}/kubepods");
    let (mc, mf) = Files::memory_limit();
    let cap: i64 = std::fs::read_to_string(cg(mc, &kubepods).join(mf))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let expected = mem_total() - (100 << 20);
    // The kernel rounds limits down to whole pages.
    assert!(
        (expected - cap).abs() < 4096,
        "kubepods limit {cap}, want {expected}"
    );
    for tier in ["burstable", "besteffort"] {
        assert!(
            cg("memory", &format!("{kubepods}/{tier}")).is_dir(),
            "{tier} tier"
        );
    }

    k.write_manifest("be.yaml", &pod("be", "{}", "exec sleep 3600"));
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
            "while :; do :; done",
        ),
    );
    let mut uids = std::collections::HashMap::new();
    for (name, qos, tier) in [
        ("be", "BestEffort", "kubepods/besteffort"),
        ("burst", "Burstable", "kubepods/burstable"),
        ("guar", "Guaranteed", "kubepods"),
    ] {
        let p = k.wait_pod(&full(name), T, "running", |p| is_running(p, "c"));
        assert_eq!(p["status"]["qosClass"], qos, "{name}");
        let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
        let dir = cg("cpu", &format!("{root}/{tier}/pod{uid}"));
        assert!(dir.is_dir(), "{name}: {} missing", dir.display());
        uids.insert(name, (uid, p));
    }
    // Pod-level values: shares from requests; the Guaranteed pod's limits.
    let (guid, guar) = &uids["guar"];
    let gdir = format!("{root}/kubepods/pod{guid}");
    let read = |c: &str, p: &str, f: &str| {
        std::fs::read_to_string(cg(c, p).join(f))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(read(mc, &gdir, mf), "67108864");
    let (qc, qf, quota) = Files::cpu_quota_100m();
    assert_eq!(read(qc, &gdir, qf), quota);
    let (wc, wf, w102) = Files::cpu_weight(102);
    assert_eq!(read(wc, &gdir, wf), w102);
    let (buid, _) = &uids["burst"];
    assert_eq!(
        read(wc, &format!("{root}/kubepods/burstable/pod{buid}"), wf),
        w102
    );
    assert_eq!(read(wc, &format!("{kubepods}/burstable"), wf), w102);
    let (_, _, w2) = Files::cpu_weight(2);
    assert_eq!(read(wc, &format!("{kubepods}/besteffort"), wf), w2);

    // Lab step 6: the limit read back from inside the container.
    let inside = exec(
        &node.rt.endpoint(),
        guar,
        "c",
        &["cat", Files::memory_limit_inside()],
    )
    .await;
    assert_eq!(inside, "67108864");

    // The CPU-limited spinner is throttled, not killed.
    let deadline = Instant::now() + T;
    loop {
        let stat = read("cpu", &gdir, "cpu.stat");
        let throttled: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if throttled > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "never throttled: {stat}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let p = k.pod(&full("guar")).unwrap();
    assert!(is_running(&p, "c"));
    assert_eq!(container_status(&p, "c").unwrap()["restartCount"], 0);

    // Over its memory limit: OOM-killed and reported so.
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

    // Beyond Allocatable: rejected with upstream's reason, never run.
    k.write_manifest(
        "huge.yaml",
        &pod("huge", "{requests: {cpu: \"1000\"}}", "exec sleep 3600"),
    );
    let p = k.wait_pod(&full("huge"), T, "rejected", |p| phase(p) == "Failed");
    assert_eq!(p["status"]["reason"], "OutOfcpu");
    let msg = p["status"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("Pod was rejected: Node didn't have enough resource: cpu, requested: 1000000, used: 200, capacity: "),
        "{msg}"
    );

    // Removing the pods removes their cgroups.
    for f in [
        "be.yaml",
        "burst.yaml",
        "guar.yaml",
        "oom.yaml",
        "huge.yaml",
    ] {
        k.remove_manifest(f);
    }
    let deadline = Instant::now() + T;
    while cg("cpu", &gdir).exists() {
        assert!(
            Instant::now() < deadline,
            "pod cgroup left behind\n{}",
            k.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_cgroup_settings_are_refused_with_the_field() {
    if !common::have_root() {
        return;
    }
    let run = |args: &[&str]| {
        let out = std::process::Command::new(common::nodus_bin())
            .arg("kubelet")
            .args(["--container-runtime-endpoint", "unix:///nonexistent.sock"])
            .args(["--healthz-port", "0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let e = run(&["--root-dir", root, "--cgroup-root", "/nodus-no-such-root-x"]);
    assert!(
        e.contains("cgroup-root \"/nodus-no-such-root-x\" doesn't exist"),
        "{e}"
    );
    let e = run(&["--root-dir", root, "--kube-reserved", "memory=100Mx"]);
    assert!(
        e.contains("kubeReserved: invalid quantity \"100Mx\" for memory"),
        "{e}"
    );
    let e = run(&["--root-dir", root, "--system-reserved", "cpu=-1"]);
    assert!(
        e.contains("systemReserved: cpu must not be negative"),
        "{e}"
    );
    // This host does not run systemd (the VM lane's guest does: kubelet_systemd.rs).
    if !std::path::Path::new("/run/systemd/system").is_dir() {
        let e = run(&["--root-dir", root, "--cgroup-driver", "systemd"]);
        assert!(
            e.contains("cgroupDriver \"systemd\": systemd cgroup driver: systemd is not the running init (no /run/systemd/system)"),
            "{e}"
        );
    }
    let e = run(&["--root-dir", root, "--cgroup-driver", "sytemd"]);
    assert!(
        e.contains(
            "cgroupDriver \"sytemd\" is invalid: supported values: \"cgroupfs\", \"systemd\""
        ),
        "{e}"
    );
    let e = run(&[
        "--root-dir",
        root,
        "--enforce-node-allocatable",
        "pods,kube-reserved",
    ]);
    assert!(e.contains("kubeReservedCgroup is not set"), "{e}");
}
