//! computePodActions and SyncPod: the diff between a pod's spec and what the runtime has,
//! and the CRI calls that close it, in upstream's order (sandbox, init containers one at a
//! time, then app containers), with restart policy, back-off, probes and hooks.

use super::container::{ContainerContext, container_config};
use super::env::EnvContext;
use super::runtime_pod::{ContainerInfo, RuntimePod, pod_status};
use super::sandbox::{pod_log_dir, sandbox_config};
use super::start_permit::StartPermit;
use super::{KubeRuntime, Waiting, image, labels};
use crate::prober::{ProbeResult, ProbeType};
use crate::volumes;
use cri::runtime::v1 as pb;
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What SyncPod will do for a pod (upstream's podActions).
#[derive(Debug, Default)]
pub struct PodActions {
    pub kill_pod: bool,
    pub create_sandbox: bool,
    /// The sandbox to start containers in (empty when one is to be created).
    pub sandbox_id: String,
    pub attempt: u32,
    /// Index into spec.initContainers of the init container to start next.
    pub next_init: Option<usize>,
    /// An init container failed under restartPolicy Never: the pod has failed.
    pub init_failed: bool,
    /// Indexes into spec.containers.
    pub start: Vec<usize>,
    /// Indexes into spec.ephemeralContainers: the ones never started (they never restart).
    pub start_ephemeral: Vec<usize>,
    /// Containers to kill: id → (name, why).
    pub kill: Vec<(ContainerInfo, String)>,
}

/// What a sync achieved, for the status and the logs.
#[derive(Debug, Default)]
pub struct SyncResult {
    pub errors: Vec<String>,
    /// The pod reached a state where nothing more will run (restart policy says so).
    pub pod_done: bool,
    /// A sandbox was to be created: whether that worked (upstream counts these for
    /// kubelet_started_user_namespaced_pods_total and its errors).
    pub sandbox_created: Option<bool>,
}

fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn exited(c: &ContainerInfo) -> bool {
    c.state == pb::ContainerState::ContainerExited
}

fn running(c: &ContainerInfo) -> bool {
    c.state == pb::ContainerState::ContainerRunning
}

/// Whether a container in state `c` should be (re)started under `policy`.
fn should_restart(c: Option<&ContainerInfo>, policy: &str) -> bool {
    match c {
        None => true,
        Some(c) if exited(c) => match policy {
            "Never" => false,
            "OnFailure" => c.exit_code != 0,
            _ => true,
        },
        Some(_) => true,
    }
}

/// What every container started in one sync shares: the pod's runtime view, its sandbox,
/// the context its container configs are built from and its place among the pods starting.
#[derive(Clone, Copy)]
struct StartContext<'a> {
    rp: &'a RuntimePod,
    sandbox_id: &'a str,
    sandbox_cfg: &'a pb::PodSandboxConfig,
    ctx: &'a ContainerContext<'a>,
    pod_ips: &'a [String],
    permit: &'a StartPermit,
}

impl KubeRuntime {
    /// Marks every container of the pod as waiting for `reason` (a pod-level step failed).
    fn all_waiting(&self, pod: &Pod, reason: &str, message: &str) {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        for c in pod_containers(pod) {
            self.set_reason(
                uid,
                &c.name,
                Some(Waiting {
                    reason: reason.into(),
                    message: message.into(),
                }),
            );
        }
    }

    /// Upstream's computePodActions over this kubelet's probe results.
    pub fn compute_pod_actions(&self, pod: &Pod, rp: &RuntimePod) -> PodActions {
        compute_pod_actions(pod, rp, &|t, id| self.probes.result(t, id))
    }

    /// CreatePodSandbox failed (the RuntimeClass lookup or the runtime): upstream's
    /// FailedCreatePodSandBox event, and the containers wait in ContainerCreating.
    fn sandbox_failed(&self, pod: &Pod, err: &str, result: &mut SyncResult) {
        let msg = format!("Failed to create pod sandbox: {err}");
        tracing::warn!(pod = %pod_name(pod), error = %msg, "CreatePodSandbox failed");
        crate::events::recorder().event(
            &crate::events::pod_ref(pod),
            crate::events::WARNING,
            "FailedCreatePodSandBox",
            &msg,
        );
        result.errors.push(msg.clone());
        self.all_waiting(pod, "ContainerCreating", &msg);
    }

