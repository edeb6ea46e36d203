//! The CRI ContainerConfig for one container of a pod (upstream's generateContainerConfig).

use super::env::{self, EnvContext};
use super::labels;
use super::sandbox::namespace_options;
use crate::volumes;
use cri::runtime::v1 as pb;
use k8s_openapi::api::core::v1::{Container, Pod};
use nodus_k8s::qos::QosClass;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// upstream's securitycontext.DefaultMaskedPaths / DefaultReadonlyPaths: the kubelet sends
/// them explicitly, because a CRI runtime masks nothing it is not told to.
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Everything about the pod's placement the container config depends on.
pub struct ContainerContext<'a> {
    pub root_dir: &'a Path,
    pub volumes: &'a HashMap<String, PathBuf>,
    pub etc_hosts: Option<&'a Path>,
    pub env: &'a EnvContext,
    pub node_memory_bytes: i64,
    /// `cpuCFSQuota` and `cpuCFSQuotaPeriod` (µs): without quota, CPU limits are not enforced.
    pub cfs_quota: bool,
    pub cfs_period_us: u64,
    /// The `memoryThrottlingFactor` when MemoryQoS applies (gate on, cgroup v2).
    pub memory_qos: Option<f64>,
    /// The pod's user namespace, the same one its sandbox got (`None`: the node's).
    pub userns: Option<&'a pb::UserNamespace>,
}

/// Why a container could not be configured: shown as `CreateContainerConfigError`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn milli(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> i64 {
    q.and_then(|q| nodus_k8s::quantity::parse_quantity(&q.0).ok())
        .map(|p| p.milli_value())
        .unwrap_or(0)
}

/// Container resources in CRI terms (cpu shares/quota, memory limit, OOM score adjust and,
/// with MemoryQoS's throttling factor, `memory.min`/`memory.high` in the unified map).
pub fn linux_resources(
    container: &Container,
    qos: QosClass,
    node_memory_bytes: i64,
    cfs: Option<u64>,
    memory_qos: Option<f64>,
) -> pb::LinuxContainerResources {
    let res = container.resources.clone().unwrap_or_default();
    let limits = res.limits.unwrap_or_default();
    let requests = res.requests.unwrap_or_default();
    let cpu_limit = milli(limits.get("cpu"));
    let mut cpu_request = milli(requests.get("cpu"));
    if cpu_request == 0 && !requests.contains_key("cpu") {
        cpu_request = cpu_limit;
    }
    let mem_limit = milli(limits.get("memory")) / 1000;
    let mut mem_request = milli(requests.get("memory")) / 1000;
    if mem_request == 0 && !requests.contains_key("memory") {
        mem_request = mem_limit;
    }
    let cpu_shares = if cpu_request == 0 {
        2
    } else {
        (cpu_request * 1024 / 1000).max(2)
    };
    let (cpu_period, cpu_quota) = match cfs {
        Some(period) if cpu_limit > 0 => (
            period as i64,
            crate::cm::resources::milli_to_quota(cpu_limit, period),
        ),
        _ => (0, 0),
    };
    // upstream's GetContainerOOMScoreAdjust.
    let oom = match qos {
        QosClass::Guaranteed => -997,
        QosClass::BestEffort => 1000,
        QosClass::Burstable => {
            let cap = node_memory_bytes.max(1);
            let adj = 1000 - (1000 * mem_request) / cap;
            if adj < 3 {
                3
            } else if adj >= 1000 {
                999
            } else {
                adj
            }
        }
    };
    let unified = memory_qos
        .map(|factor| {
            crate::cm::memory_qos::container_unified(
                mem_request,
                mem_limit,
                node_memory_bytes,
                factor,
                crate::cm::memory_qos::page_size(),
            )
        })
        .unwrap_or_default();
    pb::LinuxContainerResources {
        cpu_period,
        cpu_quota,
        cpu_shares,
        memory_limit_in_bytes: mem_limit,
        oom_score_adj: oom,
        unified,
        ..Default::default()
    }
}

