//! The per-container shim: `nodus shim …`, one small process per container.
//!
//! The daemon has it forked by its [`ForkServer`] (or starts it with [`spawn`]); it is never
//! the daemon's child and outlives the daemon (its own session, stdio on `/dev/null`), and
//! it:
//!
//! * becomes a child subreaper, then runs `<runtime> --root R create --bundle B --pid-file
//!   <state>/init.pid [--console-socket S] <id>` (with `--start`: `run --detach`, which
//!   creates and starts the container in one OCI runtime process), so the container's init
//!   becomes its child;
//! * holds the container's stdio: three pipes (stdin only with `--stdin`), or with `--tty`
//!   the pty master that runc sends over the console socket (one combined stream, reported
//!   as stdout);
//! * writes the CRI log format the kubelet reads ([`crilog`]) to `--log-path`, and fans the
//!   raw output out to attached clients;
//! * reaps the init, reads the OOM kill counter of its memory cgroup, writes
//!   `<state>/exit.json` atomically ([`ExitStatus`], read back with [`read_exit`]) and exits.
//!
//! The daemon does `runc kill` and `runc delete` itself (and `runc start` for a shim
//! without `--start`); the shim never does.
//! [`shim_alive`] tells a live shim from one that died without writing `exit.json`.
//!
//! # Files in the state directory
//!
//! `shim.pid` (the shim), `init.pid` (written by runc), `shim.sock` (control socket),
//! `exit.json` (the exit status, last thing written), `shim.log` (the shim's own log, one
//! line per event), `runc-create.log` (runc's JSON log of the create).
//!
//! # Control protocol (`<state>/shim.sock`, a Unix stream socket)
//!
//! The client sends one request per line; the shim answers each with one line, `ok` or
//! `ok <payload>`, or `err <message>`. Requests:
//!
//! | request | answer |
//! | --- | --- |
//! | `state` | `ok {"init_pid":N,"status":"running"\|"exited","exit":{…}\|null}` ([`ShimState`]) |
//! | `reopen-log` | `ok` once the log path is closed and opened anew (kubelet log rotation) |
//! | `resize <width> <height>` | `ok` once `TIOCSWINSZ` is set on the pty (err without `--tty`) |
//! | `attach <0\|1>` | `ok`, then the connection carries frames; `1` = the client sends stdin |
//!
//! After `attach`, both directions carry frames: one byte of kind, a big-endian u32 payload
//! length (at most 64 KiB), the payload ([`protocol::FrameKind`]). Shim → client: `1`
//! stdout bytes, `2` stderr bytes (an empty payload = that stream's EOF), `3` exit (payload
//! = the `exit.json` document; the last frame). Client → shim: `4` stdin bytes, `5` close
//! stdin, `6` resize (width u16 BE, height u16 BE).
//!
//! Every attached client gets all output (broadcast). Output is not kept for absent
//! clients, and a client that does not read is sent at most 256 KiB ahead: beyond that its
//! frames are dropped, the container is never blocked. With `--stdin-once` the container's
//! stdin is closed when the first client that attached with stdin disconnects or closes
//! stdin (on a TTY, "closing" sends the EOF character ^D).

pub mod cgroup;
pub mod client;
pub mod crilog;
mod forkserver;
pub mod protocol;
mod server;
mod spawn;
mod sys;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use client::{AttachEvent, AttachStream, ShimClient};
pub use forkserver::{FORK_SERVER_ARG, ForkServer, serve as serve_fork_server};
pub use spawn::{SpawnedShim, spawn};

/// `<state>/shim.pid`: the shim's pid.
pub const SHIM_PID_FILE: &str = "shim.pid";
/// `<state>/init.pid`: the container init's pid, written by the OCI runtime.
pub const INIT_PID_FILE: &str = "init.pid";
/// `<state>/shim.sock`: the control socket.
pub const SOCKET_FILE: &str = "shim.sock";
/// `<state>/exit.json`: the container's exit status.
pub const EXIT_FILE: &str = "exit.json";
/// `<state>/shim.log`: the shim's own log.
pub const SHIM_LOG_FILE: &str = "shim.log";
/// `<state>/runc-create.log`: the OCI runtime's JSON log of `create`.
pub const RUNTIME_LOG_FILE: &str = "runc-create.log";

/// Environment variable naming the descriptor the shim reports readiness on (set by
/// [`spawn`]; absent when the shim is run by hand).
pub(crate) const READY_FD_ENV: &str = "_NODUS_SHIM_READY_FD";

