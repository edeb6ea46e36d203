//! The cgroup v1 cgroupfs driver: one directory per controller mount (co-mounts such as
//! `cpu,cpuacct` once), each controller's files written by its own module. On a hybrid
//! machine the cgroup2 mount (`unified`) hosts what v1 lacks — hugetlb limits, `cgroup.kill`,
//! PSI — and is swept on removal like the v1 mounts.

mod cpu;
mod cpuacct;
pub(crate) mod cpuset;
mod freezer;
mod hugetlb;
mod memory;
pub(crate) mod pids;

use crate::common::{
    DeleteRetries, Files, check_writable, child_names, collect_pids_in, components, join,
    kill_frozen, non_root, offers,
};
use crate::controller::{Controller, ControllerKind};
use crate::error::CgroupError;
use crate::hierarchy::Hierarchy;
use crate::manager::CgroupManager;
use crate::resources::Resources;
use crate::stats::{Stats, StatsError, pressure};
use std::path::{Path, PathBuf};

/// The v1 controllers a cgroup is created in (those mounted). Others (devices, blkio, …)
/// are left to the OCI runtime, but removal sweeps every mount.
const MANAGED: &[ControllerKind] = &[
    ControllerKind::Cpu,
    ControllerKind::Cpuacct,
    ControllerKind::Cpuset,
    ControllerKind::Memory,
    ControllerKind::Pids,
    ControllerKind::Hugetlb,
    ControllerKind::Freezer,
];

/// The controllers whose directories decide `exists`, as upstream's allowlist (which
/// leaves out freezer, devices and the rest that other tools may or may not create).
const EXISTS: &[ControllerKind] = &[
    ControllerKind::Cpu,
    ControllerKind::Cpuacct,
    ControllerKind::Cpuset,
    ControllerKind::Memory,
    ControllerKind::Pids,
    ControllerKind::Hugetlb,
];

/// One v1 mount a cgroup is created in.
#[derive(Debug, Clone)]
struct Mount {
    path: PathBuf,
    /// This mount hosts cpuset: new directories need cpus/mems copied.
    cpuset: bool,
}

/// The cgroup v1 manager.
#[derive(Debug, Clone)]
pub struct V1Manager {
    h: Hierarchy,
    retries: DeleteRetries,
    files: Files,
}

impl V1Manager {
    pub fn new(h: Hierarchy) -> V1Manager {
        V1Manager {
            h,
            retries: DeleteRetries::default(),
            files: Files::default(),
        }
    }

    pub fn with_delete_retries(mut self, retries: DeleteRetries) -> V1Manager {
        self.retries = retries;
        self
    }

    #[cfg(test)]
    pub(crate) fn fake(h: Hierarchy) -> V1Manager {
        V1Manager {
            files: Files { fake: true },
            ..V1Manager::new(h)
        }
    }

    /// The mount of `c`, when it is mounted.
    fn mount(&self, c: ControllerKind) -> Option<PathBuf> {
        self.h.mount(c.name()).filter(|m| m.is_dir())
    }

    /// The directory of cgroup `comps` in controller `C`, when `C` is mounted.
    fn dir<C: Controller>(&self, comps: &[String]) -> Option<PathBuf> {
        self.mount(C::KIND).map(|m| join(&m, comps))
    }

    /// The distinct mounts of the managed controllers.
    fn mounts(&self) -> Vec<Mount> {
        let mut out: Vec<Mount> = Vec::new();
        for &c in MANAGED {
            let Some(m) = self.mount(c) else { continue };
            let cpuset = c == ControllerKind::Cpuset;
            match out.iter_mut().find(|p| p.path == m) {
                Some(p) => p.cpuset |= cpuset,
                None => out.push(Mount { path: m, cpuset }),
            }
        }
        out
    }

    /// Hugetlb limits go to the hybrid cgroup2 mount when v1 has no hugetlb mount.
    fn hugetlb_via_unified(&self) -> bool {
        self.mount(ControllerKind::Hugetlb).is_none()
    }

    /// Every mount a cgroup may have been created in, by us or by an OCI runtime below us.
    fn sweep_mounts(&self) -> Vec<PathBuf> {
        let mut v = self.h.all_mounts();
        v.extend(self.h.unified().map(Path::to_path_buf));
        v
    }

