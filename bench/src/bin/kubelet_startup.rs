//! Pod startup through the kubelet: from writing a static pod manifest (image present) to
//! every container Running as the kubelet reports it (its read-only `/pods`), for 1 pod
//! (repeated) and for 100 pods written at once; then the kubelet's CPU and RSS while the
//! 100 run. nodus kubelet on nodus's runtime vs the same kubelet on containerd, same run.

use anyhow::{Context, Result, bail};
use cri::runtime::v1 as pb;
use nodus_bench::cluster::cpu_ms;
use nodus_bench::targets::{Target, containerd, nodus, nodus_with, pct, rss_kib};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use testkit::daemon::Daemon;

const PORT: u16 = 10255;
const SINGLE_RUNS: usize = 10;

fn many() -> usize {
    std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n"
    )
}

struct Kubelet {
    daemon: Daemon,
    manifests: PathBuf,
    _dir: tempfile::TempDir,
}

fn start_kubelet(bin: &Path, t: &Target) -> Result<Kubelet> {
    let dir = tempfile::Builder::new()
        .prefix("bench-kubelet-")
        .tempdir()?;
    let manifests = dir.path().join("manifests");
    t.cgroup.create();
    std::fs::create_dir_all(&manifests)?;
    let mut cmd = t.netns.command(bin)?;
    cmd.arg("kubelet")
        .arg("--container-runtime-endpoint")
        .arg(&t.endpoint)
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .arg("--pod-manifest-path")
        .arg(&manifests)
        .arg("--pod-logs-dir")
        .arg(dir.path().join("logs"))
        .arg("--cgroup-root")
        .arg(t.cgroup.path())
        .args(["--hostname-override", "bench", "--healthz-port", "0"])
        .args(["--read-only-port", &PORT.to_string()])
        .args(["--feature-gates", "EventedPLEG=true"])
        // Disk-based eviction off, as kind's nodes: a nearly full build disk must not
        // put the measured node under DiskPressure.
        .args([
            "--eviction-hard",
            "memory.available<100Mi,nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%",
        ])
        .env("NODUS_LOG", "warn");
    let mut daemon = Daemon::spawn(
        "nodus-kubelet",
        cmd,
        &dir.path().join("log"),
        Duration::from_secs(10),
    )?;
    let ns = std::sync::Arc::clone(&t.netns);
    daemon.wait_ready(Duration::from_secs(30), || {
        ns.http_get(PORT, "/healthz").is_ok()
    })?;
    Ok(Kubelet {
        daemon,
        manifests,
        _dir: dir,
    })
}

/// Pod name → whether every container is running.
fn running(t: &Target) -> Result<HashMap<String, bool>> {
    let (code, body) = t.netns.http_get(PORT, "/pods")?;
    if code != 200 {
        bail!("/pods: {code} {body}");
    }
    let v: Value = serde_json::from_str(&body)?;
    let mut out = HashMap::new();
    for p in v["items"].as_array().cloned().unwrap_or_default() {
        let name = p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let all = p["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|cs| {
                !cs.is_empty() && cs.iter().all(|c| c["state"]["running"].is_object())
            });
        out.insert(name, all);
    }
    Ok(out)
}

/// Writes `names` at once; returns each pod's time to Running and the time to all.
fn start_pods(t: &Target, k: &Kubelet, names: &[String]) -> Result<(Vec<f64>, Duration)> {
    let mut written = HashMap::new();
    let t0 = Instant::now();
    for n in names {
        let tmp = k.manifests.join(format!(".{n}.tmp"));
        std::fs::write(&tmp, manifest(n))?;
        std::fs::rename(&tmp, k.manifests.join(format!("{n}.yaml")))?;
        written.insert(format!("{n}-bench"), Instant::now());
    }
    let mut lat = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while !written.is_empty() {
        if Instant::now() > deadline {
            bail!("{} pods not running after 300s", written.len());
        }
        let now = Instant::now();
        for (name, ok) in running(t)? {
            if ok && let Some(w) = written.remove(&name) {
                lat.push((now - w).as_secs_f64() * 1e3);
            }
        }
        std::thread::sleep(Duration::from_millis(if names.len() == 1 { 2 } else { 20 }));
    }
    Ok((lat, t0.elapsed()))
}

