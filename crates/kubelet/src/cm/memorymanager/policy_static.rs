//! upstream's Static memory manager policy: every container of a Guaranteed pod gets its
//! memory and hugepages from a set of NUMA nodes — the topology manager's choice, or the
//! narrowest set with room — and is pinned to them with `cpuset.mems`. A node serves either
//! single-node allocations or one multi-node group, never both ("Single vs. cross NUMA
//! node allocation"), and init containers' memory is reused by the containers after them.
//!
//! NUMA node sets are the topology manager's [`BitMask`]s, hints its [`TopologyHint`]s.

use super::machine::MachineInfo;
use super::reserved::{SystemReservedMemory, is_memory_type};
use super::state::{Block, MemoryTable, NumaNodeMap, NumaNodeState, State};
use crate::cm::topologymanager::bitmask::iterate_bit_masks;
use crate::cm::topologymanager::{BitMask, TopologyHint};
use k8s_openapi::api::core::v1::{Container, Pod};
use nodus_k8s::qos::{QosClass, pod_qos_class};
use std::collections::BTreeMap;

pub const NAME: &str = "Static";
const MEMORY: &str = "memory";

/// Memory type → bytes.
pub type Requested = BTreeMap<String, u64>;

/// The mask of a block's nodes (state files hold node ids, all below 64).
fn mask_of(nodes: &[usize]) -> BitMask {
    BitMask::new(nodes).unwrap_or_default()
}

fn is_restartable_init(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn is_guaranteed(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .is_some_and(|s| pod_qos_class(s) == QosClass::Guaranteed)
}

/// Pod-level resources are not served by the Static policy (upstream skips such pods).
fn has_pod_level_resources(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .is_some_and(|r| {
            r.requests.as_ref().is_some_and(|m| !m.is_empty())
                || r.limits.as_ref().is_some_and(|m| !m.is_empty())
        })
}

/// upstream's getRequestedResources: the container's memory and hugepages requests (a
/// request left out defaults to its limit, as the API server's defaulting does).
pub fn container_requests(c: &Container) -> Result<Requested, String> {
    let r = c.resources.clone().unwrap_or_default();
    let mut amounts = r.limits.unwrap_or_default();
    amounts.extend(r.requests.unwrap_or_default());
    let mut out = Requested::new();
    for (name, q) in amounts {
        if !is_memory_type(&name) {
            continue;
        }
        let v = nodus_k8s::quantity::parse_quantity(&q.0)
            .ok()
            .and_then(|p| u64::try_from(p.value()).ok())
            .ok_or("[memorymanager] failed to represent quantity as int64")?;
        out.insert(name, v);
    }
    Ok(out)
}

/// upstream's getPodRequestedResources: the larger of the app containers' sum (with
/// restartable init containers) and the largest init container.
pub fn pod_requests(pod: &Pod) -> Result<Requested, String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut by_init = Requested::new();
    let mut by_sidecars = Requested::new();
    for c in spec.init_containers.iter().flatten() {
        for (name, q) in container_requests(c)? {
            let init = by_init.entry(name.clone()).or_default();
            let sidecars = by_sidecars.entry(name).or_default();
            if is_restartable_init(c) {
                *sidecars += q;
            } else if *sidecars + q > *init {
                *init = *sidecars + q;
            }
        }
    }
    let mut by_app = Requested::new();
    for c in &spec.containers {
        for (name, q) in container_requests(c)? {
            *by_app.entry(name).or_default() += q;
        }
    }
    Ok(by_app
        .into_iter()
        .map(|(name, q)| {
            let long_running = q + by_sidecars.get(&name).copied().unwrap_or(0);
            let v = long_running.max(by_init.get(&name).copied().unwrap_or(0));
            (name, v)
        })
        .collect())
}

fn free(ms: &NumaNodeMap, node: usize, resource: &str) -> u64 {
    ms.get(&node)
        .and_then(|n| n.memory_map.get(resource))
        .map_or(0, |t| t.free)
}

fn sorted(v: &[usize]) -> Vec<usize> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v
}

/// Reusable init container memory: pod UID → NUMA mask → memory type → bytes.
type ReusableMemory = BTreeMap<String, BTreeMap<BitMaskKey, BTreeMap<String, u64>>>;

/// A mask as a map key (upstream keys by the mask's string).
type BitMaskKey = u64;

pub struct StaticPolicy {
    machine: MachineInfo,
    system_reserved: SystemReservedMemory,
    reusable: ReusableMemory,
}

