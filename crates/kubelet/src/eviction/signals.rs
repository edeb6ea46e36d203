//! What the eviction manager observes (upstream's makeSignalObservations over the summary):
//! the node's memory working set from the root memory cgroup, the kubelet root dir's and
//! the image store's filesystems, the process table, and each pod's usage.

use super::thresholds::{Observation, Observations, Signal};
use cri::runtime::v1 as pb;
use std::collections::HashMap;
use std::path::Path;

/// Node memory as upstream computes it: capacity − working set, where the working set is
/// the root memory cgroup's usage minus its inactive file pages.
pub fn memory(capacity: i64, working_set: i64) -> Observation {
    Observation {
        available: capacity - working_set,
        capacity,
    }
}

/// The node's memory working set, as cAdvisor's root container reports it: on cgroup v1
/// the root memory cgroup's usage minus `total_inactive_file`; on v2 (where the root has no
/// `memory.current`) MemTotal − MemFree minus the root's `inactive_file`.
pub fn node_working_set(cgroups: &dyn nodus_cgroups::CgroupManager) -> Option<i64> {
    cgroups
        .read_stats("/")
        .ok()
        .map(|s| s.memory.working_set_bytes as i64)
}

/// Bytes and inodes of the filesystem holding `path`: (available, capacity) each.
pub fn filesystem(path: &Path) -> Option<(Observation, Observation)> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let bs = s.fragment_size() as i64;
    Some((
        Observation {
            available: s.blocks_available() as i64 * bs,
            capacity: s.blocks() as i64 * bs,
        },
        Observation {
            available: s.files_free() as i64,
            capacity: s.files() as i64,
        },
    ))
}

/// pid.available: the smaller of pid_max and threads-max, minus the tasks alive now.
pub fn pids() -> Option<Observation> {
    let read = |p: &str| -> Option<i64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let max = match (
        read("/proc/sys/kernel/pid_max"),
        read("/proc/sys/kernel/threads-max"),
    ) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    // SAFETY: sysinfo only writes the struct it is given.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable sysinfo struct.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return None;
    }
    Some(Observation {
        available: max - i64::from(info.procs),
        capacity: max,
    })
}

/// Where the observations come from.
pub struct Sources<'a> {
    pub cgroups: &'a dyn nodus_cgroups::CgroupManager,
    pub memory_capacity: i64,
    pub allocatable_memory: i64,
    /// The `kubepods` cgroup, when the QoS hierarchy is on.
    pub kubepods: Option<&'a str>,
    pub root_dir: &'a Path,
    /// The image store's mount point (from the CRI's ImageFsInfo), when known.
    pub image_fs: Option<&'a Path>,
}

/// Every signal that can be read now; a signal that cannot is left out (its thresholds
/// are then not met, as upstream's missing observations).
pub fn observe(s: &Sources<'_>) -> Observations {
    let mut obs = Observations::new();
    if let Some(ws) = node_working_set(s.cgroups) {
        obs.insert(Signal::MemoryAvailable, memory(s.memory_capacity, ws));
    }
    if let Some(kp) = s.kubepods
        && let Ok(st) = s.cgroups.read_stats(kp)
    {
        obs.insert(
            Signal::AllocatableMemoryAvailable,
            memory(s.allocatable_memory, st.memory.working_set_bytes as i64),
        );
    }
    if let Some((bytes, inodes)) = filesystem(s.root_dir) {
        obs.insert(Signal::NodeFsAvailable, bytes);
        obs.insert(Signal::NodeFsInodesFree, inodes);
        let image = s.image_fs.and_then(filesystem).unwrap_or((bytes, inodes));
        obs.insert(Signal::ImageFsAvailable, image.0);
        obs.insert(Signal::ImageFsInodesFree, image.1);
    }
    if let Some(p) = pids() {
        obs.insert(Signal::PidAvailable, p);
    }
    obs
}

/// One container's usage, for ranking and for the eviction message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerUsage {
    pub name: String,
    pub memory_working_set: Option<i64>,
    /// Writable layer plus logs.
    pub ephemeral_bytes: Option<i64>,
}

/// One pod's usage (upstream's statsapi.PodStats, the parts eviction reads).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodUsage {
    pub memory_working_set: Option<i64>,
    /// Containers' writable layers and logs plus emptyDir volumes.
    pub ephemeral_bytes: Option<i64>,
    pub inodes: Option<i64>,
    pub processes: Option<i64>,
    pub containers: Vec<ContainerUsage>,
}

