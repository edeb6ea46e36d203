//! Cluster DNS: the Kubernetes DNS-based service discovery specification served from
//! Services and EndpointSlices, answering as CoreDNS's `kubernetes` plugin does under the
//! default Corefile (`pods insecure`, reverse zones with fallthrough, `forward .
//! /etc/resolv.conf`, TTL 5 s).
//!
//! Owns only its UDP and TCP listeners and its watches; every `nodus node` runs it
//! in-process through [`run_until`], and `nodus dns` runs it alone.
//!
//! - `records`: the store, Services and EndpointSlices by name and reverse IP;
//! - `answer`: query → response, pure;
//! - `forward`: the upstream resolvers of resolv.conf;
//! - `server`: the UDP and TCP listeners;
//! - `watch`: the API watches feeding the store.

mod answer;
mod forward;
mod records;
mod server;
mod watch;

pub use forward::ForwardError;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// CoreDNS's ceiling for the `ttl` option.
const MAX_TTL: u32 = 3600;

/// Flags of `nodus dns`.
#[derive(Debug, Clone, clap::Args)]
pub struct DnsConfig {
    /// Kubeconfig of the API server to watch [default: $KUBECONFIG or ~/.kube/config, then
    /// in-cluster].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Addresses to serve DNS on, UDP and TCP.
    #[arg(long, value_delimiter = ',', default_value = "0.0.0.0:53")]
    pub listen: Vec<SocketAddr>,
    /// The cluster's DNS domain (kubelet's --cluster-domain).
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// The resolv.conf whose nameservers answer names outside the cluster domain.
    #[arg(long, default_value = "/etc/resolv.conf")]
    pub resolv_conf: PathBuf,
    /// TTL of the answers, in seconds (0 to 3600).
    #[arg(long, default_value_t = 5)]
    pub ttl: u32,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            listen: vec![SocketAddr::from(([0, 0, 0, 0], 53))],
            cluster_domain: "cluster.local".into(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            ttl: 5,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("--ttl {0}: must be between 0 and {MAX_TTL}")]
    Ttl(u32),
    #[error("--cluster-domain: {0}")]
    Domain(String),
    #[error("--listen: at least one address is required")]
    NoListen,
    #[error(transparent)]
    Forward(#[from] ForwardError),
    #[error("kubeconfig {path}: {err}")]
    Kubeconfig { path: String, err: String },
    #[error("{0}")]
    Bind(std::io::Error),
}

async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, DnsError> {
    let shown = kubeconfig
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "($KUBECONFIG, ~/.kube/config or in-cluster)".into());
    let err = |e: String| DnsError::Kubeconfig {
        path: shown.clone(),
        err: e,
    };
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| err(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| err(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| err(e.to_string()))
}

/// Runs `nodus dns` until SIGINT or SIGTERM.
pub async fn run(config: DnsConfig) -> Result<(), DnsError> {
    run_until(config, async {
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
    })
    .await
}

/// Serves cluster DNS until `shutdown` completes. Returns an error when the configuration
/// is invalid or a listen address cannot be bound.
pub async fn run_until(
    config: DnsConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DnsError> {
    run_until_bound(config, None, shutdown).await
}

/// [`run_until`], telling `bound` once every listener is bound and the first listing of
/// Services and EndpointSlices is in (how `nodus node` embeds it: only then does the node
/// announce DNS on its Node).
pub async fn run_until_bound(
    config: DnsConfig,
    bound: Option<tokio::sync::oneshot::Sender<()>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DnsError> {
    if config.ttl > MAX_TTL {
        return Err(DnsError::Ttl(config.ttl));
    }
    if config.listen.is_empty() {
        return Err(DnsError::NoListen);
    }
    let zone = answer::Zone::new(&config.cluster_domain, config.ttl).map_err(DnsError::Domain)?;
    let upstreams = forward::read_resolv_conf(&config.resolv_conf)?;
    let forwarder = forward::Forwarder::new(upstreams, &config.listen);
    if forwarder.upstreams().is_empty() {
        tracing::warn!(resolv_conf = %config.resolv_conf.display(), "no upstream nameserver: names outside the cluster domain get SERVFAIL");
    }
    let client = client(config.kubeconfig.as_deref()).await?;
    let (udp, tcp) = server::bind(&config.listen).await.map_err(DnsError::Bind)?;
    let store = Arc::new(RwLock::new(records::Records::new()));
    let handler = Arc::new(server::Handler {
        zone,
        store: store.clone(),
        forwarder,
    });
    tracing::info!(
        listen = ?config.listen, domain = %config.cluster_domain,
        upstreams = ?handler.forwarder.upstreams(), "serving cluster DNS"
    );
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(watch::run(client, store.clone()));
    if let Some(b) = bound {
        // Announced once the first listing is in: before that every cluster name would fail.
        let store = store.clone();
        tasks.spawn(async move {
            while !store.read().is_ok_and(|s| s.synced()) {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            let _ = b.send(());
            std::future::pending::<()>().await;
        });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for s in udp {
        threads.extend(
            server::serve_udp(
                handler.clone(),
                s,
                tokio::runtime::Handle::current(),
                stop.clone(),
            )
            .map_err(DnsError::Bind)?,
        );
    }
    for l in tcp {
        tasks.spawn(server::serve_tcp(handler.clone(), l));
    }
    shutdown.await;
    stop.store(true, Ordering::Relaxed);
    tasks.shutdown().await;
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await;
    let n = store.read().map(|s| s.service_count()).unwrap_or(0);
    tracing::info!(services = n, "cluster DNS stopped");
    Ok(())
}
