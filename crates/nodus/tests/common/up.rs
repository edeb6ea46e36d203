//! `nodus up` (control plane and one node) in a network namespace of its own, with its
//! own cgroup parent and temp dirs, driven with the real kubectl; everything it started
//! is killed by PID on drop.

use super::cluster::{self, kubectl};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// `nodus crictl <args>` in `netns` against the node runtime of the `nodus up` whose data
/// dir is `<dir>/up`; its stdout, after asserting it succeeded.
pub fn crictl(netns: &testkit::Netns, dir: &Path, args: &[&str]) -> String {
    let out = netns
        .command(super::nodus_bin())
        .expect("crictl in netns")
        .arg("crictl")
        .arg("--runtime-endpoint")
        .arg(format!(
            "unix://{}",
            dir.join("up/node/run/nodus.sock").display()
        ))
        .args(args)
        .output()
        .expect("nodus crictl");
    assert!(out.status.success(), "crictl {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `nodus up` (control plane and one node) in a network namespace of its own.
pub struct Up {
    pub netns: Arc<testkit::Netns>,
    pub dir: tempfile::TempDir,
    /// The node's name (`--hostname-override`).
    pub node: String,
    daemon: Option<testkit::daemon::Daemon>,
    cgroup: Option<testkit::CgroupParent>,
}

impl Up {
    pub fn start(name: &str, subnet: &str, node: &str) -> Up {
        let netns = Arc::new(testkit::Netns::new(name).expect("netns"));
        let cgroup = testkit::CgroupParent::new(name);
        cgroup.create();
        cluster::add_node_address(&netns);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        cluster::prepare_node_dir(d, subnet, &d.join("up/node/runtime"));
        let mut cmd = netns.command(super::nodus_bin()).expect("command in netns");
        cmd.arg("up")
            .arg("--data-dir")
            .arg(d.join("up"))
            .arg("--")
            .arg("--runtime-config")
            .arg(d.join("runtime.toml"))
            .args(["--hostname-override", node])
            .arg("--pod-logs-dir")
            .arg(d.join("logs"))
            .args(["--cgroup-root", &cgroup.path()]);
        let daemon =
            testkit::daemon::Daemon::spawn(name, cmd, &d.join("up.log"), Duration::from_secs(10))
                .expect("spawn nodus up");
        let up = Up {
            netns,
            dir,
            node: node.to_string(),
            daemon: Some(daemon),
            cgroup: Some(cgroup),
        };
        up.wait(&["get", "node", node, "-o", "json"], "node Ready", |n| {
            cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True")
        });
        up
    }

    pub fn d(&self) -> &Path {
        self.dir.path()
    }

    pub fn k(&self, args: &[&str]) -> (bool, String, String) {
        let kubeconfig = self.d().join("up/control-plane/admin.kubeconfig");
        kubectl(&self.netns, &kubeconfig, self.d(), args, None)
    }

    pub fn apply(&self, yaml: &str) {
        let kubeconfig = self.d().join("up/control-plane/admin.kubeconfig");
        let (ok, out, err) = kubectl(
            &self.netns,
            &kubeconfig,
            self.d(),
            &["apply", "-f", "-"],
            Some(yaml),
        );
        assert!(ok, "kubectl apply: {out}{err}\n{yaml}");
    }

    pub fn create_fails(&self, yaml: &str) -> String {
        let kubeconfig = self.d().join("up/control-plane/admin.kubeconfig");
        let (ok, out, err) = kubectl(
            &self.netns,
            &kubeconfig,
            self.d(),
            &["create", "-f", "-"],
            Some(yaml),
        );
        assert!(!ok, "kubectl create should have failed: {out}");
        err
    }

    pub fn wait(&self, args: &[&str], what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let mut last = String::new();
        for _ in 0..400 {
            let (ok, out, err) = self.k(args);
            if ok
                && let Ok(v) = serde_json::from_str::<Value>(&out)
                && pred(&v)
            {
                return v;
            }
            last = format!("{out}{err}");
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("timed out waiting for {what}; last: {last}\n{}", self.log());
    }

    pub fn running(&self, pod: &str) -> Value {
        self.wait(
            &["get", "pod", pod, "-o", "json"],
            &format!("pod {pod} Running"),
            |p| p["status"]["phase"] == "Running",
        )
    }

    pub fn log(&self) -> String {
        testkit::daemon::log_tail(&self.d().join("up.log"), 150)
    }

    /// The shims' own logs and the OCI runtime's, for a failure message.
    pub fn shim_logs(&self) -> String {
        let mut out = String::new();
        for c in super::list_dir(&self.runtime_state().join("containers")) {
            for f in super::list_dir(&c.join("shim")) {
                if f.extension().is_some_and(|e| e == "log" || e == "json") {
                    out.push_str(&format!(
                        "== {}\n{}\n",
                        f.display(),
                        std::fs::read_to_string(&f).unwrap_or_default()
                    ));
                }
            }
        }
        out
    }

    pub fn runtime_state(&self) -> PathBuf {
        self.d().join("up/node/run/runtime")
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
        super::kill_runtime_leftovers(&self.runtime_state(), self.dir.path());
        drop(self.cgroup.take());
    }
}