    fn check_controllers(&self, r: &Resources) -> Result<(), CgroupError> {
        fn need<C: Controller>(m: &V1Manager, r: &Resources) -> Result<(), CgroupError> {
            match C::wanted(r) {
                Some(field) if m.mount(C::KIND).is_none() => Err(CgroupError::ControllerMissing {
                    controller: C::KIND.name(),
                    field,
                }),
                _ => Ok(()),
            }
        }
        need::<cpu::Cpu>(self, r)?;
        need::<memory::Memory>(self, r)?;
        need::<pids::Pids>(self, r)?;
        need::<cpuset::CpuSet>(self, r)?;
        if self.hugetlb_via_unified() && !self.h.unified().is_some_and(|u| offers(u, "hugetlb")) {
            need::<hugetlb::HugeTlb>(self, r)?;
        }
        Ok(())
    }

    fn apply(&self, comps: &[String], r: &Resources) -> Result<(), CgroupError> {
        if r.is_empty() {
            return Ok(());
        }
        fn one<C: Controller>(
            m: &V1Manager,
            comps: &[String],
            r: &Resources,
        ) -> Result<(), CgroupError> {
            match m.dir::<C>(comps) {
                Some(d) => C::apply(&m.files, &d, r),
                None => Ok(()),
            }
        }
        one::<cpuset::CpuSet>(self, comps, r)?;
        one::<cpu::Cpu>(self, comps, r)?;
        one::<memory::Memory>(self, comps, r)?;
        one::<pids::Pids>(self, comps, r)?;
        if !self.hugetlb_via_unified() {
            one::<hugetlb::HugeTlb>(self, comps, r)?;
        } else if let Some(u) = self.h.unified()
            && !r.hugetlb.is_empty()
        {
            crate::v2::apply_hugetlb(&self.files, &join(u, comps), r)?;
        }
        Ok(())
    }

    fn set_frozen(&self, path: &str, frozen: bool) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        let Some(dir) = self.dir::<freezer::Freezer>(&comps) else {
            return Err(CgroupError::ControllerMissing {
                controller: "freezer",
                field: if frozen { "freeze" } else { "thaw" },
            });
        };
        freezer::set_frozen(&self.files, &dir, frozen)
    }
}

impl CgroupManager for V1Manager {
    fn hierarchy(&self) -> &Hierarchy {
        &self.h
    }

    fn has_controller(&self, c: ControllerKind) -> bool {
        if self.mount(c).is_some() {
            return true;
        }
        c == ControllerKind::Hugetlb && self.h.unified().is_some_and(|u| offers(u, "hugetlb"))
    }

    fn check_root(&self) -> Result<(), CgroupError> {
        let mounts = self.mounts();
        if mounts.is_empty() {
            return Err(CgroupError::RootMissing(self.h.root().to_path_buf()));
        }
        for m in &mounts {
            check_writable(&m.path)?;
        }
        if let Some(u) = self.h.unified() {
            check_writable(u)?;
        }
        Ok(())
    }

    fn create(&self, path: &str, r: &Resources) -> Result<(), CgroupError> {
        let comps = components(path)?;
        r.validate()?;
        self.check_root()?;
        self.check_controllers(r)?;
        let mut created: Vec<PathBuf> = Vec::new();
        let result = (|| {
            for m in self.mounts() {
                self.files
                    .create_dirs(&m.path, &comps, &mut created, |parent, dir| {
                        if m.cpuset {
                            cpuset::inherit(&self.files, parent, dir)?;
                        }
                        Ok(())
                    })?;
            }
            if let Some(u) = self.h.unified() {
                self.files
                    .create_dirs(u, &comps, &mut created, |_, _| Ok(()))?;
                // The hybrid mount only hosts what v1 lacks, and only when it is asked for:
                // its root is shared with whatever else runs on the machine.
                if self.hugetlb_via_unified() && !r.hugetlb.is_empty() {
                    crate::v2::enable_along(&self.files, u, &comps, &[ControllerKind::Hugetlb], r)?;
                }
            }
            self.apply(&comps, r)
        })();
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
        let mounts = self.mounts();
        if mounts.is_empty() || mounts.iter().any(|m| !join(&m.path, &comps).is_dir()) {
            return Err(CgroupError::NotFound(comps.join("/")));
        }
        self.check_controllers(r)?;
        if let Some(u) = self.h.unified()
            && self.hugetlb_via_unified()
            && !r.hugetlb.is_empty()
        {
            crate::v2::enable_along(&self.files, u, &comps, &[ControllerKind::Hugetlb], r)?;
        }
        self.apply(&comps, r)
    }

