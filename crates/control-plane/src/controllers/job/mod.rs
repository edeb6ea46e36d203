//! The Job controller (upstream's `pkg/controller/job`): runs a Job's pods to completion.
//!
//! Each sync reads the Job from the store and its pods from the informer cache and:
//! counts finished pods through the `batch.kubernetes.io/job-tracking` finalizer and
//! `status.uncountedTerminatedPods` (a pod's uid is recorded in the Job before its finalizer
//! is removed, so a pod deleted right after finishing is still counted exactly once);
//! decides success (completions, Indexed `completedIndexes`, a [`success_policy`]) or failure
//! (backoffLimit, activeDeadlineSeconds, podFailurePolicy, failed indexes under
//! [`backoff_per_index`]) with upstream's FailureTarget/SuccessCriteriaMet then Failed/Complete
//! conditions; suspends and resumes; and creates or deletes pods toward parallelism, with the
//! exponential back-off of [`backoff`] after failures (per index with backoffLimitPerIndex).
//! Pods it created and has not yet seen in the cache are remembered (upstream's
//! expectations), so a slow watch never makes it create duplicates.

mod backoff;
mod backoff_per_index;
mod failure_policy;
mod indexed;
mod pods;
mod success_policy;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::rest::{now_rfc3339, now_ts};
use crate::apiserver::state::ApiState;
use crate::controllers::cache::{Cache, Change, Index};
use crate::controllers::controller_utils::pod_ready;
use crate::controllers::events::Recorder;
use crate::controllers::objects;
use crate::storage::EventKind;

use backoff_per_index::{FailureCounts, Outcome};
use failure_policy::Action;

/// The finalizer that keeps a finished pod until the Job has counted it.
pub(crate) const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// How often Jobs are re-examined without any change (deadlines, back-off expiry).
const RESYNC: Duration = Duration::from_secs(1);
/// How long pods the controller created may stay unseen before it stops waiting for them.
const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(30);

/// A Job condition's reason, as upstream names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    CompletionsReached,
    BackoffLimitExceeded,
    DeadlineExceeded,
    PodFailurePolicy,
    SuccessPolicy,
    FailedIndexes,
    MaxFailedIndexesExceeded,
    JobSuspended,
    JobResumed,
}

impl Reason {
    const ALL: [Reason; 9] = [
        Reason::CompletionsReached,
        Reason::BackoffLimitExceeded,
        Reason::DeadlineExceeded,
        Reason::PodFailurePolicy,
        Reason::SuccessPolicy,
        Reason::FailedIndexes,
        Reason::MaxFailedIndexesExceeded,
        Reason::JobSuspended,
        Reason::JobResumed,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Reason::CompletionsReached => "CompletionsReached",
            Reason::BackoffLimitExceeded => "BackoffLimitExceeded",
            Reason::DeadlineExceeded => "DeadlineExceeded",
            Reason::PodFailurePolicy => "PodFailurePolicy",
            Reason::SuccessPolicy => "SuccessPolicy",
            Reason::FailedIndexes => "FailedIndexes",
            Reason::MaxFailedIndexesExceeded => "MaxFailedIndexesExceeded",
            Reason::JobSuspended => "JobSuspended",
            Reason::JobResumed => "JobResumed",
        }
    }

    fn parse(s: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn i(v: &Value, p: &str) -> i64 {
    v.pointer(p).and_then(Value::as_i64).unwrap_or(0)
}

fn uid(v: &Value) -> &str {
    s(v, "/metadata/uid")
}

pub(crate) fn has_condition(job: &Value, ty: &str) -> bool {
    job.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty && c["status"] == "True"))
}

/// A Job with a Complete or Failed condition: nothing more happens to it.
pub(crate) fn finished(job: &Value) -> bool {
    has_condition(job, "Complete") || has_condition(job, "Failed")
}

