//! The CNI client: containerd's go-cni and libcni semantics over the plugins of the node.
//!
//! * The network is the first valid configuration of the conf dir in lexical order
//!   (`.conf`, `.conflist`, `.json`), re-read at every operation so that a network provider
//!   writing its file later makes the node ready without a restart.
//! * Every sandbox first gets the loopback network on `lo` (`cni-loopback`, the `loopback`
//!   plugin brings `lo` up), then the network on `eth0`.
//! * ADD runs the chain in order, each plugin receiving the previous result as `prevResult`;
//!   `runtimeConfig` carries the capability arguments a plugin declares (`portMappings`,
//!   `bandwidth`, `dns`, `cgroupPath`, `io.kubernetes.cri.pod-annotations`). The final
//!   result is cached (libcni's layout, see [`cache`]) with the configuration and arguments.
//! * DEL runs the chain in reverse with the cached result, using the cached configuration
//!   (so a changed or removed conf file still deletes what was added). It is idempotent: a
//!   missing netns becomes an empty `CNI_NETNS` (allowed for DEL), a missing cache means a DEL
//!   with the current configuration, and "not found" failures count as done.
//! * CHECK runs the chain with the cached result (cniVersion 0.4.0 or later).
//!
//! Plugins run in the network namespace of the calling thread: the node's in production, a
//! test's private namespace in the tests.

pub mod cache;
pub mod config;
mod error;
pub mod exec;
pub mod result;

pub use config::{DefaultNetwork, NetworkConfigList, PluginConfig};
pub use error::CniError;
pub use exec::CniCommand;
pub use result::{Interface, IpConfig, NetworkResult};

use cache::CachedInfo;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The pod interface.
pub const DEFAULT_IFNAME: &str = "eth0";
/// The loopback network's name and interface.
pub const LOOPBACK_NETWORK: &str = "cni-loopback";
pub const LOOPBACK_IFNAME: &str = "lo";
/// libcni's default cache directory.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni";
/// How long one plugin may run.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// Where plugins, configuration and cached results live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniConfig {
    /// Plugin directories, searched in order (`cni-bin-dirs`).
    pub bin_dirs: Vec<PathBuf>,
    /// Network configuration directory (`cni-conf-dir`).
    pub conf_dir: PathBuf,
    /// Result cache directory (libcni's `/var/lib/cni` by default).
    pub cache_dir: PathBuf,
    /// Kill a plugin that runs longer than this.
    pub exec_timeout: Duration,
    /// The default network's `ipMasq` (`default-network-ip-masq`).
    pub default_ip_masq: bool,
    /// The default network's host-local `dataDir` (`default-network-ipam-data-dir`).
    pub default_ipam_data_dir: Option<PathBuf>,
    /// Bring `lo` up in the runtime instead of running the loopback plugin
    /// (`use-internal-loopback`, containerd's `use_internal_loopback`; what CRI-O always does).
    pub internal_loopback: bool,
}

impl CniConfig {
    pub fn new(
        bin_dirs: Vec<PathBuf>,
        conf_dir: impl Into<PathBuf>,
        cache_dir: impl Into<PathBuf>,
    ) -> Self {
        CniConfig {
            bin_dirs,
            conf_dir: conf_dir.into(),
            cache_dir: cache_dir.into(),
            exec_timeout: DEFAULT_EXEC_TIMEOUT,
            default_ip_masq: true,
            default_ipam_data_dir: None,
            internal_loopback: false,
        }
    }
}