    /// A pod whose user namespace cannot be had fails the step that needed it, with
    /// upstream's texts: creating the sandbox (FailedCreatePodSandBox), or configuring
    /// its containers in a sandbox that already runs (CreateContainerConfigError).
    fn user_namespace_failed(
        &self,
        pod: &Pod,
        actions: &PodActions,
        err: &str,
        result: &mut SyncResult,
    ) {
        tracing::warn!(pod = %pod_name(pod), error = %err, "user namespace for pod failed");
        if actions.create_sandbox {
            result.sandbox_created = Some(false);
            crate::events::recorder().event(
                &crate::events::pod_ref(pod),
                crate::events::WARNING,
                "FailedCreatePodSandBox",
                &format!("Failed to create pod sandbox: {err}"),
            );
            let msg = format!(
                "Failed to generate sandbox config for pod {:?}: {err}",
                pod_name_uid(pod)
            );
            self.all_waiting(pod, "ContainerCreating", &msg);
            result.errors.push(msg);
        } else {
            let spec = pod.spec.clone().unwrap_or_default();
            let inits = spec.init_containers.unwrap_or_default();
            let due = actions
                .next_init
                .and_then(|i| inits.get(i))
                .into_iter()
                .chain(actions.start.iter().filter_map(|&i| spec.containers.get(i)));
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            for c in due {
                crate::events::recorder().event(
                    &crate::events::container_ref(pod, &c.name),
                    crate::events::WARNING,
                    "Failed",
                    &format!("Error: {err}"),
                );
                self.set_reason(
                    uid,
                    &c.name,
                    Some(Waiting {
                        reason: "CreateContainerConfigError".into(),
                        message: err.to_string(),
                    }),
                );
            }
            result.errors.push(err.to_string());
        }
    }

    /// Reads the pod's runtime state and runs the actions it needs.
    pub async fn sync_pod(&self, pod: &Pod) -> Result<(SyncResult, RuntimePod), tonic::Status> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let rp = pod_status(&self.rt, &uid).await?;
        let actions = self.compute_pod_actions(pod, &rp);
        let mut result = SyncResult::default();
        tracing::debug!(pod = %pod_name(pod), ?actions.kill_pod, create_sandbox = actions.create_sandbox,
            next_init = ?actions.next_init, start = ?actions.start, kill = actions.kill.len(), "computed pod actions");

        if actions.kill_pod {
            self.kill_pod(pod, &rp, None).await;
            if !actions.create_sandbox {
                result.pod_done = true;
                return Ok((result, pod_status(&self.rt, &uid).await?));
            }
        }
        for (c, why) in &actions.kill {
            tracing::info!(pod = %pod_name(pod), container = %c.name, reason = %why, "killing container");
            crate::events::recorder().event(
                &crate::events::container_ref(pod, &c.name),
                crate::events::NORMAL,
                "Killing",
                why,
            );
            self.kill_container(pod, c, None).await;
        }

        // A pod's first sync waits for its place among the pods starting (from here, its
        // volumes are the first thing it mounts).
        let permit = if actions.create_sandbox {
            StartPermit::acquire(self.pod_starts.as_ref()).await
        } else {
            StartPermit::default()
        };
        // The configMaps and secrets of volumes and env, read once for this sync.
        let objects = volumes::fetch(
            self.objects.get().map(|c| c.as_ref()),
            self.tokens.get().map(|t| t.as_ref()),
            pod,
        )
        .await;
        let volume_ctx = EnvContext {
            node_name: self.settings.sandbox.node_name.clone(),
            host_ips: self.settings.host_ips.clone(),
            pod_ips: Vec::new(),
            node_cpu_milli: self.settings.node_cpu_milli,
            node_memory_bytes: self.settings.node_memory_bytes,
            objects: objects.clone(),
            service_env: Default::default(),
        };
        let volumes = match volumes::set_up(&self.settings.root_dir, pod, &volume_ctx) {
            Ok(v) => v,
            Err(e) => {
                result.errors.push(e.to_string());
                self.all_waiting(pod, "ContainerCreating", &e.to_string());
                crate::events::recorder().event(
                    &crate::events::pod_ref(pod),
                    "Warning",
                    "FailedMount",
                    &e.to_string(),
                );
                return Ok((result, rp));
            }
        };

