//! The OCI runtime spec (`config.json`) of a CRI container, built the way containerd's CRI
//! plugin (1.7/2.x) builds it, so that a container behaves the same under nodus as under
//! containerd: process (command, environment, user and groups from the image's own
//! `/etc/passwd` and `/etc/group`, capabilities, OOM score), mounts, namespaces shared with
//! the sandbox, cgroup resources and path, devices, seccomp and the CRI annotations.
//!
//! [`build`] is the entry point; it reads the container's rootfs (users, groups), host paths
//! (mount sources, devices, seccomp profiles) and creates missing host directories of CRI
//! mounts like containerd does, but starts nothing.
//!
//! * [`user`]: uid/gid/additional gids.
//! * [`process`]: args, env, cwd from the CRI config over the image config.
//! * [`mounts`], [`devices`], [`namespaces`], [`resources`], [`capabilities`], [`seccomp`],
//!   [`annotations`]: one part of the spec each.
//! * [`host`]: facts about this machine (cgroup layout, own capabilities), probed once.

pub(crate) mod annotations;
mod capabilities;
mod devices;
mod host;
mod mounts;
mod namespaces;
mod process;
mod resources;
mod seccomp;
mod user;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use cri::runtime::v1::{ContainerConfig, PodSandboxConfig, security_profile::ProfileType};
use oci_spec::runtime::{Linux, Process, Root, Spec, User};

pub use host::HostFacts;

/// The OCI spec version written into `config.json` (what runc 1.1 itself generates).
pub const OCI_VERSION: &str = "1.0.2-dev";

/// Everything the spec of one container is built from.
#[derive(Debug, Clone)]
pub struct SpecInput<'a> {
    /// The container's id (also the last element of its cgroups path).
    pub container_id: &'a str,
    /// The sandbox's id.
    pub sandbox_id: &'a str,
    /// The CRI container config of `CreateContainer`.
    pub config: &'a ContainerConfig,
    /// The sandbox's config, as passed again with `CreateContainer`.
    pub sandbox_config: &'a PodSandboxConfig,
    /// The image config: the whole OCI image config document or its `config` object
    /// (`User`, `Env`, `Entrypoint`, `Cmd`, `WorkingDir`).
    pub image_config: &'a serde_json::Value,
    /// The mounted rootfs of the container (its `/etc/passwd` and `/etc/group` are read).
    pub rootfs: &'a Path,
    /// The sandbox's namespaces to join.
    pub namespaces: SandboxNamespaces,
    /// Files of the sandbox bind-mounted into every container.
    pub sandbox_files: SandboxFiles,
    /// The sandbox's cgroup parent (`LinuxPodSandboxConfig.cgroup_parent`).
    pub cgroup_parent: &'a str,
    /// The `systemd-cgroup` key: the cgroups path in systemd's `slice:prefix:name` form.
    pub systemd_cgroup: bool,
    /// The directory relative `Localhost` seccomp profiles are found in (the kubelet passes
    /// absolute paths nowadays).
    pub seccomp_profile_root: Option<&'a Path>,
    /// The runtime's own `oom_score_adj`: containers never get a lower one.
    pub oom_score_adj_floor: i32,
    /// CRI image volumes (mounts with `image` set), resolved to host paths.
    pub image_mounts: Vec<ImageMount>,
    /// Patterns (Go `path.Match`) of pod annotations copied into the spec (containerd's
    /// runtime option `pod_annotations`); empty: none.
    pub pod_annotations: &'a [String],
    /// Patterns of container annotations copied into the spec (`container_annotations`).
    pub container_annotations: &'a [String],
}

/// The namespaces of the sandbox a container joins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxNamespaces {
    /// The pinned network namespace (unused with `host_network`).
    pub network: Option<PathBuf>,
    /// The pinned IPC namespace (unused with `host_ipc`).
    pub ipc: Option<PathBuf>,
    /// The pinned UTS namespace (unused with `host_network`: such pods use the host's).
    pub uts: Option<PathBuf>,
    /// The sandbox's PID namespace, for containers in PID mode POD.
    pub pid: Option<NamespaceRef>,
    /// The target container's PID namespace, for PID mode TARGET (`kubectl debug --target`).
    pub target_pid: Option<NamespaceRef>,
    /// The pod uses the node's network (and UTS) namespace.
    pub host_network: bool,
    /// The pod uses the node's IPC namespace.
    pub host_ipc: bool,
    /// The pod uses the node's PID namespace.
    pub host_pid: bool,
    /// The pod's own user namespace (`hostUsers: false`), which containers join.
    pub user: Option<PodUserNamespace>,
}

