//! A pod's resource requests as the scheduler and the kubelet's admission count them
//! (upstream's `resource.PodRequests`), in milli-CPU and bytes.

use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::BTreeMap;

/// A quantity in thousandths (milli-CPU for cpu; memory callers divide by 1000); `None` when
/// absent or unparseable.
pub fn milli(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<i64> {
    q.and_then(|q| crate::quantity::parse_quantity(&q.0).ok())
        .map(|p| p.milli_value())
}

/// (cpu request milli, cpu limit milli, memory request bytes, memory limit bytes) of one
/// container; a request missing while a limit is set defaults to the limit (API defaulting).
pub fn container_resources(c: &Container) -> (i64, Option<i64>, i64, Option<i64>) {
    let r = c.resources.clone().unwrap_or_default();
    let limits = r.limits.unwrap_or_default();
    let requests = r.requests.unwrap_or_default();
    let cpu_limit = milli(limits.get("cpu"));
    let mem_limit = milli(limits.get("memory")).map(|m| m / 1000);
    let cpu_req = milli(requests.get("cpu")).or(cpu_limit).unwrap_or(0);
    let mem_req = milli(requests.get("memory"))
        .map(|m| m / 1000)
        .or(mem_limit)
        .unwrap_or(0);
    (cpu_req, cpu_limit, mem_req, mem_limit)
}

/// The pod's effective requests (upstream's PodRequests: the max of the largest init
/// container and the sum of app containers (plus restartable init containers), plus
/// overhead), as (cpu milli, memory bytes).
pub fn pod_requests(pod: &Pod) -> (i64, i64) {
    let spec = pod.spec.clone().unwrap_or_default();
    let (mut cpu, mut mem) = (0i64, 0i64);
    for c in &spec.containers {
        let (cr, _, mr, _) = container_resources(c);
        cpu += cr;
        mem += mr;
    }
    let (mut sidecar_cpu, mut sidecar_mem) = (0i64, 0i64);
    let (mut init_cpu, mut init_mem) = (0i64, 0i64);
    for c in spec.init_containers.iter().flatten() {
        let (cr, _, mr, _) = container_resources(c);
        if c.restart_policy.as_deref() == Some("Always") {
            sidecar_cpu += cr;
            sidecar_mem += mr;
            cpu += cr;
            mem += mr;
        } else {
            init_cpu = init_cpu.max(sidecar_cpu + cr);
            init_mem = init_mem.max(sidecar_mem + mr);
        }
    }
    cpu = cpu.max(init_cpu);
    mem = mem.max(init_mem);
    if let Some(o) = &spec.overhead {
        cpu += milli(o.get("cpu")).unwrap_or(0);
        mem += milli(o.get("memory")).map(|m| m / 1000).unwrap_or(0);
    }
    (cpu, mem)
}

/// upstream's IsExtendedResourceName: a domain-qualified name outside `kubernetes.io/`
/// (e.g. `devices.nodus.dev/fuse`), not `requests.`-prefixed, whose `requests.<name>` form is
/// a valid qualified name (resource quota can name it).
pub fn is_extended_resource_name(name: &str) -> bool {
    if is_native_resource(name) || name.starts_with("requests.") {
        return false;
    }
    is_qualified_name(&format!("requests.{name}"))
}

/// upstream's IsNativeResource: no domain, or a `kubernetes.io/` one.
fn is_native_resource(name: &str) -> bool {
    match name.split_once('/') {
        None => true,
        Some((prefix, _)) => prefix == "kubernetes.io" || prefix.ends_with(".kubernetes.io"),
    }
}

/// A Kubernetes qualified name: an optional DNS-subdomain prefix and `/`, then 1-63
/// alphanumerics, `-`, `_` or `.`, starting and ending alphanumeric.
fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return false;
        }
    }
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| alnum(b) || b"-_.".contains(&b))
        && alnum(name.as_bytes()[0])
        && alnum(name.as_bytes()[name.len() - 1])
}

/// One container's extended resource requests as integers (a limit stands for a missing
/// request, as API defaulting does).
pub fn container_extended_requests(c: &Container) -> BTreeMap<String, i64> {
    let r = c.resources.clone().unwrap_or_default();
    let mut out = BTreeMap::new();
    for (k, q) in r.limits.iter().flatten().chain(r.requests.iter().flatten()) {
        if is_extended_resource_name(k)
            && let Some(v) = milli(Some(q))
        {
            out.insert(k.clone(), v / 1000);
        }
    }
    out
}

/// The pod's effective extended resource requests (upstream's PodRequests: the max of the
/// largest init container and the sum of app and restartable init containers).
pub fn pod_extended_requests(pod: &Pod) -> BTreeMap<String, i64> {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut sum: BTreeMap<String, i64> = BTreeMap::new();
    for c in &spec.containers {
        for (k, v) in container_extended_requests(c) {
            *sum.entry(k).or_default() += v;
        }
    }
    let mut sidecars: BTreeMap<String, i64> = BTreeMap::new();
    let mut init_max: BTreeMap<String, i64> = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        for (k, v) in container_extended_requests(c) {
            if c.restart_policy.as_deref() == Some("Always") {
                *sidecars.entry(k.clone()).or_default() += v;
                *sum.entry(k).or_default() += v;
            } else {
                let with = sidecars.get(&k).copied().unwrap_or(0) + v;
                let m = init_max.entry(k).or_default();
                *m = (*m).max(with);
            }
        }
    }
    for (k, v) in init_max {
        let e = sum.entry(k).or_default();
        *e = (*e).max(v);
    }
    sum
}

#[cfg(test)]
mod extended_tests {
    use super::*;

    #[test]
    fn extended_resource_names_as_upstream() {
        for (name, ok) in [
            ("devices.nodus.dev/fuse", true),
            ("nvidia.com/gpu", true),
            ("example.com/a_b", true),
            ("cpu", false),
            ("kubernetes.io/foo", false),
            ("node.kubernetes.io/foo", false),
            ("requests.example.com/gpu", false),
            ("example.com/", false),
            ("Example.com/gpu", false),
            ("example.com/-gpu", false),
            ("example.com/gpu/x", false),
        ] {
            assert_eq!(is_extended_resource_name(name), ok, "{name}");
        }
    }

    #[test]
    fn pod_extended_requests_take_init_max() {
        let pod: Pod = serde_json::from_value(serde_json::json!({"spec": {
            "initContainers": [{"name": "i", "resources": {"limits": {"example.com/d": "3"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"example.com/d": "1", "cpu": "1"}, "limits": {"example.com/d": "1"}}},
                {"name": "b", "resources": {"limits": {"example.com/d": "1"}}}
            ]}}))
        .unwrap();
        assert_eq!(
            pod_extended_requests(&pod),
            BTreeMap::from([("example.com/d".to_string(), 3)])
        );
    }
}
