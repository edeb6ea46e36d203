//! Pod volumes on the node: emptyDir (disk and Memory medium), hostPath, and the
//! API-backed [`configmap`], [`secret`] (on tmpfs), [`downwardapi`] and [`projected`] (on
//! tmpfs) volumes written by the [`atomic_writer`], plus the kubelet-managed files every container
//! gets (`/etc/hosts`, the termination-message file).
//!
//! Layout as upstream's: `<root-dir>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`,
//! `<root-dir>/pods/<uid>/etc-hosts`, `<root-dir>/pods/<uid>/containers/<name>/<restart>`.
//! The API objects a pod's volumes need are fetched first ([`fetch`], async, from the
//! [`crate::objectcache`]); [`set_up`] then writes every volume on each pod sync, so a
//! changed configMap or secret reaches the running pod at its next sync. Claims
//! ([`persistent`]) resolve to their bound PV's hostPath/local directory. Other sources
//! (CSI…) are refused with a message naming the volume.

pub mod atomic_writer;
pub mod configmap;
pub mod downwardapi;
pub mod persistent;
pub mod projected;
pub mod secret;

use crate::kuberuntime::env::EnvContext;
use crate::objectcache::{Kind, ObjectCache, ObjectData, ObjectError};
use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The API objects (and projected tokens) one pod sync works from.
#[derive(Clone, Debug, Default)]
pub struct PodObjects {
    pub objects: HashMap<(Kind, String), Result<ObjectData, ObjectError>>,
    /// (volume, path) → token, for projected serviceAccountToken sources.
    pub tokens: HashMap<(String, String), Result<String, String>>,
    /// Volume name → the bound PV's path, for persistentVolumeClaim volumes.
    pub claims: HashMap<String, Result<persistent::ClaimMount, String>>,
}

impl PodObjects {
    /// The object's keys, or why it cannot be had.
    pub fn get(&self, kind: Kind, name: &str) -> Result<&ObjectData, ObjectError> {
        match self.objects.get(&(kind, name.to_string())) {
            Some(Ok(d)) => Ok(d),
            Some(Err(e)) => Err(e.clone()),
            None => Err(ObjectError::Other(format!(
                "{} {name:?} was not fetched for this pod",
                kind.noun()
            ))),
        }
    }
}

/// Fetches everything the pod refers to in the API (registering it with the cache first),
/// and asks the token manager for the projected service-account tokens.
pub async fn fetch(
    cache: Option<&ObjectCache>,
    tokens: Option<&crate::token::Manager>,
    pod: &Pod,
) -> PodObjects {
    let mut out = PodObjects::default();
    let refs = crate::objectcache::references(pod);
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let Some(cache) = cache else {
        for (k, name) in refs {
            let msg = format!(
                "{} {name:?} not found: the kubelet runs standalone (no --kubeconfig)",
                k.noun()
            );
            out.objects
                .insert((k, name), Err(ObjectError::NotFound(msg)));
        }
        return out;
    };
    cache.register_pod(pod);
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        let Some(c) = &v.persistent_volume_claim else {
            continue;
        };
        let m = match cache.client() {
            Some(client) => {
                persistent::resolve(&client, &ns, &c.claim_name, c.read_only.unwrap_or(false)).await
            }
            None => Err(format!(
                "error processing PVC {ns}/{}: the kubelet has no API server",
                c.claim_name
            )),
        };
        out.claims.insert(v.name.clone(), m);
    }
    for (k, name) in refs {
        let v = cache.get(k, &ns, &name).await;
        out.objects.insert((k, name), v);
    }
    if let Some(tokens) = tokens {
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        for v in pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
        {
            for src in v
                .projected
                .as_ref()
                .and_then(|p| p.sources.as_ref())
                .into_iter()
                .flatten()
            {
                if let Some(t) = &src.service_account_token {
                    let token = tokens
                        .get(
                            &ns,
                            &sa,
                            &name,
                            &uid,
                            t.audience.clone().into_iter().collect(),
                            t.expiration_seconds.unwrap_or(3600),
                        )
                        .await;
                    out.tokens.insert((v.name.clone(), t.path.clone()), token);
                }
            }
        }
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("MountVolume.SetUp failed for volume {volume:?} : {message}")]
    SetUp { volume: String, message: String },
    #[error(
        "Unable to attach or mount volumes: unmounted volumes=[{volume}], unattached volumes=[], failed to process volumes=[{volume}]: {message}"
    )]
    Unmountable { volume: String, message: String },
    #[error(
        "unable to attach or mount volumes: volume {0:?} named in volumeMounts is not defined in the pod"
    )]
    Undefined(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid)
}

