//! `nodus up`: a whole cluster from one command — the control plane (API server,
//! scheduler, controllers) and, on the same machine, a node joined to it with credentials
//! issued from the cluster CA (as `nodus node --control-plane-data-dir` does).
//!
//! By default the control plane bootstraps as kubeadm's does: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler are static pods the node's kubelet runs from
//! its manifest directory ([`crate::staticpods`]). `--control-plane-mode process` runs
//! them inside this process instead (the embedded store's mode, and `--no-node`'s).

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context as _;
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
    /// Start the control plane alone, without a node on this machine (in this process).
    #[arg(long)]
    pub no_node: bool,
    /// How the control plane runs: `static-pods` (kubeadm's bootstrap: etcd, kube-apiserver,
    /// kube-controller-manager and kube-scheduler as static pods of this node, with mirror
    /// pods in kube-system) or `process` (inside this process) [default: static-pods; with
    /// --no-node or --store embedded: process].
    #[arg(long, value_enum)]
    pub control_plane_mode: Option<ControlPlaneMode>,
    /// Pod CIDRs for Nodes, as kube-controller-manager's flags; on by default with
    /// --cluster-cidr 10.88.0.0/16 and a /24 per node (as k3s allocates by default).
    #[command(flatten)]
    pub node_ipam: nodus_control_plane::cli::NodeIpamArgs,
    /// Where the control plane keeps its objects: `etcd` (the --etcd-servers given, else an
    /// etcd member on 127.0.0.1 with its data in `<data-dir>/etcd`: a static pod, or a child
    /// of this process) or `embedded` (a file in the data dir, held by one process)
    /// [default: etcd with static pods, embedded in process mode].
    #[arg(long, value_enum)]
    pub store: Option<StoreKind>,
    #[command(flatten)]
    pub storage: nodus_control_plane::cli::StorageArgs,
    #[command(flatten)]
    pub leader_election: nodus_control_plane::cli::LeaderElectionArgs,
    /// Flags for the node after `--`, as `nodus node` takes them (kubelet flags such as
    /// `--hostname-override`, `--cgroup-root`, `--pod-manifest-path`; `--runtime-config`).
    #[arg(last = true)]
    pub node_args: Vec<String>,
}

/// `nodus up --control-plane-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ControlPlaneMode {
    StaticPods,
    Process,
}

