//! The cgroup v1 and v2 driver (cgroupfs layout): hierarchy detection, creating and removing
//! cgroups with their limits (cpu, memory, pids, cpuset, hugetlb), freezing and killing what
//! runs in them, and reading their usage statistics the way cAdvisor and the kubelet do.
//!
//! Structured as youki's libcgroups: the [`CgroupManager`] trait, implemented by
//! [`v1::V1Manager`] and [`v2::V2Manager`], each with one module per controller (its files
//! written, read back and turned into statistics); [`detect`] picks the one the host's
//! [`Hierarchy`] needs. [`systemd::SystemdManager`] is the systemd driver (kubelet
//! `cgroupDriver: systemd`) for v2 hosts: units through systemd's D-Bus API, reads and the
//! files systemd has no property for through the v2 code.
//!
//! Owns the cgroup filesystem; knows nothing of pods, containers or QoS classes — the
//! kubelet's container manager decides the layout and the values.
//!
//! ```no_run
//! use nodus_cgroups::{Resources, milli_cpu_to_quota, milli_cpu_to_shares};
//!
//! # fn main() -> Result<(), nodus_cgroups::CgroupError> {
//! let m = nodus_cgroups::detect(); // Arc<dyn CgroupManager>: v1 or v2 as the host has
//! // The node allocatable cap on kubepods, the BestEffort tier at the minimum share.
//! m.create("kubepods", &Resources { memory_limit: Some(6 << 30), ..Default::default() })?;
//! m.create("kubepods/besteffort", &Resources { cpu_shares: Some(2), ..Default::default() })?;
//! // A Guaranteed pod: 500m CPU and 64Mi.
//! let pod = "kubepods/pod0a1b2c3d";
//! m.create(pod, &Resources {
//!     cpu_shares: Some(milli_cpu_to_shares(500)),
//!     cpu_quota: Some(milli_cpu_to_quota(500, 100_000)),
//!     cpu_period: Some(100_000),
//!     memory_limit: Some(64 << 20),
//!     ..Default::default()
//! })?;
//! let working_set = m.read_stats(pod)?.memory.working_set_bytes;
//! # let _ = working_set;
//! m.delete(pod)?; // retries while processes exit; SIGKILLs stragglers
//! # Ok(())
//! # }
//! ```

mod common;
mod controller;
pub mod error;
pub mod hierarchy;
pub mod manager;
pub mod mountinfo;
pub mod resources;
pub mod stats;
pub mod systemd;
pub mod v1;
pub mod v2;

pub use common::DeleteRetries;
pub use controller::ControllerKind;
pub use error::CgroupError;
pub use hierarchy::Hierarchy;
pub use manager::{CgroupManager, detect, for_hierarchy, systemd_driver, with_retries};
pub use resources::{
    Resources, cpu_max, milli_cpu_to_quota, milli_cpu_to_shares, shares_to_weight,
    shares_to_weight_linear, weight_to_shares,
};
pub use stats::{CpuStats, MemoryStats, Pressure, PsiLine, PsiStats, Stats, parse_pressure};

#[cfg(test)]
mod tests_fake_v1;
#[cfg(test)]
mod tests_fake_v2;
#[cfg(test)]
mod tests_real;
#[cfg(test)]
mod tests_real_systemd;
