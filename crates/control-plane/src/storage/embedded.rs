//! The embedded store: a redb file (copy-on-write B-trees, atomic fsynced commits) plus an
//! in-memory index for reads and a bounded event log for watch replay.
//!
//! The event log is bounded by count and by bytes ([`HistoryLimit`]): large objects updated
//! often would otherwise keep hundreds of megabytes of old versions in memory and in the
//! file. Pages the trimmed events free are reused by later commits, so the file stops
//! growing; a file grown by an older version is compacted once when opened.
//!
//! A kill at any moment leaves the file at the last committed transaction: an object, its
//! event and the new revision are written in one transaction, so they appear together or
//! not at all.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;
use tokio::sync::mpsc;

use super::{
    Event, EventKind, MutateOp, MutateOutcome, Mutation, Store, StoreError, Stored,
    set_resource_version,
};

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// How much watch history the store keeps before the oldest events are compacted away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryLimit {
    pub events: usize,
    /// The events' encoded size (object and previous object).
    pub bytes: usize,
}

impl Default for HistoryLimit {
    fn default() -> Self {
        HistoryLimit {
            events: 50_000,
            bytes: 64 << 20,
        }
    }
}
/// Buffered events per watcher before it is dropped as too slow.
const WATCH_BUFFER: usize = 8192;

#[derive(serde::Serialize, serde::Deserialize)]
struct EventRecord {
    kind: EventKind,
    key: String,
    object: Value,
    prev: Option<Value>,
}

struct Watcher {
    prefix: String,
    tx: mpsc::Sender<Arc<Event>>,
}

/// An event kept for replay, with its encoded size.
struct Kept {
    event: Arc<Event>,
    bytes: usize,
}

struct Inner {
    objects: BTreeMap<String, Stored>,
    revision: u64,
    /// Events with revision > `compacted`, oldest first.
    events: VecDeque<Kept>,
    /// The sum of `events`' sizes.
    history_bytes: usize,
    compacted: u64,
    watchers: Vec<Watcher>,
}

impl Inner {
    /// The revision up to which events must go so that `incoming` more (of `bytes` in all)
    /// fit `limit`; the incoming ones are always kept.
    fn trim_point(&self, limit: HistoryLimit, incoming: usize, bytes: usize) -> Option<u64> {
        let mut count = self.events.len() + incoming;
        let mut total = self.history_bytes + bytes;
        let mut upto = None;
        for k in &self.events {
            if count <= limit.events && total <= limit.bytes {
                break;
            }
            count -= 1;
            total -= k.bytes;
            upto = Some(k.event.revision);
        }
        upto
    }

    fn drop_events_upto(&mut self, upto: u64) {
        while self
            .events
            .front()
            .is_some_and(|k| k.event.revision <= upto)
        {
            if let Some(k) = self.events.pop_front() {
                self.history_bytes -= k.bytes;
            }
        }
        self.compacted = self.compacted.max(upto);
    }
}

/// The default store: one redb file in the data dir.
pub struct EmbeddedStore {
    db: Database,
    inner: Mutex<Inner>,
    limit: HistoryLimit,
}

fn be<E: Into<redb::Error>>(e: E) -> StoreError {
    StoreError::from(e.into())
}

