//! Pinned namespaces: a pod's net, ipc and uts namespaces without a pause process.
//!
//! As CRI-O's `pinns` does, a short-lived helper creates the namespaces and the runtime
//! bind-mounts `/proc/<task>/ns/{net,ipc,uts}` onto files of the sandbox's namespace
//! directory (`<state-dir>/sandboxes/<id prefix>/ns/`). The bind mount alone keeps a namespace
//! alive; OCI runtimes join it by path. For net, ipc and uts the helper is a thread: those
//! namespaces are per task, so a thread can `unshare` them (and set the pod hostname in its
//! new UTS namespace), pin them, and exit without touching the rest of the process.
//!
//! A PID namespace is different: it dies with its last process, so sharing one across the
//! pod's containers (`NamespaceMode::POD`) needs a process to own it.
//! [`pin_pid_namespace`] forks a helper that unshares `CLONE_NEWPID` and forks again: the
//! grandchild is pid 1 of the new namespace, a tiny detached init (`nodus-pidns`) that reaps
//! zombies and exits on SIGTERM/SIGINT, like the pause container. Its pid is recorded in the
//! directory's `pid-init` file so that [`unpin`] finds it after a restart of the daemon.
//!
//! The directory all sandboxes live under (`<state-dir>/sandboxes`, the [`PinRoot`]) is made a
//! mount point of its own and *shared*, once (as `ip netns` does for `/run/netns`): a mount
//! namespace cloned while a sandbox exists (a daemon's private /tmp, a container during its
//! set-up) then receives the unmount of [`unpin`] too and does not keep the pod's network
//! namespace alive behind our back. One mount point for all sandboxes, not one per sandbox:
//! every line of the host's mount table is rendered again on each read of mountinfo, which
//! runc does several times per container.

use super::SandboxError;
use super::userns::IdMap;
use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// File names inside a sandbox's namespace directory.
pub const NET: &str = "net";
pub const IPC: &str = "ipc";
pub const UTS: &str = "uts";
pub const PID: &str = "pid";
/// The pod's user namespace, when it has one (`hostUsers: false`).
pub const USER: &str = "user";
/// Holds the host pid of the PID namespace's init.
pub const PID_INIT_FILE: &str = "pid-init";
/// The init's process name (`/proc/<pid>/comm`).
pub const PID_INIT_NAME: &str = "nodus-pidns";

const NSFS_MAGIC: i64 = 0x6e73_6673;
const HOST_NAME_MAX: usize = 64;

/// Which namespaces a sandbox gets of its own. A namespace not asked for is the node's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinOptions {
    /// A new network namespace (every pod without `hostNetwork`).
    pub net: bool,
    /// A new IPC namespace (every pod without `hostIPC`).
    pub ipc: bool,
    /// A new UTS namespace (every pod without `hostNetwork`).
    pub uts: bool,
    /// The hostname set inside the new UTS namespace; ignored without `uts`.
    pub hostname: Option<String>,
    /// A new PID namespace shared by the pod's containers (`shareProcessNamespace`,
    /// CRI `NamespaceMode::POD` for pid), owned by a tiny init process.
    pub pid: bool,
    /// A user namespace of the pod's own with these maps, owning every namespace above
    /// (CRI `NamespaceMode::POD` for userns).
    pub user: Option<UserMappings>,
}

/// The uid and gid maps of a pod's user namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserMappings {
    pub uids: Vec<IdMap>,
    pub gids: Vec<IdMap>,
}

impl UserMappings {
    /// The host uid and gid the namespace's root is: what owns a pod's writable files.
    pub fn host_root(&self) -> Option<(u32, u32)> {
        let root = |maps: &[IdMap]| {
            maps.iter()
                .find(|m| m.container_id == 0 && m.size > 0)
                .map(|m| m.host_id)
        };
        Some((root(&self.uids)?, root(&self.gids)?))
    }
}

