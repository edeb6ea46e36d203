//! Container exits: the monitor that notices them, and the one place a record turns
//! Exited (so the STOPPED event is sent once, whoever notices first: the monitor, a
//! StopContainer, or the recovery after a daemon restart).

use super::Inner;
use crate::container::monitor;
use crate::state::ContainerState;
use cri::runtime::v1 as pb;
use std::sync::Arc;
use std::time::Duration;

/// containerd's reasons, which the kubelet shows in pod status.
fn reason(code: i32, oom: bool) -> &'static str {
    if oom {
        "OOMKilled"
    } else if code == 0 {
        "Completed"
    } else {
        "Error"
    }
}

/// Records the exit of container `id` from its shim's exit.json (or as lost when the shim
/// died without writing one). Idempotent.
pub(crate) fn record_exit(inner: &Inner, id: &str) {
    let _turn = super::lock(&inner.exits);
    let Ok(mut rec) = inner.find_container(id) else {
        return;
    };
    if rec.state == ContainerState::Exited {
        return;
    }
    match crate::shim::read_exit(&rec.shim_dir) {
        Some(exit) => {
            rec.exit_code = exit.exit_code;
            rec.finished_at = exit
                .exited_at
                .timestamp_nanos_opt()
                .unwrap_or_else(crate::state::now_ns);
            // The shim's clock and ours differ by the time `runc start` took to return.
            rec.finished_at = rec.finished_at.max(rec.started_at);
            rec.reason = reason(exit.exit_code, exit.oom_killed).to_string();
            rec.message = String::new();
        }
        None => {
            if crate::shim::shim_alive(&rec.shim_dir) {
                return;
            }
            rec.exit_code = 255;
            rec.finished_at = crate::state::now_ns();
            rec.reason = "Unknown".into();
            rec.message = "the container's shim exited without recording an exit status".into();
        }
    }
    rec.state = ContainerState::Exited;
    if let Err(e) = inner.save_container_blocking(&rec) {
        tracing::error!(container = %id, error = %e, "recording container exit failed");
        return;
    }
    tracing::info!(
        container = %id,
        exit_code = rec.exit_code,
        reason = %rec.reason,
        "container exited"
    );
    let status = super::container_status::to_status(&rec);
    let sandbox = inner
        .find_sandbox(&rec.sandbox_id)
        .ok()
        .map(|s| super::pod_sandbox_status::to_status(&s));
    inner.emit(
        id,
        pb::ContainerEventType::ContainerStoppedEvent,
        sandbox,
        vec![status],
    );
}

/// Watches container `id` until its shim exits, then records the exit.
pub(crate) fn spawn_monitor(inner: &Arc<Inner>, id: &str, shim_pid: u32) {
    let inner = Arc::clone(inner);
    let id = id.to_string();
    tokio::spawn(async move {
        if let Err(e) = monitor::wait_for_exit(shim_pid).await {
            tracing::warn!(container = %id, shim_pid, error = %e, "cannot watch shim; polling");
            while monitor::alive(shim_pid) {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        record_exit(&inner, &id);
        release_mounts(&inner, &id).await;
        if let Some(nri) = inner.nri() {
            nri.container_stopped(&id).await;
        }
    });
}

/// Unmounts an exited container's rootfs and the volumes mounted in its directory (image
/// and idmapped volumes), as containerd's shim does when the task is deleted after its
/// exit: nothing reads them again (a CRI container is never restarted), and finished pods,
/// a Job's, would otherwise each keep their mounts on the host until they are removed.
async fn release_mounts(inner: &Inner, id: &str) {
    let Ok(rec) = inner.find_container(id) else {
        return;
    };
    let Some(dir) = rec.bundle.parent().map(std::path::Path::to_path_buf) else {
        return;
    };
    if rec.state != ContainerState::Exited {
        return;
    }
    let pod_ns = inner.pod_mount_ns(&rec.sandbox_id);
    let r = tokio::task::spawn_blocking(move || {
        crate::sandbox::mountns::run_in(pod_ns.as_deref(), || {
            crate::container::rootfs::unmount_all_under(&dir)
        })
        .map_err(|e| e.to_string())
        .and_then(|r| r)
    })
    .await;
    if let Ok(Err(e)) = r {
        tracing::warn!(container = %id, error = %e, "unmounting the exited container's rootfs failed; RemoveContainer retries");
    }
}

/// Waits up to `timeout` for container `id` to exit; true when it did.
pub(crate) async fn wait_exit(inner: &Inner, id: &str, timeout: Duration) -> bool {
    let Ok(rec) = inner.find_container(id) else {
        return true;
    };
    if rec.state == ContainerState::Exited {
        return true;
    }
    let done = match rec.shim_pid {
        Some(pid) => tokio::time::timeout(timeout, monitor::wait_for_exit(pid))
            .await
            .is_ok(),
        None => true,
    };
    if done {
        record_exit(inner, id);
    }
    done
}
