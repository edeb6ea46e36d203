//! Node join (issue "Identity and access"): from starting `nodus node` to its Node Ready,
//! joining with a bootstrap token (`--server --token --discovery-token-ca-cert-hash`: token
//! discovery of cluster-info, then the kubelet's TLS bootstrap through a CSR the control
//! plane approves and signs) against joining with `--control-plane-data-dir` (the node
//! issues its own credentials from the cluster CA on the same disk).
//!
//! Each sample is a fresh `nodus control-plane` in one network namespace and a fresh node
//! in a second one linked to it by a veth pair, as `crates/nodus/tests/node_join.rs` sets
//! them up. The clock starts when the node process is spawned; a watch on Nodes and CSRs,
//! from a thread inside the control plane's namespace, timestamps what the API server sees.
//! Needs root.

use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt as _;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use nodus_bench::targets::pct;
use testkit::daemon::Daemon;
use testkit::{CgroupParent, Netns};

const CP_IP: &str = "10.252.0.1";
const NODE_IP: &str = "10.252.0.2";
const API_PORT: u16 = 6443;
/// Disk-based eviction off, as kind's nodes and the tests: a nearly full build disk must
/// not put the measured node under DiskPressure.
const EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%";
const TIMEOUT: Duration = Duration::from_secs(120);

