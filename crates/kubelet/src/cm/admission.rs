//! Admission of a pod against what is left of Allocatable (upstream's predicate admit
//! handler: the scheduler's NodeResourcesFit run on the node), with upstream's reasons.
//! Extended resources the node has no device plugin for have an allocatable of 0 here;
//! device plugin resources are the device manager's check ([`super::devicemanager`]).

use super::ContainerManager;
use super::allocatable::NodeResources;
use super::resources::pod_requests;
use crate::admission::{PodAdmitAttributes, PodAdmitHandler, PodAdmitResult, Reason, Rejection};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use std::borrow::Borrow;
use std::sync::Arc;

/// upstream's predicateAdmitHandler over the container manager's Allocatable.
pub struct PredicateAdmitHandler {
    pub cm: Arc<ContainerManager>,
}

impl PodAdmitHandler for PredicateAdmitHandler {
    fn admit<'a>(&'a self, attrs: &'a PodAdmitAttributes<'a>) -> BoxFuture<'a, PodAdmitResult> {
        let r = admit(attrs.pod, attrs.other_pods, &self.cm.allocatable)
            .and_then(|()| self.admit_extended(attrs.pod, attrs.other_pods))
            .into();
        Box::pin(async move { r })
    }
}

impl PredicateAdmitHandler {
    /// Extended resources no device plugin serves: nothing of them is allocatable.
    fn admit_extended<P: Borrow<Pod>>(&self, pod: &Pod, admitted: &[P]) -> Result<(), Rejection> {
        let devices = self.cm.devices.get();
        for (name, requested) in nodus_k8s::resources::pod_extended_requests(pod) {
            if devices.is_some_and(|d| d.is_device_plugin_resource(&name)) || requested == 0 {
                continue;
            }
            let used: i64 = admitted
                .iter()
                .map(|p| {
                    nodus_k8s::resources::pod_extended_requests(p.borrow())
                        .get(&name)
                        .copied()
                        .unwrap_or(0)
                })
                .sum();
            return Err(insufficient(&name, requested, used, 0));
        }
        Ok(())
    }
}

/// upstream's InsufficientResourceError as the kubelet reports it.
fn insufficient(resource: &str, requested: i64, used: i64, capacity: i64) -> Rejection {
    Rejection {
        reason: Reason::OutOf(resource.to_string()),
        message: format!(
            "Pod was rejected: Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
}

/// Checks `pod` against `allocatable` minus the requests of `admitted` (the other active pods).
pub fn admit<P: Borrow<Pod>>(
    pod: &Pod,
    admitted: &[P],
    allocatable: &NodeResources,
) -> Result<(), Rejection> {
    let (cpu, mem) = pod_requests(pod);
    let (mut used_cpu, mut used_mem) = (0i64, 0i64);
    for p in admitted {
        let (c, m) = pod_requests(p.borrow());
        used_cpu += c;
        used_mem += m;
    }
    let reject = insufficient;
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
        let r = admit::<Pod>(&pod("1m", "2Gi"), &[], &alloc).unwrap_err();
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
