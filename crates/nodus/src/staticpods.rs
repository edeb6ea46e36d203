//! `nodus up`'s kubeadm-style bootstrap: the control plane as static pods of the node's own
//! kubelet (kubeadm's `init` phases `etcd local` and `control-plane all`).
//!
//! Before any API server exists, `nodus up` writes `etcd.yaml`, `kube-apiserver.yaml`,
//! `kube-controller-manager.yaml` and `kube-scheduler.yaml` into the kubelet's manifest
//! directory; the kubelet runs them (hostNetwork, as kubeadm's) and, once the API server
//! answers, publishes their mirror pods `<component>-<node>` in kube-system. The images
//! are made on the node from the running `nodus` binary and Debian's etcd (each with the
//! shared libraries `ldd` names) and recorded in the node's runtime, so no registry is
//! needed: the three control-plane components are `nodus kube-apiserver`,
//! `nodus kube-controller-manager` and `nodus kube-scheduler` of one image.
//!
//! A manifest is only rewritten when its content changes, so a restart of `nodus up` with
//! the same flags leaves the running control plane alone, as the kubelet restarting on a
//! kubeadm node does; an edited flag restarts just that component.

use anyhow::Context as _;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

use nodus_runtime::image::local::HostFile;

/// Where the binaries sit inside the images.
const NODUS_IN_IMAGE: &str = "/usr/local/bin/nodus";
const ETCD_IN_IMAGE: &str = "/usr/local/bin/etcd";

/// etcd's own client and peer ports, used when free (kubeadm's).
pub const ETCD_PORTS: (u16, u16) = (2379, 2380);

/// The control plane's static pods, as kubeadm names their manifests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaticPod {
    Etcd,
    KubeApiserver,
    KubeControllerManager,
    KubeScheduler,
}

impl StaticPod {
    pub fn name(self) -> &'static str {
        match self {
            StaticPod::Etcd => "etcd",
            StaticPod::KubeApiserver => "kube-apiserver",
            StaticPod::KubeControllerManager => "kube-controller-manager",
            StaticPod::KubeScheduler => "kube-scheduler",
        }
    }

    /// kubeadm's CPU requests (etcd also asks for 100Mi of memory).
    fn requests(self) -> Value {
        match self {
            StaticPod::Etcd => json!({"cpu": "100m", "memory": "100Mi"}),
            StaticPod::KubeApiserver => json!({"cpu": "250m"}),
            StaticPod::KubeControllerManager => json!({"cpu": "200m"}),
            StaticPod::KubeScheduler => json!({"cpu": "100m"}),
        }
    }
}

/// Where a component answers its health checks: `scheme://host:port` and the paths kubeadm
/// probes there (liveness and startup, readiness).
struct Health {
    scheme: &'static str,
    host: String,
    port: u16,
    live: &'static str,
    ready: &'static str,
}

impl Health {
    fn get(&self, path: &str) -> Value {
        json!({"host": self.host, "path": path, "port": self.port, "scheme": self.scheme})
    }

    /// kubeadm's probes: liveness and startup on the live path (8 and 24 failures, every
    /// 10 s after 10 s, 15 s timeout); the API server and etcd also get a readiness probe
    /// every second.
    fn probes(&self, with_readiness: bool) -> Vec<(&'static str, Value)> {
        let slow = |threshold: u32| {
            json!({
                "httpGet": self.get(self.live),
                "failureThreshold": threshold,
                "initialDelaySeconds": 10,
                "periodSeconds": 10,
                "timeoutSeconds": 15,
            })
        };
        let mut out = vec![("livenessProbe", slow(8)), ("startupProbe", slow(24))];
        if with_readiness {
            out.push((
                "readinessProbe",
                json!({
                    "httpGet": self.get(self.ready),
                    "failureThreshold": 3,
                    "periodSeconds": 1,
                    "timeoutSeconds": 15,
                }),
            ));
        }
        out
    }
}

/// A host directory mounted at the same path in a static pod.
#[derive(Clone)]
struct HostDir {
    name: &'static str,
    path: PathBuf,
    read_only: bool,
    /// Created when missing (kubeadm's `DirectoryOrCreate`), else it must exist.
    create: bool,
}