    fn delete(&self, path: &str) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        let targets = self
            .sweep_mounts()
            .iter()
            .map(|m| join(m, &comps))
            .collect();
        self.files.delete_trees(targets, self.retries, || {
            let _ = self.kill_all(path);
        })
    }

    fn exists(&self, path: &str) -> bool {
        let Ok(comps) = components(path) else {
            return false;
        };
        let mut mounts = EXISTS.iter().filter_map(|&c| self.mount(c)).peekable();
        mounts.peek().is_some() && mounts.all(|m| join(&m, &comps).is_dir())
    }

    fn add_process(&self, path: &str, pid: i32) -> Result<(), CgroupError> {
        let comps = components(path)?;
        for m in self.mounts() {
            self.files.write(
                &join(&m.path, &comps).join("cgroup.procs"),
                &pid.to_string(),
            )?;
        }
        if let Some(u) = self.h.unified() {
            let dir = join(u, &comps);
            if dir.is_dir() {
                self.files
                    .write(&dir.join("cgroup.procs"), &pid.to_string())?;
            }
        }
        Ok(())
    }

    fn pids(&self, path: &str) -> Result<Vec<i32>, CgroupError> {
        let comps = components(path)?;
        let dirs: Vec<PathBuf> = self
            .sweep_mounts()
            .iter()
            .map(|m| join(m, &comps))
            .filter(|d| d.is_dir())
            .collect();
        if dirs.is_empty() {
            return Err(CgroupError::NotFound(comps.join("/")));
        }
        collect_pids_in(&dirs)
    }

    /// Freezes, signals each pid, thaws, so nothing forks away in between; the hybrid
    /// mount's `cgroup.kill` is used too, but does not reach processes only v1 knows.
    fn kill_all(&self, path: &str) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        if let Some(u) = self.h.unified() {
            let f = join(u, &comps).join("cgroup.kill");
            if f.exists() {
                self.files.write(&f, "1")?;
            }
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

    fn read_resources(&self, path: &str) -> Result<Resources, CgroupError> {
        let comps = components(path)?;
        let Some(mem) = self.dir::<memory::Memory>(&comps) else {
            return Err(CgroupError::ControllerMissing {
                controller: "memory",
                field: "read_resources",
            });
        };
        if !mem.is_dir() {
            return Err(CgroupError::NotFound(comps.join("/")));
        }
        let mut r = Resources::default();
        memory::Memory::read(&mem, &mut r)?;
        if let Some(d) = self.dir::<cpu::Cpu>(&comps) {
            cpu::Cpu::read(&d, &mut r)?;
        }
        if let Some(d) = self.dir::<pids::Pids>(&comps) {
            pids::Pids::read(&d, &mut r)?;
        }
        if let Some(d) = self.dir::<cpuset::CpuSet>(&comps) {
            cpuset::CpuSet::read(&d, &mut r)?;
        }
        if let Some(d) = self.dir::<hugetlb::HugeTlb>(&comps) {
            hugetlb::HugeTlb::read(&d, &mut r)?;
        } else if let Some(u) = self.h.unified() {
            crate::v2::read_hugetlb(&join(u, &comps), &mut r)?;
        }
        Ok(r)
    }

    fn read_stats(&self, path: &str) -> Result<Stats, CgroupError> {
        let comps = components(path)?;
        let dir = |c: ControllerKind| self.h.dir(c.name(), &comps.join("/"));
        let mem = dir(ControllerKind::Memory);
        if !mem.exists() {
            return Err(StatsError::NotFound(path.to_string()).into());
        }
        let mut s = Stats::default();
        memory::Memory::stats(&mem, &mut s)?;
        cpu::Cpu::stats(&dir(ControllerKind::Cpu), &mut s)?;
        cpuacct::CpuAcct::stats(&dir(ControllerKind::Cpuacct), &mut s)?;
        pids::Pids::stats(&dir(ControllerKind::Pids), &mut s)?;
        // A hybrid machine's unified mount may carry PSI for the same path.
        if let Some(u) = self.h.unified() {
            let d = join(u, &comps);
            s.psi.cpu = pressure(&d, "cpu.pressure");
            s.psi.memory = pressure(&d, "memory.pressure");
            s.psi.io = pressure(&d, "io.pressure");
        }
        Ok(s)
    }

    fn children(&self, path: &str) -> Vec<String> {
        let Ok(comps) = components(path) else {
            return Vec::new();
        };
        self.dir::<memory::Memory>(&comps)
            .map(|d| child_names(&d))
            .unwrap_or_default()
    }
}
