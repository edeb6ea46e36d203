//! The topology manager (upstream's pkg/kubelet/cm/topologymanager): before a pod runs it
//! asks every hint provider (the CPU manager, the memory manager, the device manager) on
//! which NUMA nodes each container's resources could be placed, merges the hints under the
//! node's policy (`none`, `best-effort`, `restricted`, `single-numa-node`) per container or
//! per pod (the scope), and refuses the pod with `TopologyAffinityError` when the policy
//! finds no acceptable placement. Otherwise the merged hint is stored, and every provider's
//! `allocate` places the container's resources on it ([`Store::get_affinity`]).

pub mod bitmask;
pub mod numa_info;
pub mod policy;

pub use bitmask::BitMask;
pub use numa_info::NumaInfo;
pub use policy::{PolicyName, PolicyOptions};

use crate::admission::{PodAdmitAttributes, PodAdmitHandler, PodAdmitResult, Reason, Rejection};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

/// upstream's TopologyAffinityError text.
pub const TOPOLOGY_AFFINITY_ERROR: &str = "Resources cannot be allocated with Topology locality";

/// One provider's placement for one resource: the NUMA nodes it would come from (`None`:
/// any, the provider has no preference) and whether that set is as narrow as can be.
#[derive(Clone, Debug, PartialEq)]
pub struct TopologyHint {
    pub numa_node_affinity: Option<BitMask>,
    pub preferred: bool,
}

impl TopologyHint {
    /// upstream's IsEqual.
    pub fn is_equal(&self, other: &TopologyHint) -> bool {
        self.preferred == other.preferred && self.numa_node_affinity == other.numa_node_affinity
    }

    /// upstream's LessThan: preferred hints first, then the narrower affinity.
    pub fn less_than(&self, other: &TopologyHint) -> bool {
        if self.preferred != other.preferred {
            return self.preferred;
        }
        match (self.numa_node_affinity, other.numa_node_affinity) {
            (Some(a), Some(b)) => a.is_narrower_than(b),
            _ => false,
        }
    }
}

/// What the topology manager asks of the CPU, memory and device managers (upstream's
/// HintProvider). Hints are keyed by resource name (`cpu`, `memory`, `hugepages-2Mi`,
/// `example.com/dev`); a resource the provider does not serve is absent, a resource it
/// cannot place anywhere has an empty list. `allocate` runs after the pod was admitted by
/// the merge, and places the container's resources on [`Store::get_affinity`]'s hint.
pub trait HintProvider: Send + Sync {
    fn get_topology_hints(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> HashMap<String, Vec<TopologyHint>>;
    fn get_pod_topology_hints(&self, pod: &Pod) -> HashMap<String, Vec<TopologyHint>>;
    fn allocate(&self, pod: &Pod, container: &Container) -> Result<(), String>;

    /// `allocate` as admission sees it: a failure is upstream's UnexpectedAdmissionError
    /// unless the provider knows better (the CPU manager's SMTAlignmentError).
    fn allocate_for_admission(&self, pod: &Pod, container: &Container) -> Result<(), Rejection> {
        self.allocate(pod, container).map_err(unexpected)
    }
}

/// upstream's unexpectedAdmissionError.
pub fn unexpected(e: String) -> Rejection {
    Rejection {
        reason: Reason::UnexpectedAdmissionError,
        message: format!("Allocate failed due to {e}, which is unexpected"),
    }
}

/// The merged hint per container (upstream's Store), which providers read in `allocate`.
pub trait Store: Send + Sync {
    /// The merged hint for `container_name` of the pod `pod_uid`; the any-NUMA preferred
    /// hint when none is stored (the policy `none`).
    fn get_affinity(&self, pod_uid: &str, container_name: &str) -> TopologyHint;
}

/// Whether hints are merged per container or once for the whole pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Container,
    Pod,
}

impl Scope {
    pub fn parse(s: &str) -> Result<Scope, String> {
        match s {
            "container" => Ok(Scope::Container),
            "pod" => Ok(Scope::Pod),
            _ => Err(format!("unknown scope: \"{s}\"")),
        }
    }
}

/// The topology manager: the policy, the scope, the providers and the merged hints.
pub struct TopologyManager {
    policy: policy::Policy,
    scope: Scope,
    providers: RwLock<Vec<Arc<dyn HintProvider>>>,
    /// pod UID → container → merged hint.
    hints: Mutex<HashMap<String, HashMap<String, TopologyHint>>>,
}

impl TopologyManager {
    /// upstream's NewManager: the options are checked, and a machine with more NUMA nodes
    /// than `max-allowable-numa-nodes` is refused unless the policy is `none`.
    pub fn new(
        sysfs: &std::path::Path,
        policy_name: &str,
        scope_name: &str,
        options: &BTreeMap<String, String>,
    ) -> Result<TopologyManager, String> {
        let opts = PolicyOptions::parse(options)?;
        let numa = NumaInfo::discover(sysfs, opts.prefer_closest_numa)
            .map_err(|e| format!("cannot discover NUMA topology: {e}"))?;
        TopologyManager::with_numa(numa, policy_name, scope_name, opts)
    }