/// `nodus shim`'s own command line, parsed without the rest of the CLI.
#[derive(clap::Parser)]
#[command(name = "nodus shim", bin_name = "nodus shim")]
struct ShimCli {
    #[command(flatten)]
    args: ShimArgs,
}

/// Parses a shim's command line, `argv[0]` being the subcommand (`shim`). Every way a shim
/// starts (exec'd, forked by the fork server, a test's hook) parses it here, and only here:
/// building the whole nodus CLI would leave every shim's heap dirty with every role's flags.
pub fn parse_args<I, T>(argv: I) -> Result<ShimArgs, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::Parser;
    ShimCli::try_parse_from(argv).map(|cli| cli.args)
}

/// Arguments of `nodus shim`.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ShimArgs {
    /// Container id (the OCI runtime's container name).
    #[arg(long)]
    pub id: String,
    /// OCI bundle directory (config.json and rootfs).
    #[arg(long)]
    pub bundle: PathBuf,
    /// OCI runtime binary (runc).
    #[arg(long)]
    pub runtime: PathBuf,
    /// The OCI runtime's state root (`runc --root`).
    #[arg(long)]
    pub runtime_root: PathBuf,
    /// Run the OCI runtime with `--systemd-cgroup`.
    #[arg(long)]
    pub systemd_cgroup: bool,
    /// More global flags of the OCI runtime, one per occurrence (runsc's `--network=host`).
    #[arg(long = "runtime-arg", allow_hyphen_values = true)]
    pub runtime_args: Vec<String>,
    /// The shim's own directory: shim.pid, shim.sock, init.pid, exit.json, shim.log.
    #[arg(long)]
    pub state_dir: PathBuf,
    /// CRI log file; absent or empty: no log.
    #[arg(long)]
    pub log_path: Option<PathBuf>,
    /// Give the container a terminal.
    #[arg(long)]
    pub tty: bool,
    /// Keep the container's stdin open for attach.
    #[arg(long)]
    pub stdin: bool,
    /// Close the container's stdin when the first attached client with stdin goes away.
    #[arg(long)]
    pub stdin_once: bool,
    /// Start the container at once (`run --detach`) rather than leave it created for a
    /// later `runc start`: one OCI runtime process instead of two.
    #[arg(long)]
    pub start: bool,
    /// The memory cgroup file whose `oom_kill` the shim reads when the container exits,
    /// resolved by the daemon ([`cgroup::oom_file`]); absent: the shim resolves it itself.
    #[arg(long)]
    pub oom_file: Option<PathBuf>,
    /// The pod's mount namespace (its pin), entered before the OCI runtime runs: the
    /// container's rootfs is mounted there ([`crate::sandbox::mountns`]).
    #[arg(long)]
    pub mount_ns: Option<PathBuf>,
}

impl ShimArgs {
    /// The arguments after `shim` on the command line that reproduce these.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = Vec::new();
        let mut push = |flag: &str, value: &std::ffi::OsStr| {
            v.push(flag.into());
            v.push(value.to_os_string());
        };
        push("--id", self.id.as_ref());
        push("--bundle", self.bundle.as_os_str());
        push("--runtime", self.runtime.as_os_str());
        push("--runtime-root", self.runtime_root.as_os_str());
        push("--state-dir", self.state_dir.as_os_str());
        if let Some(p) = self.log_path.as_ref().filter(|p| !p.as_os_str().is_empty()) {
            push("--log-path", p.as_os_str());
        }
        if let Some(p) = &self.oom_file {
            push("--oom-file", p.as_os_str());
        }
        if let Some(p) = &self.mount_ns {
            push("--mount-ns", p.as_os_str());
        }
        for a in &self.runtime_args {
            // `--runtime-arg=--x`: a value that starts with a dash stays a value.
            v.push(format!("--runtime-arg={a}").into());
        }
        for (on, flag) in [
            (self.tty, "--tty"),
            (self.stdin, "--stdin"),
            (self.stdin_once, "--stdin-once"),
            (self.start, "--start"),
            (self.systemd_cgroup, "--systemd-cgroup"),
        ] {
            if on {
                v.push(flag.into());
            }
        }
        v
    }
}

