//! API Priority and Fairness configuration objects every cluster starts with: upstream's
//! mandatory and suggested PriorityLevelConfigurations and FlowSchemas
//! (`k8s.io/apiserver/pkg/apis/flowcontrol/bootstrap`), as `flowcontrol.apiserver.k8s.io/v1`
//! JSON. The API server creates them at start, and validation insists that the mandatory
//! ones keep their fixed spec.

use serde_json::{Value, json};

/// The annotation upstream's configuration producer sets: the server may rewrite the spec.
pub const AUTOUPDATE_ANNOTATION: &str = "apf.kubernetes.io/autoupdate-spec";

/// Names whose spec may never change (upstream's `MandatoryFlowSchemas` and
/// `MandatoryPriorityLevelConfigurations` share the names).
pub const EXEMPT: &str = "exempt";
pub const CATCH_ALL: &str = "catch-all";

fn limited_queued(shares: i64, lendable: i64, queues: i64, hand: i64, qll: i64) -> Value {
    json!({"type": "Limited", "limited": {
        "nominalConcurrencyShares": shares, "lendablePercent": lendable,
        "limitResponse": {"type": "Queue", "queuing": {
            "queues": queues, "handSize": hand, "queueLengthLimit": qll}}}})
}

/// (name, spec) of every PriorityLevelConfiguration, mandatory first.
pub fn priority_levels() -> Vec<(&'static str, Value)> {
    vec![
        (
            EXEMPT,
            json!({"type": "Exempt", "exempt": {"nominalConcurrencyShares": 0, "lendablePercent": 0}}),
        ),
        (
            CATCH_ALL,
            json!({"type": "Limited", "limited": {
                "nominalConcurrencyShares": 5, "lendablePercent": 0,
                "limitResponse": {"type": "Reject"}}}),
        ),
        ("system", limited_queued(30, 33, 64, 6, 50)),
        ("node-high", limited_queued(40, 25, 64, 6, 50)),
        ("leader-election", limited_queued(10, 0, 16, 4, 50)),
        ("workload-high", limited_queued(40, 50, 128, 6, 50)),
        ("workload-low", limited_queued(100, 90, 128, 6, 50)),
        ("global-default", limited_queued(20, 50, 128, 6, 50)),
    ]
}

fn group(name: &str) -> Value {
    json!({"kind": "Group", "group": {"name": name}})
}

fn user(name: &str) -> Value {
    json!({"kind": "User", "user": {"name": name}})
}

fn service_account(namespace: &str, name: &str) -> Value {
    json!({"kind": "ServiceAccount", "serviceAccount": {"namespace": namespace, "name": name}})
}

/// Every resource in every namespace and at cluster scope, and every non-resource URL.
fn everything(subjects: Vec<Value>) -> Value {
    json!({
        "subjects": subjects,
        "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                           "clusterScope": true, "namespaces": ["*"]}],
        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
    })
}

fn schema(level: &str, precedence: i64, distinguisher: Option<&str>, rules: Vec<Value>) -> Value {
    let mut spec = json!({
        "priorityLevelConfiguration": {"name": level},
        "matchingPrecedence": precedence,
        "rules": rules,
    });
    if let Some(d) = distinguisher {
        spec["distinguisherMethod"] = json!({"type": d});
    }
    spec
}

fn leases(verbs: &[&str]) -> Value {
    json!({"verbs": verbs, "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
           "namespaces": ["*"]})
}

