//! The kubelet's connection to a CRI runtime over a Unix socket.

use crate::metrics::RuntimeOperations;
use cri::runtime::v1::image_service_client::ImageServiceClient;
use cri::runtime::v1::runtime_service_client::RuntimeServiceClient;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint, Uri};

/// The CRI RuntimeService client. Cheap to clone: clones share one HTTP/2 connection.
pub type RuntimeClient = RuntimeServiceClient<Instrumented>;
/// The CRI ImageService client.
pub type ImageClient = ImageServiceClient<Instrumented>;

/// The connection to the runtime, each call counted in `kubelet_runtime_operations_*` when
/// the kubelet has metrics (upstream's instrumentedRuntimeService, at the one place every
/// call passes rather than in a wrapper per RPC).
#[derive(Clone)]
pub struct Instrumented {
    channel: Channel,
    ops: Option<RuntimeOperations>,
}

/// upstream's operation_type for a CRI method path: `/runtime.v1.RuntimeService/
/// RunPodSandbox` → `run_podsandbox`.
pub fn operation_type(path: &str) -> String {
    let method = path.rsplit('/').next().unwrap_or(path);
    match method {
        // upstream's names where they are not the method's own.
        "UpdateContainerResources" => return "update_container".into(),
        "GetContainerEvents" => return "get_container_events".into(),
        _ => {}
    }
    let mut out = String::new();
    for (i, ch) in method.replace("PodSandbox", "Podsandbox").char_indices() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    out
}

/// A unary call's failure shows in its response headers (gRPC's trailers-only response).
fn failed(r: &Result<http::Response<tonic::body::Body>, tonic::transport::Error>) -> bool {
    match r {
        Err(_) => true,
        Ok(resp) => resp
            .headers()
            .get("grpc-status")
            .is_some_and(|v| v.as_bytes() != b"0"),
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Instrumented {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.channel, cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let ops = self.ops.clone();
        let op = ops.as_ref().map(|_| operation_type(req.uri().path()));
        let started = Instant::now();
        let call = tower::Service::call(&mut self.channel, req);
        Box::pin(async move {
            let r = call.await;
            if let (Some(ops), Some(op)) = (ops, op) {
                ops.record(&op, started.elapsed(), failed(&r));
            }
            r
        })
    }
}

/// Both CRI services of one runtime endpoint.
#[derive(Clone)]
pub struct Runtime {
    pub runtime: RuntimeClient,
    pub image: ImageClient,
    /// The endpoint as given, e.g. `unix:///run/nodus/nodus.sock`.
    pub endpoint: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("container runtime endpoint {0:?}: only unix:// endpoints are supported")]
    Scheme(String),
    #[error("container runtime endpoint {endpoint}: {message}")]
    Dial { endpoint: String, message: String },
}

fn socket_path(endpoint: &str) -> Result<String, ConnectError> {
    if let Some(p) = endpoint.strip_prefix("unix://") {
        return Ok(p.to_string());
    }
    if endpoint.contains("://") {
        return Err(ConnectError::Scheme(endpoint.to_string()));
    }
    Ok(endpoint.to_string())
}

/// Connects lazily: like upstream's kubelet, a runtime that is not up yet is not fatal;
/// calls fail (and the PLEG reports unhealthy) until the socket answers, and the channel
/// reconnects on its own after a runtime restart.
pub fn connect(endpoint: &str, timeout: Duration) -> Result<Runtime, ConnectError> {
    connect_with(endpoint, timeout, None)
}

/// [`connect`], each call counted in the kubelet's `kubelet_runtime_operations_*`.
pub fn connect_instrumented(
    endpoint: &str,
    timeout: Duration,
    ops: RuntimeOperations,
) -> Result<Runtime, ConnectError> {
    connect_with(endpoint, timeout, Some(ops))
}

fn connect_with(
    endpoint: &str,
    timeout: Duration,
    ops: Option<RuntimeOperations>,
) -> Result<Runtime, ConnectError> {
    let path = socket_path(endpoint)?;
    // The URI is a placeholder: the connector always dials the socket.
    let ep = Endpoint::try_from("http://[::1]:50051")
        .map_err(|e| ConnectError::Dial {
            endpoint: endpoint.to_string(),
            message: e.to_string(),
        })?
        .connect_timeout(timeout)
        .timeout(Duration::from_secs(120));
    let channel = ep.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let p = path.clone();
        async move {
            let s = tokio::net::UnixStream::connect(p).await?;
            Ok::<_, std::io::Error>(TokioIo::new(s))
        }
    }));
    let channel = Instrumented { channel, ops };
    Ok(Runtime {
        runtime: RuntimeServiceClient::new(channel.clone()),
        image: ImageServiceClient::new(channel),
        endpoint: endpoint.to_string(),
    })
}

/// Strips the `<runtime>://` scheme the kubelet puts in front of container ids in pod status.
pub fn bare_container_id(id: &str) -> &str {
    id.split_once("://").map(|(_, rest)| rest).unwrap_or(id)
}

/// Dials a gRPC server on a Unix socket at once (the device plugin sockets, the pod
/// resources API): an error when nothing answers within `timeout`. The error text carries
/// its causes, as a log line should.
pub async fn dial_unix(path: std::path::PathBuf, timeout: Duration) -> Result<Channel, String> {
    let ep = Endpoint::try_from("http://[::1]:50051")
        .map_err(|e| e.to_string())?
        .connect_timeout(timeout);
    let connect = ep.connect_with_connector(tower::service_fn(move |_: Uri| {
        let p = path.clone();
        async move {
            let s = tokio::net::UnixStream::connect(p).await?;
            Ok::<_, std::io::Error>(TokioIo::new(s))
        }
    }));
    match tokio::time::timeout(timeout, connect).await {
        Err(_) => Err("context deadline exceeded".into()),
        Ok(Err(e)) => {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = format!("{msg}: {s}");
                src = s.source();
            }
            Err(msg)
        }
        Ok(Ok(c)) => Ok(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_types_are_upstreams() {
        for (path, want) in [
            ("/runtime.v1.RuntimeService/RunPodSandbox", "run_podsandbox"),
            (
                "/runtime.v1.RuntimeService/PodSandboxStatus",
                "podsandbox_status",
            ),
            (
                "/runtime.v1.RuntimeService/ListPodSandbox",
                "list_podsandbox",
            ),
            (
                "/runtime.v1.RuntimeService/ListPodSandboxStats",
                "list_podsandbox_stats",
            ),
            (
                "/runtime.v1.RuntimeService/StopPodSandbox",
                "stop_podsandbox",
            ),
            (
                "/runtime.v1.RuntimeService/ContainerStatus",
                "container_status",
            ),
            (
                "/runtime.v1.RuntimeService/ListContainers",
                "list_containers",
            ),
            (
                "/runtime.v1.RuntimeService/UpdateContainerResources",
                "update_container",
            ),
            (
                "/runtime.v1.RuntimeService/ReopenContainerLog",
                "reopen_container_log",
            ),
            ("/runtime.v1.RuntimeService/ExecSync", "exec_sync"),
            ("/runtime.v1.RuntimeService/Version", "version"),
            ("/runtime.v1.ImageService/ImageFsInfo", "image_fs_info"),
            ("/runtime.v1.ImageService/PullImage", "pull_image"),
        ] {
            assert_eq!(operation_type(path), want, "{path}");
        }
    }
}
