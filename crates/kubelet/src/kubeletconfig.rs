//! `--config`: a `kubelet.config.k8s.io/v1beta1` KubeletConfiguration file (upstream's
//! pkg/kubelet/apis/config). The fields nodus implements are read with upstream's names,
//! formats and defaults; any other field — unknown, or upstream's but not built here yet —
//! is an error naming it, never silently ignored. Flags given on the command line win over
//! the file, as upstream.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub static_pod_path: Option<PathBuf>,
    #[serde(rename = "staticPodURL")]
    pub static_pod_url: Option<String>,
    pub file_check_frequency: Option<String>,
    pub http_check_frequency: Option<String>,
    pub sync_frequency: Option<String>,
    pub address: Option<String>,
    pub read_only_port: Option<u16>,
    pub healthz_port: Option<u16>,
    pub healthz_bind_address: Option<String>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    pub resolv_conf: Option<PathBuf>,
    pub cgroup_root: Option<String>,
    pub pod_logs_dir: Option<PathBuf>,
    pub container_runtime_endpoint: Option<String>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: Option<bool>,
    pub cgroup_driver: Option<String>,
    pub kube_reserved: Option<BTreeMap<String, String>>,
    pub system_reserved: Option<BTreeMap<String, String>>,
    pub kube_reserved_cgroup: Option<String>,
    pub system_reserved_cgroup: Option<String>,
    pub eviction_hard: Option<BTreeMap<String, String>>,
    pub eviction_soft: Option<BTreeMap<String, String>>,
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    pub eviction_pressure_transition_period: Option<String>,
    pub eviction_max_pod_grace_period: Option<i32>,
    pub eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    pub enforce_node_allocatable: Option<Vec<String>>,
    pub max_pods: Option<i64>,
    pub pod_pids_limit: Option<i64>,
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: Option<String>,
    pub cpu_manager_policy: Option<String>,
    pub cpu_manager_policy_options: Option<BTreeMap<String, String>>,
    pub cpu_manager_reconcile_period: Option<String>,
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: Option<String>,
    pub topology_manager_policy: Option<String>,
    pub topology_manager_scope: Option<String>,
    pub topology_manager_policy_options: Option<BTreeMap<String, String>>,
    /// MemoryQoS: how far between request and limit a container's `memory.high` sits.
    pub memory_throttling_factor: Option<f64>,
    /// The memory manager's policy: `None` or `Static`.
    pub memory_manager_policy: Option<String>,
    /// Memory held back per NUMA node for the Static memory manager policy.
    pub reserved_memory: Option<Vec<crate::cm::memorymanager::reserved::MemoryReservation>>,
    pub register_node: Option<bool>,
    pub register_with_taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
    pub node_status_update_frequency: Option<String>,
    pub node_status_report_frequency: Option<String>,
    pub node_lease_duration_seconds: Option<i32>,
    pub port: Option<u16>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub authentication: Option<KubeletAuthentication>,
    pub authorization: Option<KubeletAuthorization>,
    pub user_namespaces: Option<UserNamespaces>,
    /// Graceful node shutdown: the whole delay logind grants the kubelet.
    pub shutdown_grace_period: Option<String>,
    /// The part of it kept for pods of system-critical priority.
    pub shutdown_grace_period_critical_pods: Option<String>,
    pub shutdown_grace_period_by_pod_priority:
        Option<Vec<crate::nodeshutdown::PriorityGracePeriod>>,
}

/// `userNamespaces`: how many host ids each pod with `hostUsers: false` gets.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserNamespaces {
    pub ids_per_pod: Option<i64>,
}

