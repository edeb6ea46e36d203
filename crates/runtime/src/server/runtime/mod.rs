//! RuntimeService: pod sandboxes and containers, one file per RPC (as containerd's CRI
//! server is laid out). The shared state — records, name reservations, the event feed —
//! lives in [`Inner`]; each RPC file holds that RPC's behaviour.

mod container_status;
mod get_container_events;
mod list_containers;
mod list_pod_sandbox;
mod pod_sandbox_status;
mod status;
mod version;

use crate::image::manager::ImageManager;
use crate::oci::Handlers;
use crate::state::{ContainerRecord, Names, RecordDir, SandboxRecord};
use cri::runtime::v1 as pb;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;
use tonic::{Request, Response, Status};

/// Everything the RPCs share.
pub struct Inner {
    pub images: Arc<ImageManager>,
    pub handlers: Handlers,
    pub state_dir: PathBuf,
    pub root_dir: PathBuf,
    pub sandbox_records: RecordDir,
    pub container_records: RecordDir,
    pub sandboxes: Mutex<HashMap<String, SandboxRecord>>,
    pub containers: Mutex<HashMap<String, ContainerRecord>>,
    pub names: Mutex<Names>,
    /// The GetContainerEvents feed (the kubelet's evented PLEG).
    pub events: broadcast::Sender<pb::ContainerEventResponse>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    /// Loads every persisted sandbox and container record and reserves their names.
    pub fn open(
        images: Arc<ImageManager>,
        config: &crate::config::RuntimeConfig,
        root_dir: &std::path::Path,
        state_dir: &std::path::Path,
    ) -> Result<Self, crate::state::StateError> {
        let sandbox_records = RecordDir::open(&root_dir.join("sandboxes"))?;
        let container_records = RecordDir::open(&root_dir.join("containers"))?;
        let mut names = Names::default();
        let mut sandboxes = HashMap::new();
        for r in sandbox_records.load_all::<SandboxRecord>()? {
            let _ = names.reserve(&r.name, &r.id);
            sandboxes.insert(r.id.clone(), r);
        }
        let mut containers = HashMap::new();
        for r in container_records.load_all::<ContainerRecord>()? {
            let _ = names.reserve(&r.name, &r.id);
            if let Ok(id) = r.image_id.parse() {
                images.acquire(&id);
            }
            containers.insert(r.id.clone(), r);
        }
        tracing::info!(
            sandboxes = sandboxes.len(),
            containers = containers.len(),
            "runtime state loaded"
        );
        let (events, _) = broadcast::channel(1024);
        Ok(Self {
            images,
            handlers: Handlers::new(&config.runtime_handlers, state_dir),
            state_dir: state_dir.to_path_buf(),
            root_dir: root_dir.to_path_buf(),
            sandbox_records,
            container_records,
            sandboxes: Mutex::new(sandboxes),
            containers: Mutex::new(containers),
            names: Mutex::new(names),
            events,
        })
    }

