//! The container manager at run time: builds the QoS hierarchy at start (capping
//! `kubepods` at Allocatable when `enforceNodeAllocatable` names pods), gives every pod its
//! cgroup before its sandbox starts, keeps the tiers' CPU shares in step with the pods they
//! hold, and removes pod cgroups when pods go.

use super::Config;
use super::allocatable::{NodeResources, allocatable, machine_capacity, parse_reserved};
use super::resources::{CgroupValues, milli_to_shares, pod_requests, pod_values};
use k8s_openapi::api::core::v1::Pod;
use nodus_cgroups::{CgroupManager, Resources};
use nodus_k8s::qos::{QosClass, pod_qos};
use std::path::Path;
use std::sync::{Arc, Mutex};

#[derive(Debug, thiserror::Error)]
pub enum CmError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("invalid configuration: cgroup-root {root:?} doesn't exist or is not usable: {source}")]
    Root {
        root: String,
        source: nodus_cgroups::CgroupError,
    },
    #[error("{0}")]
    Cgroup(#[from] nodus_cgroups::CgroupError),
    #[error("failed to initialize cpu manager: {0}")]
    CpuManagerInit(String),
    #[error("start cpu manager error: {0}")]
    CpuManagerStart(String),
    #[error("failed to initialize topology manager: {0}")]
    TopologyManagerInit(String),
    #[error(transparent)]
    MemoryManager(#[from] super::memorymanager::Error),
}

pub struct ContainerManager {
    pub config: Config,
    pub capacity: NodeResources,
    pub allocatable: NodeResources,
    cgroups: Arc<dyn CgroupManager>,
    /// Serialises tier updates with pod cgroup creation.
    lock: Mutex<()>,
    kube: NodeResources,
    system: NodeResources,
    /// The device manager, set once at start (upstream's container manager owns it too).
    pub devices: std::sync::OnceLock<Arc<super::devicemanager::DeviceManager>>,
    /// The CPU manager, set once at start.
    pub cpus: std::sync::OnceLock<Arc<super::cpumanager::CpuManager>>,
    /// The memory manager, set once at start.
    pub memory: std::sync::OnceLock<Arc<super::memorymanager::MemoryManager>>,
}

fn to_resources(v: &CgroupValues) -> Resources {
    Resources {
        cpu_shares: v.cpu_shares,
        cpu_quota: v.cpu_quota,
        cpu_period: v.cpu_period,
        memory_limit: v.memory_limit,
        memory_min: v.memory_min,
        pids_limit: v.pids_limit,
        ..Default::default()
    }
}

impl ContainerManager {
    /// Reads the machine, computes Allocatable and checks the cgroup root; nothing is
    /// created yet.
    pub fn new(config: Config, root_dir: &Path) -> Result<ContainerManager, CmError> {
        let capacity = machine_capacity(root_dir, config.max_pods);
        let kube =
            parse_reserved("kubeReserved", &config.kube_reserved).map_err(CmError::Config)?;
        let system =
            parse_reserved("systemReserved", &config.system_reserved).map_err(CmError::Config)?;
        let alloc = allocatable(&capacity, &kube, &system, &config.eviction_hard)
            .map_err(CmError::Config)?;
        if config
            .enforce_node_allocatable
            .iter()
            .any(|e| e == "kube-reserved")
            && config.kube_reserved_cgroup.is_none()
        {
            return Err(CmError::Config(
                "enforceNodeAllocatable names kube-reserved but kubeReservedCgroup is not set"
                    .into(),
            ));
        }
        if config
            .enforce_node_allocatable
            .iter()
            .any(|e| e == "system-reserved")
            && config.system_reserved_cgroup.is_none()
        {
            return Err(CmError::Config(
                "enforceNodeAllocatable names system-reserved but systemReservedCgroup is not set"
                    .into(),
            ));
        }
        let cgroups = match config.cgroup_driver {
            super::CgroupDriver::Cgroupfs => nodus_cgroups::detect(),
            super::CgroupDriver::Systemd => nodus_cgroups::systemd_driver()
                .map_err(|e| CmError::Config(format!("cgroupDriver \"systemd\": {e}")))?,
        };
        cgroups.check_root().map_err(|source| CmError::Root {
            root: config.layout.root.clone(),
            source,
        })?;
        let root = config.layout.root.trim_end_matches('/');
        if !root.is_empty() && !cgroups.exists(root) {
            return Err(CmError::Config(format!(
                "cgroup-root {:?} doesn't exist",
                config.layout.root
            )));
        }
        Ok(ContainerManager {
            config,
            capacity,
            allocatable: alloc,
            cgroups,
            lock: Mutex::new(()),
            kube,
            system,
            devices: std::sync::OnceLock::new(),
            cpus: std::sync::OnceLock::new(),
            memory: std::sync::OnceLock::new(),
        })
    }

    /// Creates `kubepods` and the tiers, and enforces the reservations asked for.
    pub fn start(&self) -> Result<(), CmError> {
        let _g = self.lock.lock();
        if !self.config.layout.per_qos {
            return Ok(());
        }
        let enforce_pods = self
            .config
            .enforce_node_allocatable
            .iter()
            .any(|e| e == "pods");
        let kubepods = Resources {
            cpu_shares: Some(milli_to_shares(self.allocatable.cpu_milli)),
            memory_limit: enforce_pods.then_some(self.allocatable.memory_bytes),
            ..Default::default()
        };
        self.cgroups
            .create(&self.config.layout.kubepods(), &kubepods)?;
        let be = Resources {
            cpu_shares: Some(super::resources::MIN_SHARES),
            ..Default::default()
        };
        self.cgroups
            .create(&self.config.layout.tier(QosClass::BestEffort), &be)?;
        self.cgroups.create(
            &self.config.layout.tier(QosClass::Burstable),
            &Resources {
                cpu_shares: Some(super::resources::MIN_SHARES),
                ..Default::default()
            },
        )?;
        for (which, cgroup, reserved) in [
            (
                "kube-reserved",
                &self.config.kube_reserved_cgroup,
                &self.kube,
            ),
            (
                "system-reserved",
                &self.config.system_reserved_cgroup,
                &self.system,
            ),
        ] {
            if !self
                .config
                .enforce_node_allocatable
                .iter()
                .any(|e| e == which)
            {
                continue;
            }
            let Some(cg) = cgroup else { continue };
            self.cgroups.create(
                cg,
                &Resources {
                    cpu_shares: (reserved.cpu_milli > 0)
                        .then(|| milli_to_shares(reserved.cpu_milli)),
                    memory_limit: (reserved.memory_bytes > 0).then_some(reserved.memory_bytes),
                    // MemoryQoS protects what is reserved from reclaim by the pods.
                    memory_min: (self.config.memory_qos && reserved.memory_bytes > 0)
                        .then_some(reserved.memory_bytes),
                    ..Default::default()
                },
            )?;
        }
        tracing::info!(
            kubepods = %self.config.layout.kubepods(),
            allocatable_cpu_milli = self.allocatable.cpu_milli,
            allocatable_memory = self.allocatable.memory_bytes,
            enforce = ?self.config.enforce_node_allocatable,
            "QoS cgroup hierarchy ready"
        );
        Ok(())
    }

    /// The `memoryThrottlingFactor` when MemoryQoS applies: the gate is on and the machine
    /// has cgroup v2 (upstream's `isCgroup2UnifiedMode() && MemoryQoS`).
    pub fn memory_qos(&self) -> Option<f64> {
        (self.config.memory_qos && self.cgroups.hierarchy().is_v2())
            .then_some(self.config.memory_throttling_factor)
    }

    /// The cgroup driver (for statistics).
    pub fn cgroups(&self) -> &Arc<dyn CgroupManager> {
        &self.cgroups
    }

    /// The pod's cgroup path (the kubelet's internal name).
    fn pod_cgroup_name(&self, pod: &Pod) -> String {
        let qos = pod_qos(pod);
        self.config
            .layout
            .pod(qos, pod.metadata.uid.as_deref().unwrap_or_default())
    }

    /// The pod's cgroup as the runtime is told it in `cgroup_parent` (upstream's
    /// `GetPodContainerName`): the cgroupfs path, or with the systemd driver the slice's
    /// expanded path, `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`,
    /// whose last component a systemd-cgroup runtime takes as the slice.
    pub fn pod_cgroup(&self, pod: &Pod) -> String {
        self.driver_name(&self.pod_cgroup_name(pod))
    }

    fn driver_name(&self, name: &str) -> String {
        match self.config.cgroup_driver {
            super::CgroupDriver::Cgroupfs => name.to_string(),
            super::CgroupDriver::Systemd => {
                format!("/{}", nodus_cgroups::systemd::names::to_systemd(name))
            }
        }
    }

    /// Creates (or updates) the pod's cgroup with its values; returns its name for the
    /// runtime ([`Self::pod_cgroup`]).
    pub fn ensure_pod(&self, pod: &Pod) -> Result<String, CmError> {
        let _g = self.lock.lock();
        let path = self.pod_cgroup_name(pod);
        let v = pod_values(
            pod,
            self.config.cpu_cfs_quota,
            self.config.cpu_cfs_quota_period_us,
            self.config.pod_pids_limit,
            self.memory_qos().is_some(),
        );
        if self.cgroups.exists(&path) {
            self.cgroups.update(&path, &to_resources(&v))?;
        } else {
            self.cgroups.create(&path, &to_resources(&v))?;
        }
        Ok(self.driver_name(&path))
    }

    /// The cgroup of the pod with `uid`, wherever its tier put it (the pod's spec may be
    /// unknown), when it exists.
    pub fn pod_cgroup_of(&self, uid: &str) -> Option<String> {
        [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ]
        .into_iter()
        .map(|qos| self.config.layout.pod(qos, uid))
        .find(|p| self.cgroups.exists(p))
    }

    /// Removes a pod's cgroup wherever its tier put it (the pod's spec may be unknown); its
    /// pinned memory goes back to the memory manager.
    pub fn remove_pod(&self, uid: &str) {
        if let Some(m) = self.memory.get() {
            m.remove_pod(uid);
        }
        let _g = self.lock.lock();
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            let path = self.config.layout.pod(qos, uid);
            if self.cgroups.exists(&path)
                && let Err(e) = self.cgroups.delete(&path)
            {
                tracing::warn!(pod_uid = %uid, cgroup = %path, error = %e, "cannot remove pod cgroup; housekeeping retries");
            }
        }
    }

    /// Sets the Burstable tier's shares to the sum of its pods' CPU requests (upstream's
    /// qosContainerManager.UpdateCgroups); BestEffort stays at the minimum. With MemoryQoS,
    /// the tiers' `memory.min` follows their pods' memory requests.
    pub fn update_tiers<P: std::borrow::Borrow<Pod>>(&self, pods: &[P]) {
        if !self.config.layout.per_qos {
            return;
        }
        let _g = self.lock.lock();
        let burstable_milli: i64 = pods
            .iter()
            .map(|p| p.borrow())
            .filter(|p| pod_qos(p) == QosClass::Burstable)
            .map(|p| pod_requests(p).0)
            .sum();
        let (kubepods_min, burstable_min) = match self.memory_qos() {
            Some(_) => super::memory_qos::tier_memory_min(pods),
            None => (None, None),
        };
        let r = Resources {
            cpu_shares: Some(milli_to_shares(burstable_milli)),
            memory_min: burstable_min,
            ..Default::default()
        };
        if let Err(e) = self
            .cgroups
            .update(&self.config.layout.tier(QosClass::Burstable), &r)
        {
            tracing::warn!(error = %e, "cannot update the burstable tier's cgroup");
        }
        if let Some(min) = kubepods_min {
            let r = Resources {
                memory_min: Some(min),
                ..Default::default()
            };
            if let Err(e) = self
                .cgroups
                .update(&self.config.layout.tier(QosClass::Guaranteed), &r)
            {
                tracing::warn!(error = %e, "cannot update the guaranteed tier's memory.min");
            }
        }
    }

    /// The pod cgroup uids present under the tiers (for orphan cleanup).
    pub fn pod_cgroup_uids(&self) -> Vec<String> {
        let mut out = Vec::new();
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            for name in self.cgroups.children(&self.config.layout.tier(qos)) {
                if let Some(uid) = name.strip_prefix("pod") {
                    out.push(uid.to_string());
                }
            }
        }
        out
    }
}