impl StaticPolicy {
    /// upstream's NewPolicyStatic: some memory must be reserved for the system.
    pub fn new(
        machine: MachineInfo,
        system_reserved: SystemReservedMemory,
    ) -> Result<StaticPolicy, String> {
        let total: u64 = system_reserved.values().filter_map(|n| n.get(MEMORY)).sum();
        if total == 0 {
            return Err("[memorymanager] you should specify the system reserved memory".into());
        }
        Ok(StaticPolicy {
            machine,
            system_reserved,
            reusable: ReusableMemory::new(),
        })
    }

    fn reserved_of(&self, node: usize, resource: &str) -> u64 {
        self.system_reserved
            .get(&node)
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(0)
    }

    /// upstream's getDefaultMachineState: every node's memory and hugepages, minus what is
    /// reserved; regular memory also minus the node's hugepages.
    pub fn default_machine_state(&self) -> NumaNodeMap {
        let mut ms = NumaNodeMap::new();
        for node in &self.machine.nodes {
            let mut state = NumaNodeState {
                number_of_assignments: 0,
                memory_map: BTreeMap::new(),
                cells: vec![node.id],
            };
            let mut in_hugepages = 0u64;
            for (size, pages) in &node.hugepages {
                let name = crate::cm::allocatable::hugepage_resource_name(*size as i64);
                let reserved = self.reserved_of(node.id, &name);
                let total = size * pages;
                let allocatable = total.saturating_sub(reserved);
                state.memory_map.insert(
                    name,
                    MemoryTable {
                        total_mem_size: total,
                        system_reserved: reserved,
                        allocatable,
                        reserved: 0,
                        free: allocatable,
                    },
                );
                in_hugepages += total;
            }
            let reserved = self.reserved_of(node.id, MEMORY);
            let allocatable = node.memory.saturating_sub(reserved + in_hugepages);
            state.memory_map.insert(
                MEMORY.into(),
                MemoryTable {
                    total_mem_size: node.memory,
                    system_reserved: reserved,
                    allocatable,
                    reserved: 0,
                    free: allocatable,
                },
            );
            ms.insert(node.id, state);
        }
        ms
    }

    /// upstream's validateState at Start: an empty state gets the default machine state;
    /// a restored one must match what the machine and the reservations give now.
    pub fn start(&self, s: &mut State) -> Result<(), String> {
        if s.machine_state.is_empty() {
            if !s.assignments.is_empty() {
                return Err(
                    "[memorymanager] machine state can not be empty when it has memory assignments"
                        .into(),
                );
            }
            s.machine_state = self.default_machine_state();
            s.store_or_log();
            return Ok(());
        }
        let mut expected = self.default_machine_state();
        for (pod, containers) in &s.assignments {
            for (container, blocks) in containers {
                for b in blocks {
                    let mut size = b.size;
                    for node in &b.numa_affinity {
                        let Some(ns) = expected.get_mut(node) else {
                            return Err(format!(
                                "[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses the NUMA that does not exist"
                            ));
                        };
                        ns.number_of_assignments += 1;
                        ns.cells = b.numa_affinity.clone();
                        let Some(t) = ns.memory_map.get_mut(&b.type_) else {
                            return Err(format!(
                                "[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses memory resource that does not exist"
                            ));
                        };
                        take(t, &mut size);
                    }
                }
            }
        }
        if !machine_states_equal(&s.machine_state, &expected) {
            return Err(
                "[memorymanager] the expected machine state is different from the real one".into(),
            );
        }
        Ok(())
    }

