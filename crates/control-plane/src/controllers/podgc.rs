//! The pod garbage collector's orphan pass (upstream's podgc `gcOrphaned`): a pod bound
//! to a node that no longer exists is force-deleted after a 40 s quarantine (the node may
//! just be re-registering), with the `DisruptionTarget` condition saying why. Nobody else
//! would ever finish such a pod: no kubelet is there to run its termination.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::state::ApiState;
use crate::controllers::cache::Cache;
use crate::controllers::controller_utils::{DisruptionReason, mark_disruption_target};
use crate::controllers::objects;

/// Upstream's gcCheckPeriod.
const PERIOD: Duration = Duration::from_secs(20);

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn mark(p: &mut Value) -> bool {
    if p.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "DisruptionTarget"))
    {
        return false;
    }
    mark_disruption_target(p, DisruptionReason::DeletionByPodGC);
    if !matches!(s(p, "/status/phase"), "Succeeded" | "Failed") {
        p["status"]["phase"] = json!("Failed");
    }
    true
}

pub async fn run(st: Arc<ApiState>, quarantine: Duration) {
    let mut nodes = Cache::new(st.store.clone(), "/core/nodes/");
    let mut pods = Cache::new(st.store.clone(), "/core/pods/");
    // Node names seen missing, and since when.
    let mut missing_since: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(PERIOD.min(quarantine));
    let Some(pods_target) = objects::target("", "pods", None) else {
        return;
    };
    loop {
        tick.tick().await;
        while nodes.try_next().is_some() {}
        while pods.try_next().is_some() {}
        let now = Instant::now();
        let mut orphans = Vec::new();
        let mut still_missing = HashMap::new();
        for (key, p) in &pods.objects {
            let node = s(p, "/spec/nodeName");
            if node.is_empty() || nodes.objects.contains_key(&format!("/core/nodes/{node}")) {
                continue;
            }
            let since = *missing_since.get(node).unwrap_or(&now);
            still_missing.insert(node.to_string(), since);
            if now.duration_since(since) >= quarantine {
                orphans.push((key.clone(), p.clone()));
            }
        }
        missing_since = still_missing;
        for (key, p) in orphans {
            let (ns, name) = (
                s(&p, "/metadata/namespace").to_string(),
                s(&p, "/metadata/name").to_string(),
            );
            tracing::info!(pod = %format!("{ns}/{name}"), node = %s(&p, "/spec/nodeName"), "podgc: deleting pod of a node that no longer exists");
            let _ = objects::modify(&st, &key, &mut mark);
            let mut t = pods_target.clone();
            t.namespace = Some(ns.clone());
            let opts = DeleteOptions {
                grace_period: Some(0),
                ..Default::default()
            };
            if let Err(e) = delete_object(&st, &t, &name, &opts) {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e.0["message"], "podgc: delete failed");
            }
        }
    }
}
