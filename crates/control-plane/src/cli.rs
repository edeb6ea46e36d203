//! `nodus control-plane`: command-line flags and the entry point.

use std::net::IpAddr;
use std::path::PathBuf;

/// Flags of `nodus control-plane`, named as kube-apiserver names them.
#[derive(Debug, clap::Args)]
pub struct ControlPlaneArgs {
    /// Where the store, the PKI and admin.kubeconfig live.
    #[arg(long, default_value = "/var/lib/nodus/control-plane")]
    pub data_dir: PathBuf,
    /// The address the API server listens on.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_address: IpAddr,
    /// The HTTPS port of the API server.
    #[arg(long, default_value_t = 6443)]
    pub secure_port: u16,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("`nodus control-plane` is not implemented yet (it arrives with the API server issue)")]
    NotBuilt,
}

/// Runs the control plane until SIGTERM/SIGINT.
pub async fn run(_args: ControlPlaneArgs) -> Result<(), RunError> {
    Err(RunError::NotBuilt)
}
