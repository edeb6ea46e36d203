//! The kubelet's Node object (upstream's kubelet_node_status.go + pkg/kubelet/nodestatus):
//! registration at start (create, or reconcile the labels of an existing Node), then a
//! status update every `nodeStatusUpdateFrequency` that is sent when something changed or
//! `nodeStatusReportFrequency` passed since the last report. The Lease ([`crate::nodelease`])
//! is the heartbeat in between.
//!
//! Readiness comes from the runtime state ([`RuntimeState`]: the CRI `Status` call every
//! 5s, as upstream's updateRuntimeUp) and the PLEG's health.

pub(crate) mod podcidr;
pub mod setters;

use crate::cm::ContainerManager;
use crate::events::{self, NORMAL};
use crate::pleg::Health;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use setters::Verdict;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the runtime's status is checked (upstream's updateRuntimeUp period).
const RUNTIME_CHECK: Duration = Duration::from_secs(5);
/// A runtime that has not answered for this long is "down" (upstream's
/// maxWaitForContainerRuntime).
const RUNTIME_DOWN_AFTER: Duration = Duration::from_secs(30);
/// upstream's nodeStatusUpdateRetry.
const UPDATE_RETRIES: usize = 5;

/// What the node is told to be.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub name: String,
    /// `--register-node`.
    pub register: bool,
    /// `--node-labels`, applied when the Node is created.
    pub labels: BTreeMap<String, String>,
    /// `--register-with-taints`.
    pub taints: Vec<Taint>,
    /// `--node-ip`, else the address of the default route's interface.
    pub node_ip: Option<IpAddr>,
    /// The kubelet API's port (daemonEndpoints).
    pub kubelet_port: i32,
    /// `nodeStatusUpdateFrequency` (10s).
    pub update_frequency: Duration,
    /// `nodeStatusReportFrequency` (5m).
    pub report_frequency: Duration,
}

/// The runtime's health as the node conditions see it (upstream's runtimeState).
#[derive(Default)]
pub struct RuntimeState {
    inner: Mutex<RuntimeInner>,
}

#[derive(Default)]
struct RuntimeInner {
    last_sync: Option<Instant>,
    runtime_error: Option<String>,
    network_error: Option<String>,
    /// `<name>://<version>`.
    version: Option<String>,
    /// The handlers and their features the last Status reported.
    handlers: Option<Vec<cri::runtime::v1::RuntimeHandler>>,
}

