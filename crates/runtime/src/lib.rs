//! The nodus container runtime: a CRI server (`runtime.v1`) on a Unix socket.
//!
//! * [`image`]: the image service — references, registry pulls (hosts.toml mirrors, auth),
//!   a content-addressed blob store, layers unpacked into overlay snapshots, image metadata.
//! * [`server`]: the gRPC services wired onto the socket.
//! * [`nri`]: the Node Resource Interface: plugins hooked into pod and container lifecycle.
//!
//! The runtime owns everything under its `--root-dir` (persistent: content, snapshots, image
//! metadata) and `--state-dir` (volatile, kept on tmpfs: `statedir`). It never touches the
//! kubelet's directories.

pub mod config;
pub mod container;
pub mod image;
pub mod nri;
pub mod oci;
pub mod sandbox;
pub mod server;
pub mod shim;
pub mod state;
mod statedir;
pub mod streaming;
