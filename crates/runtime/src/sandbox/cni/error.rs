//! The CNI client's error: which plugin, which network, which command, and what it said.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// No usable network configuration: the node is not network-ready.
    #[error("cni plugin not initialized: {reason}")]
    NotInitialized { reason: String },
    /// A configuration file that cannot be used.
    #[error("invalid CNI network config {path}: {reason}")]
    InvalidConfig { path: PathBuf, reason: String },
    /// The plugin binary is in none of the bin dirs.
    #[error(
        "failed to find plugin {plugin:?} in path {dirs:?}: install it (Debian: containernetworking-plugins) or fix cni-bin-dirs"
    )]
    PluginNotFound { plugin: String, dirs: Vec<PathBuf> },
    /// The plugin ran and failed; `msg`/`details`/`code` come from its CNI error JSON (or its
    /// output when it printed none).
    #[error("plugin type={plugin:?} name={network:?} failed ({command}): {}", describe(.msg, .details, .code))]
    Plugin {
        plugin: String,
        network: String,
        command: &'static str,
        code: Option<u32>,
        msg: String,
        details: String,
    },
    /// The plugin could not be started or talked to.
    #[error("running plugin type={plugin:?} name={network:?} ({command}): {source}")]
    Exec {
        plugin: String,
        network: String,
        command: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The plugin did not finish in time and was killed.
    #[error(
        "plugin type={plugin:?} name={network:?} ({command}) did not finish within {timeout:?} and was killed"
    )]
    Timeout {
        plugin: String,
        network: String,
        command: &'static str,
        timeout: Duration,
    },
    /// The plugin succeeded but printed something that is not a CNI result.
    #[error(
        "plugin type={plugin:?} name={network:?} ({command}) returned an invalid result: {reason}"
    )]
    InvalidResult {
        plugin: String,
        network: String,
        command: &'static str,
        reason: String,
    },
    /// A cached result cannot be read or written.
    #[error("CNI result cache {path}: {reason}")]
    Cache { path: PathBuf, reason: String },
    /// The request itself is unusable (bad container id, `;` in a pod name, ...).
    #[error("invalid CNI request: {0}")]
    InvalidRequest(String),
    /// CHECK without a cached ADD result.
    #[error(
        "network {network:?} has no cached result for container {container_id}: CHECK needs a successful ADD first"
    )]
    NoCachedResult {
        network: String,
        container_id: String,
    },
    /// CHECK on a network whose cniVersion predates it.
    #[error(
        "network {network:?} has cniVersion {version}, which does not support the CHECK command (0.4.0 or later does)"
    )]
    CheckUnsupported { network: String, version: String },
    /// `lo` could not be brought up in the pod's network namespace (internal loopback).
    #[error("setting up the loopback interface in {netns}: {reason}")]
    Loopback { netns: PathBuf, reason: String },
    /// Writing a configuration file failed.
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn describe(msg: &str, details: &str, code: &Option<u32>) -> String {
    let mut s = msg.to_string();
    if !details.is_empty() {
        s.push_str("; ");
        s.push_str(details);
    }
    if let Some(c) = code {
        s.push_str(&format!(" (CNI error code {c})"));
    }
    s
}

impl CniError {
    /// A "not found" failure, which DEL treats as already done (containerd's go-cni does the
    /// same: plugins report missing interfaces, chains or allocations this way).
    pub fn is_not_found(&self) -> bool {
        match self {
            CniError::Plugin { msg, details, .. } => {
                msg.contains("not found") || details.contains("not found")
            }
            _ => false,
        }
    }

    /// A failure mentioning a missing file (a netns that is gone).
    pub(crate) fn is_missing_file(&self) -> bool {
        match self {
            CniError::Plugin { msg, details, .. } => {
                msg.contains("no such file or directory")
                    || details.contains("no such file or directory")
            }
            _ => false,
        }
    }
}
