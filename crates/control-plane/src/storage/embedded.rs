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
//!
//! Writes are committed in groups, as etcd's WAL syncs whatever queued while it synced the
//! last batch: a writer stages its change under the lock (it gets the next revision, and
//! later writers see it), then the first writer to find no commit running writes every
//! staged change in one transaction outside the lock and applies them to the index and the
//! watchers; the others wait for their revision. Readers see committed writes only, after
//! any write staged before they asked has landed; a failed commit fails its writes and
//! every one staged after it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

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

/// An event as the events table keeps it.
#[derive(serde::Deserialize)]
struct EventRecord {
    kind: EventKind,
    key: String,
    object: Value,
    prev: Option<Value>,
}

/// [`EventRecord`] as written, borrowing the object.
#[derive(serde::Serialize)]
struct EventRecordRef<'a> {
    kind: EventKind,
    key: String,
    object: &'a Value,
    prev: Option<&'a Value>,
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
    /// Writes staged for the next commit, in revision order.
    queue: Vec<Queued>,
    /// Each key's state after the writes staged but not committed yet (`None`: deleted),
    /// with the revision of its last one: what later writers see, and readers do not.
    staged: HashMap<String, (u64, Option<Stored>)>,
    /// The last revision handed out to a staged write (`revision` when none is staged).
    next: u64,
    /// A writer is committing a batch (outside the lock).
    committing: bool,
    /// Counts failed commits; a writer waits for its revision within the epoch it staged
    /// in.
    epoch: usize,
    /// For each ended epoch, the last revision committed in it and the failure that ended it.
    epoch_ends: Vec<(u64, String)>,
}

impl Inner {
    /// The state loaded from the file: nothing staged, no watcher.
    fn new(
        objects: BTreeMap<String, Stored>,
        revision: u64,
        events: VecDeque<Kept>,
        history_bytes: usize,
        compacted: u64,
    ) -> Inner {
        Inner {
            objects,
            revision,
            events,
            history_bytes,
            compacted,
            watchers: Vec::new(),
            queue: Vec::new(),
            staged: HashMap::new(),
            next: revision,
            committing: false,
            epoch: 0,
            epoch_ends: Vec::new(),
        }
    }

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
    /// Signalled after each commit (or failed commit).
    written: Condvar,
    limit: HistoryLimit,
    /// Commits made, and the writes they held (exported as metrics).
    commits: AtomicU64,
    committed_writes: AtomicU64,
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
            inner: Mutex::new(Inner::new(
                objects,
                revision,
                events,
                history_bytes,
                compacted,
            )),
            written: Condvar::new(),
            limit,
            commits: AtomicU64::new(0),
            committed_writes: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the index half-updated: a write is
        // staged only once the caller's closure has returned, and the index is touched only
        // after a successful commit, so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `batch` durably in one transaction (its revisions are consecutive), trimming
    /// the history up to `trim_to`. Runs without the lock: writers go on staging the next
    /// batch meanwhile.
    fn persist(
        &self,
        compacted: u64,
        batch: &[Queued],
        trim_to: Option<u64>,
    ) -> Result<(), StoreError> {
        let Some(last) = batch.last().map(|q| q.revision) else {
            return Ok(());
        };
        let txn = self.db.begin_write().map_err(be)?;
        {
            let mut objects = txn.open_table(OBJECTS).map_err(be)?;
            let mut events = txn.open_table(EVENTS).map_err(be)?;
            for q in batch {
                match q.kind {
                    EventKind::Deleted => {
                        objects.remove(q.key.as_str()).map_err(be)?;
                    }
                    _ => {
                        objects
                            .insert(q.key.as_str(), q.bytes.as_slice())
                            .map_err(be)?;
                    }
                }
                events.insert(q.revision, q.record.as_slice()).map_err(be)?;
            }
            let mut meta = txn.open_table(META).map_err(be)?;
            meta.insert("revision", last).map_err(be)?;
            if let Some(upto) = trim_to {
                events.retain_in(..=upto, |_, _| false).map_err(be)?;
                meta.insert("compacted", upto.max(compacted)).map_err(be)?;
            }
        }
        txn.commit().map_err(be)?;
        Ok(())
    }

