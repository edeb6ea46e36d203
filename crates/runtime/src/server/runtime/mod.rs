//! RuntimeService: pod sandboxes and containers, one file per RPC (as containerd's CRI
//! server is laid out). The shared state — records, name reservations, the event feed —
//! lives in [`Inner`]; each RPC file holds that RPC's behaviour.

mod attach;
mod container_exit;
mod container_status;
mod create_container;
mod exec;
mod exec_sync;
mod get_container_events;
mod list_containers;
mod list_metric_descriptors;
mod list_pod_sandbox;
mod list_pod_sandbox_metrics;
mod nri;
mod pod_sandbox_status;
mod port_forward;
mod remove_container;
mod remove_pod_sandbox;
mod reopen_container_log;
mod run_pod_sandbox;
mod runtime_config;
mod start_container;
mod stats;
mod status;
mod stop_container;
mod stop_pod_sandbox;
mod update_container_resources;
mod update_runtime_config;
mod version;

use crate::image::manager::ImageManager;
use crate::oci::Handlers;
use crate::state::{ContainerRecord, Names, RecordStore, Records, SandboxRecord};
use cri::runtime::v1 as pb;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

pub(crate) use nri::{nri_evict, nri_update};
use tokio::sync::broadcast;
use tonic::{Request, Response, Status};

/// Everything the RPCs share.
pub struct Inner {
    pub images: Arc<ImageManager>,
    pub handlers: Handlers,
    pub state_dir: PathBuf,
    pub root_dir: PathBuf,
    /// `<state-dir>/sandboxes`, the one shared mount point the pods' namespaces are pinned
    /// under.
    pub pin_root: crate::sandbox::PinRoot,
    /// Where pods' mount namespaces are pinned; none where they keep the node's.
    pub mount_pins: Option<crate::sandbox::mountns::PinDir>,
    pub sandbox_records: Records,
    pub container_records: Records,
    pub sandboxes: Mutex<HashMap<String, SandboxRecord>>,
    pub containers: Mutex<HashMap<String, ContainerRecord>>,
    pub names: Mutex<Names>,
    pub cni: crate::sandbox::cni::Cni,
    pub cpu_samples: stats::CpuSamples,
    /// Starts `nodus shim` for each container: forked by one server process rather than
    /// exec'd each time.
    pub shims: crate::shim::ForkServer,
    /// The GetContainerEvents feed (the kubelet's evented PLEG).
    pub events: broadcast::Sender<pb::ContainerEventResponse>,
    /// The exec/attach/port-forward streaming server.
    pub streaming: crate::streaming::Server,
    /// What RuntimeConfig tells the kubelet.
    pub cgroup_driver: pb::CgroupDriver,
    /// Held while a container turns Exited and while its record is deleted: the monitor,
    /// StopContainer and the recovery may all notice one exit, and none may save a record
    /// that RemoveContainer is deleting (or has deleted).
    pub(crate) exits: Mutex<()>,
    /// NRI, when enabled (set once, after the runtime's state is loaded).
    pub(crate) nri: OnceLock<Arc<crate::nri::Nri>>,
    /// Sandboxes whose RunPodSandbox (and its NRI hook) is still in progress: not listed.
    pub(crate) hidden: Mutex<HashSet<String>>,
}

