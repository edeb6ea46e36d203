//! `nodus kubelet`: command-line flags (upstream's names and defaults) and the entry point
//! that wires sources, PLEG, pod workers, probers, status and servers together.

use crate::config::{self, PodConfig};
use crate::cri;
use crate::kubelet::{Core, Syncer};
use crate::kuberuntime::sandbox::SandboxSettings;
use crate::kuberuntime::{KubeRuntime, Settings};
use crate::metrics::Metrics;
use crate::pleg::{self, Health, generic::Period};
use crate::pod_workers::PodWorkers;
use crate::prober::ProbeManager;
use crate::server::{self, ServerState};
use crate::status::{ProviderAdapter, StatusManager};
use crate::syncloop::{PodManager, SyncLoop};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Flags of `nodus kubelet`, named and defaulted as upstream's kubelet.
#[derive(Debug, clap::Args)]
pub struct KubeletArgs {
    /// The CRI endpoint, e.g. unix:///run/containerd/containerd.sock.
    #[arg(long, default_value = "unix:///run/nodus/nodus.sock")]
    pub container_runtime_endpoint: String,
    /// Directory for the kubelet's files (pod dirs, volumes).
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub root_dir: PathBuf,
    /// Directory of static pod manifests (upstream's staticPodPath).
    #[arg(long)]
    pub pod_manifest_path: Option<PathBuf>,
    /// URL of a pod manifest or PodList to run as static pods (staticPodURL).
    #[arg(long)]
    pub manifest_url: Option<String>,
    /// How often the static pod directory is re-read besides inotify (fileCheckFrequency).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub file_check_frequency: Duration,
    /// How often the manifest URL is fetched (httpCheckFrequency).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub http_check_frequency: Duration,
    /// The node's name instead of the host name.
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// The node's IP address (default: the first global address of the host).
    #[arg(long)]
    pub node_ip: Option<IpAddr>,
    /// The cgroup under which pod cgroups are created (cgroupfs driver).
    #[arg(long, default_value = "/kubepods")]
    pub cgroup_root: String,
    /// Where containers' logs go (upstream's podLogsDir).
    #[arg(long, default_value = "/var/log/pods")]
    pub pod_logs_dir: PathBuf,
    /// DNS servers pods with dnsPolicy ClusterFirst use (clusterDNS).
    #[arg(long, value_delimiter = ',')]
    pub cluster_dns: Vec<String>,
    /// The cluster's DNS domain (clusterDomain).
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// The resolver file pods with dnsPolicy Default inherit (resolvConf).
    #[arg(long, default_value = "/etc/resolv.conf")]
    pub resolv_conf: PathBuf,
    /// Port of the healthz server; 0 disables it.
    #[arg(long, default_value_t = 10248)]
    pub healthz_port: u16,
    #[arg(long, default_value = "127.0.0.1")]
    pub healthz_bind_address: IpAddr,
    /// The unauthenticated read-only port (/pods, /metrics, /healthz); 0 disables it.
    #[arg(long, default_value_t = 0)]
    pub read_only_port: u16,
    /// Address the read-only port binds to.
    #[arg(long, default_value = "0.0.0.0")]
    pub address: IpAddr,
    /// Feature gates, e.g. EventedPLEG=true.
    #[arg(long, value_delimiter = ',')]
    pub feature_gates: Vec<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("invalid duration {s:?}: use Go's form, e.g. 20s, 1m, 500ms");
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let value: f64 = rest[..n].parse().map_err(|_| err())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        rest = &rest[u..];
        total += Duration::from_secs_f64(value * unit);
    }
    Ok(total)
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Connect(#[from] cri::ConnectError),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("--feature-gates: {0}")]
    FeatureGate(String),
}

fn feature(gates: &[String], name: &str) -> Result<bool, RunError> {
    let mut on = false;
    for g in gates {
        let (k, v) = g
            .split_once('=')
            .ok_or_else(|| RunError::FeatureGate(format!("{g:?} is not NAME=true|false")))?;
        let v: bool = v
            .parse()
            .map_err(|_| RunError::FeatureGate(format!("{g:?}: value must be true or false")))?;
        match k {
            "EventedPLEG" if k == name => on = v,
            "EventedPLEG" => {}
            other => {
                return Err(RunError::FeatureGate(format!(
                    "unrecognized feature gate: {other}"
                )));
            }
        }
    }
    Ok(on)
}

fn node_name(args: &KubeletArgs) -> String {
    if let Some(n) = &args.hostname_override {
        return n.to_lowercase();
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
        .to_lowercase()
}

/// The host's first global IPv4 address (what upstream picks absent --node-ip).
fn host_ip() -> Option<String> {
    let text = std::fs::read_to_string("/proc/net/fib_trie").ok()?;
    // Lines "|-- 10.0.0.5" followed by "/32 host LOCAL" mark local addresses.
    let mut last: Option<&str> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(ip) = t.strip_prefix("|-- ") {
            last = Some(ip);
        } else if t.contains("host LOCAL")
            && let Some(ip) = last
            && !ip.starts_with("127.")
        {
            return Some(ip.to_string());
        }
    }
    None
}

fn node_memory_bytes() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<i64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(1 << 30)
}

