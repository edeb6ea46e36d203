//! Mounts of a container, built like containerd's CRI plugin (`WithMounts`,
//! `linuxContainerMounts`): the default filesystems (`/proc`, `/dev`, `/dev/pts`, `/dev/shm`,
//! `/dev/mqueue`, `/sys`, `/sys/fs/cgroup`) minus those a supplied mount replaces, then the
//! CRI mounts together with the sandbox's `/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf`
//! and `/dev/shm`, sorted so that a mount never hides a deeper one.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use cri::runtime::v1::{ContainerConfig, Mount as CriMount, MountPropagation, NamespaceMode};
use oci_spec::runtime::Mount;

use nodus_cgroups::mountinfo::Mount as HostMount;

use super::{HostFacts, SpecError, SpecInput};

/// The mounts and the rootfs propagation they need.
#[derive(Debug, Clone, Default)]
pub(crate) struct MountPlan {
    pub mounts: Vec<Mount>,
    pub rootfs_propagation: Option<String>,
}

fn mount(dst: &str, typ: &str, src: &str, opts: &[&str]) -> Mount {
    let mut m = Mount::default();
    m.set_destination(PathBuf::from(dst));
    m.set_typ(Some(typ.to_string()));
    m.set_source(Some(PathBuf::from(src)));
    m.set_options(Some(opts.iter().map(|o| o.to_string()).collect()));
    m
}

/// containerd's default mounts (without `/run`), plus the cgroup filesystem. Privileged
/// containers get `/sys` and `/sys/fs/cgroup` read-write.
pub(crate) fn default_mounts(privileged: bool) -> Vec<Mount> {
    let ro = if privileged { "rw" } else { "ro" };
    vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        ),
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        ),
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        ),
        mount("/sys", "sysfs", "sysfs", &["nosuid", "noexec", "nodev", ro]),
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", ro],
        ),
    ]
}

/// Lexical path cleaning like Go's `filepath.Clean`.
pub(crate) fn clean(p: &str) -> String {
    let rooted = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            c => parts.push(c),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

fn depth(container_path: &str) -> usize {
    clean(container_path).matches('/').count()
}

/// A CRI mount after image volumes have been given their host path.
struct Bind {
    container_path: String,
    host_path: PathBuf,
    readonly: bool,
    recursive_read_only: bool,
    propagation: i32,
    /// Create the host path when missing (kubelet volumes); sandbox files are checked first.
    create: bool,
}

fn cri_binds(input: &SpecInput) -> Result<Vec<Bind>, SpecError> {
    let mut out = Vec::new();
    for (i, m) in input.config.mounts.iter().enumerate() {
        let field = format!("mounts[{i}]");
        if m.container_path.is_empty() || !m.container_path.starts_with('/') {
            return Err(SpecError::InvalidArgument(format!(
                "{field}.container_path {:?} must be an absolute path",
                m.container_path
            )));
        }
        if !m.uid_mappings.is_empty() || !m.gid_mappings.is_empty() {
            return Err(SpecError::InvalidArgument(format!(
                "{field} (container_path {:?}): idmapped mounts need user namespaces, which are not supported",
                m.container_path
            )));
        }
        let host_path = match &m.image {
            Some(image) => image_host_path(input, m, image, &field)?,
            None if m.host_path.is_empty() => {
                return Err(SpecError::InvalidArgument(format!(
                    "{field}.host_path is empty (container_path {:?})",
                    m.container_path
                )));
            }
            None => PathBuf::from(&m.host_path),
        };
        out.push(Bind {
            container_path: m.container_path.clone(),
            host_path,
            readonly: m.readonly,
            recursive_read_only: m.recursive_read_only,
            propagation: m.propagation,
            create: m.image.is_none(),
        });
    }
    Ok(out)
}

fn image_host_path(
    input: &SpecInput,
    m: &CriMount,
    image: &cri::runtime::v1::ImageSpec,
    field: &str,
) -> Result<PathBuf, SpecError> {
    if !m.host_path.is_empty() {
        return Err(SpecError::InvalidArgument(format!(
            "{field}: host_path must be empty while mounting image {:?} (got {:?})",
            image.image, m.host_path
        )));
    }
    if !m.readonly {
        return Err(SpecError::InvalidArgument(format!(
            "{field}: readonly must be true while mounting image {:?}",
            image.image
        )));
    }
    if image.image.is_empty() {
        return Err(SpecError::InvalidArgument(format!(
            "{field}: image not specified for image volume at {:?}",
            m.container_path
        )));
    }
    let want = clean(&m.container_path);
    input
        .image_mounts
        .iter()
        .find(|im| clean(&im.container_path) == want)
        .map(|im| im.host_path.clone())
        .ok_or_else(|| {
            SpecError::FailedPrecondition(format!(
                "{field}: image volume {:?} for {:?} was not prepared",
                image.image, m.container_path
            ))
        })
}

fn sandbox_binds(input: &SpecInput, cri: &[Bind]) -> Vec<Bind> {
    let config: &ContainerConfig = input.config;
    let sc = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref());
    let readonly = sc.is_some_and(|s| s.readonly_rootfs);
    let in_cri = |dst: &str| cri.iter().any(|b| clean(&b.container_path) == dst);
    let files = &input.sandbox_files;
    let mut out = Vec::new();
    for (dst, src) in [
        ("/etc/hostname", &files.hostname),
        ("/etc/hosts", &files.hosts),
        ("/etc/resolv.conf", &files.resolv_conf),
    ] {
        if in_cri(dst) {
            continue;
        }
        // Like containerd, a file the sandbox does not have is simply not mounted.
        if let Some(src) = src.as_ref().filter(|p| p.exists()) {
            out.push(Bind {
                container_path: dst.to_string(),
                host_path: src.clone(),
                readonly,
                recursive_read_only: false,
                propagation: MountPropagation::PropagationPrivate as i32,
                create: false,
            });
        }
    }
    if !in_cri("/dev/shm") {
        let host_ipc = sc
            .and_then(|s| s.namespace_options.as_ref())
            .is_some_and(|n| n.ipc == NamespaceMode::Node as i32)
            || input.namespaces.host_ipc;
        let src = if host_ipc {
            Some(PathBuf::from("/dev/shm"))
        } else {
            files.dev_shm.clone()
        };
        if let Some(src) = src.filter(|p| p.exists()) {
            out.push(Bind {
                container_path: "/dev/shm".to_string(),
                host_path: src,
                readonly: false,
                recursive_read_only: false,
                propagation: MountPropagation::PropagationPrivate as i32,
                create: false,
            });
        }
    }
    out
}

