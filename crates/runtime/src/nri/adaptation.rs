//! The runtime's side of NRI (containerd/nri's "adaptation"): the NRI socket and the
//! pre-installed plugins, every plugin's synchronization, and the lifecycle events relayed
//! to the plugins subscribed to them, in index order, one event at a time.
//!
//! Ordering and races, as containerd hosts NRI:
//! * events are relayed under one lock, so plugins see them in the order the runtime made
//!   them (a container's CreateContainer before its StartContainer, and so on);
//! * a plugin's Synchronize takes the *sync* lock exclusively, and RunPodSandbox and
//!   CreateContainer hold it shared from their hook until their record is stored, so a
//!   plugin never misses a pod or container created while it synchronizes.
//!
//! A hook that fails or does not answer within the request timeout fails the CRI call; a
//! plugin that timed out is disconnected (as upstream drops it), one whose connection closed
//! is dropped and the event goes on to the others.

use super::config::NriOptions;
use super::plugin::{self, Origin, Plugin};
use super::ttrpc::CallError;
use crate::server::runtime::Inner;
use cri::nri as api;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use tonic::Status;

pub struct Nri {
    opts: NriOptions,
    plugins: Mutex<Vec<Arc<Plugin>>>,
    dispatch: tokio::sync::Mutex<()>,
    sync: tokio::sync::RwLock<()>,
    host: OnceLock<Weak<Inner>>,
    /// Containers whose StopContainer was relayed (a stop and the exit monitor both notice
    /// one exit; plugins hear of it once).
    stopped: Mutex<HashSet<String>>,
    /// Each container's [`super::objects::spec_view`]: its bundle spec is read and parsed
    /// once, not at every event (most of an event's cost on the runtime's side otherwise).
    views: Mutex<HashMap<String, api::Container>>,
}

