//! Node join as a client meets it: bootstrap tokens authenticate (or are Unauthorized),
//! kubelet client CSRs from a bootstrapper are approved and signed by the cluster CA, a
//! node asking for another node's serving certificate is denied, an administrator approves
//! a user's CSR with `kubectl certificate approve`, cluster-info carries a JWS the token
//! verifies, and expired tokens are cleaned up.

mod common;

use std::path::Path;

use base64::Engine;
use nodus_control_plane::apiserver::authn::bootstraptoken::detached_token_is_valid;

const TOKEN_ID: &str = "abcdef";
const TOKEN_SECRET: &str = "0123456789abcdef";

/// `kubectl create secret` of a bootstrap token, as `kubeadm token create` stores one.
async fn create_token(c: &common::Cluster, id: &str, secret: &str, expiration: &str) {
    let name = format!("bootstrap-token-{id}");
    let mut args = vec![
        "create".to_string(),
        "secret".into(),
        "generic".into(),
        name,
        "-n".into(),
        "kube-system".into(),
        "--type=bootstrap.kubernetes.io/token".into(),
        format!("--from-literal=token-id={id}"),
        format!("--from-literal=token-secret={secret}"),
        "--from-literal=usage-bootstrap-authentication=true".into(),
        "--from-literal=usage-bootstrap-signing=true".into(),
        "--from-literal=auth-extra-groups=system:bootstrappers:kubeadm:default-node-token".into(),
    ];
    if !expiration.is_empty() {
        args.push(format!("--from-literal=expiration={expiration}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    c.kubectl(&args).await.ok();
}

/// kubectl with only a server, the CA and a bearer token.
async fn with_token(
    c: &common::Cluster,
    token: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> common::Out {
    let empty = c.dir.path().join("empty.kubeconfig");
    std::fs::write(&empty, "apiVersion: v1\nkind: Config\n").expect("empty kubeconfig");
    let server = format!("--server={}", c.handle.url);
    let ca = format!(
        "--certificate-authority={}",
        c.dir.path().join("pki/ca.crt").display()
    );
    let tok = format!("--token={token}");
    let mut all = vec![server.as_str(), ca.as_str(), tok.as_str()];
    all.extend_from_slice(args);
    common::kubectl_with(&empty, &all, stdin).await
}

/// A kubeconfig holding only the server, the CA and `token`.
fn token_kubeconfig(c: &common::Cluster, token: &str) -> std::path::PathBuf {
    let ca = std::fs::read(c.dir.path().join("pki/ca.crt")).expect("ca");
    let path = c
        .dir
        .path()
        .join(format!("token-{}.kubeconfig", token.replace('.', "-")));
    let cfg = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
        c.handle.url,
        base64::engine::general_purpose::STANDARD.encode(ca)
    );
    std::fs::write(&path, cfg).expect("kubeconfig");
    path
}

/// A PEM certificate request for `cn` in `orgs` with DNS and IP SANs.
fn request(cn: &str, orgs: &[&str], dns: &[&str], ips: &[&str]) -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut p =
        rcgen::CertificateParams::new(dns.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("params");
    for ip in ips {
        p.subject_alt_names
            .push(rcgen::SanType::IpAddress(ip.parse().expect("ip")));
    }
    let mut dn = rcgen::DistinguishedName::new();
    for o in orgs {
        dn.push(rcgen::DnType::OrganizationName, *o);
    }
    dn.push(rcgen::DnType::CommonName, cn);
    p.distinguished_name = dn;
    p.serialize_request(&key).expect("csr").pem().expect("pem")
}

fn csr_yaml(name: &str, pem: &str, signer: &str, usages: &[&str]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(pem);
    let usages: Vec<String> = usages.iter().map(|u| format!("  - {u}")).collect();
    format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  name: {name}\nspec:\n  request: {b64}\n  signerName: {signer}\n  usages:\n{}\n",
        usages.join("\n")
    )
}

/// The subject and issuer of the issued certificate (base64 PEM in status.certificate).
fn issued(b64: &str, ca: &Path) -> (String, Vec<String>) {
    let pem = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .expect("base64");
    let der = rustls_pemfile::certs(&mut pem.as_slice())
        .next()
        .expect("a certificate")
        .expect("pem");
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    let ca_pem = std::fs::read(ca).expect("ca");
    let ca_der = rustls_pemfile::certs(&mut ca_pem.as_slice())
        .next()
        .expect("ca cert")
        .expect("pem");
    let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_der).expect("ca x509");
    cert.verify_signature(Some(ca_cert.public_key()))
        .expect("signed by the cluster CA");
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or("")
        .to_string();
    let orgs = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    (cn, orgs)
}

async fn jsonpath(c: &common::Cluster, name: &str, path: &str) -> String {
    c.kubectl(&["get", "csr", name, "-o", &format!("jsonpath={path}")])
        .await
        .ok()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_tokens_authenticate_and_expire() {
    let c = common::start().await;
    create_token(&c, TOKEN_ID, TOKEN_SECRET, "2099-01-01T00:00:00Z").await;
    create_token(&c, "expire", "0123456789abcdef", "2020-01-01T00:00:00Z").await;
    let token = format!("{TOKEN_ID}.{TOKEN_SECRET}");

    let who = with_token(&c, &token, &["auth", "whoami"], None).await;
    let out = who.ok();
    assert!(out.contains("system:bootstrap:abcdef"), "{out}");
    assert!(
        out.contains("[system:bootstrappers system:bootstrappers:kubeadm:default-node-token system:authenticated]"),
        "{out}"
    );

    for bad in [
        "expire.0123456789abcdef",
        "abcdef.0123456789abcdee",
        "zzzzzz.0123456789abcdef",
        "abcdef.0123456789ABCDEF",
        "not-a-token",
    ] {
        let r = with_token(&c, bad, &["get", "pods"], None).await;
        assert!(
            r.fails()
                .contains("error: You must be logged in to the server"),
            "{bad}: {}",
            r.stderr
        );
        let client = common::client_for(&token_kubeconfig(&c, bad)).await;
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        match api.list(&Default::default()).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!(
                    (s.code, s.message.as_str(), s.reason.as_str()),
                    (401, "Unauthorized", "Unauthorized"),
                    "{bad}"
                );
            }
            other => panic!("{bad}: expected 401, got {other:?}"),
        }
    }

    // The token cleaner removes the expired token's Secret.
    common::eventually("the expired token is deleted", || async {
        let r = c
            .kubectl(&[
                "get",
                "secret",
                "bootstrap-token-expire",
                "-n",
                "kube-system",
            ])
            .await;
        (r.code != 0 && r.stderr.contains("NotFound")).then_some(())
    })
    .await;
    let live = c
        .kubectl(&[
            "get",
            "secret",
            "bootstrap-token-abcdef",
            "-n",
            "kube-system",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(live.ok().trim(), "secret/bootstrap-token-abcdef");

    // cluster-info: server and CA, no credentials, and a JWS the token verifies.
    let kubeconfig = c
        .kubectl(&[
            "get",
            "cm",
            "cluster-info",
            "-n",
            "kube-public",
            "-o",
            "jsonpath={.data.kubeconfig}",
        ])
        .await
        .ok()
        .to_string();
    assert!(kubeconfig.contains(&c.handle.url), "{kubeconfig}");
    assert!(
        kubeconfig.contains("certificate-authority-data"),
        "{kubeconfig}"
    );
    assert!(
        !kubeconfig.contains("client-key-data") && !kubeconfig.contains("token"),
        "{kubeconfig}"
    );
    let jws = common::eventually("cluster-info is signed for the token", || async {
        let r = c
            .kubectl(&[
                "get",
                "cm",
                "cluster-info",
                "-n",
                "kube-public",
                "-o",
                "jsonpath={.data.jws-kubeconfig-abcdef}",
            ])
            .await;
        (r.code == 0 && !r.stdout.is_empty()).then_some(r.stdout)
    })
    .await;
    assert!(detached_token_is_valid(
        &jws,
        &kubeconfig,
        TOKEN_ID,
        TOKEN_SECRET
    ));
    assert!(!detached_token_is_valid(
        &jws,
        &kubeconfig,
        TOKEN_ID,
        "0123456789abcdee"
    ));
    let keys = c
        .kubectl(&[
            "get",
            "cm",
            "cluster-info",
            "-n",
            "kube-public",
            "-o",
            "go-template={{range $k, $v := .data}}{{$k}} {{end}}",
        ])
        .await
        .ok()
        .to_string();
    assert!(
        !keys.contains("jws-kubeconfig-expire"),
        "an expired token signs nothing: {keys}"
    );
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_csrs_are_approved_signed_or_denied() {
    let c = common::start().await;
    create_token(&c, TOKEN_ID, TOKEN_SECRET, "").await;
    let token = format!("{TOKEN_ID}.{TOKEN_SECRET}");
    let ca = c.dir.path().join("pki/ca.crt");

    // A bootstrapper's kubelet client CSR: approved and signed without an administrator.
    let pem = request("system:node:n1", &["system:nodes"], &[], &[]);
    let yaml = csr_yaml(
        "node-csr-n1",
        &pem,
        "kubernetes.io/kube-apiserver-client-kubelet",
        &["digital signature", "key encipherment", "client auth"],
    );
    with_token(&c, &token, &["create", "-f", "-"], Some(&yaml))
        .await
        .ok();
    assert_eq!(
        jsonpath(&c, "node-csr-n1", "{.spec.username}").await,
        "system:bootstrap:abcdef"
    );
    let cert = common::eventually("the node client CSR is issued", || async {
        let s = jsonpath(&c, "node-csr-n1", "{.status.certificate}").await;
        (!s.is_empty()).then_some(s)
    })
    .await;
    assert_eq!(
        issued(&cert, &ca),
        (
            "system:node:n1".to_string(),
            vec!["system:nodes".to_string()]
        )
    );
    assert_eq!(
        jsonpath(&c, "node-csr-n1", "{.status.conditions[0].reason}").await,
        "AutoApproved"
    );
    let table = c.kubectl(&["get", "csr"]).await.ok().to_string();
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "AGE",
            "SIGNERNAME",
            "REQUESTOR",
            "REQUESTEDDURATION",
            "CONDITION"
        ]
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("node-csr-n1"))
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>();
    assert_eq!(
        row[2..],
        [
            "kubernetes.io/kube-apiserver-client-kubelet",
            "system:bootstrap:abcdef",
            "<none>",
            "Approved,Issued"
        ],
        "{table}"
    );

    // Node n2 asking for n1's serving certificate is denied, with the reason. The CSR is
    // stored as the API records a node's request (requester filled in from its identity):
    // which CSRs a node may create is the Node authorizer's and RBAC's business.
    let pem = request("system:node:n1", &["system:nodes"], &["n1"], &["10.0.0.1"]);
    let csr = serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": "serving-n1-by-n2", "uid": "9f1d7c1e-0000-4000-8000-000000000001",
            "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"request": base64::engine::general_purpose::STANDARD.encode(&pem),
            "signerName": "kubernetes.io/kubelet-serving",
            "usages": ["digital signature", "key encipherment", "server auth"],
            "username": "system:node:n2", "groups": ["system:nodes", "system:authenticated"]},
    });
    c.handle
        .store()
        .create(
            "/certificates.k8s.io/certificatesigningrequests/serving-n1-by-n2",
            csr,
        )
        .expect("stored");
    let reason = common::eventually("the foreign serving CSR is denied", || async {
        let s = jsonpath(
            &c,
            "serving-n1-by-n2",
            "{.status.conditions[?(@.type==\"Denied\")].reason}",
        )
        .await;
        (!s.is_empty()).then_some(s)
    })
    .await;
    assert_eq!(reason, "NodeNameMismatch");
    let msg = jsonpath(&c, "serving-n1-by-n2", "{.status.conditions[0].message}").await;
    assert_eq!(
        msg,
        "node \"system:node:n2\" may not request a certificate for \"system:node:n1\""
    );
    assert_eq!(
        jsonpath(&c, "serving-n1-by-n2", "{.status.certificate}").await,
        ""
    );

    // A request that is no certificate request is refused with upstream's text.
    let bad = csr_yaml(
        "bad",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        "kubernetes.io/kube-apiserver-client",
        &["client auth"],
    );
    let r = c.kubectl_stdin(&["create", "-f", "-"], Some(&bad)).await;
    let err = r.fails();
    assert!(
        err.contains(
            "The CertificateSigningRequest \"bad\" is invalid: spec.request: Invalid value"
        ),
        "{err}"
    );
    assert!(
        err.contains("PEM block type must be CERTIFICATE REQUEST"),
        "{err}"
    );
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn administrator_approves_and_denies_user_csrs() {
    let c = common::start().await;
    let ca = c.dir.path().join("pki/ca.crt");
    let pem = request("alice", &["dev"], &[], &[]);
    let mut yaml = csr_yaml(
        "alice",
        &pem,
        "kubernetes.io/kube-apiserver-client",
        &["client auth"],
    );
    yaml.push_str("  expirationSeconds: 86400\n");
    c.kubectl_stdin(&["create", "-f", "-"], Some(&yaml))
        .await
        .ok();
    let pending = c
        .kubectl(&["get", "csr", "alice", "--no-headers"])
        .await
        .ok()
        .to_string();
    assert!(
        pending.contains(" 24h ") && pending.trim_end().ends_with("Pending"),
        "{pending}"
    );

    let out = c.kubectl(&["certificate", "approve", "alice"]).await;
    assert_eq!(
        out.ok().trim(),
        "certificatesigningrequest.certificates.k8s.io/alice approved"
    );
    let cert = common::eventually("alice's CSR is issued", || async {
        let s = jsonpath(&c, "alice", "{.status.certificate}").await;
        (!s.is_empty()).then_some(s)
    })
    .await;
    assert_eq!(
        issued(&cert, &ca),
        ("alice".to_string(), vec!["dev".to_string()])
    );

    // Approval cannot be taken back through the main resource or status.
    let pem = request("bob", &[], &[], &[]);
    let yaml = csr_yaml(
        "bob",
        &pem,
        "kubernetes.io/kube-apiserver-client",
        &["client auth"],
    );
    c.kubectl_stdin(&["create", "-f", "-"], Some(&yaml))
        .await
        .ok();
    let out = c.kubectl(&["certificate", "deny", "bob"]).await;
    assert_eq!(
        out.ok().trim(),
        "certificatesigningrequest.certificates.k8s.io/bob denied"
    );
    let r = c
        .kubectl(&[
            "patch",
            "csr",
            "bob",
            "--subresource=status",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/status/conditions/0/type","value":"Approved"}]"#,
        ])
        .await;
    assert!(
        r.fails()
            .contains("updates may not add a condition of type \\\"Approved\\\"")
            || r.stderr
                .contains("updates may not add a condition of type \"Approved\""),
        "{}",
        r.stderr
    );
    let row = c
        .kubectl(&["get", "csr", "bob", "--no-headers"])
        .await
        .ok()
        .to_string();
    assert!(row.trim_end().ends_with("Denied"), "{row}");
    assert_eq!(jsonpath(&c, "bob", "{.status.certificate}").await, "");
    c.handle.shutdown().await;
}
