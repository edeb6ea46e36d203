//! Attach: validate and hand out a streaming URL for the container's own stdio (containerd's
//! `container_attach.go` over the kubelet's `GetAttach`); the session joins the shim.

use super::Inner;
use super::exec::{cache_full, running_container, validate_streams};
use crate::streaming;
use cri::runtime::v1 as pb;
use tonic::Status;

pub async fn attach(inner: &Inner, req: pb::AttachRequest) -> Result<pb::AttachResponse, Status> {
    let rec = running_container(inner, &req.container_id)?;
    validate_streams(
        req.tty,
        req.stdin,
        req.stdout,
        req.stderr,
        "one of stdin, stdout, and stderr must be set",
    )?;
    let cfg = rec.config();
    let url = inner
        .streaming
        .insert(streaming::Request::Attach(streaming::AttachRequest {
            container_id: rec.id.clone(),
            shim_dir: rec.shim_dir.clone(),
            container_tty: cfg.tty,
            container_stdin: cfg.stdin,
            stdin_once: cfg.stdin_once,
            tty: req.tty,
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
        }))
        .map_err(cache_full)?;
    tracing::debug!(container = %rec.id, "attach request cached");
    Ok(pb::AttachResponse { url })
}
