//! `nodus up` from its start to a Ready node: the kubeadm-style bootstrap (etcd,
//! kube-apiserver, kube-controller-manager and kube-scheduler as static pods of the node's
//! kubelet) against the one-process control plane (`--control-plane-mode process`, the
//! embedded store), same machine, same run, alternating.
//!
//! Each start is a fresh `nodus up` in a network namespace, cgroup parent and data dir of
//! its own. Static pods are timed twice per round: *cold* (a new data dir: PKI, the images
//! built from the binary, etcd's first start) and *warm* (the same data dir started again
//! after every container of the first start was killed, as after a reboot). Timed: to the
//! banner (`nodus up` prints it once the API server answers `/readyz`) and to the Node's
//! Ready condition, read by a client inside the namespace every 20 ms.

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;
use nodus_bench::targets::pct;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::daemon::Daemon;
use testkit::{CgroupParent, Netns};

const NODE: &str = "bench";

fn runs() -> usize {
    std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Process,
    StaticCold,
    StaticWarm,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Process => "one process (`--control-plane-mode process`, embedded store)",
            Mode::StaticCold => "static pods, cold (new data dir: PKI, images, etcd's first start)",
            Mode::StaticWarm => "static pods, warm (same data dir, every container killed)",
        }
    }
}

/// A node's namespace, cgroup parent and data dir.
struct Node {
    netns: Arc<Netns>,
    cgroup: CgroupParent,
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Result<Node> {
        let netns = Arc::new(Netns::new("nodus-upbench")?);
        netns.add_uplink()?;
        netns.run("ip", &["link", "set", "lo", "up"])?;
        let cgroup = CgroupParent::new("nodus-upbench");
        cgroup.create();
        let dir = tempfile::Builder::new().prefix("bench-up-").tempdir()?;
        nodus_bench::targets::prepare_node_dir(dir.path())?;
        Ok(Node { netns, cgroup, dir })
    }

    fn d(&self) -> &Path {
        self.dir.path()
    }

    fn start(&self, bin: &Path, mode: Mode, log: &Path) -> Result<Daemon> {
        let d = self.d();
        let mut cmd = self.netns.command(bin)?;
        cmd.arg("up").arg("--data-dir").arg(d.join("up"));
        if mode == Mode::Process {
            cmd.args(["--control-plane-mode", "process"]);
        }
        cmd.arg("--")
            .arg("--runtime-config")
            .arg(d.join("runtime.toml"))
            .args(["--hostname-override", NODE])
            .arg("--pod-logs-dir")
            .arg(d.join("logs"))
            .args(["--cgroup-root", &self.cgroup.path()])
            .env(
                "NODUS_LOG",
                std::env::var("NODUS_LOG").unwrap_or_else(|_| "warn".into()),
            );
        Daemon::spawn("nodus-up", cmd, log, Duration::from_secs(10))
    }

    /// Stops `nodus up` and everything it started (its containers outlive it by design).
    fn stop(&self, mut up: Daemon) {
        up.stop();
        testkit::leftovers::kill_runtime_leftovers(&self.d().join("up/node/run/runtime"), self.d());
        // Every container process left is in this node's cgroup parent.
        kill_cgroup(&self.cgroup.path());
    }
}

