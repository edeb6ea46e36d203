//! The kubelet's certificates from the cluster's CSR API (upstream's
//! `pkg/kubelet/certificate` and its `bootstrap` package): TLS bootstrap of the client
//! certificate with `--bootstrap-kubeconfig`, the serving certificate
//! (`--rotate-server-certificates` / `serverTLSBootstrap`), and when each is due for
//! renewal. Certificates and keys live together, mode 0600, in `<cert-dir>/kubelet-client-*.pem`
//! and `kubelet-server-*.pem`, with `*-current.pem` symlinks to the newest, as upstream.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, ObjectMeta, PostParams};

pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{0}")]
    Invalid(String),
    #[error("certificate signing request {name}: {err}")]
    Api { name: String, err: String },
    #[error("certificate signing request {name} was denied: {reason}: {message}")]
    Denied {
        name: String,
        reason: String,
        message: String,
    },
    #[error("certificate signing request {name} failed: {reason}: {message}")]
    Failed {
        name: String,
        reason: String,
        message: String,
    },
    #[error("timed out waiting for certificate signing request {0} to be issued")]
    Timeout(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CertificateError + '_ {
    move |err| CertificateError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// What the certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Client,
    Server,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Client => "kubelet-client",
            Kind::Server => "kubelet-server",
        }
    }
    fn signer(self) -> &'static str {
        match self {
            Kind::Client => CLIENT_SIGNER,
            Kind::Server => SERVING_SIGNER,
        }
    }
    /// ECDSA keys: no key encipherment, as upstream's kubelet asks for non-RSA keys.
    fn usages(self) -> Vec<String> {
        let last = match self {
            Kind::Client => "client auth",
            Kind::Server => "server auth",
        };
        vec!["digital signature".into(), last.into()]
    }
}

/// `<cert-dir>/kubelet-{client,server}-current.pem`.
pub fn current_path(cert_dir: &Path, kind: Kind) -> PathBuf {
    cert_dir.join(format!("{}-current.pem", kind.prefix()))
}

/// notBefore and notAfter of the first certificate in a PEM file's text.
fn validity(pem: &str) -> Option<(SystemTime, SystemTime)> {
    let der = rustls_pemfile::certs(&mut pem.as_bytes()).next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let at = |t: i64| Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t).ok()?));
    Some((
        at(cert.validity().not_before.timestamp())?,
        at(cert.validity().not_after.timestamp())?,
    ))
}

/// Upstream's rotation deadline: a random point between 70 % and 90 % of the certificate's
/// life, so a fleet of kubelets does not renew at once. `jitter` is in [0, 1).
pub fn rotation_deadline(not_before: SystemTime, not_after: SystemTime, jitter: f64) -> SystemTime {
    let life = not_after
        .duration_since(not_before)
        .unwrap_or_default()
        .as_secs_f64();
    not_before + Duration::from_secs_f64(life * (0.7 + 0.2 * jitter.clamp(0.0, 1.0)))
}

/// When the current certificate of `kind` should be renewed; `None` when there is none
/// or it does not parse.
pub fn renewal_due(cert_dir: &Path, kind: Kind) -> Option<SystemTime> {
    let pem = std::fs::read_to_string(current_path(cert_dir, kind)).ok()?;
    let (nb, na) = validity(&pem)?;
    // Any spread will do: the jitter only keeps a fleet from renewing at the same moment.
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    Some(rotation_deadline(nb, na, f64::from(nanos % 1000) / 1000.0))
}

/// Whether the current certificate of `kind` exists and is still valid now.
pub fn current_valid(cert_dir: &Path, kind: Kind) -> bool {
    std::fs::read_to_string(current_path(cert_dir, kind))
        .ok()
        .and_then(|p| validity(&p))
        .is_some_and(|(nb, na)| {
            let now = SystemTime::now();
            nb <= now && now < na
        })
}