fn revision_of(v: &Value) -> u64 {
    v.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

impl EmbeddedStore {
    /// Opens (or creates) the store file at `path` and loads it, with the default history.
    pub fn open(path: &Path) -> Result<EmbeddedStore, StoreError> {
        Self::open_with(path, HistoryLimit::default())
    }

    /// Opens (or creates) the store file at `path` (mode 0600: it holds every Secret) and
    /// loads it, keeping at most `limit` of watch history.
    pub fn open_with(path: &Path, limit: HistoryLimit) -> Result<EmbeddedStore, StoreError> {
        nodus_serving::private::create_file(path)
            .map_err(|e| StoreError::Backend(format!("{}: {e}", path.display())))?;
        let mut db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Backend(format!(
                "{}: the store is open in another process (is another nodus control plane running on this --data-dir?)",
                path.display()
            )),
            e => be(e),
        })?;
        let txn = db.begin_write().map_err(be)?;
        {
            txn.open_table(OBJECTS).map_err(be)?;
            txn.open_table(EVENTS).map_err(be)?;
            txn.open_table(META).map_err(be)?;
        }
        txn.commit().map_err(be)?;

        let read = db.begin_read().map_err(be)?;
        let meta = read.open_table(META).map_err(be)?;
        let revision = meta
            .get("revision")
            .map_err(be)?
            .map(|g| g.value())
            .unwrap_or(0);
        let compacted = meta
            .get("compacted")
            .map_err(be)?
            .map(|g| g.value())
            .unwrap_or(0);
        let mut objects = BTreeMap::new();
        for entry in read.open_table(OBJECTS).map_err(be)?.iter().map_err(be)? {
            let (k, v) = entry.map_err(be)?;
            let key = k.value().to_string();
            let object: Value =
                serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt {
                    key: key.clone(),
                    err: e.to_string(),
                })?;
            let rev = revision_of(&object);
            objects.insert(
                key.clone(),
                Stored {
                    key,
                    revision: rev,
                    object: Arc::new(object),
                },
            );
        }
        // Newest first, until the limit: older events are trimmed below.
        let mut events = VecDeque::new();
        let mut history_bytes = 0usize;
        let mut trim_to = None;
        for entry in read
            .open_table(EVENTS)
            .map_err(be)?
            .iter()
            .map_err(be)?
            .rev()
        {
            let (k, v) = entry.map_err(be)?;
            let bytes = v.value().len();
            if events.len() + 1 > limit.events || history_bytes + bytes > limit.bytes {
                trim_to = Some(k.value());
                break;
            }
            let rec: EventRecord =
                serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt {
                    key: format!("event {}", k.value()),
                    err: e.to_string(),
                })?;
            history_bytes += bytes;
            events.push_front(Kept {
                event: Arc::new(Event {
                    revision: k.value(),
                    kind: rec.kind,
                    key: rec.key,
                    object: Arc::new(rec.object),
                    prev: rec.prev.map(Arc::new),
                }),
                bytes,
            });
        }
        drop(meta);
        drop(read);
        let mut compacted = compacted;
        if let Some(upto) = trim_to {
            // History beyond the limit, e.g. from a version without the byte bound: trim it
            // and give the file's free pages back once.
            let txn = db.begin_write().map_err(be)?;
            {
                let mut ev = txn.open_table(EVENTS).map_err(be)?;
                ev.retain_in(..=upto, |_, _| false).map_err(be)?;
                let mut meta = txn.open_table(META).map_err(be)?;
                compacted = compacted.max(upto);
                meta.insert("compacted", compacted).map_err(be)?;
            }
            txn.commit().map_err(be)?;
            db.compact().map_err(be)?;
        }
        Ok(EmbeddedStore {
            db,
            inner: Mutex::new(Inner {
                objects,
                revision,
                events,
                history_bytes,
                compacted,
                watchers: Vec::new(),
            }),
            limit,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the index half-updated: the index is
        // only touched after a successful commit, so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes changes durably in one transaction, revisions `first`, `first + 1`, …; the
    /// caller holds the lock and applies them in memory after.
    fn persist(
        &self,
        inner: &Inner,
        first: u64,
        changes: &[Pending],
        rows: &[(Vec<u8>, Vec<u8>)],
        trim_to: Option<u64>,
    ) -> Result<(), StoreError> {
        let last = first + changes.len() as u64 - 1;
        let txn = self.db.begin_write().map_err(be)?;
        {
            let mut objects = txn.open_table(OBJECTS).map_err(be)?;
            let mut events = txn.open_table(EVENTS).map_err(be)?;
            for (i, (c, (bytes, rec))) in changes.iter().zip(rows).enumerate() {
                match c.kind {
                    EventKind::Deleted => {
                        objects.remove(c.key.as_str()).map_err(be)?;
                    }
                    _ => {
                        objects
                            .insert(c.key.as_str(), bytes.as_slice())
                            .map_err(be)?;
                    }
                }
                events
                    .insert(first + i as u64, rec.as_slice())
                    .map_err(be)?;
            }
            let mut meta = txn.open_table(META).map_err(be)?;
            meta.insert("revision", last).map_err(be)?;
            if let Some(upto) = trim_to {
                events.retain_in(..=upto, |_, _| false).map_err(be)?;
                meta.insert("compacted", upto.max(inner.compacted))
                    .map_err(be)?;
            }
        }
        txn.commit().map_err(be)?;
        Ok(())
    }

    fn apply(
        &self,
        inner: &mut Inner,
        key: &str,
        kind: EventKind,
        object: Value,
        prev: Option<Arc<Value>>,
    ) -> Result<Stored, StoreError> {
        let mut out = self.apply_many(
            inner,
            vec![Pending {
                key: key.to_string(),
                kind,
                object,
                prev,
            }],
        )?;
        out.pop()
            .ok_or_else(|| StoreError::Backend("empty commit".into()))
    }

    /// Commits `changes` (in order, one revision each) durably, then applies them to the
    /// index and tells watchers.
    fn apply_many(
        &self,
        inner: &mut Inner,
        mut changes: Vec<Pending>,
    ) -> Result<Vec<Stored>, StoreError> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let first = inner.revision + 1;
        for (i, c) in changes.iter_mut().enumerate() {
            set_resource_version(&mut c.object, first + i as u64);
        }
        let mut rows = Vec::with_capacity(changes.len());
        for c in &changes {
            let bytes =
                serde_json::to_vec(&c.object).map_err(|e| StoreError::Backend(e.to_string()))?;
            let rec = EventRecord {
                kind: c.kind,
                key: c.key.clone(),
                object: c.object.clone(),
                prev: c.prev.as_deref().cloned(),
            };
            let rec = serde_json::to_vec(&rec).map_err(|e| StoreError::Backend(e.to_string()))?;
            rows.push((bytes, rec));
        }
        let sizes: Vec<usize> = rows.iter().map(|(_, rec)| rec.len()).collect();
        let trim_to = inner.trim_point(self.limit, changes.len(), sizes.iter().sum());
        self.persist(inner, first, &changes, &rows, trim_to)?;
        drop(rows);
        inner.revision = first + changes.len() as u64 - 1;
        if let Some(upto) = trim_to {
            inner.drop_events_upto(upto);
        }
        let mut out = Vec::with_capacity(changes.len());
        for ((i, c), bytes) in changes.into_iter().enumerate().zip(sizes) {
            let revision = first + i as u64;
            let object = Arc::new(c.object);
            let stored = Stored {
                key: c.key.clone(),
                revision,
                object: object.clone(),
            };
            match c.kind {
                EventKind::Deleted => {
                    inner.objects.remove(&c.key);
                }
                _ => {
                    inner.objects.insert(c.key.clone(), stored.clone());
                }
            }
            let event = Arc::new(Event {
                revision,
                kind: c.kind,
                key: c.key,
                object,
                prev: c.prev,
            });
            inner.history_bytes += bytes;
            inner.events.push_back(Kept {
                event: event.clone(),
                bytes,
            });
            inner.watchers.retain(|w| {
                if !event.key.starts_with(&w.prefix) {
                    return !w.tx.is_closed();
                }
                // A full buffer means the watcher is too slow: dropping it ends its stream,
                // and the client re-watches from its last resourceVersion, as with upstream.
                w.tx.try_send(event.clone()).is_ok()
            });
            out.push(stored);
        }
        Ok(out)
    }

    /// What `f` makes of `key`, given the state `staged` by earlier operations of the same
    /// batch (or the index).
    fn stage(
        inner: &Inner,
        staged: &std::collections::HashMap<String, Option<Stored>>,
        key: &str,
        f: &mut dyn FnMut(Option<&Stored>) -> Result<Mutation, StoreError>,
    ) -> Result<(Option<Pending>, Option<Stored>), StoreError> {
        let current = match staged.get(key) {
            Some(s) => s.clone(),
            None => inner.objects.get(key).cloned(),
        };
        match f(current.as_ref())? {
            Mutation::Keep => Ok((None, current)),
            Mutation::Put(object) => {
                let (kind, prev) = match &current {
                    Some(c) => (EventKind::Modified, Some(c.object.clone())),
                    None => (EventKind::Added, None),
                };
                Ok((
                    Some(Pending {
                        key: key.to_string(),
                        kind,
                        object,
                        prev,
                    }),
                    current,
                ))
            }
            Mutation::Delete => {
                let Some(cur) = current else {
                    return Err(StoreError::NotFound(key.to_string()));
                };
                Ok((
                    Some(Pending {
                        key: key.to_string(),
                        kind: EventKind::Deleted,
                        object: (*cur.object).clone(),
                        prev: Some(cur.object.clone()),
                    }),
                    Some(cur),
                ))
            }
        }
    }
}

