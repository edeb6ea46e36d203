//! Overlay snapshots: one directory per unpacked layer, keyed by the layer stack's chain ID.
//!
//! Layout under `<root>/snapshots`, in the spirit of containerd's overlayfs snapshotter:
//!
//! ```text
//! sha256/<chain hex>/fs   a committed snapshot: the layer's own files, whiteouts in overlay
//!                         form (char device 0:0, `trusted.overlay.opaque=y`)
//! staging/<random>/fs     a layer being unpacked; renamed into `sha256/` when complete
//! ```
//!
//! A snapshot appears under `sha256/` only by one atomic rename of a complete directory, so
//! `exists(chain)` never sees a half-unpacked layer; staging leftovers of a crash are removed
//! at open. Read-only views of a chain are overlay mounts with the snapshots as lowerdirs
//! (topmost first); a single layer is a read-only bind mount.

use super::digest::Digest;
use std::collections::HashSet;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {0} does not exist (the layer is not unpacked)")]
    NotFound(Digest),
    #[error("an empty layer chain cannot be mounted")]
    EmptyChain,
    #[error("snapshots: {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mounting {kind} at {}: {source}{detail}", target.display())]
    Mount {
        kind: &'static str,
        target: PathBuf,
        detail: String,
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The snapshot store.
#[derive(Debug, Clone)]
pub struct Snapshotter {
    root: PathBuf,
    committed: PathBuf,
    staging: PathBuf,
    sync_fs: bool,
}

/// A directory being filled with one layer; removed on drop unless committed.
#[derive(Debug)]
pub struct Staging {
    dir: Option<tempfile::TempDir>,
    fs: PathBuf,
}

impl Staging {
    /// The directory to unpack the layer into (it becomes the snapshot's `fs`).
    pub fn path(&self) -> &Path {
        &self.fs
    }
}

impl Snapshotter {
    /// Opens (creating if needed) `<root>/snapshots` and removes the staging directories a
    /// crash may have left.
    pub fn open(root: impl AsRef<Path>) -> Result<Self, SnapshotError> {
        let root = root.as_ref().join("snapshots");
        let committed = root.join("sha256");
        let staging = root.join("staging");
        std::fs::create_dir_all(&committed).map_err(io_err("create", &committed))?;
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(io_err("clean up", &staging))?;
        }
        std::fs::create_dir_all(&staging).map_err(io_err("create", &staging))?;
        Ok(Self {
            root,
            committed,
            staging,
            sync_fs: false,
        })
    }

    /// With `true`, [`commit`](Self::commit) calls syncfs(2) on the snapshot's filesystem
    /// before the rename, so a committed snapshot also survives a power loss intact. Off by
    /// default, like containerd's `image_pull_with_sync_fs`: unpacking writes many files and
    /// the flush costs more than the rest of the commit.
    pub fn with_sync_fs(mut self, sync_fs: bool) -> Self {
        self.sync_fs = sync_fs;
        self
    }

    /// `<root>/snapshots`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dir(&self, chain: &Digest) -> PathBuf {
        self.committed.join(chain.hex())
    }

    /// The snapshot's file tree (whether or not it exists).
    pub fn fs_path(&self, chain: &Digest) -> PathBuf {
        self.dir(chain).join("fs")
    }

    pub fn exists(&self, chain: &Digest) -> bool {
        std::fs::symlink_metadata(self.fs_path(chain)).is_ok_and(|m| m.is_dir())
    }

    /// A fresh, empty directory on the snapshots' filesystem to unpack a layer into.
    pub fn prepare(&self) -> Result<Staging, SnapshotError> {
        let dir = tempfile::Builder::new()
            .prefix("new-")
            .tempdir_in(&self.staging)
            .map_err(io_err("create staging dir in", &self.staging))?;
        let fs = dir.path().join("fs");
        std::fs::create_dir(&fs).map_err(io_err("create", &fs))?;
        std::fs::set_permissions(&fs, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(io_err("chmod", &fs))?;
        Ok(Staging { dir: Some(dir), fs })
    }

    /// Makes the staged layer the snapshot `chain`, atomically. If another unpack committed
    /// the same chain first, the staged copy is discarded and this still succeeds. Returns
    /// the snapshot's `fs` path.
    pub fn commit(&self, mut staging: Staging, chain: &Digest) -> Result<PathBuf, SnapshotError> {
        let Some(tmp) = staging.dir.take() else {
            return Err(io_err("commit", &staging.fs)(io::Error::other(
                "staging directory already consumed",
            )));
        };
        if self.sync_fs {
            let d = std::fs::File::open(tmp.path()).map_err(io_err("open", tmp.path()))?;
            nix::unistd::syncfs(&d).map_err(|e| io_err("syncfs", tmp.path())(e.into()))?;
        }
        let dest = self.dir(chain);
        match rename_noreplace(tmp.path(), &dest) {
            Ok(()) => {
                // The TempDir no longer exists under its old name; forget it.
                let _ = tmp.keep();
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ENOTEMPTY)) => {
                tracing::debug!(chain = %chain, "snapshot committed concurrently; discarding duplicate");
                drop(tmp);
                return Ok(self.fs_path(chain));
            }
            Err(e) => return Err(io_err("commit", &dest)(e)),
        }
        std::fs::File::open(&self.committed)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync", &self.committed))?;
        Ok(self.fs_path(chain))
    }

    /// Removes a snapshot (first renamed out of sight, then deleted). The caller makes sure
    /// nothing has it mounted. Returns whether it existed.
    pub fn remove(&self, chain: &Digest) -> Result<bool, SnapshotError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = self.dir(chain);
        let trash = self.staging.join(format!(
            "rm-{}-{}-{}",
            chain.hex(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::rename(&dir, &trash) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_err("remove", &dir)(e)),
        }
        std::fs::remove_dir_all(&trash).map_err(io_err("remove", &trash))?;
        Ok(true)
    }

    /// The chain IDs of all committed snapshots.
    pub fn list(&self) -> Result<Vec<Digest>, SnapshotError> {
        let mut out = Vec::new();
        let rd = std::fs::read_dir(&self.committed).map_err(io_err("list", &self.committed))?;
        for entry in rd {
            let entry = entry.map_err(io_err("list", &self.committed))?;
            if let Some(d) = entry
                .file_name()
                .to_str()
                .and_then(|n| Digest::from_hex(n).ok())
            {
                out.push(d);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Disk space (bytes of allocated blocks) and inodes used by all snapshots.
    pub fn usage(&self) -> Result<(u64, u64), SnapshotError> {
        disk_usage(&self.root).map_err(io_err("measure", &self.root))
    }

    /// Disk space and inodes of one snapshot.
    pub fn snapshot_usage(&self, chain: &Digest) -> Result<(u64, u64), SnapshotError> {
        if !self.exists(chain) {
            return Err(SnapshotError::NotFound(chain.clone()));
        }
        let dir = self.dir(chain);
        disk_usage(&dir).map_err(io_err("measure", &dir))
    }

    /// The `fs` directories of a chain (as `chain_ids(diff_ids)` lists it, bottom layer
    /// first), returned topmost first as overlayfs' lowerdir and `apply_layer`'s `parents`
    /// want them. Pure path computation: see [`exists`](Self::exists).
    pub fn lowerdirs(&self, chain_ids: &[Digest]) -> Vec<PathBuf> {
        chain_ids.iter().rev().map(|c| self.fs_path(c)).collect()
    }

    /// [`lowerdirs`](Self::lowerdirs), failing with `NotFound` for the first missing one.
    pub fn existing_lowerdirs(&self, chain_ids: &[Digest]) -> Result<Vec<PathBuf>, SnapshotError> {
        if let Some(missing) = chain_ids.iter().find(|c| !self.exists(c)) {
            return Err(SnapshotError::NotFound(missing.clone()));
        }
        Ok(self.lowerdirs(chain_ids))
    }

    /// Mounts the image's root filesystem read-only at `target` (an existing directory):
    /// an overlay of the chain's snapshots, or a read-only bind mount for a single layer.
    pub fn mount_view(
        &self,
        chain_ids: &[Digest],
        target: &Path,
    ) -> Result<MountGuard, SnapshotError> {
        let lowers = self.existing_lowerdirs(chain_ids)?;
        match lowers.as_slice() {
            [] => Err(SnapshotError::EmptyChain),
            [single] => bind_ro(single, target),
            _ => mount_overlay(&lowers, None, target),
        }
    }

    /// Mounts a writable overlay of the chain at `target`, changes going to `upper`
    /// (`work` is overlayfs' scratch directory on the same filesystem as `upper`).
    pub fn mount_rw(
        &self,
        chain_ids: &[Digest],
        upper: &Path,
        work: &Path,
        target: &Path,
    ) -> Result<MountGuard, SnapshotError> {
        let lowers = self.existing_lowerdirs(chain_ids)?;
        if lowers.is_empty() {
            return Err(SnapshotError::EmptyChain);
        }
        mount_overlay(&lowers, Some((upper, work)), target)
    }
}

fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let from = CString::new(from.as_os_str().as_bytes())?;
    let to = CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: valid NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Disk usage of a tree as du(1) counts it: allocated blocks, each inode once.
pub(super) fn disk_usage(path: &Path) -> io::Result<(u64, u64)> {
    fn walk(dir: &Path, seen: &mut HashSet<(u64, u64)>, acc: &mut (u64, u64)) -> io::Result<()> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in rd {
            let entry = entry?;
            let m = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
                continue;
            }
            acc.0 += m.blocks() * 512;
            acc.1 += 1;
            if m.is_dir() {
                walk(&entry.path(), seen, acc)?;
            }
        }
        Ok(())
    }
    let m = std::fs::symlink_metadata(path)?;
    let mut acc = (m.blocks() * 512, 1);
    walk(path, &mut HashSet::new(), &mut acc)?;
    Ok(acc)
}

