//! Shared server state handed to every handler.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use crate::apiserver::authn::User;
use crate::apiserver::authn::serviceaccount::{DEFAULT_ISSUER, Keys};
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
    /// `--authorization-mode`, in order.
    pub authorization_modes: Vec<crate::apiserver::authz::Mode>,
    /// `--service-account-issuer`: the `iss` of service-account tokens and the OIDC issuer.
    pub service_account_issuer: String,
    /// `--api-audiences`: the audiences the API server accepts tokens for (default: the
    /// issuer, as upstream).
    pub api_audiences: Vec<String>,
    /// How many watch events, and how many bytes of them, are kept at most.
    pub watch_history: crate::storage::HistoryLimit,
    /// `--max-requests-inflight` (400; 0: no limit).
    pub max_requests_inflight: usize,
    /// `--max-mutating-requests-inflight` (200; 0: no limit).
    pub max_mutating_requests_inflight: usize,
    /// Timeouts and the connection limit of the secure port.
    pub serving: nodus_serving::conn::Limits,
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
            authorization_modes: vec![
                crate::apiserver::authz::Mode::Node,
                crate::apiserver::authz::Mode::Rbac,
            ],
            service_account_issuer: DEFAULT_ISSUER.to_string(),
            api_audiences: vec![DEFAULT_ISSUER.to_string()],
            watch_history: Default::default(),
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
            serving: Default::default(),
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
    /// The authorizer chain (`--authorization-mode`).
    pub authz: crate::apiserver::authz::Chain,
    /// The service-account token signing key (`pki/sa.key`).
    pub sa_keys: Arc<Keys>,
    /// Serialises Service IP and port allocation, which reads then writes many objects.
    pub alloc_lock: tokio::sync::Mutex<()>,
    /// `/metrics`: request counts and latencies, in-flight requests, watch events.
    pub metrics: crate::apiserver::metrics::ApiMetrics,
    /// The kubelets' resource metrics behind `metrics.k8s.io`.
    pub resource_metrics: crate::apiserver::metrics_api::Scraped,
    /// What admission reads on every create, kept by a watch (upstream's informers).
    pub listers: crate::apiserver::listers::Listers,
    /// The identity aggregated APIs are proxied with.
    pub aggregator: crate::apiserver::aggregator::Aggregator,
}

pub type SharedState = Arc<ApiState>;
