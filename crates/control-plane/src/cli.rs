//! `nodus control-plane`: command-line flags and the entry point.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use crate::apiserver::server::{self, ControlPlaneConfig, ServerError};

/// Flags of `nodus control-plane`, named as kube-apiserver names them.
#[derive(Debug, clap::Args)]
pub struct ControlPlaneArgs {
    /// Where the store, the PKI and admin.kubeconfig live.
    #[arg(long, default_value = "/var/lib/nodus/control-plane")]
    pub data_dir: PathBuf,
    /// The address the API server listens on.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_address: IpAddr,
    /// The HTTPS port: the API server's (default 6443); kube-controller-manager's (10257)
    /// and kube-scheduler's (10259) serve /healthz, /livez and /readyz there (0: not at all).
    #[arg(long)]
    pub secure_port: Option<u16>,
    /// The CIDR Service cluster IPs are allocated from.
    #[arg(long, default_value = "10.96.0.0/12")]
    pub service_cluster_ip_range: String,
    /// The port range NodePort Services are allocated from.
    #[arg(long, default_value = "30000-32767")]
    pub service_node_port_range: String,
    /// How often the node-lifecycle controller checks nodes' heartbeats.
    #[arg(long, default_value = "5s")]
    pub node_monitor_period: String,
    /// How long a node may go without a heartbeat before it is marked Unknown.
    #[arg(long, default_value = "50s")]
    pub node_monitor_grace_period: String,
    /// How long a new node has to post its first status.
    #[arg(long, default_value = "1m")]
    pub node_startup_grace_period: String,
    /// Nodes per second whose pods may start being evicted.
    #[arg(long, default_value_t = 0.1)]
    pub node_eviction_rate: f64,
    /// The most endpoints one EndpointSlice holds.
    #[arg(long, default_value_t = 100)]
    pub max_endpoints_per_slice: usize,
    /// Where the local-path provisioner puts volumes on every node (as k3s's flag).
    #[arg(long, default_value = crate::controllers::DEFAULT_LOCAL_STORAGE_PATH)]
    pub default_local_storage_path: PathBuf,
    /// Ordered authorizers on the secure port: comma-separated AlwaysAllow, AlwaysDeny,
    /// Node, RBAC.
    #[arg(long, default_value = crate::apiserver::authz::DEFAULT_MODES)]
    pub authorization_mode: String,
    /// The address published as the `kubernetes` Service's endpoint (default: the bind
    /// address, or 127.0.0.1 when binding to all addresses).
    #[arg(long)]
    pub advertise_address: Option<IpAddr>,
    /// The issuer (`iss`) of service-account tokens and of OIDC discovery.
    #[arg(long, default_value = crate::apiserver::authn::serviceaccount::DEFAULT_ISSUER)]
    pub service_account_issuer: String,
    /// The audiences the API server accepts tokens for (comma-separated; default: the
    /// service-account issuer).
    #[arg(long, value_delimiter = ',')]
    pub api_audiences: Vec<String>,
    /// Run the API server without the scheduler (another scheduler binds pods).
    #[arg(long)]
    pub disable_scheduler: bool,
    /// The most non-mutating requests in flight at a time; more get 429 (0: no limit).
    #[arg(long, default_value_t = 400)]
    pub max_requests_inflight: usize,
    /// The most mutating requests in flight at a time; more get 429 (0: no limit).
    #[arg(long, default_value_t = 200)]
    pub max_mutating_requests_inflight: usize,
    /// kube-controller-manager's and kube-scheduler's: the API server they reach the
    /// objects through, and the identity they act as there (upstream's split; without
    /// it they read etcd themselves with the storage flags).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub node_ipam: NodeIpamArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub leader_election: LeaderElectionArgs,
}

