//! What starting a shim costs: `nodus shim` exec'd per container (`posix_spawn`, then the
//! shim detaches itself) against shims forked by the runtime's fork server
//! (`nodus shim-fork-server`), each running `runc run --detach` of the same busybox
//! container, rounds alternating the two. Per start: wall time until the shim reports the
//! container created; the shim's own CPU (its scheduler runtime from
//! `/proc/<pid>/schedstat` once it has settled, plus, when exec'd, the first process that
//! only forks it off, plus, when forked, the server's CPU for the fork); the CPU of
//! everything the start ran (a cgroup of the bench's own: the shim, runc, the server — not
//! runc's init, which runs in the container's cgroup). With every shim of both kinds alive
//! at the end, their mean RSS and PSS.
//!
//!   shim-start [--write docs/PERFORMANCE.md]     (root; NODUS_BIN = the nodus binary)

use anyhow::{Context, Result, bail};
use nodus_bench::floor::{MemDir, bundle, children_cpu};
use nodus_bench::treecpu::TreeCpu;
use nodus_runtime::shim::{self, ForkServer, ShimArgs, SpawnedShim};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use testkit::CgroupParent;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Start {
    Exec,
    ForkServer,
}

impl Start {
    fn label(self) -> &'static str {
        match self {
            Start::Exec => "`nodus shim` exec'd (posix_spawn, the shim detaches itself)",
            Start::ForkServer => "forked by `nodus shim-fork-server`",
        }
    }
}

#[derive(Default)]
struct Samples {
    wall: Vec<f64>,
    shim_cpu: Vec<f64>,
    tree_cpu: Vec<f64>,
    pids: Vec<i32>,
}

/// Nanoseconds a task has run, from `/proc/<pid>/schedstat` (exact, where `stat`'s
/// clock ticks are 10 ms), in milliseconds.
fn runtime_ms(pid: i32) -> Result<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .with_context(|| format!("schedstat of {pid}"))?;
    let ns: u64 = s
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .context("schedstat format")?;
    Ok(ns as f64 / 1e6)
}

/// `Rss` and `Pss` of `pid` in KiB.
fn rss_pss(pid: i32) -> Result<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((field("Rss:"), field("Pss:")))
}

