//! The pod resources API v1 (upstream's pkg/kubelet/apis/podresources) on
//! `<root-dir>/pod-resources/kubelet.sock`: which devices each container of the active
//! pods holds (List, Get), and which devices the node can hand out
//! (GetAllocatableResources). Monitoring agents read it to attribute devices to pods.

use crate::cm::devicemanager::DeviceManager;
use cri::podresources::v1 as pb;
use k8s_openapi::api::core::v1::Pod;
use pb::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use std::path::Path;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub const SOCKET: &str = "kubelet.sock";

pub struct Server {
    pub devices: Arc<DeviceManager>,
    /// The CPU manager: exclusive CPUs per container, allocatable CPUs.
    pub cpus: Option<Arc<crate::cm::cpumanager::CpuManager>>,
    /// The pods admitted and not finished.
    pub active_pods: Box<dyn Fn() -> Vec<Pod> + Send + Sync>,
}

fn topology(numa: &[i64]) -> Option<pb::TopologyInfo> {
    (!numa.is_empty()).then(|| pb::TopologyInfo {
        nodes: numa.iter().map(|id| pb::NumaNode { id: *id }).collect(),
    })
}

impl Server {
    fn pod_resources(&self, pod: &Pod) -> pb::PodResources {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .chain(spec.containers.iter())
            .map(|c| pb::ContainerResources {
                name: c.name.clone(),
                devices: self
                    .devices
                    .container_devices(&uid, &c.name)
                    .into_iter()
                    .map(|(resource_name, (device_ids, numa))| pb::ContainerDevices {
                        resource_name,
                        device_ids,
                        topology: topology(&numa),
                    })
                    .collect(),
                cpu_ids: self
                    .cpus
                    .as_ref()
                    .map(|m| m.exclusive_cpus(&uid, &c.name))
                    .unwrap_or_default(),
                ..Default::default()
            })
            .collect();
        pb::PodResources {
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            containers,
        }
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Server {
    async fn list(
        &self,
        _: Request<pb::ListPodResourcesRequest>,
    ) -> Result<Response<pb::ListPodResourcesResponse>, Status> {
        let pod_resources = (self.active_pods)()
            .iter()
            .map(|p| self.pod_resources(p))
            .collect();
        Ok(Response::new(pb::ListPodResourcesResponse {
            pod_resources,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<pb::AllocatableResourcesRequest>,
    ) -> Result<Response<pb::AllocatableResourcesResponse>, Status> {
        let mut devices = Vec::new();
        for (resource_name, devs) in self.devices.allocatable_devices() {
            for d in devs {
                let numa: Vec<i64> = d
                    .topology
                    .iter()
                    .flat_map(|t| t.nodes.iter().map(|n| n.id))
                    .collect();
                devices.push(pb::ContainerDevices {
                    resource_name: resource_name.clone(),
                    device_ids: vec![d.id],
                    topology: topology(&numa),
                });
            }
        }
        Ok(Response::new(pb::AllocatableResourcesResponse {
            devices,
            cpu_ids: self
                .cpus
                .as_ref()
                .map(|m| m.allocatable_cpus())
                .unwrap_or_default(),
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<pb::GetPodResourcesRequest>,
    ) -> Result<Response<pb::GetPodResourcesResponse>, Status> {
        let r = request.into_inner();
        let pod = (self.active_pods)().into_iter().find(|p| {
            p.metadata.name.as_deref() == Some(r.pod_name.as_str())
                && p.metadata.namespace.as_deref() == Some(r.pod_namespace.as_str())
        });
        match pod {
            Some(p) => Ok(Response::new(pb::GetPodResourcesResponse {
                pod_resources: Some(self.pod_resources(&p)),
            })),
            None => Err(Status::unknown(format!(
                "pod {} not found in namespace {}",
                r.pod_name, r.pod_namespace
            ))),
        }
    }
}

/// Serves the API on `<dir>/kubelet.sock` until the kubelet stops.
pub async fn serve(dir: &Path, server: Server) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)?;
    tracing::info!(socket = %path.display(), "pod resources API listening");
    tonic::transport::Server::builder()
        .add_service(PodResourcesListerServer::new(server))
        .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
        .await
        .map_err(std::io::Error::other)
}