fn empty_dir_path(root: &Path, uid: &str, name: &str) -> PathBuf {
    pod_dir(root, uid)
        .join("volumes/kubernetes.io~empty-dir")
        .join(name)
}

fn is_mountpoint(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let (Ok(m), Some(parent)) = (std::fs::metadata(p), p.parent()) else {
        return false;
    };
    std::fs::metadata(parent)
        .map(|pm| pm.dev() != m.dev())
        .unwrap_or(false)
}

fn setup_failed(v: &Volume, message: impl Into<String>) -> VolumeError {
    VolumeError::SetUp {
        volume: v.name.clone(),
        message: message.into(),
    }
}

fn plugin_dir(root: &Path, uid: &str, plugin: &str, name: &str) -> PathBuf {
    pod_dir(root, uid)
        .join("volumes")
        .join(format!("kubernetes.io~{plugin}"))
        .join(name)
}

/// Writes an API-backed volume: its directory (a tmpfs for secrets), then the payload.
fn write_payload(
    v: &Volume,
    dir: &Path,
    tmpfs: bool,
    payload: Result<atomic_writer::Payload, String>,
) -> Result<(), VolumeError> {
    let payload = payload.map_err(|m| setup_failed(v, m))?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    if tmpfs && !is_mountpoint(dir) {
        // No nosuid/nodev, as upstream's Memory emptyDir under the secret plugin: the kubelet
        // alone writes here (modes are at most 0777), and in a pod with its own user
        // namespace those flags would be locked on the container's bind, so the OCI
        // runtime's read-only remount of it, which does not repeat them, fails with EPERM.
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("mode=0755"),
        )
        .map_err(|e| setup_failed(v, format!("mount tmpfs: {e}")))?;
    }
    match atomic_writer::write(dir, &payload) {
        Ok(true) => {
            tracing::info!(volume = %v.name, dir = %dir.display(), files = payload.len(), "volume contents updated")
        }
        Ok(false) => {}
        Err(e) => return Err(setup_failed(v, format!("write {}: {e}", dir.display()))),
    }
    Ok(())
}

