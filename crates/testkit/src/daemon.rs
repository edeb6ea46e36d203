//! Child daemons started by fixtures: logged to a file, killed by PID on drop.
//!
//! Every daemon is spawned from one long-lived helper thread with `PR_SET_PDEATHSIG =
//! SIGKILL`, so the kernel kills it when the test process exits even if no destructor runs
//! (for example a fixture kept in a `static`, or a test binary killed by a timeout). Spawning
//! from the test's own thread would not do: the death signal follows the spawning *thread*,
//! and each test runs on a thread of its own.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// A running child process whose stdout and stderr go to a log file.
///
/// Dropping it sends SIGTERM to its PID, waits up to the grace period given at
/// [`Daemon::spawn`], then sends SIGKILL and reaps it.
#[derive(Debug)]
pub struct Daemon {
    name: String,
    child: Child,
    log: PathBuf,
    grace: Duration,
    stopped: bool,
}

struct SpawnRequest {
    cmd: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for mut req in rx {
                    let _ = req.reply.send(req.cmd.spawn());
                }
            })
            .expect("start the testkit spawner thread");
        tx
    })
}

impl Daemon {
    /// Starts `cmd` with stdin closed and stdout/stderr appended to `log`.
    ///
    /// `name` is used in error messages; `grace` is how long [`Daemon::stop`] waits after
    /// SIGTERM before SIGKILL.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path, grace: Duration) -> Result<Daemon> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open log file {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: prctl is async-signal-safe and touches only the child.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let program = cmd.get_program().to_string_lossy().into_owned();
        let (tx, rx) = mpsc::channel();
        spawner()
            .send(SpawnRequest { cmd, reply: tx })
            .map_err(|_| anyhow::anyhow!("testkit spawner thread is gone"))?;
        let child = rx
            .recv()
            .context("testkit spawner thread did not answer")?
            .with_context(|| format!("spawn {name} ({program})"))?;
        Ok(Daemon {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            grace,
            stopped: false,
        })
    }

    /// The daemon's process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Path of the log file holding the daemon's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the log file (best effort; empty if unreadable).
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// Whether the process is still running (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        !self.stopped && matches!(self.child.try_wait(), Ok(None))
    }

    /// Polls `ready` every 50 ms until it returns `Ok(true)`, failing if the daemon exits or
    /// `timeout` passes. Errors carry the last lines of the daemon's log.
    pub fn wait_ready(&mut self, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                self.stopped = true;
                return Err(self.failure(&format!("exited during startup ({status})")));
            }
            if Instant::now() >= deadline {
                return Err(self.failure(&format!("not ready after {timeout:?}")));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// An error saying what went wrong with the daemon, with the last lines of its log.
    fn failure(&self, what: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "{} {what}; last log lines from {}:\n{}",
            self.name,
            self.log.display(),
            self.log_tail(30)
        )
    }

    /// Waits up to `timeout` for the process to exit on its own and reaps it; an error (with
    /// the log's last lines) if it is still running then.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.stopped = true;
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(self.failure(&format!("still running after {timeout:?}")));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, wait up to the grace period, SIGKILL, reap. Idempotent.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + self.grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a text file (reads at most the final 64 KiB).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(64 * 1024);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_logs_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("d.log");
        let mut cmd = Command::new("/bin/busybox");
        cmd.args(["sh", "-c", "echo hello-from-daemon; exec sleep 60"]);
        let mut d = Daemon::spawn("sleeper", cmd, &log, Duration::from_secs(2)).unwrap();
        d.wait_ready(Duration::from_secs(5), || {
            log_tail(&log, 5).contains("hello-from-daemon")
        })
        .unwrap();
        assert!(d.is_running());
        let pid = d.pid();
        drop(d);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists() || {
                // A recycled PID would be a different process; ours must not be a zombie child.
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                !stat.contains("(sleep)")
            }
        );
    }

    #[test]
    fn early_exit_reports_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("d.log");
        let mut cmd = Command::new("/bin/busybox");
        cmd.args(["sh", "-c", "echo boom-failure >&2; exit 3"]);
        let mut d = Daemon::spawn("failer", cmd, &log, Duration::from_secs(1)).unwrap();
        let err = d.wait_ready(Duration::from_secs(5), || false).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("boom-failure"), "{msg}");
        assert!(msg.contains("exited"), "{msg}");
    }
}
