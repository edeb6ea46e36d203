//! v1 `cpuset`: `cpuset.cpus` and `cpuset.mems`. A new v1 cpuset directory starts empty and
//! no task can join it, so every level gets its parent's values first (as upstream's
//! cgroupfs manager and runc do).

use crate::common::{Files, read, read_opt};
use crate::controller::{Controller, ControllerKind};
use crate::error::CgroupError;
use crate::resources::Resources;
use std::path::Path;

pub(crate) struct CpuSet;

impl Controller for CpuSet {
    const KIND: ControllerKind = ControllerKind::Cpuset;

    fn wanted(r: &Resources) -> Option<&'static str> {
        if r.cpuset_cpus.is_some() {
            Some("cpuset_cpus")
        } else if r.cpuset_mems.is_some() {
            Some("cpuset_mems")
        } else {
            None
        }
    }

    fn apply(f: &Files, dir: &Path, r: &Resources) -> Result<(), CgroupError> {
        if let Some(v) = &r.cpuset_cpus {
            f.write(&dir.join("cpuset.cpus"), v)?;
        }
        if let Some(v) = &r.cpuset_mems {
            f.write(&dir.join("cpuset.mems"), v)?;
        }
        Ok(())
    }

    fn read(dir: &Path, r: &mut Resources) -> Result<(), CgroupError> {
        r.cpuset_cpus = read_opt(&dir.join("cpuset.cpus"))?;
        r.cpuset_mems = read_opt(&dir.join("cpuset.mems"))?;
        Ok(())
    }
}

/// Copies `parent`'s cpus and mems into `dir` where `dir`'s are empty. Checked on existing
/// levels too: a concurrent create may have made the directory a moment ago without having
/// filled it in yet.
pub(crate) fn inherit(f: &Files, parent: &Path, dir: &Path) -> Result<(), CgroupError> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let own = read(&dir.join(file)).unwrap_or_default();
        if own.trim().is_empty() {
            let from = read(&parent.join(file))?;
            f.write(&dir.join(file), from.trim())?;
        }
    }
    Ok(())
}
