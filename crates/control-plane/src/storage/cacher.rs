//! The watch cache in front of etcd (upstream's `apiserver/pkg/storage/cacher`): one list and
//! one watch of the whole store keep every object in memory, decoded once.
//!
//! Without it every list decodes every object again and every watcher decodes its own copy
//! of each event, so each in-process consumer (the scheduler's and each controller's
//! informer cache, the garbage collector's graph, the listers) held a private copy of the
//! cluster: the API server on etcd took 4.9 GiB at 10,000 pods where the embedded store,
//! which hands out shared objects, took 0.9. Here lists and watch events hand out the
//! cache's own `Arc`s.
//!
//! - **Lists are consistent reads from the cache**, as upstream's `ConsistentListFromCache`:
//!   the current revision is asked of etcd (one cheap request) and the list waits until the
//!   cache has applied it. The cache's own watch asks etcd for progress notifications, so
//!   writes under another prefix of the same etcd move its revision too (every 5 s on the
//!   members nodus starts; etcd's default is 10 minutes). A cache that does not catch up
//!   within [`CATCH_UP`] (etcd down, or such writes between two notifications) is bypassed:
//!   the list goes to etcd. Progress is not requested on demand (`RequestProgress`):
//!   Debian's etcd 3.4.23 may answer it ahead of events still on their way (etcd issue
//!   15220, fixed in 3.4.25), and upstream too serves consistent lists from the cache only
//!   on fixed versions.
//! - **Bookmarks**: a watcher that asks for progress ([`Store::watch_progress`], the API
//!   server's watch handler) is told every second the revision up to which it has every
//!   event, so its bookmarks move on with the cluster even when its resource is quiet.
//! - **Watches** are served from the cache's recent events and then live, when they start
//!   within its history; older ones go to etcd (which replays them or says 410 Gone). A
//!   watcher that falls [`WATCH_BUFFER`] events behind is closed, as the embedded store's.
//! - **Reads of one key and every write** go to etcd: a GET sees the latest write of any API
//!   server, and optimistic concurrency stays etcd's.
//!
//! When the cache's own watch ends (etcd restarted or unreachable), it lists again, and the
//! watchers it fed are closed so they re-list and re-watch as after any lost watch.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use super::{Event, MutateOp, MutateOutcome, Mutation, Store, StoreError, Stored};

/// How long a list waits for the cache to reach etcd's current revision.
pub const CATCH_UP: Duration = Duration::from_secs(1);
/// Events kept for watches that start a little in the past (each may hold an old version
/// of its object, so the history is kept short).
const HISTORY: usize = 2048;
/// How often watchers that asked for progress are told the cache's revision.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Events a watcher may be behind before it is closed.
const WATCH_BUFFER: usize = 8192;

struct Watcher {
    prefix: String,
    /// Events at or before this revision were asked not to be sent.
    from: u64,
    tx: mpsc::Sender<Arc<Event>>,
    /// Sent progress markers ([`Store::watch_progress`]), and the newest revision it has
    /// been told of, by an event or a marker.
    progress: bool,
    sent: u64,
}

#[derive(Default)]
struct State {
    /// False while the cache is (re)built from a list.
    ready: bool,
    items: BTreeMap<String, Stored>,
    /// The revision the cache reflects.
    revision: u64,
    /// Recent events, oldest first: every event after `history_from` is here.
    history: VecDeque<Arc<Event>>,
    history_from: u64,
    watchers: Vec<Watcher>,
}

impl State {
    fn apply(&mut self, ev: Arc<Event>) {
        super::apply_event(&mut self.items, &ev);
        self.revision = self.revision.max(ev.revision);
        self.watchers.retain_mut(|w| {
            if ev.revision <= w.from || !ev.key.starts_with(&w.prefix) {
                return !w.tx.is_closed();
            }
            w.sent = ev.revision;
            // Full: too far behind; closed: gone. Either way it is dropped.
            w.tx.try_send(ev.clone()).is_ok()
        });
        self.history.push_back(ev);
        while self.history.len() > HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.history_from = old.revision;
            }
        }
    }
}

impl State {
    /// Tells each watcher that asked for progress that every event up to the cache's
    /// revision has been sent to it (events of other prefixes moved the revision, or etcd
    /// said it moved): its next bookmark may carry that revision.
    fn progress(&mut self) {
        let revision = self.revision;
        self.watchers.retain_mut(|w| {
            if !w.progress || w.sent >= revision || w.from >= revision {
                return !w.tx.is_closed();
            }
            w.sent = revision;
            w.tx.try_send(Arc::new(Event::progress(revision))).is_ok()
        });
    }
}

