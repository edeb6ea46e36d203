//! Linux namespaces of a container (containerd's `WithPodNamespaces`): network, IPC and UTS
//! are the sandbox's; PID is the sandbox's, the container's own, the node's or a target
//! container's; the mount namespace is always new; a cgroup namespace on cgroup v2 for
//! unprivileged containers; the pod's user namespace when it has one (`hostUsers: false`),
//! with its uid and gid maps. Also the sandbox's namespaced sysctls, which only make sense
//! together with the namespaces they belong to.

use std::collections::HashMap;
use std::path::PathBuf;

use cri::runtime::v1::{LinuxContainerSecurityContext, NamespaceMode};
use oci_spec::runtime::{
    LinuxIdMapping, LinuxIdMappingBuilder, LinuxNamespace, LinuxNamespaceType,
};

use super::{HostFacts, SandboxNamespaces, SpecError, SpecInput};
use crate::sandbox::userns::IdMap;

fn ns(typ: LinuxNamespaceType, path: Option<PathBuf>) -> LinuxNamespace {
    let mut n = LinuxNamespace::default();
    n.set_typ(typ);
    n.set_path(path);
    n
}

fn mode(value: i32, field: &str) -> Result<NamespaceMode, SpecError> {
    NamespaceMode::try_from(value).map_err(|_| {
        SpecError::InvalidArgument(format!(
            "linux.security_context.namespace_options.{field}: unknown namespace mode {value}"
        ))
    })
}

/// The container's user namespace must be its pod's: mode POD (or unset) with the pod's maps
/// in a pod that has one, NODE (or unset) in a pod that has none. A container cannot have a
/// user namespace of its own, as in containerd.
pub(crate) fn check_userns(
    sc: Option<&LinuxContainerSecurityContext>,
    sandbox: &SandboxNamespaces,
) -> Result<(), SpecError> {
    let userns = sc
        .and_then(|s| s.namespace_options.as_ref())
        .and_then(|n| n.userns_options.as_ref());
    let field = "linux.security_context.namespace_options.userns_options";
    let Some(u) = userns else { return Ok(()) };
    match (mode(u.mode, "userns_options.mode")?, &sandbox.user) {
        (NamespaceMode::Node, None) => {
            if !u.uids.is_empty() || !u.gids.is_empty() {
                return Err(SpecError::InvalidArgument(format!(
                    "{field}: mode NODE takes no uid or gid mappings"
                )));
            }
        }
        (NamespaceMode::Node, Some(_)) => {
            return Err(SpecError::InvalidArgument(format!(
                "{field}: mode is NODE but the sandbox has a user namespace of its own; its containers must use it (mode POD)"
            )));
        }
        (NamespaceMode::Pod, None) => {
            return Err(SpecError::InvalidArgument(format!(
                "{field}: mode is POD but the sandbox was created without a user namespace"
            )));
        }
        (NamespaceMode::Pod, Some(pod)) => {
            let given = |maps: &[cri::runtime::v1::IdMapping]| -> Vec<IdMap> {
                maps.iter()
                    .map(|m| IdMap {
                        container_id: m.container_id,
                        host_id: m.host_id,
                        size: m.length,
                    })
                    .collect()
            };
            let (uids, gids) = (given(&u.uids), given(&u.gids));
            if (!uids.is_empty() && uids != pod.mappings.uids)
                || (!gids.is_empty() && gids != pod.mappings.gids)
            {
                return Err(SpecError::InvalidArgument(format!(
                    "{field}: the uid/gid mappings differ from the sandbox's; a container shares its pod's user namespace"
                )));
            }
        }
        (other, _) => {
            return Err(SpecError::InvalidArgument(format!(
                "{field}: unsupported user namespace mode {} (only NODE and POD are)",
                other.as_str_name()
            )));
        }
    }
    Ok(())
}

/// The spec's `linux.uidMappings` and `linux.gidMappings`: the pod's user namespace maps.
pub(crate) fn id_mappings(
    sandbox: &SandboxNamespaces,
) -> (Option<Vec<LinuxIdMapping>>, Option<Vec<LinuxIdMapping>>) {
    let Some(user) = &sandbox.user else {
        return (None, None);
    };
    let conv = |maps: &[IdMap]| {
        maps.iter()
            .filter_map(|m| {
                LinuxIdMappingBuilder::default()
                    .container_id(m.container_id)
                    .host_id(m.host_id)
                    .size(m.size)
                    .build()
                    .ok()
            })
            .collect::<Vec<_>>()
    };
    (
        Some(conv(&user.mappings.uids)),
        Some(conv(&user.mappings.gids)),
    )
}

