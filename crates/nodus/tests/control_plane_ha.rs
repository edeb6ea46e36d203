//! Two `nodus control-plane` processes on one etcd (Debian's, on free 127.0.0.1 ports),
//! sharing the cluster's certificates as a second kubeadm control plane does (a copy of
//! the first one's `pki/`), driven by the real kubectl: each of the `kube-scheduler` and
//! `kube-controller-manager` Leases has one holder, a Deployment created through the
//! second server gets its pods scheduled by whichever leads, and when the leader is killed
//! (SIGKILL by PID) the other takes both Leases and reconciles the next Deployment. A
//! second control plane on a data dir whose embedded store is in use fails before it
//! rewrites anything there; bad `--leader-elect-*` flags fail with client-go's messages.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::etcd::{Killer, control_plane, free_port, kubectl};
use nodus_control_plane::storage::EtcdServer;
use serde_json::Value;

const LEASES: [&str; 2] = ["kube-scheduler", "kube-controller-manager"];

/// Flags for both servers: the Node below has no kubelet, so it must stay Ready for the
/// length of the test.
const FLAGS: &[&str] = &[
    "--node-monitor-grace-period=10m",
    "--node-startup-grace-period=10m",
];

/// The identity a control plane elects with, from its log.
fn identity(cp: &Killer) -> String {
    let started = Instant::now();
    loop {
        let log = cp.log();
        if let Some(id) = log
            .lines()
            .find(|l| l.contains("leader election on"))
            .and_then(|l| l.split("identity=").nth(1))
            .and_then(|s| s.split_whitespace().next())
        {
            return id.to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no identity in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn get_json(kc: &Path, home: &Path, args: &[&str]) -> Option<Value> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    let (ok, out, _) = kubectl(kc, home, &all, None);
    ok.then(|| serde_json::from_str(&out).ok()).flatten()
}

/// Polls until `pred` holds for `kubectl get ARGS -o json`; panics with the last value.
fn wait_json(
    kc: &Path,
    home: &Path,
    args: &[&str],
    timeout: Duration,
    what: &str,
    logs: &dyn Fn() -> String,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let got = get_json(kc, home, args);
        if let Some(v) = &got
            && pred(v)
        {
            return v.clone();
        }
        assert!(
            started.elapsed() < timeout,
            "timed out waiting for {what}: {got:?}\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn holder(lease: &Value) -> &str {
    lease["spec"]["holderIdentity"].as_str().unwrap_or("")
}

fn deployment(name: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: 2\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      containers: [{{name: c, image: busybox}}]\n"
    )
}

/// The Deployment's pods, once `replicas` of them are bound to `node`.
fn wait_scheduled(kc: &Path, home: &Path, name: &str, node: &str, logs: &dyn Fn() -> String) {
    let sel = format!("app={name}");
    wait_json(
        kc,
        home,
        &["pods", "-l", &sel],
        Duration::from_secs(60),
        &format!("two pods of {name} scheduled to {node}"),
        logs,
        |v| {
            let items = v["items"].as_array().cloned().unwrap_or_default();
            items.len() == 2 && items.iter().all(|p| p["spec"]["nodeName"] == node)
        },
    );
}

#[test]
fn two_control_planes_on_one_etcd_elect_one_leader_and_fail_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let etcd = EtcdServer::start(&dir.path().join("etcd")).expect("etcd starts");
    let dir1 = dir.path().join("cp1");
    let mut cp1 = control_plane(&dir1, free_port(), &etcd.url(), FLAGS);
    // The second server trusts and is trusted by the same CA and signs service-account
    // tokens with the same key: a copy of the first one's PKI, as kubeadm's
    // `join --control-plane` copies it.
    let dir2 = dir.path().join("cp2");
    std::fs::create_dir_all(dir2.join("pki")).expect("pki dir");
    for f in std::fs::read_dir(dir1.join("pki")).expect("pki") {
        let f = f.expect("entry").path();
        std::fs::copy(&f, dir2.join("pki").join(f.file_name().expect("name"))).expect("copy");
    }
    let cp2 = control_plane(&dir2, free_port(), &etcd.url(), FLAGS);
    let (id1, id2) = (identity(&cp1), identity(&cp2));
    assert_ne!(id1, id2);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    assert!(id1.starts_with(&format!("{}_", host.trim())), "{id1}");
    let kc2 = dir2.join("admin.kubeconfig");
    let (log1, log2) = (cp1.log.clone(), cp2.log.clone());
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let logs = || format!("--- cp1:\n{}\n--- cp2:\n{}", read(&log1), read(&log2));

    // The first server took both Leases; they stay with it while the second one waits.
    for name in LEASES {
        wait_json(
            &kc2,
            &home,
            &["lease", "-n", "kube-system", name],
            Duration::from_secs(30),
            &format!("{name} held by the first server"),
            &logs,
            |l| holder(l) == id1,
        );
    }
    std::thread::sleep(Duration::from_secs(5));
    let (ok, out, err) = kubectl(&kc2, &home, &["get", "lease", "-n", "kube-system"], None);
    assert!(ok, "{err}");
    for name in LEASES {
        let row = out
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} not listed: {out}"));
        assert!(row.contains(&id1), "{row}");
    }
    for name in LEASES {
        let l = get_json(&kc2, &home, &["lease", "-n", "kube-system", name]).expect("lease");
        assert_eq!(holder(&l), id1, "{l}");
        assert_eq!(l["spec"]["leaseDurationSeconds"], 15, "{l}");
    }
    for (cp, id, leads) in [(&cp1, &id1, true), (&cp2, &id2, false)] {
        for name in LEASES {
            let took = cp.log().lines().any(|l| {
                l.contains("successfully acquired lease")
                    && l.contains(&format!("lease=kube-system/{name}"))
            });
            assert_eq!(took, leads, "{id} took {name}?\n{}", logs());
        }
    }

    // A Node without a kubelet, and a Deployment through the second server: the leader's
    // controllers make the pods, its scheduler binds them.
    let (ok, _, err) = kubectl(
        &kc2,
        &home,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\nstatus:\n  allocatable: {cpu: '4', memory: 4Gi, pods: '20'}\n  conditions:\n  - {type: Ready, status: 'True', reason: KubeletReady, message: kubelet is posting ready status}\n",
        ),
    );
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&kc2, &home, &["apply", "-f", "-"], Some(&deployment("a")));
    assert!(ok, "{err}");
    wait_scheduled(&kc2, &home, "a", "n1", &logs);
    let transitions: Vec<i64> = LEASES
        .iter()
        .map(|n| {
            get_json(&kc2, &home, &["lease", "-n", "kube-system", n]).expect("lease")["spec"]
                ["leaseTransitions"]
                .as_i64()
                .unwrap_or(0)
        })
        .collect();

    // The leader dies at once: the second server takes both Leases once they have not
    // been renewed for a lease duration by its clock (15 s + up to 2 retry periods with
    // jitter; the bound leaves room for a loaded machine).
    cp1.signal(nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    for (name, before) in LEASES.iter().zip(&transitions) {
        let l = wait_json(
            &kc2,
            &home,
            &["lease", "-n", "kube-system", name],
            Duration::from_secs(60),
            &format!("{name} taken over by the second server"),
            &logs,
            |l| holder(l) == id2,
        );
        assert_eq!(l["spec"]["leaseTransitions"], before + 1, "{l}");
    }
    eprintln!("both leases moved {:?} after SIGKILL", killed.elapsed());
    let events = get_json(
        &kc2,
        &home,
        &[
            "events",
            "-n",
            "kube-system",
            "--field-selector",
            "reason=LeaderElection",
        ],
    )
    .expect("events");
    let messages: Vec<&str> = events["items"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["message"].as_str()).collect())
        .unwrap_or_default();
    for (id, name) in [&id1, &id2]
        .into_iter()
        .flat_map(|id| LEASES.map(|n| (id, n)))
    {
        let want = format!("{id} became leader");
        assert!(
            events["items"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["message"] == want.as_str() && e["involvedObject"]["name"] == name),
            "no {want:?} about {name}: {messages:?}"
        );
    }

    // The new leader reconciles and schedules.
    let (ok, _, err) = kubectl(&kc2, &home, &["apply", "-f", "-"], Some(&deployment("b")));
    assert!(ok, "{err}");
    wait_scheduled(&kc2, &home, "b", "n1", &logs);
    assert!(
        cp2.log().contains("successfully acquired lease"),
        "{}",
        logs()
    );
    drop(cp2);
}

