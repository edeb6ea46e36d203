//! Pod-level and tier-level cgroup values from the containers' requests and limits
//! (upstream's ResourceConfigForPod and the QoS manager's share accounting).

use k8s_openapi::api::core::v1::{Container, Pod};

pub use nodus_cgroups::resources::MIN_SHARES;
pub use nodus_cgroups::{
    milli_cpu_to_quota as milli_to_quota, milli_cpu_to_shares as milli_to_shares,
};

/// Values for one cgroup; `None` leaves the kernel's default (unlimited).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupValues {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory_limit: Option<i64>,
    pub pids_limit: Option<i64>,
}

fn milli(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<i64> {
    q.and_then(|q| nodus_k8s::quantity::parse_quantity(&q.0).ok())
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

/// The pod cgroup's values (upstream's ResourceConfigForPod): shares from the requests;
/// a CPU quota only when every container has a CPU limit, a memory limit only when every
/// container has one; BestEffort pods get the minimum shares.
pub fn pod_values(
    pod: &Pod,
    cfs_quota: bool,
    period: u64,
    pids_limit: Option<i64>,
) -> CgroupValues {
    let spec = pod.spec.clone().unwrap_or_default();
    let all: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let (cpu_req, mem_req) = pod_requests(pod);
    let _ = mem_req;
    let mut cpu_limit_sum = 0i64;
    let mut mem_limit_sum = 0i64;
    let mut all_cpu_limited = true;
    let mut all_mem_limited = true;
    let mut init_cpu_max = 0i64;
    let mut init_mem_max = 0i64;
    for c in &all {
        let (_, cl, _, ml) = container_resources(c);
        let is_init = spec
            .init_containers
            .iter()
            .flatten()
            .any(|i| i.name == c.name && i.restart_policy.as_deref() != Some("Always"));
        match cl {
            Some(l) if is_init => init_cpu_max = init_cpu_max.max(l),
            Some(l) => cpu_limit_sum += l,
            None => all_cpu_limited = false,
        }
        match ml {
            Some(l) if is_init => init_mem_max = init_mem_max.max(l),
            Some(l) => mem_limit_sum += l,
            None => all_mem_limited = false,
        }
    }
    let cpu_limit = cpu_limit_sum.max(init_cpu_max);
    let mem_limit = mem_limit_sum.max(init_mem_max);
    let qos = nodus_k8s::qos::pod_qos_class(&spec);
    let mut v = CgroupValues {
        pids_limit,
        ..Default::default()
    };
    if qos == nodus_k8s::qos::QosClass::BestEffort {
        v.cpu_shares = Some(MIN_SHARES);
        return v;
    }
    v.cpu_shares = Some(milli_to_shares(cpu_req));
    if all_cpu_limited && cfs_quota && cpu_limit > 0 {
        v.cpu_quota = Some(milli_to_quota(cpu_limit, period));
        v.cpu_period = Some(period);
    }
    if all_mem_limited && mem_limit > 0 {
        v.memory_limit = Some(mem_limit);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": containers}
        }))
        .unwrap()
    }

    #[test]
    fn guaranteed_pod_gets_limits() {
        let p = pod(serde_json::json!([
            {"name": "a", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "250m", "memory": "32Mi"}}}
        ]));
        let v = pod_values(&p, true, 100_000, None);
        assert_eq!(v.cpu_shares, Some(768));
        assert_eq!(v.cpu_quota, Some(75_000));
        assert_eq!(v.memory_limit, Some(96 << 20));
    }

    #[test]
    fn partially_limited_burstable_pod_gets_no_limit() {
        let p = pod(serde_json::json!([
            {"name": "a", "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}}},
            {"name": "b"}
        ]));
        let v = pod_values(&p, true, 100_000, None);
        assert_eq!(v.cpu_shares, Some(102));
        assert_eq!(v.cpu_quota, None);
        assert_eq!(v.memory_limit, None);
        let be = pod(serde_json::json!([{"name": "a"}]));
        assert_eq!(pod_values(&be, true, 100_000, None).cpu_shares, Some(2));
    }

    #[test]
    fn init_containers_count_by_their_max() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}],
                "containers": [{"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "64Mi"}}}]
            }
        }))
        .unwrap();
        assert_eq!(pod_requests(&p), (2000, 1 << 30));
    }
}
