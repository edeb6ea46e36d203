//! The cgroup manager interface (upstream's CgroupManager, youki's `CgroupManager`): create,
//! update, delete, freeze and kill cgroups by path, and read back their limits and usage.
//! [`crate::v1::V1Manager`] and [`crate::v2::V2Manager`] implement it on cgroupfs;
//! [`crate::systemd::SystemdManager`] by asking systemd for slice units.
//!
//! Paths are relative to the hierarchy root (`kubepods/burstable/pod<uid>`); a leading `/`
//! is ignored. Upstream's cgroupfs manager is the model: create every ancestor, copy the
//! parent's cpuset so a new v1 cpuset is usable, enable controllers in the parents'
//! `cgroup.subtree_control` on v2, and retry busy removals before killing stragglers.

use crate::common::DeleteRetries;
use crate::controller::ControllerKind;
use crate::error::CgroupError;
use crate::hierarchy::Hierarchy;
use crate::resources::Resources;
use crate::stats::Stats;
use std::sync::Arc;

/// A cgroup driver. Object-safe: callers hold an `Arc<dyn CgroupManager>` from [`detect`].
pub trait CgroupManager: Send + Sync + std::fmt::Debug {
    /// The mounted hierarchy the driver works in.
    fn hierarchy(&self) -> &Hierarchy;

    /// Whether limits of `controller` can be set here: mounted on v1 (for hugetlb, also
    /// offered by the hybrid cgroup2 mount), or offered by the v2 root. Upstream's kubelet
    /// sets hugetlb limits only when this holds.
    fn has_controller(&self, controller: ControllerKind) -> bool;

    /// Checks that every controller mount the driver writes to exists and is writable.
    fn check_root(&self) -> Result<(), CgroupError>;

    /// Creates cgroup `path` (and its missing ancestors) in every relevant controller and
    /// applies `r`. Idempotent. On failure, the directories this call made are removed again.
    fn create(&self, path: &str, r: &Resources) -> Result<(), CgroupError>;

    /// Applies `r` to an existing cgroup.
    fn update(&self, path: &str, r: &Resources) -> Result<(), CgroupError>;

    /// Removes the cgroup and every cgroup below it, deepest first. A busy directory
    /// (processes still leaving) is retried with growing pauses; after a few failed rounds
    /// the remaining processes are SIGKILLed ([`DeleteRetries`]). Deleting a cgroup that
    /// does not exist succeeds.
    fn delete(&self, path: &str) -> Result<(), CgroupError>;

    /// True when the cgroup exists as upstream's cgroup manager judges it: on v1, a
    /// directory in each mounted controller of cpu, cpuacct, cpuset, memory, pids, hugetlb;
    /// on v2, a directory whose `cgroup.controllers` has each of cpu, cpuset, hugetlb,
    /// memory, pids that the root offers.
    fn exists(&self, path: &str) -> bool;

    /// Moves process `pid` into the cgroup in every controller the driver manages.
    fn add_process(&self, path: &str, pid: i32) -> Result<(), CgroupError>;

    /// Every process in the cgroup and its descendants, in any controller; sorted, unique.
    fn pids(&self, path: &str) -> Result<Vec<i32>, CgroupError>;

    /// SIGKILLs every process in the cgroup and below. Does not wait for them to exit.
    fn kill_all(&self, path: &str) -> Result<(), CgroupError>;

    /// Freezes every process in the cgroup, waiting until the kernel reports it frozen.
    fn freeze(&self, path: &str) -> Result<(), CgroupError>;

    /// Thaws a frozen cgroup.
    fn thaw(&self, path: &str) -> Result<(), CgroupError>;

    /// The limits currently set on the cgroup, as the kernel reports them: each field the
    /// hierarchy has a file for is Some, with "unlimited" as -1; `hugetlb` lists every page
    /// size the kernel offers.
    fn read_resources(&self, path: &str) -> Result<Resources, CgroupError>;

    /// Usage statistics of the cgroup (of the machine, for the root).
    fn read_stats(&self, path: &str) -> Result<Stats, CgroupError>;

    /// The names of the cgroup's child cgroups, sorted; empty when it does not exist.
    fn children(&self, path: &str) -> Vec<String>;
}

/// The cgroupfs driver for this machine's hierarchy ([`Hierarchy::detect`]).
pub fn detect() -> Arc<dyn CgroupManager> {
    for_hierarchy(Hierarchy::detect())
}

/// The cgroupfs driver for `h`: v2 for a unified hierarchy, v1 (with the hybrid cgroup2
/// mount, if any) otherwise.
pub fn for_hierarchy(h: Hierarchy) -> Arc<dyn CgroupManager> {
    with_retries(h, DeleteRetries::default())
}

/// [`for_hierarchy`] with a removal patience other than the default.
pub fn with_retries(h: Hierarchy, retries: DeleteRetries) -> Arc<dyn CgroupManager> {
    if h.is_v2() {
        Arc::new(crate::v2::V2Manager::new(h).with_delete_retries(retries))
    } else {
        Arc::new(crate::v1::V1Manager::new(h).with_delete_retries(retries))
    }
}

/// The systemd driver for this machine: an error naming what is missing when the machine
/// does not run systemd or has no unified (v2) hierarchy.
pub fn systemd_driver() -> Result<Arc<dyn CgroupManager>, CgroupError> {
    Ok(Arc::new(crate::systemd::SystemdManager::new(
        Hierarchy::detect(),
    )?))
}
