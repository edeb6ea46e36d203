//! The CRI server: `runtime.v1` RuntimeService and ImageService on one Unix socket.
//!
//! One module per service and one file per RPC, as containerd's CRI server is laid out,
//! so the behaviour of a given RPC is found by its name.

pub mod image;
pub mod runtime;

use crate::config::RuntimeConfig;
use crate::image::manager::{ImageManager, ImageManagerConfig};
use cri::runtime::v1::image_service_server::ImageServiceServer;
use cri::runtime::v1::runtime_service_server::RuntimeServiceServer;
use std::path::PathBuf;
use std::sync::Arc;

/// The kubelet sends and accepts CRI messages up to 16 MiB; so do we.
const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

pub struct ServeOptions {
    pub listen: PathBuf,
    pub root_dir: PathBuf,
    pub state_dir: PathBuf,
    pub config: RuntimeConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Setup(String),
    #[error("another process is already serving on {0}; stop it or choose another --listen")]
    InUse(PathBuf),
    #[error("serving the CRI on {path}: {source}")]
    Transport {
        path: PathBuf,
        source: tonic::transport::Error,
    },
}

/// Binds the socket, refusing to steal it from a live server but replacing a stale file
/// left by a crash.
fn bind(path: &PathBuf) -> Result<tokio::net::UnixListener, ServeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| ServeError::Setup(format!("creating {}: {e}", dir.display())))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServeError::InUse(path.clone()));
        }
        std::fs::remove_file(path).map_err(|e| {
            ServeError::Setup(format!("removing stale socket {}: {e}", path.display()))
        })?;
    }
    let l = tokio::net::UnixListener::bind(path)
        .map_err(|e| ServeError::Setup(format!("listening on {}: {e}", path.display())))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| ServeError::Setup(format!("chmod {}: {e}", path.display())))?;
    Ok(l)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the server still runs; it just cannot stop gracefully.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "shutting down"),
        _ = int.recv() => tracing::info!(signal = "SIGINT", "shutting down"),
    }
}

/// Runs the CRI server until SIGTERM or SIGINT.
pub async fn serve(opts: ServeOptions) -> Result<(), ServeError> {
    let state = crate::statedir::prepare(&opts.state_dir).map_err(ServeError::Setup)?;
    let state_mount = crate::statedir::MountedHere::new(&opts.state_dir, state);
    match state {
        crate::statedir::StateDir::Mounted => tracing::info!(
            state = %opts.state_dir.display(),
            "the state dir was on disk: mounted a tmpfs on it"
        ),
        crate::statedir::StateDir::OnDisk => tracing::warn!(
            state = %opts.state_dir.display(),
            "the state dir is on disk and holds an earlier runtime's state: using it there (it is put in memory once it is empty, e.g. after a reboot)"
        ),
        crate::statedir::StateDir::InMemory => {}
    }
    let images = ImageManager::open(ImageManagerConfig::new(&opts.root_dir, &opts.config))
        .map_err(|e| ServeError::Setup(format!("opening image store: {e}")))?;
    let listener = bind(&opts.listen)?;
    // A runtime that fails to start after binding leaves no socket behind for a client to
    // find and time out on.
    let setup_failed = |msg: String| {
        let _ = std::fs::remove_file(&opts.listen);
        ServeError::Setup(msg)
    };
    if !opts.config.systemd_cgroup && nodus_cgroups::systemd::running_systemd() {
        // As the kubelet says for its cgroupDriver: systemd owns this tree, and runc's
        // cgroupfs driver writing into it beside systemd is what kubeadm advises against.
        tracing::warn!(
            "systemd-cgroup = false on a host whose cgroup tree systemd manages: set systemd-cgroup = true in the runtime's config (and the kubelet's cgroupDriver: systemd)"
        );
    }
    tracing::info!(
        socket = %opts.listen.display(),
        root = %opts.root_dir.display(),
        state = %opts.state_dir.display(),
        version = env!("CARGO_PKG_VERSION"),
        "nodus runtime serving the CRI"
    );
    let image_svc = ImageServiceServer::new(image::ImageService::new(Arc::clone(&images)))
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE);
    let inner = runtime::Inner::open(
        Arc::clone(&images),
        &opts.config,
        &opts.root_dir,
        &opts.state_dir,
    )
    .map_err(|e| setup_failed(format!("loading runtime state: {e}")))?;
    let inner = Arc::new(inner);
    inner.recover();
    if let Some(nri) = crate::nri::NriOptions::from_config(&opts.config) {
        let socket = nri.socket.clone();
        if let Err(e) = inner.start_nri(nri).await {
            if crate::nri::config::required(&opts.config) {
                inner.release_pins();
                return Err(setup_failed(format!("starting NRI: {e}")));
            }
            // On by default only: a host where containerd (or another nodus) already
            // serves NRI still gets a working node, as containerd carries on without a
            // plugin that failed to start.
            tracing::warn!(socket = %socket.display(), error = %e, "NRI could not start; running without NRI (nri = true makes this an error, nri = false turns NRI off)");
        }
    }
    state_mount.keep();
    nodus_serving::sd_notify::ready(nodus_serving::sd_notify::Component::Runtime);
    let runtime_svc = RuntimeServiceServer::new(runtime::RuntimeService::new(Arc::clone(&inner)))
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE);
    let result = tonic::transport::Server::builder()
        .add_service(runtime_svc)
        .add_service(image_svc)
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            shutdown_signal(),
        )
        .await;
    inner.stop_nri().await;
    inner.release_pins();
    let _ = std::fs::remove_file(&opts.listen);
    result.map_err(|source| ServeError::Transport {
        path: opts.listen.clone(),
        source,
    })
}
