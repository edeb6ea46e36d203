//! Startup, liveness and readiness probes (upstream's `pkg/kubelet/prober`).
//!
//! [`ProbeManager`] runs one worker task per (pod, container, probe type) that has a probe.
//! A worker reads the kubelet's latest pod status through [`PodStatusProvider`], probes
//! with the exec ([`exec`]), httpGet ([`http`]), tcpSocket ([`tcp`]) or grpc ([`grpc`])
//! handler, applies the thresholds and sends every change of result as a [`ProbeUpdate`].
//! Liveness and startup failures are acted on by the caller (restart the container);
//! readiness feeds [`ProbeManager::update_pod_status`].

pub mod exec;
pub mod grpc;
pub mod handler;
pub mod http;
mod results;
pub mod tcp;
mod worker;

use crate::cri::RuntimeClient;
use handler::Outcome;
use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, Probe};
use results::{Results, lock};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc};

/// Which of a container's probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeType {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeType {
    /// The name upstream uses in messages: `Liveness`, `Readiness`, `Startup`.
    pub fn name(self) -> &'static str {
        match self {
            ProbeType::Liveness => "Liveness",
            ProbeType::Readiness => "Readiness",
            ProbeType::Startup => "Startup",
        }
    }

    /// The value before the first probe ran (upstream's `initialValue`): a container is
    /// alive until proven otherwise, not ready until proven ready, and of unknown startup.
    pub fn initial_result(self) -> ProbeResult {
        match self {
            ProbeType::Liveness => ProbeResult::Success,
            ProbeType::Readiness => ProbeResult::Failure,
            ProbeType::Startup => ProbeResult::Unknown,
        }
    }

    fn of(self, container: &Container) -> Option<&Probe> {
        match self {
            ProbeType::Liveness => container.liveness_probe.as_ref(),
            ProbeType::Readiness => container.readiness_probe.as_ref(),
            ProbeType::Startup => container.startup_probe.as_ref(),
        }
    }
}

impl std::fmt::Display for ProbeType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A probe's current verdict on a container (upstream's `results.Result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    Success,
    Failure,
    Unknown,
}

/// A change of a probe result. `container_id` is the bare runtime id (no `runtime://`).
#[derive(Clone, Debug)]
pub struct ProbeUpdate {
    pub pod_uid: String,
    pub container_name: String,
    pub container_id: String,
    pub probe: ProbeType,
    pub result: ProbeResult,
}

/// What the probers need to know about a pod: the kubelet's latest computed status
/// (containerStatuses with containerID, state.running.startedAt, started; podIP; phase).
pub trait PodStatusProvider: Send + Sync + 'static {
    fn pod_status(&self, pod_uid: &str) -> Option<PodStatus>;
}

/// Upstream retries a probe that errored (not one that failed) this many times.
const MAX_PROBE_RETRIES: usize = 3;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ProbeKey {
    pod_uid: String,
    container_name: String,
    probe: ProbeType,
}

struct WorkerHandle {
    id: u64,
    stop: Arc<Notify>,
    trigger: mpsc::Sender<()>,
}

struct Inner {
    runtime: RuntimeClient,
    status: Arc<dyn PodStatusProvider>,
    http: Result<http::HttpProber, String>,
    results: Results,
    workers: Mutex<HashMap<ProbeKey, WorkerHandle>>,
    /// The latest pod object per UID, so workers see a deletion timestamp set after they
    /// started.
    pods: Mutex<HashMap<String, Arc<Pod>>>,
    start: Instant,
    next_id: AtomicU64,
    metrics: crate::metrics::ProberMetrics,
}

/// Runs the probe workers. Cheap to clone; clones share the workers and results.
#[derive(Clone)]
pub struct ProbeManager {
    inner: Arc<Inner>,
}

