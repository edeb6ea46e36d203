//! RunPodSandbox: pinned namespaces (no pause process: bind mounts in the manner of
//! CRI-O's pinns; a tiny init only when the pod shares one PID namespace), the pod's
//! hostname, resolv.conf, hosts and /dev/shm, and its network through CNI. A failure at any
//! step undoes the steps before it.

use super::Inner;
use crate::sandbox::cni::PodNetworkInfo;
use crate::sandbox::userns::IdMap;
use crate::sandbox::{PinOptions, UserMappings, files};
use crate::state::{SandboxRecord, SandboxState, encode, new_id};
use cri::runtime::v1 as pb;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tonic::Status;

/// containerd's default /dev/shm size.
const SHM_SIZE: u64 = 64 << 20;

pub(crate) fn namespace_mode(
    cfg: &pb::PodSandboxConfig,
    pick: impl Fn(&pb::NamespaceOption) -> i32,
) -> pb::NamespaceMode {
    cfg.linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .map(pick)
        .and_then(|m| pb::NamespaceMode::try_from(m).ok())
        .unwrap_or(pb::NamespaceMode::Pod)
}

/// The pod's user namespace maps from `userns_options`: `None` for mode NODE (or none
/// given), the maps for mode POD. Refuses what containerd refuses: maps with NODE, POD
/// without both maps, empty or overflowing ranges, a user namespace together with the
/// host's network, IPC or PID namespace, and the modes CONTAINER and TARGET.
pub(crate) fn pod_user_namespace(
    cfg: &pb::PodSandboxConfig,
) -> Result<Option<UserMappings>, Status> {
    let field = "linux.security_context.namespace_options.userns_options";
    let Some(u) = cfg
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .and_then(|n| n.userns_options.as_ref())
    else {
        return Ok(None);
    };
    let bad = |msg: String| Err(Status::invalid_argument(format!("{field}: {msg}")));
    match pb::NamespaceMode::try_from(u.mode) {
        Ok(pb::NamespaceMode::Node) => {
            if !u.uids.is_empty() || !u.gids.is_empty() {
                return bad("mode NODE takes no uid or gid mappings".into());
            }
            Ok(None)
        }
        Ok(pb::NamespaceMode::Pod) => {
            if u.uids.is_empty() || u.gids.is_empty() {
                return bad("mode POD needs both uid and gid mappings".into());
            }
            type Pick = fn(&pb::NamespaceOption) -> i32;
            let pick: [(&str, Pick); 3] = [
                ("network", |o| o.network),
                ("IPC", |o| o.ipc),
                ("PID", |o| o.pid),
            ];
            for (kind, opt) in pick {
                if namespace_mode(cfg, opt) == pb::NamespaceMode::Node {
                    return bad(format!(
                        "a pod with a user namespace cannot use the host's {kind} namespace"
                    ));
                }
            }
            let conv = |what: &str, maps: &[pb::IdMapping]| -> Result<Vec<IdMap>, Status> {
                maps.iter()
                    .map(|m| {
                        if m.length == 0
                            || m.host_id.checked_add(m.length).is_none()
                            || m.container_id.checked_add(m.length).is_none()
                        {
                            return Err(Status::invalid_argument(format!(
                                "{field}: {what} mapping {}:{}:{} is empty or overflows",
                                m.container_id, m.host_id, m.length
                            )));
                        }
                        Ok(IdMap {
                            container_id: m.container_id,
                            host_id: m.host_id,
                            size: m.length,
                        })
                    })
                    .collect()
            };
            let maps = UserMappings {
                uids: conv("uid", &u.uids)?,
                gids: conv("gid", &u.gids)?,
            };
            for (what, m) in [("UID", &maps.uids), ("GID", &maps.gids)] {
                check_id_maps(m).map_err(|e| {
                    Status::invalid_argument(format!("{field}: {what} mapping: {e}"))
                })?;
            }
            Ok(Some(maps))
        }
        Ok(other) => bad(format!(
            "unsupported user namespace mode {} (only NODE and POD are)",
            other.as_str_name()
        )),
        Err(_) => bad(format!("unknown namespace mode {}", u.mode)),
    }
}

