//! Device plugins: (1) what the admit chain costs per pod with the device manager in it —
//! the kubelet's chain (shutdown, eviction, node resources, device manager) run in-process
//! over a real plugin on a Unix socket, for a BestEffort pod and for a pod with one device
//! (Allocate round trip and checkpoint write included); (2) the time from a plugin's
//! ListAndWatch health change to the node's allocatable changing in the API, with a
//! `nodus kubelet` joined to `nodus control-plane` and the default 10 s
//! nodeStatusUpdateFrequency.

use anyhow::{Context, Result};
use cri::deviceplugin::v1beta1 as pb;
use k8s_openapi::api::core::v1::{Node, Pod};
use nodus_bench::cluster::{self, NODE};
use nodus_bench::targets::{nodus, pct};
use nodus_kubelet::admission::{Handlers, PodAdmitAttributes};
use nodus_kubelet::cm::devicemanager::{DeviceManager, registration};
use nodus_kubelet::cm::{Config, ContainerManager, qos::Layout};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

const RESOURCE: &str = "bench.nodus.dev/dev";
const ROUNDS: usize = 1000;
const HEALTH_ROUNDS: usize = 10;

fn devices(n: usize, unhealthy: usize) -> Vec<pb::Device> {
    (0..n)
        .map(|i| pb::Device {
            id: format!("dev{i}"),
            health: if i < unhealthy {
                "Unhealthy"
            } else {
                "Healthy"
            }
            .into(),
            topology: None,
        })
        .collect()
}

fn paths(n: usize) -> nodus_kubelet::deviceplugin::DevicePaths {
    Arc::new(std::sync::Mutex::new(
        (0..n)
            .map(|i| (format!("dev{i}"), PathBuf::from("/dev/null")))
            .collect::<BTreeMap<_, _>>(),
    ))
}

fn pod(i: usize, device: bool) -> Pod {
    let resources = if device {
        serde_json::json!({"limits": {RESOURCE: "1"}, "requests": {RESOURCE: "1"}})
    } else {
        serde_json::json!({})
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("p{i}"), "namespace": "default", "uid": format!("bench-{i:05}")},
        "spec": {"containers": [{"name": "c", "resources": resources}]}
    }))
    .expect("a valid pod")
}

