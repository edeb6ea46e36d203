//! Runtimes under test for the benchmarks: nodus's runtime and containerd, each a node in
//! its own network namespace and cgroup parent with the real CNI plugins, images imported
//! offline; plus the /proc readings and percentiles the benchmarks share.

use anyhow::{Result, bail};
use nodus_crictl::Clients;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use testkit::daemon::Daemon;
use testkit::{CgroupParent, Containerd, ContainerdOptions, Netns};

/// The CRI benchmarks' network: bridge + host-local + portmap, masquerading as the bridge
/// plugin's `ipMasq` does (containerd's and CRI-O's sample configuration).
pub fn conflist(data_dir: &Path) -> String {
    conflist_with(data_dir, Masq::Bridge)
}

/// Who masquerades pod traffic leaving the pod network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Masq {
    /// The bridge plugin's `ipMasq`: one iptables chain per pod, added on every CNI ADD, so
    /// an ADD costs more the more pods the node has.
    Bridge,
    /// `ipMasq` off, as `nodus up` and `nodus node` run: the pod network agent masquerades
    /// with one rule for all pods.
    Agent,
}

pub fn conflist_with(data_dir: &Path, masq: Masq) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"bench","plugins":[{{"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":{},"ipam":{{"type":"host-local","ranges":[[{{"subnet":"10.98.0.0/16"}}]],"dataDir":"{}"}}}},{{"type":"portmap","capabilities":{{"portMappings":true}}}}]}}"#,
        masq == Masq::Bridge,
        data_dir.display()
    )
}

/// A node's config files in `d`: a CNI bridge network and the runtime's config pointing at
/// it, with an NRI socket of its own.
pub fn prepare_node_dir(d: &Path) -> Result<()> {
    std::fs::create_dir_all(d.join("net.d"))?;
    std::fs::write(d.join("net.d/10-bench.conflist"), conflist(&d.join("ipam")))?;
    std::fs::write(
        d.join("runtime.toml"),
        format!(
            "cni-conf-dir = \"{}\"\ncni-bin-dirs = [\"/usr/lib/cni\", \"/opt/cni/bin\"]\n{}",
            d.join("net.d").display(),
            testkit::runtime_config::private_nri(d, "")
        ),
    )?;
    Ok(())
}

/// A runtime under test with everything it needs kept alive.
pub struct Target {
    pub name: String,
    pub c: Clients,
    pub daemon_pid: u32,
    /// The CRI endpoint, `unix://…`.
    pub endpoint: String,
    /// Matches the per-pod processes of this runtime (shims, pause), by /proc cmdline.
    pub per_pod: Box<dyn Fn(&str) -> bool + Send + Sync>,
    pub cgroup: CgroupParent,
    pub logs: PathBuf,
    /// The node's network namespace (for processes that must run inside it).
    pub netns: std::sync::Arc<Netns>,
    pub _keep: Vec<Box<dyn std::any::Any>>,
}

pub fn write_archives(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let busybox = dir.join("busybox.tar");
    testkit::image::busybox().write_oci_archive(&busybox, "docker.io/library/busybox:latest")?;
    let pause = dir.join("pause.tar");
    testkit::image::busybox_builder()
        .entrypoint(["/bin/sleep", "inf"])
        .build()?
        .write_oci_archive(&pause, "registry.k8s.io/pause:3.8")?;
    Ok((busybox, pause))
}

pub async fn nodus(bin: &Path) -> Result<Target> {
    nodus_with(bin, "").await
}

/// [`nodus`] with `extra` appended to the runtime's TOML config (e.g.
/// `default-runtime-handler = "crun"`).
pub async fn nodus_with(bin: &Path, extra: &str) -> Result<Target> {
    nodus_with_masq(bin, extra, Masq::Bridge).await
}

