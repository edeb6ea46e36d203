//! `spec.podFailurePolicy` (upstream's `matchPodFailurePolicy`): the first rule matching a
//! failed pod's container exit codes or pod conditions decides what the failure means.

use serde_json::Value;

/// A rule's action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    FailJob,
    FailIndex,
    Ignore,
    Count,
}

impl Action {
    fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "FailJob" => Action::FailJob,
            "FailIndex" => Action::FailIndex,
            "Ignore" => Action::Ignore,
            "Count" => Action::Count,
            _ => return None,
        })
    }
}

/// The matching rule's action with upstream's message for a FailJob/FailIndex match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Match {
    pub action: Action,
    pub message: String,
}

fn statuses(pod: &Value) -> impl Iterator<Item = &Value> {
    ["initContainerStatuses", "containerStatuses"]
        .into_iter()
        .flat_map(move |k| {
            pod.pointer(&format!("/status/{k}"))
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or(&[])
        })
}

fn exit_code_match(rule: &Value, pod: &Value) -> Option<(String, i64)> {
    let oc = rule.get("onExitCodes").filter(|v| !v.is_null())?;
    let op_in = oc.get("operator").and_then(Value::as_str) == Some("In");
    let values: Vec<i64> = oc
        .get("values")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    let container = oc.get("containerName").and_then(Value::as_str);
    statuses(pod).find_map(|cs| {
        let name = cs.get("name").and_then(Value::as_str).unwrap_or("");
        if container.is_some_and(|c| c != name) {
            return None;
        }
        let code = cs
            .pointer("/state/terminated/exitCode")
            .and_then(Value::as_i64)?;
        // Exit code 0 never matches NotIn: a succeeded container is no failure.
        let hit = if op_in {
            values.contains(&code)
        } else {
            code != 0 && !values.contains(&code)
        };
        hit.then(|| (name.to_string(), code))
    })
}

fn condition_match(rule: &Value, pod: &Value) -> Option<String> {
    let pats = rule.get("onPodConditions").and_then(Value::as_array)?;
    let conds = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)?;
    pats.iter().find_map(|p| {
        let ty = p.get("type").and_then(Value::as_str)?;
        let want = p.get("status").and_then(Value::as_str).unwrap_or("True");
        conds
            .iter()
            .any(|c| c["type"] == ty && c["status"] == want)
            .then(|| ty.to_string())
    })
}

/// The first matching rule of `policy` for the failed `pod`, `None` when no rule matches
/// (the failure counts against the backoff limit).
pub(crate) fn match_pod(policy: &Value, pod: &Value) -> Option<Match> {
    let rules = policy.get("rules").and_then(Value::as_array)?;
    let pod_ref = format!(
        "{}/{}",
        pod.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or(""),
        pod.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
    );
    for (i, rule) in rules.iter().enumerate() {
        let Some(action) = rule
            .get("action")
            .and_then(Value::as_str)
            .and_then(Action::parse)
        else {
            continue;
        };
        let rule_name = match action {
            Action::FailJob => "FailJob",
            Action::FailIndex => "FailIndex",
            Action::Ignore => "Ignore",
            Action::Count => "Count",
        };
        if let Some((container, code)) = exit_code_match(rule, pod) {
            return Some(Match {
                action,
                message: format!(
                    "Container {container} for pod {pod_ref} failed with exit code {code} matching {rule_name} rule at index {i}"
                ),
            });
        }
        if let Some(ty) = condition_match(rule, pod) {
            return Some(Match {
                action,
                message: format!(
                    "Pod {pod_ref} has condition {ty} matching {rule_name} rule at index {i}"
                ),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(code: i64, conds: Value) -> Value {
        json!({"metadata": {"namespace": "ns", "name": "p"}, "status": {"phase": "Failed",
            "conditions": conds,
            "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": code}}}]}})
    }

    #[test]
    fn first_matching_rule_wins() {
        let policy = json!({"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [1, 2]}},
        ]});
        let disrupted = json!([{"type": "DisruptionTarget", "status": "True"}]);
        let cases = [
            (pod(42, json!([])), Some(Action::FailJob)),
            (pod(42, disrupted.clone()), Some(Action::FailJob)),
            (pod(1, disrupted), Some(Action::Ignore)),
            (pod(3, json!([])), Some(Action::Count)),
            (pod(1, json!([])), None),
            (pod(0, json!([])), None),
        ];
        for (p, want) in cases {
            assert_eq!(match_pod(&policy, &p).map(|m| m.action), want, "{p}");
        }
        assert_eq!(
            match_pod(&policy, &pod(42, json!([]))).map(|m| m.message),
            Some("Container main for pod ns/p failed with exit code 42 matching FailJob rule at index 0".to_string())
        );
    }
}