    /// upstream's Allocate (idempotent): memory for one container of a Guaranteed pod, on
    /// `hint`'s nodes when the topology manager chose some.
    pub fn allocate(
        &mut self,
        s: &mut State,
        pod: &Pod,
        container: &Container,
        hint: TopologyHint,
    ) -> Result<(), String> {
        if !is_guaranteed(pod) || has_pod_level_resources(pod) {
            return Ok(());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Some(blocks) = s.memory_blocks(&uid, &container.name).cloned() {
            self.update_pod_reusable_memory(pod, container, &blocks);
            return Ok(());
        }
        let requested = container_requests(container)?;
        let mut ms = s.machine_state.clone();
        let mut best = hint;
        if best.numa_node_affinity.is_none() {
            let default = self
                .default_hint(&ms, &uid, &requested)
                .ok_or("[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available")?;
            if !default.preferred && best.preferred {
                return Err("[memorymanager] failed to find the default preferred hint".into());
            }
            best = default;
        }
        let mask = best.numa_node_affinity.unwrap_or_default();
        if !satisfies(&ms, mask, &requested) {
            let extended = self.extend_hint(&ms, &uid, &requested, mask).ok_or(
                "[memorymanager] failed to find NUMA nodes to extend the current topology hint",
            )?;
            if !extended.preferred && best.preferred {
                return Err("[memorymanager] failed to find the extended preferred hint".into());
            }
            best = extended;
        }
        let mask = best.numa_node_affinity.unwrap_or_default();
        if violates_numa_allocations(&ms, mask) {
            return Err("[memorymanager] preferred hint violates NUMA node allocation".into());
        }
        let nodes = mask.get_bits();
        let mut blocks = Vec::new();
        for (resource, size) in &requested {
            blocks.push(Block {
                numa_affinity: nodes.clone(),
                type_: resource.clone(),
                size: *size,
            });
            let reusable = self.pod_reusable(&uid, mask, resource);
            let size = size.saturating_sub(reusable);
            update_machine_state(&mut ms, &nodes, resource, size);
        }
        self.update_pod_reusable_memory(pod, container, &blocks);
        s.machine_state = ms;
        s.set_memory_blocks(&uid, &container.name, blocks.clone());
        self.update_init_containers_blocks(s, pod, container, &blocks);
        tracing::info!(pod_uid = %uid, container = %container.name, numa_nodes = ?nodes, "memory manager: allocated exclusive memory");
        Ok(())
    }

    /// upstream's RemoveContainer (idempotent): the container's blocks go back to their nodes.
    pub fn remove_container(&mut self, s: &mut State, uid: &str, container: &str) {
        let Some(blocks) = s.memory_blocks(uid, container).cloned() else {
            return;
        };
        s.delete(uid, container);
        for b in blocks {
            let mut released = b.size;
            for node in &b.numa_affinity {
                let Some(ns) = s.machine_state.get_mut(node) else {
                    continue;
                };
                ns.number_of_assignments -= 1;
                if ns.number_of_assignments == 0 {
                    ns.cells = vec![*node];
                }
                if released == 0 {
                    continue;
                }
                let Some(t) = ns.memory_map.get_mut(&b.type_) else {
                    continue;
                };
                let back = t.reserved.min(released);
                t.reserved -= back;
                t.free += back;
                released -= back;
            }
        }
    }

    /// upstream's GetTopologyHints: None for pods the policy does not pin.
    pub fn topology_hints(
        &self,
        s: &State,
        pod: &Pod,
        container: &Container,
    ) -> Option<BTreeMap<String, Vec<TopologyHint>>> {
        if !is_guaranteed(pod) || has_pod_level_resources(pod) {
            return None;
        }
        let requested = container_requests(container).ok()?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Some(blocks) = s.memory_blocks(&uid, &container.name) {
            return regenerate_hints(blocks, &requested);
        }
        Some(self.calculate_hints(&s.machine_state, &uid, &requested))
    }

    /// upstream's GetPodTopologyHints.
    pub fn pod_topology_hints(
        &self,
        s: &State,
        pod: &Pod,
    ) -> Option<BTreeMap<String, Vec<TopologyHint>>> {
        if !is_guaranteed(pod) || has_pod_level_resources(pod) {
            return None;
        }
        let requested = pod_requests(pod).ok()?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        for c in spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
        {
            if let Some(blocks) = s.memory_blocks(&uid, &c.name) {
                return regenerate_hints(blocks, &requested);
            }
        }
        Some(self.calculate_hints(&s.machine_state, &uid, &requested))
    }

    /// upstream's calculateHints: every node set with enough allocatable memory of each
    /// type that respects the single/cross NUMA rule and has the memory free; the narrowest
    /// sets that could ever fit are preferred.
    fn calculate_hints(
        &self,
        ms: &NumaNodeMap,
        uid: &str,
        requested: &Requested,
    ) -> BTreeMap<String, Vec<TopologyHint>> {
        let nodes: Vec<usize> = ms.keys().copied().collect();
        let mut all = Vec::new();
        iterate_bit_masks(&nodes, |m| all.push(m));
        let mut min_size = nodes.len();
        let mut masks = Vec::new();
        'masks: for mask in all {
            let nodes_in = mask.get_bits();
            let single = nodes_in.len() == 1;
            for (resource, size) in requested {
                let allocatable: u64 = nodes_in
                    .iter()
                    .map(|n| ms[n].memory_map.get(resource).map_or(0, |t| t.allocatable))
                    .sum();
                if allocatable < *size {
                    continue 'masks;
                }
            }
            min_size = min_size.min(mask.count());
            if single && ms[&nodes_in[0]].cells.len() > 1 {
                continue;
            }
            for n in &nodes_in {
                let ns = &ms[n];
                if !single
                    && ns.number_of_assignments > 0
                    && (ns.cells.len() == 1 || sorted(&ns.cells) != nodes_in)
                {
                    continue 'masks;
                }
            }
            for (resource, size) in requested {
                let total: u64 = nodes_in.iter().map(|n| free(ms, *n, resource)).sum();
                if total + self.pod_reusable(uid, mask, resource) < *size {
                    continue 'masks;
                }
            }
            masks.push(mask);
        }
        let mut hints = BTreeMap::new();
        for resource in requested.keys() {
            let list: Vec<TopologyHint> = masks
                .iter()
                .map(|m| TopologyHint {
                    numa_node_affinity: Some(*m),
                    preferred: m.count() == min_size,
                })
                .collect();
            if !list.is_empty() {
                hints.insert(resource.clone(), list);
            }
        }
        hints
    }

