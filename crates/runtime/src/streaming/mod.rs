//! The CRI streaming server: exec, attach and port-forward sessions over HTTP/1.1 upgrades,
//! laid out like the kubelet's `k8s.io/kubelet/pkg/cri/streaming` that containerd embeds.
//!
//! The `Exec`, `Attach` and `PortForward` RPCs validate their request, resolve what the
//! session will need (the OCI runtime and the process spec, the shim's directory, the
//! sandbox's network namespace) and [`Server::insert`] it under a random single-use token
//! that lives one minute. The RPC answers `http://<addr>/exec/<token>` (`/attach/…`,
//! `/portforward/…`); the client then connects with `GET` or `POST` and upgrades:
//!
//! * SPDY/3.1 (`Connection: Upgrade`, `Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version`):
//!   remotecommand `v5`/`v4`/`v3`/`v2.channel.k8s.io` (the client opens one stream per
//!   `streamType`: error, stdin, stdout, stderr, resize), or `portforward.k8s.io` (a data and
//!   an error stream per forwarded connection, with `port` and `requestID` headers);
//! * WebSocket (`Sec-WebSocket-Protocol`): `v5.channel.k8s.io`, `v4.channel.k8s.io`,
//!   `channel.k8s.io` and their `base64.` variants; each message starts with the channel:
//!   0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize, and in v5 255 = close channel
//!   (`[255, 0]` ends stdin). Port-forward uses channel pairs 2i (data) / 2i+1 (error) for
//!   the i-th port of `?port=` (or of the CRI request), each starting with the port as two
//!   little-endian bytes.
//!
//! The error stream/channel carries the outcome: with v4 and v5 a `metav1.Status` JSON
//! (`Success`, or `Failure` with reason `NonZeroExitCode` and an `ExitCode` cause, which
//! kubectl turns into "command terminated with exit code N"), with older versions the
//! error text only. An unknown, used or expired token is a 404, as upstream.
//!
//! Sessions: [`exec`] runs `runc exec` of the container's own process spec (pipes, or with a
//! TTY a pseudo-terminal of its own whose size follows the client's resize messages);
//! [`attach`] joins the container's shim; [`portforward`] dials `localhost:<port>` inside
//! the sandbox's network namespace from a thread that entered it, as containerd does.

mod attach;
mod cache;
mod exec;
mod http;
mod portforward;
mod remotecommand;
pub use nodus_spdy as spdy;
mod status;
mod ws;

use crate::oci::OciRuntime;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use cache::CacheFull;

/// Where the server listens unless the runtime config says otherwise: loopback, a port the
/// kernel picks (containerd's default `stream_server_address = "127.0.0.1"`, port 0).
pub const DEFAULT_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);
/// How long a token stays valid (the kubelet's `CacheTTL`).
pub const REQUEST_TTL: Duration = Duration::from_secs(60);
/// Tokens held at once before new requests are refused (the kubelet's `maxInFlight`).
pub const MAX_IN_FLIGHT: usize = 1000;
/// How long a SPDY client has to open the streams it asked for (the kubelet's default).
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Remotecommand protocol versions accepted over SPDY, in the server's order.
pub const SPDY_REMOTECOMMAND_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
];
/// Port-forward protocol versions accepted over SPDY.
pub const SPDY_PORTFORWARD_PROTOCOLS: &[&str] = &["portforward.k8s.io"];

/// How to run a process in a container: resolved by the Exec RPC.
#[derive(Debug, Clone)]
pub struct ExecTarget {
    /// The container's OCI runtime handler (binary and `--root`).
    pub runtime: OciRuntime,
    pub container_id: String,
    /// The OCI process to run: the container's own, with the command as its args and
    /// `terminal` set as the request asks.
    pub process: serde_json::Value,
    /// Where to put the per-exec scratch directory (process.json, pid file, runtime log).
    pub scratch_dir: PathBuf,
}

/// A validated `ExecRequest`.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub target: ExecTarget,
    pub cmd: Vec<String>,
    pub tty: bool,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

/// A validated `AttachRequest` and what the session needs of the container.
#[derive(Debug, Clone)]
pub struct AttachRequest {
    pub container_id: String,
    /// The shim's state directory (its control socket).
    pub shim_dir: PathBuf,
    /// The container's own `tty`, `stdin` and `stdin_once` (its config).
    pub container_tty: bool,
    pub container_stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

/// A validated `PortForwardRequest`.
#[derive(Debug, Clone)]
pub struct PortForwardRequest {
    pub sandbox_id: String,
    /// The sandbox's network namespace; `None` for a host-network sandbox.
    pub netns: Option<PathBuf>,
    /// The ports of the CRI request: used by WebSocket clients that name none in the URL.
    pub ports: Vec<i32>,
}

/// What a token stands for.
#[derive(Debug, Clone)]
pub enum Request {
    Exec(ExecRequest),
    Attach(AttachRequest),
    PortForward(PortForwardRequest),
}

impl Request {
    fn path(&self) -> &'static str {
        match self {
            Request::Exec(_) => "exec",
            Request::Attach(_) => "attach",
            Request::PortForward(_) => "portforward",
        }
    }
}

struct Shared {
    cache: cache::RequestCache,
    addr: SocketAddr,
}

/// The running streaming server; clones share it. Dropping the last clone does not stop
/// it: call [`Server::stop`].
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
    task: Arc<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.shared.addr)
            .finish()
    }
}

impl Server {
    /// Binds `addr` (port 0: any free port) and serves on the current tokio runtime.
    pub fn start(addr: SocketAddr) -> std::io::Result<Server> {
        let std_listener = std::net::TcpListener::bind(addr)?;
        std_listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(std_listener)?;
        let local = listener.local_addr()?;
        let shared = Arc::new(Shared {
            cache: cache::RequestCache::new(REQUEST_TTL, MAX_IN_FLIGHT),
            addr: local,
        });
        let task = tokio::spawn(http::serve(listener, Arc::clone(&shared))).abort_handle();
        tracing::info!(address = %local, "streaming server listening");
        Ok(Server {
            shared,
            task: Arc::new(task),
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://<addr>`, the prefix of every URL handed out.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// Caches `req` under a fresh token and returns its URL.
    pub fn insert(&self, req: Request) -> Result<String, CacheFull> {
        let path = req.path();
        let token = self.shared.cache.insert(req)?;
        Ok(format!("{}/{path}/{token}", self.base_url()))
    }

    /// Stops accepting connections (sessions already running go on).
    pub fn stop(&self) {
        self.task.abort();
    }
}
