//! A pod's resource requests as the scheduler and the kubelet's admission count them
//! (upstream's `resource.PodRequests`), in milli-CPU and bytes.

use k8s_openapi::api::core::v1::{Container, Pod};

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
