//! `nodus node`: a whole worker node in one process — nodus's CRI runtime, the kubelet
//! pointed at it, kube-proxy and the pod network agent ([`nodus_podnet`], flannel's role:
//! `--flannel-backend host-gw|vxlan|none`) — joining a control plane through a kubeconfig.
//!
//! Joining: `--server URL --token T --discovery-token-ca-cert-hash sha256:H` joins with no
//! secret on the node but the token ([`crate::join`]'s discovery, then the kubelet's TLS
//! bootstrap for a client certificate and a CSR for its serving certificate); or pass
//! `--kubeconfig FILE` (a kubeconfig whose client certificate is
//! `system:node:<name>` in `system:nodes`); or, on the control plane's machine,
//! `--control-plane-data-dir DIR`: the node then issues its own credentials from the
//! cluster CA in `DIR/pki` (written to `DIR/nodes/<name>.kubeconfig`), which is how a
//! second node joins a `nodus control-plane` without a bootstrap token.

use anyhow::Context as _;
use std::path::PathBuf;

/// clusterDNS unless `--cluster-dns` or the kubelet config says otherwise: the tenth address
/// of the control plane's default service CIDR (10.96.0.0/12).
pub const DEFAULT_CLUSTER_DNS: &str = "10.96.0.10";

/// Flags of `nodus node`: its own, the runtime's, and every kubelet flag.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// Where the runtime keeps images and state (`runtime/`) and its socket (`run/`).
    #[arg(long, default_value = "/var/lib/nodus/node")]
    pub data_dir: PathBuf,
    /// The data dir of a `nodus control-plane` on this machine: issue this node's
    /// credentials from its CA instead of reading --kubeconfig.
    #[arg(long)]
    pub control_plane_data_dir: Option<PathBuf>,
    /// The API server URL written into issued credentials [default: the one in the
    /// control plane's admin.kubeconfig]. Several, comma-separated (the API servers of one
    /// HA control plane): the node reaches them through a local load balancer on
    /// 127.0.0.1:--apiserver-lb-port, as k3s's agent does, and fails over when one dies.
    #[arg(long)]
    pub server: Option<String>,
    /// The port of the local API server load balancer (with several --server URLs).
    #[arg(long, default_value_t = nodus_serving::loadbalancer::DEFAULT_PORT)]
    pub apiserver_lb_port: u16,
    /// A bootstrap token (`nodus token create`) to join the cluster at --server with.
    #[arg(long)]
    pub token: Option<String>,
    /// The SHA-256 of the cluster CA's public key (`sha256:<hex>`) that token discovery
    /// must find; repeatable.
    #[arg(long)]
    pub discovery_token_ca_cert_hash: Vec<String>,
    /// How long token discovery waits for the API server to answer with cluster-info
    /// signed for --token (kubeadm's discovery.timeout).
    #[arg(long, default_value = "5m", value_parser = parse_timeout)]
    pub discovery_timeout: std::time::Duration,
    /// The runtime's configuration file (as `nodus runtime --config`).
    #[arg(long)]
    pub runtime_config: Option<PathBuf>,
    /// kube-proxy's mode: nftables (default) or iptables.
    #[arg(long)]
    pub proxy_mode: Option<String>,
    /// kube-proxy's KubeProxyConfiguration file.
    #[arg(long)]
    pub proxy_config: Option<PathBuf>,
    /// The pods' CIDR, for kube-proxy's masquerading of traffic from outside it.
    #[arg(long)]
    pub cluster_cidr: Option<String>,
    /// Run the node without kube-proxy (Services are not programmed here).
    #[arg(long)]
    pub disable_proxy: bool,
    /// Do not serve cluster DNS on this node (pods still resolve through other nodes').
    #[arg(long)]
    pub disable_cluster_dns: bool,
    /// The port this node serves cluster DNS on, at its node IP.
    #[arg(long, default_value_t = 53)]
    pub cluster_dns_port: u16,
    /// The pod network across nodes (k3s's flag): host-gw (a route per node, nodes on one
    /// L2 segment), vxlan (an overlay, nodes only need to reach each other) or none (bring
    /// your own CNI; nothing is programmed).
    #[arg(long, value_enum, default_value_t)]
    pub flannel_backend: nodus_podnet::Backend,
    #[command(flatten)]
    pub kubelet: nodus_kubelet::cli::KubeletArgs,
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    nodus_k8s::duration::parse_duration(s)
}

