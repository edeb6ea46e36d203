//! RuntimeClass end to end, through `nodus up` and the real kubectl: the kubelet resolves a
//! class to its handler through the API (class `plain` runs on handler `runc`); the
//! RuntimeClass admission plugin refuses an unknown class and gives pods the class's
//! overhead, which the scheduler counts; the lesson's gVisor class (`handler: runsc`)
//! runs its pod under gVisor for real; and the volumes the kubelet writes are read-only in
//! the container.

mod common;

use common::cluster;
use common::up::Up;
use serde_json::Value;
use std::time::Duration;

fn pod(name: &str, extra_spec: &str, command: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
{extra_spec}  containers:
  - name: app
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {command:?}]
"#
    )
}

/// The milli-CPU the scheduler still has on the node: allocatable less every bound pod's
/// requests.
fn free_cpu_milli(up: &Up) -> i64 {
    let node = up.wait(&["get", "node", "rc-node", "-o", "json"], "node", |_| true);
    let alloc = node["status"]["allocatable"]["cpu"]
        .as_str()
        .expect("allocatable cpu");
    let milli = |s: &str| -> i64 {
        match s.strip_suffix('m') {
            Some(m) => m.parse().expect("milli cpu"),
            None => (s.parse::<f64>().expect("cpu") * 1000.0) as i64,
        }
    };
    let pods = up.wait(&["get", "pods", "-A", "-o", "json"], "pods", |_| true);
    let used: i64 = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["spec"]["nodeName"] == "rc-node")
        .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
        .flat_map(|p| {
            let overhead = p["spec"]["overhead"]["cpu"].as_str().map(milli);
            p["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c["resources"]["requests"]["cpu"].as_str().map(milli))
                .chain(overhead)
                .collect::<Vec<_>>()
        })
        .sum();
    milli(alloc) - used
}

