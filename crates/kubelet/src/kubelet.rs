//! The kubelet core: what a pod worker does for a pod (sync, terminate, clean up), wired
//! to the runtime, the probers, the status manager and the metrics.

use crate::kuberuntime::sync_pod::pod_name;
use crate::kuberuntime::{KubeRuntime, runtime_pod};
use crate::metrics::Metrics;
use crate::pod_workers::PodSyncer;
use crate::status::{StatusManager, generate_pod_status, set_ready_conditions};
use crate::volumes;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod, PodStatus};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How soon a pod whose sync failed is tried again (upstream's backOffPeriod).
pub const ERROR_RETRY: Duration = Duration::from_secs(10);

pub struct Core {
    pub kr: Arc<KubeRuntime>,
    pub status: StatusManager,
    pub metrics: Arc<Metrics>,
    /// When each pod was first seen (for kubelet_pod_start_duration_seconds).
    first_seen: Mutex<HashMap<String, Instant>>,
    /// When each pod should be synced again at the latest.
    next_sync: Mutex<HashMap<String, Instant>>,
    sync_frequency: Duration,
    /// Pods refused at admission: they never run, their status says why.
    rejected: Mutex<std::collections::HashSet<String>>,
    /// The node's pressure conditions, as the eviction manager last judged them.
    pub pressure: Arc<crate::eviction::Pressure>,
    /// Whether the node is shutting down (node status and admission read it).
    pub shutdown: Arc<crate::nodeshutdown::State>,
    /// Pods the eviction or shutdown manager is killing, with the status they end with.
    abnormal: Mutex<HashMap<String, Abnormal>>,
}

/// Why the kubelet itself ended a pod (upstream's TerminatePodAbnormally callers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbnormalReason {
    /// Node-pressure eviction: its containers and volumes are removed at once, so the
    /// pressure goes away.
    Evicted,
    /// Graceful node shutdown.
    NodeShutdown,
}

impl AbnormalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AbnormalReason::Evicted => crate::eviction::REASON,
            AbnormalReason::NodeShutdown => crate::nodeshutdown::REASON,
        }
    }
}

#[derive(Debug, Clone)]
struct Abnormal {
    reason: AbnormalReason,
    message: String,
}

impl Core {
    pub fn new(
        kr: Arc<KubeRuntime>,
        status: StatusManager,
        metrics: Arc<Metrics>,
        sync_frequency: Duration,
    ) -> Core {
        Core {
            kr,
            status,
            metrics,
            first_seen: Mutex::new(HashMap::new()),
            next_sync: Mutex::new(HashMap::new()),
            sync_frequency,
            rejected: Mutex::new(Default::default()),
            pressure: Arc::default(),
            shutdown: Arc::default(),
            abnormal: Mutex::new(HashMap::new()),
        }
    }

    /// Marks a pod as evicted: once its worker stopped it, it ends Failed with reason
    /// Evicted, `message` and a DisruptionTarget condition, and its containers and volumes
    /// are removed so what it used is reclaimed.
    pub fn mark_evicted(&self, uid: &str, message: &str) {
        self.mark_abnormal(uid, AbnormalReason::Evicted, message);
    }

    /// Marks a pod the shutdown manager is terminating: it ends Failed with reason
    /// Terminated, upstream's message and a DisruptionTarget condition.
    pub fn mark_shutdown(&self, uid: &str) {
        self.mark_abnormal(
            uid,
            AbnormalReason::NodeShutdown,
            crate::nodeshutdown::MESSAGE,
        );
    }

    fn mark_abnormal(&self, uid: &str, reason: AbnormalReason, message: &str) {
        if let Ok(mut m) = self.abnormal.lock() {
            m.insert(
                uid.to_string(),
                Abnormal {
                    reason,
                    message: message.to_string(),
                },
            );
        }
    }

    fn abnormal(&self, uid: &str) -> Option<Abnormal> {
        self.abnormal.lock().ok().and_then(|m| m.get(uid).cloned())
    }

    pub fn is_rejected(&self, uid: &str) -> bool {
        self.rejected
            .lock()
            .map(|r| r.contains(uid))
            .unwrap_or(false)
    }

    /// Whether a pod counts against Allocatable: admitted and not finished.
    pub fn is_active(&self, pod: &Pod) -> bool {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if self.is_rejected(uid) {
            return false;
        }
        !matches!(
            self.status.get(uid).and_then(|s| s.phase).as_deref(),
            Some("Succeeded") | Some("Failed")
        )
    }