/// Makes every volume of the pod ready on the host; returns name → host path.
pub fn set_up(
    root: &Path,
    pod: &Pod,
    sources: &EnvContext,
) -> Result<HashMap<String, PathBuf>, VolumeError> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut out = HashMap::new();
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        let path = if let Some(ed) = &v.empty_dir {
            let p = empty_dir_path(root, uid, &v.name);
            std::fs::create_dir_all(&p).map_err(io(&p))?;
            if ed.medium.as_deref() == Some("Memory") && !is_mountpoint(&p) {
                let mut opts = String::from("mode=0777");
                if let Some(limit) = &ed.size_limit {
                    let bytes = nodus_k8s::quantity::parse_quantity(&limit.0)
                        .map_err(|e| setup_failed(v, format!("sizeLimit: {e}")))?
                        .value();
                    opts.push_str(&format!(",size={bytes}"));
                }
                // No nosuid/nodev, as upstream's emptyDir: in a pod with its own user
                // namespace they would be locked on the container's bind (see
                // write_payload).
                nix::mount::mount(
                    Some("tmpfs"),
                    &p,
                    Some("tmpfs"),
                    nix::mount::MsFlags::empty(),
                    Some(opts.as_str()),
                )
                .map_err(|e| setup_failed(v, format!("mount tmpfs: {e}")))?;
            }
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).map_err(io(&p))?;
            p
        } else if let Some(hp) = &v.host_path {
            let p = PathBuf::from(&hp.path);
            check_host_path(&p, hp.type_.as_deref().unwrap_or(""))
                .map_err(|m| setup_failed(v, m))?;
            p
        } else if v.persistent_volume_claim.is_some() {
            let m = match sources.objects.claims.get(&v.name) {
                Some(Ok(m)) => m,
                Some(Err(message)) => {
                    return Err(VolumeError::Unmountable {
                        volume: v.name.clone(),
                        message: message.clone(),
                    });
                }
                None => {
                    return Err(VolumeError::Unmountable {
                        volume: v.name.clone(),
                        message: "the claim was not resolved for this pod".into(),
                    });
                }
            };
            persistent::record(root, m).map_err(io(&m.path))?;
            check_host_path(&m.path, &m.host_path_type).map_err(|e| setup_failed(v, e))?;
            m.path.clone()
        } else if let Some(cm) = &v.config_map {
            let p = plugin_dir(root, uid, "configmap", &v.name);
            write_payload(v, &p, false, configmap::payload(cm, &sources.objects))?;
            p
        } else if let Some(sec) = &v.secret {
            let p = plugin_dir(root, uid, "secret", &v.name);
            write_payload(v, &p, true, secret::payload(sec, &sources.objects))?;
            p
        } else if let Some(d) = &v.downward_api {
            let p = plugin_dir(root, uid, "downward-api", &v.name);
            write_payload(v, &p, false, downwardapi::payload(pod, d, sources))?;
            p
        } else if let Some(pr) = &v.projected {
            let p = plugin_dir(root, uid, "projected", &v.name);
            // Upstream's projected plugin wraps an emptyDir of medium Memory: the
            // service-account token never touches the node's disk.
            write_payload(
                v,
                &p,
                true,
                projected::payload(pod, &v.name, pr, &sources.objects, sources),
            )?;
            p
        } else {
            let kind = serde_json::to_value(v)
                .ok()
                .and_then(|j| {
                    j.as_object()
                        .and_then(|o| o.keys().find(|k| *k != "name").cloned())
                })
                .unwrap_or_else(|| "unknown".into());
            return Err(setup_failed(
                v,
                format!("volume type {kind:?} is not supported by nodus's kubelet"),
            ));
        };
        out.insert(v.name.clone(), path);
    }
    Ok(out)
}

/// hostPath `type` checks with upstream's messages.
fn check_host_path(p: &Path, kind: &str) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt as _;
    let meta = std::fs::metadata(p);
    let shown = p.display();
    match kind {
        "" => Ok(()),
        "DirectoryOrCreate" => {
            if meta.is_err() {
                std::fs::create_dir_all(p).map_err(|e| format!("create {shown}: {e}"))?;
                use std::os::unix::fs::PermissionsExt as _;
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
                return Ok(());
            }
            check_host_path(p, "Directory")
        }
        "FileOrCreate" => {
            if meta.is_err() {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("create {shown}: {e}"))?;
                return Ok(());
            }
            check_host_path(p, "File")
        }
        _ => {
            let m =
                meta.map_err(|_| format!("hostPath type check failed: {shown} does not exist"))?;
            let ft = m.file_type();
            let (ok, what) = match kind {
                "Directory" => (ft.is_dir(), "a directory"),
                "File" => (ft.is_file(), "a file"),
                "Socket" => (ft.is_socket(), "a socket file"),
                "CharDevice" => (ft.is_char_device(), "a character device"),
                "BlockDevice" => (ft.is_block_device(), "a block device"),
                other => return Err(format!("hostPath type {other:?} is not supported")),
            };
            if ok {
                Ok(())
            } else {
                Err(format!("hostPath type check failed: {shown} is not {what}"))
            }
        }
    }
}

