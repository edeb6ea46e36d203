//! `/metrics/resource`: upstream's resource metrics collector
//! (pkg/kubelet/metrics/collectors/resource_metrics.go) — the node's, pods' and
//! containers' cumulative CPU and working-set memory with the time each was read, and the
//! containers' start times — from the same stats as the Summary API (labels `container`,
//! `pod`, `namespace`, written sorted as Go's client does). metrics-server (here:
//! the API server's `metrics.k8s.io`) scrapes it and turns the CPU counters into rates.

use super::ServerState;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use nodus_serving::prometheus::{self, Kind};
use serde_json::Value;

/// Milliseconds since the epoch of a Summary `time` (RFC 3339).
fn millis(v: &Value) -> Option<i64> {
    let t: jiff::Timestamp = v.as_str()?.parse().ok()?;
    Some(t.as_millisecond())
}

/// One metric family and its samples, written only if it has any (as upstream's lazy
/// collector writes no header for an empty family).
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    body: String,
}

impl Family {
    fn new(name: &'static str, help: &'static str, kind: Kind) -> Self {
        Family {
            name,
            help,
            kind,
            body: String::new(),
        }
    }

    fn add(&mut self, labels: &[(&str, &str)], value: f64, ts: Option<i64>) {
        prometheus::sample(&mut self.body, self.name, labels, value, ts);
    }
}

/// The resource metrics of a Summary; `None` when the runtime could not be read
/// (`scrape_error 1`, as upstream answers 200 with the error gauge set).
pub fn encode(summary: Option<&Value>) -> String {
    let mut node_cpu = Family::new(
        "node_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
        Kind::Counter,
    );
    let mut node_mem = Family::new(
        "node_memory_working_set_bytes",
        "[STABLE] Current working set of the node in bytes",
        Kind::Gauge,
    );
    let mut pod_cpu = Family::new(
        "pod_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
        Kind::Counter,
    );
    let mut pod_mem = Family::new(
        "pod_memory_working_set_bytes",
        "[STABLE] Current working set of the pod in bytes",
        Kind::Gauge,
    );
    let mut c_cpu = Family::new(
        "container_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
        Kind::Counter,
    );
    let mut c_mem = Family::new(
        "container_memory_working_set_bytes",
        "[STABLE] Current working set of the container in bytes",
        Kind::Gauge,
    );
    let mut c_start = Family::new(
        "container_start_time_seconds",
        "[STABLE] Start time of the container since unix epoch in seconds",
        Kind::Gauge,
    );
    let mut scrape_error = Family::new(
        "scrape_error",
        "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise",
        Kind::Gauge,
    );
    let mut resource_scrape_error = Family::new(
        "resource_scrape_error",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
        Kind::Gauge,
    );
    let failed = if summary.is_some() { 0.0 } else { 1.0 };
    scrape_error.add(&[], failed, None);
    resource_scrape_error.add(&[], failed, None);
    if let Some(s) = summary {
        let node = &s["node"];
        if let Some(ns) = node["cpu"]["usageCoreNanoSeconds"].as_u64() {
            node_cpu.add(&[], ns as f64 / 1e9, millis(&node["cpu"]["time"]));
        }
        if let Some(ws) = node["memory"]["workingSetBytes"].as_u64() {
            node_mem.add(&[], ws as f64, millis(&node["memory"]["time"]));
        }
        for p in s["pods"].as_array().into_iter().flatten() {
            let ns = p["podRef"]["namespace"].as_str().unwrap_or_default();
            let pod = p["podRef"]["name"].as_str().unwrap_or_default();
            let labels = [("pod", pod), ("namespace", ns)];
            if let Some(v) = p["cpu"]["usageCoreNanoSeconds"].as_u64() {
                pod_cpu.add(&labels, v as f64 / 1e9, millis(&p["cpu"]["time"]));
            }
            if let Some(v) = p["memory"]["workingSetBytes"].as_u64() {
                pod_mem.add(&labels, v as f64, millis(&p["memory"]["time"]));
            }
            for c in p["containers"].as_array().into_iter().flatten() {
                let name = c["name"].as_str().unwrap_or_default();
                let labels = [("container", name), ("pod", pod), ("namespace", ns)];
                if let Some(v) = c["cpu"]["usageCoreNanoSeconds"].as_u64() {
                    c_cpu.add(&labels, v as f64 / 1e9, millis(&c["cpu"]["time"]));
                }
                if let Some(v) = c["memory"]["workingSetBytes"].as_u64() {
                    c_mem.add(&labels, v as f64, millis(&c["memory"]["time"]));
                }
                if let Some(ms) = millis(&c["startTime"]) {
                    c_start.add(&labels, ms as f64 / 1e3, Some(ms));
                }
            }
        }
    }
    let mut out = String::new();
    for f in [
        c_cpu,
        c_mem,
        c_start,
        node_cpu,
        node_mem,
        pod_cpu,
        pod_mem,
        resource_scrape_error,
        scrape_error,
    ] {
        if !f.body.is_empty() {
            prometheus::family(&mut out, f.name, f.help, f.kind);
            out.push_str(&f.body);
        }
    }
    out
}

