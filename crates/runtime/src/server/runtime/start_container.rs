//! StartContainer: `runc start` on a created container.

use super::Inner;
use crate::state::ContainerState;
use cri::runtime::v1 as pb;
use std::sync::Arc;
use tonic::Status;

pub async fn start_container(
    inner: &Arc<Inner>,
    req: pb::StartContainerRequest,
) -> Result<pb::StartContainerResponse, Status> {
    let mut rec = inner.find_container(&req.container_id)?;
    if rec.state != ContainerState::Created {
        return Err(Status::failed_precondition(format!(
            "container {} is in {:?} state, only a created container can be started",
            rec.id,
            super::container_status::cri_state(rec.state)
        )));
    }
    let rt = inner
        .handlers
        .get(&rec.handler)
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
    // Running (and STARTED) is recorded before `runc start`: a container that exits at
    // once must find its record Running when its exit is recorded, so the events stay in
    // order (CREATED, STARTED, STOPPED) and finished_at is never before started_at.
    rec.state = ContainerState::Running;
    rec.started_at = crate::state::now_ns();
    inner.save_container(&rec)?;
    let sandbox = inner
        .find_sandbox(&rec.sandbox_id)
        .ok()
        .map(|s| super::pod_sandbox_status::to_status(&s));
    inner.emit(
        &rec.id,
        pb::ContainerEventType::ContainerStartedEvent,
        sandbox,
        vec![super::container_status::to_status(&rec)],
    );
    if let Err(e) = rt.start(&rec.id).await {
        // As containerd: a container that failed to start is exited, with the reason.
        let mut rec = inner.find_container(&rec.id)?;
        if rec.state == ContainerState::Running {
            rec.state = ContainerState::Exited;
            rec.exit_code = 128;
            rec.finished_at = crate::state::now_ns();
            rec.reason = "StartError".into();
            rec.message = e.to_string();
            inner.save_container(&rec)?;
            inner.emit(
                &rec.id,
                pb::ContainerEventType::ContainerStoppedEvent,
                None,
                vec![super::container_status::to_status(&rec)],
            );
        }
        return Err(Status::unknown(format!(
            "failed to start container {}: {e}",
            rec.id
        )));
    }
    tracing::info!(container = %rec.id, "container started");
    // A container that ran to completion before its monitor was watching is caught up here.
    if !crate::container::monitor::alive(rec.shim_pid.unwrap_or(0)) {
        super::container_exit::record_exit(inner, &rec.id);
    }
    Ok(pb::StartContainerResponse {})
}
