//! pods/log and nodes/proxy reach the node's kubelet over HTTPS verified by the cluster CA;
//! an unreachable kubelet is a clear error naming it; `--insecure-skip-tls-verify-backend`
//! reaches one whose certificate the CA did not sign.

mod common;

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A stand-in kubelet: HTTPS on 127.0.0.1 with a CA-signed serving certificate, answering
/// every request with its method and path.
async fn fake_kubelet(dir: &std::path::Path) -> u16 {
    let (crt, key) = nodus_control_plane::pki::issue_kubelet_serving_cert(
        dir,
        "n1",
        &["127.0.0.1".parse().expect("ip")],
    )
    .expect("serving cert");
    serve_kubelet(
        &std::fs::read_to_string(crt).expect("crt"),
        &std::fs::read_to_string(key).expect("key"),
    )
    .await
}

/// [`fake_kubelet`] with a self-signed serving certificate the cluster CA knows nothing of.
async fn self_signed_kubelet() -> u16 {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut p = rcgen::CertificateParams::new(vec!["n1".to_string()]).expect("params");
    p.subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    let cert = p.self_signed(&key).expect("cert");
    serve_kubelet(&cert.pem(), &key.serialize_pem()).await
}

async fn serve_kubelet(crt: &str, key: &str) -> u16 {
    let certs = rustls_pemfile::certs(&mut crt.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certs");
    let key = rustls_pemfile::private_key(&mut key.as_bytes())
        .expect("key")
        .expect("a key");
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("tls");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = vec![0u8; 8192];
                let Ok(n) = tls.read(&mut buf).await else {
                    return;
                };
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let line = head.lines().next().unwrap_or("").to_string();
                if head.to_ascii_lowercase().contains("\r\nupgrade: spdy/3.1") {
                    // A stream upgrade: switch protocols, then echo every byte back.
                    let resp = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n";
                    if tls.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                    let mut chunk = [0u8; 1024];
                    while let Ok(n) = tls.read(&mut chunk).await {
                        if n == 0 || tls.write_all(&chunk[..n]).await.is_err() {
                            break;
                        }
                        let _ = tls.flush().await;
                    }
                    return;
                }
                let body = format!("kubelet saw: {line}\n");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(resp.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_and_node_proxy_go_to_the_kubelet() {
    let c = common::start().await;
    let port = fake_kubelet(c.dir.path()).await;
    let node = format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: n1}}\nstatus:\n  addresses: [{{type: InternalIP, address: 127.0.0.1}}]\n  daemonEndpoints: {{kubeletEndpoint: {{Port: {port}}}}}\n"
    );
    c.kubectl_stdin(&["create", "-f", "-"], Some(&node))
        .await
        .ok();
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  nodeName: n1\n  containers: [{name: c, image: busybox}]\n";
    c.kubectl_stdin(&["create", "-f", "-"], Some(pod))
        .await
        .ok();

    let logs = c.kubectl(&["logs", "p", "--tail=5"]).await;
    assert_eq!(
        logs.ok().trim(),
        "kubelet saw: GET /containerLogs/default/p/c?tailLines=5 HTTP/1.1"
    );
    let raw = c
        .kubectl(&["get", "--raw", "/api/v1/nodes/n1/proxy/stats/summary"])
        .await;
    assert_eq!(raw.ok().trim(), "kubelet saw: GET /stats/summary HTTP/1.1");

    let pod2 = "apiVersion: v1\nkind: Pod\nmetadata: {name: q}\nspec:\n  nodeName: gone\n  containers: [{name: c, image: busybox}]\n";
    c.kubectl_stdin(&["create", "-f", "-"], Some(pod2))
        .await
        .ok();
    let node2 = "apiVersion: v1\nkind: Node\nmetadata: {name: gone}\nstatus:\n  addresses: [{type: InternalIP, address: 127.0.0.1}]\n  daemonEndpoints: {kubeletEndpoint: {Port: 1}}\n";
    c.kubectl_stdin(&["create", "-f", "-"], Some(node2))
        .await
        .ok();
    let err = c.kubectl(&["logs", "q"]).await;
    let text = err.fails();
    assert!(
        text.contains("cannot reach the kubelet of node \"gone\" at https://127.0.0.1:1"),
        "{text}"
    );
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_skip_tls_verify_backend_reaches_an_unverified_kubelet() {
    let c = common::start().await;
    let port = self_signed_kubelet().await;
    let node = format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: n1}}\nstatus:\n  addresses: [{{type: InternalIP, address: 127.0.0.1}}]\n  daemonEndpoints: {{kubeletEndpoint: {{Port: {port}}}}}\n"
    );
    c.kubectl_stdin(&["create", "-f", "-"], Some(&node))
        .await
        .ok();
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  nodeName: n1\n  containers: [{name: c, image: busybox}]\n";
    c.kubectl_stdin(&["create", "-f", "-"], Some(pod))
        .await
        .ok();
    let refused = c.kubectl(&["logs", "p"]).await;
    let text = refused.fails();
    assert!(
        text.contains("cannot reach the kubelet of node \"n1\""),
        "{text}"
    );
    let logs = c
        .kubectl(&["logs", "p", "--insecure-skip-tls-verify-backend"])
        .await;
    assert!(
        logs.ok()
            .trim()
            .starts_with("kubelet saw: GET /containerLogs/default/p/c?"),
        "{}",
        logs.stdout
    );
    c.handle.shutdown().await;
}

/// TLS as the admin client (its certificate from the data dir), HTTP/1.1.
async fn admin_tls(
    dir: &std::path::Path,
    addr: std::net::SocketAddr,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let pem = |p: &str| std::fs::read(dir.join(p)).expect("pem");
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut pem("pki/ca.crt").as_slice()) {
        roots.add(c.expect("cert")).expect("root");
    }
    let certs = rustls_pemfile::certs(&mut pem("pki/admin.crt").as_slice())
        .collect::<Result<Vec<_>, _>>()
        .expect("certs");
    let key = rustls_pemfile::private_key(&mut pem("pki/admin.key").as_slice())
        .expect("key")
        .expect("a key");
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(certs, key)
    .expect("client auth");
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .expect("tls")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_upgrades_are_tunnelled_to_the_kubelet() {
    let c = common::start().await;
    let port = fake_kubelet(c.dir.path()).await;
    let node = format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: n1}}\nstatus:\n  addresses: [{{type: InternalIP, address: 127.0.0.1}}]\n  daemonEndpoints: {{kubeletEndpoint: {{Port: {port}}}}}\n"
    );
    c.kubectl_stdin(&["create", "-f", "-"], Some(&node))
        .await
        .ok();
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  nodeName: n1\n  containers: [{name: c, image: busybox}]\n";
    c.kubectl_stdin(&["create", "-f", "-"], Some(pod))
        .await
        .ok();

    let mut tls = admin_tls(c.dir.path(), c.handle.addr).await;
    let req = "POST /api/v1/namespaces/default/pods/p/exec?command=sh&command=-c&command=true&stdout=true HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n";
    tls.write_all(req.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tls.read(&mut byte).await.expect("read");
        assert_eq!(
            n,
            1,
            "connection closed in the response head: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{head}"
    );
    tls.write_all(b"ping")
        .await
        .expect("write through the tunnel");
    tls.flush().await.expect("flush");
    let mut back = [0u8; 4];
    tls.read_exact(&mut back)
        .await
        .expect("echo through the tunnel");
    assert_eq!(&back, b"ping");
    c.handle.shutdown().await;
}
