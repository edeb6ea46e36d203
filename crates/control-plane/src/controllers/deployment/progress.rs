//! The Deployment's conditions (upstream's progress.go and the condition helpers):
//! Available from minimum availability, Progressing from rollout progress, the progress
//! deadline and pauses, ReplicaFailure copied up from the new ReplicaSet.

use serde_json::{Value, json};

use super::sync::{calculate_status, complete};
use super::{DeploymentController, Outcome, Rs};
use crate::apiserver::rest::{now_rfc3339, now_ts};
use crate::controllers::replicaset::{parse_ts, s};

/// The condition types a Deployment carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CondType {
    Available,
    Progressing,
    ReplicaFailure,
}

impl CondType {
    fn as_str(self) -> &'static str {
        match self {
            CondType::Available => "Available",
            CondType::Progressing => "Progressing",
            CondType::ReplicaFailure => "ReplicaFailure",
        }
    }
}

/// Upstream's condition reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    MinimumReplicasAvailable,
    MinimumReplicasUnavailable,
    NewReplicaSetCreated,
    FoundNewReplicaSet,
    ReplicaSetUpdated,
    NewReplicaSetAvailable,
    ProgressDeadlineExceeded,
    DeploymentPaused,
    DeploymentResumed,
    ReplicaSetCreateError,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::MinimumReplicasAvailable => "MinimumReplicasAvailable",
            Reason::MinimumReplicasUnavailable => "MinimumReplicasUnavailable",
            Reason::NewReplicaSetCreated => "NewReplicaSetCreated",
            Reason::FoundNewReplicaSet => "FoundNewReplicaSet",
            Reason::ReplicaSetUpdated => "ReplicaSetUpdated",
            Reason::NewReplicaSetAvailable => "NewReplicaSetAvailable",
            Reason::ProgressDeadlineExceeded => "ProgressDeadlineExceeded",
            Reason::DeploymentPaused => "DeploymentPaused",
            Reason::DeploymentResumed => "DeploymentResumed",
            Reason::ReplicaSetCreateError => "ReplicaSetCreateError",
        }
    }
}

pub(crate) fn condition(ty: CondType, status: &str, reason: Reason, message: &str) -> Value {
    let now = now_rfc3339();
    json!({"type": ty.as_str(), "status": status, "reason": reason.as_str(), "message": message,
        "lastUpdateTime": now, "lastTransitionTime": now})
}

pub(crate) fn get(status: &Value, ty: CondType) -> Option<&Value> {
    status
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty.as_str())
}

pub(crate) fn remove(status: &mut Value, ty: CondType) {
    if let Some(list) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        list.retain(|c| c["type"] != ty.as_str());
    }
}

/// Upstream's SetDeploymentCondition: same status and reason is no change; same status
/// keeps the transition time.
pub(crate) fn set(status: &mut Value, mut cond: Value) {
    let ty = cond["type"].as_str().unwrap_or("").to_string();
    if let Some(cur) = status
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|l| l.iter().find(|c| c["type"] == ty.as_str()))
    {
        if cur["status"] == cond["status"] && cur["reason"] == cond["reason"] {
            return;
        }
        if cur["status"] == cond["status"] {
            cond["lastTransitionTime"] = cur["lastTransitionTime"].clone();
        }
    }
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    if let Some(list) = status["conditions"].as_array_mut() {
        list.retain(|c| c["type"] != ty.as_str());
        list.push(cond);
    }
}

/// Whether the deployment has a progress deadline (unset or MaxInt32 means none).
pub(crate) fn has_deadline(d: &Value) -> bool {
    d.pointer("/spec/progressDeadlineSeconds")
        .and_then(Value::as_i64)
        .is_some_and(|p| p != i64::from(i32::MAX))
}

/// Upstream's DeploymentProgressing: the new status shows progress over the old one.
pub(crate) fn progressing(old: &Value, new: &Value) -> bool {
    let g = |v: &Value, f: &str| v.get(f).and_then(Value::as_i64).unwrap_or(0);
    let old_old = g(old, "replicas") - g(old, "updatedReplicas");
    let new_old = g(new, "replicas") - g(new, "updatedReplicas");
    g(new, "updatedReplicas") > g(old, "updatedReplicas")
        || new_old < old_old
        || g(new, "readyReplicas") > g(old, "readyReplicas")
        || g(new, "availableReplicas") > g(old, "availableReplicas")
}

