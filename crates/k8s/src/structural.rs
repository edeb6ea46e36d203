//! Structural OpenAPI v3 schemas of CustomResourceDefinitions, as apiextensions-apiserver
//! uses them: whether a schema is structural (the CRD is refused otherwise), validating a
//! custom object against it, pruning the fields it does not declare and applying its
//! `default`s. Schemas stay `serde_json::Value`s (a `JSONSchemaProps` as the CRD holds it).

use regex::Regex;
use serde_json::{Map, Value, json};

use crate::validation::{FieldError, Path};

/// The fields every object keeps whatever its schema says (the root and embedded resources).
const META_FIELDS: &[&str] = &["apiVersion", "kind", "metadata"];

fn get_bool(s: &Value, k: &str) -> bool {
    s.get(k).and_then(Value::as_bool).unwrap_or(false)
}

fn type_of(s: &Value) -> &str {
    s.get("type").and_then(Value::as_str).unwrap_or("")
}

/// Upstream's structural-schema checks (`ValidateStructural`), under `path` (the field path
/// of `openAPIV3Schema` in the CRD).
pub fn structural_errors(schema: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_node(schema, path, Level::Root, &mut errs);
    if !errs.is_empty() {
        return errs;
    }
    let ty = type_of(schema);
    if ty != "object" {
        errs.push(FieldError::invalid(
            path.child("type").as_str(),
            json!(ty),
            "must be object at the root",
        ));
    }
    errs
}

#[derive(Clone, Copy, PartialEq)]
enum Level {
    Root,
    Property,
    Items,
    Additional,
}

fn check_node(s: &Value, path: &Path, level: Level, errs: &mut Vec<FieldError>) {
    let Some(m) = s.as_object() else {
        errs.push(FieldError::invalid_omitted(
            path.as_str(),
            "must be a schema",
        ));
        return;
    };
    let int_or_string = get_bool(s, "x-kubernetes-int-or-string");
    let preserve = get_bool(s, "x-kubernetes-preserve-unknown-fields");
    let ty = type_of(s);
    if ty.is_empty() && !int_or_string && !(preserve && level != Level::Root) {
        let detail = match level {
            Level::Root => "must not be empty at the root",
            Level::Property => "must not be empty for specified object fields",
            Level::Items => "must not be empty for specified array items",
            Level::Additional => "must not be empty for specified additionalProperties",
        };
        errs.push(FieldError::required(path.child("type").as_str(), detail));
    }
    if !ty.is_empty()
        && !matches!(
            ty,
            "object" | "array" | "string" | "integer" | "number" | "boolean"
        )
    {
        errs.push(FieldError::not_supported(
            path.child("type").as_str(),
            json!(ty),
            &["array", "boolean", "integer", "number", "object", "string"],
        ));
    }
    if int_or_string && !ty.is_empty() {
        errs.push(FieldError::invalid(
            path.child("type").as_str(),
            json!(ty),
            "must be empty if x-kubernetes-int-or-string is true",
        ));
    }
    for forbidden in [
        "$ref",
        "additionalItems",
        "patternProperties",
        "dependencies",
    ] {
        if m.contains_key(forbidden) {
            errs.push(FieldError::forbidden(
                path.child(forbidden).as_str(),
                format!("{forbidden} is not supported"),
            ));
        }
    }
    if m.contains_key("properties") && m.contains_key("additionalProperties") {
        errs.push(FieldError::forbidden(
            path.child("additionalProperties").as_str(),
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    if ty == "array" && !m.contains_key("items") {
        errs.push(FieldError::required(
            path.child("items").as_str(),
            "must be specified",
        ));
    }
    if let Some(props) = m.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            check_node(v, &path.child("properties").key(k), Level::Property, errs);
        }
    }
    if let Some(items) = m.get("items") {
        check_node(items, &path.child("items"), Level::Items, errs);
    }
    if let Some(ap) = m.get("additionalProperties").filter(|v| v.is_object()) {
        check_node(
            ap,
            &path.child("additionalProperties"),
            Level::Additional,
            errs,
        );
    }
    if get_bool(s, "x-kubernetes-embedded-resource") && ty != "object" {
        errs.push(FieldError::invalid(
            path.child("type").as_str(),
            json!(ty),
            "must be object if x-kubernetes-embedded-resource is true",
        ));
    }
}

/// Validates `value` against the schema; `path` names the value (`""` for the object root).
pub fn validate(schema: &Value, value: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_at(schema, value, "", &mut errs);
    errs
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

/// The JSON type name kube-openapi reports for a value.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "" => true,
        "number" => v.is_number(),
        "integer" => {
            v.is_i64()
                || v.is_u64()
                || v.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.is_finite())
        }
        t => json_type(v) == t,
    }
}

