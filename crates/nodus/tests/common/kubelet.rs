//! A `nodus kubelet` under test: in the test node's network namespace, with its own root,
//! manifest and log directories, the node's cgroup parent as its cgroup root, and the
//! read-only port (inside the namespace) to read pod statuses from, as a user would.

use super::nodus_bin;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::Netns;
use testkit::daemon::Daemon;

pub const READ_ONLY_PORT: u16 = 10255;
pub const HEALTHZ_PORT: u16 = 10248;
pub const NODE_NAME: &str = "test-node";

pub struct Kubelet {
    daemon: Option<Daemon>,
    pub dir: tempfile::TempDir,
    netns: Arc<Netns>,
    endpoint: String,
    cgroup_root: String,
    extra: Vec<String>,
    starts: usize,
}

/// GET `path` from `127.0.0.1:port` inside `netns`.
pub fn http_get(netns: &Netns, port: u16, path: &str) -> std::io::Result<(u16, String)> {
    netns.http_get(port, path)
}

impl Kubelet {
    /// Starts a kubelet on `endpoint` (a CRI socket) with `extra` flags.
    pub fn start(netns: Arc<Netns>, endpoint: &str, cgroup_root: &str, extra: &[&str]) -> Kubelet {
        Kubelet::start_in(Kubelet::new_dir(), netns, endpoint, cgroup_root, extra)
    }

    /// A directory for [`Kubelet::start_in`]; its `root` subdirectory becomes --root-dir.
    pub fn new_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("nodus-kubelet-")
            .tempdir()
            .expect("tempdir")
    }

    /// [`Kubelet::start`] in a directory prepared by the caller (e.g. with a small
    /// filesystem mounted on `root`); mounts under it are detached when the kubelet drops.
    pub fn start_in(
        dir: tempfile::TempDir,
        netns: Arc<Netns>,
        endpoint: &str,
        cgroup_root: &str,
        extra: &[&str],
    ) -> Kubelet {
        std::fs::create_dir_all(dir.path().join("manifests")).unwrap();
        let mut k = Kubelet {
            daemon: None,
            dir,
            netns,
            endpoint: endpoint.to_string(),
            cgroup_root: cgroup_root.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            starts: 0,
        };
        k.spawn();
        k
    }

    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn logs_dir(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    /// Writes a manifest atomically (as an editor's rename would), so the kubelet never
    /// reads half a file.
    pub fn write_manifest(&self, file: &str, text: &str) {
        let tmp = self.dir.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.manifests().join(file)).unwrap();
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests().join(file)).unwrap();
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let mut cmd = self.netns.command(nodus_bin()).expect("command in netns");
        cmd.arg("kubelet")
            .arg("--container-runtime-endpoint")
            .arg(&self.endpoint)
            .arg("--root-dir")
            .arg(self.root())
            .arg("--pod-manifest-path")
            .arg(self.manifests())
            .arg("--pod-logs-dir")
            .arg(self.logs_dir())
            .arg("--cgroup-root")
            .arg(&self.cgroup_root)
            .arg("--hostname-override")
            .arg(NODE_NAME)
            .arg("--read-only-port")
            .arg(READ_ONLY_PORT.to_string())
            .args(&self.extra)
            .env("NODUS_LOG", "nodus_kubelet=debug,info");
        if !self.extra.iter().any(|a| a.starts_with("--eviction-hard")) {
            cmd.args(["--eviction-hard", super::EVICTION_HARD_DISK_OFF]);
        }
        let log = self.dir.path().join(format!("kubelet-{}.log", self.starts));
        let netns = Arc::clone(&self.netns);
        let mut d = Daemon::spawn("nodus-kubelet", cmd, &log, Duration::from_secs(5))
            .expect("spawn nodus kubelet");
        d.wait_ready(Duration::from_secs(30), || {
            http_get(&netns, READ_ONLY_PORT, "/healthz").is_ok()
        })
        .expect("nodus kubelet did not come up");
        self.daemon = Some(d);
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        if let Some(d) = self.daemon.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(d.pid() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            drop(d);
        }
    }

    pub fn start_again(&mut self) {
        assert!(self.daemon.is_none(), "still running");
        self.spawn();
    }

    pub fn log(&self) -> String {
        self.daemon
            .as_ref()
            .map(|d| d.log_tail(150))
            .unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(&self.netns, READ_ONLY_PORT, path).expect("GET from the kubelet")
    }

    pub fn healthz(&self) -> (u16, String) {
        http_get(&self.netns, HEALTHZ_PORT, "/healthz").expect("GET /healthz")
    }

    pub fn pods(&self) -> Vec<Value> {
        let (code, body) = self.get("/pods");
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("PodList JSON");
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// The pod named `name` (the static pod's full name, `<name>-test-node`).
    pub fn pod(&self, name: &str) -> Option<Value> {
        self.pods()
            .into_iter()
            .find(|p| p["metadata"]["name"] == name)
    }

    /// Waits until `pred` holds for pod `name`; panics with the pod and the log otherwise.
    pub fn wait_pod(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let p = self.pod(name);
            if let Some(p) = &p
                && pred(p)
            {
                return p.clone();
            }
            if Instant::now() > deadline {
                panic!(
                    "pod {name}: {what} did not happen within {timeout:?}\npod: {}\nkubelet log:\n{}",
                    serde_json::to_string_pretty(&p).unwrap_or_default(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until pod `name` is no longer reported.
    pub fn wait_gone(&self, name: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.pod(name).is_some() {
            if Instant::now() > deadline {
                panic!(
                    "pod {name} still reported after {timeout:?}\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.kill();
        for m in testkit::containerd::mounts_under(self.dir.path()) {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// The status of container `name` in a pod JSON.
pub fn container_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

pub fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

pub fn is_running(pod: &Value, container: &str) -> bool {
    container_status(pod, container).is_some_and(|c| c["state"]["running"].is_object())
}

pub fn condition<'a>(pod: &'a Value, type_: &str) -> Option<&'a str> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
}

/// Runs `cmd` in container `container` of `pod` (a pod JSON from the kubelet) through the
/// runtime at `endpoint`; returns its stdout, trimmed.
pub async fn exec(endpoint: &str, pod: &Value, container: &str, cmd: &[&str]) -> String {
    let id = container_status(pod, container).expect("container status")["containerID"]
        .as_str()
        .expect("a container id")
        .split_once("://")
        .map(|(_, id)| id.to_string())
        .expect("<runtime>://<id>");
    let c = super::connect(endpoint).await;
    let out = c
        .runtime
        .clone()
        .exec_sync(cri::runtime::v1::ExecSyncRequest {
            container_id: id,
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            // A bound, not a measure: an exec under the VM lane's emulation can take seconds.
            timeout: 60,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
