//! Exec: `runc exec` of the container's own process spec with the request's command.
//!
//! Without a TTY the command's stdio are pipes to the session's streams. With a TTY, runc
//! runs in the foreground with a pseudo-terminal of ours as its stdio: runc allocates the
//! container-side terminal (so the command is a session leader with a controlling terminal
//! and ^C works), copies between the two, reports the command's exit status as its own,
//! and on SIGWINCH gives the container's terminal the size of ours — so a resize from the
//! client is `TIOCSWINSZ` on our side plus SIGWINCH to runc. (Detaching runc would leave the
//! command an orphan of a process that is not ours, whose exit status nobody could read.)
//!
//! When the client goes away before the command ends, the command is killed, like an
//! ExecSync that timed out.

use super::ExecTarget;
use super::remotecommand::{Session, TermSize};
use super::status::{Outcome, go_list};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::mpsc;

/// After the command exited, how long output still held open by its children is awaited.
const DRAIN: Duration = Duration::from_secs(2);
/// The byte a terminal reads as end-of-file; sent when the client's stdin ends.
const EOF_CHAR: u8 = 0x04;

/// Runs the command and returns how it ended.
pub(crate) async fn run(
    target: &ExecTarget,
    cmd: &[String],
    tty: bool,
    s: &mut Session,
) -> Outcome {
    let dir = match tempfile::Builder::new()
        .prefix("exec-")
        .tempdir_in(&target.scratch_dir)
    {
        Ok(d) => d,
        Err(e) => return Outcome::Error(format!("creating the exec scratch directory: {e}")),
    };
    let pjson = dir.path().join("process.json");
    if let Err(e) = std::fs::write(&pjson, target.process.to_string()) {
        return Outcome::Error(format!("writing {}: {e}", pjson.display()));
    }
    let pid_file = dir.path().join("pid");
    let log = dir.path().join("runtime.log");
    let mut c = Command::new(&target.runtime.binary);
    c.args(target.runtime.global_args())
        .arg("--log")
        .arg(&log)
        .arg("--log-format")
        .arg("json")
        .arg("exec")
        .arg("--pid-file")
        .arg(&pid_file)
        .arg("--process")
        .arg(&pjson)
        .arg(&target.container_id);
    tracing::info!(
        container = %target.container_id,
        cmd = ?cmd,
        tty,
        "exec session starting"
    );
    let status = if tty {
        run_tty(c, &pid_file, s).await
    } else {
        run_pipes(c, &pid_file, s).await
    };
    let status = match status {
        Ok(st) => st,
        Err(e) => return Outcome::Error(format!("failed to exec in container: {e}")),
    };
    use std::os::unix::process::ExitStatusExt as _;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1);
    // runc's own failures (no such binary, container gone) are logged at error level; a
    // command that merely exited non-zero leaves no error there.
    if code != 0
        && let Some(msg) = runtime_error(&log)
    {
        return Outcome::Error(format!(
            "failed to exec in container: OCI runtime exec failed: {msg}"
        ));
    }
    tracing::info!(container = %target.container_id, exit_code = code, "exec session ended");
    if code == 0 {
        Outcome::Success
    } else {
        Outcome::ExitCode {
            code,
            message: format!("error executing command {}, exit code {code}", go_list(cmd)),
        }
    }
}

/// The error-level messages of runc's JSON log, if any.
fn runtime_error(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let msgs: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| matches!(v["level"].as_str(), Some("error" | "fatal")))
        .filter_map(|v| v["msg"].as_str().map(str::to_string))
        .collect();
    (!msgs.is_empty()).then(|| msgs.join("; "))
}

