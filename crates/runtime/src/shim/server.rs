//! The shim process itself: single-threaded, one `poll(2)` loop over the container's
//! output, its stdin, a signalfd for SIGCHLD, the control socket and its clients.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::Utc;
use nix::errno::Errno;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};

use super::cgroup::OomProbe;
use super::crilog::{self, CriLog, LineSplitter, Stream, Tag};
use super::protocol::{self, FrameKind, Request};
use super::spawn::ReadyMsg;
use super::{
    EXIT_FILE, ExitStatus, INIT_PID_FILE, InitStatus, READY_FD_ENV, RUNTIME_LOG_FILE,
    SHIM_LOG_FILE, SHIM_PID_FILE, SOCKET_FILE, ShimArgs, ShimError, ShimState, sys,
};

/// Bytes read from the container per read call.
const READ_CHUNK: usize = 32 * 1024;
/// Output queued for one attached client before its frames are dropped.
const CLIENT_BUF_MAX: usize = 256 * 1024;
/// Stdin queued for the container before clients stop being read.
const STDIN_BUF_MAX: usize = 64 * 1024;
/// After the init exited, how long output may stay silent before the shim stops waiting
/// for EOF (a process outside the container's pid namespace may hold the pipes).
const DRAIN_IDLE: Duration = Duration::from_secs(2);
/// How long attached clients get to read the last output and the exit frame.
const CLIENT_FLUSH: Duration = Duration::from_secs(1);
/// The terminal's EOF character, sent to close stdin on a TTY.
const VEOF: u8 = 0x04;

/// The shim's own log: one line per event, appended to `<state>/shim.log`.
struct ShimLog(Option<File>);

impl ShimLog {
    fn open(path: &Path) -> ShimLog {
        ShimLog(File::options().create(true).append(true).open(path).ok())
    }

    fn event(&self, args: fmt::Arguments<'_>) {
        if let Some(mut f) = self.0.as_ref() {
            let line = format!("{} {args}\n", crilog::rfc3339_nano(Utc::now()));
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// The readiness pipe to [`super::spawn`], when there is one.
pub(super) struct Ready(Option<File>);

impl Ready {
    /// The pipe a fork server received with the request (already close-on-exec).
    pub(super) fn from_fd(fd: OwnedFd) -> Ready {
        Ready(Some(File::from(fd)))
    }

    /// The pipe named by the environment, as `spawn` passes it to `nodus shim`.
    pub(super) fn from_env() -> Ready {
        let fd = std::env::var(READY_FD_ENV)
            .ok()
            .and_then(|v| v.parse::<RawFd>().ok())
            .filter(|&fd| fd >= 0);
        let Some(fd) = fd else {
            return Ready(None);
        };
        // `spawn` hands the pipe over as a standard stream (what posix_spawn can pass):
        // moved out of the way, with /dev/null put back in its place.
        if fd <= 2 {
            return Ready(sys::take_std_fd(fd).ok().map(File::from));
        }
        // Not inherited by runc or the container; also proves the descriptor is open.
        if sys::set_cloexec(fd, true).is_err() {
            return Ready(None);
        }
        // SAFETY: the descriptor was handed to this process by `spawn` for this purpose
        // and nothing else in the process owns it.
        Ready(Some(unsafe { File::from_raw_fd(fd) }))
    }

    fn send(&mut self, msg: &ReadyMsg) {
        if let Some(mut f) = self.0.take() {
            let mut line = serde_json::to_vec(msg).unwrap_or_default();
            line.push(b'\n');
            let _ = f.write_all(&line);
        }
    }
}

/// Runs the shim to the end, reporting on `ready`; false when the container could not be
/// created.
pub(super) fn run(args: ShimArgs, mut ready: Ready) -> bool {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let absolute = |p: &Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            cwd.join(p)
        }
    };
    let state_dir = absolute(&args.state_dir);
    let _ = std::fs::create_dir_all(&state_dir);
    let log = ShimLog::open(&state_dir.join(SHIM_LOG_FILE));
    log.event(format_args!(
        "event=start id={} pid={} tty={} stdin={} stdin_once={}",
        args.id,
        std::process::id(),
        args.tty,
        args.stdin,
        args.stdin_once
    ));
    let args = ShimArgs {
        bundle: absolute(&args.bundle),
        runtime_root: absolute(&args.runtime_root),
        // A bare name is looked up on PATH; a relative path is made absolute (runc runs
        // in the bundle directory).
        runtime: if args.runtime.components().count() > 1 {
            absolute(&args.runtime)
        } else {
            args.runtime.clone()
        },
        log_path: args
            .log_path
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
            .map(|p| absolute(p)),
        state_dir,
        ..args
    };
    match Shim::setup(&args, log) {
        Ok(mut shim) => {
            shim.log.event(format_args!(
                "event=created id={} init_pid={}",
                args.id, shim.init_pid
            ));
            ready.send(&ReadyMsg {
                shim_pid: Some(std::process::id() as i32),
                init_pid: Some(shim.init_pid),
                ..ReadyMsg::default()
            });
            sys::trim_file_rss();
            shim.run_loop();
            shim.finish();
            true
        }
        Err((log, err)) => {
            log.event(format_args!(
                "event=create_failed id={} error={err:?}",
                args.id
            ));
            let create_failed = matches!(err, ShimError::Create(_));
            let error = match err {
                ShimError::Create(msg) => msg,
                other => other.to_string(),
            };
            ready.send(&ReadyMsg {
                error: Some(error),
                create_failed,
                ..ReadyMsg::default()
            });
            let _ = std::fs::remove_file(args.state_dir.join(SOCKET_FILE));
            false
        }
    }
}

/// Replaces `path` by rename, so that the daemon never reads half a file. Not synced: the
/// shim's pid and its container's exit describe processes a host crash ends too (after a
/// reboot the daemon finds the container gone, as containerd does), a daemon crash leaves
/// them in the page cache, and the runtime's default state dir (under `/run`) is a tmpfs on
/// most hosts anyway.
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    drop(f);
    std::fs::rename(&tmp, path)
}

