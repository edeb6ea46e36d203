//! `/stats/summary`: upstream's Summary API (k8s.io/kubelet/pkg/apis/stats/v1alpha1) from
//! the CRI stats provider — pods and containers from ListPodSandboxStats, the image
//! filesystem from ImageFsInfo — and the node from the kernel (`/proc/stat`,
//! `/proc/meminfo`, `/proc/net/dev`, statfs of the kubelet's root dir, the pid counters).
//! Container `logs` are the files under the pod's log directory; a pod's
//! `ephemeral-storage` is its containers' writable layers and logs plus its emptyDirs.

use super::ServerState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use cri::runtime::v1 as pb;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Mutex;

/// The last CPU reading, to turn cumulative counters into `usageNanoCores`.
#[derive(Default)]
pub struct CpuSampler {
    last: Mutex<HashMap<String, (i64, u64)>>,
}

impl CpuSampler {
    /// Nanocores since the previous reading of `key` (none on the first).
    pub fn rate(&self, key: &str, at_ns: i64, usage_ns: u64) -> Option<u64> {
        let mut m = self.last.lock().ok()?;
        let prev = m.insert(key.to_string(), (at_ns, usage_ns));
        let (t0, u0) = prev?;
        let dt = at_ns.checked_sub(t0).filter(|d| *d > 0)?;
        let du = usage_ns.checked_sub(u0)?;
        Some(((du as u128) * 1_000_000_000 / dt as u128) as u64)
    }
}

fn rfc3339(ns: i64) -> Value {
    if ns <= 0 {
        return Value::Null;
    }
    jiff::Timestamp::from_nanosecond(i128::from(ns))
        .map(|t| Value::String(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
        .unwrap_or(Value::Null)
}

fn now_ns() -> i64 {
    jiff::Timestamp::now().as_nanosecond() as i64
}

fn cpu_json(s: &CpuSampler, key: &str, c: Option<&pb::CpuUsage>) -> Value {
    let Some(c) = c else { return Value::Null };
    let total = c.usage_core_nano_seconds.as_ref().map(|v| v.value);
    let cores = c
        .usage_nano_cores
        .as_ref()
        .map(|v| v.value)
        .or_else(|| total.and_then(|t| s.rate(key, c.timestamp, t)));
    json!({
        "time": rfc3339(c.timestamp),
        "usageNanoCores": cores,
        "usageCoreNanoSeconds": total,
    })
}

fn memory_json(m: Option<&pb::MemoryUsage>) -> Value {
    let Some(m) = m else { return Value::Null };
    let v = |x: &Option<pb::UInt64Value>| x.as_ref().map(|v| v.value);
    json!({
        "time": rfc3339(m.timestamp),
        "availableBytes": v(&m.available_bytes),
        "usageBytes": v(&m.usage_bytes),
        "workingSetBytes": v(&m.working_set_bytes),
        "rssBytes": v(&m.rss_bytes),
        "pageFaults": v(&m.page_faults),
        "majorPageFaults": v(&m.major_page_faults),
    })
}

/// One PSI file as upstream's statsapi PSIStats: `full` and `some`, each with the stall
/// `total` (the kernel's microseconds, as cAdvisor passes them on) and the 10/60/300 s
/// averages. A `cpu.pressure` without a `full` line reads as zeros, as upstream's.
fn psi_json(p: &nodus_cgroups::Pressure) -> Value {
    let line = |l: &nodus_cgroups::PsiLine| json!({"total": l.total_us, "avg10": l.avg10, "avg60": l.avg60, "avg300": l.avg300});
    json!({
        "full": line(&p.full.unwrap_or_default()),
        "some": line(&p.some),
    })
}

/// Adds the KubeletPSI fields to a pod, container or node stats object: `cpu.psi`,
/// `memory.psi` (when those stats are there) and `io` with its `psi`, each only when the
/// kernel has the pressure file.
fn add_psi(v: &mut Value, psi: &nodus_cgroups::PsiStats, now: i64) {
    if let Some(p) = &psi.cpu
        && v["cpu"].is_object()
    {
        v["cpu"]["psi"] = psi_json(p);
    }
    if let Some(p) = &psi.memory
        && v["memory"].is_object()
    {
        v["memory"]["psi"] = psi_json(p);
    }
    if let Some(p) = &psi.io {
        v["io"] = json!({"time": rfc3339(now), "psi": psi_json(p)});
    }
}

/// The node's pressure from `/proc/pressure` (the whole machine, as the root cgroup).
fn node_psi() -> nodus_cgroups::PsiStats {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/proc/pressure/{f}"))
            .ok()
            .and_then(|t| nodus_cgroups::parse_pressure(&t))
    };
    nodus_cgroups::PsiStats {
        cpu: read("cpu"),
        memory: read("memory"),
        io: read("io"),
    }
}

fn fs_json(f: Option<&pb::FilesystemUsage>) -> Value {
    let Some(f) = f else { return Value::Null };
    json!({
        "time": rfc3339(f.timestamp),
        "usedBytes": f.used_bytes.as_ref().map(|v| v.value),
        "inodesUsed": f.inodes_used.as_ref().map(|v| v.value),
    })
}

fn network_json(n: Option<&pb::NetworkUsage>) -> Value {
    let Some(n) = n else { return Value::Null };
    let iface = |i: &pb::NetworkInterfaceUsage| {
        json!({
            "name": i.name,
            "rxBytes": i.rx_bytes.as_ref().map(|v| v.value),
            "rxErrors": i.rx_errors.as_ref().map(|v| v.value),
            "txBytes": i.tx_bytes.as_ref().map(|v| v.value),
            "txErrors": i.tx_errors.as_ref().map(|v| v.value),
        })
    };
    let mut out = n.default_interface.as_ref().map(iface).unwrap_or(json!({}));
    out["time"] = rfc3339(n.timestamp);
    out["interfaces"] = Value::Array(n.interfaces.iter().map(iface).collect());
    out
}

fn statfs(path: &std::path::Path) -> Value {
    match nix::sys::statvfs::statvfs(path) {
        Ok(s) => {
            let bs = s.fragment_size();
            let cap = s.blocks() * bs;
            let avail = s.blocks_available() * bs;
            let used = (s.blocks() - s.blocks_free()) * bs;
            json!({
                "time": rfc3339(now_ns()),
                "availableBytes": avail,
                "capacityBytes": cap,
                "usedBytes": used,
                "inodesFree": s.files_free(),
                "inodes": s.files(),
                "inodesUsed": s.files() - s.files_free(),
            })
        }
        Err(_) => Value::Null,
    }
}

/// Bytes and inodes used by the files under `dir` (not following symlinks).
pub(crate) fn dir_usage(dir: &std::path::Path) -> (u64, u64) {
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            inodes += 1;
            if m.is_dir() {
                stack.push(e.path());
            } else {
                bytes += m.len();
            }
        }
    }
    (bytes, inodes)
}

