//! ContainerStats, ListContainerStats, PodSandboxStats, ListPodSandboxStats: CPU and memory
//! from each container's cgroup (working set = usage − inactive file, as the kubelet and
//! cAdvisor compute it), the writable layer's disk use, and the pod's network counters read
//! inside its pinned network namespace.

use super::{Inner, labels_match};
use crate::state::{ContainerRecord, SandboxRecord};
use cri::runtime::v1 as pb;
use nodus_cgroups::CgroupManager;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use tonic::Status;

/// The previous CPU sample per cgroup, to turn cumulative usage into nano-cores.
#[derive(Default)]
pub struct CpuSamples {
    last: Mutex<HashMap<String, (i64, u64)>>,
}

impl CpuSamples {
    fn rate(&self, key: &str, now: i64, usage: u64) -> Option<u64> {
        let mut m = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let prev = m.insert(key.to_string(), (now, usage));
        let (t0, u0) = prev?;
        let dt = now.checked_sub(t0).filter(|d| *d > 0)?;
        Some(((usage.saturating_sub(u0)) as u128 * 1_000_000_000 / dt as u128) as u64)
    }
}

fn u64v(v: u64) -> Option<pb::UInt64Value> {
    Some(pb::UInt64Value { value: v })
}

/// The cgroup of a container's bundle: its `linux.cgroupsPath`, or for systemd's
/// `slice:prefix:name` form the scope's directory in the expanded slice.
pub(super) fn cgroups_path(bundle: &Path) -> Option<String> {
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).ok()?).ok()?;
    let p = spec.get("linux")?.get("cgroupsPath")?.as_str()?;
    if !p.starts_with('/') && p.split(':').count() == 3 {
        return nodus_cgroups::systemd::names::scope_path(p).ok();
    }
    Some(p.to_string())
}

/// The host's cgroup driver; the hierarchy does not change while we run.
fn cgroups() -> &'static Arc<dyn CgroupManager> {
    static M: OnceLock<Arc<dyn CgroupManager>> = OnceLock::new();
    M.get_or_init(nodus_cgroups::detect)
}

/// CPU and memory of a cgroup; `rate_key` names the CPU sample that nano-cores are
/// computed against (None: no rate, which leaves the samples of the stats RPCs alone).
pub(super) fn cpu_and_memory(
    inner: &Inner,
    rate_key: Option<&str>,
    cgroup: Option<&str>,
) -> (Option<pb::CpuUsage>, Option<pb::MemoryUsage>) {
    let now = crate::state::now_ns();
    let stats = cgroup
        .and_then(|p| cgroups().read_stats(p).ok())
        .unwrap_or_default();
    let cpu = pb::CpuUsage {
        timestamp: now,
        usage_core_nano_seconds: u64v(stats.cpu.usage_ns),
        usage_nano_cores: rate_key
            .and_then(|key| inner.cpu_samples.rate(key, now, stats.cpu.usage_ns))
            .and_then(u64v),
    };
    let m = &stats.memory;
    let memory = pb::MemoryUsage {
        timestamp: now,
        working_set_bytes: u64v(m.working_set_bytes),
        available_bytes: m
            .limit_bytes
            .map(|l| l.saturating_sub(m.working_set_bytes))
            .and_then(u64v),
        usage_bytes: u64v(m.usage_bytes),
        rss_bytes: u64v(m.rss_bytes),
        page_faults: u64v(m.page_faults),
        major_page_faults: u64v(m.major_page_faults),
    };
    (Some(cpu), Some(memory))
}

/// Bytes and inodes under `dir` (the writable layer), without following symlinks.
fn disk_usage(dir: &Path) -> (u64, u64) {
    let mut bytes = 0;
    let mut inodes = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            inodes += 1;
            bytes += std::os::unix::fs::MetadataExt::blocks(&md) * 512;
            if md.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, inodes)
}

pub(crate) fn container_stats_of(inner: &Inner, rec: &ContainerRecord) -> pb::ContainerStats {
    let cfg = rec.config();
    let cgroup = cgroups_path(&rec.bundle);
    let (cpu, memory) = cpu_and_memory(inner, Some(&rec.id), cgroup.as_deref());
    let upper = rec.layer_dir.join("upper");
    let (bytes, inodes) = disk_usage(&upper);
    pb::ContainerStats {
        attributes: Some(pb::ContainerAttributes {
            id: rec.id.clone(),
            metadata: cfg.metadata.clone(),
            labels: cfg.labels.clone(),
            annotations: cfg.annotations.clone(),
        }),
        cpu,
        memory,
        writable_layer: Some(pb::FilesystemUsage {
            timestamp: crate::state::now_ns(),
            fs_id: Some(pb::FilesystemIdentifier {
                mountpoint: upper.display().to_string(),
            }),
            used_bytes: u64v(bytes),
            inodes_used: u64v(inodes),
        }),
        swap: None,
    }
}

