//! v2 `pids`: `pids.max` and the task count `pids.current`.

use crate::common::{Files, max_or, read_limit};
use crate::controller::{Controller, ControllerKind};
use crate::error::CgroupError;
use crate::resources::Resources;
use crate::stats::{Stats, StatsError, read_u64};
use std::path::Path;

pub(crate) struct Pids;

impl Controller for Pids {
    const KIND: ControllerKind = ControllerKind::Pids;

    fn wanted(r: &Resources) -> Option<&'static str> {
        r.pids_limit.map(|_| "pids_limit")
    }

    fn apply(f: &Files, dir: &Path, r: &Resources) -> Result<(), CgroupError> {
        if let Some(p) = r.pids_limit {
            f.write(&dir.join("pids.max"), &max_or(p))?;
        }
        Ok(())
    }

    fn read(dir: &Path, r: &mut Resources) -> Result<(), CgroupError> {
        r.pids_limit = read_limit(&dir.join("pids.max"))?;
        Ok(())
    }

    fn stats(dir: &Path, s: &mut Stats) -> Result<(), StatsError> {
        s.pids = read_u64(&dir.join("pids.current")).ok();
        Ok(())
    }
}
