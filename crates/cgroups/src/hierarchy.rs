//! Which cgroup layout the machine has, and where a cgroup's files are.
//!
//! v1 controllers are found in `/proc/self/mountinfo` rather than assumed at
//! `/sys/fs/cgroup/<name>`: distributions co-mount `cpu,cpuacct` (and sometimes
//! `net_cls,net_prio`), and a hybrid machine adds a cgroup2 mount (`unified`) that may own
//! controllers v1 does not have (here: hugetlb).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The controllers the v1 kernel knows, so mount options like `rw,relatime` are not taken
/// for controller names.
const V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// The mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    v2: bool,
    root: PathBuf,
    /// v1: controller name (or `name=systemd`) → its mount point.
    mounts: BTreeMap<String, PathBuf>,
    /// v1 hybrid: the cgroup2 mount, when it exists.
    unified: Option<PathBuf>,
}

impl Hierarchy {
    /// cgroup v2: one unified tree at `root`.
    pub fn v2(root: impl Into<PathBuf>) -> Hierarchy {
        Hierarchy {
            v2: true,
            root: root.into(),
            mounts: BTreeMap::new(),
            unified: None,
        }
    }

    /// cgroup v1 with each controller at `root/<controller>` and no unified mount.
    pub fn v1(root: impl Into<PathBuf>) -> Hierarchy {
        Hierarchy {
            v2: false,
            root: root.into(),
            mounts: BTreeMap::new(),
            unified: None,
        }
    }

    /// cgroup v1 with an explicit controller → mount point table and, on a hybrid machine,
    /// the cgroup2 mount.
    pub fn v1_mounts(
        root: impl Into<PathBuf>,
        mounts: BTreeMap<String, PathBuf>,
        unified: Option<PathBuf>,
    ) -> Hierarchy {
        Hierarchy {
            v2: false,
            root: root.into(),
            mounts,
            unified,
        }
    }

    /// Detects the layout of this machine from `/proc/self/mountinfo`, falling back to
    /// looking at `/sys/fs/cgroup` when mountinfo cannot be read. A hybrid machine (v1
    /// controllers plus a cgroup2 mount) is v1, with the cgroup2 mount as `unified`.
    pub fn detect() -> Hierarchy {
        match std::fs::read_to_string("/proc/self/mountinfo") {
            Ok(text) => Self::from_mountinfo(&text)
                .unwrap_or_else(|| Self::detect_at(Path::new("/sys/fs/cgroup"))),
            Err(_) => Self::detect_at(Path::new("/sys/fs/cgroup")),
        }
    }

    /// Parses a mountinfo text. None when it has no cgroup mount at all.
    pub fn from_mountinfo(text: &str) -> Option<Hierarchy> {
        let mut mounts = BTreeMap::new();
        let mut cgroup2: Vec<PathBuf> = Vec::new();
        for m in crate::mountinfo::parse(text) {
            match m.fs_type.as_str() {
                "cgroup" => {
                    for opt in m.super_options.split(',') {
                        if V1_CONTROLLERS.contains(&opt) || opt.starts_with("name=") {
                            mounts
                                .entry(opt.to_string())
                                .or_insert_with(|| m.mount_point.clone());
                        }
                    }
                }
                "cgroup2" => cgroup2.push(m.mount_point),
                _ => {}
            }
        }
        if mounts.is_empty() {
            // Pure v2: prefer the conventional mount point when several exist.
            let root = cgroup2
                .iter()
                .find(|p| p.as_path() == Path::new("/sys/fs/cgroup"))
                .or_else(|| cgroup2.first())?
                .clone();
            return Some(Hierarchy::v2(root));
        }
        let root = mounts
            .values()
            .next()
            .and_then(|p| p.parent())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"));
        Some(Hierarchy::v1_mounts(
            root,
            mounts,
            cgroup2.into_iter().next(),
        ))
    }

