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

/// The QoS class of a pod; a pod without a spec is BestEffort.
pub fn pod_qos(pod: &k8s_openapi::api::core::v1::Pod) -> QosClass {
    match pod.spec.as_ref() {
        Some(spec) => pod_qos_class(spec),
        None => pod_qos_class(&PodSpec::default()),
    }
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

    /// `getResourceList(cpu, memory)` of upstream's qos_test.go.
    fn rl(cpu: &str, memory: &str) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        if !cpu.is_empty() {
            m.insert("cpu".into(), json!(cpu));
        }
        if !memory.is_empty() {
            m.insert("memory".into(), json!(memory));
        }
        serde_json::Value::Object(m)
    }

    fn ctr(req: serde_json::Value, lim: serde_json::Value) -> serde_json::Value {
        json!({"name": "c", "resources": {"requests": req, "limits": lim}})
    }

    #[test]
    fn upstream_compute_pod_qos_table() {
        use QosClass::*;
        let with_huge = |mut v: serde_json::Value| {
            v["hugepages-2Mi"] = json!("1Gi");
            v
        };
        let cases: Vec<(&str, serde_json::Value, QosClass)> = vec![
            (
                "guaranteed",
                json!({"containers": [ctr(rl("100m", "100Mi"), rl("100m", "100Mi"))]}),
                Guaranteed,
            ),
            (
                "guaranteed-guaranteed",
                json!({"containers": [ctr(rl("100m", "100Mi"), rl("100m", "100Mi")), ctr(rl("100m", "100Mi"), rl("100m", "100Mi"))]}),
                Guaranteed,
            ),
            (
                "best-effort-best-effort",
                json!({"containers": [ctr(rl("", ""), rl("", "")), ctr(rl("", ""), rl("", ""))]}),
                BestEffort,
            ),
            (
                "best-effort",
                json!({"containers": [ctr(rl("", ""), rl("", ""))]}),
                BestEffort,
            ),
            (
                "best-effort-burstable",
                json!({"containers": [ctr(rl("", ""), rl("", "")), ctr(rl("1", ""), rl("2", ""))]}),
                Burstable,
            ),
            (
                "best-effort-guaranteed",
                json!({"containers": [ctr(rl("", ""), rl("", "")), ctr(rl("10m", "100Mi"), rl("10m", "100Mi"))]}),
                Burstable,
            ),
            (
                "burstable-cpu-guaranteed-memory",
                json!({"containers": [ctr(rl("", "100Mi"), rl("", "100Mi"))]}),
                Burstable,
            ),
            (
                "burstable-no-limits",
                json!({"containers": [ctr(rl("100m", "100Mi"), rl("", ""))]}),
                Burstable,
            ),
            (
                "burstable-guaranteed",
                json!({"containers": [ctr(rl("1", "100Mi"), rl("2", "100Mi")), ctr(rl("100m", "100Mi"), rl("100m", "100Mi"))]}),
                Burstable,
            ),
            (
                "burstable-unbounded-but-requests-match-limits",
                json!({"containers": [ctr(rl("100m", "100Mi"), rl("200m", "200Mi")), ctr(rl("100m", "100Mi"), rl("", ""))]}),
                Burstable,
            ),
            (
                "burstable-1",
                json!({"containers": [ctr(rl("10m", "100Mi"), rl("100m", "200Mi"))]}),
                Burstable,
            ),
            (
                "burstable-2",
                json!({"containers": [ctr(rl("0", "0"), rl("100m", "200Mi"))]}),
                Burstable,
            ),
            (
                "best-effort-hugepages",
                json!({"containers": [ctr(with_huge(rl("0", "0")), with_huge(rl("0", "0")))]}),
                BestEffort,
            ),
            (
                "init-container",
                json!({"containers": [ctr(rl("", ""), rl("", ""))], "initContainers": [ctr(rl("10m", "100Mi"), rl("100m", "200Mi"))]}),
                Burstable,
            ),
            (
                "guaranteed-with-pod-level-resources",
                json!({"containers": [ctr(rl("", ""), rl("", ""))], "resources": {"requests": rl("10m", "100Mi"), "limits": rl("10m", "100Mi")}}),
                Guaranteed,
            ),
            (
                "guaranteed-with-pod-and-container-level-resources",
                json!({"containers": [ctr(rl("3m", "10Mi"), rl("5m", "20Mi"))], "resources": {"requests": rl("10m", "100Mi"), "limits": rl("10m", "100Mi")}}),
                Guaranteed,
            ),
            (
                "burstable-with-pod-level-resources",
                json!({"containers": [ctr(rl("", ""), rl("", ""))], "resources": {"requests": rl("10m", "10Mi"), "limits": rl("20m", "50Mi")}}),
                Burstable,
            ),
            (
                "burstable-with-pod-and-container-level-resources",
                json!({"containers": [ctr(rl("5m", "10Mi"), rl("5m", "10Mi"))], "resources": {"requests": rl("10m", "10Mi"), "limits": rl("20m", "50Mi")}}),
                Burstable,
            ),
            (
                "burstable-with-pod-and-container-level-requests",
                json!({"containers": [ctr(rl("5m", "10Mi"), rl("", ""))], "resources": {"requests": rl("10m", "10Mi"), "limits": rl("", "")}}),
                Burstable,
            ),
            (
                "burstable-with-pod-and-container-level-resources-2",
                json!({"containers": [ctr(rl("5m", "10Mi"), rl("", "")), ctr(rl("5m", "10Mi"), rl("5m", "10Mi"))], "resources": {"requests": rl("10m", "10Mi"), "limits": rl("5m", "")}}),
                Burstable,
            ),
        ];
        for (name, s, want) in cases {
            assert_eq!(pod_qos_class(&spec(s)), want, "{name}");
        }
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