impl RuntimeState {
    /// One CRI `Status` (and `Version`) round.
    pub async fn check(&self, rt: &crate::cri::Runtime) {
        use cri::runtime::v1 as pb;
        let status = rt
            .runtime
            .clone()
            .status(pb::StatusRequest { verbose: false })
            .await;
        let Ok(status) = status else {
            if let Err(e) = status {
                tracing::debug!(error = %e.message(), "Container runtime sanity check failed");
            }
            return;
        };
        let version = rt
            .runtime
            .clone()
            .version(pb::VersionRequest {
                version: "v1".into(),
            })
            .await
            .ok()
            .map(|v| {
                let v = v.into_inner();
                format!("{}://{}", v.runtime_name, v.runtime_version)
            });
        let status = status.into_inner();
        let handlers = status.runtime_handlers;
        let conds = status.status.map(|s| s.conditions).unwrap_or_default();
        let describe = |c: &pb::RuntimeCondition| {
            format!(
                "{}={} reason:{} message:{}",
                c.r#type, c.status, c.reason, c.message
            )
        };
        let find = |t: &str| conds.iter().find(|c| c.r#type == t);
        let runtime_error = match find("RuntimeReady") {
            Some(c) if c.status => None,
            Some(c) => Some(format!("container runtime not ready: {}", describe(c))),
            None => Some("container runtime not ready: RuntimeReady condition not reported".into()),
        };
        let network_error = match find("NetworkReady") {
            Some(c) if c.status => None,
            Some(c) => Some(format!(
                "container runtime network not ready: {}",
                describe(c)
            )),
            None => Some(
                "container runtime network not ready: NetworkReady condition not reported".into(),
            ),
        };
        if let Ok(mut s) = self.inner.lock() {
            s.last_sync = Some(Instant::now());
            s.runtime_error = runtime_error;
            s.network_error = network_error;
            s.handlers = Some(handlers);
            if version.is_some() {
                s.version = version;
            }
        }
    }

    /// Every reason the node is not ready, in upstream's order: runtime, PLEG, network.
    pub fn errors(&self, pleg: &Health) -> Vec<String> {
        let mut errs = Vec::new();
        let Ok(s) = self.inner.lock() else {
            return vec!["runtime state is poisoned".into()];
        };
        match s.last_sync {
            None => errs.push("container runtime status check may not have completed yet".into()),
            Some(t) if t.elapsed() > RUNTIME_DOWN_AFTER => {
                errs.push("container runtime is down".into())
            }
            Some(_) => {}
        }
        if let Err(e) = pleg.check() {
            errs.push(e);
        }
        if let Some(e) = &s.runtime_error {
            errs.push(e.clone());
        }
        if let Some(e) = &s.network_error {
            errs.push(e.clone());
        }
        errs
    }

    /// The runtime handlers of the last Status answer (`None` before the first one).
    pub fn runtime_handlers(&self) -> Option<Vec<cri::runtime::v1::RuntimeHandler>> {
        self.inner.lock().ok().and_then(|s| s.handlers.clone())
    }

    pub fn version(&self) -> String {
        self.inner
            .lock()
            .ok()
            .and_then(|s| s.version.clone())
            .unwrap_or_default()
    }
}

/// Keeps the runtime state fresh, every 5s.
pub async fn run_runtime_checks(state: Arc<RuntimeState>, rt: crate::cri::Runtime) {
    let mut tick = tokio::time::interval(RUNTIME_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        state.check(&rt).await;
    }
}

/// Registers the Node and keeps its status current.
pub struct NodeStatusManager {
    pub client: kube::Client,
    pub config: NodeConfig,
    pub rt: crate::cri::Runtime,
    pub cm: Arc<ContainerManager>,
    pub pleg: Arc<Health>,
    pub runtime: Arc<RuntimeState>,
    /// The Node's uid once registered (mirror pods and the Lease point at it).
    pub node_uid: tokio::sync::watch::Sender<Option<String>>,
    /// The pressure conditions the eviction manager reports.
    pub pressure: Arc<crate::eviction::Pressure>,
    /// Whether the shutdown manager saw the node start shutting down.
    pub shutdown: Arc<crate::nodeshutdown::State>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeStatusError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
}

impl NodeStatusManager {
    fn api(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn node_ip(&self) -> Option<IpAddr> {
        self.config
            .node_ip
            .or_else(nodus_serving::hostaddr::choose_host_ip)
    }

    /// Upstream's initialNode: labels, taints, and a first status.
    async fn initial_node(&self) -> Node {
        let mut labels = setters::default_labels(&self.config.name);
        labels.extend(self.config.labels.clone());
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                labels: Some(labels),
                annotations: Some(BTreeMap::from([(
                    "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
                    "true".to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: (!self.config.taints.is_empty()).then(|| self.config.taints.clone()),
                ..Default::default()
            }),
            status: None,
        };
        let (status, _) = self.build_status(&node).await;
        node.status = Some(status);
        node
    }

    /// Adds the device plugins' resources (upstream's MachineInfo setter); `pick` takes
    /// capacity or allocatable from the device manager's (capacity, allocatable).
    fn with_devices(
        &self,
        mut list: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        pick: fn((i64, i64)) -> i64,
    ) -> BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
        if let Some(dm) = self.cm.devices.get() {
            for (name, counts) in dm.capacity() {
                let v = pick(counts);
                list.insert(
                    name,
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.to_string()),
                );
            }
        }
        list
    }

    /// The full status the node should have now, and the condition verdicts behind it.
    async fn build_status(&self, current: &Node) -> (NodeStatus, Vec<Verdict>) {
        let old = current.status.clone().unwrap_or_default();
        let mut verdicts: Vec<Verdict> = setters::pressure(
            self.pressure.memory(),
            self.pressure.disk(),
            self.pressure.pid(),
        )
        .to_vec();
        let mut errors = self.runtime.errors(&self.pleg);
        if self.shutdown.shutting_down() {
            errors.push(crate::nodeshutdown::STATUS_ERROR.to_string());
        }
        verdicts.push(setters::ready(&errors));
        let now = Time(crate::config::now_timestamp());
        let images = match self
            .rt
            .image
            .clone()
            .list_images(cri::runtime::v1::ListImagesRequest { filter: None })
            .await
        {
            Ok(r) => Some(setters::images(&r.into_inner().images)),
            Err(e) => {
                tracing::debug!(error = %e.message(), "cannot list images for the node status; keeping the last list");
                old.images.clone()
            }
        };
        let runtime_handlers = match self.runtime.runtime_handlers() {
            Some(h) => Some(setters::runtime_handlers(&h)).filter(|h| !h.is_empty()),
            None => old.runtime_handlers.clone(),
        };
        let status = NodeStatus {
            addresses: Some(setters::addresses(self.node_ip(), &self.config.name)),
            runtime_handlers,
            capacity: Some(self.with_devices(setters::resource_list(&self.cm.capacity), |c| c.0)),
            allocatable: Some(
                self.with_devices(setters::resource_list(&self.cm.allocatable), |c| c.1),
            ),
            conditions: Some(setters::conditions(
                &verdicts,
                old.conditions.as_deref().unwrap_or_default(),
                now,
            )),
            daemon_endpoints: Some(setters::daemon_endpoints(self.config.kubelet_port)),
            node_info: Some(setters::node_info(&self.runtime.version())),
            images,
            ..old
        };
        (status, verdicts)
    }

