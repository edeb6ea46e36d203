//! The latest probe result per (probe type, container), upstream's `prober/results`
//! managers folded into one; every change is pushed to the kubelet.

use super::{ProbeResult, ProbeType, ProbeUpdate};
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::mpsc::UnboundedSender;

pub(super) struct Results {
    /// The result and the id of the worker that set it: a worker that is going away only
    /// clears its own results, never those of its successor for the same container.
    entries: Mutex<HashMap<(ProbeType, String), (ProbeResult, u64)>>,
    messages: Mutex<HashMap<(ProbeType, String), String>>,
    updates: UnboundedSender<ProbeUpdate>,
}

impl Results {
    pub(super) fn new(updates: UnboundedSender<ProbeUpdate>) -> Self {
        Results {
            entries: Mutex::new(HashMap::new()),
            messages: Mutex::new(HashMap::new()),
            updates,
        }
    }

    pub(super) fn get(&self, probe: ProbeType, container_id: &str) -> Option<ProbeResult> {
        let id = crate::cri::bare_container_id(container_id);
        lock(&self.entries)
            .get(&(probe, id.to_string()))
            .map(|(r, _)| *r)
    }

    /// Records a result; a change (or a first result) is sent as a [`ProbeUpdate`].
    pub(super) fn set(
        &self,
        probe: ProbeType,
        container_id: &str,
        result: ProbeResult,
        pod_uid: &str,
        container_name: &str,
        owner: u64,
    ) {
        let id = crate::cri::bare_container_id(container_id).to_string();
        let changed = {
            let mut entries = lock(&self.entries);
            entries
                .insert((probe, id.clone()), (result, owner))
                .map(|(r, _)| r)
                != Some(result)
        };
        if changed {
            let _ = self.updates.send(ProbeUpdate {
                pod_uid: pod_uid.to_string(),
                container_name: container_name.to_string(),
                container_id: id,
                probe,
                result,
            });
        }
    }

    /// Forgets a container's result (and message) if `owner` set it.
    pub(super) fn remove(&self, probe: ProbeType, container_id: &str, owner: u64) {
        let key = (
            probe,
            crate::cri::bare_container_id(container_id).to_string(),
        );
        let mut entries = lock(&self.entries);
        if entries.get(&key).is_some_and(|(_, o)| *o == owner) {
            entries.remove(&key);
            drop(entries);
            lock(&self.messages).remove(&key);
        }
    }

    pub(super) fn set_message(&self, probe: ProbeType, container_id: &str, message: String) {
        let key = (
            probe,
            crate::cri::bare_container_id(container_id).to_string(),
        );
        lock(&self.messages).insert(key, message);
    }

    pub(super) fn message(&self, probe: ProbeType, container_id: &str) -> Option<String> {
        let key = (
            probe,
            crate::cri::bare_container_id(container_id).to_string(),
        );
        lock(&self.messages).get(&key).cloned()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
