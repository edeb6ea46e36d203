//! ContainerStatus: state, times, exit code, reason (Completed / Error / OOMKilled),
//! image and image id, mounts, log path, resources, and the user of the init process (what
//! the kubelet reports as `status.containerStatuses[].user`).

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
    let cfg = rec.config_ref();
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
    let mut status = to_status(&rec);
    status.user = container_user(&rec).map(|linux| pb::ContainerUser { linux: Some(linux) });
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
        status: Some(status),
        info,
    })
}

/// The identity of the container's init process: read from /proc while it runs (what the
/// process really has, after the image's /etc/group and the supplemental groups policy),
/// else the OCI spec's `process.user` that it was or will be started with.
fn container_user(rec: &ContainerRecord) -> Option<pb::LinuxContainerUser> {
    if rec.state == ContainerState::Running
        && let Some(pid) = rec.init_pid
    {
        let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
        let status = std::fs::read_to_string(proc_dir.join("status")).ok();
        let uid_map = std::fs::read_to_string(proc_dir.join("uid_map")).unwrap_or_default();
        let gid_map = std::fs::read_to_string(proc_dir.join("gid_map")).unwrap_or_default();
        if let Some(u) = status.and_then(|s| user_from_proc_status(&s, &uid_map, &gid_map)) {
            return Some(u);
        }
    }
    rec.user.as_ref().map(|u| pb::LinuxContainerUser {
        uid: i64::from(u.uid),
        gid: i64::from(u.gid),
        supplemental_groups: u.additional_gids.iter().map(|g| i64::from(*g)).collect(),
    })
}

/// The real uid, gid and groups of a `/proc/<pid>/status`, as the container sees them: the
/// host's ids mapped back through the process's `uid_map` / `gid_map` (identity maps
/// without a user namespace).
pub(crate) fn user_from_proc_status(
    status: &str,
    uid_map: &str,
    gid_map: &str,
) -> Option<pb::LinuxContainerUser> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| {
                v.split_ascii_whitespace()
                    .filter_map(|n| n.parse::<u32>().ok())
                    .collect::<Vec<_>>()
            })
    };
    let uid = *field("Uid")?.first()?;
    let gid = *field("Gid")?.first()?;
    let groups = field("Groups").unwrap_or_default();
    Some(pb::LinuxContainerUser {
        uid: to_inside(uid, uid_map)?,
        gid: to_inside(gid, gid_map)?,
        supplemental_groups: groups
            .into_iter()
            .filter_map(|g| to_inside(g, gid_map))
            .collect(),
    })
}

/// An id as seen from this process mapped into the namespace of an `id_map` (lines of
/// `inside outside length`, outside being our view). None when the id is not mapped.
fn to_inside(id: u32, id_map: &str) -> Option<i64> {
    if id_map.trim().is_empty() {
        return Some(i64::from(id));
    }
    id_map.lines().find_map(|l| {
        let v: Vec<u64> = l
            .split_ascii_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        let [inside, outside, len] = v[..] else {
            return None;
        };
        let id = u64::from(id);
        (id >= outside && id - outside < len).then(|| (inside + (id - outside)) as i64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tsh\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t1000\t1000\t1000\nGid:\t3000\t3000\t3000\t3000\nFDSize:\t64\nGroups:\t10 3000 4000 \nNStgid:\t1\n";

    #[test]
    fn user_of_a_process_without_user_namespace() {
        let identity = "         0          0 4294967295\n";
        assert_eq!(
            user_from_proc_status(STATUS, identity, identity),
            Some(pb::LinuxContainerUser {
                uid: 1000,
                gid: 3000,
                supplemental_groups: vec![10, 3000, 4000],
            })
        );
        assert_eq!(
            user_from_proc_status(STATUS, "", "").map(|u| u.uid),
            Some(1000)
        );
    }

    #[test]
    fn user_of_a_process_in_a_user_namespace_is_the_containers_view() {
        let status = STATUS
            .replace("1000", "66536")
            .replace("3000", "68536")
            .replace("Groups:\t10 ", "Groups:\t65546 ")
            .replace(" 4000", " 99999999");
        let map = "         0      65536      65536\n";
        assert_eq!(
            user_from_proc_status(&status, map, map),
            Some(pb::LinuxContainerUser {
                uid: 1000,
                gid: 3000,
                // A group outside the pod's range is not the container's to see.
                supplemental_groups: vec![10, 3000],
            })
        );
        assert_eq!(user_from_proc_status("Name:\tx\n", map, map), None);
    }
}
