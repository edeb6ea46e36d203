//! Cluster DNS on a node: `nodus node` serves the cluster's names ([`nodus_dns`]) on its own
//! address and, once the server answers, announces it in its Node's
//! `dns.nodus.io/serving` annotation; the control plane's clusterdns controller makes the
//! announcing nodes the endpoints of the `kube-dns` Service that pods' resolv.conf names.
//! On a clean stop the annotation is withdrawn so no pod is sent to a node that left.

use std::net::SocketAddr;
use std::path::Path;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodus_control_plane::controllers::clusterdns::DNS_ANNOTATION;

/// Sets (or, with `None`, removes) this node's announcement, retrying while the Node is
/// not registered yet.
async fn announce(client: &kube::Client, node: &str, addr: Option<SocketAddr>) {
    let nodes: Api<Node> = Api::all(client.clone());
    let value = addr.map(|a| a.to_string());
    let patch = serde_json::json!({"metadata": {"annotations": {DNS_ANNOTATION: value}}});
    for attempt in 0.. {
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node, serving = ?addr, "cluster DNS announced on the Node");
                return;
            }
            // Withdrawing is best effort: the node is stopping.
            Err(e) if addr.is_none() || attempt > 600 => {
                tracing::warn!(node, error = %e, "updating the Node's {DNS_ANNOTATION} failed");
                return;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
        }
    }
}

async fn client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await?;
    Ok(kube::Client::try_from(cfg)?)
}

/// Serves cluster DNS on `listen` until `stop` fires. A server that cannot start (the port
/// taken on this address) is logged, not fatal: pods on this node then resolve through the
/// other nodes' servers behind the same Service.
pub fn start(
    kubeconfig: &Path,
    node: &str,
    listen: SocketAddr,
    cluster_domain: String,
    resolv_conf: std::path::PathBuf,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    let kubeconfig = kubeconfig.to_path_buf();
    let node = node.to_string();
    tokio::spawn(async move {
        let config = nodus_dns::DnsConfig {
            kubeconfig: Some(kubeconfig.clone()),
            listen: vec![listen],
            cluster_domain,
            resolv_conf,
            ..Default::default()
        };
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
        let server = nodus_dns::run_until_bound(config, Some(bound_tx), async move {
            let _ = stop.await;
        });
        tokio::pin!(server);
        let client = match client(&kubeconfig).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cluster DNS: no API client; not serving");
                return;
            }
        };
        let announced = tokio::select! {
            r = &mut server => {
                if let Err(e) = r {
                    tracing::error!(error = %e, %listen, "cluster DNS did not start on this node");
                }
                return;
            }
            b = bound_rx => b.is_ok(),
        };
        // The server keeps answering while the announcement waits for the Node to register.
        let announcing = announced.then(|| {
            let (client, node) = (client.clone(), node.clone());
            tokio::spawn(async move { announce(&client, &node, Some(listen)).await })
        });
        if let Err(e) = server.await {
            tracing::error!(error = %e, "cluster DNS stopped");
        }
        if let Some(a) = announcing {
            a.abort();
            announce(&client, &node, None).await;
        }
    })
}
