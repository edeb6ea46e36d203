//! The cgroup v2 cgroupfs driver: one directory per cgroup, the controllers it needs enabled
//! in every ancestor's `cgroup.subtree_control`, each controller's files written by its own
//! module; `cgroup.kill` and `cgroup.freeze` from the core interface.

mod cpu;
mod cpuset;
mod freezer;
mod hugetlb;
mod io;
mod memory;
mod pids;

#[cfg(test)]
pub(crate) use memory::meminfo_usage;

use crate::common::{
    DeleteRetries, Files, check_writable, child_names, collect_pids_in, components, join,
    kill_frozen, non_root, offers, read,
};
use crate::controller::{Controller, ControllerKind};
use crate::error::CgroupError;
use crate::hierarchy::Hierarchy;
use crate::manager::CgroupManager;
use crate::resources::Resources;
use crate::stats::{Stats, StatsError};
use std::path::{Path, PathBuf};

/// Controllers enabled on every ancestor when the parent offers them: the kubelet's set
/// (cpu, cpuset, hugetlb, memory, pids; upstream's v2 `Exists` requires them) plus io for
/// stats.
pub(crate) const ENABLED: &[ControllerKind] = &[
    ControllerKind::Cpu,
    ControllerKind::Cpuset,
    ControllerKind::Hugetlb,
    ControllerKind::Io,
    ControllerKind::Memory,
    ControllerKind::Pids,
];

/// Controllers a cgroup must have for upstream's `Exists` (those the root offers).
const REQUIRED: &[ControllerKind] = &[
    ControllerKind::Cpu,
    ControllerKind::Cpuset,
    ControllerKind::Hugetlb,
    ControllerKind::Memory,
    ControllerKind::Pids,
];

/// The cgroup v2 manager.
#[derive(Debug, Clone)]
pub struct V2Manager {
    h: Hierarchy,
    retries: DeleteRetries,
    files: Files,
}

impl V2Manager {
    pub fn new(h: Hierarchy) -> V2Manager {
        V2Manager {
            h,
            retries: DeleteRetries::default(),
            files: Files::default(),
        }
    }

    pub fn with_delete_retries(mut self, retries: DeleteRetries) -> V2Manager {
        self.retries = retries;
        self
    }

    #[cfg(test)]
    pub(crate) fn fake(h: Hierarchy) -> V2Manager {
        V2Manager {
            files: Files { fake: true },
            ..V2Manager::new(h)
        }
    }

    fn root(&self) -> &Path {
        self.h.root()
    }

    pub(crate) fn apply(&self, comps: &[String], r: &Resources) -> Result<(), CgroupError> {
        if r.is_empty() {
            return Ok(());
        }
        let d = join(self.root(), comps);
        cpuset::CpuSet::apply(&self.files, &d, r)?;
        cpu::Cpu::apply(&self.files, &d, r)?;
        memory::Memory::apply(&self.files, &d, r)?;
        pids::Pids::apply(&self.files, &d, r)?;
        hugetlb::HugeTlb::apply(&self.files, &d, r)
    }

    fn set_frozen(&self, path: &str, frozen: bool) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        freezer::set_frozen(&self.files, &join(self.root(), &comps), frozen)
    }
}

/// The first field of `r` that controller `c` writes (what makes it required).
fn wanted(c: ControllerKind, r: &Resources) -> Option<&'static str> {
    match c {
        ControllerKind::Cpu => cpu::Cpu::wanted(r),
        ControllerKind::Cpuset => cpuset::CpuSet::wanted(r),
        ControllerKind::Memory => memory::Memory::wanted(r),
        ControllerKind::Pids => pids::Pids::wanted(r),
        ControllerKind::Hugetlb => hugetlb::HugeTlb::wanted(r),
        _ => None,
    }
}

/// Makes `controllers` available to cgroup `comps` below v2 mount `mount` by enabling them
/// in `cgroup.subtree_control` of every ancestor, root first. A controller an ancestor does
/// not offer is skipped, unless `r` needs it.
pub(crate) fn enable_along(
    f: &Files,
    mount: &Path,
    comps: &[String],
    controllers: &[ControllerKind],
    r: &Resources,
) -> Result<(), CgroupError> {
    let mut dir = mount.to_path_buf();
    for c in comps {
        enable_in(f, &dir, controllers, r)?;
        dir.push(c);
    }
    Ok(())
}