        let mut sandbox_id = actions.sandbox_id.clone();
        let spec = pod.spec.clone().unwrap_or_default();
        // The pod cgroup exists before anything runs in it (upstream's pcm.EnsureExists).
        let creates = actions.create_sandbox
            || !actions.start.is_empty()
            || !actions.start_ephemeral.is_empty()
            || actions.next_init.is_some();
        let acted = creates || !actions.kill.is_empty();
        let cgroup = if creates {
            match self.cm.ensure_pod(pod) {
                Ok(p) => p,
                Err(e) => {
                    let msg = format!("failed to create the pod's cgroup: {e}");
                    result.errors.push(msg.clone());
                    self.all_waiting(pod, "ContainerCreating", &msg);
                    return Ok((result, rp));
                }
            }
        } else {
            self.cm.pod_cgroup(pod)
        };
        // upstream computes the user namespace while generating the sandbox and container
        // configs; it is needed only when something is about to be created.
        let userns = if creates {
            match self.user_namespace(pod).await {
                Ok(u) => u,
                Err(e) => {
                    self.user_namespace_failed(pod, &actions, &e, &mut result);
                    return Ok((result, rp));
                }
            }
        } else {
            None
        };
        let cfg = sandbox_config(
            pod,
            actions.attempt,
            &cgroup,
            &self.settings.sandbox,
            userns.as_ref(),
        );
        if actions.create_sandbox {
            let log_dir = pod_log_dir(&self.settings.sandbox.pod_logs_dir, pod);
            result.sandbox_created = Some(false);
            if let Err(e) = std::fs::create_dir_all(&log_dir) {
                result.errors.push(format!(
                    "create pod log directory {}: {e}",
                    log_dir.display()
                ));
                return Ok((result, rp));
            }
            let handler = match self.runtime_handler(pod).await {
                Ok(h) => h,
                Err(e) => {
                    self.sandbox_failed(pod, &e.to_string(), &mut result);
                    return Ok((result, rp));
                }
            };
            let started = Instant::now();
            match self
                .rt
                .runtime
                .clone()
                .run_pod_sandbox(pb::RunPodSandboxRequest {
                    config: Some(cfg.clone()),
                    runtime_handler: handler,
                })
                .await
            {
                Ok(r) => {
                    result.sandbox_created = Some(true);
                    sandbox_id = r.into_inner().pod_sandbox_id;
                    tracing::info!(pod = %pod_name(pod), sandbox = %sandbox_id, took = ?started.elapsed(), "started pod sandbox");
                }
                Err(e) => {
                    self.sandbox_failed(pod, e.message(), &mut result);
                    return Ok((result, rp));
                }
            }
        }
        let pod_ips = if actions.create_sandbox {
            match self
                .rt
                .runtime
                .clone()
                .pod_sandbox_status(pb::PodSandboxStatusRequest {
                    pod_sandbox_id: sandbox_id.clone(),
                    verbose: false,
                })
                .await
            {
                Ok(r) => r
                    .into_inner()
                    .status
                    .and_then(|s| s.network)
                    .map(|n| {
                        let mut v = vec![n.ip];
                        v.extend(n.additional_ips.into_iter().map(|i| i.ip));
                        v.retain(|s| !s.is_empty());
                        v
                    })
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            }
        } else {
            rp.ips()
        };
        let pod_ips = if spec.host_network.unwrap_or(false) {
            self.settings.host_ips.clone()
        } else {
            pod_ips
        };
        let etc_hosts = if spec.host_network.unwrap_or(false) {
            None
        } else {
            match volumes::write_etc_hosts(&self.settings.root_dir, pod, &pod_ips) {
                Ok(p) => Some(p),
                Err(e) => {
                    result.errors.push(e.to_string());
                    None
                }
            }
        };
        let env = EnvContext {
            node_name: self.settings.sandbox.node_name.clone(),
            host_ips: self.settings.host_ips.clone(),
            pod_ips: pod_ips.clone(),
            node_cpu_milli: self.settings.node_cpu_milli,
            node_memory_bytes: self.settings.node_memory_bytes,
            objects,
            service_env: self.service_env(pod),
        };
        let ctx = ContainerContext {
            root_dir: &self.settings.root_dir,
            volumes: &volumes,
            etc_hosts: etc_hosts.as_deref(),
            env: &env,
            node_memory_bytes: self.settings.node_memory_bytes,
            cfs_quota: self.cm.config.cpu_cfs_quota,
            cfs_period_us: self.cm.config.cpu_cfs_quota_period_us,
            memory_qos: self.cm.memory_qos(),
            userns: userns.as_ref(),
        };