/// What kube-openapi names a field in its messages: the path, or `body` at the root.
fn body_name(path: &str) -> &str {
    if path.is_empty() { "body" } else { path }
}

fn validate_at(s: &Value, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let ty = type_of(s);
    let nullable = get_bool(s, "nullable");
    if v.is_null() {
        if !nullable && !ty.is_empty() {
            errs.push(FieldError::invalid(
                path,
                json!("null"),
                format!("{} in body must be of type {ty}: \"null\"", body_name(path)),
            ));
        }
        return;
    }
    if get_bool(s, "x-kubernetes-int-or-string") {
        if !(v.is_string() || type_matches("integer", v)) {
            errs.push(FieldError::invalid(
                path,
                json!(json_type(v)),
                format!(
                    "{} in body must be of type integer,string: \"{}\"",
                    body_name(path),
                    json_type(v)
                ),
            ));
            return;
        }
    } else if !type_matches(ty, v) {
        errs.push(FieldError::invalid(
            path,
            json!(json_type(v)),
            format!(
                "{} in body must be of type {ty}: \"{}\"",
                body_name(path),
                json_type(v)
            ),
        ));
        return;
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        let texts: Vec<String> = allowed
            .iter()
            .map(|a| match a {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        errs.push(FieldError::not_supported(path, v.clone(), &refs));
    }
    let name = body_name(path);
    match v {
        Value::String(text) => {
            let len = text.chars().count();
            if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
                && len as u64 > max
            {
                errs.push(FieldError::too_long(path, max as usize));
            }
            if let Some(min) = s.get("minLength").and_then(Value::as_u64)
                && (len as u64) < min
            {
                errs.push(FieldError::invalid(
                    path,
                    v.clone(),
                    format!("{name} in body should be at least {min} chars long"),
                ));
            }
            if let Some(p) = s.get("pattern").and_then(Value::as_str)
                && Regex::new(p).is_ok_and(|re| !re.is_match(text))
            {
                errs.push(FieldError::invalid(
                    path,
                    v.clone(),
                    format!("{name} in body should match '{p}'"),
                ));
            }
        }
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0);
            let bound = |k: &str| s.get(k).and_then(Value::as_f64);
            let show = |k: &str| s.get(k).map(Value::to_string).unwrap_or_default();
            if let Some(min) = bound("minimum") {
                let excl = get_bool(s, "exclusiveMinimum");
                if (excl && f <= min) || (!excl && f < min) {
                    let rel = if excl {
                        "greater than"
                    } else {
                        "greater than or equal to"
                    };
                    errs.push(FieldError::invalid(
                        path,
                        v.clone(),
                        format!("{name} in body should be {rel} {}", show("minimum")),
                    ));
                }
            }
            if let Some(max) = bound("maximum") {
                let excl = get_bool(s, "exclusiveMaximum");
                if (excl && f >= max) || (!excl && f > max) {
                    let rel = if excl {
                        "less than"
                    } else {
                        "less than or equal to"
                    };
                    errs.push(FieldError::invalid(
                        path,
                        v.clone(),
                        format!("{name} in body should be {rel} {}", show("maximum")),
                    ));
                }
            }
            if let Some(m) = bound("multipleOf")
                && m > 0.0
                && (f / m).fract() != 0.0
            {
                errs.push(FieldError::invalid(
                    path,
                    v.clone(),
                    format!(
                        "{name} in body should be a multiple of {}",
                        show("multipleOf")
                    ),
                ));
            }
        }
        Value::Array(items) => {
            if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
                && items.len() as u64 > max
            {
                errs.push(FieldError::too_many(path, items.len(), max as usize));
            }
            if let Some(min) = s.get("minItems").and_then(Value::as_u64)
                && (items.len() as u64) < min
            {
                errs.push(FieldError::invalid(
                    path,
                    v.clone(),
                    format!("{name} in body should have at least {min} items"),
                ));
            }
            if let Some(is) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate_at(is, item, &format!("{path}[{i}]"), errs);
                }
            }
        }
        Value::Object(m) => {
            if let Some(req) = s.get("required").and_then(Value::as_array) {
                for r in req.iter().filter_map(Value::as_str) {
                    if !m.contains_key(r) {
                        errs.push(FieldError::required(join(path, r), ""));
                    }
                }
            }
            let embedded = get_bool(s, "x-kubernetes-embedded-resource");
            if embedded {
                for k in ["apiVersion", "kind"] {
                    if m.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
                        errs.push(FieldError::required(join(path, k), "must not be empty"));
                    }
                }
            }
            let props = s.get("properties").and_then(Value::as_object);
            let additional = s.get("additionalProperties").filter(|a| a.is_object());
            for (k, child) in m {
                let sub = props.and_then(|p| p.get(k)).or(additional);
                if let Some(sub) = sub {
                    validate_at(sub, child, &join(path, k), errs);
                }
            }
        }
        _ => {}
    }
}

