//! The device manager as a topology manager hint provider (upstream's
//! devicemanager/topology_hints.go): for every device resource a container asks for, the
//! NUMA node sets holding enough of its free devices, from the TopologyInfo plugins send in
//! ListAndWatch. Resources whose devices carry no topology have no preference; a request
//! that cannot be met anywhere gets no hints (which a topology policy refuses). The
//! allocation itself stays in the device manager's own admit handler, which runs after the
//! topology manager and prefers devices on the merged hint's NUMA nodes
//! ([`DeviceManager::aligned_first`]).

use super::{DeviceManager, State};
use crate::cm::topologymanager::{
    BitMask, HintProvider, Store, TopologyHint, bitmask::iterate_bit_masks,
};
use cri::deviceplugin::v1beta1 as pb;
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::{BTreeSet, HashMap};

fn numa_nodes(d: &pb::Device) -> Vec<usize> {
    d.topology
        .as_ref()
        .map(|t| {
            t.nodes
                .iter()
                .filter_map(|n| usize::try_from(n.id).ok())
                .collect()
        })
        .unwrap_or_default()
}

impl DeviceManager {
    /// The machine's NUMA nodes (set at start, before the first pod).
    pub fn set_numa_nodes(&self, nodes: Vec<usize>) {
        let _ = self.numa_nodes.set(nodes);
    }

    /// The topology manager whose merged hint allocations prefer.
    pub fn set_affinity(&self, store: std::sync::Arc<dyn Store>) {
        let _ = self.affinity.set(store);
    }

    /// `available` reordered so the devices on the NUMA nodes of the container's merged
    /// hint come first (upstream's filterByAffinity, simplified to an order).
    pub(super) fn aligned_first(
        &self,
        s: &State,
        uid: &str,
        container: &str,
        resource: &str,
        available: &BTreeSet<String>,
    ) -> Vec<String> {
        let mask = self
            .affinity
            .get()
            .and_then(|a| a.get_affinity(uid, container).numa_node_affinity);
        let Some(mask) = mask else {
            return available.iter().cloned().collect();
        };
        let devices = s.resources.get(resource).map(|r| &r.devices);
        let aligned = |id: &String| {
            devices
                .and_then(|d| d.get(id))
                .is_some_and(|d| mask.any_set(&numa_nodes(d)))
        };
        let (mut first, rest): (Vec<String>, Vec<String>) =
            available.iter().cloned().partition(|id| aligned(id));
        first.extend(rest);
        first
    }

    fn hints_for(
        &self,
        s: &State,
        uid: &str,
        container: &str,
        requests: impl IntoIterator<Item = (String, i64)>,
    ) -> HashMap<String, Vec<TopologyHint>> {
        let mut out = HashMap::new();
        let nodes = self.numa_nodes.get().cloned().unwrap_or_else(|| vec![0]);
        for (resource, requested) in requests {
            let Some(r) = s.resources.get(&resource) else {
                continue;
            };
            if requested <= 0 || !r.devices.values().any(|d| !numa_nodes(d).is_empty()) {
                // No topology: no preference (absent).
                continue;
            }
            let requested = requested as usize;
            let allocated: BTreeSet<String> = s
                .allocated
                .get(uid)
                .and_then(|c| c.get(container))
                .and_then(|rs| rs.get(&resource))
                .map(|a| a.ids.clone())
                .unwrap_or_default();
            let hints = if !allocated.is_empty() {
                if allocated.len() != requested {
                    tracing::error!(
                        pod_uid = uid,
                        container,
                        resource,
                        "resource already allocated to pod with different number than request"
                    );
                    Vec::new()
                } else {
                    generate(r, &nodes, &allocated, &BTreeSet::new(), requested)
                }
            } else {
                let mut in_use = BTreeSet::new();
                let mut reusable = BTreeSet::new();
                for (puid, cs) in &s.allocated {
                    for (cname, rs) in cs {
                        if let Some(a) = rs.get(&resource) {
                            in_use.extend(a.ids.iter().cloned());
                            if puid == uid && cname.starts_with("init:") {
                                reusable.extend(a.ids.iter().cloned());
                            }
                        }
                    }
                }
                let available: BTreeSet<String> =
                    r.healthy().difference(&in_use).cloned().collect();
                if available.len() + reusable.len() < requested {
                    tracing::error!(
                        pod_uid = uid,
                        container,
                        resource,
                        "unable to generate topology hints: requested number of devices unavailable"
                    );
                    Vec::new()
                } else {
                    generate(r, &nodes, &available, &reusable, requested)
                }
            };
            out.insert(resource, hints);
        }
        out
    }
}

