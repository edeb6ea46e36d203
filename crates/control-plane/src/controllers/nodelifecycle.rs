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
    match ready_status(node) {
        "False" => out.push(NOT_READY),
        "True" => {}
        _ => out.push(UNREACHABLE),
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
