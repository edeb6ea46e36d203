//! The memory manager (upstream's pkg/kubelet/cm/memorymanager): with `--memory-manager-policy
//! Static` every container of a Guaranteed pod gets its memory and hugepages from chosen NUMA
//! nodes ([`policy_static`]) and is pinned to them with `cpuset.mems` at CreateContainer;
//! `None` (the default) does nothing. The machine's memory per NUMA node comes from sysfs
//! ([`machine`]), what is held back per node from `--reserved-memory` ([`reserved`]), and
//! the assignments live in `<root-dir>/memory_manager_state` ([`state`]), checked against
//! the policy at start. The manager is one of the topology manager's hint providers: it
//! gives hints and places each container on the merged hint at admission; a pod that
//! cannot be placed is refused with `UnexpectedAdmissionError`. A pod's memory goes back
//! when the pod is removed or, as upstream's removeStaleState, when it is no longer active
//! at the next admission.

pub mod machine;
pub mod policy_static;
pub mod reserved;
pub mod state;

use crate::cm::devicemanager::PendingFunc;
use crate::cm::topologymanager::{HintProvider, Store, TopologyHint};
use k8s_openapi::api::core::v1::{Container, Pod};
use nodus_k8s::quantity::{Format, ParsedQuantity};
use policy_static::StaticPolicy;
use reserved::MemoryReservation;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// upstream's policy names (`memoryManagerPolicy`).
pub const POLICY_NONE: &str = "None";

/// The memory manager's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// `None` or `Static`.
    pub policy: String,
    pub reserved_memory: Vec<MemoryReservation>,
    /// Where `devices/system/node` is read (`/sys`; a fake tree in tests).
    pub sysfs_root: PathBuf,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            policy: POLICY_NONE.into(),
            reserved_memory: Vec::new(),
            sysfs_root: "/sys".into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// upstream's NewManager failing (an unknown policy, reservations that do not add up).
    #[error("{0}")]
    New(String),
    #[error("start memory manager error: {0}")]
    Start(String),
}

enum Policy {
    None,
    Static(StaticPolicy),
}

impl Policy {
    fn name(&self) -> &'static str {
        match self {
            Policy::None => POLICY_NONE,
            Policy::Static(_) => policy_static::NAME,
        }
    }
}

struct Inner {
    policy: Policy,
    state: state::State,
}

/// upstream's ActivePodsFunc.
pub type ActivePodsFunc = Box<dyn Fn() -> Vec<Pod> + Send + Sync>;

pub struct MemoryManager {
    inner: Mutex<Inner>,
    active_pods: OnceLock<ActivePodsFunc>,
    pending: OnceLock<PendingFunc>,
    /// The topology manager's merged hints, read at Allocate (upstream's affinity Store).
    affinity: OnceLock<Arc<dyn Store>>,
}

/// What kube-reserved, system-reserved and the hard eviction threshold hold back of
/// memory (upstream's GetNodeAllocatableReservation), formatted as upstream adds them.
pub fn node_allocatable_reservation(
    config: &crate::cm::Config,
    capacity_memory: i64,
) -> Result<BTreeMap<String, ParsedQuantity>, String> {
    let mut parts = Vec::new();
    for (field, map) in [
        ("systemReserved", &config.system_reserved),
        ("kubeReserved", &config.kube_reserved),
    ] {
        if let Some(v) = map.get("memory") {
            parts.push(
                nodus_k8s::quantity::parse_quantity(v)
                    .map_err(|e| format!("{field}: invalid quantity {v:?} for memory: {e}"))?,
            );
        }
    }
    if let Some(v) = config.eviction_hard.get("memory.available") {
        let bytes = crate::cm::allocatable::threshold(
            "evictionHard",
            "memory.available",
            v,
            capacity_memory,
        )?;
        parts.push(match v.ends_with('%') {
            // upstream's GetThresholdQuantity makes a percentage a BinarySI quantity.
            true => ParsedQuantity::from_nanos(i128::from(bytes) * 1_000_000_000, Format::BinarySI),
            false => nodus_k8s::quantity::parse_quantity(v).map_err(|e| e.to_string())?,
        });
    }
    let total = reserved::sum(parts);
    Ok(if total.is_zero() {
        BTreeMap::new()
    } else {
        BTreeMap::from([("memory".to_string(), total)])
    })
}

