//! Preemption (upstream's DefaultPreemption PostFilter): when a pod fits nowhere, the
//! scheduler looks for a node where deleting some lower-priority pods would make room, and
//! which pods those would be. Per node, every lower-priority pod is taken away; if the pod
//! then fits, pods are given back most important first (those whose deletion would break a
//! PodDisruptionBudget before the others) while it still fits, and the rest are the
//! victims. Among the nodes that work, the one chosen has the fewest budget violations, then
//! the lowest highest victim priority, the smallest sum of victim priorities, the fewest
//! victims, and the latest start among its most important victims.
//!
//! Only nodes refused by a filter upstream marks Unschedulable (room: resources, pod count,
//! host ports; and topology spread skew, anti-affinity) are tried; a node refused by a filter
//! deleting pods cannot change (taints, node affinity, pod affinity, volumes) is not.
//! Topology spread and pod affinity are judged as they stand, with the victims still there,
//! so only room is ever made.
//!
//! When no node works, [`failure_message`] says why per node as upstream's FitError does,
//! and the scheduler appends it to FailedScheduling after `preemption: `.

use std::collections::HashSet;

use k8s_openapi::jiff::Timestamp;
use nodus_k8s::selector::LabelSelector;
use serde_json::Value;

use super::fit::{PodFacts, Unfit, Usage};
use crate::controllers::controller_utils::{i, label_selector, s};

/// A pod's priority as admission resolved it (no PriorityClass: 0).
pub(crate) fn priority(p: &PodFacts) -> i32 {
    p.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// When the pod started; one not started yet counts as starting now (upstream's
/// GetPodStartTime), i.e. after every started pod.
fn start_time(p: &PodFacts) -> Option<Timestamp> {
    p.pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0)
}

/// Upstream's MoreImportantPod: higher priority, then started earlier.
fn more_important_first(a: &PodFacts, b: &PodFacts) -> std::cmp::Ordering {
    priority(b)
        .cmp(&priority(a))
        .then_with(|| match (start_time(a), start_time(b)) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        })
}

/// Whether a pod refused everywhere may preempt others (upstream's
/// PodEligibleToPreemptOthers): not with `preemptionPolicy: Never`, nor while pods it
/// already preempted on its nominated node are still terminating. The error is upstream's
/// reason.
pub(crate) fn eligible(
    pod: &PodFacts,
    victims_still_terminating: bool,
) -> Result<(), &'static str> {
    let never = pod
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref())
        == Some("Never");
    if never {
        return Err("not eligible due to preemptionPolicy=Never.");
    }
    if victims_still_terminating {
        return Err("not eligible due to a terminating pod on the nominated node.");
    }
    Ok(())
}

/// Why preemption cannot make room on one node (the per-node status of upstream's
/// preemption FitError).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NotHelped {
    /// Refused by a filter that deleting pods cannot change.
    NotHelpful,
    /// No pod of lower priority runs there.
    NoVictims,
    /// Still refused with every lower-priority pod gone.
    StillUnfit(Vec<Unfit>),
}

impl NotHelped {
    fn reasons(&self) -> Vec<String> {
        match self {
            NotHelped::NotHelpful => vec!["Preemption is not helpful for scheduling".into()],
            NotHelped::NoVictims => vec!["No preemption victims found for incoming pod".into()],
            NotHelped::StillUnfit(r) => r.iter().map(ToString::to_string).collect(),
        }
    }
}

/// Upstream's DefaultPreemption message when no node can be freed, without its
/// `preemption: ` prefix: `0/2 nodes are available: 1 No preemption victims found for
/// incoming pod, 1 Preemption is not helpful for scheduling.`
pub(crate) fn failure_message(total: usize, nodes: &[NotHelped]) -> String {
    super::fit::histogram_error(total, nodes.iter().flat_map(NotHelped::reasons))
}

