//! Taint-based eviction (upstream's taint-eviction-controller): a pod on a node with a
//! NoExecute taint it does not tolerate is deleted at once; one that tolerates it for
//! `tolerationSeconds` is deleted that long after the taint was added; one that tolerates
//! it without a limit stays. Before deleting, the pod gets the `DisruptionTarget`
//! condition and a `TaintManagerEviction` event, as upstream.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Taint, Toleration};
use serde_json::{Value, json};

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::rest::now_rfc3339;
use crate::apiserver::state::ApiState;
use crate::controllers::cache::Cache;
use crate::controllers::events::Recorder;
use crate::controllers::objects;

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// Seconds from now until the pod must go: `Some(0)` now, `None` never.
pub fn eviction_delay(
    taints: &[Taint],
    tolerations: &[Toleration],
    now: k8s_openapi::jiff::Timestamp,
) -> Option<i64> {
    let mut soonest: Option<i64> = None;
    for t in taints.iter().filter(|t| t.effect == "NoExecute") {
        let remaining = match nodus_k8s::scheduling::toleration_time(t, tolerations) {
            None => 0,
            Some(None) => continue,
            Some(Some(secs)) => {
                let added = t.time_added.as_ref().map(|x| x.0).unwrap_or(now);
                let elapsed = now.duration_since(added).as_secs();
                (secs - elapsed).max(0)
            }
        };
        soonest = Some(soonest.map_or(remaining, |x| x.min(remaining)));
    }
    soonest
}

fn mark_disruption(p: &mut Value) -> bool {
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
        json!({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
        "message": "Taint manager: deleting due to NoExecute taint", "lastProbeTime": null,
        "lastTransitionTime": now_rfc3339()}),
    );
    p["status"]["conditions"] = json!(conds);
    true
}

pub async fn run(st: Arc<ApiState>) {
    let mut nodes = Cache::new(st.store.clone(), "/core/nodes/");
    let mut pods = Cache::new(st.store.clone(), "/core/pods/");
    let recorder = Recorder::new("taint-eviction-controller");
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let Some(pods_target) = objects::target("", "pods", None) else {
        return;
    };
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = nodes.next() => {}
            _ = pods.next() => {}
        }
        while nodes.try_next().is_some() {}
        while pods.try_next().is_some() {}
        // Nodes carrying NoExecute taints, by name.
        let mut tainted: HashMap<&str, Vec<Taint>> = HashMap::new();
        for n in nodes.objects.values() {
            let Some(ts) = n.pointer("/spec/taints").and_then(Value::as_array) else {
                continue;
            };
            let ts: Vec<Taint> = ts
                .iter()
                .filter(|t| t["effect"] == "NoExecute")
                .filter_map(|t| serde_json::from_value(t.clone()).ok())
                .collect();
            if !ts.is_empty() {
                tainted.insert(s(n, "/metadata/name"), ts);
            }
        }
        if tainted.is_empty() {
            continue;
        }
        let now = crate::apiserver::rest::now_ts();
        let mut evict: Vec<(String, Arc<Value>)> = Vec::new();
        for (key, p) in &pods.objects {
            let Some(taints) = tainted.get(s(p, "/spec/nodeName")) else {
                continue;
            };
            if p.pointer("/metadata/deletionTimestamp").is_some()
                || matches!(s(p, "/status/phase"), "Succeeded" | "Failed")
            {
                continue;
            }
            let tolerations: Vec<Toleration> = p
                .pointer("/spec/tolerations")
                .cloned()
                .and_then(|t| serde_json::from_value(t).ok())
                .unwrap_or_default();
            if eviction_delay(taints, &tolerations, now) == Some(0) {
                evict.push((key.clone(), p.clone()));
            }
        }
        for (key, p) in evict {
            let (ns, name) = (
                s(&p, "/metadata/namespace").to_string(),
                s(&p, "/metadata/name").to_string(),
            );
            tracing::info!(pod = %format!("{ns}/{name}"), node = %s(&p, "/spec/nodeName"), "taint-eviction: deleting pod");
            recorder.record(
                &st,
                &p,
                "Normal",
                "TaintManagerEviction",
                &format!("Marking for deletion Pod {ns}/{name}"),
            );
            let _ = objects::modify(&st, &key, &mut mark_disruption);
            let mut t = pods_target.clone();
            t.namespace = Some(ns.clone());
            if let Err(e) = delete_object(&st, &t, &name, &DeleteOptions::default()) {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e.0["message"], "taint-eviction: delete failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_counts_from_the_taint() {
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let taint: Taint = serde_json::from_value(json!({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"})).unwrap();
        let tol = |secs: Option<i64>| -> Toleration {
            serde_json::from_value(json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": secs})).unwrap()
        };
        assert_eq!(
            eviction_delay(std::slice::from_ref(&taint), &[], now),
            Some(0)
        );
        assert_eq!(
            eviction_delay(std::slice::from_ref(&taint), &[tol(Some(300))], now),
            Some(240)
        );
        assert_eq!(
            eviction_delay(std::slice::from_ref(&taint), &[tol(Some(30))], now),
            Some(0)
        );
        assert_eq!(
            eviction_delay(std::slice::from_ref(&taint), &[tol(None)], now),
            None
        );
    }
}
