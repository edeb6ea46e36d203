//! `nodus kubelet`: command-line flags (upstream's names and defaults) and the entry point
//! that wires sources, PLEG, pod workers, probers, status and servers together.

use crate::config::{self, PodConfig};
use crate::cri;
use crate::kubelet::{Core, Syncer};
use crate::kubeletconfig::{KubeletConfiguration, parse_duration};
use crate::kuberuntime::sandbox::SandboxSettings;
use crate::kuberuntime::{KubeRuntime, Settings};
use crate::metrics::Metrics;
use crate::pleg::{self, Health, generic::Period};
use crate::pod::PodManager;
use crate::pod_workers::PodWorkers;
use crate::prober::ProbeManager;
use crate::server::{self, ServerState};
use crate::status::{ProviderAdapter, StatusManager};
use crate::syncloop::SyncLoop;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Flags of `nodus kubelet`, named and defaulted as upstream's kubelet. Flags left unset
/// take their value from `--config`, then upstream's default.
#[derive(Debug, clap::Args)]
pub struct KubeletArgs {
    /// A kubelet.config.k8s.io/v1beta1 KubeletConfiguration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The CRI endpoint [default: unix:///run/nodus/nodus.sock].
    #[arg(long)]
    pub container_runtime_endpoint: Option<String>,
    /// Directory for the kubelet's files (pod dirs, volumes).
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub root_dir: PathBuf,
    /// Directory of static pod manifests (staticPodPath).
    #[arg(long)]
    pub pod_manifest_path: Option<PathBuf>,
    /// URL of a pod manifest or PodList to run as static pods (staticPodURL).
    #[arg(long)]
    pub manifest_url: Option<String>,
    /// How often the static pod directory is re-read besides inotify [default: 20s].
    #[arg(long)]
    pub file_check_frequency: Option<String>,
    /// How often the manifest URL is fetched [default: 20s].
    #[arg(long)]
    pub http_check_frequency: Option<String>,
    /// How often every pod is re-synced at the latest [default: 1m].
    #[arg(long)]
    pub sync_frequency: Option<String>,
    /// The node's name instead of the host name.
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// The node's IP address (default: the first global address of the host).
    #[arg(long)]
    pub node_ip: Option<IpAddr>,
    /// The cgroup under which `kubepods` and the pod cgroups are created [default: /].
    #[arg(long)]
    pub cgroup_root: Option<String>,
    /// Where containers' logs go (podLogsDir) [default: /var/log/pods].
    #[arg(long)]
    pub pod_logs_dir: Option<PathBuf>,
    /// DNS servers pods with dnsPolicy ClusterFirst use (clusterDNS).
    #[arg(long, value_delimiter = ',')]
    pub cluster_dns: Vec<String>,
    /// clusterDNS when neither the flag nor the config file sets it: upstream's kubelet has
    /// none, `nodus node` names the cluster DNS Service it runs.
    #[arg(skip)]
    pub default_cluster_dns: Vec<String>,
    /// The cluster's DNS domain [default: cluster.local].
    #[arg(long)]
    pub cluster_domain: Option<String>,
    /// The resolver file pods with dnsPolicy Default inherit [default: /etc/resolv.conf].
    #[arg(long)]
    pub resolv_conf: Option<PathBuf>,
    /// Port of the healthz server; 0 disables it [default: 10248].
    #[arg(long)]
    pub healthz_port: Option<u16>,
    /// [default: 127.0.0.1]
    #[arg(long)]
    pub healthz_bind_address: Option<IpAddr>,
    /// The unauthenticated read-only port (/pods, /metrics, /healthz); 0 disables it [default: 0].
    #[arg(long)]
    pub read_only_port: Option<u16>,
    /// The address the kubelet API (`--port`) and the read-only port bind to
    /// [default: 0.0.0.0].
    #[arg(long)]
    pub address: Option<IpAddr>,
    /// Feature gates, e.g. EventedPLEG=true.
    #[arg(long, value_delimiter = ',')]
    pub feature_gates: Vec<String>,
    /// How long the PLEG may go without a successful relist before the kubelet reports
    /// itself unhealthy (upstream's fixed 3m; settable here for tests and drills).
    #[arg(long, hide = true, default_value = "3m")]
    pub pleg_relist_threshold: String,
    /// Create the QoS cgroup hierarchy (kubepods, burstable, besteffort) [default: true].
    #[arg(long)]
    pub cgroups_per_qos: Option<bool>,
    /// cgroupfs or systemd (cgroup v2 hosts run by systemd); the runtime's answer to CRI
    /// RuntimeConfig overrides it [default: cgroupfs].
    #[arg(long)]
    pub cgroup_driver: Option<String>,
    /// Resources reserved for Kubernetes daemons, e.g. cpu=100m,memory=256Mi.
    #[arg(long)]
    pub kube_reserved: Option<String>,
    /// Resources reserved for the OS, e.g. cpu=100m,memory=256Mi.
    #[arg(long)]
    pub system_reserved: Option<String>,
    /// The cgroup of the Kubernetes daemons, to enforce kube-reserved on.
    #[arg(long)]
    pub kube_reserved_cgroup: Option<String>,
    /// The cgroup of the OS daemons, to enforce system-reserved on.
    #[arg(long)]
    pub system_reserved_cgroup: Option<String>,
    /// Memory Manager policy to use: None or Static [default: None].
    #[arg(long)]
    pub memory_manager_policy: Option<String>,
    /// Memory reserved per NUMA node, e.g. `0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi`
    /// (repeatable); per memory type the sum must equal kube-reserved + system-reserved +
    /// the hard eviction threshold.
    #[arg(long)]
    pub reserved_memory: Vec<String>,
    /// Hard eviction thresholds [default: memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%].
    #[arg(long)]
    pub eviction_hard: Option<String>,
    /// Soft eviction thresholds, e.g. memory.available<1.5Gi; each needs a grace period.
    #[arg(long)]
    pub eviction_soft: Option<String>,
    /// How long a soft threshold must hold before a pod is evicted, e.g. memory.available=1m30s.
    #[arg(long)]
    pub eviction_soft_grace_period: Option<String>,
    /// How long a pressure condition stays after its threshold cleared [default: 5m].
    #[arg(long)]
    pub eviction_pressure_transition_period: Option<String>,
    /// The most seconds a pod evicted for a soft threshold gets to stop [default: 0, the
    /// pod's own].
    #[arg(long, allow_hyphen_values = true)]
    pub eviction_max_pod_grace_period: Option<i32>,
    /// The least an eviction must reclaim beyond the threshold, e.g. memory.available=0Mi,nodefs.available=500Mi.
    #[arg(long)]
    pub eviction_minimum_reclaim: Option<String>,
    /// How often the eviction manager observes the signals (upstream's fixed 10s housekeeping;
    /// settable here for tests).
    #[arg(long, hide = true, default_value = "10s")]
    pub eviction_monitoring_interval: String,
    /// Which reservations to enforce with cgroups: pods, kube-reserved, system-reserved, none [default: pods].
    #[arg(long, value_delimiter = ',')]
    pub enforce_node_allocatable: Vec<String>,
    /// The most pods this node runs [default: 110].
    #[arg(long)]
    pub max_pods: Option<i64>,
    /// How many pods are started at once (their first sync: volumes, sandbox, containers),
    /// a nodus setting; 0 for no bound [default: 4 per CPU].
    #[arg(long)]
    pub max_parallel_pod_starts: Option<usize>,
    /// The most processes a pod may have; -1 for no limit [default: -1].
    #[arg(long, allow_hyphen_values = true)]
    pub pod_max_pids: Option<i64>,
    /// Enforce CPU limits with CFS quota [default: true].
    #[arg(long)]
    pub cpu_cfs_quota: Option<bool>,
    /// The CFS quota period [default: 100ms].
    #[arg(long)]
    pub cpu_cfs_quota_period: Option<String>,
    /// The CPU manager policy: none or static [default: none].
    #[arg(long)]
    pub cpu_manager_policy: Option<String>,
    /// The static policy's options, `full-pcpus-only=true,distribute-cpus-across-numa=true`.
    #[arg(long)]
    pub cpu_manager_policy_options: Option<String>,
    /// How often the CPU manager hands changed cpusets to running containers [default: 10s].
    #[arg(long)]
    pub cpu_manager_reconcile_period: Option<String>,
    /// CPUs kept for the system and the kubelet (a cpuset, e.g. 0-1); overrides the cpu of
    /// kube-reserved and system-reserved.
    #[arg(long)]
    pub reserved_cpus: Option<String>,
    /// The topology manager policy: none, best-effort, restricted or single-numa-node
    /// [default: none].
    #[arg(long)]
    pub topology_manager_policy: Option<String>,
    /// Align resources per container or per pod [default: container].
    #[arg(long)]
    pub topology_manager_scope: Option<String>,
    /// The topology manager's options, `prefer-closest-numa-nodes=true,max-allowable-numa-nodes=8`.
    #[arg(long)]
    pub topology_manager_policy_options: Option<String>,
    /// The sysfs the CPU and NUMA topology is read from (a fake tree in tests).
    #[arg(long, hide = true, env = "NODUS_SYSFS_ROOT", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// The kubeconfig to reach the API server with; without it the kubelet runs standalone
    /// (static pods only), as upstream.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// A kubeconfig with bootstrap credentials (a bootstrap token): when --kubeconfig does
    /// not exist yet, a client certificate is requested with it (TLS bootstrap) and
    /// --kubeconfig written to use `<cert-dir>/kubelet-client-current.pem`.
    #[arg(long)]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Renew the client certificate through the CSR API as it nears expiry.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub rotate_certificates: Option<bool>,
    /// Obtain the kubelet API's serving certificate from the cluster CA through the CSR API
    /// (`serverTLSBootstrap`) instead of self-signing one.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub rotate_server_certificates: Option<bool>,
    /// Register the node with the API server (with --kubeconfig) [default: true].
    #[arg(long)]
    pub register_node: Option<bool>,
    /// Labels to add when registering the node, `key=value,…`.
    #[arg(long)]
    pub node_labels: Option<String>,
    /// Taints to register the node with, `key=value:Effect,…`.
    #[arg(long)]
    pub register_with_taints: Option<String>,
    /// How often the node status is computed (and sent when it changed) [default: 10s].
    #[arg(long)]
    pub node_status_update_frequency: Option<String>,
    /// How often the node status is sent when nothing changed [default: 5m].
    #[arg(long)]
    pub node_status_report_frequency: Option<String>,
    /// The node Lease's duration; it is renewed every quarter of it [default: 40].
    #[arg(long)]
    pub node_lease_duration_seconds: Option<i32>,
    /// Port of the kubelet API (TLS, authenticated); 0 disables it [default: 10250].
    #[arg(long)]
    pub port: Option<u16>,
    /// The serving certificate of the kubelet API; without it a self-signed one is made
    /// in --cert-dir.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// The key of --tls-cert-file.
    #[arg(long)]
    pub tls_private_key_file: Option<PathBuf>,
    /// Where the self-signed serving certificate goes [default: <root-dir>/pki].
    #[arg(long)]
    pub cert_dir: Option<PathBuf>,
    /// CA bundle that client certificates of the kubelet API must chain to.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Let unauthenticated requests through as system:anonymous [default: false, the
    /// hardened setting; upstream's flag defaults to true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub anonymous_auth: Option<bool>,
    /// Check bearer tokens with a TokenReview against the API server [default: true with
    /// --kubeconfig].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub authentication_token_webhook: Option<bool>,
    /// How long TokenReview answers are cached [default: 2m].
    #[arg(long)]
    pub authentication_token_webhook_cache_ttl: Option<String>,
    /// AlwaysAllow or Webhook (SubjectAccessReview) [default: Webhook with --kubeconfig,
    /// otherwise AlwaysAllow].
    #[arg(long)]
    pub authorization_mode: Option<String>,
    /// How long an allowed SubjectAccessReview is cached [default: 5m].
    #[arg(long)]
    pub authorization_webhook_cache_authorized_ttl: Option<String>,
    /// How long a denied SubjectAccessReview is cached [default: 30s].
    #[arg(long)]
    pub authorization_webhook_cache_unauthorized_ttl: Option<String>,
}

