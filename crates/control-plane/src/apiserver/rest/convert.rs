//! One storage for Events: `events.k8s.io/v1` Events are stored as core `v1` Events (as
//! upstream stores both in the same etcd keys) and converted on the way in and out, so
//! `kubectl describe` sees what a client wrote through either API.

use serde_json::{Map, Value, json};
use std::borrow::Cow;

use super::path::Target;

/// Field pairs: (core v1 name, events.k8s.io/v1 name).
const RENAMES: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];
const SAME: &[&str] = &[
    "metadata",
    "reason",
    "type",
    "action",
    "eventTime",
    "series",
    "related",
    "reportingInstance",
];

pub fn is_events_v1(t: &Target) -> bool {
    t.info.group == "events.k8s.io" && t.info.plural == "events"
}

fn rename(obj: &Value, to_events: bool, api_version: &str) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!("Event"));
    for k in SAME {
        if let Some(v) = obj.get(*k).filter(|v| !v.is_null()) {
            out.insert((*k).to_string(), v.clone());
        }
    }
    for (core, ev) in RENAMES {
        let (from, to) = if to_events { (core, ev) } else { (ev, core) };
        if let Some(v) = obj.get(*from).filter(|v| !v.is_null()) {
            out.insert((*to).to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// A stored core Event as `events.k8s.io/v1` (anything else is returned unchanged).
pub fn core_to_events(obj: &Value) -> Value {
    if obj.get("apiVersion").and_then(Value::as_str) != Some("v1") {
        return obj.clone();
    }
    rename(obj, true, "events.k8s.io/v1")
}

/// An `events.k8s.io/v1` Event as the core Event it is stored as (anything else is
/// returned as it is).
pub fn events_to_core(obj: Value) -> Value {
    if obj.get("apiVersion").and_then(Value::as_str) != Some("events.k8s.io/v1") {
        return obj;
    }
    let mut core = rename(&obj, false, "v1");
    if core.get("source").is_none()
        && let Some(c) = obj.get("reportingController")
    {
        core["source"] = json!({"component": c});
    }
    core
}

/// How a target shows a stored object: borrowed when it is shown as stored, which is
/// every built-in resource but `events.k8s.io` (each watcher of each event, each response,
/// would otherwise copy the whole object only to serialize it).
pub fn present<'a>(t: &Target, obj: &'a Value) -> Cow<'a, Value> {
    if is_events_v1(t) {
        Cow::Owned(core_to_events(obj))
    } else if t.info.custom {
        // A CRD's versions share one storage (the `None` conversion): only apiVersion moves.
        let mut o = obj.clone();
        o["apiVersion"] = Value::from(t.gvk().api_version());
        Cow::Owned(o)
    } else {
        Cow::Borrowed(obj)
    }
}

/// Whether stored objects are presented differently from how they are stored.
pub fn converts(t: &Target) -> bool {
    is_events_v1(t) || t.info.custom
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_between_the_two_apis() {
        let ev = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "Pulled", "reason": "Pulled",
            "type": "Normal", "reportingController": "kubelet", "reportingInstance": "n1",
            "eventTime": "2026-01-01T00:00:00.000000Z", "action": "Pull"});
        let core = events_to_core(ev.clone());
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "Pulled");
        assert_eq!(core["reportingComponent"], "kubelet");
        assert_eq!(core["source"]["component"], "kubelet");
        let back = core_to_events(&core);
        assert_eq!(back["regarding"], ev["regarding"]);
        assert_eq!(back["note"], "Pulled");
        assert_eq!(back["apiVersion"], "events.k8s.io/v1");
    }
}