/// A pod's pinned user namespace and the maps it was made with (which runc wants in the
/// spec too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUserNamespace {
    pub path: PathBuf,
    pub mappings: crate::sandbox::UserMappings,
}

/// A namespace to join: a pinned file, or the namespace of a running process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceRef {
    /// A namespace file (a bind mount of `/proc/<pid>/ns/<kind>`).
    Path(PathBuf),
    /// The namespace of this process (`/proc/<pid>/ns/<kind>`).
    Process(u32),
}

impl NamespaceRef {
    /// The path to join for a namespace kind (`pid`, `net`, ...).
    pub fn ns_path(&self, kind: &str) -> PathBuf {
        match self {
            NamespaceRef::Path(p) => p.clone(),
            NamespaceRef::Process(pid) => PathBuf::from(format!("/proc/{pid}/ns/{kind}")),
        }
    }
}

/// Host files of the sandbox bind-mounted into its containers; a file that is `None` or does
/// not exist is not mounted (containerd skips them the same way).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFiles {
    /// Mounted at `/etc/hostname`.
    pub hostname: Option<PathBuf>,
    /// Mounted at `/etc/resolv.conf`.
    pub resolv_conf: Option<PathBuf>,
    /// Mounted at `/etc/hosts`.
    pub hosts: Option<PathBuf>,
    /// The sandbox's shared-memory directory, mounted at `/dev/shm` (the host's `/dev/shm`
    /// is used instead for host-IPC pods).
    pub dev_shm: Option<PathBuf>,
}

/// A CRI image volume made ready on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageMount {
    /// The `container_path` of the CRI mount it belongs to.
    pub container_path: String,
    /// A read-only view of the image's filesystem on the host.
    pub host_path: PathBuf,
}

/// Why a spec could not be built; each kind is a gRPC status code.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// The CRI request is wrong (unknown profile, missing user, bad mount, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// The request is fine but the node or sandbox cannot honour it (no shared mount, no
    /// namespace to join, unprepared image volume, no seccomp in the kernel).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Reading the host failed unexpectedly.
    #[error("{0}")]
    Internal(String),
}

impl SpecError {
    /// The gRPC status code for this error.
    pub fn code(&self) -> tonic::Code {
        match self {
            SpecError::InvalidArgument(_) => tonic::Code::InvalidArgument,
            SpecError::FailedPrecondition(_) => tonic::Code::FailedPrecondition,
            SpecError::Internal(_) => tonic::Code::Internal,
        }
    }
}

impl From<SpecError> for tonic::Status {
    fn from(e: SpecError) -> Self {
        tonic::Status::new(e.code(), e.to_string())
    }
}

/// Build the OCI spec of a container on this machine.
pub fn build(input: &SpecInput) -> Result<Spec, SpecError> {
    build_with(input, HostFacts::get())
}