        let start = StartContext {
            rp: &rp,
            sandbox_id: &sandbox_id,
            sandbox_cfg: &cfg,
            ctx: &ctx,
            pod_ips: &pod_ips,
            permit: &permit,
        };
        // Ephemeral containers first: they may be there to debug a pod stuck in init.
        let ephemeral = ephemeral_containers(pod);
        for &i in &actions.start_ephemeral {
            let Some((c, target)) = ephemeral.get(i) else {
                continue;
            };
            let kind = Kind::Ephemeral {
                target: target.as_deref(),
            };
            if let Err(e) = self.start_container(pod, c, kind, &start).await {
                result.errors.push(e);
            }
        }
        let inits = spec.init_containers.clone().unwrap_or_default();
        if let Some(i) = actions.next_init {
            let c = &inits[i];
            if let Err(e) = self.start_container(pod, c, Kind::Init, &start).await {
                result.errors.push(e);
            }
        }
        // App containers start in spec order, each after the previous one's postStart.
        for &i in &actions.start {
            let c = &spec.containers[i];
            if let Err(e) = self.start_container(pod, c, Kind::Regular, &start).await {
                result.errors.push(e);
            }
        }
        // Containers not started this round and not failing keep no stale reason.
        let ephemeral_specs = ephemeral.iter().map(|(c, _)| c);
        for c in spec
            .containers
            .iter()
            .chain(inits.iter())
            .chain(ephemeral_specs)
        {
            if rp.latest(&c.name).is_some_and(running) {
                self.set_reason(&uid, &c.name, None);
            }
        }
        if !acted {
            // Nothing changed in the runtime by this sync: the read it began with is the
            // pod's state.
            return Ok((result, rp));
        }
        let after = pod_status(&self.rt, &uid).await?;
        Ok((result, after))
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_container(
        &self,
        pod: &Pod,
        c: &Container,
        kind: Kind<'_>,
        start: &StartContext<'_>,
    ) -> Result<(), String> {
        let StartContext {
            rp,
            sandbox_id,
            sandbox_cfg,
            ctx,
            pod_ips,
            permit,
        } = *start;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let previous = rp.latest(&c.name);
        // CrashLoopBackOff: a container that exited waits out its back-off before the next start.
        let key = format!("{uid}_{}", c.name);
        if let Some(prev) = previous.filter(|p| exited(p)) {
            let finished = instant_of(prev.finished_at);
            let now = Instant::now();
            let in_backoff = self
                .crash_backoff
                .lock()
                .ok()
                .and_then(|b| b.in_backoff_since(&key, finished, now));
            if let Some(d) = in_backoff {
                let msg = format!(
                    "back-off {} restarting failed container={} pod={}",
                    human(d),
                    c.name,
                    pod_name_uid(pod)
                );
                self.set_reason(
                    &uid,
                    &c.name,
                    Some(Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message: msg.clone(),
                    }),
                );
                crate::events::recorder().event(
                    &crate::events::container_ref(pod, &c.name),
                    crate::events::WARNING,
                    "BackOff",
                    &format!(
                        "Back-off restarting failed container {} in pod {}",
                        c.name,
                        pod_name_uid(pod)
                    ),
                );
                return Err(msg);
            }
            if let Ok(mut b) = self.crash_backoff.lock() {
                b.next(&key, finished);
            }
        }
        let obj = crate::events::container_ref(pod, &c.name);
        let image_ref =
            match image::ensure_image(&self.rt, &self.image_backoff, &uid, c, &obj, permit).await {
                Ok(r) => r,
                Err(e) => {
                    self.set_reason(
                        &uid,
                        &c.name,
                        Some(Waiting {
                            reason: e.reason.into(),
                            message: e.message.clone(),
                        }),
                    );
                    return Err(e.message);
                }
            };
        let restart_count = previous.map(|p| p.restart_count + 1).unwrap_or(0);
        let fail = |reason: &str, message: String| {
            crate::events::recorder().event(
                &obj,
                crate::events::WARNING,
                "Failed",
                &format!("Error: {message}"),
            );
            self.set_reason(
                &uid,
                &c.name,
                Some(Waiting {
                    reason: reason.into(),
                    message: message.clone(),
                }),
            );
            Err(message)
        };
        let init = kind == Kind::Init;
        let mut config = match container_config(pod, c, init, restart_count, &image_ref, ctx) {
            Ok(cfg) => cfg,
            Err(e) => return fail("CreateContainerConfigError", e.0),
        };
        if let Kind::Ephemeral {
            target: Some(target),
        } = kind
        {
            // upstream's getTargetID: the target must be running to lend its namespace.
            match rp.latest(target).filter(|t| running(t)) {
                Some(t) => super::container::target_pid_namespace(&mut config, &t.id),
                None => {
                    return fail(
                        "CreateContainerConfigError",
                        format!("unable to find target container {target}"),
                    );
                }
            }
        }
        if let Some(dm) = self.cm.devices.get() {
            match dm.container_options(&uid, &c.name).await {
                Ok(Some(o)) => super::container::apply_device_options(&mut config, o),
                Ok(None) => {}
                Err(e) => return fail("CreateContainerConfigError", e),
            }
        }
        // upstream's PreCreateContainer: exclusive CPUs or the shared pool.
        if let Some(cpus) = self
            .cm
            .cpus
            .get()
            .and_then(|m| m.container_cpuset(&uid, &c.name))
        {
            let linux = config.linux.get_or_insert_with(Default::default);
            linux
                .resources
                .get_or_insert_with(Default::default)
                .cpuset_cpus = cpus;
        }
        // upstream's PreCreateContainer: the memory manager's NUMA nodes as cpuset.mems.
        if let Some(mems) = self
            .cm
            .memory
            .get()
            .and_then(|m| m.cpuset_mems(&uid, &c.name))
            && let Some(r) = config.linux.as_mut().and_then(|l| l.resources.as_mut())
        {
            r.cpuset_mems = mems;
        }
        let mut client = self.rt.runtime.clone();
        let id = match client
            .create_container(pb::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.to_string(),
                config: Some(config),
                sandbox_config: Some(sandbox_cfg.clone()),
            })
            .await
        {
            Ok(r) => r.into_inner().container_id,
            Err(e) => return fail("CreateContainerError", e.message().to_string()),
        };
        // This sync reads the pod back after the start below, so the runtime's started
        // event for an app or ephemeral container needs no sync of its own. An init
        // container's does: a sidecar's start is what lets the next container start.
        if !init {
            self.covered.created(&id);
        }
        crate::events::recorder().event(
            &obj,
            crate::events::NORMAL,
            "Created",
            &format!("Created container: {}", c.name),
        );
        if let Err(e) = client
            .start_container(pb::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
        {
            return fail("RunContainerError", e.message().to_string());
        }
        tracing::info!(pod = %pod_name(pod), container = %c.name, id = %id, restart_count, "started container");
        crate::events::recorder().event(
            &obj,
            crate::events::NORMAL,
            "Started",
            &format!("Started container {}", c.name),
        );
        self.set_reason(&uid, &c.name, None);
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            // The hook runs as long as the container makes it: not the node's start work.
            // The hook runs as long as the container makes it: not the node's start work.
            permit.release();
            let grace = grace_period(pod);
            if let Err(e) = crate::lifecycle::run_handler(
                &self.rt.runtime,
                pod,
                c,
                &id,
                h,
                pod_ips.first().map(String::as_str),
                Duration::from_secs(grace.max(1) as u64),
            )
            .await
            {
                tracing::warn!(pod = %pod_name(pod), container = %c.name, error = %e, "FailedPostStartHook");
                crate::events::recorder().event(
                    &obj,
                    crate::events::WARNING,
                    "FailedPostStartHook",
                    &e.to_string(),
                );
                let info = ContainerInfo {
                    id: id.clone(),
                    name: c.name.clone(),
                    sandbox_id: sandbox_id.to_string(),
                    state: pb::ContainerState::ContainerRunning,
                    created_at: 0,
                    started_at: 0,
                    finished_at: 0,
                    exit_code: 0,
                    reason: String::new(),
                    message: String::new(),
                    image: String::new(),
                    image_ref: String::new(),
                    image_id: String::new(),
                    hash: String::new(),
                    restart_count,
                    init,
                    annotations: HashMap::new(),
                    user: None,
                };
                self.kill_container(pod, &info, None).await;
                return fail("PostStartHookError", e.to_string());
            }
        }
        Ok(())
    }

    /// Stops one container: preStop inside the grace period, then StopContainer with what
    /// remains (at least 2 s, upstream's minimumGracePeriodInSeconds).
    pub async fn kill_container(&self, pod: &Pod, c: &ContainerInfo, grace_override: Option<i64>) {
        // A pod known only from the runtime (an orphan) carries its grace in annotations.
        let mut grace = grace_override.unwrap_or_else(|| match &pod.spec {
            Some(_) => grace_period(pod),
            None => c
                .annotations
                .get(labels::POD_TERMINATION_GRACE_PERIOD)
                .and_then(|g| g.parse().ok())
                .unwrap_or(30),
        });
        let spec_c = pod_containers(pod).into_iter().find(|x| x.name == c.name);
        let pre_stop = spec_c
            .as_ref()
            .and_then(|x| x.lifecycle.as_ref())
            .and_then(|l| l.pre_stop.clone())
            .or_else(|| {
                c.annotations
                    .get(labels::PRE_STOP_HANDLER)
                    .and_then(|s| serde_json::from_str(s).ok())
            });
        if running(c)
            && let Some(h) = pre_stop
            && grace > 0
        {
            let started = Instant::now();
            let container = spec_c.clone().unwrap_or_else(|| Container {
                name: c.name.clone(),
                ..Default::default()
            });
            let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
            if let Err(e) = crate::lifecycle::run_handler(
                &self.rt.runtime,
                pod,
                &container,
                &c.id,
                &h,
                ip.as_deref(),
                Duration::from_secs(grace as u64),
            )
            .await
            {
                tracing::warn!(pod = %pod_name(pod), container = %c.name, error = %e, "FailedPreStopHook");
                crate::events::recorder().event(
                    &crate::events::container_ref(pod, &c.name),
                    crate::events::WARNING,
                    "FailedPreStopHook",
                    &e.to_string(),
                );
            }
            grace -= started.elapsed().as_secs() as i64;
        }
        let grace = grace.max(2);
        if let Err(e) = self
            .rt
            .runtime
            .clone()
            .stop_container(pb::StopContainerRequest {
                container_id: c.id.clone(),
                timeout: grace,
            })
            .await
        {
            tracing::warn!(pod = %pod_name(pod), container = %c.name, error = %e.message(), "StopContainer failed");
        }
    }

    /// Stops every running container (in parallel, each with its own grace) and then the
    /// pod's sandboxes.
    pub async fn kill_pod(&self, pod: &Pod, rp: &RuntimePod, grace_override: Option<i64>) {
        if pod.spec.is_some() {
            for c in rp.running() {
                crate::events::recorder().event(
                    &crate::events::container_ref(pod, &c.name),
                    crate::events::NORMAL,
                    "Killing",
                    &format!("Stopping container {}", c.name),
                );
            }
        }
        let kills = rp
            .running()
            .map(|c| self.kill_container(pod, c, grace_override));
        futures::future::join_all(kills).await;
        for s in &rp.sandboxes {
            if let Err(e) = self
                .rt
                .runtime
                .clone()
                .stop_pod_sandbox(pb::StopPodSandboxRequest {
                    pod_sandbox_id: s.id.clone(),
                })
                .await
            {
                tracing::warn!(pod = %pod_name(pod), sandbox = %s.id, error = %e.message(), "StopPodSandbox failed");
            }
        }
    }

    /// Removes every container and sandbox of a pod that is gone for good.
    pub async fn remove_pod(&self, uid: &str) -> Result<(), tonic::Status> {
        let rp = pod_status(&self.rt, uid).await?;
        let mut client = self.rt.runtime.clone();
        for c in &rp.containers {
            client
                .remove_container(pb::RemoveContainerRequest {
                    container_id: c.id.clone(),
                })
                .await?;
        }
        for s in &rp.sandboxes {
            client
                .stop_pod_sandbox(pb::StopPodSandboxRequest {
                    pod_sandbox_id: s.id.clone(),
                })
                .await?;
            client
                .remove_pod_sandbox(pb::RemovePodSandboxRequest {
                    pod_sandbox_id: s.id.clone(),
                })
                .await?;
        }
        Ok(())
    }

    /// Garbage-collects a live pod's dead instances: every exited container but the newest
    /// of each name (upstream keeps one for `kubectl logs --previous`), and every sandbox
    /// but the newest once it is not ready.
    pub async fn gc_pod(&self, rp: &RuntimePod) {
        let mut client = self.rt.runtime.clone();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for c in &rp.containers {
            let n = seen.entry(c.name.as_str()).or_default();
            *n += 1;
            if *n > 2 && exited(c) {
                let _ = client
                    .remove_container(pb::RemoveContainerRequest {
                        container_id: c.id.clone(),
                    })
                    .await;
            }
        }
        for s in rp.sandboxes.iter().skip(1).filter(|s| !s.ready) {
            if rp
                .containers
                .iter()
                .any(|c| c.sandbox_id == s.id && running(c))
            {
                continue;
            }
            let _ = client
                .remove_pod_sandbox(pb::RemovePodSandboxRequest {
                    pod_sandbox_id: s.id.clone(),
                })
                .await;
        }
    }
}

