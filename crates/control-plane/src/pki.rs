//! The development PKI: a cluster CA, the API server's serving certificate, client
//! certificates (admin, nodes) and the kubeconfig files that carry them.
//!
//! Files live in `DATA_DIR/pki` and are reused on restart, so kubeconfigs handed out stay
//! valid.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, date_time_ymd,
};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("certificate generation: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("{0}")]
    Invalid(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PkiError + '_ {
    move |err| PkiError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// Paths and PEM contents of the cluster's certificates.
#[derive(Clone, Debug)]
pub struct Pki {
    pub dir: PathBuf,
    pub ca_cert_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
}

impl Pki {
    pub fn ca_cert_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
}

/// Writes a file with mode 0600 atomically (temp file + rename), so a crash never leaves a
/// truncated key or kubeconfig behind.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), PkiError> {
    nodus_serving::private::write(path, contents).map_err(io(path))
}

/// Creates a directory of keys or kubeconfigs mode 0700 (narrowing an existing one).
fn private_dir(dir: &Path) -> Result<(), PkiError> {
    nodus_serving::private::create_dir(dir).map_err(io(dir))
}

/// Narrows the files of an install made before keys were kept private.
fn restrict_files(dir: &Path) -> Result<(), PkiError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(PkiError::Io {
                path: dir.to_path_buf(),
                err: e,
            });
        }
    };
    for entry in entries.flatten() {
        let p = entry.path();
        if p.is_file() {
            nodus_serving::private::restrict_file(&p).map_err(io(&p))?;
        }
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(io(path))
}

fn validity(params: &mut CertificateParams) {
    params.not_before = date_time_ymd(2024, 1, 1);
    params.not_after = date_time_ymd(2124, 1, 1);
}

fn ca_issuer(dir: &Path) -> Result<Issuer<'static, KeyPair>, PkiError> {
    issuer(dir, "ca")
}

/// The CA `<dir>/<name>.crt` with its key.
fn issuer(dir: &Path, name: &str) -> Result<Issuer<'static, KeyPair>, PkiError> {
    let key = KeyPair::from_pem(&read(&dir.join(format!("{name}.key")))?)?;
    Ok(Issuer::from_ca_cert_pem(
        &read(&dir.join(format!("{name}.crt")))?,
        key,
    )?)
}