    /// Records a pod refused at admission with upstream's terminal status.
    pub fn reject(&self, pod: &Pod, r: crate::admission::Rejection) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        tracing::warn!(pod = %pod_name(pod), reason = %r.reason, message = %r.message, "pod rejected at admission");
        crate::events::recorder().event(
            &crate::events::pod_ref(pod),
            crate::events::WARNING,
            &r.reason.as_string(),
            &r.message,
        );
        if let Ok(mut s) = self.rejected.lock() {
            s.insert(uid.clone());
        }
        let status = PodStatus {
            phase: Some("Failed".into()),
            reason: Some(r.reason.as_string()),
            message: Some(r.message),
            qos_class: Some(nodus_k8s::qos::pod_qos(pod).as_str().to_string()),
            ..Default::default()
        };
        self.status.set(&uid, status);
    }

    /// Takes in a pod the API reports finished, without running it: like a rejected pod,
    /// it has no worker and keeps the status the server has. Its containers have all exited
    /// (the phase is final only then), so volumes a previous kubelet left mounted (it died
    /// between the pod's end and syncTerminatedPod) are unmounted now.
    pub fn adopt_finished(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        tracing::info!(pod = %pod_name(pod), phase = ?pod.status.as_ref().and_then(|s| s.phase.clone()), "pod already finished; not starting it");
        let n = volumes::unmount(&self.kr.settings.root_dir, &uid);
        if n > 0 {
            tracing::info!(pod = %pod_name(pod), volumes = n, "unmounted the finished pod's volumes");
        }
        if let Ok(mut s) = self.rejected.lock() {
            s.insert(uid.clone());
        }
        self.status
            .set(&uid, pod.status.clone().unwrap_or_default());
    }

    pub fn forget_rejected(&self, uid: &str) {
        if let Ok(mut s) = self.rejected.lock() {
            s.remove(uid);
        }
        self.status.remove(uid);
    }

    pub fn seen(&self, uid: &str) {
        if let Ok(mut m) = self.first_seen.lock() {
            m.entry(uid.to_string()).or_insert_with(Instant::now);
        }
    }

    /// Pods due for a resync (their interval passed, or a failed sync's retry is due).
    pub fn due(&self, now: Instant) -> Vec<String> {
        self.next_sync
            .lock()
            .map(|m| {
                m.iter()
                    .filter(|(_, t)| **t <= now)
                    .map(|(u, _)| u.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn schedule(&self, uid: &str, after: Duration) {
        if let Ok(mut m) = self.next_sync.lock() {
            m.insert(uid.to_string(), Instant::now() + after);
        }
    }

    /// Whether the pod passed its deadline and has not been failed for it yet.
    pub fn deadline_needs_sync(&self, pod: &Pod) -> bool {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.active_deadline_exceeded(pod)
            && self.status.get(uid).and_then(|s| s.reason).as_deref() != Some("DeadlineExceeded")
    }

    fn active_deadline_exceeded(&self, pod: &Pod) -> bool {
        let Some(deadline) = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds) else {
            return false;
        };
        let Some(start) = self
            .status
            .get(pod.metadata.uid.as_deref().unwrap_or_default())
            .and_then(|s| s.start_time)
        else {
            return false;
        };
        let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(start.0);
        elapsed.as_secs() >= deadline
    }

    /// One sync of a pod that should run; true when it has reached a terminal phase.
    async fn do_sync(self: Arc<Self>, pod: Pod, op: &'static str) -> bool {
        let started = Instant::now();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.seen(&uid);
        if self.active_deadline_exceeded(&pod) {
            self.fail_deadline(&pod).await;
            self.metrics.observe_worker(op, started.elapsed());
            return true;
        }
        let mut terminal = false;
        self.kr.probes.add_pod(&pod);
        match self.kr.sync_pod(&pod).await {
            Ok((result, rp)) => {
                let userns = pod.spec.as_ref().and_then(|s| s.host_users) == Some(false);
                if let (true, Some(ok)) = (userns, result.sandbox_created) {
                    self.metrics.started_user_namespaced_pods.inc();
                    if !ok {
                        self.metrics.started_user_namespaced_pods_errors.inc();
                    }
                }
                let status = self.compute_status(&pod, &rp);
                self.note_started(&uid, &status);
                terminal = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
                self.status.set(&uid, status);
                for e in &result.errors {
                    tracing::info!(pod = %pod_name(&pod), error = %e, "sync left an error");
                }
                self.schedule(
                    &uid,
                    if result.errors.is_empty() {
                        self.sync_frequency
                    } else {
                        ERROR_RETRY
                    },
                );
                self.kr.gc_pod(&rp).await;
            }
            Err(e) => {
                tracing::warn!(pod = %pod_name(&pod), error = %e.message(), "sync failed: runtime error");
                self.schedule(&uid, ERROR_RETRY);
            }
        }
        self.metrics.observe_worker(op, started.elapsed());
        terminal
    }

    /// Status from a fresh runtime view, readiness settled by the probers.
    pub fn compute_status(&self, pod: &Pod, rp: &runtime_pod::RuntimePod) -> PodStatus {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let reasons = self.kr.waiting_reasons(&uid);
        let kr = Arc::clone(&self.kr);
        let id_of = move |id: &str| kr.container_id(id);
        let mut status = generate_pod_status(
            &self.kr.settings.root_dir,
            pod,
            rp,
            &reasons,
            &id_of,
            &self.kr.settings.host_ips,
        );
        // Keep the old start time and deadline verdicts across syncs.
        if let Some(old) = self.status.get(&uid) {
            if old.reason.as_deref() == Some("DeadlineExceeded") {
                return old;
            }
            if old.start_time.is_some() {
                status.start_time = old.start_time;
            }
        }
        self.kr.probes.update_pod_status(pod, &mut status);
        set_ready_conditions(pod, &mut status);
        status
    }

    fn note_started(&self, uid: &str, status: &PodStatus) {
        let all_running = status.container_statuses.as_ref().is_some_and(|cs| {
            !cs.is_empty()
                && cs
                    .iter()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        });
        if !all_running {
            return;
        }
        if let Ok(mut m) = self.first_seen.lock()
            && let Some(t) = m.remove(uid)
        {
            self.metrics
                .pod_start_duration
                .observe(t.elapsed().as_secs_f64());
        }
    }

    async fn fail_deadline(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Ok(rp) = runtime_pod::pod_status(&self.kr.rt, &uid).await
            && (rp.running().next().is_some() || rp.sandboxes.iter().any(|s| s.ready))
        {
            tracing::info!(pod = %pod_name(pod), "Pod was active on the node longer than the specified deadline; killing it");
            self.kr.kill_pod(pod, &rp, None).await;
        }
        let mut status = match runtime_pod::pod_status(&self.kr.rt, &uid).await {
            Ok(rp) => self.compute_status(pod, &rp),
            Err(_) => self.status.get(&uid).unwrap_or_default(),
        };
        status.phase = Some("Failed".into());
        status.reason = Some("DeadlineExceeded".into());
        status.message =
            Some("Pod was active on the node longer than the specified deadline".into());
        self.status.set(&uid, status);
        self.schedule(&uid, self.sync_frequency);
    }

    async fn do_terminate(self: Arc<Self>, pod: Pod, grace: Option<i64>) {
        let started = Instant::now();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        tracing::info!(pod = %pod_name(&pod), ?grace, "terminating pod");
        self.kr.probes.remove_pod(&pod);
        match runtime_pod::pod_status(&self.kr.rt, &uid).await {
            Ok(rp) => {
                self.kr.kill_pod(&pod, &rp, grace).await;
                if let Ok(after) = runtime_pod::pod_status(&self.kr.rt, &uid).await {
                    let mut status = self.compute_status(&pod, &after);
                    // A terminated pod's containers are all stopped.
                    for cs in status.container_statuses.iter_mut().flatten() {
                        cs.ready = false;
                        if cs.state.as_ref().is_some_and(|s| s.running.is_some()) {
                            cs.state = Some(k8s_openapi::api::core::v1::ContainerState {
                                terminated: Some(ContainerStateTerminated {
                                    exit_code: 137,
                                    reason: Some("Error".into()),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            });
                        }
                    }
                    // upstream's getPhase for a terminal pod: once every container
                    // stopped, the pod ends Succeeded when all exited 0, else Failed (static
                    // pods keep their phase, as upstream's TODO #116484 leaves them).
                    if pod.spec.is_some() && !crate::config::is_static_pod(&pod) {
                        let exits: Vec<i32> = status
                            .container_statuses
                            .iter()
                            .flatten()
                            .map(|c| {
                                c.state
                                    .as_ref()
                                    .and_then(|s| s.terminated.as_ref())
                                    .map_or(-1, |t| t.exit_code)
                            })
                            .collect();
                        if !exits.is_empty() {
                            let ok = exits.iter().all(|e| *e == 0);
                            status.phase = Some(if ok { "Succeeded" } else { "Failed" }.into());
                        }
                    }
                    let abnormal = self.abnormal(&uid);
                    if let Some(a) = &abnormal {
                        set_terminated_abnormally(&mut status, a.reason, &a.message);
                    }
                    self.status.set(&uid, status);
                    if abnormal.is_some_and(|a| a.reason == AbnormalReason::Evicted) {
                        self.reclaim_evicted(&pod).await;
                    } else if after.running().next().is_none() {
                        // upstream's syncTerminatedPod: once no container runs, the
                        // pod's volumes are unmounted; its directory stays until the pod
                        // is deleted.
                        let n = volumes::unmount(&self.kr.settings.root_dir, &uid);
                        if n > 0 {
                            tracing::info!(pod = %pod_name(&pod), volumes = n, "unmounted the terminated pod's volumes");
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(pod = %pod_name(&pod), error = %e.message(), "cannot read pod to terminate it")
            }
        }
        if let Ok(mut m) = self.next_sync.lock() {
            m.remove(&uid);
        }
        tracing::info!(pod = %pod_name(&pod), took = ?started.elapsed(), "pod terminated");
    }

    async fn do_cleanup(self: Arc<Self>, pod: Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let removed = match self.kr.remove_pod(&uid).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(pod = %pod_name(&pod), error = %e.message(), "removing the pod's containers failed; housekeeping retries");
                false
            }
        };
        if let Some(c) = self.kr.objects.get() {
            c.unregister_pod(&uid);
        }
        if let Some(t) = self.kr.tokens.get() {
            t.delete_pod(&uid);
        }
        if let Err(e) = volumes::tear_down(&self.kr.settings.root_dir, &uid) {
            tracing::warn!(pod = %pod_name(&pod), error = %e, "tearing down the pod's volumes failed");
        }
        // Containers the runtime may still run keep their ids until housekeeping sees
        // them gone: no other pod may get the same block meanwhile.
        if removed {
            self.kr.release_user_namespace(&uid);
        }
        self.kr.cm.remove_pod(&uid);
        self.status.remove(&uid);
        if let Ok(mut m) = self.abnormal.lock() {
            m.remove(&uid);
        }
        self.kr.forget(&uid);
        if let Ok(mut m) = self.first_seen.lock() {
            m.remove(&uid);
        }
        tracing::info!(pod = %pod_name(&pod), "pod cleaned up");
    }
}

impl Core {
    /// upstream removes an evicted pod's containers and volumes right after it stopped
    /// (ShouldPodContentBeRemoved), so the pressure that evicted it goes away.
    async fn reclaim_evicted(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let removed = match self.kr.remove_pod(&uid).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(pod = %pod_name(pod), error = %e.message(), "cannot remove the evicted pod's containers");
                false
            }
        };
        if let Err(e) = volumes::tear_down(&self.kr.settings.root_dir, &uid) {
            tracing::warn!(pod = %pod_name(pod), error = %e, "cannot remove the evicted pod's volumes");
        }
        if removed {
            self.kr.release_user_namespace(&uid);
        }
    }
}

/// The terminal status of a pod the kubelet ended itself (upstream's
/// TerminatePodAbnormally): Failed (unless it already succeeded), the reason and message,
/// and a DisruptionTarget condition.
pub fn set_terminated_abnormally(status: &mut PodStatus, reason: AbnormalReason, message: &str) {
    if reason == AbnormalReason::Evicted || status.phase.as_deref() != Some("Succeeded") {
        status.phase = Some("Failed".into());
    }
    status.reason = Some(reason.as_str().into());
    status.message = Some(message.to_string());
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    conditions.retain(|c| c.type_ != "DisruptionTarget");
    conditions.push(k8s_openapi::api::core::v1::PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        reason: Some("TerminationByKubelet".into()),
        message: Some(message.to_string()),
        last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            crate::config::now_timestamp(),
        )),
        ..Default::default()
    });
}