fn write_private(path: &Path, contents: &[u8]) -> Result<(), CertificateError> {
    nodus_serving::private::write(path, contents).map_err(io(path))
}

/// Stores a new certificate and key as `<prefix>-<unix time>.pem` and points
/// `<prefix>-current.pem` at it.
fn store(
    cert_dir: &Path,
    kind: Kind,
    cert_pem: &str,
    key_pem: &str,
) -> Result<PathBuf, CertificateError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(cert_dir).map_err(io(cert_dir))?;
    let _ = std::fs::set_permissions(cert_dir, std::fs::Permissions::from_mode(0o700));
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let name = format!("{}-{stamp}.pem", kind.prefix());
    write_private(
        &cert_dir.join(&name),
        format!("{cert_pem}{key_pem}").as_bytes(),
    )?;
    let current = current_path(cert_dir, kind);
    let tmp = cert_dir.join(format!(".{}-current.tmp", kind.prefix()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&name, &tmp).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &current).map_err(io(&current))?;
    Ok(current)
}

/// Submits a CSR for `node` of `kind` through `client` and waits for the signed
/// certificate; stores it in `cert_dir` and returns the `-current.pem` path.
pub async fn request(
    client: kube::Client,
    cert_dir: &Path,
    node: &str,
    kind: Kind,
    ips: &[IpAddr],
    timeout: Duration,
) -> Result<PathBuf, CertificateError> {
    let bad = |e: rcgen::Error| CertificateError::Invalid(format!("certificate request: {e}"));
    let key = rcgen::KeyPair::generate().map_err(bad)?;
    let dns = match kind {
        Kind::Client => Vec::new(),
        Kind::Server => vec![node.to_string()],
    };
    let mut params = rcgen::CertificateParams::new(dns).map_err(bad)?;
    if kind == Kind::Server {
        params
            .subject_alt_names
            .extend(ips.iter().copied().map(rcgen::SanType::IpAddress));
    }
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "system:nodes");
    dn.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name = dn;
    let csr_pem = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(bad)?;
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some(match kind {
                Kind::Client => "node-csr-".into(),
                Kind::Server => "csr-".into(),
            }),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: kind.signer().into(),
            usages: Some(kind.usages()),
            ..Default::default()
        },
        status: None,
    };
    let created = csrs
        .create(&PostParams::default(), &csr)
        .await
        .map_err(|e| CertificateError::Api {
            name: "(new)".into(),
            err: e.to_string(),
        })?;
    let name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, signer = kind.signer(), "certificate signing request submitted");
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match csrs.get(&name).await {
            Ok(c) => {
                let status = c.status.unwrap_or_default();
                for cond in status.conditions.iter().flatten() {
                    let reason = cond.reason.clone().unwrap_or_default();
                    let message = cond.message.clone().unwrap_or_default();
                    match cond.type_.as_str() {
                        "Denied" => {
                            return Err(CertificateError::Denied {
                                name,
                                reason,
                                message,
                            });
                        }
                        "Failed" => {
                            return Err(CertificateError::Failed {
                                name,
                                reason,
                                message,
                            });
                        }
                        _ => {}
                    }
                }
                if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
                    let cert = String::from_utf8(cert.0).map_err(|e| {
                        CertificateError::Invalid(format!("issued certificate: {e}"))
                    })?;
                    let path = store(cert_dir, kind, &cert, &key.serialize_pem())?;
                    tracing::info!(csr = %name, path = %path.display(), "certificate issued");
                    return Ok(path);
                }
            }
            Err(e) => tracing::debug!(csr = %name, error = %e, "waiting for the certificate"),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CertificateError::Timeout(name));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The kubeconfig upstream's TLS bootstrap writes: the bootstrap kubeconfig's cluster and
