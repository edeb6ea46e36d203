//! PortForward: check the sandbox and hand out a streaming URL (containerd's
//! `sandbox_portforward.go` over the kubelet's `GetPortForward`); each forwarded connection
//! is dialled inside the sandbox's network namespace.

use super::Inner;
use super::exec::cache_full;
use crate::state::SandboxState;
use crate::streaming;
use cri::runtime::v1 as pb;
use tonic::Status;

pub async fn port_forward(
    inner: &Inner,
    req: pb::PortForwardRequest,
) -> Result<pb::PortForwardResponse, Status> {
    if req.pod_sandbox_id.is_empty() {
        return Err(Status::invalid_argument("missing required pod_sandbox_id"));
    }
    let sb = inner.find_sandbox(&req.pod_sandbox_id)?;
    if sb.state != SandboxState::Ready {
        return Err(Status::failed_precondition(
            "sandbox container is not running",
        ));
    }
    let url = inner
        .streaming
        .insert(streaming::Request::PortForward(
            streaming::PortForwardRequest {
                sandbox_id: sb.id.clone(),
                netns: sb.netns.clone(),
                ports: req.port,
            },
        ))
        .map_err(cache_full)?;
    tracing::debug!(sandbox = %sb.id, "port-forward request cached");
    Ok(pb::PortForwardResponse { url })
}