    pub fn sandboxes(&self) -> std::sync::MutexGuard<'_, HashMap<String, SandboxRecord>> {
        lock(&self.sandboxes)
    }

    pub fn containers(&self) -> std::sync::MutexGuard<'_, HashMap<String, ContainerRecord>> {
        lock(&self.containers)
    }

    /// Finds a sandbox by full id or unique id prefix, as crictl users type them.
    pub fn find_sandbox(&self, id: &str) -> Result<SandboxRecord, Status> {
        find_by_prefix(&self.sandboxes(), id, "sandbox")
    }

    pub fn find_container(&self, id: &str) -> Result<ContainerRecord, Status> {
        find_by_prefix(&self.containers(), id, "container")
    }

    pub fn save_sandbox(&self, rec: &SandboxRecord) -> Result<(), Status> {
        self.sandbox_records
            .save(&rec.id, rec)
            .map_err(|e| Status::internal(e.to_string()))?;
        self.sandboxes().insert(rec.id.clone(), rec.clone());
        Ok(())
    }

    pub fn save_container(&self, rec: &ContainerRecord) -> Result<(), Status> {
        self.container_records
            .save(&rec.id, rec)
            .map_err(|e| Status::internal(e.to_string()))?;
        self.containers().insert(rec.id.clone(), rec.clone());
        Ok(())
    }

    /// NetworkReady as the CNI configuration allows.
    pub fn network_condition(&self) -> pb::RuntimeCondition {
        pb::RuntimeCondition {
            r#type: "NetworkReady".into(),
            status: false,
            reason: "NetworkPluginNotReady".into(),
            message: "Network plugin returns error: cni plugin not initialized".into(),
        }
    }

    pub fn emit(
        &self,
        container_id: &str,
        kind: pb::ContainerEventType,
        sandbox: Option<pb::PodSandboxStatus>,
        containers: Vec<pb::ContainerStatus>,
    ) {
        // No subscriber is fine: the kubelet's relist covers what nobody heard.
        let _ = self.events.send(pb::ContainerEventResponse {
            container_id: container_id.to_string(),
            container_event_type: kind as i32,
            created_at: crate::state::now_ns(),
            pod_sandbox_status: sandbox,
            containers_statuses: containers,
        });
    }
}

fn find_by_prefix<T: Clone>(map: &HashMap<String, T>, id: &str, what: &str) -> Result<T, Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{what} id must not be empty"
        )));
    }
    if let Some(r) = map.get(id) {
        return Ok(r.clone());
    }
    let matches: Vec<&String> = map.keys().filter(|k| k.starts_with(id)).collect();
    match matches.as_slice() {
        [one] => Ok(map[*one].clone()),
        [] => Err(Status::not_found(format!(
            "an error occurred when try to find {what} {id:?}: not found"
        ))),
        _ => Err(Status::invalid_argument(format!(
            "{what} id prefix {id:?} is ambiguous: it matches {} {what}s",
            matches.len()
        ))),
    }
}

/// Label selector match used by the List filters: every selector pair must be present.
pub(crate) fn labels_match(
    labels: &HashMap<String, String>,
    selector: &HashMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

pub struct RuntimeService {
    inner: Arc<Inner>,
}

impl RuntimeService {
    pub fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }
}

#[tonic::async_trait]
impl pb::runtime_service_server::RuntimeService for RuntimeService {
    async fn version(
        &self,
        req: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        version::version(req.into_inner()).map(Response::new)
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        status::status(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_pod_sandbox(
        &self,
        req: Request<pb::ListPodSandboxRequest>,
    ) -> Result<Response<pb::ListPodSandboxResponse>, Status> {
        list_pod_sandbox::list_pod_sandbox(&self.inner, req.into_inner()).map(Response::new)
    }

    async fn pod_sandbox_status(
        &self,
        req: Request<pb::PodSandboxStatusRequest>,
    ) -> Result<Response<pb::PodSandboxStatusResponse>, Status> {
        pod_sandbox_status::pod_sandbox_status(&self.inner, req.into_inner()).map(Response::new)
    }

    async fn list_containers(
        &self,
        req: Request<pb::ListContainersRequest>,
    ) -> Result<Response<pb::ListContainersResponse>, Status> {
        list_containers::list_containers(&self.inner, req.into_inner()).map(Response::new)
    }

    async fn container_status(
        &self,
        req: Request<pb::ContainerStatusRequest>,
    ) -> Result<Response<pb::ContainerStatusResponse>, Status> {
        container_status::container_status(&self.inner, req.into_inner()).map(Response::new)
    }

    async fn get_container_events(
        &self,
        req: Request<pb::GetEventsRequest>,
    ) -> Result<Response<get_container_events::EventStream>, Status> {
        Ok(Response::new(get_container_events::get_container_events(
            &self.inner,
            req.into_inner(),
        )))
    }
}
