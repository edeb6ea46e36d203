//! The controllers of kube-controller-manager that a node's life depends on, run in the
//! control-plane process over informer caches of the store ([`cache`]):
//! [`nodelifecycle`] (lease → Ready=Unknown → taints), [`tainteviction`] (NoExecute taints
//! → pods deleted after their tolerationSeconds) and [`endpointslice`] (pods → the
//! EndpointSlices and Endpoints kube-proxy reads), [`podgc`] (pods of deleted nodes),
//! [`disruption`] (PodDisruptionBudget status, which pod evictions spend),
//! [`volume`] (the PV controller, pvc-/pv-protection and k3s's local-path provisioner);
//! the workload controllers [`replicaset`] (ReplicaSets and ReplicationControllers → pods),
//! [`deployment`] (Deployments → ReplicaSets), [`daemonset`] (a pod per eligible node,
//! rolled out through [`history`]'s revisions), [`statefulset`] (pods with sticky
//! identities and their claims), sharing [`controller_utils`]; and the batch controllers
//! [`job`], [`cronjob`] and [`ttlafterfinished`]; [`rootcacertpublisher`] (the cluster CA
//! in every namespace); node join: [`csrapproving`] and [`csrsigning`] (sharing
//! [`certificates`]) issue kubelet certificates, [`bootstrapsigner`] signs cluster-info for
//! bootstrap tokens and [`tokencleaner`] removes expired ones; [`nodeipam`] gives each Node
//! its pod CIDRs. Namespace deletion, the ServiceAccount
//! controller and garbage collection are level-triggered sweeps in
//! `apiserver::controllers`.

pub mod bootstrapsigner;
pub mod cache;
pub(crate) mod certificates;
pub mod clusterdns;
pub(crate) mod controller_utils;
pub mod cronjob;
pub mod csrapproving;
pub mod csrsigning;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpointslice;
pub mod events;
pub(crate) mod history;
pub mod job;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod objects;
pub mod podgc;
pub mod replicaset;
pub mod rootcacertpublisher;
pub mod statefulset;
pub mod tainteviction;
pub mod tokencleaner;
pub mod ttlafterfinished;
pub mod volume;

use std::sync::Arc;
use std::time::Duration;

use crate::apiserver::state::ApiState;

/// kube-controller-manager's and kube-scheduler's knobs, with upstream's defaults.
#[derive(Clone, Debug)]
pub struct ControllersConfig {
    /// Run the scheduler in this process.
    pub scheduler: bool,
    /// Run the node-lifecycle, taint-eviction, EndpointSlice, pod GC, ReplicaSet,
    /// ReplicationController and Deployment controllers.
    pub controllers: bool,
    /// `--node-monitor-period` (5s).
    pub node_monitor_period: Duration,
    /// `--node-monitor-grace-period` (50s).
    pub node_monitor_grace_period: Duration,
    /// `--node-startup-grace-period` (1m).
    pub node_startup_grace_period: Duration,
    /// `--node-eviction-rate`: nodes per second whose pods may start being evicted (0.1).
    pub node_eviction_rate: f64,
    /// `--max-endpoints-per-slice` (100).
    pub max_endpoints_per_slice: usize,
    /// How long pods of a deleted node wait before the pod GC removes them (upstream's
    /// quarantine, 40 s).
    pub pod_gc_quarantine: Duration,
    /// Where local-path volumes are made on the nodes (k3s's
    /// `--default-local-storage-path`).
    pub local_storage_path: std::path::PathBuf,
    /// Controllers left out, by upstream's names (kube-controller-manager's
    /// `--controllers=*,-replicaset`): a test that plays a controller itself turns it off.
    pub disabled: Vec<String>,
    /// `--cluster-signing-cert-file` / `--cluster-signing-key-file`: the CA the CSR
    /// signer issues with [default: the cluster CA in the data dir's `pki/`].
    pub cluster_signing_cert_file: Option<std::path::PathBuf>,
    pub cluster_signing_key_file: Option<std::path::PathBuf>,
    /// `--cluster-signing-duration` (8760h): the longest certificate the signer issues.
    pub cluster_signing_duration: Duration,
    /// `--leader-elect*`: whether the scheduler and the controllers run only while this
    /// process holds their Leases ([`crate::leaderelection`]).
    pub leader_election: crate::leaderelection::LeaderElectionConfig,
    /// `--allocate-node-cidrs` with its `--cluster-cidr` and mask sizes, checked
    /// ([`nodeipam::config`]); `None`: Nodes get no pod CIDRs (upstream's default).
    pub node_ipam: Option<nodeipam::NodeIpamConfig>,
}

