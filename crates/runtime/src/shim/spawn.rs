//! The daemon's side of starting a shim: a detached `exe shim …` and a wait for its report.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{READY_FD_ENV, SHIM_LOG_FILE, ShimArgs, ShimError, sys};

/// How long [`spawn`] waits for the shim to report the container created.
const CREATE_TIMEOUT: Duration = Duration::from_secs(120);

/// A shim that reported its container created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnedShim {
    pub shim_pid: i32,
    pub init_pid: i32,
}

/// The one line the shim writes on the readiness pipe.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct ReadyMsg {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shim_pid: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_pid: Option<i32>,
    /// Set when the create failed (runtime errors are prefixed `create: `).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub create_failed: bool,
}

/// Starts `exe shim <args>` fully detached and waits until it reports the container
/// created (returns the pids) or failed (returns the OCI runtime's own error message).
///
/// The shim is started with `posix_spawn` (no copy of this process's page tables, which
/// a fork of the daemon made twice per container) with the readiness pipe as its stdout;
/// it then detaches itself (`sys::detach`): its first process exits at once and is reaped
/// here, the shim goes on in a session of its own with stdio on `/dev/null`, so it
/// survives the caller being killed and the caller never has to reap it. Blocking: call it
/// from a blocking-capable thread. The runtime daemon forks its shims from a
/// [`super::ForkServer`] instead, and comes here only when that is gone.
pub fn spawn(exe: &Path, args: &ShimArgs) -> Result<SpawnedShim, ShimError> {
    spawn_with(args, |wr| start_detached(exe, args, wr))
}

/// What every way of starting a shim shares: the state directory emptied of an earlier
/// shim's files, the readiness pipe, whose write end `start` hands to the new shim (and
/// drops), and the wait for the shim's report.
pub(super) fn spawn_with(
    args: &ShimArgs,
    start: impl FnOnce(OwnedFd) -> Result<(), ShimError>,
) -> Result<SpawnedShim, ShimError> {
    std::fs::create_dir_all(&args.state_dir).map_err(|e| {
        ShimError::io(
            format!("creating shim state dir {}", args.state_dir.display()),
            e,
        )
    })?;
    for stale in [
        super::INIT_PID_FILE,
        super::EXIT_FILE,
        super::SOCKET_FILE,
        super::SHIM_PID_FILE,
    ] {
        let _ = std::fs::remove_file(args.state_dir.join(stale));
    }
    let (rd, wr) = sys::pipe().map_err(|e| ShimError::io("creating the shim's ready pipe", e))?;
    // The read below sees EOF once every copy of the write end is closed: `start` drops
    // this one, the shim closes its own when it reports or dies.
    start(wr)?;

    let msg = read_ready(rd, CREATE_TIMEOUT).map_err(|e| {
        ShimError::Start(format!(
            "{e}; {}",
            log_tail(&args.state_dir.join(SHIM_LOG_FILE))
        ))
    })?;
    if let Some(err) = msg.error {
        return Err(if msg.create_failed {
            ShimError::Create(err)
        } else {
            ShimError::Start(err)
        });
    }
    match (msg.shim_pid, msg.init_pid) {
        (Some(shim_pid), Some(init_pid)) => {
            tracing::debug!(
                container = %args.id,
                shim_pid,
                init_pid,
                "shim reported the container created"
            );
            Ok(SpawnedShim { shim_pid, init_pid })
        }
        _ => Err(ShimError::Protocol(
            "shim's ready message lacks its pids".into(),
        )),
    }
}

/// `exe shim <args>` by posix_spawn, the readiness pipe as its stdout; returns once its
/// first process, which only forks the shim off (`sys::detach`), is reaped.
pub(super) fn start_detached(exe: &Path, args: &ShimArgs, wr: OwnedFd) -> Result<(), ShimError> {
    // No pre_exec closure, uid or groups: std then uses posix_spawn (a vfork that shares
    // the daemon's memory until the exec) instead of fork.
    let mut cmd = Command::new(exe);
    cmd.arg("shim")
        .args(args.to_args())
        .stdin(Stdio::null())
        .stdout(Stdio::from(wr))
        .stderr(Stdio::null())
        .env(READY_FD_ENV, "1")
        .current_dir("/");
    let mut child = cmd
        .spawn()
        .map_err(|e| ShimError::io(format!("starting {} shim", exe.display()), e))?;
    // Our copy of the pipe's write end goes with `cmd`.
    drop(cmd);
    // The first process exits right after forking the shim.
    let _ = child.wait();
    Ok(())
}

fn read_ready(rd: OwnedFd, timeout: Duration) -> Result<ReadyMsg, String> {
    sys::set_nonblocking(rd.as_raw_fd()).map_err(|e| e.to_string())?;
    let mut file = std::fs::File::from(rd);
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "no report from the shim within {}s",
                timeout.as_secs()
            ));
        }
        let mut pfd = [sys::pollfd(file.as_raw_fd(), libc::POLLIN)];
        sys::poll(&mut pfd, left.as_millis().min(i32::MAX as u128) as i32)
            .map_err(|e| format!("waiting for the shim: {e}"))?;
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.contains(&b'\n') {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading the shim's report: {e}")),
        }
    }
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    if line.is_empty() {
        return Err("the shim exited without reporting".into());
    }
    serde_json::from_slice(line).map_err(|e| format!("bad report from the shim: {e}"))
}

/// The last lines of the shim's own log, for error messages.
fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(5)..];
            format!("{}: {}", path.display(), tail.join(" | "))
        }
        Err(e) => format!("{}: {e}", path.display()),
    }
}
