//! Shared server state handed to every handler.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use crate::apiserver::auth::User;
use crate::storage::Store;

/// Tunables of the API server, with kube-apiserver's defaults.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// `--service-cluster-ip-range`, default 10.96.0.0/12.
    pub service_cidr: (Ipv4Addr, u8),
    /// `--service-node-port-range`, default 30000-32767.
    pub node_port_range: (u16, u16),
    /// The address other components reach the API server at (the `kubernetes` Endpoints).
    pub advertise_address: IpAddr,
    pub secure_port: u16,
    /// How often a watch asking for bookmarks gets one.
    pub bookmark_interval: Duration,
    /// How long watch events are kept for replay before compaction.
    pub event_retention: Duration,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            service_cidr: (Ipv4Addr::new(10, 96, 0, 0), 12),
            node_port_range: (30000, 32767),
            advertise_address: IpAddr::from([127, 0, 0, 1]),
            secure_port: 6443,
            bookmark_interval: Duration::from_secs(60),
            event_retention: Duration::from_secs(300),
        }
    }
}

/// Everything a request handler needs.
pub struct ApiState {
    pub store: Arc<dyn Store>,
    pub config: ApiConfig,
    /// Bearer tokens from the static token file.
    pub tokens: HashMap<String, User>,
    /// The cluster CA in PEM, to verify kubelets when proxying to them.
    pub ca_pem: String,
    /// TLS towards kubelets: the cluster CA as roots, the kubelet-client certificate.
    pub kubelet_tls: Option<Arc<rustls::ClientConfig>>,
    /// Serialises Service IP and port allocation, which reads then writes many objects.
    pub alloc_lock: tokio::sync::Mutex<()>,
}

pub type SharedState = Arc<ApiState>;