/// the client certificate file (certificate and key in one).
fn client_kubeconfig(
    server: &str,
    ca_data: Option<&str>,
    ca_file: Option<&str>,
    cert: &Path,
) -> String {
    let mut cluster = serde_json::json!({"server": server});
    if let Some(d) = ca_data {
        cluster["certificate-authority-data"] = serde_json::json!(d);
    } else if let Some(f) = ca_file {
        cluster["certificate-authority"] = serde_json::json!(f);
    }
    let cert = cert.display().to_string();
    serde_yaml::to_string(&serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": cluster}],
        "contexts": [{"name": "default-context", "context": {
            "cluster": "default-cluster", "namespace": "default", "user": "default-auth"}}],
        "current-context": "default-context",
        "preferences": {},
        "users": [{"name": "default-auth", "user": {
            "client-certificate": cert, "client-key": cert}}],
    }))
    .unwrap_or_default()
}

/// Upstream's `LoadClientCert`: when `kubeconfig` is missing or its certificate is no
/// longer valid, obtain a client certificate with the bootstrap kubeconfig's credentials
/// and write `kubeconfig` pointing at `<cert-dir>/kubelet-client-current.pem`.
pub async fn bootstrap_client(
    kubeconfig: &Path,
    bootstrap_kubeconfig: &Path,
    cert_dir: &Path,
    node: &str,
) -> Result<(), CertificateError> {
    if kubeconfig.exists() && current_valid(cert_dir, Kind::Client) {
        return Ok(());
    }
    if kubeconfig.exists() && !current_path(cert_dir, Kind::Client).exists() {
        // A kubeconfig we did not write (credentials of its own): use it as it is.
        return Ok(());
    }
    let kc = kube::config::Kubeconfig::read_from(bootstrap_kubeconfig).map_err(|e| {
        CertificateError::Invalid(format!("{}: {e}", bootstrap_kubeconfig.display()))
    })?;
    let cluster = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| {
            CertificateError::Invalid(format!("{}: no cluster", bootstrap_kubeconfig.display()))
        })?;
    let server = cluster.server.clone().unwrap_or_default();
    let client = crate::apiclient::client_from_kubeconfig(bootstrap_kubeconfig)
        .await
        .map_err(|e| CertificateError::Invalid(e.to_string()))?;
    let cert = request(
        client,
        cert_dir,
        node,
        Kind::Client,
        &[],
        Duration::from_secs(15 * 60),
    )
    .await?;
    let text = client_kubeconfig(
        &server,
        cluster.certificate_authority_data.as_deref(),
        cluster.certificate_authority.as_deref(),
        &cert,
    );
    if let Some(dir) = kubeconfig.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    write_private(kubeconfig, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_deadline_falls_between_70_and_90_percent() {
        let nb = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let na = nb + Duration::from_secs(1_000);
        let at = |j: f64| {
            rotation_deadline(nb, na, j)
                .duration_since(nb)
                .unwrap()
                .as_secs()
        };
        assert_eq!(at(0.0), 700);
        assert_eq!(at(0.5), 800);
        assert_eq!(at(0.999_999), 899);
        assert_eq!(at(7.0), 900);
    }

    #[test]
    fn stored_certificates_are_private_and_current_follows_the_newest() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["n".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem();
        let cur = store(dir.path(), Kind::Client, &cert, &key.serialize_pem()).unwrap();
        assert_eq!(cur, current_path(dir.path(), Kind::Client));
        let target = std::fs::canonicalize(&cur).unwrap();
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(&cur).unwrap();
        assert!(text.contains("BEGIN CERTIFICATE") && text.contains("PRIVATE KEY"));
        assert!(current_valid(dir.path(), Kind::Client));
        assert!(!current_valid(dir.path(), Kind::Server));
        let kc = client_kubeconfig("https://10.0.0.1:6443", Some("Q0E="), None, &cur);
        assert!(
            kc.contains("client-certificate: ") && kc.contains("kubelet-client-current.pem"),
            "{kc}"
        );
        assert!(!kc.contains("token"), "{kc}");
    }
}