impl MemoryManager {
    /// upstream's NewManager then Start: the policy, checked against the machine and the
    /// reservations, and the state file, checked against the policy.
    pub fn start(
        config: &Config,
        cm: &crate::cm::Config,
        capacity_memory: i64,
        root_dir: &Path,
    ) -> Result<MemoryManager, Error> {
        reserved::validate_config(&config.reserved_memory).map_err(Error::New)?;
        let policy = match config.policy.as_str() {
            POLICY_NONE => Policy::None,
            policy_static::NAME => {
                let machine = machine::MachineInfo::read(&config.sysfs_root).map_err(|e| {
                    Error::New(format!(
                        "[memorymanager] cannot read the NUMA nodes under {}: {e}",
                        config.sysfs_root.display()
                    ))
                })?;
                let reservation =
                    node_allocatable_reservation(cm, capacity_memory).map_err(Error::New)?;
                let reserved = reserved::system_reserved_memory(
                    &machine,
                    &reservation,
                    &config.reserved_memory,
                )
                .map_err(Error::New)?;
                Policy::Static(StaticPolicy::new(machine, reserved).map_err(Error::New)?)
            }
            other => return Err(Error::New(format!("unknown policy: \"{other}\""))),
        };
        tracing::info!(policy = policy.name(), "Starting memorymanager");
        let mut state =
            state::State::new(root_dir, policy.name()).map_err(|e| Error::Start(e.to_string()))?;
        if let Policy::Static(p) = &policy {
            p.start(&mut state).map_err(|e| {
                tracing::error!(error = %e, "Invalid state, please drain node and remove policy state file");
                Error::Start(e)
            })?;
        }
        Ok(MemoryManager {
            inner: Mutex::new(Inner { policy, state }),
            active_pods: OnceLock::new(),
            pending: OnceLock::new(),
            affinity: OnceLock::new(),
        })
    }

    /// How the manager learns which pods still hold memory: the active pods, and pods
    /// still on their way to admission after a restart (their memory is not stale).
    pub fn set_active_pods(&self, active: ActivePodsFunc, pending: PendingFunc) {
        let _ = self.active_pods.set(active);
        let _ = self.pending.set(pending);
    }

    /// Sets the topology manager whose merged hint Allocate follows.
    pub fn set_affinity(&self, store: Arc<dyn Store>) {
        let _ = self.affinity.set(store);
    }

