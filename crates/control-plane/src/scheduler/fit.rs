//! The scheduler's filters and score, over a cached view of each node: upstream's
//! NodeUnschedulable, NodeName, TaintToleration, NodeAffinity, NodePorts and
//! NodeResourcesFit filters (in that order, first failure wins), and the per-node scores:
//! LeastAllocated, TaintToleration (PreferNoSchedule) and preferred NodeAffinity. Reasons
//! carry upstream's FailedScheduling wording (also those of the VolumeBinding, VolumeZone,
//! PodTopologySpread and InterPodAffinity filters, which run after these).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use nodus_k8s::resources::{container_resources, milli, pod_extended_requests, pod_requests};
use nodus_k8s::scheduling;

use super::interpodaffinity::PodAffinityTerms;

/// Requests the scheduler assumes for a container that states none, when scoring only
/// (upstream's DefaultMilliCPURequest and DefaultMemoryRequest).
const DEFAULT_MILLI_CPU: i64 = 100;
const DEFAULT_MEMORY: i64 = 200 * 1024 * 1024;

/// A host port a pod asks for: (protocol, hostIP, port).
pub type HostPort = (String, String, i32);

/// What the filters need of a pod, computed once when it enters the queue.
#[derive(Clone, Debug)]
pub struct PodFacts {
    pub cpu: i64,
    pub memory: i64,
    /// Extended resource requests (device plugins' resources), as integers.
    pub extended: BTreeMap<String, i64>,
    /// Requests with upstream's non-zero defaults, for scoring.
    pub score_cpu: i64,
    pub score_memory: i64,
    pub host_ports: Vec<HostPort>,
    pub tolerations: Vec<Toleration>,
    pub node_name: Option<String>,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// Pod (anti-)affinity terms, parsed once (InterPodAffinity reads bound pods' terms
    /// on every decision).
    pub affinity: PodAffinityTerms,
    pub pod: Pod,
}

impl PodFacts {
    pub fn of(pod: Pod) -> PodFacts {
        let (cpu, memory) = pod_requests(&pod);
        let spec = pod.spec.clone().unwrap_or_default();
        let (mut score_cpu, mut score_memory) = (0, 0);
        for c in &spec.containers {
            let (c_cpu, _, c_mem, _) = container_resources(c);
            let r = c.resources.as_ref().and_then(|r| r.requests.as_ref());
            let stated = |k: &str| r.and_then(|r| milli(r.get(k))).is_some();
            score_cpu += if c_cpu == 0 && !stated("cpu") {
                DEFAULT_MILLI_CPU
            } else {
                c_cpu
            };
            score_memory += if c_mem == 0 && !stated("memory") {
                DEFAULT_MEMORY
            } else {
                c_mem
            };
        }
        let host_ports = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let hp = p.host_port.filter(|h| *h > 0)?;
                Some((
                    p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    p.host_ip
                        .clone()
                        .filter(|i| !i.is_empty())
                        .unwrap_or_else(|| "0.0.0.0".into()),
                    hp,
                ))
            })
            .collect();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        PodFacts {
            affinity: PodAffinityTerms::of(&pod, &namespace, &labels),
            namespace,
            labels,
            extended: pod_extended_requests(&pod),
            cpu,
            memory,
            score_cpu: score_cpu.max(cpu),
            score_memory: score_memory.max(memory),
            host_ports,
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            node_name: spec.node_name.clone().filter(|n| !n.is_empty()),
            pod,
        }
    }
}

/// A node as the scheduler sees it: what it offers and what bound pods already take.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub alloc_cpu: i64,
    pub alloc_memory: i64,
    pub alloc_pods: i64,
    /// Allocatable extended resources (names with a domain outside kubernetes.io).
    pub alloc_extended: BTreeMap<String, i64>,
}