/// A mount that is unmounted when dropped.
#[derive(Debug)]
pub struct MountGuard {
    target: PathBuf,
    active: bool,
}

impl MountGuard {
    /// Takes charge of a mount made elsewhere at `target`.
    pub fn adopt(target: &Path) -> MountGuard {
        MountGuard {
            target: target.to_path_buf(),
            active: true,
        }
    }

    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Unmounts now, reporting failure (drop only logs it).
    pub fn unmount(mut self) -> Result<(), SnapshotError> {
        self.active = false;
        unmount(&self.target)
    }

    /// Leaves the mount in place (for a container whose rootfs outlives this value);
    /// returns the mount point.
    pub fn keep(mut self) -> PathBuf {
        self.active = false;
        std::mem::take(&mut self.target)
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if self.active
            && let Err(e) = unmount(&self.target)
        {
            tracing::warn!(target = %self.target.display(), error = %e, "unmount failed");
        }
    }
}

/// Unmounts `target`; if it stays busy, detaches it lazily.
pub fn unmount(target: &Path) -> Result<(), SnapshotError> {
    use nix::mount::{MntFlags, umount2};
    for attempt in 0..5 {
        match umount2(target, MntFlags::empty()) {
            Ok(()) => return Ok(()),
            Err(nix::errno::Errno::EBUSY) if attempt < 4 => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(nix::errno::Errno::EBUSY) => break,
            Err(e) => {
                return Err(SnapshotError::Mount {
                    kind: "(unmount)",
                    target: target.to_path_buf(),
                    detail: String::new(),
                    source: e.into(),
                });
            }
        }
    }
    umount2(target, MntFlags::MNT_DETACH).map_err(|e| SnapshotError::Mount {
        kind: "(lazy unmount)",
        target: target.to_path_buf(),
        detail: String::new(),
        source: e.into(),
    })
}