    pub fn policy_name(&self) -> &'static str {
        self.inner.lock().map_or(POLICY_NONE, |i| i.policy.name())
    }

    /// upstream's Allocate for one container, on the topology manager's merged hint when
    /// there is one (a hint without NUMA nodes is upstream's zero hint: the policy picks).
    pub fn allocate_container(
        &self,
        pod: &Pod,
        container: &Container,
        hint: Option<TopologyHint>,
    ) -> Result<(), String> {
        self.allocate_inner(pod, container, hint, || None)
    }

    /// Allocate after giving back the memory of pods not in `live` (when given); the state
    /// file is written once, when anything changed.
    fn allocate_inner(
        &self,
        pod: &Pod,
        container: &Container,
        hint: Option<TopologyHint>,
        live: impl FnOnce() -> Option<HashSet<String>>,
    ) -> Result<(), String> {
        // The none policy keeps no state: the active pods (a copy of every pod) are not
        // needed, and admitting a pod must not cost a walk of all the others.
        if !self.is_static() {
            return Ok(());
        }
        let live = live();
        let mut i = self.inner.lock().map_err(|_| "memory manager poisoned")?;
        let Inner { policy, state } = &mut *i;
        let Policy::Static(p) = policy else {
            return Ok(());
        };
        let mut changed = live.is_some_and(|l| self.release_stale(p, state, &l));
        let hint = match hint {
            Some(h) if h.numa_node_affinity.is_some() => h,
            _ => TopologyHint {
                numa_node_affinity: None,
                preferred: false,
            },
        };
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let had = state.memory_blocks(uid, &container.name).is_some();
        let r = p.allocate(state, pod, container, hint);
        changed |= !had && state.memory_blocks(uid, &container.name).is_some();
        if changed {
            state.store_or_log();
        }
        r
    }

    /// upstream's GetTopologyHints (None: no preference).
    pub fn topology_hints(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Option<BTreeMap<String, Vec<TopologyHint>>> {
        let i = self.inner.lock().ok()?;
        match &i.policy {
            Policy::Static(p) => p.topology_hints(&i.state, pod, container),
            Policy::None => None,
        }
    }

    /// upstream's GetPodTopologyHints.
    pub fn pod_topology_hints(&self, pod: &Pod) -> Option<BTreeMap<String, Vec<TopologyHint>>> {
        let i = self.inner.lock().ok()?;
        match &i.policy {
            Policy::Static(p) => p.pod_topology_hints(&i.state, pod),
            Policy::None => None,
        }
    }

    /// The NUMA nodes of the container's memory as `cpuset.mems` wants them (`0`, `0,1`);
    /// None when the container is not pinned (upstream's GetMemoryNUMANodes).
    pub fn cpuset_mems(&self, pod_uid: &str, container: &str) -> Option<String> {
        let i = self.inner.lock().ok()?;
        let nodes: BTreeSet<usize> = i
            .state
            .memory_blocks(pod_uid, container)?
            .iter()
            .flat_map(|b| b.numa_affinity.iter().copied())
            .collect();
        (!nodes.is_empty()).then(|| {
            nodes
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
    }

    /// The pod's memory goes back (its containers were removed).
    pub fn remove_pod(&self, pod_uid: &str) {
        let Ok(mut i) = self.inner.lock() else { return };
        let Inner { policy, state } = &mut *i;
        let Policy::Static(p) = policy else { return };
        if release(p, state, pod_uid) {
            state.store_or_log();
        }
    }

    fn is_static(&self) -> bool {
        self.inner
            .lock()
            .is_ok_and(|i| matches!(i.policy, Policy::Static(_)))
    }

    /// The pods whose memory is not stale: the active ones and `keep`, the pod being
    /// admitted; None when the manager does not know the active pods.
    fn live_pods(&self, keep: &Pod) -> Option<HashSet<String>> {
        let active_pods = self.active_pods.get()?;
        let mut live: HashSet<String> = active_pods()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        live.extend(keep.metadata.uid.clone());
        Some(live)
    }

    /// upstream's removeStaleState: pods neither live nor waiting for admission give their
    /// memory back. Whether anything changed.
    fn release_stale(
        &self,
        p: &mut StaticPolicy,
        state: &mut state::State,
        live: &HashSet<String>,
    ) -> bool {
        let pending = self.pending.get();
        let stale: Vec<String> = state
            .assignments
            .keys()
            .filter(|u| !live.contains(*u) && !pending.is_some_and(|f| f(u)))
            .cloned()
            .collect();
        for u in &stale {
            tracing::info!(pod_uid = %u, "RemoveStaleState removing state");
            release(p, state, u);
        }
        !stale.is_empty()
    }

    /// [`Self::release_stale`] on its own (before hints), writing the state when it changed.
    fn remove_stale_state(&self, keep: &Pod) {
        if !self.is_static() {
            return;
        }
        let Some(live) = self.live_pods(keep) else {
            return;
        };
        let Ok(mut i) = self.inner.lock() else { return };
        let Inner { policy, state } = &mut *i;
        let Policy::Static(p) = policy else { return };
        if self.release_stale(p, state, &live) {
            state.store_or_log();
        }
    }
}

/// Every container of the pod gives its memory back; whether it had any.
fn release(p: &mut StaticPolicy, state: &mut state::State, pod_uid: &str) -> bool {
    let containers: Vec<String> = state
        .assignments
        .get(pod_uid)
        .map(|c| c.keys().cloned().collect())
        .unwrap_or_default();
    for c in &containers {
        p.remove_container(state, pod_uid, c);
    }
    if !containers.is_empty() {
        tracing::info!(pod_uid, "memory manager: released the pod's memory");
    }
    !containers.is_empty()
}

/// The memory manager as the topology manager's hint provider.
impl HintProvider for MemoryManager {
    fn get_topology_hints(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> HashMap<String, Vec<TopologyHint>> {
        self.remove_stale_state(pod);
        self.topology_hints(pod, container)
            .map(|h| h.into_iter().collect())
            .unwrap_or_default()
    }

    fn get_pod_topology_hints(&self, pod: &Pod) -> HashMap<String, Vec<TopologyHint>> {
        self.remove_stale_state(pod);
        self.pod_topology_hints(pod)
            .map(|h| h.into_iter().collect())
            .unwrap_or_default()
    }

    fn allocate(&self, pod: &Pod, container: &Container) -> Result<(), String> {
        let hint = self.affinity.get().map(|s| {
            s.get_affinity(
                pod.metadata.uid.as_deref().unwrap_or_default(),
                &container.name,
            )
        });
        self.allocate_inner(pod, container, hint, || self.live_pods(pod))
    }
}

#[cfg(test)]
mod tests;