#[test]
fn a_graceful_stop_releases_the_leases() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let etcd = EtcdServer::start(&dir.path().join("etcd")).expect("etcd starts");
    let dir1 = dir.path().join("cp1");
    let mut cp1 = control_plane(&dir1, free_port(), &etcd.url(), &[]);
    let id1 = identity(&cp1);
    let kc = dir1.join("admin.kubeconfig");
    let logs = || cp1.log();
    for name in LEASES {
        wait_json(
            &kc,
            &home,
            &["lease", "-n", "kube-system", name],
            Duration::from_secs(30),
            &format!("{name} held"),
            &logs,
            |l| holder(l) == id1,
        );
    }
    cp1.signal(nix::sys::signal::Signal::SIGTERM);
    // A new server on the same etcd sees the Leases as released: holder cleared and a
    // one-second lease (client-go's ReleaseOnCancel), so it need not wait 15 s.
    let dir2 = dir.path().join("cp2");
    std::fs::create_dir_all(dir2.join("pki")).expect("pki dir");
    for f in std::fs::read_dir(dir1.join("pki")).expect("pki") {
        let f = f.expect("entry").path();
        std::fs::copy(&f, dir2.join("pki").join(f.file_name().expect("name"))).expect("copy");
    }
    let cp2 = control_plane(&dir2, free_port(), &etcd.url(), &["--leader-elect=false"]);
    let kc2 = dir2.join("admin.kubeconfig");
    for name in LEASES {
        let l = get_json(&kc2, &home, &["lease", "-n", "kube-system", name]).expect("lease");
        assert_eq!(holder(&l), "", "{l}\n{}", cp1.log());
        assert_eq!(l["spec"]["leaseDurationSeconds"], 1, "{l}");
    }
    assert!(
        !cp2.log().contains("leader election on"),
        "--leader-elect=false: {}",
        cp2.log()
    );
}

