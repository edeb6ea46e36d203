//! Pod status as the kubelet reports it (upstream's generateAPIPodStatus and the status
//! manager's cache): phase, conditions, container statuses with state and lastState,
//! restart counts, readiness from the probers.

mod generate;
pub mod sync;

pub use generate::{generate_pod_status, pod_phase, set_ready_conditions};

use crate::prober::PodStatusProvider;
use k8s_openapi::api::core::v1::PodStatus;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

/// The latest computed status of every pod the kubelet runs, by uid. Readers are the
/// probers, the read-only server and (later) the API status sync.
#[derive(Clone, Default)]
pub struct StatusManager {
    inner: Arc<RwLock<HashMap<String, PodStatus>>>,
    /// The pods whose status was set since the status sync last took them: its rounds
    /// between two full ones look at these only (upstream's podStatusChannel), so a status
    /// change costs one pod's sync, not the node's.
    dirty: Arc<Mutex<HashSet<String>>>,
    /// Wakes the API status sync ([`sync`]) after every change.
    pub changed: Arc<tokio::sync::Notify>,
}

impl StatusManager {
    pub fn new() -> StatusManager {
        StatusManager::default()
    }

    pub fn get(&self, uid: &str) -> Option<PodStatus> {
        self.inner.read().ok().and_then(|m| m.get(uid).cloned())
    }

    /// Stores a status, keeping the conditions' lastTransitionTime when they did not change.
    pub fn set(&self, uid: &str, mut status: PodStatus) {
        let Ok(mut m) = self.inner.write() else {
            return;
        };
        if let Some(old) = m.get(uid) {
            for c in status.conditions.iter_mut().flatten() {
                if let Some(o) = old
                    .conditions
                    .iter()
                    .flatten()
                    .find(|o| o.type_ == c.type_ && o.status == c.status)
                {
                    c.last_transition_time = o.last_transition_time.clone();
                }
            }
            if old.start_time.is_some() {
                status.start_time = old.start_time.clone();
            }
        }
        m.insert(uid.to_string(), status);
        drop(m);
        if let Ok(mut d) = self.dirty.lock() {
            d.insert(uid.to_string());
        }
        self.changed.notify_one();
    }

    /// The pods whose status was set since the last call.
    pub fn take_dirty(&self) -> HashSet<String> {
        self.dirty
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default()
    }

    pub fn remove(&self, uid: &str) {
        if let Ok(mut m) = self.inner.write() {
            m.remove(uid);
        }
    }

    pub fn all(&self) -> HashMap<String, PodStatus> {
        self.inner.read().map(|m| m.clone()).unwrap_or_default()
    }
}

/// Lets the probers read container ids and start times from the status manager.
pub struct ProviderAdapter(pub StatusManager);

impl PodStatusProvider for ProviderAdapter {
    fn pod_status(&self, pod_uid: &str) -> Option<PodStatus> {
        self.0.get(pod_uid)
    }
}
