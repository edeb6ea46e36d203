//! The CPU manager (upstream's pkg/kubelet/cm/cpumanager): with the `static` policy,
//! containers of Guaranteed pods with whole-CPU requests get CPUs of their own
//! ([`policy_static`], [`cpu_assignment`]) and every other container runs on the shared pool
//! (all CPUs minus the exclusive ones; the reserved CPUs always stay in it). The cpuset goes
//! into the container's CRI config at creation ([`CpuManager::container_cpuset`]); a
//! reconcile loop every `cpuManagerReconcilePeriod` hands changed pools to running
//! containers with UpdateContainerResources, and returns the CPUs of pods that are gone.
//! The state is checkpointed in `<root-dir>/cpu_manager_state` ([`state`]). With the `none`
//! policy containers are left on every CPU and nothing is reconciled.
//!
//! The CPU manager is a topology manager hint provider: its hints are the NUMA node sets
//! with enough free CPUs, and it allocates on the merged hint.

pub mod cpu_assignment;
pub mod policy_static;
pub mod state;

use crate::admission::{Reason, Rejection};
use crate::cm::cpuset::CpuSet;
use crate::cm::devicemanager::PendingFunc;
use crate::cm::topology::CpuTopology;
use crate::cm::topologymanager::{HintProvider, Store, TopologyHint, unexpected};
use cri::runtime::v1 as pb;
use k8s_openapi::api::core::v1::{Container, Pod};
use policy_static::{AllocateError, StaticPolicy, StaticPolicyOptions};
use state::State;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// upstream's default cpuManagerReconcilePeriod.
pub const DEFAULT_RECONCILE_PERIOD: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyName {
    None,
    Static,
}

impl PolicyName {
    pub fn parse(s: &str) -> Result<PolicyName, String> {
        match s {
            "none" => Ok(PolicyName::None),
            "static" => Ok(PolicyName::Static),
            _ => Err(format!("unknown policy: \"{s}\"")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::None => "none",
            PolicyName::Static => "static",
        }
    }
}

/// The CPU manager's settings (KubeletConfiguration's cpuManager* and reservedSystemCPUs).
#[derive(Clone, Debug)]
pub struct Config {
    pub policy: String,
    pub policy_options: BTreeMap<String, String>,
    pub reconcile_period: Duration,
    /// `--reserved-cpus`; when empty the CPUs are taken from the CPU reservation.
    pub reserved_cpus: CpuSet,
    /// kube-reserved + system-reserved cpu in milli-CPU; `None` when neither names cpu.
    pub reserved_milli: Option<i64>,
    /// Where the state file lives (the root directory).
    pub state_dir: PathBuf,
}

struct Inner {
    state: State,
    policy: Option<StaticPolicy>,
}

pub struct CpuManager {
    name: PolicyName,
    state_dir: PathBuf,
    reconcile_period: Duration,
    inner: Mutex<Inner>,
    /// The topology manager's merged hints.
    affinity: OnceLock<Arc<dyn Store>>,
    /// The pods the kubelet runs, and those on their way to admission, whose CPUs stay.
    active_pods: OnceLock<Box<dyn Fn() -> Vec<Pod> + Send + Sync>>,
    pending: OnceLock<PendingFunc>,
    /// (pod UID, container) → the cpuset the runtime last got for it.
    last_update: Mutex<HashMap<(String, String), CpuSet>>,
}

#[derive(Debug, thiserror::Error)]
pub enum CpuManagerError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    State(#[from] state::StateError),
    /// The restored state does not fit the machine or the reservation.
    #[error("{0}")]
    InvalidState(String),
}

impl CpuManagerError {
    /// Whether it happened starting (reading the state) rather than configuring.
    pub fn at_start(&self) -> bool {
        !matches!(self, CpuManagerError::Config(_))
    }
}

impl CpuManager {
    /// upstream's NewManager and Start: the policy is built, the state file read (refused
    /// when written under another policy) and checked, and written back.
    pub fn new(config: &Config, topology: CpuTopology) -> Result<CpuManager, CpuManagerError> {
        let name = PolicyName::parse(&config.policy).map_err(CpuManagerError::Config)?;
        let policy = match name {
            PolicyName::None => None,
            PolicyName::Static => {
                let reserved_milli = config.reserved_milli.ok_or_else(|| {
                    CpuManagerError::Config(
                        "[cpumanager] unable to determine reserved CPU resources for static policy"
                            .into(),
                    )
                })?;
                if reserved_milli <= 0 {
                    return Err(CpuManagerError::Config(
                        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero".into(),
                    ));
                }
                // Fractional CPUs cannot be exclusive: the reservation rounds up.
                let num_reserved = (reserved_milli as u64).div_ceil(1000) as usize;
                let opts = StaticPolicyOptions::parse(&config.policy_options).map_err(|e| {
                    CpuManagerError::Config(format!("new static policy error: {e}"))
                })?;
                Some(
                    StaticPolicy::new(topology, num_reserved, &config.reserved_cpus, opts)
                        .map_err(|e| {
                            CpuManagerError::Config(format!("new static policy error: {e}"))
                        })?,
                )
            }
        };
        if name == PolicyName::None && !config.policy_options.is_empty() {
            // Go prints the map as map[k:v ...].
            let opts: Vec<String> = config
                .policy_options
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            return Err(CpuManagerError::Config(format!(
                "None policy: received unsupported options=map[{}]",
                opts.join(" ")
            )));
        }
        let mut st = state::read(&config.state_dir, name.as_str())?.unwrap_or_default();
        if let Some(p) = &policy {
            p.validate_state(&mut st).map_err(|e| {
                CpuManagerError::InvalidState(format!(
                    "{e}, static policy invalid state, please drain node and remove policy state file"
                ))
            })?;
        }
        state::write(&config.state_dir, name.as_str(), &st)?;
        tracing::info!(policy = name.as_str(), default_cpu_set = %st.default_cpu_set, "cpu manager started");
        Ok(CpuManager {
            name,
            state_dir: config.state_dir.clone(),
            reconcile_period: config.reconcile_period,
            inner: Mutex::new(Inner { state: st, policy }),
            affinity: OnceLock::new(),
            active_pods: OnceLock::new(),
            pending: OnceLock::new(),
            last_update: Mutex::new(HashMap::new()),
        })
    }