/// Every pod's usage from the runtime's sandbox stats, the logs and emptyDir directories,
/// keyed by pod UID.
pub async fn pod_usage(
    rt: &crate::cri::Runtime,
    root_dir: &Path,
    pod_logs_dir: &Path,
) -> Result<HashMap<String, PodUsage>, tonic::Status> {
    let stats = rt
        .runtime
        .clone()
        .list_pod_sandbox_stats(pb::ListPodSandboxStatsRequest { filter: None })
        .await?
        .into_inner()
        .stats;
    let mut out = HashMap::new();
    for p in stats {
        let Some(meta) = p.attributes.as_ref().and_then(|a| a.metadata.as_ref()) else {
            continue;
        };
        let linux = p.linux.clone().unwrap_or_default();
        let log_dir = pod_logs_dir.join(format!("{}_{}_{}", meta.namespace, meta.name, meta.uid));
        let (mut bytes, mut inodes) = (0i64, 0i64);
        let mut containers = Vec::new();
        for c in &linux.containers {
            let Some(name) = c
                .attributes
                .as_ref()
                .and_then(|a| a.metadata.as_ref())
                .map(|m| m.name.clone())
            else {
                continue;
            };
            let (lb, li) = crate::server::stats::dir_usage(&log_dir.join(&name));
            let layer = c.writable_layer.as_ref();
            let rb = layer
                .and_then(|f| f.used_bytes.as_ref())
                .map_or(0, |v| v.value);
            let ri = layer
                .and_then(|f| f.inodes_used.as_ref())
                .map_or(0, |v| v.value);
            bytes += (lb + rb) as i64;
            inodes += (li + ri) as i64;
            containers.push(ContainerUsage {
                name,
                memory_working_set: c
                    .memory
                    .as_ref()
                    .and_then(|m| m.working_set_bytes.as_ref())
                    .map(|v| v.value as i64),
                ephemeral_bytes: Some((lb + rb) as i64),
            });
        }
        let volumes = crate::volumes::pod_dir(root_dir, &meta.uid)
            .join("volumes")
            .join("kubernetes.io~empty-dir");
        let (vb, vi) = crate::server::stats::dir_usage(&volumes);
        let pod_memory = linux
            .memory
            .as_ref()
            .and_then(|m| m.working_set_bytes.as_ref())
            .map(|v| v.value as i64)
            .or_else(|| {
                let v: Vec<i64> = containers
                    .iter()
                    .filter_map(|c| c.memory_working_set)
                    .collect();
                (!v.is_empty()).then(|| v.iter().sum())
            });
        let usage = PodUsage {
            memory_working_set: pod_memory,
            ephemeral_bytes: Some(bytes + vb as i64),
            inodes: Some(inodes + vi as i64),
            processes: linux
                .process
                .as_ref()
                .and_then(|p| p.process_count.as_ref())
                .map(|v| v.value as i64),
            containers,
        };
        // A pod may have an old sandbox beside its live one: keep the larger figures.
        out.entry(meta.uid.clone())
            .and_modify(|u: &mut PodUsage| {
                if usage.ephemeral_bytes > u.ephemeral_bytes {
                    *u = usage.clone();
                }
            })
            .or_insert(usage);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_available_is_capacity_minus_working_set() {
        let o = memory(8 << 30, 3 << 30);
        assert_eq!(o.available, 5 << 30);
        assert_eq!(o.capacity, 8 << 30);
    }

    #[test]
    fn this_machine_has_filesystem_and_pid_observations() {
        let (bytes, inodes) = filesystem(Path::new("/")).unwrap();
        assert!(bytes.capacity > 0 && bytes.available <= bytes.capacity);
        assert!(inodes.available <= inodes.capacity);
        let p = pids().unwrap();
        assert!(p.available > 0 && p.available < p.capacity);
    }

    #[test]
    fn v1_node_working_set_reads_the_root_memory_cgroup() {
        let d = tempfile::tempdir().unwrap();
        let mem = d.path().join("memory");
        std::fs::create_dir_all(&mem).unwrap();
        std::fs::write(mem.join("memory.usage_in_bytes"), "1000\n").unwrap();
        std::fs::write(mem.join("memory.stat"), "total_inactive_file 300\n").unwrap();
        std::fs::write(mem.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        let m = nodus_cgroups::for_hierarchy(nodus_cgroups::Hierarchy::v1(d.path()));
        assert_eq!(node_working_set(m.as_ref()), Some(700));
    }
}
