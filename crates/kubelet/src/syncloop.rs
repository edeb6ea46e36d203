//! The syncLoop: one select over pod config updates, PLEG events, probe results, the sync
//! tick and the housekeeping tick, dispatching work to the pod workers (upstream's
//! syncLoopIteration). Every decision is logged at debug level.

use crate::config::{PodOperation, PodUpdate};
use crate::kubelet::Core;
use crate::kuberuntime::runtime_pod::list_pods;
use crate::kuberuntime::sync_pod::pod_name;
use crate::pleg::PodLifecycleEvent;
use crate::pod::PodManager;
use crate::pod_workers::{PodWorkers, Update};
use crate::prober::ProbeUpdate;
use crate::volumes;
use k8s_openapi::api::core::v1::Pod;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

/// upstream's housekeepingPeriod.
pub const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

pub struct SyncLoop {
    pub core: Arc<Core>,
    pub workers: PodWorkers,
    pub pods: PodManager,
    /// The UIDs every configured source wants, once each has reported at least once
    /// (`None` before). Orphans are judged against this, not only against the pods this
    /// loop has already taken in: an ADD still queued must not make its pod an orphan, and
    /// a restarting kubelet never kills pods it is about to adopt.
    pub sources_ready: Box<dyn Fn() -> Option<HashSet<String>> + Send + Sync>,
    /// Updated on every iteration, for the `syncloop` health check.
    pub last_iteration: Arc<Mutex<Instant>>,
    /// The pod admit handlers, run on every new pod ([`crate::admission`]).
    pub admit_handlers: crate::admission::Handlers,
}

