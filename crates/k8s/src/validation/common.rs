//! Small helpers shared by the per-kind validators: JSON access, name rules, enums, ports.

use serde_json::{Value, json};
use std::collections::BTreeMap;

use super::names::{is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, max_len_error};
use super::{FieldError, Path};
use crate::gvk::Gvk;

pub(super) type Errs = Vec<FieldError>;

pub(super) fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn arr<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

pub(super) fn present(v: &Value, key: &str) -> bool {
    v.get(key).is_some_and(|x| !x.is_null())
}

pub(super) fn strmap(v: &Value, key: &str) -> BTreeMap<String, String> {
    v.get(key)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn each_msg(errs: &mut Errs, path: &Path, value: &str, msgs: Vec<String>) {
    for m in msgs {
        errs.push(FieldError::invalid(path, json!(value), m));
    }
}

/// Name validator of a kind (`ValidateNameFunc`), `prefix` for generateName.
pub(super) type NameFn = fn(&str, bool) -> Vec<String>;

/// Upstream masks a trailing dash of a generateName prefix before validating it.
pub(super) fn mask_trailing_dash(name: &str, prefix: bool) -> String {
    if prefix && name.len() > 1 && name.ends_with('-') {
        format!("{}a", &name[..name.len() - 1])
    } else {
        name.to_string()
    }
}

pub(super) fn name_is_dns_subdomain(name: &str, prefix: bool) -> Vec<String> {
    is_dns1123_subdomain(&mask_trailing_dash(name, prefix))
}

pub(super) fn name_is_dns_label(name: &str, prefix: bool) -> Vec<String> {
    is_dns1123_label(&mask_trailing_dash(name, prefix))
}

pub(super) fn name_is_dns1035_label(name: &str, prefix: bool) -> Vec<String> {
    is_dns1035_label(&mask_trailing_dash(name, prefix))
}

/// Upstream's name rule per kind.
/// Upstream's `path.IsValidPathSegmentName` (RBAC names such as `system:node` are not DNS
/// names; they only have to be usable as one URL path segment).
pub(super) fn name_is_path_segment(name: &str, prefix: bool) -> Vec<String> {
    let mut out = Vec::new();
    if !prefix {
        match name {
            "." => out.push("may not be '.'".to_string()),
            ".." => out.push("may not be '..'".to_string()),
            _ => {}
        }
    }
    for bad in ["/", "%"] {
        if name.contains(bad) {
            out.push(format!("may not contain '{bad}'"));
        }
    }
    out
}

pub(super) fn name_fn(gvk: &Gvk) -> NameFn {
    match (gvk.group.as_str(), gvk.kind.as_str()) {
        ("", "Namespace") => name_is_dns_label,
        ("", "Service") => name_is_dns1035_label,
        ("rbac.authorization.k8s.io", _) => name_is_path_segment,
        // `<version>.<group>`, `v1.` for the core group; the exact form is checked by
        // `apiregistration::validate_api_service`.
        ("apiregistration.k8s.io", _) => name_is_path_segment,
        _ => name_is_dns_subdomain,
    }
}

pub(super) const STANDARD_FINALIZERS: [&str; 3] = ["kubernetes", "orphan", "foregroundDeletion"];

pub(super) fn not_supported(errs: &mut Errs, path: Path, value: &str, supported: &[&str]) {
    errs.push(FieldError::not_supported(path, json!(value), supported));
}

/// `Required` when empty, `Unsupported value` when not one of `supported`.
pub(super) fn enum_field(errs: &mut Errs, path: Path, value: &str, supported: &[&str]) {
    if value.is_empty() {
        errs.push(FieldError::required(path, ""));
    } else if !supported.contains(&value) {
        not_supported(errs, path, value, supported);
    }
}

pub(super) fn dns_label(errs: &mut Errs, path: &Path, value: &str) {
    each_msg(errs, path, value, is_dns1123_label(value));
}

pub(super) fn is_valid_port_num(p: i64) -> Vec<String> {
    if (1..=65535).contains(&p) {
        Vec::new()
    } else {
        vec!["must be between 1 and 65535, inclusive".to_string()]
    }
}

/// Upstream's `IsValidPortName`.
pub(super) fn is_valid_port_name(port: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if port.len() > 15 {
        errs.push(max_len_error(15));
    }
    if port.is_empty()
        || !port
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        errs.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string(),
        );
    }
    if !port.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if port.contains("--") {
        errs.push("must not contain consecutive hyphens".to_string());
    }
    if port.starts_with('-') || port.ends_with('-') {
        errs.push("must not begin or end with a hyphen".to_string());
    }
    errs
}

