//! The shims' fork server: one `nodus shim-fork-server` process, started once by the
//! runtime daemon, that forks a shim for each container where the daemon would otherwise
//! exec the nodus binary anew.
//!
//! Why: an exec of the (large, position-independent) nodus binary costs each shim about
//! 3 ms of CPU before it does anything — page faults and relocations of the binary, and
//! glibc's start-up probing of the CPU (`cpuid`, which traps to the hypervisor on a
//! virtual machine). A fork of a small single-threaded process that is already past all of
//! that shares its pages instead; the shim only copies what it writes.
//!
//! The server is the daemon's child, with its end of a `SOCK_SEQPACKET` pair as stdin. A
//! request is one message: the shim's arguments as `nodus shim` takes them
//! ([`ShimArgs::to_args`]), each ended by a NUL, with the readiness pipe's write end
//! attached (SCM_RIGHTS). There is no answer on the socket: the forked shim reports on the
//! pipe exactly as one started by [`super::spawn`] does, and a request the server cannot
//! act on is answered there with the error. The server exits when the daemon's end closes.
//!
//! A forked shim calls `setsid` and puts `/dev/null` on stdin (the request socket), as a
//! detached `nodus shim` does; it writes the command line of `nodus shim <args>` over the
//! server's (started with room for it), so `ps` names its container. The server ignores SIGCHLD, so the kernel reaps the shims it
//! outlives; when it dies first they are re-parented as a detached shim is. The daemon
//! starts a new server when a request finds the old one gone, and execs the shim as before
//! when even that fails.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Mutex;

use super::server::{self, Ready};
use super::spawn::{self, ReadyMsg};
use super::{ShimArgs, ShimError, SpawnedShim, sys};

/// The first argument that makes `nodus` the fork server.
pub const FORK_SERVER_ARG: &str = "shim-fork-server";

/// Bytes of command line the server is started with (one argument of spaces): the room a
/// forked shim writes its own command line into.
const CMDLINE_ROOM: usize = 4096;

/// The longest request the server reads; arguments are paths and an id, a few hundred bytes.
const MAX_REQUEST: usize = 64 * 1024;

/// The daemon's side: starts shims through the fork server, starting the server when there
/// is none (lazily, and again when one died).
pub struct ForkServer {
    exe: PathBuf,
    running: Mutex<Option<Running>>,
}

/// A live server: its process and the daemon's end of the request socket.
struct Running {
    child: Child,
    sock: OwnedFd,
}

impl Running {
    fn start(exe: &Path) -> std::io::Result<Running> {
        let (ours, theirs) = sys::seqpacket_pair()?;
        // posix_spawn (no pre_exec): the server's end becomes its stdin, which clears
        // close-on-exec on it and on nothing else.
        let child = Command::new(exe)
            .arg(FORK_SERVER_ARG)
            .arg(" ".repeat(CMDLINE_ROOM))
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .current_dir("/")
            .spawn()?;
        tracing::debug!(pid = child.id(), "started the shims' fork server");
        Ok(Running { child, sock: ours })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Only the server: its shims are in sessions of their own and carry on.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ForkServer {
    /// A fork server of `exe` (the nodus binary); its process starts with the first shim.
    pub fn new(exe: PathBuf) -> ForkServer {
        ForkServer {
            exe,
            running: Mutex::new(None),
        }
    }

    /// As [`super::spawn`]: starts the shim (forked by the server) and waits for its report.
    /// Blocking: call it from a blocking-capable thread.
    pub fn spawn(&self, args: &ShimArgs) -> Result<SpawnedShim, ShimError> {
        spawn::spawn_with(args, |wr| self.start(args, wr))
    }

    /// The pid of the server process, if one is running.
    pub fn server_pid(&self) -> Option<u32> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.as_ref().map(|r| r.child.id())
    }

    fn start(&self, args: &ShimArgs, wr: OwnedFd) -> Result<(), ShimError> {
        let request = encode(args);
        {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            // The server in place, then one started anew if that one is gone.
            for _ in 0..2 {
                let r = match running.as_ref() {
                    Some(r) => r,
                    None => match Running::start(&self.exe) {
                        Ok(r) => running.insert(r),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot start the shims' fork server; starting the shim by exec");
                            break;
                        }
                    },
                };
                // Once the request is sent the server owns the shim's start: a server that
                // dies before forking closes its copy of the pipe, which the caller reads as
                // a shim that never reported — never a second shim for the same container.
                match sys::send_with_fd(r.sock.as_raw_fd(), &request, wr.as_raw_fd()) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        tracing::warn!(error = %e, "the shims' fork server is gone; starting another");
                        running.take();
                    }
                }
            }
        }
        spawn::start_detached(&self.exe, args, wr)
    }
}

