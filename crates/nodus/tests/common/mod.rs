//! Harness for end-to-end tests of the `nodus` binary: a real `nodus runtime` daemon on a
//! private socket and root dir, and CRI clients to it.
#![allow(dead_code)]

pub mod cluster;
pub mod etcd;
pub mod kubelet;
pub mod kubelet_api;
pub mod node;
pub mod up;

#[allow(unused_imports)] // not every test binary uses the node
pub use node::{BareNode, TestNode, container_config};

use cri::runtime::v1 as pb;
use nodus_crictl::Clients;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use testkit::daemon::Daemon;

/// Whether root-only tests can run. In CI (NODUS_TEST_REQUIRE_ROOT=1) not being root is a
/// failure, never a silent skip.
pub fn have_root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        if std::env::var_os("NODUS_TEST_REQUIRE_ROOT").is_some() {
            panic!("this test needs root and NODUS_TEST_REQUIRE_ROOT is set");
        }
        eprintln!("skipping: needs root");
    }
    root
}

/// Hard eviction thresholds for test nodes: upstream's memory threshold, disk signals off
/// (0%), as kind configures its nodes, so a build machine's nearly full disk does not put
/// every test node under DiskPressure and refuse its pods. Tests of eviction set their own.
pub const EVICTION_HARD_DISK_OFF: &str =
    "memory.available<100Mi,nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%";

pub fn nodus_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nodus"))
}

/// A `nodus runtime` daemon in its own temp dirs; killed by PID on drop.
pub struct Runtime {
    daemon: Option<Daemon>,
    netns: Option<std::sync::Arc<testkit::Netns>>,
    pub dir: tempfile::TempDir,
    pub config: Option<PathBuf>,
    starts: usize,
}

impl Runtime {
    pub fn start() -> Runtime {
        Self::start_with_config(None)
    }

    /// Starts with a runtime.toml holding `config` (TOML text).
    pub fn start_with_config(config: Option<&str>) -> Runtime {
        Self::start_full(config, None)
    }

    /// Starts inside a private network namespace (a test node), with `config`.
    pub fn start_full(
        config: Option<&str>,
        netns: Option<std::sync::Arc<testkit::Netns>>,
    ) -> Runtime {
        let dir = tempfile::Builder::new()
            .prefix("nodus-rt-")
            .tempdir()
            .expect("tempdir");
        // Always a config: at least this runtime's own NRI socket (NRI is on by default).
        let c = config.unwrap_or_default();
        let p = dir.path().join("runtime.toml");
        let text = testkit::runtime_config::private_nri(dir.path(), c) + c;
        std::fs::write(&p, text).expect("write config");
        let cfg = Some(p);
        let mut rt = Runtime {
            daemon: None,
            netns,
            dir,
            config: cfg,
            starts: 0,
        };
        rt.spawn();
        rt
    }

