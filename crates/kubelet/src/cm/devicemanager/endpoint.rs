//! One registered device plugin as the kubelet talks to it (upstream's endpoint): a gRPC
//! client on the plugin's socket, and the ListAndWatch stream feeding the manager.

use super::DeviceManager;
use cri::deviceplugin::v1beta1 as pb;
use pb::device_plugin_client::DevicePluginClient;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;

/// upstream's connection timeout for a plugin's socket.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an Allocate, GetPreferredAllocation or PreStartContainer may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct Client {
    inner: DevicePluginClient<Channel>,
}

impl Client {
    /// Dials the plugin's socket; a plugin that does not answer is an error.
    pub async fn connect(socket: PathBuf) -> Result<Client, String> {
        let channel = crate::cri::dial_unix(socket, DIAL_TIMEOUT).await?;
        Ok(Client {
            inner: DevicePluginClient::new(channel),
        })
    }

    pub async fn allocate(
        &self,
        ids: Vec<String>,
    ) -> Result<pb::ContainerAllocateResponse, String> {
        let req = pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest { devices_ids: ids }],
        };
        let r = tokio::time::timeout(CALL_TIMEOUT, self.inner.clone().allocate(req))
            .await
            .map_err(|_| "context deadline exceeded".to_string())?
            .map_err(|e| e.message().to_string())?
            .into_inner();
        r.container_responses
            .into_iter()
            .next()
            .ok_or_else(|| "no containers return in allocation response".to_string())
    }

    pub async fn preferred(
        &self,
        available: Vec<String>,
        must_include: Vec<String>,
        size: usize,
    ) -> Result<Vec<String>, String> {
        let req = pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: must_include,
                allocation_size: size as i32,
            }],
        };
        let r = tokio::time::timeout(
            CALL_TIMEOUT,
            self.inner.clone().get_preferred_allocation(req),
        )
        .await
        .map_err(|_| "context deadline exceeded".to_string())?
        .map_err(|e| e.message().to_string())?
        .into_inner();
        Ok(r.container_responses
            .into_iter()
            .next()
            .map(|c| c.device_i_ds)
            .unwrap_or_default())
    }

    pub async fn pre_start(&self, ids: Vec<String>) -> Result<(), String> {
        tokio::time::timeout(
            CALL_TIMEOUT,
            self.inner
                .clone()
                .pre_start_container(pb::PreStartContainerRequest { devices_ids: ids }),
        )
        .await
        .map_err(|_| "context deadline exceeded".to_string())?
        .map_err(|e| e.message().to_string())?;
        Ok(())
    }

    /// Follows ListAndWatch until the plugin goes away; every answer replaces the
    /// resource's devices, and the end marks them unhealthy.
    pub async fn run(self, m: Arc<DeviceManager>, resource: String, generation: u64) {
        match self.inner.clone().list_and_watch(pb::Empty {}).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(r)) => m.update_devices(&resource, generation, r.devices),
                        Ok(None) => {
                            tracing::warn!(
                                resource,
                                "ListAndWatch ended unexpectedly for device plugin"
                            );
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(resource, error = %e.message(), "ListAndWatch ended unexpectedly for device plugin");
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::error!(resource, error = %e.message(), "listAndWatch failed for device plugin");
            }
        }
        m.endpoint_stopped(&resource, generation);
    }
}
