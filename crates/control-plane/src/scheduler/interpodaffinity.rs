//! InterPodAffinity, as upstream's kube-scheduler plugin: required pod affinity and
//! anti-affinity as a filter (with the required anti-affinity of pods already bound, so a
//! pod never lands where an existing pod refuses it), and preferred terms as a score (the
//! incoming pod's preferred terms, and the existing pods' required affinity with
//! hardPodAffinityWeight 1 and their preferred terms).
//!
//! Each cycle first counts, per topology domain (topologyKey, value), the bound pods that
//! match the terms (upstream's PreFilter/PreScore state); the per-node checks then only look
//! those counts up, so a decision is linear in the bound pods, not quadratic.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm};
use nodus_k8s::selector::{self, LabelSelector, Operator, Requirement};

use super::Snapshot;
use super::fit::{NodeView, PodFacts, Unfit};

/// Upstream's default `hardPodAffinityWeight`: how much an existing pod's required affinity
/// to the incoming pod counts in the score.
const HARD_POD_AFFINITY_WEIGHT: i64 = 1;

/// One pod (anti-)affinity term with its selectors parsed.
#[derive(Clone, Debug)]
pub struct AffinityTerm {
    namespaces: Vec<String>,
    namespace_selector: Option<LabelSelector>,
    /// `None` when the selector is absent or does not parse: the term matches no pod.
    selector: Option<LabelSelector>,
    topology_key: String,
    /// The preference weight (1 for required terms).
    weight: i64,
}

