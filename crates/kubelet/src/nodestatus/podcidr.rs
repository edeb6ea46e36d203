//! The Node's pod CIDR handed to the runtime (upstream's kubelet updatePodCIDR): when
//! `spec.podCIDRs` is set or changes, the CRI `UpdateRuntimeConfig` carries it, joined
//! with commas, and the runtime builds its default pod network from it. Upstream checks in
//! each node status update; nodus also watches its own Node so the CIDR reaches the
//! runtime as soon as the IPAM controller sets it, before the first pods get addresses.

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;

/// The pod CIDR last accepted by the runtime.
pub(crate) struct PodCidr {
    rt: crate::cri::Runtime,
    current: tokio::sync::Mutex<String>,
}

/// `spec.podCIDRs` as the runtime takes it (`10.88.1.0/24,fd00:88:0:1::/64`), falling back
/// to the single-stack `spec.podCIDR`.
pub(crate) fn node_pod_cidr(node: &Node) -> String {
    let spec = node.spec.as_ref();
    match spec.and_then(|s| s.pod_cidrs.as_ref()) {
        Some(c) if !c.is_empty() => c.join(","),
        _ => spec.and_then(|s| s.pod_cidr.clone()).unwrap_or_default(),
    }
}

impl PodCidr {
    pub(crate) fn new(rt: crate::cri::Runtime) -> PodCidr {
        PodCidr {
            rt,
            current: tokio::sync::Mutex::new(String::new()),
        }
    }

    /// Sends the Node's pod CIDR to the runtime if it differs from the last one sent.
    pub(crate) async fn update(&self, node: &Node) {
        let cidr = node_pod_cidr(node);
        let mut current = self.current.lock().await;
        if cidr.is_empty() || *current == cidr {
            return;
        }
        use cri::runtime::v1 as pb;
        tracing::info!(cidr = %cidr, "Updating runtime config through cri with podcidr");
        let req = pb::UpdateRuntimeConfigRequest {
            runtime_config: Some(pb::RuntimeConfig {
                network_config: Some(pb::NetworkConfig {
                    pod_cidr: cidr.clone(),
                }),
            }),
        };
        match self.rt.runtime.clone().update_runtime_config(req).await {
            Ok(_) => {
                tracing::info!(original_pod_cidr = %current, new_pod_cidr = %cidr, "Updating Pod CIDR");
                *current = cidr;
            }
            // Kept unset: the next status update tries again.
            Err(e) => {
                tracing::error!(error = %e.message(), cidr = %cidr, "Error updating pod CIDR: failed to update pod CIDR")
            }
        }
    }

    /// Follows the Node named `name` and passes on each new pod CIDR.
    pub(crate) async fn watch(&self, client: kube::Client, name: String) {
        let api = kube::Api::<Node>::all(client);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher(api, cfg).default_backoff().applied_objects();
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(node) = ev {
                self.update(&node).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    #[test]
    fn pod_cidrs_join_dual_stack_and_fall_back_to_pod_cidr() {
        let node = |pod_cidr: Option<&str>, pod_cidrs: Option<Vec<&str>>| Node {
            spec: Some(NodeSpec {
                pod_cidr: pod_cidr.map(String::from),
                pod_cidrs: pod_cidrs.map(|v| v.into_iter().map(String::from).collect()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(node_pod_cidr(&Node::default()), "");
        assert_eq!(
            node_pod_cidr(&node(Some("10.88.1.0/24"), None)),
            "10.88.1.0/24"
        );
        assert_eq!(
            node_pod_cidr(&node(
                Some("10.88.1.0/24"),
                Some(vec!["10.88.1.0/24", "fd00:88:0:1::/64"])
            )),
            "10.88.1.0/24,fd00:88:0:1::/64"
        );
    }
}
