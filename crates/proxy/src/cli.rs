//! `nodus proxy`: flags (upstream kube-proxy's names and defaults), the KubeProxyConfiguration
//! merge (flags win), and the entry point wiring watches, the sync loop and the servers.

use crate::backend::Backend;
use crate::changetracker::ChangeTracker;
use crate::config::{KubeProxyConfiguration, parse_duration};
use crate::healthcheck::{ProxyHealth, ServiceHealthServers};
use crate::metrics::Metrics;
use crate::model::{Cidr, NodeContext, Snapshot};
use crate::proxier::{Periods, Proxier, Wake};
use crate::{iptables, nftables};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// Flags of `nodus proxy`. Flags left unset take their value from `--config`, then
/// upstream's default.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ProxyArgs {
    /// Kubeconfig of the API server to watch.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// A kubeproxy.config.k8s.io/v1alpha1 KubeProxyConfiguration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// nftables (default) or iptables. ipvs is not supported.
    #[arg(long)]
    pub proxy_mode: Option<String>,
    /// The node's name, to tell local endpoints from others [default: the host name].
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// The pods' CIDR: traffic to a ClusterIP from outside it is masqueraded.
    #[arg(long)]
    pub cluster_cidr: Option<String>,
    /// CIDRs of the node addresses NodePorts answer on [default: every local address but
    /// 127.0.0.0/8].
    #[arg(long, value_delimiter = ',')]
    pub nodeport_addresses: Vec<String>,
    /// Address of /healthz and /livez [default: 0.0.0.0:10256]; port 0 disables it.
    #[arg(long)]
    pub healthz_bind_address: Option<String>,
    /// Address of /metrics [default: 127.0.0.1:10249]; port 0 disables it.
    #[arg(long)]
    pub metrics_bind_address: Option<String>,
    /// How often a full resync runs [default: 30s].
    #[arg(long)]
    pub sync_period: Option<String>,
    /// The shortest time between two syncs [default: 1s].
    #[arg(long)]
    pub min_sync_period: Option<String>,
    /// SNAT every packet to a service.
    #[arg(long)]
    pub masquerade_all: Option<bool>,
    /// Print, per service, the rules this mode programs for the API's current state, and exit.
    #[arg(long)]
    pub show_rules: bool,
    /// Remove every rule this proxy made (both modes) and exit.
    #[arg(long)]
    pub cleanup: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(
        "proxy mode {0:?} is not supported: IPVS is absent from this kernel and deprecated upstream; use --proxy-mode nftables (default) or iptables"
    )]
    Ipvs(String),
    #[error("unknown proxy mode {0:?}: use nftables (default) or iptables")]
    Mode(String),
    #[error("--kubeconfig (or clientConnection.kubeconfig) is required")]
    NoKubeconfig,
    #[error("kubeconfig {path}: {err}")]
    Kubeconfig { path: String, err: String },
    #[error("{flag}: {value:?} is not an IPv4 CIDR")]
    Cidr { flag: &'static str, value: String },
    #[error("{flag}: {value:?} is not an address:port")]
    Addr { flag: &'static str, value: String },
    #[error("listing {what}: {err}")]
    List { what: &'static str, err: String },
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
}

/// The proxy mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Nftables,
    Iptables,
}

/// Flags and config file merged.
#[derive(Clone, Debug)]
pub struct Settings {
    pub kubeconfig: Option<PathBuf>,
    pub mode: Mode,
    pub hostname: String,
    pub ctx: NodeContext,
    pub healthz: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
    pub periods: Periods,
}

fn parse_cidr(flag: &'static str, s: &str) -> Result<Cidr, ProxyError> {
    let s = s.trim();
    s.parse::<Cidr>()
        .or_else(|_| s.parse::<Ipv4Addr>().map(Cidr::from))
        .map(|c| c.trunc())
        .map_err(|_| ProxyError::Cidr {
            flag,
            value: s.to_string(),
        })
}

fn parse_addr(flag: &'static str, s: &str) -> Result<Option<SocketAddr>, ProxyError> {
    let a: SocketAddr = s.parse().map_err(|_| ProxyError::Addr {
        flag,
        value: s.to_string(),
    })?;
    Ok((a.port() != 0).then_some(a))
}

/// The IPv4 addresses on this network namespace's interfaces.
pub fn local_addresses() -> Vec<Ipv4Addr> {
    let Ok(out) = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            it.find(|w| *w == "inet")?;
            it.next()?.split('/').next()?.parse().ok()
        })
        .collect()
}

