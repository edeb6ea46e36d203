//! The kubelet: pod sources, syncLoop, PLEG, pod workers, SyncPod over the CRI, status,
//! probes, eviction, container manager, node status and lease, the :10250 server.
//!
//! Talks to containers only through the CRI ([`cri`]), so it drives nodus's own runtime
//! and containerd alike. Module names follow upstream's packages: [`config`] (pod sources),
//! [`syncloop`], [`pleg`], [`pod_workers`], [`kuberuntime`] (SyncPod), [`status`],
//! [`prober`], [`lifecycle`] (hooks).

pub mod cli;
pub mod config;
pub mod cri;
pub mod lifecycle;
pub mod prober;