/// Unmounts the pod's tmpfs volumes (Memory emptyDirs, secrets, projected), as upstream's
/// syncTerminatedPod waits for once the pod's containers have stopped: a pod that ran to
/// completion keeps its directory (until it is deleted) but no mount. Returns how many
/// volumes were unmounted.
pub fn unmount(root: &Path, uid: &str) -> usize {
    let mut n = 0;
    for plugin in std::fs::read_dir(pod_dir(root, uid).join("volumes"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for e in std::fs::read_dir(plugin.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let p = e.path();
            if is_mountpoint(&p) {
                match nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH) {
                    Ok(()) => n += 1,
                    Err(e) => {
                        tracing::warn!(path = %p.display(), error = %e, "UnmountVolume.TearDown failed")
                    }
                }
            }
        }
    }
    n
}

/// Unmounts the pod's tmpfs volumes and removes its directory.
pub fn tear_down(root: &Path, uid: &str) -> Result<(), VolumeError> {
    unmount(root, uid);
    let dir = pod_dir(root, uid);
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&dir)(e)),
        _ => Ok(()),
    }
}

/// The pod uids that have a directory under `<root>/pods`.
pub fn pod_dirs(root: &Path) -> Vec<String> {
    std::fs::read_dir(root.join("pods"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// The hosts file upstream's kubelet writes for pods on the pod network.
pub fn write_etc_hosts(root: &Path, pod: &Pod, pod_ips: &[String]) -> Result<PathBuf, VolumeError> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let dir = pod_dir(root, uid);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let spec = pod.spec.as_ref();
    let mut s = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    let hostname = spec
        .and_then(|s| s.hostname.clone())
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    for ip in pod_ips {
        match spec.and_then(|s| s.subdomain.as_deref()) {
            Some(sub) if !sub.is_empty() => {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                s.push_str(&format!(
                    "{ip}\t{hostname}.{sub}.{ns}.svc.cluster.local\t{hostname}\n"
                ));
            }
            _ => s.push_str(&format!("{ip}\t{hostname}\n")),
        }
    }
    if let Some(aliases) = spec.and_then(|s| s.host_aliases.as_ref()) {
        s.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            let names = a.hostnames.clone().unwrap_or_default().join("\t");
            s.push_str(&format!("{}\t{}\n", a.ip, names));
        }
    }
    let p = dir.join("etc-hosts");
    std::fs::write(&p, s).map_err(io(&p))?;
    Ok(p)
}

/// The host file bind-mounted at the container's terminationMessagePath.
pub fn termination_message_file(
    root: &Path,
    uid: &str,
    container: &Container,
    restart_count: i32,
) -> Result<PathBuf, VolumeError> {
    let dir = pod_dir(root, uid).join("containers").join(&container.name);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let p = dir.join(restart_count.to_string());
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(&p, b"").map_err(io(&p))?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).map_err(io(&p))?;
    Ok(p)
}

/// Reads what the container wrote to its termination-message file (at most 4 KiB, as upstream).
pub fn read_termination_message(root: &Path, uid: &str, name: &str, restart_count: i32) -> String {
    let p = pod_dir(root, uid)
        .join("containers")
        .join(name)
        .join(restart_count.to_string());
    let mut bytes = std::fs::read(p).unwrap_or_default();
    bytes.truncate(4096);
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_path_types_are_checked_like_upstream() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, "x").unwrap();
        assert!(check_host_path(d.path(), "Directory").is_ok());
        assert_eq!(
            check_host_path(&f, "Directory").unwrap_err(),
            format!(
                "hostPath type check failed: {} is not a directory",
                f.display()
            )
        );
        let missing = d.path().join("nope");
        assert!(
            check_host_path(&missing, "File")
                .unwrap_err()
                .contains("does not exist")
        );
        assert!(check_host_path(&missing, "DirectoryOrCreate").is_ok());
        assert!(missing.is_dir());
        let nf = d.path().join("newfile");
        assert!(check_host_path(&nf, "FileOrCreate").is_ok());
        assert!(nf.is_file());
    }
}