/// Whether deleting pods might lift this refusal: upstream's Unschedulable, where the
/// others are UnschedulableAndUnresolvable.
pub(crate) fn resolvable(reasons: &[Unfit]) -> bool {
    !reasons.is_empty()
        && reasons.iter().all(|r| {
            matches!(
                r,
                Unfit::Ports
                    | Unfit::Insufficient(_)
                    | Unfit::InsufficientExtended(_)
                    | Unfit::TooManyPods
                    | Unfit::TopologySpread
                    | Unfit::PodAntiAffinity
                    | Unfit::ExistingPodsAntiAffinity
            )
        })
}

/// A PodDisruptionBudget as preemption counts it.
pub(crate) struct Budget {
    namespace: String,
    selector: LabelSelector,
    allowed: i64,
    disrupted: HashSet<String>,
}

impl Budget {
    /// The budget in `pdb`; None when its selector is missing, empty or unparsable (such a
    /// budget protects nothing here, as upstream).
    pub(crate) fn of(pdb: &Value) -> Option<Budget> {
        let sel = pdb.pointer("/spec/selector")?;
        if sel.as_object().is_none_or(|o| o.is_empty()) {
            return None;
        }
        Some(Budget {
            namespace: s(pdb, "/metadata/namespace").to_string(),
            selector: label_selector(sel)?,
            allowed: i(pdb, "/status/disruptionsAllowed"),
            disrupted: pdb
                .pointer("/status/disruptedPods")
                .and_then(Value::as_object)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default(),
        })
    }
}

/// Upstream's filterPodsWithPDBViolation over `pods` (most important first): whether
/// deleting each, after those before it, would exceed a budget.
fn violations(pods: &[(&str, &PodFacts)], budgets: &[Budget]) -> Vec<bool> {
    let mut allowed: Vec<i64> = budgets.iter().map(|b| b.allowed).collect();
    pods.iter()
        .map(|(_, p)| {
            if p.labels.is_empty() {
                return false;
            }
            let name = p.pod.metadata.name.as_deref().unwrap_or("");
            let mut violated = false;
            for (b, left) in budgets.iter().zip(allowed.iter_mut()) {
                if b.namespace != p.namespace
                    || !b.selector.matches(&p.labels)
                    || b.disrupted.contains(name)
                {
                    continue;
                }
                *left -= 1;
                if *left < 0 {
                    violated = true;
                }
            }
            violated
        })
        .collect()
}

/// The pods to delete on one node so the preemptor fits there.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Candidate {
    pub(crate) node: String,
    /// Victim keys, most important first.
    pub(crate) victims: Vec<String>,
    pub(crate) pdb_violations: usize,
    priorities: Vec<i32>,
    /// Start of the earliest-started victim among those of the highest priority.
    earliest_top_start: Option<Timestamp>,
}