impl AffinityTerm {
    fn of(
        t: &PodAffinityTerm,
        weight: i32,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Self {
        let namespace_selector = t
            .namespace_selector
            .as_ref()
            .and_then(|s| selector::from_metav1(s).ok());
        let mut namespaces = t.namespaces.clone().unwrap_or_default();
        if namespaces.is_empty() && t.namespace_selector.is_none() {
            // Neither given: the term is about the pod's own namespace.
            namespaces.push(namespace.to_string());
        }
        AffinityTerm {
            namespaces,
            namespace_selector,
            selector: term_selector(t, labels),
            topology_key: t.topology_key.clone(),
            weight: i64::from(weight),
        }
    }

    /// Whether `pod` is one of the pods this term is about (namespace and labels).
    fn matches(&self, pod: &PodFacts, snap: &Snapshot<'_>) -> bool {
        self.selector
            .as_ref()
            .is_some_and(|s| s.matches(&pod.labels))
            && (self.namespaces.contains(&pod.namespace)
                || self
                    .namespace_selector
                    .as_ref()
                    .is_some_and(|s| s.matches(&snap.namespace_labels(&pod.namespace))))
    }
}

/// The label selector with `matchLabelKeys` (`key in (value)`) and `mismatchLabelKeys`
/// (`key notin (value)`) merged in from the pod's own labels, keys the pod lacks ignored.
fn term_selector(t: &PodAffinityTerm, labels: &BTreeMap<String, String>) -> Option<LabelSelector> {
    let base = selector::from_metav1(t.label_selector.as_ref()?).ok()?;
    let mut reqs = base.requirements().to_vec();
    let keys = [
        (t.match_label_keys.as_deref(), Operator::In),
        (t.mismatch_label_keys.as_deref(), Operator::NotIn),
    ];
    for (keys, op) in keys {
        for k in keys.unwrap_or(&[]) {
            if let Some(v) = labels.get(k) {
                reqs.push(Requirement::new(k, op, vec![v.clone()]).ok()?);
            }
        }
    }
    Some(LabelSelector::from_requirements(reqs))
}

/// A pod's pod-affinity and pod-anti-affinity terms, parsed once when the pod is seen.
#[derive(Clone, Debug, Default)]
pub struct PodAffinityTerms {
    required_affinity: Vec<AffinityTerm>,
    required_anti_affinity: Vec<AffinityTerm>,
    preferred_affinity: Vec<AffinityTerm>,
    preferred_anti_affinity: Vec<AffinityTerm>,
}

impl PodAffinityTerms {
    pub fn of(pod: &Pod, namespace: &str, labels: &BTreeMap<String, String>) -> Self {
        let Some(aff) = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
            return Self::default();
        };
        let required = |terms: Option<&Vec<PodAffinityTerm>>| -> Vec<AffinityTerm> {
            terms
                .into_iter()
                .flatten()
                .map(|t| AffinityTerm::of(t, 1, namespace, labels))
                .collect()
        };
        let aa = aff.pod_affinity.as_ref();
        let anti = aff.pod_anti_affinity.as_ref();
        let preferred =
            |terms: Option<&Vec<k8s_openapi::api::core::v1::WeightedPodAffinityTerm>>| {
                terms
                    .into_iter()
                    .flatten()
                    .map(|w| AffinityTerm::of(&w.pod_affinity_term, w.weight, namespace, labels))
                    .collect()
            };
        PodAffinityTerms {
            required_affinity: required(aa.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            required_anti_affinity: required(anti.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_affinity: preferred(aa.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_anti_affinity: preferred(anti.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.required_affinity.is_empty()
            && self.required_anti_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty()
    }
}

/// Matching pods per topology domain: topologyKey → value → count.
type DomainCounts = HashMap<String, HashMap<String, i64>>;

fn bump(m: &mut DomainCounts, node: &NodeView, key: &str, by: i64) {
    if let Some(v) = node.labels.get(key) {
        *m.entry(key.to_string())
            .or_default()
            .entry(v.clone())
            .or_default() += by;
    }
}

fn count_at(m: &DomainCounts, key: &str, value: &str) -> i64 {
    m.get(key).and_then(|v| v.get(value)).copied().unwrap_or(0)
}

/// Whether `pod` matches every one of `terms` (and there is at least one).
fn matches_all(terms: &[AffinityTerm], pod: &PodFacts, snap: &Snapshot<'_>) -> bool {
    !terms.is_empty() && terms.iter().all(|t| t.matches(pod, snap))
}

/// The per-cycle counts the filter looks up (upstream's preFilterState).
pub struct FilterState<'p> {
    pod: &'p PodFacts,
    /// Domains holding a bound pod whose required anti-affinity matches the incoming pod.
    existing_anti_affinity: DomainCounts,
    /// Domains holding a bound pod that matches all the incoming pod's required affinity terms.
    affinity: DomainCounts,
    /// Domains holding a bound pod that matches one of its required anti-affinity terms.
    anti_affinity: DomainCounts,
    /// Whether the incoming pod matches all its own required affinity terms.
    self_affinity: bool,
}

/// The filter's counts for `pod`, or `None` when nothing can refuse it (upstream's Skip).
pub fn pre_filter<'p>(pod: &'p PodFacts, snap: &Snapshot<'_>) -> Option<FilterState<'p>> {
    let terms = &pod.affinity;
    let incoming = !terms.required_affinity.is_empty() || !terms.required_anti_affinity.is_empty();
    if !incoming && !snap.has_pods_with_affinity() {
        return None;
    }
    let mut st = FilterState {
        pod,
        existing_anti_affinity: DomainCounts::new(),
        affinity: DomainCounts::new(),
        anti_affinity: DomainCounts::new(),
        self_affinity: matches_all(&terms.required_affinity, pod, snap),
    };
    for (node, existing) in snap.pods_with_affinity() {
        for t in &existing.affinity.required_anti_affinity {
            if t.matches(pod, snap) {
                bump(&mut st.existing_anti_affinity, node, &t.topology_key, 1);
            }
        }
    }
    if incoming {
        for (node, existing) in snap.pods() {
            if matches_all(&terms.required_affinity, existing, snap) {
                for t in &terms.required_affinity {
                    bump(&mut st.affinity, node, &t.topology_key, 1);
                }
            }
            for t in &terms.required_anti_affinity {
                if t.matches(existing, snap) {
                    bump(&mut st.anti_affinity, node, &t.topology_key, 1);
                }
            }
        }
    }
    Some(st)
}

impl FilterState<'_> {
    /// Upstream's order: the pod's affinity, its anti-affinity, then existing pods' anti-affinity.
    pub fn filter(&self, node: &NodeView) -> Result<(), Unfit> {
        if !self.satisfies_affinity(node) {
            return Err(Unfit::PodAffinity);
        }
        let refused = self.pod.affinity.required_anti_affinity.iter().any(|t| {
            node.labels
                .get(&t.topology_key)
                .is_some_and(|v| count_at(&self.anti_affinity, &t.topology_key, v) > 0)
        });
        if refused {
            return Err(Unfit::PodAntiAffinity);
        }
        if node
            .labels
            .iter()
            .any(|(k, v)| count_at(&self.existing_anti_affinity, k, v) > 0)
        {
            return Err(Unfit::ExistingPodsAntiAffinity);
        }
        Ok(())
    }

    fn satisfies_affinity(&self, node: &NodeView) -> bool {
        let mut pods_exist = true;
        for t in &self.pod.affinity.required_affinity {
            // Every term's topology label must be on the node.
            let Some(v) = node.labels.get(&t.topology_key) else {
                return false;
            };
            if count_at(&self.affinity, &t.topology_key, v) <= 0 {
                pods_exist = false;
            }
        }
        // The first of a set of pods with affinity to each other may go anywhere, as long
        // as no pod matching its terms exists anywhere yet.
        pods_exist || (self.affinity.is_empty() && self.self_affinity)
    }
}

/// The preferred-affinity score of each of `nodes` (0–100, min-max normalized as upstream),
/// or `None` when no term concerns this pod.
pub fn score(pod: &PodFacts, snap: &Snapshot<'_>, nodes: &[&NodeView]) -> Option<Vec<i64>> {
    let terms = &pod.affinity;
    let preferred =
        !terms.preferred_affinity.is_empty() || !terms.preferred_anti_affinity.is_empty();
    if !preferred && !snap.has_pods_with_affinity() {
        return None;
    }
    let mut topo = DomainCounts::new();
    let mut process = |node: &NodeView, existing: &PodFacts| {
        if node.labels.is_empty() {
            return;
        }
        // The incoming pod's preferences about the existing pod…
        for (list, sign) in [
            (&terms.preferred_affinity, 1),
            (&terms.preferred_anti_affinity, -1),
        ] {
            for t in list {
                if t.matches(existing, snap) {
                    bump(&mut topo, node, &t.topology_key, t.weight * sign);
                }
            }
        }
        // …and the existing pod's about the incoming one.
        let theirs = &existing.affinity;
        for t in &theirs.required_affinity {
            if t.matches(pod, snap) {
                bump(&mut topo, node, &t.topology_key, HARD_POD_AFFINITY_WEIGHT);
            }
        }
        for (list, sign) in [
            (&theirs.preferred_affinity, 1),
            (&theirs.preferred_anti_affinity, -1),
        ] {
            for t in list {
                if t.matches(pod, snap) {
                    bump(&mut topo, node, &t.topology_key, t.weight * sign);
                }
            }
        }
    };
    if preferred {
        snap.pods().for_each(|(n, p)| process(n, p));
    } else {
        snap.pods_with_affinity().for_each(|(n, p)| process(n, p));
    }
    if topo.is_empty() {
        return None;
    }
    let raw: Vec<i64> = nodes
        .iter()
        .map(|n| n.labels.iter().map(|(k, v)| count_at(&topo, k, v)).sum())
        .collect();
    Some(normalize(&raw))
}

/// Min-max to 0–100, truncating as upstream's float arithmetic does.
fn normalize(raw: &[i64]) -> Vec<i64> {
    let min = raw.iter().copied().min().unwrap_or(0);
    let max = raw.iter().copied().max().unwrap_or(0);
    let diff = max - min;
    raw.iter()
        .map(|s| {
            if diff > 0 {
                (100.0 * ((s - min) as f64 / diff as f64)) as i64
            } else {
                0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Fixture, node, pod};
    use super::*;
    use serde_json::{Value, json};

    const HOST: &str = "kubernetes.io/hostname";
    const ZONE: &str = "topology.kubernetes.io/zone";

    fn labeled(app: &str) -> Value {
        json!({"metadata": {"labels": {"app": app}}})
    }

    fn with_affinity(app: &str, affinity: Value) -> Value {
        json!({"metadata": {"labels": {"app": app}}, "spec": {"affinity": affinity}})
    }

    fn term(app: &str, key: &str) -> Value {
        json!({"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key})
    }

    fn zones() -> Vec<Value> {
        vec![
            node("a1", json!({ZONE: "a"})),
            node("a2", json!({ZONE: "a"})),
            node("b1", json!({ZONE: "b"})),
            node("bare", json!({})),
        ]
    }

    /// The filter's verdict on each node, in name order.
    fn verdicts(f: &Fixture, incoming: &PodFacts) -> Vec<(String, Result<(), Unfit>)> {
        let snap = f.snapshot();
        let st = pre_filter(incoming, &snap);
        f.views()
            .into_iter()
            .map(|n| {
                let v = st.as_ref().map_or(Ok(()), |s| s.filter(n));
                (n.name.clone(), v)
            })
            .collect()
    }

    fn refused(f: &Fixture, incoming: &PodFacts) -> Vec<(String, Unfit)> {
        verdicts(f, incoming)
            .into_iter()
            .filter_map(|(n, v)| v.err().map(|e| (n, e)))
            .collect()
    }

    #[test]
    fn required_anti_affinity_keeps_matching_pods_apart_per_domain() {
        let f = Fixture::new(&zones(), vec![("a1", labeled("web"))]);
        let anti = |key: &str| {
            pod(with_affinity(
                "web",
                json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("web", key)]}}),
            ))
        };
        assert_eq!(
            refused(&f, &anti(HOST)),
            vec![("a1".into(), Unfit::PodAntiAffinity)]
        );
        // By zone, the other node of zone a is refused too; a node without the key is not.
        assert_eq!(
            refused(&f, &anti(ZONE)),
            vec![
                ("a1".into(), Unfit::PodAntiAffinity),
                ("a2".into(), Unfit::PodAntiAffinity)
            ]
        );
        // A pod in another namespace is not what the term is about.
        let mut other = with_affinity(
            "web",
            json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("web", HOST)]}}),
        );
        other["metadata"]["namespace"] = json!("other");
        assert_eq!(refused(&f, &pod(other)), vec![]);
    }

    #[test]
    fn existing_pods_anti_affinity_refuses_the_incoming_pod_symmetrically() {
        let existing = with_affinity(
            "web",
            json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("db", ZONE)]}}),
        );
        let f = Fixture::new(&zones(), vec![("a1", existing)]);
        // The incoming pod has no terms of its own, yet may not join zone a.
        assert_eq!(
            refused(&f, &pod(labeled("db"))),
            vec![
                ("a1".into(), Unfit::ExistingPodsAntiAffinity),
                ("a2".into(), Unfit::ExistingPodsAntiAffinity)
            ]
        );
        assert_eq!(refused(&f, &pod(labeled("web"))), vec![]);
    }

    #[test]
    fn required_affinity_co_locates_and_the_first_pod_may_start_a_domain() {
        let aff = |app: &str, target: &str| {
            pod(with_affinity(
                app,
                json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term(target, ZONE)]}}),
            ))
        };
        let f = Fixture::new(&zones(), vec![("a2", labeled("cache"))]);
        assert_eq!(
            refused(&f, &aff("web", "cache")),
            vec![
                ("b1".into(), Unfit::PodAffinity),
                ("bare".into(), Unfit::PodAffinity)
            ]
        );
        // Nothing matches anywhere: a pod matching its own term may go to any node that
        // has the topology key; one that does not match it may go nowhere.
        let empty = Fixture::new(&zones(), vec![]);
        assert_eq!(
            refused(&empty, &aff("cache", "cache")),
            vec![("bare".into(), Unfit::PodAffinity)]
        );
        assert_eq!(refused(&empty, &aff("web", "cache")).len(), 4);
        // Terms ANDed: the same pod must match all of them.
        let both = pod(with_affinity(
            "web",
            json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                term("cache", ZONE),
                {"labelSelector": {"matchLabels": {"tier": "hot"}}, "topologyKey": ZONE}]}}),
        ));
        assert_eq!(refused(&f, &both).len(), 4);
    }

    #[test]
    fn namespace_selector_and_match_label_keys() {
        let mut theirs = labeled("web");
        theirs["metadata"]["namespace"] = json!("team-x");
        let f = Fixture::new(&zones(), vec![("a1", theirs)]);
        f.put(
            "/core/namespaces/team-x",
            json!({"metadata": {"name": "team-x", "labels": {"team": "x"}}}),
        );
        let anti = |extra: Value| {
            let mut t = term("web", HOST);
            for (k, v) in extra.as_object().unwrap() {
                t[k] = v.clone();
            }
            pod(with_affinity(
                "web",
                json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [t]}}),
            ))
        };
        assert_eq!(refused(&f, &anti(json!({}))), vec![]);
        assert_eq!(
            refused(
                &f,
                &anti(json!({"namespaceSelector": {"matchLabels": {"team": "x"}}}))
            ),
            vec![("a1".into(), Unfit::PodAntiAffinity)]
        );
        assert_eq!(
            refused(&f, &anti(json!({"namespaceSelector": {}}))),
            vec![("a1".into(), Unfit::PodAntiAffinity)]
        );
        assert_eq!(
            refused(&f, &anti(json!({"namespaces": ["team-x"]}))),
            vec![("a1".into(), Unfit::PodAntiAffinity)]
        );

        // matchLabelKeys: only pods of the same revision keep apart.
        let rev = |r: &str, key: &str| {
            json!({"metadata": {"labels": {"app": "web", "rev": r}}, "spec": {"affinity": {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "web"}},
                    "topologyKey": HOST, key: ["rev"]}]}}}})
        };
        let f = Fixture::new(
            &zones(),
            vec![(
                "a1",
                json!({"metadata": {"labels": {"app": "web", "rev": "1"}}}),
            )],
        );
        assert_eq!(refused(&f, &pod(rev("2", "matchLabelKeys"))), vec![]);
        assert_eq!(
            refused(&f, &pod(rev("1", "matchLabelKeys"))),
            vec![("a1".into(), Unfit::PodAntiAffinity)]
        );
        assert_eq!(
            refused(&f, &pod(rev("2", "mismatchLabelKeys"))),
            vec![("a1".into(), Unfit::PodAntiAffinity)]
        );
    }

    fn scores(f: &Fixture, incoming: &PodFacts) -> Option<Vec<i64>> {
        score(incoming, &f.snapshot(), &f.views())
    }

    #[test]
    fn preferred_terms_score_min_max_normalized() {
        let pref = |kind: &str, w: i32| {
            pod(with_affinity(
                "web",
                json!({kind: {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": w, "podAffinityTerm": term("cache", ZONE)}]}}),
            ))
        };
        let f = Fixture::new(
            &zones(),
            vec![
                ("a1", labeled("cache")),
                ("b1", labeled("cache")),
                ("a2", labeled("cache")),
            ],
        );
        // a: 2 pods × 10, b: 1 × 10, bare: 0 → (x - 0) / 20.
        assert_eq!(
            scores(&f, &pref("podAffinity", 10)),
            Some(vec![100, 100, 50, 0])
        );
        assert_eq!(
            scores(&f, &pref("podAntiAffinity", 10)),
            Some(vec![0, 0, 50, 100])
        );
        // Nothing concerns a pod without terms when no pod has any.
        assert_eq!(scores(&f, &pod(labeled("web"))), None);
    }

    #[test]
    fn existing_pods_terms_count_toward_the_incoming_pod() {
        let required = with_affinity(
            "cache",
            json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("web", HOST)]}}),
        );
        let preferred_anti = with_affinity(
            "batch",
            json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 3, "podAffinityTerm": term("web", HOST)}]}}),
        );
        let f = Fixture::new(&zones(), vec![("a1", required), ("b1", preferred_anti)]);
        // a1: +1 (hardPodAffinityWeight), b1: -3, others 0 → min -3, max 1.
        assert_eq!(scores(&f, &pod(labeled("web"))), Some(vec![100, 75, 0, 75]));
    }
}