/// SIGKILLs every process under cgroup parent `path` (v1 controllers or the v2 tree).
fn kill_cgroup(path: &str) {
    fn walk(dir: &Path) {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2) of a process in this benchmark's own cgroup parent.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten().filter(|e| e.path().is_dir()) {
                walk(&e.path());
            }
        }
    }
    let rel = path.trim_start_matches('/');
    let root = Path::new("/sys/fs/cgroup");
    walk(&root.join(rel));
    if let Ok(rd) = std::fs::read_dir(root) {
        for c in rd.flatten() {
            walk(&c.path().join(rel));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
}

/// Times from `started` to the banner in `log` and to the Node Ready, polled from a thread
/// inside the node's network namespace.
fn time_to_ready(node: &Node, log: &Path, started: Instant) -> Result<(Duration, Duration)> {
    let netns = node.netns.path();
    let admin = node.d().join("up/control-plane/admin.kubeconfig");
    let log = log.to_path_buf();
    std::thread::spawn(move || -> Result<(Duration, Duration)> {
        let ns = std::fs::File::open(&netns).with_context(|| format!("{}", netns.display()))?;
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let deadline = started + Duration::from_secs(180);
            let mut banner = None;
            let mut client: Option<kube::Client> = None;
            loop {
                if Instant::now() > deadline {
                    bail!(
                        "no Ready node within 180 s; see {}:\n{}",
                        log.display(),
                        testkit::daemon::log_tail(&log, 40)
                    );
                }
                if banner.is_none()
                    && std::fs::read_to_string(&log)
                        .unwrap_or_default()
                        .contains("nodus is up: API server at")
                {
                    banner = Some(started.elapsed());
                }
                if client.is_none() && banner.is_some() {
                    client = connect(&admin).await.ok();
                }
                if let Some(c) = &client {
                    let nodes: Api<NodeObject> = Api::all(c.clone());
                    if let Ok(Some(n)) = nodes.get_opt(NODE).await
                        && ready(&n)
                    {
                        return Ok((banner.unwrap_or_default(), started.elapsed()));
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the poller panicked"))?
}

async fn connect(admin: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(admin)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}

fn ready(n: &NodeObject) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The floor, alone: etcd from spawn to serving clients, fresh and restarted on its data.
fn floors() -> Result<(f64, f64)> {
    let dir = tempfile::Builder::new()
        .prefix("bench-up-floor-")
        .tempdir()?;
    // Serving means a leader: etcd's /health says true only then.
    let healthy = |port: u16| -> Result<()> {
        use std::io::{Read as _, Write as _};
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                let mut out = String::new();
                if c.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_ok()
                    && c.read_to_string(&mut out).is_ok()
                    && out.contains("\"health\":\"true\"")
                {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!("etcd on port {port} not healthy within 30 s")
    };
    let t = Instant::now();
    let etcd = nodus_control_plane::storage::EtcdServer::start(&dir.path().join("etcd"))?;
    healthy(etcd.client_port)?;
    let fresh = t.elapsed().as_secs_f64();
    drop(etcd);
    let t = Instant::now();
    let etcd = nodus_control_plane::storage::EtcdServer::start(&dir.path().join("etcd"))?;
    healthy(etcd.client_port)?;
    let restart = t.elapsed().as_secs_f64();
    drop(etcd);
    Ok((fresh, restart))
}

fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin = nodus_bench::nodus_bin();
    let bin = std::fs::canonicalize(&bin).with_context(|| format!("{}", bin.display()))?;
    let modes = [Mode::Process, Mode::StaticCold, Mode::StaticWarm];
    let mut times: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); modes.len()];
    let (mut etcd_fresh, mut etcd_restart) = (Vec::new(), Vec::new());
    // Kept: a failed start's log is what explains it.
    let logs = tempfile::Builder::new()
        .prefix("bench-up-logs-")
        .tempdir()?
        .keep();
    for round in 0..runs() {
        // One node for the process mode, one for the cold start and its warm restart.
        let node = Node::new()?;
        let log = logs.join(format!("process-{round}.log"));
        let started = Instant::now();
        let up = node.start(&bin, Mode::Process, &log)?;
        let r = time_to_ready(&node, &log, started);
        node.stop(up);
        drop(node);
        let (banner, ready) = r?;
        times[0].0.push(banner.as_secs_f64());
        times[0].1.push(ready.as_secs_f64());
        let node = Node::new()?;
        for (i, mode) in [(1, Mode::StaticCold), (2, Mode::StaticWarm)] {
            let log = logs.join(format!("{mode:?}-{round}.log"));
            let started = Instant::now();
            let up = node.start(&bin, mode, &log)?;
            let r = time_to_ready(&node, &log, started);
            node.stop(up);
            let (banner, ready) = r?;
            times[i].0.push(banner.as_secs_f64());
            times[i].1.push(ready.as_secs_f64());
        }
        let (f, r) = floors()?;
        etcd_fresh.push(f);
        etcd_restart.push(r);
        eprintln!(
            "round {round}: process {:.2} s, cold {:.2} s, warm {:.2} s to Ready",
            times[0].1[round], times[1].1[round], times[2].1[round]
        );
    }
    let mut body = format!(
        "Measured {} on this machine (2 cores), `nodus up` {} build, {} rounds: each start in a network namespace, cgroup parent and data dir of its own, `NODUS_LOG=warn`; \"API server\" is `nodus up`'s banner (printed once `/readyz` answers ok), \"node Ready\" the Node's Ready condition read by a client in the namespace every 20 ms.\n\n| start | API server (median) | node Ready (min) | node Ready (median) | node Ready (max) |\n| --- | --- | --- | --- | --- |\n",
        nodus_bench::today(),
        nodus_bench::build_profile(&bin),
        runs()
    );
    let mut medians = Vec::new();
    for (mode, (banner, ready)) in modes.iter().zip(times.iter_mut()) {
        let b = pct(banner, 50.0);
        let min = pct(ready, 0.0);
        let med = pct(ready, 50.0);
        let max = pct(ready, 100.0);
        medians.push(med);
        body.push_str(&format!(
            "| {} | {b:.2} s | {min:.2} s | {med:.2} s | {max:.2} s |\n",
            mode.label()
        ));
    }
    let size_mb = std::fs::metadata(&bin)?.len() as f64 / 1e6;
    body.push_str(&format!(
        "\nThe floor, alone in the same rounds (medians): etcd (Debian's) from spawn to a healthy member, {:.2} s fresh and {:.2} s restarted on its data (a lone member waits out its election timeout before it leads), inside every static-pod start; nodus's share is the rest. A cold start adds the images: the {size_mb:.0} MB nodus binary (release builds carry no debug info since 2026-12-04: with line tables it was 391 MB and the cold start 2.75–3.22 s) and etcd read, hashed, stored and unpacked into the node's image store.\n",
        pct(&mut etcd_fresh, 50.0),
        pct(&mut etcd_restart, 50.0),
    ));
    body.push_str(&format!(
        "\nGoal: the static-pod bootstrap under 3 s to a Ready node: {} cold ({:.2} s), {} warm ({:.2} s); the one-process start takes {:.2} s.\n",
        if medians[1] < 3.0 { "met" } else { "not met" },
        medians[1],
        if medians[2] < 3.0 { "met" } else { "not met" },
        medians[2],
        medians[0],
    ));
    print!("{body}");
    if let Some(path) = write {
        nodus_bench::write_section(
            &path,
            "up-bootstrap",
            "## `nodus up` bootstrap: static pods vs one process (`bash bench/up-bootstrap.sh`)",
            &body,
        )?;
    }
    Ok(())
}
