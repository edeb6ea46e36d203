//! SyncPod over the CRI (upstream's kuberuntime): compute what a pod needs — a new sandbox,
//! the next init container, app containers to start or kill — and make it so.

pub mod backoff;
pub mod container;
pub mod covered_events;
pub mod env;
pub mod envvars;
pub mod image;
pub mod labels;
pub mod runtime_pod;
pub mod sandbox;
mod start_permit;
pub mod sync_pod;

use crate::cri::Runtime;
use crate::prober::ProbeManager;
use backoff::Backoff;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

pub use runtime_pod::{ContainerInfo, RuntimePod, SandboxInfo};
pub use sync_pod::{PodActions, SyncResult};

/// Node-level settings for SyncPod.
#[derive(Clone, Debug)]
pub struct Settings {
    pub root_dir: PathBuf,
    pub sandbox: sandbox::SandboxSettings,
    pub node_cpu_milli: i64,
    pub node_memory_bytes: i64,
    pub host_ips: Vec<String>,
    /// `--max-parallel-pod-starts`: pods started at once, 0 for no bound.
    pub max_parallel_pod_starts: usize,
}

/// A waiting reason a sync left for a container (upstream's ReasonCache entry).
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

/// The container-runtime half of the kubelet, shared by every pod worker.
pub struct KubeRuntime {
    pub rt: Runtime,
    /// The QoS hierarchy and pod cgroups.
    pub cm: std::sync::Arc<crate::cm::ContainerManager>,
    pub settings: Settings,
    pub probes: ProbeManager,
    /// CrashLoopBackOff: 10s doubling to 5m (upstream's MaxContainerBackOff).
    pub(crate) crash_backoff: Mutex<Backoff>,
    pub(crate) image_backoff: Mutex<Backoff>,
    /// pod uid → container name → why it is waiting.
    pub(crate) reasons: Mutex<HashMap<String, HashMap<String, Waiting>>>,
    /// The runtime's name as it reports it (`containerd`, `nodus`): the containerID scheme.
    pub runtime_name: Mutex<String>,
    /// The configMap/secret manager, set once when the kubelet has an API server.
    pub objects: std::sync::OnceLock<std::sync::Arc<crate::objectcache::ObjectCache>>,
    /// The service-account token manager, set once when the kubelet has an API server.
    pub tokens: std::sync::OnceLock<std::sync::Arc<crate::token::Manager>>,
    /// Every Service, for the containers' service variables; set once with an API server.
    pub services: std::sync::OnceLock<crate::services::ServiceLister>,
    /// The pods' user namespace blocks, set once at start (pods with `hostUsers: false`
    /// fail to sync without it).
    pub userns: std::sync::OnceLock<std::sync::Arc<crate::userns::UsernsManager>>,
    /// RuntimeClass name → CRI handler, set once when the kubelet has an API server.
    pub runtime_classes: std::sync::OnceLock<crate::runtimeclass::RuntimeClassManager>,
    /// Bounds the pods whose first sync runs at once ([`start_permit`]).
    pub(crate) pod_starts: Option<std::sync::Arc<tokio::sync::Semaphore>>,
    /// PLEG events the syncs that made their containers already covered.
    pub covered: covered_events::CoveredEvents,
}

impl KubeRuntime {
    pub fn new(
        rt: Runtime,
        cm: std::sync::Arc<crate::cm::ContainerManager>,
        settings: Settings,
        probes: ProbeManager,
    ) -> KubeRuntime {
        KubeRuntime {
            pod_starts: start_permit::limit(settings.max_parallel_pod_starts),
            rt,
            cm,
            settings,
            probes,
            crash_backoff: Mutex::new(Backoff::new(
                Duration::from_secs(10),
                Duration::from_secs(300),
            )),
            image_backoff: Mutex::new(Backoff::new(
                Duration::from_secs(10),
                Duration::from_secs(300),
            )),
            reasons: Mutex::new(HashMap::new()),
            runtime_name: Mutex::new("cri".into()),
            objects: std::sync::OnceLock::new(),
            tokens: std::sync::OnceLock::new(),
            services: std::sync::OnceLock::new(),
            userns: std::sync::OnceLock::new(),
            runtime_classes: std::sync::OnceLock::new(),
            covered: Default::default(),
        }
    }

