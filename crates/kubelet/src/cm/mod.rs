//! The container manager (upstream's pkg/kubelet/cm): the QoS cgroup hierarchy under the
//! cgroup root (`kubepods`, `kubepods/burstable`, `kubepods/besteffort`, `pod<uid>`), pod
//! cgroup values from the containers' requests and limits, node allocatable (capacity minus
//! kube-reserved, system-reserved and the hard eviction thresholds) enforced on `kubepods`,
//! admission of pods against what is left of Allocatable, the device manager that turns
//! device plugins' devices into extended resources, and the memory manager that pins
//! Guaranteed pods' memory to NUMA nodes.

pub mod admission;
pub mod allocatable;
pub mod cgroup_driver;
pub mod checksum;
pub mod cpumanager;
pub mod cpuset;
pub mod devicemanager;
pub mod manager;
pub mod memory_qos;
pub mod memorymanager;
pub mod qos;
pub mod resources;
pub mod topology;
pub mod topologymanager;

pub use manager::ContainerManager;

pub use cgroup_driver::CgroupDriver;

/// The container manager's settings (issue 5's fields).
#[derive(Clone, Debug)]
pub struct Config {
    pub layout: qos::Layout,
    pub cgroup_driver: CgroupDriver,
    pub kube_reserved: std::collections::BTreeMap<String, String>,
    pub system_reserved: std::collections::BTreeMap<String, String>,
    pub kube_reserved_cgroup: Option<String>,
    pub system_reserved_cgroup: Option<String>,
    pub eviction_hard: std::collections::BTreeMap<String, String>,
    pub enforce_node_allocatable: Vec<String>,
    pub max_pods: i64,
    pub pod_pids_limit: Option<i64>,
    pub cpu_cfs_quota: bool,
    pub cpu_cfs_quota_period_us: u64,
    /// The `MemoryQoS` feature gate (takes effect on cgroup v2 only).
    pub memory_qos: bool,
    /// KubeletConfiguration `memoryThrottlingFactor` (0 < f ≤ 1, default 0.9).
    pub memory_throttling_factor: f64,
    /// The `KubeletPSI` feature gate: pressure (PSI) figures in the Summary API.
    pub kubelet_psi: bool,
}

impl Config {
    /// A manager with upstream's KubeletConfiguration defaults over `layout` (no reservations,
    /// nothing enforced, 110 pods, CFS quota on with a 100 ms period, throttling factor 0.9).
    pub fn defaults(layout: qos::Layout) -> Config {
        Config {
            layout,
            cgroup_driver: Default::default(),
            kube_reserved: Default::default(),
            system_reserved: Default::default(),
            kube_reserved_cgroup: None,
            system_reserved_cgroup: None,
            eviction_hard: allocatable::default_eviction_hard(),
            enforce_node_allocatable: vec![],
            max_pods: 110,
            pod_pids_limit: None,
            cpu_cfs_quota: true,
            cpu_cfs_quota_period_us: 100_000,
            memory_qos: false,
            memory_throttling_factor: 0.9,
            kubelet_psi: false,
        }
    }
}

/// Go's strconv.ParseBool, which the resource managers' policy options are read with.
pub(crate) fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}