fn default_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".into())
}

impl Settings {
    pub fn resolve(args: &ProxyArgs) -> Result<Settings, ProxyError> {
        let cfg = match &args.config {
            Some(p) => KubeProxyConfiguration::load(p)?,
            None => KubeProxyConfiguration::default(),
        };
        let mode_s = args
            .proxy_mode
            .clone()
            .or(cfg.mode.clone())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "nftables".into());
        let mode = match mode_s.as_str() {
            "nftables" => Mode::Nftables,
            "iptables" => Mode::Iptables,
            "ipvs" => return Err(ProxyError::Ipvs(mode_s)),
            _ => return Err(ProxyError::Mode(mode_s)),
        };
        let section = match mode {
            Mode::Nftables => cfg.nftables.as_ref(),
            Mode::Iptables => cfg.iptables.as_ref(),
        };
        let dur = |flag: &Option<String>,
                   top: &Option<String>,
                   sec: Option<&String>,
                   def: Duration|
         -> Result<Duration, ProxyError> {
            match flag.as_ref().or(top.as_ref()).or(sec) {
                Some(s) => Ok(parse_duration(s)?),
                None => Ok(def),
            }
        };
        let periods = Periods {
            sync: dur(
                &args.sync_period,
                &cfg.sync_period,
                section.and_then(|s| s.sync_period.as_ref()),
                Duration::from_secs(30),
            )?,
            min_sync: dur(
                &args.min_sync_period,
                &cfg.min_sync_period,
                section.and_then(|s| s.min_sync_period.as_ref()),
                Duration::from_secs(1),
            )?,
        };
        let cluster_cidr = match args.cluster_cidr.as_ref().or(cfg.cluster_cidr.as_ref()) {
            Some(c) if !c.is_empty() => Some(parse_cidr(
                "--cluster-cidr",
                c.split(',').next().unwrap_or(c),
            )?),
            _ => None,
        };
        let np: Vec<String> = if args.nodeport_addresses.is_empty() {
            cfg.node_port_addresses.clone().unwrap_or_default()
        } else {
            args.nodeport_addresses.clone()
        };
        let mut nodeport_ips = Vec::new();
        if !np.is_empty() {
            let cidrs = np
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| parse_cidr("--nodeport-addresses", s))
                .collect::<Result<Vec<_>, _>>()?;
            nodeport_ips = local_addresses()
                .into_iter()
                .filter(|ip| !ip.is_loopback() && cidrs.iter().any(|c| c.contains(ip)))
                .collect();
        }
        let masquerade_all = args
            .masquerade_all
            .or(section.and_then(|s| s.masquerade_all))
            .unwrap_or(false);
        let healthz = parse_addr(
            "--healthz-bind-address",
            args.healthz_bind_address
                .as_deref()
                .or(cfg.healthz_bind_address.as_deref())
                .unwrap_or("0.0.0.0:10256"),
        )?;
        let metrics = parse_addr(
            "--metrics-bind-address",
            args.metrics_bind_address
                .as_deref()
                .or(cfg.metrics_bind_address.as_deref())
                .unwrap_or("127.0.0.1:10249"),
        )?;
        let kubeconfig = args.kubeconfig.clone().or_else(|| {
            cfg.client_connection
                .as_ref()
                .and_then(|c| c.kubeconfig.clone())
                .filter(|k| !k.is_empty())
                .map(PathBuf::from)
        });
        let hostname = args
            .hostname_override
            .clone()
            .or(cfg.hostname_override.clone())
            .filter(|h| !h.is_empty())
            .map(|h| h.to_lowercase())
            .unwrap_or_else(default_hostname);
        Ok(Settings {
            kubeconfig,
            mode,
            hostname,
            ctx: NodeContext {
                cluster_cidr,
                nodeport_ips,
                zone: None,
                masquerade_all,
            },
            healthz,
            metrics,
            periods,
        })
    }
}

