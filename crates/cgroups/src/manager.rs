//! The cgroupfs driver: create, update, delete, freeze and kill cgroups by path, on v1 (one
//! directory per controller mount) or v2 (one directory, controllers enabled from above).
//!
//! Paths are relative to the hierarchy root (`kubepods/burstable/pod<uid>`); a leading `/`
//! is ignored. Upstream's cgroupfs manager is the model: create every ancestor, copy the
//! parent's cpuset so a new v1 cpuset is usable, enable controllers in the parents'
//! `cgroup.subtree_control` on v2, and retry busy removals before killing stragglers.

use crate::error::CgroupError;
use crate::hierarchy::Hierarchy;
use crate::resources::{Resources, cpu_max, shares_to_weight};
use crate::stats::{self, Stats};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The v1 controllers a cgroup is created in (those mounted). Others (devices, blkio, …)
/// are left to the OCI runtime, but removal sweeps every mount.
const V1_CONTROLLERS: &[&str] = &[
    "cpu", "cpuacct", "cpuset", "memory", "pids", "hugetlb", "freezer",
];

/// v2 controllers enabled on every ancestor when the parent offers them: the kubelet's set
/// (cpu, cpuset, hugetlb, memory, pids; upstream's v2 `Exists` requires them) plus io for
/// stats.
const V2_CONTROLLERS: &[&str] = &["cpu", "cpuset", "hugetlb", "io", "memory", "pids"];

/// v2 controllers a cgroup must have for upstream's `Exists` (those the root offers).
const V2_REQUIRED: &[&str] = &["cpu", "cpuset", "hugetlb", "memory", "pids"];

/// v1 controllers whose directories decide `exists`, as upstream's allowlist (which leaves
/// out freezer, devices and the rest that other tools may or may not create).
const V1_EXISTS: &[&str] = &["cpu", "cpuacct", "cpuset", "memory", "pids", "hugetlb"];

const FREEZE_POLLS: u32 = 200;
const POLL: Duration = Duration::from_millis(10);
const MAX_DELETE_DELAY: Duration = Duration::from_millis(200);

/// Where one cgroup lives: a v1 controller mount or a v2 tree (the whole hierarchy, or the
/// hybrid `unified` mount).
#[derive(Debug, Clone)]
struct Place {
    mount: PathBuf,
    v2: bool,
    /// v1: this mount hosts cpuset (new directories need cpus/mems copied).
    cpuset: bool,
    /// hybrid unified mount: only holds what v1 lacks.
    hybrid: bool,
}

/// The cgroupfs cgroup manager.
#[derive(Debug, Clone)]
pub struct Manager {
    h: Hierarchy,
    delete_attempts: u32,
    kill_after: u32,
    /// Test trees on a plain filesystem: files are created on write and removed before
    /// rmdir, and no signal is ever sent.
    fake: bool,
}

impl Manager {
    pub fn new(h: Hierarchy) -> Manager {
        Manager {
            h,
            delete_attempts: 10,
            kill_after: 3,
            fake: false,
        }
    }

    /// A manager for this machine's hierarchy ([`Hierarchy::detect`]).
    pub fn detect() -> Manager {
        Manager::new(Hierarchy::detect())
    }

    /// How many removal rounds `delete` makes (≥ 1), and after how many failed rounds it
    /// starts killing the processes left in the cgroup.
    pub fn with_delete_retries(mut self, attempts: u32, kill_after: u32) -> Manager {
        self.delete_attempts = attempts.max(1);
        self.kill_after = kill_after;
        self
    }

    #[cfg(test)]
    pub(crate) fn fake(h: Hierarchy) -> Manager {
        Manager {
            fake: true,
            ..Manager::new(h)
        }
    }

    pub fn hierarchy(&self) -> &Hierarchy {
        &self.h
    }

