//! The eviction manager (upstream's pkg/kubelet/eviction): every monitoring interval it
//! observes the node's signals ([`signals`]), compares them with the configured
//! thresholds ([`thresholds`]), reports MemoryPressure / DiskPressure / PIDPressure (held
//! for the pressure transition period after a threshold clears), and, when a hard
//! threshold is met or a soft one has been met for its grace period, first frees what the
//! node itself holds ([`reclaim`]: unused images), then evicts at most one pod ranked first
//! for the starved resource ([`rank`]). The conditions also drive admission
//! ([`admission`]). The manager is handed what it needs of the kubelet (the active pods, a
//! kill) rather than the kubelet itself, as upstream's NewManager is.

pub mod admission;
pub mod rank;
pub mod reclaim;
pub mod signals;
pub mod thresholds;

use crate::kuberuntime::KubeRuntime;
use crate::kuberuntime::sync_pod::pod_name;
use crate::metrics::Metrics;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use thresholds::{
    DISK_PRESSURE, MEMORY_PRESSURE, Observations, PID_PRESSURE, Signal, Threshold, thresholds_met,
};

/// The pod status reason of an evicted or pressure-rejected pod (upstream's eviction.Reason).
pub const REASON: &str = "Evicted";
/// upstream's default evictionPressureTransitionPeriod.
pub const DEFAULT_PRESSURE_TRANSITION: Duration = Duration::from_secs(300);
/// upstream's monitoring interval (the kubelet's housekeeping of cAdvisor stats).
pub const DEFAULT_MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// The grace period of a pod evicted for a hard threshold (upstream's
/// immediateEvictionGracePeriodSeconds).
pub const IMMEDIATE_GRACE_SECONDS: i64 = 1;
/// How long the first round waits for every pod source to have been seen.
const SOURCES_WAIT: Duration = Duration::from_secs(60);
/// How long the manager waits for an evicted pod to be torn down before looking again
/// (upstream's podCleanupTimeout).
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The eviction settings (KubeletConfiguration's eviction* fields).
#[derive(Clone, Debug)]
pub struct Config {
    pub thresholds: Vec<Threshold>,
    pub pressure_transition_period: Duration,
    /// evictionMaxPodGracePeriod: the most a pod evicted for a soft threshold gets; 0 or
    /// less leaves the pod's own terminationGracePeriodSeconds.
    pub max_pod_grace_period_seconds: i64,
    pub monitoring_interval: Duration,
}

/// The pressure conditions the node reports now, shared with node status and admission.
#[derive(Debug, Default)]
pub struct Pressure {
    conditions: RwLock<Vec<&'static str>>,
}

impl Pressure {
    /// MemoryPressure, DiskPressure, PIDPressure — those that hold, in that order.
    pub fn conditions(&self) -> Vec<&'static str> {
        self.conditions
            .read()
            .map(|c| c.clone())
            .unwrap_or_default()
    }
    pub fn has(&self, condition: &str) -> bool {
        self.conditions().contains(&condition)
    }
    pub fn memory(&self) -> bool {
        self.has(MEMORY_PRESSURE)
    }
    pub fn disk(&self) -> bool {
        self.has(DISK_PRESSURE)
    }
    pub fn pid(&self) -> bool {
        self.has(PID_PRESSURE)
    }
    pub fn set(&self, c: Vec<&'static str>) {
        if let Ok(mut g) = self.conditions.write() {
            *g = c;
        }
    }
}

/// What the manager remembers between rounds: when each threshold was first seen met,
/// when each condition was last seen, and the thresholds met at the end of the last round
/// (they stay met until their minimum reclaim is satisfied).
#[derive(Debug, Default)]
pub struct Tracker {
    first_observed: Vec<(Threshold, Instant)>,
    conditions_last_observed: BTreeMap<&'static str, Instant>,
    met: Vec<Threshold>,
}

impl Tracker {
    /// One round of upstream's synchronize bookkeeping. Returns the node conditions to
    /// report and the thresholds whose grace periods are over (what drives eviction).
    pub fn step(
        &mut self,
        thresholds: &[Threshold],
        obs: &Observations,
        transition: Duration,
        now: Instant,
    ) -> (Vec<&'static str>, Vec<Threshold>) {
        let mut met = thresholds_met(thresholds, obs, false);
        for t in thresholds_met(&self.met, obs, true) {
            if !met.contains(&t) {
                met.push(t);
            }
        }
        let first: Vec<(Threshold, Instant)> = met
            .iter()
            .map(|t| {
                let at = self
                    .first_observed
                    .iter()
                    .find(|(o, _)| o == t)
                    .map_or(now, |(_, at)| *at);
                (t.clone(), at)
            })
            .collect();
        for t in &met {
            self.conditions_last_observed
                .insert(t.signal.node_condition(), now);
        }
        let conditions: Vec<&'static str> = [MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE]
            .into_iter()
            .filter(|c| {
                self.conditions_last_observed
                    .get(c)
                    .is_some_and(|at| *at == now || now.duration_since(*at) < transition)
            })
            .collect();
        let with_grace: Vec<Threshold> = first
            .iter()
            .filter(|(t, at)| now.duration_since(*at) >= t.grace_period)
            .map(|(t, _)| t.clone())
            .collect();
        self.first_observed = first;
        self.met = with_grace.clone();
        (conditions, with_grace)
    }
}