/// The kubelet API's serving settings, flags over the config file over defaults.
struct SecurePort {
    addr: SocketAddr,
    cert: Option<(PathBuf, PathBuf)>,
    cert_dir: PathBuf,
    client_ca: Option<PathBuf>,
    auth: crate::server::auth::AuthSettings,
}

fn resolve_secure(
    args: &KubeletArgs,
    node: &str,
    have_client: bool,
) -> Result<SecurePort, RunError> {
    use crate::server::auth::{AuthSettings, AuthorizationMode};
    let c = match &args.config {
        Some(p) => KubeletConfiguration::load(p)?,
        None => KubeletConfiguration::default(),
    };
    let authn = c.authentication.clone().unwrap_or_default();
    let authz = c.authorization.clone().unwrap_or_default();
    let cert = args.tls_cert_file.clone().or(c.tls_cert_file.clone());
    let key = args
        .tls_private_key_file
        .clone()
        .or(c.tls_private_key_file.clone());
    let cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => {
            return Err(RunError::Flag(
                "--tls-cert-file and --tls-private-key-file go together".into(),
            ));
        }
    };
    let mode: AuthorizationMode = match args.authorization_mode.clone().or(authz.mode.clone()) {
        Some(m) => m
            .parse()
            .map_err(|e| RunError::Flag(format!("--authorization-mode: {e}")))?,
        None if have_client => AuthorizationMode::Webhook,
        None => AuthorizationMode::AlwaysAllow,
    };
    if mode == AuthorizationMode::Webhook && !have_client {
        return Err(RunError::Flag(
            "--authorization-mode=Webhook needs --kubeconfig: the SubjectAccessReviews go to the API server".into(),
        ));
    }
    let webhook = authn.webhook.clone().unwrap_or_default();
    let token_webhook = args
        .authentication_token_webhook
        .or(webhook.enabled)
        .unwrap_or(have_client);
    if token_webhook && !have_client {
        return Err(RunError::Flag(
            "--authentication-token-webhook needs --kubeconfig: the TokenReviews go to the API server".into(),
        ));
    }
    let az = authz.webhook.clone().unwrap_or_default();
    let addr_ip = match args.address {
        Some(ip) => ip,
        None => c
            .address
            .as_deref()
            .unwrap_or("0.0.0.0")
            .parse()
            .map_err(|e| RunError::Flag(format!("address: {e}")))?,
    };
    Ok(SecurePort {
        addr: SocketAddr::new(addr_ip, args.port.or(c.port).unwrap_or(10250)),
        cert,
        cert_dir: args
            .cert_dir
            .clone()
            .unwrap_or_else(|| args.root_dir.join("pki")),
        client_ca: args
            .client_ca_file
            .clone()
            .or(authn.x509.and_then(|x| x.client_ca_file)),
        auth: AuthSettings {
            node_name: node.to_string(),
            anonymous: args
                .anonymous_auth
                .or(authn.anonymous.and_then(|a| a.enabled))
                .unwrap_or(false),
            token_webhook,
            token_cache_ttl: dur(
                &args.authentication_token_webhook_cache_ttl,
                &webhook.cache_ttl,
                "2m",
                "authentication-token-webhook-cache-ttl",
            )?,
            mode,
            authorized_ttl: dur(
                &args.authorization_webhook_cache_authorized_ttl,
                &az.cache_authorized_ttl,
                "5m",
                "authorization-webhook-cache-authorized-ttl",
            )?,
            unauthorized_ttl: dur(
                &args.authorization_webhook_cache_unauthorized_ttl,
                &az.cache_unauthorized_ttl,
                "30s",
                "authorization-webhook-cache-unauthorized-ttl",
            )?,
        },
    })
}

/// `a=1,b=2` (or with `<` for eviction thresholds) into a map.
fn parse_map(
    flag: &str,
    s: &str,
    sep: char,
) -> Result<std::collections::BTreeMap<String, String>, RunError> {
    let mut m = std::collections::BTreeMap::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once(sep)
            .ok_or_else(|| RunError::Flag(format!("--{flag}: {part:?} is not KEY{sep}VALUE")))?;
        m.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(m)
}

/// Flags, config file and defaults merged.
struct Resolved {
    endpoint: String,
    pod_manifest_path: Option<PathBuf>,
    manifest_url: Option<String>,
    file_check_frequency: Duration,
    http_check_frequency: Duration,
    sync_frequency: Duration,
    pod_logs_dir: PathBuf,
    cluster_dns: Vec<String>,
    cluster_domain: String,
    resolv_conf: PathBuf,
    healthz: SocketAddr,
    read_only: SocketAddr,
    evented_pleg: bool,
    cm: crate::cm::Config,
    memory_manager: crate::cm::memorymanager::Config,
    node: NodeSettings,
    eviction: crate::eviction::Config,
    /// `userNamespaces.idsPerPod`.
    ids_per_pod: u32,
    shutdown: crate::nodeshutdown::Config,
    resource_managers: ResourceManagers,
}

/// The CPU and topology managers' settings.
struct ResourceManagers {
    cpu: crate::cm::cpumanager::Config,
    topology_policy: String,
    topology_scope: String,
    topology_options: std::collections::BTreeMap<String, String>,
    sysfs: PathBuf,
}

