//! Node join without secrets on the node, the parts that run without a node's namespaces:
//! `nodus token create|list` against a running control plane, and the kubelet's TLS
//! bootstrap turning that token into a `system:node:<name>` client certificate signed by
//! the cluster CA (the CSR approved and signed by the control plane's controllers), kept in
//! private files the written kubeconfig points at. Then the whole join with real nodes:
//! the control plane in one network namespace, a node in a second one linked to it, joining
//! with `--server --token --discovery-token-ca-cert-hash` only.

mod common;

use common::cluster::{self, ControlPlane, NodeProcess};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

fn nodus(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(args)
        .output()
        .expect("nodus runs")
}

fn kubectl(kubeconfig: &Path, home: &Path, args: &[&str]) -> std::process::Output {
    let bin = if Path::new("/usr/bin/kubectl").exists() {
        "/usr/bin/kubectl"
    } else {
        "kubectl"
    };
    Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("HOME", home)
        .output()
        .expect("kubectl runs")
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
}

/// A kubeconfig holding the server, the CA and a bootstrap token, as `nodus node --token`
/// writes after discovery.
fn bootstrap_kubeconfig(dir: &Path, server: &str, ca: &Path, token: &str) -> PathBuf {
    let p = dir.join("bootstrap-kubelet.kubeconfig");
    std::fs::write(
        &p,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
            ca.display()
        ),
    )
    .expect("bootstrap kubeconfig");
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_create_then_tls_bootstrap_yields_a_node_identity() {
    let cp_dir = tempfile::tempdir().expect("tempdir");
    let cfg = nodus_control_plane::ControlPlaneConfig::new(
        cp_dir.path(),
        "127.0.0.1".parse().expect("ip"),
        0,
    );
    let cp = nodus_control_plane::start(cfg)
        .await
        .expect("control plane");
    let data_dir = cp_dir.path().to_str().expect("utf-8").to_string();

    // `nodus token create` prints the token and the join line with the CA's hash.
    let out = tokio::task::spawn_blocking({
        let d = data_dir.clone();
        move || nodus(&["token", "create", "--ttl", "1h", "--data-dir", &d])
    })
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = stdout.lines();
    let token = lines.next().expect("token line").to_string();
    assert_eq!(token.len(), 23, "{stdout}");
    let ca = cp_dir.path().join("pki/ca.crt");
    let hash = nodus_control_plane::pki::ca_cert_hash(&std::fs::read_to_string(&ca).expect("ca"))
        .expect("hash");
    assert_eq!(
        lines.next().expect("join line"),
        format!(
            "nodus node --server {} --token {token} --discovery-token-ca-cert-hash {hash}",
            cp.url
        )
    );
    let out = tokio::task::spawn_blocking({
        let d = data_dir.clone();
        move || nodus(&["token", "list", "--data-dir", &d])
    })
    .await
    .expect("join");
    let list = String::from_utf8_lossy(&out.stdout).to_string();
    let row = list
        .lines()
        .find(|l| l.starts_with(&token))
        .unwrap_or_else(|| panic!("{token} not listed: {list}"));
    assert!(
        row.contains("authentication,signing")
            && row.contains("system:bootstrappers:kubeadm:default-node-token"),
        "{row}"
    );
    let bad = tokio::task::spawn_blocking({
        let d = data_dir.clone();
        move || nodus(&["token", "create", "NOT-A-TOKEN", "--data-dir", &d])
    })
    .await
    .expect("join");
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("does not match the pattern [a-z0-9]{6}.[a-z0-9]{16}"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    // The kubelet's TLS bootstrap with only the token and the CA certificate.
    let node_dir = tempfile::tempdir().expect("tempdir");
    let bootstrap = bootstrap_kubeconfig(node_dir.path(), &cp.url, &ca, &token);
    let kubeconfig = node_dir.path().join("kubelet.kubeconfig");
    let cert_dir = node_dir.path().join("pki");
    nodus_kubelet::certificate::bootstrap_client(&kubeconfig, &bootstrap, &cert_dir, "joiner")
        .await
        .expect("TLS bootstrap");
    let current = cert_dir.join("kubelet-client-current.pem");
    assert_eq!(mode(&kubeconfig), 0o600);
    assert_eq!(
        mode(&std::fs::canonicalize(&current).expect("target")),
        0o600
    );
    assert_eq!(mode(&cert_dir), 0o700);
    let home = node_dir.path().join("home");
    let who = tokio::task::spawn_blocking({
        let (k, h) = (kubeconfig.clone(), home.clone());
        move || {
            kubectl(
                &k,
                &h,
                &[
                    "auth",
                    "whoami",
                    "-o",
                    "jsonpath={.status.userInfo.username} {.status.userInfo.groups}",
                ],
            )
        }
    })
    .await
    .expect("join");
    assert!(
        who.status.success(),
        "{}",
        String::from_utf8_lossy(&who.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&who.stdout),
        "system:node:joiner [\"system:nodes\",\"system:authenticated\"]"
    );
    // No CA key and no admin credentials on the node.
    for entry in walk(node_dir.path()) {
        let text = std::fs::read_to_string(&entry).unwrap_or_default();
        assert!(!text.contains("system:masters"), "{}", entry.display());
        assert!(
            !entry.ends_with("ca.key") && !entry.ends_with("admin.kubeconfig"),
            "{}",
            entry.display()
        );
    }
    // The CSR is on record as the bootstrapper's, approved automatically.
    let csrs = tokio::task::spawn_blocking({
        let k = cp.kubeconfig.clone();
        let h = cp_dir.path().join("home");
        move || kubectl(&k, &h, &["get", "csr", "--no-headers"])
    })
    .await
    .expect("join");
    let csrs = String::from_utf8_lossy(&csrs.stdout).to_string();
    let id = token.split('.').next().expect("id");
    assert!(
        csrs.lines().any(|l| l.starts_with("node-csr-")
            && l.contains(&format!("system:bootstrap:{id}"))
            && l.trim_end().ends_with("Approved,Issued")),
        "{csrs}"
    );
    // A second start reuses the certificate: no new CSR.
    nodus_kubelet::certificate::bootstrap_client(&kubeconfig, &bootstrap, &cert_dir, "joiner")
        .await
        .expect("second start");
    assert_eq!(
        std::fs::read_dir(&cert_dir)
            .expect("cert dir")
            .filter(|e| e.as_ref().is_ok_and(|e| e
                .file_name()
                .to_string_lossy()
                .starts_with("kubelet-client-1")))
            .count(),
        1
    );
    cp.shutdown().await;
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

const T: Duration = Duration::from_secs(120);
const CP_IP: &str = "10.251.0.1";
const NODE_IP: &str = "10.251.0.2";

/// `nodus ARGS…` in `netns`, killed after 60 s: (exit status success, stdout, stderr).
fn nodus_in(netns: &testkit::Netns, args: &[&str]) -> (bool, String, String) {
    let out = netns
        .command("timeout")
        .expect("command in netns")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_nodus"))
        .args(args)
        .output()
        .expect("nodus runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn a_node_joins_from_another_namespace_with_a_token_and_serves_logs_and_exec() {
    if !common::have_root() {
        return;
    }
    let cp_ns = Arc::new(testkit::Netns::new("nodus-joincp").expect("netns"));
    let node_ns = Arc::new(testkit::Netns::new("nodus-joinnode").expect("netns"));
    cluster::link_namespaces(&cp_ns, CP_IP, &node_ns, NODE_IP);
    let cgroup = testkit::CgroupParent::new("nodus-join");
    cgroup.create();
    let cp = ControlPlane::start_bound(cp_ns.clone(), CP_IP.parse().expect("ip"), &[]);
    let data_dir = cp.data_dir();
    let data_dir = data_dir.to_str().expect("utf-8");

    let token = "kt6tj9.0123456789abcdef";
    let server = format!("https://{CP_IP}:{}", cluster::API_PORT);
    let hash = nodus_control_plane::pki::ca_cert_hash(
        &std::fs::read_to_string(cp.data_dir().join("pki/ca.crt")).expect("ca"),
    )
    .expect("hash");
    // A CA hash that is not the cluster's.
    let wrong = format!("sha256:{}", "0".repeat(64));
    // `nodus node` joining `servers` with `token` and `wrong`, its output in a log file.
    let discovery = |servers: &str, timeout: &str| {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = node_ns
            .command(env!("CARGO_BIN_EXE_nodus"))
            .expect("command in netns");
        cmd.arg("node")
            .arg("--data-dir")
            .arg(dir.path())
            .args(["--server", servers, "--token", token])
            .args(["--discovery-token-ca-cert-hash", &wrong])
            .args(["--discovery-timeout", timeout])
            .args(["--hostname-override", "impostor", "--root-dir"])
            .arg(dir.path().join("kubelet"));
        let log = dir.path().join("log");
        let d = testkit::daemon::Daemon::spawn("nodus node", cmd, &log, Duration::from_secs(5))
            .expect("nodus node runs");
        (dir, d)
    };
    let failed = |(dir, mut d): (tempfile::TempDir, testkit::daemon::Daemon)| {
        let status = d
            .wait_exit(Duration::from_secs(90))
            .expect("discovery ends");
        let err = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
        assert!(!status.success(), "discovery did not fail: {err}");
        err
    };

    // A token cluster-info is not signed for: discovery reads again, at every server given
    // (one of them down), until its timeout.
    let dead = "https://127.0.0.1:1";
    let err = failed(discovery(&format!("{dead},{server}"), "1s"));
    assert!(
        err.contains(&format!(
            "token discovery at {dead}, {server} did not succeed within --discovery-timeout (1s)"
        ))
            && err.contains("there is no JWS signed token in the cluster-info ConfigMap. This token id \"kt6tj9\" is invalid for this cluster"),
        "{err}"
    );

    // Discovery that started before the token existed waits for the signer's signature,
    // then refuses the wrong CA hash before anything starts.
    let mut waiting = discovery(&server, "60s");
    let log = waiting.0.path().join("log");
    waiting
        .1
        .wait_ready(Duration::from_secs(60), || {
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("discovery: will try again"))
        })
        .expect("discovery tries again while the token is unsigned");
    let (ok, out, err) = nodus_in(&cp_ns, &["token", "create", token, "--data-dir", data_dir]);
    assert!(ok, "token create: {err}");
    assert_eq!(out.lines().next(), Some(token));
    assert_eq!(
        out.lines().nth(1),
        Some(
            format!(
                "nodus node --server {server} --token {token} --discovery-token-ca-cert-hash {hash}"
            )
            .as_str()
        )
    );
    let err = failed(waiting);
    assert!(
        err.contains("--discovery-token-ca-cert-hash: the cluster CA found in cluster-info"),
        "{err}"
    );
    assert!(
        cp.get_json(&["node", "impostor"]).is_none(),
        "a node joined with a wrong CA hash"
    );

    // The real join: the server, the token and the CA hash, nothing else.
    let node = NodeProcess::start_with_credentials(
        &node_ns,
        &[
            "--server".as_ref(),
            server.as_ref(),
            "--token".as_ref(),
            token.as_ref(),
            "--discovery-token-ca-cert-hash".as_ref(),
            hash.as_ref(),
        ],
        "joiner",
        "10.99.81.0/24",
        &cgroup.path(),
    );
    let logs = || node.log();
    let ready = |n: &serde_json::Value| {
        cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True")
    };
    let n = cp.wait_json(&["node", "joiner"], T, "joined node Ready", &logs, ready);
    assert!(
        n["status"]["addresses"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["address"] == NODE_IP)),
        "{n}"
    );

    // Nothing on the node that could act as the cluster: no CA key, no admin identity.
    let ca_key = std::fs::read_to_string(cp.data_dir().join("pki/ca.key")).expect("ca key");
    let ca_key = ca_key.trim();
    for f in walk(node.dir.path()) {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        assert!(
            name != "ca.key" && name != "admin.kubeconfig",
            "{}",
            f.display()
        );
        let text = std::fs::read(&f).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        assert!(
            !text.contains(ca_key) && !text.contains("system:masters"),
            "{}",
            f.display()
        );
    }

    // Its client and serving certificates both came from CSRs the control plane signed.
    let (ok, csrs, err) = cp.kubectl(&["get", "csr", "--no-headers"]);
    assert!(ok, "{err}");
    let id = token.split('.').next().expect("id");
    assert!(
        csrs.lines().any(
            |l| l.contains("kubernetes.io/kube-apiserver-client-kubelet")
                && l.contains(&format!("system:bootstrap:{id}"))
                && l.trim_end().ends_with("Approved,Issued")
        ),
        "{csrs}"
    );
    assert!(
        csrs.lines()
            .any(|l| l.contains("kubernetes.io/kubelet-serving")
                && l.contains("system:node:joiner")
                && l.trim_end().ends_with("Approved,Issued")),
        "{csrs}"
    );

    // A pod the scheduler places there runs, and the API server reaches its kubelet.
    cp.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: on-joiner\n  namespace: default\nspec:\n  nodeSelector: {kubernetes.io/hostname: joiner}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"echo hello from the joined node; sleep 3600\"]\n",
    );
    cp.wait_json(
        &["pod", "on-joiner", "-n", "default"],
        T,
        "pod on the joined node Running",
        &logs,
        |p| p["spec"]["nodeName"] == "joiner" && p["status"]["phase"] == "Running",
    );
    let deadline = std::time::Instant::now() + T;
    loop {
        let (ok, out, err) = cp.kubectl(&["logs", "on-joiner", "-n", "default"]);
        if ok && out.contains("hello from the joined node") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl logs: {out}{err}\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (ok, out, err) = cp.kubectl(&["exec", "on-joiner", "-n", "default", "--", "hostname"]);
    assert!(ok, "kubectl exec: {err}\n{}", node.log());
    assert_eq!(out.trim(), "on-joiner");
    let (ok, _, _) = cp.kubectl(&[
        "delete",
        "pod",
        "on-joiner",
        "-n",
        "default",
        "--wait=false",
    ]);
    assert!(ok);
}
