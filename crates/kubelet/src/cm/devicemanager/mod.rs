//! The device manager (upstream's pkg/kubelet/cm/devicemanager): device plugins register
//! on `<root-dir>/device-plugins/kubelet.sock` ([`registration`]); each plugin's
//! ListAndWatch stream ([`endpoint`]) is the resource's devices, reported as node capacity
//! (every device) and allocatable (the healthy ones). A plugin that goes away leaves its
//! devices unhealthy, and after [`ENDPOINT_STOP_GRACE`] the resource drops to 0.
//!
//! At admission ([`PodAdmitHandler`]) every container asking for a plugin's resource gets
//! devices: GetPreferredAllocation when the plugin offers it, then Allocate; the answer
//! (device nodes, mounts, envs, annotations, CDI names) goes into the container's CRI config
//! ([`DeviceManager::container_options`]), after PreStartContainer when the plugin asks for it.
//! Allocations are checkpointed ([`checkpoint`]) and restored at start, so a restarted
//! kubelet neither re-allocates running pods nor hands their devices out again.

pub mod checkpoint;
pub mod endpoint;
pub mod registration;
pub mod topology_hints;

use crate::admission::{PodAdmitAttributes, PodAdmitHandler, PodAdmitResult, Reason, Rejection};
use cri::deviceplugin::v1beta1 as pb;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, Pod};
use prost::Message as _;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The kubelet's registration socket in the device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// upstream's endpointStopGracePeriod: how long a gone plugin's resource stays in capacity.
pub const ENDPOINT_STOP_GRACE: Duration = Duration::from_secs(5 * 60);
/// The only device plugin API version this kubelet speaks.
pub const SUPPORTED_VERSIONS: &[&str] = &["v1beta1"];
pub const HEALTHY: &str = "Healthy";
/// The NUMA key for devices without topology in the checkpoint.
const NO_TOPOLOGY: &str = "-1";

/// One resource's plugin and devices.
#[derive(Default)]
struct Resource {
    options: pb::DevicePluginOptions,
    client: Option<endpoint::Client>,
    /// Bumped on every registration so a replaced plugin's stream ending is ignored.
    generation: u64,
    devices: BTreeMap<String, pb::Device>,
    /// When the plugin's stream ended (or, after a restart, when the kubelet started).
    stopped_at: Option<Instant>,
}

impl Resource {
    fn healthy(&self) -> BTreeSet<String> {
        if self.stopped_at.is_some() {
            return BTreeSet::new();
        }
        self.devices
            .values()
            .filter(|d| d.health == HEALTHY)
            .map(|d| d.id.clone())
            .collect()
    }

    fn expired(&self, now: Instant) -> bool {
        self.stopped_at
            .is_some_and(|t| now.duration_since(t) >= ENDPOINT_STOP_GRACE)
    }
}

/// What one container got for one resource.
#[derive(Clone, Debug, PartialEq)]
struct Allocation {
    ids: BTreeSet<String>,
    /// NUMA node per device at allocation time (`-1` without topology).
    numa: BTreeMap<String, Vec<String>>,
    response: pb::ContainerAllocateResponse,
}

/// pod UID → container → resource → allocation (upstream's podDevices).
type PodDevices = BTreeMap<String, BTreeMap<String, BTreeMap<String, Allocation>>>;

#[derive(Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    allocated: PodDevices,
}

/// What the container's CRI config gets from its devices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunContainerOptions {
    pub devices: Vec<pb::DeviceSpec>,
    pub mounts: Vec<pb::Mount>,
    pub envs: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub cdi_devices: Vec<String>,
}

/// Whether a pod some source wants has not reached admission yet (after a restart the
/// pods come in one at a time): its devices are not given back.
pub type PendingFunc = Box<dyn Fn(&str) -> bool + Send + Sync>;

