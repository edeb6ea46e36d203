//! `kubeproxy.config.k8s.io/v1alpha1` KubeProxyConfiguration (upstream's
//! pkg/proxy/apis/config), read strictly: an unknown field is an error naming it. Fields
//! upstream has but nodus does not act on are accepted and named in a warning.

use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("{path}: {err}")]
    Parse { path: String, err: String },
    #[error("{path}: apiVersion must be kubeproxy.config.k8s.io/v1alpha1, got {got:?}")]
    ApiVersion { path: String, got: String },
    #[error("{path}: kind must be KubeProxyConfiguration, got {got:?}")]
    Kind { path: String, got: String },
    #[error("invalid duration {0:?} (want e.g. 30s, 1m, 500ms)")]
    Duration(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientConnection {
    pub kubeconfig: Option<String>,
    pub accept_content_types: Option<String>,
    pub content_type: Option<String>,
    pub qps: Option<f64>,
    pub burst: Option<i64>,
}

/// The per-mode section (`iptables:` / `nftables:`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModeConfig {
    pub masquerade_all: Option<bool>,
    pub masquerade_bit: Option<i32>,
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    pub localhost_nodeports: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub bind_address: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub hostname_override: Option<String>,
    pub mode: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub client_connection: Option<ClientConnection>,
    pub iptables: Option<ModeConfig>,
    pub nftables: Option<ModeConfig>,
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    pub config_sync_period: Option<String>,
    // Accepted for compatibility with upstream files; nodus does not act on these.
    pub feature_gates: Option<serde_json::Value>,
    pub conntrack: Option<serde_json::Value>,
    pub ipvs: Option<serde_json::Value>,
    pub winkernel: Option<serde_json::Value>,
    pub detect_local_mode: Option<String>,
    pub detect_local: Option<serde_json::Value>,
    pub enable_profiling: Option<bool>,
    pub oom_score_adj: Option<i32>,
    pub port_range: Option<String>,
    pub show_hidden_metrics_for_version: Option<String>,
    pub logging: Option<serde_json::Value>,
}

impl KubeProxyConfiguration {
    pub fn load(path: &Path) -> Result<KubeProxyConfiguration, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
            path: shown.clone(),
            err,
        })?;
        Self::parse(&text, &shown)
    }

    pub fn parse(text: &str, shown: &str) -> Result<KubeProxyConfiguration, ConfigError> {
        let cfg: KubeProxyConfiguration =
            serde_yaml::from_str(text).map_err(|e| ConfigError::Parse {
                path: shown.to_string(),
                err: e.to_string(),
            })?;
        match cfg.api_version.as_deref() {
            Some("kubeproxy.config.k8s.io/v1alpha1") => {}
            other => {
                return Err(ConfigError::ApiVersion {
                    path: shown.to_string(),
                    got: other.unwrap_or_default().to_string(),
                });
            }
        }
        match cfg.kind.as_deref() {
            Some("KubeProxyConfiguration") => {}
            other => {
                return Err(ConfigError::Kind {
                    path: shown.to_string(),
                    got: other.unwrap_or_default().to_string(),
                });
            }
        }
        for (set, name) in [
            (cfg.conntrack.is_some(), "conntrack"),
            (cfg.ipvs.is_some(), "ipvs"),
            (cfg.winkernel.is_some(), "winkernel"),
            (cfg.detect_local.is_some(), "detectLocal"),
            (cfg.detect_local_mode.is_some(), "detectLocalMode"),
            (cfg.oom_score_adj.is_some(), "oomScoreAdj"),
            (cfg.port_range.is_some(), "portRange"),
        ] {
            if set {
                tracing::warn!(
                    file = shown,
                    field = name,
                    "field accepted but not used by nodus proxy"
                );
            }
        }
        Ok(cfg)
    }
}

/// Go's duration syntax as upstream's config files use it: `30s`, `1m`, `1h30m`, `500ms`.
pub fn parse_duration(s: &str) -> Result<Duration, ConfigError> {
    let bad = || ConfigError::Duration(s.to_string());
    let mut total = 0f64;
    let mut rest = s.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..end].parse().map_err(|_| bad())?;
        rest = &rest[end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * mult;
        rest = &rest[unit_end..];
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_field_is_an_error_naming_it() {
        let err = KubeProxyConfiguration::parse(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmodee: iptables\n",
            "f.yaml",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("modee"), "{err}");
    }

    #[test]
    fn upstream_file_parses() {
        let c = KubeProxyConfiguration::parse(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nclusterCIDR: 10.244.0.0/16\nnftables:\n  syncPeriod: 30s\n  minSyncPeriod: 1s\n  masqueradeAll: false\nclientConnection:\n  kubeconfig: /k\n",
            "f.yaml",
        );
        let c = c.ok();
        assert_eq!(c.as_ref().and_then(|c| c.mode.as_deref()), Some("nftables"));
        assert_eq!(
            c.as_ref().and_then(|c| c.cluster_cidr.as_deref()),
            Some("10.244.0.0/16")
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").ok(), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s").ok(), Some(Duration::from_secs(90)));
        assert_eq!(
            parse_duration("500ms").ok(),
            Some(Duration::from_millis(500))
        );
        assert!(parse_duration("5x").is_err());
    }
}
