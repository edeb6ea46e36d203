//! What the DaemonSet controller reads off one of its pods: updated or old, ready,
//! available, and which of several on a node is kept (oldest scheduled first).

use std::cmp::Ordering;

use serde_json::Value;

use crate::controllers::history::HASH_LABEL;

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn label<'a>(pod: &'a Value, key: &str) -> &'a str {
    pod.pointer("/metadata/labels")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Upstream's IsPodUpdated: the pod carries the current revision's hash, or the current
/// template generation.
pub(crate) fn is_updated(pod: &Value, hash: &str, template_generation: Option<i64>) -> bool {
    let generation_matches = template_generation
        .is_some_and(|g| label(pod, super::TEMPLATE_GENERATION_LABEL) == g.to_string());
    (!hash.is_empty() && label(pod, HASH_LABEL) == hash) || generation_matches
}

pub(crate) fn hash_of(pod: &Value) -> &str {
    label(pod, HASH_LABEL)
}

pub(crate) fn phase(pod: &Value) -> &str {
    s(pod, "/status/phase")
}

pub(crate) use crate::controllers::controller_utils::{
    deleting, pod_available as is_available, pod_ready as is_ready,
};

/// Upstream's podByCreationTimestampAndPhase: scheduled pods first, then oldest, then name.
pub(crate) fn keep_order(a: &Value, b: &Value) -> Ordering {
    let scheduled = |p: &Value| s(p, "/spec/nodeName").is_empty();
    scheduled(a)
        .cmp(&scheduled(b))
        .then_with(|| s(a, "/metadata/creationTimestamp").cmp(s(b, "/metadata/creationTimestamp")))
        .then_with(|| s(a, "/metadata/name").cmp(s(b, "/metadata/name")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    #[test]
    fn updated_by_hash_or_generation() {
        let p = |h: &str, g: &str| json!({"metadata": {"labels": {"controller-revision-hash": h, "pod-template-generation": g}}});
        assert!(is_updated(&p("h2", "1"), "h2", Some(2)));
        assert!(is_updated(&p("h1", "2"), "h2", Some(2)));
        assert!(!is_updated(&p("h1", "1"), "h2", Some(2)));
        assert!(!is_updated(&p("h1", "1"), "h2", None));
    }

    #[test]
    fn availability_waits_min_ready_seconds() {
        let p = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        let at = |t: &str| t.parse::<Timestamp>().unwrap();
        assert!(is_ready(&p));
        assert!(is_available(&p, 0, at("2026-01-01T00:00:00Z")));
        assert!(!is_available(&p, 10, at("2026-01-01T00:00:09Z")));
        assert!(is_available(&p, 10, at("2026-01-01T00:00:10Z")));
        let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        assert!(!is_available(&not_ready, 0, at("2026-01-01T00:00:00Z")));
    }

    #[test]
    fn scheduled_and_oldest_first() {
        let p = |n: &str, node: &str, t: &str| json!({"metadata": {"name": n, "creationTimestamp": t}, "spec": {"nodeName": node}});
        let mut v = [
            p("c", "", "2026-01-01T00:00:00Z"),
            p("b", "n", "2026-01-01T00:00:05Z"),
            p("a", "n", "2026-01-01T00:00:05Z"),
            p("d", "n", "2026-01-01T00:00:01Z"),
        ];
        v.sort_by(keep_order);
        let names: Vec<&str> = v
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["d", "a", "b", "c"]);
    }
}
