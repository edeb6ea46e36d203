//! Exec: validate, resolve the process to run and hand out a streaming URL (containerd's
//! `container_exec.go` over the kubelet's `GetExec`). The session itself runs when the
//! client connects to the URL ([`crate::streaming`]).

use super::Inner;
use crate::state::{ContainerRecord, ContainerState};
use crate::streaming;
use cri::runtime::v1 as pb;
use tonic::Status;

/// The CRI's name of a container state, as containerd prints it in errors.
pub(crate) fn state_name(s: ContainerState) -> &'static str {
    match s {
        ContainerState::Created => "CONTAINER_CREATED",
        ContainerState::Running => "CONTAINER_RUNNING",
        ContainerState::Exited => "CONTAINER_EXITED",
        ContainerState::Unknown => "CONTAINER_UNKNOWN",
    }
}

/// The kubelet's checks of the stream flags (`validateExecRequest`/`validateAttachRequest`).
pub(crate) fn validate_streams(
    tty: bool,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    none_set: &str,
) -> Result<(), Status> {
    if tty && stderr {
        // With a terminal there is one output stream; stderr cannot be told apart.
        return Err(Status::invalid_argument(
            "tty and stderr cannot both be true",
        ));
    }
    if !stdin && !stdout && !stderr {
        return Err(Status::invalid_argument(none_set));
    }
    Ok(())
}

/// The record of the running container `id` that an exec or attach streams to; upstream's
/// texts for a missing id and for a container not running.
pub(crate) fn running_container(inner: &Inner, id: &str) -> Result<ContainerRecord, Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument("missing required container_id"));
    }
    let rec = inner.find_container(id)?;
    if rec.state != ContainerState::Running {
        return Err(Status::failed_precondition(format!(
            "container is in {} state",
            state_name(rec.state)
        )));
    }
    Ok(rec)
}

pub(crate) fn cache_full(e: streaming::CacheFull) -> Status {
    Status::resource_exhausted(e.to_string())
}

pub async fn exec(inner: &Inner, req: pb::ExecRequest) -> Result<pb::ExecResponse, Status> {
    let rec = running_container(inner, &req.container_id)?;
    validate_streams(
        req.tty,
        req.stdin,
        req.stdout,
        req.stderr,
        "one of stdin, stdout, or stderr must be set",
    )?;
    if req.cmd.is_empty() {
        return Err(Status::invalid_argument("exec command must not be empty"));
    }
    let rt = inner
        .handlers
        .get(&rec.handler)
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
    let process = super::exec_sync::exec_process(&rec.bundle, &req.cmd, req.tty)?;
    let url = inner
        .streaming
        .insert(streaming::Request::Exec(streaming::ExecRequest {
            target: streaming::ExecTarget {
                runtime: rt.clone(),
                container_id: rec.id.clone(),
                process,
                scratch_dir: inner.state_dir.clone(),
            },
            cmd: req.cmd,
            tty: req.tty,
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
        }))
        .map_err(cache_full)?;
    tracing::debug!(container = %rec.id, "exec request cached");
    Ok(pb::ExecResponse { url })
}
