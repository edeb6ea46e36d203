//! The runtime's `--state-dir`: what dies with the host (sandbox namespace pins and files,
//! OCI bundles, shim sockets and pid files, the OCI runtimes' own state), kept in memory.
//!
//! containerd's `state` directory and CRI-O's run root are volatile by design and live on
//! `/run`, which a systemd host mounts as tmpfs. A host whose `/run` is an ordinary disk
//! directory would otherwise put each pod's dozen small files on disk and remove them again
//! when it goes; on ext4 without a journal, every new inode then walks past the inodes freed
//! in the last minute (`recently_deleted`), so a burst of pods after another burst's removal
//! spent a third of the daemon's CPU in the inode allocator. So the daemon mounts a tmpfs
//! there itself when the directory is not already in memory — but only over an empty
//! directory: state written on disk by an earlier runtime (whose containers may still run)
//! stays where it is, and is used as it is.
//!
//! The mount is the daemon's and stays when it stops, as `/run` does: a restarted daemon
//! finds its state on it. No `nosuid`/`nodev`: files bind-mounted from it into user-namespaced
//! containers would carry those as locked flags that the container's own mount options could
//! then not clear.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use nix::sys::statfs::{FsType, TMPFS_MAGIC, statfs};

/// linux/magic.h's RAMFS_MAGIC, which nix does not name.
const RAMFS_MAGIC: FsType = FsType(0x8584_58f6);

/// Where [`prepare`] left the state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateDir {
    /// Already on tmpfs or ramfs (`/run` on a systemd host, or our own mount from before).
    InMemory,
    /// Empty and on disk: a tmpfs is now mounted on it.
    Mounted,
    /// On disk and holding an earlier runtime's state: left as it is.
    OnDisk,
}

fn in_memory(dir: &Path) -> nix::Result<bool> {
    let t = statfs(dir)?.filesystem_type();
    Ok(t == TMPFS_MAGIC || t == RAMFS_MAGIC)
}

/// Creates `dir` if needed and makes sure it is in memory (see the module doc).
pub fn prepare(dir: &Path) -> Result<StateDir, String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("creating state dir {}: {e}", dir.display()))?;
    let statfs_err = |e| format!("statfs {}: {e}", dir.display());
    if in_memory(dir).map_err(statfs_err)? {
        return Ok(StateDir::InMemory);
    }
    let empty = std::fs::read_dir(dir)
        .map_err(|e| format!("reading state dir {}: {e}", dir.display()))?
        .next()
        .is_none();
    if !empty {
        return Ok(StateDir::OnDisk);
    }
    // The tmpfs keeps the directory's own permissions: user-namespaced containers' runc
    // init walks through it to their rootfs as an unprivileged host uid.
    let mode = std::fs::metadata(dir)
        .map_err(|e| format!("stat {}: {e}", dir.display()))?
        .permissions()
        .mode()
        & 0o7777;
    nix::mount::mount(
        Some("nodus-state"),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some(format!("mode={mode:o}").as_str()),
    )
    .map_err(|e| format!("mounting a tmpfs on the state dir {}: {e}", dir.display()))?;
    Ok(StateDir::Mounted)
}

/// Unmounts the tmpfs [`prepare`] just mounted unless [`keep`](Self::keep) is called: a
/// daemon that fails to start leaves the host as it found it (the state dir is empty then,
/// nothing has run).
pub struct MountedHere(Option<std::path::PathBuf>);

impl MountedHere {
    pub fn new(dir: &Path, outcome: StateDir) -> MountedHere {
        MountedHere((outcome == StateDir::Mounted).then(|| dir.to_path_buf()))
    }

    /// The daemon is up: the mount stays, as `/run` does.
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for MountedHere {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take()
            && let Err(e) = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH)
        {
            tracing::warn!(state = %dir.display(), error = %e, "cannot unmount the state dir's tmpfs");
        }
    }
}

/// The directory of the sandbox or container `id` under `parent`: named by the ID's first
/// 16 characters, or by the whole ID when another entry has those already.
///
/// Each pod's namespace pins and `/dev/shm`, and each container's root filesystem, are mount
/// points below these directories, so their paths are lines of the node's mount table, which
/// the kernel renders again on every read of `/proc/self/mountinfo` (runc reads it four
/// times per container it starts). The whole 64-digit ID made five of a pod's six lines 48
/// bytes longer. A prefix of 64 random bits is as unique as a node needs (crictl shows 13
/// digits), and the record keeps the directory, so nothing derives it from the ID again.
pub(crate) fn entry_dir(parent: &Path, id: &str) -> std::path::PathBuf {
    const SHORT: usize = 16;
    let short = id.get(..SHORT).unwrap_or(id);
    let dir = parent.join(short);
    if short.len() < id.len() && std::fs::symlink_metadata(&dir).is_ok() {
        return parent.join(id);
    }
    dir
}

#[cfg(test)]
mod tests {
    #[test]
    fn entry_dirs_are_named_by_an_id_prefix_unless_it_is_taken() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = ("0123456789abcdef0000", "0123456789abcdef1111");
        let first = super::entry_dir(d.path(), a);
        assert_eq!(first, d.path().join("0123456789abcdef"));
        std::fs::create_dir(&first).unwrap();
        assert_eq!(super::entry_dir(d.path(), b), d.path().join(b));
        assert_eq!(super::entry_dir(d.path(), "short"), d.path().join("short"));
    }

    use super::*;

    fn mounted(dir: &Path) -> bool {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(dir.to_str().unwrap()))
    }

    #[test]
    fn an_empty_disk_dir_gets_a_tmpfs_and_state_on_disk_is_left_alone() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (mount): skipped");
            return;
        }
        let base = tempfile::tempdir().unwrap();
        if in_memory(base.path()).unwrap() {
            eprintln!("the temp dir is already in memory: nothing to show");
            return;
        }
        let dir = base.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(prepare(&dir).unwrap(), StateDir::Mounted);
        let guard = MountedHere::new(&dir, StateDir::Mounted);
        assert!(mounted(&dir));
        assert!(in_memory(&dir).unwrap());
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777,
            0o711
        );
        // A second start (a restarted daemon) finds it in memory and mounts nothing more.
        std::fs::write(dir.join("shim.pid"), "1").unwrap();
        assert_eq!(prepare(&dir).unwrap(), StateDir::InMemory);
        // A start that fails after mounting takes its tmpfs away again.
        drop(guard);
        assert!(!mounted(&dir));

        // An earlier runtime's state on disk is used where it is.
        let old = base.path().join("old");
        std::fs::create_dir_all(old.join("containers")).unwrap();
        assert_eq!(prepare(&old).unwrap(), StateDir::OnDisk);
        assert!(!mounted(&old));
        assert!(old.join("containers").is_dir());
    }
}