/// Which list of the pod spec a container comes from: what SyncPod does differs by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind<'a> {
    Init,
    Regular,
    /// An ephemeral container, with the container whose process namespace it joins.
    Ephemeral {
        target: Option<&'a str>,
    },
}

/// spec.ephemeralContainers as containers (the fields they share), each with its
/// `targetContainerName`.
pub fn ephemeral_containers(pod: &Pod) -> Vec<(Container, Option<String>)> {
    let list = pod
        .spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or_default();
    list.iter()
        .filter_map(|ec| {
            // EphemeralContainerCommon is Container's field set, so the JSON form converts.
            let mut v = serde_json::to_value(ec).ok()?;
            if let Some(m) = v.as_object_mut() {
                m.remove("targetContainerName");
            }
            let c: Container = serde_json::from_value(v).ok()?;
            let target = ec.target_container_name.clone().filter(|t| !t.is_empty());
            Some((c, target))
        })
        .collect()
}

/// A probe result lookup: (probe, container id) → the last result.
pub type ProbeResults<'a> = &'a dyn Fn(ProbeType, &str) -> Option<ProbeResult>;

/// Upstream's computePodActions: what SyncPod must do to bring the runtime's view `rp` to
/// the pod's spec. Pure: probe results come through `probes`.
pub fn compute_pod_actions(pod: &Pod, rp: &RuntimePod, probes: ProbeResults<'_>) -> PodActions {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = restart_policy(pod);
    let host_net = spec.host_network.unwrap_or(false);
    let mut a = PodActions::default();

    // Is the sandbox still good?
    let latest = rp.sandboxes.first();
    let ready = rp.sandboxes.iter().filter(|s| s.ready).count();
    let (changed, attempt, sandbox_id) = match latest {
        None => (true, 0, String::new()),
        Some(s) if ready > 1 => (true, s.attempt + 1, s.id.clone()),
        Some(s) if !s.ready => (true, s.attempt + 1, s.id.clone()),
        Some(s) if !host_net && s.ip.is_empty() => (true, s.attempt + 1, s.id.clone()),
        Some(s) => (false, s.attempt, s.id.clone()),
    };
    a.attempt = attempt;
    a.sandbox_id = sandbox_id;
    if changed {
        a.kill_pod = true;
        // A pod that will not restart its containers does not get a second sandbox.
        if policy == "Never" && attempt != 0 && !rp.containers.is_empty() {
            return a;
        }
        let start: Vec<usize> = spec
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                let succeeded = rp
                    .latest(&c.name)
                    .is_some_and(|s| exited(s) && s.exit_code == 0);
                !(succeeded && policy == "OnFailure")
            })
            .map(|(i, _)| i)
            .collect();
        // Nothing left to start once the pod got as far as its regular containers
        // (every one succeeded under OnFailure): no new sandbox, the pod is done. A new
        // sandbox would replace the old one, and removing that one takes the finished
        // containers, and their logs, with it (upstream's computePodActions).
        if start.is_empty() && spec.containers.iter().any(|c| rp.latest(&c.name).is_some()) {
            return a;
        }
        a.create_sandbox = true;
        a.sandbox_id.clear();
        if !spec
            .init_containers
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            a.next_init = Some(0);
            return a;
        }
        a.start = start;
        return a;
    }

    // Ephemeral containers start even before initialization completes (to debug a pod
    // stuck in init), once each: one the runtime has seen is never started again.
    a.start_ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, c)| rp.latest(&c.name).is_none())
        .map(|(i, _)| i)
        .collect();

    // Init containers, strictly in order; restartable ones (sidecars) keep running.
    let inits = spec.init_containers.clone().unwrap_or_default();
    let mut initialized = true;
    for (i, c) in inits.iter().enumerate() {
        let st = rp.latest(&c.name);
        if is_sidecar(c) {
            match st {
                Some(s) if running(s) => {
                    if let Some(why) = probe_kill_reason(probes, c, s) {
                        a.kill.push((s.clone(), why));
                        a.next_init = Some(i);
                        initialized = false;
                        break;
                    }
                    if probes(ProbeType::Startup, &s.id) == Some(ProbeResult::Failure)
                        || (c.startup_probe.is_some()
                            && probes(ProbeType::Startup, &s.id) != Some(ProbeResult::Success))
                    {
                        initialized = false;
                        break;
                    }
                }
                _ => {
                    a.next_init = Some(i);
                    initialized = false;
                    break;
                }
            }
            continue;
        }
        match st {
            None => {
                a.next_init = Some(i);
                initialized = false;
                break;
            }
            Some(s) if running(s) => {
                initialized = false;
                break;
            }
            Some(s) if exited(s) && s.exit_code == 0 => continue,
            Some(s) if exited(s) => {
                if policy == "Never" {
                    a.init_failed = true;
                    a.kill_pod = true;
                    return a;
                }
                a.next_init = Some(i);
                initialized = false;
                break;
            }
            Some(s) => {
                // Created but never started, or unknown: start over.
                a.kill
                    .push((s.clone(), "Init container is in an unknown state".into()));
                a.next_init = Some(i);
                initialized = false;
                break;
            }
        }
    }
    if !initialized {
        return a;
    }

    // App containers.
    let mut keep = 0;
    for (i, c) in spec.containers.iter().enumerate() {
        let st = rp.latest(&c.name);
        match st {
            Some(s) if running(s) => {
                let why = if s.hash != labels::container_hash(c) {
                    Some(format!(
                        "Container {} definition changed, will be restarted",
                        c.name
                    ))
                } else {
                    probe_kill_reason(probes, c, s)
                };
                match why {
                    Some(why) => {
                        a.kill.push((s.clone(), why));
                        if policy != "Never" {
                            a.start.push(i);
                        }
                    }
                    None => keep += 1,
                }
            }
            Some(s) if !exited(s) => {
                a.kill
                    .push((s.clone(), "Container is in an unknown state".into()));
                a.start.push(i);
            }
            other => {
                if should_restart(other, policy) {
                    a.start.push(i);
                }
            }
        }
    }
    // Containers the spec no longer names go.
    for s in rp.running() {
        let known = spec.containers.iter().any(|c| c.name == s.name)
            || inits.iter().any(|c| c.name == s.name)
            || spec
                .ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == s.name);
        if !known {
            a.kill
                .push((s.clone(), "Container is not in the pod's spec".into()));
        }
    }
    let sidecars_running = inits
        .iter()
        .filter(|c| is_sidecar(c))
        .any(|c| rp.latest(&c.name).is_some_and(running));
    if keep == 0 && a.start.is_empty() && !sidecars_running {
        a.kill_pod = true;
    } else if keep == 0 && a.start.is_empty() && sidecars_running {
        // Every app container is done: stop the sidecars too.
        a.kill_pod = true;
    }
    a
}

