//! CreateContainer: a writable overlay over the image's snapshots and an OCI bundle built
//! from the CRI config. As in containerd, where the task is made by StartContainer, no
//! process exists yet: StartContainer's shim creates and starts the container with one
//! `runc run --detach`, one runc process fewer than `runc create` + `runc start`. Anything
//! half-made is undone when a step fails, so a failed create leaves no mount, directory or
//! name behind.

use super::Inner;
use super::run_pod_sandbox::namespace_mode;
use crate::container::rootfs::Idmap;
use crate::container::spec::{
    ImageMount, NamespaceRef, PodUserNamespace, SandboxFiles, SandboxNamespaces, SpecInput,
};
use crate::state::{ContainerRecord, ContainerState, SandboxRecord, SandboxState, encode, new_id};
use cri::runtime::v1 as pb;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tonic::Status;

/// Undo actions run in reverse order unless the create succeeds.
#[derive(Default)]
struct Undo {
    steps: Vec<Box<dyn FnOnce() + Send>>,
}

impl Undo {
    fn push(&mut self, f: impl FnOnce() + Send + 'static) {
        self.steps.push(Box::new(f));
    }
    fn disarm(mut self) {
        self.steps.clear();
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        while let Some(f) = self.steps.pop() {
            f();
        }
    }
}

/// The PID namespace a container in PID mode TARGET joins (`kubectl debug --target`): the
/// one of `target_id`'s init process, which must be a running container of the same
/// sandbox (containerd's validateTargetContainer). `None` for any other PID mode.
fn target_pid_namespace(
    inner: &Inner,
    cfg: &pb::ContainerConfig,
    sandbox_id: &str,
) -> Result<Option<NamespaceRef>, Status> {
    let Some(opts) = cfg
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .filter(|o| o.pid == pb::NamespaceMode::Target as i32)
    else {
        return Ok(None);
    };
    let invalid = |why: String| {
        Status::invalid_argument(format!(
            "invalid target container {:?} for pid namespace mode TARGET: {why}",
            opts.target_id
        ))
    };
    if opts.target_id.is_empty() {
        return Err(invalid("target_id is empty".into()));
    }
    let target = inner
        .find_container(&opts.target_id)
        .map_err(|_| invalid("container does not exist".into()))?;
    if target.sandbox_id != sandbox_id {
        return Err(invalid(format!(
            "container belongs to sandbox {:?}, not {sandbox_id:?}",
            target.sandbox_id
        )));
    }
    match (target.state, target.init_pid) {
        (ContainerState::Running, Some(pid)) => Ok(Some(NamespaceRef::Process(pid))),
        (state, _) => Err(invalid(format!(
            "container is not running (state {state:?})"
        ))),
    }
}

pub(crate) fn sandbox_namespaces(
    rec: &SandboxRecord,
    sb: &pb::PodSandboxConfig,
    container_pid_mode: Option<pb::NamespaceMode>,
) -> SandboxNamespaces {
    let net = namespace_mode(sb, |o| o.network);
    let ipc = namespace_mode(sb, |o| o.ipc);
    let pid = container_pid_mode.unwrap_or_else(|| namespace_mode(sb, |o| o.pid));
    SandboxNamespaces {
        network: rec.netns.clone(),
        ipc: rec.ipc_ns.clone(),
        uts: rec.uts_ns.clone(),
        pid: match pid {
            pb::NamespaceMode::Pod => rec.pid_ns.clone().map(NamespaceRef::Path),
            _ => None,
        },
        target_pid: None,
        host_network: net == pb::NamespaceMode::Node,
        host_ipc: ipc == pb::NamespaceMode::Node,
        host_pid: pid == pb::NamespaceMode::Node,
        user: rec
            .user_namespace()
            .map(|(path, mappings)| PodUserNamespace {
                path: path.to_path_buf(),
                mappings: mappings.clone(),
            }),
    }
}

