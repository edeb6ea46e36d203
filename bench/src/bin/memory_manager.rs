//! The memory manager's cost at admission: a Guaranteed pod admitted through the kubelet's
//! topology manager (policy `none`, as by default) with the memory manager as its hint
//! provider under `--memory-manager-policy Static` (placement over every NUMA node set, the
//! state file written) against the same pod under `None`, in-process. Two
//! machines: this one (its own /sys) and a fake sysfs of 2 sockets × 2 NUMA nodes (8Gi
//! each), where the policy weighs 15 node sets per pod. Each round the previous pod is no
//! longer active, so its memory goes back first (upstream's removeStaleState), as for a pod
//! that finished.

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use nodus_bench::targets::pct;
use nodus_kubelet::admission::{PodAdmitAttributes, PodAdmitHandler};
use nodus_kubelet::cm::memorymanager::{self, MemoryManager};
use nodus_kubelet::cm::topologymanager::TopologyManager;
use nodus_kubelet::cm::{Config, qos::Layout};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

const ROUNDS: usize = 2000;

fn cm_config() -> Config {
    Config {
        eviction_hard: BTreeMap::from([("memory.available".into(), "100Mi".into())]),
        enforce_node_allocatable: vec!["pods".into()],
        ..Config::defaults(Layout {
            root: "/".into(),
            per_qos: true,
        })
    }
}

fn guaranteed(i: usize) -> Pod {
    let r = serde_json::json!({"cpu": "100m", "memory": "64Mi"});
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("p{i}"), "namespace": "default", "uid": format!("bench-{i:05}")},
        "spec": {"containers": [{"name": "c", "resources": {"requests": r, "limits": r}}]}
    }))
    .expect("a valid pod")
}

/// A fake `devices/system/node` of `nodes` nodes with `gib` GiB each.
fn fake_sysfs(root: &Path, nodes: usize, gib: u64) -> Result<()> {
    for n in 0..nodes {
        let d = root.join(format!("devices/system/node/node{n}"));
        std::fs::create_dir_all(&d)?;
        std::fs::write(
            d.join("meminfo"),
            format!("Node {n} MemTotal:       {} kB\n", gib << 20),
        )?;
    }
    Ok(())
}

/// p50 and p99 of admitting `ROUNDS` Guaranteed pods, µs.
async fn admit_rounds(
    policy: &str,
    sysfs: &Path,
    capacity: i64,
    state_fs: &Path,
) -> Result<(f64, f64)> {
    let root = tempfile::tempdir_in(state_fs)?;
    let config = memorymanager::Config {
        policy: policy.into(),
        reserved_memory: memorymanager::reserved::parse_flag("0:memory=100Mi")
            .map_err(anyhow::Error::msg)?,
        sysfs_root: sysfs.to_path_buf(),
    };
    let m = Arc::new(MemoryManager::start(
        &config,
        &cm_config(),
        capacity,
        root.path(),
    )?);
    let tm = Arc::new(
        TopologyManager::new(sysfs, "none", "container", &BTreeMap::new())
            .map_err(anyhow::Error::msg)?,
    );
    m.set_affinity(Arc::clone(&tm) as _);
    tm.add_hint_provider(Arc::clone(&m) as _);
    // No other pod stays active: each round the previous one's memory goes back first.
    m.set_active_pods(Box::new(Vec::new), Box::new(|_| false));
    let mut out = Vec::with_capacity(ROUNDS);
    for i in 0..ROUNDS {
        let p = guaranteed(i);
        let t = Instant::now();
        let r = tm
            .admit(&PodAdmitAttributes {
                pod: &p,
                other_pods: &[],
            })
            .await;
        out.push(t.elapsed().as_secs_f64() * 1e6);
        anyhow::ensure!(r.admit, "pod refused: {}", r.message);
        if policy == "Static" {
            anyhow::ensure!(m.cpuset_mems(&format!("bench-{i:05}"), "c").is_some());
        }
    }
    Ok((pct(&mut out, 50.0), pct(&mut out, 99.0)))
}

fn mem_total() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(0)
        * 1024
}

#[tokio::main]
async fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let fake = tempfile::tempdir()?;
    fake_sysfs(fake.path(), 4, 8)?;
    let nodes_here = std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().to_string();
                    n.strip_prefix("node")
                        .is_some_and(|i| i.parse::<u32>().is_ok())
                })
                .count()
        })
        .unwrap_or(1);
    // The state file on the root filesystem (where /var/lib/kubelet is) and on tmpfs.
    let tmp = std::env::temp_dir();
    let mut state_fss = vec![("root fs", tmp.as_path())];
    if Path::new("/dev/shm").is_dir() {
        state_fss.push(("tmpfs", Path::new("/dev/shm")));
    }
    let mut rows = String::new();
    for (machine, sysfs, capacity) in [
        (
            format!("this machine ({nodes_here} NUMA node)"),
            Path::new("/sys"),
            mem_total(),
        ),
        (
            "fake 2 sockets × 2 NUMA nodes".to_string(),
            fake.path(),
            32i64 << 30,
        ),
    ] {
        for (fs, dir) in &state_fss {
            let (n50, n99) = admit_rounds("None", sysfs, capacity, dir).await?;
            let (s50, s99) = admit_rounds("Static", sysfs, capacity, dir).await?;
            rows.push_str(&format!(
                "| {machine} | {fs} | {n50:.1} µs / {n99:.1} µs | {s50:.1} µs / {s99:.1} µs | {:.1} µs / {:.1} µs |\n",
                s50 - n50,
                s99 - n99
            ));
        }
    }
    // With more runnable tasks than cores, a p99 is a scheduler time slice, not the code.
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let body = format!(
        "The kubelet's topology manager (policy `none`) with the memory manager as its hint \
         provider, run in-process on {ROUNDS} Guaranteed pods \
         (`cpu: 100m, memory: 64Mi`), one after the other; each round the previous pod is no \
         longer active and gives its memory back first (upstream's removeStaleState). \
         `Static` weighs every NUMA node set, places the pod and writes \
         `memory_manager_state`; `None` does nothing. `--reserved-memory 0:memory=100Mi`. \
         {} cores (1-minute load average {load} at the end of the run: with more runnable \
         tasks than cores, a p99 of several ms is a scheduler time slice), {build} build.\n\n\
         | machine | state file on | `None` p50 / p99 | `Static` p50 / p99 | Static policy's cost per pod p50 / p99 |\n\
         | --- | --- | --- | --- | --- |\n\
         {rows}\n\
         Goal: under 1 ms per pod. Most of `Static`'s cost is the state file's write \
         (JSON, a checksum, a temporary file renamed over the old one; once per admission \
         that changed the state), which upstream pays too (with an fsync, on every change \
         of the state).\n",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    print!("{body}");
    if let Some(path) = write {
        nodus_bench::write_section(&path, "memory-manager", "## Memory manager", &body)?;
    }
    Ok(())
}
