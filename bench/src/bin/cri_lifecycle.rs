//! The CRI pod lifecycle, nodus vs containerd, with the same client on the same machine in
//! the same run: RunPodSandbox; CreateContainer + StartContainer; StopContainer +
//! RemoveContainer; StopPodSandbox + RemovePodSandbox — for 1 pod (repeated), 50 pods in a
//! row and 50 in parallel, p50/p99 per phase; and memory at 50 running containers: the
//! daemon's RSS growth plus every per-pod process (shims, and containerd's pause
//! containers), as PSS.
//!
//! Each runtime is a test node in its own network namespace and cgroup parent, with the
//! real CNI bridge plugin; images are imported from OCI archives (no registry needed).

use anyhow::{Context, Result};
use cri::runtime::v1 as pb;
use nodus_bench::targets::{Target, containerd, nodus, pct, processes_memory, rss_kib};
use nodus_crictl::Clients;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Pods in the "50" modes; `BENCH_PODS` overrides it for a quick smoke run.
fn pod_count() -> usize {
    std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}
const SINGLE_RUNS: usize = 10;
const PHASES: [&str; 4] = [
    "RunPodSandbox",
    "Create+StartContainer",
    "Stop+RemoveContainer",
    "StopPodSandbox+RemovePodSandbox",
];

fn sandbox_config(t: &Target, i: usize, tag: &str) -> pb::PodSandboxConfig {
    let name = format!("{tag}-{i}");
    let log_dir = t.logs.join(&name);
    let _ = std::fs::create_dir_all(&log_dir);
    pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: name.clone(),
            uid: format!("uid-{name}"),
            namespace: "bench".into(),
            attempt: 0,
        }),
        hostname: name,
        log_directory: log_dir.display().to_string(),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: t.cgroup.path(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_config() -> pb::ContainerConfig {
    pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        image: Some(pb::ImageSpec {
            image: "docker.io/library/busybox:latest".into(),
            ..Default::default()
        }),
        command: vec!["sleep".into(), "3600".into()],
        log_path: "app.log".into(),
        ..Default::default()
    }
}

#[derive(Default)]
struct Pod {
    sandbox: String,
    container: String,
    cfg: pb::PodSandboxConfig,
    /// The RuntimeClass handler ("" = the runtime's default).
    handler: String,
}

async fn phase(c: &Clients, p: usize, pod: &mut Pod) -> Result<Duration> {
    let mut r = c.runtime.clone();
    let t0 = Instant::now();
    match p {
        0 => {
            pod.sandbox = r
                .run_pod_sandbox(pb::RunPodSandboxRequest {
                    config: Some(pod.cfg.clone()),
                    runtime_handler: pod.handler.clone(),
                })
                .await
                .context("RunPodSandbox")?
                .into_inner()
                .pod_sandbox_id;
        }
        1 => {
            pod.container = r
                .create_container(pb::CreateContainerRequest {
                    pod_sandbox_id: pod.sandbox.clone(),
                    config: Some(container_config()),
                    sandbox_config: Some(pod.cfg.clone()),
                })
                .await
                .context("CreateContainer")?
                .into_inner()
                .container_id;
            r.start_container(pb::StartContainerRequest {
                container_id: pod.container.clone(),
            })
            .await
            .context("StartContainer")?;
        }
        2 => {
            r.stop_container(pb::StopContainerRequest {
                container_id: pod.container.clone(),
                timeout: 0,
            })
            .await
            .context("StopContainer")?;
            r.remove_container(pb::RemoveContainerRequest {
                container_id: pod.container.clone(),
            })
            .await
            .context("RemoveContainer")?;
        }
        _ => {
            r.stop_pod_sandbox(pb::StopPodSandboxRequest {
                pod_sandbox_id: pod.sandbox.clone(),
            })
            .await
            .context("StopPodSandbox")?;
            r.remove_pod_sandbox(pb::RemovePodSandboxRequest {
                pod_sandbox_id: pod.sandbox.clone(),
            })
            .await
            .context("RemovePodSandbox")?;
        }
    }
    Ok(t0.elapsed())
}

struct Results {
    /// mode → phase → samples (ms)
    lat: HashMap<&'static str, Vec<Vec<f64>>>,
    daemon_idle_kib: u64,
    daemon_50_kib: u64,
    per_pod: (usize, u64, u64),
}

