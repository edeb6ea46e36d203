//! The pod back-off of a Job (upstream's `getBackoff` / `getRemainingTimeForFailuresCount`):
//! after the n-th counted failure a replacement pod waits 10 s · 2^(n−1), at most 6 min,
//! measured from the last failure, which is when the pod finished ([`finished_at`]).

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

/// Upstream's `DefaultJobPodFailureBackOff`.
const BASE: Duration = Duration::from_secs(10);
/// Upstream's `MaxJobPodFailureBackOff`.
const MAX: Duration = Duration::from_secs(360);

/// The back-off after `failures` counted failures (none before the first).
pub(crate) fn delay(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let exp = (failures - 1).min(16);
    BASE.saturating_mul(1 << exp).min(MAX)
}

/// How long a replacement must still wait, `since_last_failure` after the last failure.
pub(crate) fn remaining(failures: u32, since_last_failure: Duration) -> Duration {
    delay(failures).saturating_sub(since_last_failure)
}

fn ts(v: Option<&Value>) -> Option<Timestamp> {
    v.and_then(Value::as_str).and_then(|t| t.parse().ok())
}

/// When the pod finished (upstream's `getFinishedTime` before its creation-time fallback):
/// the latest `finishedAt` once every container (and sidecar) has terminated, else when it
/// turned Ready=False, else its deletion time less the grace period.
pub(crate) fn finished_at(pod: &Value) -> Option<Timestamp> {
    from_containers(pod)
        .or_else(|| {
            pod.pointer("/status/conditions")
                .and_then(Value::as_array)?
                .iter()
                .find(|c| c["type"] == "Ready" && c["status"] == "False")
                .and_then(|c| ts(c.get("lastTransitionTime")))
        })
        .or_else(|| {
            let deleted = ts(pod.pointer("/metadata/deletionTimestamp"))?;
            let grace = pod
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            deleted.checked_sub(SignedDuration::from_secs(grace)).ok()
        })
}

fn from_containers(pod: &Value) -> Option<Timestamp> {
    let sidecars: Vec<&str> = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter(|c| c["restartPolicy"] == "Always")
                .filter_map(|c| c["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    let statuses = |key: &str| {
        pod.pointer(&format!("/status/{key}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let relevant = statuses("containerStatuses").into_iter().chain(
        statuses("initContainerStatuses")
            .into_iter()
            .filter(|cs| sidecars.contains(&cs["name"].as_str().unwrap_or(""))),
    );
    let mut latest: Option<Timestamp> = None;
    for cs in relevant {
        // One container still running (or without a finish time) means no finish yet.
        let t = ts(cs.pointer("/state/terminated/finishedAt"))?;
        latest = Some(latest.map_or(t, |l| l.max(t)));
    }
    latest
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finish_time_as_upstream_looks_it_up() {
        let t = |s: &str| s.parse::<Timestamp>().ok();
        let done = |name: &str, at: &str| json!({"name": name, "state": {"terminated": {"finishedAt": at}}});
        let cases = [
            (
                json!({"status": {"containerStatuses": [done("a", "2024-01-01T00:00:05Z"), done("b", "2024-01-01T00:00:09Z")]}}),
                t("2024-01-01T00:00:09Z"),
            ),
            // One container still running: the Ready=False transition decides.
            (
                json!({"status": {"containerStatuses": [done("a", "2024-01-01T00:00:05Z"), {"name": "b", "state": {"running": {}}}],
                    "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2024-01-01T00:00:07Z"}]}}),
                t("2024-01-01T00:00:07Z"),
            ),
            // A sidecar finishes after the main container.
            (
                json!({"spec": {"initContainers": [{"name": "side", "restartPolicy": "Always"}, {"name": "init"}]},
                    "status": {"containerStatuses": [done("a", "2024-01-01T00:00:05Z")],
                    "initContainerStatuses": [done("side", "2024-01-01T00:00:06Z"), done("init", "2024-01-01T00:00:08Z")]}}),
                t("2024-01-01T00:00:06Z"),
            ),
            (
                json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:30Z", "deletionGracePeriodSeconds": 30}}),
                t("2024-01-01T00:00:00Z"),
            ),
            (json!({"status": {"phase": "Failed"}}), None),
        ];
        for (pod, want) in cases {
            assert_eq!(finished_at(&pod), want, "{pod}");
        }
    }

    #[test]
    fn doubles_from_ten_seconds_up_to_six_minutes() {
        let cases = [
            (0, 0),
            (1, 10),
            (2, 20),
            (3, 40),
            (4, 80),
            (5, 160),
            (6, 320),
            (7, 360),
            (40, 360),
        ];
        for (failures, secs) in cases {
            assert_eq!(
                delay(failures),
                Duration::from_secs(secs),
                "{failures} failures"
            );
        }
        assert_eq!(
            remaining(2, Duration::from_secs(5)),
            Duration::from_secs(15)
        );
        assert_eq!(remaining(2, Duration::from_secs(25)), Duration::ZERO);
        assert_eq!(remaining(0, Duration::ZERO), Duration::ZERO);
    }
}