struct Shared {
    inner: Arc<dyn Store>,
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
    stop_notify: tokio::sync::Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lists and watches, applying events, until stopped; again after every lost watch.
    fn run(self: Arc<Self>) {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            tracing::error!("watch cache: no runtime; lists go to etcd");
            return;
        };
        while !self.stop.load(Ordering::Relaxed) {
            let started = self
                .inner
                .list("/")
                .and_then(|(items, rev)| Ok((items, rev, self.inner.watch_progress("/", rev)?)));
            let (items, revision, mut rx) = match started {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "watch cache: listing again in 1s");
                    rt.block_on(async {
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            _ = self.stop_notify.notified() => {}
                        }
                    });
                    continue;
                }
            };
            {
                let mut st = self.lock();
                st.items = items.into_iter().map(|s| (s.key.clone(), s)).collect();
                st.revision = revision;
                st.history.clear();
                st.history_from = revision;
                st.ready = true;
            }
            self.changed.notify_all();
            let mut tick = rt.block_on(async {
                let mut t = tokio::time::interval(PROGRESS_EVERY);
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                t.tick().await;
                t
            });
            loop {
                let ev = rt.block_on(async {
                    tokio::select! {
                        ev = rx.recv() => Some(ev),
                        _ = tick.tick() => None,
                        _ = self.stop_notify.notified() => Some(None),
                    }
                });
                match ev {
                    None => self.lock().progress(),
                    Some(None) => break,
                    Some(Some(ev)) if ev.is_progress() => {
                        // etcd's revision moved without an event under the prefix.
                        let mut st = self.lock();
                        st.revision = st.revision.max(ev.revision);
                        st.progress();
                        drop(st);
                        self.changed.notify_all();
                    }
                    Some(Some(ev)) => {
                        self.lock().apply(ev);
                        self.changed.notify_all();
                    }
                }
            }
            let mut st = self.lock();
            st.ready = false;
            // Their next events may be missing: they re-list and re-watch.
            st.watchers.clear();
        }
    }
}

/// A store whose lists and watches are served from memory, over `inner` (etcd).
pub struct Cacher {
    shared: Arc<Shared>,
}

impl Cacher {
    pub fn new(inner: Arc<dyn Store>) -> Cacher {
        let shared = Arc::new(Shared {
            inner,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            stop_notify: tokio::sync::Notify::new(),
        });
        let pump = shared.clone();
        if let Err(e) = std::thread::Builder::new()
            .name("watch-cache".into())
            .spawn(move || pump.run())
        {
            tracing::error!(error = %e, "watch cache: no thread; lists go to etcd");
        }
        Cacher { shared }
    }

    fn inner(&self) -> &dyn Store {
        self.shared.inner.as_ref()
    }
}

impl Drop for Cacher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.stop_notify.notify_one();
    }
}

impl Cacher {
    /// A watch served from the cache (from its history, then live), or from etcd when it
    /// starts before the history.
    fn open(
        &self,
        prefix: &str,
        from: u64,
        progress: bool,
    ) -> Result<mpsc::Receiver<Arc<Event>>, StoreError> {
        // etcd's compaction stays the store's contract, whoever compacted: a watch that
        // replays from before it is 410 Gone even while the history still holds it.
        if from < self.shared.lock().revision {
            self.inner().check_watchable(from)?;
        }
        let mut st = self.shared.lock();
        if !st.ready || from < st.history_from {
            drop(st);
            return match progress {
                true => self.inner().watch_progress(prefix, from),
                false => self.inner().watch(prefix, from),
            };
        }
        let backlog: Vec<Arc<Event>> = st
            .history
            .iter()
            .filter(|e| e.revision > from && e.key.starts_with(prefix))
            .cloned()
            .collect();
        let (tx, rx) = mpsc::channel(WATCH_BUFFER.max(backlog.len() + 16));
        for e in backlog {
            // Sized for the backlog: cannot be full.
            let _ = tx.try_send(e);
        }
        let from = from.max(st.revision);
        st.watchers.push(Watcher {
            prefix: prefix.to_string(),
            from,
            tx,
            progress,
            sent: from,
        });
        Ok(rx)
    }
}

impl Store for Cacher {
    fn get(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        self.inner().get(key)
    }

    fn list(&self, prefix: &str) -> Result<(Vec<Stored>, u64), StoreError> {
        let target = self.inner().revision();
        let st = self.shared.lock();
        let (st, waited) = self
            .shared
            .changed
            .wait_timeout_while(st, CATCH_UP, |s| !s.ready || s.revision < target)
            .unwrap_or_else(|e| e.into_inner());
        if waited.timed_out() {
            drop(st);
            return self.inner().list(prefix);
        }
        let items = st
            .items
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, s)| s.clone())
            .collect();
        Ok((items, st.revision))
    }

    fn create(&self, key: &str, object: Value) -> Result<Stored, StoreError> {
        self.inner().create(key, object)
    }

    fn mutate(
        &self,
        key: &str,
        f: &mut dyn FnMut(Option<&Stored>) -> Result<Mutation, StoreError>,
    ) -> Result<MutateOutcome, StoreError> {
        self.inner().mutate(key, f)
    }

    fn mutate_many(
        &self,
        ops: &mut [MutateOp<'_>],
    ) -> Result<Vec<Result<MutateOutcome, StoreError>>, StoreError> {
        self.inner().mutate_many(ops)
    }

    fn update(
        &self,
        key: &str,
        object: Value,
        expected: Option<u64>,
    ) -> Result<Stored, StoreError> {
        self.inner().update(key, object, expected)
    }

    fn delete(&self, key: &str, expected: Option<u64>) -> Result<Stored, StoreError> {
        self.inner().delete(key, expected)
    }

    fn watch(&self, prefix: &str, from: u64) -> Result<mpsc::Receiver<Arc<Event>>, StoreError> {
        self.open(prefix, from, false)
    }

    fn watch_progress(
        &self,
        prefix: &str,
        from: u64,
    ) -> Result<mpsc::Receiver<Arc<Event>>, StoreError> {
        self.open(prefix, from, true)
    }

    fn revision(&self) -> u64 {
        self.inner().revision()
    }

    fn oldest_watchable(&self) -> u64 {
        self.inner().oldest_watchable()
    }

    fn check_watchable(&self, from: u64) -> Result<(), StoreError> {
        self.inner().check_watchable(from)
    }

    fn compact(&self, revision: u64) -> Result<(), StoreError> {
        self.inner().compact(revision)
    }

    fn metrics(&self, out: &mut String) {
        self.inner().metrics(out)
    }
}