impl NodeView {
    /// A view of `node`; a node with missing or unparseable allocatable offers nothing, so
    /// it is never chosen (and says "Too many pods" / "Insufficient …").
    pub fn of(node: &Node) -> NodeView {
        let alloc = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.clone())
            .unwrap_or_default();
        let q = |k: &str| milli(alloc.get(k));
        let spec = node.spec.clone().unwrap_or_default();
        NodeView {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.taints.unwrap_or_default(),
            unschedulable: spec.unschedulable.unwrap_or(false),
            alloc_cpu: q("cpu").unwrap_or(0),
            alloc_memory: q("memory").map(|m| m / 1000).unwrap_or(0),
            alloc_pods: q("pods").map(|m| m / 1000).unwrap_or(0),
            alloc_extended: alloc
                .iter()
                .filter(|(k, _)| nodus_k8s::resources::is_extended_resource_name(k))
                .map(|(k, v)| (k.clone(), milli(Some(v)).map(|m| m / 1000).unwrap_or(0)))
                .collect(),
        }
    }
}

/// What bound pods take of a node.
#[derive(Clone, Debug, Default)]
pub struct Usage {
    pub cpu: i64,
    pub memory: i64,
    pub score_cpu: i64,
    pub score_memory: i64,
    pub pods: i64,
    pub host_ports: Vec<HostPort>,
    pub extended: BTreeMap<String, i64>,
}

impl Usage {
    pub fn add(&mut self, p: &PodFacts) {
        self.cpu += p.cpu;
        self.memory += p.memory;
        self.score_cpu += p.score_cpu;
        self.score_memory += p.score_memory;
        self.pods += 1;
        self.host_ports.extend(p.host_ports.iter().cloned());
        for (k, v) in &p.extended {
            *self.extended.entry(k.clone()).or_default() += v;
        }
    }
    pub fn remove(&mut self, p: &PodFacts) {
        self.cpu -= p.cpu;
        self.memory -= p.memory;
        self.score_cpu -= p.score_cpu;
        self.score_memory -= p.score_memory;
        self.pods -= 1;
        for (k, v) in &p.extended {
            *self.extended.entry(k.clone()).or_default() -= v;
        }
        for hp in &p.host_ports {
            if let Some(i) = self.host_ports.iter().position(|x| x == hp) {
                self.host_ports.swap_remove(i);
            }
        }
    }
}

/// Why a node was filtered out, worded as upstream's FailedScheduling message counts it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unfit {
    Unschedulable,
    NodeName,
    Taint(String),
    Affinity,
    Ports,
    Insufficient(&'static str),
    /// An extended resource the node lacks (upstream words it like cpu and memory).
    InsufficientExtended(String),
    TooManyPods,
    VolumeBoundToMissingPv,
    VolumeNodeAffinityConflict,
    VolumeZoneConflict,
    TopologySpread,
    TopologySpreadMissingLabel,
    PodAffinity,
    PodAntiAffinity,
    ExistingPodsAntiAffinity,
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfit::Unschedulable => write!(f, "node(s) were unschedulable"),
            Unfit::NodeName => write!(f, "node(s) didn't match the requested node name"),
            Unfit::Taint(t) => write!(f, "node(s) had untolerated taint {t}"),
            Unfit::Affinity => write!(f, "node(s) didn't match Pod's node affinity/selector"),
            Unfit::Ports => write!(
                f,
                "node(s) didn't have free ports for the requested pod ports"
            ),
            Unfit::Insufficient(r) => write!(f, "Insufficient {r}"),
            Unfit::InsufficientExtended(r) => write!(f, "Insufficient {r}"),
            Unfit::TooManyPods => write!(f, "Too many pods"),
            Unfit::VolumeBoundToMissingPv => write!(
                f,
                "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
            ),
            Unfit::VolumeNodeAffinityConflict => {
                write!(f, "node(s) had volume node affinity conflict")
            }
            Unfit::VolumeZoneConflict => write!(f, "node(s) had no available volume zone"),
            Unfit::TopologySpread => {
                write!(f, "node(s) didn't match pod topology spread constraints")
            }
            Unfit::TopologySpreadMissingLabel => write!(
                f,
                "node(s) didn't match pod topology spread constraints (missing required label)"
            ),
            Unfit::PodAffinity => write!(f, "node(s) didn't match pod affinity rules"),
            Unfit::PodAntiAffinity => write!(f, "node(s) didn't match pod anti-affinity rules"),
            Unfit::ExistingPodsAntiAffinity => write!(
                f,
                "node(s) didn't satisfy existing pods anti-affinity rules"
            ),
        }
    }
}

