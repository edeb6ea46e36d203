//! StopPodSandbox: kill every container of the pod, tear its network down (CNI DEL), and
//! release its namespaces and /dev/shm. Idempotent, and an absent sandbox succeeds.

use super::Inner;
use crate::state::SandboxState;
use cri::runtime::v1 as pb;
use std::time::Duration;
use tonic::Status;

pub(crate) async fn stop(inner: &Inner, id: &str) -> Result<(), Status> {
    let mut rec = match inner.find_sandbox(id) {
        Ok(r) => r,
        Err(s) if s.code() == tonic::Code::NotFound => return Ok(()),
        Err(s) => return Err(s),
    };
    let ids: Vec<String> = inner
        .containers()
        .values()
        .filter(|c| c.sandbox_id == rec.id)
        .map(|c| c.id.clone())
        .collect();
    for c in ids {
        super::stop_container::stop(inner, &c, Duration::ZERO).await?;
    }
    super::run_pod_sandbox::teardown(inner, &rec).await;
    rec.network_ready = false;
    rec.netns = None;
    rec.ipc_ns = None;
    rec.uts_ns = None;
    rec.pid_ns = None;
    rec.pid_init = None;
    let was_ready = rec.state != SandboxState::NotReady;
    if was_ready {
        tracing::info!(sandbox = %rec.id, "sandbox stopped");
    }
    rec.state = SandboxState::NotReady;
    inner.save_sandbox(&rec).await?;
    // Once per stop, as the kubelet may stop a pod many times.
    if was_ready
        && let Some(nri) = inner.nri()
        && let Err(e) = nri.stop_pod_sandbox(crate::nri::objects::pod(&rec)).await
    {
        tracing::error!(sandbox = %rec.id, error = %e.message(), "NRI: StopPodSandbox notification failed");
    }
    Ok(())
}

pub async fn stop_pod_sandbox(
    inner: &Inner,
    req: pb::StopPodSandboxRequest,
) -> Result<pb::StopPodSandboxResponse, Status> {
    stop(inner, &req.pod_sandbox_id).await?;
    Ok(pb::StopPodSandboxResponse {})
}