impl SyncLoop {
    pub async fn run(
        self,
        mut config: UnboundedReceiver<PodUpdate>,
        mut pleg: UnboundedReceiver<PodLifecycleEvent>,
        mut probes: UnboundedReceiver<ProbeUpdate>,
    ) {
        let mut sync_tick = tokio::time::interval(Duration::from_secs(1));
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING_PERIOD);
        sync_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if let Ok(mut t) = self.last_iteration.lock() {
                *t = Instant::now();
            }
            tokio::select! {
                u = config.recv() => match u {
                    Some(u) => self.handle_config(u).await,
                    None => {
                        tracing::info!("pod config closed; syncLoop stops");
                        return;
                    }
                },
                Some(ev) = pleg.recv() => {
                    if self.core.kr.covered.covers(&ev) {
                        tracing::debug!(pod_uid = %ev.pod_uid, event = ?ev.kind, container = %ev.data, "SyncLoop (PLEG): already covered by the sync that made the container");
                    } else if let Some(pod) = self.pods.get(&ev.pod_uid).filter(|p| !self.core.is_rejected(&uid(p))) {
                        tracing::debug!(pod = %pod_name(&pod), event = ?ev.kind, container = %ev.data, "SyncLoop (PLEG)");
                        self.workers.update(Update::Sync(Pod::clone(&pod), "sync"));
                    }
                }
                Some(p) = probes.recv() => {
                    if let Some(pod) = self.pods.get(&p.pod_uid).filter(|p| !self.core.is_rejected(&uid(p))) {
                        tracing::debug!(pod = %pod_name(&pod), container = %p.container_name, probe = ?p.probe, result = ?p.result, "SyncLoop (probe)");
                        self.workers.update(Update::Sync(Pod::clone(&pod), "sync"));
                    }
                }
                _ = sync_tick.tick() => {
                    let mut due: HashSet<String> = self.core.due(Instant::now()).into_iter().collect();
                    // upstream's PodSyncLoopHandlers: a pod past its activeDeadlineSeconds
                    // is synced now, not at its next resync.
                    for pod in self.pods.all() {
                        if !self.core.is_rejected(&uid(&pod)) && self.core.deadline_needs_sync(&pod) {
                            due.insert(uid(&pod));
                        }
                    }
                    for u in due {
                        if let Some(pod) = self.pods.get(&u).filter(|p| !self.core.is_rejected(&uid(p))) {
                            tracing::debug!(pod = %pod_name(&pod), "SyncLoop (SYNC)");
                            self.workers.update(Update::Sync(Pod::clone(&pod), "sync"));
                        }
                    }
                }
                _ = housekeeping.tick() => self.housekeeping().await,
            }
        }
    }

    async fn handle_config(&self, u: PodUpdate) {
        for pod in u.pods {
            let name = pod_name(&pod);
            match u.op {
                PodOperation::Add => {
                    tracing::debug!(pod = %name, source = %u.source, "SyncLoop ADD");
                    // upstream's podWorkers.UpdatePod: a pod the API already reports
                    // finished (evicted or completed before a kubelet restart) is not
                    // started again; it keeps the status it has.
                    let finished = matches!(
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded") | Some("Failed")
                    );
                    if u.source == crate::config::API_SOURCE
                        && finished
                        && !self.workers.is_known(&uid(&pod))
                    {
                        self.pods.set(&pod);
                        self.core.adopt_finished(&pod);
                        continue;
                    }
                    let others: Vec<_> = self
                        .pods
                        .all()
                        .into_iter()
                        .filter(|p| uid(p) != uid(&pod) && self.core.is_active(p))
                        .collect();
                    // A pod already being deleted is not admitted: its worker only stops
                    // what it may still run (upstream skips admission for pods whose
                    // termination was requested), so it never competes for resources.
                    if pod.metadata.deletion_timestamp.is_none() {
                        let r = self
                            .admit_handlers
                            .admit(&crate::admission::PodAdmitAttributes {
                                pod: &pod,
                                other_pods: &others,
                            })
                            .await;
                        if let (false, Some(reason)) = (r.admit, r.reason) {
                            self.pods.set(&pod);
                            self.core.reject(
                                &pod,
                                crate::admission::Rejection {
                                    reason,
                                    message: r.message,
                                },
                            );
                            continue;
                        }
                    }
                    self.core.seen(&uid(&pod));
                    self.pods.set(&pod);
                    self.core.kr.cm.update_tiers(&self.pods.all());
                    if self.workers.update(Update::Sync(pod, "create")) {
                        let label = vec![(
                            "static".to_string(),
                            (u.source != crate::config::API_SOURCE).to_string(),
                        )];
                        self.core.metrics.restarted_pods.get_or_create(&label).inc();
                    }
                }
                PodOperation::Update => {
                    tracing::debug!(pod = %name, source = %u.source, "SyncLoop UPDATE");
                    self.pods.set(&pod);
                    if self.core.is_rejected(&uid(&pod)) {
                        continue;
                    }
                    self.workers.update(Update::Sync(pod, "update"));
                }
                PodOperation::Remove => {
                    tracing::debug!(pod = %name, source = %u.source, "SyncLoop REMOVE");
                    self.pods.remove(&uid(&pod));
                    self.core.kr.cm.update_tiers(&self.pods.all());
                    if self.core.is_rejected(&uid(&pod)) {
                        self.core.forget_rejected(&uid(&pod));
                        continue;
                    }
                    self.workers.update(Update::Kill {
                        pod,
                        grace: None,
                        remove: true,
                    });
                }
                PodOperation::Delete => {
                    tracing::debug!(pod = %name, source = %u.source, "SyncLoop DELETE");
                    self.pods.set(&pod);
                    let grace = pod.metadata.deletion_grace_period_seconds;
                    self.workers.update(Update::Kill {
                        pod,
                        grace,
                        remove: false,
                    });
                }
                PodOperation::Reconcile => {
                    tracing::debug!(pod = %name, source = %u.source, "SyncLoop RECONCILE");
                    self.pods.set(&pod);
                }
            }
        }
    }

    /// upstream's HandlePodCleanups, plus the metrics that need a full listing.
    async fn housekeeping(&self) {
        let desired = self.pods.uids();
        self.core.kr.probes.cleanup_pods(&desired);
        let listed = match list_pods(&self.core.kr.rt).await {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e.message(), "housekeeping: cannot list the runtime's pods");
                return;
            }
        };
        let live: HashSet<&str> = listed
            .values()
            .flat_map(|p| p.containers.iter().map(|(id, _, _)| id.as_str()))
            .collect();
        self.core.kr.covered.retain(&live);
        let running_pods = listed
            .values()
            .filter(|p| p.sandboxes.iter().any(|(_, ready)| *ready))
            .count();
        self.core.metrics.running_pods.set(running_pods as i64);
        let mut by_state: HashMap<&str, i64> = HashMap::new();
        for p in listed.values() {
            for (_, _, s) in &p.containers {
                let name = match cri::runtime::v1::ContainerState::try_from(*s) {
                    Ok(cri::runtime::v1::ContainerState::ContainerCreated) => "created",
                    Ok(cri::runtime::v1::ContainerState::ContainerRunning) => "running",
                    Ok(cri::runtime::v1::ContainerState::ContainerExited) => "exited",
                    _ => "unknown",
                };
                *by_state.entry(name).or_default() += 1;
            }
        }
        for state in ["created", "running", "exited", "unknown"] {
            self.core
                .metrics
                .running_containers
                .get_or_create(&crate::metrics::ContainerStateLabel {
                    container_state: state.into(),
                })
                .set(by_state.get(state).copied().unwrap_or(0));
        }
        let Some(from_sources) = (self.sources_ready)() else {
            return;
        };
        let desired: HashSet<String> = desired.union(&from_sources).cloned().collect();
        // Pods the runtime has that nobody wants: stop and remove them, through a worker
        // so it happens once.
        for (u, summary) in &listed {
            if desired.contains(u) || self.workers.is_known(u) {
                continue;
            }
            tracing::info!(pod_uid = %u, pod = %format!("{}/{}", summary.namespace, summary.name), "cleaning up orphaned pod");
            let mut pod = Pod::default();
            pod.metadata.uid = Some(u.clone());
            pod.metadata.name = Some(summary.name.clone());
            pod.metadata.namespace = Some(summary.namespace.clone());
            self.workers.update(Update::Kill {
                pod,
                grace: None,
                remove: true,
            });
        }
        // Pod directories of pods that are gone.
        let root = &self.core.kr.settings.root_dir;
        if let Some(client) = self.core.kr.objects.get().and_then(|c| c.client()) {
            volumes::persistent::clean_up(root, &client).await;
        }
        for u in volumes::pod_dirs(root) {
            if !desired.contains(&u) && !self.workers.is_known(&u) && !listed.contains_key(&u) {
                tracing::info!(pod_uid = %u, "removing the directory of a deleted pod");
                if let Err(e) = volumes::tear_down(root, &u) {
                    tracing::warn!(pod_uid = %u, error = %e, "cannot remove orphaned pod directory");
                }
            }
        }
        // User namespace blocks of pods that are gone (upstream's
        // CleanupOrphanedPodUsernsAllocations).
        if let Some(m) = self.core.kr.userns.get() {
            for u in m.allocated() {
                if !desired.contains(&u) && !self.workers.is_known(&u) && !listed.contains_key(&u) {
                    tracing::info!(pod_uid = %u, "releasing the user namespace of a deleted pod");
                    m.release(&u);
                }
            }
        }
        // Pod cgroups of pods that are gone (a crash between stop and cleanup).
        for u in self.core.kr.cm.pod_cgroup_uids() {
            if !desired.contains(&u) && !self.workers.is_known(&u) && !listed.contains_key(&u) {
                self.core.kr.cm.remove_pod(&u);
            }
        }
        // Hand memory freed since the last round back to the kernel: bursts (a hundred pods
        // starting, a large /pods response) otherwise stay resident in malloc's free lists.
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only releases free heap pages.
        unsafe {
            libc::malloc_trim(0);
        }
        if let Ok(mut b) = self.core.kr.crash_backoff.lock() {
            b.gc(Instant::now());
        }
    }
}