impl PinOptions {
    /// The usual pod: its own net, ipc and uts namespaces with `hostname`, pid per container.
    pub fn pod(hostname: impl Into<String>) -> Self {
        PinOptions {
            net: true,
            ipc: true,
            uts: true,
            hostname: Some(hostname.into()),
            pid: false,
            user: None,
        }
    }
}

/// The namespaces pinned for one sandbox: paths an OCI spec names in `linux.namespaces[].path`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedNamespaces {
    pub net: Option<PathBuf>,
    pub ipc: Option<PathBuf>,
    pub uts: Option<PathBuf>,
    pub pid: Option<PathBuf>,
    /// Host pid of the init owning the pinned PID namespace.
    pub pid_init: Option<u32>,
    /// The pod's user namespace, owner of all the others.
    #[serde(default)]
    pub user: Option<PathBuf>,
}

impl PinnedNamespaces {
    /// What is pinned in `dir` now (after a restart of the daemon, say): a path is reported
    /// only while a namespace is mounted on it, the init only while it is alive and its own.
    pub fn load(dir: &Path) -> Result<PinnedNamespaces, SandboxError> {
        let mut pinned = PinnedNamespaces::default();
        for (name, slot) in [
            (NET, &mut pinned.net),
            (IPC, &mut pinned.ipc),
            (UTS, &mut pinned.uts),
            (PID, &mut pinned.pid),
            (USER, &mut pinned.user),
        ] {
            let path = dir.join(name);
            if is_namespace_file(&path) {
                *slot = Some(path);
            }
        }
        if let Some(pid) = read_pid_init(dir)?
            && is_our_init(pid, &dir.join(PID))
        {
            pinned.pid_init = Some(pid);
        }
        Ok(pinned)
    }

    /// Nothing pinned at all.
    pub fn is_empty(&self) -> bool {
        self.net.is_none()
            && self.ipc.is_none()
            && self.uts.is_none()
            && self.pid.is_none()
            && self.user.is_none()
    }
}

/// Whether `path` is a mounted namespace (nsfs), e.g. a pinned file or `/proc/<pid>/ns/net`.
// The f_type field's integer type differs between architectures; the conversion is only
// useless on some of them.
#[allow(clippy::useless_conversion)]
pub fn is_namespace_file(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .map(|s| i64::from(s.filesystem_type().0) == NSFS_MAGIC)
        .unwrap_or(false)
}

/// Creates and pins the namespaces `opts` asks for under `dir` (which must not exist yet).
/// On failure everything done so far is undone.
pub fn pin(dir: &Path, opts: &PinOptions) -> Result<PinnedNamespaces, SandboxError> {
    let hostname = match (&opts.hostname, opts.uts) {
        (Some(h), true) => {
            if h.is_empty() || h.len() > HOST_NAME_MAX || h.contains('\0') {
                return Err(SandboxError::InvalidHostname(h.clone()));
            }
            Some(h.clone())
        }
        _ => None,
    };
    match fs::symlink_metadata(dir) {
        Ok(_) => return Err(SandboxError::AlreadyExists(dir.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(SandboxError::io("inspecting", dir, e)),
    }
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).map_err(|e| SandboxError::io("creating", parent, e))?;
    }
    fs::DirBuilder::new()
        .mode(0o711)
        .create(dir)
        .map_err(|e| SandboxError::io("creating", dir, e))?;
    let dir = fs::canonicalize(dir).map_err(|e| SandboxError::io("resolving", dir, e))?;
    match pin_inner(&dir, opts, hostname) {
        Ok(p) => {
            tracing::debug!(dir = %dir.display(), net = opts.net, ipc = opts.ipc, uts = opts.uts, pid = ?p.pid_init, "pinned sandbox namespaces");
            Ok(p)
        }
        Err(e) => {
            if let Err(cleanup) = unpin(&dir) {
                tracing::warn!(dir = %dir.display(), error = %cleanup, "cleaning up after a failed pin");
            }
            Err(e)
        }
    }
}