/// The `server:` of the first cluster in a kubeconfig.
fn server_of(kubeconfig: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .map(|s| s.trim().trim_matches(|c| c == '"' || c == '\'').to_string())
        .filter(|s| !s.is_empty())
        .with_context(|| format!("{} names no server", kubeconfig.display()))
}

/// Starts kube-proxy beside the kubelet, with the node's identity; it stops when `stop`
/// fires. A proxy that fails is logged, not fatal: pods keep running without Services, as
/// they would with upstream's separate kube-proxy down.
fn start_proxy(
    args: &NodeArgs,
    node: &str,
    kubeconfig: &std::path::Path,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Option<tokio::task::JoinHandle<()>> {
    if args.disable_proxy {
        tracing::info!("kube-proxy disabled: Services are not programmed on this node");
        return None;
    }
    let proxy = nodus_proxy::ProxyArgs {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        config: args.proxy_config.clone(),
        proxy_mode: args.proxy_mode.clone(),
        hostname_override: Some(node.to_string()),
        cluster_cidr: args.cluster_cidr.clone(),
        ..Default::default()
    };
    Some(tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.await;
        };
        if let Err(e) = nodus_proxy::run_until(proxy, shutdown).await {
            tracing::error!(error = %e, "kube-proxy stopped: Services are not programmed on this node");
        }
    }))
}

/// Starts the pod network agent beside the kubelet; it stops when `stop` fires. Like the
/// proxy, an agent that fails is logged, not fatal.
fn start_podnet(
    args: &NodeArgs,
    node: &str,
    kubeconfig: &std::path::Path,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Option<tokio::task::JoinHandle<()>> {
    if args.flannel_backend == nodus_podnet::Backend::None {
        tracing::info!("--flannel-backend none: the pod network across nodes is not programmed");
        return None;
    }
    let podnet = nodus_podnet::PodnetArgs {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        hostname_override: Some(node.to_string()),
        flannel_backend: args.flannel_backend,
        ..Default::default()
    };
    Some(tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.await;
        };
        if let Err(e) = nodus_podnet::run_until(podnet, shutdown).await {
            tracing::error!(error = %e, "pod network agent stopped: pods reach no other node");
        }
    }))
}

/// Token join: discovery, then the client certificate by TLS bootstrap (before kube-proxy
/// needs the kubeconfig), a serving certificate by CSR, and rotation of both.
async fn join_with_token(args: &mut NodeArgs, node: &str, token: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.control_plane_data_dir.is_none(),
        "--token and --control-plane-data-dir are alternatives"
    );
    let servers =
        nodus_serving::loadbalancer::split_servers(args.server.as_deref().unwrap_or_default());
    anyhow::ensure!(
        !servers.is_empty(),
        "--token needs --server https://HOST:PORT (the API server to join)"
    );
    let hashes = args
        .discovery_token_ca_cert_hash
        .iter()
        .map(|h| crate::join::parse_ca_hash(h))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let dir = args.data_dir.join("kubelet");
    let kubeconfig = args
        .kubelet
        .kubeconfig
        .clone()
        .unwrap_or_else(|| dir.join("kubelet.kubeconfig"));
    let cert_dir = args
        .kubelet
        .cert_dir
        .clone()
        .unwrap_or_else(|| args.kubelet.root_dir.join("pki"));
    // A node that joined before restarts on its own certificate; the token may be gone.
    let joined = kubeconfig.exists()
        && nodus_kubelet::certificate::current_valid(
            &cert_dir,
            nodus_kubelet::certificate::Kind::Client,
        );
    let ca = dir.join("pki").join("ca.crt");
    if !joined {
        // Discovery from the first API server that is trusted; the bootstrap kubeconfig
        // names that one (with several servers the node's own kubeconfig is rewritten to the
        // local load balancer afterwards).
        let (server, info) =
            crate::join::discover(&servers, token, &hashes, args.discovery_timeout).await?;
        let (bootstrap, _) = crate::join::write_bootstrap(&dir, &server, token, &info)?;
        tracing::info!(server = %server, "cluster-info verified with the token and the CA hash");
        nodus_kubelet::certificate::bootstrap_client(&kubeconfig, &bootstrap, &cert_dir, node)
            .await
            .context("TLS bootstrap of the kubelet's client certificate")?;
    }
    args.kubelet.kubeconfig = Some(kubeconfig);
    args.kubelet.cert_dir = Some(cert_dir);
    args.kubelet.rotate_certificates.get_or_insert(true);
    if args.kubelet.tls_cert_file.is_none() {
        args.kubelet.rotate_server_certificates.get_or_insert(true);
    }
    if args.kubelet.client_ca_file.is_none() {
        args.kubelet.client_ca_file = Some(ca);
    }
    Ok(())
}

