//! CertificateSigningRequest validation (upstream's `pkg/apis/certificates/validation`):
//! the request's PEM block, usages, signer name, requested duration and conditions, and
//! what each endpoint (main, `status`, `approval`) may change on update.

use serde_json::{Value, json};

use super::common::Errs;
use super::names::{is_dns1123_label, is_dns1123_subdomain};
use super::{FieldError, Path};

/// Upstream's `allValidUsages`, sorted as its NotSupported message lists them.
pub const KEY_USAGES: &[&str] = &[
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// Which endpoint an update came through: only `approval` sets Approved/Denied, only
/// `status` sets the certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CsrEndpoint {
    Main,
    Status,
    Approval,
}

/// The DER bytes of `spec.request` (a base64 string in JSON) when it holds one PEM block.
pub fn request_pem(obj: &Value) -> Option<Vec<u8>> {
    let s = obj.pointer("/spec/request")?.as_str()?;
    let bytes: k8s_openapi::ByteString = serde_json::from_value(json!(s)).ok()?;
    Some(bytes.0)
}

/// Upstream's `validateCSR` up to the PEM decoding; parsing the DER is the signer's job.
fn pem_error(pem: &[u8]) -> Option<&'static str> {
    const NOT_A_REQUEST: &str = "PEM block type must be CERTIFICATE REQUEST";
    let text = String::from_utf8_lossy(pem);
    let Some(begin) = text.find("-----BEGIN ") else {
        return Some(NOT_A_REQUEST);
    };
    let rest = &text[begin + "-----BEGIN ".len()..];
    let label = rest.split("-----").next().unwrap_or("");
    if label != "CERTIFICATE REQUEST" {
        return Some(NOT_A_REQUEST);
    }
    None
}