/// A request: each argument after `shim`, ended by a NUL.
fn encode(args: &ShimArgs) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    for a in args.to_args() {
        out.extend_from_slice(a.as_bytes());
        out.push(0);
    }
    out
}

fn decode(request: &[u8]) -> Vec<OsString> {
    let body = request.strip_suffix(&[0]).unwrap_or(request);
    if body.is_empty() {
        return Vec::new();
    }
    body.split(|&b| b == 0)
        .map(|a| OsString::from_vec(a.to_vec()))
        .collect()
}

/// The body of `nodus shim-fork-server`: serves requests on stdin until the daemon's end
/// closes. It must stay single-threaded (a fork copies only the calling thread) and
/// small (every shim starts as a copy of it).
pub fn serve() -> ExitCode {
    // SAFETY: installing SIG_IGN has no preconditions. The kernel then reaps the shims
    // this process outlives; each shim puts the default back before it runs anything.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_IGN);
    }
    // Once for all its shims, which have the same mappings (the shim drops these pages
    // once its container runs).
    sys::remember_clean_file_mappings();
    let argv0 = std::env::args_os()
        .next()
        .unwrap_or_else(|| OsString::from("nodus"));
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let got = match sys::recv_with_fd(0, &mut buf) {
            Ok(got) => got,
            Err(_) => return ExitCode::FAILURE,
        };
        let Some(ready) = got.fd else {
            if got.len == 0 {
                // The daemon's end is closed: the daemon is gone.
                return ExitCode::SUCCESS;
            }
            continue;
        };
        if got.truncated {
            refuse(
                ready,
                format!("shim request longer than {MAX_REQUEST} bytes"),
            );
            continue;
        }
        let argv = decode(&buf[..got.len]);
        let args = match super::parse_args(std::iter::once(OsString::from("shim")).chain(argv)) {
            Ok(args) => args,
            Err(e) => {
                refuse(ready, format!("bad shim arguments: {e}"));
                continue;
            }
        };
        let mut cmdline = argv0.as_bytes().to_vec();
        cmdline.extend_from_slice(b"\0shim\0");
        cmdline.extend_from_slice(&buf[..got.len]);
        // SAFETY: this process is single-threaded, so the child is a complete copy of it;
        // the child never returns into this loop (`shim_child` exits).
        match unsafe { libc::fork() } {
            -1 => refuse(
                ready,
                format!("fork of the shim: {}", std::io::Error::last_os_error()),
            ),
            0 => shim_child(args, ready, cmdline),
            _ => drop(ready),
        }
    }
}

/// A forked shim: what `nodus shim` would be after detaching, then the shim itself.
fn shim_child(args: ShimArgs, ready: OwnedFd, cmdline: Vec<u8>) -> ! {
    // SAFETY: plain calls on this process's own signal disposition, descriptors and
    // session; the fork made this process the only user of all of them.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        // The request socket is the daemon's business, not the shim's.
        if let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            libc::dup2(null.as_raw_fd(), 0);
        }
        libc::setsid();
    }
    // Best effort: a shim that shows the server's command line still works.
    let _ = sys::set_cmdline(&cmdline);
    let ok = server::run(args, Ready::from_fd(ready));
    std::process::exit(if ok { 0 } else { 1 })
}

/// Answers a request on its readiness pipe with `error`, as a shim that failed to start.
fn refuse(ready: OwnedFd, error: String) {
    let msg = ReadyMsg {
        error: Some(error),
        ..ReadyMsg::default()
    };
    let mut line = serde_json::to_vec(&msg).unwrap_or_default();
    line.push(b'\n');
    let _ = std::fs::File::from(ready).write_all(&line);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_the_shims_arguments_and_nothing_else() {
        let args = ShimArgs {
            id: "c1".into(),
            bundle: "/b".into(),
            runtime: "runc".into(),
            runtime_root: "/run/r".into(),
            state_dir: "/s".into(),
            log_path: Some("/var/log/pods/x/0.log".into()),
            tty: true,
            start: true,
            runtime_args: vec!["--network=host".into(), String::new()],
            ..ShimArgs::default()
        };
        let request = encode(&args);
        assert_eq!(request.last(), Some(&0));
        let argv = decode(&request);
        assert_eq!(argv, args.to_args());
        let parsed =
            super::super::parse_args(std::iter::once(OsString::from("shim")).chain(argv)).unwrap();
        assert_eq!(parsed, args);
        assert!(decode(&[]).is_empty());
        assert!(
            super::super::parse_args(["shim", "--bogus"]).is_err(),
            "an unknown flag is refused"
        );
    }
}