fn security_context(
    pod: &Pod,
    c: &Container,
    userns: Option<&pb::UserNamespace>,
) -> pb::LinuxContainerSecurityContext {
    let spec = pod.spec.clone().unwrap_or_default();
    let psc = spec.security_context.clone().unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    let privileged = sc.privileged.unwrap_or(false);
    let unmasked = sc.proc_mount.as_deref() == Some("Unmasked");
    let mut groups = psc.supplemental_groups.clone().unwrap_or_default();
    if let Some(fs) = psc.fs_group {
        groups.push(fs);
    }
    let seccomp = sc.seccomp_profile.clone().or(psc.seccomp_profile.clone());
    let seccomp = seccomp.map(|p| pb::SecurityProfile {
        profile_type: match p.type_.as_str() {
            "RuntimeDefault" => pb::security_profile::ProfileType::RuntimeDefault as i32,
            "Localhost" => pb::security_profile::ProfileType::Localhost as i32,
            _ => pb::security_profile::ProfileType::Unconfined as i32,
        },
        localhost_ref: p.localhost_profile.unwrap_or_default(),
    });
    pb::LinuxContainerSecurityContext {
        capabilities: sc.capabilities.as_ref().map(|caps| pb::Capability {
            add_capabilities: caps.add.clone().unwrap_or_default(),
            drop_capabilities: caps.drop.clone().unwrap_or_default(),
            ..Default::default()
        }),
        privileged,
        namespace_options: Some(namespace_options(&spec, userns)),
        run_as_user: sc
            .run_as_user
            .or(psc.run_as_user)
            .map(|value| pb::Int64Value { value }),
        run_as_group: sc
            .run_as_group
            .or(psc.run_as_group)
            .map(|value| pb::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups: groups,
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        masked_paths: if privileged || unmasked {
            Vec::new()
        } else {
            MASKED_PATHS.iter().map(|s| s.to_string()).collect()
        },
        readonly_paths: if privileged || unmasked {
            Vec::new()
        } else {
            READONLY_PATHS.iter().map(|s| s.to_string()).collect()
        },
        seccomp,
        supplemental_groups_policy: match psc.supplemental_groups_policy.as_deref() {
            Some("Strict") => pb::SupplementalGroupsPolicy::Strict as i32,
            _ => pb::SupplementalGroupsPolicy::Merge as i32,
        },
        ..Default::default()
    }
}

/// Volumes every mount of which is read-only whatever the container's `readOnly` says
/// (upstream's mustMountRO): a claim marked `readOnly`, and the volumes the kubelet writes
/// with the atomic writer (configMap, secret, downwardAPI, projected, hence the
/// service-account token), whose content a container must not change under the kubelet.
fn must_mount_read_only(v: &k8s_openapi::api::core::v1::Volume) -> bool {
    v.persistent_volume_claim
        .as_ref()
        .is_some_and(|c| c.read_only == Some(true))
        || v.config_map.is_some()
        || v.secret.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some()
}

fn mounts(
    pod: &Pod,
    c: &Container,
    ctx: &ContainerContext<'_>,
    termination_file: Option<PathBuf>,
) -> Result<Vec<pb::Mount>, ConfigError> {
    let mut out = Vec::new();
    for vm in c.volume_mounts.iter().flatten() {
        let host = ctx.volumes.get(&vm.name).ok_or_else(|| {
            ConfigError(format!(
                "cannot find volume {:?} to mount into container {:?}",
                vm.name, c.name
            ))
        })?;
        let mut host = host.clone();
        if let Some(sub) = vm.sub_path.as_deref().filter(|s| !s.is_empty()) {
            if sub.starts_with('/') || sub.split('/').any(|p| p == "..") {
                return Err(ConfigError(format!(
                    "subPath {sub:?} must be a relative path without '..'"
                )));
            }
            host = host.join(sub);
            if !host.exists() {
                std::fs::create_dir_all(&host)
                    .map_err(|e| ConfigError(format!("subPath {}: {e}", host.display())))?;
            }
        }
        let volume = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
            .find(|v| v.name == vm.name);
        let readonly = vm.read_only.unwrap_or(false) || volume.is_some_and(must_mount_read_only);
        out.push(pb::Mount {
            container_path: vm.mount_path.clone(),
            host_path: host.display().to_string(),
            readonly,
            propagation: match vm.mount_propagation.as_deref() {
                Some("HostToContainer") => pb::MountPropagation::PropagationHostToContainer as i32,
                Some("Bidirectional") => pb::MountPropagation::PropagationBidirectional as i32,
                _ => pb::MountPropagation::PropagationPrivate as i32,
            },
            recursive_read_only: readonly && vm.recursive_read_only.as_deref() == Some("Enabled"),
            ..Default::default()
        });
    }
    let mounts_etc_hosts = out.iter().any(|m| m.container_path == "/etc/hosts");
    if let Some(h) = ctx.etc_hosts
        && !mounts_etc_hosts
    {
        out.push(pb::Mount {
            container_path: "/etc/hosts".into(),
            host_path: h.display().to_string(),
            ..Default::default()
        });
    }
    if let Some(f) = termination_file {
        let path = c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into());
        if !path.is_empty() {
            out.push(pb::Mount {
                container_path: path,
                host_path: f.display().to_string(),
                ..Default::default()
            });
        }
    }
    let _ = pod;
    Ok(out)
}

