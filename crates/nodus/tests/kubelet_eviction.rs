//! Node-pressure eviction and the prober metrics, end to end: a `nodus kubelet` joined to
//! `nodus control-plane` in the test node's network namespace, watched with the real kubectl.
//!
//! Pressure is made for real without touching the machine: the kubelet's root dir is a
//! small tmpfs of the test's own, the hard threshold is `nodefs.available<20Mi`, and a
//! static pod fills its emptyDir on that tmpfs until less than the threshold is left
//! (sized from what statvfs says at test time). The static pod is critical and stays;
//! the BestEffort pod from the API is evicted; a new BestEffort pod is refused while
//! DiskPressure holds; removing the file clears the pressure after the transition period.

mod common;

use common::BareNode;
use common::kubelet::{Kubelet, NODE_NAME, is_running};
use common::kubelet_api::ControlPlane;
use serde_json::Value;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);
const MI: u64 = 1 << 20;

fn api_pod(name: &str, extra: &str) -> String {
    common::kubelet_api::busybox_pod(name, "", "exec sleep 3600", extra)
}

fn hog_manifest(fill_mib: u64) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: hog
  namespace: default
spec:
  containers:
  - name: hog
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "dd if=/dev/zero of=/data/fill bs=1048576 count={fill_mib}; exec sleep 3600"]
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    emptyDir: {{}}
"#
    )
}

