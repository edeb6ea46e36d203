//! PodTopologySpread, as upstream's kube-scheduler plugin: `topologySpreadConstraints`
//! with `whenUnsatisfiable: DoNotSchedule` as a filter (skew of the domain after placing
//! the pod at most maxSkew, with minDomains, nodeAffinityPolicy and nodeTaintsPolicy) and
//! `ScheduleAnyway` as a score; a pod with no constraints of its own gets upstream's system
//! default constraints (spread by hostname and zone, ScheduleAnyway) over the selector of
//! the Services, ReplicationController, ReplicaSet or StatefulSet it belongs to.
//!
//! Matching pods are counted once per cycle per node and summed per domain (upstream's
//! PreFilter/PreScore state), so a decision is linear in the bound pods.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use nodus_k8s::scheduling;
use nodus_k8s::selector::{self, LabelSelector, Requirement};
use serde_json::Value;

use super::Snapshot;
use super::fit::{NodeView, PodFacts, Unfit};

const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
const LABEL_ZONE: &str = "topology.kubernetes.io/zone";

/// Upstream's `whenUnsatisfiable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    DoNotSchedule,
    ScheduleAnyway,
}

impl Action {
    fn of(s: &str) -> Option<Action> {
        match s {
            "DoNotSchedule" => Some(Action::DoNotSchedule),
            "ScheduleAnyway" => Some(Action::ScheduleAnyway),
            _ => None,
        }
    }
}

/// One constraint with its selector parsed and upstream's defaults applied.
#[derive(Clone, Debug)]
struct Constraint {
    max_skew: i64,
    topology_key: String,
    /// `None` matches no pod (an absent or unparseable labelSelector).
    selector: Option<LabelSelector>,
    min_domains: i64,
    honor_node_affinity: bool,
    honor_node_taints: bool,
}

impl Constraint {
    fn of(c: &TopologySpreadConstraint, labels: &BTreeMap<String, String>) -> Constraint {
        let base = c
            .label_selector
            .as_ref()
            .and_then(|s| selector::from_metav1(s).ok());
        let keyed: Vec<Requirement> = c
            .match_label_keys
            .iter()
            .flatten()
            .filter_map(|k| {
                let v = labels.get(k)?;
                Requirement::new(k, selector::Operator::Equals, vec![v.clone()]).ok()
            })
            .collect();
        // As upstream's mergeLabelSetWithSelector: the pod's values for matchLabelKeys,
        // plus whatever the selector requires (nothing from a selector that matches nothing).
        let selector = if keyed.is_empty() {
            base
        } else {
            let mut reqs = keyed;
            reqs.extend(base.iter().flat_map(|b| b.requirements().iter().cloned()));
            Some(LabelSelector::from_requirements(reqs))
        };
        Constraint {
            max_skew: i64::from(c.max_skew),
            topology_key: c.topology_key.clone(),
            selector,
            min_domains: c.min_domains.map_or(1, i64::from),
            honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_node_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        }
    }

    fn system_default(key: &str, max_skew: i64, selector: &LabelSelector) -> Constraint {
        Constraint {
            max_skew,
            topology_key: key.to_string(),
            selector: Some(selector.clone()),
            min_domains: 1,
            honor_node_affinity: true,
            honor_node_taints: false,
        }
    }

    /// Whether pods on `node` count at all for this constraint (nodeAffinityPolicy,
    /// nodeTaintsPolicy).
    fn includes(&self, pod: &PodFacts, node: &NodeView) -> bool {
        if self.honor_node_affinity
            && !scheduling::node_matches_pod(&pod.pod, &node.name, &node.labels)
        {
            return false;
        }
        !(self.honor_node_taints
            && scheduling::untolerated_taint(
                &node.taints,
                &pod.tolerations,
                &["NoSchedule", "NoExecute"],
            )
            .is_some())
    }

    fn counts(&self, pod: &PodFacts, other: &PodFacts) -> bool {
        other.namespace == pod.namespace
            && other.pod.metadata.deletion_timestamp.is_none()
            && self
                .selector
                .as_ref()
                .is_some_and(|s| s.matches(&other.labels))
    }
}

fn own_constraints(pod: &PodFacts) -> &[TopologySpreadConstraint] {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.topology_spread_constraints.as_deref())
        .unwrap_or(&[])
}

