//! `spec.backoffLimitPerIndex` (upstream's per-index parts of `indexed_job_utils.go`): each
//! index of an Indexed Job is retried on its own. A pod carries how many earlier pods of its
//! index failed (`batch.kubernetes.io/job-index-failure-count`, and the failures the pod
//! failure policy ignored in `…-ignored-failure-count`); a failed pod whose count already
//! reached the limit, or that a FailIndex rule matched, fails its index for good, and the
//! index joins `status.failedIndexes`. Otherwise the index gets a replacement after its own
//! back-off, counted from that pod's failure, and the failed pod keeps its tracking finalizer
//! until the replacement exists, so the counts pass from one pod to the next.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::backoff;
use super::failure_policy::Action;

/// Failures of earlier pods of the index that count against the limit.
pub(crate) const FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";
/// Failures of earlier pods of the index that the pod failure policy ignored.
pub(crate) const IGNORED_FAILURE_COUNT: &str =
    "batch.kubernetes.io/job-index-ignored-failure-count";

/// The two counts a pod of an index carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FailureCounts {
    pub counted: i64,
    pub ignored: i64,
}

impl FailureCounts {
    /// Upstream reads a missing, malformed, negative or out-of-int32 value as 0, so a user
    /// editing the annotation cannot wedge the index.
    pub(crate) fn of(pod: &Value) -> FailureCounts {
        let read = |key: &str| {
            pod.pointer("/metadata/annotations")
                .and_then(|a| a.get(key))
                .and_then(Value::as_str)
                .and_then(|v| v.parse::<i64>().ok())
                .filter(|n| (0..=i64::from(i32::MAX)).contains(n))
                .unwrap_or(0)
        };
        FailureCounts {
            counted: read(FAILURE_COUNT),
            ignored: read(IGNORED_FAILURE_COUNT),
        }
    }

    /// Every failure of the index so far, ignored ones included: what its back-off grows with.
    fn absolute(self) -> i64 {
        self.counted + self.ignored
    }
}

/// What a failed pod's failure means for its index, from the pod failure policy's match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A FailIndex rule matched: the index fails now.
    FailIndex,
    /// Counts against `backoffLimitPerIndex` (no rule, or a Count or FailJob rule).
    Counted,
    /// An Ignore rule matched: retried without using up the limit.
    Ignored,
}

impl Outcome {
    pub(crate) fn of(action: Option<Action>) -> Outcome {
        match action {
            Some(Action::FailIndex) => Outcome::FailIndex,
            Some(Action::Ignore) => Outcome::Ignored,
            Some(Action::FailJob | Action::Count) | None => Outcome::Counted,
        }
    }
}

/// Upstream's `isIndexFailed`: whether the failed `pod` fails its index for good.
pub(crate) fn index_failed(pod: &Value, limit: i64, outcome: Outcome) -> bool {
    match outcome {
        Outcome::FailIndex => true,
        Outcome::Counted => FailureCounts::of(pod).counted >= limit,
        Outcome::Ignored => false,
    }
}

/// Upstream's `getNewIndexFailureCounts`: the counts of the pod replacing the failed
/// `predecessor`, or zeros for an index's first pod.
pub(crate) fn replacement_counts(predecessor: Option<(&Value, Outcome)>) -> FailureCounts {
    let Some((pod, outcome)) = predecessor else {
        return FailureCounts::default();
    };
    let mut c = FailureCounts::of(pod);
    match outcome {
        Outcome::Ignored => c.ignored += 1,
        Outcome::Counted | Outcome::FailIndex => c.counted += 1,
    }
    c
}

/// Upstream's `getRemainingTimePerIndex`: how long the index of the failed `predecessor`
/// still waits, `since` that pod failed.
pub(crate) fn remaining(predecessor: &Value, since: Duration) -> Duration {
    let failures = FailureCounts::of(predecessor).absolute() + 1;
    backoff::remaining(failures.clamp(0, i64::from(u32::MAX)) as u32, since)
}