/// The backend for `mode`, programming the current network namespace.
pub fn backend(mode: Mode) -> Box<dyn Backend> {
    match mode {
        Mode::Nftables => Box::new(nftables::Nftables::new(
            Box::new(nftables::NftRunner::new()),
        )),
        Mode::Iptables => Box::new(iptables::Iptables::new(Box::new(iptables::RestoreRunner))),
    }
}

async fn client(s: &Settings) -> Result<kube::Client, ProxyError> {
    let path = s.kubeconfig.as_ref().ok_or(ProxyError::NoKubeconfig)?;
    let shown = path.display().to_string();
    let err = |e: String| ProxyError::Kubeconfig {
        path: shown.clone(),
        err: e,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| err(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| err(e.to_string()))
}

/// Runs `nodus proxy` until SIGINT or SIGTERM.
pub async fn run(args: ProxyArgs) -> Result<(), ProxyError> {
    run_until(args, async {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = term.recv() => {}
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    })
    .await
}

/// Runs the proxy until `shutdown` completes (how `nodus node` embeds it).
pub async fn run_until(
    args: ProxyArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ProxyError> {
    let settings = Settings::resolve(&args)?;
    if args.cleanup {
        let mut ok = true;
        for mode in [Mode::Nftables, Mode::Iptables] {
            if let Err(e) = backend(mode).cleanup() {
                tracing::warn!(error = %e, ?mode, "cleanup");
                ok = false;
            }
        }
        if ok {
            println!("removed the kube-proxy rules of both modes");
        }
        return Ok(());
    }
    let client = client(&settings).await?;
    if args.show_rules {
        let text = show_rules(&client, &settings).await?;
        print!("{text}");
        return Ok(());
    }
    tracing::info!(
        mode = ?settings.mode, hostname = %settings.hostname,
        sync_period = ?settings.periods.sync, min_sync_period = ?settings.periods.min_sync,
        "starting proxy"
    );
    let tracker = Arc::new(Mutex::new(ChangeTracker::new(&settings.hostname)));
    let metrics = Arc::new(Metrics::new(settings.mode == Mode::Iptables));
    let health = Arc::new(ProxyHealth::new(settings.periods.sync * 2));
    let (tx, rx) = mpsc::channel::<Wake>();
    let svc_synced = Arc::new(AtomicBool::new(false));
    let eps_synced = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    if let Some(addr) = settings.healthz {
        let h = health.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = crate::healthcheck::serve_healthz(addr, h).await {
                tracing::error!(address = %addr, error = %e, "healthz server failed");
            }
        }));
    }
    if let Some(addr) = settings.metrics {
        let (m, h) = (metrics.clone(), health.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = crate::healthcheck::serve_metrics(addr, m, h).await {
                tracing::error!(address = %addr, error = %e, "metrics server failed");
            }
        }));
    }
    let queued = {
        let (m, h) = (metrics.clone(), health.clone());
        move || {
            m.queued();
            h.queued();
        }
    };
    tasks.push(tokio::spawn(crate::watch::services(
        client.clone(),
        tracker.clone(),
        tx.clone(),
        svc_synced.clone(),
        queued.clone(),
    )));
    tasks.push(tokio::spawn(crate::watch::endpoint_slices(
        client.clone(),
        tracker.clone(),
        tx.clone(),
        eps_synced.clone(),
        queued,
    )));
    tasks.push(tokio::spawn(crate::watch::node_zone(
        client.clone(),
        settings.hostname.clone(),
        settings.ctx.clone(),
        tx.clone(),
    )));
    let proxier = Proxier::new(
        tracker,
        backend(settings.mode),
        settings.ctx.clone(),
        metrics,
        health,
    );
    let handle = tokio::runtime::Handle::current();
    let periods = settings.periods;
    let sync_thread = std::thread::Builder::new()
        .name("proxy-sync".into())
        .spawn(move || {
            let mut hc = ServiceHealthServers::default();
            crate::proxier::run_loop(
                proxier,
                rx,
                periods,
                move || svc_synced.load(Ordering::SeqCst) && eps_synced.load(Ordering::SeqCst),
                move |p| hc.sync(&handle, p.health_check_ports()),
            );
        })
        .map_err(|e| ProxyError::List {
            what: "sync thread",
            err: e.to_string(),
        })?;
    shutdown.await;
    tracing::info!("proxy stopping; rules stay in place as upstream leaves them");
    for t in &tasks {
        t.abort();
    }
    drop(tx);
    let _ = tokio::task::spawn_blocking(move || sync_thread.join()).await;
    Ok(())
}

