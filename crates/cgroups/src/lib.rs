//! The cgroup v1 and v2 driver (cgroupfs layout): hierarchy detection, creating and removing
//! cgroups with their limits (cpu, memory, pids, cpuset, hugetlb), freezing and killing what
//! runs in them, and reading their usage statistics the way cAdvisor and the kubelet do.
//!
//! Owns the cgroup filesystem; knows nothing of pods, containers or QoS classes — the
//! kubelet's container manager decides the layout and the values.

pub mod error;
pub mod hierarchy;
pub mod manager;
pub mod resources;
pub mod stats;

pub use error::CgroupError;
pub use hierarchy::Hierarchy;
pub use manager::Manager;
pub use resources::{
    Resources, cpu_max, milli_cpu_to_quota, milli_cpu_to_shares, shares_to_weight,
    shares_to_weight_quadratic, weight_to_shares,
};
pub use stats::{CpuStats, MemoryStats, Stats, read_stats};

#[cfg(test)]
mod tests_fake_v1;
#[cfg(test)]
mod tests_fake_v2;
#[cfg(test)]
mod tests_real;
