//! One probe worker: probes one container periodically with one probe, exactly as
//! upstream's `prober/worker.go` (initial delay from the container's start, startup
//! gating, success/failure thresholds, hold after a liveness or startup failure until the
//! container is replaced).

use super::{Inner, ProbeKey, ProbeResult, ProbeType};
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, Probe};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

pub(super) struct Worker {
    inner: Arc<Inner>,
    key: ProbeKey,
    id: u64,
    /// The pod as first given; the manager's latest copy wins when there is one.
    pod: Arc<Pod>,
    container: Container,
    spec: Probe,
    /// The container the results belong to, as the status names it.
    container_id: Option<String>,
    last_result: Option<ProbeResult>,
    /// How many probes in a row gave `last_result`.
    result_run: i32,
    on_hold: bool,
}

impl Worker {
    pub(super) fn new(
        inner: Arc<Inner>,
        key: ProbeKey,
        id: u64,
        pod: Arc<Pod>,
        container: Container,
        spec: Probe,
    ) -> Self {
        Worker {
            inner,
            key,
            id,
            pod,
            container,
            spec,
            container_id: None,
            last_result: None,
            result_run: 0,
            on_hold: false,
        }
    }

    fn period(&self) -> Duration {
        Duration::from_secs(self.spec.period_seconds.unwrap_or(10).max(1) as u64)
    }

    pub(super) async fn run(mut self, stop: Arc<Notify>, mut trigger: mpsc::Receiver<()>) {
        let period = self.period();
        // After a kubelet restart every worker starts at once; spread them over a period.
        if self.inner.start.elapsed() < period {
            let jitter = period.mul_f64(random_fraction());
            tokio::select! {
                _ = tokio::time::sleep(jitter) => {}
                _ = stop.notified() => { self.finish(); return; }
            }
        }
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let keep_going = tokio::select! {
                k = self.do_probe() => k,
                _ = stop.notified() => false,
            };
            if !keep_going {
                break;
            }
            tokio::select! {
                _ = stop.notified() => break,
                _ = ticker.tick() => {}
                Some(()) = trigger.recv() => {
                    tracing::trace!(probe = %self.key.probe, container = %self.key.container_name, "probe triggered manually");
                }
            }
        }
        self.finish();
    }

    fn finish(&self) {
        if let Some(id) = self.container_id.as_deref() {
            self.inner.results.remove(self.key.probe, id, self.id);
        }
        self.inner.remove_worker(&self.key, self.id);
    }

    fn set(&self, result: ProbeResult) {
        if let Some(id) = self.container_id.as_deref() {
            self.inner.results.set(
                self.key.probe,
                id,
                result,
                &self.key.pod_uid,
                &self.key.container_name,
                self.id,
            );
        }
    }

    /// Probes once and records the result. Returns whether the worker keeps going.
    async fn do_probe(&mut self) -> bool {
        let Some(status) = self.inner.status.pod_status(&self.key.pod_uid) else {
            tracing::trace!(pod_uid = %self.key.pod_uid, "no status for pod");
            return true;
        };
        if matches!(status.phase.as_deref(), Some("Failed") | Some("Succeeded")) {
            tracing::debug!(pod_uid = %self.key.pod_uid, "pod is terminated, exiting probe worker");
            return false;
        }
        let Some(c) = find_status(&status, &self.container.name) else {
            tracing::trace!(pod_uid = %self.key.pod_uid, container = %self.container.name, "probe target container not found");
            return true;
        };
        let cid = c.container_id.clone().unwrap_or_default();
        if self.container_id.as_deref() != Some(cid.as_str()) {
            if let Some(old) = self.container_id.as_deref() {
                self.inner.results.remove(self.key.probe, old, self.id);
            }
            self.container_id = Some(cid.clone());
            self.set(self.key.probe.initial_result());
            // A new container: resume probing.
            self.on_hold = false;
        }
        if self.on_hold {
            return true;
        }
        let pod = self
            .inner
            .current_pod(&self.key.pod_uid)
            .unwrap_or_else(|| self.pod.clone());

        let state = c.state.clone().unwrap_or_default();
        let Some(running) = state.running.as_ref() else {
            tracing::trace!(container = %self.container.name, "non-running container probed");
            self.set(ProbeResult::Failure);
            // Stop once the container is terminated for good.
            let restart_never =
                pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
            return state.terminated.is_none() || !restart_never;
        };

        if pod.metadata.deletion_timestamp.is_some()
            && matches!(self.key.probe, ProbeType::Liveness | ProbeType::Startup)
        {
            tracing::debug!(probe = %self.key.probe, container = %self.container.name, "pod deletion requested, setting probe result to success");
            // A quiet shutdown: no restart of a container that is being deleted.
            self.set(ProbeResult::Success);
            return false;
        }

        let initial_delay = i64::from(self.spec.initial_delay_seconds.unwrap_or(0));
        if let Some(started_at) = running.started_at.as_ref() {
            let since = crate::config::now_timestamp()
                .duration_since(started_at.0)
                .as_secs();
            if since < initial_delay {
                return true;
            }
        }

        let started = c.started == Some(true);
        if started {
            // The startup probe is done once the container started; the worker stays for
            // the next container.
            if self.key.probe == ProbeType::Startup {
                return true;
            }
        } else if self.key.probe != ProbeType::Startup {
            // Liveness and readiness wait for the container to have started.
            return true;
        }

        let started_at = std::time::Instant::now();
        let result = match self
            .inner
            .probe(self.key.probe, &pod, &status, &self.container, &cid)
            .await
        {
            Ok(r) => r,
            // A probe error is thrown away, as upstream.
            Err(_) => return true,
        };
        self.record(&pod, result, started_at.elapsed());

        if self.last_result == Some(result) {
            self.result_run += 1;
        } else {
            self.last_result = Some(result);
            self.result_run = 1;
        }
        let failure_threshold = self.spec.failure_threshold.unwrap_or(3).max(1);
        let success_threshold = self.spec.success_threshold.unwrap_or(1).max(1);
        if (result == ProbeResult::Failure && self.result_run < failure_threshold)
            || (result == ProbeResult::Success && self.result_run < success_threshold)
        {
            return true;
        }
        self.set(result);
        if matches!(self.key.probe, ProbeType::Liveness | ProbeType::Startup)
            && result == ProbeResult::Failure
        {
            // The container will be restarted; stop probing it until a new one appears.
            self.on_hold = true;
            self.result_run = 0;
        }
        true
    }
}