/// Sets condition `ty` (upstream's `ensureJobConditionStatus`): a change of status moves
/// `lastTransitionTime`, the same status keeps it.
fn set_condition(job: &mut Value, ty: &str, status: &str, reason: Reason, message: &str) -> bool {
    let now = now_rfc3339();
    let mut conds = job["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    match conds.iter_mut().find(|c| c["type"] == ty) {
        Some(c) if c["status"] == status => return false,
        Some(c) => {
            *c = json!({"type": ty, "status": status, "reason": reason.as_str(), "message": message,
                "lastProbeTime": now, "lastTransitionTime": now});
        }
        None if status == "False" => return false,
        None => conds.push(
            json!({"type": ty, "status": status, "reason": reason.as_str(),
            "message": message, "lastProbeTime": now, "lastTransitionTime": now}),
        ),
    }
    job["status"]["conditions"] = json!(conds);
    true
}

fn pod_finished(p: &Value) -> bool {
    matches!(s(p, "/status/phase"), "Succeeded" | "Failed")
}

fn pod_terminating(p: &Value) -> bool {
    p.pointer("/metadata/deletionTimestamp").is_some() && !pod_finished(p)
}

fn has_finalizer(p: &Value) -> bool {
    p.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|x| x == TRACKING_FINALIZER))
}

fn controlled_by(p: &Value, job_uid: &str) -> bool {
    p.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|rs| {
            rs.iter()
                .any(|r| r["uid"] == job_uid && r["controller"] == json!(true))
        })
}

fn controller_uid(p: &Value) -> Option<&str> {
    p.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r["controller"] == json!(true) && r["kind"] == "Job")
        .and_then(|r| r["uid"].as_str())
}

/// What the controller remembers about one Job between syncs.
#[derive(Default)]
struct JobMemory {
    /// Pod keys created and not yet seen in the cache, with when.
    pending_creates: HashMap<String, Instant>,
    /// Pod uids the controller deleted itself (suspend, excess, failure): not failures.
    deleted_by_us: HashSet<String>,
    /// When a failed pod without a container finish time was first seen failed.
    failed_seen: HashMap<String, k8s_openapi::jiff::Timestamp>,
}

impl JobMemory {
    /// When the failed pod `p` failed: its finish time, else when this controller first saw
    /// it failed (rather than upstream's creation time, which would cut the back-off short).
    fn failure_time(&mut self, p: &Value) -> k8s_openapi::jiff::Timestamp {
        backoff::finished_at(p).unwrap_or_else(|| {
            *self
                .failed_seen
                .entry(uid(p).to_string())
                .or_insert_with(now_ts)
        })
    }
}

struct Controller {
    st: Arc<ApiState>,
    recorder: Recorder,
    memory: HashMap<String, JobMemory>,
}

