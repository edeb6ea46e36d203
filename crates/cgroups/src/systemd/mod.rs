//! The systemd cgroup driver (upstream's kubelet with `cgroupDriver: systemd`, runc's and
//! youki's systemd managers) for cgroup v2 hosts whose init is systemd. The kubelet names
//! cgroups in its internal form (`kubepods/burstable/pod<uid>`); each is a slice unit
//! ([`names`]) that systemd creates, updates and stops through its D-Bus API ([`dbus`]),
//! with the limits as unit properties ([`properties`]) so a `systemctl daemon-reload` keeps
//! them. As runc does, the values are then written to the cgroup files too (systemd rounds
//! CPU quotas to 10ms and has no property for hugetlb), the v2 controllers are enabled
//! along the path, and everything read (statistics, processes, limits, freezing, killing)
//! goes through the v2 driver on the slice's directory.

mod dbus;
pub mod names;
pub mod properties;

use crate::common::{components, non_root};
use crate::controller::ControllerKind;
use crate::error::CgroupError;
use crate::hierarchy::Hierarchy;
use crate::manager::CgroupManager;
use crate::resources::Resources;
use crate::stats::Stats;
use crate::v2::{ENABLED, V2Manager, enable_along};
use dbus::{Outcome, Systemd};
use std::path::Path;

/// Present while systemd is the running init (sd_booted(3), runc's `IsRunningSystemd`).
const SYSTEMD_RUNTIME_DIR: &str = "/run/systemd/system";

/// Whether this machine runs systemd as init.
pub fn running_systemd() -> bool {
    Path::new(SYSTEMD_RUNTIME_DIR).is_dir()
}

/// The systemd cgroup manager; paths are the kubelet's internal cgroup names.
#[derive(Debug, Clone)]
pub struct SystemdManager {
    fs: V2Manager,
    bus: Systemd,
}

impl SystemdManager {
    /// Fails, saying why, on a machine without systemd or without a unified hierarchy.
    pub fn new(h: Hierarchy) -> Result<SystemdManager, CgroupError> {
        if !running_systemd() {
            return Err(CgroupError::SystemdUnavailable {
                reason: "systemd is not the running init (no /run/systemd/system)",
            });
        }
        if !h.is_v2() {
            return Err(CgroupError::SystemdUnavailable {
                reason: "only the unified cgroup v2 hierarchy is supported",
            });
        }
        Ok(SystemdManager {
            fs: V2Manager::new(h),
            bus: Systemd::default(),
        })
    }

    /// The cgroup directory (relative to the hierarchy root) of internal name `path`.
    pub fn cgroup_path(path: &str) -> String {
        names::to_systemd(path)
    }

    fn fs_comps(path: &str) -> Result<Vec<String>, CgroupError> {
        components(&names::to_systemd(&components(path)?.join("/")))
    }

    /// Writes what systemd was told to the files as well, with the controllers enabled on
    /// every ancestor (runc's `fs2.CreateCgroupPath` and `Set` after the unit).
    fn write_files(&self, comps: &[String], r: &Resources) -> Result<(), CgroupError> {
        enable_along(
            &crate::common::Files::default(),
            self.fs.hierarchy().root(),
            comps,
            ENABLED,
            r,
        )?;
        self.fs.apply(comps, r)
    }
}

impl CgroupManager for SystemdManager {
    fn hierarchy(&self) -> &Hierarchy {
        self.fs.hierarchy()
    }

    fn has_controller(&self, c: ControllerKind) -> bool {
        self.fs.has_controller(c)
    }

    fn check_root(&self) -> Result<(), CgroupError> {
        self.fs.check_root()
    }