/// upstream's cpuManager*, reservedSystemCPUs and topologyManager* settings. A
/// `--reserved-cpus` set becomes the system-reserved cpu (and kube-reserved's cpu goes), as
/// upstream: Allocatable then leaves exactly those CPUs out.
fn resolve_resource_managers(
    args: &KubeletArgs,
    c: &KubeletConfiguration,
    cm: &mut crate::cm::Config,
) -> Result<ResourceManagers, RunError> {
    let flag = |e: String| RunError::Flag(e);
    let map =
        |name: &str, a: &Option<String>, f: &Option<std::collections::BTreeMap<String, String>>| {
            match a {
                Some(s) => parse_map(name, s, '='),
                None => Ok(f.clone().unwrap_or_default()),
            }
        };
    let reserved_text = args
        .reserved_cpus
        .clone()
        .or(c.reserved_system_cpus.clone())
        .unwrap_or_default();
    let reserved_cpus = crate::cm::cpuset::CpuSet::parse(&reserved_text).map_err(|e| {
        flag(format!(
            "unable to parse reservedSystemCPUs ({reserved_text}), error: {e}"
        ))
    })?;
    if !reserved_cpus.is_empty() {
        tracing::info!(reserved_cpus = %reserved_cpus, "--reserved-cpus is specified, it will overwrite the cpu setting in KubeReserved and SystemReserved");
        cm.kube_reserved.remove("cpu");
        cm.system_reserved
            .insert("cpu".into(), reserved_cpus.len().to_string());
    }
    let reserved_milli =
        if cm.kube_reserved.contains_key("cpu") || cm.system_reserved.contains_key("cpu") {
            let k = crate::cm::allocatable::parse_reserved("kubeReserved", &cm.kube_reserved)
                .map_err(flag)?;
            let s = crate::cm::allocatable::parse_reserved("systemReserved", &cm.system_reserved)
                .map_err(flag)?;
            Some(k.cpu_milli + s.cpu_milli)
        } else {
            None
        };
    Ok(ResourceManagers {
        cpu: crate::cm::cpumanager::Config {
            policy: args
                .cpu_manager_policy
                .clone()
                .or(c.cpu_manager_policy.clone())
                .unwrap_or_else(|| "none".into()),
            policy_options: map(
                "cpu-manager-policy-options",
                &args.cpu_manager_policy_options,
                &c.cpu_manager_policy_options,
            )?,
            reconcile_period: dur(
                &args.cpu_manager_reconcile_period,
                &c.cpu_manager_reconcile_period,
                "10s",
                "cpu-manager-reconcile-period",
            )?,
            reserved_cpus,
            reserved_milli,
            state_dir: args.root_dir.clone(),
        },
        topology_policy: args
            .topology_manager_policy
            .clone()
            .or(c.topology_manager_policy.clone())
            .unwrap_or_else(|| "none".into()),
        topology_scope: args
            .topology_manager_scope
            .clone()
            .or(c.topology_manager_scope.clone())
            .unwrap_or_else(|| "container".into()),
        topology_options: map(
            "topology-manager-policy-options",
            &args.topology_manager_policy_options,
            &c.topology_manager_policy_options,
        )?,
        sysfs: args.sysfs_root.clone(),
    })
}

/// The settings of the node status, lease and registration.
struct NodeSettings {
    register: bool,
    labels: std::collections::BTreeMap<String, String>,
    taints: Vec<k8s_openapi::api::core::v1::Taint>,
    update_frequency: Duration,
    report_frequency: Duration,
    lease_duration_seconds: i32,
    port: u16,
}

fn resolve_node(args: &KubeletArgs, c: &KubeletConfiguration) -> Result<NodeSettings, RunError> {
    let labels = match &args.node_labels {
        Some(s) => crate::nodestatus::parse_labels(s)
            .map_err(|e| RunError::Flag(format!("--node-labels: {e}")))?,
        None => Default::default(),
    };
    let taints = match &args.register_with_taints {
        Some(s) => crate::nodestatus::parse_taints(s)
            .map_err(|e| RunError::Flag(format!("--register-with-taints: {e}")))?,
        None => c.register_with_taints.clone().unwrap_or_default(),
    };
    let lease = args
        .node_lease_duration_seconds
        .or(c.node_lease_duration_seconds)
        .unwrap_or(40);
    if lease <= 0 {
        return Err(RunError::Flag(format!(
            "nodeLeaseDurationSeconds must be greater than 0, got {lease}"
        )));
    }
    Ok(NodeSettings {
        register: args.register_node.or(c.register_node).unwrap_or(true),
        labels,
        taints,
        update_frequency: dur(
            &args.node_status_update_frequency,
            &c.node_status_update_frequency,
            "10s",
            "node-status-update-frequency",
        )?,
        report_frequency: dur(
            &args.node_status_report_frequency,
            &c.node_status_report_frequency,
            "5m",
            "node-status-report-frequency",
        )?,
        lease_duration_seconds: lease,
        port: args.port.or(c.port).unwrap_or(10250),
    })
}

fn resolve(args: &KubeletArgs) -> Result<Resolved, RunError> {
    let c = match &args.config {
        Some(p) => KubeletConfiguration::load(p)?,
        None => KubeletConfiguration::default(),
    };
    let dur = |flag: &Option<String>, file: &Option<String>, default: &str, name: &str| {
        let v = flag
            .clone()
            .or_else(|| file.clone())
            .unwrap_or_else(|| default.to_string());
        parse_duration(&v).map_err(|e| RunError::Flag(format!("--{name}: {e}")))
    };
    let ip = |flag: Option<IpAddr>, file: &Option<String>, default: &str, name: &str| match flag {
        Some(ip) => Ok(ip),
        None => file
            .as_deref()
            .unwrap_or(default)
            .parse::<IpAddr>()
            .map_err(|e| RunError::Flag(format!("{name}: {e}"))),
    };
    let mut gates: Vec<String> = c
        .feature_gates
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    gates.extend(args.feature_gates.iter().cloned());
    let mut cm = resolve_cm(args, &c)?;
    cm.memory_qos = feature(&gates, "MemoryQoS")?;
    cm.kubelet_psi = feature(&gates, "KubeletPSI")?;
    let resource_managers = resolve_resource_managers(args, &c, &mut cm)?;
    let node = resolve_node(args, &c)?;
    let memory_manager = resolve_memory_manager(args, &c)?;
    let eviction = resolve_eviction(args, &c, &cm)?;
    let shutdown = resolve_shutdown(&c, &gates)?;
    let ids_per_pod = c.ids_per_pod();
    Ok(Resolved {
        ids_per_pod,
        shutdown,
        resource_managers,
        endpoint: args
            .container_runtime_endpoint
            .clone()
            .or(c.container_runtime_endpoint)
            .unwrap_or_else(|| "unix:///run/nodus/nodus.sock".into()),
        pod_manifest_path: args.pod_manifest_path.clone().or(c.static_pod_path),
        manifest_url: args.manifest_url.clone().or(c.static_pod_url),
        file_check_frequency: dur(
            &args.file_check_frequency,
            &c.file_check_frequency,
            "20s",
            "file-check-frequency",
        )?,
        http_check_frequency: dur(
            &args.http_check_frequency,
            &c.http_check_frequency,
            "20s",
            "http-check-frequency",
        )?,
        sync_frequency: dur(
            &args.sync_frequency,
            &c.sync_frequency,
            "1m",
            "sync-frequency",
        )?,
        pod_logs_dir: args
            .pod_logs_dir
            .clone()
            .or(c.pod_logs_dir)
            .unwrap_or_else(|| "/var/log/pods".into()),
        cluster_dns: if args.cluster_dns.is_empty() {
            c.cluster_dns
                .unwrap_or_else(|| args.default_cluster_dns.clone())
        } else {
            args.cluster_dns.clone()
        },
        cluster_domain: args
            .cluster_domain
            .clone()
            .or(c.cluster_domain)
            .unwrap_or_else(|| "cluster.local".into()),
        resolv_conf: args
            .resolv_conf
            .clone()
            .or(c.resolv_conf)
            .unwrap_or_else(|| "/etc/resolv.conf".into()),
        healthz: SocketAddr::new(
            ip(
                args.healthz_bind_address,
                &c.healthz_bind_address,
                "127.0.0.1",
                "healthzBindAddress",
            )?,
            args.healthz_port.or(c.healthz_port).unwrap_or(10248),
        ),
        read_only: SocketAddr::new(
            ip(args.address, &c.address, "0.0.0.0", "address")?,
            args.read_only_port.or(c.read_only_port).unwrap_or(0),
        ),
        evented_pleg: feature(&gates, "EventedPLEG")?,
        cm,
        memory_manager,
        node,
        eviction,
    })
}

