//! The status manager's API half (upstream's status_manager.go syncPod/syncBatch): sends
//! every pod's latest status to the API server and finishes graceful deletions.
//!
//! - A pod's status is sent as a JSON patch of `pods/status` computed against the status
//!   the server last showed for it, whose first operation tests the pod's uid, so a pod
//!   recreated under the same name is never written to. Only the newest status of a pod is
//!   sent (changes between two rounds coalesce), and a status that was sent is not sent
//!   again until it changes; a failed send is retried on the next round, so the latest
//!   status reaches the server once it is back.
//! - Conditions other components own (PodScheduled, DisruptionTarget, …) are kept.
//! - A terminal phase on the server is never turned back into a running one.
//! - Static pods have no API object of their own: their status goes to their mirror pod.
//! - A pod being deleted whose containers are all stopped gets the final delete
//!   (gracePeriodSeconds=0, uid precondition), after its last status was sent.

use crate::config::{self, MirrorPods};
use crate::pod::PodManager;
use crate::pod_workers::{PodWorkers, WorkerPhase};
use crate::status::StatusManager;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, Preconditions};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// upstream's syncPeriod: every status is checked at least this often.
const SYNC_PERIOD: Duration = Duration::from_secs(10);

pub struct StatusSync {
    pub client: kube::Client,
    pub status: StatusManager,
    pub pods: PodManager,
    pub workers: PodWorkers,
    pub mirrors: MirrorPods,
    /// Whether a pod was rejected at admission (it has no worker to say it is stopped).
    pub is_rejected: Box<dyn Fn(&str) -> bool + Send + Sync>,
}

/// Where a pod's status goes: namespace, name, uid of the API object, and its status there.
struct Target {
    namespace: String,
    name: String,
    uid: String,
    server_status: PodStatus,
    /// Whether the server's object has a status at all (a JSON patch must add it whole).
    has_status: bool,
}

impl StatusSync {
    pub async fn run(self) {
        let mut sent: HashMap<String, Value> = HashMap::new();
        let mut deleted: HashSet<String> = HashSet::new();
        let mirrors_changed = std::sync::Arc::clone(&self.mirrors.changed);
        loop {
            let full = tokio::select! {
                // A new mirror pod needs its static pod's status now, not at the next round.
                _ = mirrors_changed.notified() => true,
                _ = self.status.changed.notified() => {
                    // Let a burst of updates settle into one round.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    false
                }
                _ = tokio::time::sleep(SYNC_PERIOD) => true,
            };
            let changed = self.status.take_dirty();
            if full {
                self.sync_all(&mut sent, &mut deleted).await;
            } else {
                // The pods whose status changed, and those being deleted: a worker may
                // have stopped a pod's containers after its last status was set, and the
                // final delete should not wait for the next full round.
                let mut uids: HashSet<String> = changed;
                uids.extend(self.pods.deleting());
                for uid in uids {
                    if let Some(pod) = self.pods.get(&uid) {
                        self.sync_pod(&pod, &mut sent, &mut deleted).await;
                    }
                }
            }
        }
    }

    fn target(&self, pod: &Pod) -> Option<Target> {
        if config::is_static_pod(pod) {
            let mirror = self.mirrors.get(&config::pod_full_name(pod))?;
            return Some(Target {
                namespace: mirror.metadata.namespace.clone().unwrap_or_default(),
                name: mirror.metadata.name.clone()?,
                uid: mirror.metadata.uid.clone()?,
                has_status: mirror.status.is_some(),
                server_status: mirror.status.unwrap_or_default(),
            });
        }
        Some(Target {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone()?,
            uid: pod.metadata.uid.clone()?,
            has_status: pod.status.is_some(),
            server_status: pod.status.clone().unwrap_or_default(),
        })
    }

    async fn sync_all(&self, sent: &mut HashMap<String, Value>, deleted: &mut HashSet<String>) {
        let pods = self.pods.all();
        let live: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        sent.retain(|k, _| k.split('/').next().is_some_and(|u| live.contains(u)));
        deleted.retain(|u| live.contains(u));
        for pod in pods {
            self.sync_pod(&pod, sent, deleted).await;
        }
    }