    pub fn with_numa(
        numa: NumaInfo,
        policy_name: &str,
        scope_name: &str,
        opts: PolicyOptions,
    ) -> Result<TopologyManager, String> {
        let name = PolicyName::parse(policy_name)?;
        if name != PolicyName::None && numa.nodes.len() > opts.max_allowable_numa_nodes {
            return Err(format!(
                "unsupported on machines with more than {} NUMA Nodes",
                opts.max_allowable_numa_nodes
            ));
        }
        let scope = Scope::parse(scope_name)?;
        tracing::info!(
            policy = name.as_str(),
            scope = scope_name,
            "creating topology manager"
        );
        Ok(TopologyManager {
            policy: policy::Policy { name, numa, opts },
            scope,
            providers: RwLock::new(Vec::new()),
            hints: Mutex::new(HashMap::new()),
        })
    }

    pub fn policy_name(&self) -> PolicyName {
        self.policy.name
    }

    /// upstream's AddHintProvider; providers are asked in the order they were added.
    pub fn add_hint_provider(&self, p: Arc<dyn HintProvider>) {
        if let Ok(mut v) = self.providers.write() {
            v.push(p);
        }
    }

    fn providers(&self) -> Vec<Arc<dyn HintProvider>> {
        self.providers.read().map(|v| v.clone()).unwrap_or_default()
    }

    fn set_hint(&self, uid: &str, container: &str, hint: TopologyHint) {
        if let Ok(mut h) = self.hints.lock() {
            h.entry(uid.to_string())
                .or_default()
                .insert(container.to_string(), hint);
        }
    }

    /// Forgets the hints of pods no longer active (upstream's RemoveContainer).
    fn prune(&self, active: &HashSet<String>) {
        if let Ok(mut h) = self.hints.lock() {
            h.retain(|uid, _| active.contains(uid));
        }
    }

    /// upstream's scope Admit: merge (per container or per pod), refuse with
    /// TopologyAffinityError when the policy finds no placement, then let every provider
    /// allocate on the merged hint, init containers first.
    pub fn admit_pod<P: std::borrow::Borrow<Pod>>(
        &self,
        pod: &Pod,
        others: &[P],
    ) -> Result<(), Rejection> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut active: HashSet<String> = others
            .iter()
            .filter_map(|p| p.borrow().metadata.uid.clone())
            .collect();
        active.insert(uid.clone());
        self.prune(&active);
        let spec = pod.spec.clone().unwrap_or_default();
        let containers: Vec<&Container> = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .collect();
        let providers = self.providers();
        let refuse = || Rejection {
            reason: Reason::TopologyAffinityError,
            message: TOPOLOGY_AFFINITY_ERROR.to_string(),
        };
        let pod_hint = if self.policy.name != PolicyName::None && self.scope == Scope::Pod {
            let hints: Vec<_> = providers
                .iter()
                .map(|p| p.get_pod_topology_hints(pod))
                .collect();
            let (best, admit) = self.policy.merge(&hints);
            tracing::info!(pod_uid = %uid, hint = ?best, admit, "topology manager: pod affinity");
            if !admit {
                return Err(refuse());
            }
            Some(best)
        } else {
            None
        };
        for c in containers {
            if self.policy.name != PolicyName::None {
                let best = match &pod_hint {
                    Some(h) => h.clone(),
                    None => {
                        let hints: Vec<_> = providers
                            .iter()
                            .map(|p| p.get_topology_hints(pod, c))
                            .collect();
                        let (best, admit) = self.policy.merge(&hints);
                        tracing::info!(pod_uid = %uid, container = %c.name, hint = ?best, admit, "topology manager: container affinity");
                        if !admit {
                            return Err(refuse());
                        }
                        best
                    }
                };
                self.set_hint(&uid, &c.name, best);
            }
            for p in &providers {
                p.allocate_for_admission(pod, c)?;
            }
        }
        Ok(())
    }
}

impl Store for TopologyManager {
    fn get_affinity(&self, pod_uid: &str, container_name: &str) -> TopologyHint {
        self.hints
            .lock()
            .ok()
            .and_then(|h| h.get(pod_uid)?.get(container_name).cloned())
            .unwrap_or(TopologyHint {
                numa_node_affinity: None,
                preferred: false,
            })
    }
}

impl PodAdmitHandler for TopologyManager {
    fn admit<'a>(&'a self, attrs: &'a PodAdmitAttributes<'a>) -> BoxFuture<'a, PodAdmitResult> {
        let r = self.admit_pod(attrs.pod, attrs.other_pods).into();
        Box::pin(async move { r })
    }
}

#[cfg(test)]
mod tests;
