//! Joining a cluster with a bootstrap token and no secrets on the node, as `kubeadm join`
//! does: token discovery reads kube-public/cluster-info anonymously, trusts it only when
//! the bootstrap signer's JWS verifies with the token and its CA's public key matches a
//! `--discovery-token-ca-cert-hash`, then writes the CA and a bootstrap kubeconfig (the
//! token) for the kubelet's TLS bootstrap.
//!
//! The signer patches a new token's signature into cluster-info a moment after the token
//! Secret is written, and the API server may not answer yet: as kubeadm, discovery reads
//! again until `--discovery-timeout` while the signature is missing or the read fails,
//! and fails at once on a signature or CA that does not verify.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use base64::Engine;
use nodus_control_plane::apiserver::authn::bootstraptoken::{detached_token_is_valid, parse_token};
use serde_json::Value;

const HASH_FLAG: &str = "--discovery-token-ca-cert-hash";

/// A `sha256:<64 hex>` pin, lower-cased.
pub fn parse_ca_hash(h: &str) -> anyhow::Result<String> {
    let Some((kind, value)) = h.split_once(':') else {
        anyhow::bail!("{HASH_FLAG}: invalid hash {h:?}, expected a format of \"<type>:<value>\"");
    };
    anyhow::ensure!(
        kind == "sha256",
        "{HASH_FLAG}: unknown hash type {kind:?}, only sha256 is supported"
    );
    anyhow::ensure!(
        value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()),
        "{HASH_FLAG}: {h:?} is not a SHA-256 hash (64 hexadecimal digits)"
    );
    Ok(format!("sha256:{}", value.to_ascii_lowercase()))
}

/// How often discovery reads cluster-info again (kubeadm waits 5 s; the signer answers in
/// milliseconds, so a node joining just after `token create` need not wait that long).
const RETRY_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// cluster-info lacks the token's signature: the only verification failure a later read
/// may cure, as the signer may not have run yet.
#[derive(Debug)]
pub struct NoSignature {
    token_id: String,
}

impl std::fmt::Display for NoSignature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "there is no JWS signed token in the cluster-info ConfigMap. This token id {:?} is invalid for this cluster, can't connect",
            self.token_id
        )
    }
}

impl std::error::Error for NoSignature {}

/// What discovery learned and trusts.
#[derive(Debug)]
pub struct ClusterInfo {
    pub ca_pem: String,
}

/// kubeadm's checks on a fetched cluster-info ConfigMap: the JWS for the token's id
/// verifies with its secret, and the CA in the kubeconfig is pinned by one of `hashes`.
pub fn verify_cluster_info(
    cm: &Value,
    token: &str,
    hashes: &[String],
) -> anyhow::Result<ClusterInfo> {
    let parts = parse_token(token).with_context(
        || "--token: the token does not match the pattern [a-z0-9]{6}.[a-z0-9]{16}",
    )?;
    let kubeconfig = cm
        .pointer("/data/kubeconfig")
        .and_then(Value::as_str)
        .context("there is no kubeconfig in the cluster-info ConfigMap")?;
    let jws = cm
        .get("data")
        .and_then(|d| d.get(format!("jws-kubeconfig-{}", parts.id)))
        .and_then(Value::as_str)
        .ok_or_else(|| NoSignature {
            token_id: parts.id.to_string(),
        })?;
    anyhow::ensure!(
        detached_token_is_valid(jws, kubeconfig, parts.id, parts.secret),
        "failed to verify JWS signature of received cluster info object, can't trust this API Server (check --token)"
    );
    let cfg: Value =
        serde_yaml::from_str(kubeconfig).context("parsing the cluster-info kubeconfig")?;
    let ca_b64 = cfg
        .pointer("/clusters/0/cluster/certificate-authority-data")
        .and_then(Value::as_str)
        .context("the cluster-info kubeconfig carries no certificate-authority-data")?;
    let ca_pem = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(ca_b64)
            .context("decoding the cluster CA")?,
    )
    .context("decoding the cluster CA")?;
    let found = nodus_control_plane::pki::ca_cert_hash(&ca_pem)?;
    anyhow::ensure!(
        hashes.contains(&found),
        "{HASH_FLAG}: the cluster CA found in cluster-info ({found}) matches none of the given hashes ({}); refusing to trust this API server",
        hashes.join(", ")
    );
    Ok(ClusterInfo { ca_pem })
}

