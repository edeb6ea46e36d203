//! The configMap and secret managers (upstream's pkg/kubelet/configmap and secret with the
//! watch-based strategy, `configMapAndSecretChangeDetectionStrategy: Watch`): every object
//! a pod refers to — volumes, projected sources, `configMapKeyRef`/`secretKeyRef`,
//! `envFrom` — gets a watch on just that object (`fieldSelector=metadata.name=<name>`,
//! which the Node authorizer allows for objects its pods reference) from the first pod that
//! registers it until the last one is gone. Reads come from the watch's latest view, so a
//! pod sync always sees the current data and updates reach volumes at the next sync.

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Which kind of object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    /// The lower-case name upstream's errors use (`configmap "x" not found`).
    pub fn noun(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
        }
    }
}

/// The keys of a configMap (data and binaryData) or secret, as bytes.
pub type ObjectData = BTreeMap<String, Vec<u8>>;

/// What the watch knows about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Known {
    Present(ObjectData),
    Absent,
    /// The API server refused or failed (e.g. the Node authorizer found no relationship).
    Error(String),
}

/// Why an object could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// `configmap "x" not found`: an optional reference is satisfied by this.
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Other(String),
}

/// `namespace`, `name`.
type Key = (Kind, String, String);

struct Entry {
    pods: HashSet<String>,
    state: watch::Receiver<Option<Known>>,
    task: tokio::task::AbortHandle,
}

/// The objects pod `uid` refers to, from its spec.
pub fn references(pod: &Pod) -> Vec<(Kind, String)> {
    let mut out: Vec<(Kind, String)> = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    let mut add = |k: Kind, name: &str| {
        if !name.is_empty() && !out.iter().any(|(kk, n)| *kk == k && n == name) {
            out.push((k, name.to_string()));
        }
    };
    for v in spec.volumes.iter().flatten() {
        if let Some(cm) = &v.config_map {
            add(Kind::ConfigMap, &cm.name);
        }
        if let Some(s) = &v.secret {
            add(Kind::Secret, s.secret_name.as_deref().unwrap_or_default());
        }
        if let Some(p) = &v.projected {
            for src in p.sources.iter().flatten() {
                if let Some(cm) = &src.config_map {
                    add(Kind::ConfigMap, &cm.name);
                }
                if let Some(s) = &src.secret {
                    add(Kind::Secret, &s.name);
                }
            }
        }
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        for e in c.env.iter().flatten() {
            if let Some(from) = &e.value_from {
                if let Some(r) = &from.config_map_key_ref {
                    add(Kind::ConfigMap, &r.name);
                }
                if let Some(r) = &from.secret_key_ref {
                    add(Kind::Secret, &r.name);
                }
            }
        }
        for f in c.env_from.iter().flatten() {
            if let Some(r) = &f.config_map_ref {
                add(Kind::ConfigMap, &r.name);
            }
            if let Some(r) = &f.secret_ref {
                add(Kind::Secret, &r.name);
            }
        }
    }
    out
}

fn config_map_data(cm: ConfigMap) -> ObjectData {
    let mut d: ObjectData = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.unwrap_or_default() {
        d.insert(k, v.0);
    }
    d
}

fn secret_data(s: Secret) -> ObjectData {
    let mut d: ObjectData = s
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    // stringData is write-only upstream; a server that kept it still means the same keys.
    for (k, v) in s.string_data.unwrap_or_default() {
        d.entry(k).or_insert_with(|| v.into_bytes());
    }
    d
}

/// How long a read waits for a new watch's first list (upstream waits for the reflector
/// to sync before answering).
const SYNC_WAIT: Duration = Duration::from_secs(10);

/// The configMap and secret manager of one kubelet.
pub struct ObjectCache {
    client: Option<kube::Client>,
    entries: Mutex<HashMap<Key, Entry>>,
}

impl ObjectCache {
    pub fn new(client: Option<kube::Client>) -> Arc<ObjectCache> {
        Arc::new(ObjectCache {
            client,
            entries: Mutex::new(HashMap::new()),
        })
    }

    /// The API client the caches watch with (projected tokens ask it for TokenRequests).
    pub fn client(&self) -> Option<kube::Client> {
        self.client.clone()
    }