fn bind_ro(source: &Path, target: &Path) -> Result<MountGuard, SnapshotError> {
    use nix::mount::{MsFlags, mount};
    let err = |e: nix::errno::Errno| SnapshotError::Mount {
        kind: "read-only bind",
        target: target.to_path_buf(),
        detail: format!(" (source {})", source.display()),
        source: e.into(),
    };
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(err)?;
    let guard = MountGuard {
        target: target.to_path_buf(),
        active: true,
    };
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(err)?;
    Ok(guard)
}

/// Whether overlayfs has the `index` feature, which containerd turns off (`index=off`) so
/// an upper directory can later be mounted over different lower paths.
fn overlay_has_index() -> bool {
    Path::new("/sys/module/overlay/parameters/index").exists()
}

/// Mounts an overlay of `lowers` (topmost first), writable if `upper_work` is given.
///
/// Uses the new mount API (fsopen/fsconfig with one `lowerdir+` per layer, Linux ≥ 6.8), which
/// has no limit on the number or length of lower paths; older kernels get mount(2) with a
/// `lowerdir=a:b:c` option string, limited to one page.
///
/// The layer paths are handed to the kernel relative to a [`LayerBase`] (the container's
/// layer directory: `upperdir=upper,workdir=work,lowerdir+=../../snapshots/…`). The kernel
/// keeps an overlay's options as they were given and renders them again on every read of
/// `/proc/self/mountinfo`, which runc does four times per container it starts: with absolute
/// paths a pod's overlay line was 650 bytes, the longest of the node's table by far. The
/// legacy option string gets shorter too, so more layers fit in its page (containerd makes
/// its long lowerdir lists relative for that reason).
pub fn mount_overlay(
    lowers: &[PathBuf],
    upper_work: Option<(&Path, &Path)>,
    target: &Path,
) -> Result<MountGuard, SnapshotError> {
    use std::sync::atomic::AtomicBool;
    // Once the kernel turned `lowerdir+` down, ask it no more: each refusal is a line in
    // its log.
    static LEGACY: AtomicBool = AtomicBool::new(false);
    let target = if target.is_absolute() {
        target.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(io_err("resolving the mount target", target))?
            .join(target)
    };
    let base = LayerBase::of(lowers, upper_work);
    let rel_lowers: Vec<PathBuf> = lowers.iter().map(|l| base.relative(l)).collect();
    let rel_upper_work = upper_work.map(|(u, w)| (base.relative(u), base.relative(w)));
    let mount = move || {
        let upper_work = rel_upper_work
            .as_ref()
            .map(|(u, w)| (u.as_path(), w.as_path()));
        if LEGACY.load(Ordering::Relaxed) {
            return mount_overlay_legacy(&rel_lowers, upper_work, &target);
        }
        match mount_overlay_fsconfig(&rel_lowers, upper_work, &target) {
            Ok(g) => Ok(g),
            Err(FsconfigError::Unsupported) => {
                let g = mount_overlay_legacy(&rel_lowers, upper_work, &target)?;
                LEGACY.store(true, Ordering::Relaxed);
                Ok(g)
            }
            Err(FsconfigError::Failed(e)) => Err(e),
        }
    };
    base.run(mount).map_err(|e| base.explain(e))
}

