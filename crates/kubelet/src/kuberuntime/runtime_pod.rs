//! The runtime's view of a pod, read back through the CRI (upstream's kubecontainer.PodStatus).

use super::labels;
use crate::cri::Runtime;
use cri::runtime::v1 as pb;
use std::collections::HashMap;

/// One container as the runtime reports it, with the kubelet's annotations decoded.
#[derive(Clone, Debug)]
pub struct ContainerInfo {
    pub id: String,
    pub name: String,
    pub sandbox_id: String,
    pub state: pb::ContainerState,
    /// Nanoseconds since the epoch; 0 when not (yet) applicable.
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    /// The image as the pod spec names it.
    pub image: String,
    /// The resolved image (digest or id).
    pub image_ref: String,
    pub image_id: String,
    pub hash: String,
    pub restart_count: i32,
    pub init: bool,
    pub annotations: HashMap<String, String>,
    /// The identity of the init process, when the runtime reports it (ContainerStatus.user).
    pub user: Option<pb::LinuxContainerUser>,
}

/// One sandbox as the runtime reports it.
#[derive(Clone, Debug)]
pub struct SandboxInfo {
    pub id: String,
    pub attempt: u32,
    pub ready: bool,
    pub created_at: i64,
    pub ip: String,
    pub additional_ips: Vec<String>,
}

/// Everything the runtime has for one pod uid, newest first.
#[derive(Clone, Debug, Default)]
pub struct RuntimePod {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub sandboxes: Vec<SandboxInfo>,
    pub containers: Vec<ContainerInfo>,
}

impl RuntimePod {
    /// The newest status of the container named `name`.
    pub fn latest(&self, name: &str) -> Option<&ContainerInfo> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// All statuses of `name`, newest first.
    pub fn all_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a ContainerInfo> + 'a {
        self.containers.iter().filter(move |c| c.name == name)
    }

    pub fn running(&self) -> impl Iterator<Item = &ContainerInfo> {
        self.containers
            .iter()
            .filter(|c| c.state == pb::ContainerState::ContainerRunning)
    }

    /// The pod's IPs, from the newest ready sandbox.
    pub fn ips(&self) -> Vec<String> {
        self.sandboxes
            .iter()
            .find(|s| s.ready)
            .map(|s| {
                let mut v = Vec::new();
                if !s.ip.is_empty() {
                    v.push(s.ip.clone());
                }
                v.extend(s.additional_ips.iter().cloned());
                v
            })
            .unwrap_or_default()
    }
}

fn parse_container(c: pb::ContainerStatus, sandbox_id: String) -> ContainerInfo {
    let ann = c.annotations;
    let lab = c.labels;
    let name = c
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .or_else(|| lab.get(labels::CONTAINER_NAME).cloned())
        .unwrap_or_default();
    ContainerInfo {
        id: c.id,
        name,
        sandbox_id,
        state: pb::ContainerState::try_from(c.state)
            .unwrap_or(pb::ContainerState::ContainerUnknown),
        created_at: c.created_at,
        started_at: c.started_at,
        finished_at: c.finished_at,
        exit_code: c.exit_code,
        reason: c.reason,
        message: c.message,
        image: c
            .image
            .map(|i| {
                if i.user_specified_image.is_empty() {
                    i.image
                } else {
                    i.user_specified_image
                }
            })
            .unwrap_or_default(),
        image_ref: c.image_ref,
        image_id: c.image_id,
        hash: ann.get(labels::CONTAINER_HASH).cloned().unwrap_or_default(),
        restart_count: ann
            .get(labels::CONTAINER_RESTART_COUNT)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        init: lab.get(labels::CONTAINER_TYPE).map(String::as_str) == Some("init"),
        annotations: ann,
        user: c.user.and_then(|u| u.linux),
    }
}