    fn default_hint(
        &self,
        ms: &NumaNodeMap,
        uid: &str,
        requested: &Requested,
    ) -> Option<TopologyHint> {
        let hints = self.calculate_hints(ms, uid, requested);
        if hints.is_empty() {
            return None;
        }
        Some(best_hint(
            hints.get(MEMORY).map(Vec::as_slice).unwrap_or_default(),
        ))
    }

    /// upstream's extendTopologyManagerHint: the best of our hints containing `mask`.
    fn extend_hint(
        &self,
        ms: &NumaNodeMap,
        uid: &str,
        requested: &Requested,
        mask: BitMask,
    ) -> Option<TopologyHint> {
        let hints = self.calculate_hints(ms, uid, requested);
        let within: Vec<TopologyHint> = hints
            .get(MEMORY)
            .into_iter()
            .flatten()
            .filter(|h| h.numa_node_affinity.is_some_and(|m| m.and(mask) == mask))
            .cloned()
            .collect();
        (!within.is_empty()).then(|| best_hint(&within))
    }

    fn pod_reusable(&self, uid: &str, mask: BitMask, resource: &str) -> u64 {
        self.reusable
            .get(uid)
            .and_then(|m| m.get(&mask.bits()))
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(0)
    }

    /// upstream's updatePodReusableMemory: an init container's blocks become reusable by
    /// the containers after it; an app container uses them up.
    fn update_pod_reusable_memory(&mut self, pod: &Pod, container: &Container, blocks: &[Block]) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.reusable.retain(|u, _| *u == uid);
        let regular_init = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .and_then(|ics| ics.iter().find(|c| c.name == container.name))
            .is_some_and(|c| !is_restartable_init(c));
        let pod_map = self.reusable.entry(uid).or_default();
        for b in blocks {
            let mask = mask_of(&b.numa_affinity).bits();
            let r = pod_map
                .entry(mask)
                .or_default()
                .entry(b.type_.clone())
                .or_default();
            if regular_init {
                *r = (*r).max(b.size);
            } else {
                *r = r.saturating_sub(b.size);
            }
        }
    }

    /// upstream's updateInitContainersMemoryBlocks: the init containers before this one
    /// whose memory it reused give it up in the state, so the pod's blocks add up to what
    /// it holds.
    fn update_init_containers_blocks(
        &self,
        s: &mut State,
        pod: &Pod,
        container: &Container,
        blocks: &[Block],
    ) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let inits = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.clone())
            .unwrap_or_default();
        for cb in blocks {
            let mut size = cb.size;
            for ic in &inits {
                if ic.name == container.name || size == 0 {
                    break;
                }
                if is_restartable_init(ic) {
                    continue;
                }
                let Some(mut ibs) = s.memory_blocks(&uid, &ic.name).cloned() else {
                    continue;
                };
                for ib in ibs.iter_mut() {
                    if ib.size == 0
                        || ib.type_ != cb.type_
                        || mask_of(&ib.numa_affinity) != mask_of(&cb.numa_affinity)
                    {
                        continue;
                    }
                    let used = ib.size.min(size);
                    ib.size -= used;
                    size -= used;
                }
                s.set_memory_blocks(&uid, &ic.name, ibs);
            }
        }
    }
}

