//! A test node: a `nodus runtime` in its own network namespace and cgroup parent, with a
//! CNI bridge network and busybox imported from an OCI archive (no registry inside the
//! namespace), and helpers to run pods and containers on it.

use super::{Runtime, nodus_bin, spec};
use cri::runtime::v1 as pb;
use nodus_crictl::Clients;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use testkit::{CgroupParent, Netns};

/// The CNI network of a test node: a bridge with `subnet` (a /24; the gateway is its `.1`)
/// and host ports.
pub fn conflist(data_dir: &Path, subnet: &str) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "nodus-test",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet, "gateway": gateway_of(subnet)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": data_dir,
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
    .to_string()
}

/// The first address of a subnet: `10.99.0.0/24` → `10.99.0.1`.
pub fn gateway_of(subnet: &str) -> String {
    let net = subnet.split('/').next().unwrap_or_default();
    let (prefix, _) = net.rsplit_once('.').expect("an IPv4 subnet");
    format!("{prefix}.1")
}

/// Imports an OCI archive into the content store under `rt`'s root dir.
pub fn import_archive(rt: &Runtime, archive: &Path) {
    let out = std::process::Command::new(nodus_bin())
        .arg("runtime")
        .arg("import")
        .arg(archive)
        .args([std::ffi::OsStr::new("--root-dir"), rt.root().as_os_str()])
        .output()
        .expect("run nodus runtime import");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test node without CRI clients (for tests that drive it through the CLI). Fields drop
/// in order: the runtime (and everything it started) goes before the cgroup parent, the
/// directories and the network namespace.
pub struct BareNode {
    pub rt: Runtime,
    pub cgroup: CgroupParent,
    /// Pod log directories, one per sandbox name.
    pub logs: tempfile::TempDir,
    /// The node's own files: CNI config (`net.d`) and IPAM state (`ipam`).
    pub dir: tempfile::TempDir,
    pub netns: Arc<Netns>,
}

impl BareNode {
    /// Starts a node whose pods get addresses from `subnet`.
    pub fn new(subnet: &str) -> BareNode {
        Self::with_runtime_config(subnet, "")
    }

    /// [`BareNode::new`] with `extra` appended to the runtime's TOML config.
    pub fn with_runtime_config(subnet: &str, extra: &str) -> BareNode {
        let netns = Arc::new(Netns::new("nodus-node").expect("netns"));
        let dir = tempfile::Builder::new()
            .prefix("nodus-node-")
            .tempdir()
            .expect("tempdir");
        let net_d = dir.path().join("net.d");
        std::fs::create_dir_all(&net_d).unwrap();
        std::fs::write(
            net_d.join("10-test.conflist"),
            conflist(&dir.path().join("ipam"), subnet),
        )
        .unwrap();
        let cfg = format!(
            "cni-conf-dir = \"{}\"\ncni-bin-dirs = [\"/usr/lib/cni\", \"/opt/cni/bin\"]\n{extra}",
            net_d.display()
        );
        let rt = Runtime::start_full(Some(&cfg), Some(Arc::clone(&netns)));
        let archive = rt.dir.path().join("busybox.tar");
        testkit::image::busybox()
            .write_oci_archive(&archive, "docker.io/library/busybox:latest")
            .unwrap();
        import_archive(&rt, &archive);
        BareNode {
            rt,
            cgroup: CgroupParent::new("nodus-test"),
            logs: tempfile::tempdir().unwrap(),
            dir,
            netns,
        }
    }

    /// A pod named `name` (label `app=name`) in the node's cgroup parent, logging to its
    /// own directory under `logs`.
    pub fn sandbox_config(&self, name: &str) -> pb::PodSandboxConfig {
        let log_dir = self.logs.path().join(name);
        std::fs::create_dir_all(&log_dir).unwrap();
        pb::PodSandboxConfig {
            labels: HashMap::from([("app".to_string(), name.to_string())]),
            ..pod_config(name, "default", &log_dir, self.cgroup.path())
        }
    }

    pub fn container_config(&self, name: &str, cmd: &[&str]) -> pb::ContainerConfig {
        container_config(name, cmd)
    }

    /// The CRI log of container `container` in the pod named `sandbox`.
    pub fn log(&self, sandbox: &str, container: &str) -> String {
        std::fs::read_to_string(
            self.logs
                .path()
                .join(sandbox)
                .join(format!("{container}.log")),
        )
        .unwrap_or_default()
    }
}

/// A pod named `name` in `namespace` and `cgroup_parent`, logging to `log_dir`.
pub fn pod_config(
    name: &str,
    namespace: &str,
    log_dir: &Path,
    cgroup_parent: String,
) -> pb::PodSandboxConfig {
    pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: namespace.into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.display().to_string(),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A busybox container `name` limited to `limit` bytes of memory whose shell keeps 64 MiB:
/// the kernel OOM-kills it (unless it prints "survived").
pub fn memory_hog(name: &str, limit: i64) -> pb::ContainerConfig {
    let mut hog = container_config(
        name,
        &[
            "sh",
            "-c",
            "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo survived",
        ],
    );
    hog.linux = Some(pb::LinuxContainerConfig {
        resources: Some(pb::LinuxContainerResources {
            memory_limit_in_bytes: limit,
            ..Default::default()
        }),
        ..Default::default()
    });
    hog
}

/// A busybox container running `cmd`, logging to `<name>.log`.
pub fn container_config(name: &str, cmd: &[&str]) -> pb::ContainerConfig {
    pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: spec("busybox"),
        command: cmd.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

/// A test node with CRI clients to its runtime.
pub struct TestNode {
    pub node: BareNode,
    pub c: Clients,
}

impl std::ops::Deref for TestNode {
    type Target = BareNode;
    fn deref(&self) -> &BareNode {
        &self.node
    }
}

impl std::ops::DerefMut for TestNode {
    fn deref_mut(&mut self) -> &mut BareNode {
        &mut self.node
    }
}

impl TestNode {
    /// Starts a node whose pods get addresses from `subnet`, and connects to it.
    pub async fn new(subnet: &str) -> TestNode {
        Self::with_runtime_config(subnet, "").await
    }

    /// [`TestNode::new`] with `extra` appended to the runtime's TOML config.
    pub async fn with_runtime_config(subnet: &str, extra: &str) -> TestNode {
        let node = BareNode::with_runtime_config(subnet, extra);
        let c = node.rt.clients().await;
        TestNode { node, c }
    }

    pub async fn run_sandbox(&self, cfg: &pb::PodSandboxConfig) -> String {
        self.run_sandbox_on(cfg, "").await
    }

    /// RunPodSandbox with a runtime handler (a RuntimeClass's `handler`; "" is the default).
    pub async fn run_sandbox_on(&self, cfg: &pb::PodSandboxConfig, handler: &str) -> String {
        self.c
            .runtime
            .clone()
            .run_pod_sandbox(pb::RunPodSandboxRequest {
                config: Some(cfg.clone()),
                runtime_handler: handler.to_string(),
            })
            .await
            .expect("RunPodSandbox")
            .into_inner()
            .pod_sandbox_id
    }

    pub async fn create(
        &self,
        sandbox: &str,
        sb: &pb::PodSandboxConfig,
        cfg: pb::ContainerConfig,
    ) -> Result<String, tonic::Status> {
        self.c
            .runtime
            .clone()
            .create_container(pb::CreateContainerRequest {
                pod_sandbox_id: sandbox.into(),
                config: Some(cfg),
                sandbox_config: Some(sb.clone()),
            })
            .await
            .map(|r| r.into_inner().container_id)
    }

    pub async fn start(&self, id: &str) {
        self.c
            .runtime
            .clone()
            .start_container(pb::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .expect("StartContainer");
    }

    /// Creates and starts a container.
    pub async fn run(
        &self,
        sandbox: &str,
        sb: &pb::PodSandboxConfig,
        cfg: pb::ContainerConfig,
    ) -> String {
        let id = self
            .create(sandbox, sb, cfg)
            .await
            .expect("CreateContainer");
        self.start(&id).await;
        id
    }

    async fn container_status(&self, id: &str, verbose: bool) -> pb::ContainerStatusResponse {
        self.c
            .runtime
            .clone()
            .container_status(pb::ContainerStatusRequest {
                container_id: id.into(),
                verbose,
            })
            .await
            .expect("ContainerStatus")
            .into_inner()
    }

    /// The `info` a verbose ContainerStatus returns (pid, bundle, runtime handler…).
    pub async fn verbose_info(&self, id: &str) -> serde_json::Value {
        let resp = self.container_status(id, true).await;
        serde_json::from_str(&resp.info["info"]).expect("verbose info is JSON")
    }

    pub async fn status(&self, id: &str) -> pb::ContainerStatus {
        self.container_status(id, false)
            .await
            .status
            .expect("status")
    }

    pub async fn wait_state(&self, id: &str, state: pb::ContainerState) -> pb::ContainerStatus {
        for _ in 0..200 {
            let s = self.status(id).await;
            if s.state == state as i32 {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "container {id} never reached {state:?}: {:?}",
            self.status(id).await
        );
    }

    pub async fn exec(
        &self,
        id: &str,
        cmd: &[&str],
        timeout: i64,
    ) -> Result<pb::ExecSyncResponse, tonic::Status> {
        self.c
            .runtime
            .clone()
            .exec_sync(pb::ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout,
            })
            .await
            .map(|r| r.into_inner())
    }

    pub async fn sandbox_status(&self, id: &str) -> pb::PodSandboxStatus {
        self.c
            .runtime
            .clone()
            .pod_sandbox_status(pb::PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: false,
            })
            .await
            .expect("PodSandboxStatus")
            .into_inner()
            .status
            .expect("status")
    }

    pub async fn stop_and_remove_sandbox(&self, id: &str) {
        let mut r = self.c.runtime.clone();
        r.stop_pod_sandbox(pb::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        })
        .await
        .expect("StopPodSandbox");
        r.remove_pod_sandbox(pb::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        })
        .await
        .expect("RemovePodSandbox");
    }
}

/// containerd in `netns` with the same CNI network as a nodus test node (`subnet`), and
/// busybox plus the pause image (as registry.k8s.io/pause:3.8) imported offline. Its files
/// live under `base`.
pub fn start_containerd(netns: &Netns, base: &Path, subnet: &str) -> testkit::Containerd {
    std::fs::create_dir_all(base.join("net.d")).unwrap();
    std::fs::write(
        base.join("net.d/10-test.conflist"),
        conflist(&base.join("ipam"), subnet),
    )
    .unwrap();
    let ctrd = testkit::Containerd::start_with(testkit::ContainerdOptions {
        netns: Some(netns),
        cni_bin_dir: Some(Path::new("/usr/lib/cni")),
        cni_conf_dir: Some(&base.join("net.d")),
        ..Default::default()
    })
    .expect("containerd");
    for (img, name) in [
        (
            testkit::image::busybox(),
            "docker.io/library/busybox:latest",
        ),
        (testkit::image::pause(), "registry.k8s.io/pause:3.8"),
    ] {
        let a = base.join("img.tar");
        img.write_oci_archive(&a, name).unwrap();
        let out = ctrd
            .ctr(["-n", "k8s.io", "images", "import"])
            .arg(&a)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    ctrd
}
