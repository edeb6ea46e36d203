//! The pod's mount namespace: where its `/dev/shm` and its containers' root filesystems
//! are mounted, and where the OCI runtime that starts its containers runs.
//!
//! Every CRI runtime mounts a pod's shm tmpfs and each container's overlay in the node's
//! mount namespace, so the node's mount table grows by several lines per pod. runc reads
//! the mount table of the namespace it runs in several times per container and its init
//! copies it (the container's mount namespace is a clone of runc's, then pivoted away from):
//! with a hundred pods' mounts a `runc run` took 13 ms more CPU than on an empty table
//! (`bench/mount-table.sh`), and a burst of pods paid that on a table growing with it.
//!
//! So each pod gets a mount namespace of its own, made at RunPodSandbox by a helper thread
//! that unshares one from the node's and pinned, like the pod's other namespaces, by a bind
//! mount of its nsfs file, in a directory of its own ([`PinDir`], `<state-dir>/mntns`). In it:
//! - the node's mounts are slaves of the node's (`rslave`): a host mount that propagates
//!   (a shared root, as on systemd hosts) still reaches the pod and its containers, and
//!   nothing the pod mounts goes back;
//! - the sandboxes' shared mount point ([`super::PinRoot`]) is detached, so the other
//!   pods' pins are not copied in and later ones do not arrive; this pod's own pins are
//!   bound again at the same paths, so an OCI spec names them as the node does;
//! - the pod's shm tmpfs, and later each container's overlay root, image volumes and
//!   idmapped layers ([`run_in`]).
//!
//! The shim enters the namespace before it runs the OCI runtime ([`enter`]), which so
//! reads a table of the node's few own mounts and the pod's. The node's table keeps one
//! line per pod for all of that (the pin). Unpinning ([`unpin`]) drops the namespace, and
//! every mount in it with it, once the pod's last process is gone.
//!
//! Privileged pods keep the node's mount namespace: a Bidirectional mount (privileged
//! containers only) must propagate back to the node, which a slave copy never does.

use super::SandboxError;
use super::namespaces::{
    bind_namespace, is_namespace_file, make_private_mountpoint, on_scoped_helper_thread,
};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, setns, unshare};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The directory pods' mount namespaces are pinned in, a private mount point of its own.
///
/// Not under the sandboxes' shared [`super::PinRoot`]: the kernel refuses to propagate a
/// bind of a mount namespace's file (a copy could end up holding its own namespace), so a
/// pin there fails with EINVAL as soon as any copy of the node's namespace exists (a
/// privileged container's, an `ip netns exec`). Nor does it copy such binds into a new
/// mount namespace, so a pin here keeps its pod's namespace alive from the node's only.
#[derive(Debug)]
pub struct PinDir {
    dir: PathBuf,
    /// Whether this process made `dir` a mount point (so may unmount it again).
    bound: bool,
}

impl PinDir {
    /// Creates `dir` and makes it a private mount point, unless it is a mount point already
    /// (after a restart of the daemon, with the running pods' pins in it).
    pub fn prepare(dir: &Path) -> Result<PinDir, SandboxError> {
        std::fs::create_dir_all(dir).map_err(|e| SandboxError::io("creating", dir, e))?;
        let dir = std::fs::canonicalize(dir).map_err(|e| SandboxError::io("resolving", dir, e))?;
        if nodus_cgroups::mountinfo::is_mount_point(&dir)
            .map_err(|e| SandboxError::io("inspecting", &dir, e))?
        {
            return Ok(PinDir { dir, bound: false });
        }
        make_private_mountpoint(&dir)?;
        Ok(PinDir { dir, bound: true })
    }

    /// Where the mount namespace of sandbox `id` is pinned (a file, named as
    /// [`crate::statedir::entry_dir`] names a sandbox's directory).
    pub fn pin_path(&self, id: &str) -> PathBuf {
        crate::statedir::entry_dir(&self.dir, id)
    }

    /// Unmounts the directory again if this process mounted it and no pod is pinned in it.
    pub fn release(&self) {
        let empty = std::fs::read_dir(&self.dir).is_ok_and(|mut rd| rd.next().is_none());
        if self.bound
            && empty
            && let Err(e) = umount2(&self.dir, MntFlags::empty())
        {
            tracing::debug!(dir = %self.dir.display(), error = %e, "leaving the mount namespaces' pin directory mounted");
        }
    }
}

