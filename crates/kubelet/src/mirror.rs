//! Mirror pods (upstream's pkg/kubelet/pod/mirror_client.go and the syncPod/housekeeping
//! parts that call it): every static pod gets a read-only copy in the API server, named as
//! the static pod (`<name>-<node>`), annotated `kubernetes.io/config.mirror: <config hash>`
//! and owned by the Node (`controller: true`), so `kubectl get pods` shows what the node
//! runs on its own.
//!
//! A deleted mirror is created again; a mirror whose hash no longer matches the static pod
//! (the manifest changed) or that is being deleted is deleted and replaced; a mirror with
//! no static pod behind it is deleted. Its status is written by the status sync.

use crate::config::{self, CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION, MirrorPods};
use crate::pod::PodManager;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

/// How often mirrors are reconciled besides the API's own changes (the housekeeping period).
const PERIOD: Duration = Duration::from_secs(2);

pub struct MirrorManager {
    pub client: kube::Client,
    pub node: String,
    pub node_uid: tokio::sync::watch::Receiver<Option<String>>,
    pub pods: PodManager,
    pub mirrors: MirrorPods,
}

/// The config hash of a static pod (its UID, as the file source derives it).
fn hash_of(pod: &Pod) -> Option<String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION).cloned())
        .or_else(|| pod.metadata.uid.clone())
}

fn mirror_hash(mirror: &Pod) -> Option<&str> {
    mirror
        .metadata
        .annotations
        .as_ref()?
        .get(CONFIG_MIRROR_ANNOTATION)
        .map(String::as_str)
}

/// The mirror pod of `pod`, owned by the node `node` (uid `node_uid`).
pub fn mirror_of(pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let mut annotations: BTreeMap<String, String> =
        pod.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(
        CONFIG_MIRROR_ANNOTATION.into(),
        hash_of(pod).unwrap_or_default(),
    );
    let mut spec = pod.spec.clone();
    if let Some(s) = spec.as_mut() {
        s.node_name = Some(node.to_string());
    }
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_string(),
                uid: node_uid.to_string(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

impl MirrorManager {
    pub async fn run(self) {
        let changed = std::sync::Arc::clone(&self.mirrors.changed);
        loop {
            tokio::select! {
                _ = changed.notified() => {}
                _ = tokio::time::sleep(PERIOD) => {}
            }
            self.reconcile().await;
        }
    }

    async fn reconcile(&self) {
        if !self.mirrors.synced() {
            return;
        }
        let Some(node_uid) = self.node_uid.borrow().clone() else {
            return;
        };
        let statics: Vec<_> = self
            .pods
            .all()
            .into_iter()
            .filter(|p| config::is_static_pod(p))
            .collect();
        let wanted: HashSet<String> = statics.iter().map(|p| config::pod_full_name(p)).collect();
        for pod in &statics {
            let full = config::pod_full_name(pod);
            let existing = self.mirrors.get(&full);
            let hash = hash_of(pod);
            match existing {
                Some(m)
                    if m.metadata.deletion_timestamp.is_none()
                        && mirror_hash(&m) == hash.as_deref() =>
                {
                    continue;
                }
                Some(m) => {
                    tracing::info!(pod = %full, "Deleting mirror pod because it is outdated");
                    self.delete(&m).await;
                    continue;
                }
                None => {}
            }
            // A static pod on its way out gets no new mirror.
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            self.create(pod, &node_uid).await;
        }
        for m in self.mirrors.all() {
            if !wanted.contains(&config::pod_full_name(&m))
                && m.metadata.deletion_timestamp.is_none()
            {
                tracing::info!(pod = %config::pod_full_name(&m), "Deleting orphaned mirror pod");
                self.delete(&m).await;
            }
        }
    }

    async fn create(&self, pod: &Pod, node_uid: &str) {
        let mirror = mirror_of(pod, &self.node, node_uid);
        let ns = mirror.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api.create(&PostParams::default(), &mirror).await {
            Ok(_) => {
                tracing::info!(pod = %config::pod_full_name(pod), "Creating a mirror pod for static pod")
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                tracing::warn!(pod = %config::pod_full_name(pod), error = %e, "Failed creating a mirror pod");
            }
        }
    }

    async fn delete(&self, mirror: &Pod) {
        let (Some(name), Some(uid)) = (&mirror.metadata.name, &mirror.metadata.uid) else {
            return;
        };
        let ns = mirror.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                tracing::warn!(pod = %config::pod_full_name(mirror), error = %e, "Failed deleting a mirror pod");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_carries_hash_owner_and_node() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "etcd-n1", "namespace": "kube-system", "uid": "abc",
                "labels": {"app": "etcd"},
                "annotations": {"kubernetes.io/config.hash": "abc", "kubernetes.io/config.source": "file"}
            },
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let m = mirror_of(&pod, "n1", "node-uid");
        assert_eq!(m.metadata.name.as_deref(), Some("etcd-n1"));
        assert_eq!(m.metadata.uid, None);
        let a = m.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[CONFIG_MIRROR_ANNOTATION], "abc");
        assert_eq!(mirror_hash(&m), Some("abc"));
        let o = &m.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                o.kind.as_str(),
                o.name.as_str(),
                o.uid.as_str(),
                o.controller
            ),
            ("Node", "n1", "node-uid", Some(true))
        );
        assert_eq!(m.spec.unwrap().node_name.as_deref(), Some("n1"));
        assert!(m.status.is_none());
        assert!(config::is_mirror_pod(&mirror_of(&pod, "n1", "u")));
    }
}
