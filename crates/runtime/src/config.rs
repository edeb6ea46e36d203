//! `nodus runtime --config FILE`: the runtime's TOML configuration.
//!
//! Keys are kebab-case as ARCHITECTURE.md names them. An unknown key is an error naming the
//! key, never silently ignored: a typo in a mirror setting must not turn into a pull from
//! the wrong place.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RuntimeConfig {
    /// Directory in containerd's `certs.d/<host>/hosts.toml` layout.
    #[serde(default)]
    pub registry_config_dir: Option<PathBuf>,
    /// Where CNI plugin binaries are looked up, in order.
    #[serde(default = "default_cni_bin_dirs")]
    pub cni_bin_dirs: Vec<PathBuf>,
    #[serde(default = "default_cni_conf_dir")]
    pub cni_conf_dir: PathBuf,
    /// RuntimeClass handler name → OCI runtime binary. `runsc` (gVisor) is in the default table when the binary is on PATH.
    #[serde(default = "default_handlers")]
    pub runtime_handlers: BTreeMap<String, PathBuf>,
    /// The handler for pods that name none (containerd's `default_runtime_name`)
    /// [default: runc].
    #[serde(default)]
    pub default_runtime_handler: Option<String>,
    /// How many layers one pull downloads at once (containerd's max_concurrent_downloads).
    #[serde(default = "default_max_concurrent_downloads")]
    pub max_concurrent_downloads: usize,
    /// Where the exec/attach/port-forward streaming server listens (containerd's
    /// stream_server_address + stream_server_port); port 0 picks a free one.
    #[serde(default = "default_stream_server_address")]
    pub stream_server_address: std::net::SocketAddr,
    /// Whether nodus's default bridge network masquerades pod traffic (the bridge plugin's
    /// `ipMasq`). `nodus node` turns it off when its pod network agent masquerades instead,
    /// so traffic between pods on different nodes keeps the pods' addresses.
    #[serde(default = "default_true")]
    pub default_network_ip_masq: bool,
    /// host-local's allocation directory for the default network [default: the plugin's
    /// /var/lib/cni/networks].
    #[serde(default)]
    pub default_network_ipam_data_dir: Option<PathBuf>,
    /// Bring each pod's `lo` up in the runtime rather than through the CNI loopback plugin
    /// (containerd's `use_internal_loopback`, off by default there; CRI-O always does it).
    /// `nodus up` and `nodus node` turn it on: it saves a plugin process per pod.
    #[serde(default)]
    pub use_internal_loopback: bool,
    /// containerd's `SystemdCgroup`: containers' cgroups are systemd scopes in the pod's
    /// slice (`linux.cgroupsPath` as `slice:cri-nodus:<id>`, runc/crun run with
    /// `--systemd-cgroup`). The RuntimeConfig RPC tells the
    /// kubelet to use the systemd cgroup driver.
    #[serde(default)]
    pub systemd_cgroup: bool,
    /// NRI (containerd/nri's Node Resource Interface): plugins on `nri-socket` and from
    /// `nri-plugin-path` hooked into pod and container lifecycle. Unset, NRI is on as in
    /// containerd 2.x, but a runtime that cannot start it (another runtime serves the
    /// socket) logs why and runs without it; `true` makes that a start-up error; `false`
    /// turns NRI off (see [`crate::nri::config`]).
    #[serde(default)]
    pub nri: Option<bool>,
    #[serde(default = "crate::nri::config::default_socket")]
    pub nri_socket: PathBuf,
    /// Pre-installed plugins, `<idx>-<name>` executables the runtime starts.
    #[serde(default = "crate::nri::config::default_plugin_path")]
    pub nri_plugin_path: PathBuf,
    /// Their configuration, `<idx>-<name>.conf` or `<name>.conf`.
    #[serde(default = "crate::nri::config::default_plugin_config_path")]
    pub nri_plugin_config_path: PathBuf,
    /// How long a plugin has to register after connecting [default: 5s].
    #[serde(
        default = "default_nri_registration_timeout",
        deserialize_with = "crate::nri::config::duration"
    )]
    pub nri_plugin_registration_timeout: std::time::Duration,
    /// How long a plugin has to answer one request [default: 2s].
    #[serde(
        default = "default_nri_request_timeout",
        deserialize_with = "crate::nri::config::duration"
    )]
    pub nri_plugin_request_timeout: std::time::Duration,
}

fn default_nri_registration_timeout() -> std::time::Duration {
    crate::nri::config::DEFAULT_REGISTRATION_TIMEOUT
}
fn default_nri_request_timeout() -> std::time::Duration {
    crate::nri::config::DEFAULT_REQUEST_TIMEOUT
}

fn default_true() -> bool {
    true
}