    /// Runs `nodus runtime` with a runtime.toml of exactly `config` and expects it to refuse
    /// to start: it must exit non-zero on its own within 30 s (a daemon that came up is
    /// killed by its pid and the test fails, saying it started with `what`) without leaving
    /// its socket. Returns its stderr.
    pub fn refused(config: &str, what: &str) -> String {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = dir.path().join("runtime.toml");
        std::fs::write(&cfg, config).expect("write config");
        let mut child = Command::new(nodus_bin())
            .arg("runtime")
            .arg("--listen")
            .arg(dir.path().join("nodus.sock"))
            .arg("--root-dir")
            .arg(dir.path().join("root"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--config")
            .arg(&cfg)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run nodus runtime");
        let mut status = None;
        for _ in 0..300 {
            if let Some(s) = child.try_wait().expect("wait for nodus runtime") {
                status = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("nodus runtime started with {what}");
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
            .expect("read stderr");
        let left = testkit::containerd::mounts_under(dir.path());
        for m in &left {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
        assert!(
            left.is_empty(),
            "nodus runtime refused to start with {what} but left {left:?} mounted"
        );
        assert!(
            !status.success(),
            "nodus runtime exited 0 with {what}: {err}"
        );
        assert!(
            !dir.path().join("nodus.sock").exists(),
            "nodus runtime left its socket behind with {what}"
        );
        err
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("nodus.sock")
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let mut cmd = match &self.netns {
            Some(ns) => ns.command(nodus_bin()).expect("command in netns"),
            None => Command::new(nodus_bin()),
        };
        cmd.arg("runtime")
            .arg("--listen")
            .arg(self.socket())
            .arg("--root-dir")
            .arg(self.root())
            .arg("--state-dir")
            .arg(self.dir.path().join("state"))
            .env("NODUS_LOG", "debug");
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        let log = self.dir.path().join(format!("runtime-{}.log", self.starts));
        let mut d = Daemon::spawn("nodus-runtime", cmd, &log, Duration::from_secs(5))
            .expect("spawn nodus runtime");
        let sock = self.socket();
        d.wait_ready(Duration::from_secs(30), || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        })
        .expect("nodus runtime did not come up");
        self.daemon = Some(d);
    }

    /// The daemon's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(Daemon::pid)
    }

    /// SIGKILL: a crash, not a shutdown.
    pub fn kill(&mut self) {
        if let Some(d) = self.daemon.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(d.pid() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            drop(d);
        }
    }

    pub fn restart(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
        self.spawn();
    }

    pub fn start_again(&mut self) {
        assert!(self.daemon.is_none(), "still running");
        self.spawn();
    }

    pub fn log(&self) -> String {
        self.daemon
            .as_ref()
            .map(|d| d.log_tail(200))
            .unwrap_or_default()
    }

    pub async fn clients(&self) -> Clients {
        connect(&self.endpoint()).await
    }

    /// Files left in the content store's ingest area (must be none when idle).
    pub fn ingest_leftovers(&self) -> Vec<PathBuf> {
        list_dir(&self.root().join("content").join("ingest"))
    }
}

impl Drop for Runtime {
    /// Whatever a failed test left running: the daemon, every shim and container it
    /// started (by the pids they recorded), pid-namespace inits, OCI runtime state and
    /// every mount under the test's directory. The temp dir itself goes after this.
    fn drop(&mut self) {
        self.kill();
        kill_runtime_leftovers(&self.dir.path().join("state"), self.dir.path());
    }
}

pub use testkit::leftovers::kill_runtime_leftovers;

pub fn list_dir(p: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(p)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

pub async fn connect(endpoint: &str) -> Clients {
    nodus_crictl::connect(endpoint, None, Duration::from_secs(10))
        .await
        .expect("connect to CRI endpoint")
}

pub fn spec(image: &str) -> Option<pb::ImageSpec> {
    Some(pb::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    })
}

pub async fn pull(c: &Clients, image: &str) -> Result<String, tonic::Status> {
    pull_with(c, image, None).await
}

pub async fn pull_with(
    c: &Clients,
    image: &str,
    auth: Option<pb::AuthConfig>,
) -> Result<String, tonic::Status> {
    c.image
        .clone()
        .pull_image(pb::PullImageRequest {
            image: spec(image),
            auth,
            sandbox_config: None,
        })
        .await
        .map(|r| r.into_inner().image_ref)
}

pub async fn status(c: &Clients, image: &str, verbose: bool) -> pb::ImageStatusResponse {
    c.image
        .clone()
        .image_status(pb::ImageStatusRequest {
            image: spec(image),
            verbose,
        })
        .await
        .expect("ImageStatus")
        .into_inner()
}

pub async fn list(c: &Clients) -> Vec<pb::Image> {
    c.image
        .clone()
        .list_images(pb::ListImagesRequest { filter: None })
        .await
        .expect("ListImages")
        .into_inner()
        .images
}

pub async fn remove(c: &Clients, image: &str) -> Result<(), tonic::Status> {
    c.image
        .clone()
        .remove_image(pb::RemoveImageRequest { image: spec(image) })
        .await
        .map(|_| ())
}

pub fn basic_auth(user: &str, pass: &str) -> pb::AuthConfig {
    pb::AuthConfig {
        username: user.into(),
        password: pass.into(),
        ..Default::default()
    }
}

/// Chain IDs of an image, from ImageStatus's verbose info.
pub async fn chain_ids(c: &Clients, image: &str) -> Vec<String> {
    let st = status(c, image, true).await;
    let info: serde_json::Value =
        serde_json::from_str(st.info.get("info").expect("verbose info")).expect("info json");
    info["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| l["chainID"].as_str().expect("chainID").to_string())
        .collect()
}