impl ProbeManager {
    /// A manager and the stream of result changes (the syncLoop's probe channel).
    pub fn new(
        runtime: RuntimeClient,
        status: Arc<dyn PodStatusProvider>,
    ) -> (ProbeManager, mpsc::UnboundedReceiver<ProbeUpdate>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let http = http::HttpProber::new().map_err(|e| {
            tracing::error!(error = %e, "cannot build the HTTP probe client; httpGet probes will error");
            e.to_string()
        });
        let inner = Inner {
            runtime,
            status,
            http,
            results: Results::new(tx),
            workers: Mutex::new(HashMap::new()),
            pods: Mutex::new(HashMap::new()),
            start: Instant::now(),
            next_id: AtomicU64::new(1),
            metrics: crate::metrics::ProberMetrics::new(),
        };
        (
            ProbeManager {
                inner: Arc::new(inner),
            },
            rx,
        )
    }

    /// Starts a worker for every probe of the pod's containers (and restartable init
    /// containers) that has none yet; refreshes the pod the workers see. Must be called
    /// within a tokio runtime.
    pub fn add_pod(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone().filter(|u| !u.is_empty()) else {
            tracing::warn!(pod = %crate::config::pod_full_name(pod), "probe manager: pod without UID ignored");
            return;
        };
        let pod = Arc::new(pod.clone());
        lock(&self.inner.pods).insert(uid.clone(), pod.clone());
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::error!("probe manager: add_pod called outside a tokio runtime");
            return;
        };
        let mut workers = lock(&self.inner.workers);
        for container in probed_containers(&pod) {
            for probe in [
                ProbeType::Startup,
                ProbeType::Readiness,
                ProbeType::Liveness,
            ] {
                let Some(spec) = probe.of(container) else {
                    continue;
                };
                let key = ProbeKey {
                    pod_uid: uid.clone(),
                    container_name: container.name.clone(),
                    probe,
                };
                if workers.contains_key(&key) {
                    continue;
                }
                let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                let stop = Arc::new(Notify::new());
                let (trigger_tx, trigger_rx) = mpsc::channel(1);
                let w = worker::Worker::new(
                    self.inner.clone(),
                    key.clone(),
                    id,
                    pod.clone(),
                    container.clone(),
                    spec.clone(),
                );
                rt.spawn(w.run(stop.clone(), trigger_rx));
                workers.insert(
                    key,
                    WorkerHandle {
                        id,
                        stop,
                        trigger: trigger_tx,
                    },
                );
            }
        }
    }

    /// Stops the pod's workers; each clears its results as it exits. A pod added again
    /// right away gets new workers even if the old ones have not finished yet.
    pub fn remove_pod(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        lock(&self.inner.pods).remove(uid);
        self.stop_workers(|key| key.pod_uid == uid);
    }

    /// Stops the chosen workers and forgets them at once.
    fn stop_workers(&self, mut which: impl FnMut(&ProbeKey) -> bool) {
        lock(&self.inner.workers).retain(|key, w| {
            if which(key) {
                w.stop.notify_one();
                false
            } else {
                true
            }
        });
    }

    /// Stops the pod's liveness and startup workers while it terminates (upstream's
    /// `StopLivenessAndStartup`): a container being stopped must not be restarted for
    /// failing them. Readiness keeps running so the pod turns not ready.
    pub fn stop_liveness_and_startup(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        self.stop_workers(|key| {
            key.pod_uid == uid && matches!(key.probe, ProbeType::Liveness | ProbeType::Startup)
        });
    }

    /// Stops the workers of every pod not in `desired_pod_uids`.
    pub fn cleanup_pods(&self, desired_pod_uids: &HashSet<String>) {
        lock(&self.inner.pods).retain(|uid, _| desired_pod_uids.contains(uid));
        self.stop_workers(|key| !desired_pod_uids.contains(&key.pod_uid));
    }

    /// The current result of a probe for a container (bare or `runtime://` id); `None` if
    /// no worker has seen that container.
    pub fn result(&self, probe: ProbeType, container_id: &str) -> Option<ProbeResult> {
        self.inner.results.get(probe, container_id)
    }

    /// The last failure (or warning) message of a probe for a container, worded as
    /// upstream's event: `Liveness probe failed: HTTP probe failed with statuscode: 500`.
    pub fn last_message(&self, probe: ProbeType, container_id: &str) -> Option<String> {
        self.inner.results.message(probe, container_id)
    }

    /// `/metrics/probes`: every probe run so far, by result, in the text exposition format.
    pub fn metrics_text(&self) -> String {
        self.inner.metrics.encode()
    }

    /// How many probe workers run (for metrics and tests); stopped ones are not counted.
    pub fn worker_count(&self) -> usize {
        lock(&self.inner.workers).len()
    }

    /// Sets `started` and `ready` of the container statuses like upstream's
    /// `UpdatePodStatus`: started once running and the startup probe (if any) succeeded;
    /// ready once started, running and the readiness probe (if any) succeeded. A container
    /// that waits on a readiness probe gets it run right away.
    pub fn update_pod_status(&self, pod: &Pod, status: &mut PodStatus) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        for c in status.container_statuses.iter_mut().flatten() {
            let started = self.is_container_started(&uid, c);
            c.started = Some(started);
            if !started {
                c.ready = false;
                continue;
            }
            c.ready = self.is_ready(&uid, c);
        }
        let spec = pod.spec.as_ref();
        for c in status.init_container_statuses.iter_mut().flatten() {
            let started = self.is_container_started(&uid, c);
            c.started = Some(started);
            let Some(init) = spec
                .and_then(|s| s.init_containers.as_ref())
                .and_then(|ics| ics.iter().find(|ic| ic.name == c.name))
            else {
                continue;
            };
            if !is_restartable_init_container(init) {
                if c.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0)
                {
                    c.ready = true;
                }
                continue;
            }
            if !started {
                c.ready = false;
                continue;
            }
            c.ready = self.is_ready(&uid, c);
        }
    }

    fn is_running(c: &k8s_openapi::api::core::v1::ContainerStatus) -> bool {
        c.state.as_ref().and_then(|s| s.running.as_ref()).is_some()
    }

    fn is_container_started(
        &self,
        pod_uid: &str,
        c: &k8s_openapi::api::core::v1::ContainerStatus,
    ) -> bool {
        if !Self::is_running(c) {
            return false;
        }
        if let Some(id) = c.container_id.as_deref()
            && let Some(r) = self.inner.results.get(ProbeType::Startup, id)
        {
            return r == ProbeResult::Success;
        }
        // A startup probe that has not run yet keeps the container not started.
        !self.has_worker(pod_uid, &c.name, ProbeType::Startup)
    }

    fn is_ready(&self, pod_uid: &str, c: &k8s_openapi::api::core::v1::ContainerStatus) -> bool {
        if !Self::is_running(c) {
            return false;
        }
        if let Some(id) = c.container_id.as_deref()
            && self.inner.results.get(ProbeType::Readiness, id) == Some(ProbeResult::Success)
        {
            return true;
        }
        let key = ProbeKey {
            pod_uid: pod_uid.to_string(),
            container_name: c.name.clone(),
            probe: ProbeType::Readiness,
        };
        match lock(&self.inner.workers).get(&key) {
            // No readiness probe: ready once started.
            None => true,
            Some(w) => {
                // Probe now instead of waiting a whole period to turn ready.
                let _ = w.trigger.try_send(());
                false
            }
        }
    }

    fn has_worker(&self, pod_uid: &str, container_name: &str, probe: ProbeType) -> bool {
        lock(&self.inner.workers).contains_key(&ProbeKey {
            pod_uid: pod_uid.to_string(),
            container_name: container_name.to_string(),
            probe,
        })
    }
}

