//! The CSR signing controller (upstream's `pkg/controller/certificates/signer`, the
//! `csrsigning` controller): an approved CSR for `kubernetes.io/kube-apiserver-client`,
//! `kube-apiserver-client-kubelet` or `kubelet-serving` that passes its signer's rules is
//! signed with the cluster CA (`--cluster-signing-cert-file`/`-key-file`), for the
//! requested `expirationSeconds` capped by `--cluster-signing-duration` and the CA's own
//! expiry; one that does not gets a `Failed` condition.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use rcgen::{ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use serde_json::{Value, json};

use super::cache::Cache;
use super::certificates::{
    KUBE_APISERVER_CLIENT, KUBE_APISERVER_CLIENT_KUBELET, KUBELET_SERVING, has_condition,
    parse_request, usages, validate_kubelet_client, validate_kubelet_serving,
};
use crate::apiserver::state::ApiState;
use crate::controllers::objects;

/// The CA files and longest validity, as kube-controller-manager's flags give them.
#[derive(Clone, Debug)]
pub struct SigningConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub duration: Duration,
}

/// Upstream backdates certificates so a peer with a slightly slow clock accepts them.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Why a CSR is refused by its signer (the Failed condition's message).
fn signer_rules(csr: &Value, signer: &str) -> Result<(), String> {
    let req = parse_request(csr)?;
    let usages = usages(csr);
    match signer {
        KUBE_APISERVER_CLIENT_KUBELET => {
            validate_kubelet_client(&req, &usages).map_err(|e| e.to_string())
        }
        KUBELET_SERVING => validate_kubelet_serving(&req, &usages).map_err(|e| e.to_string()),
        _ => {
            let bad: Vec<&String> = usages
                .iter()
                .filter(|u| {
                    !matches!(
                        u.as_str(),
                        "digital signature" | "key encipherment" | "client auth"
                    )
                })
                .collect();
            if bad.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "invalid usage for client certificate: {}",
                    bad.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
        }
    }
}

fn unix_now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Signs the CSR's request with the CA; returns the certificate PEM.
pub(crate) fn sign(csr: &Value, cfg: &SigningConfig) -> Result<String, String> {
    let pem = nodus_k8s::validation::certificates::request_pem(csr)
        .ok_or("PEM block type must be CERTIFICATE REQUEST")?;
    let pem = String::from_utf8(pem).map_err(|e| e.to_string())?;
    let mut req = rcgen::CertificateSigningRequestParams::from_pem(&pem)
        .map_err(|e| format!("unable to parse csr: {e}"))?;
    let ca_pem = std::fs::read_to_string(&cfg.cert_file)
        .map_err(|e| format!("{}: {e}", cfg.cert_file.display()))?;
    let key_pem = std::fs::read_to_string(&cfg.key_file)
        .map_err(|e| format!("{}: {e}", cfg.key_file.display()))?;
    let key = KeyPair::from_pem(&key_pem).map_err(|e| e.to_string())?;
    let ca_not_after = ca_not_after(&ca_pem).ok_or("unreadable CA certificate")?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, key).map_err(|e| e.to_string())?;
    let mut life = cfg.duration;
    if let Some(s) = csr
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_u64)
    {
        life = life.min(Duration::from_secs(s.max(600)));
    }
    let now = unix_now();
    let not_before = now.saturating_sub(BACKDATE);
    let not_after = (now + life).min(ca_not_after);
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let p = &mut req.params;
    p.not_before = epoch + not_before;
    p.not_after = epoch + not_after;
    p.is_ca = IsCa::ExplicitNoCa;
    let mut serial = rand::random::<[u8; 16]>();
    serial[0] &= 0x7f;
    p.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    p.key_usages.clear();
    p.extended_key_usages.clear();
    for u in usages(csr) {
        match u.as_str() {
            "digital signature" | "signing" => p.key_usages.push(KeyUsagePurpose::DigitalSignature),
            "key encipherment" => p.key_usages.push(KeyUsagePurpose::KeyEncipherment),
            "content commitment" => p.key_usages.push(KeyUsagePurpose::ContentCommitment),
            "data encipherment" => p.key_usages.push(KeyUsagePurpose::DataEncipherment),
            "key agreement" => p.key_usages.push(KeyUsagePurpose::KeyAgreement),
            "client auth" => p
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth),
            "server auth" => p
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth),
            "code signing" => p
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::CodeSigning),
            "email protection" => p
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::EmailProtection),
            "timestamping" => p
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::TimeStamping),
            "ocsp signing" => p
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::OcspSigning),
            _ => {}
        }
    }
    let cert = req.signed_by(&issuer).map_err(|e| e.to_string())?;
    Ok(cert.pem())
}

fn ca_not_after(pem: &str) -> Option<Duration> {
    let der = rustls_pemfile::certs(&mut pem.as_bytes()).next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    u64::try_from(cert.validity().not_after.timestamp())
        .ok()
        .map(Duration::from_secs)
}

fn handle(st: &ApiState, cfg: &SigningConfig, key: &str, csr: &Value) {
    let signer = csr
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !matches!(
        signer,
        KUBE_APISERVER_CLIENT | KUBE_APISERVER_CLIENT_KUBELET | KUBELET_SERVING
    ) || !has_condition(csr, "Approved")
        || has_condition(csr, "Denied")
        || has_condition(csr, "Failed")
        || csr
            .pointer("/status/certificate")
            .and_then(Value::as_str)
            .is_some_and(|c| !c.is_empty())
    {
        return;
    }
    let outcome = signer_rules(csr, signer).and_then(|()| sign(csr, cfg));
    let now = crate::apiserver::rest::now_rfc3339();
    let r = objects::modify(st, key, &mut |o| {
        if has_condition(o, "Failed") || o.pointer("/status/certificate").is_some() {
            return false;
        }
        match &outcome {
            Ok(pem) => {
                o["status"]["certificate"] =
                    json!(base64::engine::general_purpose::STANDARD.encode(pem));
            }
            Err(msg) => {
                let c = json!({"type": "Failed", "status": "True",
                    "reason": "SignerValidationFailure", "message": msg,
                    "lastUpdateTime": now, "lastTransitionTime": now});
                match o
                    .pointer_mut("/status/conditions")
                    .and_then(Value::as_array_mut)
                {
                    Some(a) => a.push(c),
                    None => o["status"]["conditions"] = json!([c]),
                }
            }
        }
        true
    });
    match (r, &outcome) {
        (Err(e), _) => tracing::warn!(csr = key, error = %e, "csr signer: update failed"),
        (Ok(_), Ok(_)) => tracing::info!(csr = key, signer, "csr signed"),
        (Ok(_), Err(m)) => tracing::info!(csr = key, signer, reason = %m, "csr not signed"),
    }
}

pub async fn run(st: Arc<ApiState>, cfg: SigningConfig) {
    let mut csrs = Cache::new(
        st.store.clone(),
        "/certificates.k8s.io/certificatesigningrequests/",
    );
    loop {
        let items: Vec<(String, Arc<Value>)> = csrs
            .objects
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in items {
            handle(&st, &cfg, &k, &v);
        }
        csrs.next().await;
        while csrs.try_next().is_some() {}
    }
}