    /// Commits every write staged so far as one transaction (group commit: the writes that
    /// queued while the previous commit was being synced share this one's sync), then
    /// applies them to the index and tells watchers. The caller saw `committing` false.
    fn commit_queue<'a>(&'a self, mut inner: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        inner.committing = true;
        let batch = std::mem::take(&mut inner.queue);
        let bytes: usize = batch.iter().map(|q| q.record.len()).sum();
        let trim_to = inner.trim_point(self.limit, batch.len(), bytes);
        let compacted = inner.compacted;
        drop(inner);
        // The sync blocks this thread (a runtime worker, usually) without handing its tasks
        // over: a hand-off per commit costs more than it frees, as the other workers go on
        // taking requests, whose writers queue for the next commit.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.persist(compacted, &batch, trim_to)
        }))
        .unwrap_or_else(|_| Err(StoreError::Backend("the commit panicked".into())));
        let mut inner = self.lock();
        inner.committing = false;
        match result {
            Ok(()) => {
                self.commits.fetch_add(1, Ordering::Relaxed);
                self.committed_writes
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                inner.apply_committed(batch, trim_to)
            }
            Err(e) => inner.fail_uncommitted(&e),
        }
        self.written.notify_all();
        inner
    }

    /// Waits until the writes staged up to revision `last` in `epoch` are committed (or
    /// have failed), committing the queue itself when no other writer is.
    fn settle<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner>,
        epoch: usize,
        last: u64,
    ) -> (MutexGuard<'a, Inner>, Result<(), StoreError>) {
        loop {
            if let Some(done) = inner.outcome(epoch, last) {
                return (inner, done);
            }
            if !inner.committing && !inner.queue.is_empty() {
                inner = self.commit_queue(inner);
                continue;
            }
            inner = blocking(|| self.written.wait(inner).unwrap_or_else(|p| p.into_inner()));
        }
    }

    fn finish<'a>(
        &'a self,
        inner: MutexGuard<'a, Inner>,
        epoch: usize,
        last: u64,
    ) -> Result<(), StoreError> {
        self.settle(inner, epoch, last).1
    }

    /// The index once every write staged before now is committed (or has failed): a read
    /// sees each write that began before it, as when a write held the lock through its
    /// commit, and a client that reads an object to update it does not read it from under
    /// a write already on its way to disk.
    fn settled<'a>(&'a self, inner: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        let (epoch, last) = (inner.epoch, inner.next);
        self.settle(inner, epoch, last).0
    }

    /// Stages what `f` makes of `key`: the change queued for the next commit, or none; and
    /// the object `f` saw, with the revision that must be committed before it is returned.
    fn stage(
        inner: &mut Inner,
        key: &str,
        f: &mut dyn FnMut(Option<&Stored>) -> Result<Mutation, StoreError>,
    ) -> Result<Staged, StoreError> {
        let current = inner.current(key);
        let seen_at = inner.staged.get(key).map(|(rev, _)| *rev).unwrap_or(0);
        match f(current.as_ref())? {
            Mutation::Keep => Ok(Staged {
                stored: current,
                deleted: None,
                wait_for: seen_at,
            }),
            Mutation::Put(object) => {
                let (kind, prev) = match &current {
                    Some(c) => (EventKind::Modified, Some(c.object.clone())),
                    None => (EventKind::Added, None),
                };
                let stored = inner.queue_change(key, kind, object, prev)?;
                Ok(Staged {
                    wait_for: stored.revision,
                    stored: Some(stored),
                    deleted: None,
                })
            }
            Mutation::Delete => {
                let Some(cur) = current else {
                    return Err(StoreError::NotFound(key.to_string()));
                };
                let last = (*cur.object).clone();
                let stored =
                    inner.queue_change(key, EventKind::Deleted, last, Some(cur.object.clone()))?;
                Ok(Staged {
                    wait_for: stored.revision,
                    stored: None,
                    deleted: Some(stored),
                })
            }
        }
    }
}