fn probe_kill_reason(probes: ProbeResults<'_>, c: &Container, s: &ContainerInfo) -> Option<String> {
    if c.liveness_probe.is_some()
        && probes(ProbeType::Liveness, &s.id) == Some(ProbeResult::Failure)
    {
        return Some(format!(
            "Container {} failed liveness probe, will be restarted",
            c.name
        ));
    }
    if c.startup_probe.is_some() && probes(ProbeType::Startup, &s.id) == Some(ProbeResult::Failure)
    {
        return Some(format!(
            "Container {} failed startup probe, will be restarted",
            c.name
        ));
    }
    None
}

/// spec.initContainers followed by spec.containers.
pub fn pod_containers(pod: &Pod) -> Vec<Container> {
    let spec = pod.spec.clone().unwrap_or_default();
    spec.init_containers
        .unwrap_or_default()
        .into_iter()
        .chain(spec.containers)
        .collect()
}

/// The grace period a kill uses: the deletion's, else the spec's, else 30 s.
pub fn grace_period(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30)
}

pub fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `name_namespace(uid)`, the form upstream's messages use.
pub fn pod_name_uid(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// Maps a CRI timestamp (ns since the epoch) onto the monotonic clock.
fn instant_of(ns: i64) -> Instant {
    let now_sys = SystemTime::now();
    let now = Instant::now();
    let then = UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64);
    match now_sys.duration_since(then) {
        Ok(ago) => now.checked_sub(ago).unwrap_or(now),
        Err(_) => now,
    }
}

