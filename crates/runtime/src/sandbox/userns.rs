//! User namespaces for pods (CRI `NamespaceMode::POD` user namespaces, Kubernetes'
//! `hostUsers: false`).
//!
//! A pod's user namespace must own its network, IPC and UTS namespaces, or root in the pod
//! would hold no capability over them (no sysfs, no mqueue, no sethostname). So they are
//! created *inside* the new user namespace, which a thread cannot do (unsharing a user
//! namespace needs a single-threaded process): [`pin`] forks a helper that unshares the user
//! namespace, waits while the runtime writes its uid and gid maps, unshares the others,
//! sets the hostname, and waits again while the runtime bind-mounts all of them — then
//! exits. The bind mounts keep every namespace alive.
//!
//! Files in image layers belong to the host's root, who does not exist in the pod's user
//! namespace. [`idmapped_mount`] makes an idmapped copy of a directory's mount, through
//! which those files show the mapped ids. This kernel refuses to idmap an overlay mount
//! itself (`mount_setattr` answers EINVAL), so each layer has to be idmapped before the
//! overlay is built on top of them.

use super::SandboxError;
use super::helper_msg::{pipe, read_exact, read_msg, write_msg};
use nix::errno::Errno;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// One line of a uid or gid map: `size` ids from `container_id` inside map to `host_id` up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IdMap {
    pub container_id: u32,
    pub host_id: u32,
    pub size: u32,
}

impl IdMap {
    /// The text `/proc/<pid>/{uid,gid}_map` takes.
    pub fn render(maps: &[IdMap]) -> String {
        maps.iter()
            .map(|m| format!("{} {} {}\n", m.container_id, m.host_id, m.size))
            .collect()
    }
}

/// Where [`pin`] bind-mounts each namespace; `None` leaves that one the helper's (and so
/// the node's, since the helper exits).
#[derive(Debug, Clone, Default)]
pub struct Targets {
    pub user: PathBuf,
    pub net: Option<PathBuf>,
    pub ipc: Option<PathBuf>,
    pub uts: Option<PathBuf>,
}

// Helper → runtime messages (helper_msg): a step tag and an errno (0 = done).
const STEP_USERNS: i32 = 1;
const STEP_OTHERS: i32 = 2;
const STEP_HOSTNAME: i32 = 3;

/// The forked helper. Only async-signal-safe calls: unshare, sethostname, read, write, _exit.
///
/// # Safety
/// Called in the child of `fork` only; never returns.
unsafe fn helper_child(
    to_parent: libc::c_int,
    from_parent: libc::c_int,
    parent_ends: [libc::c_int; 2],
    flags: libc::c_int,
    hostname: Option<(*const libc::c_char, usize)>,
) -> ! {
    let mut go = [0u8; 1];
    // SAFETY: plain syscalls on values prepared before the fork.
    unsafe {
        // The runtime's ends: closed here, so that the runtime closing its write end is an
        // end of file for this helper.
        for fd in parent_ends {
            libc::close(fd);
        }
        if libc::unshare(libc::CLONE_NEWUSER) != 0 {
            write_msg(to_parent, STEP_USERNS, Errno::last() as i32);
            libc::_exit(1);
        }
        write_msg(to_parent, STEP_USERNS, 0);
        // The runtime writes the uid and gid maps now.
        if !read_exact(from_parent, &mut go) {
            libc::_exit(1);
        }
        if flags != 0 && libc::unshare(flags) != 0 {
            write_msg(to_parent, STEP_OTHERS, Errno::last() as i32);
            libc::_exit(1);
        }
        if let Some((p, len)) = hostname
            && libc::sethostname(p, len) != 0
        {
            write_msg(to_parent, STEP_HOSTNAME, Errno::last() as i32);
            libc::_exit(1);
        }
        write_msg(to_parent, STEP_OTHERS, 0);
        // The runtime bind-mounts our namespaces now; then we may go.
        let _ = read_exact(from_parent, &mut go);
        libc::_exit(0);
    }
}

fn helper_error(reason: impl Into<String>) -> SandboxError {
    SandboxError::Helper {
        ns: "user",
        reason: reason.into(),
    }
}

