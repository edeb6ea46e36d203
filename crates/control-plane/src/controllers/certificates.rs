//! What the CSR approver and signer share (upstream's `pkg/apis/certificates/helpers.go`
//! and `pkg/controller/certificates`): the signer names, a parsed x509 certificate
//! request, and the kubelet client and serving request rules.

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde_json::Value;
use x509_parser::prelude::FromDer;

pub(crate) const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
pub(crate) const KUBE_APISERVER_CLIENT_KUBELET: &str =
    "kubernetes.io/kube-apiserver-client-kubelet";
pub(crate) const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";

/// The fields of an x509 certificate request the rules look at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ParsedRequest {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub emails: Vec<String>,
    pub uris: Vec<String>,
}

/// Parses the PEM in `spec.request` and checks its signature (upstream's `ParseCSR`).
pub(crate) fn parse_request(csr: &Value) -> Result<ParsedRequest, String> {
    let pem = nodus_k8s::validation::certificates::request_pem(csr)
        .ok_or_else(|| "PEM block type must be CERTIFICATE REQUEST".to_string())?;
    parse_request_pem(&pem)
}

pub(crate) fn parse_request_pem(pem: &[u8]) -> Result<ParsedRequest, String> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).map_err(|e| e.to_string())?;
    if block.label != "CERTIFICATE REQUEST" {
        return Err("PEM block type must be CERTIFICATE REQUEST".into());
    }
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
            .map_err(|e| format!("x509: malformed certificate request: {e}"))?;
    req.verify_signature()
        .map_err(|e| format!("x509: certificate request signature: {e}"))?;
    let subject = &req.certification_request_info.subject;
    let mut out = ParsedRequest {
        common_name: subject
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .unwrap_or("")
            .to_string(),
        organizations: subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_string))
            .collect(),
        ..Default::default()
    };
    for ext in req.requested_extensions().into_iter().flatten() {
        if let x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) = ext {
            for n in &san.general_names {
                use x509_parser::extensions::GeneralName;
                match n {
                    GeneralName::DNSName(d) => out.dns_names.push(d.to_string()),
                    GeneralName::RFC822Name(e) => out.emails.push(e.to_string()),
                    GeneralName::URI(u) => out.uris.push(u.to_string()),
                    GeneralName::IPAddress(b) => {
                        if let Ok(a) = <[u8; 4]>::try_from(*b) {
                            out.ip_addresses.push(IpAddr::from(a));
                        } else if let Ok(a) = <[u8; 16]>::try_from(*b) {
                            out.ip_addresses.push(IpAddr::from(a));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(out)
}

/// The CSR's `spec.usages` as a set.
pub(crate) fn usages(csr: &Value) -> BTreeSet<String> {
    csr.pointer("/spec/usages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|u| u.as_str().map(str::to_string))
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Why a request is not a kubelet client or serving request; upstream's error texts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KubeletCsrError {
    OrganizationNotSystemNodes,
    CommonNameNotSystemNode,
    DnsSansNotAllowed,
    EmailSansNotAllowed,
    IpSansNotAllowed,
    UriSansNotAllowed,
    DnsOrIpSanRequired,
    Usages(&'static [&'static str]),
}

impl std::fmt::Display for KubeletCsrError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OrganizationNotSystemNodes => {
                f.write_str("subject organization is not system:nodes")
            }
            Self::CommonNameNotSystemNode => {
                f.write_str("subject common name does not begin with system:node:")
            }
            Self::DnsSansNotAllowed => f.write_str("DNS subjectAltNames are not allowed"),
            Self::EmailSansNotAllowed => f.write_str("Email subjectAltNames are not allowed"),
            Self::IpSansNotAllowed => f.write_str("IP subjectAltNames are not allowed"),
            Self::UriSansNotAllowed => f.write_str("URI subjectAltNames are not allowed"),
            Self::DnsOrIpSanRequired => f.write_str("DNS or IP subjectAltName is required"),
            Self::Usages(u) => write!(f, "usages did not match [{}]", u.join(" ")),
        }
    }
}

const CLIENT_USAGES: &[&str] = &["client auth", "digital signature", "key encipherment"];
const CLIENT_USAGES_NO_RSA: &[&str] = &["client auth", "digital signature"];
const SERVING_USAGES: &[&str] = &["digital signature", "key encipherment", "server auth"];
const SERVING_USAGES_NO_RSA: &[&str] = &["digital signature", "server auth"];

/// Upstream's `ValidateKubeletClientCSR`.
pub(crate) fn validate_kubelet_client(
    req: &ParsedRequest,
    usages: &BTreeSet<String>,
) -> Result<(), KubeletCsrError> {
    if req.organizations != ["system:nodes"] {
        return Err(KubeletCsrError::OrganizationNotSystemNodes);
    }
    if !req.dns_names.is_empty() {
        return Err(KubeletCsrError::DnsSansNotAllowed);
    }
    if !req.emails.is_empty() {
        return Err(KubeletCsrError::EmailSansNotAllowed);
    }
    if !req.ip_addresses.is_empty() {
        return Err(KubeletCsrError::IpSansNotAllowed);
    }
    if !req.uris.is_empty() {
        return Err(KubeletCsrError::UriSansNotAllowed);
    }
    if !req.common_name.starts_with("system:node:") {
        return Err(KubeletCsrError::CommonNameNotSystemNode);
    }
    if *usages != set(CLIENT_USAGES) && *usages != set(CLIENT_USAGES_NO_RSA) {
        return Err(KubeletCsrError::Usages(CLIENT_USAGES));
    }
    Ok(())
}

/// Upstream's `ValidateKubeletServingCSR`.
pub(crate) fn validate_kubelet_serving(
    req: &ParsedRequest,
    usages: &BTreeSet<String>,
) -> Result<(), KubeletCsrError> {
    if req.organizations != ["system:nodes"] {
        return Err(KubeletCsrError::OrganizationNotSystemNodes);
    }
    if req.dns_names.is_empty() && req.ip_addresses.is_empty() {
        return Err(KubeletCsrError::DnsOrIpSanRequired);
    }
    if !req.emails.is_empty() {
        return Err(KubeletCsrError::EmailSansNotAllowed);
    }
    if !req.uris.is_empty() {
        return Err(KubeletCsrError::UriSansNotAllowed);
    }
    if *usages != set(SERVING_USAGES) && *usages != set(SERVING_USAGES_NO_RSA) {
        return Err(KubeletCsrError::Usages(SERVING_USAGES));
    }
    if !req.common_name.starts_with("system:node:") {
        return Err(KubeletCsrError::CommonNameNotSystemNode);
    }
    Ok(())
}

/// Whether the CSR already carries a condition of type `t`.
pub(crate) fn has_condition(csr: &Value, t: &str) -> bool {
    csr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cn: &str, orgs: &[&str], dns: &[&str], ips: &[&str]) -> ParsedRequest {
        ParsedRequest {
            common_name: cn.into(),
            organizations: orgs.iter().map(|s| s.to_string()).collect(),
            dns_names: dns.iter().map(|s| s.to_string()).collect(),
            ip_addresses: ips.iter().map(|s| s.parse().unwrap()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn kubelet_client_rules() {
        use KubeletCsrError::*;
        let u = set(CLIENT_USAGES);
        let cases: Vec<(ParsedRequest, BTreeSet<String>, Result<(), KubeletCsrError>)> = vec![
            (
                req("system:node:a", &["system:nodes"], &[], &[]),
                u.clone(),
                Ok(()),
            ),
            (
                req("system:node:a", &["system:nodes"], &[], &[]),
                set(CLIENT_USAGES_NO_RSA),
                Ok(()),
            ),
            (
                req("system:node:a", &["other"], &[], &[]),
                u.clone(),
                Err(OrganizationNotSystemNodes),
            ),
            (
                req("system:node:a", &["system:nodes"], &["a"], &[]),
                u.clone(),
                Err(DnsSansNotAllowed),
            ),
            (
                req("system:node:a", &["system:nodes"], &[], &["10.0.0.1"]),
                u.clone(),
                Err(IpSansNotAllowed),
            ),
            (
                req("alice", &["system:nodes"], &[], &[]),
                u.clone(),
                Err(CommonNameNotSystemNode),
            ),
            (
                req("system:node:a", &["system:nodes"], &[], &[]),
                set(&["client auth"]),
                Err(Usages(CLIENT_USAGES)),
            ),
        ];
        for (r, u, want) in cases {
            assert_eq!(validate_kubelet_client(&r, &u), want, "{r:?}");
        }
        assert_eq!(
            Usages(CLIENT_USAGES).to_string(),
            "usages did not match [client auth digital signature key encipherment]"
        );
    }

    #[test]
    fn kubelet_serving_rules() {
        use KubeletCsrError::*;
        let u = set(SERVING_USAGES);
        let cases: Vec<(ParsedRequest, BTreeSet<String>, Result<(), KubeletCsrError>)> = vec![
            (
                req("system:node:a", &["system:nodes"], &["a"], &["10.0.0.1"]),
                u.clone(),
                Ok(()),
            ),
            (
                req("system:node:a", &["system:nodes"], &[], &[]),
                u.clone(),
                Err(DnsOrIpSanRequired),
            ),
            (
                req("system:node:a", &[], &["a"], &[]),
                u.clone(),
                Err(OrganizationNotSystemNodes),
            ),
            (
                req("a", &["system:nodes"], &["a"], &[]),
                u.clone(),
                Err(CommonNameNotSystemNode),
            ),
            (
                req("system:node:a", &["system:nodes"], &["a"], &[]),
                set(CLIENT_USAGES),
                Err(Usages(SERVING_USAGES)),
            ),
        ];
        for (r, u, want) in cases {
            assert_eq!(validate_kubelet_serving(&r, &u), want, "{r:?}");
        }
    }

    #[test]
    fn parses_a_real_request() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["node-a".to_string()]).unwrap();
        p.subject_alt_names
            .push(rcgen::SanType::IpAddress("10.0.0.7".parse().unwrap()));
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::OrganizationName, "system:nodes");
        dn.push(rcgen::DnType::CommonName, "system:node:node-a");
        p.distinguished_name = dn;
        let pem = p.serialize_request(&key).unwrap().pem().unwrap();
        let r = parse_request_pem(pem.as_bytes()).unwrap();
        assert_eq!(
            r,
            req(
                "system:node:node-a",
                &["system:nodes"],
                &["node-a"],
                &["10.0.0.7"]
            )
        );
        assert!(
            parse_request_pem(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
                .is_err()
        );
    }
}