/// Upstream's `IsRestartableInitContainer`: a sidecar (`restartPolicy: Always`).
fn is_restartable_init_container(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// App containers and sidecars: the containers that get probes.
fn probed_containers(pod: &Pod) -> Vec<&Container> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let mut out: Vec<&Container> = spec.containers.iter().collect();
    out.extend(
        spec.init_containers
            .iter()
            .flatten()
            .filter(|c| is_restartable_init_container(c)),
    );
    out
}

impl Inner {
    fn remove_worker(&self, key: &ProbeKey, id: u64) {
        let mut workers = lock(&self.workers);
        if workers.get(key).is_some_and(|w| w.id == id) {
            workers.remove(key);
        }
    }

    fn current_pod(&self, uid: &str) -> Option<Arc<Pod>> {
        lock(&self.pods).get(uid).cloned()
    }

    /// Upstream's `prober.probe`: runs the handler (retrying errors), records the message
    /// for events, and maps the outcome to a result. `Err` means the result is to be
    /// thrown away.
    async fn probe(
        &self,
        probe_type: ProbeType,
        pod: &Pod,
        status: &PodStatus,
        container: &Container,
        container_id: &str,
    ) -> Result<ProbeResult, String> {
        let Some(spec) = probe_type.of(container) else {
            return Ok(ProbeResult::Success);
        };
        let mut last_err = String::new();
        let mut outcome = None;
        for _ in 0..MAX_PROBE_RETRIES {
            match self
                .run_probe(spec, pod, status, container, container_id)
                .await
            {
                Ok(r) => {
                    outcome = Some(r);
                    break;
                }
                Err(e) => last_err = e,
            }
        }
        let pod_name = crate::config::pod_full_name(pod);
        let Some(r) = outcome else {
            tracing::warn!(probe = %probe_type, pod = %pod_name, container = %container.name, error = %last_err, "Probe errored");
            self.results.set_message(
                probe_type,
                container_id,
                format!("{probe_type} probe errored and resulted in unknown state: {last_err}"),
            );
            return Err(last_err);
        };
        match r.outcome {
            Outcome::Success => {
                tracing::trace!(probe = %probe_type, pod = %pod_name, container = %container.name, "Probe succeeded");
                Ok(ProbeResult::Success)
            }
            Outcome::Warning => {
                let msg = format!("{probe_type} probe warning: {}", r.output);
                tracing::warn!(probe = %probe_type, pod = %pod_name, container = %container.name, "{msg}");
                self.results.set_message(probe_type, container_id, msg);
                Ok(ProbeResult::Success)
            }
            Outcome::Failure => {
                let msg = format!("{probe_type} probe failed: {}", r.output);
                tracing::info!(probe = %probe_type, pod = %pod_name, container = %container.name, "{msg}");
                crate::events::recorder().event(
                    &crate::events::container_ref(pod, &container.name),
                    crate::events::WARNING,
                    "Unhealthy",
                    &msg,
                );
                self.results.set_message(probe_type, container_id, msg);
                Ok(ProbeResult::Failure)
            }
            Outcome::Unknown => {
                tracing::debug!(probe = %probe_type, pod = %pod_name, container = %container.name, "Probe unknown without error");
                Ok(ProbeResult::Failure)
            }
        }
    }