/// kube-scheduler's and kube-controller-manager's leader-election flags, with their
/// defaults; `nodus up` takes them too.
#[derive(Debug, clap::Args)]
pub struct LeaderElectionArgs {
    /// Run the scheduler and the controllers only while this process holds their Leases
    /// (kube-system/kube-scheduler, kube-system/kube-controller-manager), so several
    /// control planes can share one etcd.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
        default_missing_value = "true", require_equals = true)]
    pub leader_elect: bool,
    /// How long a candidate waits after it last saw the lease renewed before taking it.
    #[arg(long, default_value = "15s")]
    pub leader_elect_lease_duration: String,
    /// How long the leader retries renewing before it stops leading.
    #[arg(long, default_value = "10s")]
    pub leader_elect_renew_deadline: String,
    /// How long candidates wait between tries to acquire or renew.
    #[arg(long, default_value = "2s")]
    pub leader_elect_retry_period: String,
    /// The namespace of the Leases.
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
}

impl LeaderElectionArgs {
    /// The flags as given, for a component started in a process of its own.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            format!("--leader-elect={}", self.leader_elect),
            format!(
                "--leader-elect-lease-duration={}",
                self.leader_elect_lease_duration
            ),
            format!(
                "--leader-elect-renew-deadline={}",
                self.leader_elect_renew_deadline
            ),
            format!(
                "--leader-elect-retry-period={}",
                self.leader_elect_retry_period
            ),
            format!(
                "--leader-elect-resource-namespace={}",
                self.leader_elect_resource_namespace
            ),
        ]
    }

    /// The checked configuration (client-go's checks and messages).
    pub fn config(&self) -> Result<crate::leaderelection::LeaderElectionConfig, RunError> {
        let duration = |flag: &'static str, v: &str| {
            nodus_k8s::duration::parse_duration(v).map_err(|_| RunError::Flag {
                flag,
                value: v.to_string(),
                why: "not a duration (e.g. 15s)",
            })
        };
        let cfg = crate::leaderelection::LeaderElectionConfig {
            leader_elect: self.leader_elect,
            lease_duration: duration(
                "leader-elect-lease-duration",
                &self.leader_elect_lease_duration,
            )?,
            renew_deadline: duration(
                "leader-elect-renew-deadline",
                &self.leader_elect_renew_deadline,
            )?,
            retry_period: duration("leader-elect-retry-period", &self.leader_elect_retry_period)?,
            resource_namespace: self.leader_elect_resource_namespace.clone(),
        };
        if cfg.leader_elect {
            cfg.validate().map_err(RunError::LeaderElection)?;
        }
        Ok(cfg)
    }
}

/// kube-apiserver's storage flags: without `--etcd-servers`, the embedded store in the
/// data dir.
#[derive(Debug, Default, clap::Args)]
pub struct StorageArgs {
    /// etcd servers to keep the objects in (comma-separated URLs, e.g.
    /// http://127.0.0.1:2379); without it the embedded store in --data-dir.
    #[arg(long, value_delimiter = ',')]
    pub etcd_servers: Vec<String>,
    /// The CA that signed the etcd servers' certificates (https URLs).
    #[arg(long)]
    pub etcd_cafile: Option<PathBuf>,
    /// The client certificate the API server shows etcd.
    #[arg(long)]
    pub etcd_certfile: Option<PathBuf>,
    /// The client certificate's key.
    #[arg(long)]
    pub etcd_keyfile: Option<PathBuf>,
    /// The prefix of every key in etcd.
    #[arg(long, default_value = crate::storage::etcd::DEFAULT_PREFIX)]
    pub etcd_prefix: String,
    /// The longest a request may wait for the storage before it fails with 504.
    #[arg(long, default_value = "1m0s")]
    pub request_timeout: String,
    /// How long Events are kept: on etcd they are written with a lease of this length.
    #[arg(long, default_value = "1h0m0s")]
    pub event_ttl: String,
}

impl StorageArgs {
    /// The flags as given, with `etcd_servers` standing in when `--etcd-servers` is not.
    pub fn to_args(&self, etcd_servers: &[String]) -> Vec<String> {
        let servers = if self.etcd_servers.is_empty() {
            etcd_servers
        } else {
            &self.etcd_servers
        };
        let mut out = vec![
            format!("--etcd-servers={}", servers.join(",")),
            format!("--etcd-prefix={}", self.etcd_prefix),
            format!("--request-timeout={}", self.request_timeout),
            format!("--event-ttl={}", self.event_ttl),
        ];
        for (flag, file) in [
            ("--etcd-cafile", &self.etcd_cafile),
            ("--etcd-certfile", &self.etcd_certfile),
            ("--etcd-keyfile", &self.etcd_keyfile),
        ] {
            if let Some(f) = file {
                out.push(format!("{flag}={}", f.display()));
            }
        }
        out
    }

