//! Admission of a pod against what is left of Allocatable (upstream's predicate admit
//! handler: the scheduler's NodeResourcesFit run on the node), with upstream's reasons, and
//! against the node's pressure conditions (upstream's eviction admit handler).

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

/// The eviction manager's admission (upstream's managerImpl.Admit): with no pressure every
/// pod is admitted; critical pods always are; under MemoryPressure alone only BestEffort
/// pods that do not tolerate the memory-pressure taint are refused; any other pressure
/// refuses every pod.
pub fn admit_pressure(pod: &Pod, conditions: &[&str]) -> Result<(), Rejection> {
    if conditions.is_empty() || crate::eviction::rank::is_critical_pod(pod) {
        return Ok(());
    }
    let spec = pod.spec.clone().unwrap_or_default();
    if conditions == [crate::eviction::thresholds::MEMORY_PRESSURE] {
        if nodus_k8s::qos::pod_qos_class(&spec) != nodus_k8s::qos::QosClass::BestEffort {
            return Ok(());
        }
        let tolerates = spec.tolerations.iter().flatten().any(|t| {
            let key_ok = match t.key.as_deref() {
                None | Some("") => t.operator.as_deref() == Some("Exists"),
                Some(k) => k == "node.kubernetes.io/memory-pressure",
            };
            let effect_ok = matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
            let value_ok = t.operator.as_deref() == Some("Exists")
                || t.value.as_deref().unwrap_or_default().is_empty();
            key_ok && effect_ok && value_ok
        });
        if tolerates {
            return Ok(());
        }
    }
    Err(Rejection {
        reason: crate::eviction::REASON.into(),
        message: format!("The node had condition: [{}]. ", conditions.join(" ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qos_pod(requests: Option<&str>, tolerate: bool, static_pod: bool) -> Pod {
        let mut p = serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c"}]}
        });
        if let Some(m) = requests {
            p["spec"]["containers"][0]["resources"] =
                serde_json::json!({"requests": {"memory": m}});
        }
        if tolerate {
            p["spec"]["tolerations"] = serde_json::json!([{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}]);
        }
        if static_pod {
            p["metadata"]["annotations"] =
                serde_json::json!({"kubernetes.io/config.source": "file"});
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn pressure_admission_follows_upstream() {
        let be = qos_pod(None, false, false);
        let burstable = qos_pod(Some("10Mi"), false, false);
        assert!(admit_pressure(&be, &[]).is_ok());
        let r = admit_pressure(&be, &["MemoryPressure"]).unwrap_err();
        assert_eq!(r.reason, "Evicted");
        assert_eq!(r.message, "The node had condition: [MemoryPressure]. ");
        assert!(admit_pressure(&burstable, &["MemoryPressure"]).is_ok());
        assert!(admit_pressure(&qos_pod(None, true, false), &["MemoryPressure"]).is_ok());
        let r = admit_pressure(&burstable, &["DiskPressure"]).unwrap_err();
        assert_eq!(r.message, "The node had condition: [DiskPressure]. ");
        let r = admit_pressure(&burstable, &["MemoryPressure", "DiskPressure"]).unwrap_err();
        assert_eq!(
            r.message,
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
        assert!(admit_pressure(&qos_pod(None, false, true), &["DiskPressure"]).is_ok());
    }

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
