//! Pod sources (static pod directory, manifest URL, API server) merged into one stream.
//!
//! Mirrors upstream's `pkg/kubelet/config`: a source sends its full current set of pods
//! (upstream's SET) or, as a watch sees them, one pod created, changed or gone; [`PodConfig`]
//! keeps the pods per source keyed by UID and turns each change into ADD / UPDATE / REMOVE /
//! DELETE / RECONCILE updates on one channel, in the order upstream delivers them. The API
//! source sends SET only after a (re-)list and single pods otherwise, so a watch event costs
//! the merge one pod, not the node's whole set.

mod apiserver;
mod common;
mod file;
mod http;
mod merge;

use k8s_openapi::api::core::v1::Pod;
use std::sync::{Arc, Mutex};

pub use apiserver::{MirrorPods, spawn_api_source};
pub use common::{
    MAX_CONFIG_LENGTH, ManifestError, ManifestOrigin, apply_defaults, decode_manifest, fnv128a_hex,
    generate_pod_name,
};
pub use file::{FILE_CHECK_FREQUENCY, spawn_file_source};
pub use http::{HTTP_CHECK_FREQUENCY, spawn_http_source, spawn_http_source_with_headers};

/// Pods read from the static pod directory (`--pod-manifest-path`).
pub const FILE_SOURCE: &str = "file";
/// Pods read from `--manifest-url`.
pub const HTTP_SOURCE: &str = "http";
/// Pods bound to this node in the API server.
pub const API_SOURCE: &str = "api";
/// Pseudo-source: every source at once, as upstream's `kubetypes.AllSource`.
pub const ALL_SOURCE: &str = "*";

/// Which source a pod came from (`file`, `http`, `api`).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// The hash the kubelet derived for a static pod; equals its UID.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// When the kubelet first saw the pod (RFC 3339 with nanoseconds).
pub const CONFIG_FIRST_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// Set on mirror pods: the hash of the static pod they mirror.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What happened to the pods of an update, as upstream's `kubetypes.PodOperation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodOperation {
    /// Pods new to the kubelet.
    Add,
    /// Pods whose spec, labels or annotations changed.
    Update,
    /// Pods gone from their source: tear them down now.
    Remove,
    /// Pods whose deletion was requested (deletionTimestamp set): graceful termination.
    Delete,
    /// Pods whose status alone differs from what the source sent.
    Reconcile,
}

/// One batch of pods sharing an operation and a source.
#[derive(Clone, Debug)]
pub struct PodUpdate {
    pub op: PodOperation,
    pub pods: Vec<Pod>,
    pub source: String,
}

/// What a source sends: upstream's `kubetypes.PodUpdate` as sources use it.
#[derive(Clone, Debug)]
pub enum SourceUpdate {
    /// The source's full current set (upstream's SET): pods not in it are removed.
    Set(Vec<Pod>),
    /// One pod created or changed (upstream's ADD or UPDATE from a source).
    Upsert(Pod),
    /// One pod gone from the source (upstream's REMOVE from a source).
    Remove(Pod),
}

impl From<Vec<Pod>> for SourceUpdate {
    fn from(pods: Vec<Pod>) -> SourceUpdate {
        SourceUpdate::Set(pods)
    }
}

/// The channel a source sends its [`SourceUpdate`]s on.
pub type SourceSender = tokio::sync::mpsc::UnboundedSender<SourceUpdate>;

/// Merges the pod sets of all sources into one stream of [`PodUpdate`]s.
///
/// Cheap to clone; clones share the merged state.
#[derive(Clone)]
pub struct PodConfig {
    storage: Arc<Mutex<merge::PodStorage>>,
    updates: tokio::sync::mpsc::UnboundedSender<PodUpdate>,
}

impl PodConfig {
    /// The merger and the receiving end of its update stream.
    pub fn new() -> (PodConfig, tokio::sync::mpsc::UnboundedReceiver<PodUpdate>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (
            PodConfig {
                storage: Arc::new(Mutex::new(merge::PodStorage::default())),
                updates: tx,
            },
            rx,
        )
    }

    /// Registers `source` and returns the channel it sends its pod sets on.
    ///
    /// Spawns a task on the current tokio runtime that merges what arrives; it ends when
    /// every sender of the channel is dropped.
    pub fn channel(&self, source: &str) -> SourceSender {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<SourceUpdate>();
        let this = self.clone();
        let source = source.to_string();
        tokio::spawn(async move {
            while let Some(update) = rx.recv().await {
                this.merge(&source, update);
            }
        });
        tx
    }