    /// The backend the flags choose; `etcd_servers` stands in when the flag is not given
    /// (`nodus up --store etcd` with its own member).
    pub fn backend(
        &self,
        etcd_servers: Option<Vec<String>>,
    ) -> Result<crate::storage::StorageBackend, RunError> {
        let servers = if self.etcd_servers.is_empty() {
            etcd_servers.unwrap_or_default()
        } else {
            self.etcd_servers.clone()
        };
        if servers.is_empty() {
            return Ok(crate::storage::StorageBackend::Embedded);
        }
        let timeout = nodus_k8s::duration::parse_duration(&self.request_timeout)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| RunError::Flag {
                flag: "request-timeout",
                value: self.request_timeout.clone(),
                why: "not a positive duration (e.g. 1m0s)",
            })?;
        let event_ttl = nodus_k8s::duration::parse_duration(&self.event_ttl)
            .ok()
            .filter(|d| d.as_secs() > 0)
            .ok_or_else(|| RunError::Flag {
                flag: "event-ttl",
                value: self.event_ttl.clone(),
                why: "not a duration of at least 1s (e.g. 1h0m0s)",
            })?;
        let mut cfg = crate::storage::EtcdConfig::new(servers);
        cfg.event_ttl = event_ttl;
        cfg.ca_file = self.etcd_cafile.clone();
        cfg.cert_file = self.etcd_certfile.clone();
        cfg.key_file = self.etcd_keyfile.clone();
        cfg.prefix = self.etcd_prefix.clone();
        cfg.request_timeout = timeout;
        Ok(crate::storage::StorageBackend::Etcd(cfg))
    }
}

/// kube-controller-manager's node IPAM flags. `nodus up` takes them too, with its own
/// defaults ([`NodeIpamArgs::config`]).
#[derive(Debug, Default, clap::Args)]
pub struct NodeIpamArgs {
    /// Give every Node pod CIDRs from --cluster-cidr [default: false; `nodus up`: true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub allocate_node_cidrs: Option<bool>,
    /// The CIDR range of pods: one, or an IPv4 and an IPv6 one (comma-separated) for
    /// dual-stack [`nodus up`: 10.88.0.0/16].
    #[arg(long)]
    pub cluster_cidr: Option<String>,
    /// The size of each Node's pod CIDR in a single-stack cluster [default: 24 for IPv4,
    /// 64 for IPv6].
    #[arg(long)]
    pub node_cidr_mask_size: Option<u8>,
    /// The size of each Node's IPv4 pod CIDR in a dual-stack cluster [default: 24].
    #[arg(long)]
    pub node_cidr_mask_size_ipv4: Option<u8>,
    /// The size of each Node's IPv6 pod CIDR in a dual-stack cluster [default: 64].
    #[arg(long)]
    pub node_cidr_mask_size_ipv6: Option<u8>,
}

/// `nodus up`'s pod range: the runtime's default network without a pod CIDR is
/// 10.88.0.0/16 (containerd's and CRI-O's), so a node's /24 stays inside the range its
/// pods used before allocation, and it does not overlap the Service range 10.96.0.0/12.
pub const UP_CLUSTER_CIDR: &str = "10.88.0.0/16";

impl NodeIpamArgs {
    /// The flags, with `nodus up`'s defaults (`allocate`, `cluster_cidr`) written out.
    pub fn to_args(&self, allocate: bool, cluster_cidr: Option<&str>) -> Vec<String> {
        let mut out = vec![format!(
            "--allocate-node-cidrs={}",
            self.allocate_node_cidrs.unwrap_or(allocate)
        )];
        if let Some(c) = self.cluster_cidr.as_deref().or(cluster_cidr) {
            out.push(format!("--cluster-cidr={c}"));
        }
        for (flag, v) in [
            ("--node-cidr-mask-size", self.node_cidr_mask_size),
            ("--node-cidr-mask-size-ipv4", self.node_cidr_mask_size_ipv4),
            ("--node-cidr-mask-size-ipv6", self.node_cidr_mask_size_ipv6),
        ] {
            if let Some(v) = v {
                out.push(format!("{flag}={v}"));
            }
        }
        out
    }

