//! `flowcontrol.apiserver.k8s.io` validation: FlowSchema and PriorityLevelConfiguration,
//! following upstream's `pkg/apis/flowcontrol/validation` (v1 semantics: a zero
//! `nominalConcurrencyShares` is allowed).

use serde_json::{Value, json};
use std::collections::BTreeSet;

use super::common::{Errs, arr, each_msg, name_is_dns_label, name_is_dns_subdomain, s};
use super::{FieldError, Path};
use crate::flowcontrol::{EXEMPT, mandatory_spec};

const MAX_MATCHING_PRECEDENCE: i64 = 10000;
const MAX_QUEUES: i64 = 10_000_000;
/// Upstream's shuffle-sharding limit (`shufflesharding.MaxHashBits`).
const MAX_HASH_BITS: f64 = 60.0;
const VERBS: [&str; 9] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "proxy",
    "update",
    "watch",
];
const NS_ERR_INTRO: &str = "each member of this list must be '*' or a DNS-1123 label; ";

fn strings(v: &Value, key: &str) -> Vec<String> {
    arr(v, key)
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

fn has_wildcard(list: &[String]) -> bool {
    list.iter().any(|x| x == "*")
}

/// A mandatory object's spec must equal the fixed value (after defaulting).
fn fixed_spec(errs: &mut Errs, kind: &str, obj: &Value) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some(mut fixed) = mandatory_spec(kind, name) else {
        return;
    };
    let mut wrapped = json!({"spec": fixed});
    crate::defaults::default_object(
        &crate::gvk::Gvk::new("flowcontrol.apiserver.k8s.io", "v1", kind),
        &mut wrapped,
    );
    fixed = wrapped["spec"].take();
    let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
    if super::common::semantic(&spec) != super::common::semantic(&fixed) {
        errs.push(FieldError::invalid(
            "spec",
            spec,
            format!("spec of '{name}' must equal the fixed value"),
        ));
    }
}

fn conditions(errs: &mut Errs, obj: &Value) {
    let cp = Path::new("status").child("conditions");
    let mut seen = BTreeSet::new();
    for (i, c) in arr(obj.get("status").unwrap_or(&json!({})), "conditions")
        .iter()
        .enumerate()
    {
        let ty = s(c, "type");
        if !seen.insert(ty.to_string()) {
            errs.push(FieldError::duplicate(cp.index(i).child("type"), json!(ty)));
        }
        if ty.is_empty() {
            errs.push(FieldError::required(
                cp.index(i).child("type"),
                "must not be empty",
            ));
        }
    }
}