const CLUSTER_INFO_PATH: &str = "/api/v1/namespaces/kube-public/configmaps/cluster-info";

async fn fetch(client: &reqwest::Client, server: &str) -> anyhow::Result<Value> {
    let url = format!("{}{CLUSTER_INFO_PATH}", server.trim_end_matches('/'));
    let resp = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("fetching cluster-info from {server}"))?;
    let code = resp.status();
    let body = resp.text().await.unwrap_or_default();
    anyhow::ensure!(
        code.is_success(),
        "fetching cluster-info from {server}: {code}: {}",
        body.trim()
    );
    serde_json::from_str(&body).context("parsing cluster-info")
}

/// What one discovery attempt at one API server came to.
enum Attempt {
    Trusted(ClusterInfo),
    /// The server did not answer or has not signed for the token yet: ask again later.
    NotYet(anyhow::Error),
    /// cluster-info or the server's certificate does not verify: asking again changes nothing.
    Refused(anyhow::Error),
}

/// An unverified anonymous read of cluster-info at `server`, checked by
/// [`verify_cluster_info`], then read again over TLS verified with the trusted CA.
async fn attempt(
    insecure: &reqwest::Client,
    server: &str,
    token: &str,
    hashes: &[String],
) -> Attempt {
    let cm = match fetch(insecure, server).await {
        Ok(cm) => cm,
        Err(e) => return Attempt::NotYet(e),
    };
    let info = match verify_cluster_info(&cm, token, hashes) {
        Ok(info) => info,
        Err(e) if e.is::<NoSignature>() => return Attempt::NotYet(e),
        Err(e) => return Attempt::Refused(e),
    };
    let secure = reqwest::Certificate::from_pem(info.ca_pem.as_bytes())
        .and_then(|root| {
            reqwest::Client::builder()
                .tls_built_in_root_certs(false)
                .add_root_certificate(root)
                .timeout(std::time::Duration::from_secs(30))
                .build()
        })
        .map_err(anyhow::Error::from);
    match secure {
        Ok(secure) => match fetch(&secure, server).await {
            Ok(_) => Attempt::Trusted(info),
            Err(e) => Attempt::Refused(e.context(
                "the API server's certificate is not signed by the discovered cluster CA",
            )),
        },
        Err(e) => Attempt::Refused(e.context("the discovered cluster CA")),
    }
}

/// Token discovery: [`attempt`] at each of `servers` in turn, round after round until one
/// is trusted or `timeout` has passed; a server that is refused is not asked again (with
/// one server, its refusal is the answer). Returns the trusted server and what it gave.
pub async fn discover(
    servers: &[String],
    token: &str,
    hashes: &[String],
    timeout: std::time::Duration,
) -> anyhow::Result<(String, ClusterInfo)> {
    anyhow::ensure!(
        !hashes.is_empty(),
        "{HASH_FLAG} is required with --token (the hash of the cluster CA's public key, printed by `nodus token create`)"
    );
    anyhow::ensure!(
        !servers.is_empty(),
        "--token needs --server https://HOST:PORT (the API server to join)"
    );
    let insecure = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(std::time::Duration::from_secs(30))
        .build()?;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut refused = vec![false; servers.len()];
    loop {
        let mut last = None;
        for (i, server) in servers.iter().enumerate() {
            if refused[i] {
                continue;
            }
            match attempt(&insecure, server, token, hashes).await {
                Attempt::Trusted(info) => return Ok((server.clone(), info)),
                Attempt::NotYet(e) => {
                    tracing::info!(server, error = %format!("{e:#}"), "discovery: will try again");
                    last = Some(e);
                }
                Attempt::Refused(e) => {
                    refused[i] = true;
                    if refused.iter().all(|r| *r) {
                        return Err(e);
                    }
                    tracing::warn!(server, error = %format!("{e:#}"), "discovery refused this API server; trying the others");
                }
            }
        }
        // Some server was not refused, so this round has its error.
        let last = last.unwrap_or_else(|| anyhow::anyhow!("no API server answered discovery"));
        if tokio::time::Instant::now() + RETRY_INTERVAL > deadline {
            return Err(last.context(format!(
                "token discovery at {} did not succeed within --discovery-timeout ({timeout:?})",
                servers.join(", ")
            )));
        }
        tokio::time::sleep(RETRY_INTERVAL).await;
    }
}