    /// The service variables `pod`'s containers get (none without an API server).
    pub(crate) fn service_env(&self, pod: &k8s_openapi::api::core::v1::Pod) -> env::ServiceEnv {
        let Some(lister) = self.services.get() else {
            return env::ServiceEnv::default();
        };
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        env::ServiceEnv(lister.env_for(ns, links, crate::config::is_static_pod(pod)))
    }

    /// The CRI runtime handler for the pod's RuntimeClass (upstream's LookupRuntimeHandler);
    /// the runtime's default without an API server, as upstream's standalone kubelet.
    pub async fn runtime_handler(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
    ) -> Result<String, crate::runtimeclass::LookupError> {
        let Some(m) = self.runtime_classes.get() else {
            return Ok(String::new());
        };
        let name = pod
            .spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref());
        m.lookup_runtime_handler(name).await
    }

    /// The waiting reasons the last sync of pod `uid` left.
    pub fn waiting_reasons(&self, uid: &str) -> HashMap<String, Waiting> {
        self.reasons
            .lock()
            .ok()
            .and_then(|r| r.get(uid).cloned())
            .unwrap_or_default()
    }

    pub(crate) fn set_reason(&self, uid: &str, container: &str, w: Option<Waiting>) {
        if let Ok(mut r) = self.reasons.lock() {
            let pod = r.entry(uid.to_string()).or_default();
            match w {
                Some(w) => {
                    pod.insert(container.to_string(), w);
                }
                None => {
                    pod.remove(container);
                }
            }
        }
    }

    /// Forgets everything kept for a pod that is gone.
    pub fn forget(&self, uid: &str) {
        if let Ok(mut r) = self.reasons.lock() {
            r.remove(uid);
        }
        if let Ok(mut b) = self.crash_backoff.lock() {
            b.forget_prefix(&format!("{uid}_"));
        }
        if let Ok(mut b) = self.image_backoff.lock() {
            b.forget_prefix(&format!("{uid}_"));
        }
    }

    /// The pod's CRI user namespace: `None` (the node's) unless `hostUsers: false`, then
    /// its block, once the runtime handler is known to support user namespaces (asked
    /// of the runtime's Status, where upstream uses its cached runtime state).
    pub async fn user_namespace(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
    ) -> Result<Option<cri::runtime::v1::UserNamespace>, String> {
        if pod.spec.as_ref().and_then(|s| s.host_users) != Some(false) {
            return Ok(None);
        }
        let Some(manager) = self.userns.get() else {
            return Err(
                "can't set `spec.hostUsers: false`: this kubelet has no user namespace manager"
                    .into(),
            );
        };
        let handlers = self
            .rt
            .runtime
            .clone()
            .status(cri::runtime::v1::StatusRequest { verbose: false })
            .await
            .ok()
            .map(|r| r.into_inner().runtime_handlers);
        let handler = self.runtime_handler(pod).await.map_err(|e| e.to_string())?;
        manager
            .get_or_create(pod, &handler, handlers.as_deref())
            .map(Some)
    }

    /// Frees the user namespace block of a pod whose directory is gone.
    pub fn release_user_namespace(&self, uid: &str) {
        if let Some(m) = self.userns.get() {
            m.release(uid);
        }
    }

    /// Asks the runtime its name once (for `containerID: <name>://<id>`).
    pub async fn refresh_runtime_name(&self) -> Result<String, tonic::Status> {
        let v = self
            .rt
            .runtime
            .clone()
            .version(cri::runtime::v1::VersionRequest {
                version: "v1".into(),
            })
            .await?
            .into_inner();
        if let Ok(mut n) = self.runtime_name.lock() {
            *n = v.runtime_name.clone();
        }
        Ok(format!("{}://{}", v.runtime_name, v.runtime_version))
    }

    pub fn container_id(&self, id: &str) -> String {
        let name = self
            .runtime_name
            .lock()
            .map(|n| n.clone())
            .unwrap_or_else(|_| "cri".into());
        format!("{name}://{id}")
    }
}