/// One operation of a batch: its refusal, or the index of its change in the commit (when it
/// wrote one) and the object it saw.
type Planned = Result<(Option<usize>, Option<Stored>), StoreError>;

/// A change staged for commit.
struct Pending {
    key: String,
    kind: EventKind,
    object: Value,
    prev: Option<Arc<Value>>,
}

impl Store for EmbeddedStore {
    fn get(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        Ok(self.lock().objects.get(key).cloned())
    }

    fn list(&self, prefix: &str) -> Result<(Vec<Stored>, u64), StoreError> {
        let inner = self.lock();
        let items = inner
            .objects
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect();
        Ok((items, inner.revision))
    }

    fn create(&self, key: &str, object: Value) -> Result<Stored, StoreError> {
        let mut inner = self.lock();
        if inner.objects.contains_key(key) {
            return Err(StoreError::AlreadyExists(key.to_string()));
        }
        self.apply(&mut inner, key, EventKind::Added, object, None)
    }

    fn mutate(
        &self,
        key: &str,
        f: &mut dyn FnMut(Option<&Stored>) -> Result<Mutation, StoreError>,
    ) -> Result<MutateOutcome, StoreError> {
        let mut inner = self.lock();
        let current = inner.objects.get(key).cloned();
        match f(current.as_ref())? {
            Mutation::Keep => Ok(MutateOutcome {
                stored: current,
                deleted: None,
            }),
            Mutation::Put(value) => {
                let (kind, prev) = match &current {
                    Some(c) => (EventKind::Modified, Some(c.object.clone())),
                    None => (EventKind::Added, None),
                };
                let stored = self.apply(&mut inner, key, kind, value, prev)?;
                Ok(MutateOutcome {
                    stored: Some(stored),
                    deleted: None,
                })
            }
            Mutation::Delete => {
                let Some(cur) = current else {
                    return Err(StoreError::NotFound(key.to_string()));
                };
                let last = (*cur.object).clone();
                let stored = self.apply(
                    &mut inner,
                    key,
                    EventKind::Deleted,
                    last,
                    Some(cur.object.clone()),
                )?;
                Ok(MutateOutcome {
                    stored: None,
                    deleted: Some(stored),
                })
            }
        }
    }

