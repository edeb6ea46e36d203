//! RunPodSandbox: pinned namespaces (no pause process: bind mounts in the manner of
//! CRI-O's pinns; a tiny init only when the pod shares one PID namespace), the pod's
//! hostname, resolv.conf, hosts and /dev/shm, and its network through CNI. A failure at any
//! step undoes the steps before it.

use super::Inner;
use crate::sandbox::cni::PodNetworkInfo;
use crate::sandbox::{PinOptions, files};
use crate::state::{SandboxRecord, SandboxState, encode, new_id};
use cri::runtime::v1 as pb;
use std::path::Path;
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
    inner
        .handlers
        .get(&req.runtime_handler)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
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
    let dir = inner.state_dir.join("sandboxes").join(&id);
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
        handler: req.runtime_handler.clone(),
        created_at: crate::state::now_ns(),
        state: SandboxState::NotReady,
        name: name.clone(),
        netns: None,
        ipc_ns: None,
        uts_ns: None,
        pid_ns: None,
        pid_init: None,
        ip: None,
        additional_ips: Vec::new(),
        network_ready: false,
        dir: dir.clone(),
    };
    let result = setup(
        inner,
        &mut rec,
        &cfg,
        host_network,
        host_ipc,
        shared_pid,
        &hostname,
    )
    .await;
    if let Err(e) = result {
        tracing::warn!(sandbox = %id, error = %e.message(), "sandbox setup failed; undoing");
        teardown(inner, &rec).await;
        let _ = std::fs::remove_dir_all(&dir);
        inner
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release(&name);
        return Err(e);
    }
    rec.state = SandboxState::Ready;
    inner.save_sandbox(&rec)?;
    tracing::info!(sandbox = %id, name = %name, ip = ?rec.ip, "sandbox ready");
    Ok(pb::RunPodSandboxResponse { pod_sandbox_id: id })
}

async fn setup(
    inner: &Arc<Inner>,
    rec: &mut SandboxRecord,
    cfg: &pb::PodSandboxConfig,
    host_network: bool,
    host_ipc: bool,
    shared_pid: bool,
    hostname: &str,
) -> Result<(), Status> {
    let dir = rec.dir.clone();
    std::fs::create_dir_all(&dir)
        .map_err(|e| Status::internal(format!("creating {}: {e}", dir.display())))?;
    // Record early so a crash mid-setup is cleaned up by the next start.
    inner.save_sandbox(rec)?;
    let opts = PinOptions {
        net: !host_network,
        ipc: !host_ipc,
        uts: !host_network,
        hostname: (!host_network).then(|| hostname.to_string()),
        pid: shared_pid,
    };
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
    inner.save_sandbox(rec)?;

    let file_err = |what: &str, e: crate::sandbox::SandboxError| {
        Status::internal(format!("writing the sandbox's {what}: {e}"))
    };
    files::write_hostname(&dir.join("hostname"), hostname).map_err(|e| file_err("hostname", e))?;
    files::write_resolv_conf(&dir.join("resolv.conf"), cfg.dns_config.as_ref())
        .map_err(|e| file_err("resolv.conf", e))?;
    files::write_hosts(&dir.join("hosts"), None).map_err(|e| file_err("hosts", e))?;
    if !host_ipc {
        files::mount_shm(&dir.join("shm"), SHM_SIZE).map_err(|e| file_err("/dev/shm", e))?;
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
    let _ = tokio::task::spawn_blocking(move || {
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
