//! A Job's pod from its template (upstream's `podTemplateSpec` handling in `manageJob`):
//! owner reference, the tracking finalizer, and for Indexed Jobs the completion index as
//! annotation, label, `JOB_COMPLETION_INDEX` env and hostname `<job>-<index>`.

use serde_json::{Value, json};

use super::TRACKING_FINALIZER;
use super::indexed::INDEX_KEY;

fn meta_map<'a>(pod: &'a mut Value, key: &str) -> &'a mut serde_json::Map<String, Value> {
    if !pod["metadata"][key].is_object() {
        pod["metadata"][key] = json!({});
    }
    pod["metadata"][key]
        .as_object_mut()
        .expect("just made an object")
}

pub(crate) fn from_template(job: &Value, index: Option<i64>) -> Value {
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
        let pod = from_template(&job, Some(2));
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
        let plain = from_template(&job, None);
        assert_eq!(plain["metadata"]["generateName"], json!("idx-"));
        assert!(plain["spec"]["containers"][0].get("env").is_none());
    }
}
