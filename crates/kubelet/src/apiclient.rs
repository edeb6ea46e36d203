//! The kubelet's connection to the API server: a kube-rs client built from `--kubeconfig`.
//!
//! Every part of the kubelet that talks to the API (node status and lease, the API pod
//! source, status sync, mirror pods, configMap/secret volumes, events) shares one client,
//! so one TLS identity (`system:node:<name>`) and one connection pool serve them all.

use std::path::Path;

/// Why the kubeconfig could not become a client.
#[derive(Debug, thiserror::Error)]
pub enum ApiClientError {
    #[error("kubeconfig {path}: {err}")]
    Kubeconfig { path: String, err: String },
    #[error("kubeconfig {path}: cannot build a client: {err}")]
    Client { path: String, err: String },
}

/// A client for the cluster named by the kubeconfig at `path` (its current context).
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, ApiClientError> {
    let shown = path.display().to_string();
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| ApiClientError::Kubeconfig {
        path: shown.clone(),
        err: e.to_string(),
    })?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| ApiClientError::Kubeconfig {
                path: shown.clone(),
                err: e.to_string(),
            })?;
    kube::Client::try_from(config).map_err(|e| ApiClientError::Client {
        path: shown,
        err: e.to_string(),
    })
}
