//! The CPU time of a whole process tree, read from a cgroup of the bench's own: a daemon
//! put in it at start takes every process it later starts (shims, runc, CNI plugins,
//! iptables), and their CPU stays counted after they exit — which `/proc/<pid>/stat` of
//! the daemon alone cannot give. cgroup v1's `cpuacct` hierarchy or a v2 cgroup.

use anyhow::{Context, Result};
use std::path::PathBuf;

pub struct TreeCpu {
    dir: PathBuf,
    v2: bool,
    /// Made by the bench (and removed on drop), or another's cgroup it only reads.
    owned: bool,
}

fn root() -> (PathBuf, bool) {
    let v1 = PathBuf::from("/sys/fs/cgroup/cpuacct");
    if v1.join("cpuacct.usage").exists() {
        (v1, false)
    } else {
        (PathBuf::from("/sys/fs/cgroup"), true)
    }
}

impl TreeCpu {
    /// A new empty cgroup `name-<bench pid>` under the root.
    pub fn new(name: &str) -> Result<TreeCpu> {
        let (root, v2) = root();
        let dir = root.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        Ok(TreeCpu {
            dir,
            v2,
            owned: true,
        })
    }

    /// The cgroup at `path` (as a runtime's `cgroupsPath` or a kubelet's `--cgroup-root`
    /// names it, from the hierarchy's root), made by someone else: read, never removed. A
    /// cgroup that does not exist (yet) reads as 0.
    pub fn open(path: &str) -> TreeCpu {
        let (root, v2) = root();
        TreeCpu {
            dir: root.join(path.trim_start_matches('/')),
            v2,
            owned: false,
        }
    }

    /// Makes `cmd`'s process join the cgroup before it runs the program, so nothing it
    /// does (nor any process it starts) escapes the count — a process moved in after
    /// `spawn` may already have forked.
    pub fn join_on_exec(&self, cmd: &mut std::process::Command) -> Result<()> {
        use std::os::unix::process::CommandExt as _;
        let procs = std::ffi::CString::new(
            self.dir
                .join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )?;
        // SAFETY: the closure runs between fork and exec and calls only open, write and
        // close, which are async-signal-safe, on memory allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process itself.
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
                Ok(())
            });
        }
        Ok(())
    }

    /// Moves `pid` (and so every process it starts from now on) into the cgroup.
    pub fn add(&self, pid: u32) -> Result<()> {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .with_context(|| format!("write {pid} to {}", procs.display()))
    }

    /// User + system CPU of everything that has run in the cgroup, in milliseconds.
    pub fn ms(&self) -> f64 {
        if self.v2 {
            std::fs::read_to_string(self.dir.join("cpu.stat"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("usage_usec "))
                        .and_then(|v| v.trim().parse::<f64>().ok())
                })
                .map_or(0.0, |us| us / 1e3)
        } else {
            std::fs::read_to_string(self.dir.join("cpuacct.usage"))
                .ok()
                .and_then(|s| s.trim().parse::<f64>().ok())
                .map_or(0.0, |ns| ns / 1e6)
        }
    }
}

impl Drop for TreeCpu {
    /// Hands any process still inside back to the root cgroup, then removes the cgroup.
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let (Ok(procs), Some(root)) = (
            std::fs::read_to_string(self.dir.join("cgroup.procs")),
            self.dir.parent(),
        ) {
            for pid in procs.lines() {
                let _ = std::fs::write(root.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
