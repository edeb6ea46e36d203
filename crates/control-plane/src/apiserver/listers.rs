//! Listers: the in-memory copies of a few resources that admission reads on every create,
//! kept by a watch of the store — what upstream's admission plugins get from their shared
//! informers (NamespaceLifecycle, ServiceAccount, Priority).
//!
//! On etcd each read would otherwise be a round trip before the create's own transaction:
//! three reads per pod. A lister drains the watch's pending events on every read, so it is as
//! fresh as the store's watch; a `get` that misses asks the store itself, as upstream's
//! NamespaceLifecycle and ServiceAccount admission do a live lookup before refusing, so an
//! object created a moment ago is never reported missing. A stale hit (an object deleted a
//! moment ago) is the informer's window upstream has too.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc::Receiver;
use tokio::sync::mpsc::error::TryRecvError;

use crate::storage::{Event, Store, StoreError, Stored};

/// The listers admission reads from.
pub struct Listers {
    pub namespaces: Lister,
    pub service_accounts: Lister,
    pub priority_classes: Lister,
    /// Read by the aggregator on every request for a group-version not served here.
    pub api_services: Lister,
}

impl Listers {
    pub fn new(store: Arc<dyn Store>) -> Listers {
        Listers {
            namespaces: Lister::new(store.clone(), "/core/namespaces/"),
            service_accounts: Lister::new(store.clone(), "/core/serviceaccounts/"),
            priority_classes: Lister::new(store.clone(), "/scheduling.k8s.io/priorityclasses/"),
            api_services: Lister::new(store, "/apiregistration.k8s.io/apiservices/"),
        }
    }
}

#[derive(Default)]
struct Cache {
    items: BTreeMap<String, Stored>,
    /// None until the first list, and again after the watch fell behind.
    changes: Option<Receiver<Arc<Event>>>,
}

/// The objects under one key prefix.
pub struct Lister {
    store: Arc<dyn Store>,
    prefix: &'static str,
    cache: Mutex<Cache>,
}

impl Lister {
    fn new(store: Arc<dyn Store>, prefix: &'static str) -> Lister {
        Lister {
            store,
            prefix,
            cache: Mutex::new(Cache::default()),
        }
    }

    /// The object at `key` (under this lister's prefix): from memory, or from the store when
    /// the watch has not brought it yet.
    pub fn get(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        debug_assert!(
            key.starts_with(self.prefix),
            "{key} is not under {}",
            self.prefix
        );
        if let Some(hit) = self.synced()?.items.get(key) {
            return Ok(Some(hit.clone()));
        }
        self.store.get(key)
    }

    /// Every object under the prefix, as of the last event the watch delivered.
    pub fn list(&self) -> Result<Vec<Stored>, StoreError> {
        Ok(self.synced()?.items.values().cloned().collect())
    }

    /// The cache with every pending event applied; (re)listed when it has no watch.
    fn synced(&self) -> Result<MutexGuard<'_, Cache>, StoreError> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rx) = &mut cache.changes {
            let mut applied = Vec::new();
            let lost = loop {
                match rx.try_recv() {
                    Ok(ev) => applied.push(ev),
                    Err(TryRecvError::Empty) => break false,
                    // Dropped for falling behind: list again.
                    Err(TryRecvError::Disconnected) => break true,
                }
            };
            for ev in applied {
                crate::storage::apply_event(&mut cache.items, &ev);
            }
            if lost {
                cache.changes = None;
            }
        }
        if cache.changes.is_none() {
            let (items, revision) = self.store.list(self.prefix)?;
            // From the list's revision, so no change between the two is missed.
            cache.changes = Some(self.store.watch(self.prefix, revision)?);
            cache.items = items.into_iter().map(|s| (s.key.clone(), s)).collect();
        }
        Ok(cache)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::EmbeddedStore;
    use serde_json::json;

    fn ns(name: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn follows_creates_updates_and_deletes_and_asks_the_store_on_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open(&dir.path().join("s.redb")).unwrap());
        store.create("/core/namespaces/a", ns("a")).unwrap();
        let lister = Lister::new(store.clone(), "/core/namespaces/");
        assert_eq!(lister.list().unwrap().len(), 1);

        // Created after the list: found at once, from the store if the event is not in yet.
        store.create("/core/namespaces/b", ns("b")).unwrap();
        assert!(lister.get("/core/namespaces/b").unwrap().is_some());
        assert!(lister.get("/core/namespaces/none").unwrap().is_none());

        let mut terminating = ns("a");
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        store
            .update("/core/namespaces/a", terminating, None)
            .unwrap();
        store.delete("/core/namespaces/b", None).unwrap();
        // The watch delivers asynchronously; the lister catches up within moments.
        let mut seen = false;
        for _ in 0..100 {
            let a = lister.get("/core/namespaces/a").unwrap().unwrap();
            let names: Vec<String> = lister.list().unwrap().into_iter().map(|s| s.key).collect();
            if a.object.pointer("/metadata/deletionTimestamp").is_some()
                && names == ["/core/namespaces/a"]
            {
                seen = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(seen, "the lister did not follow the update and the delete");
    }
}