struct Output {
    fd: Option<OwnedFd>,
    stream: Stream,
    split: LineSplitter,
}

#[derive(Default)]
struct Attach {
    stdin: bool,
    stdin_done: bool,
}

struct Client {
    stream: UnixStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    wpos: usize,
    attach: Option<Attach>,
    read_eof: bool,
    close_after_flush: bool,
    dead: bool,
    dropping: bool,
}

impl Client {
    fn pending(&self) -> usize {
        self.wbuf.len() - self.wpos
    }

    fn flush(&mut self) {
        while self.pending() > 0 && !self.dead {
            match self.stream.write(&self.wbuf[self.wpos..]) {
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.dead = true,
            }
        }
        if self.pending() == 0 {
            self.wbuf.clear();
            self.wpos = 0;
            if self.wbuf.capacity() > CLIENT_BUF_MAX {
                self.wbuf = Vec::new();
            }
            if self.close_after_flush {
                self.dead = true;
            }
        } else if self.wpos > CLIENT_BUF_MAX / 2 {
            self.wbuf.drain(..self.wpos);
            self.wpos = 0;
        }
    }

    fn respond(&mut self, line: &str) {
        self.wbuf.extend_from_slice(line.as_bytes());
        self.wbuf.push(b'\n');
    }
}

struct Shim {
    id: String,
    state_dir: PathBuf,
    log: ShimLog,
    has_stdin: bool,
    stdin_once: bool,
    cri: Option<CriLog>,
    cri_failing: bool,
    outputs: Vec<Output>,
    /// The container's stdin: the pipe's write end, or a dup of the pty master.
    stdin: Option<OwnedFd>,
    stdin_buf: Vec<u8>,
    /// No more stdin is accepted; the fd closes once `stdin_buf` is written.
    stdin_closing: bool,
    stdin_once_fired: bool,
    pty: Option<OwnedFd>,
    listener: UnixListener,
    clients: Vec<Client>,
    sigfd: OwnedFd,
    /// Other threads exist (the shim was started from a threaded process): SIGCHLD may be
    /// taken by one of them, so children are also reaped on a timer.
    threaded: bool,
    init_pid: i32,
    oom: OomProbe,
    exit: Option<ExitStatus>,
    exit_seen: Option<Instant>,
    last_output: Instant,
    buf: Vec<u8>,
}

type SetupError = (ShimLog, ShimError);

