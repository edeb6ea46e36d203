//! The disruption controller (upstream's pkg/controller/disruption) and the budget
//! arithmetic the eviction subresource shares with it.
//!
//! For every PodDisruptionBudget it computes, from the pods its selector picks in its
//! namespace: `expectedPods` (for `maxUnavailable` or a percentage `minAvailable`, the sum
//! of the `spec.replicas` of the pods' controllers, found through their controller
//! ownerReference as upstream's getExpectedScale; for an integer `minAvailable`, the number
//! of pods), `desiredHealthy`, `currentHealthy` (Ready pods that are neither terminating
//! nor recorded in `disruptedPods`), `disruptionsAllowed`, `observedGeneration` and the
//! `DisruptionAllowed` condition (SufficientPods / InsufficientPods, or SyncFailed with
//! no disruption allowed when the computation fails). `disruptedPods` is written by the
//! eviction subresource ([`check_and_decrement`]); this controller drops an entry once its
//! pod is terminating or gone, or after [`DELETION_TIMEOUT`] if it never went.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value, json};

use crate::apiserver::rest::list::labels_of;
use crate::apiserver::rest::path;
use crate::apiserver::rest::subresources::selector_matches;
use crate::apiserver::rest::{now_rfc3339, now_ts};
use crate::apiserver::state::ApiState;
use crate::controllers::cache::Cache;
use crate::controllers::controller_utils::controller_ref as controller_of;
use crate::controllers::controller_utils::pod_ready;
use crate::controllers::events::Recorder;
use crate::controllers::objects;

/// How long an evicted pod may stay before the budget counts it again (upstream's
/// DeletionTimeout).
pub(crate) const DELETION_TIMEOUT: Duration = Duration::from_secs(120);
/// upstream's MaxDisruptedPodSize.
const MAX_DISRUPTED_POD_SIZE: usize = 2000;
const DISRUPTION_ALLOWED: &str = "DisruptionAllowed";
/// The message of every refused eviction (upstream's).
pub(crate) const VIOLATION: &str =
    "Cannot evict pod as it would violate the pod's disruption budget.";

/// The reasons of the DisruptionAllowed condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    SufficientPods,
    InsufficientPods,
    SyncFailed,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Reason::SufficientPods => "SufficientPods",
            Reason::InsufficientPods => "InsufficientPods",
            Reason::SyncFailed => "SyncFailed",
        }
    }
}

/// A budget's computed status.
#[derive(Debug, PartialEq)]
pub(crate) struct Budget {
    pub current_healthy: i64,
    pub desired_healthy: i64,
    pub expected_pods: i64,
    pub disruptions_allowed: i64,
    /// Pod name → eviction time, as stored.
    pub disrupted_pods: Map<String, Value>,
    /// Selected pods without a controller (percentages cannot count them).
    pub unmanaged: Vec<String>,
    /// Entries dropped because their pod outlived [`DELETION_TIMEOUT`].
    pub not_deleted: Vec<String>,
}

/// The scale of a pod's controller, from its controller ownerReference in `namespace`:
/// (the uid it is counted under, replicas); None when no supported controller matches.
pub(crate) type ScaleOf<'a> = dyn Fn(&str, &Value) -> Option<(String, i64)> + 'a;

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn int(v: &Value, p: &str) -> i64 {
    v.pointer(p).and_then(Value::as_i64).unwrap_or(0)
}

fn terminating(p: &Value) -> bool {
    p.pointer("/metadata/deletionTimestamp").is_some()
}

/// upstream's getExpectedScale: the sum of the scales of the pods' controllers, and the
/// pods that have none.
fn expected_scale(pods: &[&Value], scale_of: &ScaleOf) -> Result<(i64, Vec<String>), String> {
    let mut scales: HashMap<String, i64> = HashMap::new();
    let mut unmanaged = Vec::new();
    for pod in pods {
        let Some(r) = controller_of(pod) else {
            unmanaged.push(s(pod, "/metadata/name").to_string());
            continue;
        };
        if scales.contains_key(s(r, "/uid")) {
            continue;
        }
        match scale_of(s(pod, "/metadata/namespace"), r) {
            Some((uid, n)) => {
                scales.insert(uid, n);
            }
            None => {
                return Err(format!(
                    "found no controllers for pod {:?}",
                    s(pod, "/metadata/name")
                ));
            }
        }
    }
    Ok((scales.values().sum(), unmanaged))
}