fn pin_inner(
    dir: &Path,
    opts: &PinOptions,
    hostname: Option<String>,
) -> Result<PinnedNamespaces, SandboxError> {
    let mut pinned = PinnedNamespaces::default();
    let mut flags = CloneFlags::empty();
    let mut targets = Vec::new();
    for (wanted, flag, name) in [
        (opts.net, CloneFlags::CLONE_NEWNET, NET),
        (opts.ipc, CloneFlags::CLONE_NEWIPC, IPC),
        (opts.uts, CloneFlags::CLONE_NEWUTS, UTS),
    ] {
        if wanted {
            flags |= flag;
            let target = dir.join(name);
            create_ns_file(&target)?;
            targets.push((name, target));
        }
    }
    if let Some(user) = &opts.user {
        // The others must be created inside the user namespace, which takes a process.
        let target = |name: &str| {
            targets
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| t.clone())
        };
        let user_file = dir.join(USER);
        create_ns_file(&user_file)?;
        let t = super::userns::Targets {
            user: user_file.clone(),
            net: target(NET),
            ipc: target(IPC),
            uts: target(UTS),
        };
        super::userns::pin(&user.uids, &user.gids, hostname.as_deref(), &t)?;
        pinned.user = Some(user_file);
    } else if !targets.is_empty() {
        pin_in_thread(flags, hostname, targets.clone())?;
    }
    if !targets.is_empty() {
        for (name, target) in targets {
            match name {
                NET => pinned.net = Some(target),
                IPC => pinned.ipc = Some(target),
                _ => pinned.uts = Some(target),
            }
        }
    }
    if opts.pid {
        let target = dir.join(PID);
        let pid = pin_pid_namespace(&target, pinned.user.as_deref())?;
        pinned.pid = Some(target);
        pinned.pid_init = Some(pid);
        let file = dir.join(PID_INIT_FILE);
        if let Err(e) = fs::write(&file, format!("{pid}\n")) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            return Err(SandboxError::io("writing", file, e));
        }
    }
    Ok(pinned)
}

/// The directory sandboxes' namespace directories are created under, made a shared mount
/// point of its own by [`PinRoot::prepare`].
#[derive(Debug)]
pub struct PinRoot {
    dir: PathBuf,
    /// Whether this process made `dir` a mount point (so may unmount it again).
    bound: bool,
    /// Whether `dir` is the shared mount point (not with an earlier version's sandboxes
    /// still below it): then a pod's mount namespace can leave the other pods' pins out.
    mounted: bool,
}

impl PinRoot {
    /// Creates `dir` and makes it a mount point in a peer group of its own, unless it is one
    /// already: after a restart of the daemon it still is, with the running sandboxes' pins
    /// below it, and binding it again would hide them.
    pub fn prepare(dir: &Path) -> Result<PinRoot, SandboxError> {
        fs::create_dir_all(dir).map_err(|e| SandboxError::io("creating", dir, e))?;
        let dir = fs::canonicalize(dir).map_err(|e| SandboxError::io("resolving", dir, e))?;
        let inspect = |e| SandboxError::io("inspecting", &dir, e);
        if nodus_cgroups::mountinfo::is_mount_point(&dir).map_err(inspect)? {
            return Ok(PinRoot {
                dir,
                bound: false,
                mounted: true,
            });
        }
        // Sandboxes of a version that gave each its own mount point: a bind of the root
        // would hide their pins (a recursive one would copy them, and the hidden originals
        // would keep their namespaces alive after unpin). The root is made once they are gone.
        if !nodus_cgroups::mountinfo::mounts_under(&dir)
            .map_err(inspect)?
            .is_empty()
        {
            tracing::info!(dir = %dir.display(), "sandboxes of an earlier version are pinned here: the shared mount point is made once they are gone");
            return Ok(PinRoot {
                dir,
                bound: false,
                mounted: false,
            });
        }
        make_shared_mountpoint(&dir)?;
        Ok(PinRoot {
            dir,
            bound: true,
            mounted: true,
        })
    }