/// Class name ≠ handler, an unknown class, overhead (admission, scheduler, describe) and
/// the read-only atomic-writer volumes, on one cluster.
#[test]
fn runtime_class_resolves_to_its_handler_and_its_overhead_is_counted() {
    if !common::have_root() {
        return;
    }
    let up = Up::start("nodus-rtclass", "10.99.93.0/24", "rc-node");

    // The class's name is not its handler: `plain` runs on runc.
    up.apply(
        "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: plain\nhandler: runc\n",
    );
    let (ok, table, err) = up.k(&["get", "runtimeclass", "plain"]);
    assert!(ok, "{err}");
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "HANDLER", "AGE"], "{table}");
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.split_whitespace().take(2).eq(["plain", "runc"])),
        "{table}"
    );
    let (ok, described, err) = up.k(&["describe", "runtimeclass", "plain"]);
    assert!(ok, "{err}");
    assert!(
        described.contains("Name:") && described.contains("plain"),
        "{described}"
    );
    assert!(
        described
            .lines()
            .any(|l| l.trim_start().starts_with("Handler:") && l.contains("runc")),
        "{described}"
    );
    up.apply(&pod(
        "on-plain",
        "  runtimeClassName: plain\n",
        "echo ran on plain; sleep 3600",
    ));
    up.running("on-plain");
    let (_, logs, _) = up.k(&["logs", "on-plain"]);
    assert!(logs.contains("ran on plain"), "{logs}");

    // A class that does not exist: refused by admission, with upstream's text.
    let err = up.create_fails(&pod("on-missing", "  runtimeClassName: missing\n", "true"));
    assert!(
        err.contains(
            r#"pods "on-missing" is forbidden: pod rejected: RuntimeClass "missing" not found"#
        ),
        "{err}"
    );

    // Overhead: set from the class, refused when a pod states another one.
    up.apply(
        "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: heavy\nhandler: runc\noverhead:\n  podFixed:\n    cpu: 500m\n    memory: 32Mi\n",
    );
    let err = up.create_fails(&pod(
        "wrong-overhead",
        "  runtimeClassName: heavy\n  overhead:\n    cpu: 100m\n",
        "true",
    ));
    assert!(
        err.contains("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"),
        "{err}"
    );
    // A pod that fits the node without the overhead but not with it stays Pending.
    let free = free_cpu_milli(&up);
    assert!(free > 600, "the node has {free}m of CPU free");
    let request = format!("{}m", free - 100);
    let with_request = |name: &str, class: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{class}  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: busybox\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n    resources:\n      requests:\n        cpu: {request}\n"
        )
    };
    up.apply(&with_request("too-heavy", "  runtimeClassName: heavy\n"));
    let p = up.wait(
        &["get", "pod", "too-heavy", "-o", "json"],
        "too-heavy unschedulable",
        |p| {
            cluster::condition(p, "PodScheduled")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "Unschedulable")
        },
    );
    assert_eq!(
        p["spec"]["overhead"],
        serde_json::json!({"cpu": "500m", "memory": "32Mi"}),
        "{p}"
    );
    let msg = cluster::condition(&p, "PodScheduled").unwrap()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(msg.contains("Insufficient cpu"), "{msg}");
    assert_eq!(p["status"]["phase"], "Pending");
    // The same requests without the class fit.
    let (ok, out, err) = up.k(&["delete", "pod", "too-heavy", "--wait=false"]);
    assert!(ok, "{out}{err}");
    up.apply(&with_request("fits", ""));
    let p = up.running("fits");
    assert_eq!(p["spec"]["nodeName"], "rc-node");
    let (ok, out, err) = up.k(&["delete", "pod", "fits", "--timeout=60s"]);
    assert!(ok, "{out}{err}");

    // The volumes the kubelet writes are read-only in the container.
    up.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  key: value\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: sec\nstringData:\n  key: value\n",
    );
    up.apply(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: volumes
  labels: {app: volumes}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    volumeMounts:
    - {name: cm, mountPath: /cm}
    - {name: sec, mountPath: /sec}
    - {name: info, mountPath: /info}
    - {name: proj, mountPath: /proj}
    - {name: scratch, mountPath: /scratch}
  volumes:
  - name: cm
    configMap: {name: cfg}
  - name: sec
    secret: {secretName: sec}
  - name: info
    downwardAPI:
      items:
      - path: labels
        fieldRef: {fieldPath: metadata.labels}
  - name: proj
    projected:
      sources:
      - configMap: {name: cfg}
  - name: scratch
    emptyDir: {}
"#,
    );
    up.running("volumes");
    for dir in [
        "/cm",
        "/sec",
        "/info",
        "/proj",
        "/var/run/secrets/kubernetes.io/serviceaccount",
    ] {
        let (ok, out, err) = up.k(&[
            "exec",
            "volumes",
            "--",
            "sh",
            "-c",
            &format!("echo x > {dir}/new"),
        ]);
        assert!(!ok, "writing to {dir} succeeded: {out}");
        assert!(err.contains("Read-only file system"), "{dir}: {err}");
    }
    let (ok, out, err) = up.k(&["exec", "volumes", "--", "sh", "-c", "echo x > /scratch/new"]);
    assert!(ok, "an emptyDir stays writable: {out}{err}");
    // ...and the kubelet still updates them.
    up.apply("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  key: changed\n");
    let mut seen = String::new();
    for _ in 0..200 {
        seen = up.k(&["exec", "volumes", "--", "cat", "/cm/key"]).1;
        if seen == "changed" {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(seen, "changed");
}

/// The lesson's manifest: RuntimeClass `gvisor` with handler `runsc` and a pod that names
/// it run under gVisor: its kernel is the Sentry (dmesg), the host sees the sandbox and
/// not the workload, and logs, exec and stats work through kubectl.
#[test]
fn gvisor_runs_the_lessons_pod() {
    if !common::have_root() {
        return;
    }
    if !std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|d| d.join("runsc").is_file())
    {
        assert!(
            std::env::var_os("NODUS_TEST_REQUIRE_ROOT").is_none(),
            "runsc is not installed (scripts/setup.sh installs it)"
        );
        return;
    }
    let up = Up::start("nodus-gvisor", "10.99.94.0/24", "rc-node");
    up.apply(
        r#"apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor
handler: runsc
---
apiVersion: v1
kind: Pod
metadata:
  name: sandboxed
spec:
  runtimeClassName: gvisor
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo hello from gvisor; exec sleep 98765"]
"#,
    );
    let p = up.running("sandboxed");
    let pod_ip = p["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(pod_ip.starts_with("10.99.94."), "{p}");

    let (ok, dmesg, err) = up.k(&["exec", "sandboxed", "--", "dmesg"]);
    assert!(
        ok,
        "{err}\n{}\n{}\n{}",
        up.k(&["get", "pod", "sandboxed", "-o", "yaml"]).1,
        up.shim_logs(),
        up.log()
    );
    assert!(dmesg.contains("Starting gVisor..."), "{dmesg}");
    let (_, logs, _) = up.k(&["logs", "sandboxed"]);
    assert!(logs.contains("hello from gvisor"), "{logs}");
    // The pod's own address, from the CNI-configured namespace.
    let (ok, addrs, err) = up.k(&["exec", "sandboxed", "--", "ip", "addr"]);
    assert!(ok && addrs.contains(&pod_ip), "{addrs}{err}");
    // `kubectl exec -it`: a terminal inside the sandbox (kubectl gets one from `script`).
    let kubeconfig = up.d().join("up/control-plane/admin.kubeconfig");
    let out = up
        .netns
        .command("script")
        .expect("script in netns")
        .args(["-qec"])
        .arg(format!(
            "kubectl --kubeconfig {} exec -it sandboxed -- sh -c 'test -t 0 && test -t 1 && echo is-a-terminal'",
            kubeconfig.display()
        ))
        .arg("/dev/null")
        .env("HOME", up.d())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script runs");
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && tty.contains("is-a-terminal"),
        "{tty}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An exit status comes back through exec.
    let (ok, _, err) = up.k(&["exec", "sandboxed", "--", "sh", "-c", "exit 3"]);
    assert!(!ok && err.contains("exit code 3"), "{err}");

    // The host: a runsc sandbox process, and no `sleep 98765` of the workload.
    let mut sandbox = false;
    let mut workload = false;
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let ours = cmd.contains(&up.d().display().to_string());
        if cmd.starts_with("runsc-sandbox") && ours {
            sandbox = true;
        }
        if cmd.contains("sleep 98765") {
            workload = true;
        }
    }
    assert!(sandbox, "no runsc-sandbox process on the host");
    assert!(!workload, "the workload's process is visible on the host");

    // What gVisor cannot do is refused, saying so.
    up.apply(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: sandboxed-privileged
spec:
  runtimeClassName: gvisor
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    securityContext: {privileged: true}
"#,
    );
    let p = up.wait(
        &["get", "pod", "sandboxed-privileged", "-o", "json"],
        "the privileged container refused",
        |p| {
            p["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("does not support privileged containers"))
        },
    );
    assert_eq!(p["status"]["phase"], "Pending");

    // Stats: the summary API reports the sandboxed container's memory.
    let (ok, summary, err) = up.k(&["get", "--raw", "/api/v1/nodes/rc-node/proxy/stats/summary"]);
    assert!(ok, "{err}");
    let summary: Value = serde_json::from_str(&summary).expect("summary JSON");
    let stats = summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["podRef"]["name"] == "sandboxed")
        .unwrap_or_else(|| panic!("no stats for the sandboxed pod: {summary}"));
    assert!(
        stats["containers"][0]["memory"]["workingSetBytes"]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{stats}"
    );

    let (ok, out, err) = up.k(&["delete", "pod", "sandboxed", "--timeout=60s"]);
    assert!(ok, "{out}{err}\n{}", up.log());
}
