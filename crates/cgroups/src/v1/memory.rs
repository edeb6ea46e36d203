//! v1 `memory`: `memory.limit_in_bytes`; usage, working set (usage − `total_inactive_file`,
//! as cAdvisor computes it) and OOM kills. v1 has no `memory.high`/`memory.min`
//! equivalent: those fields are ignored, as upstream's v1 driver does.

use crate::common::{Files, kv, read_limit};
use crate::controller::{Controller, ControllerKind};
use crate::error::CgroupError;
use crate::resources::Resources;
use crate::stats::{MemoryStats, Stats, StatsError, read, read_u64};
use std::path::Path;

/// v1 reports "no limit" as a huge page-aligned number.
const V1_UNLIMITED: u64 = 1 << 62;

pub(crate) struct Memory;

impl Controller for Memory {
    const KIND: ControllerKind = ControllerKind::Memory;

    fn wanted(r: &Resources) -> Option<&'static str> {
        r.memory_limit.map(|_| "memory_limit")
    }

    fn apply(f: &Files, dir: &Path, r: &Resources) -> Result<(), CgroupError> {
        if let Some(m) = r.memory_limit {
            f.write(&dir.join("memory.limit_in_bytes"), &m.to_string())?;
        }
        Ok(())
    }

    fn read(dir: &Path, r: &mut Resources) -> Result<(), CgroupError> {
        r.memory_limit = read_limit(&dir.join("memory.limit_in_bytes"))?;
        Ok(())
    }

    fn stats(dir: &Path, s: &mut Stats) -> Result<(), StatsError> {
        let text = read(&dir.join("memory.stat"))?;
        let m = kv(&text);
        let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
        let inactive = m.get("total_inactive_file").copied().unwrap_or(0);
        let limit = read_u64(&dir.join("memory.limit_in_bytes"))?;
        let oom = read(&dir.join("memory.oom_control"))
            .map(|t| kv(&t).get("oom_kill").copied().unwrap_or(0))
            .unwrap_or(0);
        s.memory = MemoryStats {
            usage_bytes: usage,
            working_set_bytes: usage.saturating_sub(inactive),
            rss_bytes: m.get("total_rss").copied().unwrap_or(0),
            page_faults: m.get("total_pgfault").copied().unwrap_or(0),
            major_page_faults: m.get("total_pgmajfault").copied().unwrap_or(0),
            limit_bytes: (limit < V1_UNLIMITED).then_some(limit),
            oom_kills: oom,
        };
        Ok(())
    }
}
