//! StartContainer: the container's shim, which creates and starts it with one
//! `runc run --detach` (CreateContainer made only the bundle, as containerd's makes only
//! the container's metadata and leaves the task to StartContainer).

use super::Inner;
use crate::state::{ContainerRecord, ContainerState};
use cri::runtime::v1 as pb;
use std::sync::Arc;
use tonic::Status;

/// The shim's arguments for a created container.
fn shim_args(
    rec: &ContainerRecord,
    rt: &crate::oci::OciRuntime,
    mount_ns: Option<std::path::PathBuf>,
) -> crate::shim::ShimArgs {
    let cfg = rec.config();
    crate::shim::ShimArgs {
        id: rec.id.clone(),
        bundle: rec.bundle.clone(),
        runtime: rt.binary.clone(),
        runtime_root: rt.root.clone(),
        systemd_cgroup: rt.systemd_cgroup,
        runtime_args: rt.kind_args().iter().map(|a| a.to_string()).collect(),
        state_dir: rec.shim_dir.clone(),
        log_path: (!rec.log_path.is_empty()).then(|| rec.log_path.clone().into()),
        tty: cfg.tty,
        stdin: cfg.stdin,
        stdin_once: cfg.stdin_once,
        start: true,
        oom_file: crate::shim::cgroup::oom_file(&rec.bundle, &rec.id),
        mount_ns,
    }
}

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
        .map_err(|e| Status::failed_precondition(e.to_string()))?
        .clone();
    // Plugins' StartContainer hook: a failure leaves the container created, to be
    // started again.
    if let Some(nri) = inner.nri()
        && nri.wants(cri::nri::Event::StartContainer)
    {
        nri.start_container(
            super::nri::pod_of(inner, &rec.sandbox_id),
            nri.container(&rec),
        )
        .await?;
    }
    // Running (and STARTED) is recorded before the container runs: a container that exits
    // at once must find its record Running when its exit is recorded, so the events stay in
    // order (CREATED, STARTED, STOPPED) and finished_at is never before started_at.
    rec.state = ContainerState::Running;
    rec.started_at = crate::state::now_ns();
    inner.save_container(&rec).await?;
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
    let mount_ns = inner.pod_mount_ns(&rec.sandbox_id);
    let args = shim_args(&rec, &rt, mount_ns);
    let task = Arc::clone(inner);
    let spawned = tokio::task::spawn_blocking(move || task.shims.spawn(&args))
        .await
        .map_err(|e| Status::internal(format!("shim task failed: {e}")))?;
    let spawned = match spawned {
        Ok(s) => s,
        Err(e) => {
            // As containerd: a container that failed to start is exited, with the reason;
            // nothing of it is left in the OCI runtime.
            if let Err(d) = rt.delete(&rec.id, true).await {
                tracing::warn!(container = %rec.id, error = %d, "runc delete after a failed start");
            }
            let mut rec = inner.find_container(&rec.id)?;
            if rec.state == ContainerState::Running {
                rec.state = ContainerState::Exited;
                rec.exit_code = 128;
                rec.finished_at = crate::state::now_ns();
                rec.reason = "StartError".into();
                rec.message = e.to_string();
                inner.save_container(&rec).await?;
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
    };
    let mut rec = inner.find_container(&rec.id)?;
    rec.shim_pid = Some(spawned.shim_pid as u32);
    rec.init_pid = Some(spawned.init_pid as u32);
    inner.save_container(&rec).await?;
    super::container_exit::spawn_monitor(inner, &rec.id, spawned.shim_pid as u32);
    tracing::info!(container = %rec.id, "container started");
    if let Some(nri) = inner.nri()
        && nri.wants(cri::nri::Event::PostStartContainer)
        && let Err(e) = nri
            .post_start_container(
                super::nri::pod_of(inner, &rec.sandbox_id),
                nri.container(&rec),
            )
            .await
    {
        tracing::error!(container = %rec.id, error = %e.message(), "NRI: PostStartContainer notification failed");
    }
    Ok(pb::StartContainerResponse {})
}
