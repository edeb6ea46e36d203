//! Dialling a CRI endpoint over a Unix socket.

use crate::CrictlError;
use cri::runtime::v1::image_service_client::ImageServiceClient;
use cri::runtime::v1::runtime_service_client::RuntimeServiceClient;
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

/// Clients for both CRI services.
#[derive(Clone)]
pub struct Clients {
    pub runtime: RuntimeServiceClient<Channel>,
    pub image: ImageServiceClient<Channel>,
}

fn socket_path(endpoint: &str) -> Result<String, CrictlError> {
    if let Some(p) = endpoint.strip_prefix("unix://") {
        return Ok(p.to_string());
    }
    if endpoint.contains("://") {
        return Err(CrictlError::Usage(format!(
            "endpoint {endpoint:?}: only unix:// endpoints are supported"
        )));
    }
    Ok(endpoint.to_string())
}

async fn channel(endpoint: &str, timeout: Duration) -> Result<Channel, CrictlError> {
    let path = socket_path(endpoint)?;
    // The URI is a placeholder: the connector below always dials the socket.
    let ep = Endpoint::try_from("http://[::1]:50051")
        .map_err(|e| CrictlError::Connect(e.to_string()))?
        .connect_timeout(timeout);
    let p = path.clone();
    let connect = ep.connect_with_connector(tower::service_fn(move |_: Uri| {
        let p = p.clone();
        async move {
            let s = tokio::net::UnixStream::connect(p).await?;
            Ok::<_, std::io::Error>(TokioIo::new(s))
        }
    }));
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(ch)) => Ok(ch),
        Ok(Err(e)) => Err(CrictlError::Connect(format!(
            "validate service connection: failed to connect to {endpoint}: {e}: {}",
            source_chain(&e)
        ))),
        Err(_) => Err(CrictlError::Connect(format!(
            "validate service connection: timed out connecting to {endpoint} after {timeout:?}"
        ))),
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = Vec::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push(s.to_string());
        cur = s.source();
    }
    out.join(": ")
}

/// Connects to the runtime endpoint and the image endpoint (the same one when not given).
pub async fn connect(
    runtime_endpoint: &str,
    image_endpoint: Option<&str>,
    timeout: Duration,
) -> Result<Clients, CrictlError> {
    let rt = channel(runtime_endpoint, timeout).await?;
    let im = match image_endpoint {
        Some(e) if e != runtime_endpoint => channel(e, timeout).await?,
        _ => rt.clone(),
    };
    Ok(Clients {
        runtime: RuntimeServiceClient::new(rt),
        image: ImageServiceClient::new(im),
    })
}