    pub fn policy_name(&self) -> PolicyName {
        self.name
    }

    /// The topology manager whose hints allocations follow.
    pub fn set_affinity(&self, store: Arc<dyn Store>) {
        let _ = self.affinity.set(store);
    }

    /// How the manager learns which pods still hold CPUs.
    pub fn set_active_pods(
        &self,
        active: Box<dyn Fn() -> Vec<Pod> + Send + Sync>,
        pending: PendingFunc,
    ) {
        let _ = self.active_pods.set(active);
        let _ = self.pending.set(pending);
    }

    /// The shared pool and the exclusive CPUs now.
    pub fn state(&self) -> State {
        self.inner
            .lock()
            .map(|i| i.state.clone())
            .unwrap_or_default()
    }

    fn store(&self, s: &State) {
        if let Err(e) = state::write(&self.state_dir, self.name.as_str(), s) {
            tracing::error!(error = %e, "cpu manager: writing state");
        }
    }

    /// upstream's removeStaleState: containers of pods no longer active give their CPUs
    /// back. `keep` is a pod being admitted right now.
    fn remove_stale_state(&self, inner: &mut Inner, keep: Option<&str>) -> bool {
        // Nothing assigned, nothing to release: the active pods (a copy of every pod) are
        // not needed, and admitting a pod must not cost a walk of all the others.
        if inner.state.assignments.is_empty()
            && self.last_update.lock().map_or(true, |l| l.is_empty())
        {
            return false;
        }
        let Some(active) = self.active_pods.get() else {
            return false;
        };
        let mut live: HashSet<String> = active()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        live.extend(keep.map(str::to_string));
        let pending = self.pending.get();
        let Inner { state, policy } = inner;
        let Some(policy) = policy else {
            return false;
        };
        let stale: Vec<(String, String)> = state
            .assignments
            .iter()
            .filter(|(uid, _)| !live.contains(*uid) && !pending.is_some_and(|f| f(uid)))
            .flat_map(|(uid, cs)| cs.keys().map(|c| (uid.clone(), c.clone())))
            .collect();
        for (uid, c) in &stale {
            tracing::info!(pod_uid = %uid, container = %c, "cpu manager: releasing the CPUs of a container no longer active");
            policy.remove_container(state, uid, c);
        }
        if let Ok(mut l) = self.last_update.lock() {
            l.retain(|(uid, _), _| live.contains(uid));
        }
        !stale.is_empty()
    }

    /// The cpuset the container's CRI config gets (upstream's PreCreateContainer): its
    /// exclusive CPUs or the shared pool; `None` with the `none` policy.
    pub fn container_cpuset(&self, uid: &str, container: &str) -> Option<String> {
        if self.name == PolicyName::None {
            return None;
        }
        let set = self.inner.lock().ok()?.state.get_or_default(uid, container);
        if set.is_empty() {
            return None;
        }
        if let Ok(mut l) = self.last_update.lock() {
            l.insert((uid.to_string(), container.to_string()), set.clone());
        }
        Some(set.to_string())
    }

    /// The container's exclusive CPUs (the pod-resources API's `cpu_ids`).
    pub fn exclusive_cpus(&self, uid: &str, container: &str) -> Vec<i64> {
        self.inner
            .lock()
            .ok()
            .and_then(|i| {
                i.state
                    .get(uid, container)
                    .map(|s| s.iter().map(|c| c as i64).collect())
            })
            .unwrap_or_default()
    }

    /// The CPUs exclusive allocations may come from (upstream's GetAllocatableCPUs: every
    /// CPU but the reserved ones with `static`, none with `none`).
    pub fn allocatable_cpus(&self) -> Vec<i64> {
        self.inner
            .lock()
            .ok()
            .and_then(|i| {
                let p = i.policy.as_ref()?;
                Some(
                    p.topology
                        .cpus()
                        .difference(&p.reserved)
                        .iter()
                        .map(|c| c as i64)
                        .collect(),
                )
            })
            .unwrap_or_default()
    }