pub async fn run(st: Arc<ApiState>) {
    let mut jobs = Cache::new(st.store.clone(), "/batch/jobs/");
    let mut pods = Cache::new(st.store.clone(), "/core/pods/").with_index(Index::ControllerUid);
    let mut c = Controller {
        st: st.clone(),
        recorder: Recorder::new("job-controller"),
        memory: HashMap::new(),
    };
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        // Jobs to sync (by uid) and pods whose Job may be gone; `all` after a re-list or
        // on the resync tick (deadlines and back-off expiry need no event).
        let mut work = Work::default();
        tokio::select! {
            ch = jobs.next() => work.job(ch),
            ch = pods.next() => work.pod(ch),
            _ = resync.tick() => work.all = true,
        }
        // Coalesce a burst of changes into one pass.
        while let Some(ch) = jobs.try_next() {
            work.job(ch);
        }
        while let Some(ch) = pods.try_next() {
            work.pod(ch);
        }
        let by_uid: HashMap<String, String> = jobs
            .objects
            .iter()
            .map(|(k, j)| (uid(j).to_string(), k.clone()))
            .collect();
        c.memory.retain(|u, _| by_uid.contains_key(u));
        // Pods whose Job is gone keep no finalizer (upstream's orphan cleanup).
        let orphans: Vec<&Arc<Value>> = if work.relisted {
            pods.objects
                .values()
                .filter(|p| controller_uid(p).is_some_and(|u| !by_uid.contains_key(u)))
                .collect()
        } else {
            work.gone_jobs
                .iter()
                .flat_map(|u| pods.by_index(Index::ControllerUid, u).map(|(_, p)| p))
                .chain(work.pods.iter().filter_map(|k| pods.get(k)))
                .filter(|p| controller_uid(p).is_some_and(|u| !by_uid.contains_key(u)))
                .collect()
        };
        for p in orphans.into_iter().filter(|p| has_finalizer(p)) {
            c.remove_finalizer(p);
        }
        let dirty: Vec<&String> = if work.all || work.relisted {
            by_uid.keys().collect()
        } else {
            work.pods
                .iter()
                .filter_map(|k| pods.get(k).and_then(|p| controller_uid(p)))
                .chain(work.job_uids.iter().map(String::as_str))
                .filter_map(|u| by_uid.get_key_value(u).map(|(u, _)| u))
                .collect::<HashSet<_>>()
                .into_iter()
                .collect()
        };
        for job_uid in dirty {
            let key = &by_uid[job_uid];
            let owned: Vec<Arc<Value>> = pods
                .by_index(Index::ControllerUid, job_uid)
                .map(|(_, p)| p.clone())
                .collect();
            if let Err(e) = c.sync(key, &owned).await {
                tracing::warn!(job = %key, error = %e, "job: sync failed");
            }
        }
    }
}

/// What one pass of the loop has to look at.
#[derive(Default)]
struct Work {
    all: bool,
    relisted: bool,
    job_uids: HashSet<String>,
    /// Uids of Jobs deleted since the last pass.
    gone_jobs: HashSet<String>,
    /// Keys of pods that changed.
    pods: HashSet<String>,
}

impl Work {
    fn job(&mut self, ch: Change) {
        match ch {
            Change::Relisted => self.relisted = true,
            Change::Event(ev) => {
                let u = uid(&ev.object).to_string();
                if ev.kind == EventKind::Deleted {
                    self.gone_jobs.insert(u);
                } else {
                    self.job_uids.insert(u);
                }
            }
        }
    }

    fn pod(&mut self, ch: Change) {
        match ch {
            Change::Relisted => self.relisted = true,
            Change::Event(ev) => {
                // A deleted pod changes its Job's counts: the Job is synced by uid.
                if let Some(u) = controller_uid(&ev.object) {
                    self.job_uids.insert(u.to_string());
                }
                self.pods.insert(ev.key.clone());
            }
        }
    }
}

impl Controller {
    /// Drops the tracking finalizer (the pod goes if it was being deleted).
    fn remove_finalizer(&self, p: &Value) {
        let key = objects::key_of(
            "",
            "pods",
            Some(s(p, "/metadata/namespace")),
            s(p, "/metadata/name"),
        );
        crate::apiserver::controllers::drop_finalizer(&self.st, &key, TRACKING_FINALIZER);
    }

    fn delete_pod(&mut self, job_uid: &str, p: &Value) -> bool {
        let Some(mut t) = objects::target("", "pods", None) else {
            return false;
        };
        t.namespace = Some(s(p, "/metadata/namespace").to_string());
        let opts = DeleteOptions {
            uid: Some(uid(p).to_string()),
            ..Default::default()
        };
        match delete_object(&self.st, &t, s(p, "/metadata/name"), &opts) {
            Ok(_) => {
                self.memory
                    .entry(job_uid.to_string())
                    .or_default()
                    .deleted_by_us
                    .insert(uid(p).to_string());
                true
            }
            Err(e) => {
                tracing::warn!(pod = %s(p, "/metadata/name"), error = %e.0["message"], "job: delete failed");
                false
            }
        }
    }

