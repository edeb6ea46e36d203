//! Indexed completion mode: a pod's completion index (the
//! `batch.kubernetes.io/job-completion-index` annotation), `status.completedIndexes` and
//! `status.failedIndexes` written as upstream does (sorted intervals `1,3-5,7`, a pair as
//! `1,2`), and which indexes get a pod next.

use std::collections::BTreeSet;

use serde_json::Value;

/// The annotation and label carrying a pod's index.
pub(crate) const INDEX_KEY: &str = "batch.kubernetes.io/job-completion-index";

/// A pod's completion index, when it has a valid one below `completions`.
pub(crate) fn pod_index(pod: &Value, completions: i64) -> Option<i64> {
    let i: i64 = pod
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(INDEX_KEY))
        .and_then(Value::as_str)?
        .parse()
        .ok()?;
    (0..completions).contains(&i).then_some(i)
}

/// `1,3-5,7` for {1,3,4,5,7}; an interval of two is written `3,4`, as upstream's
/// `orderedIntervals.String()` does.
pub(crate) fn format(set: &BTreeSet<i64>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = set.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        out.push(match end - start {
            0 => start.to_string(),
            1 => format!("{start},{end}"),
            _ => format!("{start}-{end}"),
        });
    }
    out.join(",")
}

/// The inverse of [`format`], ignoring malformed parts and indexes at or above `completions`.
pub(crate) fn parse(s: &str, completions: i64) -> BTreeSet<i64> {
    let mut set = BTreeSet::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>()) {
            set.extend((a.max(0)..=b.min(completions - 1)).filter(|_| a <= b));
        }
    }
    set
}

/// Upstream's `firstPendingIndexes`: the `count` lowest indexes below `completions` that
/// neither succeeded, failed for good, nor have a pod (`busy`: active pods, and terminating
/// ones when only failed pods are replaced).
pub(crate) fn first_pending(
    count: usize,
    completions: i64,
    succeeded: &BTreeSet<i64>,
    failed: &BTreeSet<i64>,
    busy: &BTreeSet<i64>,
) -> Vec<i64> {
    // Walks the taken indexes alongside the candidates, so the cost is bounded by the
    // indexes known plus `count`, never by `completions`.
    let taken: BTreeSet<i64> = succeeded
        .iter()
        .chain(failed)
        .chain(busy)
        .copied()
        .collect();
    let mut taken = taken.into_iter().peekable();
    let mut out = Vec::with_capacity(count);
    let mut candidate = 0;
    while out.len() < count && candidate < completions {
        while taken.next_if(|t| *t < candidate).is_some() {}
        if taken.next_if_eq(&candidate).is_none() {
            out.push(candidate);
        }
        candidate += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_pending_skips_finished_and_busy_indexes() {
        let set = |v: &[i64]| v.iter().copied().collect::<BTreeSet<i64>>();
        // (count, completions, succeeded, failed, busy, want)
        type Case<'a> = (usize, i64, &'a [i64], &'a [i64], &'a [i64], &'a [i64]);
        let cases: [Case; 6] = [
            (0, 5, &[], &[], &[], &[]),
            (2, 5, &[], &[], &[], &[0, 1]),
            (3, 5, &[0], &[1], &[3], &[2, 4]),
            (5, 5, &[0, 1, 2, 3, 4], &[], &[], &[]),
            (1, 5, &[0, 1], &[2], &[], &[3]),
            (10, 3, &[], &[], &[1], &[0, 2]),
        ];
        for (count, completions, succ, failed, busy, want) in cases {
            assert_eq!(
                first_pending(count, completions, &set(succ), &set(failed), &set(busy)),
                want,
                "count {count} succeeded {succ:?} failed {failed:?} busy {busy:?}"
            );
        }
    }

    #[test]
    fn intervals_round_trip() {
        let cases: [(&[i64], &str); 6] = [
            (&[], ""),
            (&[0], "0"),
            (&[0, 1], "0,1"),
            (&[0, 1, 2, 4], "0-2,4"),
            (&[1, 3, 4, 5, 7], "1,3-5,7"),
            (&[2, 3, 5, 6, 7, 9], "2,3,5-7,9"),
        ];
        for (set, text) in cases {
            let set: BTreeSet<i64> = set.iter().copied().collect();
            assert_eq!(format(&set), text);
            assert_eq!(parse(text, 10), set);
        }
        assert_eq!(parse("0-9", 3), [0, 1, 2].into());
    }
}