impl Unfit {
    /// Whether a pod bound somewhere may lift this refusal (a pod matching the affinity
    /// terms, or one raising the least-loaded domain).
    pub fn helped_by_pod_bound(&self) -> bool {
        matches!(self, Unfit::PodAffinity | Unfit::TopologySpread)
    }
}

fn ports_conflict(a: &HostPort, b: &HostPort) -> bool {
    a.0 == b.0 && a.2 == b.2 && (a.1 == b.1 || a.1 == "0.0.0.0" || b.1 == "0.0.0.0")
}

/// Runs the filters; the reasons of the first failing filter.
pub fn filter(pod: &PodFacts, node: &NodeView, used: &Usage) -> Result<(), Vec<Unfit>> {
    if node.unschedulable {
        let t = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            value: None,
            effect: "NoSchedule".into(),
            time_added: None,
        };
        if !pod
            .tolerations
            .iter()
            .any(|tol| scheduling::tolerates(tol, &t))
        {
            return Err(vec![Unfit::Unschedulable]);
        }
    }
    if pod.node_name.as_deref().is_some_and(|n| n != node.name) {
        return Err(vec![Unfit::NodeName]);
    }
    if let Some(t) =
        scheduling::untolerated_taint(&node.taints, &pod.tolerations, &["NoSchedule", "NoExecute"])
    {
        return Err(vec![Unfit::Taint(scheduling::taint_display(t))]);
    }
    if !scheduling::node_matches_pod(&pod.pod, &node.name, &node.labels) {
        return Err(vec![Unfit::Affinity]);
    }
    if pod.host_ports.iter().any(|want| {
        used.host_ports
            .iter()
            .any(|have| ports_conflict(want, have))
    }) {
        return Err(vec![Unfit::Ports]);
    }
    let mut out = Vec::new();
    if used.pods + 1 > node.alloc_pods {
        out.push(Unfit::TooManyPods);
    }
    if pod.cpu > 0 && used.cpu + pod.cpu > node.alloc_cpu {
        out.push(Unfit::Insufficient("cpu"));
    }
    if pod.memory > 0 && used.memory + pod.memory > node.alloc_memory {
        out.push(Unfit::Insufficient("memory"));
    }
    for (name, want) in &pod.extended {
        let have = node.alloc_extended.get(name).copied().unwrap_or(0);
        let used = used.extended.get(name).copied().unwrap_or(0);
        if *want > 0 && used + want > have {
            out.push(Unfit::InsufficientExtended(name.clone()));
        }
    }
    if out.is_empty() { Ok(()) } else { Err(out) }
}

/// LeastAllocated (0–100): the share of CPU and memory left free after placing the pod.
pub fn score(pod: &PodFacts, node: &NodeView, used: &Usage) -> i64 {
    let free = |cap: i64, req: i64| {
        if cap <= 0 || req > cap {
            0
        } else {
            (cap - req) * 100 / cap
        }
    };
    (free(node.alloc_cpu, used.score_cpu + pod.score_cpu)
        + free(node.alloc_memory, used.score_memory + pod.score_memory))
        / 2
}

/// TaintToleration's score before normalizing: the node's PreferNoSchedule taints the pod
/// does not tolerate (fewer is better).
pub fn intolerable_prefer_no_schedule(pod: &PodFacts, node: &NodeView) -> i64 {
    let tolerations: Vec<Toleration> = pod
        .tolerations
        .iter()
        .filter(|t| {
            matches!(
                t.effect.as_deref(),
                None | Some("") | Some("PreferNoSchedule")
            )
        })
        .cloned()
        .collect();
    node.taints
        .iter()
        .filter(|t| t.effect == "PreferNoSchedule")
        .filter(|t| !tolerations.iter().any(|tol| scheduling::tolerates(tol, t)))
        .count() as i64
}