async fn measure(t: &Target) -> Result<Results> {
    let mut lat: HashMap<&'static str, Vec<Vec<f64>>> = HashMap::new();
    // Warm-up cycle (first-use costs: CNI bridge creation, image metadata caches).
    let mut warm = Pod {
        cfg: sandbox_config(t, 0, "warm"),
        ..Default::default()
    };
    for p in 0..4 {
        phase(&t.c, p, &mut warm).await?;
    }
    // One pod at a time, repeated.
    let mut single = vec![Vec::new(); 4];
    for i in 0..SINGLE_RUNS {
        let mut pod = Pod {
            cfg: sandbox_config(t, i, "single"),
            ..Default::default()
        };
        for (p, samples) in single.iter_mut().enumerate() {
            samples.push(phase(&t.c, p, &mut pod).await?.as_secs_f64() * 1e3);
        }
    }
    lat.insert("1 pod", single);
    // 50 in a row: each phase for every pod, one after the other.
    let daemon_idle_kib = rss_kib(t.daemon_pid);
    let mut pods: Vec<Pod> = (0..pod_count())
        .map(|i| Pod {
            cfg: sandbox_config(t, i, "row"),
            ..Default::default()
        })
        .collect();
    let mut row = vec![Vec::new(); 4];
    let mut daemon_50_kib = 0;
    let mut per_pod = (0, 0, 0);
    for (p, samples) in row.iter_mut().enumerate() {
        for pod in pods.iter_mut() {
            samples.push(phase(&t.c, p, pod).await?.as_secs_f64() * 1e3);
        }
        if p == 1 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            daemon_50_kib = rss_kib(t.daemon_pid);
            per_pod = processes_memory(&*t.per_pod);
        }
    }
    lat.insert("50 in a row", row);
    // 50 in parallel: each phase for all pods at once.
    let mut pods: Vec<Pod> = (0..pod_count())
        .map(|i| Pod {
            cfg: sandbox_config(t, i, "par"),
            ..Default::default()
        })
        .collect();
    let mut par = vec![Vec::new(); 4];
    for (p, samples) in par.iter_mut().enumerate() {
        let futs = pods.iter_mut().map(|pod| {
            let c = t.c.clone();
            async move { phase(&c, p, pod).await }
        });
        for r in futures::future::join_all(futs).await {
            samples.push(r?.as_secs_f64() * 1e3);
        }
    }
    lat.insert("50 in parallel", par);
    Ok(Results {
        lat,
        daemon_idle_kib,
        daemon_50_kib,
        per_pod,
    })
}

/// One runtime + handler's figures in handlers mode.
struct HandlerRow {
    label: String,
    /// phase → samples (ms), single-pod cycles and the pods in a row together.
    samples: Vec<Vec<f64>>,
    /// (per-pod processes, their PSS KiB, their RSS KiB) with every pod of the row running.
    per_pod: (usize, u64, u64),
    /// The daemon's RSS growth (KiB) from idle to every pod of the row running.
    daemon_growth_kib: u64,
}

