//! Node, Namespace, Event, Lease, PriorityClass, RuntimeClass and Binding validation.

use serde_json::{Value, json};
use std::collections::BTreeSet;

use super::common::{
    Errs, STANDARD_FINALIZERS, arr, each_msg, enum_field, is_valid_cidr, name_is_dns_label,
    nonnegative, not_supported, s,
};
use super::names::{is_qualified_name, is_valid_label_value};
use super::{FieldError, Path};

pub(super) fn validate_node(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let empty_spec = json!({});
    let spec_v = obj.get("spec").unwrap_or(&empty_spec);
    let cp = Path::new("spec").child("podCIDRs");
    let cidrs = arr(spec_v, "podCIDRs");
    for (i, c) in cidrs.iter().enumerate() {
        let c = c.as_str().unwrap_or("");
        if !is_valid_cidr(c) {
            errs.push(FieldError::invalid(
                cp.index(i),
                json!(c),
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            ));
        }
    }
    if cidrs.len() > 2 {
        errs.push(FieldError::invalid(
            &cp,
            json!(cidrs),
            "may specify no more than one CIDR for each IP family",
        ));
    }
    if let Some(old) = old {
        let old_spec = old.get("spec").unwrap_or(&empty_spec);
        let old_cidrs = arr(old_spec, "podCIDRs");
        if !old_cidrs.is_empty() && old_cidrs != cidrs {
            errs.push(FieldError::forbidden(&cp, "may not change once set"));
        }
        let old_provider = s(old_spec, "providerID");
        if !old_provider.is_empty() && old_provider != s(spec_v, "providerID") {
            errs.push(FieldError::forbidden(
                Path::new("spec").child("providerID"),
                "may not change once set",
            ));
        }
    }
    let tp = Path::new("spec").child("taints");
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let mut unique = BTreeSet::new();
    for (i, t) in arr(spec, "taints").iter().enumerate() {
        let ip = tp.index(i);
        let key = s(t, "key");
        each_msg(errs, &ip.child("key"), key, is_qualified_name(key));
        let msgs = is_valid_label_value(s(t, "value"));
        if !msgs.is_empty() {
            errs.push(FieldError::invalid(
                ip.child("value"),
                json!(s(t, "value")),
                msgs.join(";"),
            ));
        }
        let effect = s(t, "effect");
        enum_field(
            errs,
            ip.child("effect"),
            effect,
            &["NoSchedule", "PreferNoSchedule", "NoExecute"],
        );
        if !unique.insert((effect, key)) {
            let mut e = FieldError::duplicate(&ip, t.clone());
            e.detail = "taints must be unique by key and effect pair".to_string();
            errs.push(e);
        }
    }
}

pub(super) fn validate_namespace(errs: &mut Errs, obj: &Value) {
    let fp = Path::new("spec").child("finalizers");
    let empty = json!({});
    for (i, f) in arr(obj.get("spec").unwrap_or(&empty), "finalizers")
        .iter()
        .enumerate()
    {
        let f = f.as_str().unwrap_or("");
        let ip = fp.index(i);
        each_msg(errs, &ip, f, is_qualified_name(f));
        if !f.contains('/') && !STANDARD_FINALIZERS.contains(&f) {
            errs.push(FieldError::invalid(
                ip,
                json!(f),
                "name is neither a standard finalizer name nor is it fully qualified",
            ));
        }
    }
}

