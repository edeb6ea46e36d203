//! Which cgroup layout the machine has, and where a cgroup's files are.

use std::path::{Path, PathBuf};

/// The mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v1: one mount per controller under `root` (`root/memory`, `root/cpuacct`, …).
    V1 { root: PathBuf },
    /// cgroup v2: one unified tree at `root`.
    V2 { root: PathBuf },
}

impl Hierarchy {
    /// Detects the layout under `/sys/fs/cgroup`. A hybrid machine (v1 controllers plus a v2
    /// mount holding none of them, as here) is v1 for every purpose that matters.
    pub fn detect() -> Hierarchy {
        Self::detect_at(Path::new("/sys/fs/cgroup"))
    }

    pub fn detect_at(root: &Path) -> Hierarchy {
        if root.join("cgroup.controllers").exists() {
            Hierarchy::V2 {
                root: root.to_path_buf(),
            }
        } else {
            Hierarchy::V1 {
                root: root.to_path_buf(),
            }
        }
    }

    pub fn is_v2(&self) -> bool {
        matches!(self, Hierarchy::V2 { .. })
    }

    /// The directory of cgroup `path` (relative to the hierarchy root, e.g.
    /// `kubepods/pod123/abc`) for `controller` (ignored on v2).
    pub fn dir(&self, controller: &str, path: &str) -> PathBuf {
        let rel = path.trim_start_matches('/');
        match self {
            Hierarchy::V1 { root } => root.join(controller).join(rel),
            Hierarchy::V2 { root } => root.join(rel),
        }
    }
}
