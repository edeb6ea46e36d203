//! Events from the control plane's own components (the scheduler's FailedScheduling, the
//! node-lifecycle controller's NodeNotReady, the taint manager's TaintManagerEviction),
//! aggregated as upstream's recorder does: a repeat of the same reason and message on
//! the same object bumps `count` and `lastTimestamp` instead of creating a new Event.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::apiserver::rest::now_rfc3339;
use crate::apiserver::state::ApiState;
use crate::controllers::objects;

pub struct Recorder {
    component: String,
    /// (involved uid, reason, message) → the Event's storage key.
    seen: Mutex<HashMap<(String, String, String), String>>,
}

impl Recorder {
    pub fn new(component: &str) -> Recorder {
        Recorder {
            component: component.to_string(),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Records an event about `obj` (a Pod, a Node …). Failures are logged, never returned:
    /// an event must not stop the control loop that emits it.
    pub fn record(&self, st: &ApiState, obj: &Value, kind: &str, reason: &str, message: &str) {
        let meta = |f: &str| {
            obj.pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let (name, uid) = (meta("name"), meta("uid"));
        // Node events live in `default`, as upstream's recorder puts cluster-scoped ones.
        let ns = match meta("namespace") {
            n if n.is_empty() => "default".to_string(),
            n => n,
        };
        let now = now_rfc3339();
        let dedup = (uid.clone(), reason.to_string(), message.to_string());
        let existing = self.seen.lock().ok().and_then(|m| m.get(&dedup).cloned());
        if let Some(key) = existing {
            let bumped = objects::modify(st, &key, &mut |e| {
                let n = e.get("count").and_then(Value::as_i64).unwrap_or(1);
                e["count"] = json!(n + 1);
                e["lastTimestamp"] = json!(now);
                true
            });
            if matches!(bumped, Ok(Some(_))) {
                return;
            }
        }
        let involved = json!({
            "kind": obj.get("kind").cloned().unwrap_or(Value::Null),
            "apiVersion": obj.get("apiVersion").cloned().unwrap_or(Value::Null),
            "name": name,
            "namespace": obj.pointer("/metadata/namespace").cloned().unwrap_or(Value::Null),
            "uid": uid,
            "resourceVersion": obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null),
        });
        let ev = json!({
            "metadata": {"name": format!("{name}.{}", hex_now())},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        });
        match objects::create(st, "", "events", Some(&ns), ev) {
            Ok(s) => {
                if let Ok(mut m) = self.seen.lock() {
                    if m.len() > 10_000 {
                        m.clear();
                    }
                    m.insert(dedup, s.key);
                }
            }
            Err(e) => {
                tracing::warn!(component = %self.component, reason, error = %e, "event not recorded")
            }
        }
    }
}

/// Upstream names events `<object>.<unix nanos in hex>`.
fn hex_now() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{nanos:x}")
}