/// Takes `size` out of a table's free memory (as much as there is), as upstream's
/// updateMachineState and validateState do node by node.
fn take(t: &mut MemoryTable, size: &mut u64) {
    let n = t.free.min(*size);
    t.free -= n;
    t.reserved += n;
    *size -= n;
}

fn update_machine_state(ms: &mut NumaNodeMap, nodes: &[usize], resource: &str, size: u64) {
    let mut size = size;
    for n in nodes {
        let Some(ns) = ms.get_mut(n) else { continue };
        ns.number_of_assignments += 1;
        ns.cells = nodes.to_vec();
        if size == 0 {
            continue;
        }
        if let Some(t) = ns.memory_map.get_mut(resource) {
            take(t, &mut size);
        }
    }
}

fn satisfies(ms: &NumaNodeMap, mask: BitMask, requested: &Requested) -> bool {
    requested.iter().all(|(resource, size)| {
        mask.get_bits()
            .iter()
            .map(|n| free(ms, *n, resource))
            .sum::<u64>()
            >= *size
    })
}

/// upstream's isAffinityViolatingNUMAAllocations.
fn violates_numa_allocations(ms: &NumaNodeMap, mask: BitMask) -> bool {
    let nodes = mask.get_bits();
    if nodes.len() == 1 {
        return false;
    }
    nodes.iter().any(|n| {
        ms.get(n).is_some_and(|ns| {
            ns.number_of_assignments > 0 && (ns.cells.len() == 1 || sorted(&ns.cells) != nodes)
        })
    })
}

/// upstream's findBestHint: preferred first, then the narrowest.
fn best_hint(hints: &[TopologyHint]) -> TopologyHint {
    let mut best: Option<&TopologyHint> = None;
    for h in hints {
        let Some(b) = best else {
            best = Some(h);
            continue;
        };
        if h.preferred && !b.preferred {
            best = Some(h);
            continue;
        }
        let (hm, bm) = (
            h.numa_node_affinity.unwrap_or_default(),
            b.numa_node_affinity.unwrap_or_default(),
        );
        if h.preferred == b.preferred && hm.is_narrower_than(bm) {
            best = Some(h);
        }
    }
    best.cloned().unwrap_or(TopologyHint {
        numa_node_affinity: None,
        preferred: false,
    })
}

/// upstream's regenerateHints: the blocks a container already has, as preferred hints
/// (after a kubelet restart); None when they no longer match its requests.
fn regenerate_hints(
    blocks: &[Block],
    requested: &Requested,
) -> Option<BTreeMap<String, Vec<TopologyHint>>> {
    if blocks.len() != requested.len() {
        return None;
    }
    let mut hints: BTreeMap<String, Vec<TopologyHint>> = BTreeMap::new();
    for b in blocks {
        if requested.get(&b.type_) != Some(&b.size) {
            return None;
        }
        hints
            .entry(b.type_.clone())
            .or_default()
            .push(TopologyHint {
                numa_node_affinity: Some(mask_of(&b.numa_affinity)),
                preferred: true,
            });
    }
    Some(hints)
}

/// upstream's areMachineStatesEqual.
fn machine_states_equal(a: &NumaNodeMap, b: &NumaNodeMap) -> bool {
    if a.len() != b.len() {
        return false;
    }
    for (id, n1) in a {
        let Some(n2) = b.get(id) else { return false };
        if n1.number_of_assignments != n2.number_of_assignments
            || sorted(&n1.cells) != sorted(&n2.cells)
            || n1.memory_map.len() != n2.memory_map.len()
        {
            return false;
        }
        for (resource, t1) in &n1.memory_map {
            let Some(t2) = n2.memory_map.get(resource) else {
                return false;
            };
            if t1.total_mem_size != t2.total_mem_size
                || t1.system_reserved != t2.system_reserved
                || t1.allocatable != t2.allocatable
            {
                return false;
            }
            let group = |ms: &NumaNodeMap| {
                n1.cells.iter().fold((0u64, 0u64), |(f, r), c| {
                    let t = ms.get(c).and_then(|n| n.memory_map.get(resource));
                    (f + t.map_or(0, |t| t.free), r + t.map_or(0, |t| t.reserved))
                })
            };
            if group(a) != group(b) {
                return false;
            }
        }
    }
    true
}