/// Go's Duration.String for whole seconds: `10s`, `1m20s`, `5m0s`.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberuntime::SandboxInfo;

    fn pod(restart: &str, inits: bool, ephemeral: bool) -> Pod {
        let mut spec = serde_json::json!({
            "restartPolicy": restart,
            "containers": [{"name": "app", "image": "busybox"}],
        });
        if inits {
            spec["initContainers"] = serde_json::json!([{"name": "setup", "image": "busybox"}]);
        }
        if ephemeral {
            spec["ephemeralContainers"] = serde_json::json!([
                {"name": "debugger", "image": "busybox", "targetContainerName": "app"}
            ]);
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn container(p: &Pod, name: &str, state: pb::ContainerState, exit_code: i32) -> ContainerInfo {
        let spec = p.spec.clone().unwrap_or_default();
        let hash = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == name)
            .map(labels::container_hash)
            .unwrap_or_default();
        ContainerInfo {
            id: format!("{name}-id"),
            name: name.into(),
            sandbox_id: "sb".into(),
            state,
            created_at: 1,
            started_at: 1,
            finished_at: 2,
            exit_code,
            reason: String::new(),
            message: String::new(),
            image: "busybox".into(),
            image_ref: String::new(),
            image_id: String::new(),
            hash,
            restart_count: 0,
            init: name == "setup",
            annotations: HashMap::new(),
            user: None,
        }
    }

    fn runtime(sandbox: bool, containers: Vec<ContainerInfo>) -> RuntimePod {
        RuntimePod {
            uid: "u1".into(),
            sandboxes: if sandbox {
                vec![SandboxInfo {
                    id: "sb".into(),
                    attempt: 0,
                    ready: true,
                    created_at: 1,
                    ip: "10.0.0.2".into(),
                    additional_ips: Vec::new(),
                }]
            } else {
                Vec::new()
            },
            containers,
            ..Default::default()
        }
    }

    /// computePodActions for ephemeral containers: started once in a running sandbox
    /// (even before initialization completes), never restarted, never killed as unknown,
    /// and never started in a sandbox about to be created.
    #[test]
    fn compute_pod_actions_table() {
        use pb::ContainerState::{ContainerExited as Exited, ContainerRunning as Running};
        struct Case {
            name: &'static str,
            pod: Pod,
            runtime: fn(&Pod) -> RuntimePod,
            create_sandbox: bool,
            start: Vec<usize>,
            start_ephemeral: Vec<usize>,
            next_init: Option<usize>,
            killed: Vec<&'static str>,
            kill_pod: bool,
        }
        let cases = vec![
            Case {
                name: "no sandbox: a new one, ephemeral containers wait for it",
                pod: pod("Always", false, true),
                runtime: |_| runtime(false, vec![]),
                create_sandbox: true,
                start: vec![0],
                start_ephemeral: vec![],
                next_init: None,
                killed: vec![],
                kill_pod: true,
            },
            Case {
                name: "running pod, ephemeral container not yet started",
                pod: pod("Always", false, true),
                runtime: |p| runtime(true, vec![container(p, "app", Running, 0)]),
                create_sandbox: false,
                start: vec![],
                start_ephemeral: vec![0],
                next_init: None,
                killed: vec![],
                kill_pod: false,
            },
            Case {
                name: "ephemeral container running: kept, though not a spec container",
                pod: pod("Always", false, true),
                runtime: |p| {
                    runtime(
                        true,
                        vec![
                            container(p, "debugger", Running, 0),
                            container(p, "app", Running, 0),
                        ],
                    )
                },
                create_sandbox: false,
                start: vec![],
                start_ephemeral: vec![],
                next_init: None,
                killed: vec![],
                kill_pod: false,
            },
            Case {
                name: "ephemeral container exited: never restarted, even under Always",
                pod: pod("Always", false, true),
                runtime: |p| {
                    runtime(
                        true,
                        vec![
                            container(p, "debugger", Exited, 1),
                            container(p, "app", Running, 0),
                        ],
                    )
                },
                create_sandbox: false,
                start: vec![],
                start_ephemeral: vec![],
                next_init: None,
                killed: vec![],
                kill_pod: false,
            },
            Case {
                name: "pod stuck in init: the ephemeral container starts anyway",
                pod: pod("Always", true, true),
                runtime: |p| runtime(true, vec![container(p, "setup", Running, 0)]),
                create_sandbox: false,
                start: vec![],
                start_ephemeral: vec![0],
                next_init: None,
                killed: vec![],
                kill_pod: false,
            },
            Case {
                name: "a container neither in spec nor ephemeral is killed",
                pod: pod("Always", false, false),
                runtime: |p| {
                    runtime(
                        true,
                        vec![
                            container(p, "debugger", Running, 0),
                            container(p, "app", Running, 0),
                        ],
                    )
                },
                create_sandbox: false,
                start: vec![],
                start_ephemeral: vec![],
                next_init: None,
                killed: vec!["debugger"],
                kill_pod: false,
            },
        ];
        let no_probes: ProbeResults<'_> = &|_, _| None;
        for c in cases {
            let rp = (c.runtime)(&c.pod);
            let a = compute_pod_actions(&c.pod, &rp, no_probes);
            assert_eq!(
                a.create_sandbox, c.create_sandbox,
                "{}: create_sandbox",
                c.name
            );
            assert_eq!(a.start, c.start, "{}: start", c.name);
            assert_eq!(
                a.start_ephemeral, c.start_ephemeral,
                "{}: start_ephemeral",
                c.name
            );
            assert_eq!(a.next_init, c.next_init, "{}: next_init", c.name);
            let killed: Vec<&str> = a.kill.iter().map(|(k, _)| k.name.as_str()).collect();
            assert_eq!(killed, c.killed, "{}: killed", c.name);
            assert_eq!(a.kill_pod, c.kill_pod, "{}: kill_pod", c.name);
        }
    }

    #[test]
    fn ephemeral_containers_convert_with_their_target() {
        let p = pod("Always", false, true);
        let list = ephemeral_containers(&p);
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].0.name, "debugger");
        assert_eq!(list[0].0.image.as_deref(), Some("busybox"));
        assert_eq!(list[0].1.as_deref(), Some("app"));
    }
}