/// The eviction thresholds and periods, flags over the config file over upstream's defaults.
fn resolve_eviction(
    args: &KubeletArgs,
    c: &KubeletConfiguration,
    cm: &crate::cm::Config,
) -> Result<crate::eviction::Config, RunError> {
    use crate::eviction::thresholds::{parse_config, parse_statements};
    let flag_err = |e: crate::eviction::thresholds::ThresholdError| RunError::Flag(e.0);
    let map = |flag: &str,
               sep: char,
               a: &Option<String>,
               f: &Option<std::collections::BTreeMap<String, String>>|
     -> Result<std::collections::BTreeMap<String, String>, RunError> {
        match a {
            Some(s) if sep == '<' => parse_statements(flag, s).map_err(flag_err),
            Some(s) => parse_map(flag, s, sep),
            None => Ok(f.clone().unwrap_or_default()),
        }
    };
    let soft = map("eviction-soft", '<', &args.eviction_soft, &c.eviction_soft)?;
    let grace = map(
        "eviction-soft-grace-period",
        '=',
        &args.eviction_soft_grace_period,
        &c.eviction_soft_grace_period,
    )?;
    let reclaim = map(
        "eviction-minimum-reclaim",
        '=',
        &args.eviction_minimum_reclaim,
        &c.eviction_minimum_reclaim,
    )?;
    let enforce_pods = cm.enforce_node_allocatable.iter().any(|e| e == "pods");
    let thresholds = parse_config(&cm.eviction_hard, &soft, &grace, &reclaim, enforce_pods)
        .map_err(|e| RunError::Flag(format!("eviction thresholds: {e}")))?;
    let monitoring_interval = parse_duration(&args.eviction_monitoring_interval)
        .map_err(|e| RunError::Flag(format!("--eviction-monitoring-interval: {e}")))?;
    if monitoring_interval.is_zero() {
        return Err(RunError::Flag(
            "--eviction-monitoring-interval must be positive".into(),
        ));
    }
    Ok(crate::eviction::Config {
        thresholds,
        pressure_transition_period: dur(
            &args.eviction_pressure_transition_period,
            &c.eviction_pressure_transition_period,
            "5m",
            "eviction-pressure-transition-period",
        )?,
        max_pod_grace_period_seconds: i64::from(
            args.eviction_max_pod_grace_period
                .or(c.eviction_max_pod_grace_period)
                .unwrap_or(0),
        ),
        monitoring_interval,
    })
}

/// The memory manager's policy and per-NUMA reservations, flags over the config file.
fn resolve_memory_manager(
    args: &KubeletArgs,
    c: &KubeletConfiguration,
) -> Result<crate::cm::memorymanager::Config, RunError> {
    let reserved_memory = if args.reserved_memory.is_empty() {
        c.reserved_memory.clone().unwrap_or_default()
    } else {
        let mut out = Vec::new();
        for v in &args.reserved_memory {
            out.extend(
                crate::cm::memorymanager::reserved::parse_flag(v).map_err(|e| {
                    RunError::Flag(format!(
                        "invalid argument {v:?} for \"--reserved-memory\" flag: {e}"
                    ))
                })?,
            );
        }
        out
    };
    Ok(crate::cm::memorymanager::Config {
        policy: args
            .memory_manager_policy
            .clone()
            .or(c.memory_manager_policy.clone())
            .unwrap_or_else(|| crate::cm::memorymanager::POLICY_NONE.into()),
        reserved_memory,
        sysfs_root: args.sysfs_root.clone(),
    })
}

/// `cgroupDriver` as configured; the runtime's RuntimeConfig answer overrides it.
fn resolve_cgroup_driver(
    args: &KubeletArgs,
    c: &KubeletConfiguration,
) -> Result<crate::cm::CgroupDriver, RunError> {
    let driver = args
        .cgroup_driver
        .clone()
        .or(c.cgroup_driver.clone())
        .unwrap_or_else(|| "cgroupfs".into());
    crate::cm::CgroupDriver::parse(&driver).map_err(RunError::Flag)
}

fn resolve_cm(args: &KubeletArgs, c: &KubeletConfiguration) -> Result<crate::cm::Config, RunError> {
    let cgroup_driver = resolve_cgroup_driver(args, c)?;
    let map = |flag: &str,
               sep: char,
               a: &Option<String>,
               f: &Option<std::collections::BTreeMap<String, String>>|
     -> Result<Option<std::collections::BTreeMap<String, String>>, RunError> {
        match a {
            Some(s) => parse_map(flag, s, sep).map(Some),
            None => Ok(f.clone()),
        }
    };
    let period = dur(
        &args.cpu_cfs_quota_period,
        &c.cpu_cfs_quota_period,
        "100ms",
        "cpu-cfs-quota-period",
    )?;
    let period_us = period.as_micros() as u64;
    if !(1000..=1_000_000).contains(&period_us) {
        return Err(RunError::Flag(format!(
            "cpuCFSQuotaPeriod must be between 1ms and 1s, got {period:?}"
        )));
    }
    let enforce = if args.enforce_node_allocatable.is_empty() {
        c.enforce_node_allocatable
            .clone()
            .unwrap_or_else(|| vec!["pods".into()])
    } else {
        args.enforce_node_allocatable.clone()
    };
    for e in &enforce {
        if !["pods", "kube-reserved", "system-reserved", "none"].contains(&e.as_str()) {
            return Err(RunError::Flag(format!(
                "enforceNodeAllocatable: unsupported value {e:?}: supported values: \"pods\", \"kube-reserved\", \"system-reserved\", \"none\""
            )));
        }
    }
    let max_pods = args.max_pods.or(c.max_pods).unwrap_or(110);
    if max_pods < 1 {
        return Err(RunError::Flag(format!(
            "maxPods must be positive, got {max_pods}"
        )));
    }
    let pids = args.pod_max_pids.or(c.pod_pids_limit).unwrap_or(-1);
    let throttling = c
        .memory_throttling_factor
        .unwrap_or(crate::cm::memory_qos::DEFAULT_THROTTLING_FACTOR);
    if !(throttling > 0.0 && throttling <= 1.0) {
        return Err(RunError::Flag(format!(
            "invalid configuration: memoryThrottlingFactor {throttling} must be greater than 0 and less than or equal to 1.0"
        )));
    }
    Ok(crate::cm::Config {
        layout: crate::cm::qos::Layout {
            root: args
                .cgroup_root
                .clone()
                .or(c.cgroup_root.clone())
                .unwrap_or_else(|| "/".into()),
            per_qos: args.cgroups_per_qos.or(c.cgroups_per_qos).unwrap_or(true),
        },
        cgroup_driver,
        kube_reserved: map("kube-reserved", '=', &args.kube_reserved, &c.kube_reserved)?
            .unwrap_or_default(),
        system_reserved: map(
            "system-reserved",
            '=',
            &args.system_reserved,
            &c.system_reserved,
        )?
        .unwrap_or_default(),
        kube_reserved_cgroup: args
            .kube_reserved_cgroup
            .clone()
            .or(c.kube_reserved_cgroup.clone()),
        system_reserved_cgroup: args
            .system_reserved_cgroup
            .clone()
            .or(c.system_reserved_cgroup.clone()),
        eviction_hard: match &args.eviction_hard {
            Some(s) => crate::eviction::thresholds::parse_statements("eviction-hard", s)
                .map_err(|e| RunError::Flag(e.0))?,
            None => c
                .eviction_hard
                .clone()
                .unwrap_or_else(crate::cm::allocatable::default_eviction_hard),
        },
        enforce_node_allocatable: enforce,
        max_pods,
        pod_pids_limit: (pids > 0).then_some(pids),
        cpu_cfs_quota: args.cpu_cfs_quota.or(c.cpu_cfs_quota).unwrap_or(true),
        cpu_cfs_quota_period_us: period_us,
        // Set from the feature gates by the caller.
        memory_qos: false,
        memory_throttling_factor: throttling,
        kubelet_psi: false,
    })
}

/// The topology manager and the CPU manager (upstream's NewContainerManager and Start):
/// the CPU topology from sysfs, the CPU manager's state file checked against its policy, and
/// the CPU and device managers registered as hint providers.
fn start_resource_managers(
    rm: &ResourceManagers,
    devices: &Arc<crate::cm::devicemanager::DeviceManager>,
    memory: &Arc<crate::cm::memorymanager::MemoryManager>,
) -> Result<
    (
        Arc<crate::cm::topologymanager::TopologyManager>,
        Arc<crate::cm::cpumanager::CpuManager>,
    ),
    RunError,