/// Drops every field the schema does not declare (upstream's pruning), returning the paths
/// removed (`.spec.foo`), which strict field validation reports as unknown fields.
pub fn prune(schema: &Value, obj: &mut Value) -> Vec<String> {
    let mut pruned = Vec::new();
    prune_at(schema, obj, "", true, &mut pruned);
    pruned.sort();
    pruned
}

fn prune_at(s: &Value, v: &mut Value, path: &str, is_resource: bool, out: &mut Vec<String>) {
    let preserve = get_bool(s, "x-kubernetes-preserve-unknown-fields");
    let is_resource = is_resource || get_bool(s, "x-kubernetes-embedded-resource");
    match v {
        Value::Object(m) => {
            let props = s.get("properties").and_then(Value::as_object);
            let additional = s.get("additionalProperties");
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let child_path = format!("{path}.{k}");
                if is_resource && META_FIELDS.contains(&k.as_str()) {
                    if let (Some(sub), Some(child)) = (props.and_then(|p| p.get(&k)), m.get_mut(&k))
                        && k != "metadata"
                    {
                        prune_at(sub, child, &child_path, false, out);
                    }
                    continue;
                }
                let sub = props
                    .and_then(|p| p.get(&k))
                    .or(additional.filter(|a| a.is_object()));
                match sub {
                    Some(sub) => {
                        if let Some(child) = m.get_mut(&k) {
                            prune_at(sub, child, &child_path, false, out);
                        }
                    }
                    None if preserve || additional == Some(&Value::Bool(true)) => {}
                    None => {
                        m.remove(&k);
                        out.push(child_path);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune_at(is, item, &format!("{path}[{i}]"), false, out);
                }
            }
        }
        _ => {}
    }
}

/// Fills absent fields from their schema's `default` (upstream's structural defaulting),
/// then descends into what is there, so defaults inside defaults apply too.
pub fn apply_defaults(schema: &Value, v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, sub) in props {
                    if !m.contains_key(k)
                        && let Some(d) = sub.get("default")
                    {
                        m.insert(k.clone(), d.clone());
                    }
                }
                for (k, child) in m.iter_mut() {
                    if let Some(sub) = props.get(k) {
                        apply_defaults(sub, child);
                    }
                }
            } else if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for child in m.values_mut() {
                    apply_defaults(ap, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items") {
                for item in items {
                    apply_defaults(is, item);
                }
            }
        }
        _ => {}
    }
}

/// The `default`s of a schema must themselves validate and survive pruning (upstream refuses
/// such a CRD); returns the errors under `path`.
pub fn default_errors(schema: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    walk_defaults(schema, path, &mut errs);
    errs
}