/// [`nodus_with`] on a network whose masquerading is `masq`'s.
pub async fn nodus_with_masq(bin: &Path, extra: &str, masq: Masq) -> Result<Target> {
    let netns = std::sync::Arc::new(Netns::new("nodus-bench")?);
    let dir = tempfile::Builder::new().prefix("bench-nodus-").tempdir()?;
    let d = dir.path();
    std::fs::create_dir_all(d.join("net.d"))?;
    std::fs::write(
        d.join("net.d/10-bench.conflist"),
        conflist_with(&d.join("ipam"), masq),
    )?;
    std::fs::write(
        d.join("runtime.toml"),
        format!(
            "{}cni-conf-dir = \"{}\"\ncni-bin-dirs = [\"/usr/lib/cni\", \"/opt/cni/bin\"]\n{extra}",
            testkit::runtime_config::private_nri(d, extra),
            d.join("net.d").display()
        ),
    )?;
    let (busybox, _) = write_archives(d)?;
    let out = Command::new(bin)
        .args(["runtime", "import"])
        .arg(&busybox)
        .arg("--root-dir")
        .arg(d.join("root"))
        .output()?;
    if !out.status.success() {
        bail!("import: {}", String::from_utf8_lossy(&out.stderr));
    }
    let sock = d.join("nodus.sock");
    let mut cmd = netns.command(bin)?;
    cmd.arg("runtime")
        .arg("--listen")
        .arg(&sock)
        .arg("--root-dir")
        .arg(d.join("root"))
        .arg("--state-dir")
        .arg(d.join("state"))
        .arg("--config")
        .arg(d.join("runtime.toml"));
    // NODUS_BENCH_RUNTIME_LOG=FILE keeps the runtime's debug log of the run there, to trace
    // where a figure's time goes; the figures are taken at `warn`.
    let log = match std::env::var_os("NODUS_BENCH_RUNTIME_LOG") {
        Some(f) => {
            cmd.env("NODUS_LOG", "debug");
            PathBuf::from(f)
        }
        None => {
            cmd.env("NODUS_LOG", "warn");
            d.join("log")
        }
    };
    let mut daemon = Daemon::spawn("nodus-runtime", cmd, &log, Duration::from_secs(10))?;
    daemon.wait_ready(Duration::from_secs(30), || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    })?;
    let c = nodus_crictl::connect(
        &format!("unix://{}", sock.display()),
        None,
        Duration::from_secs(10),
    )
    .await?;
    let state = d.join("state").display().to_string();
    Ok(Target {
        name: "nodus runtime".into(),
        endpoint: format!("unix://{}", sock.display()),
        c,
        daemon_pid: daemon.pid(),
        // Shims, and under gVisor each container's sandbox (the Sentry and its ptrace
        // stubs) and gofer, all of which name the runtime's state dir (runsc's --root).
        per_pod: Box::new(move |cmdline| {
            (cmdline.contains(" shim ") || cmdline.starts_with("runsc-"))
                && cmdline.contains(&state)
        }),
        cgroup: CgroupParent::new("nodus-bench"),
        logs: d.join("logs"),
        netns: std::sync::Arc::clone(&netns),
        // Dropped in order: the daemon is killed, then what it left (shims, containers, the
        // rootfs and namespace mounts of pods still there) is cleaned up before the temp dir
        // goes, so no mount outlives the run on the host.
        _keep: vec![
            Box::new(daemon),
            Box::new(Leftovers {
                state: d.join("state"),
                base: d.to_path_buf(),
            }),
            Box::new(dir),
            Box::new(netns),
        ],
    })
}

/// Cleans up on drop what a killed nodus runtime left under its temp dir.
struct Leftovers {
    state: PathBuf,
    base: PathBuf,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        testkit::leftovers::kill_runtime_leftovers(&self.state, &self.base);
    }
}

