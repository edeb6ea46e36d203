//! The TTL-after-finished controller (upstream's `pkg/controller/ttlafterfinished`): a
//! finished Job with `spec.ttlSecondsAfterFinished` is deleted, with background propagation
//! (its pods go through the garbage collector), that many seconds after it finished.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::rest::now_ts;
use crate::apiserver::state::ApiState;
use crate::controllers::cache::Cache;
use crate::controllers::objects;

const PERIOD: Duration = Duration::from_secs(1);

/// When the Job finished: its completionTime, or the Failed condition's transition.
fn finish_time(job: &Value) -> Option<Timestamp> {
    if let Some(t) = job
        .pointer("/status/completionTime")
        .and_then(Value::as_str)
    {
        return t.parse().ok();
    }
    job.pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
        .and_then(|c| c["lastTransitionTime"].as_str())
        .and_then(|t| t.parse().ok())
}

/// Whether `job` is due for deletion at `now`.
pub(crate) fn expired(job: &Value, now: Timestamp) -> bool {
    let Some(ttl) = job
        .pointer("/spec/ttlSecondsAfterFinished")
        .and_then(Value::as_i64)
    else {
        return false;
    };
    if job.pointer("/metadata/deletionTimestamp").is_some() || !super::job::finished(job) {
        return false;
    }
    finish_time(job).is_some_and(|t| now.duration_since(t).as_secs() >= ttl)
}

pub async fn run(st: Arc<ApiState>) {
    let mut jobs = Cache::new(st.store.clone(), "/batch/jobs/");
    let Some(target) = objects::target("batch", "jobs", None) else {
        return;
    };
    loop {
        tokio::time::sleep(PERIOD).await;
        while jobs.try_next().is_some() {}
        let now = now_ts();
        let due: Vec<Value> = jobs
            .objects
            .values()
            .filter(|j| expired(j, now))
            .map(|j| (**j).clone())
            .collect();
        for job in due {
            let mut t = target.clone();
            t.namespace = job
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .map(str::to_string);
            let name = job
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let opts = DeleteOptions {
                propagation: Some("Background".into()),
                uid: job
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                ..Default::default()
            };
            if let Err(e) = delete_object(&st, &t, name, &opts) {
                tracing::warn!(job = %name, error = %e.0["message"], "ttl-after-finished: delete failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deleted_ttl_seconds_after_finishing() {
        let now: Timestamp = "2024-01-01T00:01:00Z".parse().expect("ts");
        let job = |ttl: Value, cond: &str, completion: Value| {
            json!({"spec": {"ttlSecondsAfterFinished": ttl}, "status": {"completionTime": completion,
                "conditions": [{"type": cond, "status": "True", "lastTransitionTime": "2024-01-01T00:00:30Z"}]}})
        };
        let cases = [
            (
                job(json!(60), "Complete", json!("2024-01-01T00:00:00Z")),
                true,
            ),
            (
                job(json!(61), "Complete", json!("2024-01-01T00:00:00Z")),
                false,
            ),
            (job(json!(30), "Failed", Value::Null), true),
            (job(json!(31), "Failed", Value::Null), false),
            (job(json!(0), "SuccessCriteriaMet", Value::Null), false),
            (
                job(Value::Null, "Complete", json!("2024-01-01T00:00:00Z")),
                false,
            ),
        ];
        for (j, want) in cases {
            assert_eq!(expired(&j, now), want, "{j}");
        }
    }
}
