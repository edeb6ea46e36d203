//! `nodus control-plane` and a nodus kubelet joined to it, both inside a runtime target's
//! network namespace: the cluster the API-level benchmarks measure. Killed on drop.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use testkit::daemon::Daemon;

use crate::targets::Target;

pub const API_PORT: u16 = 6443;
/// The node's name in every API-level benchmark.
pub const NODE: &str = "bench";

pub struct Cluster {
    pub kubelet: Daemon,
    pub control_plane: Daemon,
    pub admin: PathBuf,
    /// The kubelet's `--root-dir`.
    pub root: PathBuf,
    _dir: tempfile::TempDir,
}

/// The kubelet's read-only port (`/metrics`, `/pods`), reached through the runtime's
/// network namespace.
pub const READ_ONLY_PORT: u16 = 10255;

/// Starts the control plane, then a kubelet on `t`'s runtime with `kubelet_extra` flags.
pub fn start(bin: &Path, t: &Target, kubelet_extra: &[&str]) -> Result<Cluster> {
    let dir = tempfile::Builder::new().prefix("bench-api-").tempdir()?;
    let data = dir.path().join("cp");
    let mut cmd = t.netns.command(bin)?;
    cmd.arg("control-plane")
        .arg("--data-dir")
        .arg(&data)
        .args(["--bind-address", "127.0.0.1", "--secure-port"])
        .arg(API_PORT.to_string())
        .env("NODUS_LOG", "warn");
    let mut cp = Daemon::spawn(
        "nodus-control-plane",
        cmd,
        &dir.path().join("cp.log"),
        Duration::from_secs(10),
    )?;
    let admin = data.join("admin.kubeconfig");
    let ns = std::sync::Arc::clone(&t.netns);
    let a = admin.clone();
    cp.wait_ready(Duration::from_secs(60), || {
        a.exists()
            && ns
                .connect_tcp(std::net::SocketAddr::from(([127, 0, 0, 1], API_PORT)))
                .is_ok()
    })?;
    let node_kc = nodus_control_plane::pki::issue_node_kubeconfig(
        &data,
        NODE,
        &format!("https://127.0.0.1:{API_PORT}"),
    )?;
    // A serving certificate from the cluster CA, so the API server can proxy logs, exec and
    // attach to the kubelet (at --node-ip 127.0.0.1, which the benchmarks that do pass).
    let (serving_crt, serving_key) = nodus_control_plane::pki::issue_kubelet_serving_cert(
        &data,
        NODE,
        &[std::net::IpAddr::from([127, 0, 0, 1])],
    )?;
    t.cgroup.create();
    let mut cmd = t.netns.command(bin)?;
    cmd.arg("kubelet")
        .arg("--tls-cert-file")
        .arg(&serving_crt)
        .arg("--tls-private-key-file")
        .arg(&serving_key)
        .arg("--client-ca-file")
        .arg(data.join("pki/ca.crt"))
        .arg("--container-runtime-endpoint")
        .arg(&t.endpoint)
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .arg("--pod-logs-dir")
        .arg(dir.path().join("logs"))
        .arg("--cgroup-root")
        .arg(t.cgroup.path())
        .arg("--kubeconfig")
        .arg(&node_kc)
        .args(["--hostname-override", NODE, "--healthz-port", "10248"])
        // The unauthenticated port, inside the runtime's network namespace only: the
        // benchmarks read the kubelet's /metrics there.
        .args(["--read-only-port", &READ_ONLY_PORT.to_string()])
        .args(["--feature-gates", "EventedPLEG=true"])
        // Disk-based eviction off, as kind's nodes: a nearly full build disk must not
        // put the measured node under DiskPressure.
        .args([
            "--eviction-hard",
            "memory.available<100Mi,nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%",
        ])
        .args(kubelet_extra)
        .env("NODUS_LOG", "warn");
    let mut kubelet = Daemon::spawn(
        "nodus-kubelet",
        cmd,
        &dir.path().join("kubelet.log"),
        Duration::from_secs(10),
    )?;
    let ns = std::sync::Arc::clone(&t.netns);
    kubelet.wait_ready(Duration::from_secs(30), || {
        ns.http_get(10248, "/healthz").is_ok()
    })?;
    Ok(Cluster {
        kubelet,
        control_plane: cp,
        admin,
        root: dir.path().join("root"),
        _dir: dir,
    })
}

/// CPU time (user + system) a process has used so far, in milliseconds.
pub fn cpu_ms(pid: u32) -> f64 {
    let f = crate::targets::stat_fields(pid);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) * 1e3 / hz.max(1.0)
}
