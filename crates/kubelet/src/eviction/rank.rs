//! Which pod goes first (upstream's rankMemoryPressure, rankDiskPressureFunc and
//! rankPIDPressure), which pods are never evicted (IsCriticalPod), and what the evicted
//! pod is told (evictionMessage).

use super::signals::PodUsage;
use super::thresholds::{Observations, Signal, Threshold, format_amount};
use k8s_openapi::api::core::v1::{Container, Pod};
use nodus_k8s::quantity::{Format, parse_quantity};
use std::cmp::Ordering;

/// upstream's scheduling.SystemCriticalPriority (2 × 10⁹).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// upstream's IsCriticalPod: static and mirror pods, and pods with a priority at or above
/// system-critical. They are admitted under pressure and never evicted.
pub fn is_critical_pod(pod: &Pod) -> bool {
    crate::config::is_static_pod(pod)
        || crate::config::is_mirror_pod(pod)
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

fn priority(p: &Pod) -> i32 {
    p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

fn container_request(c: &Container, resource: &str) -> i64 {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(resource))
        .and_then(|q| parse_quantity(&q.0).ok())
        .map_or(0, |q| q.value())
}

/// The pod's request of `resource`: its containers' sum, or its largest init container's
/// when that is more (upstream's PodRequests without overhead).
pub fn pod_request(pod: &Pod, resource: &str) -> i64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let sum: i64 = spec
        .containers
        .iter()
        .map(|c| container_request(c, resource))
        .sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| container_request(c, resource))
        .max()
        .unwrap_or(0);
    sum.max(init)
}

/// a-before-b for booleans: `true` sorts first.
fn true_first(a: bool, b: bool) -> Ordering {
    b.cmp(&a)
}

/// The usage a ranking reads, or None when the pod has no stats.
type UsageOf<'a> = dyn Fn(&Pod) -> Option<&'a PodUsage> + 'a;

/// Pods without stats go first, as upstream's.
fn stats_first(a: Option<&PodUsage>, b: Option<&PodUsage>) -> Ordering {
    true_first(a.is_none(), b.is_none())
}

fn amount(signal: Signal, u: &PodUsage) -> i64 {
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => {
            u.memory_working_set.unwrap_or(0)
        }
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => u.inodes.unwrap_or(0),
        Signal::PidAvailable => u.processes.unwrap_or(0),
        _ => u.ephemeral_bytes.unwrap_or(0),
    }
}

fn request(signal: Signal, pod: &Pod) -> i64 {
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => pod_request(pod, "memory"),
        Signal::NodeFsAvailable | Signal::ImageFsAvailable => pod_request(pod, "ephemeral-storage"),
        _ => 0,
    }
}

/// Sorts `pods` so the first is the one to evict for `signal`:
/// memory and disk — usage above requests first, then lower priority, then the larger
/// usage above requests; pids — lower priority, then more processes.
pub fn rank<'a>(signal: Signal, pods: &mut [Pod], usage: &UsageOf<'a>) {
    let exceeds = |p: &Pod, u: &PodUsage| amount(signal, u) > request(signal, p);
    let over = |p: &Pod, u: &PodUsage| amount(signal, u) - request(signal, p);
    pods.sort_by(|a, b| {
        let (ua, ub) = (usage(a), usage(b));
        let stats_first = stats_first(ua, ub);
        if signal == Signal::PidAvailable {
            return priority(a).cmp(&priority(b)).then_with(|| {
                stats_first.then_with(|| match (ua, ub) {
                    (Some(x), Some(y)) => amount(signal, y).cmp(&amount(signal, x)),
                    _ => Ordering::Equal,
                })
            });
        }
        stats_first
            .then_with(|| match (ua, ub) {
                (Some(x), Some(y)) => true_first(exceeds(a, x), exceeds(b, y)),
                _ => Ordering::Equal,
            })
            .then_with(|| priority(a).cmp(&priority(b)))
            .then_with(|| match (ua, ub) {
                (Some(x), Some(y)) => over(b, y).cmp(&over(a, x)),
                _ => Ordering::Equal,
            })
    });
}

