//! Prometheus metrics with upstream's names (pkg/kubelet/metrics).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationTypeLabel {
    pub operation_type: String,
}

/// upstream's `kubelet_runtime_operations_*`: every CRI call the kubelet makes, by
/// operation type (`run_podsandbox`, `container_status`, …), its duration and its errors.
#[derive(Clone)]
pub struct RuntimeOperations {
    total: Family<OperationTypeLabel, Counter>,
    errors: Family<OperationTypeLabel, Counter>,
    duration: Family<OperationTypeLabel, Histogram>,
}

impl RuntimeOperations {
    fn new() -> RuntimeOperations {
        RuntimeOperations {
            total: Family::default(),
            errors: Family::default(),
            // upstream's ExponentialBuckets(.005, 2.5, 14).
            duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.5, 14))
            }),
        }
    }

    fn register(&self, registry: &mut Registry) {
        // The text format adds `_total` to counters.
        registry.register(
            "kubelet_runtime_operations",
            "Cumulative number of runtime operations by operation type.",
            self.total.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations. Broken down by operation type.",
            self.duration.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type.",
            self.errors.clone(),
        );
    }

    /// One call of `operation_type` that took `took` and failed or not.
    pub fn record(&self, operation_type: &str, took: Duration, failed: bool) {
        let label = OperationTypeLabel {
            operation_type: operation_type.to_string(),
        };
        self.total.get_or_create(&label).inc();
        self.duration
            .get_or_create(&label)
            .observe(took.as_secs_f64());
        if failed {
            self.errors.get_or_create(&label).inc();
        }
    }

    /// How many calls of `operation_type` were made.
    pub fn count(&self, operation_type: &str) -> u64 {
        self.total
            .get_or_create(&OperationTypeLabel {
                operation_type: operation_type.to_string(),
            })
            .get()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerStateLabel {
    pub container_state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionSignalLabel {
    pub eviction_signal: String,
}

pub struct Metrics {
    registry: Registry,
    pub pleg_relist_duration: Histogram,
    pub pleg_last_seen: Gauge<f64, AtomicU64>,
    pub pod_start_duration: Histogram,
    pub pod_worker_duration: Family<OperationLabel, Histogram>,
    pub running_pods: Gauge,
    pub running_containers: Family<ContainerStateLabel, Gauge>,
    pub restarted_pods: Family<Vec<(String, String)>, Counter>,
    /// upstream's kubelet_evictions (the text format names the counter `…_total`).
    pub evictions: Family<EvictionSignalLabel, Counter>,
    /// Sandboxes attempted for pods with `hostUsers: false`, and how many failed.
    pub started_user_namespaced_pods: Counter,
    pub started_user_namespaced_pods_errors: Counter,
    /// Every CRI call, given to the runtime client ([`crate::cri::connect_instrumented`]).
    pub runtime_operations: RuntimeOperations,
}

fn seconds_buckets() -> impl Iterator<Item = f64> {
    // upstream's DefBuckets-like spread, from 5ms to ~80s.
    exponential_buckets(0.005, 2.0, 15)
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let pleg_relist_duration = Histogram::new(seconds_buckets());
        registry.register(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG.",
            pleg_relist_duration.clone(),
        );
        let pleg_last_seen = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "kubelet_pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active.",
            pleg_last_seen.clone(),
        );
        let pod_start_duration = Histogram::new(seconds_buckets());
        registry.register(
            "kubelet_pod_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            pod_start_duration.clone(),
        );
        let pod_worker_duration = Family::<OperationLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(seconds_buckets())
        });
        registry.register(
            "kubelet_pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
            pod_worker_duration.clone(),
        );
        let running_pods = Gauge::default();
        registry.register(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
            running_pods.clone(),
        );
        let running_containers = Family::<ContainerStateLabel, Gauge>::default();
        registry.register(
            "kubelet_running_containers",
            "Number of containers currently running",
            running_containers.clone(),
        );
        let restarted_pods = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "kubelet_restarted_pods",
            "Number of pods that have been restarted because they were deleted and recreated with the same UID while the kubelet was watching them (common for static pods, extremely uncommon for API pods)",
            restarted_pods.clone(),
        );
        let evictions = Family::<EvictionSignalLabel, Counter>::default();
        registry.register(
            "kubelet_evictions",
            "Cumulative number of pod evictions by eviction signal",
            evictions.clone(),
        );
        let started_user_namespaced_pods = Counter::default();
        registry.register(
            "kubelet_started_user_namespaced_pods",
            "Cumulative number of pods with user namespaces started. This metric will only be collected on Linux.",
            started_user_namespaced_pods.clone(),
        );
        let started_user_namespaced_pods_errors = Counter::default();
        registry.register(
            "kubelet_started_user_namespaced_pods_errors",
            "Cumulative number of errors when starting pods with user namespaces. This metric will only be collected on Linux.",
            started_user_namespaced_pods_errors.clone(),
        );
        let runtime_operations = RuntimeOperations::new();
        runtime_operations.register(&mut registry);
        Metrics {
            registry,
            runtime_operations,
            evictions,
            started_user_namespaced_pods,
            started_user_namespaced_pods_errors,
            pleg_relist_duration,
            pleg_last_seen,
            pod_start_duration,
            pod_worker_duration,
            running_pods,
            running_containers,
            restarted_pods,
        }
    }

    pub fn observe_relist(&self, d: Duration) {
        self.pleg_relist_duration.observe(d.as_secs_f64());
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.pleg_last_seen.set(now);
    }

    pub fn observe_worker(&self, operation: &str, d: Duration) {
        self.pod_worker_duration
            .get_or_create(&OperationLabel {
                operation: operation.into(),
            })
            .observe(d.as_secs_f64());
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeResultLabels {
    pub probe_type: String,
    pub result: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeDurationLabels {
    pub probe_type: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
}

/// The prober's metrics, served apart on `/metrics/probes` as upstream's
/// (`prober_probe_total`, `prober_probe_duration_seconds`).
pub struct ProberMetrics {
    registry: Registry,
    pub results: Family<ProbeResultLabels, Counter>,
    pub duration: Family<ProbeDurationLabels, Histogram>,
}

impl ProberMetrics {
    pub fn new() -> ProberMetrics {
        let mut registry = Registry::default();
        let results = Family::<ProbeResultLabels, Counter>::default();
        // The text format appends `_total` to a counter's name.
        registry.register(
            "prober_probe",
            // prometheus-client ends every help text with a period.
            "Cumulative number of a liveness, readiness or startup probe for a container by result",
            results.clone(),
        );
        let duration = Family::<ProbeDurationLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(seconds_buckets())
        });
        registry.register(
            "prober_probe_duration_seconds",
            "Duration in seconds for a probe response",
            duration.clone(),
        );
        ProberMetrics {
            registry,
            results,
            duration,
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for ProberMetrics {
    fn default() -> Self {
        ProberMetrics::new()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
