//! pods/log and nodes/proxy reach the node's kubelet over HTTPS verified by the cluster CA;
//! an unreachable kubelet is a clear error naming it.

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
    let certs = rustls_pemfile::certs(&mut std::fs::read(crt).expect("crt").as_slice())
        .collect::<Result<Vec<_>, _>>()
        .expect("certs");
    let key = rustls_pemfile::private_key(&mut std::fs::read(key).expect("key").as_slice())
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