/// [`build`] with explicit host facts.
pub fn build_with(input: &SpecInput, host: &HostFacts) -> Result<Spec, SpecError> {
    let config = input.config;
    let sc = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref());
    let sandbox_sc = input
        .sandbox_config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref());
    let privileged = sc.is_some_and(|s| s.privileged);
    if privileged && !sandbox_sc.is_some_and(|s| s.privileged) {
        return Err(SpecError::InvalidArgument(format!(
            "no privileged container allowed in sandbox {}: linux.security_context.privileged is set but the sandbox is not privileged",
            input.sandbox_id
        )));
    }
    namespaces::check_userns(sc, &input.namespaces)?;
    check_apparmor(sc)?;

    // Process.
    let image = process::ImageConfig::from_json(input.image_config)?;
    let args = process::args(config, &image)?;
    let hostname = if input.sandbox_config.hostname.is_empty() {
        host.hostname.as_str()
    } else {
        input.sandbox_config.hostname.as_str()
    };
    let env = process::env(config, &image, hostname);
    let cwd = process::cwd(config, &image);
    let who = user::resolve(input.rootfs, sc, &image.user)?;
    let caps = capabilities::effective_set(sc, privileged, &host.current_caps)?;
    let resources_in = config.linux.as_ref().and_then(|l| l.resources.as_ref());
    let oom =
        resources::oom_score_adj(resources_in, input.oom_score_adj_floor, input.container_id)?;

    let mut oci_user = User::default();
    oci_user.set_uid(who.uid);
    oci_user.set_gid(who.gid);
    oci_user.set_additional_gids((!who.additional_gids.is_empty()).then_some(who.additional_gids));

    let mut proc_ = Process::default();
    proc_.set_terminal(config.tty.then_some(true));
    proc_.set_console_size(None);
    proc_.set_user(oci_user);
    proc_.set_args(Some(args));
    proc_.set_env(Some(env));
    proc_.set_cwd(PathBuf::from(cwd));
    proc_.set_capabilities(Some(capabilities::to_oci(&caps)));
    proc_.set_rlimits(None);
    proc_.set_no_new_privileges(sc.is_some_and(|s| s.no_new_privs).then_some(true));
    proc_.set_apparmor_profile(None);
    proc_.set_oom_score_adj(oom);
    proc_.set_selinux_label(None);
    proc_.set_scheduler(None);
    proc_.set_io_priority(None);

    // Root and mounts.
    let mut root = Root::default();
    root.set_path(input.rootfs.to_path_buf());
    root.set_readonly(sc.is_some_and(|s| s.readonly_rootfs).then_some(true));
    let mount_plan = mounts::build(input, host, privileged)?;

    // Linux.
    let device_plan = devices::build(config, privileged, host)?;
    let res = resources::build(resources_in, device_plan.rules, host, input.container_id)?;
    let ns = namespaces::build(input, sc, privileged, host)?;
    let seccomp = seccomp::build(sc, privileged, &caps, input.seccomp_profile_root, host)?;
    let (masked, readonly) = if privileged {
        (None, None)
    } else {
        let nonempty = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        (
            sc.and_then(|s| nonempty(&s.masked_paths)),
            sc.and_then(|s| nonempty(&s.readonly_paths)),
        )
    };

    let mut linux = Linux::default();
    let (uid_maps, gid_maps) = namespaces::id_mappings(&input.namespaces);
    linux.set_uid_mappings(uid_maps);
    linux.set_gid_mappings(gid_maps);
    linux.set_sysctl(namespaces::sysctls(input)?);
    linux.set_resources(Some(res));
    linux.set_cgroups_path(Some(PathBuf::from(resources::cgroups_path(
        input.cgroup_parent,
        input.container_id,
        input.systemd_cgroup,
    ))));
    linux.set_namespaces(Some(ns));
    linux.set_devices((!device_plan.devices.is_empty()).then_some(device_plan.devices));
    linux.set_seccomp(seccomp);
    linux.set_rootfs_propagation(mount_plan.rootfs_propagation);
    linux.set_masked_paths(masked);
    linux.set_readonly_paths(readonly);
    linux.set_mount_label(None);

    let mut spec = Spec::default();
    spec.set_version(OCI_VERSION.to_string());
    spec.set_root(Some(root));
    spec.set_mounts(Some(mount_plan.mounts));
    spec.set_process(Some(proc_));
    spec.set_hostname(None);
    spec.set_domainname(None);
    spec.set_hooks(None);
    spec.set_annotations(Some(annotations::build(input)));
    spec.set_linux(Some(linux));
    Ok(spec)
}

/// There is no AppArmor on nodus nodes: like containerd without AppArmor, asking for a
/// specific profile is an error, runtime-default and unconfined are fine.
fn check_apparmor(
    sc: Option<&cri::runtime::v1::LinuxContainerSecurityContext>,
) -> Result<(), SpecError> {
    let Some(sc) = sc else { return Ok(()) };
    if let Some(p) = &sc.apparmor {
        if p.profile_type == ProfileType::Localhost as i32 {
            return Err(SpecError::InvalidArgument(format!(
                "apparmor is not supported: linux.security_context.apparmor asks for Localhost profile {:?}",
                p.localhost_ref
            )));
        }
        return Ok(());
    }
    #[allow(deprecated)]
    let legacy = sc.apparmor_profile.as_str();
    if let Some(name) = legacy.strip_prefix("localhost/") {
        return Err(SpecError::InvalidArgument(format!(
            "apparmor is not supported: linux.security_context.apparmor_profile asks for {name:?}"
        )));
    }
    Ok(())
}
