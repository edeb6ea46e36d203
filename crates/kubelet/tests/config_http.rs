//! The manifest URL source against a local HTTP server: a Pod, a PodList, errors and
//! invalid pods.

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use nodus_kubelet::config::{HTTP_SOURCE, PodConfig, PodOperation, PodUpdate, spawn_http_source};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

const WAIT: Duration = Duration::from_secs(30);

type Body = Arc<Mutex<(StatusCode, String)>>;

async fn serve(body: Body) -> String {
    let app = Router::new().route(
        "/pods",
        get(move || {
            let body = body.clone();
            async move {
                let (status, text) = body.lock().unwrap().clone();
                (status, text)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/pods")
}

fn pod_json(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    })
}

async fn next_op(rx: &mut UnboundedReceiver<PodUpdate>, op: PodOperation) -> PodUpdate {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(u)) if u.op == op => return u,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("pod config stream ended while waiting for {op:?}"),
            Err(_) => panic!("no {op:?} update within {WAIT:?}"),
        }
    }
}

fn names(u: &PodUpdate) -> Vec<String> {
    u.pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn single_pod_then_pod_list_then_errors() {
    let body: Body = Arc::new(Mutex::new((StatusCode::OK, pod_json("one").to_string())));
    let url = serve(body.clone()).await;
    let (config, mut rx) = PodConfig::new();
    let _src = spawn_http_source(
        url.clone(),
        "node-b".into(),
        Duration::from_millis(100),
        config.channel(HTTP_SOURCE),
    );
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add), vec!["one-node-b"]);
    assert_eq!(add.source, "http");
    let pod = &add.pods[0];
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("kubernetes.io/config.source")
            .map(String::as_str),
        Some("http")
    );
    assert_eq!(
        annotations.get("kubernetes.io/config.hash"),
        pod.metadata.uid.as_ref()
    );

    // A PodList with one invalid item: the valid ones are taken.
    let list = serde_json::json!({
        "apiVersion": "v1", "kind": "PodList",
        "items": [pod_json("one"), pod_json("two"), {"metadata": {}, "spec": {"containers": []}}]
    });
    body.lock().unwrap().1 = list.to_string();
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add), vec!["two-node-b"]);

    // Server errors and garbage leave the pods as they are.
    *body.lock().unwrap() = (StatusCode::INTERNAL_SERVER_ERROR, "boom".into());
    tokio::time::sleep(Duration::from_millis(500)).await;
    *body.lock().unwrap() = (StatusCode::OK, "{not json".into());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut current: Vec<String> = config
        .pods()
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    current.sort();
    assert_eq!(current, vec!["one-node-b", "two-node-b"]);

    // Back to one pod: the other is removed.
    *body.lock().unwrap() = (StatusCode::OK, pod_json("two").to_string());
    let remove = next_op(&mut rx, PodOperation::Remove).await;
    assert_eq!(names(&remove), vec!["one-node-b"]);
}

#[tokio::test]
async fn an_empty_body_marks_the_source_seen() {
    let body: Body = Arc::new(Mutex::new((StatusCode::OK, String::new())));
    let url = serve(body.clone()).await;
    let (config, mut rx) = PodConfig::new();
    let _src = spawn_http_source(
        url,
        "node-b".into(),
        Duration::from_millis(100),
        config.channel(HTTP_SOURCE),
    );
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert!(add.pods.is_empty());
    assert!(config.seen_all_sources(&[HTTP_SOURCE]));
}

#[tokio::test]
async fn an_unreachable_url_is_retried() {
    // A port nobody listens on, then a server appears there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let (config, mut rx) = PodConfig::new();
    let _src = spawn_http_source(
        format!("http://{addr}/pods"),
        "node-b".into(),
        Duration::from_millis(100),
        config.channel(HTTP_SOURCE),
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!config.seen_all_sources(&[HTTP_SOURCE]));
    let app = Router::new().route("/pods", get(|| async { pod_json("late").to_string() }));
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add), vec!["late-node-b"]);
}

#[tokio::test]
async fn manifest_url_headers_are_sent() {
    let app = Router::new().route(
        "/pods",
        get(|headers: axum::http::HeaderMap| async move {
            match headers.get("authorization").and_then(|v| v.to_str().ok()) {
                Some("Bearer t0ken") => (StatusCode::OK, pod_json("secret").to_string()),
                _ => (StatusCode::UNAUTHORIZED, String::new()),
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let (config, mut rx) = PodConfig::new();
    let _src = nodus_kubelet::config::spawn_http_source_with_headers(
        format!("http://{addr}/pods"),
        vec![("Authorization".into(), "Bearer t0ken".into())],
        "node-b".into(),
        Duration::from_millis(100),
        config.channel(HTTP_SOURCE),
    );
    let add = next_op(&mut rx, PodOperation::Add).await;
    assert_eq!(names(&add), vec!["secret-node-b"]);
}
