//! v2 `cpuset`: `cpuset.cpus` and `cpuset.mems` (an empty v2 cpuset inherits its parent's
//! effective set, so nothing needs copying on create).

use crate::common::{Files, read_opt};
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