/// Seconds until the Progressing condition passes the deadline (None: no deadline or
/// nothing in progress); ≤ 0 means timed out (upstream's DeploymentTimedOut).
pub(crate) fn deadline_left(d: &Value, status: &Value) -> Option<i64> {
    if !has_deadline(d) {
        return None;
    }
    let c = get(status, CondType::Progressing)?;
    match c["reason"].as_str() {
        Some("NewReplicaSetAvailable") => return None,
        Some("ProgressDeadlineExceeded") => return Some(0),
        _ => {}
    }
    let from = parse_ts(c["lastUpdateTime"].as_str().unwrap_or(""))?;
    let deadline = d
        .pointer("/spec/progressDeadlineSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(600);
    Some(from.as_second() + deadline - now_ts().as_second())
}

/// The paused/resumed Progressing condition (upstream's checkPausedConditions); true
/// when the status changed.
pub(crate) fn paused_condition(d: &Value, status: &mut Value) -> bool {
    if !has_deadline(d) {
        return false;
    }
    let paused = d.pointer("/spec/paused").and_then(Value::as_bool) == Some(true);
    let cur = get(status, CondType::Progressing).map(|c| s(c, "/reason").to_string());
    let was_paused = cur.as_deref() == Some("DeploymentPaused");
    let cond = if paused && !was_paused {
        condition(
            CondType::Progressing,
            "Unknown",
            Reason::DeploymentPaused,
            "Deployment is paused",
        )
    } else if !paused && was_paused {
        condition(
            CondType::Progressing,
            "Unknown",
            Reason::DeploymentResumed,
            "Deployment is resumed",
        )
    } else {
        return false;
    };
    set(status, cond);
    true
}

impl DeploymentController {
    /// Upstream's syncRolloutStatus: the Progressing condition (complete, progressing
    /// or past its deadline), ReplicaFailure from the sets; requeued for the deadline.
    pub(crate) fn sync_rollout_status(
        &self,
        key: &str,
        d: &mut Value,
        new: &Option<Rs>,
        old: &[Rs],
    ) -> Outcome {
        let mut st = calculate_status(d, new.as_ref(), old);
        let old_status = d.get("status").cloned().unwrap_or(json!({}));
        if !has_deadline(d) {
            remove(&mut st, CondType::Progressing);
        }
        let cur = get(&st, CondType::Progressing).cloned();
        let timed_out_before = cur
            .as_ref()
            .is_some_and(|c| c["reason"] == Reason::ProgressDeadlineExceeded.as_str());
        let name = new.as_ref().map(|n| n.name().to_string());
        let subject = match &name {
            Some(n) => format!("ReplicaSet \"{n}\""),
            None => format!("Deployment \"{}\"", s(d, "/metadata/name")),
        };
        if has_deadline(d) && !timed_out_before {
            if complete(d, &st) {
                set(
                    &mut st,
                    condition(
                        CondType::Progressing,
                        "True",
                        Reason::NewReplicaSetAvailable,
                        &format!("{subject} has successfully progressed."),
                    ),
                );
            } else if progressing(&old_status, &st) {
                let mut c = condition(
                    CondType::Progressing,
                    "True",
                    Reason::ReplicaSetUpdated,
                    &format!("{subject} is progressing."),
                );
                if let Some(cur) = &cur {
                    if cur["status"] == "True" {
                        c["lastTransitionTime"] = cur["lastTransitionTime"].clone();
                    }
                    remove(&mut st, CondType::Progressing);
                }
                set(&mut st, c);
            } else if deadline_left(d, &st).is_some_and(|l| l <= 0) {
                set(
                    &mut st,
                    condition(
                        CondType::Progressing,
                        "False",
                        Reason::ProgressDeadlineExceeded,
                        &format!("{subject} has timed out progressing."),
                    ),
                );
            }
        }
        let failure = new
            .iter()
            .chain(old.iter())
            .filter_map(|r| {
                r.obj
                    .pointer("/status/conditions")?
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "ReplicaFailure")
                    .cloned()
            })
            .next();
        match failure {
            Some(f) => {
                let now = crate::apiserver::rest::now_rfc3339();
                let c = json!({"type": "ReplicaFailure", "status": f["status"], "reason": f["reason"],
                    "message": f["message"], "lastUpdateTime": now,
                    "lastTransitionTime": f.get("lastTransitionTime").cloned().unwrap_or(json!(now))});
                set(&mut st, c);
            }
            None => remove(&mut st, CondType::ReplicaFailure),
        }
        d["status"] = st;
        self.write_deployment(key, d);
        // Upstream's requeueStuckDeployment: look again when the deadline passes.
        let in_progress = get(&d["status"], CondType::Progressing).is_some_and(|c| {
            c["status"] == "True" && c["reason"] != Reason::NewReplicaSetAvailable.as_str()
        });
        match deadline_left(d, &d["status"]) {
            Some(left) if in_progress && left > 0 => Outcome::After(left + 1),
            _ => Outcome::Done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_keeps_transition_time_on_same_status() {
        let mut st = json!({"conditions": [{"type": "Progressing", "status": "True",
            "reason": "NewReplicaSetCreated", "lastTransitionTime": "2020-01-01T00:00:00Z"}]});
        set(
            &mut st,
            condition(
                CondType::Progressing,
                "True",
                Reason::ReplicaSetUpdated,
                "m",
            ),
        );
        let c = get(&st, CondType::Progressing).cloned().unwrap_or_default();
        assert_eq!(c["reason"], "ReplicaSetUpdated");
        assert_eq!(c["lastTransitionTime"], "2020-01-01T00:00:00Z");
        set(
            &mut st,
            condition(
                CondType::Progressing,
                "False",
                Reason::ProgressDeadlineExceeded,
                "m",
            ),
        );
        let c = get(&st, CondType::Progressing).cloned().unwrap_or_default();
        assert_ne!(c["lastTransitionTime"], "2020-01-01T00:00:00Z");
        assert_eq!(st["conditions"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn progress_is_any_improvement() {
        let old = json!({"replicas": 3, "updatedReplicas": 1, "readyReplicas": 2, "availableReplicas": 2});
        for (new, want) in [
            (
                json!({"replicas": 3, "updatedReplicas": 1, "readyReplicas": 2, "availableReplicas": 2}),
                false,
            ),
            (
                json!({"replicas": 3, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2}),
                true,
            ),
            (
                json!({"replicas": 2, "updatedReplicas": 1, "readyReplicas": 2, "availableReplicas": 2}),
                true,
            ),
            (
                json!({"replicas": 3, "updatedReplicas": 1, "readyReplicas": 3, "availableReplicas": 2}),
                true,
            ),
        ] {
            assert_eq!(progressing(&old, &new), want, "{new}");
        }
    }
}
