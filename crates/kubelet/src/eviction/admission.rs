//! The eviction manager's admit handler (upstream's managerImpl.Admit): pods are refused
//! while the node reports pressure, as upstream decides which.

use super::Pressure;
use crate::admission::{PodAdmitAttributes, PodAdmitHandler, PodAdmitResult, Reason, Rejection};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use std::sync::Arc;

/// Admits against the conditions the eviction manager last reported.
pub struct AdmitHandler {
    pub pressure: Arc<Pressure>,
}

impl PodAdmitHandler for AdmitHandler {
    fn admit<'a>(&'a self, attrs: &'a PodAdmitAttributes<'a>) -> BoxFuture<'a, PodAdmitResult> {
        let conditions = self.pressure.conditions();
        let r = admit_pressure(attrs.pod, &conditions).into();
        Box::pin(async move { r })
    }
}

/// The eviction manager's admission (upstream's managerImpl.Admit): with no pressure every
/// pod is admitted; critical pods always are; under MemoryPressure alone only BestEffort
/// pods that do not tolerate the memory-pressure taint are refused; any other pressure
/// refuses every pod.
pub fn admit_pressure(pod: &Pod, conditions: &[&str]) -> Result<(), Rejection> {
    if conditions.is_empty() || super::rank::is_critical_pod(pod) {
        return Ok(());
    }
    let spec = pod.spec.clone().unwrap_or_default();
    if conditions == [super::thresholds::MEMORY_PRESSURE] {
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
        reason: Reason::Evicted,
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
}
