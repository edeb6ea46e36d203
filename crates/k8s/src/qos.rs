//! Pod QoS class, computed like upstream's `GetPodQOS`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity::parse_quantity;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    /// The string the API uses in `status.qosClass`.
    pub fn as_str(&self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// Only these resources decide the QoS class upstream.
const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// Positive cpu/memory amounts of a resource list, in nano-units.
fn qos_amounts(list: Option<&BTreeMap<String, Quantity>>) -> BTreeMap<&'static str, i128> {
    let mut out = BTreeMap::new();
    let Some(list) = list else { return out };
    for name in QOS_RESOURCES {
        // An unparseable quantity cannot have passed validation; treat it as absent.
        if let Some(q) = list.get(name).and_then(|q| parse_quantity(&q.0).ok())
            && q.nano_value() > 0
        {
            out.insert(name, q.nano_value());
        }
    }
    out
}

fn add_into(total: &mut BTreeMap<&'static str, i128>, part: &BTreeMap<&'static str, i128>) {
    for (k, v) in part {
        *total.entry(k).or_insert(0) += v;
    }
}

/// Requests and limits of one container; a limit without a request implies an equal request,
/// as API defaulting makes it before upstream's computation ever sees the pod.
fn container_amounts(
    resources: Option<&ResourceRequirements>,
) -> (BTreeMap<&'static str, i128>, BTreeMap<&'static str, i128>) {
    let raw_requests = resources.and_then(|r| r.requests.as_ref());
    let raw_limits = resources.and_then(|r| r.limits.as_ref());
    let limits = qos_amounts(raw_limits);
    let mut requests = qos_amounts(raw_requests);
    for (k, v) in &limits {
        let explicit = raw_requests.is_some_and(|r| r.contains_key(*k));
        if !explicit {
            requests.insert(k, *v);
        }
    }
    (requests, limits)
}

/// The QoS class of a pod spec: init and app containers count (ephemeral containers cannot
/// have resources), only cpu and memory matter, and pod-level resources win when present.
pub fn pod_qos_class(spec: &PodSpec) -> QosClass {
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    let mut guaranteed = true;
    if let Some(pod_resources) = spec.resources.as_ref() {
        let (req, lim) = container_amounts(Some(pod_resources));
        add_into(&mut requests, &req);
        add_into(&mut limits, &lim);
        if !lim.is_empty() && QOS_RESOURCES.iter().any(|r| !lim.contains_key(r)) {
            guaranteed = false;
        }
        if lim.is_empty() {
            guaranteed = false;
        }
    } else {
        let containers: Vec<&Container> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .collect();
        for c in containers {
            let (req, lim) = container_amounts(c.resources.as_ref());
            add_into(&mut requests, &req);
            add_into(&mut limits, &lim);
            if QOS_RESOURCES.iter().any(|r| !lim.contains_key(r)) {
                guaranteed = false;
            }
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    if guaranteed && requests.iter().any(|(k, v)| limits.get(k) != Some(v)) {
        guaranteed = false;
    }
    if guaranteed && requests.len() == limits.len() {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap_or_default()
    }

    fn c(name: &str, resources: serde_json::Value) -> serde_json::Value {
        json!({"name": name, "image": "busybox", "resources": resources})
    }

    #[test]
    fn best_effort_without_cpu_or_memory() {
        assert_eq!(
            pod_qos_class(&spec(json!({"containers": [c("a", json!({}))]}))),
            QosClass::BestEffort
        );
        let ephemeral_only =
            json!({"containers": [c("a", json!({"requests": {"nvidia.com/gpu": "1"}}))]});
        assert_eq!(pod_qos_class(&spec(ephemeral_only)), QosClass::BestEffort);
        let zero = json!({"containers": [c("a", json!({"requests": {"cpu": "0"}}))]});
        assert_eq!(pod_qos_class(&spec(zero)), QosClass::BestEffort);
    }

    #[test]
    fn guaranteed_when_limits_equal_requests_everywhere() {
        let g = json!({"cpu": "100m", "memory": "100Mi"});
        let s = json!({"containers": [c("a", json!({"requests": g, "limits": g}))],
                       "initContainers": [c("i", json!({"limits": g}))]});
        assert_eq!(pod_qos_class(&spec(s)), QosClass::Guaranteed);
        // 0.1 and 100m are the same quantity.
        let s = json!({"containers": [c("a", json!({"requests": {"cpu": "0.1", "memory": "1Gi"},
                                                      "limits": {"cpu": "100m", "memory": "1024Mi"}}))]});
        assert_eq!(pod_qos_class(&spec(s)), QosClass::Guaranteed);
    }

    #[test]
    fn burstable_cases() {
        let s = json!({"containers": [c("a", json!({"requests": {"cpu": "100m"}}))]});
        assert_eq!(pod_qos_class(&spec(s)), QosClass::Burstable);
        let s = json!({"containers": [c("a", json!({"limits": {"cpu": "100m"}}))]});
        assert_eq!(pod_qos_class(&spec(s)), QosClass::Burstable);
        let g = json!({"cpu": "100m", "memory": "100Mi"});
        // One guaranteed container and one best-effort init container.
        let s = json!({"containers": [c("a", json!({"requests": g, "limits": g}))],
                       "initContainers": [c("i", json!({}))]});
        assert_eq!(pod_qos_class(&spec(s)), QosClass::Burstable);
        let s = json!({"containers": [c("a", json!({"requests": {"cpu": "50m", "memory": "100Mi"}, "limits": g}))]});
        assert_eq!(pod_qos_class(&spec(s)), QosClass::Burstable);
    }

    #[test]
    fn pod_level_resources_win() {
        let g = json!({"cpu": "1", "memory": "1Gi"});
        let s =
            json!({"resources": {"requests": g, "limits": g}, "containers": [c("a", json!({}))]});
        assert_eq!(pod_qos_class(&spec(s)), QosClass::Guaranteed);
        let s = json!({"resources": {"requests": {"cpu": "1"}}, "containers": [c("a", json!({"requests": g, "limits": g}))]});
        assert_eq!(pod_qos_class(&spec(s)), QosClass::Burstable);
        assert_eq!(QosClass::BestEffort.as_str(), "BestEffort");
    }
}