/// Why the runtime's state could not be opened at start-up.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error("starting the streaming server on {addr}: {source}")]
    Streaming {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("preparing the sandboxes' namespace pins: {0}")]
    Pins(#[from] crate::sandbox::SandboxError),
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
    ) -> Result<Self, OpenError> {
        for d in [root_dir.join("sandboxes"), root_dir.join("containers")] {
            std::fs::create_dir_all(&d)
                .map_err(|source| crate::state::StateError::Io { path: d, source })?;
        }
        let store = RecordStore::open(&root_dir.join("meta.redb"))?;
        let sandbox_records = Records::open(&store, "sandboxes", &root_dir.join("sandboxes"))?;
        let container_records = Records::open(&store, "containers", &root_dir.join("containers"))?;
        let mut names = Names::default();
        let mut sandboxes = HashMap::new();
        for mut r in sandbox_records.load_all::<SandboxRecord>()? {
            let _ = names.reserve(&r.name, &r.id);
            // After a reboot (or its namespaces unmounted) a sandbox has nothing left to run
            // containers in: NotReady, so the kubelet makes a new one, as containerd reports
            // a sandbox whose task is gone.
            let pinned = [&r.netns, &r.ipc_ns, &r.uts_ns, &r.pid_ns, &r.user_ns];
            if r.state == crate::state::SandboxState::Ready
                && pinned
                    .iter()
                    .filter_map(|p| p.as_deref())
                    .any(|p| !crate::sandbox::namespaces::is_namespace_file(p))
            {
                tracing::warn!(sandbox = %r.id, "the sandbox's namespaces are gone (host restarted or unmounted): NotReady");
                r.state = crate::state::SandboxState::NotReady;
                if let Err(e) = sandbox_records.save_blocking(&r.id, &r) {
                    tracing::warn!(sandbox = %r.id, error = %e, "cannot record the sandbox as NotReady");
                }
            }
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
        let mut cni_config = crate::sandbox::cni::CniConfig::new(
            config.cni_bin_dirs.clone(),
            config.cni_conf_dir.clone(),
            root_dir.join("cni").join("cache"),
        );
        cni_config.default_ip_masq = config.default_network_ip_masq;
        cni_config.default_ipam_data_dir = config.default_network_ipam_data_dir.clone();
        cni_config.internal_loopback = config.use_internal_loopback;
        let cni = crate::sandbox::cni::Cni::new(cni_config);
        match cni.ensure_default_config(None) {
            Ok(true) => tracing::info!(
                dir = %config.cni_conf_dir.display(),
                "no CNI configuration found; wrote nodus's default bridge network"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "cannot write the default CNI configuration"),
        }
        let exe = std::env::current_exe().map_err(|source| crate::state::StateError::Io {
            path: "/proc/self/exe".into(),
            source,
        })?;
        let streaming_addr = config.stream_server_address;
        let streaming = crate::streaming::Server::start(streaming_addr).map_err(|source| {
            OpenError::Streaming {
                addr: streaming_addr,
                source,
            }
        })?;
        // Last, so that no failure above leaves the mount behind.
        let pin_root = crate::sandbox::PinRoot::prepare(&state_dir.join("sandboxes"))?;
        // Pods get mount namespaces of their own only where they can leave the other pods'
        // pins out (the sandboxes' shared mount point).
        let mount_pins = match pin_root.mount_point() {
            Some(_) => Some(crate::sandbox::mountns::PinDir::prepare(
                &state_dir.join("mntns"),
            )?),
            None => None,
        };
        Ok(Self {
            images,
            handlers: Handlers::new(
                &config.runtime_handlers,
                config
                    .default_runtime_handler
                    .as_deref()
                    .unwrap_or(crate::oci::DEFAULT_HANDLER),
                state_dir,
                config.systemd_cgroup,
            ),
            state_dir: state_dir.to_path_buf(),
            root_dir: root_dir.to_path_buf(),
            pin_root,
            mount_pins,
            sandbox_records,
            container_records,
            sandboxes: Mutex::new(sandboxes),
            containers: Mutex::new(containers),
            names: Mutex::new(names),
            cni,
            cpu_samples: Default::default(),
            shims: crate::shim::ForkServer::new(exe),
            events,
            streaming,
            cgroup_driver: runtime_config::cgroup_driver(config.systemd_cgroup),
            exits: Mutex::new(()),
            nri: OnceLock::new(),
            hidden: Mutex::new(HashSet::new()),
        })
    }

    /// NRI, when enabled.
    pub(crate) fn nri(&self) -> Option<&Arc<crate::nri::Nri>> {
        self.nri.get()
    }

    /// Starts NRI with `opts`: its socket, pre-installed plugins and their synchronization.
    pub async fn start_nri(self: &Arc<Self>, opts: crate::nri::NriOptions) -> Result<(), String> {
        let nri = crate::nri::Nri::start(opts, Arc::downgrade(self)).await?;
        let _ = self.nri.set(nri);
        Ok(())
    }

    /// Stops NRI's plugins (the runtime is going down).
    pub async fn stop_nri(&self) {
        if let Some(n) = self.nri() {
            n.shutdown().await;
        }
    }

    pub(crate) fn is_hidden(&self, id: &str) -> bool {
        lock(&self.hidden).contains(id)
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

    /// Unmounts the pin directories this process mounted, if no pod is pinned in them.
    pub(crate) fn release_pins(&self) {
        self.pin_root.release();
        if let Some(p) = &self.mount_pins {
            p.release();
        }
    }

    /// The mount namespace of the pod `sandbox_id`, where its containers' mounts are and
    /// their OCI runtime runs; none for a privileged pod or one that is gone.
    pub(crate) fn pod_mount_ns(&self, sandbox_id: &str) -> Option<std::path::PathBuf> {
        self.sandboxes()
            .get(sandbox_id)
            .and_then(|s| s.mnt_ns.clone())
    }

    pub async fn save_sandbox(&self, rec: &SandboxRecord) -> Result<(), Status> {
        self.sandbox_records
            .save(&rec.id, rec)
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        self.sandboxes().insert(rec.id.clone(), rec.clone());
        Ok(())
    }

    pub async fn save_container(&self, rec: &ContainerRecord) -> Result<(), Status> {
        self.container_records
            .save(&rec.id, rec)
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        self.containers().insert(rec.id.clone(), rec.clone());
        Ok(())
    }

    /// [`Self::save_container`] for threads that are not async (exit monitors, start-up).
    pub fn save_container_blocking(&self, rec: &ContainerRecord) -> Result<(), Status> {
        self.container_records
            .save_blocking(&rec.id, rec)
            .map_err(|e| Status::internal(e.to_string()))?;
        self.containers().insert(rec.id.clone(), rec.clone());
        Ok(())
    }

    /// NetworkReady as the CNI configuration allows.
    pub fn network_condition(&self) -> pb::RuntimeCondition {
        self.cni.status().condition()
    }

    /// After a restart: watch the shims of live containers again and record the exits
    /// that happened while the daemon was down.
    pub fn recover(self: &Arc<Self>) {
        let live: Vec<(String, Option<u32>)> = self
            .containers()
            .values()
            .filter(|c| c.state != crate::state::ContainerState::Exited)
            // Created containers have no shim until they are started.
            .filter(|c| c.state != crate::state::ContainerState::Created || c.shim_pid.is_some())
            .map(|c| (c.id.clone(), c.shim_pid))
            .collect();
        for (id, shim_pid) in live {
            match shim_pid {
                Some(pid) if crate::container::monitor::alive(pid) => {
                    container_exit::spawn_monitor(self, &id, pid)
                }
                _ => container_exit::record_exit(self, &id),
            }
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

    async fn run_pod_sandbox(
        &self,
        req: Request<pb::RunPodSandboxRequest>,
    ) -> Result<Response<pb::RunPodSandboxResponse>, Status> {
        run_pod_sandbox::run_pod_sandbox(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn stop_pod_sandbox(
        &self,
        req: Request<pb::StopPodSandboxRequest>,
    ) -> Result<Response<pb::StopPodSandboxResponse>, Status> {
        stop_pod_sandbox::stop_pod_sandbox(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn remove_pod_sandbox(
        &self,
        req: Request<pb::RemovePodSandboxRequest>,
    ) -> Result<Response<pb::RemovePodSandboxResponse>, Status> {
        remove_pod_sandbox::remove_pod_sandbox(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn create_container(
        &self,
        req: Request<pb::CreateContainerRequest>,
    ) -> Result<Response<pb::CreateContainerResponse>, Status> {
        create_container::create_container(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn start_container(
        &self,
        req: Request<pb::StartContainerRequest>,
    ) -> Result<Response<pb::StartContainerResponse>, Status> {
        start_container::start_container(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn stop_container(
        &self,
        req: Request<pb::StopContainerRequest>,
    ) -> Result<Response<pb::StopContainerResponse>, Status> {
        stop_container::stop_container(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn remove_container(
        &self,
        req: Request<pb::RemoveContainerRequest>,
    ) -> Result<Response<pb::RemoveContainerResponse>, Status> {
        remove_container::remove_container(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn update_container_resources(
        &self,
        req: Request<pb::UpdateContainerResourcesRequest>,
    ) -> Result<Response<pb::UpdateContainerResourcesResponse>, Status> {
        update_container_resources::update_container_resources(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn reopen_container_log(
        &self,
        req: Request<pb::ReopenContainerLogRequest>,
    ) -> Result<Response<pb::ReopenContainerLogResponse>, Status> {
        reopen_container_log::reopen_container_log(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn update_runtime_config(
        &self,
        req: Request<pb::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<pb::UpdateRuntimeConfigResponse>, Status> {
        update_runtime_config::update_runtime_config(&self.inner, req.into_inner())
            .map(Response::new)
    }

    async fn container_stats(
        &self,
        req: Request<pb::ContainerStatsRequest>,
    ) -> Result<Response<pb::ContainerStatsResponse>, Status> {
        let inner = Arc::clone(&self.inner);
        let req = req.into_inner();
        tokio::task::spawn_blocking(move || stats::container_stats(&inner, req))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map(Response::new)
    }

    async fn list_container_stats(
        &self,
        req: Request<pb::ListContainerStatsRequest>,
    ) -> Result<Response<pb::ListContainerStatsResponse>, Status> {
        let inner = Arc::clone(&self.inner);
        let req = req.into_inner();
        tokio::task::spawn_blocking(move || stats::list_container_stats(&inner, req))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map(Response::new)
    }

    async fn pod_sandbox_stats(
        &self,
        req: Request<pb::PodSandboxStatsRequest>,
    ) -> Result<Response<pb::PodSandboxStatsResponse>, Status> {
        let inner = Arc::clone(&self.inner);
        let req = req.into_inner();
        tokio::task::spawn_blocking(move || stats::pod_sandbox_stats(&inner, req))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map(Response::new)
    }

    async fn list_pod_sandbox_stats(
        &self,
        req: Request<pb::ListPodSandboxStatsRequest>,
    ) -> Result<Response<pb::ListPodSandboxStatsResponse>, Status> {
        let inner = Arc::clone(&self.inner);
        let req = req.into_inner();
        tokio::task::spawn_blocking(move || stats::list_pod_sandbox_stats(&inner, req))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map(Response::new)
    }

    async fn exec_sync(
        &self,
        req: Request<pb::ExecSyncRequest>,
    ) -> Result<Response<pb::ExecSyncResponse>, Status> {
        exec_sync::exec_sync(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn exec(
        &self,
        req: Request<pb::ExecRequest>,
    ) -> Result<Response<pb::ExecResponse>, Status> {
        exec::exec(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn attach(
        &self,
        req: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::AttachResponse>, Status> {
        attach::attach(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn port_forward(
        &self,
        req: Request<pb::PortForwardRequest>,
    ) -> Result<Response<pb::PortForwardResponse>, Status> {
        port_forward::port_forward(&self.inner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_metric_descriptors(
        &self,
        req: Request<pb::ListMetricDescriptorsRequest>,
    ) -> Result<Response<pb::ListMetricDescriptorsResponse>, Status> {
        list_metric_descriptors::list_metric_descriptors(req.into_inner()).map(Response::new)
    }

    async fn list_pod_sandbox_metrics(
        &self,
        req: Request<pb::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<pb::ListPodSandboxMetricsResponse>, Status> {
        let inner = Arc::clone(&self.inner);
        let req = req.into_inner();
        tokio::task::spawn_blocking(move || {
            list_pod_sandbox_metrics::list_pod_sandbox_metrics(&inner, req)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map(Response::new)
    }

    async fn runtime_config(
        &self,
        req: Request<pb::RuntimeConfigRequest>,
    ) -> Result<Response<pb::RuntimeConfigResponse>, Status> {
        runtime_config::runtime_config(&self.inner, req.into_inner()).map(Response::new)
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
