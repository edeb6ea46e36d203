//! The probe handlers against local servers: HTTP (headers, redirects, status codes, body
//! limit, errors), TCP and gRPC health checks, with upstream's result texts.

use axum::Router;
use axum::http::HeaderMap;
use axum::response::Redirect;
use axum::routing::get;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction, HTTPHeader};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use nodus_kubelet::prober::grpc::{self, HealthCheckRequest, HealthCheckResponse, ServingStatus};
use nodus_kubelet::prober::handler::{HandlerResult, Outcome};
use nodus_kubelet::prober::http::{HttpProber, MAX_RESPONSE_BODY, Purpose, build_request};
use nodus_kubelet::prober::tcp;
use std::convert::Infallible;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

async fn serve(app: Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    port
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn action(port: u16, path: &str) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.into()),
        port: IntOrString::Int(i32::from(port)),
        ..Default::default()
    }
}

async fn probe(action: &HTTPGetAction) -> HandlerResult {
    let req = build_request(action, &Container::default(), "127.0.0.1", Purpose::Probe).unwrap();
    HttpProber::new().unwrap().probe(&req, T).await.unwrap()
}

async fn echo_headers(headers: HeaderMap) -> String {
    let mut lines: Vec<String> = headers
        .iter()
        .map(|(k, v)| format!("{k}={}", v.to_str().unwrap_or_default()))
        .collect();
    lines.sort();
    lines.join("\n")
}

#[tokio::test]
async fn http_status_codes_and_headers() {
    let app = Router::new()
        .route("/ok", get(echo_headers))
        .route(
            "/teapot",
            get(|| async { (axum::http::StatusCode::IM_A_TEAPOT, "secret body") }),
        )
        .route("/big", get(|| async { "x".repeat(100_000) }));
    let port = serve(app).await;

    let r = probe(&action(port, "/ok")).await;
    assert_eq!(r.outcome, Outcome::Success);
    assert!(
        r.output.contains("user-agent=kube-probe/1.33"),
        "{}",
        r.output
    );
    assert!(r.output.contains("accept=*/*"), "{}", r.output);

    let mut custom = action(port, "ok");
    custom.http_headers = Some(vec![
        HTTPHeader {
            name: "User-Agent".into(),
            value: "mine".into(),
        },
        HTTPHeader {
            name: "X-Probe".into(),
            value: "1".into(),
        },
        HTTPHeader {
            name: "Accept".into(),
            value: "application/json".into(),
        },
        HTTPHeader {
            name: "Host".into(),
            value: "example.test".into(),
        },
    ]);
    let r = probe(&custom).await;
    assert_eq!(r.outcome, Outcome::Success);
    assert!(r.output.contains("user-agent=mine"), "{}", r.output);
    assert!(r.output.contains("x-probe=1"), "{}", r.output);
    assert!(r.output.contains("host=example.test"), "{}", r.output);
    assert!(r.output.contains("accept=application/json"), "{}", r.output);

    let r = probe(&action(port, "/teapot")).await;
    assert_eq!(
        r,
        HandlerResult::new(Outcome::Failure, "HTTP probe failed with statuscode: 418")
    );

    let r = probe(&action(port, "/big")).await;
    assert_eq!(r.outcome, Outcome::Success);
    assert_eq!(r.output.len(), MAX_RESPONSE_BODY);

    let lifecycle = build_request(
        &action(port, "/ok"),
        &Container::default(),
        "127.0.0.1",
        Purpose::Lifecycle,
    )
    .unwrap();
    assert_eq!(
        lifecycle.headers.get("user-agent").unwrap(),
        "kube-lifecycle/1.33"
    );
    assert_eq!(lifecycle.url, format!("http://127.0.0.1:{port}/ok"));
}

#[tokio::test]
async fn http_redirects_same_host_followed_other_host_warned() {
    let other = serve(Router::new().route("/", get(|| async { "elsewhere" }))).await;
    let app = Router::new()
        .route("/ok", get(|| async { "fine" }))
        .route("/local", get(|| async { Redirect::temporary("/ok") }))
        .route(
            "/away",
            get(move || async move { Redirect::temporary(&format!("http://localhost:{other}/")) }),
        )
        .route("/loop", get(|| async { Redirect::temporary("/loop") }));
    let port = serve(app).await;

    let r = probe(&action(port, "/local")).await;
    assert_eq!(r, HandlerResult::new(Outcome::Success, "fine"));

    let r = probe(&action(port, "/away")).await;
    assert_eq!(r.outcome, Outcome::Warning);
    assert!(
        r.output
            .starts_with("Probe terminated redirects, Response body: "),
        "{}",
        r.output
    );

    let r = probe(&action(port, "/loop")).await;
    assert_eq!(r.outcome, Outcome::Failure);
    assert!(
        r.output.contains("stopped after 10 redirects"),
        "{}",
        r.output
    );
}

