//! Built-in control loops that run inside the API server process: the ServiceAccount
//! controller (a `default` ServiceAccount per namespace), namespace deletion, garbage
//! collection by ownerReferences (background, foreground, orphan) and event-log compaction.
//!
//! Changes reach a dependency graph ([`graph`]) and only the objects they concern are
//! examined; a level-triggered sweep over the whole store repairs anything missed every
//! [`FULL_SWEEP`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nodus_k8s::catalog::{self, ResourceInfo};
use serde_json::{Value, json};

use crate::apiserver::bootstrap::ensure_object;
use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::rest::path::{Target, group_key};
use crate::apiserver::state::ApiState;
use crate::storage::{Mutation, Stored};

mod graph;

/// How long Events are kept.
const EVENT_TTL_SECS: i64 = 3600;

/// The catalogue entry and namespace a storage key belongs to.
fn target_of(key: &str) -> Option<(Target, String)> {
    let parts: Vec<&str> = key.trim_start_matches('/').split('/').collect();
    let (g, plural, ns, name) = match parts.as_slice() {
        [g, p, ns, name] => (*g, *p, Some(ns.to_string()), name.to_string()),
        [g, p, name] => (*g, *p, None, name.to_string()),
        _ => return None,
    };
    let info: &'static ResourceInfo = catalog::served()
        .into_iter()
        .find(|i| group_key(i.group) == g && i.plural == plural)?;
    Some((
        Target {
            info,
            namespace: ns,
            name: Some(name.clone()),
            sub: None,
            watch_path: false,
            rest: Vec::new(),
        },
        name,
    ))
}