    /// Upstream's registerWithAPIServer: retries with back-off (100ms doubling to 7s)
    /// until the Node exists and carries this kubelet's default labels.
    pub async fn register(&self) -> Node {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.try_register().await {
                Ok(node) => {
                    tracing::info!(node = %self.config.name, "Successfully registered node");
                    return node;
                }
                Err(e) => {
                    tracing::warn!(node = %self.config.name, error = %e, retry_in = ?backoff, "Unable to register node with API server");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(7));
                }
            }
        }
    }

    async fn try_register(&self) -> Result<Node, NodeStatusError> {
        let node = self.initial_node().await;
        match self.api().create(&PostParams::default(), &node).await {
            Ok(created) => {
                // Some servers drop status on create: make sure it is there.
                let patch = serde_json::json!({"status": node.status});
                let n = self
                    .api()
                    .patch_status(
                        &self.config.name,
                        &PatchParams::default(),
                        &Patch::Strategic(&patch),
                    )
                    .await
                    .unwrap_or(created);
                Ok(n)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = self.api().get(&self.config.name).await?;
                // upstream's updateDefaultLabels: the standard labels follow this kubelet.
                let want = setters::default_labels(&self.config.name);
                let have = existing.metadata.labels.clone().unwrap_or_default();
                if want.iter().any(|(k, v)| have.get(k) != Some(v)) {
                    let patch = serde_json::json!({"metadata": {"labels": want}});
                    return Ok(self
                        .api()
                        .patch(
                            &self.config.name,
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await?);
                }
                Ok(existing)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Registers (when asked to), then updates the status forever.
    pub async fn run(self) {
        events::recorder().event(
            &events::node_ref(&self.config.name),
            NORMAL,
            "Starting",
            "Starting kubelet.",
        );
        // A first runtime check before registering, so a healthy node is Ready at once.
        self.runtime.check(&self.rt).await;
        let node = if self.config.register {
            Some(self.register().await)
        } else {
            None
        };
        let pod_cidr = Arc::new(podcidr::PodCidr::new(self.rt.clone()));
        if let Some(n) = &node {
            let _ = self.node_uid.send(n.metadata.uid.clone());
            pod_cidr.update(n).await;
        }
        {
            let pod_cidr = Arc::clone(&pod_cidr);
            let (client, name) = (self.client.clone(), self.config.name.clone());
            tokio::spawn(async move { pod_cidr.watch(client, name).await });
        }
        let mut last_report: Option<Instant> = None;
        let mut last_verdicts: Vec<Verdict> = Vec::new();
        let mut tick = tokio::time::interval(self.config.update_frequency);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // A shutdown starting is reported at once, not at the next tick.
            // So do the device plugins' health changes.
            let devices_changed = async {
                match self.cm.devices.get() {
                    Some(dm) => dm.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.shutdown.changed() => {}
                _ = devices_changed => {}
            }
            for attempt in 0..UPDATE_RETRIES {
                match self
                    .update_once(&pod_cidr, &mut last_report, &mut last_verdicts)
                    .await
                {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!(node = %self.config.name, attempt, error = %e, "Error updating node status, will retry");
                    }
                }
            }
        }
    }

    /// upstream's tryUpdateNodeStatus: rebuild the status and patch it when it changed or
    /// the report interval passed.
    async fn update_once(
        &self,
        pod_cidr: &podcidr::PodCidr,
        last_report: &mut Option<Instant>,
        last_verdicts: &mut Vec<Verdict>,
    ) -> Result<(), NodeStatusError> {
        let current = self.api().get(&self.config.name).await?;
        pod_cidr.update(&current).await;
        if self.node_uid.borrow().as_deref() != current.metadata.uid.as_deref() {
            let _ = self.node_uid.send(current.metadata.uid.clone());
        }
        let (status, verdicts) = self.build_status(&current).await;
        let old = current.status.clone().unwrap_or_default();
        let changed = status_changed(&old, &status);
        let due = last_report.is_none_or(|t| t.elapsed() >= self.config.report_frequency);
        if !changed && !due {
            return Ok(());
        }
        let patch = serde_json::json!({"status": status});
        self.api()
            .patch_status(
                &self.config.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await?;
        *last_report = Some(Instant::now());
        for v in &verdicts {
            let before = last_verdicts.iter().find(|o| o.type_ == v.type_);
            if before.is_none_or(|b| b.status != v.status)
                && let Some(reason) = setters::transition_event(v)
            {
                let message = format!("Node {} status is now: {reason}", self.config.name);
                events::recorder().event(
                    &events::node_ref(&self.config.name),
                    NORMAL,
                    reason,
                    &message,
                );
                tracing::info!(node = %self.config.name, condition = v.type_, status = v.status, reason = v.reason, message = %v.message, "node condition changed");
            }
        }
        *last_verdicts = verdicts;
        Ok(())
    }
}

/// Whether anything but the heartbeat times differs (upstream's nodeStatusHasChanged).
fn status_changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        if let Some(cs) = s.conditions.as_mut() {
            cs.sort_by(|a, b| a.type_.cmp(&b.type_));
        }
        serde_json::to_value(s).unwrap_or_default()
    };
    strip(old) != strip(new)
}

/// Parses `--register-with-taints` (`key=value:Effect` or `key:Effect`, comma separated).
pub fn parse_taints(s: &str) -> Result<Vec<Taint>, String> {
    let mut out = Vec::new();
    for spec in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (kv, effect) = spec
            .rsplit_once(':')
            .ok_or_else(|| format!("invalid taint spec: {spec}"))?;
        if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
            return Err(format!(
                "invalid taint effect: {effect}, unsupported taint effect"
            ));
        }
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (kv, None),
        };
        if key.is_empty() {
            return Err(format!("invalid taint spec: {spec}"));
        }
        out.push(Taint {
            key: key.to_string(),
            value,
            effect: effect.to_string(),
            time_added: None,
        });
    }
    Ok(out)
}