#[tokio::test]
async fn http_connection_errors_and_timeouts_are_failures_worded_like_go() {
    let port = free_port();
    let r = probe(&action(port, "/healthz")).await;
    assert_eq!(
        r,
        HandlerResult::new(
            Outcome::Failure,
            format!(
                "Get \"http://127.0.0.1:{port}/healthz\": dial tcp 127.0.0.1:{port}: connect: connection refused"
            )
        )
    );

    let plain = serve(Router::new().route("/", get(|| async { "plain" }))).await;
    let mut https = action(plain, "/");
    https.scheme = Some("HTTPS".into());
    let r = probe(&https).await;
    assert_eq!(
        r,
        HandlerResult::new(
            Outcome::Failure,
            format!(
                "Get \"https://127.0.0.1:{plain}/\": http: server gave HTTP response to HTTPS client"
            )
        )
    );

    let slow = serve(Router::new().route(
        "/slow",
        get(|| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            "late"
        }),
    ))
    .await;
    let req = build_request(
        &action(slow, "/slow"),
        &Container::default(),
        "127.0.0.1",
        Purpose::Probe,
    )
    .unwrap();
    let r = HttpProber::new()
        .unwrap()
        .probe(&req, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Failure);
    assert_eq!(
        r.output,
        format!(
            "Get \"http://127.0.0.1:{slow}/slow\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )
    );
}

#[tokio::test]
async fn tcp_open_and_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    assert_eq!(
        tcp::probe("127.0.0.1", port, T).await.outcome,
        Outcome::Success
    );
    drop(listener);
    assert_eq!(
        tcp::probe("127.0.0.1", port, T).await,
        HandlerResult::new(
            Outcome::Failure,
            format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
        )
    );
}

/// A grpc.health.v1.Health server: SERVING for service "" and "ready", NOT_SERVING else.
#[derive(Clone)]
struct Health;

impl tonic::server::NamedService for Health {
    const NAME: &'static str = "grpc.health.v1.Health";
}

struct Check;

impl tonic::server::UnaryService<HealthCheckRequest> for Check {
    type Response = HealthCheckResponse;
    type Future = std::future::Ready<Result<tonic::Response<HealthCheckResponse>, tonic::Status>>;
    fn call(&mut self, req: tonic::Request<HealthCheckRequest>) -> Self::Future {
        let status = match req.get_ref().service.as_str() {
            "" | "ready" => ServingStatus::Serving,
            _ => ServingStatus::NotServing,
        };
        std::future::ready(Ok(tonic::Response::new(HealthCheckResponse {
            status: status as i32,
        })))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Health {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            if req.uri().path() != "/grpc.health.v1.Health/Check" {
                return Ok(tonic::Status::unimplemented("no such method").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                HealthCheckResponse,
                HealthCheckRequest,
            >::default());
            Ok(grpc.unary(Check, req).await)
        })
    }
}

/// Any other service, so that a server without the health protocol can be tested.
#[derive(Clone)]
struct Other;

impl tonic::server::NamedService for Other {
    const NAME: &'static str = "example.Other";
}

impl tower::Service<http::Request<tonic::body::Body>> for Other {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        std::future::ready(Ok(tonic::Status::unimplemented("").into_http()))
    }
}

async fn grpc_server(health: bool) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        let mut builder = tonic::transport::Server::builder();
        let _ = if health {
            builder
                .add_service(Health)
                .serve_with_incoming(incoming)
                .await
        } else {
            builder
                .add_service(Other)
                .serve_with_incoming(incoming)
                .await
        };
    });
    port
}

#[tokio::test]
async fn grpc_health_checks() {
    let port = grpc_server(true).await;
    assert_eq!(
        grpc::probe("127.0.0.1", port, "", T).await,
        HandlerResult::new(Outcome::Success, "service healthy")
    );
    assert_eq!(
        grpc::probe("127.0.0.1", port, "ready", T).await.outcome,
        Outcome::Success
    );
    assert_eq!(
        grpc::probe("127.0.0.1", port, "db", T).await,
        HandlerResult::new(
            Outcome::Failure,
            "service unhealthy (responded with \"NOT_SERVING\")"
        )
    );

    let other = grpc_server(false).await;
    let r = grpc::probe("127.0.0.1", other, "", T).await;
    assert_eq!(r.outcome, Outcome::Failure);
    assert!(
        r.output.starts_with(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health)"
        ),
        "{}",
        r.output
    );

    let closed = free_port();
    let r = grpc::probe("127.0.0.1", closed, "", Duration::from_secs(1)).await;
    assert_eq!(
        r,
        HandlerResult::new(
            Outcome::Failure,
            format!(
                "timeout: failed to connect service \"127.0.0.1:{closed}\" within 1s: context deadline exceeded"
            )
        )
    );
}
