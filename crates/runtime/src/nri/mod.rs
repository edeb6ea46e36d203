//! NRI, the Node Resource Interface (containerd/nri), hosted by the runtime as containerd
//! 2.x and CRI-O host it: plugins connect to the NRI socket (or are started from the plugin
//! directory), are synchronized with every pod and container, and are hooked into the pod
//! and container lifecycle; at CreateContainer they may adjust the container's OCI spec, and
//! at any time they may ask for updates or evictions of containers.
//!
//! * [`mux`]: the two logical connections over one socket.
//! * [`ttrpc`]: containerd's ttrpc framing and unary calls.
//! * [`plugin`]: one plugin connection: registration, configuration, calls.
//! * [`adaptation`]: the socket, pre-installed plugins, synchronization, event relay.
//! * [`adjust`]: merging plugins' adjustments (with conflict detection) into the spec.
//! * [`objects`]: pods and containers as NRI describes them.
//! * [`stub`]: the plugin side, for plugins written with nodus (`nodus nri-plugin`).
//! * [`config`]: the runtime config keys.

pub(crate) mod adaptation;
pub(crate) mod adjust;
pub mod config;
pub(crate) mod mux;
pub(crate) mod objects;
pub mod plugin;
pub mod stub;
pub(crate) mod ttrpc;

pub use adaptation::Nri;
pub use config::NriOptions;
pub use plugin::measure_round_trips;

/// The NRI messages (containerd/nri's api.proto).
pub use cri::nri as api;