fn p50(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Kills and deletes every container under `root` (the shims then exit).
struct Containers {
    root: PathBuf,
    ids: Vec<String>,
}

impl Drop for Containers {
    fn drop(&mut self) {
        for id in &self.ids {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(&self.root)
                .args(["kill", id, "KILL"])
                .output();
        }
        std::thread::sleep(Duration::from_millis(500));
        for id in &self.ids {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(&self.root)
                .args(["delete", "--force", id])
                .output();
        }
    }
}

fn main() -> Result<()> {
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let exe = std::fs::canonicalize(nodus_bench::nodus_bin()).context("NODUS_BIN")?;
    if !Path::new("/proc/self/schedstat").exists() {
        bail!("this kernel has no /proc/<pid>/schedstat");
    }
    let cg = CgroupParent::new("shimstart");
    cg.create();
    let tmp = tempfile::Builder::new().prefix("bench-shim-").tempdir()?;
    // As on a node: runc's state, the bundles and the shims' directories in memory.
    let dir = MemDir::new(&tmp.path().join("state"))?;
    let root = dir.0.join("runc");
    let meter = TreeCpu::new("bench-shimstart")?;
    meter.add(std::process::id())?;
    let server = ForkServer::new(exe.clone());
    let mut containers = Containers {
        root: root.clone(),
        ids: Vec::new(),
    };
    let mut samples = [Samples::default(), Samples::default()];
    let mut server_pid = None;
    for round in 0..=runs {
        let order = if round % 2 == 0 {
            [Start::Exec, Start::ForkServer]
        } else {
            [Start::ForkServer, Start::Exec]
        };
        for how in order {
            let id = format!(
                "shim-{}-{round}",
                if how == Start::Exec { "e" } else { "f" }
            );
            let b = bundle(&dir.0, &cg, &id)?;
            // As the daemon does: the OOM counter resolved for the shim, so that no shim
            // reads the mount table.
            let oom_file = shim::cgroup::oom_file(&b, &id);
            let args = ShimArgs {
                oom_file,
                id: id.clone(),
                bundle: b,
                runtime: "runc".into(),
                runtime_root: root.clone(),
                state_dir: dir.0.join("shims").join(&id),
                start: true,
                ..ShimArgs::default()
            };
            let server_before = match server_pid {
                Some(p) => runtime_ms(p)?,
                None => 0.0,
            };
            let waited_before = children_cpu();
            let tree_before = meter.ms();
            let t = Instant::now();
            let spawned: SpawnedShim = match how {
                Start::Exec => shim::spawn(&exe, &args),
                Start::ForkServer => server.spawn(&args),
            }
            .with_context(|| format!("starting the shim of {id}"))?;
            let wall = t.elapsed().as_secs_f64() * 1e3;
            containers.ids.push(id);
            // The shim settles (it drops its file pages once the container runs).
            std::thread::sleep(Duration::from_millis(300));
            let mut own = runtime_ms(spawned.shim_pid)?;
            match how {
                Start::Exec => own += children_cpu() - waited_before,
                Start::ForkServer => {
                    let pid = server.server_pid().context("no fork server")? as i32;
                    if server_pid.is_some() {
                        own += runtime_ms(pid)? - server_before;
                    }
                    server_pid = Some(pid);
                }
            }
            let tree = meter.ms() - tree_before;
            // The first round warms the page cache and starts the server.
            if round > 0 {
                let s = &mut samples[how as usize];
                s.wall.push(wall);
                s.shim_cpu.push(own);
                s.tree_cpu.push(tree);
                s.pids.push(spawned.shim_pid);
            }
        }
    }
    let mut rows = String::new();
    for how in [Start::Exec, Start::ForkServer] {
        let s = &samples[how as usize];
        let mem: Vec<(f64, f64)> = s.pids.iter().filter_map(|&p| rss_pss(p).ok()).collect();
        let rss = mean(&mem.iter().map(|m| m.0).collect::<Vec<_>>());
        let pss = mean(&mem.iter().map(|m| m.1).collect::<Vec<_>>());
        rows.push_str(&format!(
            "| {} | {} | {:.1} ms | {:.2} ms | {:.1} ms | {:.0} KiB | {:.0} KiB |\n",
            how.label(),
            s.wall.len(),
            p50(&s.wall),
            p50(&s.shim_cpu),
            p50(&s.tree_cpu),
            rss,
            pss
        ));
    }
    let server_mem = server_pid
        .and_then(|p| rss_pss(p).ok())
        .map(|(rss, pss)| format!("{rss:.0} KiB RSS, {pss:.0} KiB PSS"))
        .unwrap_or_else(|| "not running".into());
    let exec = &samples[Start::Exec as usize];
    let fork = &samples[Start::ForkServer as usize];
    let body = format!(
        "Measured {} ({} build of nodus, runc {}): {runs} starts of each kind after a warm-up, rounds alternating the two, every shim running `runc run --detach` of a busybox `sleep 3600` container (its state, bundle and the shim's directory on a tmpfs); \"shim CPU\" = the shim's own run time from `/proc/<pid>/schedstat` 300 ms after it reported, plus the exec'd shim's first process (which only forks it off) or the server's run time for the fork; \"with runc\" = everything the start ran, from a cgroup of the bench's own (runc's init runs in the container's cgroup and is not in it); memory with all {} shims alive. 2 cores.\n\n\
| shim started | starts | wall p50 (to created) | shim CPU p50 | with runc p50 | RSS per shim | PSS per shim |\n\
| --- | --- | --- | --- | --- | --- | --- |\n\
{rows}\n\
The fork server itself: {server_mem}. Per container the fork server saves {:.2} ms of shim CPU (p50 against p50) and {:.1} ms of wall time.\n",
        nodus_bench::today(),
        nodus_bench::build_profile(&exe),
        nodus_bench::tool_version("runc", "runc version "),
        exec.pids.len() + fork.pids.len(),
        p50(&exec.shim_cpu) - p50(&fork.shim_cpu),
        p50(&exec.wall) - p50(&fork.wall),
    );
    print!("{body}");
    drop(containers);
    drop(server);
    if let Some(path) = write {
        nodus_bench::write_section(
            &path,
            "shim-start",
            "## Starting a shim: exec vs fork server (`bash bench/shim-start.sh`)",
            &body,
        )?;
    }
    Ok(())
}
