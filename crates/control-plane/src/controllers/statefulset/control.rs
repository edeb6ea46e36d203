//! What one sync of a StatefulSet does, decided without touching the store (upstream's
//! defaultStatefulSetControl.updateStatefulSet): the pods to create, delete or repair and
//! the status they add up to. OrderedReady ("monotonic") stops at the first pod that is
//! missing, terminating or not yet Running, Ready and available, so pods start in ordinal
//! order and stop in reverse; Parallel only waits during a rolling update, which replaces
//! one pod at a time from the highest ordinal down to the partition.

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::identity::{REVISION_LABEL, identity_matches, ordinal};
use crate::controllers::controller_utils::{
    deleting, pod_available, pod_ready, s, seconds_to_available,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strategy {
    RollingUpdate { partition: i64 },
    OnDelete,
}

/// The parts of a StatefulSet's spec a sync acts on.
#[derive(Clone, Debug)]
pub(crate) struct SetSpec {
    pub name: String,
    /// `spec.serviceName`, the governing Service that gives pods their subdomain.
    pub service_name: String,
    pub replicas: i64,
    /// `spec.ordinals.start`.
    pub start: i64,
    /// `podManagementPolicy: Parallel`.
    pub parallel: bool,
    pub strategy: Strategy,
    pub min_ready_seconds: i64,
}

impl SetSpec {
    pub(crate) fn from_object(set: &Value) -> SetSpec {
        let int = |p: &str, d: i64| set.pointer(p).and_then(Value::as_i64).unwrap_or(d);
        let strategy = match s(set, "/spec/updateStrategy/type") {
            "OnDelete" => Strategy::OnDelete,
            _ => Strategy::RollingUpdate {
                partition: int("/spec/updateStrategy/rollingUpdate/partition", 0),
            },
        };
        SetSpec {
            name: s(set, "/metadata/name").to_string(),
            service_name: s(set, "/spec/serviceName").to_string(),
            replicas: int("/spec/replicas", 1).max(0),
            start: int("/spec/ordinals/start", 0).max(0),
            parallel: s(set, "/spec/podManagementPolicy") == "Parallel",
            strategy,
            min_ready_seconds: int("/spec/minReadySeconds", 0),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeleteReason {
    /// The pod Failed or Succeeded: it is deleted to be made again.
    Finished,
    /// Its ordinal is outside the set after a scale-down.
    Condemned,
    /// It runs an older revision (rolling update).
    Update,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Create the pod (and its claims) at this ordinal, from the update revision or, below
    /// a rolling update's partition, the current one.
    Create {
        ordinal: i64,
        at_update: bool,
    },
    Delete {
        name: String,
        reason: DeleteReason,
    },
    /// The pod lost labels, hostname or subdomain its identity needs.
    FixIdentity {
        name: String,
        ordinal: i64,
    },
}

/// The counts upstream reports in StatefulSetStatus.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub replicas: i64,
    pub ready: i64,
    pub available: i64,
    pub current: i64,
    pub updated: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub actions: Vec<Action>,
    pub counts: Counts,
    /// Sync again after this many seconds (a pod still short of minReadySeconds).
    pub requeue_after: Option<i64>,
}

fn phase(p: &Value) -> &str {
    s(p, "/status/phase")
}

fn revision(p: &Value) -> &str {
    p.pointer("/metadata/labels")
        .and_then(|l| l.get(REVISION_LABEL))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn running_and_ready(p: &Value) -> bool {
    phase(p) == "Running" && pod_ready(p)
}

fn healthy(p: &Value) -> bool {
    running_and_ready(p) && !deleting(p)
}

/// Plans one sync of `set` over the pods it owns, given its current and update revisions.
pub(crate) fn plan(
    set: &SetSpec,
    owned: &[&Value],
    current_rev: &str,
    update_rev: &str,
    now: Timestamp,
) -> Plan {
    let n = set.replicas as usize;
    let mut replicas: Vec<Option<&Value>> = vec![None; n];
    let mut condemned: Vec<(i64, &Value)> = Vec::new();
    for p in owned {
        let Some(ord) = ordinal(&set.name, s(p, "/metadata/name")) else {
            continue;
        };
        if ord >= set.start && ord < set.start + set.replicas {
            replicas[(ord - set.start) as usize] = Some(p);
        } else {
            condemned.push((ord, p));
        }
    }
    condemned.sort_by_key(|(o, _)| *o);

    let mut plan = Plan {
        counts: count(owned, set.min_ready_seconds, current_rev, update_rev, now),
        ..Default::default()
    };
    let monotonic = !set.parallel;
    // Upstream blocks a monotonic scale-down on the first unhealthy pod, in ordinal order
    // over the kept pods, then over the condemned ones.
    let first_unhealthy = replicas
        .iter()
        .enumerate()
        .find(|(_, p)| !p.is_some_and(healthy))
        .map(|(i, _)| set.start + i as i64)
        .or_else(|| condemned.iter().find(|(_, p)| !healthy(p)).map(|(o, _)| *o));

    for (i, slot) in replicas.iter().enumerate() {
        let ord = set.start + i as i64;
        let Some(p) = slot else {
            let at_update = match set.strategy {
                Strategy::RollingUpdate { partition } => ord >= set.start + partition,
                Strategy::OnDelete => true,
            };
            plan.actions.push(Action::Create {
                ordinal: ord,
                at_update,
            });
            if monotonic {
                return plan;
            }
            continue;
        };
        if matches!(phase(p), "Failed" | "Succeeded") && !deleting(p) {
            plan.actions.push(Action::Delete {
                name: s(p, "/metadata/name").to_string(),
                reason: DeleteReason::Finished,
            });
            if monotonic {
                return plan;
            }
            continue;
        }
        if deleting(p) || !running_and_ready(p) {
            if monotonic {
                return plan;
            }
            continue;
        }
        if !pod_available(p, set.min_ready_seconds, now) {
            plan.requeue_after = seconds_to_available(p, set.min_ready_seconds, now)
                .map(|left| plan.requeue_after.map_or(left, |r: i64| r.min(left)));
            if monotonic {
                return plan;
            }
        }
        if !identity_matches(&set.name, &set.service_name, p, ord) {
            plan.actions.push(Action::FixIdentity {
                name: s(p, "/metadata/name").to_string(),
                ordinal: ord,
            });
        }
    }

    // Scale down from the highest ordinal.
    for (ord, p) in condemned.iter().rev() {
        if deleting(p) {
            if monotonic {
                return plan;
            }
            continue;
        }
        if monotonic && first_unhealthy.is_some_and(|u| u != *ord) {
            return plan;
        }
        plan.actions.push(Action::Delete {
            name: s(p, "/metadata/name").to_string(),
            reason: DeleteReason::Condemned,
        });
        if monotonic {
            return plan;
        }
    }

    let Strategy::RollingUpdate { partition } = set.strategy else {
        return plan;
    };
    let update_min = partition.clamp(0, set.replicas) as usize;
    for slot in replicas[update_min..].iter().rev() {
        // A pod being made again is not healthy yet: the update waits for it.
        let Some(p) = slot else { return plan };
        if revision(p) != update_rev && !deleting(p) {
            plan.actions.push(Action::Delete {
                name: s(p, "/metadata/name").to_string(),
                reason: DeleteReason::Update,
            });
            return plan;
        }
        if !healthy(p) {
            return plan;
        }
    }
    plan
}

fn count(
    owned: &[&Value],
    min_ready: i64,
    current_rev: &str,
    update_rev: &str,
    now: Timestamp,
) -> Counts {
    let mut c = Counts::default();
    for p in owned {
        if deleting(p) {
            continue;
        }
        c.replicas += 1;
        if running_and_ready(p) {
            c.ready += 1;
            if pod_available(p, min_ready, now) {
                c.available += 1;
            }
        }
        let r = revision(p);
        if r == current_rev {
            c.current += 1;
        }
        if r == update_rev {
            c.updated += 1;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2026-01-01T00:10:00Z";

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    /// A pod of set `web`: state is "ready", "running" (not ready), "pending", "failed" or
    /// "deleting"; rev its revision label.
    fn pod(ord: i64, state: &str, rev: &str) -> Value {
        let (phase, ready) = match state {
            "ready" | "deleting" => ("Running", "True"),
            "running" => ("Running", "False"),
            "pending" => ("Pending", "False"),
            "failed" => ("Failed", "False"),
            other => panic!("{other}"),
        };
        let mut p = json!({
            "metadata": {"name": format!("web-{ord}"), "labels": {
                "controller-revision-hash": rev,
                "statefulset.kubernetes.io/pod-name": format!("web-{ord}"),
                "apps.kubernetes.io/pod-index": ord.to_string()}},
            "spec": {"hostname": format!("web-{ord}")},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready,
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        });
        if state == "deleting" {
            p["metadata"]["deletionTimestamp"] = json!(NOW);
        }
        p
    }

    fn spec(replicas: i64, parallel: bool, strategy: Strategy) -> SetSpec {
        SetSpec {
            name: "web".into(),
            service_name: String::new(),
            replicas,
            start: 0,
            parallel,
            strategy,
            min_ready_seconds: 0,
        }
    }

    const RU: Strategy = Strategy::RollingUpdate { partition: 0 };

    fn create(ordinal: i64) -> Action {
        Action::Create {
            ordinal,
            at_update: true,
        }
    }

    fn delete(ord: i64, reason: DeleteReason) -> Action {
        Action::Delete {
            name: format!("web-{ord}"),
            reason,
        }
    }

    #[test]
    fn plans_as_upstream() {
        use DeleteReason::*;
        let cases: Vec<(&str, SetSpec, Vec<Value>, Vec<Action>)> = vec![
            (
                "ordered: the first missing pod only",
                spec(3, false, RU),
                vec![],
                vec![create(0)],
            ),
            (
                "ordered: waits for web-0 to be ready",
                spec(3, false, RU),
                vec![pod(0, "running", "b")],
                vec![],
            ),
            (
                "ordered: next ordinal once ready",
                spec(3, false, RU),
                vec![pod(0, "ready", "b")],
                vec![create(1)],
            ),
            (
                "parallel: every missing pod at once",
                spec(3, true, RU),
                vec![pod(1, "pending", "b")],
                vec![create(0), create(2)],
            ),
            (
                "a failed pod is deleted to be made again",
                spec(2, false, RU),
                vec![pod(0, "failed", "b"), pod(1, "ready", "b")],
                vec![delete(0, Finished)],
            ),
            (
                "ordered scale-down: highest ordinal first, one at a time",
                spec(1, false, RU),
                vec![
                    pod(0, "ready", "b"),
                    pod(1, "ready", "b"),
                    pod(2, "ready", "b"),
                ],
                vec![delete(2, Condemned)],
            ),
            (
                "ordered scale-down waits for a terminating pod",
                spec(1, false, RU),
                vec![
                    pod(0, "ready", "b"),
                    pod(1, "ready", "b"),
                    pod(2, "deleting", "b"),
                ],
                vec![],
            ),
            (
                "ordered scale-down blocked by an unhealthy kept pod",
                spec(2, false, RU),
                vec![
                    pod(0, "ready", "b"),
                    pod(1, "running", "b"),
                    pod(2, "ready", "b"),
                ],
                vec![],
            ),
            (
                "parallel scale-down: all condemned at once",
                spec(1, true, RU),
                vec![
                    pod(0, "ready", "b"),
                    pod(1, "running", "b"),
                    pod(2, "ready", "b"),
                ],
                vec![delete(2, Condemned), delete(1, Condemned)],
            ),
            (
                "rolling update replaces the highest ordinal first",
                spec(3, false, RU),
                vec![
                    pod(0, "ready", "a"),
                    pod(1, "ready", "a"),
                    pod(2, "ready", "a"),
                ],
                vec![delete(2, Update)],
            ),
            (
                "rolling update waits for the replaced pod to be healthy",
                spec(3, true, RU),
                vec![
                    pod(0, "ready", "a"),
                    pod(1, "ready", "a"),
                    pod(2, "running", "b"),
                ],
                vec![],
            ),
            (
                "rolling update moves down once the updated pod is ready",
                spec(3, false, RU),
                vec![
                    pod(0, "ready", "a"),
                    pod(1, "ready", "a"),
                    pod(2, "ready", "b"),
                ],
                vec![delete(1, Update)],
            ),
            (
                "parallel: a replaced pod being made again holds the update back",
                spec(3, true, RU),
                vec![pod(0, "ready", "a"), pod(1, "ready", "a")],
                vec![create(2)],
            ),
            (
                "partition 2 keeps web-0 and web-1 at the old revision",
                spec(3, false, Strategy::RollingUpdate { partition: 2 }),
                vec![
                    pod(0, "ready", "a"),
                    pod(1, "ready", "a"),
                    pod(2, "ready", "b"),
                ],
                vec![],
            ),
            (
                "OnDelete never deletes for an update",
                spec(2, false, Strategy::OnDelete),
                vec![pod(0, "ready", "a"), pod(1, "ready", "a")],
                vec![],
            ),
        ];
        for (what, set, pods, want) in cases {
            let refs: Vec<&Value> = pods.iter().collect();
            let got = plan(&set, &refs, "a", "b", now());
            assert_eq!(got.actions, want, "{what}");
        }
    }

    #[test]
    fn below_the_partition_pods_are_made_at_the_current_revision() {
        let set = spec(3, true, Strategy::RollingUpdate { partition: 2 });
        let got = plan(&set, &[], "a", "b", now());
        let at: Vec<(i64, bool)> = got
            .actions
            .iter()
            .map(|a| match a {
                Action::Create { ordinal, at_update } => (*ordinal, *at_update),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(at, vec![(0, false), (1, false), (2, true)]);
    }

    #[test]
    fn status_counts_and_min_ready_requeue() {
        let mut set = spec(3, false, RU);
        set.min_ready_seconds = 900;
        let pods = [
            pod(0, "ready", "a"),
            pod(1, "running", "b"),
            pod(2, "deleting", "b"),
        ];
        let refs: Vec<&Value> = pods.iter().collect();
        let got = plan(&set, &refs, "a", "b", now());
        assert_eq!(
            got.counts,
            Counts {
                replicas: 2,
                ready: 1,
                available: 0,
                current: 1,
                updated: 1
            }
        );
        // Ready since 00:00, minReadySeconds 900, now 00:10: available in 300 s.
        assert_eq!(got.requeue_after, Some(300));
        assert!(got.actions.is_empty(), "{:?}", got.actions);
    }

    #[test]
    fn a_pod_that_lost_its_labels_is_repaired() {
        let mut p = pod(0, "ready", "b");
        p["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("apps.kubernetes.io/pod-index");
        let got = plan(&spec(1, false, RU), &[&p], "b", "b", now());
        assert_eq!(
            got.actions,
            vec![Action::FixIdentity {
                name: "web-0".into(),
                ordinal: 0
            }]
        );
    }
}