/// What plugins asked for besides a container's own adjustment.
#[derive(Default)]
pub(crate) struct SideEffects {
    pub(crate) updates: Vec<api::ContainerUpdate>,
    pub(crate) evict: Vec<api::ContainerEviction>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Nri {
    /// Listens on the NRI socket, starts the pre-installed plugins and synchronizes them.
    /// `host` is the runtime whose pods and containers plugins see.
    pub async fn start(opts: NriOptions, host: Weak<Inner>) -> Result<Arc<Nri>, String> {
        let nri = Arc::new(Nri {
            opts,
            plugins: Mutex::new(Vec::new()),
            dispatch: tokio::sync::Mutex::new(()),
            sync: tokio::sync::RwLock::new(()),
            host: OnceLock::new(),
            stopped: Mutex::new(HashSet::new()),
            views: Mutex::new(HashMap::new()),
        });
        let _ = nri.host.set(host);
        let listener = bind(&nri.opts.socket)?;
        if let Err(e) = nri.start_preinstalled().await {
            // The runtime may go on without NRI: no plugin should find a socket nobody serves.
            drop(listener);
            let _ = std::fs::remove_file(&nri.opts.socket);
            return Err(e);
        }
        let weak = Arc::downgrade(&nri);
        tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "NRI: stopped accepting plugin connections");
                        return;
                    }
                };
                let Some(nri) = weak.upgrade() else { return };
                // Each connection registers on its own: a slow plugin does not hold up others.
                tokio::spawn(async move {
                    match plugin::connect(stream, Origin::External, &nri.opts, Arc::downgrade(&nri))
                        .await
                    {
                        Ok(p) => nri.add(Arc::new(p)).await,
                        Err(e) => {
                            tracing::error!(error = %e, "NRI: failed to start external plugin")
                        }
                    }
                });
            }
        });
        tracing::info!(socket = %nri.opts.socket.display(), plugin_path = %nri.opts.plugin_path.display(), "NRI enabled");
        Ok(nri)
    }

    fn host(&self) -> Option<Arc<Inner>> {
        self.host.get().and_then(Weak::upgrade)
    }

    /// Starts `<idx>-<name>` executables from the plugin directory, each with one end of a
    /// socket pair as fd 3 (NRI_PLUGIN_SOCKET=3), as containerd/nri launches them.
    async fn start_preinstalled(self: &Arc<Self>) -> Result<(), String> {
        let dir = &self.opts.plugin_path;
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(format!(
                    "failed to discover plugins in {}: {e}",
                    dir.display()
                ));
            }
        };
        let mut found = Vec::new();
        for e in entries.flatten() {
            use std::os::unix::fs::PermissionsExt as _;
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() || md.permissions().mode() & 0o111 == 0 {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let (idx, base) = name.split_once('-').ok_or_else(|| {
                format!(
                    "failed to discover plugins in {}: invalid plugin name {name:?}, idx-pluginname expected",
                    dir.display()
                )
            })?;
            plugin::check_index(idx)
                .map_err(|e| format!("failed to discover plugins in {}: {e}", dir.display()))?;
            found.push((idx.to_string(), base.to_string()));
        }
        found.sort();
        for (idx, base) in found {
            let name = format!("{idx}-{base}");
            tracing::info!(plugin = %name, "NRI: starting pre-installed plugin");
            match self.launch(&idx, &base).await {
                Ok(p) => self.add(Arc::new(p)).await,
                Err(e) => {
                    tracing::warn!(plugin = %name, error = %e, "NRI: failed to start pre-installed plugin")
                }
            }
        }
        Ok(())
    }

    async fn launch(self: &Arc<Self>, idx: &str, base: &str) -> Result<Plugin, String> {
        let config = plugin::plugin_config(&self.opts.plugin_config_path, idx, base)?;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| format!("failed to create plugin connection: {e}"))?;
        ours.set_nonblocking(true)
            .map_err(|e| format!("failed to set up local connection: {e}"))?;
        let path = self.opts.plugin_path.join(format!("{idx}-{base}"));
        let mut cmd = tokio::process::Command::new(&path);
        cmd.env_clear()
            .env("NRI_PLUGIN_NAME", base)
            .env("NRI_PLUGIN_IDX", idx)
            .env("NRI_PLUGIN_SOCKET", "3")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        let fd = {
            use std::os::fd::AsRawFd as _;
            theirs.as_raw_fd()
        };
        // SAFETY: between fork and exec only async-signal-safe calls (dup2, fcntl).
        unsafe {
            cmd.pre_exec(move || {
                if fd == 3 {
                    let flags = libc::fcntl(3, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("failed to launch plugin \"{idx}-{base}\": {e}"))?;
        drop(theirs);
        let stream = tokio::net::UnixStream::from_std(ours)
            .map_err(|e| format!("failed to set up local connection: {e}"))?;
        plugin::connect(
            stream,
            Origin::Launched {
                idx: idx.to_string(),
                base: base.to_string(),
                config,
                child: Box::new(child),
            },
            &self.opts,
            Arc::downgrade(self),
        )
        .await
    }

    /// Synchronizes a configured plugin with every pod and container, then adds it to the
    /// plugins events go to — both while no pod or container is being created.
    async fn add(self: &Arc<Self>, p: Arc<Plugin>) {
        let updates = {
            let _exclusive = self.sync.write().await;
            let (pods, containers) = match self.host() {
                Some(h) => snapshot(&h),
                None => return,
            };
            let req = api::SynchronizeRequest {
                pods,
                containers,
                more: false,
            };
            let answer: Result<api::SynchronizeResponse, _> =
                p.call("Synchronize", &req, self.opts.request_timeout).await;
            match answer {
                Ok(a) => {
                    let mut list = lock(&self.plugins);
                    list.push(Arc::clone(&p));
                    list.sort_by(|a, b| a.idx.cmp(&b.idx));
                    a.update
                }
                Err(e) => {
                    tracing::error!(plugin = %p.name(), error = %e, "NRI: failed to synchronize plugin");
                    p.stop().await;
                    return;
                }
            }
        };
        tracing::info!(plugin = %p.name(), pid = ?p.pid, events = format!("0x{:x}", p.events), "NRI: plugin connected and synchronized");
        // A plugin that goes away is dropped from the list (and its process reaped).
        let weak = Arc::downgrade(self);
        let watched = Arc::clone(&p);
        tokio::spawn(async move {
            watched.closed().await;
            tracing::info!(plugin = %watched.name(), "NRI: connection to plugin closed");
            if let Some(nri) = weak.upgrade() {
                nri.remove(&watched);
            }
            watched.stop().await;
        });
        if !updates.is_empty() {
            self.side_effects(SideEffects {
                updates,
                evict: Vec::new(),
            });
        }
    }

    /// Whether any plugin hears of `event`: without one the runtime skips building what the
    /// event would carry.
    pub(crate) fn wants(&self, event: api::Event) -> bool {
        lock(&self.plugins)
            .iter()
            .any(|p| p.subscribed(event) && !p.is_closed())
    }

    /// The container `rec` describes, as events carry it.
    pub(crate) fn container(&self, rec: &crate::state::ContainerRecord) -> api::Container {
        let cached = lock(&self.views).get(&rec.id).cloned();
        let view = match cached {
            Some(v) => v,
            None => {
                let v = super::objects::spec_view(rec);
                lock(&self.views).insert(rec.id.clone(), v.clone());
                v
            }
        };
        super::objects::with_record(view, rec)
    }

    /// The container's bundle spec was rewritten (an update of its resources).
    pub(crate) fn spec_changed(&self, id: &str) {
        lock(&self.views).remove(id);
    }

    fn remove(&self, p: &Arc<Plugin>) {
        lock(&self.plugins).retain(|x| !Arc::ptr_eq(x, p));
    }

    /// The plugins subscribed to `event`, in index order.
    fn subscribed(&self, event: api::Event) -> Vec<Arc<Plugin>> {
        lock(&self.plugins)
            .iter()
            .filter(|p| p.subscribed(event) && !p.is_closed())
            .cloned()
            .collect()
    }

    /// Held by RunPodSandbox and CreateContainer from their hook until their record is
    /// stored: no plugin synchronizes in between.
    pub(crate) async fn block_sync(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.sync.read().await
    }

    /// One request to one plugin; `Ok(None)` when the plugin is gone (the event goes on).
    async fn call<Q: prost::Message, A: prost::Message + Default>(
        &self,
        p: &Arc<Plugin>,
        event: api::Event,
        req: &Q,
    ) -> Result<Option<A>, Status> {
        let m = plugin::method(event);
        let started = std::time::Instant::now();
        let answer = p.call(m, req, self.opts.request_timeout).await;
        // Where a container's NRI time goes, event by event (NODUS_LOG=debug).
        tracing::debug!(plugin = %p.name(), event = m, elapsed_us = started.elapsed().as_micros() as u64, "NRI: event relayed");
        match answer {
            Ok(a) => Ok(Some(a)),
            Err(CallError::Closed) => {
                tracing::warn!(plugin = %p.name(), event = m, "NRI: plugin connection closed; dropping it");
                self.remove(p);
                Ok(None)
            }
            Err(CallError::Timeout(t)) => {
                tracing::error!(plugin = %p.name(), event = m, "NRI: plugin did not answer in time; disconnecting it");
                self.remove(p);
                let name = p.name();
                let p = Arc::clone(p);
                tokio::spawn(async move { p.stop().await });
                Err(Status::deadline_exceeded(format!(
                    "NRI {m} failed: plugin {name:?} did not answer within {t:?}"
                )))
            }
            Err(CallError::Status { message, .. }) => Err(Status::unknown(format!(
                "NRI {m} failed: plugin {:?}: {message}",
                p.name()
            ))),
            Err(e @ CallError::Protocol(_)) => Err(Status::unknown(format!(
                "NRI {m} failed: plugin {:?}: {e}",
                p.name()
            ))),
        }
    }

    /// Relays an event that plugins only hear about.
    async fn notify<Q: prost::Message>(&self, event: api::Event, req: &Q) -> Result<(), Status> {
        for p in self.subscribed(event) {
            self.call::<_, api::Empty>(&p, event, req).await?;
        }
        Ok(())
    }

    pub(crate) async fn run_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), Status> {
        let _turn = self.dispatch.lock().await;
        self.notify(
            api::Event::RunPodSandbox,
            &api::PodSandboxRequest { pod: Some(pod) },
        )
        .await
    }

    pub(crate) async fn stop_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), Status> {
        let _turn = self.dispatch.lock().await;
        self.notify(
            api::Event::StopPodSandbox,
            &api::PodSandboxRequest { pod: Some(pod) },
        )
        .await
    }

    pub(crate) async fn remove_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), Status> {
        let _turn = self.dispatch.lock().await;
        self.notify(
            api::Event::RemovePodSandbox,
            &api::PodSandboxRequest { pod: Some(pod) },
        )
        .await
    }

    /// CreateContainer: each subscribed plugin in turn sees the container as the ones
    /// before it adjusted it; the merged adjustment, or the first error or conflict.
    pub(crate) async fn create_container(
        &self,
        pod: api::PodSandbox,
        mut container: api::Container,
    ) -> Result<(api::ContainerAdjustment, SideEffects), Status> {
        let _turn = self.dispatch.lock().await;
        let mut merge = super::adjust::Merge::default();
        let mut side = SideEffects::default();
        for p in self.subscribed(api::Event::CreateContainer) {
            let req = api::ContainerRequest {
                pod: Some(pod.clone()),
                container: Some(container.clone()),
            };
            let Some(a): Option<api::CreateContainerResponse> =
                self.call(&p, api::Event::CreateContainer, &req).await?
            else {
                continue;
            };
            if let Some(adj) = a.adjust {
                merge
                    .add(adj, &p.name(), &mut container)
                    .map_err(|e| Status::unknown(format!("NRI CreateContainer failed: {e}")))?;
            }
            side.updates.extend(a.update);
            side.evict.extend(a.evict);
        }
        Ok((merge.adjust, side))
    }

    async fn container_event(
        &self,
        event: api::Event,
        pod: api::PodSandbox,
        container: api::Container,
    ) -> Result<(), Status> {
        self.notify(
            event,
            &api::ContainerRequest {
                pod: Some(pod),
                container: Some(container),
            },
        )
        .await
    }

    pub(crate) async fn post_create_container(
        &self,
        pod: api::PodSandbox,
        c: api::Container,
    ) -> Result<(), Status> {
        let _turn = self.dispatch.lock().await;
        self.container_event(api::Event::PostCreateContainer, pod, c)
            .await
    }

    pub(crate) async fn start_container(
        &self,
        pod: api::PodSandbox,
        c: api::Container,
    ) -> Result<(), Status> {
        let _turn = self.dispatch.lock().await;
        self.container_event(api::Event::StartContainer, pod, c)
            .await
    }

    pub(crate) async fn post_start_container(
        &self,
        pod: api::PodSandbox,
        c: api::Container,
    ) -> Result<(), Status> {
        let _turn = self.dispatch.lock().await;
        self.container_event(api::Event::PostStartContainer, pod, c)
            .await
    }

    pub(crate) async fn post_update_container(
        &self,
        pod: api::PodSandbox,
        c: api::Container,
    ) -> Result<(), Status> {
        let _turn = self.dispatch.lock().await;
        self.container_event(api::Event::PostUpdateContainer, pod, c)
            .await
    }

    /// UpdateContainer: the plugins may change the update of this container (an update
    /// naming it) and ask for updates or evictions of others.
    pub(crate) async fn update_container(
        &self,
        pod: api::PodSandbox,
        container: api::Container,
        mut resources: api::LinuxResources,
    ) -> Result<(api::LinuxResources, SideEffects), Status> {
        let _turn = self.dispatch.lock().await;
        let mut side = SideEffects::default();
        for p in self.subscribed(api::Event::UpdateContainer) {
            let req = api::UpdateContainerRequest {
                pod: Some(pod.clone()),
                container: Some(container.clone()),
                linux_resources: Some(resources.clone()),
            };
            let Some(a): Option<api::UpdateContainerResponse> =
                self.call(&p, api::Event::UpdateContainer, &req).await?
            else {
                continue;
            };
            for u in a.update {
                if u.container_id == container.id {
                    if let Some(r) = u.linux.and_then(|l| l.resources) {
                        overlay(&mut resources, r);
                    }
                } else {
                    side.updates.push(u);
                }
            }
            side.evict.extend(a.evict);
        }
        Ok((resources, side))
    }

    /// StopContainer, once per container and never after its RemoveContainer: whoever
    /// notices the stop first (StopContainer, the exit monitor) relays it.
    pub(crate) async fn container_stopped(&self, id: &str) {
        let _turn = self.dispatch.lock().await;
        let Some(host) = self.host() else { return };
        let Ok(rec) = host.find_container(id) else {
            return;
        };
        if rec.state != crate::state::ContainerState::Exited
            || !lock(&self.stopped).insert(rec.id.clone())
        {
            return;
        }
        let pod = host
            .find_sandbox(&rec.sandbox_id)
            .map(|s| super::objects::pod(&s))
            .unwrap_or_default();
        let req = api::ContainerRequest {
            pod: Some(pod),
            container: Some(self.container(&rec)),
        };
        let mut updates = Vec::new();
        for p in self.subscribed(api::Event::StopContainer) {
            match self
                .call::<_, api::StopContainerResponse>(&p, api::Event::StopContainer, &req)
                .await
            {
                Ok(Some(a)) => updates.extend(a.update),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(container = %rec.id, error = %e.message(), "NRI: StopContainer notification failed")
                }
            }
        }
        if !updates.is_empty() {
            self.side_effects(SideEffects {
                updates,
                evict: Vec::new(),
            });
        }
    }

    pub(crate) async fn remove_container(&self, pod: api::PodSandbox, c: api::Container) {
        let _turn = self.dispatch.lock().await;
        lock(&self.stopped).remove(&c.id);
        lock(&self.views).remove(&c.id);
        let id = c.id.clone();
        if let Err(e) = self
            .container_event(api::Event::RemoveContainer, pod, c)
            .await
        {
            tracing::error!(container = %id, error = %e.message(), "NRI: RemoveContainer notification failed");
        }
    }

    /// Applies plugins' updates and evictions of other containers, after the event that
    /// asked for them (never under the event lock: an update may itself stop a container).
    pub(crate) fn side_effects(&self, side: SideEffects) {
        if side.updates.is_empty() && side.evict.is_empty() {
            return;
        }
        let Some(host) = self.host() else { return };
        tokio::spawn(async move {
            let failed = crate::server::runtime::nri_update(&host, side.updates).await;
            for f in failed {
                tracing::warn!(container = %f.container_id, "NRI: plugin-requested update failed");
            }
            for e in side.evict {
                if let Err(err) =
                    crate::server::runtime::nri_evict(&host, &e.container_id, &e.reason).await
                {
                    tracing::warn!(container = %e.container_id, error = %err.message(), "NRI: eviction failed");
                }
            }
        });
    }

    /// Stops every plugin (the runtime is going down).
    pub async fn shutdown(&self) {
        let all: Vec<_> = lock(&self.plugins).drain(..).collect();
        for p in all {
            p.stop().await;
        }
        let _ = std::fs::remove_file(&self.opts.socket);
    }
}

