//! Who may use the kubelet API on :10250, as upstream's kubelet decides it
//! (pkg/kubelet/server/auth.go and the kubelet's authn/authz builders).
//!
//! Authentication: a client certificate signed by `--client-ca-file` (CN the user, O the
//! groups), else a bearer token checked with a TokenReview against the API server
//! (`--authentication-token-webhook`, answers cached), else anonymous — which nodus refuses
//! by default (`--anonymous-auth=false`, the hardening the lesson asks for): 401.
//! Authorization: `AlwaysAllow`, or `Webhook`, a SubjectAccessReview for the node with the
//! subresource the path maps to (`/stats` → `nodes/stats`, `/metrics` → `nodes/metrics`,
//! `/logs` → `nodes/log`, `/spec` → `nodes/spec`, everything else `nodes/proxy`) and the
//! verb the HTTP method maps to; verdicts cached 5m (allowed) and 30s (denied).

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An authenticated identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    pub fn anonymous() -> UserInfo {
        UserInfo {
            name: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }
}

/// The identity a verified client certificate names: CN the user, each O a group.
pub fn user_from_cert(der: &[u8]) -> Option<UserInfo> {
    let (name, groups) = nodus_serving::x509::identity(der)?;
    Some(UserInfo {
        name,
        uid: String::new(),
        groups,
        extra: BTreeMap::new(),
    })
}

/// How requests are authorized (`--authorization-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthorizationMode {
    AlwaysAllow,
    Webhook,
}

impl std::str::FromStr for AuthorizationMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "AlwaysAllow" => Ok(AuthorizationMode::AlwaysAllow),
            "Webhook" => Ok(AuthorizationMode::Webhook),
            other => Err(format!(
                "authorization mode {other:?} is not supported: use AlwaysAllow or Webhook"
            )),
        }
    }
}

/// The authentication and authorization settings of the secure port.
#[derive(Clone, Debug)]
pub struct AuthSettings {
    pub node_name: String,
    pub anonymous: bool,
    pub token_webhook: bool,
    pub token_cache_ttl: Duration,
    pub mode: AuthorizationMode,
    pub authorized_ttl: Duration,
    pub unauthorized_ttl: Duration,
}

/// What the authorizer is asked (upstream's authorizer.AttributesRecord for the kubelet).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: String,
    pub subresource: String,
    pub path: String,
}

/// The verb an HTTP method means to the authorizer.
pub fn verb_for(method: &http::Method) -> &'static str {
    match *method {
        http::Method::POST => "create",
        http::Method::GET | http::Method::HEAD => "get",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "",
    }
}

/// The `nodes/<subresource>` a kubelet path is authorized as.
pub fn subresource_for(path: &str) -> &'static str {
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
    if under("/stats") {
        "stats"
    } else if under("/metrics") {
        "metrics"
    } else if under("/logs") {
        "log"
    } else if under("/spec") {
        "spec"
    } else {
        "proxy"
    }
}

pub fn attributes(method: &http::Method, path: &str) -> Attributes {
    Attributes {
        verb: verb_for(method).to_string(),
        subresource: subresource_for(path).to_string(),
        path: path.to_string(),
    }
}

/// Why a request was refused: 401 or 403 with upstream's texts.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Unauthorized,
    Forbidden(String),
    /// The API server could not be asked; upstream answers 500.
    Error(String),
}

type Cache<K, V> = Mutex<HashMap<K, (Instant, V)>>;

/// The authenticator and authorizer of the secure port.
pub struct Auth {
    pub settings: AuthSettings,
    client: Option<kube::Client>,
    tokens: Cache<String, Option<UserInfo>>,
    verdicts: Cache<(String, Vec<String>, Attributes), Result<(), String>>,
}

fn cached<K: std::hash::Hash + Eq, V: Clone>(c: &Cache<K, V>, k: &K) -> Option<V> {
    let m = c.lock().ok()?;
    let (until, v) = m.get(k)?;
    (Instant::now() < *until).then(|| v.clone())
}

fn remember<K: std::hash::Hash + Eq, V>(c: &Cache<K, V>, k: K, v: V, ttl: Duration) {
    if let Ok(mut m) = c.lock() {
        let now = Instant::now();
        // Keep the cache bounded by dropping what expired.
        if m.len() > 4096 {
            m.retain(|_, (until, _)| *until > now);
        }
        m.insert(k, (now + ttl, v));
    }
}

impl Auth {
    pub fn new(settings: AuthSettings, client: Option<kube::Client>) -> Auth {
        Auth {
            settings,
            client,
            tokens: Mutex::new(HashMap::new()),
            verdicts: Mutex::new(HashMap::new()),
        }
    }