/// Creates a user namespace with `uids` and `gids`, and inside it the net, IPC and UTS
/// namespaces `targets` names (the UTS one with `hostname`), and bind-mounts each onto its
/// target file (which must exist). Nothing is left running.
pub fn pin(
    uids: &[IdMap],
    gids: &[IdMap],
    hostname: Option<&str>,
    targets: &Targets,
) -> Result<(), SandboxError> {
    if uids.is_empty() || gids.is_empty() {
        return Err(helper_error("a user namespace needs uid and gid mappings"));
    }
    let host = hostname
        .map(|h| CString::new(h).map_err(|_| SandboxError::InvalidHostname(h.to_string())))
        .transpose()?;
    let mut flags = 0;
    for (t, f) in [
        (&targets.net, libc::CLONE_NEWNET),
        (&targets.ipc, libc::CLONE_NEWIPC),
        (&targets.uts, libc::CLONE_NEWUTS),
    ] {
        if t.is_some() {
            flags |= f;
        }
    }
    let host_arg = match (&host, &targets.uts) {
        (Some(h), Some(_)) => Some((h.as_ptr(), h.as_bytes().len())),
        _ => None,
    };
    let (from_child, to_parent) = pipe()?;
    let (from_parent, to_child) = pipe()?;
    // SAFETY: the child only makes async-signal-safe calls (helper_child) before _exit;
    // everything it uses was prepared above.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(SandboxError::sys("fork", Errno::last()));
    }
    if child == 0 {
        // SAFETY: in the forked child; never returns.
        unsafe {
            helper_child(
                to_parent.as_raw_fd(),
                from_parent.as_raw_fd(),
                [from_child.as_raw_fd(), to_child.as_raw_fd()],
                flags,
                host_arg,
            )
        }
    }
    drop(to_parent);
    drop(from_parent);
    let result = drive(child, &from_child, &to_child, uids, gids, targets);
    // Whatever happened, the helper goes: closing its pipe releases it, and a helper stuck
    // elsewhere is killed.
    drop(to_child);
    if result.is_err() {
        // SAFETY: signalling our own direct child, which is not yet reaped.
        unsafe { libc::kill(child, libc::SIGKILL) };
    }
    // SAFETY: reaping our direct child.
    unsafe {
        let mut status = 0;
        while libc::waitpid(child, &mut status, 0) < 0 && Errno::last() == Errno::EINTR {}
    }
    result
}