/// Reads one pod's sandboxes and containers (upstream's GetPodStatus).
pub async fn pod_status(rt: &Runtime, uid: &str) -> Result<RuntimePod, tonic::Status> {
    let filter = HashMap::from([(labels::POD_UID.to_string(), uid.to_string())]);
    let mut client = rt.runtime.clone();
    let sandboxes = client
        .list_pod_sandbox(pb::ListPodSandboxRequest {
            filter: Some(pb::PodSandboxFilter {
                label_selector: filter.clone(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .items;
    let containers = client
        .list_containers(pb::ListContainersRequest {
            filter: Some(pb::ContainerFilter {
                label_selector: filter,
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .containers;
    let mut pod = RuntimePod {
        uid: uid.to_string(),
        ..Default::default()
    };
    for s in sandboxes {
        if let Some(m) = &s.metadata {
            pod.name = m.name.clone();
            pod.namespace = m.namespace.clone();
        }
        let mut info = SandboxInfo {
            id: s.id.clone(),
            attempt: s.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
            ready: s.state == pb::PodSandboxState::SandboxReady as i32,
            created_at: s.created_at,
            ip: String::new(),
            additional_ips: Vec::new(),
        };
        if info.ready {
            // Only a ready sandbox has a network worth asking about.
            match client
                .pod_sandbox_status(pb::PodSandboxStatusRequest {
                    pod_sandbox_id: s.id.clone(),
                    verbose: false,
                })
                .await
            {
                Ok(r) => {
                    if let Some(n) = r.into_inner().status.and_then(|st| st.network) {
                        info.ip = n.ip;
                        info.additional_ips = n.additional_ips.into_iter().map(|i| i.ip).collect();
                    }
                }
                Err(e) if e.code() == tonic::Code::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
        pod.sandboxes.push(info);
    }
    pod.sandboxes
        .sort_by_key(|s| std::cmp::Reverse(s.created_at));
    for c in containers {
        match client
            .container_status(pb::ContainerStatusRequest {
                container_id: c.id.clone(),
                verbose: false,
            })
            .await
        {
            Ok(r) => {
                if let Some(st) = r.into_inner().status {
                    pod.containers
                        .push(parse_container(st, c.pod_sandbox_id.clone()));
                }
            }
            // Removed between the list and the status call: it is simply gone.
            Err(e) if e.code() == tonic::Code::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    pod.containers
        .sort_by_key(|c| std::cmp::Reverse(c.created_at));
    Ok(pod)
}

/// A light listing of every pod the runtime has that the kubelet created (by label), for
/// the PLEG relist and for orphan cleanup. Container states come from ListContainers only.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodSummary {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// sandbox id → ready
    pub sandboxes: Vec<(String, bool)>,
    /// container id → (name, state)
    pub containers: Vec<(String, String, i32)>,
}

pub async fn list_pods(rt: &Runtime) -> Result<HashMap<String, PodSummary>, tonic::Status> {
    let mut client = rt.runtime.clone();
    let sandboxes = client
        .list_pod_sandbox(pb::ListPodSandboxRequest { filter: None })
        .await?
        .into_inner()
        .items;
    let containers = client
        .list_containers(pb::ListContainersRequest { filter: None })
        .await?
        .into_inner()
        .containers;
    let mut pods: HashMap<String, PodSummary> = HashMap::new();
    for s in sandboxes {
        let Some(uid) = s.labels.get(labels::POD_UID) else {
            continue;
        };
        let p = pods.entry(uid.clone()).or_default();
        p.uid = uid.clone();
        if let Some(m) = &s.metadata {
            p.name = m.name.clone();
            p.namespace = m.namespace.clone();
        }
        p.sandboxes
            .push((s.id, s.state == pb::PodSandboxState::SandboxReady as i32));
    }
    for c in containers {
        let Some(uid) = c.labels.get(labels::POD_UID) else {
            continue;
        };
        let p = pods.entry(uid.clone()).or_default();
        p.uid = uid.clone();
        let name = c
            .labels
            .get(labels::CONTAINER_NAME)
            .cloned()
            .unwrap_or_default();
        p.containers.push((c.id, name, c.state));
    }
    for p in pods.values_mut() {
        p.sandboxes.sort();
        p.containers.sort();
    }
    Ok(pods)
}