pub fn container_stats(
    inner: &Inner,
    req: pb::ContainerStatsRequest,
) -> Result<pb::ContainerStatsResponse, Status> {
    let rec = inner.find_container(&req.container_id)?;
    Ok(pb::ContainerStatsResponse {
        stats: Some(container_stats_of(inner, &rec)),
    })
}

pub fn list_container_stats(
    inner: &Inner,
    req: pb::ListContainerStatsRequest,
) -> Result<pb::ListContainerStatsResponse, Status> {
    let f = req.filter.unwrap_or_default();
    let recs: Vec<ContainerRecord> = inner
        .containers()
        .values()
        .filter(|c| f.id.is_empty() || c.id.starts_with(&f.id))
        .filter(|c| f.pod_sandbox_id.is_empty() || c.sandbox_id.starts_with(&f.pod_sandbox_id))
        .filter(|c| labels_match(&c.config().labels, &f.label_selector))
        .cloned()
        .collect();
    Ok(pb::ListContainerStatsResponse {
        stats: recs.iter().map(|r| container_stats_of(inner, r)).collect(),
    })
}

/// Interface counters inside a network namespace (`/proc/thread-self/net/dev` read from a
/// thread that joined it).
pub(super) fn net_dev(netns: &Path) -> Vec<pb::NetworkInterfaceUsage> {
    let path = netns.to_path_buf();
    let read = std::thread::spawn(move || -> Option<String> {
        let f = std::fs::File::open(&path).ok()?;
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
        std::fs::read_to_string("/proc/thread-self/net/dev").ok()
    })
    .join()
    .ok()
    .flatten()
    .unwrap_or_default();
    read.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let v: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (v.len() >= 11).then(|| pb::NetworkInterfaceUsage {
                name: name.trim().to_string(),
                rx_bytes: u64v(v[0]),
                rx_errors: u64v(v[2]),
                tx_bytes: u64v(v[8]),
                tx_errors: u64v(v[10]),
            })
        })
        .filter(|i| i.name != "lo")
        .collect()
}

fn sandbox_stats_of(inner: &Inner, rec: &SandboxRecord) -> pb::PodSandboxStats {
    let cfg = rec.config();
    let parent = cfg
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.clone())
        .filter(|p| !p.is_empty());
    let (cpu, memory) = cpu_and_memory(inner, Some(&format!("pod:{}", rec.id)), parent.as_deref());
    let containers: Vec<pb::ContainerStats> = inner
        .containers()
        .values()
        .filter(|c| c.sandbox_id == rec.id)
        .cloned()
        .collect::<Vec<_>>()
        .iter()
        .map(|c| container_stats_of(inner, c))
        .collect();
    let now = crate::state::now_ns();
    let interfaces = rec.netns.as_deref().map(net_dev).unwrap_or_default();
    let processes = parent
        .as_deref()
        .and_then(|p| cgroups().pids(p).ok())
        .map_or(0, |pids| pids.len() as u64);
    pb::PodSandboxStats {
        attributes: Some(pb::PodSandboxAttributes {
            id: rec.id.clone(),
            metadata: cfg.metadata.clone(),
            labels: cfg.labels.clone(),
            annotations: cfg.annotations.clone(),
        }),
        linux: Some(pb::LinuxPodSandboxStats {
            cpu,
            memory,
            network: Some(pb::NetworkUsage {
                timestamp: now,
                default_interface: interfaces.iter().find(|i| i.name == "eth0").cloned(),
                interfaces,
            }),
            process: Some(pb::ProcessUsage {
                timestamp: now,
                process_count: u64v(processes),
            }),
            containers,
        }),
        windows: None,
    }
}

/// Processes in a cgroup and all below it.
pub fn pod_sandbox_stats(
    inner: &Inner,
    req: pb::PodSandboxStatsRequest,
) -> Result<pb::PodSandboxStatsResponse, Status> {
    let rec = inner.find_sandbox(&req.pod_sandbox_id)?;
    Ok(pb::PodSandboxStatsResponse {
        stats: Some(sandbox_stats_of(inner, &rec)),
    })
}

pub fn list_pod_sandbox_stats(
    inner: &Inner,
    req: pb::ListPodSandboxStatsRequest,
) -> Result<pb::ListPodSandboxStatsResponse, Status> {
    let f = req.filter.unwrap_or_default();
    let recs: Vec<SandboxRecord> = inner
        .sandboxes()
        .values()
        .filter(|s| f.id.is_empty() || s.id.starts_with(&f.id))
        .filter(|s| labels_match(&s.config().labels, &f.label_selector))
        .cloned()
        .collect();
    Ok(pb::ListPodSandboxStatsResponse {
        stats: recs.iter().map(|r| sandbox_stats_of(inner, r)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nano_cores_come_from_two_samples() {
        let s = CpuSamples::default();
        assert_eq!(s.rate("c", 1_000_000_000, 0), None);
        // 0.5 s of CPU over 1 s = half a core.
        assert_eq!(s.rate("c", 2_000_000_000, 500_000_000), Some(500_000_000));
    }
}