/// upstream's GetActivePods: admitted, not finished, not being torn down — the pods the
/// eviction and shutdown managers may end.
pub fn active_pods(
    pods: &crate::pod::PodManager,
    core: &Core,
    workers: &crate::pod_workers::PodWorkers,
) -> Vec<Pod> {
    pods.all()
        .into_iter()
        .filter(|p| {
            let u = p.metadata.uid.clone().unwrap_or_default();
            !core.is_rejected(&u)
                && core.is_active(p)
                && p.metadata.deletion_timestamp.is_none()
                && workers.phase(&u) == Some(crate::pod_workers::WorkerPhase::Syncing)
        })
        .map(|p| Pod::clone(&p))
        .collect()
}

/// The pod workers' view of the core.
pub struct Syncer(pub Arc<Core>);

impl PodSyncer for Syncer {
    fn sync(&self, pod: Pod, operation: &'static str) -> BoxFuture<'static, bool> {
        Box::pin(Arc::clone(&self.0).do_sync(pod, operation))
    }
    fn terminate(&self, pod: Pod, grace: Option<i64>) -> BoxFuture<'static, ()> {
        Box::pin(Arc::clone(&self.0).do_terminate(pod, grace))
    }
    fn cleanup(&self, pod: Pod) -> BoxFuture<'static, ()> {
        Box::pin(Arc::clone(&self.0).do_cleanup(pod))
    }
}