/// Writes the discovered CA (`<dir>/pki/ca.crt`) and the bootstrap kubeconfig (0600) the
/// kubelet's TLS bootstrap uses; returns (bootstrap kubeconfig, CA file).
pub fn write_bootstrap(
    dir: &Path,
    server: &str,
    token: &str,
    info: &ClusterInfo,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki).with_context(|| format!("creating {}", pki.display()))?;
    let ca = pki.join("ca.crt");
    std::fs::write(&ca, &info.ca_pem).with_context(|| format!("writing {}", ca.display()))?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&info.ca_pem);
    let cfg = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "nodus", "cluster": {"server": server, "certificate-authority-data": b64}}],
        "users": [{"name": "tls-bootstrap-token-user", "user": {"token": token}}],
        "contexts": [{"name": "tls-bootstrap-token-user@nodus", "context": {"cluster": "nodus", "user": "tls-bootstrap-token-user"}}],
        "current-context": "tls-bootstrap-token-user@nodus",
        "preferences": {},
    });
    let path = dir.join("bootstrap-kubelet.kubeconfig");
    nodus_control_plane::pki::write_private(&path, serde_yaml::to_string(&cfg)?.as_bytes())?;
    Ok((path, ca))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_control_plane::apiserver::authn::bootstraptoken::compute_detached_signature;
    use nodus_control_plane::controllers::bootstrapsigner::cluster_info_kubeconfig;

    const TOKEN: &str = "abcdef.0123456789abcdef";

    fn ca() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.self_signed(&key).unwrap().pem()
    }

    fn cluster_info(ca: &str, signed_with: &str) -> Value {
        let kc = cluster_info_kubeconfig("https://10.0.0.1:6443", ca);
        let (id, secret) = signed_with.split_once('.').unwrap();
        serde_json::json!({"data": {"kubeconfig": kc,
            format!("jws-kubeconfig-{id}"): compute_detached_signature(&kc, id, secret)}})
    }

    #[test]
    fn hashes_are_sha256_hex() {
        let h = format!("sha256:{}", "A".repeat(64));
        assert_eq!(
            parse_ca_hash(&h).unwrap(),
            format!("sha256:{}", "a".repeat(64))
        );
        for bad in ["abc", "md5:00", "sha256:xyz"] {
            let e = parse_ca_hash(bad).unwrap_err().to_string();
            assert!(e.starts_with("--discovery-token-ca-cert-hash"), "{e}");
        }
    }

    #[test]
    fn cluster_info_is_trusted_only_with_the_token_and_the_pinned_ca() {
        let ca = ca();
        let pin = nodus_control_plane::pki::ca_cert_hash(&ca).unwrap();
        let cm = cluster_info(&ca, TOKEN);
        assert_eq!(
            verify_cluster_info(&cm, TOKEN, std::slice::from_ref(&pin))
                .unwrap()
                .ca_pem,
            ca
        );

        let other = nodus_control_plane::pki::ca_cert_hash(&self::ca()).unwrap();
        let e = verify_cluster_info(&cm, TOKEN, &[other])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--discovery-token-ca-cert-hash: the cluster CA found in cluster-info"),
            "{e}"
        );

        let forged = cluster_info(&ca, "abcdef.0123456789abcdee");
        let e = verify_cluster_info(&forged, TOKEN, std::slice::from_ref(&pin))
            .unwrap_err()
            .to_string();
        assert!(e.contains("failed to verify JWS signature"), "{e}");

        // Only a missing signature is worth reading cluster-info again for.
        let e = verify_cluster_info(&forged, TOKEN, std::slice::from_ref(&pin)).unwrap_err();
        assert!(!e.is::<NoSignature>(), "{e}");
        let e = verify_cluster_info(&cm, "zzzzzz.0123456789abcdef", &[pin]).unwrap_err();
        assert!(e.is::<NoSignature>(), "{e}");
        let e = e.to_string();
        assert!(
            e.contains("This token id \"zzzzzz\" is invalid for this cluster"),
            "{e}"
        );
    }
}