    /// upstream's reconcileState, once: stale CPUs are returned, and every running
    /// container of an active pod whose cpuset changed gets UpdateContainerResources.
    pub async fn reconcile(&self, runtime: &mut crate::cri::RuntimeClient) {
        if self.name == PolicyName::None {
            return;
        }
        let active: HashSet<String> = self
            .active_pods
            .get()
            .map(|f| f().into_iter().filter_map(|p| p.metadata.uid).collect())
            .unwrap_or_default();
        let desired: State = match self.inner.lock() {
            Ok(mut i) => {
                if self.remove_stale_state(&mut i, None) {
                    self.store(&i.state);
                }
                i.state.clone()
            }
            Err(_) => return,
        };
        let containers = match runtime
            .list_containers(pb::ListContainersRequest {
                filter: Some(pb::ContainerFilter {
                    state: Some(pb::ContainerStateValue {
                        state: pb::ContainerState::ContainerRunning as i32,
                    }),
                    ..Default::default()
                }),
            })
            .await
        {
            Ok(r) => r.into_inner().containers,
            Err(e) => {
                tracing::warn!(error = %e.message(), "cpu manager: listing containers");
                return;
            }
        };
        use crate::kuberuntime::labels::{CONTAINER_NAME, POD_UID};
        for c in containers {
            let (Some(uid), Some(name)) = (c.labels.get(POD_UID), c.labels.get(CONTAINER_NAME))
            else {
                continue;
            };
            if !active.contains(uid) {
                continue;
            }
            let want = desired.get_or_default(uid, name);
            if want.is_empty() {
                continue;
            }
            let key = (uid.clone(), name.clone());
            let last = self
                .last_update
                .lock()
                .ok()
                .and_then(|l| l.get(&key).cloned());
            if last.as_ref() == Some(&want) {
                continue;
            }
            let r = runtime
                .update_container_resources(pb::UpdateContainerResourcesRequest {
                    container_id: c.id.clone(),
                    linux: Some(pb::LinuxContainerResources {
                        cpuset_cpus: want.to_string(),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await;
            match r {
                Ok(_) => {
                    tracing::info!(pod_uid = %uid, container = %name, cpuset = %want, "cpu manager: updated container cpuset");
                    if let Ok(mut l) = self.last_update.lock() {
                        l.insert(key, want);
                    }
                }
                Err(e) => {
                    tracing::warn!(pod_uid = %uid, container = %name, error = %e.message(), "cpu manager: failed to update container cpuset")
                }
            }
        }
    }

    /// Runs [`Self::reconcile`] every reconcile period (the `static` policy only).
    pub async fn reconcile_loop(self: Arc<Self>, mut runtime: crate::cri::RuntimeClient) {
        if self.name == PolicyName::None {
            return;
        }
        let mut tick = tokio::time::interval(self.reconcile_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.reconcile(&mut runtime).await;
        }
    }

    fn allocate_inner(&self, pod: &Pod, c: &Container) -> Result<(), AllocateError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let hint = self
            .affinity
            .get()
            .map(|a| a.get_affinity(&uid, &c.name))
            .unwrap_or(TopologyHint {
                numa_node_affinity: None,
                preferred: false,
            });
        let Ok(mut guard) = self.inner.lock() else {
            return Ok(());
        };
        let inner = &mut *guard;
        let mut changed = self.remove_stale_state(inner, Some(&uid));
        if let Some(p) = inner.policy.as_mut() {
            let before = inner.state.clone();
            p.allocate(&mut inner.state, pod, c, &hint)?;
            changed |= before != inner.state;
        }
        if changed {
            self.store(&inner.state);
        }
        Ok(())
    }
}

impl HintProvider for CpuManager {
    fn get_topology_hints(&self, pod: &Pod, c: &Container) -> HashMap<String, Vec<TopologyHint>> {
        let Ok(i) = self.inner.lock() else {
            return HashMap::new();
        };
        match &i.policy {
            Some(p) => p.get_topology_hints(&i.state, pod, c),
            None => HashMap::new(),
        }
    }

    fn get_pod_topology_hints(&self, pod: &Pod) -> HashMap<String, Vec<TopologyHint>> {
        let Ok(i) = self.inner.lock() else {
            return HashMap::new();
        };
        match &i.policy {
            Some(p) => p.get_pod_topology_hints(&i.state, pod),
            None => HashMap::new(),
        }
    }

    fn allocate(&self, pod: &Pod, c: &Container) -> Result<(), String> {
        self.allocate_inner(pod, c).map_err(|e| e.to_string())
    }

    fn allocate_for_admission(&self, pod: &Pod, c: &Container) -> Result<(), Rejection> {
        self.allocate_inner(pod, c).map_err(|e| match e {
            AllocateError::SmtNotMultiple { .. } | AllocateError::SmtNotEnough { .. } => {
                Rejection {
                    reason: Reason::SmtAlignmentError,
                    message: e.to_string(),
                }
            }
            AllocateError::Take(_) => unexpected(e.to_string()),
        })
    }
}

#[cfg(test)]
mod tests;