/// One mountinfo entry: the mount point and its optional fields (`shared:N`, `master:N`).
/// The mount a path lives on: the deepest mount point containing it (the topmost of stacked
/// mounts).
fn lookup_mount(host: &HostFacts, path: &Path) -> Result<HostMount, SpecError> {
    let text = std::fs::read_to_string(&host.mountinfo_path).map_err(|e| {
        SpecError::Internal(format!(
            "failed to read {}: {e}",
            host.mountinfo_path.display()
        ))
    })?;
    let mut best: Option<HostMount> = None;
    for m in nodus_cgroups::mountinfo::parse(&text) {
        if path.starts_with(&m.mount_point)
            && best
                .as_ref()
                .is_none_or(|b| m.mount_point.as_os_str().len() >= b.mount_point.as_os_str().len())
        {
            best = Some(m);
        }
    }
    best.ok_or_else(|| {
        SpecError::Internal(format!(
            "no mount found for {} in mountinfo",
            path.display()
        ))
    })
}

fn ensure_propagation(host: &HostFacts, path: &Path, allow_slave: bool) -> Result<(), SpecError> {
    let info = lookup_mount(host, path)?;
    let ok = info
        .optional
        .iter()
        .any(|o| o.starts_with("shared:") || (allow_slave && o.starts_with("master:")));
    if ok {
        return Ok(());
    }
    let want = if allow_slave {
        "a shared or slave mount"
    } else {
        "a shared mount"
    };
    Err(SpecError::FailedPrecondition(format!(
        "path {:?} is mounted on {:?} but it is not {want}",
        path.display().to_string(),
        info.mount_point.display().to_string()
    )))
}

