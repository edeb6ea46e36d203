//! StopContainer: the image's stop signal (SIGTERM by default), then SIGKILL to every
//! process after the timeout. Stopping an exited or absent container succeeds.

use super::Inner;
use crate::state::ContainerState;
use cri::runtime::v1 as pb;
use std::time::Duration;
use tonic::Status;

/// Signal names as images spell StopSignal ("SIGQUIT", "QUIT", "3").
fn parse_signal(s: &str) -> Option<i32> {
    if let Ok(n) = s.parse::<i32>() {
        return Some(n);
    }
    let name = s.trim().to_ascii_uppercase();
    let name = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    name.parse::<nix::sys::signal::Signal>()
        .ok()
        .map(|s| s as i32)
}

fn stop_signal(inner: &Inner, image_id: &str) -> i32 {
    inner
        .images
        .resolve(image_id)
        .ok()
        .flatten()
        .and_then(|img| inner.images.config_json(&img).ok())
        .and_then(|c| {
            c.get("config")
                .and_then(|c| c.get("StopSignal"))
                .and_then(|s| s.as_str())
                .and_then(parse_signal)
        })
        .unwrap_or(libc::SIGTERM)
}

/// Stops container `id`: the stop signal, up to `timeout` of grace, then SIGKILL.
pub(crate) async fn stop(inner: &Inner, id: &str, timeout: Duration) -> Result<(), Status> {
    stop_only(inner, id, timeout).await?;
    // Plugins hear of the stop once, whoever noticed it first.
    if let Some(nri) = inner.nri() {
        nri.container_stopped(id).await;
    }
    Ok(())
}

async fn stop_only(inner: &Inner, id: &str, timeout: Duration) -> Result<(), Status> {
    let rec = match inner.find_container(id) {
        Ok(r) => r,
        Err(s) if s.code() == tonic::Code::NotFound => return Ok(()),
        Err(s) => return Err(s),
    };
    // A created container has no process yet (its shim starts with StartContainer):
    // nothing to stop, and it stays created, as in containerd.
    if rec.state == ContainerState::Exited
        || (rec.state == ContainerState::Created && rec.shim_pid.is_none())
    {
        return Ok(());
    }
    let rt = inner
        .handlers
        .get(&rec.handler)
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
    if !timeout.is_zero() && rec.state == ContainerState::Running {
        let sig = stop_signal(inner, &rec.image_id);
        if let Err(e) = rt.kill(&rec.id, sig, false).await {
            tracing::warn!(container = %rec.id, error = %e, "stop signal failed; killing");
        }
        if super::container_exit::wait_exit(inner, &rec.id, timeout).await {
            return Ok(());
        }
    }
    rt.kill(&rec.id, libc::SIGKILL, true)
        .await
        .map_err(|e| Status::unknown(format!("failed to kill container {}: {e}", rec.id)))?;
    if !super::container_exit::wait_exit(inner, &rec.id, Duration::from_secs(30)).await {
        return Err(Status::deadline_exceeded(format!(
            "container {} did not exit 30s after SIGKILL",
            rec.id
        )));
    }
    Ok(())
}

pub async fn stop_container(
    inner: &Inner,
    req: pb::StopContainerRequest,
) -> Result<pb::StopContainerResponse, Status> {
    stop(
        inner,
        &req.container_id,
        Duration::from_secs(req.timeout.max(0) as u64),
    )
    .await?;
    Ok(pb::StopContainerResponse {})
}

#[cfg(test)]
mod tests {
    #[test]
    fn stop_signals_parse_like_docker() {
        assert_eq!(super::parse_signal("SIGQUIT"), Some(libc::SIGQUIT));
        assert_eq!(super::parse_signal("quit"), Some(libc::SIGQUIT));
        assert_eq!(super::parse_signal("9"), Some(9));
        assert_eq!(super::parse_signal("NOPE"), None);
    }
}