/// A filesystem's capacity with `used` bytes and inodes of one consumer on it
/// (upstream's FsStats for container logs and pod ephemeral storage).
fn fs_with_usage(on: &std::path::Path, used: u64, inodes_used: u64) -> Value {
    let mut v = statfs(on);
    if v.is_object() {
        v["usedBytes"] = json!(used);
        v["inodesUsed"] = json!(inodes_used);
    }
    v
}

/// The node's interfaces from `/proc/net/dev` (the kubelet's network namespace).
fn node_network() -> Value {
    let text = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
    let ifaces: Vec<Value> = text
        .lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if name == "lo" {
                return None;
            }
            let v: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (v.len() >= 11).then(|| {
                json!({"name": name, "rxBytes": v[0], "rxErrors": v[2], "txBytes": v[8], "txErrors": v[10]})
            })
        })
        .collect();
    let mut out = ifaces.first().cloned().unwrap_or(json!({}));
    out["time"] = rfc3339(now_ns());
    out["interfaces"] = Value::Array(ifaces);
    out
}

fn meminfo() -> HashMap<String, u64> {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let kb: u64 = v.split_whitespace().next()?.parse().ok()?;
            Some((k.to_string(), kb * 1024))
        })
        .collect()
}

/// Busy CPU time of the whole machine in nanoseconds (all but idle and iowait).
fn node_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let busy: u64 = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4 && *i < 8)
        .map(|(_, x)| *x)
        .sum();
    // USER_HZ is 100 on Linux.
    Some(busy * 10_000_000)
}

/// The `pods` system container: the kubepods cgroup every pod runs under (upstream lists
/// it when cgroupsPerQOS is on; `kubelet` and `runtime` need cgroups nodus does not keep).
fn pods_container(s: &ServerState, now: i64) -> Value {
    let layout = &s.kr.cm.config.layout;
    if !layout.per_qos {
        return json!([]);
    }
    let Ok(st) = s.kr.cm.cgroups().read_stats(&layout.kubepods()) else {
        return json!([]);
    };
    // Available against the kubepods limit (capacity minus the reservations), else the
    // machine.
    let capacity = st
        .memory
        .limit_bytes
        .unwrap_or(s.kr.cm.capacity.memory_bytes.max(0) as u64);
    let mut v = json!({
        "name": "pods",
        "startTime": rfc3339(s.started_ns),
        "cpu": {
            "time": rfc3339(now),
            "usageNanoCores": s.cpu.rate("pods", now, st.cpu.usage_ns),
            "usageCoreNanoSeconds": st.cpu.usage_ns,
        },
        "memory": {
            "time": rfc3339(now),
            "availableBytes": capacity.saturating_sub(st.memory.working_set_bytes),
            "usageBytes": st.memory.usage_bytes,
            "workingSetBytes": st.memory.working_set_bytes,
            "rssBytes": st.memory.rss_bytes,
            "pageFaults": st.memory.page_faults,
            "majorPageFaults": st.memory.major_page_faults,
        },
    });
    if s.kr.cm.config.kubelet_psi {
        add_psi(&mut v, &st.psi, now);
    }
    json!([v])
}