fn walk_defaults(s: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    if let Some(d) = s.get("default") {
        let mut pruned = d.clone();
        let mut stripped = s.clone();
        if let Some(o) = stripped.as_object_mut() {
            o.remove("default");
        }
        let gone = {
            let mut out = Vec::new();
            prune_at(&stripped, &mut pruned, "", false, &mut out);
            out
        };
        if !gone.is_empty() {
            errs.push(FieldError::invalid(
                path.child("default").as_str(),
                d.clone(),
                format!("must not have unknown fields, got: {}", gone.join(", ")),
            ));
        }
        for e in validate(&stripped, d) {
            let field = if e.field.is_empty() {
                path.child("default").as_str().to_string()
            } else {
                format!("{}.{}", path.child("default").as_str(), e.field)
            };
            errs.push(FieldError { field, ..e });
        }
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            walk_defaults(v, &path.child("properties").key(k), errs);
        }
    }
    if let Some(items) = s.get("items") {
        walk_defaults(items, &path.child("items"), errs);
    }
}

/// The schema at a `.spec.replicas`-style JSON path (for scale subresource and printer
/// columns), if the schema declares it.
pub fn schema_at<'a>(schema: &'a Value, json_path: &str) -> Option<&'a Value> {
    let mut cur = schema;
    for seg in json_path
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
    {
        cur = cur.get("properties")?.get(seg)?;
    }
    Some(cur)
}

/// Reads a simple `.a.b.c` JSON path from an object.
pub fn value_at<'a>(obj: &'a Value, json_path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    for seg in json_path
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
    {
        cur = cur.get(seg)?;
    }
    Some(cur)
}