/// Runs `f`, which blocks on the disk or on another writer's commit; on a multi-threaded
/// tokio runtime the worker hands its other tasks to another thread meanwhile, so that
/// more requests reach the store and share the next commit.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// A write staged for the next commit, serialized.
struct Queued {
    revision: u64,
    kind: EventKind,
    key: String,
    object: Arc<Value>,
    prev: Option<Arc<Value>>,
    /// The object as stored in the objects table.
    bytes: Vec<u8>,
    /// The event as stored in the events table.
    record: Vec<u8>,
}

/// What one operation staged: the outcome it will return once revision `wait_for` is
/// committed (0: nothing to wait for).
struct Staged {
    stored: Option<Stored>,
    deleted: Option<Stored>,
    wait_for: u64,
}

impl Staged {
    fn outcome(self) -> MutateOutcome {
        MutateOutcome {
            stored: self.stored,
            deleted: self.deleted,
        }
    }
}

impl Inner {
    /// What a writer sees of `key`: its last staged write, else the committed object.
    fn current(&self, key: &str) -> Option<Stored> {
        match self.staged.get(key) {
            Some((_, s)) => s.clone(),
            None => self.objects.get(key).cloned(),
        }
    }

    /// Queues one change under the next revision and returns it as it will be stored.
    fn queue_change(
        &mut self,
        key: &str,
        kind: EventKind,
        mut object: Value,
        prev: Option<Arc<Value>>,
    ) -> Result<Stored, StoreError> {
        let revision = self.next + 1;
        set_resource_version(&mut object, revision);
        let bytes = serde_json::to_vec(&object).map_err(|e| StoreError::Backend(e.to_string()))?;
        let record = serde_json::to_vec(&EventRecordRef {
            kind,
            key: key.to_string(),
            object: &object,
            prev: prev.as_deref(),
        })
        .map_err(|e| StoreError::Backend(e.to_string()))?;
        self.next = revision;
        let stored = Stored {
            key: key.to_string(),
            revision,
            object: Arc::new(object),
        };
        let after = (kind != EventKind::Deleted).then(|| stored.clone());
        self.staged.insert(key.to_string(), (revision, after));
        self.queue.push(Queued {
            revision,
            kind,
            key: key.to_string(),
            object: stored.object.clone(),
            prev,
            bytes,
            record,
        });
        Ok(stored)
    }

    /// Whether the writes up to `last`, staged in `epoch`, are done: committed, or failed
    /// with their commit (or with an earlier one they were staged on).
    fn outcome(&self, epoch: usize, last: u64) -> Option<Result<(), StoreError>> {
        if epoch == self.epoch {
            return (self.revision >= last).then_some(Ok(()));
        }
        let (end, err) = &self.epoch_ends[epoch];
        Some(if last <= *end {
            Ok(())
        } else {
            Err(StoreError::Backend(err.clone()))
        })
    }

    /// A committed batch: into the index and the history, and to the watchers, in order.
    fn apply_committed(&mut self, batch: Vec<Queued>, trim_to: Option<u64>) {
        if let Some(upto) = trim_to {
            self.drop_events_upto(upto);
        }
        for q in batch {
            let revision = q.revision;
            self.revision = revision;
            if self.staged.get(&q.key).is_some_and(|(r, _)| *r == revision) {
                self.staged.remove(&q.key);
            }
            match q.kind {
                EventKind::Deleted => {
                    self.objects.remove(&q.key);
                }
                _ => {
                    self.objects.insert(
                        q.key.clone(),
                        Stored {
                            key: q.key.clone(),
                            revision,
                            object: q.object.clone(),
                        },
                    );
                }
            }
            let bytes = q.record.len();
            let event = Arc::new(Event {
                revision,
                kind: q.kind,
                key: q.key,
                object: q.object,
                prev: q.prev,
            });
            self.history_bytes += bytes;
            self.events.push_back(Kept {
                event: event.clone(),
                bytes,
            });
            self.watchers.retain(|w| {
                if !event.key.starts_with(&w.prefix) {
                    return !w.tx.is_closed();
                }
                // A full buffer means the watcher is too slow: dropping it ends its stream,
                // and the client re-watches from its last resourceVersion, as with upstream.
                w.tx.try_send(event.clone()).is_ok()
            });
        }
    }