    /// The user behind a request: its verified client certificate, else its bearer token,
    /// else anonymous when allowed.
    pub async fn authenticate(
        &self,
        cert_user: Option<UserInfo>,
        bearer: Option<&str>,
    ) -> Result<UserInfo, Refusal> {
        if let Some(u) = cert_user {
            return Ok(u);
        }
        if let Some(token) = bearer {
            if !self.settings.token_webhook {
                return Err(Refusal::Unauthorized);
            }
            return match self.review_token(token).await? {
                Some(u) => Ok(u),
                None => Err(Refusal::Unauthorized),
            };
        }
        if self.settings.anonymous {
            Ok(UserInfo::anonymous())
        } else {
            Err(Refusal::Unauthorized)
        }
    }

    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, Refusal> {
        use sha2::Digest as _;
        let key = hex::encode(sha2::Sha256::digest(token.as_bytes()));
        if let Some(v) = cached(&self.tokens, &key) {
            return Ok(v);
        }
        let Some(client) = self.client.clone() else {
            return Err(Refusal::Unauthorized);
        };
        let api: kube::Api<TokenReview> = kube::Api::all(client);
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let out = api
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview failed");
                Refusal::Unauthorized
            })?;
        let st = out.status.unwrap_or_default();
        let user = if st.authenticated == Some(true) {
            st.user.map(|u| UserInfo {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            })
        } else {
            None
        };
        // A refused token is asked again sooner than a good one (upstream's failure TTL).
        let ttl = if user.is_some() {
            self.settings.token_cache_ttl
        } else {
            Duration::from_secs(10).min(self.settings.token_cache_ttl)
        };
        remember(&self.tokens, key, user.clone(), ttl);
        Ok(user)
    }

    /// Whether `user` may do `attrs` on this node.
    pub async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), Refusal> {
        let forbidden = || {
            Refusal::Forbidden(format!(
                "Forbidden (user={}, verb={}, resource=nodes, subresource={})",
                user.name, attrs.verb, attrs.subresource
            ))
        };
        if self.settings.mode == AuthorizationMode::AlwaysAllow {
            return Ok(());
        }
        let key = (user.name.clone(), user.groups.clone(), attrs.clone());
        if let Some(v) = cached(&self.verdicts, &key) {
            return v.map_err(|reason| {
                tracing::debug!(user = %user.name, %reason, "kubelet API request denied (cached)");
                forbidden()
            });
        }
        let authz_error = |why: &dyn std::fmt::Display| {
            tracing::error!(user = %user.name, verb = %attrs.verb, subresource = %attrs.subresource, error = %why, "Authorization error");
            Refusal::Error(format!(
                "Authorization error (user={}, verb={}, resource=nodes, subresource={})",
                user.name, attrs.verb, attrs.subresource
            ))
        };
        let Some(client) = self.client.clone() else {
            return Err(authz_error(
                &"the Webhook authorizer has no API server to ask (no --kubeconfig)",
            ));
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(client);
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(attrs.verb.clone()),
                    group: Some(String::new()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(attrs.subresource.clone()),
                    name: Some(self.settings.node_name.clone()),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            },
            ..Default::default()
        };
        let out = api
            .create(&kube::api::PostParams::default(), &sar)
            .await
            .map_err(|e| authz_error(&format!("SubjectAccessReview failed: {e}")))?;
        let st = out.status.unwrap_or_default();
        let verdict = if st.allowed {
            Ok(())
        } else {
            Err(st.reason.unwrap_or_default())
        };
        let ttl = if verdict.is_ok() {
            self.settings.authorized_ttl
        } else {
            self.settings.unauthorized_ttl
        };
        remember(&self.verdicts, key, verdict.clone(), ttl);
        verdict.map_err(|reason| {
            tracing::info!(user = %user.name, verb = %attrs.verb, subresource = %attrs.subresource, %reason, "kubelet API request denied");
            forbidden()
        })
    }
}