fn constraints(pod: &PodFacts, action: Action, snap: &Snapshot<'_>) -> Vec<Constraint> {
    let own = own_constraints(pod);
    if !own.is_empty() {
        return own
            .iter()
            .filter(|c| Action::of(&c.when_unsatisfiable) == Some(action))
            .map(|c| Constraint::of(c, &pod.labels))
            .collect();
    }
    // The system defaults are all ScheduleAnyway.
    if action != Action::ScheduleAnyway {
        return Vec::new();
    }
    match default_selector(pod, snap) {
        Some(sel) => vec![
            Constraint::system_default(LABEL_HOSTNAME, 3, &sel),
            Constraint::system_default(LABEL_ZONE, 5, &sel),
        ],
        None => Vec::new(),
    }
}

/// Upstream's DefaultSelector: the selectors of the Services in the pod's namespace that
/// select it, plus its controller's (ReplicationController, ReplicaSet or StatefulSet).
/// `None` when that is empty (the pod belongs to nothing to spread).
fn default_selector(pod: &PodFacts, snap: &Snapshot<'_>) -> Option<LabelSelector> {
    let ns = &pod.namespace;
    let as_map = |v: &Value| -> Option<BTreeMap<String, String>> {
        v.as_object().map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
    };
    let mut set = BTreeMap::new();
    for svc in snap.list(&format!("/core/services/{ns}/")) {
        if let Some(sel) = svc.pointer("/spec/selector").and_then(as_map)
            && LabelSelector::from_map(&sel).matches(&pod.labels)
        {
            set.extend(sel);
        }
    }
    let mut reqs = LabelSelector::from_map(&set).requirements().to_vec();
    let owner = pod
        .pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    if let Some(o) = owner {
        let name = &o.name;
        match (o.api_version.as_str(), o.kind.as_str()) {
            ("v1", "ReplicationController") => {
                if let Some(sel) = snap
                    .get(&format!("/core/replicationcontrollers/{ns}/{name}"))
                    .and_then(|rc| rc.pointer("/spec/selector").and_then(as_map))
                {
                    set.extend(sel);
                    reqs = LabelSelector::from_map(&set).requirements().to_vec();
                }
            }
            ("apps/v1", kind @ ("ReplicaSet" | "StatefulSet")) => {
                let plural = if kind == "ReplicaSet" {
                    "replicasets"
                } else {
                    "statefulsets"
                };
                let sel = snap
                    .get(&format!("/apps/{plural}/{ns}/{name}"))
                    .and_then(|o| o.pointer("/spec/selector").cloned())
                    .and_then(|s| serde_json::from_value(s).ok())
                    .and_then(|s| selector::from_metav1(&s).ok());
                if let Some(sel) = sel {
                    reqs.extend(sel.requirements().iter().cloned());
                }
            }
            _ => {}
        }
    }
    (!reqs.is_empty()).then(|| LabelSelector::from_requirements(reqs))
}

fn has_all_keys(node: &NodeView, cs: &[Constraint]) -> bool {
    cs.iter().all(|c| node.labels.contains_key(&c.topology_key))
}

/// Per constraint, the matching bound pods on each node.
fn counts_by_node<'n>(
    pod: &PodFacts,
    snap: &Snapshot<'n>,
    cs: &[Constraint],
) -> Vec<HashMap<&'n str, i64>> {
    let mut out = vec![HashMap::new(); cs.len()];
    for (node, other) in snap.pods() {
        for (i, c) in cs.iter().enumerate() {
            if c.counts(pod, other) {
                *out[i].entry(node.name.as_str()).or_default() += 1;
            }
        }
    }
    out
}

/// The per-cycle state the DoNotSchedule filter looks up.
pub struct FilterState {
    constraints: Vec<Constraint>,
    /// Per constraint: domain value → matching pods.
    domains: Vec<HashMap<String, i64>>,
    self_match: Vec<bool>,
}

/// The filter's state for `pod`, or `None` when it has no DoNotSchedule constraint.
pub fn pre_filter(pod: &PodFacts, snap: &Snapshot<'_>) -> Option<FilterState> {
    let cs = constraints(pod, Action::DoNotSchedule, snap);
    if cs.is_empty() {
        return None;
    }
    let per_node = counts_by_node(pod, snap, &cs);
    let mut domains = vec![HashMap::new(); cs.len()];
    for node in snap.nodes() {
        if !has_all_keys(node, &cs) {
            continue;
        }
        for (i, c) in cs.iter().enumerate() {
            if !c.includes(pod, node) {
                continue;
            }
            let here = per_node[i].get(node.name.as_str()).copied().unwrap_or(0);
            *domains[i]
                .entry(node.labels[&c.topology_key].clone())
                .or_default() += here;
        }
    }
    let self_match = cs
        .iter()
        .map(|c| c.selector.as_ref().is_some_and(|s| s.matches(&pod.labels)))
        .collect();
    Some(FilterState {
        constraints: cs,
        domains,
        self_match,
    })
}

