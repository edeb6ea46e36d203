//! The Swagger 2.0 document (`/openapi/v2`), converted from the v3 operations and schemas:
//! parameters carry their type inline, request bodies become `in: body` parameters, and
//! references point into `#/definitions/`.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::schemas::{INT_OR_STRING, QUANTITY, REF_PREFIX};

const V2_REF_PREFIX: &str = "#/definitions/";

const PRODUCES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];

/// Rewrites every `$ref` from the v3 components location to the v2 definitions location,
/// and turns v3's `allOf: [{$ref}]` wrapper back into Swagger 2.0's `$ref` with sibling
/// keys, the only form kubectl's v2 model parser follows.
fn rewrite_refs(value: &mut Value) {
    match value {
        Value::Object(m) => {
            let single_ref = match m.get("allOf") {
                Some(Value::Array(all)) if all.len() == 1 => all[0]
                    .as_object()
                    .filter(|o| o.len() == 1)
                    .and_then(|o| o.get("$ref"))
                    .cloned(),
                _ => None,
            };
            if let Some(r) = single_ref {
                m.remove("allOf");
                m.insert("$ref".into(), r);
            }
            if let Some(Value::String(r)) = m.get_mut("$ref")
                && let Some(name) = r.strip_prefix(REF_PREFIX)
            {
                *r = format!("{V2_REF_PREFIX}{name}");
            }
            m.values_mut().for_each(rewrite_refs);
        }
        Value::Array(a) => a.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

/// A v3 parameter (`schema: {type, ...}`) as a v2 one (`type` beside `name`).
fn parameter(p: &Value) -> Value {
    let mut out = Map::new();
    if let Value::Object(m) = p {
        for (k, v) in m {
            if k == "schema" {
                if let Value::Object(s) = v {
                    out.extend(s.clone());
                }
            } else {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

fn first_schema(content: &Value) -> Option<Value> {
    content
        .as_object()?
        .values()
        .next()
        .and_then(|m| m.get("schema"))
        .cloned()
}

fn operation(op: &Value) -> Value {
    let mut out = Map::new();
    let Value::Object(m) = op else {
        return op.clone();
    };
    let mut params: Vec<Value> = Vec::new();
    for (k, v) in m {
        match k.as_str() {
            "parameters" => {
                params.extend(v.as_array().into_iter().flatten().map(parameter));
            }
            "requestBody" => {
                if let Some(schema) = first_schema(&v["content"]) {
                    params.insert(
                        0,
                        json!({"name": "body", "in": "body", "required": true, "schema": schema}),
                    );
                }
                let consumes: Vec<&String> = v["content"]
                    .as_object()
                    .map(|c| c.keys().collect())
                    .unwrap_or_default();
                out.insert("consumes".into(), json!(consumes));
            }
            "responses" => {
                let mut responses = Map::new();
                for (code, r) in v.as_object().into_iter().flatten() {
                    let mut resp = Map::new();
                    resp.insert("description".into(), r["description"].clone());
                    if let Some(schema) = first_schema(&r["content"]) {
                        resp.insert("schema".into(), schema);
                    }
                    responses.insert(code.clone(), Value::Object(resp));
                }
                out.insert("responses".into(), Value::Object(responses));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if !params.is_empty() {
        out.insert("parameters".into(), Value::Array(params));
    }
    out.entry("consumes").or_insert_with(|| json!(["*/*"]));
    out.insert("produces".into(), json!(PRODUCES));
    out.insert("schemes".into(), json!(["https"]));
    Value::Object(out)
}

/// The whole v2 document from every group-version's v3 paths and all component schemas.
pub(crate) fn document(
    paths: &Map<String, Value>,
    schemas: &BTreeMap<String, Value>,
    version: &str,
    security: Value,
) -> Value {
    let mut v2_paths = Map::new();
    for (path, item) in paths {
        let mut v2_item = Map::new();
        for (k, v) in item.as_object().into_iter().flatten() {
            let converted = if k == "parameters" {
                Value::Array(v.as_array().into_iter().flatten().map(parameter).collect())
            } else {
                operation(v)
            };
            v2_item.insert(k.clone(), converted);
        }
        v2_paths.insert(path.clone(), Value::Object(v2_item));
    }
    let mut definitions: Map<String, Value> = schemas
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Swagger 2.0 has no oneOf: upstream writes these scalars as plain strings there.
    if let Some(Value::Object(s)) = definitions.get_mut(INT_OR_STRING) {
        s.remove("oneOf");
        s.insert("type".into(), json!("string"));
    }
    if let Some(Value::Object(s)) = definitions.get_mut(QUANTITY) {
        s.remove("oneOf");
        s.insert("type".into(), json!("string"));
    }
    let mut doc = json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": version},
        "paths": v2_paths,
        "definitions": definitions,
        "securityDefinitions": security,
        "security": [{"BearerToken": []}],
    });
    rewrite_refs(&mut doc);
    doc
}