pub async fn containerd() -> Result<Target> {
    let netns = std::sync::Arc::new(Netns::new("ctrd-bench")?);
    let dir = tempfile::Builder::new().prefix("bench-ctrd-").tempdir()?;
    let d = dir.path();
    std::fs::create_dir_all(d.join("net.d"))?;
    std::fs::write(d.join("net.d/10-bench.conflist"), conflist(&d.join("ipam")))?;
    let ctrd = Containerd::start_with(ContainerdOptions {
        netns: Some(netns.as_ref()),
        cni_bin_dir: Some(Path::new("/usr/lib/cni")),
        cni_conf_dir: Some(&d.join("net.d")),
        ..Default::default()
    })?;
    let (busybox, pause) = write_archives(d)?;
    for a in [&busybox, &pause] {
        let out = ctrd
            .ctr(["-n", "k8s.io", "images", "import"])
            .arg(a)
            .output()?;
        if !out.status.success() {
            bail!("ctr import: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let c = nodus_crictl::connect(&ctrd.endpoint(), None, Duration::from_secs(10)).await?;
    let sock = ctrd.socket().display().to_string();
    let version = Command::new("containerd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .map(str::to_string)
        })
        .unwrap_or_default();
    // containerd-shim-runc-v2 processes of this containerd, and the pause processes (the
    // sandbox containers), which the app containers ("sleep 3600") are not.
    Ok(Target {
        name: format!("containerd {version}"),
        endpoint: ctrd.endpoint(),
        c,
        daemon_pid: ctrd.pid(),
        per_pod: Box::new(move |cmdline| {
            (cmdline.contains("containerd-shim") && cmdline.contains(&sock))
                || cmdline.starts_with("/bin/sleep inf")
        }),
        cgroup: CgroupParent::new("ctrd-bench"),
        logs: d.join("logs"),
        netns: std::sync::Arc::clone(&netns),
        _keep: vec![Box::new(ctrd), Box::new(dir), Box::new(netns)],
    })
}

pub fn kib(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub fn rss_kib(pid: u32) -> u64 {
    kib(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default(),
        "VmRSS:",
    )
}

/// The fields of `/proc/<pid>/stat` after the command name (so stat(5)'s field 3, the
/// state, is index 0); empty when the process is gone. The name may hold spaces and
/// parentheses, hence the split at the last `)`.
pub fn stat_fields(pid: u32) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The RSS of a runtime's node-wide processes: the daemon at `pid` and its children that
/// are not per-pod processes (`per_pod` their command lines) — nodus's shim fork server,
/// which every shim is forked from and which lives as long as the daemon.
pub fn runtime_rss_kib(pid: u32, per_pod: &(dyn Fn(&str) -> bool + Sync)) -> u64 {
    let mut total = rss_kib(pid);
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let ppid = stat_fields(child)
            .get(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(pid) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{child}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        if !cmdline.is_empty() && !per_pod(&cmdline) {
            total += rss_kib(child);
        }
    }
    total
}

/// (count, sum of PSS KiB, sum of RSS KiB) of the processes whose command line `matches`
/// (a runtime's per-pod processes: shims, pause containers). `BENCH_SMAPS=DIR` keeps each
/// one's /proc/PID/smaps there, to see where its memory goes.
pub fn processes_memory(matches: &(dyn Fn(&str) -> bool + Sync)) -> (usize, u64, u64) {
    let mut n = 0;
    let (mut pss, mut rss) = (0, 0);
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        if cmdline.is_empty() || !matches(&cmdline) {
            continue;
        }
        n += 1;
        if std::env::var_os("BENCH_VERBOSE").is_some() {
            eprintln!("per-pod process {pid}: {cmdline}");
        }
        if let Some(dir) = std::env::var_os("BENCH_SMAPS") {
            let _ = std::fs::copy(
                format!("/proc/{pid}/smaps"),
                PathBuf::from(dir).join(format!("{pid}.smaps")),
            );
        }
        pss += kib(
            &std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default(),
            "Pss:",
        );
        rss += rss_kib(pid);
    }
    (n, pss, rss)
}

pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return 0.0;
    }
    let idx = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[idx.min(v.len() - 1)]
}
