//! `nodus device-plugin`: a generic host-device plugin (the role of the generic device
//! plugins deployed as DaemonSets). Each `--device NAME=PATH_OR_GLOB[,count=N]` becomes an
//! extended resource whose devices are the host device nodes matched, each offered `N`
//! times for devices many containers may share (FUSE, TUN). A device is healthy while its
//! node exists. Every resource is one plugin socket in the kubelet's device plugin
//! directory, registered over `kubelet.sock`; when the kubelet re-creates that socket
//! (a restart) the plugin serves and registers again.

use cri::deviceplugin::v1beta1 as pb;
use pb::device_plugin_server::{DevicePlugin, DevicePluginServer};
use pb::registration_client::RegistrationClient;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// How often device nodes and the kubelet's socket are looked at.
const POLL: Duration = Duration::from_secs(1);

#[derive(Debug, clap::Args)]
pub struct DevicePluginArgs {
    /// A resource and the host device nodes it offers: `NAME=PATH_OR_GLOB[,count=N]`, e.g.
    /// `devices.nodus.dev/fuse=/dev/fuse,count=10`. Repeatable. Default: fuse and tun.
    #[arg(long = "device")]
    pub devices: Vec<String>,
    /// The kubelet's device plugin directory (`<root-dir>/device-plugins`).
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    pub device_plugin_path: PathBuf,
}

/// One `--device`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    pub resource: String,
    pub pattern: String,
    pub count: usize,
}

pub fn parse_device(s: &str) -> Result<DeviceSpec, String> {
    let (resource, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("--device {s:?}: want NAME=PATH_OR_GLOB[,count=N]"))?;
    if !nodus_k8s::resources::is_extended_resource_name(resource) {
        return Err(format!(
            "--device {s:?}: {resource:?} is not an extended resource name"
        ));
    }
    let mut parts = rest.split(',');
    let pattern = parts.next().unwrap_or_default().to_string();
    if !pattern.starts_with('/') {
        return Err(format!("--device {s:?}: the path must be absolute"));
    }
    let mut count = 1;
    for p in parts {
        match p.split_once('=') {
            Some(("count", n)) => {
                count =
                    n.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        format!("--device {s:?}: count must be a positive integer")
                    })?
            }
            _ => return Err(format!("--device {s:?}: unknown option {p:?}")),
        }
    }
    Ok(DeviceSpec {
        resource: resource.to_string(),
        pattern,
        count,
    })
}

fn default_devices() -> Vec<DeviceSpec> {
    vec![
        DeviceSpec {
            resource: "devices.nodus.dev/fuse".into(),
            pattern: "/dev/fuse".into(),
            count: 1,
        },
        DeviceSpec {
            resource: "devices.nodus.dev/tun".into(),
            pattern: "/dev/net/tun".into(),
            count: 1,
        },
    ]
}

/// Shell-style match of one path component (`*`, `?`).
fn component_matches(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            component_matches(&pattern[1..], name)
                || (!name.is_empty() && component_matches(pattern, &name[1..]))
        }
        (Some(b'?'), Some(_)) => component_matches(&pattern[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => component_matches(&pattern[1..], &name[1..]),
        _ => false,
    }
}

/// The paths under `root` matching an absolute glob, sorted.
pub fn glob(root: &Path, pattern: &str) -> Vec<PathBuf> {
    let mut current = vec![PathBuf::from("/")];
    for comp in pattern.split('/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        for dir in &current {
            if !comp.contains(['*', '?']) {
                let p = dir.join(comp);
                if root
                    .join(p.strip_prefix("/").unwrap_or(&p))
                    .symlink_metadata()
                    .is_ok()
                {
                    next.push(p);
                }
                continue;
            }
            let host = root.join(dir.strip_prefix("/").unwrap_or(dir));
            let Ok(rd) = std::fs::read_dir(host) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name();
                if component_matches(comp.as_bytes(), name.as_encoded_bytes()) {
                    next.push(dir.join(name));
                }
            }
        }
        current = next;
    }
    current.sort();
    current
}

