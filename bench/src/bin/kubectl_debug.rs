//! `kubectl debug` latency: from starting `kubectl debug -i <pod> --target=app -- ps` (the
//! real kubectl) to its exit with the debugger's output — the ephemeral container added
//! through `pods/ephemeralcontainers`, started by the kubelet in the pod's sandbox in the
//! target's process namespace, attached to (or its log read when it finished first). The
//! nodus kubelet on nodus's runtime vs the same kubelet on containerd + runc, same run, same
//! `nodus control-plane`.

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use nodus_bench::cluster::{self, NODE};
use nodus_bench::targets::{Target, containerd, nodus, pct};
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const IMAGE: &str = "docker.io/library/busybox:latest";

fn runs() -> usize {
    std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

/// Creates the pod to debug and waits until it runs.
async fn start_pod(admin: &Path) -> Result<()> {
    let kc = kube::config::Kubeconfig::read_from(admin)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    let api: Api<Pod> = Api::namespaced(kube::Client::try_from(config)?, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
            }],
        },
    }))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    // The node registers after the kubelet starts: retry until the pod is accepted.
    loop {
        match api.create(&PostParams::default(), &pod).await {
            Ok(_) => break,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => return Err(e.into()),
        }
    }
    loop {
        let p = api.get("web").await?;
        if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("pod web not Running after 120s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs [`start_pod`] on a thread inside the network namespace at `netns`.
fn start_pod_in(netns: PathBuf, admin: &Path) -> Result<()> {
    std::thread::scope(|s| {
        s.spawn(|| -> Result<()> {
            let f = std::fs::File::open(&netns)?;
            nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(start_pod(admin))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("pod thread panicked"))?
    })
}

/// One `kubectl debug -i` run: its wall time in milliseconds, checked to have shown the
/// target's process.
fn debug_once(t: &Target, admin: &Path, home: &Path, i: usize) -> Result<f64> {
    let name = format!("dbg-{i}");
    let mut cmd = t.netns.command("kubectl")?;
    cmd.arg("--kubeconfig")
        .arg(admin)
        .args(["debug", "-i", "web", "--target=app", "-c", &name])
        .arg(format!("--image={IMAGE}"))
        .args(["--image-pull-policy=IfNotPresent", "--", "ps"])
        .env("HOME", home)
        .stdin(std::process::Stdio::null());
    let started = Instant::now();
    let out = cmd.output().context("running kubectl debug")?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !stdout.contains("sleep 3600") {
        bail!(
            "kubectl debug {name} on {}: {}\n{stdout}{}",
            t.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(ms)
}

#[tokio::main]
async fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin =
        PathBuf::from(std::env::var("NODUS_BIN").context("set NODUS_BIN to the nodus binary")?);
    let n = runs();
    let mut rows = Vec::new();
    for which in ["nodus", "containerd"] {
        let t = if which == "nodus" {
            nodus(&bin).await?
        } else {
            containerd().await?
        };
        eprintln!("measuring kubectl debug on {}", t.name);
        // The API server reaches the kubelet (attach, logs) at the node's address; the
        // runtime's network namespace has only loopback.
        let c = cluster::start(&bin, &t, &["--node-ip", "127.0.0.1"])?;
        start_pod_in(t.netns.path(), &c.admin).with_context(|| format!("on {}", t.name))?;
        let home = tempfile::tempdir()?;
        // The first debugger warms kubectl's discovery cache; it is not counted.
        debug_once(&t, &c.admin, home.path(), 0)?;
        let mut lat = Vec::new();
        for i in 1..=n {
            lat.push(debug_once(&t, &c.admin, home.path(), i)?);
        }
        rows.push(format!(
            "| nodus kubelet on {} | {:.0} | {:.0} |\n",
            t.name,
            pct(&mut lat, 50.0),
            pct(&mut lat, 99.0),
        ));
        drop(c);
        drop(t);
    }
    let mut body = format!(
        "Wall time of `kubectl debug -i web --target=app --image=busybox -- ps` (the real \
         kubectl, its discovery cache warm) until it exits having printed the target's `sleep \
         3600`: the strategic merge patch of `pods/ephemeralcontainers`, the kubelet's sync \
         starting the ephemeral container in the running sandbox with PID namespace TARGET, \
         kubectl's watch seeing it run and its attach (or, when `ps` already finished, its log \
         read). `nodus control-plane` and the nodus kubelet in the runtime's network namespace, \
         image present; {n} debuggers one after another in the same pod. Milliseconds. {} \
         cores.\n\n\
         | setup | p50 | p99 |\n\
         | --- | --- | --- |\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    for r in rows {
        body.push_str(&r);
    }
    println!("{body}");
    if let Some(p) = write {
        nodus_bench::write_section(
            &p,
            "kubectl-debug",
            "## kubectl debug (`bash bench/kubectl-debug.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}
