//! The object store behind the API server: keys, revisions, optimistic concurrency and watch.
//!
//! Every write bumps one global revision, which is the `resourceVersion` clients see. The
//! embedded backend ([`embedded::EmbeddedStore`], the default) keeps the data in a
//! crash-safe redb file; the etcd backend ([`etcd::EtcdStore`], `--etcd-servers`) keeps it
//! in etcd v3 as kube-apiserver does.

mod bridge;
pub mod cacher;
pub mod embedded;
pub mod etcd;
pub mod rest;
#[cfg(test)]
mod suite;

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

pub use cacher::Cacher;
pub use embedded::{EmbeddedStore, HistoryLimit};
pub use etcd::{EtcdConfig, EtcdServer, EtcdStore};
pub use rest::RestStore;

/// Where the API server keeps its objects.
#[derive(Clone, Debug, Default)]
pub enum StorageBackend {
    /// The redb file in the data dir.
    #[default]
    Embedded,
    /// etcd v3 (`--etcd-servers`).
    Etcd(EtcdConfig),
    /// The API server of this kubeconfig (`--kubeconfig`): kube-controller-manager and
    /// kube-scheduler run apart from it.
    Api(std::path::PathBuf),
}

/// An object as stored, with the revision of its last write.
#[derive(Clone, Debug)]
pub struct Stored {
    pub key: String,
    pub revision: u64,
    pub object: Arc<Value>,
}

/// Applies one watch event to a copy of the objects kept by key, as an informer's store
/// does: the object as written, or the key gone.
pub fn apply_event(items: &mut std::collections::BTreeMap<String, Stored>, ev: &Event) {
    match ev.kind {
        EventKind::Deleted => {
            items.remove(&ev.key);
        }
        EventKind::Added | EventKind::Modified => {
            items.insert(
                ev.key.clone(),
                Stored {
                    key: ev.key.clone(),
                    revision: ev.revision,
                    object: ev.object.clone(),
                },
            );
        }
    }
}

impl Event {
    /// A progress marker on a [`Store::watch_progress`] stream: every event under the
    /// watched prefix up to `revision` has been sent. It names no key.
    pub fn progress(revision: u64) -> Event {
        Event {
            revision,
            kind: EventKind::Modified,
            key: String::new(),
            object: Arc::new(Value::Null),
            prev: None,
        }
    }

    pub fn is_progress(&self) -> bool {
        self.key.is_empty()
    }
}

/// What happened to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

/// One change, as replayed to watchers. `prev` is the object before the change (for
/// MODIFIED and DELETED), which watchers need to tell when an object leaves a selector.
#[derive(Clone, Debug)]
pub struct Event {
    pub revision: u64,
    pub kind: EventKind,
    pub key: String,
    pub object: Arc<Value>,
    pub prev: Option<Arc<Value>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("key {0} not found")]
    NotFound(String),
    #[error("key {0} already exists")]
    AlreadyExists(String),
    #[error(
        "the object has been modified; please apply your changes to the latest version and try again"
    )]
    Conflict { key: String, current: u64 },
    #[error("too old resource version: {requested} ({oldest})")]
    Compacted { requested: u64, oldest: u64 },
    #[error("storage backend: {0}")]
    Backend(String),
    /// The backend cannot be reached (etcd down): 503 until it is back.
    #[error("storage is unavailable: {0}")]
    Unavailable(String),
    /// The backend did not answer within the request bound: 504.
    #[error("request did not complete within requested timeout - context deadline exceeded")]
    Timeout,
    #[error("storage: object {key} is not valid JSON: {err}")]
    Corrupt { key: String, err: String },
    /// The API server refused a request of a [`RestStore`]: its Status, passed on as is.
    #[error("{}", .0.get("message").and_then(Value::as_str).unwrap_or("the API server refused the request"))]
    Refused(Box<Value>),
}

impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}

/// Result of an atomic read-modify-write: write this value, delete the key, or leave it.
pub enum Mutation {
    Put(Value),
    Delete,
    Keep,
}

