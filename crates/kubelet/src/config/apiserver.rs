//! The API server pod source (upstream's config/apiserver.go): a reflector over the pods
//! bound to this node (`fieldSelector=spec.nodeName=<node>`). kube-runtime's watcher does
//! the list+watch, re-lists after 410 Gone and backs off on errors (upstream's reflector
//! behaviour). Upstream sends the full set on every change, which costs a Go pointer per
//! pod; here a list is sent whole (SET, so pods gone during a broken watch are removed) and
//! each watch event as the one pod it changes, so an event does not copy the node's pods.
//!
//! Mirror pods are the API's copies of this node's static pods: they are not run. They go
//! to the [`MirrorPods`] index instead, which the mirror pod manager and the status sync
//! read.

use super::{SourceSender, SourceUpdate, is_mirror_pod, pod_full_name};
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

    /// Keeps the newest copy; wakes the readers only when what they act on changed (a new
    /// mirror pod, another uid, its deletion or its annotations), not for the status writes
    /// the kubelet itself makes to mirror pods.
    fn upsert(&self, pod: Pod) {
        let news = self.pods.lock().is_ok_and(|mut m| {
            let news = m.get(&pod_full_name(&pod)).is_none_or(|old| {
                old.metadata.uid != pod.metadata.uid
                    || old.metadata.deletion_timestamp != pod.metadata.deletion_timestamp
                    || old.metadata.annotations != pod.metadata.annotations
            });
            m.insert(pod_full_name(&pod), pod);
            news
        });
        if news {
            self.changed.notify_waiters();
        }
    }

    fn remove(&self, pod: &Pod) {
        let removed = self.pods.lock().is_ok_and(|mut m| {
            let full = pod_full_name(pod);
            // A mirror pod recreated under the same name is not the one the event removes.
            let same = m.get(&full).map(|p| &p.metadata.uid) == Some(&pod.metadata.uid);
            same && m.remove(&full).is_some()
        });
        if removed {
            self.changed.notify_waiters();
        }
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
        let mut buffer: Option<Vec<Pod>> = None;
        while let Some(ev) = stream.next().await {
            let update = match ev {
                Ok(watcher::Event::Init) => {
                    buffer = Some(Vec::new());
                    continue;
                }
                Ok(watcher::Event::InitApply(p)) => {
                    if let Some(b) = buffer.as_mut() {
                        b.push(p);
                    }
                    continue;
                }
                Ok(watcher::Event::InitDone) => {
                    let listed = buffer.take().unwrap_or_default();
                    tracing::debug!(node = %node, pods = listed.len(), "API pod source listed");
                    let (mirror, regular): (Vec<Pod>, Vec<Pod>) =
                        listed.into_iter().partition(is_mirror_pod);
                    mirrors.replace(mirror.into_iter().map(|p| (pod_full_name(&p), p)).collect());
                    SourceUpdate::Set(regular)
                }
                Ok(watcher::Event::Apply(p)) if is_mirror_pod(&p) => {
                    mirrors.upsert(p);
                    continue;
                }
                Ok(watcher::Event::Delete(p)) if is_mirror_pod(&p) => {
                    mirrors.remove(&p);
                    continue;
                }
                Ok(watcher::Event::Apply(p)) => SourceUpdate::Upsert(p),
                Ok(watcher::Event::Delete(p)) => SourceUpdate::Remove(p),
                Err(e) => {
                    tracing::warn!(node = %node, error = %e, "API pod source: watch failed; retrying with back-off");
                    continue;
                }
            };
            if tx.send(update).is_err() {
                tracing::info!("pod config closed; API pod source stops");
                return;
            }
        }
    })
}
