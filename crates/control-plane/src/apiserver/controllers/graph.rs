//! The garbage collector's dependency graph (upstream's `GraphBuilder`): owners, dependents
//! and namespaces kept current from the store's watch, so that a write touches only the
//! objects it concerns. Without it every burst of writes re-read and re-examined the whole
//! store, which under a stream of pod creations was a quarter of the API server's CPU.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde_json::{Value, json};

use super::{OwnerState, collect_dependent, deleting, finish_namespace, finish_owner, owner_uids};
use crate::apiserver::bootstrap::ensure_object;
use crate::apiserver::state::ApiState;
use crate::storage::{Event, EventKind, Stored};

const NAMESPACES: &str = "/core/namespaces/";
const SERVICE_ACCOUNTS: &str = "/core/serviceaccounts/";

/// One object as the collector sees it.
#[derive(Debug)]
struct Node {
    key: String,
    owners: Vec<String>,
    deleting: bool,
    state: OwnerState,
    object: std::sync::Arc<Value>,
}

/// What an applied change asks the collector to look at.
#[derive(Debug, Default)]
pub(crate) struct Attention {
    uids: HashSet<String>,
    /// Namespaces whose ServiceAccount `default` may be missing.
    service_accounts: HashSet<String>,
    /// Namespaces being deleted whose contents changed.
    namespaces: HashSet<String>,
}

impl Attention {
    pub(crate) fn is_empty(&self) -> bool {
        self.uids.is_empty() && self.service_accounts.is_empty() && self.namespaces.is_empty()
    }
}

/// The graph: objects by uid, dependents by owner uid (owners not (yet) stored included),
/// and the keys in each namespace.
#[derive(Debug, Default)]
pub(crate) struct Graph {
    nodes: HashMap<String, Node>,
    uid_by_key: HashMap<String, String>,
    dependents: HashMap<String, HashSet<String>>,
    namespaces: HashMap<String, BTreeSet<String>>,
}

/// `<ns>` of a namespaced key `/<group>/<plural>/<ns>/<name>`.
fn namespace_of(key: &str) -> Option<&str> {
    let parts: Vec<&str> = key.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        [_, _, ns, _] => Some(ns),
        _ => None,
    }
}

fn uid_of(o: &Value) -> Option<&str> {
    o.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
}

impl Graph {
    /// The graph of a full listing.
    pub(crate) fn from_list(all: &[Stored]) -> Graph {
        let mut g = Graph::default();
        for s in all {
            g.put(&s.key, &s.object, &mut Attention::default());
        }
        g
    }

    /// Applies one change and notes what it concerns.
    pub(crate) fn apply(&mut self, ev: &Event, att: &mut Attention) {
        match ev.kind {
            EventKind::Deleted => self.remove(&ev.key, att),
            EventKind::Added | EventKind::Modified => self.put(&ev.key, &ev.object, att),
        }
        if let Some(name) = ev.key.strip_prefix(NAMESPACES) {
            if ev.kind != EventKind::Deleted && !deleting(&ev.object) {
                att.service_accounts.insert(name.to_string());
            }
        } else if let Some(rest) = ev.key.strip_prefix(SERVICE_ACCOUNTS)
            && ev.kind == EventKind::Deleted
            && let Some((ns, "default")) = rest.split_once('/')
        {
            att.service_accounts.insert(ns.to_string());
        }
    }