impl Shim {
    fn setup(args: &ShimArgs, log: ShimLog) -> Result<Shim, SetupError> {
        macro_rules! tri {
            ($e:expr, $ctx:expr) => {
                match $e {
                    Ok(v) => v,
                    Err(e) => return Err((log, ShimError::io($ctx, e))),
                }
            };
        }
        let state = &args.state_dir;
        // Before anything else, while the shim is one thread (setns of a mount namespace
        // needs that): the OCI runtime it runs must see the pod's mounts.
        if let Some(ns) = &args.mount_ns {
            tri!(
                crate::sandbox::mountns::enter(ns),
                format!("entering the pod's mount namespace {}", ns.display())
            );
        }
        tri!(
            write_atomic(
                &state.join(SHIM_PID_FILE),
                std::process::id().to_string().as_bytes()
            ),
            "writing shim.pid"
        );
        sys::ignore_sigpipe();
        tri!(sys::set_child_subreaper(), "prctl(PR_SET_CHILD_SUBREAPER)");
        let sigfd = tri!(sys::sigchld_fd(), "creating the SIGCHLD signalfd");
        let threads = sys::thread_count();
        if threads != 1 {
            log.event(format_args!(
                "event=warning threads={threads} note=\"the shim should run single-threaded; reaping on a 1s timer\""
            ));
        }

        let sock_path = state.join(SOCKET_FILE);
        let _ = std::fs::remove_file(&sock_path);
        let listener = tri!(
            sys::bind_unix(&sock_path),
            format!("binding the control socket {}", sock_path.display())
        );
        tri!(listener.set_nonblocking(true), "control socket nonblocking");

        let oom = match &args.oom_file {
            Some(f) => OomProbe::for_file(Some(f.clone())),
            None => OomProbe::for_bundle(&args.bundle, &args.id),
        };
        log.event(format_args!(
            "event=oom_probe file={} parent={}",
            oom.file
                .as_ref()
                .map(|f| f.display().to_string())
                .unwrap_or_else(|| "none".into()),
            oom.parent
                .as_ref()
                .map(|(f, n)| format!("{}:{n}", f.display()))
                .unwrap_or_else(|| "none".into())
        ));
        let cri = match &args.log_path {
            Some(p) => Some(tri!(
                CriLog::open(p),
                format!("opening the container log {}", p.display())
            )),
            None => None,
        };

        // The container's stdio, and runc's.
        let mut cmd = Command::new(&args.runtime);
        cmd.arg("--root").arg(&args.runtime_root);
        if args.systemd_cgroup {
            cmd.arg("--systemd-cgroup");
        }
        cmd.args(&args.runtime_args);
        cmd.arg("--log")
            .arg(state.join(RUNTIME_LOG_FILE))
            .arg("--log-format")
            .arg("json");
        if args.start {
            cmd.arg("run").arg("--detach");
        } else {
            cmd.arg("create");
        }
        cmd.arg("--bundle")
            .arg(&args.bundle)
            .arg("--pid-file")
            .arg(state.join(INIT_PID_FILE));
        let _ = std::fs::remove_file(state.join(RUNTIME_LOG_FILE));
        let mut console: Option<(UnixListener, Option<tempfile::TempDir>)> = None;
        let mut outputs = Vec::new();
        let mut stdin_w = None;
        let errors_r;
        if args.tty {
            let mut path = state.join("console.sock");
            let mut tmp = None;
            if path.as_os_str().len() > 100 {
                let dir = tri!(
                    tempfile::Builder::new().prefix("nodus-console-").tempdir(),
                    "creating a console socket dir"
                );
                path = dir.path().join("c.sock");
                tmp = Some(dir);
            }
            let _ = std::fs::remove_file(&path);
            let l = tri!(
                UnixListener::bind(&path),
                format!("binding console socket {}", path.display())
            );
            cmd.arg("--console-socket").arg(&path);
            console = Some((l, tmp));
            let (r, w) = tri!(sys::pipe(), "creating a pipe");
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(w));
            errors_r = r;
        } else {
            let (out_r, out_w) = tri!(sys::pipe(), "creating the stdout pipe");
            let (err_r, err_w) = tri!(sys::pipe(), "creating the stderr pipe");
            if args.stdin {
                let (in_r, in_w) = tri!(sys::pipe(), "creating the stdin pipe");
                cmd.stdin(Stdio::from(in_r));
                stdin_w = Some(in_w);
            } else {
                cmd.stdin(Stdio::null());
            }
            cmd.stdout(Stdio::from(out_w)).stderr(Stdio::from(err_w));
            outputs.push(Output {
                fd: Some(out_r),
                stream: Stream::Stdout,
                split: LineSplitter::new(crilog::MAX_LINE),
            });
            let err_dup = tri!(err_r.try_clone(), "duplicating the stderr pipe");
            outputs.push(Output {
                fd: Some(err_r),
                stream: Stream::Stderr,
                split: LineSplitter::new(crilog::MAX_LINE),
            });
            errors_r = err_dup;
        }
        cmd.arg(&args.id)
            .current_dir(&args.bundle)
            .env_remove(READY_FD_ENV);