/// `BENCH_HANDLERS=runc,crun` (the VM lane) or `BENCH_HANDLERS=runc,runsc` (gVisor): the
/// single-pod and in-a-row cycles under each RuntimeClass handler of nodus, and
/// containerd's runc beside them; p50/p99 per phase and memory per running pod. A run with
/// runsc writes its own section; the VM lane's guest is emulated, so only its ratios mean
/// anything.
async fn handlers_mode(
    bin: &std::path::Path,
    handlers: &[String],
    write: Option<PathBuf>,
) -> Result<()> {
    let pods = pod_count();
    let gvisor = handlers.iter().any(|h| h == "runsc");
    let mut rows: Vec<HandlerRow> = Vec::new();
    let cycle = |t: &Target, handler: &str, runs: usize, tag: &'static str| {
        let pods: Vec<Pod> = (0..runs)
            .map(|i| Pod {
                cfg: sandbox_config(t, i, tag),
                handler: handler.to_string(),
                ..Default::default()
            })
            .collect();
        pods
    };
    let mut run = async |t: &Target, handler: &str, label: String| -> Result<()> {
        let mut warm = cycle(t, handler, 1, "warm");
        for p in 0..4 {
            phase(&t.c, p, &mut warm[0]).await?;
        }
        let mut samples = vec![Vec::new(); 4];
        for mut pod in cycle(t, handler, SINGLE_RUNS, "single") {
            for (p, s) in samples.iter_mut().enumerate() {
                s.push(phase(&t.c, p, &mut pod).await?.as_secs_f64() * 1e3);
            }
        }
        let idle = rss_kib(t.daemon_pid);
        let mut per_pod = (0, 0, 0);
        let mut growth = 0;
        let mut row = cycle(t, handler, pods, "row");
        for (p, s) in samples.iter_mut().enumerate() {
            for pod in row.iter_mut() {
                s.push(phase(&t.c, p, pod).await?.as_secs_f64() * 1e3);
            }
            if p == 1 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                growth = rss_kib(t.daemon_pid).saturating_sub(idle);
                per_pod = processes_memory(&*t.per_pod);
            }
        }
        rows.push(HandlerRow {
            label,
            samples,
            per_pod,
            daemon_growth_kib: growth,
        });
        Ok(())
    };
    for h in handlers {
        let t = nodus(bin).await?;
        eprintln!("measuring nodus with handler {h}");
        run(&t, h, format!("nodus + {h}")).await?;
    }
    let t = containerd().await?;
    eprintln!("measuring containerd");
    run(&t, "", "containerd + runc".into()).await?;
    // The floor under Create+Start with each handler: its `run --detach` alone, as nodus's
    // shim calls it.
    let mut floors = Vec::new();
    // runsc's sandbox is not a `run --detach` of a bundle as runc's and crun's are.
    for h in handlers.iter().filter(|h| *h != "runsc") {
        eprintln!("measuring {h} run --detach alone");
        let (mut wall, mut cpu) = nodus_bench::floor::oci_run_detach(h, SINGLE_RUNS)?;
        floors.push((h.clone(), pct(&mut wall, 50.0), pct(&mut cpu, 50.0)));
    }
    let version = |b: &str| nodus_bench::tool_version(b, "");
    let kernel = String::from_utf8_lossy(
        &Command::new("uname")
            .arg("-r")
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default(),
    )
    .trim()
    .to_string();
    let hierarchy = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "cgroup v2"
    } else {
        "cgroup v1"
    };
    let mut body = if gvisor {
        format!(
            "`BENCH_HANDLERS=runc,runsc` on this machine (kernel {kernel}, {hierarchy}, {} \
             cores): nodus with its runc handler, nodus with gVisor ({}, ptrace platform, \
             `--network=host`: each container is a sandbox of its own, see ARCHITECTURE), and \
             containerd + runc; the same client, busybox `sleep 3600`, the {} build of nodus. \
             p50 / p99 in ms over {SINGLE_RUNS} single-pod cycles and {pods} pods in a row \
             together.\n\n",
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            version("runsc"),
            if bin.components().any(|c| c.as_os_str() == "debug") {
                "debug"
            } else {
                "release"
            },
        )
    } else {
        format!(
            "Inside the VM lane's guest (`bash scripts/vm-test.sh bench/cri-lifecycle`: Debian \
             bookworm, kernel {kernel}, pure cgroup v2, systemd; qemu TCG emulation, so only the \
             ratios mean anything); {} and {}; the debug build of nodus the lane runs. p50 / p99 \
             in ms over {SINGLE_RUNS} single-pod cycles and {pods} pods in a row together.\n\n",
            version("runc"),
            version("crun"),
        )
    };
    body.push_str(
        "| runtime + handler | RunPodSandbox | Create+StartContainer | Stop+RemoveContainer | StopPodSandbox+RemovePodSandbox | memory per running pod |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    let mut p50s: Vec<(String, Vec<f64>)> = Vec::new();
    for r in &rows {
        let mut cells = Vec::new();
        let mut p50 = Vec::new();
        for s in &r.samples {
            let mut s = s.clone();
            let (a, b) = (pct(&mut s, 50.0), pct(&mut s, 99.0));
            p50.push(a);
            cells.push(format!("{a:.1} / {b:.1}"));
        }
        let (count, pss, _) = r.per_pod;
        let per = (r.daemon_growth_kib + pss) as f64 / pods as f64;
        body.push_str(&format!(
            "| {} | {} | {:.0} KiB ({count} processes) |\n",
            r.label,
            cells.join(" | "),
            per
        ));
        p50s.push((r.label.clone(), p50));
    }
    body.push_str(
        "\nMemory per running pod: the daemon's RSS growth plus the PSS of every per-pod process \
         (shims; under gVisor also each container's `runsc-sandbox` (the Sentry) and `runsc-gofer`; \
         containerd's pause containers), divided by the pods.\n",
    );
    let create = |label: &str| p50s.iter().find(|(l, _)| l == label).map(|(_, v)| v[1]);
    if let (Some(runc), Some(crun)) = (create("nodus + runc"), create("nodus + crun")) {
        body.push_str(&format!(
            "\nCreate+StartContainer, crun / runc under nodus: {:.2}× (goal: at most 0.5×)",
            crun / runc
        ));
        if let Some(c) = create("containerd + runc") {
            body.push_str(&format!(
                "; nodus + crun / containerd + runc: {:.2}×; nodus + runc / containerd + runc: {:.2}×",
                crun / c,
                runc / c
            ));
        }
        body.push_str(".\n");
    }
    body.push_str(
        "\nThe floor under Create+StartContainer: each OCI runtime's `run --detach` of the same \
         container timed alone in the same guest (`bench/src/floor.rs`), as nodus's shim calls it; \
         \"nodus own\" = nodus's Create+Start p50 minus that floor.\n\n\
         | handler | `run --detach` alone p50 | its CPU p50 | nodus Create+Start p50 | nodus own |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    for (h, wall, cpu) in &floors {
        if let Some(c) = create(&format!("nodus + {h}")) {
            body.push_str(&format!(
                "| {h} | {wall:.1} | {cpu:.1} | {c:.1} | {:.1} |\n",
                c - wall
            ));
        }
    }
    let floor = |h: &str| floors.iter().find(|(n, _, _)| n == h).map(|f| f.1);
    if let (Some(runc), Some(crun)) = (floor("runc"), floor("crun")) {
        body.push_str(&format!("\ncrun / runc alone: {:.2}×.\n", crun / runc));
    }
    if let (Some(runc), Some(runsc)) = (create("nodus + runc"), create("nodus + runsc")) {
        body.push_str(&format!(
            "\nCreate+StartContainer, runsc / runc under nodus: {:.2}× (booting a Sentry per \
             container). Stop+RemoveContainer under runsc waits for the `runsc-sandbox` process \
             to end after the workload is killed: the shim reports the exit when it does.\n",
            runsc / runc
        ));
    }
    println!("{body}");
    if let Some(p) = write {
        let (id, heading) = if gvisor {
            (
                "cri-lifecycle-gvisor",
                "## CRI pod lifecycle under gVisor: runc vs runsc on nodus, and containerd + runc",
            )
        } else {
            (
                "cri-lifecycle-vm",
                "## CRI pod lifecycle on cgroup v2 with runc and crun (VM lane)",
            )
        };
        nodus_bench::write_section(&p, id, heading, &body)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin =
        PathBuf::from(std::env::var("NODUS_BIN").context("set NODUS_BIN to the nodus binary")?);
    if let Ok(h) = std::env::var("BENCH_HANDLERS") {
        let handlers: Vec<String> = h.split(',').map(str::to_string).collect();
        return handlers_mode(&bin, &handlers, write).await;
    }
    let pods = pod_count();
    // BENCH_FLOOR_ONLY=1: just time runc and the CNI chain alone (a quick look).
    if std::env::var("BENCH_FLOOR_ONLY").is_ok_and(|v| v == "1") {
        println!("{:?}", nodus_bench::floor::measure(SINGLE_RUNS)?);
        return Ok(());
    }
    let mut results = Vec::new();
    for which in ["nodus", "containerd"] {
        let t = if which == "nodus" {
            nodus(&bin).await?
        } else {
            containerd().await?
        };
        eprintln!("measuring {}", t.name);
        let r = measure(&t)
            .await
            .with_context(|| format!("measuring {}", t.name))?;
        results.push((t.name.clone(), r));
        drop(t);
    }
    let mut body = format!(
        "Same Rust CRI client for both; each runtime in its own network namespace with the CNI \
         bridge + host-local + portmap plugins, runc {}, busybox `sleep 3600` containers; \
         containerd's sandboxes use a pause image (`sleep inf`) imported offline. Latency \
         per phase in milliseconds (p50 / p99); {SINGLE_RUNS} single-pod cycles, then {pods} \
         pods phase by phase in a row and in parallel. {} cores.\n\n\
         | mode | phase | nodus p50 | nodus p99 | containerd p50 | containerd p99 | nodus/containerd p50 |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
        Command::new("runc")
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .map(str::to_string))
            .unwrap_or_default(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    eprintln!("timing runc and the CNI plugins alone");
    let floors = nodus_bench::floor::measure(SINGLE_RUNS)?;
    let (n, c) = (&results[0].1, &results[1].1);
    for mode in ["1 pod", "50 in a row", "50 in parallel"] {
        for (p, name) in PHASES.iter().enumerate() {
            let mut a = n.lat[mode][p].clone();
            let mut b = c.lat[mode][p].clone();
            let (a50, a99, b50, b99) = (
                pct(&mut a, 50.0),
                pct(&mut a, 99.0),
                pct(&mut b, 50.0),
                pct(&mut b, 99.0),
            );
            body.push_str(&format!(
                "| {mode} | {name} | {a50:.1} | {a99:.1} | {b50:.1} | {b99:.1} | {:.2}× |\n",
                a50 / b50
            ));
        }
    }
    // The floor: the parts each runtime calls, timed alone, against the single-pod phases.
    body.push_str(
        "\nThe floor under those phases: the parts each runtime calls, timed alone in the same run \
         (`bench/src/floor.rs`: the same container by `runc run --detach`, as nodus's shim starts it, \
         and by `runc create` + `runc start`, as containerd's shim does; the CNI chain's ADD and DEL \
         with the same configuration); \"own\" = a runtime's single-pod p50 minus its floor's p50, \
         the work that is the runtime's own.\n\n\
         | phase | half of containerd's p50 | nodus calls | p50 | p99 | containerd calls | p50 | p99 | nodus own | containerd own |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let single = |r: &Results, p: usize| {
        let mut v = r.lat["1 pod"][p].clone();
        pct(&mut v, 50.0)
    };
    let cni_add = "CNI ADD (loopback, bridge + host-local, portmap)";
    for (phase_ix, (np_part, n_samples), (cp_part, c_samples)) in [
        (0, (cni_add, &floors.cni_add), (cni_add, &floors.cni_add)),
        (
            1,
            ("runc run --detach", &floors.runc_run),
            ("runc create + runc start", &floors.runc_create_start),
        ),
        (
            3,
            ("CNI DEL", &floors.cni_del),
            ("CNI DEL", &floors.cni_del),
        ),
    ] {
        let (mut nv, mut cv) = (n_samples.clone(), c_samples.clone());
        let (n50, n99, c50, c99) = (
            pct(&mut nv, 50.0),
            pct(&mut nv, 99.0),
            pct(&mut cv, 50.0),
            pct(&mut cv, 99.0),
        );
        let (np, cp) = (single(n, phase_ix), single(c, phase_ix));
        body.push_str(&format!(
            "| {} | {:.1} | {np_part} | {n50:.1} | {n99:.1} | {cp_part} | {c50:.1} | {c99:.1} | {:.1} | {:.1} |\n",
            PHASES[phase_ix],
            cp / 2.0,
            np - n50,
            cp - c50
        ));
    }
    let (mut rc, mut ac, mut rr) = (
        floors.runc_cpu.clone(),
        floors.cni_add_cpu.clone(),
        floors.runc_run_cpu.clone(),
    );
    let (rc50, ac50, rr50) = (pct(&mut rc, 50.0), pct(&mut ac, 50.0), pct(&mut rr, 50.0));
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;
    body.push_str(&format!(
        "\nCPU time (user + system, p50) of those processes: runc run --detach {rr50:.1} ms (runc create + \
         start {rc50:.1} ms), CNI ADD {ac50:.1} ms — {:.1} ms per nodus pod, so a burst of 100 pods \
         needs at least {:.2} s of this machine's {cores} cores for them alone.\n",
        rr50 + ac50,
        (rr50 + ac50) * 100.0 / cores / 1e3
    ));
    body.push_str(&format!(
        "\nMemory at {pods} running containers (one per pod):\n\n\
         | runtime | daemon RSS idle → at {pods} | per-pod processes | their PSS (sum) | their RSS (sum) | overhead per container (Δdaemon RSS + per-pod PSS) / {pods} |\n\
         | --- | --- | --- | --- | --- | --- |\n"
    ));
    for (name, r) in &results {
        let (count, pss, rss) = r.per_pod;
        let per = (r.daemon_50_kib.saturating_sub(r.daemon_idle_kib) + pss) as f64 / pods as f64;
        body.push_str(&format!(
            "| {name} | {:.1} → {:.1} MiB | {count} | {:.1} MiB | {:.1} MiB | {:.0} KiB |\n",
            r.daemon_idle_kib as f64 / 1024.0,
            r.daemon_50_kib as f64 / 1024.0,
            pss as f64 / 1024.0,
            rss as f64 / 1024.0,
            per
        ));
    }
    println!("{body}");
    if let Some(p) = write {
        nodus_bench::write_section(
            &p,
            "cri-lifecycle",
            "## CRI pod lifecycle (`bash bench/cri-lifecycle.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}
