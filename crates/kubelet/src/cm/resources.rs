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
    /// MemoryQoS's v2 `memory.min`: the pod's memory requests.
    pub memory_min: Option<i64>,
    pub pids_limit: Option<i64>,
}

pub use nodus_k8s::resources::{container_resources, milli, pod_requests};

/// The pod cgroup's values (upstream's ResourceConfigForPod): shares from the requests;
/// a CPU quota only when every container has a CPU limit, a memory limit only when every
/// container has one; BestEffort pods get the minimum shares. With `memory_qos`,
/// `memory.min` is the pod's memory requests, when it has any.
pub fn pod_values(
    pod: &Pod,
    cfs_quota: bool,
    period: u64,
    pids_limit: Option<i64>,
    memory_qos: bool,
) -> CgroupValues {
    let spec = pod.spec.clone().unwrap_or_default();
    let all: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let (cpu_req, mem_req) = pod_requests(pod);
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
    // The RuntimeClass's overhead is the sandbox's own share: it is added to a limit the
    // containers set (upstream's PodLimits), as the requests already count it.
    let overhead = spec.overhead.as_ref();
    let cpu_limit =
        cpu_limit_sum.max(init_cpu_max) + milli(overhead.and_then(|o| o.get("cpu"))).unwrap_or(0);
    let mem_limit = mem_limit_sum.max(init_mem_max)
        + milli(overhead.and_then(|o| o.get("memory")))
            .map(|m| m / 1000)
            .unwrap_or(0);
    let qos = nodus_k8s::qos::pod_qos_class(&spec);
    let mut v = CgroupValues {
        pids_limit,
        memory_min: (memory_qos && mem_req > 0).then_some(mem_req),
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
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

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
        let v = pod_values(&p, true, 100_000, None, false);
        assert_eq!(v.cpu_shares, Some(768));
        assert_eq!(v.cpu_quota, Some(75_000));
        assert_eq!(v.memory_limit, Some(96 << 20));
    }

    #[test]
    fn runtime_class_overhead_sizes_the_pod_cgroup() {
        let mut p = pod(serde_json::json!([
            {"name": "a", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}
        ]));
        p.spec.as_mut().unwrap().overhead = Some(
            [
                ("cpu".to_string(), Quantity("250m".into())),
                ("memory".to_string(), Quantity("120Mi".into())),
            ]
            .into(),
        );
        let v = pod_values(&p, true, 100_000, None, false);
        assert_eq!(v.cpu_shares, Some(768));
        assert_eq!(v.cpu_quota, Some(75_000));
        assert_eq!(v.memory_limit, Some(184 << 20));
    }

    #[test]
    fn partially_limited_burstable_pod_gets_no_limit() {
        let p = pod(serde_json::json!([
            {"name": "a", "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}}},
            {"name": "b"}
        ]));
        let v = pod_values(&p, true, 100_000, None, false);
        assert_eq!(v.cpu_shares, Some(102));
        assert_eq!(v.cpu_quota, None);
        assert_eq!(v.memory_limit, None);
        let be = pod(serde_json::json!([{"name": "a"}]));
        assert_eq!(
            pod_values(&be, true, 100_000, None, false).cpu_shares,
            Some(2)
        );
    }

    #[test]
    fn memory_qos_protects_the_pod_requests() {
        let p = pod(serde_json::json!([
            {"name": "a", "resources": {"requests": {"memory": "64Mi"}, "limits": {"memory": "128Mi"}}},
            {"name": "b", "resources": {"requests": {"memory": "32Mi"}}}
        ]));
        assert_eq!(
            pod_values(&p, true, 100_000, None, true).memory_min,
            Some(96 << 20)
        );
        assert_eq!(pod_values(&p, true, 100_000, None, false).memory_min, None);
        let be = pod(serde_json::json!([{"name": "a"}]));
        assert_eq!(pod_values(&be, true, 100_000, None, true).memory_min, None);
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
