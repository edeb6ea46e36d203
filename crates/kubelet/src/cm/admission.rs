//! Admission of a pod against what is left of Allocatable (upstream's predicate admit
//! handler: the scheduler's NodeResourcesFit run on the node), with upstream's reasons.

use super::allocatable::NodeResources;
use super::resources::pod_requests;
use k8s_openapi::api::core::v1::Pod;

/// Why a pod was rejected: the pod's status gets phase Failed with these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

/// Checks `pod` against `allocatable` minus the requests of `admitted` (the other active pods).
pub fn admit(pod: &Pod, admitted: &[Pod], allocatable: &NodeResources) -> Result<(), Rejection> {
    let (cpu, mem) = pod_requests(pod);
    let (mut used_cpu, mut used_mem) = (0i64, 0i64);
    for p in admitted {
        let (c, m) = pod_requests(p);
        used_cpu += c;
        used_mem += m;
    }
    let reject = |resource: &str, requested: i64, used: i64, capacity: i64| Rejection {
        reason: format!("OutOf{resource}"),
        message: format!(
            "Pod was rejected: Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    };
    if admitted.len() as i64 + 1 > allocatable.pods {
        return Err(reject("pods", 1, admitted.len() as i64, allocatable.pods));
    }
    if cpu > 0 && used_cpu + cpu > allocatable.cpu_milli {
        return Err(reject("cpu", cpu, used_cpu, allocatable.cpu_milli));
    }
    if mem > 0 && used_mem + mem > allocatable.memory_bytes {
        return Err(reject("memory", mem, used_mem, allocatable.memory_bytes));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu: &str, mem: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]}
        }))
        .unwrap()
    }

    #[test]
    fn rejects_with_upstream_reasons() {
        let alloc = NodeResources {
            cpu_milli: 1000,
            memory_bytes: 1 << 30,
            pods: 2,
            ..Default::default()
        };
        assert!(admit(&pod("500m", "100Mi"), &[pod("400m", "100Mi")], &alloc).is_ok());
        let r = admit(&pod("700m", "100Mi"), &[pod("400m", "100Mi")], &alloc).unwrap_err();
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(
            r.message,
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 700, used: 400, capacity: 1000"
        );
        let r = admit(&pod("1m", "2Gi"), &[], &alloc).unwrap_err();
        assert_eq!(r.reason, "OutOfmemory");
        let r = admit(
            &pod("1m", "1Mi"),
            &[pod("1m", "1Mi"), pod("1m", "1Mi")],
            &alloc,
        )
        .unwrap_err();
        assert_eq!(r.reason, "OutOfpods");
    }
}
