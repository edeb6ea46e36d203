//! The CPU and topology managers' cost at admission: the kubelet's admit chain (node
//! shutdown, eviction, node resources, topology manager with the CPU manager as its hint
//! provider) run in-process, for a BestEffort pod and for a Guaranteed pod given exclusive
//! CPUs (hints, merge, takeByTopology and the `cpu_manager_state` write included). Two
//! machines: this one (its own sysfs, `--reserved-cpus 0`, topology policy none) and a fake
//! 2-socket × 2-NUMA-node × 2-core × 2-thread tree (16 CPUs) under `single-numa-node`,
//! where every Guaranteed pod's hints are merged over 4 NUMA nodes.

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use nodus_bench::targets::pct;
use nodus_kubelet::admission::{Handlers, PodAdmitAttributes};
use nodus_kubelet::cm::cpumanager::{self, CpuManager};
use nodus_kubelet::cm::cpuset::CpuSet;
use nodus_kubelet::cm::topology::CpuTopology;
use nodus_kubelet::cm::topologymanager::TopologyManager;
use nodus_kubelet::cm::{Config, ContainerManager, qos::Layout};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

const ROUNDS: usize = 1000;

fn pod(i: usize, guaranteed: Option<&str>) -> Pod {
    let resources = match guaranteed {
        Some(cpu) => serde_json::json!({
            "limits": {"cpu": cpu, "memory": "64Mi"},
            "requests": {"cpu": cpu, "memory": "64Mi"}
        }),
        None => serde_json::json!({}),
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("p{i}"), "namespace": "default", "uid": format!("bench-{i:05}")},
        "spec": {"containers": [{"name": "c", "resources": resources}]}
    }))
    .expect("a valid pod")
}

fn cm_config(root: String) -> Config {
    Config::defaults(Layout {
        root,
        per_qos: false,
    })
}

/// p50 and p99 in µs of: a BestEffort pod through the chain without the CPU and topology
/// managers, a BestEffort pod and a Guaranteed pod through the chain with them.
async fn admission(sysfs: &Path, tm_policy: &str, cpus: &str) -> Result<[f64; 6]> {
    let parent = testkit::CgroupParent::new("nodus-rmbench");
    parent.create();
    let root = tempfile::tempdir()?;
    let cm = Arc::new(ContainerManager::new(
        cm_config(parent.path()),
        root.path(),
    )?);
    let topology = CpuTopology::discover(sysfs)?;
    let tm = Arc::new(
        TopologyManager::new(sysfs, tm_policy, "container", &BTreeMap::new())
            .map_err(anyhow::Error::msg)?,
    );
    let cpu = Arc::new(CpuManager::new(
        &cpumanager::Config {
            policy: "static".into(),
            policy_options: BTreeMap::new(),
            reconcile_period: cpumanager::DEFAULT_RECONCILE_PERIOD,
            reserved_cpus: CpuSet::new([0]),
            reserved_milli: Some(1000),
            state_dir: root.path().to_path_buf(),
        },
        topology,
    )?);
    cpu.set_affinity(Arc::clone(&tm) as _);
    // No other active pods: the previous pod's CPUs go back first, as for a pod that finished.
    cpu.set_active_pods(Box::new(Vec::new), Box::new(|_| false));
    tm.add_hint_provider(Arc::clone(&cpu) as _);
    let mut baseline = Handlers::default();
    baseline.add(Arc::new(nodus_kubelet::nodeshutdown::State::default()));
    baseline.add(Arc::new(nodus_kubelet::eviction::admission::AdmitHandler {
        pressure: Arc::default(),
    }));
    baseline.add(Arc::new(
        nodus_kubelet::cm::admission::PredicateAdmitHandler {
            cm: Arc::clone(&cm),
        },
    ));
    let mut chain = baseline.clone();
    chain.add(Arc::clone(&tm) as _);
    let (mut base, mut best_effort, mut guaranteed) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        for (kind, out) in [(0, &mut base), (1, &mut best_effort), (2, &mut guaranteed)] {
            let g = kind == 2;
            let p = pod(i * 3 + kind, g.then_some(cpus));
            let handlers = if kind == 0 { &baseline } else { &chain };
            let t = Instant::now();
            let r = handlers
                .admit(&PodAdmitAttributes {
                    pod: &p,
                    other_pods: &[],
                })
                .await;
            out.push(t.elapsed().as_secs_f64() * 1e6);
            anyhow::ensure!(
                r.admit,
                "pod refused: {} {}",
                r.reason.map(|r| r.to_string()).unwrap_or_default(),
                r.message
            );
            if g {
                let s = cpu.state();
                anyhow::ensure!(
                    s.get(p.metadata.uid.as_deref().unwrap_or_default(), "c")
                        .is_some_and(|c| c.len().to_string() == cpus),
                    "no exclusive CPUs: {s:?}"
                );
            }
        }
    }
    Ok([
        pct(&mut base, 50.0),
        pct(&mut base, 99.0),
        pct(&mut best_effort, 50.0),
        pct(&mut best_effort, 99.0),
        pct(&mut guaranteed, 50.0),
        pct(&mut guaranteed, 99.0),
    ])
}

#[tokio::main]
async fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let here = admission(Path::new("/sys"), "none", "1").await?;
    let fake = tempfile::tempdir()?;
    nodus_kubelet::cm::topology::fake_sysfs(fake.path(), 2, 2, 2, 2);
    let numa = admission(fake.path(), "single-numa-node", "2").await?;
    let row = |name: &str, v: [f64; 6]| {
        format!(
            "| {name} | {:.0} / {:.0} µs | {:.0} / {:.0} µs | {:.0} / {:.0} µs | {:.0} / {:.0} µs |\n",
            v[0],
            v[1],
            v[2],
            v[3],
            v[4],
            v[5],
            v[4] - v[0],
            v[5] - v[1]
        )
    };
    let body = format!(
        "The kubelet's admit chain (node shutdown, eviction, node resources, topology manager \
         calling the CPU manager) run in-process with the `static` CPU policy: {ROUNDS} \
         BestEffort pods through the chain without the CPU and topology managers, {ROUNDS} \
         through the chain with them and {ROUNDS} Guaranteed pods with whole CPUs, in turn \
         (each Guaranteed pod's CPUs taken by takeByTopology; the next pod's admission gives \
         them back, as for a pod that finished; each change written to `cpu_manager_state`). On this machine's CPUs (`--reserved-cpus 0`, one CPU \
         per pod, topology policy `none`) and on a fake 2-socket × 2-NUMA-node × 2-core × \
         2-thread sysfs (16 CPUs, two CPUs per pod, `single-numa-node`: hints over 4 NUMA \
         nodes merged for every pod). {} cores, {} build.\n\n\
         | machine | BestEffort, no managers p50 / p99 | BestEffort, managers | Guaranteed, exclusive CPUs | managers' cost (Guaranteed − no managers) |\n\
         | --- | --- | --- | --- | --- |\n{}{}\n\
         Goal: the managers add under 1 ms per pod.\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        row("this machine", here),
        row("2 sockets × 2 NUMA, SMT", numa),
    );
    println!("{body}");
    if let Some(w) = write {
        nodus_bench::write_section(
            &w,
            "resource-managers",
            "## CPU and topology managers (`bash bench/resource-managers.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", w.display());
    }
    Ok(())
}