fn default_cni_bin_dirs() -> Vec<PathBuf> {
    vec!["/opt/cni/bin".into(), "/usr/lib/cni".into()]
}
fn default_cni_conf_dir() -> PathBuf {
    "/etc/cni/net.d".into()
}
fn default_handlers() -> BTreeMap<String, PathBuf> {
    let mut t = BTreeMap::from([
        ("runc".to_string(), PathBuf::from("runc")),
        ("crun".to_string(), PathBuf::from("crun")),
    ]);
    // gVisor only where it is installed: a RuntimeClass naming it elsewhere fails with
    // "no runtime for \"runsc\"", not with a missing binary at every pod.
    if crate::oci::find_binary(std::path::Path::new("runsc")).is_some() {
        t.insert("runsc".to_string(), PathBuf::from("runsc"));
    }
    t
}
fn default_max_concurrent_downloads() -> usize {
    3
}
fn default_stream_server_address() -> std::net::SocketAddr {
    crate::streaming::DEFAULT_ADDRESS
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            registry_config_dir: None,
            cni_bin_dirs: default_cni_bin_dirs(),
            cni_conf_dir: default_cni_conf_dir(),
            runtime_handlers: default_handlers(),
            default_runtime_handler: None,
            max_concurrent_downloads: default_max_concurrent_downloads(),
            stream_server_address: default_stream_server_address(),
            default_network_ip_masq: true,
            default_network_ipam_data_dir: None,
            use_internal_loopback: false,
            systemd_cgroup: false,
            nri: None,
            nri_socket: crate::nri::config::default_socket(),
            nri_plugin_path: crate::nri::config::default_plugin_path(),
            nri_plugin_config_path: crate::nri::config::default_plugin_config_path(),
            nri_plugin_registration_timeout: default_nri_registration_timeout(),
            nri_plugin_request_timeout: default_nri_request_timeout(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading runtime config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("runtime config {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

impl RuntimeConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let c = Self::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })?;
        // runc would fail each container with a D-Bus error; say it once, at start.
        if c.systemd_cgroup && !nodus_cgroups::systemd::running_systemd() {
            return Err(ConfigError::Parse {
                path: path.to_path_buf(),
                message: "systemd-cgroup = true needs systemd as init, and this machine does not run it (no /run/systemd/system)".into(),
            });
        }
        Ok(c)
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let c: Self = toml::from_str(text).map_err(|e| e.to_string().trim().to_string())?;
        if c.max_concurrent_downloads == 0 {
            return Err("max-concurrent-downloads must be at least 1".into());
        }
        if let Some(d) = &c.default_runtime_handler
            && !c.runtime_handlers.contains_key(d)
        {
            return Err(format!(
                "default-runtime-handler {d:?} is not in runtime-handlers ({})",
                c.runtime_handlers
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nri_keys_and_defaults() {
        let c = RuntimeConfig::parse("").unwrap();
        assert_eq!(c.nri, None);
        assert!(
            crate::nri::NriOptions::from_config(&c).is_some(),
            "on by default"
        );
        let off = RuntimeConfig::parse("nri = false").unwrap();
        assert!(crate::nri::NriOptions::from_config(&off).is_none());
        assert_eq!(c.nri_socket, PathBuf::from("/var/run/nri/nri.sock"));
        assert_eq!(c.nri_plugin_path, PathBuf::from("/opt/nri/plugins"));
        assert_eq!(c.nri_plugin_config_path, PathBuf::from("/etc/nri/conf.d"));
        assert_eq!(c.nri_plugin_registration_timeout.as_secs(), 5);
        assert_eq!(c.nri_plugin_request_timeout.as_secs(), 2);
        let c = RuntimeConfig::parse(
            "nri = true\nnri-socket = \"/tmp/n.sock\"\nnri-plugin-request-timeout = \"500ms\"\n",
        )
        .unwrap();
        assert_eq!(c.nri, Some(true));
        assert_eq!(c.nri_socket, PathBuf::from("/tmp/n.sock"));
        assert_eq!(c.nri_plugin_request_timeout.as_millis(), 500);
        let err = RuntimeConfig::parse("nri-plugin-request-timeout = \"soon\"").unwrap_err();
        assert!(err.contains("invalid duration \"soon\""), "{err}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = RuntimeConfig::parse("registry-config-dri = \"/x\"").unwrap_err();
        assert!(err.contains("registry-config-dri"), "{err}");
    }

    #[test]
    fn defaults_and_values() {
        let c = RuntimeConfig::parse(
            "registry-config-dir = \"/etc/nodus/certs.d\"\n[runtime-handlers]\nkata = \"/usr/bin/kata\"\n",
        )
        .unwrap();
        assert_eq!(
            c.registry_config_dir.unwrap(),
            PathBuf::from("/etc/nodus/certs.d")
        );
        assert!(c.runtime_handlers.contains_key("kata"));
        assert_eq!(c.max_concurrent_downloads, 3);
        assert_eq!(c.stream_server_address.to_string(), "127.0.0.1:0");
        assert!(c.default_network_ip_masq);
        assert!(c.default_network_ipam_data_dir.is_none());
        let c = RuntimeConfig::parse(
            "default-network-ip-masq = false\ndefault-network-ipam-data-dir = \"/tmp/ipam\"\n",
        )
        .unwrap();
        assert!(!c.default_network_ip_masq);
        assert_eq!(
            c.default_network_ipam_data_dir.unwrap(),
            PathBuf::from("/tmp/ipam")
        );
        assert!(!c.systemd_cgroup);
        assert!(
            RuntimeConfig::parse("systemd-cgroup = true")
                .unwrap()
                .systemd_cgroup
        );
        assert!(
            !RuntimeConfig::parse("systemd-cgroup = false")
                .unwrap()
                .systemd_cgroup
        );
        assert_eq!(
            RuntimeConfig::parse("default-runtime-handler = \"crun\"")
                .unwrap()
                .default_runtime_handler
                .as_deref(),
            Some("crun")
        );
        let err = RuntimeConfig::parse("default-runtime-handler = \"kata\"").unwrap_err();
        assert!(
            err.starts_with(
                "default-runtime-handler \"kata\" is not in runtime-handlers (crun, runc"
            ),
            "{err}"
        );
        let c = RuntimeConfig::parse("stream-server-address = \"127.0.0.1:10010\"").unwrap();
        assert_eq!(c.stream_server_address.port(), 10010);
        let err = RuntimeConfig::parse("stream-server-address = \"nowhere\"").unwrap_err();
        assert!(
            err.contains("stream-server-address") || err.contains("socket address"),
            "{err}"
        );
    }
}
