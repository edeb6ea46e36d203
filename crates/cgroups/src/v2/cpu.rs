//! v2 `cpu`: `cpu.weight` (from v1 shares, see [`crate::shares_to_weight`]) and `cpu.max`;
//! usage and throttling from `cpu.stat`, pressure from `cpu.pressure`.

use crate::common::{Files, kv, parse_limit, read_opt};
use crate::controller::{Controller, ControllerKind};
use crate::error::CgroupError;
use crate::resources::{Resources, cpu_max, shares_to_weight, weight_to_shares};
use crate::stats::{Stats, StatsError, pressure};
use std::path::Path;

pub(crate) struct Cpu;

impl Controller for Cpu {
    const KIND: ControllerKind = ControllerKind::Cpu;

    fn wanted(r: &Resources) -> Option<&'static str> {
        if r.cpu_shares.is_some() {
            Some("cpu_shares")
        } else if r.cpu_quota.is_some() {
            Some("cpu_quota")
        } else if r.cpu_period.is_some() {
            Some("cpu_period")
        } else {
            None
        }
    }

    fn apply(f: &Files, dir: &Path, r: &Resources) -> Result<(), CgroupError> {
        if let Some(s) = r.cpu_shares {
            f.write(&dir.join("cpu.weight"), &shares_to_weight(s).to_string())?;
        }
        if let Some(line) = cpu_max(r.cpu_quota, r.cpu_period) {
            f.write(&dir.join("cpu.max"), &line)?;
        }
        Ok(())
    }

    fn read(dir: &Path, r: &mut Resources) -> Result<(), CgroupError> {
        r.cpu_shares = read_opt(&dir.join("cpu.weight"))?
            .and_then(|w| w.parse().ok())
            .map(weight_to_shares);
        if let Some(line) = read_opt(&dir.join("cpu.max"))? {
            let mut it = line.split_whitespace();
            r.cpu_quota = it.next().map(parse_limit);
            r.cpu_period = it.next().and_then(|p| p.parse().ok());
        }
        Ok(())
    }

    fn stats(dir: &Path, s: &mut Stats) -> Result<(), StatsError> {
        let text = std::fs::read_to_string(dir.join("cpu.stat")).unwrap_or_default();
        let c = kv(&text);
        s.cpu.periods = c.get("nr_periods").copied().unwrap_or(0);
        s.cpu.usage_ns = c.get("usage_usec").copied().unwrap_or(0) * 1000;
        s.cpu.throttled_periods = c.get("nr_throttled").copied().unwrap_or(0);
        s.cpu.throttled_ns = c.get("throttled_usec").copied().unwrap_or(0) * 1000;
        s.psi.cpu = pressure(dir, "cpu.pressure");
        Ok(())
    }
}