/// Points every bind mount of directories and files (volumes, the sandbox's files) at an
/// idmapped copy under `dir/idmapped-mounts`, so that files the host's root owns show as
/// the pod's root's. Image volumes are idmapped already; a source on a filesystem without
/// idmap support (procfs, sysfs) is bound as it is, with a log line.
fn idmap_bind_mounts(
    mut spec: oci_spec::runtime::Spec,
    userns: &Path,
    dir: &Path,
) -> Result<oci_spec::runtime::Spec, Status> {
    let already = dir.join("image-volumes");
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    for (i, m) in mounts.iter_mut().enumerate() {
        let opts = m.options().clone().unwrap_or_default();
        let bind =
            m.typ().as_deref() == Some("bind") || opts.iter().any(|o| o == "bind" || o == "rbind");
        let Some(source) = m
            .source()
            .clone()
            .filter(|s| bind && !s.starts_with(&already))
        else {
            continue;
        };
        let regular = std::fs::metadata(&source).is_ok_and(|md| md.is_dir() || md.is_file());
        if !regular {
            continue;
        }
        let target = dir.join("idmapped-mounts").join(i.to_string());
        let recursive = opts.iter().any(|o| o == "rbind");
        match crate::container::rootfs::idmap_bind_source(&source, &target, userns, recursive) {
            Ok(Some(mapped)) => {
                m.set_source(Some(mapped));
            }
            Ok(None) => {
                tracing::info!(source = %source.display(), destination = %m.destination().display(), "the source's filesystem cannot be idmapped; bound as is (its files show as nobody in the pod)");
            }
            Err(e) => {
                return Err(Status::internal(format!(
                    "idmapping mount {}: {e}",
                    m.destination().display()
                )));
            }
        }
    }
    spec.set_mounts(Some(mounts));
    Ok(spec)
}

pub(crate) fn sandbox_files(rec: &SandboxRecord) -> SandboxFiles {
    let existing = |p: PathBuf| p.exists().then_some(p);
    SandboxFiles {
        hostname: existing(rec.dir.join("hostname")),
        resolv_conf: existing(rec.dir.join("resolv.conf")),
        hosts: existing(rec.dir.join("hosts")),
        dev_shm: existing(rec.dir.join("shm")),
    }
}

/// The runtime's own oom_score_adj: containers may not go below it (this machine kind
/// cannot lower it at all).
fn own_oom_score_adj() -> i32 {
    std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn remove_tree(p: &Path) {
    if let Err(e) = std::fs::remove_dir_all(p)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %p.display(), error = %e, "cleanup failed");
    }
}

