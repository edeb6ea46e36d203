//! The container manager (upstream's pkg/kubelet/cm): the QoS cgroup hierarchy under the
//! cgroup root (`kubepods`, `kubepods/burstable`, `kubepods/besteffort`, `pod<uid>`), pod
//! cgroup values from the containers' requests and limits, node allocatable (capacity minus
//! kube-reserved, system-reserved and the hard eviction thresholds) enforced on `kubepods`,
//! and admission of pods against what is left of Allocatable.

pub mod admission;
pub mod allocatable;
pub mod qos;
pub mod resources;