/// `authentication` of the KubeletConfiguration (who the kubelet API believes).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletAuthentication {
    pub x509: Option<KubeletX509Authentication>,
    pub webhook: Option<KubeletWebhookAuthentication>,
    pub anonymous: Option<KubeletAnonymousAuthentication>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletX509Authentication {
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletWebhookAuthentication {
    pub enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletAnonymousAuthentication {
    pub enabled: Option<bool>,
}

/// `authorization` of the KubeletConfiguration (what an authenticated caller may do).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletAuthorization {
    pub mode: Option<String>,
    pub webhook: Option<KubeletWebhookAuthorization>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletWebhookAuthorization {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: Option<String>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to read kubelet config file {path:?}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to decode kubelet config file {path:?}: {message}")]
    Decode { path: PathBuf, message: String },
    #[error("kubelet config file {path:?}: {message}")]
    Invalid { path: PathBuf, message: String },
}

pub use nodus_k8s::duration::parse_duration;

impl KubeletConfiguration {
    pub fn load(path: &Path) -> Result<KubeletConfiguration, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<KubeletConfiguration, ConfigError> {
        let cfg: KubeletConfiguration =
            serde_yaml::from_str(text).map_err(|e| ConfigError::Decode {
                path: path.to_path_buf(),
                message: explain(&e.to_string()),
            })?;
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        match (cfg.api_version.as_deref(), cfg.kind.as_deref()) {
            (Some("kubelet.config.k8s.io/v1beta1"), Some("KubeletConfiguration")) => {}
            (a, k) => {
                return Err(invalid(format!(
                    "expected apiVersion \"kubelet.config.k8s.io/v1beta1\" and kind \"KubeletConfiguration\", got apiVersion {:?} and kind {:?}",
                    a.unwrap_or_default(),
                    k.unwrap_or_default()
                )));
            }
        }
        for (name, v) in [
            ("cpuCFSQuotaPeriod", &cfg.cpu_cfs_quota_period),
            (
                "cpuManagerReconcilePeriod",
                &cfg.cpu_manager_reconcile_period,
            ),
            (
                "evictionPressureTransitionPeriod",
                &cfg.eviction_pressure_transition_period,
            ),
            ("fileCheckFrequency", &cfg.file_check_frequency),
            ("httpCheckFrequency", &cfg.http_check_frequency),
            (
                "nodeStatusUpdateFrequency",
                &cfg.node_status_update_frequency,
            ),
            (
                "nodeStatusReportFrequency",
                &cfg.node_status_report_frequency,
            ),
            ("syncFrequency", &cfg.sync_frequency),
        ] {
            if let Some(v) = v {
                parse_duration(v).map_err(|e| invalid(format!("{name}: {e}")))?;
            }
        }
        if let Some(ids) = cfg.user_namespaces.as_ref().and_then(|u| u.ids_per_pod) {
            validate_ids_per_pod(ids).map_err(invalid)?;
        }
        Ok(cfg)
    }

    /// `userNamespaces.idsPerPod`, 65536 unless set (validated when the file was read).
    pub fn ids_per_pod(&self) -> u32 {
        self.user_namespaces
            .as_ref()
            .and_then(|u| u.ids_per_pod)
            .and_then(|i| u32::try_from(i).ok())
            .unwrap_or(crate::userns::USERNS_LENGTH)
    }
}

/// upstream's checks of `userNamespaces.idsPerPod`, with its messages.
fn validate_ids_per_pod(ids: i64) -> Result<(), String> {
    let unit = i64::from(crate::userns::USERNS_LENGTH);
    if ids < unit {
        return Err(format!(
            "invalid configuration: userNamespaces.idsPerPod must not be less than {unit}"
        ));
    }
    if ids % unit != 0 {
        return Err(format!(
            "invalid configuration: userNamespaces.idsPerPod must be a multiple of {unit}"
        ));
    }
    if ids > i64::from(u32::MAX) {
        return Err(format!(
            "invalid configuration: userNamespaces.idsPerPod must not be more than {}",
            u32::MAX
        ));
    }
    Ok(())
}

/// serde names an unknown field with the list of known ones; say it the user's way.
fn explain(msg: &str) -> String {
    // Nested fields come prefixed with their path: `authentication.x509: unknown field …`.
    if let Some((path, rest)) = msg.split_once("unknown field `")
        && let Some((field, _)) = rest.split_once('`')
    {
        let path = path.trim_end_matches(": ").trim();
        let field = if path.is_empty() {
            field.to_string()
        } else {
            format!("{path}.{field}")
        };
        return format!(
            "unknown or unsupported field {field:?}: nodus's kubelet does not implement it (yet); remove it or see the README for the supported fields"
        );
    }
    msg.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reads_upstream_fields() {
        let c = KubeletConfiguration::parse(
            Path::new("k.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: /etc/kubernetes/manifests\nfileCheckFrequency: 5s\nclusterDNS: [10.96.0.10]\nfeatureGates: {EventedPLEG: true}\n",
        )
        .unwrap();
        assert_eq!(
            c.static_pod_path.unwrap(),
            PathBuf::from("/etc/kubernetes/manifests")
        );
        assert_eq!(c.cluster_dns.unwrap(), vec!["10.96.0.10".to_string()]);
        assert!(c.feature_gates.unwrap()["EventedPLEG"]);
    }

    #[test]
    fn user_namespaces_ids_per_pod_is_read_and_checked() {
        let parse = |body: &str| {
            KubeletConfiguration::parse(
                Path::new("k.yaml"),
                &format!(
                    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}"
                ),
            )
        };
        assert_eq!(
            parse("").unwrap().ids_per_pod(),
            65536,
            "upstream's default"
        );
        assert_eq!(
            parse("userNamespaces: {idsPerPod: 131072}\n")
                .unwrap()
                .ids_per_pod(),
            131072
        );
        for (v, why) in [
            ("1024", "must not be less than 65536"),
            ("100000", "must be a multiple of 65536"),
            ("4295032832", "must not be more than 4294967295"),
        ] {
            let err = parse(&format!("userNamespaces: {{idsPerPod: {v}}}\n"))
                .unwrap_err()
                .to_string();
            assert_eq!(
                err,
                format!(
                    "kubelet config file \"k.yaml\": invalid configuration: userNamespaces.idsPerPod {why}"
                )
            );
        }
    }

    #[test]
    fn reads_the_kubelet_api_settings() {
        let c = KubeletConfiguration::parse(
            Path::new("k.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nport: 10250\ntlsCertFile: /pki/k.crt\nauthentication:\n  x509: {clientCAFile: /pki/ca.crt}\n  webhook: {enabled: true, cacheTTL: 2m}\n  anonymous: {enabled: false}\nauthorization:\n  mode: Webhook\n  webhook: {cacheAuthorizedTTL: 5m, cacheUnauthorizedTTL: 30s}\n",
        )
        .unwrap();
        let authn = c.authentication.unwrap();
        assert_eq!(
            authn.x509.unwrap().client_ca_file.unwrap(),
            PathBuf::from("/pki/ca.crt")
        );
        assert_eq!(authn.anonymous.unwrap().enabled, Some(false));
        assert_eq!(c.authorization.unwrap().mode.as_deref(), Some("Webhook"));
        let e = KubeletConfiguration::parse(
            Path::new("k.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nauthentication: {x509: {clientCAFil: x}}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"authentication.x509.clientCAFil\""), "{e}");
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = KubeletConfiguration::parse(
            Path::new("k.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPth: /x\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("\"staticPodPth\"") && e.contains("k.yaml"),
            "{e}"
        );
        let e = KubeletConfiguration::parse(Path::new("k.yaml"), "apiVersion: v1\nkind: Pod\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("KubeletConfiguration"), "{e}");
        let e = KubeletConfiguration::parse(
            Path::new("k.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: soon\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("syncFrequency"), "{e}");
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_duration("20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("20").is_err());
        assert!(parse_duration("1d").is_err());
    }
}