    /// The shared mount point, when it is one: what a pod's mount namespace detaches
    /// ([`super::mountns::create`]).
    pub fn mount_point(&self) -> Option<&Path> {
        self.mounted.then_some(self.dir.as_path())
    }

    /// Where the sandbox `id` pins its namespaces (a new directory, named as
    /// [`crate::statedir::entry_dir`] names it).
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        crate::statedir::entry_dir(&self.dir, id)
    }

    /// Unmounts the root again if this process mounted it and nothing is pinned below it, so
    /// a daemon stopped with no pods leaves no mount behind; with pods left it stays for the
    /// next run.
    pub fn release(&self) {
        if !self.bound {
            return;
        }
        let busy = fs::read_dir(&self.dir)
            .map(|rd| {
                rd.flatten().any(|e| {
                    !nodus_cgroups::mountinfo::mounts_under(&e.path())
                        .unwrap_or_default()
                        .is_empty()
                })
            })
            .unwrap_or(true);
        if busy {
            return;
        }
        if let Err(e) = umount2(&self.dir, MntFlags::empty()) {
            tracing::debug!(dir = %self.dir.display(), error = %e, "leaving the sandboxes' mount point mounted");
        }
    }
}

/// Makes `dir` a private mount point of its own (bind on itself, private).
pub(crate) fn make_private_mountpoint(dir: &Path) -> Result<(), SandboxError> {
    let what = dir.display();
    mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| SandboxError::sys(format!("bind-mounting {what} onto itself"), e))?;
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| SandboxError::sys(format!("making {what} a private mount"), e))
}

/// Makes `dir` a mount point of its own in a peer group of its own (a private one, then
/// shared): mounts under it propagate only to copies of it.
fn make_shared_mountpoint(dir: &Path) -> Result<(), SandboxError> {
    make_private_mountpoint(dir)?;
    let what = dir.display();
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .map_err(|e| SandboxError::sys(format!("making {what} a shared mount"), e))?;
    Ok(())
}

fn create_ns_file(path: &Path) -> Result<(), SandboxError> {
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(SandboxError::io("creating", path, e)),
    }
}

/// Pins the namespace at `source` (a `/proc/…/ns/<kind>` file) by bind-mounting it onto
/// `target`, an existing file.
pub(crate) fn bind_namespace(source: &str, target: &Path) -> Result<(), SandboxError> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        SandboxError::sys(
            format!("bind-mounting {source} onto {}", target.display()),
            e,
        )
    })
}

/// Unshares `flags` in a dedicated thread, sets the hostname, bind-mounts the thread's
/// namespaces onto `targets`. The thread then exits: its namespaces differ from the process's,
/// so it must never run anything else (never a pooled thread).
fn pin_in_thread(
    flags: CloneFlags,
    hostname: Option<String>,
    targets: Vec<(&'static str, PathBuf)>,
) -> Result<(), SandboxError> {
    on_helper_thread("nodus-pinns", "net/ipc/uts", move || {
        unshare(flags).map_err(|e| SandboxError::sys(format!("unshare({flags:?})"), e))?;
        if let Some(h) = hostname {
            // SAFETY: pointer and length of a live string; affects this thread's new UTS ns.
            let rc = unsafe { libc::sethostname(h.as_ptr().cast(), h.len()) };
            if rc != 0 {
                return Err(SandboxError::sys(
                    format!("sethostname({h:?}) in the new UTS namespace"),
                    Errno::last(),
                ));
            }
        }
        for (name, target) in &targets {
            bind_namespace(&format!("/proc/thread-self/ns/{name}"), target)?;
        }
        Ok(())
    })
}

/// [`on_helper_thread`] for work that borrows from the caller and returns a value.
pub(crate) fn on_scoped_helper_thread<T: Send>(
    name: &str,
    ns: &'static str,
    f: impl FnOnce() -> Result<T, SandboxError> + Send,
) -> Result<T, SandboxError> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn_scoped(s, f)
            .map_err(|e| SandboxError::Helper {
                ns,
                reason: format!("spawning the helper thread: {e}"),
            })?
            .join()
            .map_err(|_| SandboxError::Helper {
                ns,
                reason: "the helper thread panicked".into(),
            })?
    })
}