impl FilterState {
    pub fn filter(&self, node: &NodeView) -> Result<(), Unfit> {
        for (i, c) in self.constraints.iter().enumerate() {
            let Some(value) = node.labels.get(&c.topology_key) else {
                return Err(Unfit::TopologySpreadMissingLabel);
            };
            let domains = &self.domains[i];
            // Too few eligible domains: the global minimum counts as 0.
            let min = if (domains.len() as i64) < c.min_domains {
                0
            } else {
                domains
                    .values()
                    .copied()
                    .min()
                    .unwrap_or(i64::from(i32::MAX))
            };
            let here = domains.get(value).copied().unwrap_or(0);
            if here + i64::from(self.self_match[i]) - min > c.max_skew {
                return Err(Unfit::TopologySpread);
            }
        }
        Ok(())
    }
}

/// The ScheduleAnyway score of each of `nodes` (0–100, fewer matching pods scoring higher,
/// as upstream's NormalizeScore), or `None` when there is nothing to spread.
pub fn score(pod: &PodFacts, snap: &Snapshot<'_>, nodes: &[&NodeView]) -> Option<Vec<i64>> {
    let cs = constraints(pod, Action::ScheduleAnyway, snap);
    if cs.is_empty() {
        return None;
    }
    // Nodes lacking a key of the pod's own constraints are not scored; the system
    // defaults tolerate missing keys.
    let require_all = !own_constraints(pod).is_empty();
    let ignored: Vec<bool> = nodes
        .iter()
        .map(|n| require_all && !has_all_keys(n, &cs))
        .collect();
    let mut domains: Vec<HashMap<String, i64>> = vec![HashMap::new(); cs.len()];
    for (n, _) in nodes.iter().zip(&ignored).filter(|(_, ig)| !**ig) {
        for (i, c) in cs.iter().enumerate() {
            if c.topology_key != LABEL_HOSTNAME {
                let v = n.labels.get(&c.topology_key).cloned().unwrap_or_default();
                domains[i].entry(v).or_default();
            }
        }
    }
    let scored = ignored.iter().filter(|i| !**i).count();
    let weights: Vec<f64> = cs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let size = if c.topology_key == LABEL_HOSTNAME {
                scored
            } else {
                domains[i].len()
            };
            ((size + 2) as f64).ln()
        })
        .collect();
    let per_node = counts_by_node(pod, snap, &cs);
    for node in snap.nodes() {
        if require_all && !has_all_keys(node, &cs) {
            continue;
        }
        for (i, c) in cs.iter().enumerate() {
            if !c.includes(pod, node) {
                continue;
            }
            let v = node.labels.get(&c.topology_key).map_or("", String::as_str);
            if let Some(d) = domains[i].get_mut(v) {
                *d += per_node[i].get(node.name.as_str()).copied().unwrap_or(0);
            }
        }
    }
    let raw: Vec<Option<i64>> = nodes
        .iter()
        .zip(&ignored)
        .map(|(n, ig)| {
            if *ig {
                return None;
            }
            let mut s = 0.0;
            for (i, c) in cs.iter().enumerate() {
                let Some(v) = n.labels.get(&c.topology_key) else {
                    continue;
                };
                let cnt = if c.topology_key == LABEL_HOSTNAME {
                    per_node[i].get(n.name.as_str()).copied().unwrap_or(0)
                } else {
                    domains[i].get(v).copied().unwrap_or(0)
                };
                // maxSkew-1 waters down differences between domains.
                s += cnt as f64 * weights[i] + (c.max_skew - 1) as f64;
            }
            Some(s.round() as i64)
        })
        .collect();
    Some(normalize(&raw))
}