    /// upstream's syncPod: sends `pod`'s status if it changed, then the final delete once a
    /// deleted pod's containers are all stopped.
    async fn sync_pod(
        &self,
        pod: &Pod,
        sent: &mut HashMap<String, Value>,
        deleted: &mut HashSet<String>,
    ) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let Some(target) = self.target(pod) else {
            return;
        };
        if let Some(status) = self.status.get(&uid) {
            // Keyed by the target's uid too: a recreated mirror pod gets the status anew.
            let key = format!("{uid}/{}", target.uid);
            self.sync_status(pod, &target, status, &key, sent).await;
        }
        if !config::is_static_pod(pod)
            && pod.metadata.deletion_timestamp.is_some()
            && !deleted.contains(&uid)
            && self.can_be_deleted(&uid)
        {
            self.final_delete(&target).await;
            deleted.insert(uid);
        }
    }

    /// upstream's canBeDeleted, as far as nodus tracks it: the worker stopped every
    /// container (or the pod never ran).
    fn can_be_deleted(&self, uid: &str) -> bool {
        match self.workers.phase(uid) {
            Some(WorkerPhase::Terminated) => true,
            Some(_) => false,
            None => (self.is_rejected)(uid),
        }
    }

    async fn sync_status(
        &self,
        pod: &Pod,
        target: &Target,
        status: PodStatus,
        key: &str,
        sent: &mut HashMap<String, Value>,
    ) {
        let merged = merge_foreign_conditions(status, &target.server_status);
        let Ok(new) = serde_json::to_value(&merged) else {
            return;
        };
        if sent.get(key) == Some(&new) {
            return;
        }
        let old = serde_json::to_value(&target.server_status).unwrap_or(Value::Null);
        if old == new {
            sent.insert(key.to_string(), new);
            return;
        }
        let terminal = |s: &PodStatus| matches!(s.phase.as_deref(), Some("Succeeded" | "Failed"));
        if terminal(&target.server_status) && !terminal(&merged) {
            tracing::debug!(pod = %config::format_pod(pod), "not moving a terminal pod status back");
            sent.insert(key.to_string(), new);
            return;
        }
        let ops = status_patch(&target.uid, target.has_status, &old, &new);
        let mut result = self.patch_status(target, &ops).await;
        if let Err(kube::Error::Api(s)) = &result
            && s.code != 404
        {
            // The watch's copy may be behind the server: read the pod, and if it is still
            // the same pod, patch again against what the server really has.
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
            result = match api.get_opt(&target.name).await {
                Ok(Some(fresh)) if fresh.metadata.uid.as_deref() == Some(target.uid.as_str()) => {
                    let old = serde_json::to_value(&fresh.status).unwrap_or(Value::Null);
                    let ops = status_patch(&target.uid, fresh.status.is_some(), &old, &new);
                    self.patch_status(target, &ops).await
                }
                Ok(_) => {
                    tracing::info!(pod = %config::format_pod(pod), "pod was replaced or removed in the API server; status not sent");
                    sent.insert(key.to_string(), new);
                    return;
                }
                Err(e) => Err(e),
            };
        }
        match result {
            Ok(_) => {
                tracing::debug!(pod = %config::format_pod(pod), target = %target.name, phase = ?merged.phase, "Status for pod updated successfully");
                sent.insert(key.to_string(), new);
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                tracing::debug!(pod = %config::format_pod(pod), "pod gone from the API server; status not sent");
                sent.insert(key.to_string(), new);
            }
            Err(e) => {
                tracing::warn!(pod = %config::format_pod(pod), error = %e, "Failed to update status for pod; retrying");
            }
        }
    }

    /// PATCH `pods/<name>/status` with a JSON patch (kube-rs's typed JSON patch needs a
    /// feature this workspace does not build, so the request is made by hand).
    async fn patch_status(&self, target: &Target, ops: &Value) -> Result<Pod, kube::Error> {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/status",
            target.namespace, target.name
        );
        let body = serde_json::to_vec(ops).map_err(kube::Error::SerdeError)?;
        let req = http::Request::builder()
            .method(http::Method::PATCH)
            .uri(path)
            .header(http::header::CONTENT_TYPE, "application/json-patch+json")
            .body(body)
            .map_err(kube::Error::HttpError)?;
        self.client.request::<Pod>(req).await
    }

    async fn final_delete(&self, target: &Target) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(target.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&target.name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{}/{}", target.namespace, target.name), "Pod fully terminated and removed from etcd")
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{}", target.namespace, target.name), error = %e, "final delete of the pod failed; retrying");
            }
        }
    }
}

