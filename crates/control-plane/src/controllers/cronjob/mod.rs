//! The CronJob controller (upstream's `cronjob_controllerv2`): creates a Job for each due
//! activation of a CronJob's schedule in its time zone ([`schedule`]), named after the
//! scheduled minute so a restart or a slow cache never creates it twice; applies the
//! concurrency policy (Allow, Forbid, Replace), `startingDeadlineSeconds` and `suspend`;
//! keeps `status.active`, `lastScheduleTime` and `lastSuccessfulTime`; and deletes finished
//! Jobs beyond the history limits.

mod schedule;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::rest::now_ts;
use crate::apiserver::state::ApiState;
use crate::controllers::cache::Cache;
use crate::controllers::events::Recorder;
use crate::controllers::job;
use crate::controllers::objects;
use crate::storage::StoreError;

use schedule::Missed;

/// The annotation recording which activation a Job is for.
const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
const TICK: Duration = Duration::from_secs(1);

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn time(v: &Value, p: &str) -> Option<Timestamp> {
    v.pointer(p)
        .and_then(Value::as_str)
        .and_then(|t| t.parse().ok())
}

fn uid(v: &Value) -> &str {
    s(v, "/metadata/uid")
}

/// Go's `time.RFC1123Z` of a UTC time, as the MissSchedule event prints it.
fn rfc1123z(t: Timestamp) -> String {
    t.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .strftime("%a, %d %b %Y %H:%M:%S +0000")
        .to_string()
}

fn controller_of(job: &Value) -> Option<&str> {
    job.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r["controller"] == json!(true) && r["kind"] == "CronJob")
        .and_then(|r| r["uid"].as_str())
}

fn delete_job(st: &ApiState, job: &Value) -> bool {
    let Some(mut t) = objects::target("batch", "jobs", None) else {
        return false;
    };
    t.namespace = Some(s(job, "/metadata/namespace").to_string());
    let opts = DeleteOptions {
        propagation: Some("Background".into()),
        uid: Some(uid(job).to_string()),
        ..Default::default()
    };
    match delete_object(st, &t, s(job, "/metadata/name"), &opts) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(job = %s(job, "/metadata/name"), error = %e.0["message"], "cronjob: delete failed");
            false
        }
    }
}

fn job_ref(job: &Value) -> Value {
    json!({"kind": "Job", "namespace": s(job, "/metadata/namespace"), "name": s(job, "/metadata/name"),
        "uid": uid(job), "apiVersion": "batch/v1", "resourceVersion": s(job, "/metadata/resourceVersion")})
}

struct Controller {
    st: Arc<ApiState>,
    recorder: Recorder,
    /// When each CronJob next needs a look without any change (its next activation).
    due: HashMap<String, Timestamp>,
}

pub async fn run(st: Arc<ApiState>) {
    let mut cronjobs = Cache::new(st.store.clone(), "/batch/cronjobs/");
    let mut jobs = Cache::new(st.store.clone(), "/batch/jobs/");
    let mut c = Controller {
        st: st.clone(),
        recorder: Recorder::new("cronjob-controller"),
        due: HashMap::new(),
    };
    loop {
        let changed = tokio::select! {
            _ = cronjobs.next() => true,
            _ = jobs.next() => true,
            _ = tokio::time::sleep(TICK) => false,
        };
        while cronjobs.try_next().is_some() {}
        while jobs.try_next().is_some() {}
        let now = now_ts();
        let mut children: HashMap<String, Vec<Arc<Value>>> = HashMap::new();
        for j in jobs.objects.values() {
            if let Some(u) = controller_of(j) {
                children.entry(u.to_string()).or_default().push(j.clone());
            }
        }
        let keys: Vec<String> = cronjobs.objects.keys().cloned().collect();
        c.due.retain(|k, _| cronjobs.objects.contains_key(k));
        for key in keys {
            if !changed && c.due.get(&key).is_some_and(|t| *t > now) {
                continue;
            }
            let cj_uid = cronjobs
                .objects
                .get(&key)
                .map(|o| uid(o).to_string())
                .unwrap_or_default();
            let owned = children.remove(&cj_uid).unwrap_or_default();
            match c.sync(&key, &owned, now).await {
                Ok(next) => {
                    // Without a next activation, look again in a minute (a bad zone or
                    // schedule may be fixed by an update, which is a change anyway).
                    let next =
                        next.unwrap_or(now + k8s_openapi::jiff::SignedDuration::from_secs(60));
                    c.due.insert(key, next);
                }
                Err(e) => {
                    tracing::warn!(cronjob = %key, error = %e, "cronjob: sync failed");
                    c.due
                        .insert(key, now + k8s_openapi::jiff::SignedDuration::from_secs(5));
                }
            }
        }
    }
}

