//! Pod workers: one task per pod, so work on a pod is serialised while pods proceed in
//! parallel (upstream's podWorkers). Each worker follows upstream's state machine:
//! syncing → terminating (containers stopped within the grace period) → terminated
//! (resources released), entered when the pod is deleted or, as upstream's completeSync,
//! when its sync finds it in a terminal phase; a pod that is removed is torn down exactly once, and a pod
//! re-added with the same UID while terminating waits for the teardown to finish.

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// What the kubelet does for a worker. Implemented by the kubelet core.
pub trait PodSyncer: Send + Sync + 'static {
    /// Reconciles a pod that should run. `operation` is `create`, `update` or `sync`.
    /// Returns true once the pod has reached a terminal phase (Succeeded or Failed,
    /// upstream's isTerminal): the worker then terminates it and syncs it no more.
    fn sync(&self, pod: Pod, operation: &'static str) -> BoxFuture<'static, bool>;
    /// Stops every container of the pod within `grace` (None: the pod's own).
    fn terminate(&self, pod: Pod, grace: Option<i64>) -> BoxFuture<'static, ()>;
    /// Releases what a terminated pod held: containers, sandboxes, volumes, status.
    fn cleanup(&self, pod: Pod) -> BoxFuture<'static, ()>;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerPhase {
    Syncing,
    Terminating,
    Terminated,
}

#[derive(Debug)]
struct WorkerState {
    pod: Pod,
    phase: WorkerPhase,
    /// The next sync's operation, when one is pending.
    pending: Option<&'static str>,
    /// Termination requested (grace) — sticky once set.
    terminate: Option<Option<i64>>,
    /// Remove everything after termination (the pod left its source).
    remove: bool,
    /// A pod with the same UID added while this one was terminating.
    readd: Option<Pod>,
}

struct Worker {
    state: Arc<Mutex<WorkerState>>,
    wake: Arc<Notify>,
}

/// The set of pod workers, by pod UID.
#[derive(Clone)]
pub struct PodWorkers {
    workers: Arc<Mutex<HashMap<String, Worker>>>,
    syncer: Arc<dyn PodSyncer>,
}

/// What the syncLoop asks of a worker.
#[derive(Clone, Debug)]
pub enum Update {
    /// Run (or keep running) this pod; `operation` names why, for the metrics.
    Sync(Pod, &'static str),
    /// Stop the pod's containers; with `remove`, also release everything afterwards.
    Kill {
        pod: Pod,
        grace: Option<i64>,
        remove: bool,
    },
}

impl PodWorkers {
    pub fn new(syncer: Arc<dyn PodSyncer>) -> PodWorkers {
        PodWorkers {
            workers: Arc::new(Mutex::new(HashMap::new())),
            syncer,
        }
    }

    /// Routes an update to the pod's worker, starting one if needed. Returns true when a
    /// pod was re-added under a UID that is still terminating (a static pod restart).
    pub fn update(&self, update: Update) -> bool {
        let update = terminating_if_deleted(update);
        let (uid, pod) = match &update {
            Update::Sync(p, _) | Update::Kill { pod: p, .. } => {
                (p.metadata.uid.clone().unwrap_or_default(), p.clone())
            }
        };
        let Ok(mut workers) = self.workers.lock() else {
            return false;
        };
        let mut restarted = false;
        let worker = workers.entry(uid.clone()).or_insert_with(|| {
            let state = Arc::new(Mutex::new(WorkerState {
                pod: pod.clone(),
                phase: WorkerPhase::Syncing,
                pending: None,
                terminate: None,
                remove: false,
                readd: None,
            }));
            let wake = Arc::new(Notify::new());
            tokio::spawn(run_worker(
                uid.clone(),
                Arc::clone(&state),
                Arc::clone(&wake),
                Arc::clone(&self.syncer),
                Arc::clone(&self.workers),
            ));
            Worker { state, wake }
        });
        if let Ok(mut s) = worker.state.lock() {
            match update {
                Update::Sync(p, op) => {
                    if s.terminate.is_some() {
                        // Upstream refuses to start a pod whose UID is still being torn
                        // down; it starts again once the teardown is over.
                        s.readd = Some(p);
                        restarted = true;
                    } else {
                        s.pod = p;
                        s.pending = Some(match (s.pending, op) {
                            (Some("create"), _) => "create",
                            (_, op) => op,
                        });
                    }
                }
                Update::Kill { pod, grace, remove } => {
                    if s.terminate.is_none() || remove {
                        s.pod = pod;
                    }
                    // A shorter grace period wins, as upstream's.
                    let g = match (s.terminate.flatten(), grace) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => b.or(a),
                    };
                    s.terminate = Some(g);
                    s.remove |= remove;
                    s.readd = None;
                }
            }
        }
        worker.wake.notify_one();
        restarted
    }

