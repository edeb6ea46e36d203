//! The cost of NRI per container with one plugin connected (`nodus nri-plugin`, a real
//! process over the real socket, injecting one environment variable):
//!
//! * raw: one event round trip (runtime → plugin → runtime over the mux and ttrpc) with a
//!   typical container object, and the four round trips of one container's events back to
//!   back, without the runtime's work around them;
//! * CreateContainer + StartContainer on `nodus runtime` with NRI on and no plugin, then
//!   with the plugin (which is called at CreateContainer, PostCreateContainer,
//!   StartContainer and PostStartContainer), p50/p99 of each and the difference. The runs
//!   alternate in four blocks (without, with, without, with: the plugin is stopped and
//!   started again between them), so a drift of the runtime's state over the runs (more
//!   containers made and removed, a warmer page cache) falls on both sides alike instead
//!   of on whichever side runs second.
//!
//! Goal (issue 20): NRI adds under 1 ms per container with one plugin.

use anyhow::{Context, Result};
use cri::runtime::v1 as pb;
use nodus_bench::targets::{nodus_with, pct};
use nodus_runtime::nri::api;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn runs() -> usize {
    std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}
const RAW_ROUND_TRIPS: usize = 2000;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn plugin(bin: &Path, socket: &Path, log: &Path) -> Result<testkit::daemon::Daemon> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "nri-plugin",
        "--idx",
        "10",
        "--name",
        "bench",
        "--inject-env",
        "BENCH=1",
    ])
    .arg("--socket")
    .arg(socket)
    .arg("--event-log")
    .arg(log);
    testkit::daemon::Daemon::spawn(
        "nri-plugin",
        cmd,
        &log.with_extension("out"),
        Duration::from_secs(5),
    )
}

/// The container events the plugin hears of between CreateContainer and a running container.
const CONTAINER_EVENTS: [api::Event; 4] = [
    api::Event::CreateContainer,
    api::Event::PostCreateContainer,
    api::Event::StartContainer,
    api::Event::PostStartContainer,
];

/// Raw round trips to a plugin process: `n` runs of `events`, each run timed.
async fn raw(bin: &Path, dir: &Path, events: &[api::Event], n: usize) -> Result<Vec<f64>> {
    let sock = dir.join("raw.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = tokio::net::UnixListener::bind(&sock)?;
    let _p = plugin(bin, &sock, &dir.join("raw.events"))?;
    let (stream, _) = listener.accept().await?;
    let opts = nodus_runtime::nri::NriOptions {
        socket: sock.clone(),
        plugin_path: dir.join("none"),
        plugin_config_path: dir.join("none"),
        registration_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(5),
    };
    let pod = api::PodSandbox {
        id: "a".repeat(64),
        name: "bench-pod".into(),
        uid: "0a1b2c3d-0000-4000-8000-000000000000".into(),
        namespace: "default".into(),
        labels: [("app".to_string(), "bench".to_string())].into(),
        ..Default::default()
    };
    let container = api::Container {
        id: "b".repeat(64),
        pod_sandbox_id: "a".repeat(64),
        name: "app".into(),
        args: vec!["sleep".into(), "3600".into()],
        env: (0..10).map(|i| format!("VAR_{i}=value-{i}")).collect(),
        mounts: (0..8)
            .map(|i| api::Mount {
                destination: format!("/mnt/{i}"),
                r#type: "bind".into(),
                source: format!("/var/lib/kubelet/pods/x/volumes/{i}"),
                options: vec!["rbind".into(), "rprivate".into()],
            })
            .collect(),
        ..Default::default()
    };
    let d = nodus_runtime::nri::measure_round_trips(stream, &opts, pod, container, events, n)
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(d.into_iter().map(ms).collect())
}

/// One container's CreateContainer and StartContainer times.
#[derive(Default)]
struct Timed {
    create: Vec<f64>,
    start: Vec<f64>,
}

impl Timed {
    fn total(&self) -> Vec<f64> {
        self.create
            .iter()
            .zip(&self.start)
            .map(|(c, s)| c + s)
            .collect()
    }
}

/// create and start times of `n` containers in one pod (each removed after it is timed),
/// added to `out`.
async fn lifecycle(
    t: &nodus_bench::targets::Target,
    tag: &str,
    n: usize,
    out: &mut Timed,
) -> Result<()> {
    let mut r = t.c.runtime.clone();
    let name = format!("nri-{tag}");
    let log_dir = t.logs.join(&name);
    std::fs::create_dir_all(&log_dir)?;
    let cfg = pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: name.clone(),
            uid: format!("uid-{name}"),
            namespace: "bench".into(),
            attempt: 0,
        }),
        log_directory: log_dir.display().to_string(),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: t.cgroup.path(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sb = r
        .run_pod_sandbox(pb::RunPodSandboxRequest {
            config: Some(cfg.clone()),
            runtime_handler: String::new(),
        })
        .await?
        .into_inner()
        .pod_sandbox_id;
    for i in 0..n {
        let c = pb::ContainerConfig {
            metadata: Some(pb::ContainerMetadata {
                name: format!("app-{i}"),
                attempt: 0,
            }),
            image: Some(pb::ImageSpec {
                image: "docker.io/library/busybox:latest".into(),
                ..Default::default()
            }),
            command: vec!["sleep".into(), "3600".into()],
            log_path: format!("app-{i}.log"),
            ..Default::default()
        };
        let t0 = Instant::now();
        let id = r
            .create_container(pb::CreateContainerRequest {
                pod_sandbox_id: sb.clone(),
                config: Some(c),
                sandbox_config: Some(cfg.clone()),
            })
            .await?
            .into_inner()
            .container_id;
        let t1 = Instant::now();
        r.start_container(pb::StartContainerRequest {
            container_id: id.clone(),
        })
        .await?;
        out.create.push(ms(t1 - t0));
        out.start.push(ms(t1.elapsed()));
        r.stop_container(pb::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await?;
        r.remove_container(pb::RemoveContainerRequest { container_id: id })
            .await?;
    }
    r.stop_pod_sandbox(pb::StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    })
    .await?;
    r.remove_pod_sandbox(pb::RemovePodSandboxRequest { pod_sandbox_id: sb })
        .await?;
    Ok(())
}