    /// The checked configuration; `allocate` and `cluster_cidr` are the defaults when the
    /// flags are not given (upstream's: false and none; `nodus up`'s, as k3s: true and
    /// [`UP_CLUSTER_CIDR`]).
    pub fn config(
        &self,
        allocate: bool,
        cluster_cidr: Option<&str>,
        service_cidr: (Ipv4Addr, u8),
    ) -> Result<Option<crate::controllers::nodeipam::NodeIpamConfig>, RunError> {
        let flags = crate::controllers::nodeipam::NodeIpamFlags {
            allocate_node_cidrs: self.allocate_node_cidrs.unwrap_or(allocate),
            cluster_cidr: self.cluster_cidr.as_deref().or(cluster_cidr),
            node_cidr_mask_size: self.node_cidr_mask_size,
            node_cidr_mask_size_ipv4: self.node_cidr_mask_size_ipv4,
            node_cidr_mask_size_ipv6: self.node_cidr_mask_size_ipv6,
        };
        crate::controllers::nodeipam::config(&flags, service_cidr).map_err(RunError::NodeIpam)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Server(#[from] ServerError),
    #[error("invalid --authorization-mode: {0}")]
    AuthorizationMode(String),
    #[error("invalid --{flag} {value:?}: {why}")]
    Flag {
        flag: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("{0}")]
    NodeIpam(String),
    #[error("invalid leader election configuration: {0}")]
    LeaderElection(String),
    #[error("installing signal handlers: {0}")]
    Signal(std::io::Error),
}

fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), RunError> {
    let bad = |why| RunError::Flag {
        flag: "service-cluster-ip-range",
        value: s.to_string(),
        why,
    };
    let (ip, bits) = s
        .split_once('/')
        .ok_or_else(|| bad("expected an IPv4 CIDR like 10.96.0.0/12"))?;
    let ip: Ipv4Addr = ip.parse().map_err(|_| bad("not an IPv4 address"))?;
    let bits: u8 = bits.parse().map_err(|_| bad("bad prefix length"))?;
    if !(8..=30).contains(&bits) {
        return Err(bad("the prefix length must be between 8 and 30"));
    }
    Ok((ip, bits))
}

fn parse_range(s: &str) -> Result<(u16, u16), RunError> {
    let bad = |why| RunError::Flag {
        flag: "service-node-port-range",
        value: s.to_string(),
        why,
    };
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| bad("expected a range like 30000-32767"))?;
    let a: u16 = a.trim().parse().map_err(|_| bad("bad start port"))?;
    let b: u16 = b.trim().parse().map_err(|_| bad("bad end port"))?;
    if a > b {
        return Err(bad("the start is after the end"));
    }
    Ok((a, b))
}

/// Which part of the control plane a process runs: all of it (`nodus control-plane`) or
/// one component, as kubeadm's static pods split them (`nodus kube-apiserver`,
/// `nodus kube-controller-manager`, `nodus kube-scheduler`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    All,
    ApiServer,
    ControllerManager,
    Scheduler,
}

impl Component {
    /// Upstream's name of the component.
    pub fn name(self) -> &'static str {
        match self {
            Component::All => "control plane",
            Component::ApiServer => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
        }
    }

    /// Upstream's default `--secure-port` of the component.
    pub fn default_secure_port(self) -> u16 {
        match self {
            Component::All | Component::ApiServer => 6443,
            Component::ControllerManager => crate::healthz::CONTROLLER_MANAGER_PORT,
            Component::Scheduler => crate::healthz::SCHEDULER_PORT,
        }
    }
}

/// Runs the control plane until SIGTERM/SIGINT.
pub async fn run(args: ControlPlaneArgs) -> Result<(), RunError> {
    run_component(args, Component::All).await
}