/// Errors of the shim, its launcher and its client.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The OCI runtime failed to create the container; the message is its own.
    #[error("OCI runtime create failed: {0}")]
    Create(String),
    /// The shim died or gave up before reporting the container created.
    #[error("shim failed to start: {0}")]
    Start(String),
    #[error("shim protocol error: {0}")]
    Protocol(String),
    /// The shim answered `err …`.
    #[error("shim refused the request: {0}")]
    Refused(String),
}

impl ShimError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> ShimError {
        ShimError::Io {
            context: context.into(),
            source,
        }
    }
}

/// The container's exit, as written to `<state>/exit.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// The exit code, or 128 + the signal number when the init was killed by a signal.
    pub exit_code: i32,
    /// When the shim reaped the init (RFC 3339 with nanoseconds, UTC).
    #[serde(with = "rfc3339_nano")]
    pub exited_at: DateTime<Utc>,
    /// The container's memory cgroup recorded an OOM kill.
    pub oom_killed: bool,
    /// The signal that killed the init, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

mod rfc3339_nano {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::crilog::rfc3339_nano(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let s = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}

/// Whether the container's init is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InitStatus {
    /// Alive: created (not yet started) or running.
    Running,
    Exited,
}

/// The answer to `state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShimState {
    pub init_pid: i32,
    pub status: InitStatus,
    #[serde(default)]
    pub exit: Option<ExitStatus>,
}

/// Runs the shim (the body of `nodus shim`). Blocks until the container has exited and
/// `exit.json` is written, or until the create failed.
pub fn main(args: ShimArgs) -> ExitCode {
    // Started by the runtime's `spawn`, which waits only for this first process: leave it
    // before anything else runs (and while the process is single-threaded).
    if std::env::var_os(READY_FD_ENV).is_some() && sys::detach().is_err() {
        return ExitCode::FAILURE;
    }
    if server::run(args, server::Ready::from_env()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The exit status the shim recorded, if the container has exited.
pub fn read_exit(state_dir: &Path) -> Option<ExitStatus> {
    let bytes = std::fs::read(state_dir.join(EXIT_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The pid in `<state>/shim.pid`.
pub fn shim_pid(state_dir: &Path) -> Option<i32> {
    std::fs::read_to_string(state_dir.join(SHIM_PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether the shim of this state directory is alive: its pid names a live process and
/// its control socket accepts a connection.
pub fn shim_alive(state_dir: &Path) -> bool {
    let Some(pid) = shim_pid(state_dir) else {
        return false;
    };
    sys::process_alive(pid) && sys::connect_unix(&state_dir.join(SOCKET_FILE)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ShimArgs,
    }

    #[test]
    fn args_round_trip() {
        let args = ShimArgs {
            id: "c1".into(),
            bundle: "/b".into(),
            runtime: "/usr/sbin/runc".into(),
            runtime_root: "/run/r".into(),
            state_dir: "/s".into(),
            log_path: Some("/var/log/pods/x/0.log".into()),
            tty: true,
            stdin: false,
            stdin_once: true,
            start: true,
            systemd_cgroup: true,
            runtime_args: vec!["--network=host".into()],
            oom_file: Some("/sys/fs/cgroup/memory/kubepods/c1/memory.oom_control".into()),
            mount_ns: Some("/run/nodus/sandboxes/0123/ns/mnt".into()),
        };
        let argv = std::iter::once(OsString::from("shim")).chain(args.to_args());
        assert_eq!(Cli::parse_from(argv).args, args);
        let none = ShimArgs {
            log_path: Some(PathBuf::new()),
            ..args.clone()
        };
        let argv = std::iter::once(OsString::from("shim")).chain(none.to_args());
        assert_eq!(Cli::parse_from(argv).args.log_path, None);
    }

    #[test]
    fn exit_status_json() {
        let s: ExitStatus = serde_json::from_str(
            r#"{"exit_code":137,"exited_at":"2016-10-06T00:17:09.669794202Z","oom_killed":true,"signal":9}"#,
        )
        .unwrap();
        assert_eq!(s.exit_code, 137);
        assert_eq!(s.signal, Some(9));
        let back = serde_json::to_string(&s).unwrap();
        assert!(
            back.contains(r#""exited_at":"2016-10-06T00:17:09.669794202Z""#),
            "{back}"
        );
        let plain: ExitStatus = serde_json::from_str(
            r#"{"exit_code":3,"exited_at":"2016-10-06T00:17:09Z","oom_killed":false}"#,
        )
        .unwrap();
        assert_eq!(plain.signal, None);
        assert!(!serde_json::to_string(&plain).unwrap().contains("signal"));
    }
}