/// Upstream's `getPodsWithDelayedDeletionPerIndex`: per index, the failed pod a replacement
/// is made from: the one with the most failures behind it, the later failure on a tie.
/// `candidates` are failed pods still holding the finalizer whose index is neither
/// finished nor running, with their index and failure time.
pub(crate) fn delayed_deletion<'a>(
    candidates: impl IntoIterator<Item = (i64, &'a Value, Timestamp)>,
) -> BTreeMap<i64, (&'a Value, Timestamp)> {
    let mut out: BTreeMap<i64, (&'a Value, Timestamp)> = BTreeMap::new();
    for (ix, pod, at) in candidates {
        let replace = out.get(&ix).is_none_or(|(last, last_at)| {
            FailureCounts::of(last).absolute() <= FailureCounts::of(pod).absolute()
                && at >= *last_at
        });
        if replace {
            out.insert(ix, (pod, at));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, counted: &str, ignored: Option<&str>) -> Value {
        let mut p = json!({"metadata": {"name": name, "annotations": {FAILURE_COUNT: counted}}});
        if let Some(i) = ignored {
            p["metadata"]["annotations"][IGNORED_FAILURE_COUNT] = json!(i);
        }
        p
    }

    #[test]
    fn counts_read_as_upstream_parses_them() {
        let cases = [
            (pod("a", "3", Some("2")), (3, 2)),
            (pod("a", "0", None), (0, 0)),
            (pod("a", "-1", None), (0, 0)),
            (pod("a", "x", Some("1")), (0, 1)),
            (pod("a", "2147483648", None), (0, 0)),
            (json!({"metadata": {}}), (0, 0)),
        ];
        for (p, (counted, ignored)) in cases {
            assert_eq!(
                FailureCounts::of(&p),
                FailureCounts { counted, ignored },
                "{p}"
            );
        }
    }

    #[test]
    fn an_index_fails_once_its_limit_is_used_up_or_a_fail_index_rule_matches() {
        // (failures before this pod, limit, outcome, index failed)
        let cases = [
            ("0", 0, Outcome::Counted, true),
            ("0", 1, Outcome::Counted, false),
            ("1", 1, Outcome::Counted, true),
            ("2", 1, Outcome::Counted, true),
            ("5", 1, Outcome::Ignored, false),
            ("0", 3, Outcome::FailIndex, true),
        ];
        for (count, limit, outcome, want) in cases {
            assert_eq!(
                index_failed(&pod("p", count, None), limit, outcome),
                want,
                "count {count} limit {limit} {outcome:?}"
            );
        }
    }

    #[test]
    fn a_replacement_carries_its_predecessors_counts() {
        let failed = pod("p", "1", Some("2"));
        let cases = [
            (None, (0, 0)),
            (Some((&failed, Outcome::Counted)), (2, 2)),
            (Some((&failed, Outcome::Ignored)), (1, 3)),
        ];
        for (predecessor, (counted, ignored)) in cases {
            assert_eq!(
                replacement_counts(predecessor),
                FailureCounts { counted, ignored },
                "{predecessor:?}"
            );
        }
    }

    #[test]
    fn back_off_grows_with_every_failure_of_the_index() {
        // One failure: 10 s; three before it (one ignored) and this one: 80 s.
        assert_eq!(
            remaining(&pod("p", "0", None), Duration::from_secs(4)),
            Duration::from_secs(6)
        );
        assert_eq!(
            remaining(&pod("p", "2", Some("1")), Duration::from_secs(30)),
            Duration::from_secs(50)
        );
        assert_eq!(
            remaining(&pod("p", "0", None), Duration::from_secs(11)),
            Duration::ZERO
        );
    }

    #[test]
    fn the_latest_failure_of_an_index_is_kept_for_its_replacement() {
        let t = |s: u64| Timestamp::from_second(s as i64).expect("ts");
        let (a, b, c, d, e) = (
            pod("a", "0", None),
            pod("b", "1", None),
            pod("c", "0", Some("1")),
            pod("d", "0", None),
            pod("e", "1", None),
        );
        let got = delayed_deletion([
            (0, &a, t(10)),
            (0, &b, t(20)),
            (1, &c, t(30)),
            // Fewer failures behind it: not the latest, though it finished later.
            (1, &d, t(40)),
            // Same counts, earlier failure: the one already kept stays.
            (0, &e, t(15)),
        ]);
        let names: Vec<(i64, &str)> = got
            .iter()
            .map(|(ix, (p, _))| (*ix, p["metadata"]["name"].as_str().unwrap_or("")))
            .collect();
        assert_eq!(names, vec![(0, "b"), (1, "c")]);
    }
}