/// Runs `f` on a thread of its own and waits for it: namespace changes (unshare, setns)
/// affect the calling thread, so they must never happen on one of the runtime's own.
fn on_helper_thread(
    name: &str,
    ns: &'static str,
    f: impl FnOnce() -> Result<(), SandboxError> + Send + 'static,
) -> Result<(), SandboxError> {
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| SandboxError::Helper {
            ns,
            reason: format!("spawning the helper thread: {e}"),
        })?;
    handle.join().map_err(|_| SandboxError::Helper {
        ns,
        reason: "the helper thread panicked".into(),
    })?
}

/// Brings `lo` up in the network namespace pinned at `netns`, as CRI-O does and containerd
/// does with `use_internal_loopback`: what the CNI loopback plugin does, without starting a
/// process per pod. Runs on a thread of its own, which ends in that namespace.
pub fn loopback_up(netns: &Path) -> Result<(), SandboxError> {
    let netns = netns.to_path_buf();
    on_helper_thread("nodus-lo", "net", move || {
        let f = fs::File::open(&netns)
            .map_err(|e| SandboxError::io("opening the network namespace", &netns, e))?;
        nix::sched::setns(&f, CloneFlags::CLONE_NEWNET).map_err(|e| {
            SandboxError::sys(
                format!("entering the network namespace {}", netns.display()),
                e,
            )
        })?;
        // SAFETY: plain socket(2); the descriptor is owned below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(SandboxError::sys(
                "socket(AF_INET) in the pod's network namespace",
                Errno::last(),
            ));
        }
        // SAFETY: fd was just returned by socket(2) and is owned by nothing else.
        let sock = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: ifreq is plain data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the flags of the ifreq passed.
        if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
            return Err(SandboxError::sys("SIOCGIFFLAGS lo", Errno::last()));
        }
        // SAFETY: after SIOCGIFFLAGS the union holds the flags.
        unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
        // SAFETY: as above.
        if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
            return Err(SandboxError::sys("setting lo up", Errno::last()));
        }
        Ok(())
    })
}

/// Starts the init of a new PID namespace and bind-mounts that namespace onto `target`
/// (created if missing). Returns the init's host pid. With `userns` (a pinned user
/// namespace) the init joins it first, so that the PID namespace belongs to the pod's user
/// namespace and its containers, root there, may join it.
///
/// The init is detached (own session, reparented away from the caller, stdio on /dev/null,
/// no inherited descriptors, cwd `/`), so it outlives the runtime daemon. It blocks every
/// signal and takes them with `sigwaitinfo`: SIGTERM/SIGINT make it exit (and the kernel then
/// kills the whole namespace), SIGCHLD makes it reap. It stays in the caller's cgroup: move
/// it into the pod's cgroup if it must be accounted there.
pub fn pin_pid_namespace(target: &Path, userns: Option<&Path>) -> Result<u32, SandboxError> {
    create_ns_file(target)?;
    let userns = userns
        .map(|p| fs::File::open(p).map_err(|e| SandboxError::io("opening", p, e)))
        .transpose()?;
    let userns_fd = userns.as_ref().map_or(-1, |f| f.as_raw_fd());
    let devnull = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| SandboxError::io("opening", "/dev/null", e))?;
    let comm = CString::new(PID_INIT_NAME).map_err(|_| SandboxError::Helper {
        ns: "pid",
        reason: "bad init name".into(),
    })?;
    let (rd, wr) = super::helper_msg::pipe()?;
    let (rfd, wfd) = (rd.as_raw_fd(), wr.as_raw_fd());
    let devnull_fd = devnull.as_raw_fd();
    // SAFETY: the child only makes async-signal-safe calls (see pid_helper_child) before
    // `_exit`; everything it needs was prepared above.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(SandboxError::sys("fork", Errno::last()));
    }
    if child == 0 {
        // SAFETY: in the forked child; never returns.
        unsafe { pid_helper_child(rfd, wfd, devnull_fd, userns_fd, comm.as_ptr()) }
    }
    // Our copy of the write end goes, so a helper that dies is an end of file here.
    drop(wr);
    let msg = super::helper_msg::read_msg(rfd);
    drop(rd);
    // SAFETY: reaping our direct child.
    unsafe {
        let mut status = 0;
        while libc::waitpid(child, &mut status, 0) < 0 && Errno::last() == Errno::EINTR {}
    }
    drop(devnull);
    drop(userns);
    let Some((tag, value)) = msg else {
        return Err(SandboxError::Helper {
            ns: "pid",
            reason: "the helper process died before reporting the init's pid".into(),
        });
    };
    let pid = match tag {
        0 if value > 0 => value,
        1 => {
            return Err(SandboxError::sys(
                "unshare(CLONE_NEWPID) in the helper process",
                Errno::from_raw(value),
            ));
        }
        3 => {
            return Err(SandboxError::sys(
                "joining the pod's user namespace in the helper process",
                Errno::from_raw(value),
            ));
        }
        _ => {
            return Err(SandboxError::sys(
                "fork of the pid namespace init",
                Errno::from_raw(value),
            ));
        }
    };
    if let Err(e) = bind_namespace(&format!("/proc/{pid}/ns/pid"), target) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        return Err(e);
    }
    Ok(pid as u32)
}

