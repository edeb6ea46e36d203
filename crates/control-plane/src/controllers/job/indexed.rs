//! Indexed completion mode: a pod's completion index (the
//! `batch.kubernetes.io/job-completion-index` annotation) and `status.completedIndexes`
//! written as upstream does, sorted intervals `1,3-5,7`.

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

/// `1,3-5,7` for {1,3,4,5,7}.
pub(crate) fn format(set: &BTreeSet<i64>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = set.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_round_trip() {
        let cases: [(&[i64], &str); 4] = [
            (&[], ""),
            (&[0], "0"),
            (&[0, 1, 2, 4], "0-2,4"),
            (&[1, 3, 4, 5, 7], "1,3-5,7"),
        ];
        for (set, text) in cases {
            let set: BTreeSet<i64> = set.iter().copied().collect();
            assert_eq!(format(&set), text);
            assert_eq!(parse(text, 10), set);
        }
        assert_eq!(parse("0-9", 3), [0, 1, 2].into());
    }
}