    fn put(&mut self, key: &str, o: &std::sync::Arc<Value>, att: &mut Attention) {
        let Some(uid) = uid_of(o) else {
            return;
        };
        if self.uid_by_key.get(key).is_some_and(|u| u != uid) {
            // Deleted and re-created between two looks: the old object is gone.
            self.remove(key, att);
        }
        let owners = owner_uids(o);
        let state = OwnerState::of(o);
        let node = Node {
            key: key.to_string(),
            owners: owners.clone(),
            deleting: deleting(o),
            state,
            object: o.clone(),
        };
        let old = self.nodes.insert(uid.to_string(), node);
        self.uid_by_key.insert(key.to_string(), uid.to_string());
        if let Some(ns) = namespace_of(key) {
            self.namespaces
                .entry(ns.to_string())
                .or_default()
                .insert(key.to_string());
            if self.namespace_deleting(ns) {
                att.namespaces.insert(ns.to_string());
            }
        }
        let old_owners = old.as_ref().map(|n| n.owners.clone()).unwrap_or_default();
        for o in old_owners.iter().filter(|o| !owners.contains(o)) {
            self.unlink(o, uid, att);
        }
        for o in &owners {
            self.dependents
                .entry(o.clone())
                .or_default()
                .insert(uid.to_string());
        }
        if !owners.is_empty() {
            att.uids.insert(uid.to_string());
        }
        if state != OwnerState::Live || deleting(o) {
            att.uids.insert(uid.to_string());
            if old.as_ref().is_none_or(|n| n.state != state) {
                // Dependents learn how their owner is going.
                att.uids
                    .extend(self.dependents.get(uid).into_iter().flatten().cloned());
            }
        }
        if key.starts_with(NAMESPACES) && deleting(o) {
            att.namespaces
                .insert(key.trim_start_matches(NAMESPACES).to_string());
        }
    }

    fn remove(&mut self, key: &str, att: &mut Attention) {
        let Some(uid) = self.uid_by_key.remove(key) else {
            return;
        };
        let Some(node) = self.nodes.remove(&uid) else {
            return;
        };
        for o in &node.owners {
            self.unlink(o, &uid, att);
        }
        // Its dependents have lost an owner.
        att.uids
            .extend(self.dependents.get(&uid).into_iter().flatten().cloned());
        if let Some(ns) = namespace_of(key) {
            if let Some(keys) = self.namespaces.get_mut(ns) {
                keys.remove(key);
                if keys.is_empty() {
                    self.namespaces.remove(ns);
                }
            }
            if self.namespace_deleting(ns) {
                att.namespaces.insert(ns.to_string());
            }
        }
    }

    /// `dep` no longer refers to `owner`: an owner waiting for its last dependent may finish.
    fn unlink(&mut self, owner: &str, dep: &str, att: &mut Attention) {
        if let Some(d) = self.dependents.get_mut(owner) {
            d.remove(dep);
            if d.is_empty() {
                self.dependents.remove(owner);
                if self.nodes.contains_key(owner) {
                    att.uids.insert(owner.to_string());
                }
            }
        }
    }

    fn namespace_deleting(&self, ns: &str) -> bool {
        self.uid_by_key
            .get(&format!("{NAMESPACES}{ns}"))
            .and_then(|u| self.nodes.get(u))
            .is_some_and(|n| n.deleting)
    }

    fn state(&self, uid: &str) -> OwnerState {
        self.nodes.get(uid).map_or(OwnerState::Gone, |n| n.state)
    }

