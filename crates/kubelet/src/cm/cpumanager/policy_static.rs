//! The `static` policy (upstream's policy_static.go): a container of a Guaranteed pod whose
//! CPU request is a whole number gets that many CPUs of its own, taken out of the shared pool
//! ([`super::cpu_assignment`], aligned on the topology manager's hint); every other container
//! runs on the shared pool, which always keeps the reserved CPUs. CPUs of init containers are
//! reused by the app containers after them; a removed container's CPUs go back to the pool.

use super::cpu_assignment::{
    TakeError, take_by_topology_numa_distributed, take_by_topology_numa_packed,
};
use super::state::State;
use crate::cm::cpuset::CpuSet;
use crate::cm::topology::CpuTopology;
use crate::cm::topologymanager::{BitMask, TopologyHint, bitmask::iterate_bit_masks};
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::{BTreeMap, HashMap};

pub const FULL_PCPUS_ONLY: &str = "full-pcpus-only";
pub const DISTRIBUTE_CPUS_ACROSS_NUMA: &str = "distribute-cpus-across-numa";

/// upstream's StaticPolicyOptions (the ones nodus implements).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StaticPolicyOptions {
    pub full_physical_cpus_only: bool,
    pub distribute_cpus_across_numa: bool,
}

impl StaticPolicyOptions {
    /// upstream's NewStaticPolicyOptions, with its texts.
    pub fn parse(options: &BTreeMap<String, String>) -> Result<StaticPolicyOptions, String> {
        let mut o = StaticPolicyOptions::default();
        for (name, value) in options {
            let v = || {
                crate::cm::parse_go_bool(value).ok_or_else(|| {
                    format!(
                        "bad value for option {name:?}: strconv.ParseBool: parsing {value:?}: invalid syntax"
                    )
                })
            };
            match name.as_str() {
                FULL_PCPUS_ONLY => o.full_physical_cpus_only = v()?,
                DISTRIBUTE_CPUS_ACROSS_NUMA => o.distribute_cpus_across_numa = v()?,
                _ => return Err(format!("unknown CPU Manager Policy option: {name:?}")),
            }
        }
        Ok(o)
    }
}

/// Why a container cannot get its CPUs.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllocateError {
    /// upstream's SMTAlignmentError (`full-pcpus-only`).
    #[error(
        "SMT Alignment Error: requested {requested} cpus not multiple cpus per core = {per_core}"
    )]
    SmtNotMultiple { requested: usize, per_core: usize },
    #[error(
        "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = {available}, requested CPUs = {requested}, CPUs per core = {per_core}"
    )]
    SmtNotEnough {
        available: usize,
        requested: usize,
        per_core: usize,
    },
    #[error("{0}")]
    Take(#[from] TakeError),
}

pub struct StaticPolicy {
    pub topology: CpuTopology,
    pub reserved: CpuSet,
    /// The reserved CPUs with their core siblings, off limits with `full-pcpus-only`.
    reserved_physical: CpuSet,
    pub options: StaticPolicyOptions,
    /// pod UID → CPUs its init containers had, for its next containers (upstream's cpusToReuse).
    cpus_to_reuse: HashMap<String, CpuSet>,
}

impl StaticPolicy {
    /// upstream's NewStaticPolicy: `reserved_cpus` when given (`--reserved-cpus`), else
    /// `num_reserved` CPUs taken as an allocation would take them (low cores first).
    pub fn new(
        topology: CpuTopology,
        num_reserved: usize,
        reserved_cpus: &CpuSet,
        options: StaticPolicyOptions,
    ) -> Result<StaticPolicy, String> {
        let mut p = StaticPolicy {
            topology,
            reserved: CpuSet::default(),
            reserved_physical: CpuSet::default(),
            options,
            cpus_to_reuse: HashMap::new(),
        };
        let reserved = if !reserved_cpus.is_empty() {
            reserved_cpus.clone()
        } else {
            p.take_by_topology(&p.topology.cpus(), num_reserved)
                .unwrap_or_default()
        };
        if reserved.len() != num_reserved {
            return Err(format!(
                "[cpumanager] unable to reserve the required amount of CPUs (size of {reserved} did not equal {num_reserved})"
            ));
        }
        let cores: Vec<usize> = reserved
            .iter()
            .filter_map(|c| p.topology.details.get(&c).map(|i| i.core_id))
            .collect();
        p.reserved_physical = p.topology.cpus_in_cores(&cores);
        p.reserved = reserved;
        tracing::info!(reserved = %p.reserved, "static policy: reserved CPUs");
        Ok(p)
    }

