//! Pod cgroup churn through the kubelet's container manager: for 100 pods (a third each
//! Guaranteed, Burstable, BestEffort) create the pod cgroup with its values and update the
//! QoS tiers, then delete them all, updating the tiers as each goes — on this machine's real
//! cgroups, under a private cgroup root. Reports wall time per pod and the CPU time the
//! process spent (user + system), the kubelet's own cost of this churn.

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use nodus_kubelet::cm::{Config, ContainerManager, qos::Layout};

use std::time::{Duration, Instant};

fn pods() -> usize {
    std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

fn pod(i: usize) -> Pod {
    let resources = match i % 3 {
        0 => {
            serde_json::json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}})
        }
        1 => serde_json::json!({"requests": {"cpu": "50m", "memory": "32Mi"}}),
        _ => serde_json::json!({}),
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("p{i}"), "uid": format!("bench-{i:04}")},
        "spec": {"containers": [{"name": "c", "resources": resources}]}
    }))
    .expect("a valid pod")
}

fn cpu_time() -> Duration {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF);
    match u {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| {
                Duration::from_secs(tv.tv_sec() as u64) + Duration::from_micros(tv.tv_usec() as u64)
            };
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let n = pods();
    let parent = testkit::CgroupParent::new("nodus-cgbench");
    parent.create();
    let dir = tempfile::tempdir()?;
    let cfg = Config {
        enforce_node_allocatable: vec!["pods".into()],
        ..Config::defaults(Layout {
            root: parent.path(),
            per_qos: true,
        })
    };
    let cm = ContainerManager::new(cfg, dir.path())?;
    cm.start()?;
    let all: Vec<Pod> = (0..n).map(pod).collect();

    let (c0, t0) = (cpu_time(), Instant::now());
    let mut create = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        cm.ensure_pod(&all[i])?;
        cm.update_tiers(&all[..=i]);
        create.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (create_wall, create_cpu) = (t0.elapsed(), cpu_time() - c0);
    let (c1, t1) = (cpu_time(), Instant::now());
    let mut delete = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        cm.remove_pod(all[i].metadata.uid.as_deref().unwrap_or_default());
        cm.update_tiers(&all[i + 1..]);
        delete.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (delete_wall, delete_cpu) = (t1.elapsed(), cpu_time() - c1);
    let p = |v: &mut Vec<f64>, q: f64| nodus_bench::targets::pct(v, q);
    let body = format!(
        "The kubelet's container manager on this machine's real cgroups (v1, cgroupfs), under \
         a private cgroup root: {n} pods, a third each Guaranteed / Burstable / BestEffort; \
         per pod, create its `pod<uid>` cgroup in every controller with its values and \
         update the QoS tiers; then remove each and update the tiers. CPU is the process's \
         user+system time for the whole phase. {} cores.\n\n\
         | phase | per pod p50 | per pod p99 | total wall | CPU used |\n\
         | --- | --- | --- | --- | --- |\n\
         | create + tier update | {:.2} ms | {:.2} ms | {:.0} ms | {:.0} ms |\n\
         | delete + tier update | {:.2} ms | {:.2} ms | {:.0} ms | {:.0} ms |\n\n\
         No peer can run here for comparison (upstream's kubelet is not installable); \
         upstream's kubelet does the same work per pod through libcontainer's cgroupfs \
         manager.\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        p(&mut create, 50.0),
        p(&mut create, 99.0),
        create_wall.as_secs_f64() * 1e3,
        create_cpu.as_secs_f64() * 1e3,
        p(&mut delete, 50.0),
        p(&mut delete, 99.0),
        delete_wall.as_secs_f64() * 1e3,
        delete_cpu.as_secs_f64() * 1e3,
    );
    println!("{body}");
    if let Some(w) = write {
        nodus_bench::write_section(
            &w,
            "cgroup-churn",
            "## Pod cgroup churn (`bash bench/cgroup-churn.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", w.display());
    }
    // The tiers and kubepods go with the parent.
    let cg = nodus_cgroups::detect();
    let _ = cg.delete(&format!("{}/kubepods", parent.path()));
    Ok(())
}