/// Makes the pod's mount namespace and pins it at `pin` (a file in a [`PinDir`]): the
/// node's mounts as slaves, `pin_root` (the sandboxes' shared mount point) detached, the
/// namespace files `pins` (this pod's, under `pin_root`) bound again at their paths, and
/// the pod's shm tmpfs mounted at `shm.0` with `shm.1` bytes when given. Nothing of it is
/// left on failure but the empty file `pin`, which [`unpin`] removes.
pub fn create(
    pin: &Path,
    pin_root: &Path,
    pins: &[PathBuf],
    shm: Option<(&Path, u64)>,
) -> Result<(), SandboxError> {
    // Opened here, in the node's namespace: in the new one they are hidden once the pin
    // root is detached, and a bind from `/proc/self/fd/N` reaches them through the fd.
    let mut sources = Vec::with_capacity(pins.len());
    for p in pins {
        let f = File::open(p).map_err(|e| SandboxError::io("opening", p, e))?;
        sources.push((f, p.clone()));
    }
    let ns = on_scoped_helper_thread("nodus-mntns", "mnt", || {
        make_namespace(pin_root, &sources, shm)
    })?;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(pin)
        .map_err(|e| SandboxError::io("creating", pin, e))?;
    // The helper thread is gone: its namespace lives on through this fd until the bind.
    bind_namespace(&format!("/proc/self/fd/{}", ns.as_raw_fd()), pin)
}

/// Undoes [`create`]: unmounts the pin (the namespace goes with its last process) and
/// removes its file. Idempotent.
pub fn unpin(pin: &Path) -> Result<(), SandboxError> {
    super::files::detach_all(pin)?;
    match std::fs::remove_file(pin) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(SandboxError::io("removing", pin, e))
        }
        _ => Ok(()),
    }
}

/// The body of [`create`]'s helper thread: its namespace changes are its own (the thread
/// exits after), and it hands back the new namespace's file.
fn make_namespace(
    pin_root: &Path,
    pins: &[(File, PathBuf)],
    shm: Option<(&Path, u64)>,
) -> Result<File, SandboxError> {
    unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|e| SandboxError::sys("unshare(CLONE_NEWNS) for the pod", e))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| SandboxError::sys("making the pod's copy of / a slave (rslave)", e))?;
    // A slave's unmount does not propagate: the node keeps its pins.
    umount2(pin_root, MntFlags::MNT_DETACH).map_err(|e| {
        SandboxError::sys(
            format!(
                "detaching the other pods' pins ({}) from the pod's mount namespace",
                pin_root.display()
            ),
            e,
        )
    })?;
    for (f, path) in pins {
        bind_namespace(&format!("/proc/self/fd/{}", f.as_raw_fd()), path)?;
    }
    if let Some((path, size)) = shm {
        super::files::mount_shm(path, size)?;
    }
    File::open("/proc/thread-self/ns/mnt")
        .map_err(|e| SandboxError::io("opening", "/proc/thread-self/ns/mnt", e))
}

/// Runs `f` in the pod's mount namespace pinned at `pin`, on a thread of its own (which
/// ends with it), and returns what it returns; without a pin, or when the pod's namespace
/// is gone (its sandbox removed), `f` runs here, in the node's.
pub fn run_in<T: Send>(
    pin: Option<&Path>,
    f: impl FnOnce() -> T + Send,
) -> Result<T, SandboxError> {
    let Some(pin) = pin.filter(|p| is_namespace_file(p)) else {
        return Ok(f());
    };
    let ns = File::open(pin).map_err(|e| SandboxError::io("opening", pin, e))?;
    on_scoped_helper_thread("nodus-in-pod", "mnt", || {
        // A thread shares its filesystem context (root, cwd) with the process, and setns of
        // a mount namespace replaces it: take a copy of its own first.
        unshare(CloneFlags::CLONE_FS).map_err(|e| SandboxError::sys("unshare(CLONE_FS)", e))?;
        setns(&ns, CloneFlags::CLONE_NEWNS).map_err(|e| {
            SandboxError::sys(
                format!("entering the pod's mount namespace {}", pin.display()),
                e,
            )
        })?;
        Ok(f())
    })
}

/// Moves this (single-threaded) process into the pod's mount namespace pinned at `pin`.
pub fn enter(pin: &Path) -> std::io::Result<()> {
    let ns = File::open(pin)?;
    setns(&ns, CloneFlags::CLONE_NEWNS).map_err(std::io::Error::from)
}