    /// upstream's validateState at start: an empty state becomes every CPU in the pool; a
    /// restored one must hold the reserved CPUs in its pool, not overlap, and cover exactly
    /// the machine's CPUs.
    pub fn validate_state(&self, s: &mut State) -> Result<(), String> {
        let all = self.topology.cpus();
        if s.default_cpu_set.is_empty() {
            if !s.assignments.is_empty() {
                return Err("default cpuset cannot be empty".into());
            }
            s.default_cpu_set = all;
            return Ok(());
        }
        if !self.reserved.is_subset_of(&s.default_cpu_set) {
            return Err(format!(
                "not all reserved cpus: \"{}\" are present in defaultCpuSet: \"{}\"",
                self.reserved, s.default_cpu_set
            ));
        }
        let mut known = s.default_cpu_set.clone();
        for (pod, cs) in &s.assignments {
            for (c, set) in cs {
                if !s.default_cpu_set.intersection(set).is_empty() {
                    return Err(format!(
                        "pod: {pod}, container: {c} cpuset: \"{set}\" overlaps with default cpuset \"{}\"",
                        s.default_cpu_set
                    ));
                }
                known = known.union(set);
            }
        }
        if known != all {
            return Err(format!(
                "current set of available CPUs \"{all}\" doesn't match with CPUs in state \"{known}\""
            ));
        }
        Ok(())
    }

    fn take_by_topology(&self, available: &CpuSet, num: usize) -> Result<CpuSet, TakeError> {
        if self.options.distribute_cpus_across_numa {
            let group = if self.options.full_physical_cpus_only {
                self.topology.cpus_per_core()
            } else {
                1
            };
            return take_by_topology_numa_distributed(&self.topology, available, num, group);
        }
        take_by_topology_numa_packed(&self.topology, available, num)
    }

    /// The pool minus the reserved CPUs (with `full-pcpus-only`, minus their whole cores,
    /// so that no allocation has to split a core).
    pub fn available_cpus(&self, s: &State) -> CpuSet {
        if self.options.full_physical_cpus_only {
            return s.default_cpu_set.difference(&self.reserved_physical);
        }
        s.default_cpu_set.difference(&self.reserved)
    }

    /// The exclusive CPUs the container is entitled to: its integer CPU request in a
    /// Guaranteed pod, else 0 (upstream's guaranteedCPUs).
    pub fn guaranteed_cpus(pod: &Pod, c: &Container) -> usize {
        let guaranteed = pod.spec.as_ref().map(nodus_k8s::qos::pod_qos_class)
            == Some(nodus_k8s::qos::QosClass::Guaranteed);
        if !guaranteed {
            return 0;
        }
        let (milli, ..) = nodus_k8s::resources::container_resources(c);
        if milli <= 0 || milli % 1000 != 0 {
            return 0;
        }
        (milli / 1000) as usize
    }

    /// upstream's podGuaranteedCPUs: the larger of the init containers' peak and what the
    /// long-running containers hold together.
    pub fn pod_guaranteed_cpus(pod: &Pod) -> usize {
        let spec = pod.spec.clone().unwrap_or_default();
        let (mut by_init, mut by_sidecars) = (0, 0);
        for c in spec.init_containers.iter().flatten() {
            let n = Self::guaranteed_cpus(pod, c);
            if c.restart_policy.as_deref() == Some("Always") {
                by_sidecars += n;
            } else if by_sidecars + n > by_init {
                by_init = by_sidecars + n;
            }
        }
        let by_app: usize = spec
            .containers
            .iter()
            .map(|c| Self::guaranteed_cpus(pod, c))
            .sum();
        by_init.max(by_app + by_sidecars)
    }

    /// upstream's Allocate.
    pub fn allocate(
        &mut self,
        s: &mut State,
        pod: &Pod,
        c: &Container,
        hint: &TopologyHint,
    ) -> Result<(), AllocateError> {
        let num = Self::guaranteed_cpus(pod, c);
        if num == 0 {
            return Ok(());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if self.options.full_physical_cpus_only {
            let per_core = self.topology.cpus_per_core().max(1);
            if !num.is_multiple_of(per_core) {
                return Err(AllocateError::SmtNotMultiple {
                    requested: num,
                    per_core,
                });
            }
            let available = s.default_cpu_set.difference(&self.reserved_physical).len();
            if num > available {
                return Err(AllocateError::SmtNotEnough {
                    available,
                    requested: num,
                    per_core,
                });
            }
        }
        if let Some(set) = s.get(&uid, &c.name).cloned() {
            self.update_cpus_to_reuse(pod, c, &set);
            return Ok(());
        }
        let reusable = self.cpus_to_reuse.get(&uid).cloned().unwrap_or_default();
        let set = self.allocate_cpus(s, num, hint.numa_node_affinity, &reusable)?;
        tracing::info!(pod_uid = %uid, container = %c.name, cpus = %set, "static policy: exclusive CPUs");
        s.set(&uid, &c.name, set.clone());
        self.update_cpus_to_reuse(pod, c, &set);
        Ok(())
    }

    fn allocate_cpus(
        &self,
        s: &mut State,
        num: usize,
        affinity: Option<BitMask>,
        reusable: &CpuSet,
    ) -> Result<CpuSet, AllocateError> {
        let allocatable = self.available_cpus(s).union(reusable);
        let mut result = CpuSet::default();
        if let Some(mask) = affinity {
            let aligned =
                allocatable.intersection(&self.topology.cpus_in_numa_nodes(&mask.get_bits()));
            let n = aligned.len().min(num);
            result = self.take_by_topology(&aligned, n)?;
        }
        let rest = self.take_by_topology(&allocatable.difference(&result), num - result.len())?;
        result = result.union(&rest);
        s.default_cpu_set = s.default_cpu_set.difference(&result);
        Ok(result)
    }

    fn update_cpus_to_reuse(&mut self, pod: &Pod, c: &Container, set: &CpuSet) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.cpus_to_reuse.retain(|k, _| *k == uid);
        let reuse = self.cpus_to_reuse.entry(uid).or_default();
        let spec = pod.spec.as_ref();
        let init = spec
            .and_then(|s| s.init_containers.as_ref())
            .and_then(|ics| ics.iter().find(|i| i.name == c.name));
        match init {
            Some(i) if i.restart_policy.as_deref() != Some("Always") => {
                *reuse = reuse.union(set);
            }
            Some(_) => {}
            None => *reuse = reuse.difference(set),
        }
    }

