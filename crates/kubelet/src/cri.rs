//! The kubelet's connection to a CRI runtime over a Unix socket.

use cri::runtime::v1::image_service_client::ImageServiceClient;
use cri::runtime::v1::runtime_service_client::RuntimeServiceClient;
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

/// The CRI RuntimeService client. Cheap to clone: clones share one HTTP/2 connection.
pub type RuntimeClient = RuntimeServiceClient<Channel>;
/// The CRI ImageService client.
pub type ImageClient = ImageServiceClient<Channel>;

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