        log.event(format_args!("event=runtime_create cmd={cmd:?}"));
        let status = match cmd.spawn() {
            Ok(mut child) => {
                // The container holds the other ends now.
                drop(cmd);
                tri!(child.wait(), "waiting for the OCI runtime")
            }
            Err(e) => {
                return Err((
                    log,
                    ShimError::Create(format!(
                        "cannot run OCI runtime {}: {e}",
                        args.runtime.display()
                    )),
                ));
            }
        };
        if !status.success() {
            let msg = create_error(
                &args.runtime,
                status,
                &errors_r,
                &state.join(RUNTIME_LOG_FILE),
            );
            return Err((log, ShimError::Create(msg)));
        }
        drop(errors_r);
        let init_pid = match std::fs::read_to_string(state.join(INIT_PID_FILE))
            .map_err(|e| e.to_string())
            .and_then(|s| s.trim().parse::<i32>().map_err(|e| e.to_string()))
        {
            Ok(pid) => pid,
            Err(e) => {
                return Err((
                    log,
                    ShimError::Start(format!(
                        "{} create succeeded but {} is unreadable: {e}",
                        args.runtime.display(),
                        INIT_PID_FILE
                    )),
                ));
            }
        };

        let mut pty = None;
        let mut stdin = stdin_w;
        if let Some((listener, _tmp)) = console {
            let master = tri!(
                receive_console(&listener),
                "receiving the pty master from the OCI runtime"
            );
            if args.stdin {
                stdin = Some(tri!(master.try_clone(), "duplicating the pty master"));
            }
            pty = Some(tri!(master.try_clone(), "duplicating the pty master"));
            outputs.push(Output {
                fd: Some(master),
                stream: Stream::Stdout,
                split: LineSplitter::new(crilog::MAX_LINE),
            });
        }
        for fd in outputs
            .iter()
            .filter_map(|o| o.fd.as_ref())
            .chain(stdin.as_ref())
        {
            tri!(sys::set_nonblocking(fd.as_raw_fd()), "setting O_NONBLOCK");
        }