/// upstream's getExpectedPodCount: (expectedPods, desiredHealthy, unmanaged pods).
fn expected_pod_count(
    pdb: &Value,
    pods: &[&Value],
    scale_of: &ScaleOf,
) -> Result<(i64, i64, Vec<String>), String> {
    let spec = &pdb["spec"];
    if let Some(max) = spec.get("maxUnavailable").filter(|v| !v.is_null()) {
        let (expected, unmanaged) = expected_scale(pods, scale_of)?;
        let max = nodus_k8s::intstr::scaled_value(max, expected, true)?;
        return Ok((expected, (expected - max).max(0), unmanaged));
    }
    match spec.get("minAvailable") {
        Some(Value::Number(n)) => Ok((pods.len() as i64, n.as_i64().unwrap_or(0), Vec::new())),
        Some(v @ Value::String(_)) => {
            let (expected, unmanaged) = expected_scale(pods, scale_of)?;
            let min = nodus_k8s::intstr::scaled_value(v, expected, true)?;
            Ok((expected, min, unmanaged))
        }
        _ => Ok((0, 0, Vec::new())),
    }
}

fn parse_time(v: &Value) -> Option<Timestamp> {
    v.as_str()?.parse().ok()
}

/// Whether an eviction recorded at `when` still stands at `now`.
fn eviction_pending(when: &Value, now: Timestamp) -> bool {
    parse_time(when).is_some_and(|t| {
        t.checked_add(SignedDuration::try_from(DELETION_TIMEOUT).unwrap_or_default())
            .is_ok_and(|expires| expires > now)
    })
}

/// upstream's trySync arithmetic for `pdb` over the pods it selects.
pub(crate) fn compute(
    pdb: &Value,
    pods: &[&Value],
    scale_of: &ScaleOf,
    now: Timestamp,
) -> Result<Budget, String> {
    let (expected_pods, desired_healthy, unmanaged) = expected_pod_count(pdb, pods, scale_of)?;
    // upstream's buildDisruptedPodMap.
    let recorded = pdb
        .pointer("/status/disruptedPods")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut disrupted_pods = Map::new();
    let mut not_deleted = Vec::new();
    for pod in pods.iter().filter(|p| !terminating(p)) {
        let name = s(pod, "/metadata/name");
        let Some(when) = recorded.get(name) else {
            continue;
        };
        if eviction_pending(when, now) {
            disrupted_pods.insert(name.to_string(), when.clone());
        } else {
            not_deleted.push(name.to_string());
        }
    }
    let current_healthy = pods
        .iter()
        .filter(|p| !terminating(p))
        .filter(|p| !disrupted_pods.contains_key(s(p, "/metadata/name")))
        .filter(|p| pod_ready(p))
        .count() as i64;
    // A budget that expects no pods allows nothing, so pods that appear before the next
    // sync are safe.
    let mut disruptions_allowed = current_healthy - desired_healthy;
    if expected_pods <= 0 || disruptions_allowed <= 0 {
        disruptions_allowed = 0;
    }
    Ok(Budget {
        current_healthy,
        desired_healthy,
        expected_pods,
        disruptions_allowed,
        disrupted_pods,
        unmanaged,
        not_deleted,
    })
}

/// apimeta.SetStatusCondition for the DisruptionAllowed condition of `status`.
fn set_condition(status: &mut Value, reason: Reason, message: &str) {
    let observed = int(status, "/observedGeneration");
    let want = if reason == Reason::SufficientPods {
        "True"
    } else {
        "False"
    };
    let mut conds = status["conditions"].as_array().cloned().unwrap_or_default();
    let transition = match conds.iter().find(|c| c["type"] == DISRUPTION_ALLOWED) {
        Some(c) if c["status"] == want => c["lastTransitionTime"].clone(),
        _ => json!(now_rfc3339()),
    };
    conds.retain(|c| c["type"] != DISRUPTION_ALLOWED);
    conds.push(json!({
        "type": DISRUPTION_ALLOWED,
        "status": want,
        "reason": reason.as_str(),
        "message": message,
        "observedGeneration": observed,
        "lastTransitionTime": transition,
    }));
    status["conditions"] = json!(conds);
}

