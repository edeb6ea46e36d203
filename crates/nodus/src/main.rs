//! The `nodus` binary: parses the command line and wires roles together. Business logic
//! lives in the role crates (runtime, kubelet, proxy, control-plane, crictl).

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

mod dns;
mod join;
mod loadbalancer;
mod node;
mod nri_plugin;
mod staticpods;
mod token;
mod up;

#[derive(Debug, Parser)]
#[command(
    name = "nodus",
    version,
    about = "A Kubernetes worker node in one binary: kubelet, CRI runtime and kube-proxy",
    long_about = "nodus is a Kubernetes worker node in one binary: the kubelet, a CRI container \
runtime and kube-proxy on Linux cgroups and namespaces, plus a small control plane so a whole \
cluster starts with one command.\n\nLogs go to stderr; set NODUS_LOG (e.g. NODUS_LOG=debug or \
NODUS_LOG=nodus_runtime=trace) to change the level."
)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Run a whole single-node cluster: control plane + node (like `k3s server`).
    Up(up::UpArgs),
    /// Run kubelet + runtime + proxy, joining a control plane via kubeconfig.
    Node(Box<node::NodeArgs>),
    /// Bootstrap tokens for joining nodes (like `kubeadm token`).
    Token(token::TokenArgs),
    /// Run the kubelet alone, driving any CRI runtime.
    Kubelet(Box<nodus_kubelet::cli::KubeletArgs>),
    /// A device plugin offering host device nodes (by path or glob) as extended resources.
    DevicePlugin(nodus_kubelet::deviceplugin::DevicePluginArgs),
    /// Run the CRI runtime server on a Unix socket (like containerd / CRI-O).
    Runtime(RuntimeCmd),
    /// An example NRI plugin: injects env variables, devices, mounts into containers.
    NriPlugin(nri_plugin::NriPluginArgs),
    /// Run kube-proxy alone (nftables or iptables mode).
    Proxy(nodus_proxy::ProxyArgs),
    /// Run cluster DNS alone (the records CoreDNS's kubernetes plugin serves).
    Dns(nodus_dns::DnsConfig),
    /// Run the API server, scheduler and controllers.
    ControlPlane(Box<nodus_control_plane::cli::ControlPlaneArgs>),
    /// Run the API server alone (kubeadm's `kube-apiserver` static pod).
    KubeApiserver(Box<nodus_control_plane::cli::ControlPlaneArgs>),
    /// Run the controllers alone, on the API server's etcd and PKI (`kube-controller-manager`).
    KubeControllerManager(Box<nodus_control_plane::cli::ControlPlaneArgs>),
    /// Run the scheduler alone, on the API server's etcd and PKI (`kube-scheduler`).
    KubeScheduler(Box<nodus_control_plane::cli::ControlPlaneArgs>),
    /// A crictl-compatible client of any CRI endpoint.
    Crictl(nodus_crictl::Crictl),
    /// Internal: the per-container shim the runtime starts (not for direct use).
    #[command(hide = true)]
    Shim(nodus_runtime::shim::ShimArgs),
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
struct RuntimeCmd {
    #[command(subcommand)]
    action: Option<RuntimeAction>,
    #[command(flatten)]
    serve: RuntimeServe,
}

#[derive(Debug, Args)]
struct RuntimeDirs {
    /// Persistent state: content store, snapshots, image metadata.
    #[arg(long, default_value = "/var/lib/nodus/runtime")]
    root_dir: PathBuf,
    /// Volatile state: sockets, per-container runtime state.
    #[arg(long, default_value = "/run/nodus/runtime")]
    state_dir: PathBuf,
    /// Runtime configuration file (TOML; registry-config-dir, cni-bin-dirs, cni-conf-dir,
    /// runtime-handlers).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct RuntimeServe {
    /// Unix socket to serve the CRI on.
    #[arg(long, default_value = "/run/nodus/nodus.sock")]
    listen: PathBuf,
    #[command(flatten)]
    dirs: RuntimeDirs,
}