/// Runs the runtime and the kubelet until SIGTERM/SIGINT. `nodus up` calls this with the
/// control plane's data dir.
pub async fn run(mut args: NodeArgs) -> anyhow::Result<()> {
    let node = nodus_kubelet::cli::node_name(&args.kubelet);
    if args.kubelet.default_cluster_dns.is_empty() {
        // The kube-dns Service of a control plane on the default service CIDR.
        args.kubelet.default_cluster_dns = vec![DEFAULT_CLUSTER_DNS.to_string()];
    }
    let servers =
        nodus_serving::loadbalancer::split_servers(args.server.as_deref().unwrap_or_default());
    if let Some(cp) = &args.control_plane_data_dir {
        let server = match servers.first() {
            Some(s) => s.clone(),
            None => server_of(&cp.join("admin.kubeconfig"))?,
        };
        let path = nodus_control_plane::pki::issue_node_kubeconfig(cp, &node, &server)
            .with_context(|| format!("issuing credentials for node {node}"))?;
        tracing::info!(node = %node, kubeconfig = %path.display(), "issued node credentials from the control plane's CA");
        args.kubelet.kubeconfig = Some(path);
        // A serving certificate from the same CA for the kubelet API, naming the address
        // the API server dials (the Node's InternalIP), so logs/exec/port-forward verify.
        if args.kubelet.tls_cert_file.is_none() {
            let mut ips: Vec<std::net::IpAddr> = nodus_kubelet::cli::node_ip(&args.kubelet)
                .into_iter()
                .collect();
            ips.push(std::net::IpAddr::from([127, 0, 0, 1]));
            // `--address` binds the kubelet API to one address: the certificate names it.
            if let Some(a) = args.kubelet.address
                && !a.is_unspecified()
                && !ips.contains(&a)
            {
                ips.push(a);
            }
            let (crt, key) = nodus_control_plane::pki::issue_kubelet_serving_cert(cp, &node, &ips)
                .with_context(|| {
                    format!("issuing the kubelet serving certificate of node {node}")
                })?;
            args.kubelet.tls_cert_file = Some(crt);
            args.kubelet.tls_private_key_file = Some(key);
        }
        if args.kubelet.client_ca_file.is_none() {
            args.kubelet.client_ca_file = Some(cp.join("pki").join("ca.crt"));
        }
    }
    if let Some(token) = args.token.clone() {
        join_with_token(&mut args, &node, &token).await?;
    }
    let Some(mut kubeconfig) = args.kubelet.kubeconfig.clone() else {
        anyhow::bail!(
            "`nodus node` needs --server URL --token T --discovery-token-ca-cert-hash sha256:H, --kubeconfig FILE (a system:node:<name> kubeconfig) or --control-plane-data-dir DIR"
        );
    };
    // Kept alive for the node's lifetime: every component's connections go through it.
    let _lb = if servers.len() > 1 {
        let listen = std::net::SocketAddr::from(([127, 0, 0, 1], args.apiserver_lb_port));
        let lb = nodus_serving::loadbalancer::LoadBalancer::start(listen, &servers).await?;
        let lb_kubeconfig = args
            .data_dir
            .join("kubelet")
            .join("apiserver-lb.kubeconfig");
        nodus_serving::private::create_dir(&args.data_dir.join("kubelet"))?;
        crate::loadbalancer::rewrite_kubeconfig(&kubeconfig, &lb_kubeconfig, &lb.url())?;
        kubeconfig = lb_kubeconfig;
        args.kubelet.kubeconfig = Some(kubeconfig.clone());
        Some(lb)
    } else {
        None
    };
    let socket = args.data_dir.join("run").join("nodus.sock");
    if args.kubelet.container_runtime_endpoint.is_none() {
        args.kubelet.container_runtime_endpoint = Some(format!("unix://{}", socket.display()));
    }
    let mut config = match &args.runtime_config {
        Some(p) => nodus_runtime::config::RuntimeConfig::load(p)?,
        // nodus's own node brings each pod's `lo` up itself, as CRI-O does: a plugin process
        // per pod less. A runtime config file decides for itself (containerd's default, the
        // loopback plugin, when it does not say).
        None => nodus_runtime::config::RuntimeConfig {
            use_internal_loopback: true,
            ..Default::default()
        },
    };
    if args.flannel_backend != nodus_podnet::Backend::None {
        // The agent's table masquerades what leaves the pod network; the bridge masquerading
        // everything that leaves its own subnet would hide pods' addresses from other nodes.
        config.default_network_ip_masq = false;
    }
    let mut runtime = tokio::spawn(nodus_runtime::server::serve(
        nodus_runtime::server::ServeOptions {
            listen: socket,
            root_dir: args.data_dir.join("runtime"),
            state_dir: args.data_dir.join("run").join("runtime"),
            config,
        },
    ));
    let (stop_proxy, proxy_stop) = tokio::sync::oneshot::channel();
    let proxy = start_proxy(&args, &node, &kubeconfig, proxy_stop);
    let (stop_dns, dns_stop) = tokio::sync::oneshot::channel();
    let dns = match nodus_kubelet::cli::node_ip(&args.kubelet) {
        Some(ip) if !args.disable_cluster_dns => Some(crate::dns::start(
            &kubeconfig,
            &node,
            std::net::SocketAddr::new(ip, args.cluster_dns_port),
            args.kubelet
                .cluster_domain
                .clone()
                .unwrap_or_else(|| "cluster.local".into()),
            args.kubelet
                .resolv_conf
                .clone()
                .unwrap_or_else(|| "/etc/resolv.conf".into()),
            dns_stop,
        )),
        Some(_) => None,
        None => {
            tracing::warn!("no node IP: this node does not serve cluster DNS");
            None
        }
    };
    let (stop_podnet, podnet_stop) = tokio::sync::oneshot::channel();
    let podnet = start_podnet(&args, &node, &kubeconfig, podnet_stop);
    let kubelet = nodus_kubelet::cli::run(args.kubelet);
    tokio::pin!(kubelet);
    let result = tokio::select! {
        r = &mut kubelet => {
            // Both stop on the same signal; let the runtime remove its socket.
            match tokio::time::timeout(std::time::Duration::from_secs(10), &mut runtime).await {
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "runtime stopped with an error"),
                Ok(Err(e)) => tracing::warn!(error = %e, "runtime task failed"),
                _ => {}
            }
            r.map_err(anyhow::Error::from)
        }
        r = &mut runtime => {
            match r {
                Ok(Ok(())) => Err(anyhow::anyhow!("the container runtime stopped")),
                Ok(Err(e)) => Err(anyhow::Error::new(e).context("the container runtime failed")),
                Err(e) => Err(anyhow::anyhow!("the container runtime task failed: {e}")),
            }
        }
    };
    let _ = stop_proxy.send(());
    let _ = stop_dns.send(());
    let _ = stop_podnet.send(());
    for task in [proxy, podnet, dns].into_iter().flatten() {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), task).await;
    }
    result
}