/// Parses `--node-labels` (`key=value,…`).
pub fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("invalid label {part:?}: expected KEY=VALUE"))?;
        if k.is_empty() {
            return Err(format!("invalid label {part:?}: empty key"));
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_parse_like_upstream() {
        let t = parse_taints("dedicated=gpu:NoSchedule,spot:PreferNoSchedule").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            (
                t[0].key.as_str(),
                t[0].value.as_deref(),
                t[0].effect.as_str()
            ),
            ("dedicated", Some("gpu"), "NoSchedule")
        );
        assert_eq!(t[1].value, None);
        assert!(parse_taints("a=b:Sometimes").is_err());
        assert!(parse_taints("nokey").is_err());
    }

    #[test]
    fn runtime_errors_in_upstream_order() {
        let pleg = Health::new(Duration::from_secs(180));
        let s = RuntimeState::default();
        assert_eq!(
            s.errors(&pleg),
            vec!["container runtime status check may not have completed yet".to_string()]
        );
        if let Ok(mut i) = s.inner.lock() {
            i.last_sync = Instant::now().checked_sub(Duration::from_secs(31));
            i.network_error = Some(
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:no CNI".into(),
            );
        }
        let errs = s.errors(&pleg);
        assert_eq!(errs[0], "container runtime is down");
        assert!(errs[1].starts_with("container runtime network not ready: NetworkReady=false"));
        let ready = setters::ready(&errs);
        assert!(ready.message.starts_with("[container runtime is down, "));
    }

    #[test]
    fn labels_parse() {
        let l = parse_labels("a=1, b=two").unwrap();
        assert_eq!(l["b"], "two");
        assert!(parse_labels("novalue").is_err());
    }

    #[test]
    fn heartbeat_alone_is_no_change() {
        let t = |s| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        let v = [setters::ready(&[])];
        let a = NodeStatus {
            conditions: Some(setters::conditions(&v, &[], t(1))),
            ..Default::default()
        };
        let b = NodeStatus {
            conditions: Some(setters::conditions(
                &v,
                a.conditions.as_deref().unwrap(),
                t(2),
            )),
            ..Default::default()
        };
        assert!(!status_changed(&a, &b));
        let c = NodeStatus {
            conditions: Some(setters::conditions(
                &[setters::ready(&["down".into()])],
                a.conditions.as_deref().unwrap(),
                t(3),
            )),
            ..Default::default()
        };
        assert!(status_changed(&a, &c));
    }
}
