//! `nodus up`: a whole cluster from one command — the control plane (API server,
//! scheduler, controllers) and, on the same machine, a node joined to it.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Args;

/// Flags of `nodus up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where everything lives: `control-plane/` (store, PKI, admin.kubeconfig) and the
    /// node's state beside it.
    #[arg(long, default_value = "/var/lib/nodus")]
    pub data_dir: PathBuf,
    /// The address the API server listens on.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_address: IpAddr,
    /// The API server's HTTPS port (0 picks a free one).
    #[arg(long, default_value_t = 6443)]
    pub secure_port: u16,
}

/// The message that tells a user where the cluster is and what to type next.
pub fn banner(url: &str, kubeconfig: &std::path::Path, node: Option<&str>) -> String {
    let mut s = format!(
        "nodus is up: API server at {url}\nkubeconfig: {}\n",
        kubeconfig.display()
    );
    match node {
        Some(n) => s.push_str(&format!("node: {n}\n")),
        None => s.push_str("node: none yet (the control plane runs alone)\n"),
    }
    s.push_str(&format!(
        "next: export KUBECONFIG={} && kubectl get nodes\n",
        kubeconfig.display()
    ));
    s
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    let cp_dir = args.data_dir.join("control-plane");
    let cfg =
        nodus_control_plane::ControlPlaneConfig::new(&cp_dir, args.bind_address, args.secure_port);
    let handle = nodus_control_plane::start(cfg).await?;
    print!("{}", banner(&handle.url, &handle.kubeconfig, None));
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down");
    handle.shutdown().await;
    Ok(())
}