fn enable_in(
    f: &Files,
    dir: &Path,
    controllers: &[ControllerKind],
    r: &Resources,
) -> Result<(), CgroupError> {
    let available = read(&dir.join("cgroup.controllers"))?;
    let available: Vec<&str> = available.split_whitespace().collect();
    let ctl = dir.join("cgroup.subtree_control");
    let enabled = read(&ctl)?;
    let enabled: Vec<&str> = enabled
        .split_whitespace()
        .map(|c| c.trim_start_matches('+'))
        .collect();
    let mut missing = Vec::new();
    for &c in controllers {
        if enabled.contains(&c.name()) {
            continue;
        }
        if available.contains(&c.name()) {
            missing.push(c);
        } else if let Some(field) = wanted(c, r) {
            return Err(CgroupError::ControllerMissing {
                controller: c.name(),
                field,
            });
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let line = missing
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    if f.write(&ctl, &line).is_ok() {
        return Ok(());
    }
    // One refused controller (e.g. cpu with realtime tasks present) must not block the
    // others; only a controller the limits need is an error.
    for c in missing {
        if let Err(e) = f.write(&ctl, &format!("+{c}"))
            && wanted(c, r).is_some()
        {
            return Err(e);
        }
    }
    Ok(())
}

/// Writes the hugetlb limits of `r` into v2 directory `dir` (the hybrid mount's, for v1).
pub(crate) fn apply_hugetlb(f: &Files, dir: &Path, r: &Resources) -> Result<(), CgroupError> {
    hugetlb::HugeTlb::apply(f, dir, r)
}

/// Reads the hugetlb limits of v2 directory `dir` into `r`.
pub(crate) fn read_hugetlb(dir: &Path, r: &mut Resources) -> Result<(), CgroupError> {
    hugetlb::HugeTlb::read(dir, r)
}

impl CgroupManager for V2Manager {
    fn hierarchy(&self) -> &Hierarchy {
        &self.h
    }

    fn has_controller(&self, c: ControllerKind) -> bool {
        offers(self.root(), c.name())
    }

    fn check_root(&self) -> Result<(), CgroupError> {
        check_writable(self.root())
    }

    fn create(&self, path: &str, r: &Resources) -> Result<(), CgroupError> {
        let comps = components(path)?;
        r.validate()?;
        self.check_root()?;
        let mut created: Vec<PathBuf> = Vec::new();
        let result = self
            .files
            .create_dirs(self.root(), &comps, &mut created, |_, _| Ok(()))
            .and_then(|()| {
                enable_along(&self.files, self.root(), &comps, ENABLED, r)?;
                self.apply(&comps, r)
            });
        if result.is_err() {
            for d in created.iter().rev() {
                let _ = self.files.rmdir(d);
            }
        }
        result
    }

    fn update(&self, path: &str, r: &Resources) -> Result<(), CgroupError> {
        let comps = components(path)?;
        r.validate()?;
        if !join(self.root(), &comps).is_dir() {
            return Err(CgroupError::NotFound(comps.join("/")));
        }
        enable_along(&self.files, self.root(), &comps, ENABLED, r)?;
        self.apply(&comps, r)
    }

    fn delete(&self, path: &str) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        let target = join(self.root(), &comps);
        self.files.delete_trees(vec![target], self.retries, || {
            let _ = self.kill_all(path);
        })
    }

    /// As upstream's v2 `Exists`: a directory whose `cgroup.controllers` has each of cpu,
    /// cpuset, hugetlb, memory, pids that the root offers.
    fn exists(&self, path: &str) -> bool {
        let Ok(comps) = components(path) else {
            return false;
        };
        let dir = join(self.root(), &comps);
        let Ok(have) = read(&dir.join("cgroup.controllers")) else {
            return false;
        };
        let root = read(&self.root().join("cgroup.controllers")).unwrap_or_default();
        let root: Vec<&str> = root.split_whitespace().collect();
        REQUIRED
            .iter()
            .filter(|c| root.contains(&c.name()))
            .all(|c| have.split_whitespace().any(|h| h == c.name()))
    }

    fn add_process(&self, path: &str, pid: i32) -> Result<(), CgroupError> {
        let comps = components(path)?;
        self.files.write(
            &join(self.root(), &comps).join("cgroup.procs"),
            &pid.to_string(),
        )
    }

    fn pids(&self, path: &str) -> Result<Vec<i32>, CgroupError> {
        let comps = components(path)?;
        let dir = join(self.root(), &comps);
        if !dir.is_dir() {
            return Err(CgroupError::NotFound(comps.join("/")));
        }
        collect_pids_in(&[dir])
    }

    /// `cgroup.kill` where the kernel has it (5.14+); otherwise freeze, signal each pid,
    /// thaw, so nothing forks away in between. Does not wait for the processes to exit.
    fn kill_all(&self, path: &str) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        let f = join(self.root(), &comps).join("cgroup.kill");
        if f.exists() {
            return self.files.write(&f, "1");
        }
        if self.files.fake {
            return Ok(());
        }
        kill_frozen(self, path)
    }

    fn freeze(&self, path: &str) -> Result<(), CgroupError> {
        self.set_frozen(path, true)
    }

    fn thaw(&self, path: &str) -> Result<(), CgroupError> {
        self.set_frozen(path, false)
    }

    /// On v2 `cpu_shares` is derived from `cpu.weight` ([`crate::weight_to_shares`]), so it
    /// round-trips only approximately.
    fn read_resources(&self, path: &str) -> Result<Resources, CgroupError> {
        let comps = components(path)?;
        let d = join(self.root(), &comps);
        if !d.is_dir() {
            return Err(CgroupError::NotFound(comps.join("/")));
        }
        let mut r = Resources::default();
        cpu::Cpu::read(&d, &mut r)?;
        memory::Memory::read(&d, &mut r)?;
        pids::Pids::read(&d, &mut r)?;
        cpuset::CpuSet::read(&d, &mut r)?;
        hugetlb::HugeTlb::read(&d, &mut r)?;
        Ok(r)
    }

    fn read_stats(&self, path: &str) -> Result<Stats, CgroupError> {
        let comps = components(path)?;
        let dir = join(self.root(), &comps);
        if !dir.exists() {
            return Err(StatsError::NotFound(path.to_string()).into());
        }
        let mut s = Stats::default();
        memory::Memory::stats(&dir, &mut s)?;
        cpu::Cpu::stats(&dir, &mut s)?;
        pids::Pids::stats(&dir, &mut s)?;
        io::Io::stats(&dir, &mut s)?;
        if comps.is_empty() {
            let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
            memory::root_stats(&dir, &meminfo, &mut s);
        }
        Ok(s)
    }

    fn children(&self, path: &str) -> Vec<String> {
        match components(path) {
            Ok(comps) => child_names(&join(self.root(), &comps)),
            Err(_) => Vec::new(),
        }
    }
}