    /// A commit failed: it and every write staged after it (each may have been staged on
    /// its state) fail with its error, and revisions go on from the last committed one.
    fn fail_uncommitted(&mut self, e: &StoreError) {
        let message = match e {
            StoreError::Backend(m) => m.clone(),
            other => other.to_string(),
        };
        self.epoch_ends.push((self.revision, message));
        self.epoch += 1;
        self.staged.clear();
        self.queue.clear();
        self.next = self.revision;
    }
}

impl Store for EmbeddedStore {
    fn get(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        let mut inner = self.lock();
        if inner.staged.contains_key(key) {
            inner = self.settled(inner);
        }
        Ok(inner.objects.get(key).cloned())
    }

    fn list(&self, prefix: &str) -> Result<(Vec<Stored>, u64), StoreError> {
        let mut inner = self.lock();
        if inner.next > inner.revision {
            inner = self.settled(inner);
        }
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
        if inner.current(key).is_some() {
            return Err(StoreError::AlreadyExists(key.to_string()));
        }
        let stored = inner.queue_change(key, EventKind::Added, object, None)?;
        let epoch = inner.epoch;
        self.finish(inner, epoch, stored.revision)?;
        Ok(stored)
    }

    fn mutate(
        &self,
        key: &str,
        f: &mut dyn FnMut(Option<&Stored>) -> Result<Mutation, StoreError>,
    ) -> Result<MutateOutcome, StoreError> {
        let mut inner = self.lock();
        let staged = Self::stage(&mut inner, key, f)?;
        let epoch = inner.epoch;
        self.finish(inner, epoch, staged.wait_for)?;
        Ok(staged.outcome())
    }

