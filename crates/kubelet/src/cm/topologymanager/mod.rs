//! The topology manager (upstream's pkg/kubelet/cm/topologymanager): before a pod runs it
//! asks every hint provider (the CPU manager, the memory manager, the device manager) on
//! which NUMA nodes each container's resources could be placed, merges the hints under the
//! node's policy (`none`, `best-effort`, `restricted`, `single-numa-node`) per container or
//! per pod (the scope), and refuses the pod with `TopologyAffinityError` when the policy
//! finds no acceptable placement. Otherwise the merged hint is stored, and every provider's
//! `allocate` places the container's resources on it ([`Store::get_affinity`]).

pub mod bitmask;

pub use bitmask::BitMask;

use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::HashMap;

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
}

/// The merged hint per container (upstream's Store), which providers read in `allocate`.
pub trait Store: Send + Sync {
    /// The merged hint for `container_name` of the pod `pod_uid`; the any-NUMA preferred
    /// hint when none is stored (the policy `none`).
    fn get_affinity(&self, pod_uid: &str, container_name: &str) -> TopologyHint;
}