/// Sets in `base` every field `r` sets.
pub(crate) fn overlay(base: &mut api::LinuxResources, r: api::LinuxResources) {
    if let Some(m) = r.memory {
        let b = base.memory.get_or_insert_with(Default::default);
        b.limit = m.limit.or(b.limit);
        b.reservation = m.reservation.or(b.reservation);
        b.swap = m.swap.or(b.swap);
        b.swappiness = m.swappiness.or(b.swappiness);
    }
    if let Some(c) = r.cpu {
        let b = base.cpu.get_or_insert_with(Default::default);
        b.shares = c.shares.or(b.shares);
        b.quota = c.quota.or(b.quota);
        b.period = c.period.or(b.period);
        if !c.cpus.is_empty() {
            b.cpus = c.cpus;
        }
        if !c.mems.is_empty() {
            b.mems = c.mems;
        }
    }
    base.unified.extend(r.unified);
    if r.pids.is_some() {
        base.pids = r.pids;
    }
    if !r.hugepage_limits.is_empty() {
        base.hugepage_limits = r.hugepage_limits;
    }
}

/// Every pod and container, for a plugin's Synchronize.
fn snapshot(host: &Inner) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
    let pods = host.sandboxes().values().map(super::objects::pod).collect();
    let recs: Vec<_> = host.containers().values().cloned().collect();
    let containers = recs.iter().map(super::objects::container).collect();
    (pods, containers)
}