    fn mutate_many(
        &self,
        ops: &mut [MutateOp<'_>],
    ) -> Result<Vec<Result<MutateOutcome, StoreError>>, StoreError> {
        let mut inner = self.lock();
        let mut wait_for = 0;
        let mut plan = Vec::with_capacity(ops.len());
        for (key, f) in ops.iter_mut() {
            let staged = Self::stage(&mut inner, key, &mut **f);
            if let Ok(s) = &staged {
                wait_for = wait_for.max(s.wait_for);
            }
            plan.push(staged);
        }
        let epoch = inner.epoch;
        self.finish(inner, epoch, wait_for)?;
        Ok(plan.into_iter().map(|p| p.map(Staged::outcome)).collect())
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

    fn metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(
            out,
            "# HELP nodus_store_commits_total Synced transactions of the embedded store; each holds every write that queued while the one before it was being synced.\n\
             # TYPE nodus_store_commits_total counter\n\
             nodus_store_commits_total {}\n\
             # HELP nodus_store_committed_writes_total Writes the embedded store's commits held.\n\
             # TYPE nodus_store_committed_writes_total counter\n\
             nodus_store_committed_writes_total {}\n",
            self.commits.load(Ordering::Relaxed),
            self.committed_writes.load(Ordering::Relaxed),
        );
    }

    fn oldest_watchable(&self) -> u64 {
        self.lock().compacted
    }

    fn compact(&self, revision: u64) -> Result<(), StoreError> {
        let mut inner = self.lock();
        // Not beside a commit in flight: its transaction records the compacted revision it
        // saw, which must not overwrite a newer one.
        while inner.committing {
            inner = blocking(|| self.written.wait(inner).unwrap_or_else(|p| p.into_inner()));
        }
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

    /// Writers see what is staged, readers what is committed; a failed commit fails its
    /// writes and every one staged after it, and revisions go on from the last committed.
    #[test]
    fn staged_writes_are_seen_by_writers_and_fail_with_their_commit() {
        let outcome =
            |i: &Inner, epoch, last| i.outcome(epoch, last).map(|r| r.map_err(|e| e.to_string()));
        let mut inner = Inner::new(BTreeMap::new(), 5, VecDeque::new(), 0, 0);
        let a = inner
            .queue_change("/k/a", EventKind::Added, json!({"v": 1}), None)
            .unwrap();
        assert_eq!(a.revision, 6);
        assert_eq!(a.object["metadata"]["resourceVersion"], "6");
        assert!(!inner.objects.contains_key("/k/a"), "not committed yet");
        assert_eq!(inner.current("/k/a").unwrap().revision, 6);
        assert_eq!(outcome(&inner, 0, 6), None, "waits for the commit");
        let batch = std::mem::take(&mut inner.queue);
        let b = inner
            .queue_change(
                "/k/a",
                EventKind::Modified,
                json!({"v": 2}),
                Some(a.object.clone()),
            )
            .unwrap();
        assert_eq!(b.revision, 7);
        inner.apply_committed(batch, None);
        assert_eq!(inner.revision, 6);
        assert_eq!(outcome(&inner, 0, 6), Some(Ok(())));
        assert_eq!(inner.objects["/k/a"].object["v"], 1);
        assert_eq!(
            inner.current("/k/a").unwrap().object["v"],
            2,
            "still staged"
        );
        inner.fail_uncommitted(&StoreError::Backend("disk gone".into()));
        assert_eq!(
            outcome(&inner, 0, 7),
            Some(Err("storage backend: disk gone".into()))
        );
        assert_eq!(
            outcome(&inner, 0, 6),
            Some(Ok(())),
            "committed before the failure"
        );
        assert_eq!(inner.current("/k/a").unwrap().object["v"], 1);
        assert!(inner.queue.is_empty());
        let c = inner
            .queue_change("/k/b", EventKind::Added, json!({}), None)
            .unwrap();
        assert_eq!((c.revision, inner.epoch), (7, 1));
        assert_eq!(outcome(&inner, 1, 7), None);
    }

    /// Writers on many threads at once, each a read-modify-write of one counter and a
    /// create of its own: no update is lost, every write has a revision of its own, a
    /// watcher sees them all in revision order, the commits held them all, and the file
    /// has them after a reopen.
    #[test]
    fn concurrent_writers_share_commits_and_lose_nothing() {
        const THREADS: u64 = 8;
        const EACH: u64 = 25;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let store = Arc::new(EmbeddedStore::open(&path).unwrap());
        store
            .create(
                "/c/counter",
                json!({"metadata": {"name": "counter"}, "n": 0}),
            )
            .unwrap();
        let mut events = store.watch("/c/", store.revision()).unwrap();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let store = store.clone();
                s.spawn(move || {
                    for i in 0..EACH {
                        store
                            .mutate("/c/counter", &mut |cur| {
                                let mut o = (*cur.unwrap().object).clone();
                                o["n"] = json!(o["n"].as_u64().unwrap() + 1);
                                Ok(Mutation::Put(o))
                            })
                            .unwrap();
                        store
                            .create(&format!("/c/t{t}-{i}"), json!({"metadata": {}}))
                            .unwrap();
                    }
                });
            }
        });
        let writes = THREADS * EACH * 2;
        let counter = store.get("/c/counter").unwrap().unwrap();
        assert_eq!(counter.object["n"], THREADS * EACH);
        assert_eq!(store.revision(), 1 + writes);
        let mut seen = Vec::new();
        while let Ok(e) = events.try_recv() {
            seen.push(e.revision);
        }
        assert_eq!(seen, (2..=1 + writes).collect::<Vec<_>>());
        let mut metrics = String::new();
        store.metrics(&mut metrics);
        assert!(
            metrics.contains(&format!(
                "nodus_store_committed_writes_total {}\n",
                writes + 1
            )),
            "{metrics}"
        );
        drop(events);
        drop(store);
        let store = EmbeddedStore::open(&path).unwrap();
        assert_eq!(store.revision(), 1 + writes);
        assert_eq!(
            store.get("/c/counter").unwrap().unwrap().object["n"],
            THREADS * EACH
        );
        assert_eq!(store.list("/c/t").unwrap().0.len() as u64, THREADS * EACH);
    }

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