fn node_json(s: &ServerState, image_fs: Value) -> Value {
    let now = now_ns();
    let mem = meminfo();
    let total = mem.get("MemTotal").copied().unwrap_or(0);
    let free = mem.get("MemFree").copied().unwrap_or(0);
    let available = mem.get("MemAvailable").copied().unwrap_or(free);
    let inactive_file = mem.get("Inactive(file)").copied().unwrap_or(0);
    let usage = total.saturating_sub(free);
    let working_set = usage.saturating_sub(inactive_file);
    let cpu = node_cpu_ns().map(|ns| {
        json!({
            "time": rfc3339(now),
            "usageNanoCores": s.cpu.rate("node", now, ns),
            "usageCoreNanoSeconds": ns,
        })
    });
    let pid_max: Option<u64> = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|t| t.trim().parse().ok());
    let procs = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                .count()
        })
        .unwrap_or(0);
    let mut node = json!({
        "nodeName": s.node_name,
        "systemContainers": pods_container(s, now),
        "startTime": rfc3339(s.started_ns),
        "cpu": cpu,
        "memory": {
            "time": rfc3339(now),
            "availableBytes": available,
            "usageBytes": usage,
            "workingSetBytes": working_set,
            "rssBytes": mem.get("AnonPages").copied(),
        },
        "network": node_network(),
        "fs": statfs(&s.kr.settings.root_dir),
        "runtime": {"imageFs": image_fs, "containerFs": image_fs},
        "rlimit": {"time": rfc3339(now), "maxpid": pid_max, "curproc": procs},
    });
    if s.kr.cm.config.kubelet_psi {
        add_psi(&mut node, &node_psi(), now);
    }
    node
}