#[test]
fn a_second_control_plane_on_a_data_dir_in_use_fails_before_touching_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("cp");
    let log = dir.path().join("cp.log");
    let mut first = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["control-plane", "--data-dir"])
        .arg(&data)
        .args(["--secure-port", &free_port().to_string()])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("nodus control-plane");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(first.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("read");
    let first = Killer { child: first, log };
    assert!(line.contains("API server at"), "{line}\n{}", first.log());
    let kubeconfig = std::fs::read_to_string(data.join("admin.kubeconfig")).expect("kubeconfig");

    let out = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["control-plane", "--data-dir"])
        .arg(&data)
        .args(["--secure-port", &free_port().to_string()])
        .stdin(Stdio::null())
        .output()
        .expect("second nodus control-plane");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("store.redb: the store is open in another process"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("admin.kubeconfig")).expect("kubeconfig"),
        kubeconfig,
        "admin.kubeconfig was rewritten"
    );
    drop(first);
}

#[test]
fn leader_election_flags_are_checked_with_client_go_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (flags, want) in [
        (
            &["--leader-elect-renew-deadline=20s"][..],
            "invalid leader election configuration: leaseDuration must be greater than renewDeadline",
        ),
        (
            &["--leader-elect-retry-period=9s"][..],
            "invalid leader election configuration: renewDeadline must be greater than retryPeriod*JitterFactor",
        ),
        (
            &["--leader-elect-retry-period=soon"][..],
            "invalid --leader-elect-retry-period \"soon\"",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_nodus"))
            .args(["control-plane", "--data-dir"])
            .arg(dir.path().join("cp"))
            .args(["--secure-port", &free_port().to_string()])
            .args(flags)
            .stdin(Stdio::null())
            .output()
            .expect("nodus control-plane");
        assert!(!out.status.success(), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{flags:?}: {err}");
    }
    assert!(
        !dir.path().join("cp").join("admin.kubeconfig").exists(),
        "bad flags must fail before the data dir is written"
    );
}