/// Writes `value` at a simple `.a.b.c` JSON path, creating objects on the way.
pub fn set_value_at(obj: &mut Value, json_path: &str, value: Value) {
    let segs: Vec<&str> = json_path
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .collect();
    let mut cur = obj;
    for (i, seg) in segs.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(m) = cur else { return };
        if i + 1 == segs.len() {
            m.insert((*seg).to_string(), value);
            return;
        }
        cur = m
            .entry((*seg).to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                "name": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 5},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
                "port": {"x-kubernetes-int-or-string": true},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                             "x-kubernetes-preserve-unknown-fields": true},
                "nested": {"type": "object", "default": {}, "properties": {
                    "mode": {"type": "string", "default": "fast"}}},
            }},
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
        }})
    }

    fn texts(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn validation_errors_name_the_field_as_upstream() {
        let cases: &[(Value, &str)] = &[
            (
                json!({"size": "3"}),
                "spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\"",
            ),
            (json!({}), "spec.size: Required value"),
            (
                json!({"size": 0}),
                "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1",
            ),
            (
                json!({"size": 11}),
                "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10",
            ),
            (
                json!({"size": 1, "color": "pink"}),
                "spec.color: Unsupported value: \"pink\": supported values: \"red\", \"blue\"",
            ),
            (
                json!({"size": 1, "name": "AB"}),
                "spec.name: Invalid value: \"AB\": spec.name in body should match '^[a-z]+$'",
            ),
            (
                json!({"size": 1, "name": "a"}),
                "spec.name: Invalid value: \"a\": spec.name in body should be at least 2 chars long",
            ),
            (
                json!({"size": 1, "name": "abcdef"}),
                "spec.name: Too long: may not be more than 5 bytes",
            ),
            (
                json!({"size": 1, "tags": []}),
                "spec.tags: Invalid value: []string(nil): spec.tags in body should have at least 1 items",
            ),
            (
                json!({"size": 1, "tags": ["a", "b", "c"]}),
                "spec.tags: Too many: 3: must have at most 2 items",
            ),
            (
                json!({"size": 1, "tags": [1]}),
                "spec.tags[0]: Invalid value: \"integer\": spec.tags[0] in body must be of type string: \"integer\"",
            ),
            (
                json!({"size": 1, "port": true}),
                "spec.port: Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\"",
            ),
            (
                json!({"size": 1, "labels": {"a": 1}}),
                "spec.labels.a: Invalid value: \"integer\": spec.labels.a in body must be of type string: \"integer\"",
            ),
            (
                json!({"size": 1, "template": {"kind": "Pod"}}),
                "spec.template.apiVersion: Required value: must not be empty",
            ),
        ];
        for (spec, want) in cases {
            let obj = json!({"apiVersion": "x/v1", "kind": "X", "spec": spec});
            assert_eq!(
                texts(&validate(&schema(), &obj)),
                vec![want.to_string()],
                "{spec}"
            );
        }
        let ok = json!({"spec": {"size": 3, "port": "http", "extra": {"anything": [1]},
            "template": {"apiVersion": "v1", "kind": "Pod"}}});
        assert!(validate(&schema(), &ok).is_empty());
        assert!(validate(&schema(), &json!({"spec": {"size": 3, "port": 8080}})).is_empty());
    }

    #[test]
    fn pruning_drops_undeclared_fields_only() {
        let mut obj = json!({"apiVersion": "x/v1", "kind": "X",
            "metadata": {"name": "a", "labels": {"k": "v"}},
            "spec": {"size": 1, "bogus": 1, "extra": {"kept": true},
                     "labels": {"free": "form"}, "template": {"apiVersion": "v1", "kind": "Pod", "spec": {}}},
            "status": {"ready": true, "phase": "x"}, "top": 1});
        let pruned = prune(&schema(), &mut obj);
        assert_eq!(pruned, vec![".spec.bogus", ".status.phase", ".top"]);
        assert_eq!(obj["spec"]["extra"], json!({"kept": true}));
        assert_eq!(obj["spec"]["labels"], json!({"free": "form"}));
        assert_eq!(obj["spec"]["template"]["spec"], json!({}));
        assert_eq!(obj["metadata"]["labels"], json!({"k": "v"}));
    }

    #[test]
    fn defaults_fill_absent_fields_recursively() {
        let cases = [
            (
                json!({"spec": {"size": 1}}),
                json!({"spec": {"size": 1, "color": "red", "nested": {"mode": "fast"}}}),
            ),
            (
                json!({"spec": {"size": 1, "color": "blue", "nested": {"mode": "slow"}}}),
                json!({"spec": {"size": 1, "color": "blue", "nested": {"mode": "slow"}}}),
            ),
            (json!({}), json!({})),
        ];
        for (mut input, want) in cases {
            apply_defaults(&schema(), &mut input);
            assert_eq!(input, want);
        }
    }

    #[test]
    fn non_structural_schemas_are_refused_with_upstream_texts() {
        let p = Path::new("spec.versions[0].schema.openAPIV3Schema");
        let cases: &[(Value, &str)] = &[
            (
                json!({"properties": {"spec": {"type": "object"}}}),
                "spec.versions[0].schema.openAPIV3Schema.type: Required value: must not be empty at the root",
            ),
            (
                json!({"type": "object", "properties": {"spec": {"properties": {}}}}),
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields",
            ),
            (
                json!({"type": "object", "properties": {"l": {"type": "array"}}}),
                "spec.versions[0].schema.openAPIV3Schema.properties[l].items: Required value: must be specified",
            ),
            (
                json!({"type": "string"}),
                "spec.versions[0].schema.openAPIV3Schema.type: Invalid value: \"string\": must be object at the root",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}}),
                "spec.versions[0].schema.openAPIV3Schema.additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive",
            ),
        ];
        for (s, want) in cases {
            assert_eq!(
                texts(&structural_errors(s, &p)),
                vec![want.to_string()],
                "{s}"
            );
        }
        assert!(structural_errors(&schema(), &p).is_empty());
    }

    #[test]
    fn json_paths_read_and_write() {
        let mut o = json!({"spec": {"replicas": 2}});
        assert_eq!(value_at(&o, ".spec.replicas"), Some(&json!(2)));
        set_value_at(&mut o, ".status.replicas", json!(3));
        assert_eq!(o["status"]["replicas"], json!(3));
        assert_eq!(
            schema_at(&schema(), ".spec.size").map(type_of),
            Some("integer")
        );
    }
}