    /// Merges what `source` sent right away and emits the resulting updates.
    /// [`PodConfig::channel`] calls this for everything its sender receives.
    pub fn merge(&self, source: &str, update: SourceUpdate) {
        let mut storage = match self.storage.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Sending under the lock keeps the updates of concurrent sources in merge order.
        for update in storage.merge(source, update) {
            if self.updates.send(update).is_err() {
                tracing::debug!(source, "pod config receiver dropped, update discarded");
            }
        }
    }

    /// True once every named source has sent its pod set at least once.
    pub fn seen_all_sources(&self, sources: &[&str]) -> bool {
        let storage = match self.storage.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        sources.iter().all(|s| storage.seen(s))
    }

    /// The merged desired state of all sources (upstream's `MergedState`).
    pub fn pods(&self) -> Vec<Pod> {
        let storage = match self.storage.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        storage.all_pods()
    }
}

/// The current time as an API timestamp (k8s-openapi builds jiff without its clock).
pub fn now_timestamp() -> k8s_openapi::jiff::Timestamp {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_nanosecond(nanos).unwrap_or_default()
}

/// The source a pod came from, from its `kubernetes.io/config.source` annotation.
pub fn pod_source(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .map(String::as_str)
}

/// A static pod is one whose source is known and is not the API server (upstream's
/// `kubetypes.IsStaticPod`).
pub fn is_static_pod(pod: &Pod) -> bool {
    matches!(pod_source(pod), Some(s) if s != API_SOURCE)
}

/// A mirror pod is the API server's copy of a static pod; it carries the
/// `kubernetes.io/config.mirror` annotation (upstream's `kubetypes.IsMirrorPod`).
pub fn is_mirror_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION))
}

/// `<name>_<namespace>`, upstream's `kubecontainer.GetPodFullName`.
pub fn pod_full_name(pod: &Pod) -> String {
    format!(
        "{}_{}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default()
    )
}

/// `<name>_<namespace>(<uid>)`, upstream's `format.Pod`, used in log and event messages.
pub fn format_pod(pod: &Pod) -> String {
    format!(
        "{}({})",
        pod_full_name(pod),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(uid: &str, name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                name: Some(name.into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn sources_feed_one_ordered_stream() {
        let (config, mut rx) = PodConfig::new();
        let file = config.channel(FILE_SOURCE);
        let api = config.channel(API_SOURCE);
        assert!(!config.seen_all_sources(&[FILE_SOURCE, API_SOURCE]));
        file.send(vec![pod("1", "a")].into()).unwrap();
        let u = rx.recv().await.unwrap();
        assert_eq!(
            (u.op, u.source.as_str(), u.pods.len()),
            (PodOperation::Add, "file", 1)
        );
        assert!(config.seen_all_sources(&[FILE_SOURCE]));
        assert!(!config.seen_all_sources(&[FILE_SOURCE, API_SOURCE]));
        api.send(vec![].into()).unwrap();
        let u = rx.recv().await.unwrap();
        assert_eq!(
            (u.op, u.source.as_str(), u.pods.len()),
            (PodOperation::Add, "api", 0)
        );
        assert!(config.seen_all_sources(&[FILE_SOURCE, API_SOURCE]));
        file.send(vec![].into()).unwrap();
        let u = rx.recv().await.unwrap();
        assert_eq!((u.op, u.pods.len()), (PodOperation::Remove, 1));
        assert!(config.pods().is_empty());
    }

    #[test]
    fn static_pods_and_full_names() {
        let mut p = pod("1", "etcd-node1");
        assert!(!is_static_pod(&p));
        p.metadata.annotations =
            Some([(CONFIG_SOURCE_ANNOTATION.to_string(), "file".to_string())].into());
        assert!(is_static_pod(&p));
        p.metadata.annotations =
            Some([(CONFIG_SOURCE_ANNOTATION.to_string(), "api".to_string())].into());
        assert!(!is_static_pod(&p));
        assert_eq!(pod_full_name(&p), "etcd-node1_kube-system");
        assert!(!is_mirror_pod(&p));
        p.metadata.annotations =
            Some([(CONFIG_MIRROR_ANNOTATION.to_string(), "hash".to_string())].into());
        assert!(is_mirror_pod(&p));
        assert_eq!(format_pod(&p), "etcd-node1_kube-system(1)");
    }
}