/// nodus's counterpart of k3s's `/var/lib/rancher/k3s/storage`.
pub const DEFAULT_LOCAL_STORAGE_PATH: &str = "/var/lib/nodus/storage";

impl Default for ControllersConfig {
    fn default() -> Self {
        ControllersConfig {
            scheduler: true,
            controllers: true,
            node_monitor_period: Duration::from_secs(5),
            node_monitor_grace_period: Duration::from_secs(50),
            node_startup_grace_period: Duration::from_secs(60),
            node_eviction_rate: 0.1,
            max_endpoints_per_slice: 100,
            pod_gc_quarantine: Duration::from_secs(40),
            local_storage_path: DEFAULT_LOCAL_STORAGE_PATH.into(),
            disabled: Vec::new(),
            cluster_signing_cert_file: None,
            cluster_signing_key_file: None,
            cluster_signing_duration: Duration::from_secs(365 * 24 * 3600),
            node_ipam: None,
            leader_election: Default::default(),
        }
    }
}

/// Starts the scheduler on `tasks` (what the `kube-scheduler` Lease guards).
pub fn spawn_scheduler(st: &Arc<ApiState>, tasks: &mut tokio::task::JoinSet<()>) {
    tasks.spawn(crate::scheduler::run(st.clone()));
}

/// Starts the controllers `cfg` enables on `tasks` (what the `kube-controller-manager`
/// Lease guards), with the API server's ServiceAccount, namespace, garbage-collector and
/// ClusterRole aggregation loops, which are kube-controller-manager's upstream.
pub fn spawn_controllers(
    st: &Arc<ApiState>,
    cfg: &ControllersConfig,
    tasks: &mut tokio::task::JoinSet<()>,
) {
    tasks.spawn(crate::apiserver::controllers::run(st.clone()));
    tasks.spawn(crate::apiserver::authz::policy::run_aggregation(
        st.store.clone(),
    ));
    tasks.spawn(nodelifecycle::run(st.clone(), cfg.clone()));
    tasks.spawn(tainteviction::run(st.clone()));
    tasks.spawn(endpointslice::run(st.clone(), cfg.max_endpoints_per_slice));
    tasks.spawn(podgc::run(st.clone(), cfg.pod_gc_quarantine));
    let on = |name: &str| !cfg.disabled.iter().any(|d| d == name);
    if on("job") {
        tasks.spawn(job::run(st.clone()));
    }
    if on("cronjob") {
        tasks.spawn(cronjob::run(st.clone()));
    }
    if on("ttl-after-finished") {
        tasks.spawn(ttlafterfinished::run(st.clone()));
    }
    if on("persistentvolume-binder") {
        tasks.spawn(volume::run(st.clone(), cfg.local_storage_path.clone()));
    }
    if on("root-ca-cert-publisher") {
        tasks.spawn(rootcacertpublisher::run(st.clone()));
    }
    if on("disruption") {
        tasks.spawn(disruption::run(st.clone()));
    }
    if on("daemonset") {
        tasks.spawn(daemonset::run(st.clone()));
    }
    if on("replicaset") {
        tasks.spawn(replicaset::run(st.clone(), replicaset::Kind::ReplicaSet));
    }
    if on("deployment") {
        tasks.spawn(deployment::run(st.clone()));
    }
    if on("replicationcontroller") {
        tasks.spawn(replicaset::run(
            st.clone(),
            replicaset::Kind::ReplicationController,
        ));
    }
    if on("statefulset") {
        tasks.spawn(statefulset::run(st.clone()));
    }
    if on("csrapproving") {
        tasks.spawn(csrapproving::run(st.clone()));
    }
    if on("csrsigning")
        && let (Some(cert_file), Some(key_file)) = (
            cfg.cluster_signing_cert_file.clone(),
            cfg.cluster_signing_key_file.clone(),
        )
    {
        tasks.spawn(csrsigning::run(
            st.clone(),
            csrsigning::SigningConfig {
                cert_file,
                key_file,
                duration: cfg.cluster_signing_duration,
            },
        ));
    }
    if on("nodeipam")
        && let Some(ipam) = cfg.node_ipam.clone()
    {
        tasks.spawn(nodeipam::run(st.clone(), ipam));
    }
    if on("clusterdns") {
        tasks.spawn(clusterdns::run(st.clone()));
    }
    if on("bootstrapsigner") {
        tasks.spawn(bootstrapsigner::run(st.clone()));
    }
    if on("tokencleaner") {
        tasks.spawn(tokencleaner::run(st.clone()));
    }
}