/// Upstream's `legacyValidateEvent` for core/v1 Events: old-style events (no `eventTime`)
/// must agree on the namespace; new-style ones need the reporting fields.
pub(super) fn validate_event(errs: &mut Errs, obj: &Value) {
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let ins = obj
        .pointer("/involvedObject/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let new_style = obj.get("eventTime").is_some_and(|t| !t.is_null());
    let mismatch = if new_style {
        ins.is_empty() && ns != "default" && ns != "kube-system"
    } else if ins.is_empty() {
        !ns.is_empty() && ns != "default"
    } else {
        ns != ins
    };
    if mismatch {
        errs.push(FieldError::invalid(
            Path::new("involvedObject").child("namespace"),
            json!(ins),
            "does not match event.namespace",
        ));
    }
    if !new_style {
        return;
    }
    let controller = s(obj, "reportingComponent");
    if controller.is_empty() {
        errs.push(FieldError::required("reportingComponent", ""));
    }
    each_msg(
        errs,
        &Path::new("reportingComponent"),
        controller,
        is_qualified_name(controller),
    );
    let limited = [
        ("reportingInstance", 128, true),
        ("action", 128, true),
        ("reason", 128, true),
        ("message", 1024, false),
    ];
    for (field, limit, required) in limited {
        let v = s(obj, field);
        if required && v.is_empty() {
            errs.push(FieldError::required(field, ""));
        }
        if v.len() > limit {
            errs.push(FieldError::invalid(
                field,
                json!(""),
                format!("can have at most {limit} characters"),
            ));
        }
    }
}

pub(super) fn validate_lease(errs: &mut Errs, obj: &Value) {
    let sp = Path::new("spec");
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    if let Some(d) = spec.get("leaseDurationSeconds").and_then(Value::as_i64)
        && d <= 0
    {
        errs.push(FieldError::invalid(
            sp.child("leaseDurationSeconds"),
            json!(d),
            "must be greater than 0",
        ));
    }
    nonnegative(errs, sp.child("leaseTransitions"), spec, "leaseTransitions");
}

pub(super) const SYSTEM_PRIORITY_CLASSES: [(&str, i64); 2] = [
    ("system-node-critical", 2_000_001_000),
    ("system-cluster-critical", 2_000_000_000),
];

pub(super) fn validate_priority_class(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let value = obj.get("value").and_then(Value::as_i64).unwrap_or(0);
    if name.starts_with("system-") {
        let problem = match SYSTEM_PRIORITY_CLASSES.iter().find(|(n, _)| *n == name) {
            None => Some(format!("{name} is not a known system priority class")),
            Some((_, v)) if *v != value => {
                Some(format!("value of {name} PriorityClass must be {v}"))
            }
            Some(_) if obj.get("globalDefault").and_then(Value::as_bool) == Some(true) => Some(
                format!("globalDefault of {name} PriorityClass must be false"),
            ),
            Some(_) => None,
        };
        if let Some(p) = problem {
            errs.push(FieldError::forbidden(
                Path::new("metadata").child("name"),
                format!("priority class names with 'system-' prefix are reserved for system use only. error: {p}"),
            ));
        }
    } else if value > 1_000_000_000 {
        errs.push(FieldError::forbidden(
            "value",
            "maximum allowed value of a user defined priority is 1000000000",
        ));
    }
    if let Some(pp) = obj.get("preemptionPolicy").and_then(Value::as_str) {
        enum_field(
            errs,
            Path::new("preemptionPolicy"),
            pp,
            &["PreemptLowerPriority", "Never"],
        );
    }
    if let Some(old) = old {
        if old.get("value") != obj.get("value") {
            errs.push(FieldError::forbidden(
                "value",
                "may not be changed in an update.",
            ));
        }
        if old.get("preemptionPolicy") != obj.get("preemptionPolicy") {
            errs.push(FieldError::invalid(
                "preemptionPolicy",
                obj.get("preemptionPolicy").cloned().unwrap_or(Value::Null),
                "field is immutable",
            ));
        }
    }
}

pub(super) fn validate_runtime_class(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let h = s(obj, "handler");
    each_msg(errs, &Path::new("handler"), h, name_is_dns_label(h, false));
    if let Some(old) = old
        && s(old, "handler") != h
    {
        errs.push(FieldError::invalid(
            "handler",
            json!(h),
            "field is immutable",
        ));
    }
}

pub(super) fn validate_binding(errs: &mut Errs, obj: &Value) {
    let empty = json!({});
    let target = obj.get("target").unwrap_or(&empty);
    let tp = Path::new("target");
    if s(target, "name").is_empty() {
        errs.push(FieldError::required(tp.child("name"), ""));
    }
    let kind = s(target, "kind");
    if !kind.is_empty() && kind != "Node" {
        not_supported(errs, tp.child("kind"), kind, &["Node", "<empty>"]);
    }
}