    async fn run_probe(
        &self,
        spec: &Probe,
        pod: &Pod,
        status: &PodStatus,
        container: &Container,
        container_id: &str,
    ) -> Result<handler::HandlerResult, String> {
        let timeout = Duration::from_secs(spec.timeout_seconds.unwrap_or(1).max(1) as u64);
        let pod_ip = status.pod_ip.as_deref().unwrap_or_default();
        if let Some(exec_action) = spec.exec.as_ref() {
            let cmd = exec_action.command.clone().unwrap_or_default();
            return exec::probe(&self.runtime, container_id, &cmd, timeout).await;
        }
        if let Some(action) = spec.http_get.as_ref() {
            let prober = self.http.as_ref().map_err(Clone::clone)?;
            let req = http::build_request(action, container, pod_ip, http::Purpose::Probe)?;
            return prober.probe(&req, timeout).await;
        }
        if let Some(action) = spec.tcp_socket.as_ref() {
            let port = handler::resolve_container_port(&action.port, container)?;
            let host = match action.host.as_deref() {
                Some(h) if !h.is_empty() => h,
                _ => pod_ip,
            };
            if host.is_empty() {
                return Err("no host to probe: the pod has no IP yet".to_string());
            }
            return Ok(tcp::probe(host, port, timeout).await);
        }
        if let Some(action) = spec.grpc.as_ref() {
            let port = u16::try_from(action.port)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("invalid port number: {}", action.port))?;
            if pod_ip.is_empty() {
                return Err("no host to probe: the pod has no IP yet".to_string());
            }
            let service = action.service.as_deref().unwrap_or_default();
            return Ok(grpc::probe(pod_ip, port, service, timeout).await);
        }
        Err(format!(
            "missing probe handler for {}:{}",
            crate::config::format_pod(pod),
            container.name
        ))
    }
}
