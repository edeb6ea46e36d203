//! A Job's pod from its template (upstream's `podTemplateSpec` handling in `manageJob`):
//! owner reference, the tracking finalizer, and for Indexed Jobs the completion index as
//! annotation, label, `JOB_COMPLETION_INDEX` env and hostname `<job>-<index>`, plus the
//! index's failure counts under `backoffLimitPerIndex`.

use serde_json::{Value, json};

use super::TRACKING_FINALIZER;
use super::backoff_per_index::{FAILURE_COUNT, FailureCounts, IGNORED_FAILURE_COUNT};
use super::indexed::INDEX_KEY;

fn meta_map<'a>(pod: &'a mut Value, key: &str) -> &'a mut serde_json::Map<String, Value> {
    if !pod["metadata"][key].is_object() {
        pod["metadata"][key] = json!({});
    }
    pod["metadata"][key]
        .as_object_mut()
        .expect("just made an object")
}

/// The pod for `index` (none for a NonIndexed Job); `counts` are the index's failures so far
/// when the Job has `backoffLimitPerIndex`.
pub(crate) fn from_template(
    job: &Value,
    index: Option<i64>,
    counts: Option<FailureCounts>,
) -> Value {
    let name = job
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let template = job
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "spec": template.get("spec").cloned().unwrap_or_else(|| json!({})),
    });
    if let Some(m) = pod["metadata"].as_object_mut() {
        m.remove("name");
        m.remove("namespace");
    }
    pod["metadata"]["generateName"] = json!(match index {
        Some(ix) => format!("{name}-{ix}-"),
        None => format!("{name}-"),
    });
    pod["metadata"]["finalizers"] = json!([TRACKING_FINALIZER]);
    pod["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": name,
        "uid": job.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
        "controller": true, "blockOwnerDeletion": true,
    }]);
    if let Some(ix) = index {
        meta_map(&mut pod, "annotations").insert(INDEX_KEY.into(), json!(ix.to_string()));
        meta_map(&mut pod, "labels").insert(INDEX_KEY.into(), json!(ix.to_string()));
        if let Some(c) = counts {
            let annotations = meta_map(&mut pod, "annotations");
            annotations.insert(FAILURE_COUNT.into(), json!(c.counted.to_string()));
            if c.ignored > 0 {
                annotations.insert(IGNORED_FAILURE_COUNT.into(), json!(c.ignored.to_string()));
            }
        }
        if pod.pointer("/spec/hostname").is_none_or(Value::is_null) {
            pod["spec"]["hostname"] = json!(format!("{name}-{ix}"));
        }
        let env = json!({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
            "apiVersion": "v1",
            "fieldPath": format!("metadata.annotations['{INDEX_KEY}']")}}});
        for list in ["initContainers", "containers"] {
            if let Some(cs) = pod["spec"][list].as_array_mut() {
                for c in cs {
                    let has = c["env"]
                        .as_array()
                        .is_some_and(|e| e.iter().any(|v| v["name"] == "JOB_COMPLETION_INDEX"));
                    if has {
                        continue;
                    }
                    if !c["env"].is_array() {
                        c["env"] = json!([]);
                    }
                    if let Some(e) = c["env"].as_array_mut() {
                        e.push(env.clone());
                    }
                }
            }
        }
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexed_pods_carry_their_index() {
        let job = json!({"metadata": {"name": "idx", "uid": "u"}, "spec": {"template": {
            "metadata": {"labels": {"batch.kubernetes.io/job-name": "idx"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
        let pod = from_template(&job, Some(2), None);
        assert_eq!(pod["metadata"]["generateName"], json!("idx-2-"));
        assert_eq!(pod["metadata"]["annotations"][INDEX_KEY], json!("2"));
        assert_eq!(pod["metadata"]["labels"][INDEX_KEY], json!("2"));
        assert_eq!(
            pod["metadata"]["labels"]["batch.kubernetes.io/job-name"],
            json!("idx")
        );
        assert_eq!(pod["spec"]["hostname"], json!("idx-2"));
        assert_eq!(
            pod["spec"]["containers"][0]["env"][0]["name"],
            json!("JOB_COMPLETION_INDEX")
        );
        assert_eq!(pod["metadata"]["finalizers"], json!([TRACKING_FINALIZER]));
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], json!("u"));
        assert!(pod["metadata"]["annotations"].get(FAILURE_COUNT).is_none());
        let plain = from_template(&job, None, None);
        assert_eq!(plain["metadata"]["generateName"], json!("idx-"));
        assert!(plain["spec"]["containers"][0].get("env").is_none());
        // Under backoffLimitPerIndex the counts ride along; an ignored count only when any.
        let cases = [((0, 0), Some("0"), None), ((2, 1), Some("2"), Some("1"))];
        for ((counted, ignored), want_counted, want_ignored) in cases {
            let p = from_template(&job, Some(1), Some(FailureCounts { counted, ignored }));
            let a = &p["metadata"]["annotations"];
            assert_eq!(a[FAILURE_COUNT].as_str(), want_counted);
            assert_eq!(
                a.get(IGNORED_FAILURE_COUNT).and_then(Value::as_str),
                want_ignored
            );
        }
    }
}
