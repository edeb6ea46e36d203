//! The part of upstream's API Priority and Fairness configuration controller that shows in
//! `kubectl get flowschemas`: every FlowSchema's `Dangling` condition says whether the
//! PriorityLevelConfiguration it names exists (the MISSINGPL column). Requests are not
//! queued by these objects; nodus limits with its max-in-flight filter.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::apiserver::state::ApiState;
use crate::storage::Mutation;

const PREFIX: &str = "/flowcontrol.apiserver.k8s.io/";
const SCHEMAS: &str = "/flowcontrol.apiserver.k8s.io/flowschemas/";
const LEVELS: &str = "/flowcontrol.apiserver.k8s.io/prioritylevelconfigurations/";

/// The condition upstream writes for a schema naming `level`.
fn dangling(level: &str, exists: bool, previous: Option<&Value>, now: &str) -> Value {
    let (status, reason, message) = if exists {
        (
            "False",
            "Found",
            format!(
                "This FlowSchema references the PriorityLevelConfiguration object named {level:?} and it exists"
            ),
        )
    } else {
        (
            "True",
            "NotFound",
            format!(
                "This FlowSchema references the PriorityLevelConfiguration object named {level:?} but there is no such object"
            ),
        )
    };
    // The transition time moves only with the status.
    let since = previous
        .filter(|p| p["status"] == status)
        .and_then(|p| p.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(now));
    json!({"type": "Dangling", "status": status, "lastTransitionTime": since,
           "reason": reason, "message": message})
}

/// One pass: each FlowSchema's `Dangling` condition brought up to date.
pub(crate) fn sync(st: &ApiState) {
    let (Ok((schemas, _)), Ok((levels, _))) = (st.store.list(SCHEMAS), st.store.list(LEVELS))
    else {
        return;
    };
    let names: HashSet<&str> = levels
        .iter()
        .filter_map(|l| l.object.pointer("/metadata/name").and_then(Value::as_str))
        .collect();
    let now = crate::apiserver::rest::now_rfc3339();
    for fs in &schemas {
        let level = fs
            .object
            .pointer("/spec/priorityLevelConfiguration/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let exists = names.contains(level);
        let conditions = |o: &Value| -> Vec<Value> {
            o.pointer("/status/conditions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let current = conditions(&fs.object);
        let previous = current.iter().find(|c| c["type"] == "Dangling");
        let want = dangling(level, exists, previous, &now);
        if previous == Some(&want) {
            continue;
        }
        let _ = st.store.mutate(&fs.key, &mut |cur| {
            let Some(cur) = cur else {
                return Ok(Mutation::Keep);
            };
            let mut new = (*cur.object).clone();
            let mut conds: Vec<Value> = conditions(&new)
                .into_iter()
                .filter(|c| c["type"] != "Dangling")
                .collect();
            conds.push(want.clone());
            new["status"]["conditions"] = Value::Array(conds);
            Ok(Mutation::Put(new))
        });
    }
}

/// Re-runs [`sync`] whenever a FlowSchema or priority level changes.
pub(crate) async fn run(st: Arc<ApiState>) {
    loop {
        let rev = st.store.revision();
        let st2 = st.clone();
        let _ = tokio::task::spawn_blocking(move || sync(&st2)).await;
        let Ok(mut rx) = st.store.watch(PREFIX, rev) else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        while rx.recv().await.is_some() {
            // Let a burst of writes settle into one pass.
            tokio::time::sleep(Duration::from_millis(50)).await;
            while rx.try_recv().is_ok() {}
            let st2 = st.clone();
            let _ = tokio::task::spawn_blocking(move || sync(&st2)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangling_keeps_its_transition_time_until_the_status_moves() {
        let found = dangling("exempt", true, None, "t1");
        assert_eq!(found["status"], "False");
        assert_eq!(found["reason"], "Found");
        assert_eq!(
            found["message"],
            "This FlowSchema references the PriorityLevelConfiguration object named \"exempt\" and it exists"
        );
        assert_eq!(dangling("exempt", true, Some(&found), "t2"), found);
        let missing = dangling("exempt", false, Some(&found), "t3");
        assert_eq!(
            (
                missing["status"].as_str(),
                missing["lastTransitionTime"].as_str()
            ),
            (Some("True"), Some("t3"))
        );
    }
}