fn kill_command(pid_file: &Path) {
    if let Some(pid) = std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
        .filter(|p| *p > 0)
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

async fn run_pipes(
    mut c: Command,
    pid_file: &Path,
    s: &mut Session,
) -> io::Result<std::process::ExitStatus> {
    c.stdin(if s.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(if s.stdout.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stderr(if s.stderr.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = c.spawn()?;
    let mut pumps = Vec::new();
    if let (Some(mut w), Some(mut rx)) = (child.stdin.take(), s.stdin.take()) {
        tokio::spawn(async move {
            while let Some(chunk) = rx.recv().await {
                if w.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            // Dropping the pipe is the command's end of input.
        });
    }
    if let (Some(mut r), Some(out)) = (child.stdout.take(), s.stdout.clone()) {
        pumps.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 || out.write(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }));
    }
    if let (Some(mut r), Some(out)) = (child.stderr.take(), s.stderr.clone()) {
        pumps.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 || out.write(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }));
    }
    // Resizes mean nothing without a terminal; keep the channel drained.
    if let Some(mut rx) = s.resize.take() {
        tokio::spawn(async move { while rx.recv().await.is_some() {} });
    }
    let status = tokio::select! {
        st = child.wait() => st?,
        _ = s.disconnected() => {
            kill_command(pid_file);
            child.wait().await?
        }
    };
    let _ = tokio::time::timeout(DRAIN, futures::future::join_all(pumps)).await;
    Ok(status)
}

/// A pseudo-terminal pair: the master stays here, the slave becomes runc's stdio.
fn open_pty() -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: plain open(2) of a constant path; the result is checked.
    let master = unsafe {
        libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if master < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `master` was just opened and is owned by nobody else.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    // SAFETY: unlockpt and TIOCGPTPEER take the master descriptor and plain flags.
    let slave = unsafe {
        if libc::unlockpt(master.as_raw_fd()) != 0 {
            return Err(io::Error::last_os_error());
        }
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if slave < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: TIOCGPTPEER returned a new descriptor that nobody else owns.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    // Raw from the start, so input sent before runc takes over is not echoed or edited
    // here (the container's terminal does that).
    // SAFETY: termios is plain data filled by tcgetattr on a valid terminal descriptor.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(slave.as_raw_fd(), &mut t) == 0 {
            libc::cfmakeraw(&mut t);
            libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &t);
        }
    }
    Ok((master, slave))
}

fn set_winsize(fd: RawFd, size: TermSize) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.height,
        ws_col: size.width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize structure, which `ws` is.
    if unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

async fn write_all_fd(fd: &AsyncFd<OwnedFd>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        let mut guard = fd.writable().await?;
        match guard.try_io(|inner| {
            // SAFETY: `data` is valid for reads of its length.
            let n = unsafe {
                libc::write(
                    inner.get_ref().as_raw_fd(),
                    data.as_ptr().cast(),
                    data.len(),
                )
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        }) {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

async fn read_fd(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|inner| {
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe {
                libc::read(
                    inner.get_ref().as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        }) {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

async fn run_tty(
    mut c: Command,
    pid_file: &Path,
    s: &mut Session,
) -> io::Result<std::process::ExitStatus> {
    let (master, slave) = open_pty()?;
    c.stdin(Stdio::from(slave.try_clone()?))
        .stdout(Stdio::from(slave.try_clone()?))
        .stderr(Stdio::from(slave));
    // SAFETY: setsid is async-signal-safe; runc gets a session of its own, away from the
    // daemon's process group and its signals.
    unsafe {
        c.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = c.spawn()?;
    // The Command still holds the slave copies until it is dropped.
    drop(c);
    let runc_pid = child.id();
    // SAFETY: the OwnedFd is moved into the AsyncFd and stays open, the same descriptor,
    // for as long as the AsyncFd lives.
    let master = std::sync::Arc::new(unsafe { AsyncFd::register(master) }?);

    // Output: until every holder of the slave (runc) has gone, then EIO.
    let out = s.stdout.clone();
    let m = std::sync::Arc::clone(&master);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match read_fd(&m, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Some(o) = &out
                        && o.write(&buf[..n]).await.is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    // Input, then ^D when the client's stdin ends.
    if let Some(mut rx) = s.stdin.take() {
        let m = std::sync::Arc::clone(&master);
        tokio::spawn(async move {
            while let Some(chunk) = rx.recv().await {
                if write_all_fd(&m, &chunk).await.is_err() {
                    return;
                }
            }
            let _ = write_all_fd(&m, &[EOF_CHAR]).await;
        });
    }
    if let Some(rx) = s.resize.take() {
        tokio::spawn(resize_loop(std::sync::Arc::clone(&master), rx, runc_pid));
    }
    let status = tokio::select! {
        st = child.wait() => st?,
        _ = s.disconnected() => {
            kill_command(pid_file);
            child.wait().await?
        }
    };
    let _ = tokio::time::timeout(DRAIN, reader).await;
    Ok(status)
}

async fn resize_loop(
    master: std::sync::Arc<AsyncFd<OwnedFd>>,
    mut sizes: mpsc::Receiver<TermSize>,
    runc_pid: Option<u32>,
) {
    while let Some(size) = sizes.recv().await {
        if size.width == 0 || size.height == 0 {
            continue;
        }
        if set_winsize(master.as_raw_fd(), size).is_err() {
            return;
        }
        if let Some(pid) = runc_pid {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGWINCH,
            );
        }
    }
}