/// The directory an overlay's layer paths are given relative to: of the parent of `upper`
/// and `work` and the lowers' deepest common ancestor, the one that makes the options
/// shortest. `None` (paths as given) when there is nothing to shorten or a path is not
/// absolute.
///
/// The kernel resolves `..` physically. The steps up lead only through directories the
/// runtime made itself (`layers/<id>`, `snapshots/sha256/<chain>`) to the root they share; a
/// symlink put in their place would make the mount fail with ENOENT, the error naming the
/// base, rather than mount something else.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LayerBase(Option<PathBuf>);

impl LayerBase {
    fn of(lowers: &[PathBuf], upper_work: Option<(&Path, &Path)>) -> LayerBase {
        let all_absolute = lowers.iter().all(|l| l.is_absolute())
            && upper_work.is_none_or(|(u, w)| u.is_absolute() && w.is_absolute());
        if !all_absolute {
            return LayerBase(None);
        }
        let lowers_ancestor = lowers.iter().skip(1).fold(
            lowers
                .first()
                .and_then(|l| l.parent())
                .map(Path::to_path_buf),
            |acc, l| acc.map(|a| common_ancestor(&a, l)),
        );
        let upper_parent =
            upper_work.and_then(|(u, w)| u.parent().filter(|p| Some(*p) == w.parent()));
        let paths: Vec<&Path> = lowers
            .iter()
            .map(PathBuf::as_path)
            .chain(upper_work.into_iter().flat_map(|(u, w)| [u, w]))
            .collect();
        // Of the two, the one that makes the options shortest: the upper's parent for an
        // image of a few layers, the snapshots' directory for one of many.
        [upper_parent.map(Path::to_path_buf), lowers_ancestor]
            .into_iter()
            .flatten()
            .filter(|b| b.parent().is_some())
            .map(|b| LayerBase(Some(b)))
            .min_by_key(|base| {
                paths
                    .iter()
                    .map(|p| base.relative(p).as_os_str().len())
                    .sum::<usize>()
            })
            .unwrap_or(LayerBase(None))
    }

    /// `path` relative to the base (`..` where it leaves it).
    fn relative(&self, path: &Path) -> PathBuf {
        let Some(base) = &self.0 else {
            return path.to_path_buf();
        };
        let common = common_ancestor(base, path);
        let ups = base.components().count() - common.components().count();
        let mut rel = PathBuf::new();
        for _ in 0..ups {
            rel.push("..");
        }
        rel.push(path.strip_prefix(&common).unwrap_or(path));
        if rel.as_os_str().is_empty() {
            rel.push(".");
        }
        rel
    }

    /// Runs `f` where relative layer paths resolve: on a thread of its own whose working
    /// directory is the base (the process's is shared by all its threads, so it is never
    /// changed).
    fn run(
        &self,
        f: impl FnOnce() -> Result<MountGuard, SnapshotError> + Send,
    ) -> Result<MountGuard, SnapshotError> {
        let Some(base) = &self.0 else {
            return f();
        };
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("nodus-overlay".into())
                .spawn_scoped(s, || {
                    nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS).map_err(|e| {
                        io_err("unsharing the working directory for", base)(e.into())
                    })?;
                    std::env::set_current_dir(base)
                        .map_err(io_err("entering the layer directory", base))?;
                    f()
                })
                .map_err(io_err("starting a thread to mount an overlay in", base))?
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Names the base in a mount error, whose paths are relative to it.
    fn explain(&self, e: SnapshotError) -> SnapshotError {
        match (e, &self.0) {
            (
                SnapshotError::Mount {
                    kind,
                    target,
                    detail,
                    source,
                },
                Some(base),
            ) => SnapshotError::Mount {
                kind,
                target,
                detail: format!("{detail} (layer paths relative to {})", base.display()),
                source,
            },
            (e, _) => e,
        }
    }
}

fn common_ancestor(a: &Path, b: &Path) -> PathBuf {
    a.components()
        .zip(b.components())
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x)
        .collect()
}

enum FsconfigError {
    Unsupported,
    Failed(SnapshotError),
}

const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