    fn create(&self, path: &str, r: &Resources) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        r.validate()?;
        self.check_root()?;
        let unit = names::slice_name(&comps.join("/"));
        let parent = names::parent_slice(&unit);
        let props = properties::slice_properties(&unit, &parent, r);
        if self.bus.start_transient(&unit, props)? == Outcome::Exists {
            self.bus
                .set_properties(&unit, properties::resource_properties(r))?;
        }
        self.write_files(&Self::fs_comps(path)?, r)
    }

    fn update(&self, path: &str, r: &Resources) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        r.validate()?;
        let fs = Self::fs_comps(path)?;
        if !self.fs.hierarchy().root().join(fs.join("/")).is_dir() {
            return Err(CgroupError::NotFound(fs.join("/")));
        }
        let unit = names::slice_name(&comps.join("/"));
        let props = properties::resource_properties(r);
        // A directory systemd does not know as a unit (made by another driver) still takes
        // the values through its files.
        if !props.is_empty() {
            self.bus.set_properties(&unit, props)?;
        }
        self.write_files(&fs, r)
    }

    /// Stops the slice (systemd stops what runs in it and removes its cgroups), then
    /// removes whatever directory is left, waiting while it is busy.
    fn delete(&self, path: &str) -> Result<(), CgroupError> {
        let comps = non_root(path)?;
        let unit = names::slice_name(&comps.join("/"));
        self.bus.stop(&unit)?;
        self.fs.delete(&Self::cgroup_path(path))
    }

    /// The slice's directory with the cpu, memory and pids controllers (those the root
    /// offers). Unlike the v2 driver, cpuset and hugetlb are not required: systemd rewrites
    /// its slices' `cgroup.subtree_control` whenever it realizes a unit in them (a
    /// container's scope, for one) and drops cpuset where no unit sets `AllowedCPUs`, so a
    /// pod slice would stop "existing" once its first container started, and its removal
    /// would be skipped. cpu, memory and pids stay: every slice is started with their
    /// accounting on.
    fn exists(&self, path: &str) -> bool {
        let Ok(comps) = components(&Self::cgroup_path(path)) else {
            return false;
        };
        let root = self.fs.hierarchy().root();
        let Ok(have) =
            std::fs::read_to_string(root.join(comps.join("/")).join("cgroup.controllers"))
        else {
            return false;
        };
        let offered = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        ["cpu", "memory", "pids"]
            .into_iter()
            .filter(|c| offered.split_whitespace().any(|o| o == *c))
            .all(|c| have.split_whitespace().any(|h| h == c))
    }

    fn add_process(&self, path: &str, pid: i32) -> Result<(), CgroupError> {
        self.fs.add_process(&Self::cgroup_path(path), pid)
    }

    fn pids(&self, path: &str) -> Result<Vec<i32>, CgroupError> {
        self.fs.pids(&Self::cgroup_path(path))
    }

    fn kill_all(&self, path: &str) -> Result<(), CgroupError> {
        non_root(path)?;
        self.fs.kill_all(&Self::cgroup_path(path))
    }

    fn freeze(&self, path: &str) -> Result<(), CgroupError> {
        non_root(path)?;
        self.fs.freeze(&Self::cgroup_path(path))
    }

    fn thaw(&self, path: &str) -> Result<(), CgroupError> {
        non_root(path)?;
        self.fs.thaw(&Self::cgroup_path(path))
    }

    fn read_resources(&self, path: &str) -> Result<Resources, CgroupError> {
        self.fs.read_resources(&Self::cgroup_path(path))
    }

    fn read_stats(&self, path: &str) -> Result<Stats, CgroupError> {
        self.fs.read_stats(&Self::cgroup_path(path))
    }

    /// Child slices by their internal names (upstream's `CgroupName` of each directory:
    /// `kubepods-burstable-pod1_2.slice` is `pod1-2`); other units (container scopes) by
    /// their directory names.
    fn children(&self, path: &str) -> Vec<String> {
        self.fs
            .children(&Self::cgroup_path(path))
            .into_iter()
            .map(|n| {
                if n.ends_with(".slice") {
                    names::parse_systemd(&n).pop().unwrap_or(n)
                } else {
                    n
                }
            })
            .collect()
    }
}