/// A CRI port mapping (hostPort).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    pub protocol: Protocol,
    pub container_port: i32,
    pub host_port: i32,
    /// Empty: every address of the node.
    pub host_ip: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    fn as_cni(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl From<&cri::runtime::v1::PortMapping> for PortMapping {
    fn from(p: &cri::runtime::v1::PortMapping) -> Self {
        let protocol = match cri::runtime::v1::Protocol::try_from(p.protocol) {
            Ok(cri::runtime::v1::Protocol::Udp) => Protocol::Udp,
            Ok(cri::runtime::v1::Protocol::Sctp) => Protocol::Sctp,
            _ => Protocol::Tcp,
        };
        PortMapping {
            protocol,
            container_port: p.container_port,
            host_port: p.host_port,
            host_ip: p.host_ip.clone(),
        }
    }
}

/// Traffic shaping for the `bandwidth` plugin (bits per second, bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bandwidth {
    pub ingress_rate: u64,
    pub ingress_burst: u64,
    pub egress_rate: u64,
    pub egress_burst: u64,
}

/// What the plugins learn about the pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodNetworkInfo {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub port_mappings: Vec<PortMapping>,
    pub bandwidth: Option<Bandwidth>,
    pub dns: Option<cri::runtime::v1::DnsConfig>,
    /// The pod's cgroup parent (`cgroupPath` capability).
    pub cgroup_path: Option<String>,
    /// Pod annotations (containerd's `io.kubernetes.cri.pod-annotations` capability).
    pub annotations: BTreeMap<String, String>,
}

impl PodNetworkInfo {
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        uid: impl Into<String>,
    ) -> Self {
        PodNetworkInfo {
            name: name.into(),
            namespace: namespace.into(),
            uid: uid.into(),
            ..Default::default()
        }
    }

    /// From a `RunPodSandbox` request's config.
    pub fn from_cri(config: &cri::runtime::v1::PodSandboxConfig) -> Self {
        let meta = config.metadata.clone().unwrap_or_default();
        PodNetworkInfo {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            port_mappings: config.port_mappings.iter().map(PortMapping::from).collect(),
            bandwidth: None,
            dns: config.dns_config.clone(),
            cgroup_path: config
                .linux
                .as_ref()
                .map(|l| l.cgroup_parent.clone())
                .filter(|c| !c.is_empty()),
            annotations: config
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// The capability arguments offered to plugins (each gets those it declares).
    pub fn capability_args(&self) -> Map<String, Value> {
        let mut caps = Map::new();
        // containerd passes only mappings with a host port, protocol in lower case.
        let ports: Vec<Value> = self
            .port_mappings
            .iter()
            .filter(|p| p.host_port > 0)
            .map(|p| {
                let mut m = json!({
                    "hostPort": p.host_port,
                    "containerPort": p.container_port,
                    "protocol": p.protocol.as_cni(),
                });
                if !p.host_ip.is_empty() {
                    m["hostIP"] = Value::String(p.host_ip.clone());
                }
                m
            })
            .collect();
        caps.insert("portMappings".into(), Value::Array(ports));
        if let Some(b) = &self.bandwidth {
            caps.insert(
                "bandwidth".into(),
                json!({
                    "ingressRate": b.ingress_rate,
                    "ingressBurst": b.ingress_burst,
                    "egressRate": b.egress_rate,
                    "egressBurst": b.egress_burst,
                }),
            );
        }
        if let Some(dns) = &self.dns {
            caps.insert(
                "dns".into(),
                json!({"servers": dns.servers, "searches": dns.searches, "options": dns.options}),
            );
        }
        if let Some(cg) = &self.cgroup_path {
            caps.insert("cgroupPath".into(), Value::String(cg.clone()));
        }
        caps.insert(
            "io.kubernetes.cri.pod-annotations".into(),
            json!(self.annotations),
        );
        caps
    }

    fn cni_args(&self, sandbox_id: &str) -> Result<Vec<(String, String)>, CniError> {
        exec::pod_cni_args(&self.namespace, &self.name, sandbox_id, &self.uid)
    }
}

/// The NetworkReady condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkStatus {
    pub ready: bool,
    pub reason: String,
    pub message: String,
}