/// upstream's generateDeviceTopologyHints.
fn generate(
    r: &super::Resource,
    nodes: &[usize],
    available: &BTreeSet<String>,
    reusable: &BTreeSet<String>,
    request: usize,
) -> Vec<TopologyHint> {
    let mut min_affinity = nodes.len();
    let mut hints = Vec::new();
    let on = |mask: BitMask, id: &String| {
        r.devices
            .get(id)
            .is_some_and(|d| mask.any_set(&numa_nodes(d)))
    };
    iterate_bit_masks(nodes, |mask| {
        let in_mask = r
            .devices
            .values()
            .filter(|d| mask.any_set(&numa_nodes(d)))
            .count();
        if in_mask >= request && mask.count() < min_affinity {
            min_affinity = mask.count();
        }
        let mut matching = 0;
        for id in reusable {
            if r.devices.get(id).is_none_or(|d| d.topology.is_none()) {
                continue;
            }
            if !on(mask, id) {
                return;
            }
            matching += 1;
        }
        matching += available.iter().filter(|id| on(mask, id)).count();
        if matching >= request {
            hints.push(TopologyHint {
                numa_node_affinity: Some(mask),
                preferred: false,
            });
        }
    });
    for h in &mut hints {
        h.preferred = h
            .numa_node_affinity
            .is_some_and(|m| m.count() == min_affinity);
    }
    hints
}

impl HintProvider for DeviceManager {
    fn get_topology_hints(&self, pod: &Pod, c: &Container) -> HashMap<String, Vec<TopologyHint>> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Ok(s) = self.state.lock() else {
            return HashMap::new();
        };
        self.hints_for(
            &s,
            &uid,
            &c.name,
            nodus_k8s::resources::container_extended_requests(c),
        )
    }

    fn get_pod_topology_hints(&self, pod: &Pod) -> HashMap<String, Vec<TopologyHint>> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Ok(s) = self.state.lock() else {
            return HashMap::new();
        };
        // upstream's getPodDeviceRequest: the larger of the biggest init request and the
        // sum over the app containers.
        self.hints_for(
            &s,
            &uid,
            "",
            nodus_k8s::resources::pod_extended_requests(pod),
        )
    }

    /// Devices are allocated by the device manager's own admit handler, which talks to the
    /// plugins asynchronously and runs right after the topology manager.
    fn allocate(&self, _: &Pod, _: &Container) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(id: &str, numa: i64) -> pb::Device {
        pb::Device {
            id: id.into(),
            health: super::super::HEALTHY.into(),
            topology: Some(pb::TopologyInfo {
                nodes: vec![pb::NumaNode { id: numa }],
            }),
        }
    }

    #[test]
    fn hints_are_the_numa_sets_with_enough_free_devices() {
        let mut r = super::super::Resource::default();
        for (id, n) in [("a", 0), ("b", 0), ("c", 1), ("d", 3)] {
            r.devices.insert(id.into(), dev(id, n));
        }
        let nodes = [0, 1, 2, 3];
        let all: BTreeSet<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        let m = |n: &[usize]| Some(BitMask::new(n).unwrap());
        // One device: each node with a device is a preferred single-node hint.
        let h = generate(&r, &nodes, &all, &BTreeSet::new(), 1);
        let preferred: Vec<_> = h
            .iter()
            .filter(|h| h.preferred)
            .map(|h| h.numa_node_affinity)
            .collect();
        assert_eq!(preferred, vec![m(&[0]), m(&[1]), m(&[3])]);
        // Two devices: node 0 alone can, preferred; pairs with two devices are not.
        let h = generate(&r, &nodes, &all, &BTreeSet::new(), 2);
        assert!(h.contains(&TopologyHint {
            numa_node_affinity: m(&[0]),
            preferred: true
        }));
        assert!(h.contains(&TopologyHint {
            numa_node_affinity: m(&[1, 3]),
            preferred: false
        }));
        assert!(!h.iter().any(|h| h.numa_node_affinity == m(&[2])));
        // With a and b taken, two devices need nodes 1 and 3: that pair is the narrowest
        // that can, but a single node could hold two on this machine, so not preferred.
        let free: BTreeSet<String> = ["c", "d"].iter().map(|s| s.to_string()).collect();
        let h = generate(&r, &nodes, &free, &BTreeSet::new(), 2);
        assert!(h.iter().all(|h| !h.preferred));
        assert!(h.contains(&TopologyHint {
            numa_node_affinity: m(&[1, 3]),
            preferred: false
        }));
    }
}