    async fn sync(&mut self, key: &str, owned: &[Arc<Value>]) -> Result<(), String> {
        let Some(stored) = self.st.store.get(key).map_err(|e| e.to_string())? else {
            return Ok(());
        };
        let job: Value = (*stored.object).clone();
        let job_uid = uid(&job).to_string();
        let ns = s(&job, "/metadata/namespace").to_string();
        let pods: Vec<&Value> = owned
            .iter()
            .map(|p| p.as_ref())
            .filter(|p| controlled_by(p, &job_uid))
            .collect();
        // Expectations: wait until every pod created earlier is visible.
        let mem = self.memory.entry(job_uid.clone()).or_default();
        let seen: HashSet<String> = pods
            .iter()
            .map(|p| objects::key_of("", "pods", Some(&ns), s(p, "/metadata/name")))
            .collect();
        mem.pending_creates
            .retain(|k, at| !seen.contains(k) && at.elapsed() < EXPECTATIONS_TIMEOUT);
        if !mem.pending_creates.is_empty() {
            return Ok(());
        }
        if job.pointer("/metadata/deletionTimestamp").is_some() {
            for p in pods.iter().filter(|p| has_finalizer(p)) {
                self.remove_finalizer(p);
            }
            return Ok(());
        }
        if finished(&job) {
            for p in pods
                .iter()
                .filter(|p| has_finalizer(p) && (pod_finished(p) || pod_terminating(p)))
            {
                self.remove_finalizer(p);
            }
            return Ok(());
        }
        self.sync_active(key, job, &pods).await
    }

