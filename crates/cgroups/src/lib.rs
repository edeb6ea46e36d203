//! The cgroup v1 and v2 driver: hierarchy detection, and (so far) resource usage statistics
//! of a cgroup, read the way cAdvisor and the kubelet read them.
//!
//! Owns the cgroup filesystem; knows nothing of pods or containers. Creating cgroups and
//! setting limits arrive with the cgroups/QoS issue.

pub mod hierarchy;
pub mod stats;

pub use hierarchy::Hierarchy;
pub use stats::{CpuStats, MemoryStats, Stats};