pub async fn create_container(
    inner: &Arc<Inner>,
    req: pb::CreateContainerRequest,
) -> Result<pb::CreateContainerResponse, Status> {
    let cfg = req
        .config
        .ok_or_else(|| Status::invalid_argument("container config is required"))?;
    let meta = cfg
        .metadata
        .clone()
        .filter(|m| !m.name.is_empty())
        .ok_or_else(|| {
            Status::invalid_argument("container config must include metadata with a name")
        })?;
    let sandbox = inner.find_sandbox(&req.pod_sandbox_id)?;
    if sandbox.state != SandboxState::Ready {
        return Err(Status::failed_precondition(format!(
            "sandbox {} is not ready: create containers only in a ready sandbox",
            sandbox.id
        )));
    }
    let sb_cfg = req
        .sandbox_config
        .clone()
        .unwrap_or_else(|| sandbox.config());
    let log_path = match (sb_cfg.log_directory.as_str(), cfg.log_path.as_str()) {
        (d, p) if !d.is_empty() && !p.is_empty() => {
            // The shim writes the log as root: a path out of the pod's log directory would
            // let a CRI client have any file on the node appended to.
            let escapes = Path::new(p).components().any(|c| {
                !matches!(
                    c,
                    std::path::Component::Normal(_) | std::path::Component::CurDir
                )
            });
            if escapes {
                return Err(Status::invalid_argument(format!(
                    "container log path {p:?} must be relative and inside the sandbox's log directory {d:?}"
                )));
            }
            Path::new(d).join(p)
        }
        _ => PathBuf::new(),
    };
    let sb_meta = sandbox.config().metadata.unwrap_or_default();
    let name = format!(
        "{}_{}_{}_{}_{}",
        meta.name, sb_meta.name, sb_meta.namespace, sb_meta.uid, meta.attempt
    );
    let image_name = cfg
        .image
        .as_ref()
        .map(|i| i.image.clone())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Status::invalid_argument("container config must name an image"))?;
    let image = inner
        .images
        .resolve(&image_name)
        .map_err(|e| super::super::image::status("CreateContainer", e))?
        .ok_or_else(|| {
            Status::not_found(format!(
                "failed to get image {image_name:?}: image not found; pull it first"
            ))
        })?;
    let rt = inner
        .handlers
        .get(&sandbox.handler)
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
    if rt.kind == crate::oci::CliKind::Runsc {
        crate::oci::gvisor::check_container(&cfg)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    // Resolved before anything is made, so a bad target leaves nothing behind.
    let target_pid = target_pid_namespace(inner, &cfg, &sandbox.id)?;

    // No NRI plugin synchronizes between this container's hook and its record.
    let sync_block = match inner.nri() {
        Some(n) => Some(n.block_sync().await),
        None => None,
    };
    let id = new_id();
    {
        let mut names = inner.names.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(holder) = names.reserve(&name, &id) {
            return Err(Status::already_exists(format!(
                "failed to reserve container name {name:?}: name {name:?} is reserved for {holder:?}"
            )));
        }
    }
    let mut undo = Undo::default();
    {
        let inner = Arc::clone(inner);
        let name = name.clone();
        undo.push(move || {
            inner
                .names
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .release(&name)
        });
    }

    let dir = crate::statedir::entry_dir(&inner.state_dir.join("containers"), &id);
    let bundle = dir.join("bundle");
    let rootfs = bundle.join("rootfs");
    let shim_dir = dir.join("shim");
    let layer_dir = inner.root_dir.join("layers").join(&id);
    for d in [
        &rootfs,
        &shim_dir,
        &layer_dir.join("upper"),
        &layer_dir.join("work"),
    ] {
        std::fs::create_dir_all(d)
            .map_err(|e| Status::internal(format!("creating {}: {e}", d.display())))?;
    }
    // The pod's mount namespace, where everything below is mounted and the rootfs read.
    let pod_ns = sandbox.mnt_ns.clone();
    let in_pod = |what: &str, e: crate::sandbox::SandboxError| {
        Status::internal(format!("{what} in the pod's mount namespace: {e}"))
    };
    {
        let (dir, layer_dir, pod_ns) = (dir.clone(), layer_dir.clone(), pod_ns.clone());
        // Everything this create mounts lives under `dir` (rootfs, image volumes, idmapped
        // layers and volumes): unmounted before anything is removed, or the removal would
        // reach through an idmapped volume into the volume itself.
        undo.push(move || {
            let unmounted = crate::sandbox::mountns::run_in(pod_ns.as_deref(), || {
                crate::container::rootfs::unmount_all_under(&dir)
            })
            .map_err(|e| e.to_string())
            .and_then(|r| r);
            match unmounted {
                Ok(()) => {
                    remove_tree(&dir);
                    remove_tree(&layer_dir);
                }
                Err(e) => {
                    tracing::error!(dir = %dir.display(), error = %e, "cleanup: still mounted, left in place");
                }
            }
        });
    }
    let chain = image.chain_ids();
    let idmap = sandbox.user_namespace().map(|(userns, maps)| Idmap {
        userns,
        root: maps.host_root(),
    });
    crate::sandbox::mountns::run_in(pod_ns.as_deref(), || {
        crate::container::rootfs::mount_rw(
            inner.images.snapshotter(),
            &chain,
            &layer_dir.join("upper"),
            &layer_dir.join("work"),
            &rootfs,
            idmap.as_ref(),
            &dir.join("idmapped-layers"),
        )
        .map(|m| m.keep())
    })
    .map_err(|e| in_pod("mounting the rootfs", e))?
    .map_err(|e| Status::internal(format!("mounting the rootfs of {id}: {e}")))?;

    // Image volumes: a read-only view of another image's root filesystem.
    let mut image_mounts = Vec::new();
    let mut resolved_images = Vec::new();
    for (i, m) in cfg.mounts.iter().enumerate() {
        let Some(spec) = m.image.as_ref().filter(|s| !s.image.is_empty()) else {
            continue;
        };
        let img = inner
            .images
            .resolve(&spec.image)
            .map_err(|e| super::super::image::status("CreateContainer", e))?
            .ok_or_else(|| {
                Status::not_found(format!(
                    "image volume {:?}: image {:?} not found; pull it first",
                    m.container_path, spec.image
                ))
            })?;
        let target = dir.join("image-volumes").join(i.to_string());
        std::fs::create_dir_all(&target)
            .map_err(|e| Status::internal(format!("creating {}: {e}", target.display())))?;
        let host_path = crate::sandbox::mountns::run_in(pod_ns.as_deref(), || {
            crate::container::rootfs::mount_view(
                inner.images.snapshotter(),
                &img.chain_ids(),
                &target,
                idmap.as_ref(),
                &dir.join("idmapped-layers"),
            )
            .map_err(|e| Status::internal(format!("mounting image volume {}: {e}", spec.image)))?
            .keep();
            if m.image_sub_path.is_empty() {
                return Ok(target.clone());
            }
            crate::container::image_sub_path::resolve(&target, &m.image_sub_path).map_err(|e| {
                Status::invalid_argument(format!(
                    "mounts[{i}]: failed to ensure image subpath {:?} in image {:?} (container path {:?}): {e}",
                    m.image_sub_path, spec.image, m.container_path
                ))
            })
        })
        .map_err(|e| in_pod("mounting an image volume", e))??;
        image_mounts.push(ImageMount {
            container_path: m.container_path.clone(),
            host_path,
        });
        resolved_images.push((i, img.id.to_string()));
    }
    // ContainerStatus reports the image each volume mounts as it resolved now (`image_ref`,
    // the id the container's own `image_ref` is), whatever the name points at later.
    let mut cfg = cfg;
    for (i, id) in resolved_images {
        if let Some(spec) = cfg.mounts[i].image.as_mut() {
            spec.image_ref = id;
        }
    }

    let image_config = inner
        .images
        .config_json(&image)
        .map_err(|e| super::super::image::status("CreateContainer", e))?;
    let container_pid_mode = cfg
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .and_then(|o| pb::NamespaceMode::try_from(o.pid).ok());
    let mut namespaces = sandbox_namespaces(&sandbox, &sb_cfg, container_pid_mode);
    namespaces.target_pid = target_pid;
    let files = sandbox_files(&sandbox);
    let cgroup_parent = sb_cfg
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.clone())
        .unwrap_or_default();
    let spec = {
        let (cfg, sb_cfg, image_config, rootfs) = (
            cfg.clone(),
            sb_cfg.clone(),
            image_config.clone(),
            rootfs.clone(),
        );
        let (id, sandbox_id) = (id.clone(), sandbox.id.clone());
        let systemd_cgroup = inner.handlers.systemd_cgroup();
        let pod_ns = pod_ns.clone();
        // In the pod's mount namespace: the user is looked up in the rootfs mounted there.
        tokio::task::spawn_blocking(move || {
            crate::sandbox::mountns::run_in(pod_ns.as_deref(), || {
                let all = ["*".to_string()];
                crate::container::spec::build(&SpecInput {
                    container_id: &id,
                    sandbox_id: &sandbox_id,
                    config: &cfg,
                    sandbox_config: &sb_cfg,
                    image_config: &image_config,
                    rootfs: &rootfs,
                    namespaces,
                    sandbox_files: files,
                    cgroup_parent: &cgroup_parent,
                    systemd_cgroup,
                    seccomp_profile_root: None,
                    oom_score_adj_floor: own_oom_score_adj(),
                    image_mounts,
                    pod_annotations: &all,
                    container_annotations: &all,
                })
            })
        })
        .await
        .map_err(|e| Status::internal(format!("spec task failed: {e}")))?
        .map_err(|e| in_pod("building the OCI spec", e))??
    };
    let mut spec = spec;
    if rt.kind == crate::oci::CliKind::Runsc {
        crate::oci::gvisor::own_sandbox(&mut spec);
    }
    if let Some(idmap) = &idmap {
        let (userns, d, pod_ns) = (idmap.userns.to_path_buf(), dir.clone(), pod_ns.clone());
        spec = tokio::task::spawn_blocking(move || {
            crate::sandbox::mountns::run_in(pod_ns.as_deref(), || {
                idmap_bind_mounts(spec, &userns, &d)
            })
        })
        .await
        .map_err(|e| Status::internal(format!("idmap task failed: {e}")))?
        .map_err(|e| in_pod("idmapping the volumes", e))??;
    }
    // Plugins' CreateContainer hook: their adjustments go into the spec; an error or a
    // conflict between two plugins fails the create, and the undo removes what it made.
    let mut side_effects = None;
    // Checked under the sync block: no plugin can join (and miss this container) after it.
    if let Some(nri) = inner.nri()
        && nri.wants(cri::nri::Event::CreateContainer)
    {
        // The seccomp profile is most of the spec (hundreds of syscall rules) and NRI
        // neither shows nor adjusts it: it stays out of the JSON round trip, which with it
        // cost the create milliseconds.
        let seccomp = spec
            .linux_mut()
            .as_mut()
            .and_then(|l| l.seccomp_mut().take());
        let mut value = serde_json::to_value(&spec)
            .map_err(|e| Status::internal(format!("encoding the OCI spec: {e}")))?;
        let mut view = crate::nri::objects::from_spec(&id, &sandbox.id, &meta.name, &value);
        view.labels = cfg.labels.clone();
        let (adjust, effects) = nri
            .create_container(crate::nri::objects::pod(&sandbox), view)
            .await?;
        crate::nri::adjust::apply(&mut value, &adjust)
            .map_err(|e| Status::invalid_argument(format!("NRI CreateContainer: {e}")))?;
        spec = serde_json::from_value(value).map_err(|e| {
            Status::invalid_argument(format!(
                "NRI CreateContainer: the adjusted OCI spec is invalid: {e}"
            ))
        })?;
        if let Some(linux) = spec.linux_mut().as_mut() {
            linux.set_seccomp(seccomp);
        }
        side_effects = Some(effects);
    }
    let config_path = bundle.join("config.json");
    let body = serde_json::to_vec_pretty(&spec)
        .map_err(|e| Status::internal(format!("encoding the OCI spec: {e}")))?;
    std::fs::write(&config_path, body)
        .map_err(|e| Status::internal(format!("writing {}: {e}", config_path.display())))?;

    let rec = ContainerRecord {
        id: id.clone(),
        sandbox_id: sandbox.id.clone(),
        config: encode(&cfg),
        decoded: Default::default(),
        name,
        image_ref: image_name,
        image_id: image.id.to_string(),
        handler: sandbox.handler.clone(),
        created_at: crate::state::now_ns(),
        started_at: 0,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        state: ContainerState::Created,
        log_path: log_path.display().to_string(),
        bundle,
        layer_dir,
        shim_dir,
        shim_pid: None,
        init_pid: None,
        user: spec.process().as_ref().map(|p| crate::state::ProcessUser {
            uid: p.user().uid(),
            gid: p.user().gid(),
            additional_gids: p.user().additional_gids().clone().unwrap_or_default(),
        }),
    };
    inner.save_container(&rec).await?;
    undo.disarm();
    drop(sync_block);
    inner.images.acquire(&image.id);
    tracing::info!(container = %id, sandbox = %sandbox.id, name = %rec.name, "container created");
    inner.emit(
        &id,
        pb::ContainerEventType::ContainerCreatedEvent,
        Some(super::pod_sandbox_status::to_status(&sandbox)),
        vec![super::container_status::to_status(&rec)],
    );
    if let Some(nri) = inner.nri() {
        if nri.wants(cri::nri::Event::PostCreateContainer)
            && let Err(e) = nri
                .post_create_container(crate::nri::objects::pod(&sandbox), nri.container(&rec))
                .await
        {
            tracing::error!(container = %id, error = %e.message(), "NRI: PostCreateContainer notification failed");
        }
        if let Some(side) = side_effects {
            nri.side_effects(side);
        }
    }
    Ok(pb::CreateContainerResponse { container_id: id })
}
