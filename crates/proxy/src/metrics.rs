//! Prometheus metrics with upstream kube-proxy's names (pkg/proxy/metrics), served on
//! `metricsBindAddress` (127.0.0.1:10249) at `/metrics`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The proxy's metrics.
pub struct Metrics {
    registry: Registry,
    pub sync_duration: Histogram,
    pub full_sync_duration: Histogram,
    pub partial_sync_duration: Histogram,
    pub last_timestamp: Gauge<f64, AtomicU64>,
    pub last_queued_timestamp: Gauge<f64, AtomicU64>,
    pub network_programming: Histogram,
    pub service_changes: Counter,
    pub endpoint_changes: Counter,
    pub sync_failures: Counter,
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(false)
    }
}

impl Metrics {
    /// `iptables`: name the failure counter as upstream's iptables mode does.
    pub fn new(iptables: bool) -> Metrics {
        let mut registry = Registry::default();
        // upstream: exponential buckets from 1ms, factor 2, 15 buckets.
        let h = || Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let sync_duration = h();
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            sync_duration.clone(),
        );
        let full_sync_duration = h();
        registry.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            full_sync_duration.clone(),
        );
        let partial_sync_duration = h();
        registry.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            partial_sync_duration.clone(),
        );
        let last_timestamp = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            last_timestamp.clone(),
        );
        let last_queued_timestamp = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            last_queued_timestamp.clone(),
        );
        let network_programming = Histogram::new(exponential_buckets(0.25, 2.0, 12));
        registry.register(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            network_programming.clone(),
        );
        let service_changes = Counter::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            service_changes.clone(),
        );
        let endpoint_changes = Counter::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            endpoint_changes.clone(),
        );
        let sync_failures = Counter::default();
        let (name, help) = if iptables {
            (
                "kubeproxy_sync_proxy_rules_iptables_restore_failures",
                "Cumulative proxy iptables restore failures",
            )
        } else {
            (
                "kubeproxy_sync_proxy_rules_nftables_sync_failures",
                "Cumulative proxy nftables sync failures",
            )
        };
        registry.register(name, help, sync_failures.clone());
        Metrics {
            registry,
            sync_duration,
            full_sync_duration,
            partial_sync_duration,
            last_timestamp,
            last_queued_timestamp,
            network_programming,
            service_changes,
            endpoint_changes,
            sync_failures,
        }
    }

    pub fn observe_sync(&self, full: bool, d: Duration, ok: bool) {
        self.sync_duration.observe(d.as_secs_f64());
        if full {
            self.full_sync_duration.observe(d.as_secs_f64());
        } else {
            self.partial_sync_duration.observe(d.as_secs_f64());
        }
        if ok {
            self.last_timestamp.set(now_secs());
        } else {
            self.sync_failures.inc();
        }
    }

    pub fn queued(&self) {
        self.last_queued_timestamp.set(now_secs());
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
