//! ContainerStatus: state, times, exit code, reason (Completed / Error / OOMKilled),
//! image and image id, mounts, log path, resources.

use super::Inner;
use crate::state::{ContainerRecord, ContainerState};
use cri::runtime::v1 as pb;
use std::collections::HashMap;
use tonic::Status;

pub(crate) fn cri_state(s: ContainerState) -> pb::ContainerState {
    match s {
        ContainerState::Created => pb::ContainerState::ContainerCreated,
        ContainerState::Running => pb::ContainerState::ContainerRunning,
        ContainerState::Exited => pb::ContainerState::ContainerExited,
        ContainerState::Unknown => pb::ContainerState::ContainerUnknown,
    }
}

/// The CRI view of a container record.
pub(crate) fn to_status(rec: &ContainerRecord) -> pb::ContainerStatus {
    let cfg = rec.config();
    pb::ContainerStatus {
        id: rec.id.clone(),
        metadata: cfg.metadata.clone(),
        state: cri_state(rec.state) as i32,
        created_at: rec.created_at,
        started_at: rec.started_at,
        finished_at: rec.finished_at,
        exit_code: rec.exit_code,
        image: Some(pb::ImageSpec {
            image: rec.image_ref.clone(),
            ..Default::default()
        }),
        image_ref: rec.image_id.clone(),
        reason: rec.reason.clone(),
        message: rec.message.clone(),
        labels: cfg.labels.clone(),
        annotations: cfg.annotations.clone(),
        mounts: cfg.mounts.clone(),
        log_path: rec.log_path.clone(),
        resources: cfg
            .linux
            .as_ref()
            .and_then(|l| l.resources.clone())
            .map(|r| pb::ContainerResources {
                linux: Some(r),
                windows: None,
            }),
        image_id: rec.image_id.clone(),
        user: None,
    }
}

pub fn container_status(
    inner: &Inner,
    req: pb::ContainerStatusRequest,
) -> Result<pb::ContainerStatusResponse, Status> {
    let rec = inner.find_container(&req.container_id)?;
    let mut info = HashMap::new();
    if req.verbose {
        let v = serde_json::json!({
            "sandboxID": rec.sandbox_id,
            "pid": rec.init_pid,
            "shimPid": rec.shim_pid,
            "runtimeHandler": rec.handler,
            "bundle": rec.bundle,
            "name": rec.name,
        });
        info.insert("info".to_string(), v.to_string());
    }
    Ok(pb::ContainerStatusResponse {
        status: Some(to_status(&rec)),
        info,
    })
}