/// Keeps the server's conditions whose type the kubelet does not set.
fn merge_foreign_conditions(mut status: PodStatus, server: &PodStatus) -> PodStatus {
    let ours: HashSet<String> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.clone())
        .collect();
    let foreign: Vec<_> = server
        .conditions
        .iter()
        .flatten()
        .filter(|c| !ours.contains(&c.type_))
        .cloned()
        .collect();
    if !foreign.is_empty() {
        let mut all = foreign;
        all.extend(status.conditions.take().unwrap_or_default());
        status.conditions = Some(all);
    }
    status
}

fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// A JSON patch (RFC 6902) that first tests the object's uid (upstream puts the uid in its
/// status patches as a precondition, so a pod recreated under the same name is never
/// written to), then sets each top-level status field that differs between `old` (the
/// server's) and `new`.
pub fn status_patch(uid: &str, has_status: bool, old: &Value, new: &Value) -> Value {
    let mut ops = vec![serde_json::json!({"op": "test", "path": "/metadata/uid", "value": uid})];
    if !has_status {
        ops.push(serde_json::json!({"op": "add", "path": "/status", "value": new}));
        return Value::Array(ops);
    }
    if let Value::Object(diff) = merge_diff(old, new) {
        for (k, v) in diff {
            let path = format!("/status/{}", pointer_token(&k));
            ops.push(if v.is_null() {
                serde_json::json!({"op": "remove", "path": path})
            } else {
                // Whole top-level fields: a nested merge diff is not a JSON patch value.
                serde_json::json!({"op": "add", "path": path, "value": new[&k]})
            });
        }
    }
    Value::Array(ops)
}

/// The JSON merge patch (RFC 7386) that turns `old` into `new`.
pub fn merge_diff(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = serde_json::Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) if ov == nv => {}
                    Some(ov @ Value::Object(_)) if nv.is_object() => {
                        out.insert(k.clone(), merge_diff(ov, nv));
                    }
                    _ => {
                        out.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            Value::Object(out)
        }
        _ => new.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diff_sets_changes_and_nulls_removals() {
        let old = json!({"phase": "Pending", "a": {"x": 1, "y": 2}, "gone": 1});
        let new = json!({"phase": "Running", "a": {"x": 1, "y": 3}});
        assert_eq!(
            merge_diff(&old, &new),
            json!({"phase": "Running", "a": {"y": 3}, "gone": null})
        );
    }

    #[test]
    fn status_patch_tests_the_uid_and_sets_changed_fields() {
        let old = json!({"phase": "Pending", "podIP": "10.0.0.1", "conditions": [{"type": "A"}]});
        let new = json!({"phase": "Running", "conditions": [{"type": "A"}]});
        assert_eq!(
            status_patch("u1", true, &old, &new),
            json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "add", "path": "/status/phase", "value": "Running"},
                {"op": "remove", "path": "/status/podIP"},
            ])
        );
        assert_eq!(
            status_patch("u1", false, &json!({}), &new)[1],
            json!({"op": "add", "path": "/status", "value": new})
        );
    }

    #[test]
    fn scheduler_conditions_survive() {
        let server: PodStatus = serde_json::from_value(json!({
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]
        }))
        .unwrap();
        let ours: PodStatus = serde_json::from_value(json!({
            "conditions": [{"type": "Ready", "status": "True"}]
        }))
        .unwrap();
        let m = merge_foreign_conditions(ours, &server);
        let types: Vec<_> = m
            .conditions
            .unwrap()
            .into_iter()
            .map(|c| (c.type_, c.status))
            .collect();
        assert_eq!(
            types,
            vec![
                ("PodScheduled".to_string(), "True".to_string()),
                ("Ready".to_string(), "True".to_string())
            ]
        );
    }
}