impl super::plugin::RuntimeService for Nri {
    fn update_containers(
        self: Arc<Self>,
        plugin: String,
        req: api::UpdateContainersRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = api::UpdateContainersResponse> + Send>>
    {
        Box::pin(async move {
            tracing::info!(plugin = %plugin, updates = req.update.len(), evictions = req.evict.len(), "NRI: plugin requested container updates");
            let Some(host) = self.host() else {
                return api::UpdateContainersResponse { failed: req.update };
            };
            let failed = crate::server::runtime::nri_update(&host, req.update).await;
            for e in req.evict {
                if let Err(err) =
                    crate::server::runtime::nri_evict(&host, &e.container_id, &e.reason).await
                {
                    tracing::warn!(container = %e.container_id, error = %err.message(), "NRI: eviction failed");
                }
            }
            api::UpdateContainersResponse { failed }
        })
    }
}

/// Binds the NRI socket, replacing a stale file as containerd/nri does, but refusing to
/// take the socket of a live runtime (containerd/nri would remove it and bind anew, cutting
/// the other runtime off from every plugin that connects later).
fn bind(path: &Path) -> Result<tokio::net::UnixListener, String> {
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("failed to create socket {}: {e}", path.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!(
                "another runtime is serving NRI on {}: set nri-socket in the runtime's config to another path, or nri = false",
                path.display()
            ));
        }
        let _ = std::fs::remove_file(path);
    }
    tokio::net::UnixListener::bind(path)
        .map_err(|e| format!("failed to create socket {}: {e}", path.display()))
}
