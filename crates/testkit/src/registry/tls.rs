//! Test certificates for HTTPS registries: a throwaway CA ([`TestCa`]) that issues server
//! certificates (IP and DNS SANs) and client certificates, all ECDSA P-256 made with rcgen.
//!
//! Nothing here is trusted by the system: a client accepts these certificates only when it is
//! given [`TestCa::cert_pem`] (containerd's / nodus's `ca` in `hosts.toml`, or
//! [`ClientTls::ca_pem`] for testkit's own [`RegistryClient`](super::RegistryClient)).
//!
//! ```
//! use testkit::registry::tls::TestCa;
//! let ca = TestCa::generate("example CA").unwrap();
//! let server = ca.server_cert(&["127.0.0.1", "localhost"]).unwrap();
//! assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
//! assert!(server.key_pem.contains("PRIVATE KEY"));
//! ```

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// A certificate and its private key, both PEM (the key is PKCS#8 `PRIVATE KEY`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertPem {
    pub cert_pem: String,
    pub key_pem: String,
}

impl CertPem {
    /// Certificate then key in one PEM text, as `reqwest::Identity::from_pem` wants it.
    pub fn identity_pem(&self) -> String {
        format!("{}{}", self.cert_pem, self.key_pem)
    }
}

/// A self-signed certificate authority that signs test certificates.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

fn dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "nodus testkit");
    dn.push(DnType::CommonName, common_name);
    dn
}

impl TestCa {
    /// A fresh CA key and self-signed CA certificate with subject CN `common_name`.
    pub fn generate(common_name: &str) -> Result<TestCa> {
        let key = KeyPair::generate().context("generate CA key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .context("self-sign CA certificate")?;
        Ok(TestCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate (PEM): the file to name in `ca = ...`.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    fn issue(
        &self,
        sans: &[&str],
        common_name: &str,
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<CertPem> {
        let key = KeyPair::generate().context("generate certificate key")?;
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .with_context(|| format!("certificate names {sans:?}"))?;
        params.distinguished_name = dn(common_name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .context("sign certificate with the test CA")?;
        Ok(CertPem {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A server certificate (`serverAuth`) valid for `names`: IP addresses become IP SANs,
    /// anything else DNS SANs.
    pub fn server_cert(&self, names: &[&str]) -> Result<CertPem> {
        let cn = names.first().copied().unwrap_or("testkit server");
        self.issue(names, cn, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate (`clientAuth`) with subject CN `common_name`.
    pub fn client_cert(&self, common_name: &str) -> Result<CertPem> {
        self.issue(&[], common_name, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// TLS settings of a testkit [`RegistryClient`](super::RegistryClient).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// A PEM CA (bundle) to trust besides the built-in roots.
    pub ca_pem: Option<String>,
    /// A client certificate and key (one PEM text) to present.
    pub identity_pem: Option<String>,
}

impl ClientTls {
    /// A `reqwest` client builder trusting `ca_pem` and presenting `identity_pem`.
    pub fn apply(&self, mut b: reqwest::ClientBuilder) -> Result<reqwest::ClientBuilder> {
        if let Some(ca) = &self.ca_pem {
            for cert in
                reqwest::Certificate::from_pem_bundle(ca.as_bytes()).context("parse the CA PEM")?
            {
                b = b.add_root_certificate(cert);
            }
        }
        if let Some(id) = &self.identity_pem {
            b = b.identity(
                reqwest::Identity::from_pem(id.as_bytes()).context("parse the client identity")?,
            );
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_distinct_certificates() {
        let ca = TestCa::generate("t").unwrap();
        let a = ca.server_cert(&["127.0.0.1", "localhost", "::1"]).unwrap();
        let b = ca.client_cert("client").unwrap();
        assert_ne!(a.cert_pem, b.cert_pem);
        assert_ne!(a.cert_pem, ca.cert_pem());
        assert!(a.identity_pem().contains("BEGIN CERTIFICATE"));
        assert!(a.identity_pem().contains("BEGIN PRIVATE KEY"));
        let tls = ClientTls {
            ca_pem: Some(ca.cert_pem().to_string()),
            identity_pem: Some(b.identity_pem()),
        };
        tls.apply(reqwest::Client::builder())
            .unwrap()
            .build()
            .unwrap();
    }

    #[test]
    fn rejects_bad_names() {
        let ca = TestCa::generate("t").unwrap();
        assert!(ca.server_cert(&["b\u{fc}cher.example"]).is_err());
    }
}