/// (name, spec) of every FlowSchema, mandatory first.
pub fn flow_schemas() -> Vec<(&'static str, Value)> {
    let all_users = || {
        vec![
            group("system:unauthenticated"),
            group("system:authenticated"),
        ]
    };
    let election = ["get", "create", "update"];
    vec![
        (
            EXEMPT,
            schema(
                EXEMPT,
                1,
                None,
                vec![everything(vec![group("system:masters")])],
            ),
        ),
        (
            CATCH_ALL,
            schema(
                CATCH_ALL,
                10000,
                Some("ByUser"),
                vec![everything(all_users())],
            ),
        ),
        (
            "probes",
            schema(
                EXEMPT,
                2,
                None,
                vec![json!({"subjects": all_users(), "nonResourceRules": [
                    {"verbs": ["get"], "nonResourceURLs": ["/healthz", "/readyz", "/livez"]}]})],
            ),
        ),
        (
            "system-leader-election",
            schema(
                "leader-election",
                100,
                Some("ByUser"),
                vec![json!({
                    "subjects": [user("system:kube-controller-manager"), user("system:kube-scheduler"),
                                 service_account("kube-system", "*")],
                    "resourceRules": [
                        {"verbs": election, "apiGroups": [""], "resources": ["endpoints", "configmaps"],
                         "namespaces": ["kube-system"]},
                        leases(&election)]})],
            ),
        ),
        (
            "endpoint-controller",
            schema(
                "workload-high",
                150,
                Some("ByUser"),
                vec![json!({
                    "subjects": [user("system:kube-controller-manager"),
                                 service_account("kube-system", "endpoint-controller")],
                    "resourceRules": [{"verbs": election, "apiGroups": [""],
                                       "resources": ["endpoints"], "namespaces": ["*"]}]})],
            ),
        ),
        (
            "workload-leader-election",
            schema(
                "leader-election",
                200,
                Some("ByUser"),
                vec![json!({"subjects": [service_account("kube-system", "*")],
                            "resourceRules": [
                                {"verbs": election, "apiGroups": [""],
                                 "resources": ["endpoints", "configmaps"], "namespaces": ["*"]},
                                leases(&election)]})],
            ),
        ),
        (
            "system-node-high",
            schema(
                "node-high",
                400,
                Some("ByUser"),
                vec![
                    json!({"subjects": [group("system:nodes")], "resourceRules": [
                    {"verbs": ["*"], "apiGroups": [""], "resources": ["nodes", "nodes/status"],
                     "clusterScope": true, "namespaces": ["*"]},
                    leases(&["*"])]}),
                ],
            ),
        ),
        (
            "system-nodes",
            schema(
                "system",
                500,
                Some("ByUser"),
                vec![everything(vec![group("system:nodes")])],
            ),
        ),
        (
            "kube-controller-manager",
            schema(
                "workload-high",
                800,
                Some("ByNamespace"),
                vec![everything(vec![user("system:kube-controller-manager")])],
            ),
        ),
        (
            "kube-scheduler",
            schema(
                "workload-high",
                800,
                Some("ByNamespace"),
                vec![everything(vec![user("system:kube-scheduler")])],
            ),
        ),
        (
            "kube-system-service-accounts",
            schema(
                "workload-high",
                900,
                Some("ByNamespace"),
                vec![everything(vec![service_account("kube-system", "*")])],
            ),
        ),
        (
            "service-accounts",
            schema(
                "workload-low",
                9000,
                Some("ByUser"),
                vec![everything(vec![group("system:serviceaccounts")])],
            ),
        ),
        (
            "global-default",
            schema(
                "global-default",
                9900,
                Some("ByUser"),
                vec![everything(all_users())],
            ),
        ),
    ]
}

/// The fixed spec of a mandatory object of the kind, if `name` is one.
pub fn mandatory_spec(kind: &str, name: &str) -> Option<Value> {
    if name != EXEMPT && name != CATCH_ALL {
        return None;
    }
    let list = match kind {
        "FlowSchema" => flow_schemas(),
        "PriorityLevelConfiguration" => priority_levels(),
        _ => return None,
    };
    list.into_iter().find(|(n, _)| *n == name).map(|(_, s)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_names_a_level_that_exists() {
        let levels: Vec<&str> = priority_levels().iter().map(|(n, _)| *n).collect();
        for (name, spec) in flow_schemas() {
            let level = spec["priorityLevelConfiguration"]["name"].as_str().unwrap();
            assert!(levels.contains(&level), "{name} -> {level}");
        }
        assert!(mandatory_spec("FlowSchema", "exempt").is_some());
        assert!(mandatory_spec("FlowSchema", "global-default").is_none());
    }
}