/// What the kernel and the pod's root need of one set of maps: container ID 0 (the pod's
/// root, who owns its files and namespaces) mapped — in containerd's words when it is not —
/// and no two lines sharing an id on either side, which the kernel refuses with a bare
/// EINVAL.
pub(crate) fn check_id_maps(maps: &[IdMap]) -> Result<(), String> {
    let range = |start: u32, size: u32| u64::from(start)..u64::from(start) + u64::from(size);
    if !maps
        .iter()
        .any(|m| range(m.container_id, m.size).contains(&0))
    {
        return Err("container ID 0 cannot be mapped to a host ID".into());
    }
    for (i, a) in maps.iter().enumerate() {
        for b in &maps[i + 1..] {
            let overlap = |x: std::ops::Range<u64>, y: std::ops::Range<u64>| {
                x.start < y.end && y.start < x.end
            };
            if overlap(range(a.container_id, a.size), range(b.container_id, b.size))
                || overlap(range(a.host_id, a.size), range(b.host_id, b.size))
            {
                return Err(format!(
                    "mappings {}:{}:{} and {}:{}:{} overlap",
                    a.container_id, a.host_id, a.size, b.container_id, b.host_id, b.size
                ));
            }
        }
    }
    Ok(())
}

fn node_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

pub async fn run_pod_sandbox(
    inner: &Arc<Inner>,
    req: pb::RunPodSandboxRequest,
) -> Result<pb::RunPodSandboxResponse, Status> {
    let cfg = req
        .config
        .ok_or_else(|| Status::invalid_argument("sandbox config is required"))?;
    let meta = cfg
        .metadata
        .clone()
        .filter(|m| !m.name.is_empty() && !m.namespace.is_empty() && !m.uid.is_empty())
        .ok_or_else(|| {
            Status::invalid_argument(
                "sandbox config must include metadata with name, namespace and uid",
            )
        })?;
    let rt = inner
        .handlers
        .get(&req.runtime_handler)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    if rt.kind == crate::oci::CliKind::Runsc {
        crate::oci::gvisor::check_sandbox(&cfg)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    let user = pod_user_namespace(&cfg)?;
    let name = format!(
        "{}_{}_{}_{}",
        meta.name, meta.namespace, meta.uid, meta.attempt
    );
    let id = new_id();
    if let Err(holder) = inner
        .names
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .reserve(&name, &id)
    {
        return Err(Status::already_exists(format!(
            "failed to reserve sandbox name {name:?}: name {name:?} is reserved for {holder:?}"
        )));
    }
    let dir = inner.pin_root.sandbox_dir(&id);
    let host_network = namespace_mode(&cfg, |o| o.network) == pb::NamespaceMode::Node;
    let host_ipc = namespace_mode(&cfg, |o| o.ipc) == pb::NamespaceMode::Node;
    let shared_pid = namespace_mode(&cfg, |o| o.pid) == pb::NamespaceMode::Pod;
    let hostname = if cfg.hostname.is_empty() || host_network {
        node_hostname()
    } else {
        cfg.hostname.clone()
    };

    let mut rec = SandboxRecord {
        id: id.clone(),
        config: encode(&cfg),
        decoded: Default::default(),
        handler: req.runtime_handler.clone(),
        created_at: crate::state::now_ns(),
        state: SandboxState::NotReady,
        name: name.clone(),
        netns: None,
        ipc_ns: None,
        uts_ns: None,
        pid_ns: None,
        pid_init: None,
        user_ns: None,
        user_mappings: user.clone(),
        mnt_ns: None,
        ip: None,
        additional_ips: Vec::new(),
        network_ready: false,
        dir: dir.clone(),
    };
    let opts = PinOptions {
        net: !host_network,
        ipc: !host_ipc,
        uts: !host_network,
        hostname: (!host_network).then(|| hostname.clone()),
        pid: shared_pid,
        user,
    };
    // Not listed until its NRI hook is done, and no plugin synchronizes in between.
    super::lock(&inner.hidden).insert(id.clone());
    let sync_block = match inner.nri() {
        Some(n) => Some(n.block_sync().await),
        None => None,
    };
    let mut result = setup(inner, &mut rec, &cfg, opts, &hostname).await;
    if result.is_ok()
        && let Some(nri) = inner.nri()
    {
        result = nri.run_pod_sandbox(crate::nri::objects::pod(&rec)).await;
    }
    if let Err(e) = result {
        tracing::warn!(sandbox = %id, error = %e.message(), "sandbox setup failed; undoing");
        teardown(inner, &rec).await;
        let _ = std::fs::remove_dir_all(&dir);
        if let Err(d) = inner.sandbox_records.delete(&id).await {
            tracing::error!(sandbox = %id, error = %d, "removing the record of a failed sandbox");
        }
        inner.sandboxes().remove(&id);
        super::lock(&inner.hidden).remove(&id);
        inner
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release(&name);
        return Err(e);
    }
    rec.state = SandboxState::Ready;
    let saved = inner.save_sandbox(&rec).await;
    super::lock(&inner.hidden).remove(&id);
    drop(sync_block);
    saved?;
    tracing::info!(sandbox = %id, name = %name, ip = ?rec.ip, "sandbox ready");
    Ok(pb::RunPodSandboxResponse { pod_sandbox_id: id })
}

async fn setup(
    inner: &Arc<Inner>,
    rec: &mut SandboxRecord,
    cfg: &pb::PodSandboxConfig,
    opts: PinOptions,
    hostname: &str,
) -> Result<(), Status> {
    let host_ipc = !opts.ipc;
    let dir = rec.dir.clone();
    std::fs::create_dir_all(&dir)
        .map_err(|e| Status::internal(format!("creating {}: {e}", dir.display())))?;
    // Record early so a crash mid-setup is cleaned up by the next start.
    inner.save_sandbox(rec).await?;
    let ns_dir = dir.join("ns");
    let pinned = tokio::task::spawn_blocking(move || crate::sandbox::pin(&ns_dir, &opts))
        .await
        .map_err(|e| Status::internal(format!("pin task failed: {e}")))?
        .map_err(|e| Status::internal(format!("failed to create namespaces: {e}")))?;
    rec.netns = pinned.net;
    rec.ipc_ns = pinned.ipc;
    rec.uts_ns = pinned.uts;
    rec.pid_ns = pinned.pid;
    rec.pid_init = pinned.pid_init;
    rec.user_ns = pinned.user;
    let privileged = cfg
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .is_some_and(|s| s.privileged);
    let pod_ns = inner
        .mount_pins
        .as_ref()
        .zip(inner.pin_root.mount_point())
        .filter(|_| !privileged);
    // Recorded with the pins, before it is made, so a crash in between still finds it to
    // undo.
    rec.mnt_ns = pod_ns.map(|(mount_pins, _)| mount_pins.pin_path(&rec.id));
    inner.save_sandbox(rec).await?;

    let file_err = |what: &str, e: crate::sandbox::SandboxError| {
        Status::internal(format!("writing the sandbox's {what}: {e}"))
    };
    files::write_hostname(&dir.join("hostname"), hostname).map_err(|e| file_err("hostname", e))?;
    files::write_resolv_conf(&dir.join("resolv.conf"), cfg.dns_config.as_ref())
        .map_err(|e| file_err("resolv.conf", e))?;
    files::write_hosts(&dir.join("hosts"), None).map_err(|e| file_err("hosts", e))?;
    let shm = (!host_ipc).then(|| dir.join("shm"));
    match pod_ns.zip(rec.mnt_ns.clone()) {
        Some(((_, pin_root), pin)) => {
            let pins: Vec<PathBuf> = [
                &rec.netns,
                &rec.ipc_ns,
                &rec.uts_ns,
                &rec.pid_ns,
                &rec.user_ns,
            ]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
            let pin_root = pin_root.to_path_buf();
            tokio::task::spawn_blocking(move || {
                crate::sandbox::mountns::create(
                    &pin,
                    &pin_root,
                    &pins,
                    shm.as_deref().map(|p| (p, SHM_SIZE)),
                )
            })
            .await
            .map_err(|e| Status::internal(format!("mount namespace task failed: {e}")))?
            .map_err(|e| {
                Status::internal(format!("failed to create the pod's mount namespace: {e}"))
            })?;
        }
        None => {
            if let Some(shm) = &shm {
                files::mount_shm(shm, SHM_SIZE).map_err(|e| file_err("/dev/shm", e))?;
            }
        }
    }

    if let Some(netns) = rec.netns.clone() {
        let pod = PodNetworkInfo::from_cri(cfg);
        let res = inner.cni.setup(&rec.id, &netns, &pod).await.map_err(|e| {
            Status::unknown(format!(
                "failed to setup network for sandbox {:?}: {e}",
                rec.id
            ))
        })?;
        rec.network_ready = true;
        rec.ip = res.primary_ip().map(|ip| ip.to_string());
        rec.additional_ips = res
            .additional_ips()
            .iter()
            .map(|ip| ip.to_string())
            .collect();
    }
    Ok(())
}

/// Undoes whatever a sandbox has of network, namespaces and /dev/shm. Idempotent; logs
/// and goes on when one step fails so the others still happen.
pub(crate) async fn teardown(inner: &Inner, rec: &SandboxRecord) {
    if rec.network_ready || rec.netns.is_some() {
        let pod = PodNetworkInfo::from_cri(&rec.config());
        if let Err(e) = inner
            .cni
            .teardown(&rec.id, rec.netns.as_deref(), &pod)
            .await
        {
            tracing::error!(sandbox = %rec.id, error = %e, "CNI DEL failed");
        }
    }
    if let Some(pid) = rec.pid_init {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let dir = rec.dir.clone();
    let pod_ns = rec.mnt_ns.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(pin) = &pod_ns
            && let Err(e) = crate::sandbox::mountns::unpin(pin)
        {
            tracing::error!(pin = %pin.display(), error = %e, "unpinning the pod's mount namespace failed");
        }
        if let Err(e) = files::unmount_shm(&dir.join("shm")) {
            tracing::error!(dir = %dir.display(), error = %e, "unmounting /dev/shm failed");
        }
        if Path::new(&dir.join("ns")).exists()
            && let Err(e) = crate::sandbox::unpin(&dir.join("ns"))
        {
            tracing::error!(dir = %dir.display(), error = %e, "unpinning namespaces failed");
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uids: Vec<pb::IdMapping>, gids: Vec<pb::IdMapping>) -> pb::PodSandboxConfig {
        pb::PodSandboxConfig {
            linux: Some(pb::LinuxPodSandboxConfig {
                security_context: Some(pb::LinuxSandboxSecurityContext {
                    namespace_options: Some(pb::NamespaceOption {
                        userns_options: Some(pb::UserNamespace {
                            mode: pb::NamespaceMode::Pod as i32,
                            uids,
                            gids,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn m(container_id: u32, host_id: u32, length: u32) -> pb::IdMapping {
        pb::IdMapping {
            container_id,
            host_id,
            length,
        }
    }

    fn refusal(cfg: &pb::PodSandboxConfig) -> (tonic::Code, String) {
        let e = pod_user_namespace(cfg).unwrap_err();
        (e.code(), e.message().to_string())
    }

    #[test]
    fn pod_user_namespace_maps_are_checked() {
        let ok = pod(vec![m(0, 65536, 65536)], vec![m(0, 65536, 65536)]);
        assert!(pod_user_namespace(&ok).unwrap().is_some());
        let two = pod(
            vec![m(0, 65536, 1000), m(1000, 200000, 1000)],
            vec![m(0, 65536, 65536)],
        );
        assert!(pod_user_namespace(&two).unwrap().is_some());

        let (code, msg) = refusal(&pod(vec![m(1, 65536, 65536)], vec![m(0, 65536, 65536)]));
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(
            msg.ends_with("UID mapping: container ID 0 cannot be mapped to a host ID"),
            "{msg}"
        );
        let (code, msg) = refusal(&pod(vec![m(0, 65536, 65536)], vec![m(100, 65536, 5)]));
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(
            msg.ends_with("GID mapping: container ID 0 cannot be mapped to a host ID"),
            "{msg}"
        );
        let (code, msg) = refusal(&pod(vec![m(0, 65536, 0)], vec![m(0, 65536, 65536)]));
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(msg.contains("is empty"), "{msg}");
        // Overlapping inside the container, then on the host.
        for uids in [
            vec![m(0, 65536, 1000), m(999, 300000, 10)],
            vec![m(0, 65536, 1000), m(5000, 66000, 10)],
        ] {
            let (code, msg) = refusal(&pod(uids, vec![m(0, 65536, 65536)]));
            assert_eq!(code, tonic::Code::InvalidArgument);
            assert!(msg.contains("overlap"), "{msg}");
        }
    }
}
