//! PodSandboxStatus: state, network (pod IPs), namespace options, labels, annotations and
//! handler; verbose adds the runtime's own view (namespace paths, pid-namespace init).

use super::Inner;
use crate::state::{SandboxRecord, SandboxState};
use cri::runtime::v1 as pb;
use std::collections::HashMap;
use tonic::Status;

/// The CRI view of a sandbox record.
pub(crate) fn cri_state(s: SandboxState) -> pb::PodSandboxState {
    match s {
        SandboxState::Ready => pb::PodSandboxState::SandboxReady,
        SandboxState::NotReady => pb::PodSandboxState::SandboxNotready,
    }
}

pub(crate) fn to_status(rec: &SandboxRecord) -> pb::PodSandboxStatus {
    let cfg = rec.config_ref();
    let ns_opts = cfg
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    pb::PodSandboxStatus {
        id: rec.id.clone(),
        metadata: cfg.metadata.clone(),
        state: cri_state(rec.state) as i32,
        created_at: rec.created_at,
        network: Some(pb::PodSandboxNetworkStatus {
            ip: rec.ip.clone().unwrap_or_default(),
            additional_ips: rec
                .additional_ips
                .iter()
                .map(|ip| pb::PodIp { ip: ip.clone() })
                .collect(),
        }),
        linux: Some(pb::LinuxPodSandboxStatus {
            namespaces: Some(pb::Namespace { options: ns_opts }),
        }),
        labels: cfg.labels.clone(),
        annotations: cfg.annotations.clone(),
        runtime_handler: rec.handler.clone(),
    }
}

pub fn pod_sandbox_status(
    inner: &Inner,
    req: pb::PodSandboxStatusRequest,
) -> Result<pb::PodSandboxStatusResponse, Status> {
    let rec = inner.find_sandbox(&req.pod_sandbox_id)?;
    let mut info = HashMap::new();
    if req.verbose {
        let v = serde_json::json!({
            "sandboxID": rec.id,
            "name": rec.name,
            "runtimeHandler": rec.handler,
            "netNamespacePath": rec.netns,
            "ipcNamespacePath": rec.ipc_ns,
            "utsNamespacePath": rec.uts_ns,
            "pidNamespacePath": rec.pid_ns,
            "pidNamespaceInit": rec.pid_init,
            "networkReady": rec.network_ready,
            "sandboxDir": rec.dir,
        });
        info.insert("info".to_string(), v.to_string());
    }
    let containers_statuses = inner
        .containers()
        .values()
        .filter(|c| c.sandbox_id == rec.id)
        .map(super::container_status::to_status)
        .collect();
    Ok(pb::PodSandboxStatusResponse {
        status: Some(to_status(&rec)),
        info,
        containers_statuses,
        timestamp: crate::state::now_ns(),
    })
}
