//! What the v1 and v2 drivers share: cgroup path checking, one-write file access, the
//! retrying removal of a cgroup tree, and the small parsers of the kernel's file formats.

use crate::error::CgroupError;
use crate::manager::CgroupManager;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(crate) const POLL: Duration = Duration::from_millis(10);
pub(crate) const FREEZE_POLLS: u32 = 200;
const MAX_DELETE_DELAY: Duration = Duration::from_millis(200);

/// How patiently `delete` removes a busy cgroup: `attempts` removal rounds (≥ 1) with
/// growing pauses, killing the processes left inside from round `kill_after + 1` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteRetries {
    pub attempts: u32,
    pub kill_after: u32,
}

impl Default for DeleteRetries {
    fn default() -> Self {
        DeleteRetries {
            attempts: 10,
            kill_after: 3,
        }
    }
}

/// Access to cgroup files. `fake` serves test trees on a plain filesystem: files are
/// created on write and removed before rmdir, and no signal is ever sent.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Files {
    pub fake: bool,
}

impl Files {
    /// One write(2) of exactly `value`, as the kernel parses a cgroup file per write.
    pub fn write(&self, path: &Path, value: &str) -> Result<(), CgroupError> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(self.fake)
            .create(self.fake)
            .open(path)
            .map_err(|e| CgroupError::write(path, value, e))?;
        f.write_all(value.as_bytes())
            .map_err(|e| CgroupError::write(path, value, e))
    }

    pub fn rmdir(&self, d: &Path) -> std::io::Result<()> {
        if self.fake
            && let Ok(entries) = std::fs::read_dir(d)
        {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        match std::fs::remove_dir(d) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    /// Depth-first removal of `d` and its child cgroups; the first failure is returned with
    /// the directory it happened in.
    pub fn remove_tree(&self, d: &Path) -> Result<(), (PathBuf, std::io::Error)> {
        let entries = match std::fs::read_dir(d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err((d.to_path_buf(), e)),
        };
        let mut first: Option<(PathBuf, std::io::Error)> = None;
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir())
                && let Err(err) = self.remove_tree(&e.path())
            {
                first.get_or_insert(err);
            }
        }
        if let Some(err) = first {
            return Err(err);
        }
        self.rmdir(d).map_err(|e| (d.to_path_buf(), e))
    }

    /// Removes every directory of `targets` (one cgroup in each of its mounts) with its
    /// subtree, deepest first. A busy directory (processes still leaving) is retried with
    /// growing pauses; from round `kill_after + 1` on, `kill` is called first. A target
    /// that does not exist counts as removed.
    pub fn delete_trees(
        &self,
        mut targets: Vec<PathBuf>,
        retries: DeleteRetries,
        kill: impl Fn(),
    ) -> Result<(), CgroupError> {
        targets.retain(|d| d.exists());
        let attempts = retries.attempts.max(1);
        let mut delay = POLL;
        for attempt in 1..=attempts {
            if attempt > retries.kill_after {
                kill();
            }
            let mut last: Option<(PathBuf, std::io::Error)> = None;
            targets.retain(|t| match self.remove_tree(t) {
                Ok(()) => false,
                Err(e) => {
                    last = Some(e);
                    true
                }
            });
            let Some((dir, err)) = last else {
                return Ok(());
            };
            let retryable = matches!(
                err.raw_os_error(),
                Some(libc::EBUSY) | Some(libc::ENOTEMPTY) | Some(libc::EAGAIN)
            );
            if !retryable || attempt == attempts {
                return Err(CgroupError::Remove {
                    path: dir,
                    attempts: attempt,
                    source: err,
                });
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(MAX_DELETE_DELAY);
        }
        Ok(())
    }

    /// Creates the directories of `comps` below `mount` that are missing, recording each new
    /// one in `created` (so a failed create can take them back). `each` runs on every level,
    /// new or not, with (parent, dir).
    pub fn create_dirs(
        &self,
        mount: &Path,
        comps: &[String],
        created: &mut Vec<PathBuf>,
        mut each: impl FnMut(&Path, &Path) -> Result<(), CgroupError>,
    ) -> Result<(), CgroupError> {
        let mut cur = mount.to_path_buf();
        for c in comps {
            let parent = cur.clone();
            cur.push(c);
            if !cur.is_dir() {
                match std::fs::create_dir(&cur) {
                    Ok(()) => created.push(cur.clone()),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(source) => {
                        return Err(CgroupError::Create {
                            path: cur.clone(),
                            source,
                        });
                    }
                }
            }
            each(&parent, &cur)?;
        }
        Ok(())
    }
}

/// The path's names, rejecting `.`/`..` so a cgroup path can never leave its mount.
pub(crate) fn components(path: &str) -> Result<Vec<String>, CgroupError> {
    let mut out = Vec::new();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        if c == "." || c == ".." {
            return Err(CgroupError::InvalidPath(path.to_string()));
        }
        out.push(c.to_string());
    }
    Ok(out)
}