    /// upstream's RemoveContainer: the CPUs go back to the pool unless another container of
    /// the pod still holds them (an app container reusing an init container's CPUs).
    pub fn remove_container(&mut self, s: &mut State, uid: &str, container: &str) {
        let in_use: CpuSet = s
            .assignments
            .get(uid)
            .into_iter()
            .flatten()
            .filter(|(c, _)| c.as_str() != container)
            .fold(CpuSet::default(), |a, (_, set)| a.union(set));
        if let Some(set) = s.get(uid, container).cloned() {
            s.delete(uid, container);
            s.default_cpu_set = s.default_cpu_set.union(&set.difference(&in_use));
        }
    }

    /// upstream's GetTopologyHints.
    pub fn get_topology_hints(
        &self,
        s: &State,
        pod: &Pod,
        c: &Container,
    ) -> HashMap<String, Vec<TopologyHint>> {
        let requested = Self::guaranteed_cpus(pod, c);
        if requested == 0 {
            return HashMap::new();
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let hints = if let Some(allocated) = s.get(&uid, &c.name) {
            if allocated.len() != requested {
                tracing::error!(pod_uid = %uid, container = %c.name, "CPUs already allocated to container with different number than request");
                Vec::new()
            } else {
                self.generate_cpu_topology_hints(allocated, &CpuSet::default(), requested)
            }
        } else {
            let reusable = self.cpus_to_reuse.get(&uid).cloned().unwrap_or_default();
            self.generate_cpu_topology_hints(&self.available_cpus(s), &reusable, requested)
        };
        HashMap::from([("cpu".to_string(), hints)])
    }

    /// upstream's GetPodTopologyHints.
    pub fn get_pod_topology_hints(
        &self,
        s: &State,
        pod: &Pod,
    ) -> HashMap<String, Vec<TopologyHint>> {
        let requested = Self::pod_guaranteed_cpus(pod);
        if requested == 0 {
            return HashMap::new();
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let mut assigned = CpuSet::default();
        for c in spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
        {
            if let Some(set) = s.get(&uid, &c.name) {
                if set.len() != Self::guaranteed_cpus(pod, c) {
                    return HashMap::from([("cpu".to_string(), Vec::new())]);
                }
                assigned = assigned.union(set);
            }
        }
        let hints = if assigned.len() == requested {
            self.generate_cpu_topology_hints(&assigned, &CpuSet::default(), requested)
        } else {
            let reusable = self
                .cpus_to_reuse
                .get(&uid)
                .cloned()
                .unwrap_or_default()
                .union(&assigned);
            self.generate_cpu_topology_hints(&self.available_cpus(s), &reusable, requested)
        };
        HashMap::from([("cpu".to_string(), hints)])
    }

    /// Every NUMA node set with enough CPUs for the request; preferred are those as narrow
    /// as the machine allows for that many CPUs (upstream's generateCPUTopologyHints).
    pub fn generate_cpu_topology_hints(
        &self,
        available: &CpuSet,
        reusable: &CpuSet,
        request: usize,
    ) -> Vec<TopologyHint> {
        let nodes = self.topology.numa_nodes();
        let mut min_affinity = nodes.len();
        let mut hints = Vec::new();
        let numa_of = |c: usize| self.topology.details.get(&c).map(|i| i.numa_node_id);
        iterate_bit_masks(&nodes, |mask| {
            let in_mask = self.topology.cpus_in_numa_nodes(&mask.get_bits()).len();
            if in_mask >= request && mask.count() < min_affinity {
                min_affinity = mask.count();
            }
            let mut matching = 0;
            for c in reusable.iter() {
                if !numa_of(c).is_some_and(|n| mask.is_set(n)) {
                    return;
                }
                matching += 1;
            }
            matching += available
                .iter()
                .filter(|&c| numa_of(c).is_some_and(|n| mask.is_set(n)))
                .count();
            if matching < request {
                return;
            }
            hints.push(TopologyHint {
                numa_node_affinity: Some(mask),
                preferred: false,
            });
        });
        for h in &mut hints {
            if h.numa_node_affinity
                .is_some_and(|m| m.count() == min_affinity)
            {
                h.preferred = true;
            }
        }
        hints
    }
}