/// kubeadm's manifest of one component: hostNetwork, system-node-critical, the
/// `component`/`tier` labels, its command and host directories.
fn manifest(
    pod: StaticPod,
    image: &str,
    command: Vec<String>,
    dirs: &[HostDir],
    env: &[(String, String)],
    health: &Health,
) -> Value {
    let mut container = json!({
        "name": pod.name(),
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "resources": {"requests": pod.requests()},
        "volumeMounts": dirs.iter().map(|d| json!({
            "name": d.name,
            "mountPath": d.path,
            "readOnly": d.read_only,
        })).collect::<Vec<_>>(),
    });
    let with_readiness = matches!(pod, StaticPod::Etcd | StaticPod::KubeApiserver);
    for (field, probe) in health.probes(with_readiness) {
        container[field] = probe;
    }
    if !env.is_empty() {
        container["env"] = env
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name(),
            "namespace": "kube-system",
            "labels": {"component": pod.name(), "tier": "control-plane"},
        },
        "spec": {
            "hostNetwork": true,
            "priorityClassName": "system-node-critical",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
            "volumes": dirs.iter().map(|d| json!({
                "name": d.name,
                "hostPath": {
                    "path": d.path,
                    "type": if d.create { "DirectoryOrCreate" } else { "Directory" },
                },
            })).collect::<Vec<_>>(),
        },
    })
}

/// What the control plane's static pods are made from.
pub struct Plan {
    /// The control plane's data dir (PKI, tokens, admin.kubeconfig), shared by the three
    /// components and mounted at the same path.
    pub cp_dir: PathBuf,
    /// etcd's data dir and ports, when this node runs the etcd member.
    pub etcd: Option<(PathBuf, u16, u16)>,
    pub node_name: String,
    /// Flags every component gets (data dir, addresses).
    pub common_args: Vec<String>,
    /// kube-apiserver's own (its port, storage).
    pub apiserver_args: Vec<String>,
    /// kube-controller-manager's own (node IPAM) and both elected components' (leader
    /// election).
    pub controller_manager_args: Vec<String>,
    pub scheduler_args: Vec<String>,
    /// Host directories of files named by flags (etcd's TLS files), mounted read-only.
    pub extra_dirs: Vec<PathBuf>,
    /// Where the kubelet reaches the API server's `/livez` and `/readyz` (kubeadm probes the
    /// advertised address).
    pub apiserver_endpoint: (String, u16),
}

/// The images' names: a fingerprint of the binary in the tag, so a rebuilt binary gets a
/// new image (and a changed manifest restarts the component on it).
pub struct Images {
    pub nodus: String,
    pub etcd: Option<String>,
}

/// A short fingerprint of a file's identity and change time, cheap at every start.
fn fingerprint(path: &Path) -> anyhow::Result<String> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()).hash(&mut h);
    Ok(format!("{:012x}", h.finish() & 0xffff_ffff_ffff))
}

/// The shared libraries `ldd` says `binary` loads (none for a static binary).
fn shared_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    // A static binary: ldd says so and exits 1.
    if !out.status.success() {
        return Ok(Vec::new());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.trim(),
                None => l,
            };
            let path = path.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// The binary and its libraries, each at its host path but the binary at `dest`.
fn image_files(binary: &Path, dest: &str) -> anyhow::Result<Vec<HostFile>> {
    let mut files = vec![HostFile {
        source: binary.to_path_buf(),
        dest: dest.to_string(),
    }];
    for lib in shared_libraries(binary)? {
        files.push(HostFile {
            dest: lib.to_string_lossy().into_owned(),
            source: lib,
        });
    }
    Ok(files)
}

/// Makes the images in the node's runtime store (before the runtime serves): the running
/// `nodus` binary, and etcd when this node runs the member.
pub async fn build_images(
    runtime_root: &Path,
    runtime_config: &nodus_runtime::config::RuntimeConfig,
    with_etcd: bool,
) -> anyhow::Result<Images> {
    let images = nodus_runtime::image::manager::ImageManager::open(
        nodus_runtime::image::manager::ImageManagerConfig::new(runtime_root, runtime_config),
    )
    .context("opening the node's image store")?;
    let exe = std::env::current_exe().context("finding the nodus binary")?;
    let nodus = format!(
        "localhost/nodus:{}-{}",
        env!("CARGO_PKG_VERSION"),
        fingerprint(&exe)?
    );
    images
        .build_from_host_files(
            &nodus,
            &image_files(&exe, NODUS_IN_IMAGE)?,
            &[NODUS_IN_IMAGE.to_string()],
        )
        .await
        .with_context(|| format!("building {nodus}"))?;
    let etcd = if with_etcd {
        let bin = nodus_control_plane::storage::etcd::server::etcd_binary();
        let name = format!("localhost/etcd:{}", fingerprint(&bin)?);
        images
            .build_from_host_files(
                &name,
                &image_files(&bin, ETCD_IN_IMAGE)?,
                &[ETCD_IN_IMAGE.to_string()],
            )
            .await
            .with_context(|| format!("building {name} from {}", bin.display()))?;
        Some(name)
    } else {
        None
    };
    Ok(Images { nodus, etcd })
}