/// Like [`components`], refusing the hierarchy root: killing, freezing or removing "the
/// root" would mean every process on the machine.
pub(crate) fn non_root(path: &str) -> Result<Vec<String>, CgroupError> {
    let comps = components(path)?;
    if comps.is_empty() {
        return Err(CgroupError::InvalidPath(path.to_string()));
    }
    Ok(comps)
}

pub(crate) fn join(base: &Path, comps: &[String]) -> PathBuf {
    let mut p = base.to_path_buf();
    p.extend(comps);
    p
}

pub(crate) fn read(p: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(p).map_err(|source| CgroupError::Read {
        path: p.to_path_buf(),
        source,
    })
}

/// A file's trimmed content, None when the kernel does not have it.
pub(crate) fn read_opt(p: &Path) -> Result<Option<String>, CgroupError> {
    match std::fs::read_to_string(p) {
        Ok(t) => Ok(Some(t.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CgroupError::Read {
            path: p.to_path_buf(),
            source,
        }),
    }
}

/// A limit file's value with "unlimited" as -1 (see [`parse_limit`]); None when absent.
pub(crate) fn read_limit(p: &Path) -> Result<Option<i64>, CgroupError> {
    Ok(read_opt(p)?.map(|v| parse_limit(&v)))
}

/// Whether `controller` is listed in the `cgroup.controllers` file of v2 directory `dir`.
pub(crate) fn offers(dir: &Path, controller: &str) -> bool {
    read(&dir.join("cgroup.controllers"))
        .is_ok_and(|t| t.split_whitespace().any(|c| c == controller))
}

/// A limit file's value: "max" and v1's page-rounded "no limit" (≥ 2^62) read as -1.
pub(crate) fn parse_limit(v: &str) -> i64 {
    if v == "max" {
        return -1;
    }
    match v.parse::<u64>() {
        Ok(n) if n >= 1 << 62 => -1,
        Ok(n) => n as i64,
        Err(_) => v.parse().unwrap_or(-1),
    }
}

/// "-1 means unlimited" as the kernel's v2 files (and v1 `pids.max`) spell it.
pub(crate) fn max_or(v: i64) -> String {
    if v < 0 {
        "max".to_string()
    } else {
        v.to_string()
    }
}

/// `key value` lines (memory.stat, cpu.stat, memory.events, memory.oom_control).
pub(crate) fn kv(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?, it.next()?.parse().ok()?))
        })
        .collect()
}

/// Every process in `dirs` and their descendants; sorted, unique.
pub(crate) fn collect_pids_in(dirs: &[PathBuf]) -> Result<Vec<i32>, CgroupError> {
    let mut pids = Vec::new();
    for d in dirs {
        collect_pids(d, &mut pids)?;
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

fn collect_pids(dir: &Path, out: &mut Vec<i32>) -> Result<(), CgroupError> {
    match std::fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(text) => out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(CgroupError::Read {
                path: dir.join("cgroup.procs"),
                source,
            });
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&e.path(), out)?;
            }
        }
    }
    Ok(())
}

/// The names of the child cgroups of `dir`, sorted.
pub(crate) fn child_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// SIGKILLs every process of the cgroup at `path` while it is frozen, so that none forks
/// past the list (a cgroup that cannot be frozen is killed as it runs): `kill_all` where
/// the kernel has no `cgroup.kill`.
pub(crate) fn kill_frozen<M: CgroupManager + ?Sized>(m: &M, path: &str) -> Result<(), CgroupError> {
    let frozen = m.freeze(path).is_ok();
    let pids = m.pids(path);
    if let Ok(pids) = &pids {
        kill_pids(pids);
    }
    if frozen {
        m.thaw(path)?;
    }
    pids.map(|_| ())
}

/// SIGKILLs each of `pids` but init and ourselves.
fn kill_pids(pids: &[i32]) {
    let me = std::process::id() as i32;
    for &pid in pids.iter().filter(|&&p| p > 1 && p != me) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Checks that `mount` exists and is writable.
pub(crate) fn check_writable(mount: &Path) -> Result<(), CgroupError> {
    if !mount.is_dir() {
        return Err(CgroupError::RootMissing(mount.to_path_buf()));
    }
    nix::unistd::access(mount, nix::unistd::AccessFlags::W_OK).map_err(|e| {
        CgroupError::RootNotWritable {
            path: mount.to_path_buf(),
            source: std::io::Error::from_raw_os_error(e as i32),
        }
    })
}

/// `hugetlb.<size><suffix>` files of a cgroup directory, sorted by page size name.
pub(crate) fn hugetlb_limits(dir: &Path, suffix: &str) -> Result<Vec<(String, u64)>, CgroupError> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(size) = name
            .strip_prefix("hugetlb.")
            .and_then(|n| n.strip_suffix(suffix))
        else {
            continue;
        };
        if size.contains('.') {
            continue; // hugetlb.2MB.rsvd.max and friends
        }
        let v = read(&e.path())?;
        out.push((size.to_string(), parse_limit(v.trim()).max(0) as u64));
    }
    out.sort();
    Ok(out)
}
