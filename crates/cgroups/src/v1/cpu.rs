//! v1 `cpu`: `cpu.shares` and the CFS bandwidth pair `cpu.cfs_quota_us`/`cpu.cfs_period_us`;
//! throttling figures from `cpu.stat`.

use crate::common::{Files, kv, read_limit, read_opt};
use crate::controller::{Controller, ControllerKind};
use crate::error::CgroupError;
use crate::resources::Resources;
use crate::stats::{Stats, StatsError};
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
            f.write(&dir.join("cpu.shares"), &s.to_string())?;
        }
        apply_cfs(f, dir, r)
    }

    fn read(dir: &Path, r: &mut Resources) -> Result<(), CgroupError> {
        r.cpu_shares = read_opt(&dir.join("cpu.shares"))?.and_then(|v| v.parse().ok());
        r.cpu_quota = read_limit(&dir.join("cpu.cfs_quota_us"))?;
        r.cpu_period = read_opt(&dir.join("cpu.cfs_period_us"))?.and_then(|v| v.parse().ok());
        Ok(())
    }

    fn stats(dir: &Path, s: &mut Stats) -> Result<(), StatsError> {
        let text = std::fs::read_to_string(dir.join("cpu.stat")).unwrap_or_default();
        let c = kv(&text);
        s.cpu.periods = c.get("nr_periods").copied().unwrap_or(0);
        s.cpu.throttled_periods = c.get("nr_throttled").copied().unwrap_or(0);
        s.cpu.throttled_ns = c.get("throttled_time").copied().unwrap_or(0);
        Ok(())
    }
}

/// The kernel checks a new period against the current quota (and vice versa), so one
/// order can be refused where the other is accepted; like runc, try the period first and,
/// if it is refused, set the quota first.
fn apply_cfs(f: &Files, d: &Path, r: &Resources) -> Result<(), CgroupError> {
    let quota_file = d.join("cpu.cfs_quota_us");
    let period_file = d.join("cpu.cfs_period_us");
    let mut quota_done = false;
    if let Some(p) = r.cpu_period {
        let v = p.to_string();
        if let Err(e) = f.write(&period_file, &v) {
            let Some(q) = r
                .cpu_quota
                .filter(|_| e.raw_os_error() == Some(libc::EINVAL))
            else {
                return Err(e);
            };
            f.write(&quota_file, &q.to_string())?;
            quota_done = true;
            f.write(&period_file, &v)?;
        }
    }
    if let Some(q) = r.cpu_quota
        && !quota_done
    {
        f.write(&quota_file, &q.to_string())?;
    }
    Ok(())
}
