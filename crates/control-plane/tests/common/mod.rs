//! Shared harness: an in-process control plane on 127.0.0.1:0 with a temp data dir, and
//! the real kubectl run against its admin kubeconfig.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nodus_control_plane::apiserver::state::ApiConfig;
use nodus_control_plane::{ControlPlaneConfig, ServerHandle};
use tokio::io::AsyncWriteExt;

pub struct Cluster {
    pub handle: ServerHandle,
    pub dir: tempfile::TempDir,
}

pub async fn start() -> Cluster {
    start_with(ApiConfig::default()).await
}

pub async fn start_with(api: ApiConfig) -> Cluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = start_in(dir.path(), api).await;
    Cluster { handle, dir }
}

pub async fn start_in(dir: &Path, api: ApiConfig) -> ServerHandle {
    start_configured(dir, api, Default::default()).await
}

/// A control plane with the scheduler's and controllers' knobs set (shorter grace periods).
pub async fn start_with_controllers(
    controllers: nodus_control_plane::controllers::ControllersConfig,
) -> Cluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = start_configured(dir.path(), ApiConfig::default(), controllers).await;
    Cluster { handle, dir }
}

pub async fn start_configured(
    dir: &Path,
    api: ApiConfig,
    controllers: nodus_control_plane::controllers::ControllersConfig,
) -> ServerHandle {
    let mut cfg = ControlPlaneConfig::new(dir, "127.0.0.1".parse().expect("ip"), 0);
    cfg.api = api;
    cfg.controllers = controllers;
    nodus_control_plane::start(cfg)
        .await
        .expect("control plane starts")
}

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert_eq!(
            self.code, 0,
            "kubectl failed: stdout={} stderr={}",
            self.stdout, self.stderr
        );
        assert_eq!(self.stderr, "", "kubectl printed on stderr");
        &self.stdout
    }
    #[track_caller]
    pub fn fails(&self) -> &str {
        assert_ne!(
            self.code, 0,
            "kubectl unexpectedly succeeded: {}",
            self.stdout
        );
        &self.stderr
    }
}

pub fn kubectl_bin() -> PathBuf {
    for p in ["/usr/bin/kubectl", "/usr/local/bin/kubectl"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    PathBuf::from("kubectl")
}

impl Cluster {
    pub fn kubeconfig(&self) -> &Path {
        &self.handle.kubeconfig
    }

    pub async fn kubectl(&self, args: &[&str]) -> Out {
        self.kubectl_stdin(args, None).await
    }

    pub async fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Out {
        kubectl_with(self.kubeconfig(), args, stdin).await
    }

    pub async fn apply(&self, yaml: &str) -> Out {
        self.kubectl_stdin(&["apply", "-f", "-"], Some(yaml)).await
    }

    pub async fn apply_server_side(&self, yaml: &str) -> Out {
        self.kubectl_stdin(&["apply", "--server-side", "-f", "-"], Some(yaml))
            .await
    }

    pub async fn client(&self) -> kube::Client {
        client_for(self.kubeconfig()).await
    }
}

pub async fn kubectl_with(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Out {
    let home = kubeconfig
        .parent()
        .unwrap_or(Path::new("/tmp"))
        .join("home");
    let _ = std::fs::create_dir_all(&home);
    let mut cmd = tokio::process::Command::new(kubectl_bin());
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        // A private HOME keeps kubectl's discovery cache per test.
        .env("HOME", &home)
        .env("KUBECACHEDIR", home.join("cache"))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("kubectl runs");
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).await.expect("write stdin");
        drop(pipe);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("kubectl finished in time")
        .expect("kubectl output");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub async fn client_for(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig parses");
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("kube config");
    // Tests look at the server's first answer (a 429 must not be retried for minutes).
    cfg.default_retry = false;
    kube::Client::try_from(cfg).expect("kube client")
}

/// Polls `f` every 100 ms until it returns `Some`, for up to `tries` × 100 ms; panics
/// naming `what` otherwise.
pub async fn eventually_n<F, Fut, T>(what: &str, tries: usize, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..tries {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// [`eventually_n`] with a 30 s budget.
pub async fn eventually<F, Fut, T>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_n(what, 300, f).await
}