/// Why the serving certificate could not be loaded or made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Without `--tls-cert-file`, upstream writes a self-signed certificate for the host name
/// to `<cert-dir>/kubelet.crt` (and `.key`) and reuses it on the next start.
pub fn self_signed(
    cert_dir: &Path,
    node_name: &str,
    ips: &[std::net::IpAddr],
) -> Result<(PathBuf, PathBuf), TlsError> {
    let crt = cert_dir.join("kubelet.crt");
    let key = cert_dir.join("kubelet.key");
    // The key is root's alone, also when an earlier install left it readable.
    let io = |p: &Path| {
        let path = p.to_path_buf();
        move |source| TlsError::Io { path, source }
    };
    nodus_serving::private::create_dir(cert_dir).map_err(io(cert_dir))?;
    nodus_serving::private::restrict_file(&key).map_err(io(&key))?;
    if crt.exists() && key.exists() {
        return Ok((crt, key));
    }
    let invalid = |e: rcgen::Error| TlsError::Invalid(format!("self-signed certificate: {e}"));
    let mut params = rcgen::CertificateParams::new(vec![node_name.to_string()]).map_err(invalid)?;
    params
        .subject_alt_names
        .extend(ips.iter().copied().map(rcgen::SanType::IpAddress));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, format!("{node_name}@{now}"));
    params.distinguished_name = dn;
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2035, 1, 1);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let kp = rcgen::KeyPair::generate().map_err(invalid)?;
    let cert = params.self_signed(&kp).map_err(invalid)?;
    nodus_serving::private::write(&key, kp.serialize_pem().as_bytes()).map_err(io(&key))?;
    std::fs::write(&crt, cert.pem()).map_err(io(&crt))?;
    tracing::info!(cert = %crt.display(), "wrote a self-signed serving certificate (no --tls-cert-file)");
    Ok((crt, key))
}

/// The TLS config of the secure port: the serving pair, and client certificates verified
/// against `client_ca` when given (optional, so token and anonymous requests still reach
/// the authenticator and get its 401).
pub fn server_tls(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let bad = |what: &str, e: &dyn std::fmt::Display| TlsError::Invalid(format!("{what}: {e}"));
    let certs: Vec<rustls::pki_types::CertificateDer<'static>> =
        rustls_pemfile::certs(&mut read(cert)?.as_slice())
            .collect::<Result<_, _>>()
            .map_err(|e| bad(&cert.display().to_string(), &e))?;
    if certs.is_empty() {
        return Err(TlsError::Invalid(format!(
            "{}: no certificate in the file",
            cert.display()
        )));
    }
    let key_der = rustls_pemfile::private_key(&mut read(key)?.as_slice())
        .map_err(|e| bad(&key.display().to_string(), &e))?
        .ok_or_else(|| {
            TlsError::Invalid(format!("{}: no private key in the file", key.display()))
        })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("tls", &e))?;
    let mut cfg = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_pemfile::certs(&mut read(ca)?.as_slice()) {
                let c = c.map_err(|e| bad(&ca.display().to_string(), &e))?;
                roots
                    .add(c)
                    .map_err(|e| bad(&ca.display().to_string(), &e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| bad("--client-ca-file", &e))?;
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(certs, key_der)
        }
        None => builder
            .with_no_client_auth()
            .with_single_cert(certs, key_der),
    }
    .map_err(|e| bad("serving certificate", &e))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_upstreams_subresources() {
        assert_eq!(subresource_for("/stats/summary"), "stats");
        assert_eq!(subresource_for("/stats"), "stats");
        assert_eq!(subresource_for("/metrics/cadvisor"), "metrics");
        assert_eq!(subresource_for("/logs/syslog"), "log");
        assert_eq!(subresource_for("/spec/"), "spec");
        assert_eq!(subresource_for("/containerLogs/ns/p/c"), "proxy");
        assert_eq!(subresource_for("/exec/ns/p/c"), "proxy");
        assert_eq!(subresource_for("/statsx"), "proxy");
        assert_eq!(verb_for(&http::Method::POST), "create");
        assert_eq!(verb_for(&http::Method::GET), "get");
    }

    #[tokio::test]
    async fn anonymous_is_refused_unless_enabled() {
        let settings = AuthSettings {
            node_name: "n".into(),
            anonymous: false,
            token_webhook: false,
            token_cache_ttl: Duration::from_secs(120),
            mode: AuthorizationMode::AlwaysAllow,
            authorized_ttl: Duration::from_secs(300),
            unauthorized_ttl: Duration::from_secs(30),
        };
        let a = Auth::new(settings.clone(), None);
        assert_eq!(a.authenticate(None, None).await, Err(Refusal::Unauthorized));
        assert_eq!(
            a.authenticate(None, Some("tok")).await,
            Err(Refusal::Unauthorized)
        );
        let a = Auth::new(
            AuthSettings {
                anonymous: true,
                ..settings
            },
            None,
        );
        assert_eq!(a.authenticate(None, None).await, Ok(UserInfo::anonymous()));
        let webhook = Auth::new(
            AuthSettings {
                mode: AuthorizationMode::Webhook,
                ..a.settings.clone()
            },
            None,
        );
        let attrs = attributes(&http::Method::POST, "/exec/ns/p/c");
        assert_eq!(
            webhook.authorize(&UserInfo::anonymous(), &attrs).await,
            Err(Refusal::Error(
                "Authorization error (user=system:anonymous, verb=create, resource=nodes, subresource=proxy)".into()
            ))
        );
    }
}