fn finalizers(o: &Value) -> Vec<String> {
    o.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn deleting(o: &Value) -> bool {
    o.pointer("/metadata/deletionTimestamp").is_some()
}

fn uid(o: &Value) -> &str {
    o.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn owner_uids(o: &Value) -> Vec<String> {
    o.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes a finalizer; deletes the object if it was the last thing holding it.
pub(crate) fn drop_finalizer(st: &ApiState, key: &str, f: &str) {
    let _ = st.store.mutate(key, &mut |cur| {
        let Some(cur) = cur else {
            return Ok(Mutation::Keep);
        };
        let mut new = (*cur.object).clone();
        let Some(list) = new
            .pointer_mut("/metadata/finalizers")
            .and_then(Value::as_array_mut)
        else {
            return Ok(Mutation::Keep);
        };
        let before = list.len();
        list.retain(|x| x != f);
        if list.len() == before {
            return Ok(Mutation::Keep);
        }
        if crate::apiserver::rest::update::ready_to_delete(&new) {
            return Ok(Mutation::Delete);
        }
        Ok(Mutation::Put(new))
    });
}

/// Drops owner references to `owners` from the object at `key`.
fn remove_owner_refs(st: &ApiState, key: &str, owners: &HashSet<String>) {
    let _ = st.store.mutate(key, &mut |cur| {
        let Some(cur) = cur else {
            return Ok(Mutation::Keep);
        };
        let mut new = (*cur.object).clone();
        let Some(refs) = new
            .pointer_mut("/metadata/ownerReferences")
            .and_then(Value::as_array_mut)
        else {
            return Ok(Mutation::Keep);
        };
        refs.retain(|r| {
            !r.get("uid")
                .and_then(Value::as_str)
                .is_some_and(|u| owners.contains(u))
        });
        if refs.is_empty()
            && let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut)
        {
            m.remove("ownerReferences");
        }
        Ok(Mutation::Put(new))
    });
}

fn delete_key(st: &ApiState, key: &str, propagation: &str) {
    if let Some((t, name)) = target_of(key) {
        let opts = DeleteOptions {
            propagation: Some(propagation.to_string()),
            ..Default::default()
        };
        let _ = delete_object(st, &t, &name, &opts);
    }
}

/// One pass of every built-in controller.
pub fn sweep(st: &ApiState) {
    let Ok((all, _)) = st.store.list("/") else {
        return;
    };
    let by_uid: HashMap<&str, &Stored> = all
        .iter()
        .map(|s| (uid(&s.object), s))
        .filter(|(u, _)| !u.is_empty())
        .collect();

    // ServiceAccount controller and namespace lifecycle.
    for ns in all
        .iter()
        .filter(|s| s.key.starts_with("/core/namespaces/"))
    {
        let Some(name) = ns.object.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        if !deleting(&ns.object) {
            let _ = ensure_object(
                st,
                "",
                "serviceaccounts",
                Some(name),
                json!({"metadata": {"name": "default"}}),
            );
            continue;
        }
        let contents: Vec<(&str, bool)> = all
            .iter()
            .filter(|s| {
                target_of(&s.key).is_some_and(|(t, _)| t.namespace.as_deref() == Some(name))
            })
            .map(|s| (s.key.as_str(), deleting(&s.object)))
            .collect();
        finish_namespace(st, &ns.key, contents);
    }

    // Events expire after an hour, as with kube-apiserver's default --event-ttl.
    let now = crate::apiserver::rest::now_ts();
    for ev in all.iter().filter(|s| s.key.starts_with("/core/events/")) {
        let o = &ev.object;
        // The newest of the server's creation time and the client's observation times, so
        // an event is kept an hour past its last write, as an etcd lease would keep it.
        let when = [
            "/metadata/creationTimestamp",
            "/lastTimestamp",
            "/eventTime",
            "/series/lastObservedTime",
        ]
        .iter()
        .filter_map(|p| {
            o.pointer(p)?
                .as_str()?
                .parse::<k8s_openapi::jiff::Timestamp>()
                .ok()
        })
        .max();
        if when.is_some_and(|t| now.duration_since(t).as_secs() > EVENT_TTL_SECS) {
            let _ = st.store.delete(&ev.key, Some(ev.revision));
        }
    }

    // Garbage collector: dependents whose owners are gone or going.
    let mut has_dependents: HashSet<&str> = HashSet::new();
    for dep in &all {
        let owners = owner_uids(&dep.object);
        if owners.is_empty() {
            continue;
        }
        has_dependents.extend(
            owners
                .iter()
                .filter_map(|o| by_uid.get(o.as_str()).map(|s| uid(&s.object))),
        );
        collect_dependent(st, &dep.key, deleting(&dep.object), &owners, |o| {
            by_uid
                .get(o)
                .map_or(OwnerState::Gone, |s| OwnerState::of(&s.object))
        });
    }
    // Owners waiting on dependents: finished once none refers to them.
    for owner in all.iter().filter(|s| deleting(&s.object)) {
        if !has_dependents.contains(uid(&owner.object)) {
            finish_owner(st, &owner.key, &owner.object);
        }
    }
}

/// Namespace deletion: everything in it is deleted; once nothing is left, the namespace's
/// `kubernetes` finalizer is cleared and it goes.
pub(crate) fn finish_namespace(st: &ApiState, ns_key: &str, contents: Vec<(&str, bool)>) {
    if contents.is_empty() {
        let _ = st.store.mutate(ns_key, &mut |cur| {
            let Some(cur) = cur else {
                return Ok(Mutation::Keep);
            };
            let mut new = (*cur.object).clone();
            new["spec"]["finalizers"] = json!([]);
            if finalizers(&new).is_empty() {
                return Ok(Mutation::Delete);
            }
            Ok(Mutation::Put(new))
        });
    } else {
        for (key, is_deleting) in contents {
            if !is_deleting {
                delete_key(st, key, "Background");
            }
        }
    }
}

/// How a dependent sees one of its owners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnerState {
    Gone,
    Live,
    /// Being deleted with `propagationPolicy: Orphan`.
    Orphaning,
    /// Being deleted with `propagationPolicy: Foreground`.
    Foreground,
}

impl OwnerState {
    fn of(o: &Value) -> OwnerState {
        if !deleting(o) {
            return OwnerState::Live;
        }
        let f = finalizers(o);
        if f.iter().any(|x| x == "orphan") {
            OwnerState::Orphaning
        } else if f.iter().any(|x| x == "foregroundDeletion") {
            OwnerState::Foreground
        } else {
            OwnerState::Live
        }
    }
}

/// The garbage collector's decision for one dependent: orphan it from owners deleted with
/// Orphan, delete it when every owner is gone (or one is deleted in the foreground), drop
/// references to owners that are gone while others remain.
pub(crate) fn collect_dependent(
    st: &ApiState,
    key: &str,
    is_deleting: bool,
    owners: &[String],
    state: impl Fn(&str) -> OwnerState,
) {
    let mut gone = HashSet::new();
    let mut orphaning = HashSet::new();
    let mut foreground = false;
    for o in owners {
        match state(o) {
            OwnerState::Gone => {
                gone.insert(o.clone());
            }
            OwnerState::Orphaning => {
                orphaning.insert(o.clone());
            }
            OwnerState::Foreground => foreground = true,
            OwnerState::Live => {}
        }
    }
    if !orphaning.is_empty() {
        remove_owner_refs(st, key, &orphaning);
    } else if gone.len() == owners.len() {
        if !is_deleting {
            delete_key(st, key, "Background");
        }
    } else if foreground {
        if !is_deleting {
            delete_key(st, key, "Foreground");
        }
    } else if !gone.is_empty() {
        remove_owner_refs(st, key, &gone);
    }
}

/// An owner deleted with Orphan or Foreground propagation that no dependent refers to any
/// more: its finalizer goes, and with it the owner.
pub(crate) fn finish_owner(st: &ApiState, key: &str, o: &Value) {
    let f = finalizers(o);
    for fin in ["orphan", "foregroundDeletion"] {
        if f.iter().any(|x| x == fin) {
            drop_finalizer(st, key, fin);
        }
    }
}

/// How often the whole store is swept anyway, repairing anything a missed change left and
/// expiring Events.
const FULL_SWEEP: Duration = Duration::from_secs(30);

/// Runs the controllers and compaction until the task is aborted: each burst of changes is
/// applied to the graph and only what it concerns is examined; a full sweep runs every
/// [`FULL_SWEEP`] and whenever the watch is lost.
pub async fn run(st: Arc<ApiState>) {
    let mut compactor = Compactor::default();
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut last_full = Instant::now();
    let mut graph: Option<(
        graph::Graph,
        tokio::sync::mpsc::Receiver<Arc<crate::storage::Event>>,
    )> = None;
    loop {
        let mut full = last_full.elapsed() >= FULL_SWEEP;
        match graph.as_mut() {
            None => full = true,
            Some((g, rx)) => {
                tokio::select! {
                    _ = tick.tick() => {}
                    ev = rx.recv() => {
                        // Let a burst of writes settle into one pass.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let mut att = graph::Attention::default();
                        let mut lost = ev.is_none();
                        if let Some(ev) = ev {
                            g.apply(&ev, &mut att);
                        }
                        loop {
                            match rx.try_recv() {
                                Ok(ev) => g.apply(&ev, &mut att),
                                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                                    lost = true;
                                    break;
                                }
                            }
                        }
                        if lost {
                            full = true;
                        } else if !att.is_empty() {
                            let st2 = st.clone();
                            let g2 = std::mem::take(g);
                            let g2 = tokio::task::spawn_blocking(move || {
                                g2.attend(&st2, att);
                                g2
                            })
                            .await;
                            match g2 {
                                Ok(g2) => *g = g2,
                                Err(_) => full = true,
                            }
                        }
                    }
                }
            }
        }
        if full {
            let st2 = st.clone();
            graph = tokio::task::spawn_blocking(move || {
                // The graph from a listing and a watch from the same revision, then the
                // sweep: what changes while it runs arrives on the watch. (Swept first, an
                // object made between the sweep's reads and the listing sat in the graph
                // unattended until the next full sweep, 30 s later.)
                let (all, rev) = st2.store.list("/").ok()?;
                let rx = st2.store.watch("/", rev).ok()?;
                sweep(&st2);
                Some((graph::Graph::from_list(&all), rx))
            })
            .await
            .ok()
            .flatten();
            last_full = Instant::now();
        }
        if st.store.remote().is_none() {
            compactor.tick(&st);
        }
    }
}