/// The environment passed on to the components (their log level).
fn passed_env() -> Vec<(String, String)> {
    std::env::var("NODUS_LOG")
        .ok()
        .map(|v| vec![("NODUS_LOG".to_string(), v)])
        .unwrap_or_default()
}

/// The four manifests (three with an external etcd), by file name.
pub fn manifests(plan: &Plan, images: &Images) -> Vec<(String, Value)> {
    let env = passed_env();
    let mut dirs = vec![HostDir {
        name: "control-plane",
        path: plan.cp_dir.clone(),
        read_only: false,
        create: true,
    }];
    for (i, d) in plan.extra_dirs.iter().enumerate() {
        dirs.push(HostDir {
            name: ["etcd-certs-0", "etcd-certs-1", "etcd-certs-2"][i.min(2)],
            path: d.clone(),
            read_only: true,
            create: false,
        });
    }
    let mut out = Vec::new();
    if let (Some((data, client, peer)), Some(image)) = (&plan.etcd, &images.etcd) {
        let cluster = format!("{}=http://127.0.0.1:{peer}", plan.node_name);
        let mut command = vec![ETCD_IN_IMAGE.to_string()];
        command.extend(nodus_control_plane::storage::etcd::server::member_args(
            &plan.node_name,
            data,
            *client,
            *peer,
            &cluster,
        ));
        let etcd_dirs = [HostDir {
            name: "etcd-data",
            path: data.clone(),
            read_only: false,
            create: true,
        }];
        // Debian's etcd (3.4) answers `/health` on its client URL; kubeadm's newer etcd has
        // `/livez` and `/readyz` on a separate metrics port.
        let health = Health {
            scheme: "HTTP",
            host: "127.0.0.1".into(),
            port: *client,
            live: "/health",
            ready: "/health",
        };
        out.push((
            "etcd.yaml".to_string(),
            manifest(StaticPod::Etcd, image, command, &etcd_dirs, &[], &health),
        ));
    }
    let component = |pod: StaticPod, own: &[String], extra: &[HostDir]| {
        let mut command = vec![NODUS_IN_IMAGE.to_string(), pod.name().to_string()];
        command.extend(plan.common_args.iter().cloned());
        command.extend(own.iter().cloned());
        let mut all = dirs.clone();
        all.extend(extra.iter().cloned());
        let (host, port) = match pod {
            StaticPod::KubeControllerManager => (
                "127.0.0.1".to_string(),
                nodus_control_plane::healthz::CONTROLLER_MANAGER_PORT,
            ),
            StaticPod::KubeScheduler => (
                "127.0.0.1".to_string(),
                nodus_control_plane::healthz::SCHEDULER_PORT,
            ),
            _ => plan.apiserver_endpoint.clone(),
        };
        let health = Health {
            scheme: "HTTPS",
            host,
            port,
            live: if pod == StaticPod::KubeApiserver {
                "/livez"
            } else {
                "/healthz"
            },
            ready: "/readyz",
        };
        (
            format!("{}.yaml", pod.name()),
            manifest(pod, &images.nodus, command, &all, &env, &health),
        )
    };
    out.push(component(
        StaticPod::KubeApiserver,
        &plan.apiserver_args,
        &[],
    ));
    // CronJobs' `timeZone` reads the host's zone database, as kubeadm mounts it.
    let zoneinfo: Vec<HostDir> = Path::new("/usr/share/zoneinfo")
        .is_dir()
        .then(|| HostDir {
            name: "zoneinfo",
            path: "/usr/share/zoneinfo".into(),
            read_only: true,
            create: false,
        })
        .into_iter()
        .collect();
    out.push(component(
        StaticPod::KubeControllerManager,
        &plan.controller_manager_args,
        &zoneinfo,
    ));
    out.push(component(
        StaticPod::KubeScheduler,
        &plan.scheduler_args,
        &[],
    ));
    out
}