/// The message an evicted pod's status and event carry (upstream's evictionMessage):
/// `The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi.
/// Container x was using 70Mi, request is 0, has larger consumption of memory. `
pub fn eviction_message(
    resource: &str,
    pod: &Pod,
    usage: Option<&PodUsage>,
    thresholds: &[Threshold],
    obs: &Observations,
) -> String {
    let mut msg = format!("The node was low on resource: {resource}. ");
    if let Some((t, o)) = thresholds
        .iter()
        .filter(|t| t.signal.resource() == resource)
        .find_map(|t| obs.get(&t.signal).map(|o| (t, o)))
    {
        msg += &format!(
            "Threshold quantity: {}, available: {}. ",
            t.value.resolve(o.capacity).canonical(),
            format_amount(o.available, t.signal.format())
        );
    }
    let (Some(u), Some(spec)) = (usage, pod.spec.as_ref()) else {
        return msg;
    };
    for cu in &u.containers {
        let Some(c) = spec.containers.iter().find(|c| c.name == cu.name) else {
            continue;
        };
        let used = match resource {
            "memory" => cu.memory_working_set,
            "ephemeral-storage" => cu.ephemeral_bytes,
            _ => None,
        };
        let Some(used) = used else { continue };
        let req = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
            .and_then(|q| parse_quantity(&q.0).ok());
        let req_value = req.map_or(0, |q| q.value());
        if used > req_value {
            msg += &format!(
                "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                c.name,
                format_amount(used, Format::BinarySI),
                req.map_or_else(|| "0".to_string(), |q| q.canonical()),
            );
        }
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::super::thresholds::{Observation, parse_config};
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    fn pod(name: &str, priority: i32, mem_request: Option<&str>) -> Pod {
        let mut c = serde_json::json!({"name": "c", "image": "busybox"});
        if let Some(r) = mem_request {
            c["resources"] = serde_json::json!({"requests": {"memory": r}});
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": name, "namespace": "default"},
            "spec": {"priority": priority, "containers": [c]},
        }))
        .unwrap()
    }

    fn mem(v: i64) -> PodUsage {
        PodUsage {
            memory_working_set: Some(v),
            ephemeral_bytes: Some(v),
            inodes: Some(v),
            processes: Some(v),
            containers: vec![super::super::signals::ContainerUsage {
                name: "c".into(),
                memory_working_set: Some(v),
                ephemeral_bytes: Some(v),
            }],
        }
    }

    fn names(p: &[Pod]) -> Vec<&str> {
        p.iter()
            .map(|p| p.metadata.name.as_deref().unwrap())
            .collect()
    }

    const MI: i64 = 1 << 20;

    #[test]
    fn memory_ranks_exceeders_then_priority_then_usage_above_request() {
        let mut pods = vec![
            pod("within-request", 0, Some("500Mi")),
            pod("high-prio-hog", 1000, None),
            pod("small", 0, None),
            pod("big", 0, None),
            pod("no-stats", 0, None),
        ];
        let usage: HashMap<&str, PodUsage> = HashMap::from([
            ("within-request", mem(400 * MI)),
            ("high-prio-hog", mem(900 * MI)),
            ("small", mem(10 * MI)),
            ("big", mem(300 * MI)),
        ]);
        let f = |p: &Pod| usage.get(p.metadata.name.as_deref().unwrap_or_default());
        rank(Signal::MemoryAvailable, &mut pods, &f);
        assert_eq!(
            names(&pods),
            [
                "no-stats",
                "big",
                "small",
                "high-prio-hog",
                "within-request"
            ]
        );
    }

    #[test]
    fn pids_rank_by_priority_then_process_count() {
        let mut pods = vec![pod("a", 10, None), pod("b", 0, None), pod("c", 0, None)];
        let usage: HashMap<&str, PodUsage> =
            HashMap::from([("a", mem(500)), ("b", mem(5)), ("c", mem(50))]);
        let f = |p: &Pod| usage.get(p.metadata.name.as_deref().unwrap_or_default());
        rank(Signal::PidAvailable, &mut pods, &f);
        assert_eq!(names(&pods), ["c", "b", "a"]);
    }

    #[test]
    fn disk_ranks_by_ephemeral_usage() {
        let mut pods = vec![pod("a", 0, None), pod("b", 0, None)];
        let usage: HashMap<&str, PodUsage> =
            HashMap::from([("a", mem(20 * MI)), ("b", mem(30 * MI))]);
        let f = |p: &Pod| usage.get(p.metadata.name.as_deref().unwrap_or_default());
        rank(Signal::NodeFsAvailable, &mut pods, &f);
        assert_eq!(names(&pods), ["b", "a"]);
    }

    #[test]
    fn critical_pods_are_static_mirror_or_system_critical() {
        let mut p = pod("p", 0, None);
        assert!(!is_critical_pod(&p));
        p.metadata.annotations = Some(BTreeMap::from([(
            "kubernetes.io/config.source".to_string(),
            "file".to_string(),
        )]));
        assert!(is_critical_pod(&p));
        assert!(is_critical_pod(&pod("sys", SYSTEM_CRITICAL_PRIORITY, None)));
        assert!(!is_critical_pod(&pod(
            "high",
            SYSTEM_CRITICAL_PRIORITY - 1,
            None
        )));
    }

    #[test]
    fn message_names_threshold_and_offending_containers() {
        let t = parse_config(
            &BTreeMap::from([("memory.available".to_string(), "100Mi".to_string())]),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            false,
        )
        .unwrap();
        let obs = Observations::from([(
            Signal::MemoryAvailable,
            Observation {
                available: 50 * MI,
                capacity: 1 << 30,
            },
        )]);
        let p = pod("x", 0, None);
        let mut u = mem(70 * MI);
        u.containers[0].name = "c".into();
        assert_eq!(
            eviction_message("memory", &p, Some(&u), &t, &obs),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container c was using 70Mi, request is 0, has larger consumption of memory. "
        );
        let within = pod("y", 0, Some("100Mi"));
        assert_eq!(
            eviction_message("memory", &within, Some(&u), &t, &obs),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
        );
        assert_eq!(
            eviction_message("pids", &p, None, &t, &obs),
            "The node was low on resource: pids. "
        );
    }
}