pub(super) fn validate_signer_name(errs: &mut Errs, path: &Path, signer: &str) {
    if signer.is_empty() {
        errs.push(FieldError::required(path, "signerName must be provided"));
        return;
    }
    let parts: Vec<&str> = signer.split('/').collect();
    if parts.len() != 2 {
        errs.push(FieldError::invalid(
            path,
            json!(signer),
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
        return;
    }
    let labels: Vec<&str> = parts[0].split('.').collect();
    for l in &labels {
        let e = is_dns1123_label(l);
        if !e.is_empty() {
            for m in e {
                errs.push(FieldError::invalid(
                    path,
                    json!(parts[0]),
                    format!("validating label {l:?}: {m}"),
                ));
            }
            break;
        }
    }
    if labels.len() < 2 {
        errs.push(FieldError::invalid(
            path,
            json!(parts[0]),
            "should be a domain with at least two segments separated by dots",
        ));
    }
    for l in parts[1].split('.') {
        let e = is_dns1123_subdomain(l);
        if !e.is_empty() {
            for m in e {
                errs.push(FieldError::invalid(
                    path,
                    json!(parts[1]),
                    format!("validating label {l:?}: {m}"),
                ));
            }
            break;
        }
    }
}

fn conditions(o: &Value) -> Vec<&Value> {
    o.pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn of_type<'a>(o: &'a Value, t: &str) -> Vec<&'a Value> {
    conditions(o)
        .into_iter()
        .filter(|c| c["type"] == t)
        .collect()
}

pub(super) fn validate_csr(errs: &mut Errs, obj: &Value) {
    let sp = Path::new("spec");
    match request_pem(obj) {
        Some(pem) => {
            if let Some(m) = pem_error(&pem) {
                errs.push(FieldError::invalid(
                    sp.child("request"),
                    obj.pointer("/spec/request").cloned().unwrap_or(Value::Null),
                    m,
                ));
            }
        }
        None => errs.push(FieldError::invalid(
            sp.child("request"),
            obj.pointer("/spec/request").cloned().unwrap_or(json!("")),
            "PEM block type must be CERTIFICATE REQUEST",
        )),
    }
    let usages = obj
        .pointer("/spec/usages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if usages.is_empty() {
        errs.push(FieldError::required(
            sp.child("usages"),
            "usages must be provided",
        ));
    }
    let mut seen = Vec::new();
    for (i, u) in usages.iter().enumerate() {
        let s = u.as_str().unwrap_or("");
        if !KEY_USAGES.contains(&s) {
            errs.push(FieldError::not_supported(
                sp.child("usages").index(i),
                u.clone(),
                KEY_USAGES,
            ));
        }
        if seen.contains(&s) {
            errs.push(FieldError::duplicate(
                sp.child("usages").index(i),
                u.clone(),
            ));
        }
        seen.push(s);
    }
    let signer = obj
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if signer == "kubernetes.io/legacy-unknown" {
        errs.push(FieldError::invalid(
            sp.child("signerName"),
            json!(signer),
            "the legacy signerName is not allowed via this API version",
        ));
    } else {
        validate_signer_name(errs, &sp.child("signerName"), signer);
    }
    if let Some(secs) = obj
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        && secs < 600
    {
        errs.push(FieldError::invalid(
            sp.child("expirationSeconds"),
            json!(secs),
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    let cp = Path::new("status").child("conditions");
    let (mut approved, mut denied) = (false, false);
    let mut types: Vec<&str> = Vec::new();
    for (i, c) in conditions(obj).into_iter().enumerate() {
        let t = c["type"].as_str().unwrap_or("");
        if t.is_empty() {
            errs.push(FieldError::required(cp.index(i).child("type"), ""));
        }
        let st = c["status"].as_str().unwrap_or("");
        let allowed: &[&str] = if matches!(t, "Approved" | "Denied") {
            &["True"]
        } else {
            &["False", "True", "Unknown"]
        };
        if st.is_empty() {
            errs.push(FieldError::required(cp.index(i).child("status"), ""));
        } else if !allowed.contains(&st) {
            errs.push(FieldError::not_supported(
                cp.index(i).child("status"),
                json!(st),
                allowed,
            ));
        }
        match t {
            "Approved" => approved = true,
            "Denied" => denied = true,
            _ => {}
        }
        if (t == "Approved" && denied) || (t == "Denied" && approved) {
            errs.push(FieldError::invalid(
                cp.index(i).child("type"),
                json!(t),
                "Approved and Denied conditions are mutually exclusive",
            ));
        }
        if types.contains(&t) {
            errs.push(FieldError::duplicate(cp.index(i).child("type"), json!(t)));
        }
        types.push(t);
    }
}

/// What an update through `endpoint` may not do: remove Approved/Denied/Failed, touch
/// Approved/Denied outside `approval`, set the certificate outside `status` or replace an
/// issued one.
pub fn validate_csr_update(new: &Value, old: &Value, endpoint: CsrEndpoint) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let cp = Path::new("status").child("conditions");
    for t in ["Approved", "Denied", "Failed"] {
        if of_type(new, t).len() < of_type(old, t).len() {
            errs.push(FieldError::forbidden(
                &cp,
                format!("updates may not remove a condition of type {t:?}"),
            ));
        }
    }
    if endpoint != CsrEndpoint::Approval {
        for t in ["Approved", "Denied"] {
            let (o, n) = (of_type(old, t), of_type(new, t));
            if n.len() > o.len() {
                errs.push(FieldError::forbidden(
                    &cp,
                    format!("updates may not add a condition of type {t:?}"),
                ));
            } else if n.len() == o.len() && n != o {
                errs.push(FieldError::forbidden(
                    &cp,
                    format!("updates may not modify a condition of type {t:?}"),
                ));
            }
        }
    }
    let cert = |o: &Value| {
        o.pointer("/status/certificate")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    if cert(new) != cert(old) {
        let path = Path::new("status").child("certificate");
        if endpoint != CsrEndpoint::Status {
            errs.push(FieldError::forbidden(
                &path,
                "updates may not set certificate content",
            ));
        } else if !cert(old).is_empty() {
            errs.push(FieldError::forbidden(
                &path,
                "updates may not modify existing certificate content",
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        serde_json::to_value(k8s_openapi::ByteString(s.as_bytes().to_vec()))
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    }

    fn csr(request: &str, usages: Value, signer: &str) -> Value {
        json!({"metadata": {"name": "c"}, "spec": {"request": b64(request), "usages": usages, "signerName": signer}})
    }

    fn msgs(o: &Value) -> Vec<String> {
        let mut e = Vec::new();
        validate_csr(&mut e, o);
        e.iter().map(|e| e.to_string()).collect()
    }

    const PEM: &str =
        "-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n";

    #[test]
    fn csr_fields_get_upstream_texts() {
        assert!(
            msgs(&csr(
                PEM,
                json!(["client auth"]),
                "kubernetes.io/kube-apiserver-client"
            ))
            .is_empty()
        );
        let m = msgs(&csr("invalid data", json!([]), ""));
        assert!(
            m.iter()
                .any(|m| m.ends_with("PEM block type must be CERTIFICATE REQUEST")),
            "{m:?}"
        );
        assert!(
            m.contains(&"spec.usages: Required value: usages must be provided".to_string()),
            "{m:?}"
        );
        assert!(
            m.contains(&"spec.signerName: Required value: signerName must be provided".to_string()),
            "{m:?}"
        );
        let m = msgs(&csr(
            PEM,
            json!(["client auth", "client auth", "bogus"]),
            "nodot",
        ));
        assert!(
            m.iter()
                .any(|m| m.starts_with("spec.usages[1]: Duplicate value")),
            "{m:?}"
        );
        assert!(
            m.iter()
                .any(|m| m.starts_with("spec.usages[2]: Unsupported value: \"bogus\"")),
            "{m:?}"
        );
        assert!(
            m.iter().any(|m| m.contains(
                "must be a fully qualified domain and path of the form 'example.com/signer-name'"
            )),
            "{m:?}"
        );
        let mut short = csr(PEM, json!(["client auth"]), "example.com/x");
        short["spec"]["expirationSeconds"] = json!(60);
        assert_eq!(
            msgs(&short),
            vec![
                "spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 600 seconds (10 minutes)"
            ]
        );
    }

    #[test]
    fn approval_conditions_only_through_approval() {
        let old = csr(PEM, json!(["client auth"]), "example.com/x");
        let mut new = old.clone();
        new["status"] = json!({"conditions": [{"type": "Approved", "status": "True"}]});
        let e = validate_csr_update(&new, &old, CsrEndpoint::Status);
        assert_eq!(
            e[0].to_string(),
            "status.conditions: Forbidden: updates may not add a condition of type \"Approved\""
        );
        assert!(validate_csr_update(&new, &old, CsrEndpoint::Approval).is_empty());
        let e = validate_csr_update(&old, &new, CsrEndpoint::Approval);
        assert!(
            e[0].to_string()
                .contains("updates may not remove a condition of type \"Approved\"")
        );
        let mut issued = new.clone();
        issued["status"]["certificate"] = json!("Y2VydA==");
        assert!(validate_csr_update(&issued, &new, CsrEndpoint::Status).is_empty());
        assert_eq!(
            validate_csr_update(&issued, &new, CsrEndpoint::Main)[0].to_string(),
            "status.certificate: Forbidden: updates may not set certificate content"
        );
    }
}
