//! A StatefulSet's revisions (upstream's ControllerRevision history for StatefulSets): each
//! distinct pod template is stored once as a ControllerRevision named `<set>-<hash>` whose
//! `data` is the patch that restores it (`{"spec":{"template":{…,"$patch":"replace"}}}`)
//! and whose `revision` number orders them. Pods carry the revision's name in the
//! `controller-revision-hash` label, which is how an update tells old pods from new.

use serde_json::{Value, json};

use super::identity::REVISION_LABEL;
use crate::controllers::controller_utils::{owner_ref, s};

/// The patch a revision stores for `set`'s current template.
pub(crate) fn patch_of(set: &Value) -> Value {
    let mut template = set
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    template["$patch"] = json!("replace");
    json!({"spec": {"template": template}})
}

/// The pod template a revision restores.
pub(crate) fn template_of(revision: &Value) -> Value {
    let mut t = revision
        .pointer("/data/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if let Some(m) = t.as_object_mut() {
        m.remove("$patch");
    }
    t
}

/// FNV-1a (32 bit) over the revision's data and the collision count, written with the
/// vowel-free alphabet upstream uses for generated names (so no word is ever spelled).
pub(crate) fn hash(data: &Value, collision_count: i64) -> String {
    let mut h: u32 = 0x811c_9dc5;
    let mut feed = |b: u8| {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    };
    for b in data.to_string().bytes() {
        feed(b);
    }
    if collision_count > 0 {
        for b in (collision_count as u32).to_le_bytes() {
            feed(b);
        }
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    h.to_string()
        .bytes()
        .map(|d| ALPHABET[d as usize % ALPHABET.len()] as char)
        .collect()
}

/// A new ControllerRevision of `set` with `number` as its revision.
pub(crate) fn new_revision(set: &Value, number: i64, collision_count: i64) -> Value {
    let data = patch_of(set);
    let hash = hash(&data, collision_count);
    let mut labels = set
        .pointer("/spec/template/metadata/labels")
        .cloned()
        .unwrap_or_else(|| json!({}));
    labels[REVISION_LABEL] = json!(hash);
    json!({
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": format!("{}-{hash}", s(set, "/metadata/name")),
            "namespace": s(set, "/metadata/namespace"),
            "labels": labels,
            "ownerReferences": [owner_ref("apps/v1", "StatefulSet", set)],
        },
        "data": data,
        "revision": number,
    })
}

/// Whether two revisions restore the same template.
pub(crate) fn same_data(a: &Value, b: &Value) -> bool {
    a.get("data") == b.get("data")
}

pub(crate) fn number(revision: &Value) -> i64 {
    revision
        .get("revision")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(image: &str) -> Value {
        json!({"metadata": {"name": "web", "namespace": "ns", "uid": "u"},
            "spec": {"template": {"metadata": {"labels": {"app": "w"}},
                "spec": {"containers": [{"name": "c", "image": image}]}}}})
    }

    #[test]
    fn a_template_change_is_a_new_revision_and_restores_its_template() {
        let a = new_revision(&set("nginx:1"), 1, 0);
        let a2 = new_revision(&set("nginx:1"), 2, 0);
        let b = new_revision(&set("nginx:2"), 2, 0);
        assert_eq!(a["metadata"]["name"], a2["metadata"]["name"]);
        assert!(same_data(&a, &a2));
        assert_ne!(a["metadata"]["name"], b["metadata"]["name"]);
        assert!(!same_data(&a, &b));
        assert_eq!(template_of(&b)["spec"]["containers"][0]["image"], "nginx:2");
        assert!(template_of(&b).get("$patch").is_none());
        assert_eq!(a["data"]["spec"]["template"]["$patch"], "replace");
        let name = a["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("web-"));
        assert!(
            name[4..]
                .bytes()
                .all(|c| b"bcdfghjklmnpqrstvwxz2456789".contains(&c))
        );
        assert_eq!(
            a["metadata"]["labels"][REVISION_LABEL].as_str(),
            Some(&name[4..])
        );
        // A collision count gives another name for the same data.
        assert_ne!(
            new_revision(&set("nginx:1"), 1, 1)["metadata"]["name"],
            a["metadata"]["name"]
        );
    }
}