fn cstr(p: &[u8]) -> io::Result<CString> {
    CString::new(p).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The messages the kernel queued on an fs context (`e overlay: ...`), for error reports.
fn fs_context_messages(fd: &OwnedFd) -> String {
    let mut out = String::new();
    let mut buf = [0u8; 1024];
    for _ in 0..16 {
        // SAFETY: reading into a local buffer.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        let msg = String::from_utf8_lossy(&buf[..n as usize]);
        out.push_str(" [");
        out.push_str(msg.trim());
        out.push(']');
    }
    out
}

fn mount_overlay_fsconfig(
    lowers: &[PathBuf],
    upper_work: Option<(&Path, &Path)>,
    target: &Path,
) -> Result<MountGuard, FsconfigError> {
    let kind = if upper_work.is_some() {
        "overlay"
    } else {
        "read-only overlay"
    };
    let fail = |source: io::Error, detail: String| {
        FsconfigError::Failed(SnapshotError::Mount {
            kind,
            target: target.to_path_buf(),
            detail,
            source,
        })
    };
    let fstype = c"overlay";
    // SAFETY: plain syscalls with valid NUL-terminated strings; returned fds are owned.
    let fsfd = match check(unsafe {
        libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC)
    }) {
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd as i32) },
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => return Err(FsconfigError::Unsupported),
        Err(e) => return Err(fail(e, " (fsopen)".into())),
    };
    let set = |key: &std::ffi::CStr, value: &[u8]| -> io::Result<()> {
        let value = cstr(value)?;
        check(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fsfd.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        })
        .map(drop)
    };
    for (i, lower) in lowers.iter().enumerate() {
        if let Err(e) = set(c"lowerdir+", lower.as_os_str().as_bytes()) {
            if i == 0 && e.raw_os_error() == Some(libc::EINVAL) {
                // A kernel before 6.8 does not know `lowerdir+`.
                return Err(FsconfigError::Unsupported);
            }
            let detail = format!(
                " (lowerdir {}){}",
                lower.display(),
                fs_context_messages(&fsfd)
            );
            return Err(fail(e, detail));
        }
    }
    if let Some((upper, work)) = upper_work {
        for (key, value) in [(c"upperdir", upper), (c"workdir", work)] {
            set(key, value.as_os_str().as_bytes()).map_err(|e| {
                let detail = format!(
                    " ({} {}){}",
                    key.to_string_lossy(),
                    value.display(),
                    fs_context_messages(&fsfd)
                );
                fail(e, detail)
            })?;
        }
        if overlay_has_index() {
            set(c"index", b"off").map_err(|e| fail(e, fs_context_messages(&fsfd)))?;
        }
    }
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fsfd.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_char>(),
            0,
        )
    })
    .map_err(|e| {
        // Before 6.5 overlayfs had no fs_context of its own: the kernel's legacy context
        // accepted `lowerdir+` as text and only the create refuses it. mount(2) with one
        // option string then decides (and reports a genuine EINVAL itself).
        if e.raw_os_error() == Some(libc::EINVAL) {
            return FsconfigError::Unsupported;
        }
        fail(e, fs_context_messages(&fsfd))
    })?;
    let attrs = if upper_work.is_some() {
        0
    } else {
        MOUNT_ATTR_RDONLY
    };
    let mfd = check(unsafe {
        libc::syscall(libc::SYS_fsmount, fsfd.as_raw_fd(), FSMOUNT_CLOEXEC, attrs)
    })
    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd as i32) })
    .map_err(|e| fail(e, fs_context_messages(&fsfd)))?;
    let target_c = cstr(target.as_os_str().as_bytes()).map_err(|e| fail(e, String::new()))?;
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mfd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target_c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
    .map_err(|e| fail(e, " (move_mount)".into()))?;
    Ok(MountGuard {
        target: target.to_path_buf(),
        active: true,
    })
}

fn mount_overlay_legacy(
    lowers: &[PathBuf],
    upper_work: Option<(&Path, &Path)>,
    target: &Path,
) -> Result<MountGuard, SnapshotError> {
    use nix::mount::{MsFlags, mount};
    let kind = if upper_work.is_some() {
        "overlay"
    } else {
        "read-only overlay"
    };
    let fail = |source: io::Error, detail: String| SnapshotError::Mount {
        kind,
        target: target.to_path_buf(),
        detail,
        source,
    };
    let mut opts = Vec::<u8>::from(&b"lowerdir="[..]);
    for (i, lower) in lowers.iter().enumerate() {
        let b = lower.as_os_str().as_bytes();
        if b.iter().any(|c| matches!(c, b':' | b',')) {
            return Err(fail(
                io::Error::from(io::ErrorKind::InvalidInput),
                format!(" (path {} contains ':' or ',')", lower.display()),
            ));
        }
        if i > 0 {
            opts.push(b':');
        }
        opts.extend_from_slice(b);
    }
    let mut flags = MsFlags::empty();
    if let Some((upper, work)) = upper_work {
        opts.extend_from_slice(b",upperdir=");
        opts.extend_from_slice(upper.as_os_str().as_bytes());
        opts.extend_from_slice(b",workdir=");
        opts.extend_from_slice(work.as_os_str().as_bytes());
        if overlay_has_index() {
            opts.extend_from_slice(b",index=off");
        }
    } else {
        flags |= MsFlags::MS_RDONLY;
    }
    // The kernel copies at most one page of mount data.
    if opts.len() >= 4096 {
        return Err(fail(
            io::Error::from(io::ErrorKind::InvalidInput),
            format!(
                " ({} layers make a {}-byte option string, over this kernel's one-page limit)",
                lowers.len(),
                opts.len()
            ),
        ));
    }
    let data = std::ffi::OsStr::from_bytes(&opts);
    mount(Some("overlay"), target, Some("overlay"), flags, Some(data))
        .map_err(|e| fail(e.into(), String::new()))?;
    Ok(MountGuard {
        target: target.to_path_buf(),
        active: true,
    })
}

