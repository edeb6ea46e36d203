//! ControllerRevision history for workload controllers (upstream's `pkg/controller/history`
//! and the snapshot/cleanup halves of the DaemonSet and StatefulSet controllers): one
//! immutable revision per distinct pod template, named `<owner>-<hash>`, controlled by its
//! owner, numbered in the order the templates became current, truncated to the owner's
//! `revisionHistoryLimit`. Nothing here knows the owner's kind: the owner object supplies
//! its apiVersion, kind, name and uid.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::state::ApiState;
use crate::controllers::objects;
use crate::storage::StoreError;

/// The label carrying the template hash on revisions and on the pods made from them
/// (upstream's `ControllerRevisionHashLabelKey` / `DefaultDaemonSetUniqueLabelKey`).
pub(crate) const HASH_LABEL: &str = "controller-revision-hash";

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// Upstream's `rand.SafeEncodeString`: each byte mapped onto an alphabet without vowels
/// (so no words) or look-alikes.
fn safe_encode(s: &str) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    s.bytes()
        .map(|b| ALPHANUMS[b as usize % ALPHANUMS.len()] as char)
        .collect()
}

/// The hash naming a revision of `template`: FNV-1a (32 bit) over its canonical JSON, then
/// the collision count (little-endian, as upstream's ComputeHash adds it), printed in
/// decimal and safe-encoded. A bumped `collision_count` moves a clashing name aside.
pub(crate) fn hash(template: &Value, collision_count: Option<i64>) -> String {
    const OFFSET: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    let mut h = OFFSET;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u32::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    };
    // serde_json's maps are sorted, so equal templates give equal bytes.
    feed(template.to_string().as_bytes());
    if let Some(c) = collision_count {
        feed(&(c as u32).to_le_bytes());
    }
    safe_encode(&h.to_string())
}

/// `<owner>-<hash>`, the owner's part cut so the name stays a valid 253-character name
/// (upstream's ControllerRevisionName).
pub(crate) fn revision_name(owner: &str, hash: &str) -> String {
    let owner = if owner.len() > 223 {
        &owner[..223]
    } else {
        owner
    };
    format!("{owner}-{hash}")
}

/// The revision data of a pod-template owner (DaemonSet, StatefulSet): a strategic merge
/// patch replacing the template, which is what `kubectl rollout undo` applies.
pub(crate) fn template_patch(owner: &Value) -> Value {
    let mut template = owner
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    template["$patch"] = json!("replace");
    json!({"spec": {"template": template}})
}

/// The pod template a revision made by [`template_patch`] restores.
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

/// Whether `obj` names `owner` as its controller.
pub(crate) fn controlled_by(obj: &Value, owner: &Value) -> bool {
    let uid = s(owner, "/metadata/uid");
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| r["controller"] == true && r["uid"] == uid && !uid.is_empty())
}

/// The controller owner reference to `owner` that its revisions and pods carry.
pub(crate) fn controller_ref(owner: &Value) -> Value {
    json!({
        "apiVersion": s(owner, "/apiVersion"),
        "kind": s(owner, "/kind"),
        "name": s(owner, "/metadata/name"),
        "uid": s(owner, "/metadata/uid"),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

pub(crate) fn revision_of(r: &Value) -> i64 {
    r.get("revision").and_then(Value::as_i64).unwrap_or(0)
}

/// The revisions among `all` that `owner` controls, oldest revision first.
pub(crate) fn owned<'a>(
    all: impl Iterator<Item = &'a Arc<Value>>,
    owner: &Value,
) -> Vec<Arc<Value>> {
    let ns = s(owner, "/metadata/namespace");
    let mut out: Vec<Arc<Value>> = all
        .filter(|r| s(r, "/metadata/namespace") == ns && controlled_by(r, owner))
        .cloned()
        .collect();
    out.sort_by_key(|r| (revision_of(r), s(r, "/metadata/name").to_string()));
    out
}

/// The number the next new revision gets: one past the highest.
pub(crate) fn next_revision(revisions: &[Arc<Value>]) -> i64 {
    revisions.iter().map(|r| revision_of(r)).max().unwrap_or(0) + 1
}

/// Why a revision could not be created.
#[derive(Debug)]
pub(crate) enum CreateError {
    /// A different revision already holds the name: the owner bumps its collisionCount.
    Collision,
    Store(StoreError),
}

/// Creates the revision `<owner>-<hash>` holding `data` as number `revision`, labelled
/// with `labels` plus the hash and annotated like its owner. An existing revision with the
/// same name and data (created by an earlier pass whose watch event is still on its way)
/// is returned as is.
pub(crate) fn create(
    st: &ApiState,
    owner: &Value,
    hash: &str,
    labels: &Value,
    data: Value,
    revision: i64,
) -> Result<Arc<Value>, CreateError> {
    let ns = s(owner, "/metadata/namespace");
    let name = revision_name(s(owner, "/metadata/name"), hash);
    let mut labels = labels.as_object().cloned().unwrap_or_default();
    labels.insert(HASH_LABEL.into(), json!(hash));
    let mut meta = json!({
        "name": name,
        "labels": labels,
        "ownerReferences": [controller_ref(owner)],
    });
    if let Some(a) = owner
        .pointer("/metadata/annotations")
        .filter(|a| a.is_object())
    {
        meta["annotations"] = a.clone();
    }
    let obj = json!({"metadata": meta, "data": data, "revision": revision});
    match objects::create(st, "apps", "controllerrevisions", Some(ns), obj) {
        Ok(stored) => Ok(stored.object),
        Err(StoreError::AlreadyExists(_)) => {
            let key = objects::key_of("apps", "controllerrevisions", Some(ns), &name);
            match st.store.get(&key).map_err(CreateError::Store)? {
                Some(cur)
                    if cur.object.get("data") == Some(&data)
                        && controlled_by(&cur.object, owner) =>
                {
                    Ok(cur.object)
                }
                _ => Err(CreateError::Collision),
            }
        }
        Err(e) => Err(CreateError::Store(e)),
    }
}

/// Moves `rev` to number `revision` (a rollback makes an old template current again).
pub(crate) fn bump(st: &ApiState, rev: &Value, revision: i64) -> Result<(), StoreError> {
    let key = objects::key_of(
        "apps",
        "controllerrevisions",
        Some(s(rev, "/metadata/namespace")),
        s(rev, "/metadata/name"),
    );
    objects::modify(st, &key, &mut |r| {
        r["revision"] = json!(revision);
        true
    })?;
    Ok(())
}

/// Which of the non-current revisions `old` (oldest first) to delete so that at most
/// `limit` remain, never one whose hash a live pod still carries.
pub(crate) fn to_truncate<'a>(
    old: &'a [Arc<Value>],
    live_hashes: &HashSet<String>,
    limit: i64,
) -> Vec<&'a Arc<Value>> {
    let mut excess = old.len() as i64 - limit.max(0);
    let mut out = Vec::new();
    for r in old {
        if excess <= 0 {
            break;
        }
        let h = r
            .pointer("/metadata/labels")
            .and_then(|l| l.get(HASH_LABEL))
            .and_then(Value::as_str)
            .unwrap_or("");
        if live_hashes.contains(h) {
            continue;
        }
        out.push(r);
        excess -= 1;
    }
    out
}

