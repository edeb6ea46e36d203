//! An informer over the store: one prefix listed once, then kept current from the store's
//! watch, re-listed when the watch falls behind. The scheduler and every controller read
//! their world from these instead of listing the store on each decision.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::storage::{Event, EventKind, Store};

/// What the cache learned on one [`Cache::next`].
pub enum Change {
    /// One store event, already applied to the cache.
    Event(Arc<Event>),
    /// The watch was lost and the whole prefix re-listed: treat everything as changed.
    Relisted,
}

/// A secondary index (client-go's `Indexers`): the values an object is filed under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Index {
    /// `metadata.namespace`.
    Namespace,
    /// The uid of the ownerReference with `controller: true`.
    ControllerUid,
}

impl Index {
    fn values(self, o: &Value) -> Option<&str> {
        match self {
            Index::Namespace => o.pointer("/metadata/namespace")?.as_str(),
            Index::ControllerUid => o
                .pointer("/metadata/ownerReferences")?
                .as_array()?
                .iter()
                .find(|r| r["controller"] == true)?
                .get("uid")?
                .as_str(),
        }
    }
}

pub struct Cache {
    store: Arc<dyn Store>,
    prefix: String,
    pub objects: HashMap<String, Arc<Value>>,
    rx: Option<mpsc::Receiver<Arc<Event>>>,
    /// Index → value → keys filed under it.
    indices: HashMap<Index, HashMap<String, HashSet<String>>>,
}

impl Cache {
    pub fn new(store: Arc<dyn Store>, prefix: &str) -> Cache {
        let mut c = Cache {
            store,
            prefix: prefix.to_string(),
            objects: HashMap::new(),
            rx: None,
            indices: HashMap::new(),
        };
        c.relist();
        c
    }

    /// Keeps `index` over the cached objects from now on.
    pub fn with_index(mut self, index: Index) -> Cache {
        self.indices.insert(index, HashMap::new());
        self.reindex();
        self
    }

    /// The objects filed under `value` in `index` (which must have been asked for).
    pub fn by_index<'a>(
        &'a self,
        index: Index,
        value: &str,
    ) -> impl Iterator<Item = (&'a String, &'a Arc<Value>)> + 'a {
        debug_assert!(self.indices.contains_key(&index), "{index:?} is not kept");
        self.indices
            .get(&index)
            .and_then(|m| m.get(value))
            .into_iter()
            .flatten()
            .filter_map(|k| self.objects.get_key_value(k))
    }

    /// The values `index` holds objects under.
    pub fn index_values(&self, index: Index) -> impl Iterator<Item = &String> {
        self.indices.get(&index).into_iter().flat_map(|m| m.keys())
    }

    fn reindex(&mut self) {
        for (index, m) in self.indices.iter_mut() {
            m.clear();
            for (k, o) in &self.objects {
                if let Some(v) = index.values(o) {
                    m.entry(v.to_string()).or_default().insert(k.clone());
                }
            }
        }
    }

    fn file(&mut self, key: &str, old: Option<&Value>, new: Option<&Value>) {
        for (index, m) in self.indices.iter_mut() {
            let (was, is) = (
                old.and_then(|o| index.values(o)),
                new.and_then(|o| index.values(o)),
            );
            if was == is {
                continue;
            }
            if let Some(v) = was
                && let Some(keys) = m.get_mut(v)
            {
                keys.remove(key);
                if keys.is_empty() {
                    m.remove(v);
                }
            }
            if let Some(v) = is {
                m.entry(v.to_string()).or_default().insert(key.to_string());
            }
        }
    }

    fn relist(&mut self) {
        match self.store.list(&self.prefix) {
            Ok((items, rev)) => {
                self.objects = items.into_iter().map(|s| (s.key, s.object)).collect();
                self.reindex();
                self.rx = self.store.watch(&self.prefix, rev).ok();
            }
            Err(e) => {
                tracing::warn!(prefix = %self.prefix, error = %e, "cache: list failed");
                self.rx = None;
            }
        }
    }

    fn apply(&mut self, ev: &Event) {
        match ev.kind {
            EventKind::Added | EventKind::Modified => {
                let old = self.objects.insert(ev.key.clone(), ev.object.clone());
                if !self.indices.is_empty() {
                    self.file(&ev.key, old.as_deref(), Some(&ev.object));
                }
            }
            EventKind::Deleted => {
                let old = self.objects.remove(&ev.key);
                if !self.indices.is_empty() {
                    self.file(&ev.key, old.as_deref(), None);
                }
            }
        }
    }

    /// Waits for the next change under the prefix.
    pub async fn next(&mut self) -> Change {
        loop {
            let Some(rx) = self.rx.as_mut() else {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                self.relist();
                if self.rx.is_some() {
                    return Change::Relisted;
                }
                continue;
            };
            match rx.recv().await {
                Some(ev) => {
                    self.apply(&ev);
                    return Change::Event(ev);
                }
                None => {
                    self.relist();
                    return Change::Relisted;
                }
            }
        }
    }

    /// A change already waiting, without blocking.
    pub fn try_next(&mut self) -> Option<Change> {
        let rx = self.rx.as_mut()?;
        match rx.try_recv() {
            Ok(ev) => {
                self.apply(&ev);
                Some(Change::Event(ev))
            }
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => {
                self.relist();
                Some(Change::Relisted)
            }
        }
    }

    pub fn get(&self, key: &str) -> Option<&Arc<Value>> {
        self.objects.get(key)
    }
}