/// The devices of one resource now: `<path>` (or `<path>#<i>` when shared), healthy while
/// the node exists. Devices seen before and gone now stay listed, unhealthy.
fn list_devices(spec: &DeviceSpec, known: &mut BTreeMap<String, PathBuf>) -> Vec<pb::Device> {
    for path in glob(Path::new("/"), &spec.pattern) {
        for i in 0..spec.count {
            let id = if spec.count == 1 {
                path.display().to_string()
            } else {
                format!("{}#{i}", path.display())
            };
            known.insert(id, path.clone());
        }
    }
    known
        .iter()
        .map(|(id, path)| pb::Device {
            id: id.clone(),
            health: if path.exists() {
                "Healthy"
            } else {
                "Unhealthy"
            }
            .into(),
            topology: None,
        })
        .collect()
}

struct Plugin {
    resource: String,
    /// The device list ListAndWatch streams.
    devices: watch::Receiver<Vec<pb::Device>>,
    paths: DevicePaths,
}

type Stream<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(pb::DevicePluginOptions::default()))
    }

    async fn list_and_watch(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<Stream<pb::ListAndWatchResponse>>, Status> {
        let rx = self.devices.clone();
        let s = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let devices = rx.borrow_and_update().clone();
            Some((Ok(pb::ListAndWatchResponse { devices }), (rx, false)))
        });
        Ok(Response::new(Box::pin(s)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented(
            "GetPreferredAllocation is not offered",
        ))
    }

    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let paths = self.paths.lock().map(|p| p.clone()).unwrap_or_default();
        let mut container_responses = Vec::new();
        for req in request.into_inner().container_requests {
            let mut r = pb::ContainerAllocateResponse::default();
            for id in req.devices_ids {
                let path = paths.get(&id).ok_or_else(|| {
                    Status::invalid_argument(format!("unknown device {id:?} for {}", self.resource))
                })?;
                let p = path.display().to_string();
                if !r.devices.iter().any(|d| d.host_path == p) {
                    r.devices.push(pb::DeviceSpec {
                        container_path: p.clone(),
                        host_path: p,
                        permissions: "rw".into(),
                    });
                }
            }
            container_responses.push(r);
        }
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}

fn socket_name(resource: &str) -> String {
    let safe: String = resource
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("nodus-{safe}.sock")
}

async fn register(dir: &Path, resource: &str, endpoint: &str) -> Result<(), String> {
    let kubelet = dir.join(crate::cm::devicemanager::KUBELET_SOCKET);
    let channel = crate::cri::dial_unix(kubelet, Duration::from_secs(10))
        .await
        .map_err(|e| format!("cannot reach the kubelet: {e}"))?;
    RegistrationClient::new(channel)
        .register(pb::RegisterRequest {
            version: crate::cm::devicemanager::SUPPORTED_VERSIONS[0].into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: Some(pb::DevicePluginOptions::default()),
        })
        .await
        .map_err(|e| e.message().to_string())?;
    Ok(())
}

/// The kubelet socket's inode, to notice it being re-created.
fn kubelet_socket_id(dir: &Path) -> Option<u64> {
    std::fs::metadata(dir.join(crate::cm::devicemanager::KUBELET_SOCKET))
        .ok()
        .map(|m| m.ino())
}

/// Device ID → host device node.
pub type DevicePaths = Arc<std::sync::Mutex<BTreeMap<String, PathBuf>>>;

/// Watches one resource's device nodes, then serves it.
async fn run_resource(dir: PathBuf, spec: DeviceSpec) {
    let paths: DevicePaths = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    let mut known = BTreeMap::new();
    let (tx, rx) = watch::channel(list_devices(&spec, &mut known));
    if let Ok(mut p) = paths.lock() {
        *p = known.clone();
    }
    {
        let (spec, paths) = (spec.clone(), Arc::clone(&paths));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(POLL).await;
                let now = list_devices(&spec, &mut known);
                if let Ok(mut p) = paths.lock() {
                    *p = known.clone();
                }
                tx.send_if_modified(|old| {
                    if *old != now {
                        tracing::info!(resource = %spec.resource, devices = ?now.iter().map(|d| (d.id.as_str(), d.health.as_str())).collect::<Vec<_>>(), "devices changed");
                        *old = now;
                        true
                    } else {
                        false
                    }
                });
            }
        });
    }
    serve(dir, spec.resource, rx, paths).await
}