    /// Detects the layout under `root` by looking at the directory alone: a
    /// `cgroup.controllers` file means v2; otherwise each subdirectory is a v1 mount named
    /// after its controllers (`cpu,cpuacct` serves both), and `unified` is the hybrid mount.
    pub fn detect_at(root: &Path) -> Hierarchy {
        if root.join("cgroup.controllers").exists() {
            return Hierarchy::v2(root);
        }
        let mut mounts = BTreeMap::new();
        let mut unified = None;
        if let Ok(entries) = std::fs::read_dir(root) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let path = e.path();
                if name == "unified" && path.join("cgroup.controllers").exists() {
                    unified = Some(path);
                    continue;
                }
                // Prefer the real co-mount directory over its symlink aliases.
                let is_link = e.file_type().map(|t| t.is_symlink()).unwrap_or(false);
                for c in name.split(',') {
                    if V1_CONTROLLERS.contains(&c) || c.starts_with("name=") {
                        if is_link {
                            mounts.entry(c.to_string()).or_insert_with(|| path.clone());
                        } else {
                            mounts.insert(c.to_string(), path.clone());
                        }
                    }
                }
            }
        }
        Hierarchy::v1_mounts(root, mounts, unified)
    }

    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// The hierarchy root (`/sys/fs/cgroup` on most machines).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// v1 hybrid: the cgroup2 mount.
    pub fn unified(&self) -> Option<&Path> {
        self.unified.as_deref()
    }

    /// v1: the mount point of `controller`, if it is mounted (or, for a hierarchy built with
    /// [`Hierarchy::v1`], the conventional `root/<controller>`).
    pub fn mount(&self, controller: &str) -> Option<PathBuf> {
        if self.v2 {
            return Some(self.root.clone());
        }
        if self.mounts.is_empty() {
            return Some(self.root.join(controller));
        }
        self.mounts.get(controller).cloned()
    }

    /// Every distinct v1 mount point (each co-mount once), or the v2 root.
    pub fn all_mounts(&self) -> Vec<PathBuf> {
        if self.v2 {
            return vec![self.root.clone()];
        }
        let mut v: Vec<PathBuf> = if self.mounts.is_empty() {
            std::fs::read_dir(&self.root)
                .map(|it| {
                    it.flatten()
                        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                        .map(|e| e.path())
                        .filter(|p| Some(p.as_path()) != self.unified.as_deref())
                        .collect()
                })
                .unwrap_or_default()
        } else {
            self.mounts.values().cloned().collect()
        };
        v.sort();
        v.dedup();
        v
    }

    /// The directory of cgroup `path` (relative to the hierarchy root, e.g.
    /// `kubepods/pod123/abc`) for `controller` (ignored on v2). A v1 controller that is not
    /// mounted resolves to the conventional `root/<controller>`, which does not exist.
    pub fn dir(&self, controller: &str, path: &str) -> PathBuf {
        let rel = path.trim_start_matches('/');
        if self.v2 {
            return self.root.join(rel);
        }
        self.mount(controller)
            .unwrap_or_else(|| self.root.join(controller))
            .join(rel)
    }
}

/// The cgroup of a process from its `/proc/<pid>/cgroup` text: in the v1 hierarchy that
/// holds `controller`, or (None) in the v2 hierarchy (the `0::` line).
pub fn process_cgroup(proc_cgroup: &str, controller: Option<&str>) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (id, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        let hit = match controller {
            Some(c) => ctrls.split(',').any(|x| x == c),
            None => id == "0" && ctrls.is_empty(),
        };
        hit.then(|| path.to_string())
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn co_mounted_controllers_share_one_directory() {
        let h = Hierarchy::from_mountinfo(HYBRID).unwrap();
        assert!(!h.is_v2());
        assert_eq!(
            h.dir("cpuacct", "/kubepods"),
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/kubepods")
        );
        assert_eq!(
            h.dir("cpu", "kubepods"),
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/kubepods")
        );
        assert_eq!(h.mount("pids"), None);
        assert_eq!(h.unified(), Some(Path::new("/sys/fs/cgroup/unified")));
        assert_eq!(h.root(), Path::new("/sys/fs/cgroup"));
        assert_eq!(h.all_mounts().len(), 4);
    }

    #[test]
    fn pure_v2_mountinfo() {
        let h = Hierarchy::from_mountinfo(
            "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
        )
        .unwrap();
        assert!(h.is_v2());
        assert_eq!(h.dir("memory", "a/b"), PathBuf::from("/sys/fs/cgroup/a/b"));
        assert_eq!(
            Hierarchy::from_mountinfo("1 2 0:1 / / rw - ext4 x rw\n"),
            None
        );
    }

    #[test]
    fn process_cgroups_by_controller() {
        let own = "12:cpu,cpuacct:/a\n9:memory:/user.slice\n0::/user.slice/x.scope\n";
        assert_eq!(
            process_cgroup(own, Some("memory")).as_deref(),
            Some("/user.slice")
        );
        assert_eq!(process_cgroup(own, Some("cpuacct")).as_deref(), Some("/a"));
        assert_eq!(
            process_cgroup(own, None).as_deref(),
            Some("/user.slice/x.scope")
        );
        assert_eq!(process_cgroup(own, Some("pids")), None);
    }

    #[test]
    fn detect_at_reads_directory_names() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("cpu,cpuacct")).unwrap();
        std::fs::create_dir(d.path().join("memory")).unwrap();
        std::os::unix::fs::symlink(d.path().join("cpu,cpuacct"), d.path().join("cpu")).unwrap();
        let h = Hierarchy::detect_at(d.path());
        assert!(!h.is_v2());
        assert_eq!(h.mount("cpu"), Some(d.path().join("cpu,cpuacct")));
        assert_eq!(h.mount("memory"), Some(d.path().join("memory")));
    }

    #[test]
    fn this_machine_is_detected() {
        // Whatever the host is, detection must name a memory location for stats.
        let h = Hierarchy::detect();
        assert!(h.dir("memory", "x").ends_with("x"));
    }
}
