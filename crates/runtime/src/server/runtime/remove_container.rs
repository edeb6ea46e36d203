//! RemoveContainer: a running container is killed first (the CRI contract); then the OCI
//! runtime's state, the rootfs mount, the writable layer, the name and the record go.
//! Removing an absent container succeeds.

use super::Inner;
use crate::state::ContainerState;
use cri::runtime::v1 as pb;
use std::time::Duration;
use tonic::Status;

pub(crate) async fn remove(inner: &Inner, id: &str) -> Result<(), Status> {
    let rec = match inner.find_container(id) {
        Ok(r) => r,
        Err(s) if s.code() == tonic::Code::NotFound => return Ok(()),
        Err(s) => return Err(s),
    };
    if rec.state != ContainerState::Exited {
        super::stop_container::stop(inner, &rec.id, Duration::ZERO).await?;
    }
    if let Ok(rt) = inner.handlers.get(&rec.handler) {
        rt.delete(&rec.id, true)
            .await
            .map_err(|e| Status::unknown(format!("failed to delete container {}: {e}", rec.id)))?;
    }
    // What plugins are told of the container, read before its bundle goes.
    let nri_view = inner.nri().map(|nri| {
        let mut c = nri.container(&rec);
        c.state = cri::nri::ContainerState::ContainerStopped as i32;
        c
    });
    let dir = rec.bundle.parent().map(|p| p.to_path_buf());
    let layer_dir = rec.layer_dir.clone();
    let pod_ns = inner.pod_mount_ns(&rec.sandbox_id);
    tokio::task::spawn_blocking(move || -> Result<(), String> {
        // Everything mounted in the container's directory (rootfs, image volumes, idmapped
        // volumes) goes before the directory does, or removing it would reach into them.
        if let Some(dir) = &dir {
            crate::sandbox::mountns::run_in(pod_ns.as_deref(), || {
                crate::container::rootfs::unmount_all_under(dir)
            })
            .map_err(|e| e.to_string())??;
        }
        for d in dir.iter().chain(std::iter::once(&layer_dir)) {
            match std::fs::remove_dir_all(d) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(format!("removing {}: {e}", d.display()));
                }
                _ => {}
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| Status::internal(format!("cleanup task failed: {e}")))?
    .map_err(|e| Status::internal(format!("removing container {}: {e}", rec.id)))?;
    {
        let _turn = super::lock(&inner.exits);
        inner
            .container_records
            .delete_blocking(&rec.id)
            .map_err(|e| Status::internal(e.to_string()))?;
        inner.containers().remove(&rec.id);
    }
    inner
        .names
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .release(&rec.name);
    if let Ok(img) = rec.image_id.parse() {
        inner.images.release(&img);
    }
    tracing::info!(container = %rec.id, "container removed");
    if let (Some(nri), Some(c)) = (inner.nri(), nri_view) {
        nri.remove_container(super::nri::pod_of(inner, &rec.sandbox_id), c)
            .await;
    }
    let mut status = super::container_status::to_status(&rec);
    status.state = pb::ContainerState::ContainerExited as i32;
    inner.emit(
        &rec.id,
        pb::ContainerEventType::ContainerDeletedEvent,
        None,
        vec![status],
    );
    Ok(())
}

pub async fn remove_container(
    inner: &Inner,
    req: pb::RemoveContainerRequest,
) -> Result<pb::RemoveContainerResponse, Status> {
    remove(inner, &req.container_id).await?;
    Ok(pb::RemoveContainerResponse {})
}
