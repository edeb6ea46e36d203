//! v2 `memory`: `memory.min` (MemoryQoS's protected requests), `memory.high` (its
//! throttling point) and `memory.max`; usage, working set (`memory.current` −
//! `inactive_file` of `memory.stat`, as cAdvisor computes it), OOM kills from
//! `memory.events`, and `memory.pressure`.
//!
//! The root cgroup has no `memory.current`: as cAdvisor does, its usage is the machine's
//! (MemTotal − MemFree of `/proc/meminfo`).

use crate::common::{Files, kv, max_or, read_limit};
use crate::controller::{Controller, ControllerKind};
use crate::error::CgroupError;
use crate::resources::Resources;
use crate::stats::{MemoryStats, Stats, StatsError, pressure, read_u64};
use std::path::Path;

pub(crate) struct Memory;

impl Controller for Memory {
    const KIND: ControllerKind = ControllerKind::Memory;

    fn wanted(r: &Resources) -> Option<&'static str> {
        if r.memory_limit.is_some() {
            Some("memory_limit")
        } else if r.memory_high.is_some() {
            Some("memory_high")
        } else if r.memory_min.is_some() {
            Some("memory_min")
        } else {
            None
        }
    }

    fn apply(f: &Files, dir: &Path, r: &Resources) -> Result<(), CgroupError> {
        if let Some(m) = r.memory_min {
            f.write(&dir.join("memory.min"), &m.to_string())?;
        }
        if let Some(m) = r.memory_high {
            f.write(&dir.join("memory.high"), &max_or(m))?;
        }
        if let Some(m) = r.memory_limit {
            f.write(&dir.join("memory.max"), &max_or(m))?;
        }
        Ok(())
    }

    fn read(dir: &Path, r: &mut Resources) -> Result<(), CgroupError> {
        r.memory_limit = read_limit(&dir.join("memory.max"))?;
        r.memory_high = read_limit(&dir.join("memory.high"))?;
        r.memory_min = read_limit(&dir.join("memory.min"))?;
        Ok(())
    }

    fn stats(dir: &Path, s: &mut Stats) -> Result<(), StatsError> {
        let text = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        let m = kv(&text);
        let usage = read_u64(&dir.join("memory.current")).unwrap_or(0);
        let inactive = m.get("inactive_file").copied().unwrap_or(0);
        let max = std::fs::read_to_string(dir.join("memory.max")).unwrap_or_default();
        let events = std::fs::read_to_string(dir.join("memory.events")).unwrap_or_default();
        s.memory = MemoryStats {
            usage_bytes: usage,
            working_set_bytes: usage.saturating_sub(inactive),
            rss_bytes: m.get("anon").copied().unwrap_or(0),
            page_faults: m.get("pgfault").copied().unwrap_or(0),
            major_page_faults: m.get("pgmajfault").copied().unwrap_or(0),
            limit_bytes: max.trim().parse().ok(),
            oom_kills: kv(&events).get("oom_kill").copied().unwrap_or(0),
        };
        s.psi.memory = pressure(dir, "memory.pressure");
        Ok(())
    }
}

/// The root cgroup's usage and working set: the machine's memory in use (from `meminfo`,
/// the text of `/proc/meminfo`) less the inactive file pages of the root's `memory.stat`.
pub(crate) fn root_stats(dir: &Path, meminfo: &str, s: &mut Stats) {
    if let Some(usage) = meminfo_usage(meminfo) {
        let text = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        let inactive = kv(&text).get("inactive_file").copied().unwrap_or(0);
        s.memory.usage_bytes = usage;
        s.memory.working_set_bytes = usage.saturating_sub(inactive);
    }
}

/// The machine's memory in use, MemTotal − MemFree, in bytes.
pub(crate) fn meminfo_usage(meminfo: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
    };
    Some((field("MemTotal")?.saturating_sub(field("MemFree")?)) * 1024)
}