pub(super) fn port_num_or_name(errs: &mut Errs, path: Path, v: Option<&Value>) {
    match v {
        Some(Value::Number(n)) => {
            let p = n.as_i64().unwrap_or(0);
            for m in is_valid_port_num(p) {
                errs.push(FieldError::invalid(&path, json!(p), m));
            }
        }
        Some(Value::String(name)) => each_msg(errs, &path, name, is_valid_port_name(name)),
        _ => errs.push(FieldError::invalid(
            &path,
            json!(0),
            "must be between 1 and 65535, inclusive",
        )),
    }
}

pub(super) fn nonnegative(errs: &mut Errs, path: Path, v: &Value, key: &str) {
    if let Some(n) = v.get(key).and_then(Value::as_i64)
        && n < 0
    {
        errs.push(FieldError::invalid(
            path,
            json!(n),
            "must be greater than or equal to 0",
        ));
    }
}

pub(super) const PROTOCOLS: [&str; 3] = ["SCTP", "TCP", "UDP"];

/// Upstream's `validateLocalDescendingPath` (subPath).
pub(super) fn local_descending_path(errs: &mut Errs, path: &str, p: &Path) {
    if path.starts_with('/') {
        errs.push(FieldError::invalid(
            p,
            json!(path),
            "must be a relative path",
        ));
    }
    if path.split('/').any(|part| part == "..") {
        errs.push(FieldError::invalid(p, json!(path), "must not contain '..'"));
    }
}

/// A CIDR as upstream's `IsValidCIDR` accepts it (address/prefix within the family's length).
pub(super) fn is_valid_cidr(c: &str) -> bool {
    let Some((ip, bits)) = c.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => bits <= 32,
        Ok(std::net::IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

/// Upstream's `ValidatePositiveIntOrPercent` (and `IsNotMoreThan100Percent` when `max_100`).
pub(super) fn int_or_percent(
    errs: &mut Errs,
    v: Option<&Value>,
    p: Path,
    max_100: bool,
) -> Option<i64> {
    match v {
        Some(Value::Number(n)) => {
            let n = n.as_i64().unwrap_or(0);
            if n < 0 {
                errs.push(FieldError::invalid(
                    &p,
                    json!(n),
                    "must be greater than or equal to 0",
                ));
            }
            Some(n)
        }
        Some(Value::String(sv)) => {
            let pct = sv
                .strip_suffix('%')
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<i64>().ok());
            match pct {
                None => {
                    errs.push(FieldError::invalid(
                        &p,
                        json!({"$stringer": sv}),
                        "must be an integer or percentage (e.g '5%')",
                    ));
                    None
                }
                Some(n) => {
                    if max_100 && n > 100 {
                        errs.push(FieldError::invalid(
                            &p,
                            json!({"$stringer": sv}),
                            "must not be greater than 100%",
                        ));
                    }
                    Some(n)
                }
            }
        }
        _ => None,
    }
}

/// A value as upstream's `Semantic.DeepEqual` sees it: nulls, empty strings and empty lists
/// under a key are the same as the key being absent. Empty objects are kept, since an empty
/// struct pointer (e.g. `securityContext: {}`) differs from a missing one upstream.
pub(super) fn semantic(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| match v {
                    Value::Null => false,
                    Value::String(s) => !s.is_empty(),
                    Value::Array(a) => !a.is_empty(),
                    _ => true,
                })
                .map(|(k, v)| (k.clone(), semantic(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(semantic).collect()),
        other => other.clone(),
    }
}

/// Upstream's `ValidateLabelSelector` as far as parsing a selector checks it (operators,
/// values per operator, label keys and values).
pub(super) fn label_selector(errs: &mut Errs, path: Path, sel: &Value) {
    let parsed: Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector, _> =
        serde_json::from_value(sel.clone());
    let checked = parsed
        .map_err(|e| e.to_string())
        .and_then(|s| crate::selector::from_metav1(&s).map_err(|e| e.to_string()));
    if let Err(e) = checked {
        errs.push(FieldError::invalid(path, sel.clone(), e));
    }
}