impl NetworkStatus {
    /// As the CRI `RuntimeCondition` of type `NetworkReady`.
    pub fn condition(&self) -> cri::runtime::v1::RuntimeCondition {
        cri::runtime::v1::RuntimeCondition {
            r#type: "NetworkReady".into(),
            status: self.ready,
            reason: self.reason.clone(),
            message: self.message.clone(),
        }
    }
}

/// The CNI client.
#[derive(Debug, Clone)]
pub struct Cni {
    cfg: CniConfig,
}

struct Attachment<'a> {
    list: &'a NetworkConfigList,
    container_id: &'a str,
    netns: &'a str,
    ifname: &'a str,
    args: &'a [(String, String)],
    caps: &'a Map<String, Value>,
}

impl Cni {
    pub fn new(cfg: CniConfig) -> Self {
        Cni { cfg }
    }

    pub fn config(&self) -> &CniConfig {
        &self.cfg
    }

    /// The loopback network run through its plugin; None when the runtime brings `lo` up
    /// itself.
    fn loopback_list(&self) -> Option<NetworkConfigList> {
        (!self.cfg.internal_loopback).then(config::loopback_list)
    }

    /// The network sandboxes get now: the first valid configuration of the conf dir.
    pub fn network(&self) -> Result<NetworkConfigList, CniError> {
        config::load_dir(&self.cfg.conf_dir)
    }

    /// NetworkReady: a configuration exists and its plugins (and `loopback`, unless the
    /// runtime brings `lo` up itself) are installed.
    pub fn status(&self) -> NetworkStatus {
        let check = || -> Result<(), CniError> {
            let list = self.network()?;
            for p in list
                .plugins
                .iter()
                .chain(self.loopback_list().iter().flat_map(|l| &l.plugins))
            {
                exec::find_plugin(&p.plugin_type, &self.cfg.bin_dirs)?;
            }
            Ok(())
        };
        match check() {
            Ok(()) => NetworkStatus {
                ready: true,
                reason: String::new(),
                message: String::new(),
            },
            Err(e) => NetworkStatus {
                ready: false,
                reason: "NetworkPluginNotReady".into(),
                message: format!("Network plugin returns error: {e}"),
            },
        }
    }

    /// Writes nodus's default network ([`DefaultNetwork::new`], with this client's
    /// default-network settings) when the conf dir holds no configuration. Returns whether it
    /// wrote one.
    pub fn ensure_default_config(&self, pod_cidr: Option<&str>) -> Result<bool, CniError> {
        // Without the node's pod CIDR the network is the fallback subnet, which no pod
        // network agent knows about: it masquerades as it always did.
        let ip_masq = self.cfg.default_ip_masq || pod_cidr.is_none_or(|c| c.trim().is_empty());
        let mut net = DefaultNetwork::new(pod_cidr).with_ip_masq(ip_masq);
        if let Some(dir) = &self.cfg.default_ipam_data_dir {
            net = net.with_ipam_data_dir(dir);
        }
        self.ensure_default_config_with(&net)
    }

