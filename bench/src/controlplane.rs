//! A `nodus control-plane` process for benchmarks: started on a free port over a temp
//! data dir, reached with kube-rs, killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

pub struct Server {
    pub child: Child,
    pub kubeconfig: PathBuf,
    pub data_dir: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Stops the server and hands back its data dir (to start again over the same store).
    pub fn stop(mut self) -> Option<tempfile::TempDir> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self._dir.take()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(bin: &Path) -> Result<Server> {
    start_with(bin, &[], None)
}

/// Starts `nodus control-plane` with `extra` flags, on a fresh temp dir or on `reuse`'s.
pub fn start_with(bin: &Path, extra: &[&str], reuse: Option<tempfile::TempDir>) -> Result<Server> {
    let dir = match reuse {
        Some(d) => d,
        None => tempfile::Builder::new()
            .prefix("bench-apiserver-")
            .tempdir()?,
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut child = Command::new(bin)
        .args(["control-plane", "--data-dir"])
        .arg(dir.path())
        .args(["--secure-port", &port.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut line = String::new();
    let stdout = child.stdout.take().context("stdout")?;
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
    if !line.contains("API server at") {
        bail!("control plane did not start: {line:?}");
    }
    Ok(Server {
        kubeconfig: dir.path().join("admin.kubeconfig"),
        data_dir: dir.path().to_path_buf(),
        child,
        _dir: Some(dir),
    })
}

pub async fn client(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    cfg.default_retry = false;
    Ok(kube::Client::try_from(cfg)?)
}