> {
    use crate::cm::manager::CmError;
    let topology = crate::cm::topology::CpuTopology::discover(&rm.sysfs)
        .map_err(|e| CmError::CpuManagerInit(e.to_string()))?;
    let tm = Arc::new(
        crate::cm::topologymanager::TopologyManager::new(
            &rm.sysfs,
            &rm.topology_policy,
            &rm.topology_scope,
            &rm.topology_options,
        )
        .map_err(CmError::TopologyManagerInit)?,
    );
    devices.set_numa_nodes(topology.numa_nodes());
    devices.set_affinity(Arc::clone(&tm) as _);
    let cpus = crate::cm::cpumanager::CpuManager::new(&rm.cpu, topology).map_err(|e| {
        if e.at_start() {
            CmError::CpuManagerStart(e.to_string())
        } else {
            CmError::CpuManagerInit(e.to_string())
        }
    })?;
    let cpus = Arc::new(cpus);
    cpus.set_affinity(Arc::clone(&tm) as _);
    tm.add_hint_provider(Arc::clone(&cpus) as _);
    memory.set_affinity(Arc::clone(&tm) as _);
    tm.add_hint_provider(Arc::clone(memory) as _);
    tm.add_hint_provider(Arc::clone(devices) as _);
    Ok((tm, cpus))
}

/// upstream's ActivePodsFunc over the pod manager, the core and the workers.
fn active_pods_func(
    core: &Arc<crate::kubelet::Core>,
    pods: &PodManager,
    workers: &crate::pod_workers::PodWorkers,
) -> Box<dyn Fn() -> Vec<k8s_openapi::api::core::v1::Pod> + Send + Sync> {
    let (c, p, w) = (Arc::clone(core), pods.clone(), workers.clone());
    Box::new(move || crate::kubelet::active_pods(&p, &c, &w))
}