/// upstream's UpdateDisruptionAllowedCondition.
fn update_allowed_condition(status: &mut Value) {
    let reason = if int(status, "/disruptionsAllowed") > 0 {
        Reason::SufficientPods
    } else {
        Reason::InsufficientPods
    };
    set_condition(status, reason, "");
}

/// The status `pdb` gets for `b` (its other conditions kept).
pub(crate) fn budget_status(pdb: &Value, b: &Budget) -> Value {
    let mut status = json!({
        "currentHealthy": b.current_healthy,
        "desiredHealthy": b.desired_healthy,
        "expectedPods": b.expected_pods,
        "disruptionsAllowed": b.disruptions_allowed,
        "observedGeneration": int(pdb, "/metadata/generation"),
        "conditions": pdb.pointer("/status/conditions").cloned().unwrap_or(json!([])),
    });
    if !b.disrupted_pods.is_empty() {
        status["disruptedPods"] = Value::Object(b.disrupted_pods.clone());
    }
    update_allowed_condition(&mut status);
    status
}

/// upstream's failSafe: nothing may be disrupted while the budget cannot be computed.
pub(crate) fn fail_safe_status(pdb: &Value, err: &str) -> Value {
    let mut status = pdb.get("status").cloned().unwrap_or(json!({}));
    if !status.is_object() {
        status = json!({});
    }
    status["disruptionsAllowed"] = json!(0);
    set_condition(&mut status, Reason::SyncFailed, err);
    status
}

fn too_many_requests(retry_after: u32, cause: String) -> Value {
    let mut st = nodus_k8s::status::too_many_requests(VIOLATION, retry_after);
    st["details"]["causes"] = json!([{"reason": "DisruptionBudget", "message": cause}]);
    st
}