/// The snapshot of the API's current services, as the proxy would see it.
pub async fn snapshot(client: &kube::Client, hostname: &str) -> Result<Snapshot, ProxyError> {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let lp = kube::api::ListParams::default();
    let svcs = kube::Api::<Service>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|e| ProxyError::List {
            what: "services",
            err: e.to_string(),
        })?;
    let slices = kube::Api::<EndpointSlice>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|e| ProxyError::List {
            what: "endpointslices",
            err: e.to_string(),
        })?;
    let mut t = ChangeTracker::new(hostname);
    for s in &svcs.items {
        t.service_update(s);
    }
    for s in &slices.items {
        t.slice_update(s);
    }
    let mut snap = Snapshot::new();
    for svc in t.all_services() {
        for e in t.entries(&svc) {
            snap.insert(e.port.name.clone(), e);
        }
    }
    Ok(snap)
}

const NFT_WALK: &str = "\
# How a packet to a Service meets these rules (nftables mode, table ip kube-proxy):
#  1. nat-prerouting / nat-output jump to `services`. Traffic to a ClusterIP from outside
#     the cluster CIDR is marked for masquerade.
#  2. A ClusterIP without session affinity: `dnat … map @service-endpoints-<proto>` looks
#     (ClusterIP . port . numgen random mod 65536) up — one lookup however many services
#     exist — and each endpoint owns an equal range of the random number (equal shares).
#  3. Anything else (sessionAffinity, NodePorts, externalIPs, LoadBalancer IPs) goes through
#     the verdict maps `service-ips` / `service-nodeports` to the service's chain, where
#     `numgen random mod N == 0` rules pick an endpoint (the first takes 1/N of new flows,
#     the next 1/(N-1) of the rest, …); with sessionAffinity the client's address in an
#     affinity set goes first, to an endpoint chain that DNATs to the pod IP:port.
#  4. conntrack pins the flow; replies are un-DNATed; nat-postrouting masquerades marked
#     packets and hairpin flows (a pod reaching itself: `endpoint-hairpin`). No endpoints:
#     `no-endpoint-services` sends the packet to reject-chain.
";

const IPT_WALK: &str = "\
# How a packet to a Service meets these rules (iptables mode, nat table):
#  1. PREROUTING / OUTPUT jump to KUBE-SERVICES, which matches VIP + port and jumps to
#     the service's KUBE-SVC-… chain (NodePorts: KUBE-NODEPORTS → KUBE-EXT-…).
#  2. KUBE-SVC-… picks one KUBE-SEP-… chain with the statistic module, equal shares.
#  3. KUBE-SEP-… DNATs to the pod IP:port (and marks hairpin traffic for masquerade).
#  4. conntrack pins the flow; KUBE-POSTROUTING masquerades marked packets. No endpoints:
#     the filter table's KUBE-SERVICES rejects.
";

async fn show_rules(client: &kube::Client, s: &Settings) -> Result<String, ProxyError> {
    let snap = snapshot(client, &s.hostname).await?;
    let b = backend(s.mode);
    let walk = match s.mode {
        Mode::Nftables => NFT_WALK,
        Mode::Iptables => IPT_WALK,
    };
    Ok(format!("{walk}\n{}", b.show_rules(&snap, &s.ctx)))
}