/// Builds the CreateContainer config. `image_ref` is the image as resolved by the pull.
pub fn container_config(
    pod: &Pod,
    c: &Container,
    init: bool,
    restart_count: i32,
    image_ref: &str,
    ctx: &ContainerContext<'_>,
) -> Result<pb::ContainerConfig, ConfigError> {
    let spec = pod.spec.clone().unwrap_or_default();
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let envs = env::make_env(pod, c, ctx.env).map_err(|e| ConfigError(e.0))?;
    let command = env::expand_all(c.command.as_deref().unwrap_or_default(), &envs);
    let args = env::expand_all(c.args.as_deref().unwrap_or_default(), &envs);
    let termination = volumes::termination_message_file(ctx.root_dir, uid, c, restart_count)
        .map_err(|e| ConfigError(e.to_string()))?;
    let qos = nodus_k8s::qos::pod_qos_class(&spec);
    Ok(pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: c.name.clone(),
            attempt: restart_count as u32,
        }),
        image: Some(pb::ImageSpec {
            image: image_ref.to_string(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command,
        args,
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: envs
            .into_iter()
            .map(|(key, value)| pb::KeyValue { key, value })
            .collect(),
        mounts: mounts(pod, c, ctx, Some(termination))?,
        labels: labels::container_labels(pod, c, init),
        annotations: labels::container_annotations(
            pod,
            c,
            &labels::container_hash(c),
            restart_count,
        ),
        log_path: format!("{}/{}.log", c.name, restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(pb::LinuxContainerConfig {
            resources: Some(linux_resources(
                c,
                qos,
                ctx.node_memory_bytes,
                ctx.cfs_quota.then_some(ctx.cfs_period_us),
                ctx.memory_qos,
            )),
            security_context: Some(security_context(pod, c, ctx.userns)),
        }),
        ..Default::default()
    })
}

/// Puts an ephemeral container in the process namespace of the container `target_id`
/// (`targetContainerName`): PID mode TARGET, unless the pod already shares one process
/// namespace among all its containers (or uses the node's), as upstream's kubelet.
pub fn target_pid_namespace(config: &mut pb::ContainerConfig, target_id: &str) {
    let Some(ns) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    else {
        return;
    };
    if ns.pid == pb::NamespaceMode::Container as i32 {
        ns.pid = pb::NamespaceMode::Target as i32;
        ns.target_id = target_id.to_string();
    }
}

/// Adds what the device plugins answered at Allocate to the container's config: device
/// nodes, mounts, environment (the plugin's value wins over the pod's, as upstream appends
/// it after), annotations and CDI device names.
pub fn apply_device_options(
    config: &mut pb::ContainerConfig,
    o: crate::cm::devicemanager::RunContainerOptions,
) {
    for d in o.devices {
        config.devices.push(pb::Device {
            container_path: d.container_path,
            host_path: d.host_path,
            permissions: d.permissions,
        });
    }
    for m in o.mounts {
        config.mounts.push(pb::Mount {
            container_path: m.container_path,
            host_path: m.host_path,
            readonly: m.read_only,
            ..Default::default()
        });
    }
    for (key, value) in o.envs {
        config.envs.retain(|e| e.key != key);
        config.envs.push(pb::KeyValue { key, value });
    }
    config.annotations.extend(o.annotations);
    for name in o.cdi_devices {
        config.cdi_devices.push(pb::CdiDevice { name });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    #[test]
    fn target_pid_namespace_only_replaces_a_container_namespace() {
        let with_pid = |pid: pb::NamespaceMode| pb::ContainerConfig {
            linux: Some(pb::LinuxContainerConfig {
                security_context: Some(pb::LinuxContainerSecurityContext {
                    namespace_options: Some(pb::NamespaceOption {
                        pid: pid as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ns = |c: &pb::ContainerConfig| {
            let o = c.linux.as_ref().unwrap().security_context.as_ref().unwrap();
            let o = o.namespace_options.as_ref().unwrap();
            (o.pid, o.target_id.clone())
        };
        let mut c = with_pid(pb::NamespaceMode::Container);
        target_pid_namespace(&mut c, "abc");
        assert_eq!(ns(&c), (pb::NamespaceMode::Target as i32, "abc".into()));
        // shareProcessNamespace: the debugger already sees every process of the pod.
        let mut c = with_pid(pb::NamespaceMode::Pod);
        target_pid_namespace(&mut c, "abc");
        assert_eq!(ns(&c), (pb::NamespaceMode::Pod as i32, String::new()));
    }

    #[test]
    fn memory_qos_puts_memory_min_and_high_in_the_unified_map() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "app",
            "resources": {"requests": {"memory": "128Mi"}, "limits": {"memory": "256Mi"}}
        }))
        .unwrap();
        let page = crate::cm::memory_qos::page_size();
        let r = linux_resources(&c, QosClass::Burstable, 32 << 30, None, Some(0.9));
        assert_eq!(r.unified["memory.min"], (128i64 << 20).to_string());
        let high = ((128i64 << 20) as f64 + (128i64 << 20) as f64 * 0.9) as i64 / page * page;
        assert_eq!(r.unified["memory.high"], high.to_string());
        assert_eq!(r.memory_limit_in_bytes, 256 << 20);
        // Gate off (or cgroup v1): nothing in the unified map.
        let r = linux_resources(&c, QosClass::Burstable, 32 << 30, None, None);
        assert!(r.unified.is_empty());
    }

    #[test]
    fn every_container_gets_the_pods_user_namespace() {
        let root = tempfile::tempdir().unwrap();
        let c = Container {
            name: "app".into(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        let mut pod = Pod::default();
        pod.metadata.name = Some("web".into());
        pod.metadata.uid = Some("u1".into());
        pod.spec = Some(PodSpec {
            host_users: Some(false),
            containers: vec![c.clone()],
            ..Default::default()
        });
        let m = pb::IdMapping {
            host_id: 196608,
            container_id: 0,
            length: 65536,
        };
        let userns = pb::UserNamespace {
            mode: pb::NamespaceMode::Pod as i32,
            uids: vec![m],
            gids: vec![m],
        };
        let volumes = HashMap::new();
        let env = EnvContext {
            node_name: "n".into(),
            host_ips: Vec::new(),
            pod_ips: Vec::new(),
            node_cpu_milli: 1000,
            node_memory_bytes: 1 << 30,
            objects: Default::default(),
            service_env: Default::default(),
        };
        let mut ctx = ContainerContext {
            root_dir: root.path(),
            volumes: &volumes,
            etc_hosts: None,
            env: &env,
            node_memory_bytes: 1 << 30,
            cfs_quota: true,
            cfs_period_us: 100_000,
            memory_qos: None,
            userns: Some(&userns),
        };
        let userns_of = |cfg: pb::ContainerConfig| {
            cfg.linux
                .and_then(|l| l.security_context)
                .and_then(|s| s.namespace_options)
                .and_then(|n| n.userns_options)
        };
        let cfg = container_config(&pod, &c, false, 0, "busybox", &ctx).unwrap();
        assert_eq!(userns_of(cfg), Some(userns.clone()));
        ctx.userns = None;
        let cfg = container_config(&pod, &c, false, 0, "busybox", &ctx).unwrap();
        assert_eq!(
            userns_of(cfg).map(|u| (u.mode, u.uids.len())),
            Some((pb::NamespaceMode::Node as i32, 0))
        );
    }
}
