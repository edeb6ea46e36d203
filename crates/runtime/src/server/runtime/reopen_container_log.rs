//! ReopenContainerLog: the kubelet renamed the log file (rotation); the shim reopens the
//! path so new output goes to a fresh file.

use super::Inner;
use crate::state::ContainerState;
use cri::runtime::v1 as pb;
use tonic::Status;

pub async fn reopen_container_log(
    inner: &Inner,
    req: pb::ReopenContainerLogRequest,
) -> Result<pb::ReopenContainerLogResponse, Status> {
    let rec = inner.find_container(&req.container_id)?;
    if rec.state != ContainerState::Running {
        return Err(Status::failed_precondition(format!(
            "container {} is not running",
            rec.id
        )));
    }
    let dir = rec.shim_dir.clone();
    tokio::task::spawn_blocking(move || {
        crate::shim::ShimClient::connect(&dir).and_then(|mut c| c.reopen_log())
    })
    .await
    .map_err(|e| Status::internal(format!("reopen task failed: {e}")))?
    .map_err(|e| Status::unknown(format!("failed to reopen the log of {}: {e}", rec.id)))?;
    Ok(pb::ReopenContainerLogResponse {})
}