/// Resolve the host side of a bind: create it when missing (kubelet volumes, as containerd
/// does), then follow it if it is a symlink.
fn prepare_host_path(b: &Bind) -> Result<PathBuf, SpecError> {
    let p = &b.host_path;
    match std::fs::symlink_metadata(p) {
        Ok(meta) if meta.file_type().is_symlink() => std::fs::canonicalize(p).map_err(|e| {
            SpecError::InvalidArgument(format!(
                "failed to resolve symlink {} (mount at {:?}): {e}",
                p.display(),
                b.container_path
            ))
        }),
        Ok(_) => Ok(p.clone()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && b.create => {
            std::fs::create_dir_all(p).map_err(|e| {
                SpecError::Internal(format!(
                    "failed to mkdir {} for the mount at {:?}: {e}",
                    p.display(),
                    b.container_path
                ))
            })?;
            Ok(p.clone())
        }
        Err(e) => Err(SpecError::InvalidArgument(format!(
            "failed to stat host path {} of the mount at {:?}: {e}",
            p.display(),
            b.container_path
        ))),
    }
}

/// All mounts of the container.
pub(crate) fn build(
    input: &SpecInput,
    host: &HostFacts,
    privileged: bool,
) -> Result<MountPlan, SpecError> {
    let cri = cri_binds(input)?;
    let extra = sandbox_binds(input, &cri);
    let mut binds = cri;
    binds.extend(extra);
    // Stable: equal depths keep CRI order, then the sandbox files.
    binds.sort_by_key(|b| depth(&b.container_path));

    let supplied: HashSet<String> = binds.iter().map(|b| clean(&b.container_path)).collect();
    let dev_supplied = supplied.contains("/dev");
    let mut plan = MountPlan::default();
    for m in default_mounts(privileged) {
        let dst = clean(&m.destination().to_string_lossy());
        if supplied.contains(&dst) || (dev_supplied && dst.starts_with("/dev/")) {
            continue;
        }
        plan.mounts.push(m);
    }

    for b in &binds {
        let src = prepare_host_path(b)?;
        let mut options = vec!["rbind".to_string()];
        match MountPropagation::try_from(b.propagation) {
            Ok(MountPropagation::PropagationPrivate) => options.push("rprivate".into()),
            Ok(MountPropagation::PropagationBidirectional) => {
                ensure_propagation(host, &src, false)?;
                options.push("rshared".into());
                plan.rootfs_propagation = Some("rshared".into());
            }
            Ok(MountPropagation::PropagationHostToContainer) => {
                ensure_propagation(host, &src, true)?;
                options.push("rslave".into());
                if plan.rootfs_propagation.as_deref() != Some("rshared") {
                    plan.rootfs_propagation = Some("rslave".into());
                }
            }
            Err(_) => {
                tracing::warn!(
                    container_id = input.container_id,
                    host_path = %b.host_path.display(),
                    propagation = b.propagation,
                    "unknown mount propagation, using rprivate"
                );
                options.push("rprivate".into());
            }
        }
        match (b.readonly, b.recursive_read_only) {
            (true, true) => {
                if b.propagation != MountPropagation::PropagationPrivate as i32 {
                    return Err(SpecError::InvalidArgument(format!(
                        "recursive read-only mount needs private propagation, got {} (hostPath={:?})",
                        MountPropagation::try_from(b.propagation)
                            .map(|p| p.as_str_name().to_string())
                            .unwrap_or_else(|_| b.propagation.to_string()),
                        b.host_path.display().to_string()
                    )));
                }
                options.push("rro".into());
            }
            (true, false) => options.push("ro".into()),
            (false, true) => {
                return Err(SpecError::InvalidArgument(format!(
                    "recursive read-only mount conflicts with RW mount (hostPath={:?})",
                    b.host_path.display().to_string()
                )));
            }
            (false, false) => options.push("rw".into()),
        }
        let mut m = Mount::default();
        m.set_destination(PathBuf::from(&b.container_path));
        m.set_typ(Some("bind".into()));
        m.set_source(Some(src));
        m.set_options(Some(options));
        plan.mounts.push(m);
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_like_go() {
        for (i, o) in [
            ("/", "/"),
            ("/a/b/", "/a/b"),
            ("/a//b/./c/..", "/a/b"),
            ("/../a", "/a"),
            ("a/../../b", "../b"),
            ("", "."),
        ] {
            assert_eq!(clean(i), o, "{i:?}");
        }
        assert_eq!(depth("/"), 1);
        assert_eq!(depth("/etc/hosts"), 2);
        assert_eq!(depth("/a/b/c/"), 3);
    }
}