/// Upstream's NormalizeScore: `100 * (max + min - s) / max`, ignored nodes 0.
fn normalize(raw: &[Option<i64>]) -> Vec<i64> {
    let min = raw.iter().flatten().copied().min().unwrap_or(0);
    let max = raw.iter().flatten().copied().max().unwrap_or(0).max(0);
    raw.iter()
        .map(|s| match s {
            None => 0,
            Some(_) if max == 0 => 100,
            Some(s) => 100 * (max + min - s) / max,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Fixture, node, pod};
    use super::*;
    use serde_json::json;

    fn web() -> Value {
        json!({"metadata": {"labels": {"app": "web"}}})
    }

    fn spread(constraint: Value) -> PodFacts {
        let mut c = json!({"maxSkew": 1, "topologyKey": LABEL_ZONE, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}}});
        for (k, v) in constraint.as_object().unwrap() {
            c[k] = v.clone();
        }
        pod(
            json!({"metadata": {"labels": {"app": "web"}}, "spec": {"topologySpreadConstraints": [c]}}),
        )
    }

    fn zoned() -> Vec<Value> {
        vec![
            node("a1", json!({LABEL_ZONE: "a"})),
            node("b1", json!({LABEL_ZONE: "b"})),
            node("bare", json!({})),
        ]
    }

    fn refused(f: &Fixture, p: &PodFacts) -> Vec<(String, Unfit)> {
        let st = pre_filter(p, &f.snapshot());
        f.views()
            .into_iter()
            .filter_map(|n| {
                let v = st.as_ref().map_or(Ok(()), |s| s.filter(n));
                v.err().map(|e| (n.name.clone(), e))
            })
            .collect()
    }

    #[test]
    fn do_not_schedule_keeps_the_skew_within_max_skew() {
        let f = Fixture::new(&zoned(), vec![("a1", web()), ("a1", web()), ("b1", web())]);
        // a: 2 + 1 - 1 = 2 > 1; b: 1 + 1 - 1 = 1.
        assert_eq!(
            refused(&f, &spread(json!({}))),
            vec![
                ("a1".into(), Unfit::TopologySpread),
                ("bare".into(), Unfit::TopologySpreadMissingLabel)
            ]
        );
        assert_eq!(
            refused(&f, &spread(json!({"maxSkew": 2}))),
            vec![("bare".into(), Unfit::TopologySpreadMissingLabel)]
        );
        // Fewer domains than minDomains: the global minimum is 0, so b is too full as well.
        assert_eq!(refused(&f, &spread(json!({"minDomains": 3}))).len(), 3);
        // A pod the selector does not match adds no skew of its own.
        let mut other = spread(json!({}));
        other.labels.clear();
        assert_eq!(refused(&f, &other).len(), 1);
        // ScheduleAnyway never filters.
        assert_eq!(
            refused(&f, &spread(json!({"whenUnsatisfiable": "ScheduleAnyway"}))),
            vec![]
        );
    }

    #[test]
    fn terminating_pods_other_namespaces_and_absent_selectors_do_not_count() {
        let mut gone = web();
        gone["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let mut elsewhere = web();
        elsewhere["metadata"]["namespace"] = json!("other");
        let f = Fixture::new(&zoned(), vec![("a1", gone), ("a1", elsewhere)]);
        assert_eq!(refused(&f, &spread(json!({}))).len(), 1);
        // No labelSelector: matches nothing, not even the pod itself.
        let f = Fixture::new(&zoned(), vec![("a1", web()), ("a1", web())]);
        assert_eq!(
            refused(&f, &spread(json!({"labelSelector": null}))).len(),
            1
        );
    }

    #[test]
    fn node_inclusion_policies_decide_which_domains_count() {
        let nodes = vec![
            node("a1", json!({LABEL_ZONE: "a", "disk": "hdd"})),
            node("b1", json!({LABEL_ZONE: "b", "disk": "ssd"})),
            node("b2", json!({LABEL_ZONE: "b", "disk": "ssd"})),
        ];
        let f = Fixture::new(&nodes, vec![("b1", web())]);
        let picky = |policy: Value| {
            let mut p = spread(policy);
            let mut spec = p.pod.spec.clone().unwrap();
            spec.node_selector = Some([("disk".to_string(), "ssd".to_string())].into());
            p.pod.spec = Some(spec);
            p
        };
        // Honor (default): zone a is not the pod's to use, so b is the minimum: b ok.
        assert_eq!(refused(&f, &picky(json!({}))), vec![]);
        // Ignore: zone a with 0 pods counts, b at 1 + 1 - 0 is too much.
        assert_eq!(
            refused(&f, &picky(json!({"nodeAffinityPolicy": "Ignore"}))),
            vec![
                ("b1".into(), Unfit::TopologySpread),
                ("b2".into(), Unfit::TopologySpread)
            ]
        );

        // Taints: ignored by default, so a tainted empty zone holds the minimum at 0.
        let mut tainted = node("a1", json!({LABEL_ZONE: "a"}));
        tainted["spec"] = json!({"taints": [{"key": "k", "effect": "NoSchedule"}]});
        let f = Fixture::new(
            &[tainted, node("b1", json!({LABEL_ZONE: "b"}))],
            vec![("b1", web())],
        );
        assert_eq!(
            refused(&f, &spread(json!({}))),
            vec![("b1".into(), Unfit::TopologySpread)]
        );
        assert_eq!(
            refused(&f, &spread(json!({"nodeTaintsPolicy": "Honor"}))),
            vec![]
        );
    }

    #[test]
    fn match_label_keys_narrow_the_selector_to_the_pods_values() {
        let rev = |r: &str| json!({"metadata": {"labels": {"app": "web", "rev": r}}});
        let f = Fixture::new(&zoned(), vec![("a1", rev("1")), ("a1", rev("1"))]);
        let mut p = spread(json!({"matchLabelKeys": ["rev"]}));
        p.labels.insert("rev".into(), "2".into());
        let mut spec = p.pod.spec.clone().unwrap();
        spec.topology_spread_constraints.as_mut().unwrap()[0].match_label_keys =
            Some(vec!["rev".into()]);
        p.pod.spec = Some(spec);
        assert_eq!(
            refused(&f, &p).len(),
            1,
            "rev 1 pods do not count for rev 2"
        );
        p.labels.insert("rev".into(), "1".into());
        assert_eq!(refused(&f, &p).len(), 2);
    }

    #[test]
    fn schedule_anyway_scores_emptier_domains_higher() {
        let nodes = vec![
            node("a1", json!({LABEL_ZONE: "a"})),
            node("a2", json!({LABEL_ZONE: "a"})),
            node("b1", json!({LABEL_ZONE: "b"})),
            node("bare", json!({})),
        ];
        let f = Fixture::new(&nodes, vec![("a1", web()), ("a2", web()), ("b1", web())]);
        let p = spread(json!({"whenUnsatisfiable": "ScheduleAnyway"}));
        // Weight ln(2 + 2); a: 2 × 1.386 = 3, b: 1.386 = 1; bare lacks the key: ignored, 0.
        // 100 * (3 + 1 - s) / 3.
        assert_eq!(
            score(&p, &f.snapshot(), &f.views()),
            Some(vec![33, 33, 100, 0])
        );
        assert_eq!(score(&spread(json!({})), &f.snapshot(), &f.views()), None);
    }

    #[test]
    fn system_defaults_spread_the_pods_of_a_replica_set() {
        let nodes = vec![
            node("n1", json!({LABEL_ZONE: "a"})),
            node("n2", json!({LABEL_ZONE: "a"})),
            node("n3", json!({})),
        ];
        let f = Fixture::new(&nodes, vec![("n1", web()), ("n1", web()), ("n2", web())]);
        f.put(
            "/apps/replicasets/default/web",
            json!({"metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": "web"}}}}),
        );
        let owned = pod(
            json!({"metadata": {"labels": {"app": "web"}, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u", "controller": true}]}}),
        );
        // hostname (maxSkew 3, ln(3 + 2)): n1 2, n2 1, n3 0; zone (maxSkew 5, ln(2 + 2)):
        // a holds 3, n3's missing zone is a domain "" of its own (defaults do not require keys).
        // n1: 2×1.609+2 + 3×1.386+4 = 13.38 → 13; n2: 1.609+2 + 8.16 = 11.77 → 12;
        // n3 has no zone label, so only its hostname term: 0+2 → 100 * (13 + 2 - s) / 13.
        assert_eq!(
            score(&owned, &f.snapshot(), &f.views()),
            Some(vec![15, 23, 100])
        );
        // Not owned, no Service: nothing to spread.
        assert_eq!(score(&pod(web()), &f.snapshot(), &f.views()), None);
        // A Service selecting it is enough.
        f.put(
            "/core/services/default/web",
            json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {"selector": {"app": "web"}}}),
        );
        assert!(score(&pod(web()), &f.snapshot(), &f.views()).is_some());
        // A pod with constraints of its own gets no defaults.
        assert_eq!(score(&spread(json!({})), &f.snapshot(), &f.views()), None);
    }
}