    /// Starts watching what `pod` refers to (upstream's RegisterPod); stops watching what
    /// an earlier version of it referred to and no longer does.
    pub fn register_pod(&self, pod: &Pod) {
        let Some(client) = self.client.clone() else {
            return;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let wanted: HashSet<Key> = references(pod)
            .into_iter()
            .map(|(k, n)| (k, ns.clone(), n))
            .collect();
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        for (key, e) in entries.iter_mut() {
            if !wanted.contains(key) {
                e.pods.remove(&uid);
            }
        }
        entries.retain(|key, e| {
            let keep = !e.pods.is_empty();
            if !keep {
                tracing::debug!(kind = key.0.noun(), namespace = %key.1, name = %key.2, "no pod refers to the object any more; stopping its watch");
                e.task.abort();
            }
            keep
        });
        for key in wanted {
            if let Some(e) = entries.get_mut(&key) {
                e.pods.insert(uid.clone());
                continue;
            }
            let (tx, rx) = watch::channel(None);
            let task = tokio::spawn(watch_object(client.clone(), key.clone(), tx)).abort_handle();
            entries.insert(
                key,
                Entry {
                    pods: HashSet::from([uid.clone()]),
                    state: rx,
                    task,
                },
            );
        }
    }

    /// Stops watching what only pod `uid` referred to (upstream's UnregisterPod).
    pub fn unregister_pod(&self, uid: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|_, e| {
                e.pods.remove(uid);
                if e.pods.is_empty() {
                    e.task.abort();
                    false
                } else {
                    true
                }
            });
        }
    }

    /// The object's current keys, or the error a pod sync reports (`configmap "x" not
    /// found`; `failed to sync configmap cache` when the watch never answered).
    pub async fn get(&self, kind: Kind, ns: &str, name: &str) -> Result<ObjectData, ObjectError> {
        if self.client.is_none() {
            return Err(ObjectError::Other(format!(
                "{} {name:?} not found: the kubelet has no API server (no --kubeconfig)",
                kind.noun()
            )));
        }
        let key = (kind, ns.to_string(), name.to_string());
        let rx = self
            .entries
            .lock()
            .ok()
            .and_then(|e| e.get(&key).map(|e| e.state.clone()));
        let Some(mut rx) = rx else {
            return Err(ObjectError::Other(format!(
                "object {ns:?}/{name:?} not registered ({} of a pod the kubelet does not run)",
                kind.noun()
            )));
        };
        let state = tokio::time::timeout(SYNC_WAIT, rx.wait_for(Option::is_some))
            .await
            .ok()
            .and_then(|r| r.ok().map(|v| v.clone()))
            .flatten();
        match state {
            Some(Known::Present(d)) => Ok(d),
            Some(Known::Absent) => Err(ObjectError::NotFound(format!(
                "{} {name:?} not found",
                kind.noun()
            ))),
            Some(Known::Error(e)) => Err(ObjectError::Other(e)),
            None => Err(ObjectError::Other(format!(
                "failed to sync {} cache: timed out waiting for the condition",
                kind.noun()
            ))),
        }
    }
}

impl Drop for ObjectCache {
    /// The watch tasks would outlive the cache otherwise (an abort handle does not abort
    /// on drop).
    fn drop(&mut self) {
        if let Ok(entries) = self.entries.get_mut() {
            for e in entries.values() {
                e.task.abort();
            }
        }
    }
}

/// Keeps `tx` at the latest state of one object until aborted; re-lists after errors
/// with the watcher's default back-off.
async fn watch_object(client: kube::Client, key: Key, tx: watch::Sender<Option<Known>>) {
    let (kind, ns, name) = key;
    let cfg = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
    match kind {
        Kind::ConfigMap => {
            let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, &ns);
            run_watch(api, cfg, config_map_data, kind, &name, tx).await
        }
        Kind::Secret => {
            let api: kube::Api<Secret> = kube::Api::namespaced(client, &ns);
            run_watch(api, cfg, secret_data, kind, &name, tx).await
        }
    }
}

async fn run_watch<K>(
    api: kube::Api<K>,
    cfg: kube::runtime::watcher::Config,
    data: fn(K) -> ObjectData,
    kind: Kind,
    name: &str,
    tx: watch::Sender<Option<Known>>,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use futures::StreamExt as _;
    use kube::runtime::WatchStreamExt as _;
    use kube::runtime::watcher::Event;
    let stream = kube::runtime::watcher(api, cfg).default_backoff();
    futures::pin_mut!(stream);
    let mut listing: Option<Known> = None;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => listing = Some(Known::Absent),
            Ok(Event::InitApply(o)) => listing = Some(Known::Present(data(o))),
            Ok(Event::InitDone) => {
                let v = listing.take().unwrap_or(Known::Absent);
                tx.send_replace(Some(v));
            }
            Ok(Event::Apply(o)) => {
                tracing::debug!(kind = kind.noun(), %name, "object changed");
                tx.send_replace(Some(Known::Present(data(o))));
            }
            Ok(Event::Delete(_)) => {
                tx.send_replace(Some(Known::Absent));
            }
            Err(e) => {
                tracing::warn!(kind = kind.noun(), %name, error = %e, "watching the object failed; retrying");
                // Only a watch that never listed reports the error; a known state stays.
                if tx.borrow().is_none() || matches!(*tx.borrow(), Some(Known::Error(_))) {
                    tx.send_replace(Some(Known::Error(format!(
                        "failed to get {} {name:?}: {e}",
                        kind.noun()
                    ))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_cover_volumes_projections_and_env() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {
                "volumes": [
                    {"name": "a", "configMap": {"name": "cm1"}},
                    {"name": "b", "secret": {"secretName": "s1"}},
                    {"name": "c", "projected": {"sources": [{"configMap": {"name": "cm2"}}, {"secret": {"name": "s1"}}]}}
                ],
                "containers": [{"name": "c", "env": [
                    {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm3", "key": "k"}}}
                ], "envFrom": [{"secretRef": {"name": "s2"}}]}]
            }
        }))
        .unwrap();
        let mut r = references(&pod);
        r.sort();
        assert_eq!(
            r,
            vec![
                (Kind::ConfigMap, "cm1".to_string()),
                (Kind::ConfigMap, "cm2".to_string()),
                (Kind::ConfigMap, "cm3".to_string()),
                (Kind::Secret, "s1".to_string()),
                (Kind::Secret, "s2".to_string()),
            ]
        );
    }
}
