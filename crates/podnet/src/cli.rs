//! The agent: flags, the watch of Nodes and the sync loop that turns them into kernel state.
//!
//! Every change to a Node (and a periodic resync, which also repairs drift) recomputes the
//! whole [`plan`](crate::plan::plan) and reconciles the kernel to it, so nothing depends on
//! seeing each event: a node deleted while the agent was down loses its route at start.

use crate::kernel::{ExecRunner, Kernel};
use crate::lease::{self, Skip};
use crate::plan::{self, Backend, Conflict, Lease, Mac};
use crate::{events, masq, vxlan};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the kernel is reconciled without a change to any Node.
const RESYNC: Duration = Duration::from_secs(30);

/// Flags of the pod network agent (`nodus node` sets them from its own).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PodnetArgs {
    /// Kubeconfig of the API server to watch Nodes through (the node's own).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name.
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// host-gw (default), vxlan or none (k3s's `--flannel-backend`).
    #[arg(long, value_enum, default_value_t)]
    pub flannel_backend: Backend,
    /// The VXLAN network identifier [default: 1].
    #[arg(long)]
    pub vxlan_vni: Option<u32>,
    /// The VXLAN UDP port [default: 8472, flannel's].
    #[arg(long)]
    pub vxlan_port: Option<u16>,
}

#[derive(Debug, thiserror::Error)]
pub enum PodnetError {
    #[error("--kubeconfig is required")]
    NoKubeconfig,
    #[error("--hostname-override is required")]
    NoNodeName,
    #[error("kubeconfig {path}: {err}")]
    Kubeconfig { path: String, err: String },
}

async fn client(path: &std::path::Path) -> Result<kube::Client, PodnetError> {
    let err = |e: String| PodnetError::Kubeconfig {
        path: path.display().to_string(),
        err: e,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| err(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| err(e.to_string()))
}

/// Turns on IPv4 forwarding in this process's network namespace (the node's): pods'
/// traffic to other nodes is forwarded between the bridge, the uplink and the VXLAN device.
fn enable_forwarding() {
    const PATH: &str = "/proc/sys/net/ipv4/ip_forward";
    match std::fs::read_to_string(PATH) {
        Ok(v) if v.trim() == "1" => {}
        _ => match std::fs::write(PATH, "1") {
            Ok(()) => tracing::info!("net.ipv4.ip_forward set to 1"),
            Err(e) => tracing::warn!(path = PATH, error = %e, "cannot enable IPv4 forwarding"),
        },
    }
}

/// The Nodes as last seen, and whether the first list is complete.
#[derive(Default)]
struct Store {
    nodes: BTreeMap<String, Node>,
    synced: bool,
}

/// Watches every Node into `store`, waking `changed` on each change.
async fn watch_nodes(
    client: kube::Client,
    store: Arc<Mutex<Store>>,
    changed: Arc<tokio::sync::Notify>,
) {
    let api: Api<Node> = Api::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    let mut relist: Option<BTreeMap<String, Node>> = None;
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(error = %e, "watching nodes failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let name = |n: &Node| n.metadata.name.clone().unwrap_or_default();
        {
            let Ok(mut s) = store.lock() else { return };
            match ev {
                Event::Init => {
                    relist = Some(BTreeMap::new());
                    continue;
                }
                Event::InitApply(n) => {
                    relist.get_or_insert_with(BTreeMap::new).insert(name(&n), n);
                    continue;
                }
                Event::InitDone => {
                    s.nodes = relist.take().unwrap_or_default();
                    s.synced = true;
                }
                Event::Apply(n) => {
                    s.nodes.insert(name(&n), n);
                }
                Event::Delete(n) => {
                    s.nodes.remove(&name(&n));
                }
            }
        }
        changed.notify_one();
    }
}

/// What the sync loop remembers between rounds (to log and report once, not every round).
#[derive(Default)]
struct Memory {
    skipped: HashMap<String, Skip>,
    conflicts: BTreeSet<Conflict>,
    waiting_for_own: bool,
    waiting: BTreeSet<String>,
    /// The leases and this node's annotations the last sync worked from: a Node update that
    /// changes neither (a status heartbeat) needs no work until the next resync.
    last: Option<(Vec<Lease>, BTreeMap<String, String>)>,
}

struct Agent {
    client: kube::Client,
    node: String,
    backend: Backend,
    vni: u32,
    port: u16,
    kernel: Option<Kernel>,
    memory: Memory,
}

impl Agent {
    /// Runs `f` with the kernel on a blocking thread (iproute2 and nft are processes).
    async fn with_kernel<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Kernel) -> T + Send + 'static,
    ) -> T {
        let mut k = self
            .kernel
            .take()
            .unwrap_or_else(|| Kernel::new(Box::new(ExecRunner)));
        let (k, out) = tokio::task::spawn_blocking(move || {
            let out = f(&mut k);
            (k, out)
        })
        .await
        .unwrap_or_else(|e| panic!("kernel task panicked: {e}"));
        self.kernel = Some(k);
        out
    }

    async fn sync(&mut self, nodes: BTreeMap<String, Node>, force: bool) {
        let mut leases: Vec<Lease> = Vec::new();
        let mut skipped = HashMap::new();
        for (name, n) in &nodes {
            match lease::from_node(n) {
                Ok(l) => leases.push(l),
                Err(why) => {
                    if name != &self.node && self.memory.skipped.get(name) != Some(&why) {
                        tracing::info!(node = %name, reason = %why, "node skipped: no route to it");
                    }
                    skipped.insert(name.clone(), why);
                }
            }
        }
        self.memory.skipped = skipped;
        let key = (
            leases.clone(),
            nodes
                .get(&self.node)
                .and_then(|n| n.metadata.annotations.clone())
                .unwrap_or_default(),
        );
        if !force && self.memory.last.as_ref() == Some(&key) {
            return;
        }
        self.memory.last = Some(key);
        let Some(own) = leases.iter().find(|l| l.node == self.node).cloned() else {
            if !self.memory.waiting_for_own {
                let why = self
                    .memory
                    .skipped
                    .get(&self.node)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| format!("node {} is not registered", self.node));
                tracing::info!(reason = %why, "waiting for this node's podCIDR and InternalIP");
                self.memory.waiting_for_own = true;
            }
            return;
        };
        self.memory.waiting_for_own = false;

        let backend = self.backend;
        let device = vxlan::Device {
            vni: self.vni,
            port: self.port,
            local: own.public_ip,
            address: plan::vtep_address(own.pod_cidr),
        };
        let p = plan::plan(&self.node, backend, &leases);
        let cidrs = p.pod_cidrs.clone();
        let plan_for_kernel = p.clone();
        let (mac, report, masq) = self
            .with_kernel(move |k| {
                let mac = match backend {
                    Backend::Vxlan => Some(vxlan::ensure(k, &device)),
                    _ => {
                        if let Err(e) = vxlan::remove(k) {
                            tracing::warn!(error = %e, "cannot remove the VXLAN device");
                        }
                        None
                    }
                };
                let report = k.sync(&plan_for_kernel);
                let masq = masq::sync(k, &cidrs);
                (mac, report, masq)
            })
            .await;
        let mac = match mac {
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot set up the VXLAN device");
                None
            }
            None => None,
        };
        for c in &report.changes {
            tracing::info!(command = %c, "pod network changed");
        }
        for e in &report.errors {
            tracing::warn!(error = %e, "pod network");
        }
        if let Err(e) = masq {
            tracing::warn!(error = %e, table = masq::TABLE, "cannot update the masquerade table");
        }
        if backend != Backend::Vxlan || mac.is_some() {
            self.publish(&nodes, &own, mac.as_ref()).await;
        }

        let waiting: BTreeSet<String> = p.waiting.iter().cloned().collect();
        for w in waiting.difference(&self.memory.waiting) {
            tracing::info!(node = %w, "node has not published a VXLAN VTEP MAC yet: no route to it");
        }
        self.memory.waiting = waiting;
        let conflicts: BTreeSet<Conflict> = p.conflicts.iter().cloned().collect();
        for c in conflicts.difference(&self.memory.conflicts) {
            tracing::warn!(node = %c.node, "{}", c.message());
            if let Some(n) = nodes.get(&c.node) {
                events::warn_node(
                    &self.client,
                    &self.node,
                    n,
                    events::CIDR_NOT_AVAILABLE,
                    &c.message(),
                )
                .await;
            }
        }
        self.memory.conflicts = conflicts;
    }

    /// Writes flannel's annotations on this node's Node when they differ.
    async fn publish(&self, nodes: &BTreeMap<String, Node>, own: &Lease, mac: Option<&Mac>) {
        let want = lease::own_annotations(self.backend, self.vni, mac, own.public_ip);
        let have = nodes
            .get(&self.node)
            .and_then(|n| n.metadata.annotations.clone())
            .unwrap_or_default();
        if want.iter().all(|(k, v)| have.get(k) == Some(v)) {
            return;
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = serde_json::json!({"metadata": {"annotations": want}});
        match api
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = %self.node, backend = self.backend.annotation(), vtep_mac = ?mac.map(Mac::as_str), "published the node's backend annotations")
            }
            Err(e) => tracing::warn!(node = %self.node, error = %e, "cannot annotate this node"),
        }
    }
}

