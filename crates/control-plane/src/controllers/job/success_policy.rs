//! `spec.successPolicy` (upstream's `matchSuccessPolicy`): an Indexed Job may be declared
//! succeeded before every index has, once the succeeded indexes meet one of its rules.
//! Rules are tried in order; a rule with `succeededIndexes` needs all of them, or only
//! `succeededCount` of them when both are given; a rule with only `succeededCount` needs that
//! many succeeded indexes anywhere.

use std::collections::BTreeSet;

use serde_json::Value;

use super::indexed;

/// The condition message when rule `index` is the first one met.
fn matched(index: usize) -> String {
    format!("Matched rules at index {index}")
}

/// The SuccessCriteriaMet message when `succeeded` (indexes below `completions`) meets a
/// rule of `policy`, `None` when no rule is met yet.
pub(crate) fn matches(
    policy: &Value,
    completions: i64,
    succeeded: &BTreeSet<i64>,
) -> Option<String> {
    if succeeded.is_empty() {
        return None;
    }
    let rules = policy.get("rules").and_then(Value::as_array)?;
    for (i, rule) in rules.iter().enumerate() {
        let count = rule.get("succeededCount").and_then(Value::as_i64);
        match rule.get("succeededIndexes").and_then(Value::as_str) {
            Some(text) => {
                let required = indexed::parse(text, completions);
                // A rule whose indexes do not parse names nothing and can never be met.
                if required.is_empty() {
                    continue;
                }
                let contained = required.intersection(succeeded).count() as i64;
                if contained == required.len() as i64 || count.is_some_and(|c| contained >= c) {
                    return Some(matched(i));
                }
            }
            None => {
                if count.is_some_and(|c| succeeded.len() as i64 >= c) {
                    return Some(matched(i));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The cases of upstream's `TestMatchSuccessPolicy` (with the feature gate on).
    #[test]
    fn rules_are_met_as_upstream_decides() {
        let set = |intervals: &[(i64, i64)]| -> BTreeSet<i64> {
            intervals.iter().flat_map(|(a, b)| *a..=*b).collect()
        };
        let rule = |ix: Option<&str>, count: Option<i64>| {
            let mut r = json!({});
            if let Some(ix) = ix {
                r["succeededIndexes"] = json!(ix);
            }
            if let Some(c) = count {
                r["succeededCount"] = json!(c);
            }
            r
        };
        // (rules, succeeded intervals, matched rule)
        type Case<'a> = (Vec<Value>, &'a [(i64, i64)], Option<usize>);
        let cases: Vec<Case> = vec![
            (vec![], &[(0, 0)], None),
            (vec![rule(Some("invalid-form"), None)], &[(0, 0)], None),
            (vec![rule(Some("0-2"), None)], &[(0, 2), (4, 7)], Some(0)),
            (vec![rule(Some("3"), None)], &[(0, 2)], None),
            (vec![rule(None, Some(2))], &[(0, 2)], Some(0)),
            (vec![rule(None, Some(4))], &[(0, 2)], None),
            (
                vec![rule(Some("9"), None), rule(Some("4,6"), None)],
                &[(0, 2), (4, 7)],
                Some(1),
            ),
            (
                vec![rule(Some("0,1"), None), rule(Some("5"), None)],
                &[(0, 2), (4, 7)],
                Some(0),
            ),
            (vec![rule(Some("3-6"), Some(2))], &[(0, 2), (4, 7)], Some(0)),
            (vec![rule(Some("3-6"), Some(2))], &[(0, 2), (6, 7)], None),
            (vec![rule(None, Some(4))], &[], None),
            (
                vec![rule(Some("2-4,6-8"), None)],
                &[(1, 5), (6, 9)],
                Some(0),
            ),
            (
                vec![rule(Some("2-4,6-9"), None)],
                &[(2, 4), (6, 9)],
                Some(0),
            ),
            (
                vec![rule(Some("2-4,8-12"), None)],
                &[(2, 5), (7, 15)],
                Some(0),
            ),
            (vec![rule(Some(""), None)], &[(1, 3)], None),
            (vec![rule(Some(""), None)], &[], None),
            (
                vec![rule(Some("10-12,14-16"), None)],
                &[(1, 3), (5, 7)],
                None,
            ),
            (vec![rule(Some("1-3,5-7"), None)], &[(2, 4), (6, 8)], None),
            (
                vec![rule(Some("1-3,5-7"), Some(4))],
                &[(2, 4), (6, 8)],
                Some(0),
            ),
            (vec![rule(Some("2-4,6-9"), None)], &[(1, 3), (5, 7)], None),
            (
                vec![rule(Some("2-4,6-9"), Some(4))],
                &[(1, 3), (5, 7)],
                Some(0),
            ),
            (vec![rule(Some("0-4,6-9"), None)], &[(1, 3), (7, 8)], None),
            (
                vec![rule(Some("0-4,6-9"), Some(5))],
                &[(1, 3), (7, 8)],
                Some(0),
            ),
            (vec![rule(Some("0-6,8-9"), None)], &[(1, 3), (5, 9)], None),
            (
                vec![rule(Some("0-6,8-9"), Some(7))],
                &[(1, 3), (5, 9)],
                Some(0),
            ),
            (vec![rule(Some("0-5,7-9"), None)], &[(1, 5), (7, 10)], None),
            (
                vec![rule(Some("0-5,7-9"), Some(8))],
                &[(1, 5), (7, 10)],
                Some(0),
            ),
            (vec![rule(Some("0-3,6-9"), None)], &[(1, 10)], None),
            (vec![rule(Some("0-3,6-9"), Some(7))], &[(1, 10)], Some(0)),
        ];
        for (rules, succeeded, want) in cases {
            let policy = json!({ "rules": rules });
            assert_eq!(
                matches(&policy, 10, &set(succeeded)),
                want.map(matched),
                "{policy} with {succeeded:?}"
            );
        }
        assert_eq!(
            matches(
                &json!({"rules": [{"succeededCount": 1}]}),
                10,
                &set(&[(3, 3)])
            ),
            Some("Matched rules at index 0".to_string())
        );
    }
}
