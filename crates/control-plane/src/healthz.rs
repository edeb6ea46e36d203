//! The secure port of kube-controller-manager (10257) and kube-scheduler (10259): `/healthz`,
//! `/livez` and `/readyz`, which kubeadm's static pods probe.
//!
//! As upstream with no `--tls-cert-file`, the component serves a self-signed certificate made
//! in memory at start (the kubelet's prober does not verify certificates), and the health
//! paths are open to anyone (upstream's `--authorization-always-allow-paths` default). The
//! answer comes from the component's own runtime, so a wedged process fails its probe.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::apiserver::server::ServerError;

/// kube-controller-manager's default `--secure-port`.
pub const CONTROLLER_MANAGER_PORT: u16 = 10257;
/// kube-scheduler's default `--secure-port`.
pub const SCHEDULER_PORT: u16 = 10259;

/// Binds `addr` and serves the health paths over HTTPS until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    component: &'static str,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<SocketAddr, ServerError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|err| ServerError::Bind { addr, err })?;
    let bound = listener
        .local_addr()
        .map_err(|err| ServerError::Bind { addr, err })?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(self_signed(component)?));
    let ok = || async { "ok" };
    let app = Router::new()
        .route("/healthz", get(ok))
        .route("/livez", get(ok))
        .route("/readyz", get(ok));
    tokio::spawn(async move {
        use tower::ServiceExt as _;
        let service = move |_cert: Option<CertificateDer<'static>>| {
            let app = app.clone();
            move |req: hyper::Request<hyper::body::Incoming>| {
                app.clone().oneshot(req.map(axum::body::Body::new))
            }
        };
        let limits = nodus_serving::conn::Limits::default();
        nodus_serving::conn::serve(listener, Some(acceptor), limits, service, shutdown).await;
    });
    tracing::info!(component, addr = %bound, "serving securely");
    Ok(bound)
}

/// Upstream's `GenerateSelfSignedCertKey`: CN `localhost@<unix time>`, for localhost and
/// 127.0.0.1.
fn self_signed(component: &str) -> Result<rustls::ServerConfig, ServerError> {
    let err = |e: &dyn std::fmt::Display| {
        ServerError::Tls(format!(
            "{component}'s self-signed serving certificate: {e}"
        ))
    };
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .map_err(|e| err(&e))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("localhost@{now}"));
    let key = rcgen::KeyPair::generate().map_err(|e| err(&e))?;
    let cert = params.self_signed(&key).map_err(|e| err(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&e))?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|e| err(&e))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_ok_over_https_to_a_client_that_does_not_verify() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            "kube-scheduler",
            std::future::pending(),
        )
        .await
        .unwrap();
        let client = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .unwrap();
        for path in ["/healthz", "/livez", "/readyz"] {
            let resp = client
                .get(format!("https://{addr}{path}"))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{path}");
            assert_eq!(resp.text().await.unwrap(), "ok");
        }
        let plain = reqwest::get(format!("http://{addr}/healthz")).await;
        assert!(
            plain.map(|r| !r.status().is_success()).unwrap_or(true),
            "plain HTTP is not served"
        );
        let taken = serve(addr, "kube-scheduler", std::future::pending()).await;
        assert!(
            matches!(&taken, Err(e) if e.to_string().starts_with(&format!("listening on {addr}: "))),
            "{taken:?}"
        );
    }
}