impl Controller {
    /// One pass over a CronJob; returns when it is next due.
    async fn sync(
        &mut self,
        key: &str,
        owned: &[Arc<Value>],
        now: Timestamp,
    ) -> Result<Option<Timestamp>, String> {
        let Some(stored) = self.st.store.get(key).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let mut cj = (*stored.object).clone();
        let before = cj.clone();
        let cj_uid = uid(&cj).to_string();
        let ns = s(&cj, "/metadata/namespace").to_string();
        let owned: Vec<&Value> = owned
            .iter()
            .map(|j| j.as_ref())
            .filter(|j| controller_of(j) == Some(&cj_uid))
            .collect();
        let mut active: Vec<Value> = cj
            .pointer("/status/active")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();

        // Reconcile status.active and lastSuccessfulTime with the Jobs that exist.
        let child_uids: HashSet<&str> = owned.iter().map(|j| uid(j)).collect();
        for j in &owned {
            let in_active = active.iter().any(|r| r["uid"] == uid(j));
            let done = job::finished(j);
            if !in_active && !done {
                self.recorder.record(
                    &self.st,
                    &cj,
                    "Warning",
                    "UnexpectedJob",
                    &format!(
                        "Saw a job that the controller did not create or forgot: {}",
                        s(j, "/metadata/name")
                    ),
                );
            } else if in_active && done {
                active.retain(|r| r["uid"] != uid(j));
                let cond = if job::has_condition(j, "Complete") {
                    "Complete"
                } else {
                    "Failed"
                };
                self.recorder.record(
                    &self.st,
                    &cj,
                    "Normal",
                    "SawCompletedJob",
                    &format!(
                        "Saw completed job: {}, condition: {cond}",
                        s(j, "/metadata/name")
                    ),
                );
            }
            if done
                && let Some(ct) = time(j, "/status/completionTime")
                && time(&cj, "/status/lastSuccessfulTime").is_none_or(|l| ct > l)
            {
                cj["status"]["lastSuccessfulTime"] = json!(ct.to_string());
            }
        }
        let mut missing = Vec::new();
        active.retain(|r| {
            let keep = child_uids.contains(r["uid"].as_str().unwrap_or(""));
            if !keep {
                missing.push(r["name"].as_str().unwrap_or("").to_string());
            }
            keep
        });
        for name in missing {
            self.recorder.record(
                &self.st,
                &cj,
                "Normal",
                "MissingJob",
                &format!("Active job went missing: {name}"),
            );
        }
        self.cleanup_history(&cj, &owned);

        let result = self.schedule(&mut cj, &mut active, now, &ns).await;
        if !active.is_empty() {
            cj["status"]["active"] = json!(active);
        } else if let Some(o) = cj["status"].as_object_mut() {
            o.remove("active");
        }
        if cj != before {
            let status = cj["status"].clone();
            objects::modify(&self.st, key, &mut |cur| {
                if uid(cur) != cj_uid {
                    return false;
                }
                cur["status"] = status.clone();
                true
            })
            .map_err(|e| e.to_string())?;
        }
        result
    }