/// Deletes `revisions`; failures are logged and retried on a later pass.
pub(crate) fn delete(st: &ApiState, revisions: &[&Arc<Value>]) {
    let Some(mut t) = objects::target("apps", "controllerrevisions", None) else {
        return;
    };
    for r in revisions {
        t.namespace = Some(s(r, "/metadata/namespace").to_string());
        if let Err(e) = delete_object(st, &t, s(r, "/metadata/name"), &DeleteOptions::default()) {
            tracing::warn!(revision = %s(r, "/metadata/name"), error = %e.0["message"], "history: delete failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(name: &str, n: i64, hash: &str) -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": name, "namespace": "d",
            "labels": {HASH_LABEL: hash}}, "revision": n}))
    }

    #[test]
    fn hash_is_stable_safe_and_moved_by_collisions() {
        let t = json!({"spec": {"containers": [{"name": "c", "image": "a"}]}});
        let h = hash(&t, None);
        assert_eq!(h, hash(&t.clone(), None));
        assert!(!h.is_empty() && h.len() <= 10);
        assert!(
            h.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)),
            "{h}"
        );
        assert_ne!(h, hash(&t, Some(1)));
        assert_ne!(h, hash(&json!({"spec": {}}), None));
    }

    #[test]
    fn names_and_patches() {
        assert_eq!(revision_name("web", "abc"), "web-abc");
        assert_eq!(revision_name(&"x".repeat(300), "h").len(), 225);
        let ds = json!({"spec": {"template": {"spec": {"containers": []}}}});
        assert_eq!(
            template_patch(&ds),
            json!({"spec": {"template": {"spec": {"containers": []}, "$patch": "replace"}}})
        );
    }

    #[test]
    fn truncation_keeps_the_limit_and_live_revisions() {
        let old = vec![rev("a", 1, "ha"), rev("b", 2, "hb"), rev("c", 3, "hc")];
        let names = |v: Vec<&Arc<Value>>| {
            v.iter()
                .map(|r| s(r, "/metadata/name").to_string())
                .collect::<Vec<_>>()
        };
        let none = HashSet::new();
        let cases: &[(i64, &[&str], &[&str])] = &[
            (10, &[], &[]),
            (3, &[], &[]),
            (2, &[], &["a"]),
            (1, &[], &["a", "b"]),
            (0, &[], &["a", "b", "c"]),
            (1, &["ha"], &["b", "c"]),
            (0, &["hb"], &["a", "c"]),
        ];
        for (limit, live, want) in cases {
            let live: HashSet<String> = live.iter().map(|h| h.to_string()).collect();
            let live = if live.is_empty() { none.clone() } else { live };
            assert_eq!(
                names(to_truncate(&old, &live, *limit)),
                *want,
                "limit {limit}"
            );
        }
        assert_eq!(next_revision(&old), 4);
        assert_eq!(next_revision(&[]), 1);
    }
}