/// Compaction of the store's history to what a watch may still need, by the process that
/// holds the store: the revision seen `event_retention` ago is the oldest kept.
#[derive(Default)]
pub struct Compactor {
    history: VecDeque<(Instant, u64)>,
}

impl Compactor {
    pub fn tick(&mut self, st: &ApiState) {
        let now = Instant::now();
        self.history.push_back((now, st.store.revision()));
        let retention = st.config.event_retention;
        let mut compact_to = None;
        while self
            .history
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > retention)
        {
            compact_to = self.history.pop_front().map(|(_, r)| r);
        }
        if let Some(r) = compact_to {
            let _ = st.store.compact(r);
        }
    }
}

/// Compaction alone, for an API server whose controllers run in another process (which
/// reaches the store through it and cannot compact it).
pub async fn compact(st: Arc<ApiState>) {
    let mut compactor = Compactor::default();
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        let st2 = st.clone();
        compactor = tokio::task::spawn_blocking(move || {
            compactor.tick(&st2);
            compactor
        })
        .await
        .unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::state::ApiConfig;
    use crate::storage::{EmbeddedStore, Store};

    #[test]
    fn events_older_than_an_hour_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open(&dir.path().join("s.redb")).unwrap());
        let st = ApiState {
            store: store.clone(),
            config: ApiConfig::default(),
            tokens: Default::default(),
            authz: crate::apiserver::authz::Chain::new(
                &ApiConfig::default().authorization_modes,
                store.clone(),
            ),
            ca_pem: String::new(),
            kubelet_tls: None,
            sa_keys: Arc::new(crate::apiserver::authn::serviceaccount::Keys::generate()),
            alloc_lock: tokio::sync::Mutex::new(()),
            metrics: Default::default(),
            resource_metrics: Default::default(),
            listers: crate::apiserver::listers::Listers::new(store.clone()),
            aggregator: Default::default(),
        };
        let fresh = crate::apiserver::rest::now_rfc3339();
        store
            .create(
                "/core/events/default/old",
                json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "old", "namespace": "default",
                    "creationTimestamp": "2020-01-01T00:00:00Z"}, "lastTimestamp": "2020-01-01T00:00:00Z"}),
            )
            .unwrap();
        store
            .create(
                "/core/events/default/new",
                json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "new", "namespace": "default",
                    "creationTimestamp": fresh}, "lastTimestamp": "2020-01-01T00:00:00Z"}),
            )
            .unwrap();
        sweep(&st);
        assert!(store.get("/core/events/default/old").unwrap().is_none());
        assert!(store.get("/core/events/default/new").unwrap().is_some());
    }
}