        Ok(Shim {
            id: args.id.clone(),
            state_dir: args.state_dir.clone(),
            log,
            has_stdin: args.stdin,
            stdin_once: args.stdin_once,
            cri,
            cri_failing: false,
            outputs,
            stdin,
            stdin_buf: Vec::new(),
            stdin_closing: false,
            stdin_once_fired: false,
            pty,
            listener,
            clients: Vec::new(),
            sigfd,
            threaded: threads != 1,
            init_pid,
            oom,
            exit: None,
            exit_seen: None,
            last_output: Instant::now(),
            buf: vec![0; READ_CHUNK],
        })
    }

    fn run_loop(&mut self) {
        loop {
            if let Some(seen) = self.exit_seen {
                let drained = self.outputs.iter().all(|o| o.fd.is_none());
                if drained {
                    break;
                }
                if self.last_output.max(seen).elapsed() > DRAIN_IDLE {
                    self.log.event(format_args!(
                        "event=drain_timeout id={} note=\"output still open {}s after exit\"",
                        self.id,
                        DRAIN_IDLE.as_secs()
                    ));
                    break;
                }
            }
            let mut pfds = Vec::with_capacity(4 + self.outputs.len() + self.clients.len());
            pfds.push(sys::pollfd(self.sigfd.as_raw_fd(), libc::POLLIN));
            pfds.push(sys::pollfd(self.listener.as_raw_fd(), libc::POLLIN));
            let out_base = pfds.len();
            for o in &self.outputs {
                let fd = o.fd.as_ref().map_or(-1, |f| f.as_raw_fd());
                pfds.push(sys::pollfd(fd, libc::POLLIN));
            }
            let stdin_idx = pfds.len();
            let stdin_fd = match &self.stdin {
                Some(fd) if !self.stdin_buf.is_empty() => fd.as_raw_fd(),
                _ => -1,
            };
            pfds.push(sys::pollfd(stdin_fd, libc::POLLOUT));
            let client_base = pfds.len();
            let stdin_room = self.stdin_buf.len() < STDIN_BUF_MAX;
            for c in &self.clients {
                let mut ev = 0;
                if !c.read_eof && (c.attach.is_none() || stdin_room) {
                    ev |= libc::POLLIN;
                }
                if c.pending() > 0 {
                    ev |= libc::POLLOUT;
                }
                pfds.push(sys::pollfd(c.stream.as_raw_fd(), ev));
            }
            let timeout = match (self.exit_seen.is_some(), self.threaded) {
                (true, _) => 100,
                (false, true) => 1000,
                (false, false) => -1,
            };
            if let Err(e) = sys::poll(&mut pfds, timeout) {
                self.log.event(format_args!("event=poll_error error={e}"));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }

            if pfds[0].revents != 0 {
                sys::drain_signalfd(self.sigfd.as_raw_fd());
                self.reap();
            } else if self.threaded && self.exit.is_none() {
                self.reap();
            }
            for i in 0..self.outputs.len() {
                if pfds[out_base + i].revents != 0 {
                    self.read_output(i);
                }
            }
            if pfds[stdin_idx].revents != 0 {
                self.flush_stdin();
            }
            let nclients = self.clients.len();
            for j in 0..nclients {
                let rev = pfds[client_base + j].revents;
                if rev & libc::POLLIN != 0 {
                    self.client_read(j);
                }
                if rev & libc::POLLOUT != 0 {
                    self.clients[j].flush();
                }
                if rev & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
                    && rev & libc::POLLIN == 0
                {
                    self.clients[j].dead = true;
                }
            }
            if pfds[1].revents != 0 {
                self.accept_clients();
            }
            self.remove_dead_clients();
        }
    }

    fn reap(&mut self) {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    if pid.as_raw() == self.init_pid {
                        self.init_exited(code, None);
                    }
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    if pid.as_raw() == self.init_pid {
                        self.init_exited(128 + sig as i32, Some(sig as i32));
                    }
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    self.log
                        .event(format_args!("event=waitpid_error error={e}"));
                    break;
                }
            }
        }
    }

    fn init_exited(&mut self, exit_code: i32, signal: Option<i32>) {
        let exited_at = Utc::now();
        // Read now: the daemon may delete the cgroup as soon as exit.json exists.
        let oom_kills = self.oom.oom_kills();
        let status = ExitStatus {
            exit_code,
            exited_at,
            oom_killed: oom_kills.unwrap_or(0) > 0,
            signal,
        };
        self.log.event(format_args!(
            "event=init_exited id={} init_pid={} exit_code={} signal={} oom_kills={}",
            self.id,
            self.init_pid,
            exit_code,
            signal.map_or("none".into(), |s| s.to_string()),
            oom_kills.map_or("unknown".into(), |n| n.to_string())
        ));
        self.exit = Some(status);
        self.exit_seen = Some(Instant::now());
        self.stdin = None;
        self.stdin_buf = Vec::new();
    }

    fn read_output(&mut self, i: usize) {
        let mut buf = std::mem::take(&mut self.buf);
        // A few reads per wakeup, so that one chatty stream does not starve the rest.
        for _ in 0..4 {
            let Some(fd) = self.outputs[i].fd.as_ref() else {
                break;
            };
            match sys::read(fd.as_raw_fd(), &mut buf) {
                Ok(0) => {
                    self.output_eof(i);
                    break;
                }
                Ok(n) => {
                    self.last_output = Instant::now();
                    self.log_output(i, &buf[..n], false);
                    let kind = match self.outputs[i].stream {
                        Stream::Stdout => FrameKind::Stdout,
                        Stream::Stderr => FrameKind::Stderr,
                    };
                    self.broadcast(kind, &buf[..n], false);
                    if n < buf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // EIO: the pty's other side is gone.
                Err(_) => {
                    self.output_eof(i);
                    break;
                }
            }
        }
        self.buf = buf;
    }

    fn output_eof(&mut self, i: usize) {
        self.log_output(i, &[], true);
        self.outputs[i].fd = None;
        let kind = match self.outputs[i].stream {
            Stream::Stdout => FrameKind::Stdout,
            Stream::Stderr => FrameKind::Stderr,
        };
        self.broadcast(kind, &[], true);
        self.log.event(format_args!(
            "event=output_eof id={} stream={}",
            self.id,
            self.outputs[i].stream.as_str()
        ));
    }

    fn log_output(&mut self, i: usize, data: &[u8], eof: bool) {
        let Shim {
            outputs,
            cri,
            cri_failing,
            log,
            ..
        } = self;
        let out = &mut outputs[i];
        let stream = out.stream;
        let mut emit = |tag: Tag, content: &[u8]| {
            if let Some(cri) = cri.as_mut() {
                match cri.write(stream, tag, content) {
                    Ok(()) => *cri_failing = false,
                    Err(e) => {
                        if !*cri_failing {
                            log.event(format_args!(
                                "event=log_write_error path={} error={e}",
                                cri.path().display()
                            ));
                        }
                        *cri_failing = true;
                    }
                }
            }
        };
        if eof {
            out.split.finish(&mut emit);
        } else {
            out.split.feed(data, &mut emit);
        }
    }

    /// Queues a frame for every attached client. Data frames are dropped for a client that
    /// is too far behind; `force` frames (EOF, exit) never are.
    fn broadcast(&mut self, kind: FrameKind, data: &[u8], force: bool) {
        for c in self.clients.iter_mut() {
            if c.attach.is_none() || c.dead {
                continue;
            }
            if !force && c.pending() + protocol::frame_len(data.len()) > CLIENT_BUF_MAX {
                if !c.dropping {
                    self.log.event(format_args!(
                        "event=attach_client_slow id={} note=\"dropping output for this client\"",
                        self.id
                    ));
                    c.dropping = true;
                }
                continue;
            }
            c.dropping = false;
            protocol::encode_frame(&mut c.wbuf, kind, data);
            c.flush();
        }
    }

    fn flush_stdin(&mut self) {
        if let Some(fd) = self.stdin.as_ref() {
            while !self.stdin_buf.is_empty() {
                match sys::write(fd.as_raw_fd(), &self.stdin_buf) {
                    Ok(n) => {
                        self.stdin_buf.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        self.log.event(format_args!(
                            "event=stdin_write_error id={} error={e}",
                            self.id
                        ));
                        self.stdin_buf.clear();
                        self.stdin_closing = true;
                    }
                }
            }
        }
        if self.stdin_closing && self.stdin_buf.is_empty() && self.stdin.take().is_some() {
            self.log
                .event(format_args!("event=stdin_closed id={}", self.id));
        }
    }

    /// No more stdin for the container: closes the pipe, or sends EOF on a terminal.
    fn close_stdin(&mut self) {
        if self.stdin_closing {
            return;
        }
        if self.pty.is_some() && self.stdin.is_some() {
            self.stdin_buf.push(VEOF);
        }
        self.stdin_closing = true;
        self.flush_stdin();
    }

    fn accept_clients(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    self.clients.push(Client {
                        stream,
                        rbuf: Vec::new(),
                        wbuf: Vec::new(),
                        wpos: 0,
                        attach: None,
                        read_eof: false,
                        close_after_flush: false,
                        dead: false,
                        dropping: false,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }

    fn client_read(&mut self, j: usize) {
        let mut chunk = [0u8; 8192];
        let n = match self.clients[j].stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                return;
            }
            Err(_) => {
                self.clients[j].dead = true;
                return;
            }
        };
        if n == 0 {
            self.clients[j].read_eof = true;
            self.client_stdin_done(j);
            if self.clients[j].attach.is_none() {
                self.clients[j].close_after_flush = true;
                self.clients[j].flush();
            }
            return;
        }
        self.clients[j].rbuf.extend_from_slice(&chunk[..n]);
        self.process_client_input(j);
        self.clients[j].flush();
    }

    fn process_client_input(&mut self, j: usize) {
        loop {
            if self.clients[j].dead {
                return;
            }
            if self.clients[j].attach.is_none() {
                let c = &mut self.clients[j];
                let Some(nl) = c.rbuf.iter().position(|&b| b == b'\n') else {
                    if c.rbuf.len() > protocol::MAX_LINE {
                        c.respond("err request line too long");
                        c.close_after_flush = true;
                        c.rbuf.clear();
                    }
                    return;
                };
                let line: Vec<u8> = c.rbuf.drain(..=nl).collect();
                let line = String::from_utf8_lossy(&line[..nl]).into_owned();
                self.handle_request(j, line.trim());
                continue;
            }
            let frame = match protocol::decode_frame(&mut self.clients[j].rbuf) {
                Ok(Some(f)) => f,
                Ok(None) => return,
                Err(e) => {
                    self.log.event(format_args!(
                        "event=attach_protocol_error id={} error={e}",
                        self.id
                    ));
                    self.clients[j].dead = true;
                    return;
                }
            };
            self.handle_frame(j, frame.0, &frame.1);
        }
    }

    fn handle_request(&mut self, j: usize, line: &str) {
        let req = match Request::parse(line) {
            Ok(r) => r,
            Err(msg) => {
                self.clients[j].respond(&format!("err {msg}"));
                return;
            }
        };
        match req {
            Request::State => {
                let state = ShimState {
                    init_pid: self.init_pid,
                    status: if self.exit.is_some() {
                        InitStatus::Exited
                    } else {
                        InitStatus::Running
                    },
                    exit: self.exit.clone(),
                };
                let json = serde_json::to_string(&state).unwrap_or_default();
                self.clients[j].respond(&format!("ok {json}"));
            }
            Request::ReopenLog => {
                let reply = match self.cri.as_mut() {
                    None => "ok".to_string(),
                    Some(cri) => match cri.reopen() {
                        Ok(()) => {
                            self.cri_failing = false;
                            self.log.event(format_args!(
                                "event=log_reopened id={} path={}",
                                self.id,
                                cri.path().display()
                            ));
                            "ok".to_string()
                        }
                        Err(e) => {
                            self.log.event(format_args!(
                                "event=log_reopen_error id={} path={} error={e}",
                                self.id,
                                cri.path().display()
                            ));
                            format!("err reopening {}: {e}", cri.path().display())
                        }
                    },
                };
                self.clients[j].respond(&reply);
            }
            Request::Resize { width, height } => {
                let reply = self.resize(width, height);
                self.clients[j].respond(&reply);
            }
            Request::Attach { stdin } => {
                if stdin && !self.has_stdin {
                    self.clients[j].respond("err the container was not created with stdin");
                    return;
                }
                self.log
                    .event(format_args!("event=attach id={} stdin={stdin}", self.id));
                let exit = self.exit.clone();
                let closed: Vec<FrameKind> = self
                    .outputs
                    .iter()
                    .filter(|o| o.fd.is_none())
                    .map(|o| match o.stream {
                        Stream::Stdout => FrameKind::Stdout,
                        Stream::Stderr => FrameKind::Stderr,
                    })
                    .collect();
                let c = &mut self.clients[j];
                c.respond("ok");
                c.attach = Some(Attach {
                    stdin,
                    stdin_done: false,
                });
                for kind in closed {
                    protocol::encode_frame(&mut c.wbuf, kind, &[]);
                }
                if let Some(exit) = exit {
                    let json = serde_json::to_vec(&exit).unwrap_or_default();
                    protocol::encode_frame(&mut c.wbuf, FrameKind::Exit, &json);
                    c.close_after_flush = true;
                }
            }
        }
    }

    fn resize(&mut self, width: u16, height: u16) -> String {
        match self.pty.as_ref() {
            None => "err the container has no terminal".into(),
            Some(pty) => match sys::set_winsize(pty.as_raw_fd(), width, height) {
                Ok(()) => "ok".into(),
                Err(e) => format!("err TIOCSWINSZ: {e}"),
            },
        }
    }

    fn handle_frame(&mut self, j: usize, kind: FrameKind, payload: &[u8]) {
        match kind {
            FrameKind::Stdin => {
                let accept = matches!(
                    &self.clients[j].attach,
                    Some(a) if a.stdin && !a.stdin_done
                );
                if accept && self.stdin.is_some() && !self.stdin_closing {
                    self.stdin_buf.extend_from_slice(payload);
                    self.flush_stdin();
                }
            }
            FrameKind::CloseStdin => self.client_stdin_done(j),
            FrameKind::Resize if payload.len() == 4 => {
                let w = u16::from_be_bytes([payload[0], payload[1]]);
                let h = u16::from_be_bytes([payload[2], payload[3]]);
                let r = self.resize(w, h);
                if r != "ok" {
                    self.log.event(format_args!(
                        "event=resize_error id={} error={r:?}",
                        self.id
                    ));
                }
            }
            other => {
                self.log.event(format_args!(
                    "event=attach_protocol_error id={} error=\"unexpected {other:?} frame\"",
                    self.id
                ));
                self.clients[j].dead = true;
            }
        }
    }

    /// A client that attached with stdin is done sending it.
    fn client_stdin_done(&mut self, j: usize) {
        let Some(a) = self.clients[j].attach.as_mut() else {
            return;
        };
        if !a.stdin || a.stdin_done {
            return;
        }
        a.stdin_done = true;
        if self.stdin_once && !self.stdin_once_fired {
            self.stdin_once_fired = true;
            self.log.event(format_args!(
                "event=stdin_once_close id={} note=\"first stdin client is gone\"",
                self.id
            ));
            self.close_stdin();
        }
    }

    fn remove_dead_clients(&mut self) {
        let mut j = 0;
        while j < self.clients.len() {
            if self.clients[j].dead {
                self.client_stdin_done(j);
                self.clients.swap_remove(j);
            } else {
                j += 1;
            }
        }
    }

    fn finish(mut self) {
        for i in 0..self.outputs.len() {
            if self.outputs[i].fd.is_some() {
                self.log_output(i, &[], true);
                self.outputs[i].fd = None;
            }
        }
        let exit = self.exit.clone().unwrap_or(ExitStatus {
            exit_code: 255,
            exited_at: Utc::now(),
            oom_killed: false,
            signal: None,
        });
        let json = serde_json::to_vec(&exit).unwrap_or_default();
        match write_atomic(&self.state_dir.join(EXIT_FILE), &json) {
            Ok(()) => self.log.event(format_args!(
                "event=exit_recorded id={} exit_code={} oom_killed={}",
                self.id, exit.exit_code, exit.oom_killed
            )),
            Err(e) => self.log.event(format_args!(
                "event=exit_write_error id={} error={e}",
                self.id
            )),
        }
        for c in self.clients.iter_mut() {
            if c.attach.is_some() {
                protocol::encode_frame(&mut c.wbuf, FrameKind::Exit, &json);
                c.close_after_flush = true;
                c.flush();
            } else {
                c.dead = true;
            }
        }
        let deadline = Instant::now() + CLIENT_FLUSH;
        loop {
            self.clients.retain(|c| !c.dead);
            if self.clients.is_empty() {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut pfds: Vec<libc::pollfd> = self
                .clients
                .iter()
                .map(|c| sys::pollfd(c.stream.as_raw_fd(), libc::POLLOUT))
                .collect();
            if sys::poll(&mut pfds, left.as_millis() as i32).is_err() {
                break;
            }
            for (c, p) in self.clients.iter_mut().zip(&pfds) {
                if p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                    c.dead = true;
                } else if p.revents != 0 {
                    c.flush();
                }
            }
        }
        let _ = std::fs::remove_file(self.state_dir.join(SOCKET_FILE));
        self.log
            .event(format_args!("event=shim_exit id={}", self.id));
    }
}