/// Memory first, then the others in their configured order (upstream's byEvictionPriority).
pub fn by_eviction_priority(thresholds: &mut [Threshold]) {
    thresholds.sort_by_key(|t| {
        !matches!(
            t.signal,
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
        )
    });
}

/// The grace period an evicted pod gets: [`IMMEDIATE_GRACE_SECONDS`] for a hard threshold;
/// for a soft one, the pod's own capped at evictionMaxPodGracePeriod.
pub fn eviction_grace(pod: &Pod, hard: bool, max_pod_grace: i64) -> i64 {
    if hard {
        return IMMEDIATE_GRACE_SECONDS;
    }
    let own = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    if max_pod_grace > 0 {
        own.min(max_pod_grace)
    } else {
        own
    }
}

/// The running manager.
pub struct Manager {
    pub config: Config,
    pub pressure: Arc<Pressure>,
    /// The runtime, the container manager and the root directory the signals are read from.
    pub kr: Arc<KubeRuntime>,
    pub metrics: Arc<Metrics>,
    /// upstream's ActivePodsFunc: pods admitted, not finished, not being torn down.
    pub active_pods: ActivePodsFunc,
    /// upstream's KillPodFunc.
    pub kill_pod: KillPodFunc,
    pub node: String,
    pub pod_logs_dir: PathBuf,
    /// True once every pod source has been seen and its pods taken in, so pods that ran
    /// before a restart are admitted as before rather than judged under fresh pressure.
    pub sources_seen: Box<dyn Fn() -> bool + Send + Sync>,
}

/// The pods eviction may choose from.
pub type ActivePodsFunc = Box<dyn Fn() -> Vec<Pod> + Send + Sync>;

/// Stops a pod with the grace period given, failing it with reason Evicted and the message
/// given; resolves once the pod's containers have stopped.
pub type KillPodFunc = Arc<dyn Fn(Pod, i64, String) -> BoxFuture<'static, ()> + Send + Sync>;

impl Manager {
    pub async fn run(self) {
        if self.config.thresholds.is_empty() {
            tracing::info!("Eviction manager: no thresholds configured; not monitoring");
            return;
        }
        // A source that never answers (an unreachable manifest URL) must not switch
        // eviction off: after a while the manager starts regardless.
        let give_up = Instant::now() + SOURCES_WAIT;
        while !(self.sources_seen)() && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tracing::info!(thresholds = ?self.config.thresholds.iter().map(|t| t.signal.as_str()).collect::<Vec<_>>(), interval = ?self.config.monitoring_interval, "Eviction manager: starting control loop");
        let cgroups = self.kr.cm.cgroups().clone();
        let mut tracker = Tracker::default();
        loop {
            match self.synchronize(&mut tracker, cgroups.as_ref()).await {
                Some(stopped) => {
                    // upstream's waitForPodsCleanup: the next round judges the node only
                    // once what the evicted pod held is given back.
                    if tokio::time::timeout(CLEANUP_TIMEOUT, stopped).await.is_ok() {
                        tracing::info!("Eviction manager: pod successfully cleaned up");
                    } else {
                        tracing::info!(
                            "Eviction manager: timed out waiting for pod to be cleaned up"
                        );
                    }
                }
                None => tokio::time::sleep(self.config.monitoring_interval).await,
            }
        }
    }

    async fn image_fs(&self) -> Option<PathBuf> {
        let r = self
            .kr
            .rt
            .image
            .clone()
            .image_fs_info(cri::runtime::v1::ImageFsInfoRequest {})
            .await
            .ok()?;
        r.into_inner()
            .image_filesystems
            .into_iter()
            .next()
            .and_then(|f| f.fs_id)
            .map(|id| PathBuf::from(id.mountpoint))
            .filter(|p| !p.as_os_str().is_empty())
    }

