//! What every workload controller asks of the objects it reads (upstream's
//! pkg/controller/controller_utils.go and podutil): controller references, pod phases and
//! readiness, availability after minReadySeconds, label selectors in JSON form.

use k8s_openapi::jiff::Timestamp;
use nodus_k8s::selector::LabelSelector;
use serde_json::{Value, json};

pub(crate) fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

pub(crate) fn i(v: &Value, p: &str) -> i64 {
    v.pointer(p).and_then(Value::as_i64).unwrap_or(0)
}

/// A metav1.LabelSelector in JSON, parsed; None when missing or unparsable.
pub(crate) fn label_selector(sel: &Value) -> Option<LabelSelector> {
    let ls: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
        serde_json::from_value(sel.clone()).ok()?;
    nodus_k8s::selector::from_metav1(&ls).ok()
}

pub(crate) fn parse_ts(v: &str) -> Option<Timestamp> {
    v.parse::<Timestamp>().ok()
}

/// The owner reference marked `controller: true`, if any.
pub(crate) fn controller_ref(obj: &Value) -> Option<&Value> {
    obj.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
}

/// The controller reference an owner puts on what it creates or adopts.
pub(crate) fn owner_ref(api_version: &str, kind: &str, owner: &Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": s(owner, "/metadata/name"),
        "uid": s(owner, "/metadata/uid"), "controller": true, "blockOwnerDeletion": true})
}

pub(crate) fn deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// Who is about to delete a pod, as its `DisruptionTarget` condition says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DisruptionReason {
    DeletionByTaintManager,
    DeletionByPodGC,
    PreemptionByScheduler,
}

impl DisruptionReason {
    fn reason(self) -> &'static str {
        match self {
            DisruptionReason::DeletionByTaintManager => "DeletionByTaintManager",
            DisruptionReason::DeletionByPodGC => "DeletionByPodGC",
            DisruptionReason::PreemptionByScheduler => "PreemptionByScheduler",
        }
    }

    fn message(self) -> &'static str {
        match self {
            DisruptionReason::DeletionByTaintManager => {
                "Taint manager: deleting due to NoExecute taint"
            }
            DisruptionReason::DeletionByPodGC => "PodGC: node no longer exists",
            DisruptionReason::PreemptionByScheduler => {
                "default-scheduler: preempting to accommodate a higher priority pod"
            }
        }
    }
}

/// Gives the pod `DisruptionTarget=True` with `why`, unless it already has it; whether it
/// changed.
pub(crate) fn mark_disruption_target(p: &mut Value, why: DisruptionReason) -> bool {
    let mut conds = p["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if conds
        .iter()
        .any(|c| c["type"] == "DisruptionTarget" && c["status"] == "True")
    {
        return false;
    }
    conds.retain(|c| c["type"] != "DisruptionTarget");
    conds.push(
        json!({"type": "DisruptionTarget", "status": "True", "reason": why.reason(),
        "message": why.message(), "lastProbeTime": null,
        "lastTransitionTime": crate::apiserver::rest::now_rfc3339()}),
    );
    p["status"]["conditions"] = json!(conds);
    true
}

fn condition<'a>(p: &'a Value, type_: &str) -> Option<&'a Value> {
    p.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Upstream's IsPodActive: not finished and not being deleted.
pub(crate) fn pod_active(p: &Value) -> bool {
    !matches!(s(p, "/status/phase"), "Succeeded" | "Failed") && !deleting(p)
}

/// When the pod last became Ready, if it is Ready.
pub(crate) fn ready_since(p: &Value) -> Option<Timestamp> {
    condition(p, "Ready")
        .filter(|c| c["status"] == "True")?
        .get("lastTransitionTime")
        .and_then(Value::as_str)
        .and_then(parse_ts)
}

pub(crate) fn pod_ready(p: &Value) -> bool {
    condition(p, "Ready").is_some_and(|c| c["status"] == "True")
}

/// Upstream's IsPodAvailable: Ready for at least `min_ready` seconds.
pub(crate) fn pod_available(p: &Value, min_ready: i64, now: Timestamp) -> bool {
    if !pod_ready(p) {
        return false;
    }
    if min_ready <= 0 {
        return true;
    }
    ready_since(p).is_some_and(|t| t.as_second() + min_ready <= now.as_second())
}

/// Seconds until a Ready pod becomes available, when it is not yet.
pub(crate) fn seconds_to_available(p: &Value, min_ready: i64, now: Timestamp) -> Option<i64> {
    let since = ready_since(p)?;
    let left = since.as_second() + min_ready - now.as_second();
    (left > 0).then_some(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready_since(t: &str) -> Value {
        json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": t}]}})
    }

    #[test]
    fn availability_counts_from_the_ready_transition() {
        let now = parse_ts("2026-01-01T00:01:00Z").unwrap();
        let p = ready_since("2026-01-01T00:00:30Z");
        let cases = [
            (0, true, None),
            (30, true, None),
            (31, false, Some(1)),
            (90, false, Some(60)),
        ];
        for (min_ready, available, left) in cases {
            assert_eq!(
                pod_available(&p, min_ready, now),
                available,
                "minReady {min_ready}"
            );
            if min_ready > 0 {
                assert_eq!(
                    seconds_to_available(&p, min_ready, now),
                    left,
                    "minReady {min_ready}"
                );
            }
        }
        let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        assert!(!pod_available(&not_ready, 0, now));
        assert_eq!(seconds_to_available(&not_ready, 10, now), None);
    }
}
