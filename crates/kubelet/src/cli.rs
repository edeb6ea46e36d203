//! `nodus kubelet`: command-line flags (upstream's names) and the entry point.

use std::path::PathBuf;

/// Flags of `nodus kubelet`, named and defaulted as upstream's kubelet.
#[derive(Debug, clap::Args)]
pub struct KubeletArgs {
    /// The CRI endpoint, e.g. unix:///run/containerd/containerd.sock.
    #[arg(long, default_value = "unix:///run/nodus/nodus.sock")]
    pub container_runtime_endpoint: String,
    /// Directory for the kubelet's files (pod dirs, volumes, checkpoints).
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub root_dir: PathBuf,
    /// Directory of static pod manifests.
    #[arg(long)]
    pub pod_manifest_path: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(
        "`nodus kubelet` is not implemented yet (it arrives with the kubelet sync engine issue)"
    )]
    NotBuilt,
}

/// Runs the kubelet until SIGTERM/SIGINT.
pub async fn run(_args: KubeletArgs) -> Result<(), RunError> {
    Err(RunError::NotBuilt)
}
