//! Pod sandboxes: pinned namespaces, CNI networking, hostname/resolv.conf/hosts.
//!
//! * [`namespaces`]: a pod's net/ipc/uts namespaces are created by a short-lived helper
//!   thread and *pinned* by bind mounts under `<state-dir>/sandboxes/<id prefix>/ns/`, in the manner
//!   of CRI-O's `pinns`: no pause process holds them. A shared PID namespace needs a process:
//!   a tiny detached init ([`namespaces::pin_pid_namespace`]) is its pid 1. Everything pinned
//!   survives a restart of the runtime daemon and is found again by reading what exists.
//! * [`cni`]: a CNI client with libcni / containerd go-cni semantics: the first network
//!   config of the conf dir, the loopback network handled separately, ADD/CHECK/DEL chains
//!   with `prevResult`, results cached in libcni's layout for DEL and CHECK after a restart.
//! * [`files`]: the sandbox's `hostname`, `resolv.conf`, `hosts` and `/dev/shm`.
//! * [`mountns`]: the pod's own mount namespace, where its shm and its containers' root
//!   filesystems are mounted and its OCI runtime runs, out of the node's mount table.
//!
//! This module never touches the node's own network: the CNI plugins it runs act on the
//! network namespace of the thread that calls it (the node's, in production).

pub mod cni;
pub mod files;
mod helper_msg;
pub mod mountns;
pub mod namespaces;
pub mod userns;

pub use namespaces::{
    PinOptions, PinRoot, PinnedNamespaces, UserMappings, pin, pin_pid_namespace, unpin,
};

use std::path::PathBuf;

/// A failure of the sandbox layer, naming what was attempted and where.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A file-system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A namespace or mount system call failed.
    #[error("{op}: {source}")]
    Sys {
        op: String,
        #[source]
        source: nix::errno::Errno,
    },
    /// The pod hostname cannot be set (empty or longer than 64 bytes).
    #[error(
        "invalid pod hostname {0:?}: a hostname must be 1 to 64 characters (the kernel's HOST_NAME_MAX)"
    )]
    InvalidHostname(String),
    /// `pin` was asked to use a directory that already exists (a previous sandbox with the same
    /// id, or a crash half-way): `unpin` it first.
    #[error(
        "sandbox namespace directory {0} already exists: unpin it first (a sandbox with this id was not cleaned up)"
    )]
    AlreadyExists(PathBuf),
    /// The helper holding a namespace could not be started.
    #[error("pinning the {ns} namespace: {reason}")]
    Helper { ns: &'static str, reason: String },
    /// A CNI operation failed.
    #[error(transparent)]
    Cni(#[from] cni::CniError),
}

impl SandboxError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SandboxError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn sys(op: impl Into<String>, source: nix::errno::Errno) -> Self {
        SandboxError::Sys {
            op: op.into(),
            source,
        }
    }
}