#[cfg(test)]
mod tests {
    use super::super::digest::chain_ids;
    use super::super::unpack::{Compression, apply_layer, testutil::Layer};
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    /// The node's mount table's entry for `target`, if it is a mount point.
    fn mount_of(target: &Path) -> Option<nodus_cgroups::mountinfo::Mount> {
        let target = std::fs::canonicalize(target).unwrap();
        nodus_cgroups::mountinfo::read_self()
            .unwrap()
            .into_iter()
            .find(|m| m.mount_point == target)
    }

    fn is_mounted(target: &Path) -> bool {
        mount_of(target).is_some()
    }

    /// Unpacks `layers` as a chain; returns the chain IDs.
    fn unpack_chain(s: &Snapshotter, layers: &[Vec<u8>]) -> Vec<Digest> {
        let mut diff_ids = Vec::new();
        for tar in layers {
            let parents = s.lowerdirs(&chain_ids(&diff_ids));
            let staging = s.prepare().unwrap();
            let stats = apply_layer(&tar[..], Compression::None, staging.path(), &parents).unwrap();
            diff_ids.push(stats.diff_id);
            let chain = chain_ids(&diff_ids).pop().unwrap();
            assert!(!s.exists(&chain));
            s.commit(staging, &chain).unwrap();
            assert!(s.exists(&chain));
        }
        chain_ids(&diff_ids)
    }

    /// A store holding the first of [`three_layers`], and an empty `mnt` directory.
    fn one_layer_and_a_mount_point() -> (tempfile::TempDir, Snapshotter, Vec<Digest>, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let s = Snapshotter::open(root.path()).unwrap();
        let chain = unpack_chain(&s, &three_layers()[..1]);
        let mnt = root.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        (root, s, chain, mnt)
    }

    fn three_layers() -> Vec<Vec<u8>> {
        vec![
            Layer::new()
                .dir("etc")
                .file("etc/passwd", b"root")
                .file("etc/shadow", b"secret")
                .dir("a")
                .file("a/file1", b"one")
                .file("a/file2", b"two")
                .dir("d")
                .file("d/x", b"x")
                .file("d/y", b"y")
                .file("keep", b"k")
                .build(),
            Layer::new()
                .dir("a")
                .whiteout("a/file1")
                .dir("etc")
                .whiteout("etc/shadow")
                .dir("d")
                .opaque("d")
                .file("d/z", b"z")
                .build(),
            Layer::new().dir("a").file("a/file1", b"one again").build(),
        ]
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn whiteouts_hide_lower_files_in_a_mounted_view() {
        let root = tempfile::tempdir().unwrap();
        let s = Snapshotter::open(root.path()).unwrap();
        let chain = unpack_chain(&s, &three_layers());
        assert_eq!(s.list().unwrap(), {
            let mut c = chain.clone();
            c.sort();
            c
        });
        let lowers = s.lowerdirs(&chain);
        assert_eq!(lowers[0], s.fs_path(&chain[2]), "topmost first");
        assert_eq!(lowers[2], s.fs_path(&chain[0]));

        let mnt = root.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        {
            let _view = s.mount_view(&chain, &mnt).unwrap();
            assert!(is_mounted(&mnt));
            assert_eq!(std::fs::read(mnt.join("a/file1")).unwrap(), b"one again");
            assert_eq!(std::fs::read(mnt.join("a/file2")).unwrap(), b"two");
            assert_eq!(std::fs::read(mnt.join("etc/passwd")).unwrap(), b"root");
            assert!(!mnt.join("etc/shadow").exists());
            assert_eq!(names(&mnt.join("d")), ["z"]);
            assert_eq!(names(&mnt), ["a", "d", "etc", "keep"]);
            let e = std::fs::write(mnt.join("new"), b"x").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EROFS));
        }
        assert!(!is_mounted(&mnt), "unmounted on drop");

        // Two layers: file1 deleted and not yet re-added.
        let g = s.mount_view(&chain[..2], &mnt).unwrap();
        assert!(!mnt.join("a/file1").exists());
        assert_eq!(names(&mnt.join("a")), ["file2"]);
        g.unmount().unwrap();
        assert!(!is_mounted(&mnt));