    /// One round (upstream's synchronize); returns, when it evicted a pod, what resolves
    /// once that pod has stopped.
    async fn synchronize(
        &self,
        tracker: &mut Tracker,
        cgroups: &dyn nodus_cgroups::CgroupManager,
    ) -> Option<BoxFuture<'static, ()>> {
        let cm = &self.kr.cm;
        let kubepods = cm
            .config
            .layout
            .per_qos
            .then(|| cm.config.layout.kubepods());
        let image_fs = self.image_fs().await;
        let root_dir = self.kr.settings.root_dir.clone();
        let sources = signals::Sources {
            cgroups,
            memory_capacity: cm.capacity.memory_bytes,
            allocatable_memory: cm.allocatable.memory_bytes,
            kubepods: kubepods.as_deref(),
            root_dir: &root_dir,
            image_fs: image_fs.as_deref(),
        };
        let obs = signals::observe(&sources);
        tracing::debug!(observations = ?obs, "Eviction manager: observations");
        let (conditions, mut met) = tracker.step(
            &self.config.thresholds,
            &obs,
            self.config.pressure_transition_period,
            Instant::now(),
        );
        let before = self.pressure.conditions();
        if before != conditions {
            tracing::info!(node = %self.node, conditions = ?conditions, "Eviction manager: node conditions changed");
        }
        self.pressure.set(conditions);
        if met.is_empty() {
            tracing::debug!("Eviction manager: no resources are starved");
            return None;
        }
        by_eviction_priority(&mut met);
        let to_reclaim = met[0].clone();
        let resource = to_reclaim.signal.resource();
        tracing::info!(resource, signal = %to_reclaim.signal, "Eviction manager: attempting to reclaim");
        crate::events::recorder().event(
            &crate::events::node_ref(&self.node),
            crate::events::WARNING,
            "EvictionThresholdMet",
            &format!("Attempting to reclaim {resource}"),
        );
        if self.reclaim_node_level(&to_reclaim, &sources).await {
            tracing::info!(
                resource,
                "Eviction manager: able to reduce resource pressure without evicting pods."
            );
            return None;
        }
        tracing::info!(resource, "Eviction manager: must evict pod(s) to reclaim");
        let mut active = (self.active_pods)();
        if active.is_empty() {
            tracing::error!(
                "Eviction manager: eviction thresholds have been met, but no pods are active to evict"
            );
            return None;
        }
        let usage = match signals::pod_usage(&self.kr.rt, &root_dir, &self.pod_logs_dir).await {
            Ok(u) => u,
            Err(e) => {
                tracing::error!(error = %e.message(), "Eviction manager: failed to get pod stats");
                return None;
            }
        };
        let usage_of = |p: &Pod| usage.get(p.metadata.uid.as_deref().unwrap_or_default());
        rank::rank(to_reclaim.signal, &mut active, &usage_of);
        tracing::info!(pods = ?active.iter().map(pod_name).collect::<Vec<_>>(), "Eviction manager: pods ranked for eviction");
        for pod in active {
            if rank::is_critical_pod(&pod) {
                tracing::error!(pod = %pod_name(&pod), "Eviction manager: cannot evict a critical pod");
                continue;
            }
            let grace = eviction_grace(
                &pod,
                to_reclaim.is_hard(),
                self.config.max_pod_grace_period_seconds,
            );
            let message = rank::eviction_message(resource, &pod, usage_of(&pod), &met, &obs);
            let stopped = self.evict(pod, grace, &message);
            self.metrics
                .evictions
                .get_or_create(&crate::metrics::EvictionSignalLabel {
                    eviction_signal: to_reclaim.signal.as_str().into(),
                })
                .inc();
            return Some(stopped);
        }
        tracing::info!("Eviction manager: unable to evict any pods from the node");
        None
    }

    /// upstream's reclaimNodeLevelResources: frees what the node holds for the starved
    /// resource (unused images, for disk), then tells whether every threshold, with its
    /// minimum reclaim, is now clear.
    async fn reclaim_node_level(&self, t: &Threshold, sources: &signals::Sources<'_>) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        let dev = |p: &std::path::Path| std::fs::metadata(p).ok().map(|m| m.dev());
        let dedicated = sources
            .image_fs
            .is_some_and(|p| dev(p) != dev(sources.root_dir));
        if !reclaim::images_help(t.signal, dedicated) {
            return false;
        }
        match reclaim::delete_unused_images(&self.kr.rt).await {
            Ok(0) => false,
            Ok(freed) => {
                tracing::info!(freed, "Eviction manager: unused images removed");
                let obs = signals::observe(sources);
                thresholds_met(&self.config.thresholds, &obs, true).is_empty()
            }
            Err(e) => {
                tracing::info!(error = %e.message(), "Eviction manager: unexpected error when attempting to reduce resource pressure");
                false
            }
        }
    }

    /// Records the eviction and hands the kill to the kubelet, which fails the pod with
    /// reason Evicted once its containers stopped.
    fn evict(&self, pod: Pod, grace: i64, message: &str) -> BoxFuture<'static, ()> {
        crate::events::recorder().event(
            &crate::events::pod_ref(&pod),
            crate::events::WARNING,
            REASON,
            message,
        );
        tracing::info!(pod = %pod_name(&pod), pod_uid = %pod.metadata.uid.as_deref().unwrap_or_default(), grace, message, "Evicting pod");
        (self.kill_pod)(pod, grace, message.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::thresholds::{Observation, parse_config};
    use super::*;

    fn cfg(hard: &[(&str, &str)], soft: &[(&str, &str)], grace: &[(&str, &str)]) -> Vec<Threshold> {
        let m = |p: &[(&str, &str)]| {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        parse_config(&m(hard), &m(soft), &m(grace), &BTreeMap::new(), false).unwrap()
    }

    fn obs(signal: Signal, available: i64) -> Observations {
        Observations::from([(
            signal,
            Observation {
                available,
                capacity: 1 << 30,
            },
        )])
    }

    const MI: i64 = 1 << 20;

    #[test]
    fn hard_threshold_evicts_at_once_and_condition_holds_for_the_transition_period() {
        let t = cfg(&[("memory.available", "100Mi")], &[], &[]);
        let mut tr = Tracker::default();
        let t0 = Instant::now();
        let period = Duration::from_secs(300);
        let (c, met) = tr.step(&t, &obs(Signal::MemoryAvailable, 50 * MI), period, t0);
        assert_eq!(c, [MEMORY_PRESSURE]);
        assert_eq!(met.len(), 1);
        let (c, met) = tr.step(
            &t,
            &obs(Signal::MemoryAvailable, 500 * MI),
            period,
            t0 + Duration::from_secs(10),
        );
        assert_eq!(
            c,
            [MEMORY_PRESSURE],
            "held while the transition period runs"
        );
        assert!(met.is_empty());
        let (c, _) = tr.step(
            &t,
            &obs(Signal::MemoryAvailable, 500 * MI),
            period,
            t0 + Duration::from_secs(301),
        );
        assert!(c.is_empty());
    }

    #[test]
    fn soft_threshold_waits_for_its_grace_period() {
        let t = cfg(
            &[],
            &[("nodefs.available", "1Gi")],
            &[("nodefs.available", "1m")],
        );
        let mut tr = Tracker::default();
        let t0 = Instant::now();
        let low = obs(Signal::NodeFsAvailable, 10 * MI);
        let (c, met) = tr.step(&t, &low, Duration::ZERO, t0);
        assert_eq!(c, [DISK_PRESSURE], "the condition does not wait");
        assert!(met.is_empty());
        let (_, met) = tr.step(&t, &low, Duration::ZERO, t0 + Duration::from_secs(30));
        assert!(met.is_empty());
        let (_, met) = tr.step(&t, &low, Duration::ZERO, t0 + Duration::from_secs(60));
        assert_eq!(met.len(), 1);
        assert!(!met[0].is_hard());
        // Cleared, then met again: the grace period starts over.
        let (c, _) = tr.step(
            &t,
            &obs(Signal::NodeFsAvailable, 2 << 30),
            Duration::ZERO,
            t0 + Duration::from_secs(61),
        );
        assert!(c.is_empty());
        let (_, met) = tr.step(&t, &low, Duration::ZERO, t0 + Duration::from_secs(62));
        assert!(met.is_empty());
    }

    #[test]
    fn memory_is_reclaimed_first_and_grace_follows_the_threshold_kind() {
        let mut t = cfg(
            &[("nodefs.available", "1Gi"), ("memory.available", "1Gi")],
            &[],
            &[],
        );
        by_eviction_priority(&mut t);
        assert_eq!(t[0].signal, Signal::MemoryAvailable);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"terminationGracePeriodSeconds": 60, "containers": []}
        }))
        .unwrap();
        assert_eq!(eviction_grace(&pod, true, 10), IMMEDIATE_GRACE_SECONDS);
        assert_eq!(eviction_grace(&pod, false, 10), 10);
        assert_eq!(eviction_grace(&pod, false, 0), 60);
    }

    #[test]
    fn pressure_reports_in_order() {
        let p = Pressure::default();
        p.set(vec![MEMORY_PRESSURE, DISK_PRESSURE]);
        assert!(p.memory() && p.disk() && !p.pid());
    }
}