pub(super) fn validate_flow_schema(errs: &mut Errs, obj: &Value) {
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let sp = Path::new("spec");
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mp = sp.child("matchingPrecedence");
    let precedence = spec
        .get("matchingPrecedence")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if precedence <= 0 {
        errs.push(FieldError::invalid(
            &mp,
            json!(precedence),
            "must be a positive value",
        ));
    }
    if precedence > MAX_MATCHING_PRECEDENCE {
        errs.push(FieldError::invalid(
            &mp,
            json!(precedence),
            format!("must not be greater than {MAX_MATCHING_PRECEDENCE}"),
        ));
    }
    if precedence == 1 && name != EXEMPT {
        errs.push(FieldError::invalid(
            &mp,
            json!(precedence),
            "only the schema named 'exempt' may have matchingPrecedence 1",
        ));
    }
    if let Some(dm) = spec.get("distinguisherMethod").filter(|v| !v.is_null()) {
        let ty = s(dm, "type");
        if ty != "ByNamespace" && ty != "ByUser" {
            errs.push(FieldError::not_supported(
                sp.child("distinguisherMethod").child("type"),
                dm.clone(),
                &["ByNamespace", "ByUser"],
            ));
        }
    }
    let pl = spec
        .pointer("/priorityLevelConfiguration/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let plp = sp.child("priorityLevelConfiguration").child("name");
    if pl.is_empty() {
        errs.push(FieldError::required(plp, "must reference a priority level"));
    } else {
        each_msg(errs, &plp, pl, name_is_dns_subdomain(pl, false));
    }
    for (i, rule) in arr(spec, "rules").iter().enumerate() {
        validate_rules_with_subjects(errs, rule, &sp.child("rules").index(i));
    }
    fixed_spec(errs, "FlowSchema", obj);
    conditions(errs, obj);
}

fn validate_rules_with_subjects(errs: &mut Errs, rule: &Value, p: &Path) {
    let subjects = arr(rule, "subjects");
    if subjects.is_empty() {
        errs.push(FieldError::required(
            p.child("subjects"),
            "subjects must contain at least one value",
        ));
    }
    for (i, subject) in subjects.iter().enumerate() {
        validate_subject(errs, subject, &p.child("subjects").index(i));
    }
    let resource_rules = arr(rule, "resourceRules");
    let non_resource_rules = arr(rule, "nonResourceRules");
    if resource_rules.is_empty() && non_resource_rules.is_empty() {
        errs.push(FieldError::required(
            p,
            "at least one of resourceRules and nonResourceRules has to be non-empty",
        ));
    }
    for (i, r) in resource_rules.iter().enumerate() {
        validate_resource_rule(errs, r, &p.child("resourceRules").index(i));
    }
    for (i, r) in non_resource_rules.iter().enumerate() {
        validate_non_resource_rule(errs, r, &p.child("nonResourceRules").index(i));
    }
}

fn validate_subject(errs: &mut Errs, subject: &Value, p: &Path) {
    let kind = s(subject, "kind");
    let set = |k: &str| subject.get(k).is_some_and(|v| !v.is_null());
    let forbid = |errs: &mut Errs, field: &str, kind: &str| {
        if set(field) {
            errs.push(FieldError::forbidden(
                p.child(field),
                format!("{field} is forbidden when subject kind is not '{kind}'"),
            ));
        }
    };
    match kind {
        "ServiceAccount" => {
            let sap = p.child("serviceAccount");
            match subject.get("serviceAccount").filter(|v| !v.is_null()) {
                None => errs.push(FieldError::required(
                    &sap,
                    "serviceAccount is required when subject kind is 'ServiceAccount'",
                )),
                Some(sa) => {
                    let name = s(sa, "name");
                    if name.is_empty() {
                        errs.push(FieldError::required(sap.child("name"), ""));
                    } else if name != "*" {
                        each_msg(
                            errs,
                            &sap.child("name"),
                            name,
                            name_is_dns_subdomain(name, false),
                        );
                    }
                    let ns = s(sa, "namespace");
                    if ns.is_empty() {
                        errs.push(FieldError::required(
                            sap.child("namespace"),
                            "must specify namespace for service account",
                        ));
                    } else {
                        each_msg(
                            errs,
                            &sap.child("namespace"),
                            ns,
                            name_is_dns_label(ns, false),
                        );
                    }
                }
            }
            forbid(errs, "user", "User");
            forbid(errs, "group", "Group");
        }
        "User" | "Group" => {
            let field = kind.to_lowercase();
            let fp = p.child(&field);
            match subject.get(&field).filter(|v| !v.is_null()) {
                None => errs.push(FieldError::required(
                    &fp,
                    format!("{field} is required when subject kind is '{kind}'"),
                )),
                Some(v) if s(v, "name").is_empty() => {
                    errs.push(FieldError::required(fp.child("name"), ""))
                }
                Some(_) => {}
            }
            forbid(errs, "serviceAccount", "ServiceAccount");
            if kind == "User" {
                forbid(errs, "group", "Group");
            } else {
                forbid(errs, "user", "User");
            }
        }
        other => errs.push(FieldError::not_supported(
            p.child("kind"),
            json!(other),
            &["Group", "ServiceAccount", "User"],
        )),
    }
}

fn validate_verbs(errs: &mut Errs, rule: &Value, p: &Path) {
    let empty = Some("verbs must contain at least one value");
    if let Some(verbs) = wildcard_list(errs, rule, "verbs", p, empty, "verbs")
        && !verbs.iter().all(|v| VERBS.contains(&v.as_str()))
    {
        errs.push(FieldError::not_supported(
            p.child("verbs"),
            json!(verbs),
            &VERBS,
        ));
    }
}

/// A list that must not be empty (when `empty` gives the message) and may hold `*` only
/// alone. Returns the list when it names items rather than `*`, for per-item checks.
fn wildcard_list(
    errs: &mut Errs,
    rule: &Value,
    key: &str,
    p: &Path,
    empty: Option<&str>,
    other: &str,
) -> Option<Vec<String>> {
    let list = strings(rule, key);
    if list.is_empty() {
        if let Some(msg) = empty {
            errs.push(FieldError::required(p.child(key), msg));
        }
        None
    } else if has_wildcard(&list) {
        if list.len() > 1 {
            errs.push(FieldError::invalid(
                p.child(key),
                json!(list),
                format!("if '*' is present, must not specify other {other}"),
            ));
        }
        None
    } else {
        Some(list)
    }
}

fn validate_resource_rule(errs: &mut Errs, rule: &Value, p: &Path) {
    validate_verbs(errs, rule, p);
    wildcard_list(
        errs,
        rule,
        "apiGroups",
        p,
        Some("resource rules must supply at least one api group"),
        "api groups",
    );
    wildcard_list(
        errs,
        rule,
        "resources",
        p,
        Some("resource rules must supply at least one resource"),
        "resources",
    );
    let cluster_scope = rule
        .get("clusterScope")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let empty = (!cluster_scope)
        .then_some("resource rules that are not cluster scoped must supply at least one namespace");
    let Some(namespaces) = wildcard_list(errs, rule, "namespaces", p, empty, "namespaces") else {
        return;
    };
    let np = p.child("namespaces");
    for (i, ns) in namespaces.iter().enumerate() {
        for m in name_is_dns_label(ns, false) {
            errs.push(FieldError::invalid(
                np.index(i),
                json!(ns),
                format!("{NS_ERR_INTRO}{m}"),
            ));
        }
    }
}

fn validate_non_resource_rule(errs: &mut Errs, rule: &Value, p: &Path) {
    validate_verbs(errs, rule, p);
    let empty = Some("nonResourceURLs must contain at least one value");
    let key = "nonResourceURLs";
    let Some(urls) = wildcard_list(errs, rule, key, p, empty, "non-resource URLs") else {
        return;
    };
    let up = p.child(key);
    for (i, url) in urls.iter().enumerate() {
        if let Some(m) = non_resource_url_error(url) {
            errs.push(FieldError::invalid(up.index(i), json!(url), m));
        }
    }
}

/// Upstream's `ValidateNonResourceURLPath`.
fn non_resource_url_error(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("must not be empty");
    }
    if path == "/" {
        return None;
    }
    if !path.starts_with('/') {
        return Some("must start with slash");
    }
    if path.contains(' ') {
        return Some("must not contain white-space");
    }
    if path.contains("//") {
        return Some("must not contain double slash");
    }
    let stars = path.matches('*').count();
    if stars > 1 || (stars == 1 && !path.ends_with("/*")) {
        return Some("wildcard can only do suffix matching");
    }
    None
}

