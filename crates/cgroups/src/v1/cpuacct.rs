//! v1 `cpuacct`: the cumulative CPU time of a cgroup (`cpuacct.usage`, nanoseconds).

use crate::controller::{Controller, ControllerKind};
use crate::stats::{Stats, StatsError, read_u64};
use std::path::Path;

pub(crate) struct CpuAcct;

impl Controller for CpuAcct {
    const KIND: ControllerKind = ControllerKind::Cpuacct;

    fn stats(dir: &Path, s: &mut Stats) -> Result<(), StatsError> {
        s.cpu.usage_ns = read_u64(&dir.join("cpuacct.usage")).unwrap_or(0);
        Ok(())
    }
}