    fn mutate_many(
        &self,
        ops: &mut [MutateOp<'_>],
    ) -> Result<Vec<Result<MutateOutcome, StoreError>>, StoreError> {
        let mut inner = self.lock();
        let mut staged: std::collections::HashMap<String, Option<Stored>> = Default::default();
        let mut pending = Vec::new();
        let mut plan: Vec<Planned> = Vec::new();
        for (key, f) in ops.iter_mut() {
            match Self::stage(&inner, &staged, key, &mut **f) {
                Ok((Some(p), seen)) => {
                    let kept = match p.kind {
                        EventKind::Deleted => None,
                        _ => Some(Stored {
                            key: p.key.clone(),
                            revision: 0,
                            object: Arc::new(p.object.clone()),
                        }),
                    };
                    staged.insert(key.to_string(), kept);
                    plan.push(Ok((Some(pending.len()), seen)));
                    pending.push(p);
                }
                Ok((None, seen)) => plan.push(Ok((None, seen))),
                Err(e) => plan.push(Err(e)),
            }
        }
        let kinds: Vec<EventKind> = pending.iter().map(|p| p.kind).collect();
        let written = self.apply_many(&mut inner, pending)?;
        Ok(plan
            .into_iter()
            .map(|p| {
                p.map(|(idx, seen)| match idx {
                    Some(i) if kinds[i] == EventKind::Deleted => MutateOutcome {
                        stored: None,
                        deleted: Some(written[i].clone()),
                    },
                    Some(i) => MutateOutcome {
                        stored: Some(written[i].clone()),
                        deleted: None,
                    },
                    None => MutateOutcome {
                        stored: seen,
                        deleted: None,
                    },
                })
            })
            .collect())
    }

    fn watch(&self, prefix: &str, from: u64) -> Result<mpsc::Receiver<Arc<Event>>, StoreError> {
        let mut inner = self.lock();
        if from < inner.compacted {
            return Err(StoreError::Compacted {
                requested: from,
                oldest: inner.compacted + 1,
            });
        }
        let backlog: Vec<Arc<Event>> = inner
            .events
            .iter()
            .map(|k| &k.event)
            .filter(|e| e.revision > from && e.key.starts_with(prefix))
            .cloned()
            .collect();
        let (tx, rx) = mpsc::channel(WATCH_BUFFER.max(backlog.len() + 16));
        for e in backlog {
            // The channel was sized for the backlog, so this cannot be full.
            let _ = tx.try_send(e);
        }
        inner.watchers.push(Watcher {
            prefix: prefix.to_string(),
            tx,
        });
        Ok(rx)
    }

    fn revision(&self) -> u64 {
        self.lock().revision
    }

    fn oldest_watchable(&self) -> u64 {
        self.lock().compacted
    }

    fn compact(&self, revision: u64) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let upto = revision.min(inner.revision);
        if upto <= inner.compacted {
            return Ok(());
        }
        let txn = self.db.begin_write().map_err(be)?;
        {
            let mut events = txn.open_table(EVENTS).map_err(be)?;
            events.retain_in(..=upto, |_, _| false).map_err(be)?;
            let mut meta = txn.open_table(META).map_err(be)?;
            meta.insert("compacted", upto).map_err(be)?;
        }
        txn.commit().map_err(be)?;
        inner.drop_events_upto(upto);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The suite's batch scenario, then what only a file-backed store must show: the
    /// batch is on disk after a reopen.
    #[test]
    fn a_batch_survives_reopen() {
        let b = crate::storage::suite::embedded();
        crate::storage::suite::a_batch_applies_in_order_and_skips_refused_operations(&b);
        let revision = b.store.revision();
        let crate::storage::suite::Backend { store, dir, .. } = b;
        drop(store);
        let store = EmbeddedStore::open(&dir.path().join("store.redb")).unwrap();
        assert_eq!(store.revision(), revision);
        assert_eq!(
            store.get("/core/pods/default/a").unwrap().unwrap().object["n"],
            2
        );
        assert!(store.get("/core/pods/default/b").unwrap().is_none());
    }

    #[test]
    fn revisions_survive_reopen_and_conflicts_are_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let a = store
            .create("/core/pods/default/a", json!({"metadata": {"name": "a"}}))
            .unwrap();
        assert_eq!(a.revision, 1);
        assert!(matches!(
            store.create("/core/pods/default/a", json!({})),
            Err(StoreError::AlreadyExists(_))
        ));
        let b = store
            .update(
                "/core/pods/default/a",
                json!({"metadata": {"name": "a"}}),
                Some(1),
            )
            .unwrap();
        assert_eq!(b.revision, 2);
        assert!(matches!(
            store.update("/core/pods/default/a", json!({}), Some(1)),
            Err(StoreError::Conflict { .. })
        ));
        drop(store);
        let store = EmbeddedStore::open(&path).unwrap();
        assert_eq!(store.revision(), 2);
        let got = store.get("/core/pods/default/a").unwrap().unwrap();
        assert_eq!(got.object["metadata"]["resourceVersion"], "2");
        let c = store.create("/core/pods/default/c", json!({})).unwrap();
        assert_eq!(c.revision, 3);
        let (items, rev) = store.list("/core/pods/default/").unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(rev, 3);
    }

