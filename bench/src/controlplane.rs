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

/// The pod every create benchmark writes (one container, no node: nothing runs it).
pub fn bench_pod(name: &str) -> Result<k8s_openapi::api::core::v1::Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "app", "image": "busybox", "command": ["sleep", "3600"]}]}
    }))?)
}

/// Creates `prefix-0` … `prefix-<n-1>` in `default`, one after another.
pub async fn create_pods(c: kube::Client, prefix: String, n: usize) -> Result<()> {
    use kube::api::{Api, PostParams};
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c, "default");
    for i in 0..n {
        api.create(
            &PostParams::default(),
            &bench_pod(&format!("{prefix}-{i}"))?,
        )
        .await?;
    }
    Ok(())
}

/// Pods created one after another by one client.
pub const SINGLE: usize = 1_000;
/// Concurrent clients, each on its own connection, and the pods each creates.
pub const CONCURRENT: usize = 8;
pub const PER_CLIENT: usize = 250;

/// The API server benchmark's create workload: pods created per second by `clients[0]`
/// alone ([`SINGLE`] pods in a row), then by all of them at once ([`PER_CLIENT`] each).
/// Names start with `prefix`, so the workload can run again on the same server.
pub async fn create_rates(clients: &[kube::Client], prefix: &str) -> Result<(f64, f64)> {
    use std::time::Instant;
    let first = clients.first().context("no client")?;
    let t = Instant::now();
    create_pods(first.clone(), format!("{prefix}single"), SINGLE).await?;
    let single = SINGLE as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut tasks = Vec::new();
    for (k, c) in clients.iter().enumerate() {
        tasks.push(tokio::spawn(create_pods(
            c.clone(),
            format!("{prefix}conc{k}"),
            PER_CLIENT,
        )));
    }
    for task in tasks {
        task.await??;
    }
    let concurrent = (clients.len() * PER_CLIENT) as f64 / t.elapsed().as_secs_f64();
    Ok((single, concurrent))
}

/// Fills the store up to `total` pods after [`create_rates`] made its share, the rest spread
/// over `clients` running at once.
pub async fn fill_to(clients: &[kube::Client], total: usize) -> Result<()> {
    let rest = total.saturating_sub(SINGLE + CONCURRENT * PER_CLIENT);
    let mut tasks = Vec::new();
    for (k, cl) in clients.iter().enumerate() {
        let n = rest / clients.len() + usize::from(k < rest % clients.len());
        tasks.push(tokio::spawn(create_pods(cl.clone(), format!("fill{k}"), n)));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// `rounds` lists of every pod with `params`: each one's time in ms, and the count of the last.
pub async fn list_pods(
    c: &kube::Client,
    params: &kube::api::ListParams,
    rounds: usize,
) -> Result<(Vec<f64>, usize)> {
    let all: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(c.clone());
    let (mut lat, mut count) = (Vec::new(), 0);
    for _ in 0..rounds {
        let t = std::time::Instant::now();
        count = all.list(params).await?.items.len();
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((lat, count))
}
