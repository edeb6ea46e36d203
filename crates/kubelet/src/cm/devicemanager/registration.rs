//! The kubelet's Registration service on `device-plugins/kubelet.sock` (upstream's
//! devicemanager/plugin/v1beta1 server): a plugin names its API version, its socket and
//! its resource; a bad version or resource name, or a socket that does not answer, is
//! refused with upstream's message and logged.

use super::{DeviceManager, SUPPORTED_VERSIONS, endpoint};
use cri::deviceplugin::v1beta1 as pb;
use pb::registration_server::{Registration, RegistrationServer};
use std::sync::Arc;
use tonic::{Request, Response, Status};

struct Server {
    m: Arc<DeviceManager>,
}

/// Why a registration is refused before the plugin is dialled (upstream's texts).
pub fn validate(r: &pb::RegisterRequest) -> Result<(), String> {
    if !SUPPORTED_VERSIONS.contains(&r.version.as_str()) {
        return Err(format!(
            "requested API version {:?} is not supported by kubelet. Supported versions are {:?}",
            r.version, SUPPORTED_VERSIONS
        ));
    }
    if !nodus_k8s::resources::is_extended_resource_name(&r.resource_name) {
        return Err(format!("the ResourceName {:?} is invalid", r.resource_name));
    }
    if r.endpoint.is_empty() || r.endpoint.contains('/') {
        return Err(format!("invalid endpoint {:?}", r.endpoint));
    }
    Ok(())
}

#[tonic::async_trait]
impl Registration for Server {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let r = request.into_inner();
        tracing::info!(resource = %r.resource_name, endpoint = %r.endpoint, version = %r.version, "Got registration request from device plugin with resource");
        if let Err(e) = validate(&r) {
            tracing::warn!(resource = %r.resource_name, error = %e, "Bad registration request from device plugin");
            return Err(Status::unknown(e));
        }
        let socket = self.m.dir().join(&r.endpoint);
        let client = match endpoint::Client::connect(socket).await {
            Ok(c) => c,
            Err(e) => {
                let e = format!("failed to dial device plugin: {e}");
                tracing::warn!(resource = %r.resource_name, error = %e, "Error connecting to device plugin client");
                return Err(Status::unknown(e));
            }
        };
        let options = r.options.unwrap_or_default();
        let generation = self.m.register(&r.resource_name, options, client.clone());
        tracing::info!(resource = %r.resource_name, pre_start_required = options.pre_start_required, get_preferred_allocation_available = options.get_preferred_allocation_available, "Registered endpoint");
        tokio::spawn(client.run(Arc::clone(&self.m), r.resource_name, generation));
        Ok(Response::new(pb::Empty {}))
    }
}

/// Serves Registration on `kubelet.sock` until the kubelet stops.
pub async fn serve(m: Arc<DeviceManager>) -> std::io::Result<()> {
    let path = m.socket_path();
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)?;
    tracing::info!(socket = %path.display(), "device plugin registration server listening");
    tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(Server { m }))
        .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
        .await
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_carry_upstreams_messages() {
        let req = |v: &str, name: &str| pb::RegisterRequest {
            version: v.into(),
            endpoint: "p.sock".into(),
            resource_name: name.into(),
            options: None,
        };
        assert!(validate(&req("v1beta1", "devices.nodus.dev/fuse")).is_ok());
        assert_eq!(
            validate(&req("v1alpha", "devices.nodus.dev/fuse")).unwrap_err(),
            "requested API version \"v1alpha\" is not supported by kubelet. Supported versions are [\"v1beta1\"]"
        );
        assert_eq!(
            validate(&req("v1beta1", "fuse")).unwrap_err(),
            "the ResourceName \"fuse\" is invalid"
        );
        assert_eq!(
            validate(&req("v1beta1", "kubernetes.io/fuse")).unwrap_err(),
            "the ResourceName \"kubernetes.io/fuse\" is invalid"
        );
    }
}
