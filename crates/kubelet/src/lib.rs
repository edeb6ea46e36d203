//! The kubelet: pod sources, syncLoop, PLEG, pod workers, SyncPod over the CRI, status,
//! probes, eviction, container manager, node status and lease, the :10250 server.
//!
//! Talks to containers only through the CRI ([`cri`]), so it drives nodus's own runtime
//! and containerd alike. Module names follow upstream's packages: [`config`] (pod sources),
//! [`syncloop`], [`pleg`], [`pod_workers`], [`kuberuntime`] (SyncPod), [`status`],
//! [`prober`], [`eviction`], [`lifecycle`] (hooks), [`volumes`], [`metrics`], [`server`]; with a
//! kubeconfig also [`nodestatus`], [`nodelease`], the API pod source, [`status::sync`],
//! [`mirror`] pods, [`events`] and [`runtimeclass`] (class → CRI handler); [`userns`] hands pods with `hostUsers: false` their ids.
//! New pods pass the [`admission`] chain; [`pod`] is the pod manager; device plugins register
//! with [`cm::devicemanager`] and [`podresources`] reports what each pod holds.

pub mod admission;
pub mod apiclient;
pub mod certificate;
pub mod cli;
pub mod cm;
pub mod config;
pub mod cri;
pub mod deviceplugin;
pub mod events;
pub mod eviction;
pub mod kubelet;
pub mod kubeletconfig;
pub mod kuberuntime;
pub mod lifecycle;
pub mod metrics;
pub mod mirror;
pub mod nodelease;
pub mod nodeshutdown;
pub mod nodestatus;
pub mod objectcache;
pub mod pleg;
pub mod pod;
pub mod pod_workers;
pub mod podresources;
pub mod prober;
pub mod runtimeclass;
pub mod server;
pub mod services;
pub mod status;
pub mod syncloop;
pub mod token;
pub mod userns;
pub mod volumes;
