//! gVisor (`runsc`) as a handler: its global flags, and what a pod or container asks that
//! a gVisor sandbox cannot give, refused up front with a message that says so rather than
//! a runsc failure deep in StartContainer (or, worse, silently ignored).

use cri::runtime::v1 as pb;

/// runsc's global flags. `--network=host`: the Sentry uses the network stack of the
/// namespace it starts in, the pod's (the spec's network namespace path), so every
/// container of the pod, each a sandbox of its own, sees the interfaces and addresses CNI
/// configured; runsc's own netstack (`sandbox`) moves the addresses into the first
/// sandbox and leaves the pod's other containers without any.
pub const GLOBAL_ARGS: &[&str] = &["--network=host"];

/// What gVisor cannot do, each refused with its reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error(
        "gVisor (runsc) does not support user namespaces (hostUsers: false): its Sentry is already the pod's kernel"
    )]
    UserNamespace,
    #[error(
        "gVisor (runsc) does not support pod sysctls ({0}): the Sentry is not configured through /proc/sys of the host"
    )]
    Sysctls(String),
    #[error(
        "gVisor (runsc) does not support privileged containers: the sandbox never gives a container the host's devices or capabilities"
    )]
    Privileged,
    #[error(
        "gVisor (runsc) does not support host devices in a container ({0}): the Sentry has no passthrough for them"
    )]
    Devices(String),
    #[error(
        "gVisor (runsc) does not support mount propagation {propagation} (mount {path:?}): the sandbox's mounts are private"
    )]
    MountPropagation {
        propagation: &'static str,
        path: String,
    },
    #[error(
        "gVisor (runsc) does not support a process namespace shared between containers (shareProcessNamespace or a target container): each container is a sandbox of its own"
    )]
    SharedPidNamespace,
    #[error(
        "gVisor (runsc) cannot update a running container's resources (runsc has no update command)"
    )]
    Update,
}

/// Makes the container a gVisor sandbox of its own: runsc reads containerd's
/// `io.kubernetes.cri.container-type` and would otherwise look for a running sandbox named
/// by the pod's sandbox id, which here holds only pinned namespaces.
pub fn own_sandbox(spec: &mut oci_spec::runtime::Spec) {
    use crate::container::spec::annotations::{CONTAINER_TYPE, CONTAINER_TYPE_SANDBOX};
    let mut a = spec.annotations().clone().unwrap_or_default();
    a.insert(CONTAINER_TYPE.into(), CONTAINER_TYPE_SANDBOX.into());
    spec.set_annotations(Some(a));
}

/// Refuses a pod sandbox gVisor cannot run.
pub fn check_sandbox(cfg: &pb::PodSandboxConfig) -> Result<(), Unsupported> {
    let Some(linux) = cfg.linux.as_ref() else {
        return Ok(());
    };
    if !linux.sysctls.is_empty() {
        let names: Vec<&str> = linux.sysctls.keys().map(String::as_str).collect();
        return Err(Unsupported::Sysctls(names.join(", ")));
    }
    let ns = linux
        .security_context
        .as_ref()
        .and_then(|s| s.namespace_options.as_ref());
    if ns
        .and_then(|n| n.userns_options.as_ref())
        .is_some_and(|u| u.mode == pb::NamespaceMode::Pod as i32)
    {
        return Err(Unsupported::UserNamespace);
    }
    if ns.is_some_and(|n| n.pid == pb::NamespaceMode::Pod as i32) {
        return Err(Unsupported::SharedPidNamespace);
    }
    Ok(())
}

/// Refuses a container gVisor cannot run.
pub fn check_container(cfg: &pb::ContainerConfig) -> Result<(), Unsupported> {
    let sc = cfg.linux.as_ref().and_then(|l| l.security_context.as_ref());
    if sc.is_some_and(|s| s.privileged) {
        return Err(Unsupported::Privileged);
    }
    if sc
        .and_then(|s| s.namespace_options.as_ref())
        .is_some_and(|n| {
            n.pid == pb::NamespaceMode::Pod as i32 || n.pid == pb::NamespaceMode::Target as i32
        })
    {
        return Err(Unsupported::SharedPidNamespace);
    }
    if !cfg.devices.is_empty() {
        let paths: Vec<&str> = cfg.devices.iter().map(|d| d.host_path.as_str()).collect();
        return Err(Unsupported::Devices(paths.join(", ")));
    }
    for m in &cfg.mounts {
        let propagation = match pb::MountPropagation::try_from(m.propagation) {
            Ok(pb::MountPropagation::PropagationBidirectional) => "Bidirectional",
            Ok(pb::MountPropagation::PropagationHostToContainer) => "HostToContainer",
            _ => continue,
        };
        return Err(Unsupported::MountPropagation {
            propagation,
            path: m.container_path.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_gvisor_cannot_do_is_named() {
        let mut c = pb::ContainerConfig::default();
        assert_eq!(check_container(&c), Ok(()));
        c.mounts.push(pb::Mount {
            container_path: "/data".into(),
            propagation: pb::MountPropagation::PropagationBidirectional as i32,
            ..Default::default()
        });
        let e = check_container(&c).unwrap_err().to_string();
        assert!(e.contains("Bidirectional") && e.contains("/data"), "{e}");
        c.mounts.clear();
        c.linux = Some(pb::LinuxContainerConfig {
            security_context: Some(pb::LinuxContainerSecurityContext {
                privileged: true,
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(check_container(&c), Err(Unsupported::Privileged));
        // `kubectl debug --target`: PID namespace mode TARGET.
        c.linux = Some(pb::LinuxContainerConfig {
            security_context: Some(pb::LinuxContainerSecurityContext {
                namespace_options: Some(pb::NamespaceOption {
                    pid: pb::NamespaceMode::Target as i32,
                    target_id: "abc".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        let e = check_container(&c).unwrap_err().to_string();
        assert!(
            e.contains("gVisor") && e.contains("target container"),
            "{e}"
        );
        let mut sb = pb::PodSandboxConfig::default();
        assert_eq!(check_sandbox(&sb), Ok(()));
        sb.linux = Some(pb::LinuxPodSandboxConfig {
            sysctls: [("net.core.somaxconn".to_string(), "1024".to_string())].into(),
            ..Default::default()
        });
        assert!(
            check_sandbox(&sb)
                .unwrap_err()
                .to_string()
                .contains("net.core.somaxconn")
        );
    }
}
