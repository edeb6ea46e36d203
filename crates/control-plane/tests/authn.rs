//! Authentication as clients meet it: anonymous requests reach only health and version,
//! bearer tokens come from the static token file, unknown tokens are Unauthorized.

mod common;

use std::sync::Arc;

use nodus_control_plane::apiserver::state::ApiConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A GET with no client certificate and no token; returns (status code, body).
async fn anonymous_get(
    addr: std::net::SocketAddr,
    ca: &std::path::Path,
    path: &str,
) -> (u16, String) {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut std::fs::read(ca).expect("ca").as_slice()) {
        roots.add(c.expect("cert")).expect("root");
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .expect("tls");
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_tokens_and_health() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tokens.csv"), "s3cret,alice,1000,\"dev\"\n").expect("tokens");
    let handle = common::start_in(dir.path(), ApiConfig::default()).await;
    let ca = dir.path().join("pki/ca.crt");

    let (code, body) = anonymous_get(handle.addr, &ca, "/readyz?verbose").await;
    assert_eq!(code, 200);
    assert!(body.contains("readyz check passed"), "{body}");
    let (code, body) = anonymous_get(handle.addr, &ca, "/version").await;
    assert_eq!(code, 200);
    assert!(body.contains("\"gitVersion\":\"v1.33.0+nodus\""), "{body}");
    let (code, body) = anonymous_get(handle.addr, &ca, "/api/v1/namespaces/default/pods").await;
    assert_eq!(code, 403);
    assert!(
        body.contains(r#"pods is forbidden: User \"system:anonymous\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""#),
        "{body}"
    );
    let (code, body) = anonymous_get(handle.addr, &ca, "/apis").await;
    assert_eq!(code, 403);
    assert!(
        body.contains(r#"forbidden: User \"system:anonymous\" cannot get path \"/apis\""#),
        "{body}"
    );

    // alice's group may read kube-system, as an operator would grant it.
    let admin = common::kubectl_with(
        &handle.kubeconfig,
        &[
            "create",
            "rolebinding",
            "dev-view",
            "--clusterrole=view",
            "--group=dev",
            "-n",
            "kube-system",
        ],
        None,
    )
    .await;
    assert_eq!(admin.code, 0, "{}", admin.stderr);
    let empty = dir.path().join("empty.kubeconfig");
    std::fs::write(&empty, "apiVersion: v1\nkind: Config\n").expect("empty kubeconfig");
    let server = format!("--server={}", handle.url);
    let ca_flag = format!("--certificate-authority={}", ca.display());
    let alice = common::kubectl_with(
        &empty,
        &[
            &server,
            &ca_flag,
            "--token=s3cret",
            "get",
            "configmaps",
            "-n",
            "kube-system",
        ],
        None,
    )
    .await;
    assert_eq!(alice.code, 0, "{}", alice.stderr);
    let bad = common::kubectl_with(
        &empty,
        &[&server, &ca_flag, "--token=wrong", "get", "pods"],
        None,
    )
    .await;
    assert!(
        bad.fails()
            .contains("error: You must be logged in to the server (Unauthorized)"),
        "{}",
        bad.stderr
    );
    handle.shutdown().await;
}
