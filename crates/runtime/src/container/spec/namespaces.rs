//! Linux namespaces of a container (containerd's `WithPodNamespaces`): network, IPC and UTS
//! are the sandbox's; PID is the sandbox's, the container's own, the node's or a target
//! container's; the mount namespace is always new; a cgroup namespace on cgroup v2 for
//! unprivileged containers. Also the sandbox's namespaced sysctls, which only make sense
//! together with the namespaces they belong to.

use std::collections::HashMap;
use std::path::PathBuf;

use cri::runtime::v1::{LinuxContainerSecurityContext, NamespaceMode};
use oci_spec::runtime::{LinuxNamespace, LinuxNamespaceType};

use super::{HostFacts, SpecError, SpecInput};

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

/// Refuse user namespaces, which nodus does not support yet.
pub(crate) fn check_userns(sc: Option<&LinuxContainerSecurityContext>) -> Result<(), SpecError> {
    let userns = sc
        .and_then(|s| s.namespace_options.as_ref())
        .and_then(|n| n.userns_options.as_ref());
    if let Some(u) = userns {
        match mode(u.mode, "userns_options.mode")? {
            NamespaceMode::Node => {}
            other => {
                return Err(SpecError::InvalidArgument(format!(
                    "user namespaces are not supported: linux.security_context.namespace_options.userns_options.mode is {} (only NODE is)",
                    other.as_str_name()
                )));
            }
        }
    }
    Ok(())
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