    /// [`Cni::ensure_default_config`] with every knob.
    pub fn ensure_default_config_with(&self, net: &DefaultNetwork) -> Result<bool, CniError> {
        let dir = &self.cfg.conf_dir;
        let existing = match config::conf_files(dir) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(source) => {
                return Err(CniError::Io {
                    path: dir.clone(),
                    source,
                });
            }
        };
        if !existing.is_empty() {
            return Ok(false);
        }
        let conflist = net.conflist()?;
        let mut bytes = serde_json::to_vec_pretty(&conflist).unwrap_or_default();
        bytes.push(b'\n');
        let path = dir.join(&net.file_name);
        let io = |source| CniError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let tmp = dir.join(format!(".{}.tmp", net.file_name));
        std::fs::write(&tmp, &bytes).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        tracing::info!(path = %path.display(), subnets = ?net.subnets, "wrote default CNI network config");
        Ok(true)
    }

    fn cni_path(&self) -> String {
        self.cfg
            .bin_dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":")
    }

    async fn run_plugin(
        &self,
        att: &Attachment<'_>,
        plugin: &PluginConfig,
        command: CniCommand,
        prev: Option<&Value>,
    ) -> Result<Vec<u8>, CniError> {
        let bin = exec::find_plugin(&plugin.plugin_type, &self.cfg.bin_dirs)?;
        let stdin = config::plugin_stdin(att.list, plugin, prev, att.caps);
        let args = exec::format_cni_args(att.args);
        let path = self.cni_path();
        let inv = exec::Invocation {
            command,
            container_id: att.container_id,
            netns: att.netns,
            ifname: att.ifname,
            cni_args: &args,
            cni_path: &path,
        };
        exec::exec_plugin(
            &bin,
            &plugin.plugin_type,
            &att.list.name,
            &inv,
            stdin,
            self.cfg.exec_timeout,
        )
        .await
    }

    /// ADD over the chain; caches and returns the final result.
    async fn add_list(&self, att: &Attachment<'_>) -> Result<Value, CniError> {
        let mut prev: Option<Value> = None;
        for plugin in &att.list.plugins {
            let out = self
                .run_plugin(att, plugin, CniCommand::Add, prev.as_ref())
                .await?;
            let invalid = |reason: String| CniError::InvalidResult {
                plugin: plugin.plugin_type.clone(),
                network: att.list.name.clone(),
                command: "add",
                reason,
            };
            let v: Value = serde_json::from_slice(&out).map_err(|e| {
                invalid(format!(
                    "not JSON ({e}): {:?}",
                    String::from_utf8_lossy(&out)
                ))
            })?;
            if !v.is_object() {
                return Err(invalid("not a JSON object".into()));
            }
            prev = Some(v);
        }
        let result = prev.unwrap_or_else(|| json!({"cniVersion": att.list.cni_version}));
        let info = CachedInfo {
            kind: cache::CACHE_KIND.into(),
            container_id: att.container_id.into(),
            config: att.list.bytes.clone(),
            if_name: att.ifname.into(),
            network_name: att.list.name.clone(),
            netns: att.netns.into(),
            cni_args: att
                .args
                .iter()
                .map(|(k, v)| [k.clone(), v.clone()])
                .collect(),
            capability_args: att.caps.clone(),
            result: Some(result.clone()),
        };
        cache::write(&self.cache_file(att), &info)?;
        Ok(result)
    }

    /// DEL over the chain in reverse. Every plugin is tried; "not found" counts as done.
    async fn del_list(&self, att: &Attachment<'_>, prev: Option<&Value>) -> Result<(), CniError> {
        // Before 0.4.0 DEL gets no prevResult (libcni).
        let prev = prev.filter(|_| att.list.version_at_least("0.4.0"));
        let mut first_err = None;
        for plugin in att.list.plugins.iter().rev() {
            match self.run_plugin(att, plugin, CniCommand::Del, prev).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() || (att.netns.is_empty() && e.is_missing_file()) => {
                    tracing::debug!(container_id = att.container_id, network = %att.list.name, error = %e, "CNI DEL: already gone");
                }
                Err(e) => {
                    tracing::warn!(container_id = att.container_id, network = %att.list.name, error = %e, "CNI DEL failed");
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn cache_file(&self, att: &Attachment<'_>) -> PathBuf {
        cache::cache_file(
            &self.cfg.cache_dir,
            &att.list.name,
            att.container_id,
            att.ifname,
        )
    }

    /// Sets up the sandbox's network in `netns`: loopback on `lo`, then the network on `eth0`.
    /// On failure, whatever was set up is deleted again before the error is returned.
    pub async fn setup(
        &self,
        sandbox_id: &str,
        netns: &Path,
        pod: &PodNetworkInfo,
    ) -> Result<NetworkResult, CniError> {
        exec::validate_container_id(sandbox_id)?;
        let netns_s = netns.to_str().ok_or_else(|| {
            CniError::InvalidRequest(format!("netns path {} is not UTF-8", netns.display()))
        })?;
        let args = pod.cni_args(sandbox_id)?;
        let caps = pod.capability_args();
        let list = self.network()?;
        let lo = self.loopback_list();
        for p in lo.iter().flat_map(|l| &l.plugins).chain(&list.plugins) {
            exec::find_plugin(&p.plugin_type, &self.cfg.bin_dirs)?;
        }
        let att = Attachment {
            list: &list,
            container_id: sandbox_id,
            netns: netns_s,
            ifname: DEFAULT_IFNAME,
            args: &args,
            caps: &caps,
        };
        let lo_att = lo.as_ref().map(|l| Attachment {
            list: l,
            ifname: LOOPBACK_IFNAME,
            ..att
        });
        let outcome = async {
            match &lo_att {
                Some(a) => {
                    self.add_list(a).await?;
                }
                None => {
                    let path = netns.to_path_buf();
                    tokio::task::spawn_blocking(move || {
                        crate::sandbox::namespaces::loopback_up(&path)
                    })
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
                    .map_err(|reason| CniError::Loopback {
                        netns: netns.to_path_buf(),
                        reason,
                    })?;
                }
            }
            let raw = self.add_list(&att).await?;
            let last = list
                .plugins
                .last()
                .map(|p| p.plugin_type.clone())
                .unwrap_or_default();
            let invalid = |reason: String| CniError::InvalidResult {
                plugin: last.clone(),
                network: list.name.clone(),
                command: "add",
                reason,
            };
            let result = NetworkResult::parse(&list.name, DEFAULT_IFNAME, raw).map_err(invalid)?;
            if result.ips.is_empty() {
                return Err(invalid(format!(
                    "no IP address for interface {DEFAULT_IFNAME}"
                )));
            }
            Ok(result)
        }
        .await;
        match outcome {
            Ok(result) => {
                tracing::info!(
                    sandbox_id,
                    pod = %format!("{}/{}", pod.namespace, pod.name),
                    network = %list.name,
                    ip = ?result.primary_ip(),
                    "set up pod network"
                );
                Ok(result)
            }
            Err(e) => {
                tracing::warn!(sandbox_id, network = %list.name, error = %e, "pod network setup failed; deleting what was set up");
                let cached = cache::read(&self.cache_file(&att)).ok().flatten();
                let prev = cached.and_then(|c| c.result);
                for a in std::iter::once(&att).chain(lo_att.as_ref()) {
                    let prev = if a.ifname == DEFAULT_IFNAME {
                        prev.as_ref()
                    } else {
                        None
                    };
                    if let Err(del) = self.del_list(a, prev).await {
                        tracing::warn!(sandbox_id, network = %a.list.name, error = %del, "cleanup DEL after failed setup");
                    }
                    let _ = cache::remove(&self.cache_file(a));
                }
                Err(e)
            }
        }
    }

    /// CHECK: asks every plugin whether the sandbox's network is still as ADD left it.
    pub async fn check(
        &self,
        sandbox_id: &str,
        netns: &Path,
        pod: &PodNetworkInfo,
    ) -> Result<(), CniError> {
        exec::validate_container_id(sandbox_id)?;
        let netns_s = netns.to_str().ok_or_else(|| {
            CniError::InvalidRequest(format!("netns path {} is not UTF-8", netns.display()))
        })?;
        let args = pod.cni_args(sandbox_id)?;
        let caps = pod.capability_args();
        let list = self.network()?;
        let lo = self.loopback_list();
        let lists = lo
            .iter()
            .map(|l| (l, LOOPBACK_IFNAME))
            .chain([(&list, DEFAULT_IFNAME)]);
        for (l, ifname) in lists {
            if !l.version_at_least("0.4.0") {
                return Err(CniError::CheckUnsupported {
                    network: l.name.clone(),
                    version: l.cni_version.clone(),
                });
            }
            if l.disable_check {
                continue;
            }
            let att = Attachment {
                list: l,
                container_id: sandbox_id,
                netns: netns_s,
                ifname,
                args: &args,
                caps: &caps,
            };
            let cached = cache::read(&self.cache_file(&att))?
                .and_then(|c| c.result)
                .ok_or_else(|| CniError::NoCachedResult {
                    network: l.name.clone(),
                    container_id: sandbox_id.into(),
                })?;
            for plugin in &l.plugins {
                self.run_plugin(&att, plugin, CniCommand::Check, Some(&cached))
                    .await?;
            }
        }
        Ok(())
    }

    /// Tears the sandbox's network down (DEL). Idempotent: a netns that is gone (`None`, a
    /// missing file, a file no namespace is mounted on) becomes an empty `CNI_NETNS`; cached
    /// attachments are deleted with their cached configuration, result and arguments; without
    /// a cache the current network is deleted with `pod`'s arguments; "not found" is success.
    pub async fn teardown(
        &self,
        sandbox_id: &str,
        netns: Option<&Path>,
        pod: &PodNetworkInfo,
    ) -> Result<(), CniError> {
        exec::validate_container_id(sandbox_id)?;
        let netns_s = match netns {
            Some(p) if super::namespaces::is_namespace_file(p) => p.to_str().unwrap_or_default(),
            Some(p) => {
                tracing::debug!(sandbox_id, netns = %p.display(), "netns is gone; CNI DEL without it");
                ""
            }
            None => "",
        };
        let args = pod.cni_args(sandbox_id)?;
        let caps = pod.capability_args();
        let mut entries = cache::entries_for(&self.cfg.cache_dir, sandbox_id);
        // The pod network before loopback: reverse of setup.
        entries.sort_by_key(|(_, info)| info.network_name == LOOPBACK_NETWORK);
        let current = self.network();
        let mut main_cached = false;
        let mut first_err: Option<CniError> = None;
        for (path, info) in &entries {
            let is_lo = info.network_name == LOOPBACK_NETWORK;
            main_cached |= !is_lo;
            let list = match NetworkConfigList::from_conflist_bytes(&info.config, None) {
                Ok(l) => l,
                Err(reason) => {
                    tracing::warn!(sandbox_id, cache = %path.display(), %reason, "cached CNI config unusable; using the current one");
                    if is_lo {
                        config::loopback_list()
                    } else {
                        match &current {
                            Ok(l) => l.clone(),
                            Err(e) => {
                                first_err.get_or_insert(CniError::Cache {
                                    path: path.clone(),
                                    reason: format!("{reason}, and no current config: {e}"),
                                });
                                continue;
                            }
                        }
                    }
                }
            };
            let cached_args: Vec<(String, String)> = info
                .cni_args
                .iter()
                .map(|[k, v]| (k.clone(), v.clone()))
                .collect();
            let att = Attachment {
                list: &list,
                container_id: sandbox_id,
                netns: netns_s,
                ifname: &info.if_name,
                args: if cached_args.is_empty() {
                    &args
                } else {
                    &cached_args
                },
                caps: if info.capability_args.is_empty() {
                    &caps
                } else {
                    &info.capability_args
                },
            };
            match self.del_list(&att, info.result.as_ref()).await {
                Ok(()) => cache::remove(path)?,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if !main_cached {
            match &current {
                Ok(list) => {
                    let att = Attachment {
                        list,
                        container_id: sandbox_id,
                        netns: netns_s,
                        ifname: DEFAULT_IFNAME,
                        args: &args,
                        caps: &caps,
                    };
                    if let Err(e) = self.del_list(&att, None).await {
                        first_err.get_or_insert(e);
                    }
                }
                Err(e) => {
                    tracing::warn!(sandbox_id, error = %e, "no cached CNI result and no network config: nothing known to delete");
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => {
                tracing::info!(sandbox_id, pod = %format!("{}/{}", pod.namespace, pod.name), "tore down pod network");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
