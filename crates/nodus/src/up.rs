//! `nodus up`: a whole cluster from one command — the control plane (API server,
//! scheduler, controllers) and, on the same machine, a node joined to it with credentials
//! issued from the cluster CA (as `nodus node --control-plane-data-dir` does).

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Args;

/// Flags of `nodus up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where everything lives: `control-plane/` (store, PKI, admin.kubeconfig), the node's
    /// state (`node/`, `kubelet/`) and `manifests/`, the static pod directory.
    #[arg(long, default_value = "/var/lib/nodus")]
    pub data_dir: PathBuf,
    /// The address the API server listens on (all of the host's, as k3s and kube-apiserver
    /// do: pods reach it through the `kubernetes` Service at the advertised address).
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: IpAddr,
    /// The `kubernetes` Service's endpoint (default: the address of the host's
    /// default-route interface).
    #[arg(long)]
    pub advertise_address: Option<IpAddr>,
    /// The API server's HTTPS port (0 picks a free one).
    #[arg(long, default_value_t = 6443)]
    pub secure_port: u16,
    /// Start the control plane alone, without a node on this machine.
    #[arg(long)]
    pub no_node: bool,
    /// Pod CIDRs for Nodes, as kube-controller-manager's flags; on by default with
    /// --cluster-cidr 10.88.0.0/16 and a /24 per node (as k3s allocates by default).
    #[command(flatten)]
    pub node_ipam: nodus_control_plane::cli::NodeIpamArgs,
    /// Where the control plane keeps its objects: `embedded` (a file in the data dir) or
    /// `etcd`: the --etcd-servers given, else an etcd member started here on 127.0.0.1
    /// with its data in `<data-dir>/etcd`.
    #[arg(long, value_enum, default_value_t = StoreKind::Embedded)]
    pub store: StoreKind,
    #[command(flatten)]
    pub storage: nodus_control_plane::cli::StorageArgs,
    #[command(flatten)]
    pub leader_election: nodus_control_plane::cli::LeaderElectionArgs,
    /// Flags for the node after `--`, as `nodus node` takes them (kubelet flags such as
    /// `--hostname-override`, `--cgroup-root`, `--pod-manifest-path`; `--runtime-config`).
    #[arg(last = true)]
    pub node_args: Vec<String>,
}

/// `nodus up --store`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    Embedded,
    Etcd,
}

/// The hard eviction thresholds of the node `nodus up` runs, unless given after `--`.
pub const UP_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%";

/// `nodus node` flags for the node `nodus up` runs: the user's, plus the data dirs under
/// `--data-dir` unless the user named them.
fn node_args(args: &UpArgs, cp_dir: &std::path::Path) -> anyhow::Result<crate::node::NodeArgs> {
    #[derive(clap::Parser)]
    struct NodeCli {
        #[command(flatten)]
        node: crate::node::NodeArgs,
    }
    if !args
        .node_args
        .iter()
        .any(|a| a.starts_with("--pod-manifest-path"))
    {
        let dir = args.data_dir.join("manifests");
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    }
    let mut argv: Vec<std::ffi::OsString> = vec!["nodus-node".into()];
    let given = |flag: &str| {
        args.node_args
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    let defaults = [
        ("--data-dir", args.data_dir.join("node")),
        ("--root-dir", args.data_dir.join("kubelet")),
        ("--control-plane-data-dir", cp_dir.to_path_buf()),
        // Static pods: drop a manifest here and the kubelet runs it (with a mirror pod).
        ("--pod-manifest-path", args.data_dir.join("manifests")),
    ];
    for (flag, value) in defaults {
        if !given(flag) {
            argv.push(flag.into());
            argv.push(value.into());
        }
    }
    // A development cluster on a workstation, as kind's nodes: disk-based eviction off
    // (0%), so a nearly full disk does not refuse every pod; memory keeps upstream's 100Mi.
    if !given("--eviction-hard") {
        argv.push("--eviction-hard".into());
        argv.push(UP_EVICTION_HARD.into());
    }
    argv.extend(args.node_args.iter().map(Into::into));
    use clap::Parser as _;
    Ok(NodeCli::try_parse_from(argv)?.node)
}

/// The message that tells a user where the cluster is and what to type next.
pub fn banner(url: &str, kubeconfig: &std::path::Path, node: Option<&str>) -> String {
    let mut s = format!(
        "nodus is up: API server at {url}\nkubeconfig: {}\n",
        kubeconfig.display()
    );
    match node {
        Some(n) => s.push_str(&format!("node: {n}\n")),
        None => s.push_str("node: none (the control plane runs alone)\n"),
    }
    s.push_str(&format!(
        "next: export KUBECONFIG={} && kubectl get nodes\n",
        kubeconfig.display()
    ));
    s
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    let cp_dir = args.data_dir.join("control-plane");
    // Parse the node's flags first: a typo fails before anything starts.
    let mut node = if args.no_node {
        None
    } else {
        Some(node_args(&args, &cp_dir)?)
    };
    let mut cfg =
        nodus_control_plane::ControlPlaneConfig::new(&cp_dir, args.bind_address, args.secure_port);
    cfg.advertise_address = args.advertise_address;
    cfg.controllers.leader_election = args.leader_election.config()?;
    cfg.controllers.node_ipam = args.node_ipam.config(
        true,
        Some(nodus_control_plane::cli::UP_CLUSTER_CIDR),
        cfg.api.service_cidr,
    )?;
    if let Some(n) = node.as_mut() {
        // Pods resolve through the cluster DNS Service of this control plane's service CIDR.
        n.kubelet.default_cluster_dns = vec![
            nodus_control_plane::controllers::clusterdns::cluster_dns_ip(cfg.api.service_cidr)
                .to_string(),
        ];
    }
    // Kept until the control plane has stopped; dropping it stops etcd.
    let mut etcd_member = None;
    let own_servers = match args.store {
        StoreKind::Embedded if !args.storage.etcd_servers.is_empty() => {
            anyhow::bail!("--etcd-servers needs --store etcd");
        }
        StoreKind::Embedded => None,
        StoreKind::Etcd if args.storage.etcd_servers.is_empty() => {
            let dir = args.data_dir.join("etcd");
            let member = tokio::task::block_in_place(|| {
                nodus_control_plane::storage::EtcdServer::start(&dir)
            })
            .map_err(|e| anyhow::anyhow!("starting etcd in {}: {e}", dir.display()))?;
            let url = member.url();
            etcd_member = Some(member);
            Some(vec![url])
        }
        StoreKind::Etcd => None,
    };
    cfg.storage = args.storage.backend(own_servers)?;
    let handle = nodus_control_plane::start(cfg).await?;
    if let Some(n) = node.as_mut()
        && n.server.is_none()
    {
        // The node reaches the API server at the address it actually listens on.
        n.server = Some(handle.url.clone());
    }
    let node_name = node
        .as_ref()
        .map(|n| nodus_kubelet::cli::node_name(&n.kubelet));
    print!(
        "{}",
        banner(&handle.url, &handle.kubeconfig, node_name.as_deref())
    );
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let result = match node {
        // The node stops on SIGTERM/SIGINT (the kubelet's own handlers); then the control plane.
        Some(n) => crate::node::run(n).await,
        None => {
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = signal(SignalKind::terminate())?;
            let mut int = signal(SignalKind::interrupt())?;
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            Ok(())
        }
    };
    tracing::info!("shutting down the control plane");
    handle.shutdown().await;
    drop(etcd_member);
    result
}
