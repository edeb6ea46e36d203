//! Events from the control plane's own components (the scheduler's FailedScheduling, the
//! node-lifecycle controller's NodeNotReady, the taint manager's TaintManagerEviction),
//! correlated as upstream's recorder does (`nodus_k8s::events`): a repeat of the same reason and
//! message on the same object bumps `count` and `lastTimestamp` instead of creating a new
//! Event, many different messages are combined into one event, and an object's bursts are
//! throttled.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use nodus_k8s::events::{Correlator, Verdict};

use serde_json::{Value, json};

use crate::apiserver::rest::now_rfc3339;
use crate::apiserver::state::ApiState;
use crate::controllers::objects;
use crate::storage::{MutateOp, Mutation, StoreError, Stored};

pub struct Recorder {
    component: String,
    /// (involved uid, reason, message) → the Event's storage key; a combined event's
    /// entry has [`COMBINED`] for its message.
    seen: Mutex<HashMap<(String, String, String), String>>,
    correlator: Mutex<Correlator>,
}

/// The `seen` message of an object's combined event, which every later combined event of
/// that type and reason bumps.
const COMBINED: &str = "\u{0}combined";

impl Recorder {
    pub fn new(component: &str) -> Recorder {
        Recorder {
            component: component.to_string(),
            seen: Mutex::new(HashMap::new()),
            correlator: Mutex::new(Correlator::default()),
        }
    }

    /// Records an event about `obj` (a Pod, a Node …). Failures are logged, never returned:
    /// an event must not stop the control loop that emits it.
    pub fn record(&self, st: &ApiState, obj: &Value, kind: &str, reason: &str, message: &str) {
        self.record_many(st, &[(obj, kind, reason, message)]);
    }

    /// Records several events in one store commit (the scheduler's batch of Scheduled
    /// events); repeats bump the existing event as [`Recorder::record`] does.
    pub fn record_many(&self, st: &ApiState, items: &[(&Value, &str, &str, &str)]) {
        let now = now_rfc3339();
        let mut ops: Vec<MutateOp<'_>> = Vec::new();
        let mut dedups = Vec::new();
        let at = Instant::now();
        for (obj, kind, reason, message) in items {
            let meta = |f: &str| obj.pointer(f).and_then(Value::as_str).unwrap_or("");
            let uid = meta("/metadata/uid").to_string();
            let object = [
                meta("/kind"),
                meta("/metadata/namespace"),
                meta("/metadata/name"),
                &uid,
                meta("/apiVersion"),
            ]
            .join("\u{0}");
            let verdict = match self.correlator.lock() {
                Ok(mut c) => c.correlate(&object, kind, reason, message, at),
                Err(_) => continue,
            };
            let Verdict::Record { message, combined } = verdict else {
                tracing::debug!(component = %self.component, reason, object = %meta("/metadata/name"), "event dropped by the spam filter");
                continue;
            };
            let seen_as = if combined { COMBINED } else { message.as_str() };
            let dedup = (uid, reason.to_string(), seen_as.to_string());
            let existing = self.seen.lock().ok().and_then(|m| m.get(&dedup).cloned());
            let now = now.clone();
            match existing {
                Some(key) => ops.push((
                    key,
                    Box::new(move |cur: Option<&Stored>| {
                        let Some(cur) = cur else {
                            return Err(StoreError::NotFound("event".into()));
                        };
                        let mut e = (*cur.object).clone();
                        let n = e.get("count").and_then(Value::as_i64).unwrap_or(1);
                        e["count"] = json!(n + 1);
                        e["lastTimestamp"] = json!(now);
                        // A combined event shows the latest of the messages it counts.
                        e["message"] = json!(message);
                        Ok(Mutation::Put(e))
                    }),
                )),
                None => match self.build(obj, kind, reason, &message, &now) {
                    Ok((key, ev)) => {
                        let mut ev = Some(ev);
                        ops.push((
                            key,
                            Box::new(move |cur: Option<&Stored>| match (cur, ev.take()) {
                                (None, Some(ev)) => Ok(Mutation::Put(ev)),
                                _ => Err(StoreError::AlreadyExists("event".into())),
                            }),
                        ))
                    }
                    Err(e) => {
                        tracing::warn!(component = %self.component, reason, error = %e, "event not recorded");
                        continue;
                    }
                },
            }
            dedups.push(dedup);
        }
        let keys: Vec<String> = ops.iter().map(|(k, _)| k.clone()).collect();
        match st.store.mutate_many(&mut ops) {
            Ok(results) => {
                let Ok(mut seen) = self.seen.lock() else {
                    return;
                };
                if seen.len() > 10_000 {
                    seen.clear();
                }
                for ((dedup, key), r) in dedups.into_iter().zip(keys).zip(results) {
                    match r {
                        Ok(_) => {
                            seen.insert(dedup, key);
                        }
                        // The event it would bump is gone (expired): forget it, the next
                        // repeat creates a fresh one.
                        Err(e) => {
                            if !matches!(e, StoreError::NotFound(_)) {
                                tracing::warn!(component = %self.component, reason = %dedup.1, error = %e, "event not recorded");
                            }
                            seen.remove(&dedup);
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(component = %self.component, error = %e, "events not recorded")
            }
        }
    }

    /// The Event object for `obj` and its storage key.
    fn build(
        &self,
        obj: &Value,
        kind: &str,
        reason: &str,
        message: &str,
        now: &str,
    ) -> Result<(String, Value), StoreError> {
        let meta = |f: &str| {
            obj.pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let name = meta("name");
        // Node events live in `default`, as upstream's recorder puts cluster-scoped ones.
        let ns = match meta("namespace") {
            n if n.is_empty() => "default".to_string(),
            n => n,
        };
        let involved = json!({
            "kind": obj.get("kind").cloned().unwrap_or(Value::Null),
            "apiVersion": obj.get("apiVersion").cloned().unwrap_or(Value::Null),
            "name": name,
            "namespace": obj.pointer("/metadata/namespace").cloned().unwrap_or(Value::Null),
            "uid": meta("uid"),
            "resourceVersion": obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null),
        });
        let event_name = format!("{name}.{}", hex_now());
        let ev = json!({
            "metadata": {"name": event_name},
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
        let (_, ev) = objects::prepare("", "events", Some(&ns), ev)?;
        Ok((objects::key_of("", "events", Some(&ns), &event_name), ev))
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