/// The forked helper: join the user namespace (if any), unshare the PID namespace, fork its
/// init, report the init's pid (tag 0) or an errno (tag 1: unshare, tag 2: fork, tag 3:
/// setns) on the pipe, exit.
unsafe fn pid_helper_child(
    rfd: libc::c_int,
    wfd: libc::c_int,
    devnull: libc::c_int,
    userns: libc::c_int,
    comm: *const libc::c_char,
) -> ! {
    unsafe {
        libc::close(rfd);
        if userns >= 0 && libc::setns(userns, libc::CLONE_NEWUSER) != 0 {
            super::helper_msg::write_msg(wfd, 3, *libc::__errno_location());
            libc::_exit(1);
        }
        if libc::unshare(libc::CLONE_NEWPID) != 0 {
            super::helper_msg::write_msg(wfd, 1, *libc::__errno_location());
            libc::_exit(1);
        }
        // The init closes its end of `ready` once set up (close_range): EOF here means it
        // is detached, named and has its signals blocked.
        let mut ready = [0 as libc::c_int; 2];
        if libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            super::helper_msg::write_msg(wfd, 2, *libc::__errno_location());
            libc::_exit(1);
        }
        let pid = libc::fork();
        if pid < 0 {
            super::helper_msg::write_msg(wfd, 2, *libc::__errno_location());
            libc::_exit(1);
        }
        if pid == 0 {
            pid_init_main(devnull, comm);
        }
        libc::close(ready[1]);
        let mut byte = 0u8;
        while libc::read(ready[0], (&mut byte as *mut u8).cast(), 1) < 0
            && *libc::__errno_location() == libc::EINTR
        {}
        super::helper_msg::write_msg(wfd, 0, pid);
        libc::_exit(0);
    }
}

/// Pid 1 of the pod's PID namespace: pause semantics with async-signal-safe calls only.
unsafe fn pid_init_main(devnull: libc::c_int, comm: *const libc::c_char) -> ! {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_NAME, comm, 0, 0, 0);
        libc::setsid();
        libc::chdir(c"/".as_ptr());
        libc::dup2(devnull, 0);
        libc::dup2(devnull, 1);
        libc::dup2(devnull, 2);
        // Every inherited descriptor goes, the pipes to the helper and the caller included.
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            let mut fd = 3;
            while fd < 65536 {
                libc::close(fd);
                fd += 1;
            }
        }
        loop {
            let sig = libc::sigwaitinfo(&set, std::ptr::null_mut());
            if sig == libc::SIGTERM || sig == libc::SIGINT {
                libc::_exit(0);
            }
            // Reap on every wake-up: orphans of the namespace are reparented to us.
            while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
        }
    }
}

