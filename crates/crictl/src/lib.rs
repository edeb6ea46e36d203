//! `nodus crictl`: a client of any CRI endpoint (nodus's own runtime, containerd, CRI-O)
//! with crictl's command names, flags, columns and JSON output, so operators' muscle memory
//! and scripts work unchanged.
//!
//! Owns only client-side presentation; it never reaches into a runtime's files. Like
//! crictl (and the kubelet it stands in for), it does read and delete the container log
//! files the pod config's `log_directory` names: `logs` parses them, `rm` removes them.
//!
//! Extensions over crictl: `events --count N` exits after N events.

mod attach;
mod config;
mod connect;
mod containers;
mod events;
mod exec;
mod format;
mod images;
mod logs;
mod pods;
mod port_forward;
mod runtime;
mod stats;
pub mod stream;
mod timefmt;
mod util;

use clap::{Args, Subcommand};
use std::time::Duration;

pub use connect::{Clients, connect};

/// Global flags, as crictl spells them.
#[derive(Debug, Args, Clone)]
pub struct Crictl {
    /// Container runtime endpoint (unix:///path or a socket path).
    #[arg(
        short = 'r',
        long,
        env = "CONTAINER_RUNTIME_ENDPOINT",
        default_value = "unix:///run/nodus/nodus.sock"
    )]
    pub runtime_endpoint: String,
    /// Image service endpoint; defaults to the runtime endpoint.
    #[arg(short = 'i', long, env = "IMAGE_SERVICE_ENDPOINT")]
    pub image_endpoint: Option<String>,
    /// Timeout for connecting to the endpoint, e.g. 2s.
    #[arg(short = 't', long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand, Clone)]
pub enum Command {
    /// List images.
    Images(images::ImagesArgs),
    /// Pull an image from a registry.
    Pull(images::PullArgs),
    /// Remove one or more images.
    Rmi(images::RmiArgs),
    /// Return the status of one or more images.
    Inspecti(images::InspectiArgs),
    /// Return image filesystem info.
    Imagefsinfo(images::ImageFsInfoArgs),
    /// Display information of the container runtime.
    Info(runtime::InfoArgs),
    /// Display runtime version information.
    Version,
    /// Run a command in a running container.
    Exec(exec::ExecArgs),
    /// Attach to a running container.
    Attach(attach::AttachArgs),
    /// Forward local ports to a pod.
    PortForward(port_forward::PortForwardArgs),
    /// Run a new pod.
    Runp(pods::RunpArgs),
    /// Stop one or more running pods.
    Stopp(pods::StoppArgs),
    /// Remove one or more pods.
    Rmp(pods::RmpArgs),
    /// List pods.
    Pods(pods::PodsArgs),
    /// Display the status of one or more pods.
    Inspectp(pods::InspectpArgs),
    /// Create a new container.
    Create(containers::CreateArgs),
    /// Run a new container inside a sandbox.
    Run(containers::RunArgs),
    /// Start one or more created containers.
    Start(containers::StartArgs),
    /// Stop one or more running containers.
    Stop(containers::StopArgs),
    /// Remove one or more containers.
    Rm(containers::RmArgs),
    /// List containers.
    Ps(containers::PsArgs),
    /// Display the status of one or more containers.
    Inspect(containers::InspectArgs),
    /// Fetch the logs of a container.
    Logs(logs::LogsArgs),
    /// List container(s) resource usage statistics.
    Stats(stats::StatsArgs),
    /// List pod statistics.
    Statsp(stats::StatspArgs),
    /// Stream the events of containers.
    #[command(alias = "event")]
    Events(events::EventsArgs),
}

#[derive(Debug, thiserror::Error)]
pub enum CrictlError {
    #[error("{0}")]
    Connect(String),
    #[error("{context}: {status}")]
    Rpc { context: String, status: RpcError },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Other(String),
    /// The command that ran in the container exited non-zero (`exec --sync`); crictl exits
    /// with that code.
    #[error("non-zero exit code ({0})")]
    Exit(i32),
}

/// A gRPC status printed the way Go's grpc prints it, since users grep for that form.
#[derive(Debug)]
pub struct RpcError(pub tonic::Status);

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rpc error: code = {} desc = {}",
            format::code_name(self.0.code()),
            self.0.message()
        )
    }
}

pub(crate) fn rpc(context: impl Into<String>) -> impl FnOnce(tonic::Status) -> CrictlError {
    let context = context.into();
    move |s| CrictlError::Rpc {
        context,
        status: RpcError(s),
    }
}

impl CrictlError {
    /// The gRPC code when the failure came from the runtime.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            CrictlError::Rpc { status, .. } => Some(status.0.code()),
            _ => None,
        }
    }
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("invalid duration {s:?}: unknown unit {unit:?}")),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// Runs one crictl command, writing its output to `out`.
pub async fn run(args: Crictl, out: &mut (dyn std::io::Write + Send)) -> Result<(), CrictlError> {
    let clients = connect(
        &args.runtime_endpoint,
        args.image_endpoint.as_deref(),
        args.timeout,
    )
    .await?;
    match args.command {
        Command::Images(a) => images::images(&clients, a, out).await,
        Command::Pull(a) => images::pull(&clients, a, out).await,
        Command::Rmi(a) => images::rmi(&clients, a, out).await,
        Command::Inspecti(a) => images::inspecti(&clients, a, out).await,
        Command::Imagefsinfo(a) => images::imagefsinfo(&clients, a, out).await,
        Command::Info(a) => runtime::info(&clients, a, out).await,
        Command::Version => runtime::version(&clients, out).await,
        Command::Exec(a) => exec::run(&clients, a, out).await,
        Command::Attach(a) => attach::run(&clients, a, out).await,
        Command::PortForward(a) => port_forward::run(&clients, a, out).await,
        Command::Runp(a) => pods::runp(&clients, a, out).await,
        Command::Stopp(a) => pods::stopp(&clients, a, out).await,
        Command::Rmp(a) => pods::rmp(&clients, a, out).await,
        Command::Pods(a) => pods::pods(&clients, a, out).await,
        Command::Inspectp(a) => pods::inspectp(&clients, a, out).await,
        Command::Create(a) => containers::create(&clients, a, out).await,
        Command::Run(a) => containers::run(&clients, a, out).await,
        Command::Start(a) => containers::start(&clients, a, out).await,
        Command::Stop(a) => containers::stop(&clients, a, out).await,
        Command::Rm(a) => containers::rm(&clients, a, out).await,
        Command::Ps(a) => containers::ps(&clients, a, out).await,
        Command::Inspect(a) => containers::inspect(&clients, a, out).await,
        Command::Logs(a) => logs::logs(&clients, a, out).await,
        Command::Stats(a) => stats::stats(&clients, a, out).await,
        Command::Statsp(a) => stats::statsp(&clients, a, out).await,
        Command::Events(a) => events::events(&clients, a, out).await,
    }
}