fn drive(
    child: libc::pid_t,
    from_child: &OwnedFd,
    to_child: &OwnedFd,
    uids: &[IdMap],
    gids: &[IdMap],
    targets: &Targets,
) -> Result<(), SandboxError> {
    let step = |what: &str| -> Result<(), SandboxError> {
        match read_msg(from_child.as_raw_fd()) {
            Some((_, 0)) => Ok(()),
            Some((tag, errno)) => {
                let op = match tag {
                    STEP_USERNS => "unshare(CLONE_NEWUSER)",
                    STEP_HOSTNAME => "sethostname in the new UTS namespace",
                    _ => "unshare of the net/ipc/uts namespaces inside the user namespace",
                };
                Err(SandboxError::sys(op, Errno::from_raw(errno)))
            }
            None => Err(helper_error(format!("the helper died {what}"))),
        }
    };
    step("before creating the user namespace")?;
    for (file, maps) in [("uid_map", uids), ("gid_map", gids)] {
        let path = format!("/proc/{child}/{file}");
        std::fs::write(&path, IdMap::render(maps))
            .map_err(|e| SandboxError::io("writing", path, e))?;
    }
    let go = [1u8];
    // SAFETY: writing one byte from a live buffer to a pipe we own.
    if unsafe { libc::write(to_child.as_raw_fd(), go.as_ptr().cast(), 1) } != 1 {
        return Err(SandboxError::sys("releasing the helper", Errno::last()));
    }
    step("inside the user namespace")?;
    let all = [
        ("user", Some(&targets.user)),
        ("net", targets.net.as_ref()),
        ("ipc", targets.ipc.as_ref()),
        ("uts", targets.uts.as_ref()),
    ];
    for (name, target) in all {
        let Some(target) = target else { continue };
        super::namespaces::bind_namespace(&format!("/proc/{child}/ns/{name}"), target)?;
    }
    Ok(())
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// Mounts at `target` (an existing directory, or file for a file `source`) a copy of the
/// mount of `source` whose ids are mapped through the user namespace pinned at `userns`: a
/// file the host's root owns shows as owned by the namespace's root. `recursive` copies the
/// mounts below `source` too (an `rbind`), each idmapped.
pub fn idmapped_mount(
    source: &Path,
    target: &Path,
    userns: &Path,
    read_only: bool,
    recursive: bool,
) -> Result<(), SandboxError> {
    let cpath = |p: &Path| {
        CString::new(p.as_os_str().as_encoded_bytes())
            .map_err(|_| helper_error(format!("{} contains a NUL byte", p.display())))
    };
    let (src, dst) = (cpath(source)?, cpath(target)?);
    let ns = std::fs::File::open(userns).map_err(|e| SandboxError::io("opening", userns, e))?;
    // SAFETY: open_tree with a valid NUL-terminated path; the result is a new descriptor.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE
                | libc::O_CLOEXEC as libc::c_uint
                | if recursive {
                    libc::AT_RECURSIVE as libc::c_uint
                } else {
                    0
                },
        )
    };
    if tree < 0 {
        return Err(SandboxError::sys(
            format!("open_tree({})", source.display()),
            Errno::last(),
        ));
    }
    // SAFETY: a descriptor open_tree just returned, owned by nobody else.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as libc::c_int) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | if read_only { MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: ns.as_raw_fd() as u64,
    };
    // SAFETY: mount_setattr on a detached tree we own, with a live, correctly sized struct.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | if recursive { libc::AT_RECURSIVE } else { 0 },
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(SandboxError::sys(
            format!("idmapping the mount of {}", source.display()),
            Errno::last(),
        ));
    }
    // SAFETY: move_mount of the detached tree onto a valid NUL-terminated path.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(SandboxError::sys(
            format!("attaching the idmapped mount at {}", target.display()),
            Errno::last(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// The user namespace owning the namespace file at `ns` (ioctl NS_GET_USERNS).
    fn owner(ns: &Path) -> std::fs::Metadata {
        const NS_GET_USERNS: libc::c_ulong = 0xb701;
        let f = std::fs::File::open(ns).unwrap();
        // SAFETY: ioctl on a namespace fd; returns a new fd on success.
        let fd = unsafe { libc::ioctl(f.as_raw_fd(), NS_GET_USERNS) };
        assert!(fd >= 0, "NS_GET_USERNS: {}", Errno::last());
        // SAFETY: a descriptor the ioctl just returned.
        let owned = unsafe { std::fs::File::from_raw_fd(fd) };
        owned.metadata().unwrap()
    }

    #[test]
    fn a_pod_user_namespace_owns_its_net_ipc_uts_and_maps_layer_files() {
        if !root() {
            if std::env::var("NODUS_TEST_REQUIRE_ROOT").is_ok_and(|v| v == "1") {
                panic!("this test needs root");
            }
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let ns = dir.path().join("ns");
        std::fs::create_dir(&ns).unwrap();
        let t = Targets {
            user: ns.join("user"),
            net: Some(ns.join("net")),
            ipc: Some(ns.join("ipc")),
            uts: Some(ns.join("uts")),
        };
        for p in [
            &t.user,
            t.net.as_ref().unwrap(),
            t.ipc.as_ref().unwrap(),
            t.uts.as_ref().unwrap(),
        ] {
            std::fs::write(p, "").unwrap();
        }
        let maps = [IdMap {
            container_id: 0,
            host_id: 200_000,
            size: 65536,
        }];
        pin(&maps, &maps, Some("userns-pod"), &t).expect("pin");
        let user = std::fs::metadata(&t.user).unwrap();
        for n in ["net", "ipc", "uts"] {
            let o = owner(&ns.join(n));
            assert_eq!(
                (o.dev(), o.ino()),
                (user.dev(), user.ino()),
                "{n} is owned by the pod's user namespace"
            );
        }
        // The layer: a file the host's root owns shows as owned by the namespace's root
        // mapped back, i.e. host id 200000 when seen through the idmapped mount.
        let layer = dir.path().join("layer");
        let mapped = dir.path().join("mapped");
        std::fs::create_dir(&layer).unwrap();
        std::fs::create_dir(&mapped).unwrap();
        std::fs::write(layer.join("f"), "x").unwrap();
        idmapped_mount(&layer, &mapped, &t.user, false, false).expect("idmapped mount");
        let seen = std::fs::metadata(mapped.join("f")).unwrap();
        let _ = nix::mount::umount2(&mapped, nix::mount::MntFlags::MNT_DETACH);
        for p in [
            &t.user,
            t.net.as_ref().unwrap(),
            t.ipc.as_ref().unwrap(),
            t.uts.as_ref().unwrap(),
        ] {
            let _ = nix::mount::umount2(p.as_path(), nix::mount::MntFlags::MNT_DETACH);
        }
        assert_eq!(seen.uid(), 200_000);
        assert_eq!(seen.gid(), 200_000);

        // No mappings: refused before anything is created.
        let err = pin(&[], &maps, None, &t).unwrap_err();
        assert!(err.to_string().contains("uid and gid mappings"), "{err}");
    }
}