/// The eviction subresource's half (upstream's checkAndDecrement): refuses with
/// upstream's status when `pdb` allows no disruption now, otherwise spends one and
/// records `pod` in `disruptedPods` so the controller does not count it meanwhile.
pub(crate) fn check_and_decrement(pdb: &mut Value, pod: &str, now: Timestamp) -> Result<(), Value> {
    let name = s(pdb, "/metadata/name").to_string();
    if int(pdb, "/status/observedGeneration") < int(pdb, "/metadata/generation") {
        return Err(too_many_requests(
            10,
            format!("The disruption budget {name} is still being processed by the server."),
        ));
    }
    let allowed = int(pdb, "/status/disruptionsAllowed");
    let forbidden = |cause: &str| {
        nodus_k8s::status::forbidden_with("policy", "poddisruptionbudget", &name, cause)
    };
    if allowed < 0 {
        return Err(forbidden("pdb disruptions allowed is negative"));
    }
    let disrupted = pdb
        .pointer("/status/disruptedPods")
        .and_then(Value::as_object)
        .map_or(0, Map::len);
    if disrupted > MAX_DISRUPTED_POD_SIZE {
        return Err(forbidden(
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        ));
    }
    if allowed == 0 {
        return Err(too_many_requests(
            0,
            format!(
                "The disruption budget {name} needs {} healthy pods and has {} currently",
                int(pdb, "/status/desiredHealthy"),
                int(pdb, "/status/currentHealthy")
            ),
        ));
    }
    let status = &mut pdb["status"];
    status["disruptionsAllowed"] = json!(allowed - 1);
    if allowed - 1 == 0 {
        update_allowed_condition(status);
    }
    if !status["disruptedPods"].is_object() {
        status["disruptedPods"] = json!({});
    }
    status["disruptedPods"][pod] = json!(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    Ok(())
}

/// Whether the eviction of a pod that is not Ready may skip the budget (upstream: the
/// AlwaysAllow policy, or IfHealthyBudget — the default — with a budget already met).
pub(crate) fn unhealthy_pod_may_go(pdb: &Value) -> bool {
    if s(pdb, "/spec/unhealthyPodEvictionPolicy") == "AlwaysAllow" {
        return true;
    }
    let desired = int(pdb, "/status/desiredHealthy");
    int(pdb, "/status/currentHealthy") >= desired && desired > 0
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// upstream's finders: ReplicationController, ReplicaSet (or the Deployment that controls
/// it), StatefulSet; the referenced object must carry the reference's uid.
fn find_scale(st: &ApiState, ns: &str, r: &Value) -> Option<(String, i64)> {
    let get = |group: &str, plural: &str, name: &str, uid: &str| -> Option<Arc<Value>> {
        let key = objects::key_of(group, plural, Some(ns), name);
        let obj = st.store.get(&key).ok()??.object;
        (s(&obj, "/metadata/uid") == uid).then_some(obj)
    };
    let replicas = |o: &Value| {
        o.pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)
    };
    let (kind, group, name, uid) = (
        s(r, "/kind"),
        group_of(s(r, "/apiVersion")),
        s(r, "/name"),
        s(r, "/uid"),
    );
    match (group, kind) {
        ("", "ReplicationController") => {
            let o = get("", "replicationcontrollers", name, uid)?;
            Some((uid.to_string(), replicas(&o)))
        }
        ("apps", "StatefulSet") => {
            let o = get("apps", "statefulsets", name, uid)?;
            Some((uid.to_string(), replicas(&o)))
        }
        ("apps", "ReplicaSet") => {
            let rs = get("apps", "replicasets", name, uid)?;
            match controller_of(&rs) {
                Some(d)
                    if s(d, "/kind") == "Deployment" && group_of(s(d, "/apiVersion")) == "apps" =>
                {
                    let dep = get("apps", "deployments", s(d, "/name"), s(d, "/uid"))?;
                    Some((s(d, "/uid").to_string(), replicas(&dep)))
                }
                _ => Some((uid.to_string(), replicas(&rs))),
            }
        }
        _ => None,
    }
}

pub async fn run(st: Arc<ApiState>) {
    let Some(pdb_t) = objects::target("policy", "poddisruptionbudgets", None) else {
        return;
    };
    let mut pdbs = Cache::new(st.store.clone(), &path::prefix(pdb_t.info, None));
    let mut pods = Cache::new(st.store.clone(), "/core/pods/");
    let recorder = Recorder::new("controllermanager");
    // Level-triggered: every change, and once a second for evictions that time out.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = pdbs.next() => {}
            _ = pods.next() => {}
        }
        while pdbs.try_next().is_some() {}
        while pods.try_next().is_some() {}
        let now = now_ts();
        for (key, pdb) in &pdbs.objects {
            let ns = s(pdb, "/metadata/namespace");
            let selector = pdb.pointer("/spec/selector");
            let selected: Vec<&Value> = pods
                .objects
                .values()
                .filter(|p| s(p, "/metadata/namespace") == ns)
                .filter(|p| selector_matches(selector, &labels_of(p)))
                .map(|p| p.as_ref())
                .collect();
            let result = compute(pdb, &selected, &|ns, r| find_scale(&st, ns, r), now);
            let status = match &result {
                Ok(b) => budget_status(pdb, b),
                Err(e) => fail_safe_status(pdb, e),
            };
            if pdb.get("status") == Some(&status) {
                continue;
            }
            // Written only over the version it was computed from: an eviction recorded
            // meanwhile is seen on the next round, never overwritten.
            let rv = s(pdb, "/metadata/resourceVersion").to_string();
            let written = objects::modify(&st, key, &mut |cur| {
                if s(cur, "/metadata/resourceVersion") != rv {
                    return false;
                }
                cur["status"] = status.clone();
                true
            });
            match written {
                Ok(Some(_)) => {}
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(pdb = %key, error = %e, "disruption: status update failed");
                    continue;
                }
            }
            tracing::debug!(pdb = %key, status = %status, "disruption: status updated");
            match &result {
                Err(e) => recorder.record(
                    &st,
                    pdb,
                    "Warning",
                    "CalculateExpectedPodCountFailed",
                    &format!("Failed to calculate the number of expected pods: {e}"),
                ),
                Ok(b) => {
                    if selected.is_empty() {
                        recorder.record(&st, pdb, "Normal", "NoPods", "No matching pods found");
                    }
                    if !b.unmanaged.is_empty() {
                        recorder.record(
                            &st,
                            pdb,
                            "Warning",
                            "UnmanagedPods",
                            &format!(
                                "Pods selected by this PodDisruptionBudget (selector: {}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value.",
                                selector.map(Value::to_string).unwrap_or_default()
                            ),
                        );
                    }
                    for name in &b.not_deleted {
                        if let Some(p) = selected.iter().find(|p| s(p, "/metadata/name") == name) {
                            recorder.record(
                                &st,
                                p,
                                "Warning",
                                "NotDeleted",
                                &format!(
                                    "Pod was expected by PDB {ns}/{} to be deleted but it wasn't",
                                    s(pdb, "/metadata/name")
                                ),
                            );
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2026-01-01T00:10:00Z";

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    /// A pod named `name`: Ready or not, terminating or not, controlled by `owner` (kind,
    /// uid) when given.
    fn pod(name: &str, ready: bool, deleting: bool, owner: Option<(&str, &str)>) -> Value {
        let mut p = json!({"metadata": {"name": name, "namespace": "ns"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        if deleting {
            p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:09:00Z");
        }
        if let Some((kind, uid)) = owner {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind,
                "name": uid, "uid": uid, "controller": true}]);
        }
        p
    }

    fn pdb(spec: Value, disrupted: Value) -> Value {
        json!({"metadata": {"name": "b", "namespace": "ns", "generation": 2},
            "spec": spec, "status": {"disruptedPods": disrupted}})
    }

    /// rs1 has 3 replicas, rs2 (of a Deployment with 4) is counted as the Deployment.
    fn scales(_ns: &str, r: &Value) -> Option<(String, i64)> {
        match r["uid"].as_str()? {
            "rs1" => Some(("rs1".into(), 3)),
            "rs2" | "rs2b" => Some(("dep".into(), 4)),
            _ => None,
        }
    }

    /// (what, spec, disruptedPods, pods, (expected, desired, current, allowed)).
    type Case<'a> = (&'a str, Value, Value, &'a Vec<Value>, Row);
    type Row = (i64, i64, i64, i64);

    fn row(b: &Budget) -> Row {
        (
            b.expected_pods,
            b.desired_healthy,
            b.current_healthy,
            b.disruptions_allowed,
        )
    }

    #[test]
    fn budgets_are_computed_as_upstream() {
        let rs = Some(("ReplicaSet", "rs1"));
        let three_ready = vec![
            pod("a", true, false, rs),
            pod("b", true, false, rs),
            pod("c", true, false, rs),
        ];
        let two_of_three = vec![
            pod("a", true, false, rs),
            pod("b", true, false, rs),
            pod("c", false, false, rs),
        ];
        let recent = json!({"a": "2026-01-01T00:09:00Z"});
        let expired = json!({"a": "2026-01-01T00:07:00Z"});
        // (what, spec, disruptedPods, pods, (expected, desired, current, allowed))
        let cases: Vec<Case> = vec![
            (
                "integer minAvailable counts the pods",
                json!({"minAvailable": 2}),
                json!(null),
                &three_ready,
                (3, 2, 3, 1),
            ),
            (
                "minAvailable equal to the healthy pods",
                json!({"minAvailable": 3}),
                json!(null),
                &three_ready,
                (3, 3, 3, 0),
            ),
            (
                "an unready pod is not healthy",
                json!({"minAvailable": 2}),
                json!(null),
                &two_of_three,
                (3, 2, 2, 0),
            ),
            (
                "percentage minAvailable rounds up against the scale",
                json!({"minAvailable": "50%"}),
                json!(null),
                &three_ready,
                (3, 2, 3, 1),
            ),
            (
                "integer maxUnavailable",
                json!({"maxUnavailable": 1}),
                json!(null),
                &three_ready,
                (3, 2, 3, 1),
            ),
            (
                "percentage maxUnavailable rounds up",
                json!({"maxUnavailable": "34%"}),
                json!(null),
                &three_ready,
                (3, 1, 3, 2),
            ),
            (
                "maxUnavailable above the scale",
                json!({"maxUnavailable": 5}),
                json!(null),
                &three_ready,
                (3, 0, 3, 3),
            ),
            (
                "an eviction in flight is not healthy",
                json!({"minAvailable": 1}),
                recent.clone(),
                &three_ready,
                (3, 1, 2, 1),
            ),
            (
                "an eviction past two minutes counts again",
                json!({"minAvailable": 1}),
                expired,
                &three_ready,
                (3, 1, 3, 2),
            ),
            (
                "neither field: nothing allowed",
                json!({}),
                json!(null),
                &three_ready,
                (0, 0, 3, 0),
            ),
        ];
        for (what, spec, disrupted, pods, want) in cases {
            let p = pdb(spec, disrupted);
            let refs: Vec<&Value> = pods.iter().collect();
            let b = compute(&p, &refs, &scales, now()).unwrap();
            assert_eq!(row(&b), want, "{what}");
        }
    }

    #[test]
    fn no_pods_expected_allows_nothing() {
        let p = pdb(json!({"minAvailable": 0}), json!(null));
        let b = compute(&p, &[], &scales, now()).unwrap();
        assert_eq!(row(&b), (0, 0, 0, 0));
    }

    #[test]
    fn a_deployments_replica_sets_count_once_as_the_deployment() {
        let pods = [
            pod("a", true, false, Some(("ReplicaSet", "rs2"))),
            pod("b", true, false, Some(("ReplicaSet", "rs2b"))),
            pod("c", true, false, Some(("ReplicaSet", "rs2"))),
        ];
        let refs: Vec<&Value> = pods.iter().collect();
        let p = pdb(json!({"maxUnavailable": "25%"}), json!(null));
        let b = compute(&p, &refs, &scales, now()).unwrap();
        // Scale 4 (the Deployment's), one unavailable allowed: 3 desired, 3 healthy.
        assert_eq!(row(&b), (4, 3, 3, 0));
    }

    #[test]
    fn disrupted_pods_are_dropped_when_terminating_gone_or_expired() {
        let rs = Some(("ReplicaSet", "rs1"));
        let pods = [
            pod("a", true, true, rs),
            pod("b", true, false, rs),
            pod("c", true, false, rs),
        ];
        let refs: Vec<&Value> = pods.iter().collect();
        let p = pdb(
            json!({"minAvailable": 1}),
            json!({"a": "2026-01-01T00:09:30Z", "b": "2026-01-01T00:09:30Z",
                "c": "2026-01-01T00:01:00Z", "gone": "2026-01-01T00:09:30Z"}),
        );
        let b = compute(&p, &refs, &scales, now()).unwrap();
        let kept: Vec<&String> = b.disrupted_pods.keys().collect();
        assert_eq!(kept, vec!["b"]);
        assert_eq!(b.not_deleted, vec!["c".to_string()]);
        // a is terminating, b is being evicted: c alone is healthy.
        assert_eq!(row(&b), (3, 1, 1, 0));
    }

    #[test]
    fn percentages_need_controllers() {
        let bare = [
            pod("a", true, false, None),
            pod("b", true, false, Some(("ReplicaSet", "rs1"))),
        ];
        let refs: Vec<&Value> = bare.iter().collect();
        // Unmanaged pods are reported, not counted.
        let b = compute(
            &pdb(json!({"minAvailable": "50%"}), json!(null)),
            &refs,
            &scales,
            now(),
        )
        .unwrap();
        assert_eq!(b.unmanaged, vec!["a".to_string()]);
        assert_eq!(row(&b), (3, 2, 2, 0));
        // An integer minAvailable needs none.
        let b = compute(
            &pdb(json!({"minAvailable": 1}), json!(null)),
            &refs,
            &scales,
            now(),
        )
        .unwrap();
        assert_eq!(row(&b), (2, 1, 2, 1));
        // A controller that cannot be found fails the sync.
        let lost = [pod("a", true, false, Some(("ReplicaSet", "nope")))];
        let refs: Vec<&Value> = lost.iter().collect();
        let e = compute(
            &pdb(json!({"maxUnavailable": 1}), json!(null)),
            &refs,
            &scales,
            now(),
        )
        .unwrap_err();
        assert_eq!(e, "found no controllers for pod \"a\"");
    }

    fn condition(status: &Value) -> (String, String, String) {
        let c = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "DisruptionAllowed")
            .unwrap();
        (
            c["status"].as_str().unwrap().into(),
            c["reason"].as_str().unwrap().into(),
            c["message"].as_str().unwrap().into(),
        )
    }

    #[test]
    fn status_carries_the_condition_and_generation() {
        let p = pdb(json!({"minAvailable": 1}), json!(null));
        let pods = [pod("a", true, false, None), pod("b", true, false, None)];
        let refs: Vec<&Value> = pods.iter().collect();
        let st = budget_status(&p, &compute(&p, &refs, &scales, now()).unwrap());
        assert_eq!(st["observedGeneration"], 2);
        assert_eq!(st["disruptionsAllowed"], 1);
        assert!(st.get("disruptedPods").is_none());
        assert_eq!(
            condition(&st),
            ("True".into(), "SufficientPods".into(), "".into())
        );
        assert_eq!(st["conditions"][0]["observedGeneration"], 2);
        let p2 = pdb(json!({"minAvailable": 2}), json!(null));
        let st2 = budget_status(&p2, &compute(&p2, &refs, &scales, now()).unwrap());
        assert_eq!(
            condition(&st2),
            ("False".into(), "InsufficientPods".into(), "".into())
        );
        let failed = fail_safe_status(&json!({"status": st}), "found no controllers for pod \"a\"");
        assert_eq!(failed["disruptionsAllowed"], 0);
        assert_eq!(
            condition(&failed),
            (
                "False".into(),
                "SyncFailed".into(),
                "found no controllers for pod \"a\"".into()
            )
        );
    }

    #[test]
    fn evictions_spend_the_budget_or_are_refused() {
        let mut p = json!({"metadata": {"name": "b", "generation": 1},
            "status": {"observedGeneration": 1, "disruptionsAllowed": 1, "desiredHealthy": 2, "currentHealthy": 3}});
        check_and_decrement(&mut p, "a", now()).unwrap();
        assert_eq!(p["status"]["disruptionsAllowed"], 0);
        assert_eq!(p["status"]["disruptedPods"]["a"], NOW);
        assert_eq!(condition(&p["status"]).1, "InsufficientPods");
        let refused = check_and_decrement(&mut p, "b", now()).unwrap_err();
        assert_eq!(refused["code"], 429);
        assert_eq!(refused["message"], VIOLATION);
        assert_eq!(
            refused["details"]["causes"][0],
            json!({"reason": "DisruptionBudget", "message": "The disruption budget b needs 2 healthy pods and has 3 currently"})
        );
        // A budget the controller has not seen since its last change: retry later.
        let mut stale = json!({"metadata": {"name": "b", "generation": 2},
            "status": {"observedGeneration": 1, "disruptionsAllowed": 5}});
        let e = check_and_decrement(&mut stale, "a", now()).unwrap_err();
        assert_eq!(e["details"]["retryAfterSeconds"], 10);
        assert_eq!(
            e["details"]["causes"][0]["message"],
            "The disruption budget b is still being processed by the server."
        );
        let mut negative = json!({"metadata": {"name": "b"}, "status": {"disruptionsAllowed": -1}});
        let e = check_and_decrement(&mut negative, "a", now()).unwrap_err();
        assert_eq!(e["code"], 403);
        assert_eq!(
            e["message"],
            "poddisruptionbudget.policy \"b\" is forbidden: pdb disruptions allowed is negative"
        );
    }

    #[test]
    fn unhealthy_pods_go_as_the_policy_says() {
        let p = |policy: Option<&str>, current: i64, desired: i64| {
            let mut v = json!({"spec": {}, "status": {"currentHealthy": current, "desiredHealthy": desired}});
            if let Some(pol) = policy {
                v["spec"]["unhealthyPodEvictionPolicy"] = json!(pol);
            }
            v
        };
        for (policy, current, desired, want) in [
            (None, 2, 2, true),
            (Some("IfHealthyBudget"), 2, 2, true),
            (Some("IfHealthyBudget"), 1, 2, false),
            (None, 0, 0, false),
            (Some("AlwaysAllow"), 0, 2, true),
        ] {
            assert_eq!(
                unhealthy_pod_may_go(&p(policy, current, desired)),
                want,
                "{policy:?} {current}/{desired}"
            );
        }
    }
}