fn get_json(cp: &ControlPlane, args: &[&str]) -> Option<Value> {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend(["-o", "json"]);
    let out = cp.kubectl(&a);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// Polls `f` until it gives a value; panics naming `what` with the kubelet's log.
fn wait_for<T>(k: &Kubelet, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + T;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!(
                "{what} did not happen within {T:?}\nkubelet log:\n{}",
                k.log()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn node_condition(cp: &ControlPlane, type_: &str) -> Option<Value> {
    let node = get_json(cp, &["node", NODE_NAME])?;
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

fn events(cp: &ControlPlane) -> Vec<Value> {
    get_json(cp, &["events", "-A"])
        .and_then(|v| v["items"].as_array().cloned())
        .unwrap_or_default()
}

fn has_event(cp: &ControlPlane, object: &str, type_: &str, reason: &str) -> Option<Value> {
    events(cp).into_iter().find(|e| {
        e["involvedObject"]["name"] == object && e["type"] == type_ && e["reason"] == reason
    })
}

/// The tmpfs the kubelet's root dir lives on; detached by the kubelet's drop, or here when
/// the kubelet never started.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &std::path::Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            at,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size},mode=0755").as_str()),
        )
        .expect("mount tmpfs for the kubelet root dir");
        Tmpfs(at.to_path_buf())
    }

    fn available(&self) -> u64 {
        let s = nix::sys::statvfs::statvfs(&self.0).expect("statvfs");
        s.blocks_available() * s.fragment_size()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_pressure_evicts_a_best_effort_pod_spares_the_static_one_and_refuses_new_pods() {
    if !common::have_root() {
        return;
    }
    let node = BareNode::new("10.89.47.0/24");
    node.cgroup.create();
    let cp = ControlPlane::start(node.netns.clone());
    let dir = Kubelet::new_dir();
    let root = Tmpfs::mount(&dir.path().join("root"), "64m");
    let mut flags = cp.kubelet_flags(NODE_NAME);
    flags.extend(
        [
            "--eviction-hard",
            "nodefs.available<20Mi",
            "--eviction-pressure-transition-period",
            "10s",
            "--eviction-monitoring-interval",
            "1s",
            "--node-status-update-frequency",
            "1s",
        ]
        .map(String::from),
    );
    let flag_refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut k = Kubelet::start_in(
        dir,
        node.netns.clone(),
        &node.rt.endpoint(),
        &node.cgroup.path(),
        &flag_refs,
    );

    // No pressure yet: the node says so with upstream's reason.
    let c = wait_for(&k, "DiskPressure=False reported", || {
        node_condition(&cp, "DiskPressure").filter(|c| c["status"] == "False")
    });
    assert_eq!(c["reason"], "KubeletHasNoDiskPressure");
    assert_eq!(c["message"], "kubelet has no disk pressure");

    cp.kubectl_ok(&["create", "-f", "-"], Some(&api_pod("victim", "")));
    k.wait_pod("victim", T, "app running", |p| is_running(p, "app"));

    // Fill the tmpfs until 10Mi are left: below the 20Mi threshold.
    let avail = root.available();
    assert!(avail > 40 * MI, "tmpfs has {avail} bytes available");
    let fill = (avail - 10 * MI) / MI;
    k.write_manifest("hog.yaml", &hog_manifest(fill));
    let hog = format!("hog-{NODE_NAME}");

    let c = wait_for(&k, "DiskPressure=True reported", || {
        node_condition(&cp, "DiskPressure").filter(|c| c["status"] == "True")
    });
    assert_eq!(c["reason"], "KubeletHasDiskPressure");
    assert_eq!(c["message"], "kubelet has disk pressure");

    // The BestEffort API pod is evicted: Failed, reason Evicted, upstream's message, a
    // DisruptionTarget condition and a Warning event.
    let victim = wait_for(&k, "victim evicted", || {
        get_json(&cp, &["pod", "victim"]).filter(|p| p["status"]["reason"] == "Evicted")
    });
    assert_eq!(victim["status"]["phase"], "Failed", "{victim:#}");
    let message = victim["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "The node was low on resource: ephemeral-storage. Threshold quantity: 20Mi, available: "
        ),
        "{message}"
    );
    let dt = victim["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionTarget"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(dt["status"], "True", "{victim:#}");
    assert_eq!(dt["reason"], "TerminationByKubelet", "{victim:#}");
    let ev = wait_for(&k, "Evicted event", || {
        has_event(&cp, "victim", "Warning", "Evicted")
    });
    assert_eq!(ev["message"].as_str(), Some(message));
    wait_for(&k, "EvictionThresholdMet node event", || {
        has_event(&cp, NODE_NAME, "Warning", "EvictionThresholdMet")
    });

    // The static pod used more, yet is critical: it still runs.
    let h = k
        .pod(&hog)
        .expect("the static pod is still known to the kubelet");
    assert!(is_running(&h, "hog"), "{h:#}");
    assert_ne!(h["status"]["reason"], "Evicted", "{h:#}");

    // While DiskPressure holds, a new pod is refused at admission.
    cp.kubectl_ok(&["create", "-f", "-"], Some(&api_pod("late", "")));
    let late = wait_for(&k, "late pod rejected", || {
        get_json(&cp, &["pod", "late"]).filter(|p| p["status"]["phase"] == "Failed")
    });
    assert_eq!(late["status"]["reason"], "Evicted", "{late:#}");
    assert_eq!(
        late["status"]["message"], "The node had condition: [DiskPressure]. ",
        "{late:#}"
    );

    let (code, metrics) = k.get("/metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("kubelet_evictions_total{eviction_signal=\"nodefs.available\"} 1"),
        "{metrics}"
    );

    // A restarted kubelet takes the finished pods in as they are: nothing starts again.
    k.kill();
    k.start_again();
    let h = k.wait_pod(&hog, T, "static pod adopted", |p| is_running(p, "hog"));

    // Free the space: the pressure clears and, after the transition period, the node
    // reports no disk pressure again and admits pods.
    let out = common::kubelet::exec(&node.rt.endpoint(), &h, "hog", &["rm", "/data/fill"]).await;
    assert_eq!(out, "");
    let c = wait_for(&k, "DiskPressure=False again", || {
        node_condition(&cp, "DiskPressure").filter(|c| c["status"] == "False")
    });
    assert_eq!(c["reason"], "KubeletHasNoDiskPressure");
    cp.kubectl_ok(&["create", "-f", "-"], Some(&api_pod("after", "")));
    k.wait_pod("after", T, "app running", |p| is_running(p, "app"));
    let h = k.pod(&hog).expect("static pod");
    assert!(is_running(&h, "hog"), "{h:#}");
    // Long after the restart the finished pods are still finished, here and in the API.
    for name in ["victim", "late"] {
        let p = k.pod(name).expect("finished pod still known");
        assert_eq!(p["status"]["phase"], "Failed", "{p:#}");
        assert_eq!(p["status"]["reason"], "Evicted", "{p:#}");
        assert!(!is_running(&p, "app"), "{p:#}");
        let p = get_json(&cp, &["pod", name]).expect("pod in the API");
        assert_eq!(p["status"]["phase"], "Failed", "{p:#}");
        assert_eq!(p["status"]["reason"], "Evicted", "{p:#}");
    }
    drop(k);
    drop(root);
}

/// The prober counts every probe on `/metrics/probes`, reachable through the API server.
#[tokio::test(flavor = "multi_thread")]
async fn probe_results_are_counted_on_metrics_probes() {
    if !common::have_root() {
        return;
    }
    let node = BareNode::new("10.89.48.0/24");
    node.cgroup.create();
    let cp = ControlPlane::start(node.netns.clone());
    let k = cp.join_kubelet(&node, &[]);
    let probe = r#"    readinessProbe:
      exec:
        command: ["true"]
      periodSeconds: 1
"#;
    cp.kubectl_ok(&["create", "-f", "-"], Some(&api_pod("ready", probe)));
    let pod = k.wait_pod("ready", T, "ready", |p| {
        p["status"]["containerStatuses"][0]["ready"] == true
    });
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let path = format!("/api/v1/nodes/{NODE_NAME}/proxy/metrics/probes");
    let count = || -> Option<f64> {
        let text = cp.kubectl_ok(&["get", "--raw", &path], None);
        text.lines()
            .find(|l| {
                l.starts_with("prober_probe_total{")
                    && l.contains("probe_type=\"Readiness\"")
                    && l.contains("result=\"successful\"")
                    && l.contains("container=\"app\"")
                    && l.contains("pod=\"ready\"")
                    && l.contains("namespace=\"default\"")
                    && l.contains(&format!("pod_uid=\"{uid}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    let first = wait_for(&k, "a successful readiness probe counted", &count);
    assert!(first >= 1.0);
    wait_for(&k, "the count to go up", || count().filter(|n| *n > first));
    let text = cp.kubectl_ok(&["get", "--raw", &path], None);
    assert!(
        text.contains("prober_probe_duration_seconds_count{probe_type=\"Readiness\",container=\"app\",pod=\"ready\",namespace=\"default\"}"),
        "{text}"
    );
}

/// MemoryPressure from the node's real root memory cgroup: a hard threshold above the
/// machine's memory (read at test time) is met whatever the load, without using any. A
/// BestEffort pod is refused at admission, a Burstable one is admitted and then evicted for
/// memory; the static pod is critical and stays.
#[tokio::test(flavor = "multi_thread")]
async fn memory_pressure_refuses_best_effort_pods_and_evicts_the_others() {
    if !common::have_root() {
        return;
    }
    let mem_total: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("MemTotal")
        * 1024;
    let threshold_gi = mem_total.div_ceil(1 << 30) + 1;
    let node = BareNode::new("10.89.49.0/24");
    node.cgroup.create();
    let cp = ControlPlane::start(node.netns.clone());
    let k = cp.join_kubelet(
        &node,
        &[
            "--eviction-hard".to_string(),
            format!("memory.available<{threshold_gi}Gi"),
            "--eviction-monitoring-interval".into(),
            "1s".into(),
            "--node-status-update-frequency".into(),
            "1s".into(),
            // Allocatable memory is zero under such a threshold: nothing to cap kubepods at.
            "--enforce-node-allocatable".into(),
            "none".into(),
        ],
    );
    k.write_manifest(
        "guard.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: guard\n  namespace: default\nspec:\n  containers:\n  - name: guard\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"exec sleep 3600\"]\n",
    );
    let guard = format!("guard-{NODE_NAME}");
    k.wait_pod(&guard, T, "guard running", |p| is_running(p, "guard"));

    let c = wait_for(&k, "MemoryPressure=True reported", || {
        node_condition(&cp, "MemoryPressure").filter(|c| c["status"] == "True")
    });
    assert_eq!(c["reason"], "KubeletHasInsufficientMemory");
    assert_eq!(c["message"], "kubelet has insufficient memory available");

    cp.kubectl_ok(&["create", "-f", "-"], Some(&api_pod("be", "")));
    let be = wait_for(&k, "BestEffort pod rejected", || {
        get_json(&cp, &["pod", "be"]).filter(|p| p["status"]["phase"] == "Failed")
    });
    assert_eq!(be["status"]["reason"], "Evicted", "{be:#}");
    assert_eq!(
        be["status"]["message"], "The node had condition: [MemoryPressure]. ",
        "{be:#}"
    );

    // A CPU request alone makes it Burstable and fits the zero memory Allocatable.
    let requests = "    resources:\n      requests:\n        cpu: 10m\n";
    cp.kubectl_ok(&["create", "-f", "-"], Some(&api_pod("bu", requests)));
    let bu = wait_for(&k, "Burstable pod evicted", || {
        get_json(&cp, &["pod", "bu"]).filter(|p| p["status"]["reason"] == "Evicted")
    });
    assert_eq!(bu["status"]["phase"], "Failed", "{bu:#}");
    assert_eq!(bu["status"]["qosClass"], "Burstable", "{bu:#}");
    let message = bu["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "The node was low on resource: memory. Threshold quantity: {threshold_gi}Gi, available: "
        )),
        "{message}"
    );
    wait_for(&k, "Evicted event for bu", || {
        has_event(&cp, "bu", "Warning", "Evicted")
    });
    let g = k.pod(&guard).expect("static pod");
    assert!(is_running(&g, "guard"), "{g:#}");
    let (_, metrics) = k.get("/metrics");
    assert!(
        metrics.contains("kubelet_evictions_total{eviction_signal=\"memory.available\"}"),
        "{metrics}"
    );
}

/// PIDPressure from the machine's process table: a threshold above pid capacity (the
/// smaller of pid_max and threads-max, read at test time) is always met. Every
/// non-critical pod is refused, with the condition named.
#[tokio::test(flavor = "multi_thread")]
async fn pid_pressure_is_reported_and_refuses_pods() {
    if !common::have_root() {
        return;
    }
    let read = |p: &str| -> u64 { std::fs::read_to_string(p).unwrap().trim().parse().unwrap() };
    let capacity = read("/proc/sys/kernel/pid_max").min(read("/proc/sys/kernel/threads-max"));
    let node = BareNode::new("10.89.50.0/24");
    node.cgroup.create();
    let cp = ControlPlane::start(node.netns.clone());
    let k = cp.join_kubelet(
        &node,
        &[
            "--eviction-hard".to_string(),
            format!("pid.available<{}", capacity + 1000),
            "--eviction-monitoring-interval".into(),
            "1s".into(),
            "--node-status-update-frequency".into(),
            "1s".into(),
        ],
    );
    let c = wait_for(&k, "PIDPressure=True reported", || {
        node_condition(&cp, "PIDPressure").filter(|c| c["status"] == "True")
    });
    assert_eq!(c["reason"], "KubeletHasInsufficientPID");
    assert_eq!(c["message"], "kubelet has insufficient PID available");
    let other = node_condition(&cp, "DiskPressure").expect("DiskPressure");
    assert_eq!(other["status"], "False", "{other:#}");
    let requests = "    resources:\n      requests:\n        cpu: 10m\n";
    cp.kubectl_ok(&["create", "-f", "-"], Some(&api_pod("refused", requests)));
    let p = wait_for(&k, "pod refused", || {
        get_json(&cp, &["pod", "refused"]).filter(|p| p["status"]["phase"] == "Failed")
    });
    assert_eq!(p["status"]["reason"], "Evicted", "{p:#}");
    assert_eq!(
        p["status"]["message"], "The node had condition: [PIDPressure]. ",
        "{p:#}"
    );
}