/// Storage as the API server needs it. Keys look like `/<group>/<resource>/<ns>/<name>`.
pub trait Store: Send + Sync {
    fn get(&self, key: &str) -> Result<Option<Stored>, StoreError>;
    /// Objects under `prefix` and the revision the list is consistent at.
    fn list(&self, prefix: &str) -> Result<(Vec<Stored>, u64), StoreError>;
    /// Creates `key`; fails if it exists. `metadata.resourceVersion` is set to the new revision.
    fn create(&self, key: &str, object: Value) -> Result<Stored, StoreError>;
    /// Atomically reads `key` (None when absent) and applies `f` under the write lock.
    /// Returns the stored result (None after a delete or when kept and absent).
    fn mutate(
        &self,
        key: &str,
        f: &mut dyn FnMut(Option<&Stored>) -> Result<Mutation, StoreError>,
    ) -> Result<MutateOutcome, StoreError>;
    /// Several read-modify-writes in one durable commit, applied in order (each sees what
    /// the ones before it wrote). An operation whose function fails is left out and its
    /// error returned in its slot; the others still commit. The outer error is the
    /// commit's own. Backends without transactions may apply them one by one.
    fn mutate_many(
        &self,
        ops: &mut [MutateOp<'_>],
    ) -> Result<Vec<Result<MutateOutcome, StoreError>>, StoreError> {
        Ok(ops
            .iter_mut()
            .map(|(key, f)| self.mutate(key, &mut **f))
            .collect())
    }
    /// Replaces `key` if its revision equals `expected` (when given).
    fn update(
        &self,
        key: &str,
        object: Value,
        expected: Option<u64>,
    ) -> Result<Stored, StoreError> {
        let mut obj = Some(object);
        let out = self.mutate(key, &mut |cur| {
            let Some(cur) = cur else {
                return Err(StoreError::NotFound(key.to_string()));
            };
            if let Some(e) = expected
                && e != cur.revision
            {
                return Err(StoreError::Conflict {
                    key: key.to_string(),
                    current: cur.revision,
                });
            }
            Ok(Mutation::Put(obj.take().unwrap_or(Value::Null)))
        })?;
        out.stored
            .ok_or_else(|| StoreError::NotFound(key.to_string()))
    }
    /// Deletes `key` if its revision equals `expected` (when given); returns the last state.
    fn delete(&self, key: &str, expected: Option<u64>) -> Result<Stored, StoreError> {
        let out = self.mutate(key, &mut |cur| {
            let Some(cur) = cur else {
                return Err(StoreError::NotFound(key.to_string()));
            };
            if let Some(e) = expected
                && e != cur.revision
            {
                return Err(StoreError::Conflict {
                    key: key.to_string(),
                    current: cur.revision,
                });
            }
            Ok(Mutation::Delete)
        })?;
        out.deleted
            .ok_or_else(|| StoreError::NotFound(key.to_string()))
    }
    /// Events under `prefix` strictly after revision `from`, then live ones. The channel
    /// closes when the watcher falls too far behind; it must then re-watch or re-list.
    fn watch(&self, prefix: &str, from: u64) -> Result<mpsc::Receiver<Arc<Event>>, StoreError>;
    /// [`Store::watch`], with progress markers ([`Event::is_progress`]) between the events
    /// where the backend knows its revision moved on: what bookmarks carry to a watcher of
    /// a quiet resource. Backends without progress send none.
    fn watch_progress(
        &self,
        prefix: &str,
        from: u64,
    ) -> Result<mpsc::Receiver<Arc<Event>>, StoreError> {
        self.watch(prefix, from)
    }
    /// The newest revision.
    fn revision(&self) -> u64;
    /// The oldest revision a watch can start from.
    fn oldest_watchable(&self) -> u64;
    /// Fails with [`StoreError::Compacted`] when a watch from `from` could not replay what
    /// followed it; may ask the server (etcd is compacted by others too).
    fn check_watchable(&self, from: u64) -> Result<(), StoreError> {
        match self.oldest_watchable() {
            oldest if from < oldest => Err(StoreError::Compacted {
                requested: from,
                oldest: oldest + 1,
            }),
            _ => Ok(()),
        }
    }
    /// Forgets events at or before `revision`.
    fn compact(&self, revision: u64) -> Result<(), StoreError>;
    /// Appends the backend's own metrics in the Prometheus text format (etcd's request
    /// metrics; the embedded store has none).
    fn metrics(&self, _out: &mut String) {}
    /// The API server behind a store reached through it, for the writes whose meaning
    /// the REST API keeps to itself (graceful deletion, admission); None for a store this
    /// process owns.
    fn remote(&self) -> Option<&RestStore> {
        None
    }
}

/// One operation of [`Store::mutate_many`]: a key and what to make of it.
pub type MutateOp<'a> = (
    String,
    Box<dyn FnMut(Option<&Stored>) -> Result<Mutation, StoreError> + Send + 'a>,
);

/// What [`Store::mutate`] did.
#[derive(Debug, Default)]
pub struct MutateOutcome {
    /// The object as now stored (after Put, or the unchanged one after Keep).
    pub stored: Option<Stored>,
    /// The object as it was before a Delete, carrying the deletion revision.
    pub deleted: Option<Stored>,
}

/// Writes `revision` into `metadata.resourceVersion`.
pub fn set_resource_version(object: &mut Value, revision: u64) {
    if let Some(obj) = object.as_object_mut() {
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(m) = meta.as_object_mut() {
            m.insert(
                "resourceVersion".into(),
                Value::String(revision.to_string()),
            );
        }
    }
}