        // One layer: a read-only bind mount.
        let g = s.mount_view(&chain[..1], &mnt).unwrap();
        assert_eq!(std::fs::read(mnt.join("a/file1")).unwrap(), b"one");
        assert_eq!(names(&mnt.join("d")), ["x", "y"]);
        let e = std::fs::write(mnt.join("new"), b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS));
        drop(g);
        assert!(!is_mounted(&mnt));

        // From 6.8 the new mount API is what the kernel uses (no silent fallback); before,
        // the create step refuses `lowerdir+` and mount(2) takes over.
        let release = nix::sys::utsname::uname().unwrap();
        let release = release.release().to_string_lossy().into_owned();
        let mut v = release
            .split(|c: char| !c.is_ascii_digit())
            .map(|n| n.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        let fsconfig = mount_overlay_fsconfig(&lowers, None, &mnt);
        if (major, minor) >= (6, 8) {
            assert!(fsconfig.is_ok(), "kernel {release}");
        } else {
            assert!(
                matches!(fsconfig, Err(FsconfigError::Unsupported)),
                "kernel {release}"
            );
        }
        drop(fsconfig);
        assert!(!is_mounted(&mnt));
        // The legacy mount(2) path gives the same view.
        let g = mount_overlay_legacy(&lowers, None, &mnt).unwrap();
        assert_eq!(std::fs::read(mnt.join("a/file1")).unwrap(), b"one again");
        assert!(!mnt.join("etc/shadow").exists());
        drop(g);
        assert!(!is_mounted(&mnt));

        assert!(matches!(
            s.mount_view(&[], &mnt),
            Err(SnapshotError::EmptyChain)
        ));
        let missing = Digest::of(b"missing");
        assert!(matches!(
            s.mount_view(&[chain[0].clone(), missing.clone()], &mnt),
            Err(SnapshotError::NotFound(d)) if d == missing
        ));
    }

    #[test]
    fn writable_mount_records_changes_in_upper() {
        let root = tempfile::tempdir().unwrap();
        let s = Snapshotter::open(root.path()).unwrap();
        let chain = unpack_chain(&s, &three_layers());
        let (upper, work, mnt) = (
            root.path().join("upper"),
            root.path().join("work"),
            root.path().join("mnt"),
        );
        for d in [&upper, &work, &mnt] {
            std::fs::create_dir(d).unwrap();
        }
        let g = s.mount_rw(&chain, &upper, &work, &mnt).unwrap();
        // The node's mount table shows the layers as relative paths, the shortest set.
        let options = mount_of(&mnt).expect("mounted").super_options;
        // `lowerdir+=a/fs,lowerdir+=b/fs` from fsconfig, `lowerdir=a/fs:b/fs` from mount(2)
        // on a kernel before 6.8.
        let lowers: Vec<&str> = options
            .split(',')
            .filter_map(|o| o.strip_prefix("lowerdir+=").or(o.strip_prefix("lowerdir=")))
            .flat_map(|l| l.split(':'))
            .collect();
        let want: Vec<String> = chain
            .iter()
            .rev()
            .map(|c| format!("{}/fs", c.hex()))
            .collect();
        assert_eq!(lowers, want, "{options}");
        assert!(
            options.contains(",upperdir=../../upper,workdir=../../work"),
            "{options}"
        );
        assert!(
            !options.contains(root.path().to_str().unwrap()),
            "{options}"
        );
        std::fs::write(mnt.join("created"), b"c").unwrap();
        std::fs::remove_file(mnt.join("a/file2")).unwrap();
        drop(g);
        assert!(!is_mounted(&mnt));
        assert_eq!(std::fs::read(upper.join("created")).unwrap(), b"c");
        let wh = std::fs::symlink_metadata(upper.join("a/file2")).unwrap();
        assert!(wh.file_type().is_char_device());
        // The snapshot itself is untouched.
        assert_eq!(
            std::fs::read(s.fs_path(&chain[0]).join("a/file2")).unwrap(),
            b"two"
        );
    }

    #[test]
    fn a_failed_mount_names_the_directory_its_layer_paths_are_relative_to() {
        let (root, s, chain, mnt) = one_layer_and_a_mount_point();
        let layer = root.path().join("layers/c1");
        std::fs::create_dir_all(layer.join("upper")).unwrap();
        // No work directory.
        let e = s
            .mount_rw(&chain, &layer.join("upper"), &layer.join("work"), &mnt)
            .unwrap_err()
            .to_string();
        let base = root.path().join("snapshots/sha256").join(chain[0].hex());
        // fsconfig names the option it refused; mount(2), on a kernel before 6.8, cannot.
        assert!(
            e.contains("No such file or directory")
                && e.contains(&format!("layer paths relative to {}", base.display())),
            "{e}"
        );
        assert!(!is_mounted(&mnt));
    }

    #[test]
    fn layer_paths_are_given_relative_to_the_upper_parent_or_the_lowers_ancestor() {
        let p = |s: &str| PathBuf::from(s);
        // Names as long as the node's: 64 hex digits.
        let hex = |s: &str| format!("{s:0>64}");
        let snap = |h: &str| p(&format!("/var/lib/nodus/snapshots/sha256/{}/fs", hex(h)));
        let layer = p(&format!("/var/lib/nodus/layers/{}", hex("c1")));
        let (upper, work) = (layer.join("upper"), layer.join("work"));
        let rw = LayerBase::of(&[snap("aa"), snap("bb")], Some((&upper, &work)));
        assert_eq!(rw, LayerBase(Some(layer.clone())));
        // Many layers: the snapshots' directory makes the shorter options.
        let many: Vec<PathBuf> = (0..12).map(|i| snap(&format!("{i:02}"))).collect();
        let snaps = p("/var/lib/nodus/snapshots/sha256");
        assert_eq!(
            LayerBase::of(&many, Some((&upper, &work))),
            LayerBase(Some(snaps.clone()))
        );
        assert_eq!(
            LayerBase(Some(snaps)).relative(&upper),
            p(&format!("../../layers/{}/upper", hex("c1")))
        );
        for (path, want) in [
            (&upper, "upper"),
            (&work, "work"),
            (
                &snap("aa"),
                &format!("../../snapshots/sha256/{}/fs", hex("aa")),
            ),
            (&layer, "."),
        ] {
            assert_eq!(rw.relative(path), p(want), "{}", path.display());
        }
        let ro = LayerBase::of(&[snap("aa"), snap("bb")], None);
        assert_eq!(ro, LayerBase(Some(p("/var/lib/nodus/snapshots/sha256"))));
        assert_eq!(ro.relative(&snap("bb")), p(&format!("{}/fs", hex("bb"))));
        assert_eq!(
            LayerBase::of(&[snap("aa")], None).relative(&snap("aa")),
            p("fs")
        );
        // Upper and work apart: relative to the lower's directory.
        let apart = LayerBase::of(&[snap("aa")], Some((&upper, &p("/var/lib/nodus/w"))));
        assert_eq!(apart, LayerBase(snap("aa").parent().map(Path::to_path_buf)));
        // Nothing to shorten, or paths that are not absolute: given as they are.
        for base in [
            LayerBase::of(&[p("/a/fs"), p("/b/fs")], None),
            LayerBase::of(&[p("rel/fs")], Some((&upper, &work))),
        ] {
            assert_eq!(base, LayerBase(None));
            assert_eq!(base.relative(&upper), upper);
        }
    }

    #[test]
    fn a_mount_is_released_when_a_test_panics() {
        let (_root, s, chain, mnt) = one_layer_and_a_mount_point();
        let r = std::panic::catch_unwind(|| {
            let _g = s.mount_view(&chain, &mnt).unwrap();
            panic!("boom");
        });
        assert!(r.is_err());
        assert!(!is_mounted(&mnt));
    }

    #[test]
    fn commit_races_remove_list_usage_and_crash_leftovers() {
        let root = tempfile::tempdir().unwrap();
        let s = Snapshotter::open(root.path()).unwrap();
        let chain = Digest::of(b"chain");
        let a = s.prepare().unwrap();
        let b = s.prepare().unwrap();
        assert_ne!(a.path(), b.path());
        std::fs::write(a.path().join("f"), b"a").unwrap();
        std::fs::write(b.path().join("f"), b"b").unwrap();
        let b_path = b.path().to_path_buf();
        let p = s.commit(a, &chain).unwrap();
        assert_eq!(p, s.fs_path(&chain));
        // The loser of the race succeeds and its copy is gone.
        assert_eq!(s.commit(b, &chain).unwrap(), p);
        assert!(!b_path.exists());
        assert_eq!(std::fs::read(p.join("f")).unwrap(), b"a");
        assert_eq!(s.list().unwrap(), std::slice::from_ref(&chain));
        let (bytes, inodes) = s.usage().unwrap();
        assert!(bytes > 0 && inodes >= 3, "{bytes} {inodes}");
        let (_, one) = s.snapshot_usage(&chain).unwrap();
        assert_eq!(one, 3, "dir, fs, f");

        // A dropped staging directory cleans up after itself.
        let c = s.prepare().unwrap();
        let c_path = c.path().to_path_buf();
        drop(c);
        assert!(!c_path.exists());

        // Leftovers of a crash are removed at open.
        let leftover = s.prepare().unwrap();
        let leftover_path = leftover.path().to_path_buf();
        std::mem::forget(leftover);
        assert!(leftover_path.exists());
        let s = Snapshotter::open(root.path()).unwrap();
        assert!(!leftover_path.exists());
        assert!(s.exists(&chain));

        assert!(s.remove(&chain).unwrap());
        assert!(!s.remove(&chain).unwrap());
        assert!(!s.exists(&chain));
        assert!(s.list().unwrap().is_empty());
        assert_eq!(
            names(&root.path().join("snapshots/staging")),
            Vec::<String>::new()
        );
    }
}