    async fn sync_active(
        &mut self,
        key: &str,
        mut job: Value,
        pods: &[&Value],
    ) -> Result<(), String> {
        let job_uid = uid(&job).to_string();
        let before = job.clone();
        let spec = job["spec"].clone();
        let indexed = s(&spec, "/completionMode") == "Indexed";
        let completions = spec.get("completions").and_then(Value::as_i64);
        let parallelism = i(&spec, "/parallelism").max(0);
        let backoff_limit = spec
            .get("backoffLimit")
            .and_then(Value::as_i64)
            .unwrap_or(6);
        let suspended = spec.get("suspend").and_then(Value::as_bool) == Some(true);
        let only_failed = s(&spec, "/podReplacementPolicy") == "Failed";
        let policy = spec
            .get("podFailurePolicy")
            .filter(|v| !v.is_null())
            .cloned();
        let completions_n = completions.unwrap_or(0);
        // backoffLimitPerIndex, maxFailedIndexes and successPolicy apply to Indexed Jobs only
        // (validation refuses them elsewhere).
        let per_index = spec
            .get("backoffLimitPerIndex")
            .and_then(Value::as_i64)
            .filter(|_| indexed);
        let max_failed_indexes = spec.get("maxFailedIndexes").and_then(Value::as_i64);
        let success_policy = spec
            .get("successPolicy")
            .filter(|v| indexed && !v.is_null())
            .cloned();
        let outcome_of = |p: &Value| {
            Outcome::of(
                policy
                    .as_ref()
                    .and_then(|pol| failure_policy::match_pod(pol, p))
                    .map(|m| m.action),
            )
        };
        if job["status"].is_null() {
            job["status"] = json!({});
        }
        let deleted_by_us = self
            .memory
            .get(&job_uid)
            .map(|m| m.deleted_by_us.clone())
            .unwrap_or_default();

        // 1. Record newly finished pods in uncountedTerminatedPods, keeping their finalizers.
        let mut unc_succ: BTreeSet<String> =
            str_set(&job, "/status/uncountedTerminatedPods/succeeded");
        let mut unc_fail: BTreeSet<String> =
            str_set(&job, "/status/uncountedTerminatedPods/failed");
        let mut completed: BTreeSet<i64> =
            indexed::parse(s(&job, "/status/completedIndexes"), completions_n);
        let mut failed_ix: BTreeSet<i64> =
            indexed::parse(s(&job, "/status/failedIndexes"), completions_n);
        let mut failure: Option<(Reason, String)> = None;
        let mut ignored: Vec<&Value> = Vec::new();
        // Failed pods of valid indexes not yet counted: a replacement is made from them.
        let mut index_failures: Vec<(i64, &Value)> = Vec::new();
        // Back-off counts from the newest failure among the Job's pods (they stay after
        // being counted), so it survives a controller restart.
        let mem = self.memory.entry(job_uid.clone()).or_default();
        let last_failure = pods
            .iter()
            .filter(|p| s(p, "/status/phase") == "Failed" && !deleted_by_us.contains(uid(p)))
            .map(|p| mem.failure_time(p))
            .max();
        for p in pods.iter().copied().filter(|p| has_finalizer(p)) {
            let u = uid(p).to_string();
            if unc_succ.contains(&u) || unc_fail.contains(&u) {
                continue;
            }
            if pod_finished(p) || pod_terminating(p) {
                // The cache may not show yet that this pod was counted (its finalizer
                // already removed): the store decides, so nothing is counted twice.
                let key = objects::key_of(
                    "",
                    "pods",
                    Some(s(p, "/metadata/namespace")),
                    s(p, "/metadata/name"),
                );
                let current = self.st.store.get(&key).ok().flatten();
                if !current.is_some_and(|c| uid(&c.object) == u && has_finalizer(&c.object)) {
                    continue;
                }
            }
            let phase = s(p, "/status/phase");
            if phase == "Succeeded" {
                if indexed {
                    match indexed::pod_index(p, completions.unwrap_or(0)) {
                        Some(ix) => {
                            completed.insert(ix);
                        }
                        None => continue,
                    }
                }
                unc_succ.insert(u);
                continue;
            }
            if deleted_by_us.contains(&u) {
                // Removed by this controller (suspend, excess, outcome known): no failure,
                // nothing to count, and nothing left to keep it for.
                if phase == "Failed" || pod_terminating(p) {
                    ignored.push(p);
                }
                continue;
            }
            let failed = phase == "Failed" || (!only_failed && pod_terminating(p));
            if !failed {
                continue;
            }
            let matched = policy
                .as_ref()
                .and_then(|pol| failure_policy::match_pod(pol, p));
            if let (Some(limit), Some(ix)) = (per_index, indexed::pod_index(p, completions_n)) {
                let outcome = Outcome::of(matched.as_ref().map(|m| m.action));
                if backoff_per_index::index_failed(p, limit, outcome) {
                    failed_ix.insert(ix);
                }
                index_failures.push((ix, p));
            }
            if let Some(m) = matched {
                match m.action {
                    Action::Ignore => {
                        ignored.push(p);
                        continue;
                    }
                    Action::FailJob => {
                        if failure.is_none() {
                            failure = Some((Reason::PodFailurePolicy, m.message));
                        }
                    }
                    // The index fails, not the Job ([`backoff_per_index`]).
                    Action::FailIndex | Action::Count => {}
                }
            }
            unc_fail.insert(u);
        }

        let counted_succ = i(&job, "/status/succeeded");
        let counted_fail = i(&job, "/status/failed");
        let succeeded = if indexed {
            completed.len() as i64
        } else {
            counted_succ + unc_succ.len() as i64
        };
        let failed = counted_fail + unc_fail.len() as i64;

        let active: Vec<&Value> = pods
            .iter()
            .copied()
            .filter(|p| !pod_finished(p) && p.pointer("/metadata/deletionTimestamp").is_none())
            .collect();
        let terminating = pods.iter().filter(|p| pod_terminating(p)).count() as i64;
        let indexes_of = |ps: &mut dyn Iterator<Item = &&Value>| -> BTreeSet<i64> {
            ps.filter_map(|p| indexed::pod_index(p, completions_n))
                .collect()
        };
        let active_ix = indexes_of(&mut active.iter());
        // Per index, the failed pod its replacement will be made from: it keeps its
        // finalizer (and stays uncounted) until that replacement exists.
        let delayed = if per_index.is_some() {
            let mem = self.memory.entry(job_uid.clone()).or_default();
            let candidates: Vec<(i64, &Value, k8s_openapi::jiff::Timestamp)> = index_failures
                .iter()
                .filter(|(ix, _)| {
                    !completed.contains(ix) && !failed_ix.contains(ix) && !active_ix.contains(ix)
                })
                .map(|(ix, p)| (*ix, *p, mem.failure_time(p)))
                .collect();
            backoff_per_index::delayed_deletion(candidates)
        } else {
            Default::default()
        };

        // 2. Success or failure.
        if !has_condition(&job, "FailureTarget") && !has_condition(&job, "SuccessCriteriaMet") {
            let started = job
                .pointer("/status/startTime")
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
            if failure.is_none() && failed > backoff_limit {
                failure = Some((
                    Reason::BackoffLimitExceeded,
                    "Job has reached the specified backoff limit".to_string(),
                ));
            }
            if failure.is_none()
                && !suspended
                && let (Some(ads), Some(start)) = (
                    spec.get("activeDeadlineSeconds").and_then(Value::as_i64),
                    started,
                )
                && now_ts().duration_since(start).as_secs() >= ads
            {
                failure = Some((
                    Reason::DeadlineExceeded,
                    "Job was active longer than specified deadline".to_string(),
                ));
            }
            if failure.is_none() && per_index.is_some() {
                let nfailed = failed_ix.len() as i64;
                if max_failed_indexes.is_some_and(|m| nfailed > m) {
                    failure = Some((
                        Reason::MaxFailedIndexesExceeded,
                        "Job has exceeded the specified maximal number of failed indexes"
                            .to_string(),
                    ));
                } else if nfailed > 0 && nfailed + completed.len() as i64 >= completions_n {
                    failure = Some((Reason::FailedIndexes, "Job has failed indexes".to_string()));
                }
            }
            let policy_met = success_policy
                .as_ref()
                .filter(|_| failure.is_none())
                .and_then(|sp| success_policy::matches(sp, completions_n, &completed));
            let success = match completions {
                Some(c) => succeeded >= c,
                // A work queue: done when one pod succeeded and none is left running.
                None => succeeded > 0 && active.is_empty(),
            };
            if let Some((reason, message)) = &failure {
                set_condition(&mut job, "FailureTarget", "True", *reason, message);
            } else if let Some(message) = policy_met {
                set_condition(
                    &mut job,
                    "SuccessCriteriaMet",
                    "True",
                    Reason::SuccessPolicy,
                    &message,
                );
            } else if success {
                set_condition(
                    &mut job,
                    "SuccessCriteriaMet",
                    "True",
                    Reason::CompletionsReached,
                    "Reached expected number of succeeded pods",
                );
            }
        }
        let failing = has_condition(&job, "FailureTarget");
        let succeeding = has_condition(&job, "SuccessCriteriaMet");
        // Failed pods awaiting their replacement stay uncounted, unless the outcome is known
        // and no replacement will come.
        if !failing && !succeeding {
            let held: HashSet<&str> = delayed.values().map(|(p, _)| uid(p)).collect();
            unc_fail.retain(|u| !held.contains(u.as_str()));
            ignored.retain(|p| !held.contains(uid(p)));
        }
        let failed = counted_fail + unc_fail.len() as i64;

        // 3. Pods: terminate everything once the outcome is known, else manage toward parallelism.
        let mut to_delete: Vec<&Value> = Vec::new();
        let mut to_create: Vec<(Option<i64>, Option<FailureCounts>)> = Vec::new();
        if failing || succeeding || suspended {
            to_delete.extend(active.iter().copied());
        } else {
            let mut want = match completions {
                Some(c) => (c - succeeded).clamp(0, parallelism),
                None if succeeded > 0 => 0,
                None => parallelism,
            };
            if only_failed {
                want = (want - terminating).max(0);
            }
            let have = active.len() as i64;
            if have > want {
                // Newest first, as upstream's ActivePods ordering deletes them.
                let mut extra = active.clone();
                extra.sort_by(|a, b| {
                    s(b, "/metadata/creationTimestamp").cmp(s(a, "/metadata/creationTimestamp"))
                });
                to_delete.extend(extra.into_iter().take((have - want) as usize));
            } else if have < want {
                // With backoffLimitPerIndex each index waits on its own (below).
                let wait = if failed > 0 && per_index.is_none() {
                    let since = last_failure
                        .map(|t| now_ts().duration_since(t).unsigned_abs())
                        .unwrap_or_default();
                    backoff::remaining(failed.min(u32::MAX as i64) as u32, since)
                } else {
                    Duration::ZERO
                };
                if wait.is_zero() {
                    if indexed {
                        let mut busy = active_ix.clone();
                        if only_failed {
                            busy.extend(indexes_of(
                                &mut pods.iter().filter(|p| pod_terminating(p)),
                            ));
                        }
                        let pending = indexed::first_pending(
                            (want - have) as usize,
                            completions_n,
                            &completed,
                            &failed_ix,
                            &busy,
                        );
                        for ix in pending {
                            if per_index.is_none() {
                                to_create.push((Some(ix), None));
                                continue;
                            }
                            let predecessor = delayed.get(&ix);
                            if let Some((p, at)) = predecessor {
                                let since = now_ts().duration_since(*at).unsigned_abs();
                                if !backoff_per_index::remaining(p, since).is_zero() {
                                    continue;
                                }
                            }
                            let counts = backoff_per_index::replacement_counts(
                                predecessor.map(|(p, _)| (*p, outcome_of(p))),
                            );
                            to_create.push((Some(ix), Some(counts)));
                        }
                    } else {
                        to_create.extend((0..want - have).map(|_| (None, None)));
                    }
                }
            }
        }

        // 4. Suspend and resume.
        if suspended {
            if set_condition(
                &mut job,
                "Suspended",
                "True",
                Reason::JobSuspended,
                "Job suspended",
            ) {
                self.recorder
                    .record(&self.st, &job, "Normal", "Suspended", "Job suspended");
            }
        } else {
            if set_condition(
                &mut job,
                "Suspended",
                "False",
                Reason::JobResumed,
                "Job resumed",
            ) {
                job["status"]["startTime"] = json!(now_rfc3339());
                self.recorder
                    .record(&self.st, &job, "Normal", "Resumed", "Job resumed");
            }
            if job.pointer("/status/startTime").is_none_or(Value::is_null) {
                job["status"]["startTime"] = json!(now_rfc3339());
            }
        }

        // 5. Status phase 1: uncounted uids recorded before finalizers go.
        let status = &mut job["status"];
        status["active"] = json!(active.len());
        status["ready"] = json!(active.iter().filter(|p| pod_ready(p)).count());
        status["terminating"] = json!(terminating);
        status["uncountedTerminatedPods"] = uncounted_json(&unc_succ, &unc_fail);
        if indexed {
            status["completedIndexes"] = json!(indexed::format(&completed));
            status["succeeded"] = json!(succeeded);
        }
        if per_index.is_some() {
            status["failedIndexes"] = json!(indexed::format(&failed_ix));
        }
        strip_zero(status);
        if job != before {
            self.write_status(key, &job)?;
        }

        // 6. Finalizers off the recorded pods, then the counts move out of uncounted.
        let recorded: HashSet<&String> = unc_succ.iter().chain(unc_fail.iter()).collect();
        for p in pods.iter().filter(|p| has_finalizer(p)) {
            if recorded.contains(&uid(p).to_string()) || ignored.iter().any(|x| uid(x) == uid(p)) {
                self.remove_finalizer(p);
            }
        }
        if !unc_succ.is_empty() || !unc_fail.is_empty() {
            if !indexed {
                job["status"]["succeeded"] = json!(succeeded);
            }
            job["status"]["failed"] = json!(failed);
            job["status"]["uncountedTerminatedPods"] = json!({});
            strip_zero(&mut job["status"]);
            self.write_status(key, &job)?;
        }

        // 7. Pod changes, then the final condition once nothing runs any more.
        for p in &to_delete {
            if self.delete_pod(&job_uid, p) && !suspended && !failing && !succeeding {
                self.recorder.record(
                    &self.st,
                    &job,
                    "Normal",
                    "SuccessfulDelete",
                    &format!("Deleted pod: {}", s(p, "/metadata/name")),
                );
            }
        }
        for (ix, counts) in to_create {
            self.create_pod(&job, ix, counts).await;
        }
        let nothing_running = active.is_empty() && terminating == 0;
        if nothing_running && (failing || succeeding) {
            let (ty, reason, message) = job["status"]["conditions"]
                .as_array()
                .and_then(|cs| {
                    cs.iter().find(|c| {
                        c["status"] == "True"
                            && (c["type"] == "FailureTarget" || c["type"] == "SuccessCriteriaMet")
                    })
                })
                .map(|c| {
                    let ty = if c["type"] == "FailureTarget" {
                        "Failed"
                    } else {
                        "Complete"
                    };
                    (
                        ty,
                        c["reason"].as_str().unwrap_or("").to_string(),
                        c["message"].as_str().unwrap_or("").to_string(),
                    )
                })
                .unwrap_or(("Complete", String::new(), String::new()));
            let reason_enum = Reason::parse(&reason).unwrap_or(Reason::CompletionsReached);
            set_condition(&mut job, ty, "True", reason_enum, &message);
            if ty == "Complete" {
                job["status"]["completionTime"] = json!(now_rfc3339());
            }
            job["status"]["active"] = json!(0);
            job["status"]["ready"] = json!(0);
            strip_zero(&mut job["status"]);
            self.write_status(key, &job)?;
            if ty == "Complete" {
                self.recorder
                    .record(&self.st, &job, "Normal", "Completed", "Job completed");
            } else {
                self.recorder
                    .record(&self.st, &job, "Warning", &reason, &message);
            }
        }
        Ok(())
    }

