//! The cgroup controllers the drivers know, and what one controller's implementation does
//! (youki's per-controller `Controller`/`StatsProvider` split): write its part of
//! [`Resources`], read it back, and add its figures to [`Stats`]. Each v1 and v2 controller
//! is one file implementing [`Controller`] for its own files.

use crate::common::Files;
use crate::error::CgroupError;
use crate::resources::Resources;
use crate::stats::{Stats, StatsError};
use std::path::Path;

/// A cgroup controller (subsystem) by its kernel name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ControllerKind {
    Cpu,
    Cpuacct,
    Cpuset,
    Memory,
    Pids,
    Hugetlb,
    Freezer,
    Io,
    Blkio,
    Devices,
}

impl ControllerKind {
    /// The name in `cgroup.controllers`, mount options and v1 mount directories.
    pub fn name(self) -> &'static str {
        match self {
            ControllerKind::Cpu => "cpu",
            ControllerKind::Cpuacct => "cpuacct",
            ControllerKind::Cpuset => "cpuset",
            ControllerKind::Memory => "memory",
            ControllerKind::Pids => "pids",
            ControllerKind::Hugetlb => "hugetlb",
            ControllerKind::Freezer => "freezer",
            ControllerKind::Io => "io",
            ControllerKind::Blkio => "blkio",
            ControllerKind::Devices => "devices",
        }
    }
}

impl std::fmt::Display for ControllerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One controller's files in one cgroup directory.
pub(crate) trait Controller {
    const KIND: ControllerKind;

    /// The first field of `r` this controller writes, if any: a missing controller is then
    /// an error naming that field rather than something to skip.
    fn wanted(_r: &Resources) -> Option<&'static str> {
        None
    }

    /// Writes this controller's part of `r` into cgroup directory `dir`.
    fn apply(_f: &Files, _dir: &Path, _r: &Resources) -> Result<(), CgroupError> {
        Ok(())
    }

    /// Fills in this controller's fields of `r` from `dir` (left None when the kernel has
    /// no file for them).
    fn read(_dir: &Path, _r: &mut Resources) -> Result<(), CgroupError> {
        Ok(())
    }

    /// Adds this controller's usage figures from `dir` to `s`.
    fn stats(_dir: &Path, _s: &mut Stats) -> Result<(), StatsError> {
        Ok(())
    }
}