fn receive_console(listener: &UnixListener) -> io::Result<OwnedFd> {
    listener.set_nonblocking(true)?;
    let mut pfd = [sys::pollfd(listener.as_raw_fd(), libc::POLLIN)];
    if sys::poll(&mut pfd, 10_000)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the OCI runtime did not connect to the console socket",
        ));
    }
    let (conn, _) = listener.accept()?;
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    sys::recv_fd(&conn)
}

/// The OCI runtime's own words for a failed create: its stderr, else the errors of its
/// JSON log, else its exit status.
fn create_error(
    runtime: &Path,
    status: std::process::ExitStatus,
    stderr: &OwnedFd,
    log_path: &Path,
) -> String {
    let mut text = Vec::new();
    if sys::set_nonblocking(stderr.as_raw_fd()).is_ok() {
        let mut chunk = [0u8; 4096];
        while text.len() < 64 * 1024 {
            match sys::read(stderr.as_raw_fd(), &mut chunk) {
                Ok(n) if n > 0 => text.extend_from_slice(&chunk[..n]),
                _ => break,
            }
        }
    }
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if !lines.is_empty() {
        return lines.join("; ");
    }
    let from_log: Vec<String> = std::fs::read_to_string(log_path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| matches!(v["level"].as_str(), Some("error" | "fatal")))
        .filter_map(|v| v["msg"].as_str().map(str::to_owned))
        .collect();
    if !from_log.is_empty() {
        return from_log.join("; ");
    }
    format!("{} create exited with {status}", runtime.display())
}
