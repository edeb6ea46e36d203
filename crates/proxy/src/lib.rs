//! kube-proxy: Service and EndpointSlice change tracking rendered to nftables (default) or
//! iptables, never in the data path.
//!
//! Owns only its own kernel objects: the nftables table `ip kube-proxy`, or the `KUBE-*`
//! chains of the iptables nat and filter tables plus the jumps into them. It must not touch
//! any other table, chain or rule, nor the node's interfaces or routes.
//!
//! `nodus node` embeds it with [`cli::run_until`]; the model-level [`proxier::Proxier`]
//! drives a [`backend::Backend`] without an API server (golden tests, benchmark).

pub mod backend;
pub mod changetracker;
pub mod cli;
pub mod config;
pub mod conntrack;
pub mod healthcheck;
pub mod iptables;
pub mod libnft;
pub mod metrics;
pub mod model;
pub mod nftables;
pub mod proxier;
pub mod topology;
pub mod watch;

pub use cli::{ProxyArgs, run, run_until};
