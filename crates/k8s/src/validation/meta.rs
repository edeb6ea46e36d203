//! `metadata` validation: names per kind, labels, annotations, owner references, finalizers.

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

use super::common::{Errs, arr, each_msg, name_fn, name_is_dns_label, s, strmap};
use super::names::{is_qualified_name, is_valid_label_value};
use super::{FieldError, Path};
use crate::gvk::Gvk;

pub(super) const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

pub(super) fn validate_labels(errs: &mut Errs, labels: &BTreeMap<String, String>, path: &Path) {
    for (k, v) in labels {
        each_msg(errs, path, k, is_qualified_name(k));
        each_msg(errs, path, v, is_valid_label_value(v));
    }
}

pub(super) fn validate_meta(errs: &mut Errs, gvk: &Gvk, obj: &Value, namespaced: bool) {
    let meta = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let p = Path::new("metadata");
    let name_rule = name_fn(gvk);
    let generate = s(&meta, "generateName");
    if !generate.is_empty() {
        each_msg(
            errs,
            &p.child("generateName"),
            generate,
            name_rule(generate, true),
        );
    }
    let name = s(&meta, "name");
    if name.is_empty() {
        errs.push(FieldError::required(
            p.child("name"),
            "name or generateName is required",
        ));
    } else {
        each_msg(errs, &p.child("name"), name, name_rule(name, false));
    }
    let ns = s(&meta, "namespace");
    if namespaced {
        if ns.is_empty() {
            errs.push(FieldError::required(p.child("namespace"), ""));
        } else {
            each_msg(
                errs,
                &p.child("namespace"),
                ns,
                name_is_dns_label(ns, false),
            );
        }
    } else if !ns.is_empty() {
        errs.push(FieldError::forbidden(
            p.child("namespace"),
            "not allowed on this type",
        ));
    }
    if let Some(g) = meta.get("generation").and_then(Value::as_i64)
        && g < 0
    {
        errs.push(FieldError::invalid(
            p.child("generation"),
            json!(g),
            "must be greater than or equal to 0",
        ));
    }
    validate_labels(errs, &strmap(&meta, "labels"), &p.child("labels"));
    let annotations = strmap(&meta, "annotations");
    let ap = p.child("annotations");
    let mut total = 0;
    for (k, v) in &annotations {
        each_msg(errs, &ap, k, is_qualified_name(&k.to_lowercase()));
        total += k.len() + v.len();
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::too_long(&ap, TOTAL_ANNOTATION_SIZE_LIMIT));
    }
    let op = p.child("ownerReferences");
    let mut controllers = Vec::new();
    for r in arr(&meta, "ownerReferences") {
        let api_version = s(r, "apiVersion");
        let version = api_version.rsplit('/').next().unwrap_or("");
        if version.is_empty() {
            errs.push(FieldError::invalid(
                op.child("apiVersion"),
                json!(api_version),
                "version must not be empty",
            ));
        }
        if s(r, "kind").is_empty() {
            errs.push(FieldError::invalid(
                op.child("kind"),
                json!(""),
                "kind must not be empty",
            ));
        }
        if s(r, "name").is_empty() {
            errs.push(FieldError::invalid(
                op.child("name"),
                json!(""),
                "name must not be empty",
            ));
        }
        if s(r, "uid").is_empty() {
            errs.push(FieldError::invalid(
                op.child("uid"),
                json!(""),
                "uid must not be empty",
            ));
        }
        if r.get("controller").and_then(Value::as_bool) == Some(true) {
            controllers.push(format!("{}/{}", s(r, "kind"), s(r, "name")));
        }
    }
    if controllers.len() > 1 {
        errs.push(FieldError::invalid(
            &op,
            Value::Null,
            format!("Only one reference can have Controller set to true. Found \"true\" in references for {}", controllers.join(" and ")),
        ));
    }
    let fp = p.child("finalizers");
    let mut seen = BTreeSet::new();
    for f in arr(&meta, "finalizers").iter().filter_map(Value::as_str) {
        each_msg(errs, &fp, f, is_qualified_name(f));
        if !seen.insert(f) {
            errs.push(FieldError::duplicate(&fp, json!(f)));
        }
    }
}

pub(super) fn validate_meta_update(errs: &mut Errs, new: &Value, old: &Value) {
    let p = Path::new("metadata");
    for key in ["name", "namespace", "uid"] {
        let (n, o) = (
            new.pointer(&format!("/metadata/{key}")),
            old.pointer(&format!("/metadata/{key}")),
        );
        let ns = n.and_then(Value::as_str).unwrap_or("");
        let os = o.and_then(Value::as_str).unwrap_or("");
        if ns != os {
            errs.push(FieldError::invalid(
                p.child(key),
                json!(ns),
                "field is immutable",
            ));
        }
    }
    let (n, o) = (
        new.pointer("/metadata/creationTimestamp"),
        old.pointer("/metadata/creationTimestamp"),
    );
    if n.and_then(Value::as_str).unwrap_or("") != o.and_then(Value::as_str).unwrap_or("") {
        errs.push(FieldError::invalid(
            p.child("creationTimestamp"),
            n.cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

pub(super) fn is_namespaced(gvk: &Gvk) -> bool {
    crate::catalog::by_kind(&gvk.group, &gvk.kind).is_none_or(|r| r.namespaced)
}