pub struct DeviceManager {
    dir: PathBuf,
    pending: std::sync::OnceLock<PendingFunc>,
    state: Mutex<State>,
    /// Wakes the node status loop when capacity or allocatable changed.
    changed: tokio::sync::Notify,
    /// The machine's NUMA nodes, for topology hints.
    numa_nodes: std::sync::OnceLock<Vec<usize>>,
    /// The topology manager's merged hints, which allocations prefer.
    affinity: std::sync::OnceLock<std::sync::Arc<dyn crate::cm::topologymanager::Store>>,
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceManagerError {
    #[error("device plugin directory {0}: {1}")]
    Io(PathBuf, std::io::Error),
}

impl DeviceManager {
    /// Prepares `<root-dir>/device-plugins`: stale sockets are removed (plugins watch for
    /// the kubelet's socket being re-created and register again), the checkpoint is read.
    pub fn new(root_dir: &Path) -> Result<DeviceManager, DeviceManagerError> {
        let dir = root_dir.join("device-plugins");
        let io = |e| DeviceManagerError::Io(dir.clone(), e);
        std::fs::create_dir_all(&dir).map_err(io)?;
        for e in std::fs::read_dir(&dir).map_err(io)?.flatten() {
            use std::os::unix::fs::FileTypeExt as _;
            if e.file_type().is_ok_and(|t| t.is_socket()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let m = DeviceManager {
            dir,
            pending: std::sync::OnceLock::new(),
            state: Mutex::new(State::default()),
            changed: tokio::sync::Notify::new(),
            numa_nodes: std::sync::OnceLock::new(),
            affinity: std::sync::OnceLock::new(),
        };
        m.restore();
        Ok(m)
    }

    /// Sets how to tell pods still on their way to admission (see [`PendingFunc`]).
    pub fn set_pending(&self, f: PendingFunc) {
        let _ = self.pending.set(f);
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn socket_path(&self) -> PathBuf {
        self.dir.join(KUBELET_SOCKET)
    }

    /// upstream's readCheckpoint: allocations come back as they were; every resource named
    /// is known but has no devices until its plugin registers again.
    fn restore(&self) {
        let data = match checkpoint::read(&self.dir) {
            Ok(Some(d)) => d,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(error = %e, "Continue after failing to read checkpoint file. Device allocation info may NOT be up-to-date");
                return;
            }
        };
        let Ok(mut s) = self.state.lock() else { return };
        let now = Instant::now();
        for name in data.registered_devices.keys() {
            s.resources.insert(
                name.clone(),
                Resource {
                    stopped_at: Some(now),
                    ..Default::default()
                },
            );
        }
        for e in data.pod_device_entries {
            let Ok(response) = pb::ContainerAllocateResponse::decode(e.alloc_resp.as_slice())
            else {
                tracing::warn!(pod_uid = %e.pod_uid, container = %e.container_name, "cannot decode a checkpointed allocation; dropping it");
                continue;
            };
            let ids = e.device_ids.values().flatten().cloned().collect();
            s.allocated
                .entry(e.pod_uid)
                .or_default()
                .entry(e.container_name)
                .or_default()
                .insert(
                    e.resource_name,
                    Allocation {
                        ids,
                        numa: e.device_ids,
                        response,
                    },
                );
        }
        tracing::info!(
            resources = s.resources.len(),
            pods = s.allocated.len(),
            "device manager: checkpoint restored"
        );
    }

    fn write_checkpoint(&self, s: &State) {
        let mut data = checkpoint::CheckpointData::default();
        for (uid, containers) in &s.allocated {
            for (c, resources) in containers {
                for (r, a) in resources {
                    data.pod_device_entries.push(checkpoint::PodDevicesEntry {
                        pod_uid: uid.clone(),
                        container_name: c.clone(),
                        resource_name: r.clone(),
                        device_ids: a.numa.clone(),
                        alloc_resp: a.response.encode_to_vec(),
                    });
                }
            }
        }
        for (name, r) in &s.resources {
            data.registered_devices
                .insert(name.clone(), r.devices.keys().cloned().collect());
        }
        if let Err(e) = checkpoint::write(&self.dir, &data) {
            tracing::error!(error = %e, "device manager: cannot write the checkpoint");
        }
    }

    /// Resolves when capacity or allocatable may have changed.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Whether `name` is a device plugin's resource (registered now, or before a restart).
    pub fn is_device_plugin_resource(&self, name: &str) -> bool {
        self.state
            .lock()
            .is_ok_and(|s| s.resources.contains_key(name))
    }

    /// upstream's GetCapacity: per resource, every device (capacity) and the healthy ones
    /// (allocatable); a resource whose plugin has been gone past the grace is 0.
    pub fn capacity(&self) -> BTreeMap<String, (i64, i64)> {
        let now = Instant::now();
        let Ok(s) = self.state.lock() else {
            return BTreeMap::new();
        };
        s.resources
            .iter()
            .map(|(name, r)| {
                let v = if r.expired(now) {
                    (0, 0)
                } else {
                    (r.devices.len() as i64, r.healthy().len() as i64)
                };
                (name.clone(), v)
            })
            .collect()
    }

    /// The healthy devices per resource (the pod-resources API's GetAllocatableResources).
    pub fn allocatable_devices(&self) -> BTreeMap<String, Vec<pb::Device>> {
        let Ok(s) = self.state.lock() else {
            return BTreeMap::new();
        };
        s.resources
            .iter()
            .map(|(name, r)| {
                let healthy = r.healthy();
                (
                    name.clone(),
                    r.devices
                        .values()
                        .filter(|d| healthy.contains(&d.id))
                        .cloned()
                        .collect(),
                )
            })
            .collect()
    }

    /// The devices of one container: resource → (device IDs, NUMA nodes).
    pub fn container_devices(
        &self,
        uid: &str,
        container: &str,
    ) -> BTreeMap<String, (Vec<String>, Vec<i64>)> {
        let Ok(s) = self.state.lock() else {
            return BTreeMap::new();
        };
        s.allocated
            .get(uid)
            .and_then(|c| c.get(container))
            .map(|rs| {
                rs.iter()
                    .map(|(r, a)| {
                        let numa = a
                            .numa
                            .keys()
                            .filter_map(|k| k.parse::<i64>().ok())
                            .filter(|n| *n >= 0)
                            .collect();
                        (r.clone(), (a.ids.iter().cloned().collect(), numa))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A registration passed validation and its plugin answered: the resource is served by
    /// `client` from now on (a plugin registering again replaces its old endpoint).
    fn register(
        &self,
        name: &str,
        options: pb::DevicePluginOptions,
        client: endpoint::Client,
    ) -> u64 {
        let Ok(mut s) = self.state.lock() else {
            return 0;
        };
        let r = s.resources.entry(name.to_string()).or_default();
        r.generation += 1;
        r.options = options;
        r.client = Some(client);
        r.stopped_at = None;
        r.generation
    }

    /// A ListAndWatch answer: the resource's devices now.
    fn update_devices(&self, name: &str, generation: u64, devices: Vec<pb::Device>) {
        let Ok(mut s) = self.state.lock() else { return };
        let Some(r) = s
            .resources
            .get_mut(name)
            .filter(|r| r.generation == generation)
        else {
            return;
        };
        r.devices = devices.into_iter().map(|d| (d.id.clone(), d)).collect();
        let healthy = r.healthy().len();
        let total = r.devices.len();
        tracing::info!(
            resource = name,
            total,
            healthy,
            "device plugin reported its devices"
        );
        self.write_checkpoint(&s);
        drop(s);
        self.changed.notify_waiters();
    }

    /// The plugin's stream ended: its devices are unhealthy from now on (upstream's
    /// markResourceUnhealthy), and after the grace the resource is 0.
    fn endpoint_stopped(&self, name: &str, generation: u64) {
        let Ok(mut s) = self.state.lock() else { return };
        let Some(r) = s
            .resources
            .get_mut(name)
            .filter(|r| r.generation == generation)
        else {
            return;
        };
        r.stopped_at = Some(Instant::now());
        r.client = None;
        drop(s);
        self.changed.notify_waiters();
    }

    /// upstream's UpdateAllocatedDevices: devices of pods no longer active go back, but not
    /// those of pods still waiting for their turn at admission.
    fn release_inactive(&self, s: &mut State, active: &HashSet<String>) -> bool {
        let pending = self.pending.get();
        let gone: Vec<String> = s
            .allocated
            .keys()
            .filter(|u| !active.contains(*u) && !pending.is_some_and(|f| f(u)))
            .cloned()
            .collect();
        for u in &gone {
            tracing::info!(pod_uid = %u, "device manager: releasing the devices of a pod no longer active");
            s.allocated.remove(u);
        }
        !gone.is_empty()
    }

    /// upstream's Allocate for every container of `pod` asking for device resources, init
    /// containers first (their devices may be reused by the containers after them).
    pub async fn allocate<P: std::borrow::Borrow<Pod>>(
        &self,
        pod: &Pod,
        others: &[P],
    ) -> Result<(), String> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        {
            let mut active: HashSet<String> = others
                .iter()
                .filter_map(|p| p.borrow().metadata.uid.clone())
                .collect();
            active.insert(uid.clone());
            let mut s = self.state.lock().map_err(|_| "device manager poisoned")?;
            if self.release_inactive(&mut s, &active) {
                self.write_checkpoint(&s);
            }
        }
        let inits = spec.init_containers.iter().flatten();
        let all: Vec<(&Container, bool)> = inits
            .map(|c| (c, c.restart_policy.as_deref() != Some("Always")))
            .chain(spec.containers.iter().map(|c| (c, false)))
            .collect();
        for (c, reusable_after) in all {
            for (resource, needed) in nodus_k8s::resources::container_extended_requests(c) {
                if needed <= 0 || !self.is_device_plugin_resource(&resource) {
                    continue;
                }
                self.allocate_container(&uid, &c.name, &resource, needed as usize, reusable_after)
                    .await?;
            }
        }
        Ok(())
    }

    async fn allocate_container(
        &self,
        uid: &str,
        container: &str,
        resource: &str,
        needed: usize,
        init: bool,
    ) -> Result<(), String> {
        let (available, reusable, client, options) = {
            let s = self.state.lock().map_err(|_| "device manager poisoned")?;
            let pod = s.allocated.get(uid);
            // Already done (a kubelet restart re-admitting a running pod): keep it.
            if pod
                .and_then(|p| p.get(container))
                .is_some_and(|c| c.contains_key(resource))
            {
                return Ok(());
            }
            let Some(r) = s.resources.get(resource) else {
                return Err(format!("cannot allocate unregistered device {resource}"));
            };
            let mut in_use = BTreeSet::new();
            let mut reusable = BTreeSet::new();
            for (puid, containers) in &s.allocated {
                for (cname, rs) in containers {
                    if let Some(a) = rs.get(resource) {
                        in_use.extend(a.ids.iter().cloned());
                        if puid == uid && cname.starts_with("init:") {
                            reusable.extend(a.ids.iter().cloned());
                        }
                    }
                }
            }
            let healthy = r.healthy();
            let reusable: BTreeSet<String> = reusable.intersection(&healthy).cloned().collect();
            let available: BTreeSet<String> = healthy
                .difference(&in_use)
                .cloned()
                .chain(reusable.iter().cloned())
                .collect();
            if available.len() < needed {
                return Err(format!(
                    "requested number of devices unavailable for {resource}. Requested: {needed}, Available: {}",
                    available.len()
                ));
            }
            let ordered = self.aligned_first(&s, uid, container, resource, &available);
            (ordered, reusable, r.client.clone(), r.options)
        };
        let Some(client) = client else {
            return Err(format!("cannot allocate unregistered device {resource}"));
        };
        let must: Vec<String> = reusable.iter().take(needed).cloned().collect();
        let mut chosen: Option<Vec<String>> = None;
        if options.get_preferred_allocation_available {
            match client
                .preferred(available.to_vec(), must.clone(), needed)
                .await
            {
                Ok(ids)
                    if ids.len() == needed
                        && ids.iter().all(|i| available.contains(i))
                        && must.iter().all(|m| ids.contains(m)) =>
                {
                    chosen = Some(ids)
                }
                Ok(ids) => {
                    tracing::info!(
                        resource,
                        ?ids,
                        "device plugin preferred an allocation that does not fit; choosing ourselves"
                    )
                }
                Err(e) => {
                    tracing::info!(resource, error = %e, "GetPreferredAllocation failed; choosing ourselves")
                }
            }
        }
        let ids = chosen.unwrap_or_else(|| {
            let mut ids = must.clone();
            ids.extend(
                available
                    .iter()
                    .filter(|i| !must.contains(i))
                    .take(needed - must.len())
                    .cloned(),
            );
            ids
        });
        let response = client.allocate(ids.clone()).await?;
        let Ok(mut s) = self.state.lock() else {
            return Err("device manager poisoned".into());
        };
        let mut numa: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let devices = s
            .resources
            .get(resource)
            .map(|r| r.devices.clone())
            .unwrap_or_default();
        for id in &ids {
            let node = devices
                .get(id)
                .and_then(|d| d.topology.as_ref())
                .and_then(|t| t.nodes.first())
                .map(|n| n.id.to_string())
                .unwrap_or_else(|| NO_TOPOLOGY.to_string());
            numa.entry(node).or_default().push(id.clone());
        }
        let key = if init {
            format!("init:{container}")
        } else {
            container.to_string()
        };
        tracing::info!(pod_uid = uid, container, resource, devices = ?ids, "devices allocated");
        s.allocated
            .entry(uid.to_string())
            .or_default()
            .entry(key.clone())
            .or_default()
            .insert(
                resource.to_string(),
                Allocation {
                    ids: ids.into_iter().collect(),
                    numa,
                    response,
                },
            );
        // The container's name is what later lookups use; init containers are also kept
        // under their marker so their devices can be reused.
        if init {
            let a = s.allocated[uid][&key][resource].clone();
            s.allocated
                .entry(uid.to_string())
                .or_default()
                .entry(container.to_string())
                .or_default()
                .insert(resource.to_string(), a);
        }
        self.write_checkpoint(&s);
        Ok(())
    }

    /// upstream's GetDeviceRunContainerOptions: what the container's CRI config gets from
    /// its devices, after PreStartContainer for plugins that ask for it.
    pub async fn container_options(
        &self,
        uid: &str,
        container: &str,
    ) -> Result<Option<RunContainerOptions>, String> {
        let (allocs, clients) = {
            let s = self.state.lock().map_err(|_| "device manager poisoned")?;
            let Some(rs) = s.allocated.get(uid).and_then(|c| c.get(container)) else {
                return Ok(None);
            };
            let clients: BTreeMap<String, (bool, Option<endpoint::Client>)> = rs
                .keys()
                .map(|r| {
                    let res = s.resources.get(r);
                    (
                        r.clone(),
                        (
                            res.is_some_and(|x| x.options.pre_start_required),
                            res.and_then(|x| x.client.clone()),
                        ),
                    )
                })
                .collect();
            (rs.clone(), clients)
        };
        let mut out = RunContainerOptions::default();
        for (resource, a) in allocs {
            if let Some((true, client)) = clients.get(&resource) {
                let Some(client) = client else {
                    return Err(format!("plugin resource {resource} is not registered"));
                };
                client
                    .pre_start(a.ids.iter().cloned().collect())
                    .await
                    .map_err(|e| {
                        format!("device plugin PreStartContainer rpc failed with err: {e}")
                    })?;
            }
            merge(&mut out, a.response);
        }
        Ok(Some(out))
    }
}

/// Adds one plugin's answer, skipping device nodes and mounts already present (two
/// resources may hand out the same node).
fn merge(out: &mut RunContainerOptions, r: pb::ContainerAllocateResponse) {
    for d in r.devices {
        if !out
            .devices
            .iter()
            .any(|o| o.container_path == d.container_path)
        {
            out.devices.push(d);
        }
    }
    for m in r.mounts {
        if !out
            .mounts
            .iter()
            .any(|o| o.container_path == m.container_path)
        {
            out.mounts.push(m);
        }
    }
    out.envs.extend(r.envs);
    out.annotations.extend(r.annotations);
    for c in r.cdi_devices {
        if !out.cdi_devices.contains(&c.name) {
            out.cdi_devices.push(c.name);
        }
    }
}

impl PodAdmitHandler for DeviceManager {
    fn admit<'a>(&'a self, attrs: &'a PodAdmitAttributes<'a>) -> BoxFuture<'a, PodAdmitResult> {
        Box::pin(async move {
            self.allocate(attrs.pod, attrs.other_pods)
                .await
                .map_err(|e| Rejection {
                    reason: Reason::UnexpectedAdmissionError,
                    message: format!("Allocate failed due to {e}, which is unexpected"),
                })
                .into()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_counts_every_device_and_allocatable_the_healthy_ones() {
        let dir = tempfile::tempdir().unwrap();
        let m = DeviceManager::new(dir.path()).unwrap();
        {
            let mut s = m.state.lock().unwrap();
            let r = s.resources.entry("example.com/d".into()).or_default();
            r.generation = 1;
        }
        let dev = |id: &str, h: &str| pb::Device {
            id: id.into(),
            health: h.into(),
            topology: None,
        };
        m.update_devices(
            "example.com/d",
            1,
            vec![dev("a", HEALTHY), dev("b", "Unhealthy"), dev("c", HEALTHY)],
        );
        assert_eq!(m.capacity()["example.com/d"], (3, 2));
        // A stale stream's end is ignored.
        m.endpoint_stopped("example.com/d", 0);
        assert_eq!(m.capacity()["example.com/d"], (3, 2));
        m.endpoint_stopped("example.com/d", 1);
        assert_eq!(m.capacity()["example.com/d"], (3, 0));
        m.state
            .lock()
            .unwrap()
            .resources
            .get_mut("example.com/d")
            .unwrap()
            .stopped_at = Instant::now().checked_sub(ENDPOINT_STOP_GRACE);
        assert_eq!(m.capacity()["example.com/d"], (0, 0));
        // The registered devices are in the checkpoint; after a restart the resource is
        // known but empty until its plugin comes back.
        let again = DeviceManager::new(dir.path()).unwrap();
        assert!(again.is_device_plugin_resource("example.com/d"));
        assert_eq!(again.capacity()["example.com/d"], (0, 0));
    }

    #[test]
    fn responses_merge_without_duplicates() {
        let mut out = RunContainerOptions::default();
        let r = pb::ContainerAllocateResponse {
            envs: [("A".to_string(), "1".to_string())].into(),
            mounts: vec![],
            devices: vec![pb::DeviceSpec {
                container_path: "/dev/fuse".into(),
                host_path: "/dev/fuse".into(),
                permissions: "rw".into(),
            }],
            annotations: Default::default(),
            cdi_devices: vec![pb::CdiDevice {
                name: "vendor.com/gpu=0".into(),
            }],
        };
        merge(&mut out, r.clone());
        merge(&mut out, r);
        assert_eq!(out.devices.len(), 1);
        assert_eq!(out.cdi_devices, vec!["vendor.com/gpu=0".to_string()]);
        assert_eq!(out.envs["A"], "1");
    }
}
