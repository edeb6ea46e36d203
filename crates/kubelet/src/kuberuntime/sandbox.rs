//! The CRI PodSandboxConfig for a pod (upstream's generatePodSandboxConfig).

use super::labels;
use cri::runtime::v1 as pb;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use std::path::{Path, PathBuf};

/// Node-level settings that shape every sandbox.
#[derive(Clone, Debug)]
pub struct SandboxSettings {
    pub node_name: String,
    pub pod_logs_dir: PathBuf,
    /// The resolver file pods with dnsPolicy Default inherit (`resolvConf`).
    pub resolv_conf: PathBuf,
    /// `clusterDNS` and `clusterDomain`; empty clusterDNS makes ClusterFirst fall back to
    /// Default, as upstream does (with a log line).
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
}

/// `<pod-logs-dir>/<namespace>_<name>_<uid>`, upstream's BuildPodLogsDirectory.
pub fn pod_log_dir(logs: &Path, pod: &Pod) -> PathBuf {
    let m = &pod.metadata;
    logs.join(format!(
        "{}_{}_{}",
        m.namespace.as_deref().unwrap_or("default"),
        m.name.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default()
    ))
}

/// Namespace modes shared by the sandbox and its containers. `userns` is the pod's user
/// namespace from the [`crate::userns`] manager; `None` means the node's (mode NODE, as
/// upstream sends for pods with hostUsers unset or true).
pub fn namespace_options(
    spec: &PodSpec,
    userns: Option<&pb::UserNamespace>,
) -> pb::NamespaceOption {
    let mode = |host: Option<bool>, otherwise: pb::NamespaceMode| {
        if host.unwrap_or(false) {
            pb::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    let pid_default = if spec.share_process_namespace.unwrap_or(false) {
        pb::NamespaceMode::Pod
    } else {
        pb::NamespaceMode::Container
    };
    pb::NamespaceOption {
        network: mode(spec.host_network, pb::NamespaceMode::Pod),
        pid: mode(spec.host_pid, pid_default),
        ipc: mode(spec.host_ipc, pb::NamespaceMode::Pod),
        userns_options: Some(
            userns
                .cloned()
                .unwrap_or_else(crate::userns::node_user_namespace),
        ),
        ..Default::default()
    }
}

fn read_resolv_conf(path: &Path) -> (Vec<String>, Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let (mut servers, mut searches, mut options) = (Vec::new(), Vec::new(), Vec::new());
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("nameserver") => servers.extend(f.next().map(str::to_string)),
            Some("search") => searches = f.map(str::to_string).collect(),
            Some("options") => options.extend(f.map(str::to_string)),
            _ => {}
        }
    }
    (servers, searches, options)
}

/// The pod's resolver config by dnsPolicy, as upstream's dns.Configurer.
pub fn dns_config(spec: &PodSpec, pod: &Pod, s: &SandboxSettings) -> Option<pb::DnsConfig> {
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let host_net = spec.host_network.unwrap_or(false);
    let effective = match policy {
        "ClusterFirstWithHostNet" if host_net => "ClusterFirst",
        "ClusterFirst" if host_net => "Default",
        p => p,
    };
    let effective = if effective == "ClusterFirst" && s.cluster_dns.is_empty() {
        tracing::debug!(
            pod = pod.metadata.name.as_deref().unwrap_or_default(),
            "ClusterFirst policy specified without ClusterDNS; falling back to Default"
        );
        "Default"
    } else {
        effective
    };
    let mut cfg = match effective {
        "None" => pb::DnsConfig::default(),
        "ClusterFirst" => {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let d = &s.cluster_domain;
            let (_, host_search, _) = read_resolv_conf(&s.resolv_conf);
            let mut searches = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()];
            searches.extend(host_search);
            pb::DnsConfig {
                servers: s.cluster_dns.clone(),
                searches,
                options: vec!["ndots:5".into()],
            }
        }
        _ => {
            let (servers, searches, options) = read_resolv_conf(&s.resolv_conf);
            pb::DnsConfig {
                servers,
                searches,
                options,
            }
        }
    };
    if let Some(extra) = &spec.dns_config {
        for ns in extra.nameservers.iter().flatten() {
            if !cfg.servers.contains(ns) {
                cfg.servers.push(ns.clone());
            }
        }
        for se in extra.searches.iter().flatten() {
            if !cfg.searches.contains(se) {
                cfg.searches.push(se.clone());
            }
        }
        for o in extra.options.iter().flatten() {
            let opt = match &o.value {
                Some(v) => format!("{}:{v}", o.name.as_deref().unwrap_or_default()),
                None => o.name.clone().unwrap_or_default(),
            };
            let key = opt.split(':').next().unwrap_or_default().to_string();
            cfg.options
                .retain(|e| e.split(':').next() != Some(key.as_str()));
            cfg.options.push(opt);
        }
    }
    if host_net && effective == "Default" && spec.dns_config.is_none() {
        // Host-network pods with the Default policy use the host's file as it is.
        return None;
    }
    Some(cfg)
}