/// Resolves once the pod's worker is no longer running or stopping it.
async fn worker_stopped(w: crate::pod_workers::PodWorkers, uid: String) {
    use crate::pod_workers::WorkerPhase::{Syncing, Terminating};
    while matches!(w.phase(&uid), Some(Syncing | Terminating)) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The eviction manager's kill: the pod is marked Evicted and handed to its worker.
fn eviction_kill(
    core: &Arc<crate::kubelet::Core>,
    workers: &crate::pod_workers::PodWorkers,
) -> crate::eviction::KillPodFunc {
    let (c, w) = (Arc::clone(core), workers.clone());
    Arc::new(move |pod, grace, message| {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        c.mark_evicted(&uid, &message);
        w.update(crate::pod_workers::Update::Kill {
            pod,
            grace: Some(grace),
            remove: false,
        });
        Box::pin(worker_stopped(w.clone(), uid))
    })
}

/// What the shutdown manager is given of the kubelet: its active pods, and a kill that
/// marks the pod's terminal status and resolves once the pod's worker has stopped it.
#[allow(clippy::type_complexity)]
fn shutdown_functions(
    core: &Arc<crate::kubelet::Core>,
    pods: &PodManager,
    workers: &crate::pod_workers::PodWorkers,
) -> (
    Box<dyn Fn() -> Vec<k8s_openapi::api::core::v1::Pod> + Send + Sync>,
    crate::nodeshutdown::KillPod,
) {
    let active = active_pods_func(core, pods, workers);
    let (c, w) = (Arc::clone(core), workers.clone());
    let kill: crate::nodeshutdown::KillPod = Arc::new(move |pod, grace| {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        c.mark_shutdown(&uid);
        w.update(crate::pod_workers::Update::Kill {
            pod,
            grace: Some(grace),
            remove: false,
        });
        Box::pin(worker_stopped(w.clone(), uid))
    });
    (active, kill)
}

/// Graceful node shutdown from the KubeletConfiguration (upstream has no flags for it).
fn resolve_shutdown(
    c: &KubeletConfiguration,
    gates: &[String],
) -> Result<crate::nodeshutdown::Config, RunError> {
    let period = |v: &Option<String>, name: &str| -> Result<Duration, RunError> {
        match v {
            Some(v) => parse_duration(v).map_err(|e| RunError::Flag(format!("{name}: {e}"))),
            None => Ok(Duration::ZERO),
        }
    };
    let by_priority = c
        .shutdown_grace_period_by_pod_priority
        .clone()
        .unwrap_or_default();
    if !by_priority.is_empty() && !feature(gates, "GracefulNodeShutdownBasedOnPodPriority")? {
        return Err(RunError::Flag(
            "invalid configuration: Specifying shutdownGracePeriodByPodPriority requires feature gate GracefulNodeShutdownBasedOnPodPriority".into(),
        ));
    }
    let config = crate::nodeshutdown::Config {
        shutdown_grace_period: period(&c.shutdown_grace_period, "shutdownGracePeriod")?,
        shutdown_grace_period_critical_pods: period(
            &c.shutdown_grace_period_critical_pods,
            "shutdownGracePeriodCriticalPods",
        )?,
        by_pod_priority: by_priority,
    };
    config.validate().map_err(RunError::Flag)?;
    if !feature(gates, "GracefulNodeShutdown")? {
        tracing::info!(
            "Node graceful shutdown feature is disabled, node shutdown will be immediate"
        );
        return Ok(crate::nodeshutdown::Config::default());
    }
    Ok(config)
}

fn dur(
    flag: &Option<String>,
    file: &Option<String>,
    default: &str,
    name: &str,
) -> Result<Duration, RunError> {
    let v = flag
        .clone()
        .or_else(|| file.clone())
        .unwrap_or_else(|| default.to_string());
    parse_duration(&v).map_err(|e| RunError::Flag(format!("--{name}: {e}")))
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Connect(#[from] cri::ConnectError),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("--feature-gates: {0}")]
    FeatureGate(String),
    #[error(transparent)]
    Config(#[from] crate::kubeletconfig::ConfigError),
    #[error("{0}")]
    Flag(String),
    // The cause follows in the error chain (`{:#}`), not repeated here.
    #[error("Failed to start ContainerManager")]
    Cm(#[from] crate::cm::manager::CmError),
    #[error(transparent)]
    ApiClient(#[from] crate::apiclient::ApiClientError),
}

/// The feature gates this kubelet knows, with their defaults (upstream's as of 1.34:
/// MemoryQoS alpha, KubeletPSI beta).
const FEATURE_GATES: &[(&str, bool)] = &[
    ("EventedPLEG", false),
    ("GracefulNodeShutdown", true),
    ("GracefulNodeShutdownBasedOnPodPriority", true),
    ("KubeletPSI", true),
    ("MemoryQoS", false),
];

fn feature(gates: &[String], name: &str) -> Result<bool, RunError> {
    let mut on = FEATURE_GATES
        .iter()
        .find(|(n, _)| *n == name)
        .is_some_and(|&(_, default)| default);
    for g in gates {
        let (k, v) = g
            .split_once('=')
            .ok_or_else(|| RunError::FeatureGate(format!("{g:?} is not NAME=true|false")))?;
        let v: bool = v
            .parse()
            .map_err(|_| RunError::FeatureGate(format!("{g:?}: value must be true or false")))?;
        if !FEATURE_GATES.iter().any(|(n, _)| *n == k) {
            return Err(RunError::FeatureGate(format!(
                "unrecognized feature gate: {k}"
            )));
        }
        if k == name {
            on = v;
        }
    }
    Ok(on)
}

/// The node's name: `--hostname-override`, else the host name, lowercased (as upstream).
pub fn node_name(args: &KubeletArgs) -> String {
    if let Some(n) = &args.hostname_override {
        return n.to_lowercase();
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
        .to_lowercase()
}

/// The node's address: `--node-ip`, else the address of the interface with the default
/// route, else the host's first global IPv4 address. The Node's InternalIP, the pods'
/// hostIP and the kubelet serving certificate's IP must all agree on it.
pub fn node_ip(args: &KubeletArgs) -> Option<IpAddr> {
    args.node_ip
        .or_else(nodus_serving::hostaddr::choose_host_ip)
        .or_else(|| host_ip().and_then(|s| s.parse().ok()))
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

/// What the parts that talk to the API server share.
struct ApiParts {
    client: kube::Client,
    node: String,
    settings: NodeSettings,
    node_ip: Option<IpAddr>,
    rt: cri::Runtime,
    cm: Arc<crate::cm::ContainerManager>,
    pleg: Arc<Health>,
    status: StatusManager,
    pods: PodManager,
    workers: PodWorkers,
    mirrors: config::MirrorPods,
    core: Arc<Core>,
    pressure: Arc<crate::eviction::Pressure>,
}

/// Node registration and status, the Lease, the status sync and mirror pods.
fn spawn_api_parts(p: ApiParts) {
    let (uid_tx, uid_rx) = tokio::sync::watch::channel(None);
    let runtime = Arc::new(crate::nodestatus::RuntimeState::default());
    tokio::spawn(crate::nodestatus::run_runtime_checks(
        Arc::clone(&runtime),
        p.rt.clone(),
    ));
    let manager = crate::nodestatus::NodeStatusManager {
        client: p.client.clone(),
        config: crate::nodestatus::NodeConfig {
            name: p.node.clone(),
            register: p.settings.register,
            labels: p.settings.labels,
            taints: p.settings.taints,
            node_ip: p.node_ip,
            kubelet_port: i32::from(p.settings.port),
            update_frequency: p.settings.update_frequency,
            report_frequency: p.settings.report_frequency,
        },
        rt: p.rt,
        cm: p.cm,
        pleg: p.pleg,
        runtime,
        node_uid: uid_tx,
        pressure: p.pressure,
        shutdown: Arc::clone(&p.core.shutdown),
    };
    tokio::spawn(manager.run());
    tokio::spawn(
        crate::nodelease::LeaseController {
            client: p.client.clone(),
            node: p.node.clone(),
            duration_seconds: p.settings.lease_duration_seconds,
            node_uid: uid_rx.clone(),
        }
        .run(),
    );
    tokio::spawn(
        crate::mirror::MirrorManager {
            client: p.client.clone(),
            node: p.node,
            node_uid: uid_rx,
            pods: p.pods.clone(),
            mirrors: p.mirrors.clone(),
        }
        .run(),
    );
    let core = p.core;
    tokio::spawn(
        crate::status::sync::StatusSync {
            client: p.client,
            status: p.status,
            pods: p.pods,
            workers: p.workers,
            mirrors: p.mirrors,
            is_rejected: Box::new(move |uid| core.is_rejected(uid)),
        }
        .run(),
    );
}

/// Runs the kubelet until SIGTERM/SIGINT. Pods keep running when it stops, as upstream's.
/// Renews the client certificate at upstream's jittered deadline, as the node itself
/// (the approver's selfnodeclient rule). New connections use the renewed file.
async fn rotate_client_certificate(client: kube::Client, cert_dir: PathBuf, node: String) {
    use crate::certificate::{Kind, renewal_due, request};
    loop {
        let Some(due) = renewal_due(&cert_dir, Kind::Client) else {
            return;
        };
        let wait = due
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        tokio::time::sleep(wait).await;
        if let Err(e) = request(
            client.clone(),
            &cert_dir,
            &node,
            Kind::Client,
            &[],
            Duration::from_secs(15 * 60),
        )
        .await
        {
            tracing::warn!(error = %e, "client certificate rotation failed; retrying");
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    }
}

pub async fn run(args: KubeletArgs) -> Result<(), RunError> {
    let node = node_name(&args);
    let mut r = resolve(&args)?;
    let evented = r.evented_pleg;
    for d in [&args.root_dir, &r.pod_logs_dir] {
        std::fs::create_dir_all(d).map_err(|e| RunError::Io(d.display().to_string(), e))?;
    }
    let metrics = Arc::new(Metrics::new());
    let rt = cri::connect_instrumented(
        &r.endpoint,
        Duration::from_secs(10),
        metrics.runtime_operations.clone(),
    )?;
    r.cm.cgroup_driver = crate::cm::cgroup_driver::from_runtime(&rt.runtime, r.cm.cgroup_driver)
        .await
        .map_err(RunError::Flag)?;
    if r.cm.cgroup_driver == crate::cm::cgroup_driver::CgroupDriver::Cgroupfs
        && nodus_cgroups::systemd::running_systemd()
    {
        // Upstream's advice (kubeadm's "Configuring a cgroup driver"): two managers of one
        // tree disagree under resource pressure. It works, so it is said, not refused.
        tracing::warn!(
            "cgroupDriver \"cgroupfs\" on a host whose cgroup tree systemd manages: systemd and the kubelet would both manage cgroups; set cgroupDriver: systemd (--cgroup-driver systemd) and the runtime's systemd-cgroup = true"
        );
    }
    let cert_dir = args
        .cert_dir
        .clone()
        .unwrap_or_else(|| args.root_dir.join("pki"));
    if let (Some(kc), Some(bootstrap)) = (&args.kubeconfig, &args.bootstrap_kubeconfig) {
        crate::certificate::bootstrap_client(kc, bootstrap, &cert_dir, &node)
            .await
            .map_err(|e| RunError::Flag(format!("TLS bootstrap: {e}")))?;
    }
    let api_client = match &args.kubeconfig {
        Some(p) => Some(
            crate::apiclient::client_from_kubeconfig(p)
                .await
                .map_err(|e| RunError::Flag(e.to_string()))?,
        ),
        None => None,
    };
    let secure = resolve_secure(&args, &node, api_client.is_some())?;
    let host_ips: Vec<String> = node_ip(&args)
        .map(|ip| ip.to_string())
        .into_iter()
        .collect();
    let cm = Arc::new(crate::cm::ContainerManager::new(
        r.cm.clone(),
        &args.root_dir,
    )?);
    let memory = Arc::new(
        crate::cm::memorymanager::MemoryManager::start(
            &r.memory_manager,
            &r.cm,
            cm.capacity.memory_bytes,
            &args.root_dir,
        )
        .map_err(crate::cm::manager::CmError::from)?,
    );
    let _ = cm.memory.set(Arc::clone(&memory));
    cm.start()?;
    let devices = Arc::new(
        crate::cm::devicemanager::DeviceManager::new(&args.root_dir)
            .map_err(|e| RunError::Flag(e.to_string()))?,
    );
    let _ = cm.devices.set(Arc::clone(&devices));
    let (topology_manager, cpus) =
        start_resource_managers(&r.resource_managers, &devices, &memory)?;
    let _ = cm.cpus.set(Arc::clone(&cpus));
    tokio::spawn(Arc::clone(&cpus).reconcile_loop(rt.runtime.clone()));
    {
        let dm = Arc::clone(&devices);
        tokio::spawn(async move {
            if let Err(e) = crate::cm::devicemanager::registration::serve(dm).await {
                tracing::error!(error = %e, "device plugin registration server failed");
            }
        });
    }
    // The downward API reads an unset limit as node allocatable, as upstream.
    let settings = Settings {
        root_dir: args.root_dir.clone(),
        sandbox: SandboxSettings {
            node_name: node.clone(),
            pod_logs_dir: r.pod_logs_dir.clone(),
            resolv_conf: r.resolv_conf.clone(),
            cluster_dns: r.cluster_dns.clone(),
            cluster_domain: r.cluster_domain.clone(),
        },
        node_cpu_milli: cm.allocatable.cpu_milli,
        node_memory_bytes: cm.allocatable.memory_bytes,
        host_ips,
        max_parallel_pod_starts: args
            .max_parallel_pod_starts
            .unwrap_or_else(|| 4 * std::thread::available_parallelism().map_or(1, |n| n.get())),
    };
    let status = StatusManager::new();
    let (probes, probe_rx) = ProbeManager::new(
        rt.runtime.clone(),
        Arc::new(ProviderAdapter(status.clone())),
    );
    let kr = Arc::new(KubeRuntime::new(
        rt.clone(),
        Arc::clone(&cm),
        settings,
        probes,
    ));
    // upstream's MakeUserNsManager: a bad id range stops the kubelet at start.
    let userns = crate::userns::KubeletMappings::from_files(&Default::default(), r.ids_per_pod)
        .and_then(|m| {
            crate::userns::UsernsManager::new(
                &args.root_dir.join("pods"),
                m,
                u32::try_from(r.cm.max_pods).unwrap_or(u32::MAX),
                r.ids_per_pod,
            )
        })
        .map_err(|e| RunError::Flag(format!("user namespace manager: kubelet mappings: {e}")))?;
    let _ = kr.userns.set(Arc::new(userns));
    if let Some(c) = &api_client {
        let _ = kr
            .objects
            .set(crate::objectcache::ObjectCache::new(Some(c.clone())));
        let _ = kr
            .tokens
            .set(Arc::new(crate::token::Manager::new(c.clone())));
        let _ = kr
            .services
            .set(crate::services::ServiceLister::start(c.clone()));
        let _ = kr
            .runtime_classes
            .set(crate::runtimeclass::RuntimeClassManager::start(c.clone()));
    }
    // Container ids carry the runtime's name (`nodus://…`): nothing may be reported before
    // it is known, or ids would switch from a placeholder to the real name. Upstream's
    // kubelet exits when Version fails at start (and its unit restarts it); this one waits.
    let mut tries = 0u32;
    loop {
        match kr.refresh_runtime_name().await {
            Ok(v) => {
                tracing::info!(node = %node, runtime = %v, endpoint = %rt.endpoint, "connected to the container runtime");
                break;
            }
            Err(e) => {
                if tries.is_multiple_of(20) {
                    tracing::warn!(endpoint = %rt.endpoint, error = %e.message(), "container runtime not answering yet; waiting for it");
                }
                tries += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    let core = Arc::new(Core::new(
        Arc::clone(&kr),
        status.clone(),
        Arc::clone(&metrics),
        r.sync_frequency,
    ));
    let workers = PodWorkers::new(Arc::new(Syncer(Arc::clone(&core))));

    let (pod_config, config_rx) = PodConfig::new();
    let mut sources: Vec<&'static str> = Vec::new();
    if let Some(dir) = &r.pod_manifest_path {
        sources.push(config::FILE_SOURCE);
        config::spawn_file_source(
            dir.clone(),
            node.clone(),
            r.file_check_frequency,
            pod_config.channel(config::FILE_SOURCE),
        );
    }
    if let Some(url) = &r.manifest_url {
        sources.push(config::HTTP_SOURCE);
        config::spawn_http_source(
            url.clone(),
            node.clone(),
            r.http_check_frequency,
            pod_config.channel(config::HTTP_SOURCE),
        );
    }
    // One client, one identity and one connection pool for everything the kubelet asks of
    // the API server.
    let client = api_client.clone();
    let mirrors = config::MirrorPods::default();
    if let Some(client) = &client {
        sources.push(config::API_SOURCE);
        crate::events::recorder().connect(client.clone(), &node);
        config::spawn_api_source(
            client.clone(),
            node.clone(),
            pod_config.channel(config::API_SOURCE),
            mirrors.clone(),
        );
    }
    if sources.is_empty() {
        tracing::warn!(
            "no pod source configured (--pod-manifest-path, --manifest-url): this kubelet runs nothing"
        );
    }

    let (pleg_tx, pleg_rx) = tokio::sync::mpsc::unbounded_channel();
    let threshold = parse_duration(&args.pleg_relist_threshold)
        .map_err(|e| RunError::Flag(format!("--pleg-relist-threshold: {e}")))?;
    let health = Arc::new(Health::new(threshold));
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
    if let Some(client) = client {
        spawn_api_parts(ApiParts {
            client,
            node: node.clone(),
            settings: r.node,
            node_ip: args.node_ip,
            rt: rt.clone(),
            cm: Arc::clone(&cm),
            pleg: Arc::clone(&health),
            status: status.clone(),
            pods: pods.clone(),
            workers: workers.clone(),
            mirrors,
            core: Arc::clone(&core),
            pressure: Arc::clone(&core.pressure),
        });
    }
    {
        let cfg = pod_config.clone();
        let srcs = sources.clone();
        let known = pods.clone();
        tokio::spawn(
            crate::eviction::Manager {
                config: r.eviction.clone(),
                pressure: Arc::clone(&core.pressure),
                kr: Arc::clone(&core.kr),
                metrics: Arc::clone(&core.metrics),
                active_pods: active_pods_func(&core, &pods, &workers),
                kill_pod: eviction_kill(&core, &workers),
                node: node.clone(),
                pod_logs_dir: r.pod_logs_dir.clone(),
                sources_seen: Box::new(move || {
                    cfg.seen_all_sources(&srcs)
                        && cfg.pods().iter().all(|p| {
                            known
                                .get(p.metadata.uid.as_deref().unwrap_or_default())
                                .is_some()
                        })
                }),
            }
            .run(),
        );
    }
    {
        let (active_pods, kill_pod) = shutdown_functions(&core, &pods, &workers);
        tokio::spawn(
            crate::nodeshutdown::Manager {
                groups: r.shutdown.groups(),
                state: Arc::clone(&core.shutdown),
                node: node.clone(),
                active_pods,
                kill_pod,
            }
            .run(),
        );
    }
    let last_iteration = Arc::new(Mutex::new(Instant::now()));
    let state = ServerState {
        pleg: Arc::clone(&health),
        last_iteration: Arc::clone(&last_iteration),
        metrics: Arc::clone(&metrics),
        pods: pods.clone(),
        status: status.clone(),
        kr: Arc::clone(&kr),
        node_name: node.clone(),
        started_ns: k8s_openapi::jiff::Timestamp::now().as_nanosecond() as i64,
        cpu: Arc::default(),
    };
    if let (Some(client), true) = (&api_client, args.rotate_certificates.unwrap_or(false)) {
        tokio::spawn(rotate_client_certificate(
            client.clone(),
            cert_dir.clone(),
            node.clone(),
        ));
    }
    let server_bootstrap = secure.cert.is_none()
        && args.rotate_server_certificates.unwrap_or(false)
        && api_client.is_some();
    if secure.addr.port() != 0 && server_bootstrap {
        let auth = Arc::new(crate::server::auth::Auth::new(
            secure.auth.clone(),
            api_client.clone(),
        ));
        let client = api_client.clone().expect("checked above");
        let ips: Vec<IpAddr> = kr
            .settings
            .host_ips
            .iter()
            .filter_map(|i| i.parse().ok())
            .collect();
        let (addr, st, node, client_ca) = (
            secure.addr,
            state.clone(),
            node.clone(),
            secure.client_ca.clone(),
        );
        let dir = cert_dir.clone();
        // The API server trusts the serving certificate only once the cluster CA signs it;
        // the kubelet API comes up when it is issued (the Node must be registered first).
        tokio::spawn(async move {
            let cert = if crate::certificate::current_valid(&dir, crate::certificate::Kind::Server)
            {
                crate::certificate::current_path(&dir, crate::certificate::Kind::Server)
            } else {
                match crate::certificate::request(
                    client,
                    &dir,
                    &node,
                    crate::certificate::Kind::Server,
                    &ips,
                    Duration::from_secs(3600),
                )
                .await
                {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::error!(error = %e, "no serving certificate: the kubelet API is not served");
                        return;
                    }
                }
            };
            let tls = match crate::server::auth::server_tls(&cert, &cert, client_ca.as_deref()) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(error = %e, "kubelet API TLS");
                    return;
                }
            };
            if let Err(e) = server::serve_secure(addr, st, auth, tls).await {
                tracing::error!(address = %addr, error = %e, "kubelet API server failed");
            }
        });
    } else if secure.addr.port() != 0 {
        let (cert, key) = match &secure.cert {
            Some(pair) => pair.clone(),
            None => {
                let ips: Vec<IpAddr> = kr
                    .settings
                    .host_ips
                    .iter()
                    .filter_map(|i| i.parse().ok())
                    .collect();
                crate::server::auth::self_signed(&secure.cert_dir, &node, &ips)
                    .map_err(|e| RunError::Flag(format!("serving certificate: {e}")))?
            }
        };
        let tls = crate::server::auth::server_tls(&cert, &key, secure.client_ca.as_deref())
            .map_err(|e| RunError::Flag(format!("kubelet API TLS: {e}")))?;
        if secure.client_ca.is_none() {
            tracing::warn!(
                "no --client-ca-file: client certificates are not accepted on the kubelet API"
            );
        }
        let auth = Arc::new(crate::server::auth::Auth::new(
            secure.auth.clone(),
            api_client.clone(),
        ));
        let addr = secure.addr;
        let st = state.clone();
        tokio::spawn(async move {
            if let Err(e) = server::serve_secure(addr, st, auth, tls).await {
                tracing::error!(address = %addr, error = %e, "kubelet API server failed");
            }
        });
    }
    if r.healthz.port() != 0 {
        let addr = r.healthz;
        let st = state.clone();
        tokio::spawn(async move {
            if let Err(e) = server::serve_healthz(addr, st).await {
                tracing::error!(address = %addr, error = %e, "healthz server failed");
            }
        });
    }
    if r.read_only.port() != 0 {
        let addr = r.read_only;
        let st = state.clone();
        tokio::spawn(async move {
            if let Err(e) = server::serve_read_only(addr, st).await {
                tracing::error!(address = %addr, error = %e, "read-only server failed");
            }
        });
    }

    // upstream's registration order, with the shutdown refusal first so a node going down
    // says so, and the device allocation last so it only happens for pods that fit.
    let mut admit_handlers = crate::admission::Handlers::default();
    admit_handlers.add(Arc::clone(&core.shutdown) as _);
    admit_handlers.add(Arc::new(crate::eviction::admission::AdmitHandler {
        pressure: Arc::clone(&core.pressure),
    }));
    admit_handlers.add(Arc::new(crate::cm::admission::PredicateAdmitHandler {
        cm: Arc::clone(&cm),
    }));
    admit_handlers.add(Arc::clone(&topology_manager) as _);
    admit_handlers.add(Arc::clone(&devices) as _);
    {
        let pending = || -> crate::cm::devicemanager::PendingFunc {
            let (cfg, srcs, known) = (pod_config.clone(), sources.clone(), pods.clone());
            Box::new(move |uid| {
                known.get(uid).is_none()
                    && (!cfg.seen_all_sources(&srcs)
                        || cfg
                            .pods()
                            .iter()
                            .any(|p| p.metadata.uid.as_deref() == Some(uid)))
            })
        };
        devices.set_pending(pending());
        cpus.set_active_pods(active_pods_func(&core, &pods, &workers), pending());
        memory.set_active_pods(active_pods_func(&core, &pods, &workers), pending());
    }
    {
        let server = crate::podresources::Server {
            devices: Arc::clone(&devices),
            cpus: Some(Arc::clone(&cpus)),
            active_pods: active_pods_func(&core, &pods, &workers),
        };
        let dir = args.root_dir.join("pod-resources");
        tokio::spawn(async move {
            if let Err(e) = crate::podresources::serve(&dir, server).await {
                tracing::error!(error = %e, "pod resources API failed");
            }
        });
    }
    let cfg = pod_config.clone();
    let sync_loop = SyncLoop {
        admit_handlers,
        core,
        workers,
        pods,
        sources_ready: Box::new(move || {
            cfg.seen_all_sources(&sources).then(|| {
                cfg.pods()
                    .iter()
                    .filter_map(|p| p.metadata.uid.clone())
                    .collect()
            })
        }),
        last_iteration,
    };
    tracing::info!(node = %node, evented_pleg = evented, "kubelet started");
    nodus_serving::sd_notify::ready(nodus_serving::sd_notify::Component::Kubelet);
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

    #[derive(clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        k: KubeletArgs,
    }

    fn args(a: &[&str]) -> KubeletArgs {
        use clap::Parser as _;
        Cmd::try_parse_from(std::iter::once("kubelet").chain(a.iter().copied()))
            .unwrap()
            .k
    }

    #[test]
    fn secure_port_defaults_follow_the_kubeconfig() {
        use crate::server::auth::AuthorizationMode;
        let s = resolve_secure(&args(&[]), "n", false).unwrap();
        assert_eq!(s.addr.port(), 10250);
        assert_eq!(s.auth.mode, AuthorizationMode::AlwaysAllow);
        assert!(!s.auth.token_webhook && !s.auth.anonymous);
        let s = resolve_secure(&args(&[]), "n", true).unwrap();
        assert_eq!(s.auth.mode, AuthorizationMode::Webhook);
        assert!(s.auth.token_webhook && !s.auth.anonymous);
        assert_eq!(s.auth.authorized_ttl, Duration::from_secs(300));
        assert_eq!(s.auth.unauthorized_ttl, Duration::from_secs(30));
        let s = resolve_secure(
            &args(&["--anonymous-auth", "--authentication-token-webhook=false"]),
            "n",
            true,
        )
        .unwrap();
        assert!(s.auth.anonymous && !s.auth.token_webhook);
        let e = resolve_secure(&args(&["--authorization-mode", "Webhook"]), "n", false)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("needs --kubeconfig"), "{e}");
        let e = resolve_secure(&args(&["--authorization-mode", "RBAC"]), "n", true)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("AlwaysAllow or Webhook"), "{e}");
    }

    #[test]
    fn eviction_settings_from_flags_and_file() {
        let c = KubeletConfiguration::default();
        let a = args(&[]);
        let e = resolve_eviction(&a, &c, &resolve_cm(&a, &c).unwrap()).unwrap();
        assert_eq!(e.pressure_transition_period, Duration::from_secs(300));
        assert_eq!(e.monitoring_interval, Duration::from_secs(10));
        let mut signals: Vec<&str> = e.thresholds.iter().map(|t| t.signal.as_str()).collect();
        signals.sort();
        assert_eq!(
            signals,
            [
                "allocatableMemory.available",
                "imagefs.available",
                "memory.available",
                "nodefs.available",
                "nodefs.inodesFree"
            ]
        );
        let a = args(&[
            "--eviction-soft",
            "memory.available<1Gi",
            "--eviction-soft-grace-period",
            "memory.available=1m30s",
            "--eviction-pressure-transition-period",
            "30s",
            "--eviction-max-pod-grace-period",
            "20",
        ]);
        let e = resolve_eviction(&a, &c, &resolve_cm(&a, &c).unwrap()).unwrap();
        let soft = e.thresholds.iter().find(|t| !t.is_hard()).unwrap();
        assert_eq!(soft.grace_period, Duration::from_secs(90));
        assert_eq!(e.pressure_transition_period, Duration::from_secs(30));
        assert_eq!(e.max_pod_grace_period_seconds, 20);
        let a = args(&["--eviction-soft", "memory.available<1Gi"]);
        let err = resolve_eviction(&a, &c, &resolve_cm(&a, &c).unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains(
                "grace period must be specified for the soft eviction threshold memory.available"
            ),
            "{err}"
        );
        let a = args(&["--eviction-hard", "memory.available>1Gi"]);
        let err = resolve_cm(&a, &c).err().unwrap().to_string();
        assert!(err.contains("unsupported operator \">\""), "{err}");
        let file = KubeletConfiguration::parse(
            std::path::Path::new("k.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard: {memory.available: 200Mi}\nevictionSoft: {nodefs.available: 15%}\nevictionSoftGracePeriod: {nodefs.available: 2m}\nevictionMinimumReclaim: {nodefs.available: 1Gi}\nevictionPressureTransitionPeriod: 1m\nevictionMaxPodGracePeriod: 60\n",
        )
        .unwrap();
        let a = args(&[]);
        let e = resolve_eviction(&a, &file, &resolve_cm(&a, &file).unwrap()).unwrap();
        let soft = e.thresholds.iter().find(|t| !t.is_hard()).unwrap();
        assert_eq!(soft.signal.as_str(), "nodefs.available");
        assert_eq!(soft.grace_period, Duration::from_secs(120));
        assert!(soft.min_reclaim.is_some());
        assert_eq!(e.pressure_transition_period, Duration::from_secs(60));
        assert_eq!(e.max_pod_grace_period_seconds, 60);
    }

    #[test]
    fn memory_throttling_factor_defaults_and_is_checked() {
        let a = args(&[]);
        let c = KubeletConfiguration::default();
        assert_eq!(resolve_cm(&a, &c).unwrap().memory_throttling_factor, 0.9);
        let file = |f: &str| {
            KubeletConfiguration::parse(
                std::path::Path::new("k.yaml"),
                &format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmemoryThrottlingFactor: {f}\n"),
            )
            .unwrap()
        };
        assert_eq!(
            resolve_cm(&a, &file("0.5"))
                .unwrap()
                .memory_throttling_factor,
            0.5
        );
        assert_eq!(
            resolve_cm(&a, &file("1.5")).err().unwrap().to_string(),
            "invalid configuration: memoryThrottlingFactor 1.5 must be greater than 0 and less than or equal to 1.0"
        );
        assert!(resolve_cm(&a, &file("0")).is_err());
    }

    #[test]
    fn memory_manager_settings_from_flags_and_file() {
        let c = KubeletConfiguration::default();
        let m = resolve_memory_manager(&args(&[]), &c).unwrap();
        assert_eq!(m.policy, "None");
        assert!(m.reserved_memory.is_empty());
        let a = args(&[
            "--memory-manager-policy",
            "Static",
            "--reserved-memory",
            "0:memory=1Gi;1:memory=2Gi",
            "--reserved-memory",
            "2:hugepages-1Gi=1Gi",
        ]);
        let m = resolve_memory_manager(&a, &c).unwrap();
        assert_eq!(m.policy, "Static");
        let nodes: Vec<i32> = m.reserved_memory.iter().map(|r| r.numa_node).collect();
        assert_eq!(nodes, [0, 1, 2]);
        let e = resolve_memory_manager(&args(&["--reserved-memory", "0:cpu=1"]), &c)
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            e,
            "invalid argument \"0:cpu=1\" for \"--reserved-memory\" flag: memory type conversion error, unknown type: \"cpu\""
        );
        let file = KubeletConfiguration::parse(
            std::path::Path::new("k.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmemoryManagerPolicy: Static\nreservedMemory:\n- numaNode: 0\n  limits: {memory: 1100Mi}\n",
        )
        .unwrap();
        let m = resolve_memory_manager(&args(&[]), &file).unwrap();
        assert_eq!(m.policy, "Static");
        assert_eq!(m.reserved_memory[0].limits["memory"], "1100Mi");
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
        // MemoryQoS is alpha (off unless asked), KubeletPSI beta (on unless refused).
        assert!(!feature(&[], "MemoryQoS").unwrap());
        assert!(feature(&["MemoryQoS=true".into()], "MemoryQoS").unwrap());
        assert!(feature(&[], "KubeletPSI").unwrap());
        assert!(!feature(&["KubeletPSI=false".into()], "KubeletPSI").unwrap());
    }
}