impl Worker {
    /// Counts the probe in `prober_probe_total` and times it in
    /// `prober_probe_duration_seconds`, labelled as upstream's worker does.
    fn record(&self, pod: &Pod, result: ProbeResult, took: Duration) {
        let m = &self.inner.metrics;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        m.results
            .get_or_create(&crate::metrics::ProbeResultLabels {
                probe_type: self.key.probe.name().into(),
                result: match result {
                    ProbeResult::Success => "successful",
                    ProbeResult::Failure => "failed",
                    ProbeResult::Unknown => "unknown",
                }
                .into(),
                container: self.container.name.clone(),
                pod: name.clone(),
                namespace: namespace.clone(),
                pod_uid: self.key.pod_uid.clone(),
            })
            .inc();
        m.duration
            .get_or_create(&crate::metrics::ProbeDurationLabels {
                probe_type: self.key.probe.name().into(),
                container: self.container.name.clone(),
                pod: name,
                namespace,
            })
            .observe(took.as_secs_f64());
    }
}

/// The container's status among app containers, else among init containers; only one
/// that has a container id counts.
fn find_status<'a>(
    status: &'a k8s_openapi::api::core::v1::PodStatus,
    name: &str,
) -> Option<&'a ContainerStatus> {
    let with_id = |list: Option<&'a Vec<ContainerStatus>>| {
        list.into_iter()
            .flatten()
            .find(|c| c.name == name && c.container_id.as_deref().is_some_and(|id| !id.is_empty()))
    };
    with_id(status.container_statuses.as_ref())
        .or_else(|| with_id(status.init_container_statuses.as_ref()))
}

/// A number in [0, 1) that differs between calls, without a random number crate.
fn random_fraction() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}
