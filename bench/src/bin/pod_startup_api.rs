//! Pod startup through the API server: from a pod created (with `spec.nodeName` set, so no
//! scheduler is involved) to phase Running observed by a watch, for 1 pod (repeated) and a
//! burst of pods created at once. `nodus control-plane` + the nodus kubelet (with
//! `--kubeconfig`) on nodus's runtime vs the same kubelet on containerd, same run.
//!
//! The control plane and the kubelet live in the runtime's network namespace; the
//! measuring client runs on a thread that entered that namespace, so it reaches the API
//! server on 127.0.0.1 as they do.

use anyhow::{Context, Result, bail};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use nodus_bench::cluster::{self, NODE};
use nodus_bench::targets::{containerd, nodus, pct, processes_memory, rss_kib, runtime_rss_kib};
use std::collections::HashMap;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const SINGLE_RUNS: usize = 10;

fn many() -> usize {
    std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
}

fn pod(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": "docker.io/library/busybox:latest",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
            }],
        },
    }))?)
}

/// Creates `names` one after another as fast as the API takes them; returns each pod's
/// time from its create call to Running seen by the watch, and the time until all run.
async fn start_pods(api: &Api<Pod>, names: &[String]) -> Result<(Vec<f64>, Duration)> {
    let list = api.list(&ListParams::default()).await?;
    let rv = list.metadata.resource_version.unwrap_or_default();
    let mut stream = api.watch(&WatchParams::default(), &rv).await?.boxed();
    let t0 = Instant::now();
    let mut created: HashMap<String, Instant> = HashMap::new();
    for n in names {
        let at = Instant::now();
        api.create(&PostParams::default(), &pod(n)?).await?;
        created.insert(n.clone(), at);
    }
    let mut lat = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while !created.is_empty() {
        let ev = tokio::time::timeout_at(deadline, stream.next())
            .await
            .with_context(|| format!("{} pods not Running after 300s", created.len()))?;
        let Some(ev) = ev else {
            bail!("watch ended");
        };
        if let WatchEvent::Added(p) | WatchEvent::Modified(p) = ev? {
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if running
                && let Some(name) = p.metadata.name.as_ref()
                && let Some(at) = created.remove(name)
            {
                lat.push(at.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    Ok((lat, t0.elapsed()))
}

async fn delete_all(api: &Api<Pod>) -> Result<()> {
    for p in api.list(&ListParams::default()).await? {
        if let Some(n) = p.metadata.name {
            let _ = api.delete(&n, &DeleteParams::default()).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if api.list(&ListParams::default()).await?.items.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("pods still in the API 300s after their deletion");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Results {
    single: Vec<f64>,
    many: Vec<f64>,
    many_total: Duration,
    rss_kib: u64,
    /// The runtime daemon's RSS with the pods running (with its fork server).
    runtime_rss_kib: u64,
    /// (count, PSS, RSS) of the runtime's per-pod processes with the pods running.
    per_pod: (usize, u64, u64),
}

/// Whose memory makes up the node besides the kubelet: the runtime daemon and its per-pod
/// processes (shims; containerd's pause containers too).
struct NodeProcs<'a> {
    kubelet: u32,
    runtime: u32,
    per_pod: &'a (dyn Fn(&str) -> bool + Send + Sync),
}

async fn measure(admin: &Path, procs: &NodeProcs<'_>) -> Result<Results> {
    let kc = kube::config::Kubeconfig::read_from(admin)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    let client = kube::Client::try_from(config)?;
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    // The node must be Ready before pods are timed.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = nodes.get_opt(NODE).await?.is_some_and(|n| {
            n.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if ready {
            break;
        }
        if Instant::now() > deadline {
            bail!("node {NODE} not Ready after 60s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    start_pods(&api, &["warmup".to_string()]).await?;
    delete_all(&api).await?;
    let mut single = Vec::new();
    for i in 0..SINGLE_RUNS {
        let (lat, _) = start_pods(&api, &[format!("one-{i}")]).await?;
        single.extend(lat);
        delete_all(&api).await?;
    }
    let names: Vec<String> = (0..many()).map(|i| format!("many-{i}")).collect();
    let (many_lat, total) = start_pods(&api, &names).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss = rss_kib(procs.kubelet);
    let runtime_rss_kib = runtime_rss_kib(procs.runtime, procs.per_pod);
    let per_pod = processes_memory(procs.per_pod);
    delete_all(&api).await?;
    Ok(Results {
        single,
        many: many_lat,
        many_total: total,
        rss_kib: rss,
        runtime_rss_kib,
        per_pod,
    })
}

/// Runs [`measure`] on a thread inside the network namespace at `netns`.
fn measure_in(netns: PathBuf, admin: PathBuf, procs: &NodeProcs<'_>) -> Result<Results> {
    std::thread::scope(|s| {
        s.spawn(|| -> Result<Results> {
            let f = std::fs::File::open(&netns)?;
            nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(measure(&admin, procs))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("measuring thread panicked"))?
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin =
        PathBuf::from(std::env::var("NODUS_BIN").context("set NODUS_BIN to the nodus binary")?);
    let n = many();
    let mut rows = Vec::new();
    let mut mem_rows = Vec::new();
    for which in ["nodus", "containerd"] {
        let t = if which == "nodus" {
            nodus(&bin).await?
        } else {
            containerd().await?
        };
        eprintln!("measuring pod startup through the API on {}", t.name);
        let c = cluster::start(&bin, &t, &[])?;
        let procs = NodeProcs {
            kubelet: c.kubelet.pid(),
            runtime: t.daemon_pid,
            per_pod: &*t.per_pod,
        };
        let mut r = measure_in(t.netns.path(), c.admin.clone(), &procs)
            .with_context(|| format!("on {}", t.name))?;
        let mib = |k: u64| k as f64 / 1024.0;
        let (count, pss, prss) = r.per_pod;
        rows.push(format!(
            "| nodus kubelet on {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} s | {:.1} MiB |\n",
            t.name,
            pct(&mut r.single, 50.0),
            pct(&mut r.single, 99.0),
            pct(&mut r.many, 50.0),
            pct(&mut r.many, 99.0),
            r.many_total.as_secs_f64(),
            mib(r.rss_kib),
        ));
        mem_rows.push(format!(
            "| {} | {:.1} MiB | {:.1} MiB | {count} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB |\n",
            t.name,
            mib(r.rss_kib),
            mib(r.runtime_rss_kib),
            mib(pss),
            mib(prss),
            mib(r.rss_kib + r.runtime_rss_kib + pss),
            mib(r.rss_kib + r.runtime_rss_kib + prss),
        ));
        drop(c);
        drop(t);
    }
    let mut body = format!(
        "From the pod's create call (kube-rs, admin credentials; `spec.nodeName` set, so no \
         scheduler) to phase Running seen by a watch on the API server: `nodus control-plane` \
         and the nodus kubelet (`--kubeconfig`, EventedPLEG on) in the runtime's network \
         namespace; busybox `sleep 3600`, image present. {SINGLE_RUNS} single pods one after \
         another, then {n} pods created back to back. Times in milliseconds; kubelet RSS with \
         the {n} pods running. {} cores.\n\n\
         | setup | 1 pod p50 | 1 pod p99 | {n} pods p50 | {n} pods p99 | all {n} running | kubelet RSS |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    for r in rows {
        body.push_str(&r);
    }
    body.push_str(&format!(
        "\nNode memory with the {n} pods running (kube-proxy is not part of this setup; its own \
         figures are in the proxy section): per-pod processes are the runtime's shims (and \
         containerd's pause containers); the runtime daemon's figure includes its children that \
         are not per pod (nodus's shim fork server); \"node\" = kubelet + runtime daemon + per-pod processes, \
         counting those by PSS (shared pages split between them) and by RSS (every page counted in \
         every process).\n\n\
         | runtime | kubelet RSS | runtime daemon RSS | per-pod processes | their PSS | their RSS | node (PSS) | node (RSS) |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    ));
    for r in mem_rows {
        body.push_str(&r);
    }
    body.push_str(
        "\nGoals (issue 8): p50 under 300 ms for one pod, p99 under 1 s at 100 pods; the \
         Kubernetes pod startup SLO (p99 ≤ 5 s) is the floor.\n",
    );
    println!("{body}");
    if let Some(p) = write {
        nodus_bench::write_section(
            &p,
            "pod-startup-api",
            "## Pod startup through the API server (`bash bench/pod-startup-api.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}
