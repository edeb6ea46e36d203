//! Who a client certificate names (upstream's x509 request authenticator with
//! CommonNameUserConversion): the user is the subject's CN, the groups its O values, plus
//! `system:authenticated`. The API server and the kubelet API authenticate alike.

/// (user, groups) from a DER client certificate; None when it has no usable CN.
pub fn identity(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    groups.push("system:authenticated".into());
    Some((name, groups))
}