    fn places(&self) -> Vec<Place> {
        if self.h.is_v2() {
            return vec![Place {
                mount: self.h.root().to_path_buf(),
                v2: true,
                cpuset: false,
                hybrid: false,
            }];
        }
        let mut out: Vec<Place> = Vec::new();
        for c in V1_CONTROLLERS {
            let Some(m) = self.h.mount(c) else { continue };
            if !m.is_dir() {
                continue;
            }
            match out.iter_mut().find(|p| p.mount == m) {
                Some(p) => p.cpuset |= *c == "cpuset",
                None => out.push(Place {
                    mount: m,
                    v2: false,
                    cpuset: *c == "cpuset",
                    hybrid: false,
                }),
            }
        }
        if let Some(u) = self.h.unified() {
            out.push(Place {
                mount: u.to_path_buf(),
                v2: true,
                cpuset: false,
                hybrid: true,
            });
        }
        out
    }

    /// Whether limits of `controller` (cpu, memory, pids, cpuset, hugetlb, freezer, …) can
    /// be set here: mounted on v1 (for hugetlb, also offered by the hybrid cgroup2 mount), or
    /// offered by the v2 root. Upstream's kubelet sets hugetlb limits only when this holds
    /// for its v1 mounts.
    pub fn has_controller(&self, controller: &str) -> bool {
        let offered = |root: &Path| {
            read(&root.join("cgroup.controllers"))
                .is_ok_and(|t| t.split_whitespace().any(|c| c == controller))
        };
        if self.h.is_v2() {
            return offered(self.h.root());
        }
        if self.h_has_v1(controller) {
            return true;
        }
        controller == "hugetlb" && self.h.unified().is_some_and(offered)
    }

    /// Checks that every controller mount the driver writes to exists and is writable.
    pub fn check_root(&self) -> Result<(), CgroupError> {
        let places = self.places();
        if places.iter().all(|p| p.hybrid) {
            return Err(CgroupError::RootMissing(self.h.root().to_path_buf()));
        }
        for p in &places {
            if !p.mount.is_dir() {
                return Err(CgroupError::RootMissing(p.mount.clone()));
            }
            nix::unistd::access(&p.mount, nix::unistd::AccessFlags::W_OK).map_err(|e| {
                CgroupError::RootNotWritable {
                    path: p.mount.clone(),
                    source: std::io::Error::from_raw_os_error(e as i32),
                }
            })?;
        }
        Ok(())
    }

    /// Creates cgroup `path` (and its missing ancestors) in every relevant controller and
    /// applies `r`. Idempotent. On failure, the directories this call made are removed again.
    pub fn create(&self, path: &str, r: &Resources) -> Result<(), CgroupError> {
        let comps = components(path)?;
        r.validate()?;
        self.check_root()?;
        let places = self.places();
        self.check_controllers(&places, r)?;
        let mut created: Vec<PathBuf> = Vec::new();
        let result = self
            .create_dirs(&places, &comps, &mut created)
            .and_then(|()| {
                self.enable_controllers(&places, &comps, r)?;
                self.apply(&places, &comps, r)
            });
        if result.is_err() {
            for d in created.iter().rev() {
                let _ = self.rmdir(d);
            }
        }
        result
    }

    /// Applies `r` to an existing cgroup.
    pub fn update(&self, path: &str, r: &Resources) -> Result<(), CgroupError> {
        let comps = components(path)?;
        r.validate()?;
        let places = self.places();
        let missing = places
            .iter()
            .filter(|p| !p.hybrid)
            .any(|p| !join(&p.mount, &comps).is_dir());
        if places.is_empty() || missing {
            return Err(CgroupError::NotFound(comps.join("/")));
        }
        self.check_controllers(&places, r)?;
        self.enable_controllers(&places, &comps, r)?;
        self.apply(&places, &comps, r)
    }

