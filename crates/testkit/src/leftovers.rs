//! What a runtime under test leaves behind when its daemon is killed: shims, containers,
//! pid-namespace inits, OCI runtime state and mounts — cleaned up by the pids and paths
//! they recorded, for tests and benchmarks alike.

use std::path::{Path, PathBuf};
use std::process::Command;

fn list_dir(p: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(p)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Kills every shim and container a runtime with state dir `state` started (by the pids
/// they recorded), pid-namespace inits and OCI runtime state, and unmounts everything under
/// `base`.
pub fn kill_runtime_leftovers(state: &Path, base: &Path) {
    let kill = |pidfile: PathBuf| {
        if let Some(pid) = std::fs::read_to_string(pidfile)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    };
    for c in list_dir(&state.join("containers")) {
        kill(c.join("shim/shim.pid"));
        kill(c.join("shim/init.pid"));
        if let Some(id) = c.file_name().and_then(|n| n.to_str()) {
            for root in list_dir(&state.join("oci")) {
                // gVisor's state is runsc's own: runc cannot delete its sandboxes.
                let bin = if root.ends_with("runsc") {
                    "runsc"
                } else {
                    "runc"
                };
                let _ = Command::new(bin)
                    .arg("--root")
                    .arg(&root)
                    .args(["delete", "--force", id])
                    .output();
            }
        }
    }
    for sb in list_dir(&state.join("sandboxes")) {
        kill(sb.join("ns/pid-init"));
    }
    for m in crate::containerd::mounts_under(base) {
        let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// What pods left mounted under a runtime's directory `dir`: every mount point below it, except
/// the runtime's own, which stay while the daemon runs and are looked into rather than
/// reported themselves: the state dir's tmpfs (`<dir>/state`, as `/run` is), the pin root
/// (`<state>/sandboxes`, one shared mount point, as `/run/netns` is) and the private
/// directory pods' mount namespaces are pinned in (`<state>/mntns`).
pub fn pod_mounts_under(dir: &Path) -> Vec<PathBuf> {
    let state = dir.join("state");
    let own = [state.join("sandboxes"), state.join("mntns")];
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for m in crate::containerd::mounts_under(&d) {
            if m == state || own.contains(&m) {
                // The listing stops at a mount point: look below the runtime's own.
                todo.extend(list_dir(&m));
            } else {
                out.push(m);
            }
        }
    }
    out
}