/// Runs `component` until SIGTERM/SIGINT.
pub async fn run_component(args: ControlPlaneArgs, component: Component) -> Result<(), RunError> {
    let port = args
        .secure_port
        .unwrap_or_else(|| component.default_secure_port());
    let mut cfg = ControlPlaneConfig::new(&args.data_dir, args.bind_address, port);
    cfg.api.service_cidr = parse_cidr(&args.service_cluster_ip_range)?;
    cfg.api.node_port_range = parse_range(&args.service_node_port_range)?;
    cfg.api.authorization_modes = crate::apiserver::authz::parse_modes(&args.authorization_mode)
        .map_err(RunError::AuthorizationMode)?;
    cfg.advertise_address = args.advertise_address;
    if args.service_account_issuer.is_empty() {
        return Err(RunError::Flag {
            flag: "service-account-issuer",
            value: String::new(),
            why: "must not be empty",
        });
    }
    cfg.api.service_account_issuer = args.service_account_issuer.clone();
    cfg.api.api_audiences = if args.api_audiences.is_empty() {
        vec![args.service_account_issuer.clone()]
    } else {
        args.api_audiences.clone()
    };
    cfg.api.max_requests_inflight = args.max_requests_inflight;
    cfg.api.max_mutating_requests_inflight = args.max_mutating_requests_inflight;
    let duration = |flag: &'static str, v: &str| {
        nodus_k8s::duration::parse_duration(v).map_err(|_| RunError::Flag {
            flag,
            value: v.to_string(),
            why: "not a duration (e.g. 5s, 1m)",
        })
    };
    cfg.controllers.node_monitor_period =
        duration("node-monitor-period", &args.node_monitor_period)?;
    cfg.controllers.node_monitor_grace_period =
        duration("node-monitor-grace-period", &args.node_monitor_grace_period)?;
    cfg.controllers.node_startup_grace_period =
        duration("node-startup-grace-period", &args.node_startup_grace_period)?;
    if cfg.controllers.node_monitor_period.is_zero() {
        return Err(RunError::Flag {
            flag: "node-monitor-period",
            value: args.node_monitor_period.clone(),
            why: "must be positive",
        });
    }
    cfg.controllers.node_eviction_rate = args.node_eviction_rate.max(0.0);
    cfg.controllers.max_endpoints_per_slice = args.max_endpoints_per_slice.clamp(1, 1000);
    cfg.controllers.scheduler = !args.disable_scheduler;
    cfg.controllers.local_storage_path = args.default_local_storage_path.clone();
    cfg.controllers.node_ipam = args.node_ipam.config(false, None, cfg.api.service_cidr)?;
    cfg.controllers.leader_election = args.leader_election.config()?;
    cfg.storage = args.storage.backend(None)?;
    if let Some(kubeconfig) = &args.kubeconfig {
        if !args.storage.etcd_servers.is_empty() {
            return Err(RunError::Flag {
                flag: "kubeconfig",
                value: kubeconfig.display().to_string(),
                why: "the objects are reached through the API server or in etcd, not both: drop --etcd-servers",
            });
        }
        cfg.storage = crate::storage::StorageBackend::Api(kubeconfig.clone());
    }
    if component != Component::All {
        // Started beside etcd (kubeadm's static pods come up together): wait for it.
        cfg.store_wait = std::time::Duration::from_secs(60);
    }
    cfg.controllers.scheduler &= matches!(component, Component::All | Component::Scheduler);
    cfg.controllers.controllers &=
        matches!(component, Component::All | Component::ControllerManager);
    enum Handle {
        Server(server::ServerHandle),
        Components(server::ComponentsHandle),
    }
    let handle = match component {
        Component::All | Component::ApiServer => {
            let handle = server::start(cfg).await?;
            println!(
                "nodus {}: API server at {} ; kubeconfig {}",
                component.name(),
                handle.url,
                handle.kubeconfig.display()
            );
            Handle::Server(handle)
        }
        Component::ControllerManager | Component::Scheduler => {
            Handle::Components(server::start_components(cfg, component.name()).await?)
        }
    };
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(RunError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(RunError::Signal)?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down");
    match handle {
        Handle::Server(h) => h.shutdown().await,
        Handle::Components(h) => h.shutdown().await,
    }
    Ok(())
}