async fn remove_all(t: &Target, k: &Kubelet) -> Result<()> {
    for e in std::fs::read_dir(&k.manifests)? {
        std::fs::remove_file(e?.path())?;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let left =
            t.c.runtime
                .clone()
                .list_pod_sandbox(pb::ListPodSandboxRequest { filter: None })
                .await?
                .into_inner()
                .items
                .len();
        if left == 0 && running(t)?.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{left} sandboxes left after removing every manifest");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Results {
    single: Vec<f64>,
    many: Vec<f64>,
    many_total: Duration,
    rss_kib: u64,
    cpu_pct: f64,
}

/// With `idle`, also the kubelet's CPU over 30 s with the pods running.
async fn measure(bin: &Path, t: &Target, idle: bool) -> Result<Results> {
    let k = start_kubelet(bin, t)?;
    // Warm-up: the first pod pays for lazily built caches on both sides.
    start_pods(t, &k, &["warmup".to_string()])?;
    remove_all(t, &k).await?;
    let mut single = Vec::new();
    for i in 0..SINGLE_RUNS {
        let (lat, _) = start_pods(t, &k, &[format!("one-{i}")])?;
        single.extend(lat);
        remove_all(t, &k).await?;
    }
    let names: Vec<String> = (0..many()).map(|i| format!("many-{i}")).collect();
    let (many_lat, total) = start_pods(t, &k, &names)?;
    let pid = k.daemon.pid();
    let mut cpu_pct = 0.0;
    if idle {
        // Let the burst settle, then watch the kubelet idle over 100 running pods.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (c0, w0) = (cpu_ms(pid), Instant::now());
        tokio::time::sleep(Duration::from_secs(30)).await;
        cpu_pct = (cpu_ms(pid) - c0).max(0.0) / 1e3 / w0.elapsed().as_secs_f64() * 100.0;
    }
    let rss = rss_kib(pid);
    remove_all(t, &k).await?;
    Ok(Results {
        single,
        many: many_lat,
        many_total: total,
        rss_kib: rss,
        cpu_pct,
    })
}

/// `BENCH_HANDLERS=runc,crun`: the same runs with nodus's runtime defaulting to each OCI
/// handler (`default-runtime-handler`), and containerd's runc beside them; the VM lane's
/// cgroup v2 guest runs it, where crun works. Only ratios mean something there.
async fn handlers_mode(bin: &Path, handlers: &[String], write: Option<PathBuf>) -> Result<()> {
    let n = many();
    let mut rows: Vec<(String, Results)> = Vec::new();
    for h in handlers {
        let t = nodus_with(bin, &format!("default-runtime-handler = \"{h}\"\n")).await?;
        eprintln!("measuring the kubelet on nodus + {h}");
        let r = measure(bin, &t, false)
            .await
            .with_context(|| format!("on nodus + {h}"))?;
        rows.push((format!("nodus + {h}"), r));
    }
    let t = containerd().await?;
    eprintln!("measuring the kubelet on containerd");
    let r = measure(bin, &t, false).await.context("on containerd")?;
    rows.push(("containerd + runc".into(), r));
    drop(t);
    let mut body = format!(
        "Inside the VM lane's guest (`bash scripts/vm-test.sh bench/kubelet-startup`: pure \
         cgroup v2 under systemd, qemu TCG emulation, so only the ratios mean anything): the \
         nodus kubelet (debug build) from writing a static pod manifest to the container \
         Running in its `/pods`, on nodus's runtime with each OCI handler as the default and on \
         containerd; {SINGLE_RUNS} single pods, then {n} written at once. Times in ms.\n\n\
         | kubelet on | 1 pod p50 | 1 pod p99 | {n} pods p50 | {n} pods p99 | all {n} running |\n\
         | --- | --- | --- | --- | --- | --- |\n"
    );
    let mut all = HashMap::new();
    for (label, r) in rows.iter_mut() {
        body.push_str(&format!(
            "| {label} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} s |\n",
            pct(&mut r.single, 50.0),
            pct(&mut r.single, 99.0),
            pct(&mut r.many, 50.0),
            pct(&mut r.many, 99.0),
            r.many_total.as_secs_f64(),
        ));
        all.insert(
            label.clone(),
            (pct(&mut r.single, 50.0), r.many_total.as_secs_f64()),
        );
    }
    if let (Some(runc), Some(crun)) = (all.get("nodus + runc"), all.get("nodus + crun")) {
        body.push_str(&format!(
            "\ncrun / runc under the nodus kubelet and runtime: 1 pod p50 {:.2}×, all {n} running {:.2}×",
            crun.0 / runc.0,
            crun.1 / runc.1
        ));
        if let Some(c) = all.get("containerd + runc") {
            body.push_str(&format!(
                "; nodus + crun / containerd + runc: 1 pod {:.2}×, all {n} {:.2}×",
                crun.0 / c.0,
                crun.1 / c.1
            ));
        }
        body.push_str(".\n");
    }
    println!("{body}");
    if let Some(p) = write {
        nodus_bench::write_section(
            &p,
            "kubelet-startup-vm",
            "## Pod startup through the kubelet on cgroup v2 with runc and crun (VM lane)",
            &body,
        )?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin =
        PathBuf::from(std::env::var("NODUS_BIN").context("set NODUS_BIN to the nodus binary")?);
    let n = many();
    if let Ok(h) = std::env::var("BENCH_HANDLERS") {
        let handlers: Vec<String> = h.split(',').map(str::to_string).collect();
        return handlers_mode(&bin, &handlers, write).await;
    }
    let mut rows = Vec::new();
    for which in ["nodus", "containerd"] {
        let t = if which == "nodus" {
            nodus(&bin).await?
        } else {
            containerd().await?
        };
        eprintln!("measuring the kubelet on {}", t.name);
        let mut r = measure(&bin, &t, true)
            .await
            .with_context(|| format!("on {}", t.name))?;
        rows.push(format!(
            "| nodus kubelet on {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} s | {:.1} MiB | {:.1} % |\n",
            t.name,
            pct(&mut r.single, 50.0),
            pct(&mut r.single, 99.0),
            pct(&mut r.many, 50.0),
            pct(&mut r.many, 99.0),
            r.many_total.as_secs_f64(),
            r.rss_kib as f64 / 1024.0,
            r.cpu_pct,
        ));
        drop(t);
    }
    let mut body = format!(
        "From writing a static pod manifest (busybox `sleep 3600`, image present, \
         imagePullPolicy IfNotPresent) to every container Running in the kubelet's own \
         `/pods` (polled); {SINGLE_RUNS} single pods one after another, then {n} manifests \
         written at once. EventedPLEG on (containerd 1.6 has no event stream, so that side \
         relists every second). Kubelet CPU and RSS measured over 30 s with the {n} pods \
         running. Times in milliseconds. {} cores.\n\n\
         | setup | 1 pod p50 | 1 pod p99 | {n} pods p50 | {n} pods p99 | all {n} running | kubelet RSS | kubelet CPU |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    for r in rows {
        body.push_str(&r);
    }
    body.push_str(
        "\nGoals (issue 4): 1 pod p50 under 150 ms on the nodus runtime; 100 pods running in \
         under 10 s; kubelet RSS under 30 MB with 100 pods. Upstream for comparison (no \
         upstream kubelet can run here): ~1.8 s average pod startup on kind, most of it \
         waiting for the PLEG relist; upstream kubelet RSS ~100–125 MB.\n",
    );
    println!("{body}");
    if let Some(p) = write {
        nodus_bench::write_section(
            &p,
            "kubelet-startup",
            "## Pod startup through the kubelet (`bash bench/kubelet-startup.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}