    /// Acts on what the applied changes concern, as the full sweep would for those objects.
    pub(crate) fn attend(&self, st: &ApiState, att: Attention) {
        for ns in &att.service_accounts {
            let _ = ensure_object(
                st,
                "",
                "serviceaccounts",
                Some(ns),
                json!({"metadata": {"name": "default"}}),
            );
        }
        for ns in &att.namespaces {
            if !self.namespace_deleting(ns) {
                continue;
            }
            let contents: Vec<(&str, bool)> = self
                .namespaces
                .get(ns)
                .into_iter()
                .flatten()
                .map(|k| {
                    let d = self
                        .uid_by_key
                        .get(k)
                        .and_then(|u| self.nodes.get(u))
                        .is_some_and(|n| n.deleting);
                    (k.as_str(), d)
                })
                .collect();
            finish_namespace(st, &format!("{NAMESPACES}{ns}"), contents);
        }
        for uid in &att.uids {
            let Some(node) = self.nodes.get(uid) else {
                continue;
            };
            if !node.owners.is_empty() {
                collect_dependent(st, &node.key, node.deleting, &node.owners, |o| {
                    self.state(o)
                });
            }
            if node.deleting && !self.dependents.contains_key(uid) {
                finish_owner(st, &node.key, &node.object);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn obj(uid: &str, owners: &[&str], fin: &[&str], deleting: bool) -> Arc<Value> {
        let mut o = json!({"metadata": {"uid": uid, "name": uid}});
        if !owners.is_empty() {
            o["metadata"]["ownerReferences"] =
                json!(owners.iter().map(|u| json!({"uid": u})).collect::<Vec<_>>());
        }
        if !fin.is_empty() {
            o["metadata"]["finalizers"] = json!(fin);
        }
        if deleting {
            o["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        Arc::new(o)
    }

    fn ev(kind: EventKind, key: &str, o: Arc<Value>) -> Event {
        Event {
            revision: 1,
            kind,
            key: key.into(),
            object: o,
            prev: None,
        }
    }

    #[test]
    fn a_change_concerns_only_its_object_its_dependents_and_waiting_owners() {
        let rs = "/apps/replicasets/default/rs";
        let pod = |n: &str| format!("/core/pods/default/{n}");
        let mut g = Graph::default();
        let mut att = Attention::default();
        g.apply(
            &ev(EventKind::Added, rs, obj("rs", &[], &[], false)),
            &mut att,
        );
        assert!(
            att.uids.is_empty(),
            "a live owner with no owners needs nothing"
        );
        for n in ["a", "b"] {
            g.apply(
                &ev(EventKind::Added, &pod(n), obj(n, &["rs"], &[], false)),
                &mut att,
            );
        }
        assert_eq!(att.uids, HashSet::from(["a".into(), "b".into()]));

        // The owner deleted in the foreground: both dependents are looked at again.
        let mut att = Attention::default();
        g.apply(
            &ev(
                EventKind::Modified,
                rs,
                obj("rs", &[], &["foregroundDeletion"], true),
            ),
            &mut att,
        );
        assert_eq!(
            att.uids,
            HashSet::from(["rs".into(), "a".into(), "b".into()])
        );
        assert_eq!(g.state("rs"), OwnerState::Foreground);

        // The last dependent gone: the waiting owner is looked at (to drop its finalizer).
        let mut att = Attention::default();
        g.apply(
            &ev(EventKind::Deleted, &pod("a"), obj("a", &["rs"], &[], false)),
            &mut att,
        );
        assert!(!att.uids.contains("rs"), "b still depends on rs");
        g.apply(
            &ev(EventKind::Deleted, &pod("b"), obj("b", &["rs"], &[], false)),
            &mut att,
        );
        assert!(att.uids.contains("rs"));
        assert!(!g.dependents.contains_key("rs"));

        // The owner removed: a dependent created later still names it, and is collected.
        let mut att = Attention::default();
        g.apply(
            &ev(EventKind::Deleted, rs, obj("rs", &[], &[], true)),
            &mut att,
        );
        g.apply(
            &ev(EventKind::Added, &pod("c"), obj("c", &["rs"], &[], false)),
            &mut att,
        );
        assert_eq!(g.state("rs"), OwnerState::Gone);
        assert!(att.uids.contains("c"));
    }

    #[test]
    fn namespaces_and_their_default_service_account() {
        let mut g = Graph::default();
        let mut att = Attention::default();
        g.apply(
            &ev(
                EventKind::Added,
                "/core/namespaces/team",
                obj("ns", &[], &[], false),
            ),
            &mut att,
        );
        g.apply(
            &ev(
                EventKind::Added,
                "/core/configmaps/team/x",
                obj("x", &[], &[], false),
            ),
            &mut att,
        );
        assert_eq!(att.service_accounts, HashSet::from(["team".into()]));
        assert!(att.namespaces.is_empty());

        let mut att = Attention::default();
        g.apply(
            &ev(
                EventKind::Deleted,
                "/core/serviceaccounts/team/default",
                obj("sa", &[], &[], false),
            ),
            &mut att,
        );
        assert_eq!(att.service_accounts, HashSet::from(["team".into()]));

        let mut att = Attention::default();
        g.apply(
            &ev(
                EventKind::Modified,
                "/core/namespaces/team",
                obj("ns", &[], &["kubernetes"], true),
            ),
            &mut att,
        );
        assert_eq!(att.namespaces, HashSet::from(["team".into()]));
        assert!(att.service_accounts.is_empty());
        let mut att = Attention::default();
        g.apply(
            &ev(
                EventKind::Deleted,
                "/core/configmaps/team/x",
                obj("x", &[], &[], false),
            ),
            &mut att,
        );
        assert_eq!(att.namespaces, HashSet::from(["team".into()]));
        assert!(!g.namespaces.contains_key("team"));
    }
}