/// A new self-signed CA named `cn`: (certificate, key) in PEM.
fn new_ca(cn: &str) -> Result<(String, String), PkiError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params);
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The front proxy's CA and the API server's client certificate signed by it, as kubeadm
/// makes them (`front-proxy-ca.crt`, `front-proxy-client.crt`, CN `front-proxy-client`):
/// the identity the API server shows extension API servers when it proxies to them, which
/// trust the `X-Remote-*` headers only from a client this CA signed.
pub struct FrontProxy {
    pub ca_pem: String,
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

/// The front proxy's CN, as `requestheader-allowed-names` lists it.
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// [`FrontProxy`] from `pki_dir`, made where missing.
pub fn front_proxy(pki_dir: &Path) -> Result<FrontProxy, PkiError> {
    let ca_crt = pki_dir.join("front-proxy-ca.crt");
    let ca_key = pki_dir.join("front-proxy-ca.key");
    if !ca_crt.exists() || !ca_key.exists() {
        let (cert, key) = new_ca("front-proxy-ca")?;
        write_private(&ca_key, key.as_bytes())?;
        write_private(&ca_crt, cert.as_bytes())?;
    }
    let ca_pem = read(&ca_crt)?;
    let crt = pki_dir.join("front-proxy-client.crt");
    let key = pki_dir.join("front-proxy-client.key");
    let (client_cert_pem, client_key_pem) = match (read(&crt), read(&key)) {
        (Ok(c), Ok(k)) if signed_by_ca(&c, &ca_pem) => (c, k),
        _ => {
            let (c, k) = client_cert_by(pki_dir, "front-proxy-ca", FRONT_PROXY_CLIENT, &[])?;
            write_private(&key, k.as_bytes())?;
            write_private(&crt, c.as_bytes())?;
            (c, k)
        }
    };
    Ok(FrontProxy {
        ca_pem,
        client_cert_pem,
        client_key_pem,
    })
}

/// A client certificate and key signed by the CA, as PEM.
fn client_cert(dir: &Path, cn: &str, orgs: &[&str]) -> Result<(String, String), PkiError> {
    client_cert_by(dir, "ca", cn, orgs)
}

/// A client certificate and key signed by the CA `<dir>/<ca>.crt`, as PEM.
fn client_cert_by(
    dir: &Path,
    ca: &str,
    cn: &str,
    orgs: &[&str],
) -> Result<(String, String), PkiError> {
    let issuer = issuer(dir, ca)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    for o in orgs {
        dn.push(DnType::OrganizationName, *o);
    }
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    validity(&mut params);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Creates the CA and serving certificate in `data_dir/pki` unless present, and returns them.
/// The serving certificate names loopback and `addresses` (the bind and advertise
/// addresses, the `kubernetes` Service's cluster IP); one that misses any is reissued.
pub fn ensure(data_dir: &Path, addresses: &[IpAddr]) -> Result<Pki, PkiError> {
    let dir = data_dir.join("pki");
    private_dir(&dir)?;
    restrict_files(&dir)?;
    let nodes = data_dir.join("nodes");
    if nodes.exists() {
        private_dir(&nodes)?;
        restrict_files(&nodes)?;
    }
    nodus_serving::private::restrict_file(&data_dir.join("admin.kubeconfig"))
        .map_err(io(&data_dir.join("admin.kubeconfig")))?;
    let ca_crt = dir.join("ca.crt");
    let ca_key = dir.join("ca.key");
    if !ca_crt.exists() || !ca_key.exists() {
        let (cert, key) = new_ca("kubernetes")?;
        write_private(&ca_key, key.as_bytes())?;
        write_private(&ca_crt, cert.as_bytes())?;
        // A new CA invalidates every certificate it did not sign.
        let _ = std::fs::remove_file(dir.join("apiserver.crt"));
    }
    let srv_crt = dir.join("apiserver.crt");
    let srv_key = dir.join("apiserver.key");
    let needs_serving = match read(&srv_crt) {
        Ok(pem) => !addresses.iter().all(|a| serving_cert_covers(&pem, *a)),
        Err(_) => true,
    };
    if needs_serving || !srv_key.exists() {
        let issuer = ca_issuer(&dir)?;
        let mut names: Vec<SanType> = Vec::new();
        for dns in [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ] {
            names.push(SanType::DnsName(dns.try_into()?));
        }
        let mut ips: Vec<IpAddr> = vec![[127, 0, 0, 1].into()];
        for a in addresses {
            if !ips.contains(a) && !a.is_unspecified() {
                ips.push(*a);
            }
        }
        names.extend(ips.into_iter().map(SanType::IpAddress));
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = names;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "kube-apiserver");
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        write_private(&srv_key, key.serialize_pem().as_bytes())?;
        write_private(&srv_crt, cert.pem().as_bytes())?;
    }
    Ok(Pki {
        ca_cert_pem: read(&ca_crt)?,
        serving_cert_pem: read(&srv_crt)?,
        serving_key_pem: read(&srv_key)?,
        dir,
    })
}

/// Whether an existing serving certificate already names `bind` (so a restart with another
/// `--bind-address` or `--advertise-address` gets a fresh one).
fn serving_cert_covers(pem: &str, bind: IpAddr) -> bool {
    if bind.is_unspecified() || bind == IpAddr::from([127, 0, 0, 1]) {
        return true;
    }
    let Ok(Some(der)) = rustls_pemfile::certs(&mut pem.as_bytes())
        .next()
        .transpose()
    else {
        return false;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&der) else {
        return false;
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    san.value.general_names.iter().any(|n| match n {
        x509_parser::extensions::GeneralName::IPAddress(b) => match bind {
            IpAddr::V4(v4) => *b == v4.octets(),
            IpAddr::V6(v6) => *b == v6.octets(),
        },
        _ => false,
    })
}

/// The API server's client certificate towards kubelets (CN
/// `kube-apiserver-kubelet-client`, O `system:masters`, as kubeadm issues it), as PEM
/// (cert, key); created on first use and reused.
pub fn kubelet_client_cert(pki: &Pki) -> Result<(String, String), PkiError> {
    let cert_path = pki.dir.join("apiserver-kubelet-client.crt");
    let key_path = pki.dir.join("apiserver-kubelet-client.key");
    if let (Ok(c), Ok(k)) = (read(&cert_path), read(&key_path))
        && signed_by_ca(&c, &pki.ca_cert_pem)
    {
        return Ok((c, k));
    }
    let (c, k) = client_cert(
        &pki.dir,
        "kube-apiserver-kubelet-client",
        &["system:masters"],
    )?;
    write_private(&key_path, k.as_bytes())?;
    write_private(&cert_path, c.as_bytes())?;
    Ok((c, k))
}

/// Renders a kubeconfig with embedded certificate data, named as kubeadm names them.
pub fn kubeconfig(ca_pem: &str, server: &str, user: &str, cert_pem: &str, key_pem: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let cfg = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "nodus", "cluster": {
            "server": server,
            "certificate-authority-data": b64(ca_pem),
        }}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(cert_pem),
            "client-key-data": b64(key_pem),
        }}],
        "contexts": [{"name": format!("{user}@nodus"), "context": {"cluster": "nodus", "user": user}}],
        "current-context": format!("{user}@nodus"),
        "preferences": {},
    });
    serde_yaml::to_string(&cfg).unwrap_or_default()
}