/// The namespaces, in containerd's order: pid, ipc, uts, mount, network, then cgroup.
pub(crate) fn build(
    input: &SpecInput,
    sc: Option<&LinuxContainerSecurityContext>,
    privileged: bool,
    host: &HostFacts,
) -> Result<Vec<LinuxNamespace>, SpecError> {
    let sandbox = &input.namespaces;
    let opts = sc.and_then(|s| s.namespace_options.as_ref());
    let pid_mode = mode(opts.map(|o| o.pid).unwrap_or(0), "pid")?;
    let missing = |what: &str| {
        SpecError::FailedPrecondition(format!(
            "sandbox {} has no {what} namespace to join",
            input.sandbox_id
        ))
    };

    let mut out = Vec::new();
    // The user namespace first: runc joins the others with the capabilities root has in it.
    if let Some(user) = &sandbox.user {
        out.push(ns(LinuxNamespaceType::User, Some(user.path.clone())));
    }
    match pid_mode {
        NamespaceMode::Container => out.push(ns(LinuxNamespaceType::Pid, None)),
        NamespaceMode::Node => {}
        NamespaceMode::Pod if sandbox.host_pid => {}
        NamespaceMode::Pod => {
            let pid = sandbox.pid.as_ref().ok_or_else(|| missing("pid"))?;
            out.push(ns(LinuxNamespaceType::Pid, Some(pid.ns_path("pid"))));
        }
        NamespaceMode::Target => {
            let target = sandbox.target_pid.as_ref().ok_or_else(|| {
                SpecError::InvalidArgument(format!(
                    "invalid target container: linux.security_context.namespace_options.target_id {:?} has no pid namespace to join",
                    opts.map(|o| o.target_id.as_str()).unwrap_or("")
                ))
            })?;
            out.push(ns(LinuxNamespaceType::Pid, Some(target.ns_path("pid"))));
        }
    }
    if !sandbox.host_ipc {
        let path = sandbox.ipc.clone().ok_or_else(|| missing("ipc"))?;
        out.push(ns(LinuxNamespaceType::Ipc, Some(path)));
    }
    // Kubernetes pods on the host network also use the host's UTS namespace.
    match (&sandbox.uts, sandbox.host_network) {
        (_, true) => {}
        (Some(path), false) => out.push(ns(LinuxNamespaceType::Uts, Some(path.clone()))),
        (None, false) => return Err(missing("uts")),
    }
    out.push(ns(LinuxNamespaceType::Mount, None));
    if !sandbox.host_network {
        let path = sandbox.network.clone().ok_or_else(|| missing("network"))?;
        out.push(ns(LinuxNamespaceType::Network, Some(path)));
    }
    // cgroupns hides the host's cgroup tree; containerd uses it only on cgroup v2 and never
    // for privileged containers.
    if host.cgroup_v2 && !privileged {
        out.push(ns(LinuxNamespaceType::Cgroup, None));
    }
    Ok(out)
}

/// The sandbox's sysctls: each must belong to a namespace the container does not share with
/// the host (IPC: `kernel.shm*`, `kernel.msg*`, `kernel.sem`, `fs.mqueue.*`; network:
/// `net.*`; UTS: `kernel.hostname`, `kernel.domainname`), as the OCI runtime requires.
pub(crate) fn sysctls(input: &SpecInput) -> Result<Option<HashMap<String, String>>, SpecError> {
    let Some(sysctls) = input.sandbox_config.linux.as_ref().map(|l| &l.sysctls) else {
        return Ok(None);
    };
    if sysctls.is_empty() {
        return Ok(None);
    }
    let sandbox = &input.namespaces;
    let mut out = HashMap::new();
    for (key, value) in sysctls {
        // Both separators are accepted by the kubelet; the OCI runtime wants dots.
        let name = key.replace('/', ".");
        let (ns, shared) = if name.starts_with("kernel.shm")
            || name.starts_with("kernel.msg")
            || name == "kernel.sem"
            || name.starts_with("fs.mqueue.")
        {
            ("IPC", sandbox.host_ipc)
        } else if name.starts_with("net.") {
            ("network", sandbox.host_network)
        } else if name == "kernel.hostname" || name == "kernel.domainname" {
            ("UTS", sandbox.host_network)
        } else {
            return Err(SpecError::InvalidArgument(format!(
                "linux.sysctls: sysctl {key:?} is not namespaced and cannot be set for a pod"
            )));
        };
        if shared {
            return Err(SpecError::InvalidArgument(format!(
                "linux.sysctls: sysctl {key:?} needs the pod's own {ns} namespace, but the pod shares the host's"
            )));
        }
        out.insert(name, value.clone());
    }
    Ok(Some(out))
}