#[derive(Debug, Subcommand)]
enum RuntimeAction {
    /// Load images from an OCI archive (an OCI image layout in a tar), no registry needed.
    Import {
        /// The archive, e.g. made by `ctr images export` or `skopeo copy … oci-archive:FILE`.
        file: PathBuf,
        /// Name for images whose archive entry carries no name.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        dirs: RuntimeDirs,
    },
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NODUS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn runtime_config(path: Option<&PathBuf>) -> anyhow::Result<nodus_runtime::config::RuntimeConfig> {
    Ok(match path {
        Some(p) => nodus_runtime::config::RuntimeConfig::load(p)?,
        None => Default::default(),
    })
}

async fn runtime(cmd: RuntimeCmd) -> anyhow::Result<()> {
    match cmd.action {
        None => {
            let dirs = cmd.serve.dirs;
            let config = runtime_config(dirs.config.as_ref())?;
            nodus_runtime::server::serve(nodus_runtime::server::ServeOptions {
                listen: cmd.serve.listen,
                root_dir: dirs.root_dir,
                state_dir: dirs.state_dir,
                config,
            })
            .await?;
        }
        Some(RuntimeAction::Import { file, name, dirs }) => {
            let config = runtime_config(dirs.config.as_ref())?;
            let images = nodus_runtime::image::manager::ImageManager::open(
                nodus_runtime::image::manager::ImageManagerConfig::new(&dirs.root_dir, &config),
            )
            .context("opening the image store")?;
            let imported = images
                .import_archive(&file, name.as_deref())
                .await
                .with_context(|| format!("importing {}", file.display()))?;
            for img in imported {
                let names = if img.repo_tags.is_empty() {
                    img.repo_digests.join(", ")
                } else {
                    img.repo_tags.join(", ")
                };
                println!("unpacking {names} ({})...done", img.id);
            }
        }
    }
    Ok(())
}

async fn control_plane_component(
    args: nodus_control_plane::cli::ControlPlaneArgs,
    component: nodus_control_plane::cli::Component,
) -> anyhow::Result<()> {
    Ok(nodus_control_plane::cli::run_component(args, component).await?)
}

fn main() -> ExitCode {
    // The shim must stay single-threaded and small: one runs per container for the
    // container's whole life. It parses only its own arguments: building the whole CLI
    // (every role's flags) would leave ~300 KiB of heap and ~100 KiB of stack dirty in
    // every shim, half its memory.
    if std::env::args_os().nth(1).is_some_and(|a| a == "shim") {
        match nodus_runtime::shim::parse_args(std::env::args_os().skip(1)) {
            Ok(args) => return nodus_runtime::shim::main(args),
            Err(e) => e.exit(),
        }
    }
    // The same holds for the server every shim is forked from.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == nodus_runtime::shim::FORK_SERVER_ARG)
    {
        return nodus_runtime::shim::serve_fork_server();
    }
    nodus_serving::sd_notify::take_socket_from_env();
    let cli = Cli::parse();
    let cli = match cli.role {
        Role::Shim(args) => return nodus_runtime::shim::main(args),
        role => Cli { role },
    };
    init_logging();
    limit_malloc_arenas();
    {
        use nodus_serving::sd_notify::{Component, expect};
        match &cli.role {
            Role::Up(a) if a.no_node => expect(&[Component::ControlPlane]),
            Role::Up(_) => expect(&[
                Component::ControlPlane,
                Component::Runtime,
                Component::Kubelet,
            ]),
            Role::Node(_) => expect(&[Component::Runtime, Component::Kubelet]),
            Role::Kubelet(_) => expect(&[Component::Kubelet]),
            Role::Runtime(r) if r.action.is_none() => expect(&[Component::Runtime]),
            Role::ControlPlane(_)
            | Role::KubeApiserver(_)
            | Role::KubeControllerManager(_)
            | Role::KubeScheduler(_) => expect(&[Component::ControlPlane]),
            _ => {}
        }
    }
    if matches!(
        cli.role,
        Role::Up(_)
            | Role::Node(_)
            | Role::Kubelet(_)
            | Role::ControlPlane(_)
            | Role::KubeApiserver(_)
    ) {
        // Servers holding thousands of connections (and watches) need more than 1024 fds.
        if let Err(e) = nodus_serving::rlimit::raise_nofile_limit() {
            tracing::warn!(error = %e, "cannot raise the open files limit");
        }
    }
    // An NRI plugin answers one runtime, one event at a time: on one thread each event is
    // handled where it arrives, with no wake-up of another worker thread on the way.
    let mut builder = if matches!(cli.role, Role::NriPlugin(_)) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nodus: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    use nodus_control_plane::cli::Component;
    let result: anyhow::Result<()> = rt.block_on(async {
        match cli.role {
            Role::Runtime(cmd) => runtime(cmd).await,
            Role::Crictl(args) => {
                let mut out = std::io::stdout();
                nodus_crictl::run(args, &mut out).await.map_err(Into::into)
            }
            Role::Up(args) => up::run(args).await,
            Role::Node(args) => node::run(*args).await,
            Role::Token(args) => token::run(args).await,
            Role::Kubelet(args) => nodus_kubelet::cli::run(*args).await.map_err(Into::into),
            Role::DevicePlugin(args) => nodus_kubelet::deviceplugin::run(args)
                .await
                .map_err(anyhow::Error::msg),
            Role::NriPlugin(args) => nri_plugin::run(args).await,
            Role::Proxy(args) => nodus_proxy::run(args).await.map_err(Into::into),
            Role::Dns(config) => nodus_dns::run(config).await.map_err(Into::into),
            Role::ControlPlane(args) => nodus_control_plane::cli::run(*args)
                .await
                .map_err(Into::into),
            Role::KubeApiserver(args) => control_plane_component(*args, Component::ApiServer).await,
            Role::KubeControllerManager(args) => {
                control_plane_component(*args, Component::ControllerManager).await
            }
            Role::KubeScheduler(args) => control_plane_component(*args, Component::Scheduler).await,
            Role::Shim(_) => unreachable!("handled before the async runtime starts"),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nodus: {e:#}");
            match e.downcast_ref::<nodus_crictl::CrictlError>() {
                // As crictl: `exec --sync` exits with the command's own code.
                Some(nodus_crictl::CrictlError::Exit(code)) => {
                    ExitCode::from(u8::try_from(*code).unwrap_or(1))
                }
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// glibc gives every thread that allocates its own malloc arena (up to 8 per core), and a
/// long-running daemon with a few dozen tokio and blocking threads keeps each one's free
/// memory. Two arenas keep the daemons' resident memory low at no measurable cost for
/// their allocation rates.
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only tunes the allocator; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
