//! The node-lifecycle controller: notices when a kubelet stops phoning home and says so.
//!
//! Every `node-monitor-period` it compares, per node, the last time it *saw* a heartbeat
//! (a change of the node's Lease `renewTime` or of the Ready condition's
//! `lastHeartbeatTime`) against `node-monitor-grace-period` (50 s; `node-startup-grace-
//! period` for a node that never reported). Past it, every condition the kubelet owns
//! turns `Unknown` ("Kubelet stopped posting node status."). Taints follow the conditions:
//! NoSchedule ones for the scheduler (TaintNodesByCondition) and the NoExecute
//! `node.kubernetes.io/unreachable` / `not-ready` ones that drive taint-based eviction,
//! added at `node-eviction-rate` per second, and withheld when a whole zone is down (then
//! the problem is more likely the control plane's own connectivity, as upstream reasons).
//! When a node leaves Ready, the Ready condition of its pods turns False at once
//! (upstream's MarkPodsNotReady), so Services stop sending them traffic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use crate::apiserver::rest::now_rfc3339;
use crate::apiserver::state::ApiState;
use crate::controllers::ControllersConfig;
use crate::controllers::cache::Cache;
use crate::controllers::events::Recorder;
use crate::controllers::objects;

pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
const KUBELET_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];
/// Upstream's unhealthyZoneThreshold and largeClusterSizeThreshold.
const UNHEALTHY_ZONE_THRESHOLD: f64 = 0.55;
const LARGE_CLUSTER: usize = 50;

/// What was last seen of a node's heartbeats, and when (by this controller's clock).
struct Health {
    lease_renew: String,
    ready_heartbeat: String,
    probe: Instant,
    /// The node's Ready status as this controller last observed it.
    observed_ready: String,
    /// The node left Ready and its pods are still to be marked not ready (kept until a
    /// round succeeds, as upstream retries MarkPodsNotReady).
    mark_pods: bool,
}

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn condition<'a>(node: &'a Value, t: &str) -> Option<&'a Value> {
    node.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
}

fn ready_status(node: &Value) -> &str {
    condition(node, "Ready").map_or("Unknown", |c| s(c, "/status"))
}

/// The NoSchedule taints the node's conditions call for (upstream's nodeConditionToTaintKeyStatusMap).
fn condition_taints(node: &Value) -> Vec<&'static str> {
    let mut out = Vec::new();
    // Only a Ready condition that says False or Unknown taints, as upstream's map: a node
    // that never posted one (just registered, or made by hand) is left alone until the
    // startup grace period marks it Unknown.
    match condition(node, "Ready").map(|c| s(c, "/status")) {
        Some("False") => out.push(NOT_READY),
        Some("Unknown") => out.push(UNREACHABLE),
        _ => {}
    }
    for (cond, taint) in [
        ("MemoryPressure", "node.kubernetes.io/memory-pressure"),
        ("DiskPressure", "node.kubernetes.io/disk-pressure"),
        ("PIDPressure", "node.kubernetes.io/pid-pressure"),
        (
            "NetworkUnavailable",
            "node.kubernetes.io/network-unavailable",
        ),
    ] {
        if condition(node, cond).is_some_and(|c| c["status"] == "True") {
            out.push(taint);
        }
    }
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        out.push("node.kubernetes.io/unschedulable");
    }
    out
}

/// Rewrites the node's taints: the controller-owned NoSchedule set as `want_noschedule`,
/// the NoExecute unreachable/not-ready pair as `want_noexecute` (None: leave as is).
fn set_taints(
    node: &mut Value,
    want_noschedule: &[&str],
    want_noexecute: Option<Option<&str>>,
) -> bool {
    const OWNED_NOSCHEDULE: [&str; 7] = [
        NOT_READY,
        UNREACHABLE,
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/network-unavailable",
        "node.kubernetes.io/unschedulable",
    ];
    let taints = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let now = now_rfc3339();
    let mut out: Vec<Value> = Vec::new();
    for t in &taints {
        let key = s(t, "/key");
        let effect = s(t, "/effect");
        let owned_ns = effect == "NoSchedule" && OWNED_NOSCHEDULE.contains(&key);
        let owned_ne = effect == "NoExecute" && (key == UNREACHABLE || key == NOT_READY);
        if owned_ns && !want_noschedule.contains(&key) {
            continue;
        }
        if owned_ne
            && let Some(want) = want_noexecute
            && want != Some(key)
        {
            continue;
        }
        out.push(t.clone());
    }
    for key in want_noschedule {
        if !out
            .iter()
            .any(|t| s(t, "/key") == *key && s(t, "/effect") == "NoSchedule")
        {
            out.push(json!({"key": key, "effect": "NoSchedule", "timeAdded": now}));
        }
    }
    if let Some(Some(key)) = want_noexecute
        && !out
            .iter()
            .any(|t| s(t, "/key") == key && s(t, "/effect") == "NoExecute")
    {
        out.push(json!({"key": key, "effect": "NoExecute", "timeAdded": now}));
    }
    if out == taints {
        return false;
    }
    if out.is_empty() {
        if let Some(spec) = node.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("taints");
        }
    } else {
        node["spec"]["taints"] = json!(out);
    }
    true
}

