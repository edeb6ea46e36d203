//! `/proc/<pid>/mountinfo` (proc(5)), parsed in one place: cgroup detection reads its
//! cgroup mounts, the runtime its mount points and propagation, the test kit what to unmount.
//!
//! Reading it is not free: the kernel renders and escapes every mount of the namespace on
//! each read (an overlay's long `lowerdir=` list included), so its cost grows with every
//! running container. [`mounts_under`] answers the common question "what is mounted below
//! this directory" without it.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of mountinfo, the fields nodus reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The mount point (field 5), unescaped.
    pub mount_point: PathBuf,
    /// The optional fields (`shared:N`, `master:N`, `propagate_from:N`, `unbindable`).
    pub optional: Vec<String>,
    /// The filesystem type after the separator (`cgroup`, `cgroup2`, `overlay`, …).
    pub fs_type: String,
    /// The per-superblock options (for cgroup v1, the controllers).
    pub super_options: String,
}

/// Parses mountinfo text; lines that are not mountinfo are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let (pre, post) = line.split_once(" - ")?;
    let fields: Vec<&str> = pre.split(' ').collect();
    if fields.len() < 6 {
        return None;
    }
    let mut post = post.split(' ');
    let fs_type = post.next()?.to_string();
    let super_options = post.nth(1).unwrap_or_default().to_string();
    Some(Mount {
        mount_point: PathBuf::from(unescape(fields[4])),
        optional: fields[6..].iter().map(|s| s.to_string()).collect(),
        fs_type,
        super_options,
    })
}

/// This process's mounts.
pub fn read_self() -> io::Result<Vec<Mount>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// Undoes the kernel's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
pub fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') as u32 * 64
                + (bytes[i + 2] - b'0') as u32 * 8
                + (bytes[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points at or below `dir` in this process's mount namespace, deepest first (the
/// order to unmount them in). A mount hidden under another mount is found once the upper
/// one is gone, so callers unmount and ask again until this is empty.
///
/// Walks `dir` and asks statx(2) whether each entry is the root of a mount, never
/// descending into a mount; so it costs one system call per entry of a small directory
/// tree instead of a read of every mount on the host. A tree larger than `limit` entries,
/// or a kernel without `STATX_ATTR_MOUNT_ROOT` (before 5.8), falls back to mountinfo.
pub fn mounts_under(dir: &Path) -> io::Result<Vec<PathBuf>> {
    const LIMIT: usize = 4096;
    match walk(dir, LIMIT) {
        Ok(Some(mut points)) => {
            sort_deepest_first(&mut points);
            Ok(points)
        }
        Ok(None) => from_mountinfo(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

fn from_mountinfo(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut points: Vec<PathBuf> = read_self()?
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    sort_deepest_first(&mut points);
    Ok(points)
}

fn sort_deepest_first(points: &mut Vec<PathBuf>) {
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
}

/// Whether `path` is the root of a mount (statx(2), or mountinfo on kernels before 5.8).
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    match is_mount_root(path)? {
        Some(root) => Ok(root),
        None => Ok(read_self()?.iter().any(|m| m.mount_point == path)),
    }
}

/// Whether `path` is the root of a mount; None when the kernel cannot say.
fn is_mount_root(path: &Path) -> io::Result<Option<bool>> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statx writes only into `st`, which lives for the call.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT,
            0,
            &mut st,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if st.stx_attributes_mask & bit == 0 {
        return Ok(None);
    }
    Ok(Some(st.stx_attributes & bit != 0))
}

/// The mount points at or below `dir`; None to fall back to mountinfo.
fn walk(dir: &Path, limit: usize) -> io::Result<Option<Vec<PathBuf>>> {
    let mut points = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(p) = todo.pop() {
        seen += 1;
        if seen > limit {
            return Ok(None);
        }
        let root = match is_mount_root(&p) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(None),
            // Gone meanwhile (a racing removal): nothing mounted there.
            Err(e) if e.kind() == io::ErrorKind::NotFound && p != dir => continue,
            Err(e) => return Err(e),
        };
        if root {
            points.push(p);
            continue;
        }
        let meta = std::fs::symlink_metadata(&p)?;
        if !meta.is_dir() {
            continue;
        }
        let entries = match std::fs::read_dir(&p) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            todo.push(entry?.path());
        }
    }
    Ok(Some(points))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_parsed_and_unescaped() {
        let text = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
31 23 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
40 22 0:4 net:[4026532] /run/nodus/sandboxes/a\\040b/ns/net rw master:3 propagate_from:1 - nsfs nsfs rw
not a mountinfo line
";
        let m = parse(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].mount_point, PathBuf::from("/proc"));
        assert!(m[0].optional.is_empty());
        assert_eq!(m[1].fs_type, "cgroup");
        assert_eq!(m[1].super_options, "rw,cpu,cpuacct");
        assert_eq!(m[1].optional, vec!["shared:9"]);
        assert_eq!(
            m[2].mount_point,
            PathBuf::from("/run/nodus/sandboxes/a b/ns/net")
        );
        assert_eq!(m[2].optional, vec!["master:3", "propagate_from:1"]);
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }

    #[test]
    fn an_unmounted_tree_has_no_mount_points() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/f"), "x").unwrap();
        std::os::unix::fs::symlink("/proc", d.path().join("a/link")).unwrap();
        assert_eq!(mounts_under(d.path()).unwrap(), Vec::<PathBuf>::new());
        assert_eq!(
            mounts_under(&d.path().join("missing")).unwrap(),
            Vec::<PathBuf>::new()
        );
    }

    /// A real mount (root only): the walk finds the same mount points as mountinfo, the
    /// deepest first, and does not descend into a mount.
    #[test]
    fn the_walk_agrees_with_mountinfo() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        use nix::mount::{MntFlags, MsFlags, mount, umount2};
        let d = tempfile::tempdir().unwrap();
        let (outer, inner, file) = (
            d.path().join("outer"),
            d.path().join("outer/x/inner"),
            d.path().join("file"),
        );
        std::fs::create_dir_all(&outer).unwrap();
        std::fs::write(&file, "").unwrap();
        let none: Option<&str> = None;
        mount(Some("tmpfs"), &outer, Some("tmpfs"), MsFlags::empty(), none).unwrap();
        std::fs::create_dir_all(&inner).unwrap();
        mount(Some("tmpfs"), &inner, Some("tmpfs"), MsFlags::empty(), none).unwrap();
        mount(
            Some("/proc/self/ns/net"),
            &file,
            none,
            MsFlags::MS_BIND,
            none,
        )
        .unwrap();
        let walked = mounts_under(d.path());
        let listed = from_mountinfo(d.path());
        for p in [&inner, &outer, &file] {
            let _ = umount2(p.as_path(), MntFlags::MNT_DETACH);
        }
        let (walked, listed) = (walked.unwrap(), listed.unwrap());
        // The walk stops at `outer`; mountinfo also lists what is mounted inside it.
        assert_eq!(listed.len(), 3, "{listed:?}");
        assert_eq!(walked.len(), 2, "{walked:?}");
        assert!(walked.contains(&outer) && walked.contains(&file));
        assert!(mounts_under(d.path()).unwrap().is_empty());
    }
}