/// Runs the kubelet until SIGTERM/SIGINT. Pods keep running when it stops, as upstream's.
pub async fn run(args: KubeletArgs) -> Result<(), RunError> {
    let node = node_name(&args);
    let evented = feature(&args.feature_gates, "EventedPLEG")?;
    for d in [&args.root_dir, &args.pod_logs_dir] {
        std::fs::create_dir_all(d).map_err(|e| RunError::Io(d.display().to_string(), e))?;
    }
    let rt = cri::connect(&args.container_runtime_endpoint, Duration::from_secs(10))?;
    let host_ips: Vec<String> = args
        .node_ip
        .map(|ip| ip.to_string())
        .or_else(host_ip)
        .into_iter()
        .collect();
    let settings = Settings {
        root_dir: args.root_dir.clone(),
        cgroup_root: args.cgroup_root.clone(),
        sandbox: SandboxSettings {
            node_name: node.clone(),
            pod_logs_dir: args.pod_logs_dir.clone(),
            resolv_conf: args.resolv_conf.clone(),
            cluster_dns: args.cluster_dns.clone(),
            cluster_domain: args.cluster_domain.clone(),
        },
        node_cpu_milli: std::thread::available_parallelism()
            .map(|n| n.get() as i64 * 1000)
            .unwrap_or(1000),
        node_memory_bytes: node_memory_bytes(),
        host_ips,
    };
    let status = StatusManager::new();
    let (probes, probe_rx) = ProbeManager::new(
        rt.runtime.clone(),
        Arc::new(ProviderAdapter(status.clone())),
    );
    let kr = Arc::new(KubeRuntime::new(rt.clone(), settings, probes));
    match kr.refresh_runtime_name().await {
        Ok(v) => {
            tracing::info!(node = %node, runtime = %v, endpoint = %rt.endpoint, "connected to the container runtime")
        }
        Err(e) => {
            tracing::warn!(endpoint = %rt.endpoint, error = %e.message(), "container runtime not answering yet; retrying in the background")
        }
    }
    let metrics = Arc::new(Metrics::new());
    let core = Arc::new(Core::new(
        Arc::clone(&kr),
        status.clone(),
        Arc::clone(&metrics),
    ));
    let workers = PodWorkers::new(Arc::new(Syncer(Arc::clone(&core))));

    let (pod_config, config_rx) = PodConfig::new();
    let mut sources: Vec<&'static str> = Vec::new();
    if let Some(dir) = &args.pod_manifest_path {
        sources.push(config::FILE_SOURCE);
        config::spawn_file_source(
            dir.clone(),
            node.clone(),
            args.file_check_frequency,
            pod_config.channel(config::FILE_SOURCE),
        );
    }
    if let Some(url) = &args.manifest_url {
        sources.push(config::HTTP_SOURCE);
        config::spawn_http_source(
            url.clone(),
            node.clone(),
            args.http_check_frequency,
            pod_config.channel(config::HTTP_SOURCE),
        );
    }
    if sources.is_empty() {
        tracing::warn!(
            "no pod source configured (--pod-manifest-path, --manifest-url): this kubelet runs nothing"
        );
    }

    let (pleg_tx, pleg_rx) = tokio::sync::mpsc::unbounded_channel();
    let health = Arc::new(Health::new(pleg::RELIST_THRESHOLD));
    let period = Arc::new(Period::new(pleg::evented::NORMAL_RELIST));
    tokio::spawn(pleg::generic::run(
        rt.clone(),
        Arc::clone(&period),
        Arc::clone(&health),
        Arc::clone(&metrics),
        pleg_tx.clone(),
    ));
    if evented {
        tokio::spawn(pleg::evented::run(
            rt.clone(),
            Arc::clone(&period),
            Arc::clone(&health),
            pleg_tx,
        ));
    }

    let pods = PodManager::default();
    let last_iteration = Arc::new(Mutex::new(Instant::now()));
    let state = ServerState {
        pleg: Arc::clone(&health),
        last_iteration: Arc::clone(&last_iteration),
        metrics: Arc::clone(&metrics),
        pods: pods.clone(),
        status: status.clone(),
    };
    if args.healthz_port != 0 {
        let addr = SocketAddr::new(args.healthz_bind_address, args.healthz_port);
        let st = state.clone();
        tokio::spawn(async move {
            if let Err(e) = server::serve_healthz(addr, st).await {
                tracing::error!(address = %addr, error = %e, "healthz server failed");
            }
        });
    }
    if args.read_only_port != 0 {
        let addr = SocketAddr::new(args.address, args.read_only_port);
        let st = state.clone();
        tokio::spawn(async move {
            if let Err(e) = server::serve_read_only(addr, st).await {
                tracing::error!(address = %addr, error = %e, "read-only server failed");
            }
        });
    }

    let cfg = pod_config.clone();
    let sync_loop = SyncLoop {
        core,
        workers,
        pods,
        sources_ready: Box::new(move || cfg.seen_all_sources(&sources)),
        last_iteration,
    };
    tracing::info!(node = %node, evented_pleg = evented, "kubelet started");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| RunError::Io("SIGTERM handler".into(), e))?;
    tokio::select! {
        _ = sync_loop.run(config_rx, pleg_rx, probe_rx) => {}
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; the kubelet stops, pods keep running"),
        _ = term.recv() => tracing::info!("terminated; the kubelet stops, pods keep running"),
    }
    drop(pod_config);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_duration("20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("20").is_err());
        assert!(parse_duration("1d").is_err());
    }

    #[test]
    fn feature_gates_are_checked() {
        assert!(feature(&["EventedPLEG=true".into()], "EventedPLEG").unwrap());
        assert!(!feature(&[], "EventedPLEG").unwrap());
        let e = feature(&["Nope=true".into()], "EventedPLEG").unwrap_err();
        assert_eq!(
            e.to_string(),
            "--feature-gates: unrecognized feature gate: Nope"
        );
    }
}