/// Runs the agent until `shutdown` completes (how `nodus node` embeds it). Routes and the
/// device stay in place when it stops, as flannel leaves them: pods keep talking while the
/// node restarts.
pub async fn run_until(
    args: PodnetArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), PodnetError> {
    if args.flannel_backend == Backend::None {
        tracing::info!("flannel backend none: the pod network across nodes is not programmed");
        return Ok(());
    }
    let node = args
        .hostname_override
        .clone()
        .ok_or(PodnetError::NoNodeName)?;
    let kubeconfig = args.kubeconfig.as_ref().ok_or(PodnetError::NoKubeconfig)?;
    let client = client(kubeconfig).await?;
    enable_forwarding();
    tracing::info!(node = %node, backend = args.flannel_backend.annotation(), "starting the pod network agent");
    let store = Arc::new(Mutex::new(Store::default()));
    let changed = Arc::new(tokio::sync::Notify::new());
    let watch = tokio::spawn(watch_nodes(client.clone(), store.clone(), changed.clone()));
    let mut agent = Agent {
        client,
        node,
        backend: args.flannel_backend,
        vni: args.vxlan_vni.unwrap_or(vxlan::DEFAULT_VNI),
        port: args.vxlan_port.unwrap_or(vxlan::DEFAULT_PORT),
        kernel: None,
        memory: Memory::default(),
    };
    let work = async {
        loop {
            let force = tokio::select! {
                _ = changed.notified() => false,
                _ = tokio::time::sleep(RESYNC) => true,
            };
            let nodes = match store.lock() {
                Ok(s) if s.synced => s.nodes.clone(),
                _ => continue,
            };
            agent.sync(nodes, force).await;
        }
    };
    tokio::select! {
        _ = shutdown => {}
        _ = work => {}
    }
    watch.abort();
    tracing::info!("pod network agent stopping; routes stay in place");
    Ok(())
}