/// Upstream's selectVictimsOnNode. `on_node` are the pods bound there; `fits` says whether
/// the preemptor fits the node with the given usage, or why not.
pub(crate) fn select_victims(
    pod: &PodFacts,
    node: &str,
    used: &Usage,
    on_node: &[(&str, &PodFacts)],
    budgets: &[Budget],
    fits: &dyn Fn(&Usage) -> Result<(), Vec<Unfit>>,
) -> Result<Candidate, NotHelped> {
    let prio = priority(pod);
    let mut used = used.clone();
    let mut lower: Vec<(&str, &PodFacts)> = on_node
        .iter()
        .filter(|(_, p)| priority(p) < prio)
        .copied()
        .collect();
    if lower.is_empty() {
        return Err(NotHelped::NoVictims);
    }
    for (_, p) in &lower {
        used.remove(p);
    }
    fits(&used).map_err(NotHelped::StillUnfit)?;
    let fits = |u: &Usage| fits(u).is_ok();
    lower.sort_by(|a, b| more_important_first(a.1, b.1));
    let violating = violations(&lower, budgets);
    let (breaking, keeping): (Vec<_>, Vec<_>) =
        lower.iter().zip(&violating).partition(|(_, v)| **v);
    let mut victims: Vec<(&str, &PodFacts)> = Vec::new();
    let mut pdb_violations = 0;
    for (group, breaks) in [(breaking, true), (keeping, false)] {
        for ((key, p), _) in group {
            used.add(p);
            if !fits(&used) {
                used.remove(p);
                victims.push((key, p));
                pdb_violations += usize::from(breaks);
            }
        }
    }
    if victims.is_empty() {
        // It fits with nothing removed (upstream's "expected at least one victim pod").
        return Err(NotHelped::NoVictims);
    }
    victims.sort_by(|a, b| more_important_first(a.1, b.1));
    let top = priority(victims[0].1);
    let earliest_top_start = victims
        .iter()
        .filter(|(_, p)| priority(p) == top)
        .map(|(_, p)| start_time(p))
        .min_by(|a, b| match (a, b) {
            (Some(x), Some(y)) => x.cmp(y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        })
        .flatten();
    Ok(Candidate {
        node: node.to_string(),
        priorities: victims.iter().map(|(_, p)| priority(p)).collect(),
        victims: victims.iter().map(|(k, _)| k.to_string()).collect(),
        pdb_violations,
        earliest_top_start,
    })
}

/// Upstream's pickOneNodeForPreemption over candidates in node order (ties: the first).
pub(crate) fn pick(candidates: Vec<Candidate>) -> Option<Candidate> {
    // Sum of priorities shifted to be positive, so fewer low-priority victims win.
    let sum = |c: &Candidate| -> i64 {
        c.priorities
            .iter()
            .map(|p| i64::from(*p) + i64::from(i32::MAX) + 1)
            .sum()
    };
    let highest = |c: &Candidate| c.priorities.first().copied().unwrap_or(i32::MIN);
    candidates.into_iter().reduce(|best, c| {
        let key = |c: &Candidate| (c.pdb_violations, highest(c), sum(c), c.victims.len());
        match key(&c).cmp(&key(&best)) {
            std::cmp::Ordering::Less => c,
            std::cmp::Ordering::Greater => best,
            // Latest start among the most important victims; not started counts as latest.
            std::cmp::Ordering::Equal => match (c.earliest_top_start, best.earliest_top_start) {
                (None, Some(_)) => c,
                (Some(x), Some(y)) if x > y => c,
                _ => best,
            },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::fit::{self, NodeView};
    use crate::scheduler::testing::pod;
    use serde_json::json;

    fn at(prio: i32, cpu: &str, labels: Value, started: Option<&str>) -> PodFacts {
        let mut v = json!({"metadata": {"name": format!("p{prio}-{cpu}"), "labels": labels},
            "spec": {"priority": prio, "containers": [{"name": "c",
                "resources": {"requests": {"cpu": cpu}}}]}});
        if let Some(t) = started {
            v["status"] = json!({"startTime": t});
        }
        pod(v)
    }

    fn node(cpu: &str) -> NodeView {
        NodeView::of(
            &serde_json::from_value(json!({"metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}}))
            .unwrap(),
        )
    }

    /// Victims on a node of `cpu` holding `pods` (keyed k0, k1, …) for `preemptor`.
    fn victims(
        cpu: &str,
        preemptor: &PodFacts,
        pods: &[PodFacts],
        budgets: &[Budget],
    ) -> Option<(Vec<String>, usize)> {
        let n = node(cpu);
        let mut used = Usage::default();
        for p in pods {
            used.add(p);
        }
        let keys: Vec<String> = (0..pods.len()).map(|i| format!("k{i}")).collect();
        let on: Vec<(&str, &PodFacts)> = keys.iter().map(String::as_str).zip(pods).collect();
        let fits = |u: &Usage| fit::filter(preemptor, &n, u);
        select_victims(preemptor, "n", &used, &on, budgets, &fits)
            .map(|c| (c.victims, c.pdb_violations))
            .ok()
    }

    #[test]
    fn the_fewest_least_important_pods_make_room() {
        let high = at(100, "2", json!({}), None);
        // (node cpu, pods on it, victims expected)
        type Case<'a> = (&'a str, Vec<PodFacts>, Option<Vec<&'a str>>);
        let cases: Vec<Case> = vec![
            // Removing the lowest-priority pod is enough.
            (
                "4",
                vec![at(1, "2", json!({}), None), at(5, "2", json!({}), None)],
                Some(vec!["k0"]),
            ),
            // Equal priority: the one started later goes.
            (
                "4",
                vec![
                    at(1, "2", json!({}), Some("2026-01-01T00:00:00Z")),
                    at(1, "2", json!({}), Some("2026-01-02T00:00:00Z")),
                ],
                Some(vec!["k1"]),
            ),
            // Two small pods must both go for one big one; one of them is enough on a
            // bigger node.
            (
                "3",
                vec![at(1, "1", json!({}), None), at(2, "1", json!({}), None)],
                Some(vec!["k0"]),
            ),
            (
                "2",
                vec![at(1, "1", json!({}), None), at(2, "1", json!({}), None)],
                Some(vec!["k1", "k0"]),
            ),
            // Pods of equal or higher priority are never victims.
            ("2", vec![at(100, "2", json!({}), None)], None),
            // Even with every lower pod gone the node is too small.
            ("1", vec![at(1, "1", json!({}), None)], None),
        ];
        for (cpu, pods, want) in cases {
            let got = victims(cpu, &high, &pods, &[]).map(|(v, _)| v);
            let want = want.map(|w| w.into_iter().map(String::from).collect::<Vec<_>>());
            assert_eq!(got, want, "node cpu {cpu}");
        }
    }

    #[test]
    fn pods_a_budget_protects_are_spared_first_and_violations_counted() {
        let high = at(100, "2", json!({}), None);
        let pdb = |allowed: i64, disrupted: Value| {
            Budget::of(&json!({"metadata": {"namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": "db"}}},
                "status": {"disruptionsAllowed": allowed, "disruptedPods": disrupted}}))
            .unwrap()
        };
        // The protected pod has the lower priority, yet the other one goes.
        let pods = vec![
            at(1, "2", json!({"app": "db"}), None),
            at(2, "2", json!({"app": "web"}), None),
        ];
        assert_eq!(
            victims("4", &high, &pods, &[pdb(0, json!({}))]),
            Some((vec!["k1".into()], 0))
        );
        // Both must go: one violation counted.
        assert_eq!(
            victims("2", &high, &pods, &[pdb(0, json!({}))]),
            Some((vec!["k1".into(), "k0".into()], 1))
        );
        // A budget with room, or one already counting the pod as disrupted: no violation.
        assert_eq!(
            victims("2", &high, &pods, &[pdb(1, json!({}))]).map(|v| v.1),
            Some(0)
        );
        assert_eq!(
            victims(
                "2",
                &high,
                &pods,
                &[pdb(0, json!({"p1-2": "2026-01-01T00:00:00Z"}))]
            )
            .map(|v| v.1),
            Some(0)
        );
        // An empty selector protects nothing.
        assert!(
            Budget::of(&json!({"metadata": {"namespace": "default"}, "spec": {"selector": {}}}))
                .is_none()
        );
    }

    fn cand(node: &str, violations: usize, prios: &[i32], start: Option<&str>) -> Candidate {
        Candidate {
            node: node.into(),
            victims: prios.iter().map(|p| format!("{node}-{p}")).collect(),
            pdb_violations: violations,
            priorities: prios.to_vec(),
            earliest_top_start: start.map(|s| s.parse().unwrap()),
        }
    }

    #[test]
    fn the_node_is_picked_as_upstream_orders_the_criteria() {
        let t1 = Some("2026-01-01T00:00:00Z");
        let t2 = Some("2026-01-02T00:00:00Z");
        let cases: Vec<(Vec<Candidate>, &str)> = vec![
            // Fewest budget violations beats everything else.
            (
                vec![cand("a", 1, &[1], t1), cand("b", 0, &[50, 40], t1)],
                "b",
            ),
            // Lowest highest victim priority.
            (
                vec![cand("a", 0, &[10], t1), cand("b", 0, &[5, 5], t1)],
                "b",
            ),
            // Smallest sum of priorities.
            (
                vec![cand("a", 0, &[5, 4], t1), cand("b", 0, &[5, 1], t1)],
                "b",
            ),
            // Fewest victims (priorities shifted positive, so more victims sum higher).
            (vec![cand("a", 0, &[5, 0], t1), cand("b", 0, &[5], t1)], "b"),
            // Latest start of the most important victims.
            (vec![cand("a", 0, &[5], t1), cand("b", 0, &[5], t2)], "b"),
            // All equal: the first node.
            (vec![cand("a", 0, &[5], t1), cand("b", 0, &[5], t1)], "a"),
        ];
        for (cands, want) in cases {
            assert_eq!(pick(cands).map(|c| c.node), Some(want.to_string()));
        }
        assert_eq!(pick(vec![]), None);
    }

    #[test]
    fn why_no_node_can_be_freed_in_upstreams_words() {
        let high = at(100, "2", json!({}), None);
        let n = node("1");
        let why = |pods: &[PodFacts]| {
            let mut used = Usage::default();
            pods.iter().for_each(|p| used.add(p));
            let keys: Vec<String> = (0..pods.len()).map(|i| format!("k{i}")).collect();
            let on: Vec<(&str, &PodFacts)> = keys.iter().map(String::as_str).zip(pods).collect();
            let fits = |u: &Usage| fit::filter(&high, &n, u);
            select_victims(&high, "n", &used, &on, &[], &fits).err()
        };
        // Only equal or higher priority pods: nothing to take.
        assert_eq!(
            why(&[at(100, "1", json!({}), None)]),
            Some(NotHelped::NoVictims)
        );
        assert_eq!(why(&[]), Some(NotHelped::NoVictims));
        // The node is too small even when emptied.
        assert_eq!(
            why(&[at(1, "1", json!({}), None)]),
            Some(NotHelped::StillUnfit(vec![Unfit::Insufficient("cpu")]))
        );
        let cases: Vec<(usize, Vec<NotHelped>, &str)> = vec![
            (
                1,
                vec![NotHelped::NoVictims],
                "0/1 nodes are available: 1 No preemption victims found for incoming pod.",
            ),
            (
                3,
                vec![
                    NotHelped::NotHelpful,
                    NotHelped::StillUnfit(vec![
                        Unfit::Insufficient("cpu"),
                        Unfit::Insufficient("memory"),
                    ]),
                    NotHelped::NotHelpful,
                ],
                "0/3 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 2 Preemption is not helpful for scheduling.",
            ),
        ];
        for (total, nodes, want) in cases {
            assert_eq!(failure_message(total, &nodes), want);
        }
    }

    #[test]
    fn eligibility_and_resolvable_refusals() {
        let mut never = at(100, "1", json!({}), None);
        never.pod.spec.as_mut().unwrap().preemption_policy = Some("Never".into());
        assert_eq!(
            eligible(&never, false),
            Err("not eligible due to preemptionPolicy=Never.")
        );
        let p = at(100, "1", json!({}), None);
        assert_eq!(eligible(&p, false), Ok(()));
        assert_eq!(
            eligible(&p, true),
            Err("not eligible due to a terminating pod on the nominated node.")
        );
        assert!(resolvable(&[
            Unfit::Insufficient("cpu"),
            Unfit::TooManyPods
        ]));
        assert!(resolvable(&[Unfit::Ports]));
        assert!(resolvable(&[Unfit::ExistingPodsAntiAffinity]));
        assert!(!resolvable(&[Unfit::PodAffinity]));
        assert!(!resolvable(&[Unfit::TopologySpreadMissingLabel]));
        assert!(!resolvable(&[Unfit::Taint("{a: }".into())]));
        assert!(!resolvable(&[Unfit::VolumeNodeAffinityConflict]));
        assert!(!resolvable(&[]));
    }
}