/// Writes `data_dir/admin.kubeconfig` (CN kubernetes-admin, O system:masters) for `server`.
pub fn write_admin_kubeconfig(
    data_dir: &Path,
    pki: &Pki,
    server: &str,
) -> Result<PathBuf, PkiError> {
    let cert_path = pki.dir.join("admin.crt");
    let key_path = pki.dir.join("admin.key");
    let (cert, key) = match (read(&cert_path), read(&key_path)) {
        (Ok(c), Ok(k)) if signed_by_ca(&c, &pki.ca_cert_pem) => (c, k),
        _ => {
            let (c, k) = client_cert(&pki.dir, "kubernetes-admin", &["system:masters"])?;
            write_private(&key_path, k.as_bytes())?;
            write_private(&cert_path, c.as_bytes())?;
            (c, k)
        }
    };
    let path = data_dir.join("admin.kubeconfig");
    write_private(
        &path,
        kubeconfig(&pki.ca_cert_pem, server, "kubernetes-admin", &cert, &key).as_bytes(),
    )?;
    Ok(path)
}

fn signed_by_ca(cert_pem: &str, ca_pem: &str) -> bool {
    let first = |pem: &str| {
        rustls_pemfile::certs(&mut pem.as_bytes())
            .next()
            .and_then(Result::ok)
    };
    let (Some(cert), Some(ca)) = (first(cert_pem), first(ca_pem)) else {
        return false;
    };
    let (Ok((_, cert)), Ok((_, ca))) = (
        x509_parser::parse_x509_certificate(&cert),
        x509_parser::parse_x509_certificate(&ca),
    ) else {
        return false;
    };
    cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// Writes `data_dir/nodes/<node>.kubeconfig` whose client certificate is CN
/// `system:node:<node>`, O `system:nodes`, as the kubelet's TLS bootstrap would obtain.
pub fn issue_node_kubeconfig(
    data_dir: &Path,
    node_name: &str,
    server_url: &str,
) -> Result<PathBuf, PkiError> {
    if node_name.is_empty() || node_name.contains('/') {
        return Err(PkiError::Invalid(format!(
            "invalid node name {node_name:?}"
        )));
    }
    let dir = data_dir.join("pki");
    let ca = read(&dir.join("ca.crt"))?;
    let (cert, key) = client_cert(&dir, &format!("system:node:{node_name}"), &["system:nodes"])?;
    let out_dir = data_dir.join("nodes");
    private_dir(&out_dir)?;
    let path = out_dir.join(format!("{node_name}.kubeconfig"));
    let user = format!("system:node:{node_name}");
    write_private(
        &path,
        kubeconfig(&ca, server_url, &user, &cert, &key).as_bytes(),
    )?;
    Ok(path)
}

/// Issues a kubelet serving certificate signed by the cluster CA (CN `system:node:<node>`,
/// SANs: the node name and `ips`), written to `data_dir/nodes/<node>-kubelet.{crt,key}`,
/// so the API server can verify the kubelet it proxies logs and exec to.
pub fn issue_kubelet_serving_cert(
    data_dir: &Path,
    node_name: &str,
    ips: &[IpAddr],
) -> Result<(PathBuf, PathBuf), PkiError> {
    if node_name.is_empty() || node_name.contains('/') {
        return Err(PkiError::Invalid(format!(
            "invalid node name {node_name:?}"
        )));
    }
    let dir = data_dir.join("pki");
    let issuer = ca_issuer(&dir)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut names = vec![SanType::DnsName(node_name.try_into()?)];
    names.extend(ips.iter().copied().map(SanType::IpAddress));
    params.subject_alt_names = names;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "system:nodes");
    dn.push(DnType::CommonName, format!("system:node:{node_name}"));
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let out_dir = data_dir.join("nodes");
    private_dir(&out_dir)?;
    let crt = out_dir.join(format!("{node_name}-kubelet.crt"));
    let key_path = out_dir.join(format!("{node_name}-kubelet.key"));
    write_private(&key_path, key.serialize_pem().as_bytes())?;
    write_private(&crt, cert.pem().as_bytes())?;
    Ok((crt, key_path))
}