/// Starts the plugin and waits until the runtime has synchronized it.
async fn connect(bin: &Path, sock: &Path, events: &Path) -> Result<testkit::daemon::Daemon> {
    let _ = std::fs::remove_file(events);
    let p = plugin(bin, sock, events)?;
    for _ in 0..200 {
        if std::fs::read_to_string(events).is_ok_and(|s| s.contains("\"Synchronize\"")) {
            return Ok(p);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    anyhow::bail!(
        "the plugin was not synchronized within 5 s (see {})",
        events.display()
    )
}

fn row(label: &str, v: &mut [f64]) -> (String, f64) {
    let (p50, p99) = (pct(v, 50.0), pct(v, 99.0));
    (
        format!("| {label} | {} | {p50:.3} | {p99:.3} |\n", v.len()),
        p50,
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin =
        PathBuf::from(std::env::var("NODUS_BIN").context("set NODUS_BIN to the nodus binary")?);
    let dir = tempfile::Builder::new().prefix("bench-nri-").tempdir()?;
    let mut single = raw(
        &bin,
        dir.path(),
        &[api::Event::PostCreateContainer],
        RAW_ROUND_TRIPS,
    )
    .await?;
    let mut per_container = raw(&bin, dir.path(), &CONTAINER_EVENTS, RAW_ROUND_TRIPS / 4).await?;

    let sock = dir.path().join("nri.sock");
    let t = nodus_with(
        &bin,
        &format!(
            "nri = true\nnri-socket = \"{}\"\nnri-plugin-path = \"{}\"\n",
            sock.display(),
            dir.path().join("plugins").display()
        ),
    )
    .await?;
    // The plugin's event log lives on tmpfs: on the runtime's disk its appends would be
    // flushed by every fsync of the runtime's own container records (ext4's ordered
    // journal), charging the plugin's disk writes to NRI.
    let shm = tempfile::Builder::new()
        .prefix("bench-nri-")
        .tempdir_in("/dev/shm")?;
    let events = shm.path().join("lifecycle.events");
    let (mut without, mut with) = (Timed::default(), Timed::default());
    let half = runs().div_ceil(2);
    for round in 0..2 {
        lifecycle(&t, &format!("without-{round}"), half, &mut without).await?;
        let p = connect(&bin, &sock, &events).await?;
        lifecycle(&t, &format!("with-{round}"), half, &mut with).await?;
        drop(p);
        // The runtime drops a plugin when its connection closes; give it that moment so
        // the next block really runs without one.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut body = format!(
        "Measured {} on this machine: NRI with one plugin (`nodus nri-plugin --inject-env BENCH=1`, a separate process on the NRI socket, its event log on tmpfs so that its own writes are not flushed by the runtime's fsyncs), {build} build, {} cores; the lifecycle runs alternate in blocks without and with the plugin (without, with, without, with).\n\n| measurement | n | p50 ms | p99 ms |\n| --- | --- | --- | --- |\n",
        nodus_bench::today(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    let (r, raw50) = row(
        "raw event round trip (PostCreateContainer, 10 env, 8 mounts)",
        &mut single,
    );
    body.push_str(&r);
    let (r, seq50) = row(
        "raw round trips of one container's 4 events (CreateContainer, PostCreate, Start, PostStart)",
        &mut per_container,
    );
    body.push_str(&r);
    let (r, w50) = row(
        "CreateContainer+StartContainer, NRI on, no plugin",
        &mut without.total(),
    );
    body.push_str(&r);
    let (r, p50) = row(
        "CreateContainer+StartContainer, one plugin (4 events)",
        &mut with.total(),
    );
    body.push_str(&r);
    for (label, v) in [
        ("CreateContainer alone, no plugin", &mut without.create),
        ("CreateContainer alone, one plugin", &mut with.create),
        ("StartContainer alone, no plugin", &mut without.start),
        ("StartContainer alone, one plugin", &mut with.start),
    ] {
        body.push_str(&row(label, v).0);
    }
    body.push_str(&format!(
        "\nNRI's cost per container: {:.3} ms (p50 difference of the lifecycle rows); one container's 4 events: {seq50:.3} ms (4 × the single event: {:.3} ms). Goal: under 1 ms per container.\n",
        p50 - w50,
        4.0 * raw50
    ));
    print!("{body}");
    if let Some(path) = write {
        nodus_bench::write_section(&path, "nri", "## NRI round trip", &body)?;
    }
    Ok(())
}
