//! The pod manager (upstream's pkg/kubelet/pod): the pods the kubelet's sources want, by
//! UID. The syncLoop writes it; the eviction, shutdown and status managers, the server and
//! the admit handlers read it.

use k8s_openapi::api::core::v1::Pod;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// The desired pods, by UID (upstream's pod manager).
///
/// Pods are shared, not copied, with readers (upstream hands out pointers): admitting a pod
/// reads every other pod, and a deep copy of each would make a burst of N pods cost N².
#[derive(Clone, Default)]
pub struct PodManager {
    pods: Arc<Mutex<HashMap<String, Arc<Pod>>>>,
}

impl PodManager {
    pub fn get(&self, uid: &str) -> Option<Arc<Pod>> {
        self.pods.lock().ok().and_then(|p| p.get(uid).cloned())
    }
    pub fn all(&self) -> Vec<Arc<Pod>> {
        self.pods
            .lock()
            .map(|p| p.values().cloned().collect())
            .unwrap_or_default()
    }
    pub(crate) fn set(&self, pod: &Pod) {
        if let Ok(mut p) = self.pods.lock() {
            p.insert(uid(pod), Arc::new(pod.clone()));
        }
    }
    pub(crate) fn remove(&self, uid: &str) {
        if let Ok(mut p) = self.pods.lock() {
            p.remove(uid);
        }
    }
    /// The UIDs of the pods whose deletion was requested.
    pub(crate) fn deleting(&self) -> Vec<String> {
        self.pods
            .lock()
            .map(|p| {
                p.iter()
                    .filter(|(_, pod)| pod.metadata.deletion_timestamp.is_some())
                    .map(|(uid, _)| uid.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
    pub(crate) fn uids(&self) -> HashSet<String> {
        self.pods
            .lock()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}