pub(super) fn validate_priority_level(errs: &mut Errs, obj: &Value) {
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let sp = Path::new("spec");
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let ty = s(spec, "type");
    if (name == EXEMPT) != (ty == "Exempt") {
        errs.push(FieldError::invalid(
            sp.child("type"),
            json!(ty),
            "type must be 'Exempt' if and only if name is 'exempt'",
        ));
    }
    let set = |k: &str| spec.get(k).is_some_and(|v| !v.is_null());
    match ty {
        "Exempt" => {
            if set("limited") {
                errs.push(FieldError::forbidden(
                    sp.child("limited"),
                    "must be nil if the type is not Limited",
                ));
            }
            if let Some(ex) = spec.get("exempt") {
                shares_and_percent(errs, ex, &sp.child("exempt"));
            }
        }
        "Limited" => {
            if set("exempt") {
                errs.push(FieldError::forbidden(
                    sp.child("exempt"),
                    "must be nil if the type is Limited",
                ));
            }
            match spec.get("limited").filter(|v| !v.is_null()) {
                None => errs.push(FieldError::required(
                    sp.child("limited"),
                    "must not be empty when type is Limited",
                )),
                Some(l) => validate_limited(errs, l, &sp.child("limited")),
            }
        }
        other => errs.push(FieldError::not_supported(
            sp.child("type"),
            json!(other),
            &["Exempt", "Limited"],
        )),
    }
    fixed_spec(errs, "PriorityLevelConfiguration", obj);
    conditions(errs, obj);
}

fn shares_and_percent(errs: &mut Errs, v: &Value, p: &Path) {
    if let Some(n) = v.get("nominalConcurrencyShares").and_then(Value::as_i64)
        && n < 0
    {
        errs.push(FieldError::invalid(
            p.child("nominalConcurrencyShares"),
            json!(n),
            "must be a non-negative integer",
        ));
    }
    if let Some(n) = v.get("lendablePercent").and_then(Value::as_i64)
        && !(0..=100).contains(&n)
    {
        errs.push(FieldError::invalid(
            p.child("lendablePercent"),
            json!(n),
            "must be between 0 and 100, inclusive",
        ));
    }
}

fn validate_limited(errs: &mut Errs, l: &Value, p: &Path) {
    shares_and_percent(errs, l, p);
    if let Some(n) = l.get("borrowingLimitPercent").and_then(Value::as_i64)
        && n < 0
    {
        errs.push(FieldError::invalid(
            p.child("borrowingLimitPercent"),
            json!(n),
            "if specified, must be a non-negative integer",
        ));
    }
    let empty = json!({});
    let lr = l.get("limitResponse").unwrap_or(&empty);
    let lp = p.child("limitResponse");
    let queuing = lr.get("queuing").filter(|v| !v.is_null());
    match s(lr, "type") {
        "Reject" => {
            if queuing.is_some() {
                errs.push(FieldError::forbidden(
                    lp.child("queuing"),
                    "must be nil if limited.limitResponse.type is not Limited",
                ));
            }
        }
        "Queue" => match queuing {
            None => errs.push(FieldError::required(
                lp.child("queuing"),
                "must not be empty if limited.limitResponse.type is Limited",
            )),
            Some(q) => validate_queuing(errs, q, &lp.child("queuing")),
        },
        other => errs.push(FieldError::not_supported(
            lp.child("type"),
            json!(other),
            &["Queue", "Reject"],
        )),
    }
}

