//! The API server pod source (upstream's config/apiserver.go): a reflector over the pods
//! bound to this node (`fieldSelector=spec.nodeName=<node>`) that sends the full set on
//! every change. kube-runtime's watcher does the list+watch, re-lists after 410 Gone and
//! backs off on errors (upstream's reflector behaviour).
//!
//! Mirror pods are the API's copies of this node's static pods: they are not run. They go
//! to the [`MirrorPods`] index instead, which the mirror pod manager and the status sync
//! read.

use super::{SourceSender, is_mirror_pod, pod_full_name};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The mirror pods the API server has for this node, by full name (`<name>_<namespace>`).
#[derive(Clone, Default)]
pub struct MirrorPods {
    pods: Arc<Mutex<HashMap<String, Pod>>>,
    /// Signalled whenever the set changes.
    pub changed: Arc<Notify>,
    /// Set once the first full list arrived.
    synced: Arc<std::sync::atomic::AtomicBool>,
}

impl MirrorPods {
    pub fn get(&self, full_name: &str) -> Option<Pod> {
        self.pods.lock().ok()?.get(full_name).cloned()
    }

    pub fn all(&self) -> Vec<Pod> {
        self.pods
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether the index reflects the API server at least once.
    pub fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Acquire)
    }

    fn replace(&self, pods: HashMap<String, Pod>) {
        if let Ok(mut m) = self.pods.lock() {
            *m = pods;
        }
        self.synced
            .store(true, std::sync::atomic::Ordering::Release);
        self.changed.notify_waiters();
    }
}

/// Starts the reflector for pods bound to `node`; pod sets go to `tx`, mirror pods to
/// `mirrors`.
pub fn spawn_api_source(
    client: kube::Client,
    node: String,
    tx: SourceSender,
    mirrors: MirrorPods,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Pod> = Api::all(client);
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let mut stream = watcher(api, cfg).default_backoff().boxed();
        let mut pods: HashMap<String, Pod> = HashMap::new();
        let mut buffer: Option<HashMap<String, Pod>> = None;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Init) => buffer = Some(HashMap::new()),
                Ok(watcher::Event::InitApply(p)) => {
                    if let Some(b) = buffer.as_mut() {
                        b.insert(key(&p), p);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    pods = buffer.take().unwrap_or_default();
                    tracing::debug!(node = %node, pods = pods.len(), "API pod source listed");
                }
                Ok(watcher::Event::Apply(p)) => {
                    pods.insert(key(&p), p);
                }
                Ok(watcher::Event::Delete(p)) => {
                    pods.remove(&key(&p));
                }
                Err(e) => {
                    tracing::warn!(node = %node, error = %e, "API pod source: watch failed; retrying with back-off");
                    continue;
                }
            }
            if buffer.is_some() {
                continue;
            }
            let (mirror, regular): (Vec<&Pod>, Vec<&Pod>) =
                pods.values().partition(|p| is_mirror_pod(p));
            mirrors.replace(
                mirror
                    .into_iter()
                    .map(|p| (pod_full_name(p), p.clone()))
                    .collect(),
            );
            if tx.send(regular.into_iter().cloned().collect()).is_err() {
                tracing::info!("pod config closed; API pod source stops");
                return;
            }
        }
    })
}

fn key(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_else(|| pod_full_name(p))
}