    /// True when the cgroup exists as upstream's cgroup manager judges it: on v1, a
    /// directory in each mounted controller of cpu, cpuacct, cpuset, memory, pids, hugetlb;
    /// on v2, a directory whose `cgroup.controllers` has each of cpu, cpuset, hugetlb,
    /// memory, pids that the root offers.
    pub fn exists(&self, path: &str) -> bool {
        let Ok(comps) = components(path) else {
            return false;
        };
        if self.h.is_v2() {
            let dir = join(self.h.root(), &comps);
            let Ok(have) = read(&dir.join("cgroup.controllers")) else {
                return false;
            };
            let root = read(&self.h.root().join("cgroup.controllers")).unwrap_or_default();
            let root: Vec<&str> = root.split_whitespace().collect();
            return V2_REQUIRED
                .iter()
                .filter(|c| root.contains(c))
                .all(|c| have.split_whitespace().any(|h| h == *c));
        }
        let mut mounts = V1_EXISTS
            .iter()
            .filter_map(|c| self.h.mount(c))
            .filter(|m| m.is_dir())
            .peekable();
        mounts.peek().is_some() && mounts.all(|m| join(&m, &comps).is_dir())
    }

    /// Every process in the cgroup and its descendants, in any controller; sorted, unique.
    pub fn pids(&self, path: &str) -> Result<Vec<i32>, CgroupError> {
        let comps = components(path)?;
        let mut dirs: Vec<PathBuf> = self.sweep_mounts();
        dirs.iter_mut().for_each(|d| *d = join(d, &comps));
        dirs.retain(|d| d.is_dir());
        if dirs.is_empty() {
            return Err(CgroupError::NotFound(comps.join("/")));
        }
        let mut pids = Vec::new();
        for d in dirs {
            collect_pids(&d, &mut pids)?;
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// Moves process `pid` into the cgroup in every controller the driver manages.
    pub fn add_process(&self, path: &str, pid: i32) -> Result<(), CgroupError> {
        let comps = components(path)?;
        for p in self.places() {
            let dir = join(&p.mount, &comps);
            if p.hybrid && !dir.is_dir() {
                continue;
            }
            self.write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// SIGKILLs every process in the cgroup and below: v2 `cgroup.kill` where the kernel has
    /// it, otherwise (and for v1 controllers) freeze, signal each pid, thaw, so nothing forks
    /// away in between. Does not wait for the processes to exit.
    pub fn kill_all(&self, path: &str) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        let mut via_kill_file = false;
        for p in self.places().iter().filter(|p| p.v2) {
            let f = join(&p.mount, &comps).join("cgroup.kill");
            if f.exists() {
                self.write(&f, "1")?;
                via_kill_file = !p.hybrid;
            }
        }
        if via_kill_file || self.fake {
            return Ok(());
        }
        let frozen = self.freeze(path).is_ok();
        let pids = self.pids(path);
        if let Ok(pids) = &pids {
            let me = std::process::id() as i32;
            for &pid in pids.iter().filter(|&&p| p > 1 && p != me) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if frozen {
            self.thaw(path)?;
        }
        pids.map(|_| ())
    }

    /// Freezes every process in the cgroup, waiting until the kernel reports it frozen.
    pub fn freeze(&self, path: &str) -> Result<(), CgroupError> {
        self.set_frozen(path, true)
    }

    /// Thaws a frozen cgroup.
    pub fn thaw(&self, path: &str) -> Result<(), CgroupError> {
        self.set_frozen(path, false)
    }

    fn set_frozen(&self, path: &str, frozen: bool) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        if self.h.is_v2() {
            let dir = join(self.h.root(), &comps);
            self.write(&dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })?;
            let events = dir.join("cgroup.events");
            let want = if frozen { "frozen 1" } else { "frozen 0" };
            let mut state = String::new();
            for _ in 0..FREEZE_POLLS {
                let text = read(&events)?;
                state = format!(
                    "frozen {}",
                    text.lines()
                        .find_map(|l| l.strip_prefix("frozen "))
                        .unwrap_or("0")
                        .trim()
                );
                if state == want {
                    return Ok(());
                }
                std::thread::sleep(POLL);
            }
            return Err(CgroupError::Freeze {
                path: events,
                state,
                want,
            });
        }
        let Some(mount) = self.h.mount("freezer").filter(|m| m.is_dir()) else {
            return Err(CgroupError::ControllerMissing {
                controller: "freezer",
                field: if frozen { "freeze" } else { "thaw" },
            });
        };
        let file = join(&mount, &comps).join("freezer.state");
        let want = if frozen { "FROZEN" } else { "THAWED" };
        let mut state = String::new();
        for i in 0..FREEZE_POLLS {
            // A freeze can stall in FREEZING while a task is in an uninterruptible state;
            // writing again retries it, as runc does.
            if i % 10 == 0 {
                self.write(&file, want)?;
            }
            state = read(&file)?.trim().to_string();
            if state == want {
                return Ok(());
            }
            std::thread::sleep(POLL);
        }
        if frozen {
            let _ = self.write(&file, "THAWED");
        }
        Err(CgroupError::Freeze {
            path: file,
            state,
            want,
        })
    }

    /// Removes the cgroup and every cgroup below it from every controller mount, deepest
    /// first. A busy directory (processes still leaving) is retried with growing pauses; after
    /// `kill_after` failed rounds the remaining processes are SIGKILLed. Deleting a cgroup
    /// that does not exist succeeds.
    pub fn delete(&self, path: &str) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        let mut targets: Vec<PathBuf> = self
            .sweep_mounts()
            .iter()
            .map(|m| join(m, &comps))
            .filter(|d| d.exists())
            .collect();
        let mut delay = POLL;
        for attempt in 1..=self.delete_attempts {
            if attempt > self.kill_after {
                let _ = self.kill_all(path);
            }
            let mut last: Option<(PathBuf, std::io::Error)> = None;
            targets.retain(|t| match self.remove_tree(t) {
                Ok(()) => false,
                Err(e) => {
                    last = Some(e);
                    true
                }
            });
            let Some((dir, err)) = last else {
                return Ok(());
            };
            let retryable = matches!(
                err.raw_os_error(),
                Some(libc::EBUSY) | Some(libc::ENOTEMPTY) | Some(libc::EAGAIN)
            );
            if !retryable || attempt == self.delete_attempts {
                return Err(CgroupError::Remove {
                    path: dir,
                    attempts: attempt,
                    source: err,
                });
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(MAX_DELETE_DELAY);
        }
        Ok(())
    }

    /// The limits currently set on the cgroup, as the kernel reports them: each field the
    /// hierarchy has a file for is Some, with "unlimited" as -1. On v2 `cpu_shares` is
    /// derived from `cpu.weight` ([`crate::weight_to_shares`]), so it round-trips only
    /// approximately; `hugetlb` lists every page size the kernel offers.
    pub fn read_resources(&self, path: &str) -> Result<Resources, CgroupError> {
        let comps = components(path)?;
        let opt = |p: PathBuf| -> Result<Option<String>, CgroupError> {
            match std::fs::read_to_string(&p) {
                Ok(t) => Ok(Some(t.trim().to_string())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(CgroupError::Read { path: p, source }),
            }
        };
        let num = |p: PathBuf| -> Result<Option<i64>, CgroupError> {
            Ok(opt(p.clone())?.map(|v| parse_limit(&v)))
        };
        let mut r = Resources::default();
        if self.h.is_v2() {
            let d = join(self.h.root(), &comps);
            if !d.is_dir() {
                return Err(CgroupError::NotFound(comps.join("/")));
            }
            r.cpu_shares = opt(d.join("cpu.weight"))?
                .and_then(|w| w.parse().ok())
                .map(crate::resources::weight_to_shares);
            if let Some(line) = opt(d.join("cpu.max"))? {
                let mut it = line.split_whitespace();
                r.cpu_quota = it.next().map(parse_limit);
                r.cpu_period = it.next().and_then(|p| p.parse().ok());
            }
            r.memory_limit = num(d.join("memory.max"))?;
            r.memory_high = num(d.join("memory.high"))?;
            r.pids_limit = num(d.join("pids.max"))?;
            r.cpuset_cpus = opt(d.join("cpuset.cpus"))?;
            r.cpuset_mems = opt(d.join("cpuset.mems"))?;
            r.hugetlb = hugetlb_limits(&d, ".max")?;
            return Ok(r);
        }
        let dir = |c: &str| {
            self.h
                .mount(c)
                .filter(|m| m.is_dir())
                .map(|m| join(&m, &comps))
        };
        let Some(mem) = dir("memory") else {
            return Err(CgroupError::ControllerMissing {
                controller: "memory",
                field: "read_resources",
            });
        };
        if !mem.is_dir() {
            return Err(CgroupError::NotFound(comps.join("/")));
        }
        r.memory_limit = num(mem.join("memory.limit_in_bytes"))?;
        if let Some(d) = dir("cpu") {
            r.cpu_shares = opt(d.join("cpu.shares"))?.and_then(|v| v.parse().ok());
            r.cpu_quota = num(d.join("cpu.cfs_quota_us"))?;
            r.cpu_period = opt(d.join("cpu.cfs_period_us"))?.and_then(|v| v.parse().ok());
        }
        if let Some(d) = dir("pids") {
            r.pids_limit = num(d.join("pids.max"))?;
        }
        if let Some(d) = dir("cpuset") {
            r.cpuset_cpus = opt(d.join("cpuset.cpus"))?;
            r.cpuset_mems = opt(d.join("cpuset.mems"))?;
        }
        if let Some(d) = dir("hugetlb") {
            r.hugetlb = hugetlb_limits(&d, ".limit_in_bytes")?;
        } else if let Some(u) = self.h.unified() {
            r.hugetlb = hugetlb_limits(&join(u, &comps), ".max")?;
        }
        Ok(r)
    }

    /// Usage statistics of the cgroup.
    pub fn read_stats(&self, path: &str) -> Result<Stats, CgroupError> {
        Ok(stats::read_stats(&self.h, path)?)
    }

    /// Every mount a cgroup may have been created in, by us or by an OCI runtime below us.
    fn sweep_mounts(&self) -> Vec<PathBuf> {
        let mut v = self.h.all_mounts();
        if let Some(u) = self.h.unified() {
            v.push(u.to_path_buf());
        }
        v
    }

    fn check_controllers(&self, places: &[Place], r: &Resources) -> Result<(), CgroupError> {
        if self.h.is_v2() {
            return Ok(()); // checked against cgroup.controllers while enabling
        }
        let has = |c: &str| self.h.mount(c).is_some_and(|m| m.is_dir());
        let need = |c: &'static str, field: &'static str, wanted: bool| {
            if wanted && !has(c) {
                Err(CgroupError::ControllerMissing {
                    controller: c,
                    field,
                })
            } else {
                Ok(())
            }
        };
        need("cpu", "cpu_shares", r.cpu_shares.is_some())?;
        need("cpu", "cpu_quota", r.cpu_quota.is_some())?;
        need("cpu", "cpu_period", r.cpu_period.is_some())?;
        need("memory", "memory_limit", r.memory_limit.is_some())?;
        need("pids", "pids_limit", r.pids_limit.is_some())?;
        need("cpuset", "cpuset_cpus", r.cpuset_cpus.is_some())?;
        need("cpuset", "cpuset_mems", r.cpuset_mems.is_some())?;
        if !r.hugetlb.is_empty() && !has("hugetlb") {
            let unified_has = places.iter().any(|p| {
                p.hybrid
                    && read(&p.mount.join("cgroup.controllers"))
                        .is_ok_and(|t| t.split_whitespace().any(|c| c == "hugetlb"))
            });
            if !unified_has {
                return Err(CgroupError::ControllerMissing {
                    controller: "hugetlb",
                    field: "hugetlb",
                });
            }
        }
        Ok(())
    }

    fn create_dirs(
        &self,
        places: &[Place],
        comps: &[String],
        created: &mut Vec<PathBuf>,
    ) -> Result<(), CgroupError> {
        for p in places {
            let mut cur = p.mount.clone();
            for c in comps {
                let parent = cur.clone();
                cur.push(c);
                if !cur.is_dir() {
                    match std::fs::create_dir(&cur) {
                        Ok(()) => created.push(cur.clone()),
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(source) => {
                            return Err(CgroupError::Create {
                                path: cur.clone(),
                                source,
                            });
                        }
                    }
                }
                // Checked on existing levels too: a concurrent create may have made the
                // directory a moment ago without having filled it in yet.
                if p.cpuset {
                    for f in ["cpuset.cpus", "cpuset.mems"] {
                        let own = read(&cur.join(f)).unwrap_or_default();
                        if own.trim().is_empty() {
                            let from = read(&parent.join(f))?;
                            self.write(&cur.join(f), from.trim())?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// v2: makes the controllers this cgroup needs available to it by enabling them in
    /// `cgroup.subtree_control` of every ancestor, root first.
    fn enable_controllers(
        &self,
        places: &[Place],
        comps: &[String],
        r: &Resources,
    ) -> Result<(), CgroupError> {
        for p in places.iter().filter(|p| p.v2) {
            let mut wanted: Vec<&'static str> = Vec::new();
            if !p.hybrid {
                wanted.extend(V2_CONTROLLERS);
            } else if !r.hugetlb.is_empty() && !self.h_has_v1("hugetlb") {
                // The hybrid mount only hosts what v1 lacks, and only when it is asked for:
                // its root is shared with whatever else runs on the machine.
                wanted.push("hugetlb");
            }
            if wanted.is_empty() {
                continue;
            }
            let mut dir = p.mount.clone();
            for c in comps {
                self.enable_in(&dir, &wanted, r)?;
                dir.push(c);
            }
        }
        Ok(())
    }

    fn h_has_v1(&self, c: &str) -> bool {
        self.h.mount(c).is_some_and(|m| m.is_dir())
    }

    fn enable_in(&self, dir: &Path, wanted: &[&str], r: &Resources) -> Result<(), CgroupError> {
        let hugetlb = !r.hugetlb.is_empty();
        let cpuset = r.cpuset_cpus.is_some() || r.cpuset_mems.is_some();
        let available = read(&dir.join("cgroup.controllers"))?;
        let available: Vec<&str> = available.split_whitespace().collect();
        let ctl = dir.join("cgroup.subtree_control");
        let enabled = read(&ctl)?;
        let enabled: Vec<&str> = enabled
            .split_whitespace()
            .map(|c| c.trim_start_matches('+'))
            .collect();
        let required = |c: &str| match c {
            "cpu" => r.cpu_shares.is_some() || r.cpu_quota.is_some() || r.cpu_period.is_some(),
            "memory" => r.memory_limit.is_some() || r.memory_high.is_some(),
            "pids" => r.pids_limit.is_some(),
            "cpuset" => cpuset,
            "hugetlb" => hugetlb,
            _ => false,
        };
        let mut missing = Vec::new();
        for c in wanted {
            if enabled.contains(c) {
                continue;
            }
            if available.contains(c) {
                missing.push(*c);
            } else if required(c) {
                return Err(CgroupError::ControllerMissing {
                    controller: static_name(c),
                    field: field_of(c),
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
        if self.write(&ctl, &line).is_ok() {
            return Ok(());
        }
        // One refused controller (e.g. cpu with realtime tasks present) must not block the
        // others; only a controller the limits need is an error.
        for c in missing {
            if let Err(e) = self.write(&ctl, &format!("+{c}"))
                && required(c)
            {
                return Err(e);
            }
        }
        Ok(())
    }

    fn apply(&self, places: &[Place], comps: &[String], r: &Resources) -> Result<(), CgroupError> {
        if r.is_empty() {
            return Ok(());
        }
        if self.h.is_v2() {
            let dir = join(self.h.root(), comps);
            return self.apply_v2(&dir, r);
        }
        let dir = |c: &str| self.h.mount(c).map(|m| join(&m, comps));
        if let Some(d) = dir("cpuset") {
            if let Some(v) = &r.cpuset_cpus {
                self.write(&d.join("cpuset.cpus"), v)?;
            }
            if let Some(v) = &r.cpuset_mems {
                self.write(&d.join("cpuset.mems"), v)?;
            }
        }
        if let Some(d) = dir("cpu") {
            if let Some(s) = r.cpu_shares {
                self.write(&d.join("cpu.shares"), &s.to_string())?;
            }
            self.apply_v1_cfs(&d, r)?;
        }
        if let (Some(d), Some(m)) = (dir("memory"), r.memory_limit) {
            self.write(&d.join("memory.limit_in_bytes"), &m.to_string())?;
        }
        if let (Some(d), Some(p)) = (dir("pids"), r.pids_limit) {
            self.write(&d.join("pids.max"), &max_or(p))?;
        }
        if !r.hugetlb.is_empty() {
            match dir("hugetlb").filter(|_| self.h_has_v1("hugetlb")) {
                Some(d) => {
                    for (size, limit) in &r.hugetlb {
                        self.write(
                            &d.join(format!("hugetlb.{size}.limit_in_bytes")),
                            &limit.to_string(),
                        )?;
                    }
                }
                None => {
                    if let Some(u) = places.iter().find(|p| p.hybrid) {
                        let d = join(&u.mount, comps);
                        for (size, limit) in &r.hugetlb {
                            self.write(&d.join(format!("hugetlb.{size}.max")), &limit.to_string())?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The kernel checks a new period against the current quota (and vice versa), so one
    /// order can be refused where the other is accepted; like runc, try the period first and,
    /// if it is refused, set the quota first.
    fn apply_v1_cfs(&self, d: &Path, r: &Resources) -> Result<(), CgroupError> {
        let quota_file = d.join("cpu.cfs_quota_us");
        let period_file = d.join("cpu.cfs_period_us");
        let mut quota_done = false;
        if let Some(p) = r.cpu_period {
            let v = p.to_string();
            if let Err(e) = self.write(&period_file, &v) {
                let Some(q) = r
                    .cpu_quota
                    .filter(|_| e.raw_os_error() == Some(libc::EINVAL))
                else {
                    return Err(e);
                };
                self.write(&quota_file, &q.to_string())?;
                quota_done = true;
                self.write(&period_file, &v)?;
            }
        }
        if let Some(q) = r.cpu_quota
            && !quota_done
        {
            self.write(&quota_file, &q.to_string())?;
        }
        Ok(())
    }

    fn apply_v2(&self, d: &Path, r: &Resources) -> Result<(), CgroupError> {
        if let Some(v) = &r.cpuset_cpus {
            self.write(&d.join("cpuset.cpus"), v)?;
        }
        if let Some(v) = &r.cpuset_mems {
            self.write(&d.join("cpuset.mems"), v)?;
        }
        if let Some(s) = r.cpu_shares {
            self.write(&d.join("cpu.weight"), &shares_to_weight(s).to_string())?;
        }
        if let Some(line) = cpu_max(r.cpu_quota, r.cpu_period) {
            self.write(&d.join("cpu.max"), &line)?;
        }
        if let Some(m) = r.memory_high {
            self.write(&d.join("memory.high"), &max_or(m))?;
        }
        if let Some(m) = r.memory_limit {
            self.write(&d.join("memory.max"), &max_or(m))?;
        }
        if let Some(p) = r.pids_limit {
            self.write(&d.join("pids.max"), &max_or(p))?;
        }
        for (size, limit) in &r.hugetlb {
            self.write(&d.join(format!("hugetlb.{size}.max")), &limit.to_string())?;
        }
        Ok(())
    }

    /// One write(2) of exactly `value`, as the kernel parses a cgroup file per write.
    fn write(&self, path: &Path, value: &str) -> Result<(), CgroupError> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(self.fake)
            .create(self.fake)
            .open(path)
            .map_err(|e| CgroupError::write(path, value, e))?;
        f.write_all(value.as_bytes())
            .map_err(|e| CgroupError::write(path, value, e))
    }

    fn rmdir(&self, d: &Path) -> std::io::Result<()> {
        if self.fake
            && let Ok(entries) = std::fs::read_dir(d)
        {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        match std::fs::remove_dir(d) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    /// Depth-first removal of `d` and its child cgroups; the first failure is returned with
    /// the directory it happened in.
    fn remove_tree(&self, d: &Path) -> Result<(), (PathBuf, std::io::Error)> {
        let entries = match std::fs::read_dir(d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err((d.to_path_buf(), e)),
        };
        let mut first: Option<(PathBuf, std::io::Error)> = None;
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir())
                && let Err(err) = self.remove_tree(&e.path())
            {
                first.get_or_insert(err);
            }
        }
        if let Some(err) = first {
            return Err(err);
        }
        self.rmdir(d).map_err(|e| (d.to_path_buf(), e))
    }
}

fn static_name(c: &str) -> &'static str {
    match c {
        "cpu" => "cpu",
        "memory" => "memory",
        "pids" => "pids",
        "cpuset" => "cpuset",
        "hugetlb" => "hugetlb",
        _ => "io",
    }
}

fn field_of(c: &str) -> &'static str {
    match c {
        "cpu" => "cpu_shares/cpu_quota/cpu_period",
        "memory" => "memory_limit/memory_high",
        "pids" => "pids_limit",
        "cpuset" => "cpuset_cpus/cpuset_mems",
        "hugetlb" => "hugetlb",
        _ => "io",
    }
}

/// A limit file's value: "max" and v1's page-rounded "no limit" (≥ 2^62) read as -1.
fn parse_limit(v: &str) -> i64 {
    if v == "max" {
        return -1;
    }
    match v.parse::<u64>() {
        Ok(n) if n >= 1 << 62 => -1,
        Ok(n) => n as i64,
        Err(_) => v.parse().unwrap_or(-1),
    }
}

/// `hugetlb.<size><suffix>` files of a cgroup directory, sorted by page size name.
fn hugetlb_limits(dir: &Path, suffix: &str) -> Result<Vec<(String, u64)>, CgroupError> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(size) = name
            .strip_prefix("hugetlb.")
            .and_then(|n| n.strip_suffix(suffix))
        else {
            continue;
        };
        if size.contains('.') {
            continue; // hugetlb.2MB.rsvd.max and friends
        }
        let v = read(&e.path())?;
        out.push((size.to_string(), parse_limit(v.trim()).max(0) as u64));
    }
    out.sort();
    Ok(out)
}

/// "-1 means unlimited" as the kernel's v2 files (and v1 `pids.max`) spell it.
fn max_or(v: i64) -> String {
    if v < 0 {
        "max".to_string()
    } else {
        v.to_string()
    }
}

/// The path's names, rejecting `.`/`..` so a cgroup path can never leave its mount.
fn components(path: &str) -> Result<Vec<String>, CgroupError> {
    let mut out = Vec::new();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        if c == "." || c == ".." {
            return Err(CgroupError::InvalidPath(path.to_string()));
        }
        out.push(c.to_string());
    }
    Ok(out)
}

/// Like [`components`], refusing the hierarchy root: killing, freezing or removing "the
/// root" would mean every process on the machine.
fn non_root(path: &str) -> Result<Vec<String>, CgroupError> {
    let comps = components(path)?;
    if comps.is_empty() {
        return Err(CgroupError::InvalidPath(path.to_string()));
    }
    Ok(comps)
}

fn join(base: &Path, comps: &[String]) -> PathBuf {
    let mut p = base.to_path_buf();
    p.extend(comps);
    p
}

fn read(p: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(p).map_err(|source| CgroupError::Read {
        path: p.to_path_buf(),
        source,
    })
}

fn collect_pids(dir: &Path, out: &mut Vec<i32>) -> Result<(), CgroupError> {
    match std::fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(text) => out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(CgroupError::Read {
                path: dir.join("cgroup.procs"),
                source,
            });
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&e.path(), out)?;
            }
        }
    }
    Ok(())
}
