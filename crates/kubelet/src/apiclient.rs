//! The kubelet's connection to the API server: a kube-rs client built from `--kubeconfig`.
//!
//! Every part of the kubelet that talks to the API (node status and lease, the API pod
//! source, status sync, mirror pods, configMap/secret volumes, events) shares one client,
//! so one TLS identity (`system:node:<name>`) and one connection pool serve them all.
//!
//! When the kubeconfig names its client certificate by file (as the one TLS bootstrap
//! writes does: `kubelet-client-current.pem`), the certificate is read again whenever the
//! file changes, so a rotated certificate is presented by every new connection without a
//! restart (upstream's dynamic client certificate). Connections already open keep the
//! identity they authenticated with, which the API server checked at their handshake.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use kube::client::ConfigExt as _;
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;

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
    let cert_files = client_cert_files(&kc, path);
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| ApiClientError::Kubeconfig {
                path: shown.clone(),
                err: e.to_string(),
            })?;
    let client_err = |e: String| ApiClientError::Client {
        path: shown.clone(),
        err: e,
    };
    let Some((cert, key)) = cert_files else {
        return kube::Client::try_from(config).map_err(|e| client_err(e.to_string()));
    };
    let resolver = ReloadingClientCert::new(cert, key).map_err(client_err)?;
    with_client_cert(config, Arc::new(resolver)).map_err(client_err)
}

/// The files of the current user's `client-certificate`/`client-key`, relative paths taken
/// from the kubeconfig's directory as kubectl does; None for inline data or other auth.
fn client_cert_files(kc: &kube::config::Kubeconfig, path: &Path) -> Option<(PathBuf, PathBuf)> {
    let ctx_name = kc.current_context.as_deref()?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)?
        .context
        .as_ref()?;
    let user = kc
        .auth_infos
        .iter()
        .find(|a| a.name == ctx.user.as_deref().unwrap_or_default())?
        .auth_info
        .as_ref()?;
    let base = path.parent().unwrap_or(Path::new("."));
    let cert = base.join(user.client_certificate.as_deref()?);
    let key = base.join(user.client_key.as_deref()?);
    Some((cert, key))
}

/// A kube client like `kube::Client::try_from(config)`, whose TLS client identity comes
/// from `resolver` at each handshake.
fn with_client_cert(
    config: kube::Config,
    resolver: Arc<dyn ResolvesClientCert>,
) -> Result<kube::Client, String> {
    use tower::ServiceBuilder;
    let mut tls = config.rustls_client_config().map_err(|e| e.to_string())?;
    tls.client_auth_cert_resolver = resolver;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let http_client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(|e| e.to_string())?)
        .layer(config.extra_headers_layer().map_err(|e| e.to_string())?)
        .map_err(tower::BoxError::from)
        .service(http_client);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// The client certificate and key from their files, re-read when the certificate file's
/// modification time changes (checked at each new connection: one stat).
#[derive(Debug)]
struct ReloadingClientCert {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<(Option<SystemTime>, Arc<CertifiedKey>)>,
}

impl ReloadingClientCert {
    fn new(cert: PathBuf, key: PathBuf) -> Result<Self, String> {
        let mtime = modified(&cert);
        let ck = load(&cert, &key)?;
        Ok(ReloadingClientCert {
            cert,
            key,
            loaded: Mutex::new((mtime, Arc::new(ck))),
        })
    }

    fn current(&self) -> Option<Arc<CertifiedKey>> {
        let mut loaded = self.loaded.lock().ok()?;
        let mtime = modified(&self.cert);
        if mtime != loaded.0 {
            match load(&self.cert, &self.key) {
                Ok(ck) => {
                    tracing::info!(path = %self.cert.display(), "client certificate changed on disk; new connections present it");
                    *loaded = (mtime, Arc::new(ck));
                }
                // A half-written rotation keeps the previous certificate.
                Err(e) => {
                    tracing::warn!(error = %e, "reloading the client certificate failed; keeping the current one")
                }
            }
        }
        Some(Arc::clone(&loaded.1))
    }
}

impl ResolvesClientCert for ReloadingClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let cert_pem = read(cert)?;
    let key_pem = read(key)?;
    let chain: Vec<_> = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate", cert.display()));
    }
    let der = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|e| format!("{}: {e}", key.display()))?
        .ok_or_else(|| format!("{}: no private key", key.display()))?;
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let signer = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| format!("{}: {e}", key.display()))?;
    Ok(CertifiedKey::new(chain, signer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cn: &str) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn cn_of(ck: &CertifiedKey) -> String {
        nodus_serving::x509::identity(ck.cert[0].as_ref())
            .unwrap()
            .0
    }

    #[test]
    fn a_rotated_certificate_is_presented_by_the_next_handshake() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kubelet-client-current.pem");
        let (c, k) = pair("system:node:old");
        std::fs::write(&file, format!("{c}{k}")).unwrap();
        let r = ReloadingClientCert::new(file.clone(), file.clone()).unwrap();
        assert_eq!(cn_of(&r.current().unwrap()), "system:node:old");
        // Rotation replaces the file (a new mtime): the next resolve reads it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (c, k) = pair("system:node:new");
        let tmp = dir.path().join("tmp.pem");
        std::fs::write(&tmp, format!("{c}{k}")).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        assert_eq!(cn_of(&r.current().unwrap()), "system:node:new");
        // A broken file keeps the last good certificate.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&file, "garbage").unwrap();
        assert_eq!(cn_of(&r.current().unwrap()), "system:node:new");
    }
}
