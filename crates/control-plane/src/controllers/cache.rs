//! An informer over the store: one prefix listed once, then kept current from the store's
//! watch, re-listed when the watch falls behind. The scheduler and every controller read
//! their world from these instead of listing the store on each decision.

use std::collections::HashMap;
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

pub struct Cache {
    store: Arc<dyn Store>,
    prefix: String,
    pub objects: HashMap<String, Arc<Value>>,
    rx: Option<mpsc::Receiver<Arc<Event>>>,
}

impl Cache {
    pub fn new(store: Arc<dyn Store>, prefix: &str) -> Cache {
        let mut c = Cache {
            store,
            prefix: prefix.to_string(),
            objects: HashMap::new(),
            rx: None,
        };
        c.relist();
        c
    }

    fn relist(&mut self) {
        match self.store.list(&self.prefix) {
            Ok((items, rev)) => {
                self.objects = items.into_iter().map(|s| (s.key, s.object)).collect();
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
                self.objects.insert(ev.key.clone(), ev.object.clone());
            }
            EventKind::Deleted => {
                self.objects.remove(&ev.key);
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