/// Serves `resource` with the devices `devices` carries (each change is a ListAndWatch
/// answer) from its socket in `dir`, registering with the kubelet, and again whenever the
/// kubelet's socket is replaced (a kubelet restart).
pub async fn serve(
    dir: PathBuf,
    resource: String,
    devices: watch::Receiver<Vec<pb::Device>>,
    paths: DevicePaths,
) {
    let endpoint = socket_name(&resource);
    loop {
        // Wait for a kubelet to listen.
        let kubelet_id = loop {
            if let Some(id) = kubelet_socket_id(&dir) {
                break id;
            }
            tokio::time::sleep(POLL).await;
        };
        let path = dir.join(&endpoint);
        let _ = std::fs::remove_file(&path);
        let listener = match tokio::net::UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(socket = %path.display(), error = %e, "cannot listen");
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let plugin = Plugin {
            resource: resource.clone(),
            devices: devices.clone(),
            paths: Arc::clone(&paths),
        };
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(plugin))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async {
                        let _ = stop_rx.await;
                    },
                ),
        );
        match register(&dir, &resource, &endpoint).await {
            Ok(()) => {
                tracing::info!(resource = %resource, socket = %path.display(), "registered with the kubelet")
            }
            Err(e) => {
                tracing::warn!(resource = %resource, error = %e, "registration failed; trying again")
            }
        }
        // Serve until the kubelet's socket is replaced (or our own removed, as a kubelet
        // starting does), then start over.
        loop {
            tokio::time::sleep(POLL).await;
            if kubelet_socket_id(&dir) != Some(kubelet_id) || !path.exists() {
                tracing::info!(resource = %resource, "kubelet socket changed; registering again");
                break;
            }
        }
        let _ = stop_tx.send(());
        let _ = server.await;
    }
}

pub async fn run(args: DevicePluginArgs) -> Result<(), String> {
    let specs = if args.devices.is_empty() {
        default_devices()
    } else {
        args.devices
            .iter()
            .map(|d| parse_device(d))
            .collect::<Result<Vec<_>, _>>()?
    };
    tracing::info!(dir = %args.device_plugin_path.display(), resources = ?specs.iter().map(|s| s.resource.as_str()).collect::<Vec<_>>(), "device plugin starting");
    let tasks: Vec<_> = specs
        .into_iter()
        .map(|s| tokio::spawn(run_resource(args.device_plugin_path.clone(), s)))
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_flags_parse() {
        assert_eq!(
            parse_device("devices.nodus.dev/fuse=/dev/fuse,count=10").unwrap(),
            DeviceSpec {
                resource: "devices.nodus.dev/fuse".into(),
                pattern: "/dev/fuse".into(),
                count: 10
            }
        );
        assert_eq!(parse_device("example.com/tty=/dev/tty*").unwrap().count, 1);
        for bad in [
            "fuse=/dev/fuse",
            "devices.nodus.dev/fuse",
            "devices.nodus.dev/fuse=dev/fuse",
            "devices.nodus.dev/fuse=/dev/fuse,count=0",
            "devices.nodus.dev/fuse=/dev/fuse,shared",
        ] {
            assert!(parse_device(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn globs_match_components() {
        let root = tempfile::tempdir().unwrap();
        for f in ["dev/ttyS0", "dev/ttyS1", "dev/tty", "dev/net/tun"] {
            let p = root.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "").unwrap();
        }
        assert_eq!(
            glob(root.path(), "/dev/ttyS*"),
            vec![PathBuf::from("/dev/ttyS0"), PathBuf::from("/dev/ttyS1")]
        );
        assert_eq!(
            glob(root.path(), "/dev/*/tun"),
            vec![PathBuf::from("/dev/net/tun")]
        );
        assert_eq!(
            glob(root.path(), "/dev/tt?"),
            vec![PathBuf::from("/dev/tty")]
        );
        assert!(glob(root.path(), "/dev/fuse").is_empty());
    }

    #[test]
    fn shared_devices_are_listed_count_times_and_vanish_unhealthy() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("dev0");
        std::fs::write(&node, "").unwrap();
        let spec = DeviceSpec {
            resource: "example.com/d".into(),
            pattern: node.display().to_string(),
            count: 2,
        };
        let mut known = BTreeMap::new();
        let d = list_devices(&spec, &mut known);
        assert_eq!(d.len(), 2);
        assert!(d.iter().all(|d| d.health == "Healthy"));
        assert!(d[0].id.ends_with("dev0#0"));
        std::fs::remove_file(&node).unwrap();
        let d = list_devices(&spec, &mut known);
        assert_eq!(d.len(), 2);
        assert!(d.iter().all(|d| d.health == "Unhealthy"));
    }
}