fn samples() -> usize {
    std::env::var("BENCH_JOIN_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Join {
    /// `--server --token --discovery-token-ca-cert-hash`.
    Token,
    /// `--control-plane-data-dir --server`.
    DataDir,
}

/// What the API server saw, in seconds after the node process was spawned.
#[derive(Debug, Default)]
struct Sample {
    /// The node's client CSR created (token join only).
    csr_created: Option<f64>,
    /// That CSR's certificate issued.
    csr_issued: Option<f64>,
    /// The Node object created (the kubelet registered).
    registered: f64,
    /// Its Ready condition True.
    ready: f64,
}

fn ip(ns: &Netns, args: &[&str]) -> Result<()> {
    let out = ns.run("ip", args)?;
    ensure!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A veth pair from `cp` (CP_IP) to `node` (NODE_IP, default route through it).
fn link(cp: &Netns, node: &Netns) -> Result<()> {
    ip(
        cp,
        &[
            "link",
            "add",
            "peer0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            node.name(),
        ],
    )?;
    ip(cp, &["addr", "add", &format!("{CP_IP}/24"), "dev", "peer0"])?;
    ip(cp, &["link", "set", "peer0", "up"])?;
    ip(
        node,
        &["addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"],
    )?;
    ip(node, &["link", "set", "eth0", "up"])?;
    ip(
        node,
        &["route", "add", "default", "via", CP_IP, "dev", "eth0"],
    )
}

/// Runs `f` on a thread inside `netns` with a tokio runtime of its own.
fn in_netns<T: Send>(
    netns: &Netns,
    f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T>>>> + Send,
) -> Result<T> {
    let path = netns.path();
    std::thread::scope(|s| {
        s.spawn(move || -> Result<T> {
            let file = std::fs::File::open(&path)?;
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(f())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("thread in {} panicked", netns.name()))?
    })
}

async fn admin_client(kubeconfig: &Path) -> Result<kube::Client> {
    nodus_bench::controlplane::client(kubeconfig).await
}

/// Waits until the bootstrap signer has signed cluster-info for token `id`: an
/// administrator's step before handing out the join line, not part of the join.
async fn wait_signed(kubeconfig: PathBuf, id: String) -> Result<()> {
    let c = admin_client(&kubeconfig).await?;
    let api: Api<ConfigMap> = Api::namespaced(c, "kube-public");
    let key = format!("jws-kubeconfig-{id}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let cm = api.get_opt("cluster-info").await?;
        if cm
            .and_then(|cm| cm.data)
            .is_some_and(|d| d.contains_key(&key))
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "cluster-info not signed for {id}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Watches Nodes and CSRs from the current revision; tells `go` when it watches, then
/// reports when `node` registered and turned Ready, and when its client CSR was created
/// and issued, as instants.
#[derive(Debug, Default)]
struct Seen {
    csr_created: Option<Instant>,
    csr_issued: Option<Instant>,
    registered: Option<Instant>,
    ready: Option<Instant>,
}

async fn watch_join(kubeconfig: PathBuf, node: String, go: mpsc::Sender<()>) -> Result<Seen> {
    let c = admin_client(&kubeconfig).await?;
    let nodes: Api<Node> = Api::all(c.clone());
    let csrs: Api<CertificateSigningRequest> = Api::all(c);
    let rv = nodes
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut node_events = nodes.watch(&WatchParams::default(), &rv).await?.boxed();
    let mut csr_events = csrs.watch(&WatchParams::default(), &rv).await?.boxed();
    go.send(()).ok();
    let mut seen = Seen::default();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let client_signer = "kubernetes.io/kube-apiserver-client-kubelet";
    while seen.ready.is_none() {
        tokio::select! {
            ev = node_events.next() => {
                let Some(ev) = ev else { bail!("node watch ended") };
                if let WatchEvent::Added(n) | WatchEvent::Modified(n) = ev?
                    && n.metadata.name.as_deref() == Some(node.as_str())
                {
                    let now = Instant::now();
                    seen.registered.get_or_insert(now);
                    if ready(&n) {
                        seen.ready = Some(now);
                    }
                }
            }
            ev = csr_events.next() => {
                let Some(ev) = ev else { bail!("CSR watch ended") };
                if let WatchEvent::Added(r) | WatchEvent::Modified(r) = ev?
                    && r.spec.signer_name == client_signer
                {
                    let now = Instant::now();
                    seen.csr_created.get_or_insert(now);
                    if r.status.as_ref().is_some_and(|s| s.certificate.is_some()) {
                        seen.csr_issued.get_or_insert(now);
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline) => bail!("{node} not Ready after {TIMEOUT:?}"),
        }
    }
    Ok(seen)
}

/// One join on a fresh control plane and node.
fn sample(bin: &Path, how: Join, k: usize) -> Result<Sample> {
    let cp_ns = Arc::new(Netns::new("nodus-bjcp")?);
    let node_ns = Arc::new(Netns::new("nodus-bjnode")?);
    link(&cp_ns, &node_ns)?;
    let dir = tempfile::Builder::new().prefix("bench-join-").tempdir()?;
    let cp_data = dir.path().join("cp");
    let server = format!("https://{CP_IP}:{API_PORT}");

    let mut cmd = cp_ns.command(bin)?;
    cmd.arg("control-plane")
        .arg("--data-dir")
        .arg(&cp_data)
        .args(["--bind-address", CP_IP, "--secure-port"])
        .arg(API_PORT.to_string())
        .env("NODUS_LOG", "warn");
    let mut cp = Daemon::spawn(
        "nodus-control-plane",
        cmd,
        &dir.path().join("cp.log"),
        Duration::from_secs(10),
    )?;
    let admin = cp_data.join("admin.kubeconfig");
    let addr: std::net::SocketAddr = format!("{CP_IP}:{API_PORT}").parse()?;
    cp.wait_ready(Duration::from_secs(60), || {
        admin.exists() && cp_ns.connect_tcp(addr).is_ok()
    })?;

    let credentials: Vec<String> = match how {
        Join::Token => {
            let out = cp_ns
                .command(bin)?
                .args(["token", "create", "--data-dir"])
                .arg(&cp_data)
                .output()?;
            ensure!(
                out.status.success(),
                "nodus token create: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let token = String::from_utf8(out.stdout)?
                .lines()
                .next()
                .context("no token printed")?
                .to_string();
            let hash = nodus_control_plane::pki::ca_cert_hash(&std::fs::read_to_string(
                cp_data.join("pki/ca.crt"),
            )?)?;
            let id = token.split('.').next().unwrap_or("").to_string();
            let a = admin.clone();
            in_netns(&cp_ns, move || Box::pin(wait_signed(a, id)))?;
            vec![
                "--server".into(),
                server.clone(),
                "--token".into(),
                token,
                "--discovery-token-ca-cert-hash".into(),
                hash,
            ]
        }
        Join::DataDir => vec![
            "--control-plane-data-dir".into(),
            cp_data.to_string_lossy().into_owned(),
            "--server".into(),
            server.clone(),
        ],
    };

    let node_dir = dir.path().join("node");
    nodus_bench::targets::prepare_node_dir(&node_dir)?;
    let cgroup = CgroupParent::new("bench-join");
    cgroup.create();
    let name = format!("join-{k}");
    let mut cmd = node_ns.command(bin)?;
    cmd.arg("node")
        .arg("--data-dir")
        .arg(node_dir.join("data"))
        .args(&credentials)
        .arg("--runtime-config")
        .arg(node_dir.join("runtime.toml"))
        .args(["--hostname-override", &name])
        .arg("--root-dir")
        .arg(node_dir.join("kubelet"))
        .arg("--pod-logs-dir")
        .arg(node_dir.join("logs"))
        .args(["--cgroup-root", &cgroup.path()])
        .args(["--eviction-hard", EVICTION_HARD])
        .env("NODUS_LOG", "warn");

    // The watch starts first; the clock when the node process is handed to the spawner.
    let (go_tx, go_rx) = mpsc::channel();
    let (node_tx, node_rx) = mpsc::channel::<Result<(Daemon, Instant)>>();
    let log = node_dir.join("node.log");
    let seen = std::thread::scope(|s| {
        let spawner = s.spawn(move || {
            if go_rx.recv_timeout(Duration::from_secs(30)).is_err() {
                return;
            }
            let t0 = Instant::now();
            let d = Daemon::spawn("nodus-node", cmd, &log, Duration::from_secs(10));
            let _ = node_tx.send(d.map(|d| (d, t0)));
        });
        let a = admin.clone();
        let n = name.clone();
        let seen = in_netns(&cp_ns, move || Box::pin(watch_join(a, n, go_tx)));
        let _ = spawner.join();
        seen
    });
    let (mut node, t0) = match node_rx.try_recv() {
        Ok(started) => started?,
        // The watch failed before the node was started: its error says why.
        Err(_) => {
            return Err(seen
                .err()
                .unwrap_or_else(|| anyhow::anyhow!("node not started")));
        }
    };
    let seen = seen.with_context(|| format!("{how:?} join:\n{}", node.log_tail(40)))?;
    node.stop();
    cp.stop();
    let since = |at: Option<Instant>| at.map(|at| at.saturating_duration_since(t0).as_secs_f64());
    Ok(Sample {
        csr_created: since(seen.csr_created),
        csr_issued: since(seen.csr_issued),
        registered: since(seen.registered).context("never registered")?,
        ready: since(seen.ready).context("never Ready")?,
    })
}

fn stats(v: &[f64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    let mut v = v.to_vec();
    format!(
        "{:.2} s ({:.2}–{:.2})",
        pct(&mut v, 50.0),
        v[0],
        v[v.len() - 1]
    )
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin =
        PathBuf::from(std::env::var("NODUS_BIN").unwrap_or_else(|_| "target/release/nodus".into()));
    ensure!(nix::unistd::geteuid().is_root(), "node-join needs root");
    let n = samples();
    let load_start = loadavg();
    let mut token = Vec::new();
    let mut data_dir = Vec::new();
    for k in 0..n {
        // Alternate which join goes first, so drift in the machine's load hits both.
        let order = if k % 2 == 0 {
            [Join::Token, Join::DataDir]
        } else {
            [Join::DataDir, Join::Token]
        };
        for how in order {
            let s = sample(&bin, how, k)?;
            println!(
                "{how:?} #{k}: CSR created {:?} issued {:?}, registered {:.2} s, Ready {:.2} s",
                s.csr_created, s.csr_issued, s.registered, s.ready
            );
            match how {
                Join::Token => token.push(s),
                Join::DataDir => data_dir.push(s),
            }
        }
    }
    let load_end = loadavg();
    let col = |v: &[Sample], f: &dyn Fn(&Sample) -> Option<f64>| -> String {
        stats(&v.iter().filter_map(f).collect::<Vec<_>>())
    };
    let row = |label: &str, v: &[Sample]| {
        format!(
            "| {label} | {} | {} | {} | {} |\n",
            col(v, &|s| s.csr_created),
            col(v, &|s| s.csr_issued),
            col(v, &|s| Some(s.registered)),
            col(v, &|s| Some(s.ready)),
        )
    };
    let body = format!(
        "From spawning `nodus node` (release) to what the API server shows, seen by a watch \
on Nodes and CSRs: median (min–max) of {n} samples each, the two joins alternating, each on \
a fresh `nodus control-plane` in its own network namespace and a fresh node in a second one \
linked by a veth pair (as `crates/nodus/tests/node_join.rs`); no pods. The token was made by \
`nodus token create` and cluster-info signed for it before the clock starts. 2 cores, load \
average {load_start} at the start and {load_end} at the end.\n\n\
| join | client CSR created | CSR issued | Node registered | Node Ready |\n\
| --- | --- | --- | --- | --- |\n{}{}",
        row(
            "`--server --token --discovery-token-ca-cert-hash` (discovery + TLS bootstrap)",
            &token
        ),
        row(
            "`--control-plane-data-dir` (credentials issued from the CA on disk)",
            &data_dir
        ),
    );
    println!("{body}");
    if let Some(p) = write {
        nodus_bench::write_section(
            &p,
            "node-join",
            "## Node join (`bash bench/node-join.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}