    /// Stores `job`'s status (only the status: spec changes made meanwhile are kept).
    fn write_status(&self, key: &str, job: &Value) -> Result<(), String> {
        let want_uid = uid(job).to_string();
        let status = job["status"].clone();
        objects::modify(&self.st, key, &mut |cur| {
            if uid(cur) != want_uid {
                return false;
            }
            cur["status"] = status.clone();
            true
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    async fn create_pod(&mut self, job: &Value, index: Option<i64>, counts: Option<FailureCounts>) {
        let ns = s(job, "/metadata/namespace").to_string();
        let pod = pods::from_template(job, index, counts);
        match objects::create_as_client(&self.st, "", "pods", &ns, pod).await {
            Ok(stored) => {
                let name = s(&stored.object, "/metadata/name").to_string();
                self.memory
                    .entry(uid(job).to_string())
                    .or_default()
                    .pending_creates
                    .insert(
                        objects::key_of("", "pods", Some(&ns), &name),
                        Instant::now(),
                    );
                self.recorder.record(
                    &self.st,
                    job,
                    "Normal",
                    "SuccessfulCreate",
                    &format!("Created pod: {name}"),
                );
            }
            Err(e) => {
                self.recorder.record(
                    &self.st,
                    job,
                    "Warning",
                    "FailedCreate",
                    &format!("Error creating: {e}"),
                );
            }
        }
    }
}

fn str_set(v: &Value, p: &str) -> BTreeSet<String> {
    v.pointer(p)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn uncounted_json(succ: &BTreeSet<String>, fail: &BTreeSet<String>) -> Value {
    let mut o = json!({});
    if !succ.is_empty() {
        o["succeeded"] = json!(succ);
    }
    if !fail.is_empty() {
        o["failed"] = json!(fail);
    }
    o
}

/// Go's `omitempty` on the int32 counters (`ready` and `terminating` are pointers: kept).
fn strip_zero(status: &mut Value) {
    if let Some(o) = status.as_object_mut() {
        for k in ["active", "succeeded", "failed"] {
            if o.get(k).and_then(Value::as_i64) == Some(0) {
                o.remove(k);
            }
        }
    }
}
