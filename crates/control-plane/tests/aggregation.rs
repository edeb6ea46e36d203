//! APIService aggregation with the real kubectl: an extension API server (here a small
//! HTTPS server in the test, serving `wardle.example.com/v1alpha1` `flunders` as upstream's
//! sample-apiserver does) behind a selectorless Service and its EndpointSlice, registered
//! by an APIService with its `caBundle`. The backend trusts only clients signed by the front
//! proxy CA it reads from `kube-system/extension-apiserver-authentication`, and answers
//! with the user the API server names in `X-Remote-User`. The APIService turns Available,
//! `kubectl api-resources` and `kubectl get flunders` reach it; when the backend goes, the
//! APIService says FailedDiscoveryCheck and requests are 503.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

/// The backend: a server certificate for `api.default.svc` from a CA of its own, client
/// certificates required from `client_ca_pem`. Returns (port, CA PEM, stop).
async fn backend(client_ca_pem: &str) -> (u16, String, tokio::sync::oneshot::Sender<()>) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.pem(), ca_key).expect("issuer");
    let key = rcgen::KeyPair::generate().expect("key");
    let params =
        rcgen::CertificateParams::new(vec!["api.default.svc".to_string()]).expect("params");
    let cert = params.signed_by(&key, &issuer).expect("cert");

    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut client_ca_pem.as_bytes()) {
        roots.add(c.expect("pem")).expect("root");
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .expect("verifier");
    let tls = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der"),
        )
        .expect("tls");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = |_cert: Option<rustls::pki_types::CertificateDer<'static>>| {
        |req: hyper::Request<hyper::body::Incoming>| async move {
            let user = req
                .headers()
                .get("X-Remote-User")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let body = match req.uri().path() {
                "/apis/wardle.example.com/v1alpha1" => json!({
                    "kind": "APIResourceList", "apiVersion": "v1",
                    "groupVersion": "wardle.example.com/v1alpha1",
                    "resources": [{"name": "flunders", "singularName": "flunder",
                        "namespaced": true, "kind": "Flunder", "verbs": ["get", "list"]}],
                }),
                p if p.ends_with("/flunders") => json!({
                    "kind": "FlunderList", "apiVersion": "wardle.example.com/v1alpha1",
                    "metadata": {"resourceVersion": "1"},
                    "items": [{"kind": "Flunder", "apiVersion": "wardle.example.com/v1alpha1",
                        "metadata": {"name": format!("hello-{user}"), "namespace": "default",
                            "creationTimestamp": "2026-12-04T00:00:00Z"}}],
                }),
                _ => {
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})
                }
            };
            let mut r = axum::response::Response::new(axum::body::Body::from(body.to_string()));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            Ok::<_, std::convert::Infallible>(r)
        }
    };
    tokio::spawn(nodus_serving::conn::serve(
        listener,
        Some(tokio_rustls::TlsAcceptor::from(Arc::new(tls))),
        nodus_serving::conn::Limits::default(),
        service,
        async move {
            let _ = stopped.await;
        },
    ));
    (port, ca.pem(), stop)
}

async fn available(c: &common::Cluster) -> Option<(String, String)> {
    let out = c
        .kubectl(&[
            "get",
            "apiservice",
            "v1alpha1.wardle.example.com",
            "-o",
            "json",
        ])
        .await;
    let v: Value = serde_json::from_str(&out.stdout).ok()?;
    let cond = v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Available")?
        .clone();
    Some((
        cond["status"].as_str()?.to_string(),
        cond["reason"].as_str()?.to_string(),
    ))
}

async fn wait_available(c: &common::Cluster, status: &str, reason: &str) {
    let started = Instant::now();
    loop {
        let got = available(c).await;
        if got
            .as_ref()
            .is_some_and(|(s, r)| s == status && r == reason)
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "APIService not {status}/{reason}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiservice_naming_a_service_is_proxied_to_its_backend() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let c = common::start().await;
    let cm = c
        .kubectl(&[
            "get",
            "configmap",
            "-n",
            "kube-system",
            "extension-apiserver-authentication",
            "-o",
            "json",
        ])
        .await;
    let cm: Value = serde_json::from_str(cm.ok()).expect("json");
    assert_eq!(
        cm["data"]["requestheader-allowed-names"],
        "[\"front-proxy-client\"]"
    );
    assert_eq!(
        cm["data"]["requestheader-username-headers"],
        "[\"X-Remote-User\"]"
    );
    let front_proxy_ca = cm["data"]["requestheader-client-ca-file"]
        .as_str()
        .expect("front proxy CA")
        .to_string();
    let (port, ca, stop) = backend(&front_proxy_ca).await;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&ca);
    c.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: api, namespace: default}}\nspec:\n  ports: [{{port: 443, targetPort: {port}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: api-1\n  namespace: default\n  labels: {{kubernetes.io/service-name: api}}\naddressType: IPv4\nendpoints: [{{addresses: ['127.0.0.1'], conditions: {{ready: true}}}}]\nports: [{{port: {port}, protocol: TCP}}]\n---\napiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {{name: v1alpha1.wardle.example.com}}\nspec:\n  group: wardle.example.com\n  version: v1alpha1\n  service: {{namespace: default, name: api, port: 443}}\n  caBundle: {b64}\n  groupPriorityMinimum: 1000\n  versionPriority: 15\n"
    ))
    .await
    .ok();
    wait_available(&c, "True", "Passed").await;

    let out = c
        .kubectl(&["api-resources", "--api-group=wardle.example.com"])
        .await;
    assert!(out.ok().contains("flunders"), "{}", out.stdout);
    let out = c
        .kubectl(&["get", "flunders", "-n", "default", "-o", "json"])
        .await;
    let list: Value = serde_json::from_str(out.ok()).expect("json");
    assert_eq!(
        list["items"][0]["metadata"]["name"], "hello-kubernetes-admin",
        "{list}"
    );

    // The backend goes: the APIService says why, and requests are 503.
    let _ = stop.send(());
    wait_available(&c, "False", "FailedDiscoveryCheck").await;
    let out = c.kubectl(&["get", "flunders", "-n", "default"]).await;
    assert!(
        out.fails()
            .contains("the server is currently unable to handle the request"),
        "{}",
        out.stderr
    );
    c.handle.shutdown().await;
}