/// NodeAffinity's score before normalizing: the weights of the pod's preferred node
/// affinity terms the node matches.
pub fn preferred_node_affinity(pod: &PodFacts, node: &NodeView) -> i64 {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .filter(|t| {
            t.weight != 0 && scheduling::term_matches(&t.preference, &node.name, &node.labels)
        })
        .map(|t| i64::from(t.weight))
        .sum()
}

/// Upstream's DefaultNormalizeScore: scaled to 0–100 by the highest score, reversed
/// (100 − x) when lower raw scores are better.
pub fn default_normalize(raw: Vec<i64>, reverse: bool) -> Vec<i64> {
    let max = raw.iter().copied().max().unwrap_or(0).max(0);
    raw.into_iter()
        .map(|s| {
            let s = if max == 0 { 0 } else { 100 * s / max };
            if reverse { 100 - s } else { s }
        })
        .collect()
}

/// Upstream's FitError text: `0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had
/// untolerated taint {k: v}.` (counts per reason, the phrases sorted).
pub fn fit_error(total: usize, reasons: &[Unfit]) -> String {
    histogram_error(total, reasons.iter().map(ToString::to_string))
}

/// Upstream's FitError over any per-node reasons: each reason with how many times it was
/// given, sorted as text.
pub(crate) fn histogram_error(total: usize, reasons: impl Iterator<Item = String>) -> String {
    if total == 0 {
        return "no nodes available to schedule pods".to_string();
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in reasons {
        *counts.entry(r).or_default() += 1;
    }
    let mut parts: Vec<String> = counts.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    format!("0/{total} nodes are available: {}.", parts.join(", "))
}

/// Upstream's FitError text when a PreFilter refused the pod outright:
/// `0/3 nodes are available: persistentvolumeclaim "data" not found.`
pub fn pre_filter_error(total: usize, msg: &str) -> String {
    if total == 0 {
        return "no nodes available to schedule pods".to_string();
    }
    format!("0/{total} nodes are available: {msg}.")
}

/// Distinct reasons, so a node failing on both cpu and memory counts once per resource.
pub fn dedup(reasons: Vec<Unfit>) -> Vec<Unfit> {
    let mut seen = HashSet::new();
    reasons
        .into_iter()
        .filter(|r| seen.insert(r.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> PodFacts {
        PodFacts::of(serde_json::from_value(v).unwrap())
    }
    fn node(v: serde_json::Value) -> NodeView {
        NodeView::of(&serde_json::from_value(v).unwrap())
    }

    #[test]
    fn filters_in_upstream_order_with_upstream_words() {
        let n = node(
            json!({"metadata": {"name": "n1", "labels": {"disk": "ssd"}},
            "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "2", "memory": "1Gi", "pods": "2"}}}),
        );
        let used = Usage::default();
        let p = pod(
            json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}]}}),
        );
        assert_eq!(
            filter(&p, &n, &used),
            Err(vec![Unfit::Taint("{dedicated: gpu}".into())])
        );
        let p = pod(
            json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "3", "memory": "2Gi"}}}],
            "tolerations": [{"key": "dedicated", "operator": "Exists"}]}}),
        );
        assert_eq!(
            filter(&p, &n, &used),
            Err(vec![
                Unfit::Insufficient("cpu"),
                Unfit::Insufficient("memory")
            ])
        );
        let p = pod(
            json!({"spec": {"containers": [{"name": "c"}], "nodeSelector": {"disk": "hdd"},
            "tolerations": [{"operator": "Exists"}]}}),
        );
        assert_eq!(filter(&p, &n, &used), Err(vec![Unfit::Affinity]));
    }

    #[test]
    fn extended_resources_are_counted() {
        let n = node(
            json!({"metadata": {"name": "n"}, "status": {"allocatable": {
            "cpu": "2", "memory": "1Gi", "pods": "10", "devices.nodus.dev/fuse": "1"}}}),
        );
        let p = pod(json!({"spec": {"containers": [{"name": "c", "resources": {
            "limits": {"devices.nodus.dev/fuse": "1"}}}]}}));
        let mut used = Usage::default();
        assert!(filter(&p, &n, &used).is_ok());
        used.add(&p);
        let err = filter(&p, &n, &used).unwrap_err();
        assert_eq!(err[0].to_string(), "Insufficient devices.nodus.dev/fuse");
        used.remove(&p);
        assert!(filter(&p, &n, &used).is_ok());
        let none = node(
            json!({"metadata": {"name": "n"}, "status": {"allocatable": {
            "cpu": "2", "memory": "1Gi", "pods": "10"}}}),
        );
        assert!(filter(&p, &none, &Usage::default()).is_err());
    }

    #[test]
    fn garbage_status_offers_nothing() {
        let n =
            node(json!({"metadata": {"name": "bad"}, "status": {"allocatable": {"cpu": "lots"}}}));
        let p = pod(json!({"spec": {"containers": [{"name": "c"}]}}));
        assert_eq!(
            filter(&p, &n, &Usage::default()),
            Err(vec![Unfit::TooManyPods])
        );
    }

    #[test]
    fn host_ports_conflict_on_wildcard() {
        let n = node(
            json!({"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "2", "memory": "1Gi", "pods": "10"}}}),
        );
        let p = pod(
            json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}}),
        );
        let mut used = Usage::default();
        assert!(filter(&p, &n, &used).is_ok());
        used.add(&p);
        assert_eq!(filter(&p, &n, &used), Err(vec![Unfit::Ports]));
        used.remove(&p);
        assert!(filter(&p, &n, &used).is_ok());
    }

    #[test]
    fn taint_and_node_affinity_scores_normalize_as_upstream() {
        let tainted = |name: &str, taints: serde_json::Value| {
            node(
                json!({"metadata": {"name": name, "labels": {"disk": name}}, "spec": {"taints": taints}}),
            )
        };
        let nodes = [
            tainted("clean", json!([])),
            tainted("one", json!([{"key": "a", "effect": "PreferNoSchedule"}])),
            tainted(
                "two",
                json!([{"key": "a", "effect": "PreferNoSchedule"},
                {"key": "b", "effect": "PreferNoSchedule"}, {"key": "c", "effect": "NoSchedule"}]),
            ),
        ];
        let p = pod(json!({"spec": {"containers": [{"name": "c"}]}}));
        let raw: Vec<i64> = nodes
            .iter()
            .map(|n| intolerable_prefer_no_schedule(&p, n))
            .collect();
        assert_eq!(raw, [0, 1, 2]);
        assert_eq!(default_normalize(raw, true), [100, 50, 0]);
        // Tolerating "a" (a NoSchedule toleration does not count for PreferNoSchedule).
        let p = pod(
            json!({"spec": {"containers": [{"name": "c"}], "tolerations": [
            {"key": "a", "operator": "Exists", "effect": "PreferNoSchedule"},
            {"key": "b", "operator": "Exists", "effect": "NoSchedule"}]}}),
        );
        let raw: Vec<i64> = nodes
            .iter()
            .map(|n| intolerable_prefer_no_schedule(&p, n))
            .collect();
        assert_eq!(raw, [0, 0, 1]);
        assert_eq!(default_normalize(vec![0, 0, 0], true), [100, 100, 100]);

        let p = pod(
            json!({"spec": {"containers": [{"name": "c"}], "affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 30, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["one", "two"]}]}},
                {"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["two"]}]}}]}}}}),
        );
        let raw: Vec<i64> = nodes
            .iter()
            .map(|n| preferred_node_affinity(&p, n))
            .collect();
        assert_eq!(raw, [0, 30, 40]);
        assert_eq!(default_normalize(raw, false), [0, 75, 100]);
    }

    #[test]
    fn fit_error_counts_and_sorts() {
        let msg = fit_error(
            3,
            &[
                Unfit::Insufficient("cpu"),
                Unfit::Taint("{a: }".into()),
                Unfit::Taint("{a: }".into()),
            ],
        );
        assert_eq!(
            msg,
            "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint {a: }."
        );
        assert_eq!(fit_error(0, &[]), "no nodes available to schedule pods");
    }
}