/// Writes each manifest whose content differs from the file's (atomically: the kubelet
/// never reads half a file, and skips the dot-named temporary).
pub fn write_manifests(dir: &Path, manifests: &[(String, Value)]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (file, pod) in manifests {
        let text = serde_yaml::to_string(pod).context("rendering a static pod manifest")?;
        let path = dir.join(file);
        if std::fs::read_to_string(&path).is_ok_and(|t| t == text) {
            continue;
        }
        let tmp = dir.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
        tracing::info!(manifest = %path.display(), "wrote static pod manifest");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            cp_dir: "/var/lib/nodus/control-plane".into(),
            etcd: Some(("/var/lib/nodus/etcd".into(), 2379, 2380)),
            node_name: "cp1".into(),
            common_args: vec!["--data-dir=/var/lib/nodus/control-plane".into()],
            apiserver_args: vec!["--secure-port=6443".into()],
            controller_manager_args: vec!["--allocate-node-cidrs=true".into()],
            scheduler_args: vec![],
            extra_dirs: vec![],
            apiserver_endpoint: ("10.0.0.5".into(), 6443),
        }
    }

    #[test]
    fn kubeadm_names_labels_and_commands() {
        let images = Images {
            nodus: "localhost/nodus:1-abc".into(),
            etcd: Some("localhost/etcd:def".into()),
        };
        let m = manifests(&plan(), &images);
        let names: Vec<&str> = m.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            names,
            [
                "etcd.yaml",
                "kube-apiserver.yaml",
                "kube-controller-manager.yaml",
                "kube-scheduler.yaml"
            ]
        );
        let api = &m[1].1;
        assert_eq!(api["metadata"]["labels"]["tier"], "control-plane");
        assert_eq!(api["spec"]["hostNetwork"], true);
        assert_eq!(api["spec"]["priorityClassName"], "system-node-critical");
        let cmd = &api["spec"]["containers"][0]["command"];
        assert_eq!(
            cmd,
            &json!([
                NODUS_IN_IMAGE,
                "kube-apiserver",
                "--data-dir=/var/lib/nodus/control-plane",
                "--secure-port=6443"
            ])
        );
        let etcd = &m[0].1;
        let cmd: Vec<&str> = etcd["spec"]["containers"][0]["command"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(cmd.contains(&"--name=cp1"), "{cmd:?}");
        assert!(
            cmd.contains(&"--listen-client-urls=http://127.0.0.1:2379"),
            "{cmd:?}"
        );
        assert_eq!(
            etcd["spec"]["volumes"][0]["hostPath"]["path"],
            "/var/lib/nodus/etcd"
        );
    }

    #[test]
    fn kubeadm_probes_each_component_where_it_answers() {
        let images = Images {
            nodus: "localhost/nodus:1-abc".into(),
            etcd: Some("localhost/etcd:def".into()),
        };
        let m = manifests(&plan(), &images);
        let c = |i: usize| m[i].1["spec"]["containers"][0].clone();
        let (etcd, api, kcm, sched) = (c(0), c(1), c(2), c(3));
        assert_eq!(
            api["livenessProbe"],
            json!({"httpGet": {"host": "10.0.0.5", "path": "/livez", "port": 6443, "scheme": "HTTPS"},
                "failureThreshold": 8, "initialDelaySeconds": 10, "periodSeconds": 10, "timeoutSeconds": 15})
        );
        assert_eq!(api["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(api["readinessProbe"]["periodSeconds"], 1);
        assert_eq!(api["startupProbe"]["failureThreshold"], 24);
        assert_eq!(
            kcm["livenessProbe"]["httpGet"],
            json!({"host": "127.0.0.1", "path": "/healthz", "port": 10257, "scheme": "HTTPS"})
        );
        assert_eq!(kcm["startupProbe"]["httpGet"]["port"], 10257);
        assert_eq!(sched["livenessProbe"]["httpGet"]["port"], 10259);
        assert!(kcm.get("readinessProbe").is_none() && sched.get("readinessProbe").is_none());
        assert_eq!(
            etcd["livenessProbe"]["httpGet"],
            json!({"host": "127.0.0.1", "path": "/health", "port": 2379, "scheme": "HTTP"})
        );
        // Every probe is one the API server's own validation accepts (after its defaults).
        let gvk = nodus_k8s::Gvk::new("", "v1", "Pod");
        for (_, pod) in &m {
            let mut pod = pod.clone();
            nodus_k8s::defaults::default_object(&gvk, &mut pod);
            let errs = nodus_k8s::validation::validate_object(&gvk, &pod, None);
            assert!(errs.is_empty(), "{errs:?}");
        }
    }

    #[test]
    fn an_external_etcd_gets_no_etcd_pod() {
        let mut p = plan();
        p.etcd = None;
        let images = Images {
            nodus: "localhost/nodus:1-abc".into(),
            etcd: None,
        };
        assert_eq!(manifests(&p, &images).len(), 3);
    }

    #[test]
    fn ldd_lists_the_libraries_of_a_dynamic_binary() {
        let libs = shared_libraries(Path::new("/bin/sh")).unwrap();
        assert!(
            libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
            "{libs:?}"
        );
    }

    #[test]
    fn an_unchanged_manifest_is_not_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let m = vec![("a.yaml".to_string(), json!({"kind": "Pod"}))];
        write_manifests(dir.path(), &m).unwrap();
        let path = dir.path().join("a.yaml");
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        write_manifests(dir.path(), &m).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            before
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