fn protocol(p: Option<&str>) -> i32 {
    match p {
        Some("UDP") => pb::Protocol::Udp as i32,
        Some("SCTP") => pb::Protocol::Sctp as i32,
        _ => pb::Protocol::Tcp as i32,
    }
}

pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    cgroup_parent: &str,
    s: &SandboxSettings,
    userns: Option<&pb::UserNamespace>,
) -> pb::PodSandboxConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let m = &pod.metadata;
    let host_net = spec.host_network.unwrap_or(false);
    let hostname = if host_net {
        String::new()
    } else {
        let mut h = spec
            .hostname
            .clone()
            .or_else(|| m.name.clone())
            .unwrap_or_default();
        // A hostname is at most 63 characters and must not end in '-' or '.'.
        h.truncate(63);
        h.trim_end_matches(['-', '.']).to_string()
    };
    let port_mappings = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| pb::PortMapping {
            protocol: protocol(p.protocol.as_deref()),
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let psc = spec.security_context.clone().unwrap_or_default();
    let privileged = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    let mut supplemental: Vec<i64> = psc.supplemental_groups.clone().unwrap_or_default();
    if let Some(fs) = psc.fs_group {
        supplemental.push(fs);
    }
    pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            namespace: m.namespace.clone().unwrap_or_else(|| "default".into()),
            attempt,
        }),
        hostname,
        log_directory: pod_log_dir(&s.pod_logs_dir, pod).display().to_string(),
        dns_config: dns_config(&spec, pod, s),
        port_mappings,
        labels: labels::sandbox_labels(pod),
        annotations: labels::sandbox_annotations(pod),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.to_string(),
            security_context: Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(&spec, userns)),
                run_as_user: psc.run_as_user.map(|value| pb::Int64Value { value }),
                run_as_group: psc.run_as_group.map(|value| pb::Int64Value { value }),
                supplemental_groups: supplemental,
                privileged,
                ..Default::default()
            }),
            sysctls: psc
                .sysctls
                .iter()
                .flatten()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;

    fn pod(host_users: Option<bool>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.uid = Some("u1".into());
        p.spec = Some(PodSpec {
            host_users,
            containers: vec![Container {
                name: "c".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    fn settings() -> SandboxSettings {
        SandboxSettings {
            node_name: "n".into(),
            pod_logs_dir: "/var/log/pods".into(),
            resolv_conf: "/nonexistent/resolv.conf".into(),
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".into(),
        }
    }

    fn pod_userns(host_id: u32) -> pb::UserNamespace {
        let m = pb::IdMapping {
            host_id,
            container_id: 0,
            length: 65536,
        };
        pb::UserNamespace {
            mode: pb::NamespaceMode::Pod as i32,
            uids: vec![m],
            gids: vec![m],
        }
    }

    fn sandbox_userns(cfg: &pb::PodSandboxConfig) -> pb::UserNamespace {
        cfg.linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .and_then(|n| n.userns_options.clone())
            .expect("userns_options is always sent")
    }

    #[test]
    fn pods_sharing_the_hosts_users_get_node_mode_without_mappings() {
        for hu in [None, Some(true)] {
            let spec = pod(hu).spec.unwrap();
            let ns = namespace_options(&spec, None);
            let u = ns.userns_options.expect("sent, as upstream sends NODE");
            assert_eq!(u.mode, pb::NamespaceMode::Node as i32);
            assert!(u.uids.is_empty() && u.gids.is_empty());
            assert_eq!(ns.network, pb::NamespaceMode::Pod as i32);
        }
    }

    #[test]
    fn a_user_namespace_reaches_the_sandbox_config_unchanged() {
        let p = pod(Some(false));
        let u = pod_userns(131072);
        let cfg = sandbox_config(&p, 0, "/kubepods", &settings(), Some(&u));
        assert_eq!(sandbox_userns(&cfg), u);
        let cfg = sandbox_config(&p, 0, "/kubepods", &settings(), None);
        assert_eq!(
            sandbox_userns(&cfg).mode,
            pb::NamespaceMode::Node as i32,
            "no mapping given: the node's"
        );
    }

    #[test]
    fn host_namespaces_stay_independent_of_the_user_namespace() {
        let mut spec = pod(Some(false)).spec.unwrap();
        spec.host_pid = Some(true);
        spec.share_process_namespace = Some(true);
        let u = pod_userns(65536);
        let ns = namespace_options(&spec, Some(&u));
        assert_eq!(ns.pid, pb::NamespaceMode::Node as i32);
        assert_eq!(ns.ipc, pb::NamespaceMode::Pod as i32);
        assert_eq!(ns.userns_options, Some(u));
    }
}