/// Marks every kubelet-owned condition Unknown; true when anything changed.
fn mark_unknown(node: &mut Value) -> bool {
    let now = now_rfc3339();
    let mut conds = node["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut changed = false;
    for t in KUBELET_CONDITIONS {
        match conds.iter_mut().find(|c| c["type"] == t) {
            Some(c) if c["status"] != "Unknown" => {
                c["status"] = json!("Unknown");
                c["reason"] = json!("NodeStatusUnknown");
                c["message"] = json!("Kubelet stopped posting node status.");
                c["lastTransitionTime"] = json!(now);
                changed = true;
            }
            Some(_) => {}
            None => {
                conds.push(
                    json!({"type": t, "status": "Unknown", "reason": "NodeStatusNeverUpdated",
                    "message": "Kubelet never posted node status.", "lastHeartbeatTime": null,
                    "lastTransitionTime": now}),
                );
                changed = true;
            }
        }
    }
    if changed {
        node["status"]["conditions"] = json!(conds);
    }
    changed
}

/// Sets the Ready condition of the pod False (reason and message left as the kubelet
/// wrote them, as upstream); true when it changed.
fn set_pod_not_ready(pod: &mut Value) -> bool {
    let Some(conds) = pod
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    else {
        return false;
    };
    let Some(c) = conds.iter_mut().find(|c| c["type"] == "Ready") else {
        return false;
    };
    if c["status"] == "False" {
        return false;
    }
    c["status"] = json!("False");
    c["lastTransitionTime"] = json!(now_rfc3339());
    true
}

/// upstream's MarkPodsNotReady for the pods bound to `node`: each one's Ready condition
/// turns False, with a `NodeNotReady` warning on the pod. False when a write failed (the
/// next round tries again).
fn mark_pods_not_ready(st: &ApiState, pods: &Cache, node: &str, recorder: &Recorder) -> bool {
    let mut ok = true;
    for (key, p) in &pods.objects {
        if s(p, "/spec/nodeName") != node {
            continue;
        }
        match objects::modify(st, key, &mut set_pod_not_ready) {
            Ok(Some(updated)) => {
                tracing::info!(pod = %format!("{}/{}", s(p, "/metadata/namespace"), s(p, "/metadata/name")), node, "node-lifecycle: pod ready status set to false");
                recorder.record(
                    st,
                    &updated.object,
                    "Warning",
                    "NodeNotReady",
                    "Node is not ready",
                );
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(pod = %key, error = %e, "node-lifecycle: cannot mark pod not ready");
                ok = false;
            }
        }
    }
    ok
}

fn zone_of(node: &Value) -> String {
    let l = |k: &str| {
        node.pointer(&format!("/metadata/labels/{}", k.replace('/', "~1")))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    l("topology.kubernetes.io/zone")
        .or_else(|| l("failure-domain.beta.kubernetes.io/zone"))
        .unwrap_or_default()
}

pub async fn run(st: Arc<ApiState>, cfg: ControllersConfig) {
    let mut nodes = Cache::new(st.store.clone(), "/core/nodes/");
    let mut leases = Cache::new(
        st.store.clone(),
        "/coordination.k8s.io/leases/kube-node-lease/",
    );
    let mut pods = Cache::new(st.store.clone(), "/core/pods/");
    let recorder = Recorder::new("node-controller");
    let mut health: HashMap<String, Health> = HashMap::new();
    let mut tick = tokio::time::interval(cfg.node_monitor_period);
    let started = Instant::now();
    // Token bucket for NoExecute tainting (node-eviction-rate, burst 1).
    let mut tokens = 1.0f64;
    let mut last_refill = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = nodes.next() => continue,
            _ = leases.next() => continue,
            _ = pods.next() => continue,
        }
        while nodes.try_next().is_some() {}
        while leases.try_next().is_some() {}
        let now = Instant::now();
        tokens = (tokens + now.duration_since(last_refill).as_secs_f64() * cfg.node_eviction_rate)
            .min(1.0);
        last_refill = now;

        // 1. Observe heartbeats.
        let mut views: Vec<(String, String, Arc<Value>)> = Vec::new();
        for (key, node) in &nodes.objects {
            let name = s(node, "/metadata/name").to_string();
            let lease = leases
                .get(&format!(
                    "/coordination.k8s.io/leases/kube-node-lease/{name}"
                ))
                .map(|l| s(l, "/spec/renewTime").to_string())
                .unwrap_or_default();
            let hb = condition(node, "Ready")
                .map(|c| s(c, "/lastHeartbeatTime").to_string())
                .unwrap_or_default();
            let h = health.entry(name.clone()).or_insert_with(|| Health {
                lease_renew: lease.clone(),
                ready_heartbeat: hb.clone(),
                // A node first seen now (or at controller start) gets a full grace period.
                probe: now,
                observed_ready: ready_status(node).to_string(),
                mark_pods: false,
            });
            if h.lease_renew != lease || h.ready_heartbeat != hb {
                h.lease_renew = lease;
                h.ready_heartbeat = hb;
                h.probe = now;
            }
            views.push((key.clone(), name, node.clone()));
        }
        health.retain(|n, _| views.iter().any(|(_, name, _)| name == n));

        // 2. Conditions Unknown past the grace period.
        for (key, name, node) in &views {
            let Some(h) = health.get(name) else { continue };
            let never = condition(node, "Ready").is_none();
            let grace = if never {
                cfg.node_startup_grace_period
            } else {
                cfg.node_monitor_grace_period
            };
            let since = now.duration_since(h.probe).min(now.duration_since(started));
            if since <= grace {
                continue;
            }
            let was_ready = ready_status(node) == "True";
            match objects::modify(&st, key, &mut mark_unknown) {
                Ok(Some(updated)) => {
                    tracing::info!(node = %name, "node-lifecycle: kubelet stopped posting node status; conditions Unknown");
                    if was_ready {
                        recorder.record(
                            &st,
                            &updated.object,
                            "Normal",
                            "NodeNotReady",
                            &format!("Node {name} status is now: NodeNotReady"),
                        );
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "node-lifecycle: status update failed")
                }
            }
        }

        // 3. Zone states from the freshest view.
        let fresh: Vec<Arc<Value>> = views
            .iter()
            .map(|(k, _, v)| {
                st.store
                    .get(k)
                    .ok()
                    .flatten()
                    .map(|s| s.object)
                    .unwrap_or_else(|| v.clone())
            })
            .collect();
        // Pods of a node that just left Ready stop being ready (upstream's
        // MarkPodsNotReady), so their endpoints stop receiving traffic now rather than
        // when the pods are evicted.
        while pods.try_next().is_some() {}
        for ((_, name, _), node) in views.iter().zip(fresh.iter()) {
            let Some(h) = health.get_mut(name) else {
                continue;
            };
            let ready = ready_status(node);
            if ready == "True" {
                h.mark_pods = false;
            } else if h.observed_ready == "True" {
                h.mark_pods = true;
            }
            h.observed_ready = ready.to_string();
            if h.mark_pods && mark_pods_not_ready(&st, &pods, name, &recorder) {
                h.mark_pods = false;
            }
        }

        let mut zones: HashMap<String, (usize, usize)> = HashMap::new();
        for n in &fresh {
            let e = zones.entry(zone_of(n)).or_default();
            e.0 += 1;
            if ready_status(n) != "True" {
                e.1 += 1;
            }
        }
        let state = |z: &str| -> &'static str {
            let (total, bad) = zones.get(z).copied().unwrap_or((0, 0));
            if total > 0 && bad == total {
                "FullDisruption"
            } else if bad > 2 && bad as f64 / total as f64 >= UNHEALTHY_ZONE_THRESHOLD {
                "PartialDisruption"
            } else {
                "Normal"
            }
        };
        let all_down = !zones.is_empty() && zones.keys().all(|z| state(z) == "FullDisruption");

        // 4. Taints.
        for ((key, name, _), node) in views.iter().zip(fresh.iter()) {
            let noschedule = condition_taints(node);
            let ready = ready_status(node);
            let zone_state = state(&zone_of(node));
            let want_noexecute: Option<Option<&str>> = if ready == "True" || all_down {
                Some(None)
            } else if zone_state == "Normal"
                || (zone_state == "PartialDisruption" && zones.len() > LARGE_CLUSTER)
            {
                let want = if ready == "False" {
                    NOT_READY
                } else {
                    UNREACHABLE
                };
                let has = node
                    .pointer("/spec/taints")
                    .and_then(Value::as_array)
                    .is_some_and(|ts| {
                        ts.iter()
                            .any(|t| s(t, "/key") == want && s(t, "/effect") == "NoExecute")
                    });
                if has {
                    Some(Some(want))
                } else if tokens >= 1.0 {
                    tokens -= 1.0;
                    Some(Some(want))
                } else {
                    None
                }
            } else {
                None
            };
            match objects::modify(&st, key, &mut |n| {
                set_taints(n, &noschedule, want_noexecute)
            }) {
                Ok(Some(_)) => {
                    tracing::info!(node = %name, ready, zone_state, "node-lifecycle: taints updated")
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "node-lifecycle: taint update failed")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_false_or_unknown_ready_condition_taints() {
        let ready =
            |status: &str| json!({"status": {"conditions": [{"type": "Ready", "status": status}]}});
        assert_eq!(
            condition_taints(&json!({"metadata": {"name": "bare"}})),
            Vec::<&str>::new()
        );
        assert_eq!(condition_taints(&ready("True")), Vec::<&str>::new());
        assert_eq!(condition_taints(&ready("False")), [NOT_READY]);
        assert_eq!(condition_taints(&ready("Unknown")), [UNREACHABLE]);
        assert_eq!(condition_taints(&ready("garbage")), Vec::<&str>::new());
    }

    #[test]
    fn taints_follow_conditions_and_keep_foreign_ones() {
        let mut n = json!({"spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
        let ns = condition_taints(&n);
        assert_eq!(ns, vec![UNREACHABLE]);
        assert!(set_taints(&mut n, &ns, Some(Some(UNREACHABLE))));
        let keys: Vec<(String, String)> = n["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (s(t, "/key").to_string(), s(t, "/effect").to_string()))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("dedicated".into(), "NoSchedule".into()),
                (UNREACHABLE.into(), "NoSchedule".into()),
                (UNREACHABLE.into(), "NoExecute".into()),
            ]
        );
        // Nothing to change the second time.
        assert!(!set_taints(&mut n, &ns, Some(Some(UNREACHABLE))));
        // Ready again: the controller's taints go, the foreign one stays.
        assert!(set_taints(&mut n, &[], Some(None)));
        assert_eq!(n["spec"]["taints"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_pod_is_marked_not_ready_once_keeping_the_kubelets_reason() {
        let mut p = json!({"status": {"conditions": [
            {"type": "ContainersReady", "status": "True"},
            {"type": "Ready", "status": "True", "reason": "r", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}});
        assert!(set_pod_not_ready(&mut p));
        let c = &p["status"]["conditions"];
        assert_eq!(c[1]["status"], "False");
        assert_eq!(c[1]["reason"], "r");
        assert_ne!(c[1]["lastTransitionTime"], "2020-01-01T00:00:00Z");
        // ContainersReady is the kubelet's alone.
        assert_eq!(c[0]["status"], "True");
        assert!(!set_pod_not_ready(&mut p));
        // A pod without a Ready condition (never reported) is left alone.
        assert!(!set_pod_not_ready(&mut json!({"status": {}})));
    }

    #[test]
    fn unknown_conditions_say_why() {
        let mut n = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}});
        assert!(mark_unknown(&mut n));
        let ready = condition(&n, "Ready").unwrap();
        assert_eq!(ready["status"], "Unknown");
        assert_eq!(ready["reason"], "NodeStatusUnknown");
        assert_eq!(ready["message"], "Kubelet stopped posting node status.");
        let mem = condition(&n, "MemoryPressure").unwrap();
        assert_eq!(mem["reason"], "NodeStatusNeverUpdated");
        assert!(!mark_unknown(&mut n));
    }
}