/// Undoes [`pin`]: stops the PID namespace's init, unmounts every namespace file (and the
/// directory's own mount, which versions before the shared [`PinRoot`] made), removes the
/// directory. Idempotent; after a crash it works from what exists (mounts listed in
/// /proc/self/mountinfo, the `pid-init` file).
pub fn unpin(dir: &Path) -> Result<(), SandboxError> {
    let dir = match fs::canonicalize(dir) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(SandboxError::io("resolving", dir, e)),
    };
    stop_pid_init(&dir)?;
    unmount_all_under(&dir)?;
    match fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(SandboxError::io("removing", dir, e)),
    }
    tracing::debug!(dir = %dir.display(), "unpinned sandbox namespaces");
    Ok(())
}

fn read_pid_init(dir: &Path) -> Result<Option<u32>, SandboxError> {
    let file = dir.join(PID_INIT_FILE);
    match fs::read_to_string(&file) {
        Ok(s) => Ok(s.trim().parse::<u32>().ok().filter(|p| *p > 1)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SandboxError::io("reading", file, e)),
    }
}

/// Whether `pid` is (still) the init of the namespace pinned at `pinned`: compared by the
/// namespace's inode when it is mounted, else by name and being pid 1 of a child namespace.
/// Guards against killing an unrelated process that reused the pid.
fn is_our_init(pid: u32, pinned: &Path) -> bool {
    let proc_ns = PathBuf::from(format!("/proc/{pid}/ns/pid"));
    if is_namespace_file(pinned) {
        return match (fs::metadata(pinned), fs::metadata(&proc_ns)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        };
    }
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm.trim_end() != PID_INIT_NAME {
        return false;
    }
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|l| {
            let ids: Vec<&str> = l.split_whitespace().collect();
            ids.len() >= 2 && ids.last() == Some(&"1")
        })
        .unwrap_or(false)
}

/// Process state letter from /proc/<pid>/stat ('Z' zombie), None when gone.
fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.trim_start().chars().next()
}

fn stop_pid_init(dir: &Path) -> Result<(), SandboxError> {
    let Some(pid) = read_pid_init(dir)? else {
        return Ok(());
    };
    if !is_our_init(pid, &dir.join(PID)) {
        return Ok(());
    }
    // SIGKILL from the parent namespace always reaches a namespace init; its death kills every
    // other process of the namespace.
    match nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    ) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => {
            return Err(SandboxError::sys(
                format!("killing pid namespace init {pid}"),
                e,
            ));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match proc_state(pid) {
            None | Some('Z') | Some('X') => return Ok(()),
            Some(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    tracing::warn!(pid, dir = %dir.display(), "pid namespace init did not exit within 5s of SIGKILL");
    Ok(())
}

fn unmount_all_under(dir: &Path) -> Result<(), SandboxError> {
    for _ in 0..16 {
        let points = nodus_cgroups::mountinfo::mounts_under(dir)
            .map_err(|e| SandboxError::io("reading", "/proc/self/mountinfo", e))?;
        if points.is_empty() {
            return Ok(());
        }
        for mp in points {
            match umount2(&mp, MntFlags::MNT_DETACH) {
                Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
                Err(e) => {
                    return Err(SandboxError::sys(format!("unmounting {}", mp.display()), e));
                }
            }
        }
    }
    Err(SandboxError::sys(
        format!("{} is still mounted after repeated unmounts", dir.display()),
        Errno::EBUSY,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_pin_rejects_bad_hostnames_before_touching_anything() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ns");
        let long = "x".repeat(65);
        for bad in ["", long.as_str()] {
            let err = pin(&dir, &PinOptions::pod(bad)).unwrap_err();
            assert!(matches!(err, SandboxError::InvalidHostname(_)), "{err}");
        }
        assert!(!dir.exists());
        // Nothing there: unpin is a no-op.
        unpin(&dir).unwrap();
    }
}
