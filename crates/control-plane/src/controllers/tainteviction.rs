//! Taint-based eviction (upstream's taint-eviction-controller): a pod on a node with a
//! NoExecute taint it does not tolerate is deleted at once; one that tolerates it for
//! `tolerationSeconds` is deleted that long after this controller first saw it on the
//! tainted node (upstream's timed workers start when the pod or node update is handled,
//! not at the taint's `timeAdded`); one that tolerates it without a limit stays. Before
//! deleting, the pod gets the `DisruptionTarget` condition and a `TaintManagerEviction`
//! event, as upstream.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Taint, Toleration};
use serde_json::Value;

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::state::ApiState;
use crate::controllers::cache::Cache;
use crate::controllers::controller_utils::{DisruptionReason, mark_disruption_target};
use crate::controllers::events::Recorder;
use crate::controllers::objects;

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// How long a pod may stay on a node with `taints` (upstream's getMinTolerationTime over
/// the tolerations it uses): `Some(0)` not at all, `Some(s)` `s` seconds, `None` for ever.
pub fn toleration_limit(taints: &[Taint], tolerations: &[Toleration]) -> Option<i64> {
    let mut soonest: Option<i64> = None;
    for t in taints.iter().filter(|t| t.effect == "NoExecute") {
        let limit = match nodus_k8s::scheduling::toleration_time(t, tolerations) {
            None => 0,
            Some(None) => continue,
            Some(Some(secs)) => secs.max(0),
        };
        soonest = Some(soonest.map_or(limit, |x| x.min(limit)));
    }
    soonest
}

/// An eviction scheduled for a pod (upstream's TimedWorker), by pod key.
struct Scheduled {
    uid: String,
    fire_at: Instant,
}

pub async fn run(st: Arc<ApiState>) {
    let mut nodes = Cache::new(st.store.clone(), "/core/nodes/");
    let mut pods = Cache::new(st.store.clone(), "/core/pods/");
    let recorder = Recorder::new("taint-eviction-controller");
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut scheduled: HashMap<String, Scheduled> = HashMap::new();
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
            scheduled.clear();
            continue;
        }
        let now = Instant::now();
        let mut evict: Vec<(String, Arc<Value>)> = Vec::new();
        let mut timed: HashMap<String, Scheduled> = HashMap::new();
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
            let Some(limit) = toleration_limit(taints, &tolerations) else {
                continue;
            };
            let uid = s(p, "/metadata/uid");
            // A pod already counting down keeps its start; a new one starts now.
            let fire_at = match scheduled.remove(key) {
                Some(w) if w.uid == uid => w.fire_at,
                _ => now + Duration::from_secs(limit as u64),
            };
            if fire_at <= now {
                evict.push((key.clone(), p.clone()));
            } else {
                timed.insert(
                    key.clone(),
                    Scheduled {
                        uid: uid.to_string(),
                        fire_at,
                    },
                );
            }
        }
        // Pods no longer on a tainted node, or tolerating it now, lose their countdown.
        scheduled = timed;
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
            let _ = objects::modify(&st, &key, &mut |p| {
                mark_disruption_target(p, DisruptionReason::DeletionByTaintManager)
            });
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
    use serde_json::json;

    #[test]
    fn the_limit_is_the_shortest_toleration_used() {
        let taint = |key: &str| -> Taint {
            serde_json::from_value(
                json!({"key": key, "effect": "NoExecute", "timeAdded": "2020-01-01T00:00:00Z"}),
            )
            .unwrap()
        };
        let tol = |key: &str, secs: Option<i64>| -> Toleration {
            serde_json::from_value(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": secs})).unwrap()
        };
        let u = "node.kubernetes.io/unreachable";
        let n = "node.kubernetes.io/not-ready";
        let cases: Vec<(Vec<Taint>, Vec<Toleration>, Option<i64>)> = vec![
            // Not tolerated: at once.
            (vec![taint(u)], vec![], Some(0)),
            // The taint's timeAdded, years ago, does not shorten the toleration.
            (vec![taint(u)], vec![tol(u, Some(300))], Some(300)),
            (vec![taint(u)], vec![tol(u, None)], None),
            (vec![taint(u)], vec![tol(u, Some(-5))], Some(0)),
            // Two taints: the shortest limit; one tolerated for ever does not count.
            (
                vec![taint(u), taint(n)],
                vec![tol(u, None), tol(n, Some(30))],
                Some(30),
            ),
            (
                vec![taint(u), taint(n)],
                vec![tol(u, Some(10)), tol(n, Some(30))],
                Some(10),
            ),
            // One of two taints not tolerated: at once.
            (vec![taint(u), taint(n)], vec![tol(u, Some(10))], Some(0)),
        ];
        for (taints, tols, want) in cases {
            assert_eq!(
                toleration_limit(&taints, &tols),
                want,
                "{taints:?} {tols:?}"
            );
        }
    }
}