/// The Summary: node and every pod the runtime reports stats for.
pub async fn summary_json(s: &ServerState) -> Result<Value, tonic::Status> {
    let mut rt = s.kr.rt.runtime.clone();
    let pods = rt
        .list_pod_sandbox_stats(pb::ListPodSandboxStatsRequest { filter: None })
        .await?
        .into_inner()
        .stats;
    let image_fs =
        s.kr.rt
            .image
            .clone()
            .image_fs_info(pb::ImageFsInfoRequest {})
            .await
            .ok()
            .and_then(|r| r.into_inner().image_filesystems.into_iter().next())
            .map(|f| {
                let mut v = fs_json(Some(&f));
                if let Some(mp) = f.fs_id.as_ref().map(|i| i.mountpoint.clone())
                    && let Value::Object(st) = statfs(std::path::Path::new(&mp))
                {
                    for k in ["availableBytes", "capacityBytes", "inodesFree", "inodes"] {
                        if let Some(x) = st.get(k) {
                            v[k] = x.clone();
                        }
                    }
                }
                v
            })
            .unwrap_or(Value::Null);
    let statuses = s.status.all();
    let mut out_pods = Vec::new();
    for p in pods {
        let Some(attrs) = &p.attributes else { continue };
        let Some(meta) = &attrs.metadata else {
            continue;
        };
        // Only pods this kubelet made (upstream filters on its labels too).
        if !attrs
            .labels
            .contains_key(crate::kuberuntime::labels::POD_UID)
        {
            continue;
        }
        let linux = p.linux.clone().unwrap_or_default();
        let status = statuses.get(&meta.uid);
        let started = |name: &str| {
            status
                .and_then(|st| st.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.name == name))
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.running.as_ref())
                .and_then(|r| r.started_at.as_ref())
                .map(|t| Value::String(t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
                .unwrap_or(Value::Null)
        };
        let log_dir =
            s.kr.settings
                .sandbox
                .pod_logs_dir
                .join(format!("{}_{}_{}", meta.namespace, meta.name, meta.uid));
        let (mut ephemeral_bytes, mut ephemeral_inodes) = (0u64, 0u64);
        // KubeletPSI: pressure from the pod's cgroup and, below it, each container's
        // (the runtime puts a container at <pod cgroup>/<container id>).
        let pod_cgroup =
            s.kr.cm
                .config
                .kubelet_psi
                .then(|| s.kr.cm.pod_cgroup_of(&meta.uid))
                .flatten();
        let psi_of = |cgroup: &str| s.kr.cm.cgroups().read_stats(cgroup).ok().map(|st| st.psi);
        let now = now_ns();
        let containers: Vec<Value> = linux
            .containers
            .iter()
            .filter_map(|c| {
                let name = c.attributes.as_ref()?.metadata.as_ref()?.name.clone();
                let id = c.attributes.as_ref()?.id.clone();
                let (log_bytes, log_inodes) = dir_usage(&log_dir.join(&name));
                let rootfs = c.writable_layer.as_ref();
                ephemeral_bytes += log_bytes
                    + rootfs
                        .and_then(|f| f.used_bytes.as_ref())
                        .map_or(0, |v| v.value);
                ephemeral_inodes += log_inodes
                    + rootfs
                        .and_then(|f| f.inodes_used.as_ref())
                        .map_or(0, |v| v.value);
                let mut v = json!({
                    "name": name,
                    "startTime": started(&name),
                    "cpu": cpu_json(&s.cpu, &id, c.cpu.as_ref()),
                    "memory": memory_json(c.memory.as_ref()),
                    "rootfs": fs_json(rootfs),
                    "logs": fs_with_usage(&log_dir, log_bytes, log_inodes),
                });
                if let Some(psi) = pod_cgroup
                    .as_ref()
                    .and_then(|p| psi_of(&format!("{p}/{id}")))
                {
                    add_psi(&mut v, &psi, now);
                }
                Some(v)
            })
            .collect();
        let volumes_dir =
            crate::volumes::pod_dir(&s.kr.settings.root_dir, &meta.uid).join("volumes");
        let (vol_bytes, vol_inodes) = dir_usage(&volumes_dir.join("kubernetes.io~empty-dir"));
        let mut pod = json!({
            "podRef": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid},
            "startTime": status
                .and_then(|st| st.start_time.as_ref())
                .map(|t| Value::String(t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
                .unwrap_or(Value::Null),
            "containers": containers,
            "cpu": cpu_json(&s.cpu, &attrs.id, linux.cpu.as_ref()),
            "memory": memory_json(linux.memory.as_ref()),
            "network": network_json(linux.network.as_ref()),
            "volume": [],
            "ephemeral-storage": fs_with_usage(
                &s.kr.settings.root_dir,
                ephemeral_bytes + vol_bytes,
                ephemeral_inodes + vol_inodes,
            ),
            "process_stats": linux.process.as_ref().map(|p| json!({
                "process_count": p.process_count.as_ref().map(|v| v.value),
            })),
        });
        if let Some(psi) = pod_cgroup.as_deref().and_then(psi_of) {
            add_psi(&mut pod, &psi, now);
        }
        out_pods.push(pod);
    }
    Ok(json!({"node": node_json(s, image_fs), "pods": out_pods}))
}

/// GET /stats/summary
pub async fn summary(State(s): State<ServerState>) -> Response {
    match summary_json(&s).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => super::text(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed to get stats summary: {}", e.message()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_fields_as_upstream_statsapi() {
        let mut v = json!({"cpu": {"usageCoreNanoSeconds": 1}, "memory": {"workingSetBytes": 2}});
        let psi = nodus_cgroups::PsiStats {
            cpu: nodus_cgroups::parse_pressure(
                "some avg10=1.50 avg60=0.25 avg300=0.00 total=12345\n",
            ),
            memory: None,
            io: nodus_cgroups::parse_pressure(
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=7\nfull avg10=0.10 avg60=0.00 avg300=0.00 total=3\n",
            ),
        };
        add_psi(&mut v, &psi, 1_700_000_000_000_000_000);
        assert_eq!(
            v["cpu"]["psi"],
            json!({
                "some": {"total": 12345, "avg10": 1.5, "avg60": 0.25, "avg300": 0.0},
                "full": {"total": 0, "avg10": 0.0, "avg60": 0.0, "avg300": 0.0},
            })
        );
        assert!(v["memory"].get("psi").is_none(), "{v}");
        assert_eq!(v["io"]["psi"]["full"]["total"], 3);
        assert_eq!(v["io"]["time"], "2023-11-14T22:13:20Z");
        // No pressure files: nothing is added.
        let mut bare = json!({"cpu": {}, "memory": {}});
        add_psi(&mut bare, &nodus_cgroups::PsiStats::default(), 1);
        assert_eq!(bare, json!({"cpu": {}, "memory": {}}));
    }
}