impl UpArgs {
    /// The mode and store the flags choose, or why they cannot go together.
    pub fn mode(&self) -> anyhow::Result<(ControlPlaneMode, StoreKind)> {
        let mode = self.control_plane_mode.unwrap_or(
            if self.no_node || self.store == Some(StoreKind::Embedded) {
                ControlPlaneMode::Process
            } else {
                ControlPlaneMode::StaticPods
            },
        );
        match (mode, self.store) {
            (ControlPlaneMode::StaticPods, _) if self.no_node => anyhow::bail!(
                "--no-node leaves no kubelet to run the control plane's static pods: use --control-plane-mode process"
            ),
            (ControlPlaneMode::StaticPods, Some(StoreKind::Embedded)) => anyhow::bail!(
                "--store embedded is a file one process holds, but kube-apiserver, kube-controller-manager and kube-scheduler run as static pods of their own: use --store etcd or --control-plane-mode process"
            ),
            (ControlPlaneMode::StaticPods, _) => Ok((mode, StoreKind::Etcd)),
            (ControlPlaneMode::Process, store) => Ok((mode, store.unwrap_or(StoreKind::Embedded))),
        }
    }
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
    let (mode, store) = args.mode()?;
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
    if mode == ControlPlaneMode::StaticPods {
        let node = node.context("static pods need this machine's node")?;
        return run_static_pods(&args, &cfg, node).await;
    }
    // Kept until the control plane has stopped; dropping it stops etcd.
    let mut etcd_member = None;
    let own_servers = match store {
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

/// The API server's URL for clients on this machine.
fn local_url(bind: IpAddr, port: u16) -> String {
    match bind {
        a if a.is_unspecified() => format!("https://127.0.0.1:{port}"),
        IpAddr::V6(v6) => format!("https://[{v6}]:{port}"),
        IpAddr::V4(v4) => format!("https://{v4}:{port}"),
    }
}

/// Waits until the API server behind `kubeconfig` answers `/readyz` with ok.
async fn wait_ready(kubeconfig: &std::path::Path) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let mut last = String::from("admin.kubeconfig not written yet");
    while started.elapsed() < std::time::Duration::from_secs(300) {
        if kubeconfig.exists() {
            match ready_once(kubeconfig).await {
                Ok(()) => return Ok(()),
                Err(e) => last = format!("{e:#}"),
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    anyhow::bail!("the API server did not become ready in 5 minutes: {last}")
}

async fn ready_once(kubeconfig: &std::path::Path) -> anyhow::Result<()> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    let client = kube::Client::try_from(config)?;
    let req = http::Request::get("/readyz").body(Vec::new())?;
    let body = client.request_text(req).await?;
    anyhow::ensure!(body.trim() == "ok", "/readyz: {body}");
    Ok(())
}

/// kubeadm's bootstrap: the PKI and the node's credentials first, then the images and the
/// static pod manifests, then the node, whose kubelet starts the control plane from them
/// and registers once its API server answers.
async fn run_static_pods(
    args: &UpArgs,
    cfg: &nodus_control_plane::ControlPlaneConfig,
    mut node: crate::node::NodeArgs,
) -> anyhow::Result<()> {
    use crate::staticpods;
    anyhow::ensure!(
        args.secure_port != 0,
        "--secure-port 0 (a free port) needs --control-plane-mode process: the static pods' manifests name the port"
    );
    nodus_control_plane::apiserver::server::ensure_pki(cfg)?;
    let etcd = if args.storage.etcd_servers.is_empty() {
        let dir = args.data_dir.join("etcd");
        let (client, peer) = nodus_control_plane::storage::etcd::server::member_ports(
            &dir,
            Some(staticpods::ETCD_PORTS),
        )
        .with_context(|| format!("choosing etcd's ports in {}", dir.display()))?;
        Some((dir, client, peer))
    } else {
        None
    };
    let etcd_bin = nodus_control_plane::storage::etcd::server::etcd_binary();
    anyhow::ensure!(
        etcd.is_none() || etcd_bin.is_file(),
        "no etcd at {} for the etcd static pod: install Debian's etcd-server, point NODUS_ETCD at an etcd binary, give --etcd-servers, or use --control-plane-mode process",
        etcd_bin.display()
    );
    let own_servers: Vec<String> = etcd
        .iter()
        .map(|(_, client, _)| format!("http://127.0.0.1:{client}"))
        .collect();
    let runtime_config = match &node.runtime_config {
        Some(p) => nodus_runtime::config::RuntimeConfig::load(p)?,
        None => Default::default(),
    };
    let images = staticpods::build_images(
        &node.data_dir.join("runtime"),
        &runtime_config,
        etcd.is_some(),
    )
    .await?;
    let mut common = vec![
        format!("--data-dir={}", cfg.data_dir.display()),
        format!("--bind-address={}", args.bind_address),
    ];
    if let Some(a) = args.advertise_address {
        common.push(format!("--advertise-address={a}"));
    }
    let mut apiserver_args = vec![format!("--secure-port={}", args.secure_port)];
    apiserver_args.extend(args.storage.to_args(&own_servers));
    // As kubeadm's controller-manager.conf and scheduler.conf: the two components reach
    // the objects only through the local API server, each as its own user.
    let url = local_url(args.bind_address, args.secure_port);
    let own_kubeconfig = |file: &str, user: &str| -> anyhow::Result<String> {
        let path =
            nodus_control_plane::pki::issue_user_kubeconfig(&cfg.data_dir, file, user, &[], &url)?;
        Ok(format!("--kubeconfig={}", path.display()))
    };
    let elected = args.leader_election.to_args();
    let mut controller_manager_args = args
        .node_ipam
        .to_args(true, Some(nodus_control_plane::cli::UP_CLUSTER_CIDR));
    controller_manager_args.extend(elected.iter().cloned());
    controller_manager_args.push(own_kubeconfig(
        "controller-manager.conf",
        "system:kube-controller-manager",
    )?);
    let mut scheduler_args = elected;
    scheduler_args.push(own_kubeconfig("scheduler.conf", "system:kube-scheduler")?);
    let mut extra_dirs: Vec<std::path::PathBuf> = [
        &args.storage.etcd_cafile,
        &args.storage.etcd_certfile,
        &args.storage.etcd_keyfile,
    ]
    .into_iter()
    .flatten()
    .filter_map(|f| f.parent().map(std::path::Path::to_path_buf))
    .collect();
    extra_dirs.sort();
    extra_dirs.dedup();
    let node_name = nodus_kubelet::cli::node_name(&node.kubelet);
    let plan = staticpods::Plan {
        cp_dir: cfg.data_dir.clone(),
        etcd,
        node_name: node_name.clone(),
        common_args: common,
        apiserver_args,
        controller_manager_args,
        scheduler_args,
        extra_dirs,
        apiserver_endpoint: (
            match args.advertise_address {
                Some(a) => a.to_string(),
                None if args.bind_address.is_unspecified() => "127.0.0.1".into(),
                None => args.bind_address.to_string(),
            },
            args.secure_port,
        ),
    };
    let manifest_dir = node
        .kubelet
        .pod_manifest_path
        .clone()
        .unwrap_or_else(|| args.data_dir.join("manifests"));
    staticpods::write_manifests(&manifest_dir, &staticpods::manifests(&plan, &images))?;
    if node.server.is_none() {
        node.server = Some(url.clone());
    }
    let kubeconfig = cfg.data_dir.join("admin.kubeconfig");
    let mut node_task = tokio::spawn(crate::node::run(node));
    tokio::select! {
        r = &mut node_task => {
            return match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.context("the node stopped before the API server answered")),
                Err(e) => Err(anyhow::anyhow!("the node task failed: {e}")),
            };
        }
        r = wait_ready(&kubeconfig) => r?,
    }
    print!("{}", banner(&url, &kubeconfig, Some(&node_name)));
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    nodus_serving::sd_notify::ready(nodus_serving::sd_notify::Component::ControlPlane);
    // The node stops on SIGTERM/SIGINT; the control plane's static pods keep running, as
    // on a kubeadm node whose kubelet stops, and are adopted when `nodus up` starts again.
    node_task
        .await
        .map_err(|e| anyhow::anyhow!("the node task failed: {e}"))?
}