    #[test]
    fn history_is_bounded_by_bytes_in_memory_and_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let limit = HistoryLimit {
            events: 50_000,
            bytes: 1 << 20,
        };
        let store = EmbeddedStore::open_with(&path, limit).unwrap();
        let big = "x".repeat(100 * 1024);
        let key = "/core/configmaps/ns/big";
        store.create(key, json!({"data": {"k": big}})).unwrap();
        let mut sizes = Vec::new();
        for i in 0..300 {
            store
                .update(key, json!({"data": {"k": big, "i": i}}), None)
                .unwrap();
            if i % 100 == 99 {
                sizes.push(std::fs::metadata(&path).unwrap().len());
            }
        }
        {
            let inner = store.lock();
            assert!(
                inner.history_bytes <= limit.bytes,
                "{}",
                inner.history_bytes
            );
            // Each event holds two 100 KiB versions: about five fit in 1 MiB.
            assert!(
                (3..=6).contains(&inner.events.len()),
                "{}",
                inner.events.len()
            );
        }
        // Freed pages are reused: the file does not keep growing with the updates.
        assert!(sizes[2] <= sizes[0] * 2, "file sizes {sizes:?}");
        assert!(sizes[2] < 32 << 20, "file sizes {sizes:?}");
        let oldest = store.oldest_watchable();
        assert!(oldest > 250);
        match store.watch("/core/configmaps/", 5) {
            Err(e @ StoreError::Compacted { .. }) => {
                assert_eq!(
                    e.to_string(),
                    format!("too old resource version: 5 ({})", oldest + 1)
                );
            }
            other => panic!("expected Compacted, got {:?}", other.map(|_| ())),
        }
        assert!(
            store
                .watch("/core/configmaps/", store.revision() - 2)
                .is_ok()
        );
        drop(store);
        // Reopening with a smaller budget trims the history kept from before.
        let store = EmbeddedStore::open_with(
            &path,
            HistoryLimit {
                events: 2,
                bytes: 1 << 20,
            },
        )
        .unwrap();
        assert_eq!(store.lock().events.len(), 2);
        assert_eq!(store.oldest_watchable(), store.revision() - 2);
    }
}
