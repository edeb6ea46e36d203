//! Pod networking across nodes: the role flannel plays on k3s.
//!
//! Every `nodus node` runs this agent in its own network namespace. It watches the Node
//! objects (their `spec.podCIDR`, InternalIP and flannel's backend annotations, a node's
//! "subnet lease" in flannel's words) and programs the kernel so that a pod reaches a pod on
//! any other node with its own source IP:
//!
//! - `host-gw`: a route `<podCIDR> via <InternalIP>` per other node (one L2 segment);
//! - `vxlan`: the VXLAN device `nodus.1` (flannel's `flannel.1`) with a route, a permanent
//!   neighbour and an FDB entry per other node, its VTEP MAC published in this node's
//!   annotations under flannel's keys;
//! - the nftables table `ip nodus-podnet` masquerading pod traffic that leaves the pod
//!   network (the runtime's default bridge stops masquerading when this agent is on).
//!
//! It owns only its own kernel objects: routes with protocol [`kernel::RTPROT_NODUS`], the
//! `nodus.1` device and what hangs off it, and its nftables table. The desired state is a
//! pure function of the Nodes ([`plan`]); [`kernel`] reconciles the kernel to it through a
//! [`kernel::Runner`] (iproute2 and nft), so a route of a node deleted while the agent was
//! down is removed at the next start.

pub mod cli;
pub(crate) mod events;
pub mod kernel;
pub mod lease;
pub mod masq;
pub mod plan;
pub(crate) mod vxlan;

pub use cli::{PodnetArgs, run_until};
pub use plan::Backend;