/// The handler of `/metrics/resource` on the secure and read-only ports.
pub(crate) async fn handler(State(s): State<ServerState>) -> Response {
    let summary = match super::stats::summary_json(&s).await {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(error = %e.message(), "resource metrics: reading stats failed");
            None
        }
    };
    (
        [(header::CONTENT_TYPE, prometheus::CONTENT_TYPE)],
        encode(summary.as_ref()),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_becomes_upstreams_resource_metrics_with_timestamps() {
        let summary = serde_json::json!({
            "node": {
                "cpu": {"time": "2026-01-01T00:00:10Z", "usageCoreNanoSeconds": 12_500_000_000u64},
                "memory": {"time": "2026-01-01T00:00:10Z", "workingSetBytes": 1024},
            },
            "pods": [{
                "podRef": {"name": "web", "namespace": "default"},
                "cpu": {"time": "2026-01-01T00:00:10Z", "usageCoreNanoSeconds": 500_000_000u64},
                "memory": {"time": "2026-01-01T00:00:10Z", "workingSetBytes": 2048},
                "containers": [{
                    "name": "app",
                    "startTime": "2026-01-01T00:00:00Z",
                    "cpu": {"time": "2026-01-01T00:00:10Z", "usageCoreNanoSeconds": 250_000_000u64},
                    "memory": {"time": "2026-01-01T00:00:10Z", "workingSetBytes": 4096},
                }],
            }],
        });
        let out = encode(Some(&summary));
        let ts = 1_767_225_610_000i64;
        for line in [
            format!("node_cpu_usage_seconds_total 12.5 {ts}"),
            format!("node_memory_working_set_bytes 1024 {ts}"),
            format!("pod_cpu_usage_seconds_total{{namespace=\"default\",pod=\"web\"}} 0.5 {ts}"),
            format!("pod_memory_working_set_bytes{{namespace=\"default\",pod=\"web\"}} 2048 {ts}"),
            format!(
                "container_cpu_usage_seconds_total{{container=\"app\",namespace=\"default\",pod=\"web\"}} 0.25 {ts}"
            ),
            format!(
                "container_memory_working_set_bytes{{container=\"app\",namespace=\"default\",pod=\"web\"}} 4096 {ts}"
            ),
            "container_start_time_seconds{container=\"app\",namespace=\"default\",pod=\"web\"} 1767225600 1767225600000".to_string(),
            "scrape_error 0".to_string(),
            "# TYPE container_cpu_usage_seconds_total counter".to_string(),
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
    }

    #[test]
    fn a_failed_scrape_says_so() {
        let out = encode(None);
        assert!(out.lines().any(|l| l == "scrape_error 1"), "{out}");
        assert!(!out.contains("node_cpu"), "{out}");
    }
}
