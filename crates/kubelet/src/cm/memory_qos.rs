//! MemoryQoS (KEP 2570, feature gate `MemoryQoS`, cgroup v2 only): `memory.min` protects
//! what pods requested from reclaim, at every level (container, pod, QoS tier), and a
//! container's `memory.high` throttles it by reclaim before it reaches its limit.
//!
//! The container values travel in the CRI's `LinuxContainerResources.unified` map, the
//! pod and tier values are written by the container manager; the arithmetic is upstream's
//! (kuberuntime_container_linux.go, helpers_linux.go, qos_container_manager_linux.go).

use k8s_openapi::api::core::v1::Pod;
use nodus_k8s::qos::{QosClass, pod_qos};
use std::collections::HashMap;

/// The unified-map keys (upstream's Cgroup2MemoryMin / Cgroup2MemoryHigh).
pub const MEMORY_MIN: &str = "memory.min";
pub const MEMORY_HIGH: &str = "memory.high";

/// KubeletConfiguration `memoryThrottlingFactor` default.
pub const DEFAULT_THROTTLING_FACTOR: f64 = 0.9;

/// The machine's page size, which `memory.high` is rounded down to.
pub fn page_size() -> i64 {
    // SAFETY: sysconf only reads a constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as i64 } else { 4096 }
}

/// A container's `memory.high`: `floor((request + factor × (limit − request)) / page) ×
/// page`, with node allocatable standing in for a missing limit. None when it would not be
/// above the request (nothing to throttle), for a container whose request equals its limit
/// (Guaranteed by memory: the limit already applies), or without allocatable to go by.
pub fn container_memory_high(
    request: i64,
    limit: i64,
    allocatable: i64,
    factor: f64,
    page: i64,
) -> Option<i64> {
    if request == limit {
        return None;
    }
    let ceiling = if limit != 0 { limit } else { allocatable };
    if ceiling <= 0 {
        return None;
    }
    let high = ((request as f64 + (ceiling as f64 - request as f64) * factor) / page as f64).floor()
        as i64
        * page;
    (high != 0 && high > request).then_some(high)
}

/// The MemoryQoS keys of a container's unified map: `memory.min` = its memory request
/// (when there is one) and `memory.high` per [`container_memory_high`].
pub fn container_unified(
    request: i64,
    limit: i64,
    allocatable: i64,
    factor: f64,
    page: i64,
) -> HashMap<String, String> {
    let mut out = HashMap::new();
    if request != 0 {
        out.insert(MEMORY_MIN.to_string(), request.to_string());
    }
    if let Some(high) = container_memory_high(request, limit, allocatable, factor, page) {
        out.insert(MEMORY_HIGH.to_string(), high.to_string());
    }
    out
}

/// The QoS tiers' `memory.min`: Burstable gets the sum of its pods' memory requests, the
/// Guaranteed tier (`kubepods` itself, which holds Burstable too) that sum plus the
/// Guaranteed pods'. Each is None when 0, as upstream leaves the file alone then.
pub fn tier_memory_min<P: std::borrow::Borrow<Pod>>(pods: &[P]) -> (Option<i64>, Option<i64>) {
    let (mut guaranteed, mut burstable) = (0i64, 0i64);
    for p in pods {
        let p = p.borrow();
        let req = super::resources::pod_requests(p).1;
        match pod_qos(p) {
            QosClass::Guaranteed => guaranteed += req,
            QosClass::Burstable => burstable += req,
            QosClass::BestEffort => {}
        }
    }
    let kubepods = guaranteed + burstable;
    (
        (kubepods > 0).then_some(kubepods),
        (burstable > 0).then_some(burstable),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: i64 = 1 << 20;
    const GI: i64 = 1 << 30;

    #[test]
    fn container_memory_high_as_upstream_computes_it() {
        // (request, limit, allocatable, factor) → memory.high, page 4096. The first rows
        // are upstream's TestGenerateContainerConfigWithMemoryQoSEnforced pods: 128Mi
        // request with a 256Mi limit, and without a limit against allocatable.
        let rows: &[(i64, i64, i64, f64, Option<i64>)] = &[
            (128 * MI, 256 * MI, 32 * GI, 0.9, Some(255_012_864)),
            (128 * MI, 0, 32 * GI, 0.9, Some(30_937_186_304)),
            // Guaranteed by memory: the limit is the throttle.
            (128 * MI, 128 * MI, 32 * GI, 0.9, None),
            // No request: 0.9 of the limit, page-aligned.
            (0, 100 * MI, 32 * GI, 0.9, Some(94_371_840)),
            // factor 1.0 puts memory.high at the limit.
            (64 * MI, 256 * MI, 32 * GI, 1.0, Some(256 * MI)),
            // A high at or below the request throttles nothing.
            (4096, 8191, 0, 0.1, None),
            // No limit and no allocatable to go by.
            (128 * MI, 0, 0, 0.9, None),
        ];
        for &(req, lim, alloc, f, want) in rows {
            assert_eq!(
                container_memory_high(req, lim, alloc, f, 4096),
                want,
                "request {req} limit {lim} allocatable {alloc} factor {f}"
            );
        }
    }

    #[test]
    fn container_unified_keys() {
        let u = container_unified(128 * MI, 256 * MI, 32 * GI, 0.9, 4096);
        assert_eq!(u[MEMORY_MIN], "134217728");
        assert_eq!(u[MEMORY_HIGH], "255012864");
        let guaranteed = container_unified(128 * MI, 128 * MI, 32 * GI, 0.9, 4096);
        assert_eq!(guaranteed.len(), 1);
        assert_eq!(guaranteed[MEMORY_MIN], "134217728");
        let best_effort = container_unified(0, 0, 32 * GI, 0.9, 4096);
        assert!(best_effort.is_empty(), "{best_effort:?}");
    }

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": containers}
        }))
        .unwrap()
    }

    #[test]
    fn tiers_sum_requests_with_burstable_inside_kubepods() {
        let g = pod(serde_json::json!([
            {"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
        ]));
        let b = pod(serde_json::json!([
            {"name": "a", "resources": {"requests": {"memory": "256Mi"}}},
            {"name": "b", "resources": {"requests": {"memory": "128Mi"}, "limits": {"memory": "1Gi"}}}
        ]));
        let be = pod(serde_json::json!([{"name": "a"}]));
        assert_eq!(
            tier_memory_min(&[g.clone(), b.clone(), be.clone()]),
            (Some(GI + 384 * MI), Some(384 * MI))
        );
        assert_eq!(tier_memory_min(&[g]), (Some(GI), None));
        assert_eq!(tier_memory_min(&[be]), (None, None));
    }
}