    /// Creates the Job of the most recent unmet activation, if the policies allow it.
    async fn schedule(
        &mut self,
        cj: &mut Value,
        active: &mut Vec<Value>,
        now: Timestamp,
        ns: &str,
    ) -> Result<Option<Timestamp>, String> {
        if cj.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(None);
        }
        let tz_name = cj
            .pointer("/spec/timeZone")
            .and_then(Value::as_str)
            .map(str::to_string);
        let tz = match nodus_k8s::cron::time_zone(tz_name.as_deref()) {
            Ok(tz) => tz,
            Err(e) => {
                self.recorder.record(
                    &self.st,
                    cj,
                    "Warning",
                    "UnknownTimeZone",
                    &format!("invalid timeZone: {:?}: {e}", tz_name.unwrap_or_default()),
                );
                return Ok(None);
            }
        };
        if cj.pointer("/spec/suspend").and_then(Value::as_bool) == Some(true) {
            return Ok(None);
        }
        let spec_text = s(cj, "/spec/schedule").to_string();
        let sched = match nodus_k8s::cron::parse(&spec_text) {
            Ok(s) => s,
            Err(e) => {
                self.recorder.record(
                    &self.st,
                    cj,
                    "Warning",
                    "UnparseableSchedule",
                    &format!("unparseable schedule: {spec_text:?} : {e}"),
                );
                return Ok(None);
            }
        };
        let earliest = time(cj, "/status/lastScheduleTime")
            .or_else(|| time(cj, "/metadata/creationTimestamp"))
            .unwrap_or(now);
        let deadline = cj
            .pointer("/spec/startingDeadlineSeconds")
            .and_then(Value::as_i64);
        let next_after_now = sched.next(now, &tz);
        let (scheduled, missed) = match schedule::most_recent(&sched, &tz, earliest, deadline, now)
        {
            Ok(v) => v,
            Err(e) => {
                self.recorder.record(
                    &self.st,
                    cj,
                    "Warning",
                    "InvalidSchedule",
                    &format!("invalid schedule: {spec_text} : {e}"),
                );
                return Ok(None);
            }
        };
        let Some(scheduled) = scheduled else {
            return Ok(next_after_now);
        };
        if missed == Missed::Many {
            self.recorder.record(&self.st, cj, "Warning", "TooManyMissedTimes",
                "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew");
        }
        if let Some(d) = deadline
            && scheduled + k8s_openapi::jiff::SignedDuration::from_secs(d) < now
        {
            self.recorder.record(
                &self.st,
                cj,
                "Warning",
                "MissSchedule",
                &format!(
                    "Missed scheduled time to start a job: {}",
                    rfc1123z(scheduled)
                ),
            );
            return Ok(next_after_now);
        }
        let cj_name = s(cj, "/metadata/name").to_string();
        let name = schedule::job_name(&cj_name, scheduled);
        if active.iter().any(|r| r["name"] == name.as_str())
            || time(cj, "/status/lastScheduleTime") == Some(scheduled)
        {
            return Ok(next_after_now);
        }
        let policy = s(cj, "/spec/concurrencyPolicy").to_string();
        if policy == "Forbid" && !active.is_empty() {
            self.recorder.record(&self.st, cj, "Normal", "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is Forbid");
            return Ok(next_after_now);
        }
        if policy == "Replace" {
            for r in active.clone() {
                let key =
                    objects::key_of("batch", "jobs", Some(ns), r["name"].as_str().unwrap_or(""));
                if let Ok(Some(j)) = self.st.store.get(&key) {
                    if !delete_job(&self.st, &j.object) {
                        return Err("could not delete a job to replace it".into());
                    }
                    self.recorder.record(
                        &self.st,
                        cj,
                        "Normal",
                        "SuccessfulDelete",
                        &format!("Deleted job {}", s(&j.object, "/metadata/name")),
                    );
                }
                active.retain(|x| x["uid"] != r["uid"]);
            }
        }
        let template = cj
            .pointer("/spec/jobTemplate")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let mut annotations = template
            .pointer("/metadata/annotations")
            .cloned()
            .unwrap_or_else(|| json!({}));
        annotations[SCHEDULED_TIMESTAMP] = json!(schedule::scheduled_annotation(scheduled, &tz));
        let job_obj = json!({
            "metadata": {
                "name": name,
                "labels": template.pointer("/metadata/labels").cloned().unwrap_or_else(|| json!({})),
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": cj_name,
                    "uid": uid(cj), "controller": true, "blockOwnerDeletion": true}],
            },
            "spec": template.get("spec").cloned().unwrap_or_else(|| json!({})),
        });
        let created = match objects::create(&self.st, "batch", "jobs", Some(ns), job_obj) {
            Ok(stored) => {
                self.recorder.record(
                    &self.st,
                    cj,
                    "Normal",
                    "SuccessfulCreate",
                    &format!("Created job {name}"),
                );
                (*stored.object).clone()
            }
            Err(StoreError::AlreadyExists(_)) => {
                let key = objects::key_of("batch", "jobs", Some(ns), &name);
                let Ok(Some(existing)) = self.st.store.get(&key) else {
                    return Ok(next_after_now);
                };
                // Someone else's Job, or ours already listed: nothing to record.
                if controller_of(&existing.object) != Some(uid(cj))
                    || active.iter().any(|r| r["uid"] == uid(&existing.object))
                {
                    return Ok(next_after_now);
                }
                (*existing.object).clone()
            }
            Err(e) => {
                self.recorder.record(
                    &self.st,
                    cj,
                    "Warning",
                    "FailedCreate",
                    &format!("Error creating job: {e}"),
                );
                return Err(e.to_string());
            }
        };
        active.push(job_ref(&created));
        cj["status"]["lastScheduleTime"] = json!(scheduled.to_string());
        Ok(next_after_now)
    }

    /// Deletes the oldest finished Jobs beyond `successfulJobsHistoryLimit` and
    /// `failedJobsHistoryLimit`.
    fn cleanup_history(&self, cj: &Value, owned: &[&Value]) {
        for (cond, limit_field) in [
            ("Complete", "successfulJobsHistoryLimit"),
            ("Failed", "failedJobsHistoryLimit"),
        ] {
            let Some(limit) = cj
                .pointer(&format!("/spec/{limit_field}"))
                .and_then(Value::as_i64)
            else {
                continue;
            };
            let mut done: Vec<&Value> = owned
                .iter()
                .copied()
                .filter(|j| {
                    job::has_condition(j, cond)
                        && j.pointer("/metadata/deletionTimestamp").is_none()
                })
                .collect();
            if done.len() as i64 <= limit {
                continue;
            }
            // Oldest first by start time (creation when it never started).
            done.sort_by_key(|j| {
                time(j, "/status/startTime").or_else(|| time(j, "/metadata/creationTimestamp"))
            });
            let excess = done.len() - limit.max(0) as usize;
            for j in done.into_iter().take(excess) {
                if delete_job(&self.st, j) {
                    self.recorder.record(
                        &self.st,
                        cj,
                        "Normal",
                        "SuccessfulDelete",
                        &format!("Deleted job {}", s(j, "/metadata/name")),
                    );
                }
            }
        }
    }
}