/// Writes a client kubeconfig for any user name and groups (tests, extra identities).
pub fn issue_user_kubeconfig(
    data_dir: &Path,
    file_name: &str,
    user: &str,
    groups: &[&str],
    server_url: &str,
) -> Result<PathBuf, PkiError> {
    let dir = data_dir.join("pki");
    let ca = read(&dir.join("ca.crt"))?;
    let (cert, key) = client_cert(&dir, user, groups)?;
    let path = data_dir.join(file_name);
    write_private(
        &path,
        kubeconfig(&ca, server_url, user, &cert, &key).as_bytes(),
    )?;
    Ok(path)
}

/// The DER SubjectPublicKeyInfo prefix of an ECDSA P-256 key (id-ecPublicKey, prime256v1),
/// followed by the 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// The SubjectPublicKeyInfo DER of a P-256 public key given as its uncompressed point.
pub fn p256_spki_der(point: &[u8]) -> Vec<u8> {
    let mut der = P256_SPKI_PREFIX.to_vec();
    der.extend_from_slice(point);
    der
}

fn pem_block(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The service-account token signing key, `sa.key` (PKCS#8 PEM) with its public half in
/// `sa.pub`, as kubeadm lays them out; created once (ECDSA P-256, signing ES256) and kept,
/// so tokens already handed out stay valid across restarts. Returns the PKCS#8 DER.
pub fn service_account_key(pki_dir: &Path) -> Result<Vec<u8>, PkiError> {
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
    let key_path = pki_dir.join("sa.key");
    let pub_path = pki_dir.join("sa.pub");
    let rng = ring::rand::SystemRandom::new();
    let der = match read(&key_path) {
        Ok(pem) => rustls_pemfile::private_key(&mut pem.as_bytes())
            .ok()
            .flatten()
            .map(|k| k.secret_der().to_vec())
            .ok_or_else(|| PkiError::Invalid(format!("{}: no private key", key_path.display())))?,
        Err(_) => {
            let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                .map_err(|_| PkiError::Invalid("generating the service-account key".into()))?;
            write_private(&key_path, pem_block("PRIVATE KEY", doc.as_ref()).as_bytes())?;
            doc.as_ref().to_vec()
        }
    };
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng)
        .map_err(|e| PkiError::Invalid(format!("{}: {e}", key_path.display())))?;
    let public = pem_block("PUBLIC KEY", &p256_spki_der(pair.public_key().as_ref()));
    if read(&pub_path).ok().as_deref() != Some(public.as_str()) {
        write_private(&pub_path, public.as_bytes())?;
    }
    Ok(der)
}

/// kubeadm's `--discovery-token-ca-cert-hash` of a CA: `sha256:` and the hex SHA-256 of the
/// certificate's SubjectPublicKeyInfo, so it pins the key whatever the certificate says.
pub fn ca_cert_hash(ca_pem: &str) -> Result<String, PkiError> {
    use sha2::{Digest, Sha256};
    let der = rustls_pemfile::certs(&mut ca_pem.as_bytes())
        .next()
        .and_then(Result::ok)
        .ok_or_else(|| PkiError::Invalid("no certificate in the CA bundle".into()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| PkiError::Invalid(format!("parsing the CA certificate: {e}")))?;
    let digest = Sha256::digest(cert.tbs_certificate.subject_pki.raw);
    Ok(format!(
        "sha256:{}",
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_hash_pins_the_public_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = ensure(dir.path(), &[IpAddr::from([127, 0, 0, 1])]).unwrap();
        let h = ca_cert_hash(&p.ca_cert_pem).unwrap();
        assert!(h.starts_with("sha256:") && h.len() == 7 + 64, "{h}");
        // The same key reissued keeps the hash; the openssl equivalent is
        // `openssl x509 -pubkey | openssl pkey -pubin -outform der | sha256sum`.
        let key = KeyPair::from_pem(&read(&p.dir.join("ca.key")).unwrap()).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let again = params.self_signed(&key).unwrap().pem();
        assert_eq!(ca_cert_hash(&again).unwrap(), h);
        let other = KeyPair::generate().unwrap();
        let foreign = params.self_signed(&other).unwrap().pem();
        assert_ne!(ca_cert_hash(&foreign).unwrap(), h);
        assert!(ca_cert_hash("junk").is_err());
    }
}
