//! A control plane for kubelet API tests: `nodus control-plane` inside the test node's
//! network namespace (so its 127.0.0.1 is the node's), with a static token file, the node's
//! kubeconfig and kubelet serving certificate issued from its CA, and helpers that run
//! kubectl and curl inside the namespace as a user on that node would.

use super::BareNode;
use super::kubelet::{Kubelet, NODE_NAME};
use super::nodus_bin;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;
use testkit::Netns;
use testkit::daemon::Daemon;

pub const API_PORT: u16 = 6443;
pub const KUBELET_PORT: u16 = 10250;
/// Bearer tokens of the static token file: a user bound to `cluster-admin` (as an operator
/// would bind one), and a node identity the Node authorizer refuses `nodes/proxy` of another
/// node.
pub const ALLOWED_TOKEN: &str = "alice-token-0123456789";
pub const DENIED_TOKEN: &str = "othernode-token-0123456789";

pub struct ControlPlane {
    daemon: Option<Daemon>,
    pub dir: tempfile::TempDir,
    netns: Arc<Netns>,
    home: PathBuf,
}

impl ControlPlane {
    pub fn start(netns: Arc<Netns>) -> ControlPlane {
        let dir = tempfile::Builder::new()
            .prefix("nodus-cp-")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        std::fs::write(
            dir.path().join("data/tokens.csv"),
            format!(
                "{ALLOWED_TOKEN},alice,1001,\"dev\"\n{DENIED_TOKEN},system:node:other,1002,\"system:nodes\"\n"
            ),
        )
        .unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let mut cmd = netns.command(nodus_bin()).expect("command in netns");
        cmd.args(["control-plane", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--bind-address", "127.0.0.1", "--secure-port"])
            .arg(API_PORT.to_string())
            .env("NODUS_LOG", "info");
        let log = dir.path().join("control-plane.log");
        let mut d = Daemon::spawn("nodus-control-plane", cmd, &log, Duration::from_secs(5))
            .expect("spawn control plane");
        let kc = dir.path().join("data/admin.kubeconfig");
        let ns = Arc::clone(&netns);
        d.wait_ready(Duration::from_secs(30), || {
            kc.exists() && ns.connect_tcp(([127, 0, 0, 1], API_PORT).into()).is_ok()
        })
        .expect("control plane did not come up");
        let cp = ControlPlane {
            daemon: Some(d),
            dir,
            netns,
            home,
        };
        cp.kubectl_ok(
            &[
                "create",
                "clusterrolebinding",
                "alice-cluster-admin",
                "--clusterrole=cluster-admin",
                "--user=alice",
            ],
            None,
        );
        cp
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{API_PORT}")
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.data().join("admin.kubeconfig")
    }

    pub fn ca(&self) -> PathBuf {
        self.data().join("pki/ca.crt")
    }

    /// The admin's client certificate and key (CN kubernetes-admin, O system:masters).
    pub fn admin_cert(&self) -> (PathBuf, PathBuf) {
        (
            self.data().join("pki/admin.crt"),
            self.data().join("pki/admin.key"),
        )
    }

    /// A kubelet on `node` joined to this control plane as [`NODE_NAME`] with
    /// [`Self::kubelet_flags`], plus `extra` flags.
    pub fn join_kubelet(&self, node: &BareNode, extra: &[String]) -> Kubelet {
        let mut flags = self.kubelet_flags(NODE_NAME);
        flags.extend(extra.iter().cloned());
        let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
        Kubelet::start(
            node.netns.clone(),
            &node.rt.endpoint(),
            &node.cgroup.path(),
            &refs,
        )
    }

    /// The kubelet flags that join it to this control plane with its own identity, a
    /// serving certificate from the cluster CA, client certificates checked against the CA,
    /// TokenReview authentication and SubjectAccessReview authorization.
    pub fn kubelet_flags(&self, node: &str) -> Vec<String> {
        let kc = nodus_control_plane::pki::issue_node_kubeconfig(&self.data(), node, &self.url())
            .expect("node kubeconfig");
        let (crt, key) = nodus_control_plane::pki::issue_kubelet_serving_cert(
            &self.data(),
            node,
            &["127.0.0.1".parse().unwrap()],
        )
        .expect("serving cert");
        let p = |p: &Path| p.display().to_string();
        vec![
            // The node's InternalIP, which the API server dials for logs/exec: the serving
            // certificate above names it.
            "--node-ip".into(),
            "127.0.0.1".into(),
            "--kubeconfig".into(),
            p(&kc),
            "--tls-cert-file".into(),
            p(&crt),
            "--tls-private-key-file".into(),
            p(&key),
            "--client-ca-file".into(),
            p(&self.ca()),
            "--authentication-token-webhook=true".into(),
            "--authorization-mode".into(),
            "Webhook".into(),
            "--anonymous-auth=false".into(),
        ]
    }

    /// `kubectl` as the admin, inside the namespace.
    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = self.netns.command("kubectl").expect("kubectl in netns");
        cmd.arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(args)
            .env("HOME", &self.home);
        cmd
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args)
            .stdin(Stdio::null())
            .output()
            .expect("run kubectl")
    }

    /// `kubectl` with `stdin`; panics with its stderr unless it succeeds.
    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write as _;
        let mut child = self
            .kubectl_cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl");
        if let (Some(mut s), Some(text)) = (child.stdin.take(), stdin) {
            s.write_all(text.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the kubelet's mirror pod `name` is in the API server with phase Running,
    /// as `kubectl port-forward` requires: the kubelet's status reaches a mirror pod only
    /// after the mirror pod exists (on the status manager's next round, as upstream's).
    pub fn wait_mirror_running(&self, name: &str, timeout: std::time::Duration) {
        let deadline = std::time::Instant::now() + timeout;
        let mut phase = String::new();
        while std::time::Instant::now() < deadline {
            let out = self.kubectl(&["get", "pod", name, "-o", "jsonpath={.status.phase}"]);
            phase = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && phase == "Running" {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        panic!(
            "mirror pod {name} did not appear Running (phase {phase:?})\n{}",
            self.log()
        );
    }

    /// curl inside the namespace; returns (HTTP code, body).
    pub fn curl(&self, args: &[&str]) -> (u16, String) {
        let mut cmd = self.netns.command("curl").expect("curl in netns");
        cmd.args(["-sS", "--max-time", "20", "--cacert"])
            .arg(self.ca())
            .args(["-w", "\n%{http_code}"])
            .args(args);
        let out = cmd.output().expect("run curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (
            code.trim().parse().unwrap_or(0),
            format!("{body}{}", String::from_utf8_lossy(&out.stderr)),
        )
    }

    pub fn log(&self) -> String {
        self.daemon
            .as_ref()
            .map(|d| d.log_tail(80))
            .unwrap_or_default()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
    }
}

/// A pod bound to the test node (`spec.nodeName`, so no scheduler) with one busybox
/// container `app` running `sh -c script`; `spec_extra` (indented two spaces) goes into the
/// pod spec, `container_extra` (indented four) into the container.
pub fn busybox_pod(name: &str, spec_extra: &str, script: &str, container_extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  nodeName: {NODE_NAME}
{spec_extra}  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {script:?}]
{container_extra}"#
    )
}