    pub fn phase(&self, uid: &str) -> Option<WorkerPhase> {
        let workers = self.workers.lock().ok()?;
        let w = workers.get(uid)?;
        w.state.lock().ok().map(|s| s.phase)
    }

    /// UIDs with a live worker.
    pub fn uids(&self) -> Vec<String> {
        self.workers
            .lock()
            .map(|w| w.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub fn is_known(&self, uid: &str) -> bool {
        self.workers
            .lock()
            .map(|w| w.contains_key(uid))
            .unwrap_or(false)
    }
}

/// upstream's UpdatePod: a pod that carries a deletion timestamp is terminating, whatever
/// the update says, so a pod first seen already deleted (after a kubelet restart, or
/// deleted before the kubelet started it) goes straight to terminating and is never
/// started; its grace period is the one the API server set for the deletion.
fn terminating_if_deleted(update: Update) -> Update {
    match update {
        Update::Sync(pod, _) if pod.metadata.deletion_timestamp.is_some() => {
            let grace = pod.metadata.deletion_grace_period_seconds;
            Update::Kill {
                pod,
                grace,
                remove: false,
            }
        }
        other => other,
    }
}

async fn run_worker(
    uid: String,
    state: Arc<Mutex<WorkerState>>,
    wake: Arc<Notify>,
    syncer: Arc<dyn PodSyncer>,
    workers: Arc<Mutex<HashMap<String, Worker>>>,
) {
    loop {
        wake.notified().await;
        loop {
            // Take the work under the lock, do it without.
            let work = {
                let Ok(mut s) = state.lock() else { return };
                if let Some(grace) = s.terminate {
                    if s.phase == WorkerPhase::Syncing {
                        s.phase = WorkerPhase::Terminating;
                        s.pending = None;
                        Some(Work::Terminate(s.pod.clone(), grace))
                    } else if s.phase == WorkerPhase::Terminating {
                        None
                    } else if s.remove {
                        Some(Work::Cleanup(s.pod.clone()))
                    } else {
                        None
                    }
                } else {
                    s.pending.take().map(|op| Work::Sync(s.pod.clone(), op))
                }
            };
            match work {
                None => break,
                Some(Work::Sync(pod, op)) => {
                    if syncer.sync(pod, op).await
                        && let Ok(mut s) = state.lock()
                    {
                        // upstream's completeSync: a pod that finished goes on to
                        // terminating (its containers have exited; the sandbox stops and
                        // the volumes are unmounted) with its own grace period.
                        s.terminate.get_or_insert(None);
                    }
                }
                Some(Work::Terminate(pod, grace)) => {
                    syncer.terminate(pod, grace).await;
                    if let Ok(mut s) = state.lock() {
                        s.phase = WorkerPhase::Terminated;
                    }
                    // Loop: cleanup follows when the pod was removed.
                }
                Some(Work::Cleanup(pod)) => {
                    syncer.cleanup(pod).await;
                    let readd = {
                        let Ok(mut w) = workers.lock() else { return };
                        let readd = state.lock().ok().and_then(|mut s| s.readd.take());
                        match readd {
                            Some(p) => {
                                // Same UID again: start over in this worker.
                                if let Ok(mut s) = state.lock() {
                                    s.pod = p;
                                    s.phase = WorkerPhase::Syncing;
                                    s.terminate = None;
                                    s.remove = false;
                                    s.pending = Some("create");
                                }
                                true
                            }
                            None => {
                                w.remove(&uid);
                                false
                            }
                        }
                    };
                    if !readd {
                        return;
                    }
                }
            }
        }
    }
}

enum Work {
    Sync(Pod, &'static str),
    Terminate(Pod, Option<i64>),
    Cleanup(Pod),
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::time::Duration;

    /// Records the calls; its syncs report the pod terminal when `terminal` is set.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>, std::sync::atomic::AtomicBool);

    impl PodSyncer for Arc<Recorder> {
        fn sync(&self, _pod: Pod, operation: &'static str) -> BoxFuture<'static, bool> {
            self.0.lock().unwrap().push(format!("sync {operation}"));
            let terminal = self.1.load(std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move { terminal })
        }
        fn terminate(&self, _pod: Pod, grace: Option<i64>) -> BoxFuture<'static, ()> {
            self.0.lock().unwrap().push(format!("terminate {grace:?}"));
            Box::pin(async {})
        }
        fn cleanup(&self, _pod: Pod) -> BoxFuture<'static, ()> {
            self.0.lock().unwrap().push("cleanup".into());
            Box::pin(async {})
        }
    }

    fn pod(deleted: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some("u1".into());
        p.metadata.name = Some("p".into());
        if deleted {
            p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
            p.metadata.deletion_grace_period_seconds = Some(7);
        }
        p
    }

    async fn settle(workers: &PodWorkers, uid: &str, phase: Option<WorkerPhase>) {
        for _ in 0..200 {
            if workers.phase(uid) == phase {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("worker of {uid} never reached {phase:?}");
    }

    #[tokio::test]
    async fn a_pod_first_seen_deleted_is_terminated_never_started() {
        let rec = Arc::new(Recorder::default());
        let workers = PodWorkers::new(Arc::new(Arc::clone(&rec)));
        workers.update(Update::Sync(pod(true), "create"));
        settle(&workers, "u1", Some(WorkerPhase::Terminated)).await;
        // Later syncs (PLEG, resync) of the deleted pod change nothing.
        workers.update(Update::Sync(pod(true), "sync"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec!["terminate Some(7)".to_string()]
        );
        // Its removal from the source releases it.
        workers.update(Update::Kill {
            pod: pod(true),
            grace: None,
            remove: true,
        });
        settle(&workers, "u1", None).await;
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec!["terminate Some(7)".to_string(), "cleanup".to_string()]
        );
    }

    #[tokio::test]
    async fn a_running_pod_updated_with_a_deletion_timestamp_terminates() {
        let rec = Arc::new(Recorder::default());
        let workers = PodWorkers::new(Arc::new(Arc::clone(&rec)));
        workers.update(Update::Sync(pod(false), "create"));
        for _ in 0..200 {
            if !rec.0.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        workers.update(Update::Sync(pod(true), "update"));
        settle(&workers, "u1", Some(WorkerPhase::Terminated)).await;
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec!["sync create".to_string(), "terminate Some(7)".to_string()]
        );
    }

    #[tokio::test]
    async fn a_pod_that_finished_is_terminated_once_and_synced_no_more() {
        let rec = Arc::new(Recorder::default());
        let workers = PodWorkers::new(Arc::new(Arc::clone(&rec)));
        rec.1.store(true, std::sync::atomic::Ordering::SeqCst);
        workers.update(Update::Sync(pod(false), "create"));
        settle(&workers, "u1", Some(WorkerPhase::Terminated)).await;
        workers.update(Update::Sync(pod(false), "sync"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec!["sync create".to_string(), "terminate None".to_string()]
        );
        // Deleting it later releases what it held.
        workers.update(Update::Kill {
            pod: pod(true),
            grace: None,
            remove: true,
        });
        settle(&workers, "u1", None).await;
        assert_eq!(rec.0.lock().unwrap().last().unwrap(), "cleanup");
    }
}