fn validate_queuing(errs: &mut Errs, q: &Value, p: &Path) {
    let int = |k: &str| q.get(k).and_then(Value::as_i64).unwrap_or(0);
    let (qll, queues, hand) = (int("queueLengthLimit"), int("queues"), int("handSize"));
    if qll <= 0 {
        errs.push(FieldError::invalid(
            p.child("queueLengthLimit"),
            json!(qll),
            "must be positive",
        ));
    }
    if queues <= 0 {
        errs.push(FieldError::invalid(
            p.child("queues"),
            json!(queues),
            "must be positive",
        ));
    } else if queues > MAX_QUEUES {
        errs.push(FieldError::invalid(
            p.child("queues"),
            json!(queues),
            format!("must not be greater than {MAX_QUEUES}"),
        ));
    }
    if hand <= 0 {
        errs.push(FieldError::invalid(
            p.child("handSize"),
            json!(hand),
            "must be positive",
        ));
    } else if hand > queues {
        errs.push(FieldError::invalid(
            p.child("handSize"),
            json!(hand),
            format!("should not be greater than queues ({queues})"),
        ));
    } else if required_entropy_bits(queues, hand) > MAX_HASH_BITS {
        errs.push(FieldError::invalid(
            p.child("handSize"),
            json!(hand),
            format!(
                "required entropy bits of deckSize {queues} and handSize {hand} should not be greater than {MAX_HASH_BITS}"
            ),
        ));
    }
}

/// Upstream's `shufflesharding.RequiredEntropyBits`: ceil(log2(deck^hand)).
fn required_entropy_bits(deck: i64, hand: i64) -> f64 {
    ((deck as f64).log2() * hand as f64).ceil()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule_errors(rule: Value) -> Vec<String> {
        let obj = json!({"metadata": {"name": "s"}, "spec": {
            "matchingPrecedence": 500,
            "priorityLevelConfiguration": {"name": "workload-low"},
            "rules": [rule]}});
        let mut errs = Vec::new();
        validate_flow_schema(&mut errs, &obj);
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn rule_lists_as_upstream() {
        let group = json!([{"kind": "Group", "group": {"name": "g"}}]);
        let cases: &[(Value, &[&str])] = &[
            (
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"],
                       "namespaces": ["*"]}),
                &[],
            ),
            (
                json!({"verbs": [], "apiGroups": [""], "resources": ["pods"],
                       "clusterScope": true}),
                &["verbs: Required value: verbs must contain at least one value"],
            ),
            (
                json!({"verbs": ["*", "get"], "apiGroups": [""], "resources": ["pods"],
                       "clusterScope": true}),
                &["if '*' is present, must not specify other verbs"],
            ),
            (
                json!({"verbs": ["fly"], "apiGroups": [""], "resources": ["pods"],
                       "clusterScope": true}),
                &["verbs: Unsupported value"],
            ),
            (
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}),
                &["not cluster scoped must supply at least one namespace"],
            ),
            (
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"],
                       "namespaces": ["*", "default"]}),
                &["if '*' is present, must not specify other namespaces"],
            ),
            (
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"],
                       "namespaces": ["Not_A_Label"]}),
                &["namespaces[0]: Invalid value: \"Not_A_Label\""],
            ),
            (
                json!({"verbs": ["get"], "nonResourceURLs": []}),
                &["nonResourceURLs must contain at least one value"],
            ),
            (
                json!({"verbs": ["get"], "nonResourceURLs": ["*", "/healthz"]}),
                &["if '*' is present, must not specify other non-resource URLs"],
            ),
        ];
        for (rule, want) in cases {
            let key = if rule.get("nonResourceURLs").is_some() {
                "nonResourceRules"
            } else {
                "resourceRules"
            };
            let errs = rule_errors(json!({"subjects": group, key: [rule]}));
            assert_eq!(errs.len(), want.len(), "{rule}: {errs:?}");
            for (e, w) in errs.iter().zip(want.iter()) {
                assert!(e.contains(w), "{rule}: {e:?} lacks {w:?}");
            }
        }
    }
}