async fn admission() -> Result<(f64, f64, f64, f64)> {
    let parent = testkit::CgroupParent::new("nodus-devbench");
    parent.create();
    let root = tempfile::tempdir()?;
    let cfg = Config::defaults(Layout {
        root: parent.path(),
        per_qos: false,
    });
    let cm = Arc::new(ContainerManager::new(cfg, root.path())?);
    let dm = Arc::new(DeviceManager::new(root.path())?);
    let _ = cm.devices.set(Arc::clone(&dm));
    tokio::spawn(registration::serve(Arc::clone(&dm)));
    let (_tx, rx) = watch::channel(devices(8, 0));
    tokio::spawn(nodus_kubelet::deviceplugin::serve(
        dm.dir().to_path_buf(),
        RESOURCE.into(),
        rx,
        paths(8),
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while dm.capacity().get(RESOURCE) != Some(&(8, 8)) {
        anyhow::ensure!(Instant::now() < deadline, "the plugin did not register");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut chain = Handlers::default();
    chain.add(Arc::new(nodus_kubelet::nodeshutdown::State::default()));
    chain.add(Arc::new(nodus_kubelet::eviction::admission::AdmitHandler {
        pressure: Arc::default(),
    }));
    chain.add(Arc::new(
        nodus_kubelet::cm::admission::PredicateAdmitHandler {
            cm: Arc::clone(&cm),
        },
    ));
    chain.add(Arc::clone(&dm) as _);
    let (mut best_effort, mut device) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        for (with_device, out) in [(false, &mut best_effort), (true, &mut device)] {
            let p = pod(i * 2 + usize::from(with_device), with_device);
            let t = Instant::now();
            // No other active pods: the previous device pod's device goes back first, as
            // it would for a pod that finished.
            let r = chain
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
        }
    }
    Ok((
        pct(&mut best_effort, 50.0),
        pct(&mut best_effort, 99.0),
        pct(&mut device, 50.0),
        pct(&mut device, 99.0),
    ))
}

async fn allocatable(nodes: &kube::Api<Node>) -> Option<String> {
    let n = nodes.get(NODE).await.ok()?;
    n.status?.allocatable?.get(RESOURCE).map(|q| q.0.clone())
}

async fn wait_allocatable(nodes: &kube::Api<Node>, want: &str) -> Result<Duration> {
    let t = Instant::now();
    while allocatable(nodes).await.as_deref() != Some(want) {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(60),
            "allocatable never became {want}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(t.elapsed())
}

/// Flips one device's health `HEALTH_ROUNDS` times each way and times the API's view.
async fn measure_health(admin: PathBuf, plugin_dir: PathBuf) -> Result<Vec<f64>> {
    let client = nodus_bench::controlplane::client(&admin).await?;
    let nodes: kube::Api<Node> = kube::Api::all(client);
    let (tx, rx) = watch::channel(devices(4, 0));
    tokio::spawn(nodus_kubelet::deviceplugin::serve(
        plugin_dir,
        RESOURCE.into(),
        rx,
        paths(4),
    ));
    wait_allocatable(&nodes, "4")
        .await
        .context("registration")?;
    let mut out = Vec::new();
    for _ in 0..HEALTH_ROUNDS {
        tx.send_replace(devices(4, 1));
        out.push(wait_allocatable(&nodes, "3").await?.as_secs_f64() * 1e3);
        tx.send_replace(devices(4, 0));
        out.push(wait_allocatable(&nodes, "4").await?.as_secs_f64() * 1e3);
    }
    Ok(out)
}

async fn health_to_api(bin: &std::path::Path) -> Result<Vec<f64>> {
    let t = nodus(bin).await?;
    let c = cluster::start(bin, &t, &[])?;
    let (netns, admin, dir) = (
        t.netns.path(),
        c.admin.clone(),
        c.root.join("device-plugins"),
    );
    // The API server listens inside the node's network namespace: measure from a thread
    // that entered it.
    let out = std::thread::spawn(move || -> Result<Vec<f64>> {
        use std::os::fd::AsFd as _;
        let f = std::fs::File::open(&netns)?;
        nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(measure_health(admin, dir))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("measuring thread panicked"))??;
    drop(c);
    Ok(out)
}

#[tokio::main]
async fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin =
        PathBuf::from(std::env::var("NODUS_BIN").context("set NODUS_BIN to the nodus binary")?);
    let (be50, be99, d50, d99) = admission().await?;
    let mut health = health_to_api(&bin).await?;
    let body = format!(
        "The kubelet's admit chain (node shutdown, eviction, node resources, device manager) \
         run in-process over `nodus device-plugin`'s gRPC server on a Unix socket: {ROUNDS} \
         BestEffort pods and {ROUNDS} pods asking for one `{RESOURCE}` (each an Allocate round \
         trip and a checkpoint write), alternating. Then a `nodus kubelet` joined to \
         `nodus control-plane` (default nodeStatusUpdateFrequency 10 s) with a plugin whose \
         ListAndWatch marks one of 4 devices unhealthy and healthy again, {HEALTH_ROUNDS} \
         times each: time from the plugin's answer to the Node's allocatable changing as a \
         client polling every 10 ms reads it. {} cores, {} build.\n\n\
         | measure | p50 | p99 |\n\
         | --- | --- | --- |\n\
         | admission, BestEffort pod | {be50:.0} µs | {be99:.0} µs |\n\
         | admission, pod with one device | {d50:.0} µs | {d99:.0} µs |\n\
         | device manager's cost per pod (difference) | {:.0} µs | {:.0} µs |\n\
         | health change → allocatable in the API | {:.0} ms | {:.0} ms |\n\n\
         Goals: managers add under 1 ms per pod; a health change reaches the API within one \
         node-status update (10 s): the device manager wakes the node status loop on every \
         change instead of waiting for its tick.\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        d50 - be50,
        d99 - be99,
        pct(&mut health, 50.0),
        pct(&mut health, 99.0),
    );
    println!("{body}");
    if let Some(w) = write {
        nodus_bench::write_section(
            &w,
            "device-plugins",
            "## Device plugins (`bash bench/device-plugins.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", w.display());
    }
    Ok(())
}
