//! Test fixtures for nodus. Used only by the tests and benchmarks of other crates, never by
//! production code.
//!
//! testkit owns:
//!
//! - [`image`]: OCI images built offline and deterministically from host files (layers with
//!   every tar entry kind, whiteouts, xattrs, gzip/zstd/none compression; OCI and Docker
//!   manifests; multi-platform indexes; OCI image layouts and archives) plus ready-made
//!   images (`busybox`, a whiteout stack, a ~100 MB image, malicious layers).
//! - [`registry`]: the real `docker-registry` (distribution v2) started on 127.0.0.1 with no
//!   auth, htpasswd basic auth, or token auth backed by a token server testkit runs itself;
//!   plus a small async client that pushes images through the distribution HTTP API.
//! - [`faulty_proxy`]: an HTTP proxy in front of a registry that truncates, corrupts, fails or
//!   hangs responses, for pull failure tests.
//! - [`containerd`]: a private, throw-away `containerd` (own root, state, sockets, CRI plugin).
//! - [`certs_d`]: containerd-style `certs.d/<host>/hosts.toml` directories for mirror tests.
//! - [`runtime_config`]: config keys keeping a test runtime off host-wide paths (its own
//!   NRI socket).
//! - [`port`] and [`daemon`]: free ports on 127.0.0.1 and child daemons that log to files,
//!   die with the test process, and are killed (by PID) when dropped.
//!
//! Every fixture cleans up in `Drop`, so a panicking test leaves no process, mount or
//! temporary directory behind. Network traffic goes to 127.0.0.1 only.
//!
//! testkit must not touch the host beyond its own temporary directories and the processes it
//! starts: it never edits system configuration and never kills a process it did not start.

pub mod certs_d;
pub mod containerd;
pub mod daemon;
pub mod faulty_proxy;
pub mod image;
pub mod leftovers;
pub mod netns;
pub mod port;
pub mod registry;
pub mod runtime_config;

mod http_server;

pub use certs_d::{CertsD, HostEntry};
pub use containerd::{Containerd, ContainerdOptions};
pub use faulty_proxy::{Fault, FaultRule, FaultTarget, FaultyProxy};
pub use image::{Compression, Entry, Image, ImageIndex, Layer, LayerBuilder, ManifestFormat};
pub use netns::{CgroupParent, Netns};
pub use port::free_port;
pub use registry::{Registry, RegistryClient};
