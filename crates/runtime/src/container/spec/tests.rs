//! Whole-spec tests: a container config, a sandbox, a rootfs with `/etc/passwd` and
//! `/etc/group` in a temp dir, and fixed host facts.

use std::path::{Path, PathBuf};

use cri::runtime::v1::{
    Capability as CriCaps, ContainerConfig, ContainerMetadata, Device, IdMapping, ImageSpec,
    Int64Value, LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount as CriMount, MountPropagation,
    NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata, SecurityProfile,
    UserNamespace, security_profile::ProfileType,
};
use oci_spec::runtime::{
    Capability, LinuxDeviceType, LinuxNamespaceType, LinuxSeccompAction, Mount, Spec,
};
use serde_json::{Value, json};

use super::*;

struct Fixture {
    dir: tempfile::TempDir,
    config: ContainerConfig,
    sandbox: PodSandboxConfig,
    image: Value,
    namespaces: SandboxNamespaces,
    files: SandboxFiles,
    image_mounts: Vec<ImageMount>,
    pod_patterns: Vec<String>,
    container_patterns: Vec<String>,
    floor: i32,
    profile_root: Option<PathBuf>,
    facts: HostFacts,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("rootfs/etc")).unwrap();
        std::fs::write(
            p.join("rootfs/etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(
            p.join("rootfs/etc/group"),
            "root:x:0:root\nwheel:x:10:root\napp:x:1000:\nmedia:x:500:app\n",
        )
        .unwrap();
        std::fs::create_dir_all(p.join("sandbox/shm")).unwrap();
        for f in ["hostname", "hosts", "resolv.conf"] {
            std::fs::write(p.join("sandbox").join(f), "x\n").unwrap();
        }
        std::fs::write(
            p.join("mountinfo"),
            "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/root rw\n",
        )
        .unwrap();
        let sc = LinuxContainerSecurityContext {
            namespace_options: Some(NamespaceOption {
                pid: NamespaceMode::Container as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: "sha256:0123".into(),
                user_specified_image: "busybox:1.36".into(),
                ..Default::default()
            }),
            command: vec!["sh".into()],
            linux: Some(LinuxContainerConfig {
                resources: None,
                security_context: Some(sc),
            }),
            ..Default::default()
        };
        let sandbox = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: "web-0".into(),
                uid: "uid-1".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: "web-0".into(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: "/kubepods/besteffort/poduid-1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        Fixture {
            namespaces: SandboxNamespaces {
                network: Some(p.join("ns/net")),
                ipc: Some(p.join("ns/ipc")),
                uts: Some(p.join("ns/uts")),
                pid: Some(NamespaceRef::Process(4242)),
                ..Default::default()
            },
            files: SandboxFiles {
                hostname: Some(p.join("sandbox/hostname")),
                resolv_conf: Some(p.join("sandbox/resolv.conf")),
                hosts: Some(p.join("sandbox/hosts")),
                dev_shm: Some(p.join("sandbox/shm")),
            },
            facts: HostFacts {
                cgroup_v2: false,
                swap_controller: true,
                hugetlb_controller: false,
                current_caps: vec![
                    Capability::Chown,
                    Capability::SysAdmin,
                    Capability::NetAdmin,
                ],
                hostname: "node-1".into(),
                seccomp_enabled: true,
                mountinfo_path: p.join("mountinfo"),
                dev_dir: PathBuf::from("/dev"),
            },
            dir,
            config,
            sandbox,
            image: json!({"config": {"Env": ["PATH=/bin"], "Cmd": ["sleep", "1"]}}),
            image_mounts: vec![],
            pod_patterns: vec![],
            container_patterns: vec![],
            floor: 0,
            profile_root: None,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn sc(&mut self) -> &mut LinuxContainerSecurityContext {
        self.config
            .linux
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
    }

    fn build(&self) -> Result<Spec, SpecError> {
        let rootfs = self.path("rootfs");
        let input = SpecInput {
            container_id: "c0ffee",
            sandbox_id: "sb1",
            config: &self.config,
            sandbox_config: &self.sandbox,
            image_config: &self.image,
            rootfs: &rootfs,
            namespaces: self.namespaces.clone(),
            sandbox_files: self.files.clone(),
            cgroup_parent: self
                .sandbox
                .linux
                .as_ref()
                .map(|l| l.cgroup_parent.as_str())
                .unwrap_or(""),
            systemd_cgroup: false,
            seccomp_profile_root: self.profile_root.as_deref(),
            oom_score_adj_floor: self.floor,
            image_mounts: self.image_mounts.clone(),
            pod_annotations: &self.pod_patterns,
            container_annotations: &self.container_patterns,
        };
        build_with(&input, &self.facts)
    }
}

fn destinations(spec: &Spec) -> Vec<String> {
    spec.mounts()
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.destination().display().to_string())
        .collect()
}

fn mount_at<'a>(spec: &'a Spec, dst: &str) -> &'a Mount {
    spec.mounts()
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.destination() == Path::new(dst))
        .unwrap_or_else(|| panic!("no mount at {dst}"))
}

fn options(m: &Mount) -> Vec<String> {
    m.options().clone().unwrap_or_default()
}

fn namespaces(spec: &Spec) -> Vec<(LinuxNamespaceType, Option<PathBuf>)> {
    spec.linux()
        .as_ref()
        .unwrap()
        .namespaces()
        .as_ref()
        .unwrap()
        .iter()
        .map(|n| (n.typ(), n.path().clone()))
        .collect()
}

fn caps(spec: &Spec) -> Vec<String> {
    let mut v: Vec<String> = spec
        .process()
        .as_ref()
        .unwrap()
        .capabilities()
        .as_ref()
        .unwrap()
        .bounding()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn defaults_like_containerd() {
    let f = Fixture::new();
    let spec = f.build().unwrap();
    assert_eq!(spec.version(), OCI_VERSION);
    let root = spec.root().as_ref().unwrap();
    assert_eq!(root.path(), &f.path("rootfs"));
    assert_eq!(root.readonly(), None);
    assert_eq!(spec.hostname(), &None);

    assert_eq!(
        destinations(&spec),
        [
            "/proc",
            "/dev",
            "/dev/pts",
            "/dev/mqueue",
            "/sys",
            "/sys/fs/cgroup",
            "/etc/hostname",
            "/etc/hosts",
            "/etc/resolv.conf",
            "/dev/shm",
        ]
    );
    assert_eq!(
        options(mount_at(&spec, "/sys")),
        ["nosuid", "noexec", "nodev", "ro"]
    );
    assert_eq!(
        mount_at(&spec, "/sys/fs/cgroup").typ().as_deref(),
        Some("cgroup")
    );
    let hosts = mount_at(&spec, "/etc/hosts");
    assert_eq!(
        hosts.source().as_deref(),
        Some(f.path("sandbox/hosts").as_path())
    );
    assert_eq!(options(hosts), ["rbind", "rprivate", "rw"]);
    assert_eq!(
        mount_at(&spec, "/dev/shm").source().as_deref(),
        Some(f.path("sandbox/shm").as_path())
    );

    let p = spec.process().as_ref().unwrap();
    assert_eq!(p.args().as_deref(), Some(&["sh".to_string()][..]));
    assert_eq!(
        p.env().as_deref(),
        Some(&["PATH=/bin".to_string(), "HOSTNAME=web-0".to_string()][..])
    );
    assert_eq!(p.cwd(), Path::new("/"));
    assert_eq!(p.terminal(), None);
    assert_eq!(p.no_new_privileges(), None);
    assert_eq!(p.oom_score_adj(), None);
    assert!(p.rlimits().is_none());
    assert_eq!((p.user().uid(), p.user().gid()), (0, 0));
    assert_eq!(p.user().additional_gids().as_deref(), Some(&[0, 10][..]));
    let mut want_caps: Vec<String> = capabilities::DEFAULT_CAPS
        .iter()
        .map(|c| c.to_string())
        .collect();
    want_caps.sort();
    assert_eq!(caps(&spec), want_caps);
    let pcaps = p.capabilities().as_ref().unwrap();
    assert!(pcaps.ambient().is_none() && pcaps.inheritable().is_none());

    let linux = spec.linux().as_ref().unwrap();
    assert_eq!(
        linux.cgroups_path().as_deref(),
        Some(Path::new("/kubepods/besteffort/poduid-1/c0ffee"))
    );
    assert!(
        linux.seccomp().is_none(),
        "no seccomp field: unconfined like containerd"
    );
    assert!(linux.masked_paths().is_none() && linux.readonly_paths().is_none());
    assert!(linux.devices().is_none());
    let rules = linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .clone()
        .unwrap();
    assert_eq!(rules.len(), 1);
    assert!(!rules[0].allow() && rules[0].access().as_deref() == Some("rwm"));
    assert_eq!(
        namespaces(&spec),
        [
            (LinuxNamespaceType::Pid, None),
            (LinuxNamespaceType::Ipc, Some(f.path("ns/ipc"))),
            (LinuxNamespaceType::Uts, Some(f.path("ns/uts"))),
            (LinuxNamespaceType::Mount, None),
            (LinuxNamespaceType::Network, Some(f.path("ns/net"))),
        ]
    );

    let a = spec.annotations().as_ref().unwrap();
    for (k, v) in [
        ("io.kubernetes.cri.container-type", "container"),
        ("io.kubernetes.cri.sandbox-id", "sb1"),
        ("io.kubernetes.cri.sandbox-name", "web-0"),
        ("io.kubernetes.cri.sandbox-namespace", "default"),
        ("io.kubernetes.cri.sandbox-uid", "uid-1"),
        ("io.kubernetes.cri.container-name", "app"),
        ("io.kubernetes.cri.image-name", "busybox:1.36"),
    ] {
        assert_eq!(a.get(k).map(String::as_str), Some(v), "{k}");
    }
    assert_eq!(a.len(), 7);
}

#[test]
fn cri_mounts_sorted_with_options() {
    let mut f = Fixture::new();
    let m = |dst: &str, src: &Path, ro: bool, rro: bool, prop: MountPropagation| CriMount {
        container_path: dst.into(),
        host_path: src.display().to_string(),
        readonly: ro,
        recursive_read_only: rro,
        propagation: prop as i32,
        ..Default::default()
    };
    let data = f.path("vol/data");
    let missing = f.path("vol/created-by-runtime");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(f.path("vol/hosts"), "1.2.3.4 x\n").unwrap();
    std::os::unix::fs::symlink(&data, f.path("vol/link")).unwrap();
    f.config.mounts = vec![
        m(
            "/data/deep/x",
            &data,
            true,
            false,
            MountPropagation::PropagationPrivate,
        ),
        m(
            "/data",
            &missing,
            false,
            false,
            MountPropagation::PropagationPrivate,
        ),
        m(
            "/etc/hosts",
            &f.path("vol/hosts"),
            true,
            false,
            MountPropagation::PropagationPrivate,
        ),
        m(
            "/cache",
            &data,
            true,
            true,
            MountPropagation::PropagationPrivate,
        ),
        m(
            "/linked",
            &f.path("vol/link"),
            false,
            false,
            MountPropagation::PropagationHostToContainer,
        ),
        m(
            "/shared",
            &data,
            false,
            false,
            MountPropagation::PropagationBidirectional,
        ),
    ];
    let spec = f.build().unwrap();
    assert_eq!(
        destinations(&spec),
        [
            "/proc",
            "/dev",
            "/dev/pts",
            "/dev/mqueue",
            "/sys",
            "/sys/fs/cgroup",
            // depth 1, CRI order
            "/data",
            "/cache",
            "/linked",
            "/shared",
            // depth 2: CRI first, then the sandbox files not overridden
            "/etc/hosts",
            "/etc/hostname",
            "/etc/resolv.conf",
            "/dev/shm",
            "/data/deep/x",
        ]
    );
    assert!(
        missing.is_dir(),
        "missing host dirs are created like containerd does"
    );
    assert_eq!(
        options(mount_at(&spec, "/data/deep/x")),
        ["rbind", "rprivate", "ro"]
    );
    assert_eq!(
        options(mount_at(&spec, "/data")),
        ["rbind", "rprivate", "rw"]
    );
    assert_eq!(
        options(mount_at(&spec, "/cache")),
        ["rbind", "rprivate", "rro"]
    );
    let linked = mount_at(&spec, "/linked");
    assert_eq!(options(linked), ["rbind", "rslave", "rw"]);
    assert_eq!(
        linked.source().as_deref(),
        Some(data.canonicalize().unwrap().as_path())
    );
    assert_eq!(
        options(mount_at(&spec, "/shared")),
        ["rbind", "rshared", "rw"]
    );
    assert_eq!(
        mount_at(&spec, "/etc/hosts").source().as_deref(),
        Some(f.path("vol/hosts").as_path())
    );
    assert_eq!(
        spec.linux()
            .as_ref()
            .unwrap()
            .rootfs_propagation()
            .as_deref(),
        Some("rshared")
    );
}

#[test]
fn mount_errors() {
    let base = |prop: MountPropagation, ro: bool, rro: bool| {
        let mut f = Fixture::new();
        std::fs::create_dir_all(f.path("vol")).unwrap();
        f.config.mounts = vec![CriMount {
            container_path: "/v".into(),
            host_path: f.path("vol").display().to_string(),
            readonly: ro,
            recursive_read_only: rro,
            propagation: prop as i32,
            ..Default::default()
        }];
        f
    };
    let err = base(MountPropagation::PropagationPrivate, false, true)
        .build()
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.to_string()
            .contains("recursive read-only mount conflicts with RW mount"),
        "{err}"
    );

    let err = base(MountPropagation::PropagationHostToContainer, true, true)
        .build()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("recursive read-only mount needs private propagation"),
        "{err}"
    );

    // A host path on a private mount cannot be shared.
    let f = base(MountPropagation::PropagationBidirectional, false, false);
    std::fs::write(
        &f.facts.mountinfo_path,
        format!(
            "22 1 0:21 / / rw shared:1 - ext4 /dev/root rw\n30 22 0:40 / {} rw - tmpfs tmpfs rw\n",
            f.path("vol").display()
        ),
    )
    .unwrap();
    let err = f.build().unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.to_string().contains("is not a shared mount"), "{err}");

    let mut f = Fixture::new();
    f.config.mounts = vec![CriMount {
        container_path: "relative".into(),
        host_path: "/tmp".into(),
        ..Default::default()
    }];
    assert!(
        f.build()
            .unwrap_err()
            .to_string()
            .contains("mounts[0].container_path \"relative\"")
    );
}

#[test]
fn host_dev_mount_replaces_dev_defaults() {
    let mut f = Fixture::new();
    f.config.tty = true;
    f.config.mounts = vec![CriMount {
        container_path: "/dev".into(),
        host_path: "/dev".into(),
        ..Default::default()
    }];
    let spec = f.build().unwrap();
    let d = destinations(&spec);
    assert!(
        !d.iter().any(|d| d == "/dev/pts" || d == "/dev/mqueue"),
        "{d:?}"
    );
    assert_eq!(mount_at(&spec, "/dev").typ().as_deref(), Some("bind"));
    let p = spec.process().as_ref().unwrap();
    assert_eq!(p.terminal(), Some(true));
    assert!(
        p.env()
            .as_ref()
            .unwrap()
            .contains(&"TERM=xterm".to_string())
    );
    if Path::new("/dev/console").exists() {
        let devices = spec.linux().as_ref().unwrap().devices().clone().unwrap();
        assert!(
            devices
                .iter()
                .any(|d| d.path() == Path::new("/dev/console"))
        );
    }
}

#[test]
fn image_volumes() {
    let mut f = Fixture::new();
    std::fs::create_dir_all(f.path("imgvol")).unwrap();
    let vol = CriMount {
        container_path: "/models".into(),
        readonly: true,
        image: Some(ImageSpec {
            image: "sha256:feed".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    f.config.mounts = vec![vol.clone()];
    let err = f.build().unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");

    f.image_mounts = vec![ImageMount {
        container_path: "/models/".into(),
        host_path: f.path("imgvol"),
    }];
    let spec = f.build().unwrap();
    let m = mount_at(&spec, "/models");
    assert_eq!(m.source().as_deref(), Some(f.path("imgvol").as_path()));
    assert_eq!(options(m), ["rbind", "rprivate", "ro"]);

    f.config.mounts = vec![CriMount {
        readonly: false,
        ..vol.clone()
    }];
    assert!(
        f.build()
            .unwrap_err()
            .to_string()
            .contains("readonly must be true")
    );
    f.config.mounts = vec![CriMount {
        host_path: "/x".into(),
        ..vol
    }];
    assert!(
        f.build()
            .unwrap_err()
            .to_string()
            .contains("host_path must be empty")
    );
}

#[test]
fn namespaces_per_mode() {
    use LinuxNamespaceType::*;
    let f0 = Fixture::new();
    let p = |r: &str| Some(f0.path(r));
    // (pid mode, host network, host ipc, host pid, cgroup v2, expected)
    let cases = vec![
        (
            NamespaceMode::Container,
            false,
            false,
            false,
            false,
            vec![
                (Pid, None),
                (Ipc, p("ns/ipc")),
                (Uts, p("ns/uts")),
                (Mount, None),
                (Network, p("ns/net")),
            ],
        ),
        (
            NamespaceMode::Pod,
            false,
            false,
            false,
            false,
            vec![
                (Pid, Some(PathBuf::from("/proc/4242/ns/pid"))),
                (Ipc, p("ns/ipc")),
                (Uts, p("ns/uts")),
                (Mount, None),
                (Network, p("ns/net")),
            ],
        ),
        (
            NamespaceMode::Pod,
            false,
            false,
            true,
            false,
            vec![
                (Ipc, p("ns/ipc")),
                (Uts, p("ns/uts")),
                (Mount, None),
                (Network, p("ns/net")),
            ],
        ),
        (
            NamespaceMode::Node,
            true,
            true,
            true,
            false,
            vec![(Mount, None)],
        ),
        (
            NamespaceMode::Container,
            true,
            false,
            false,
            true,
            vec![
                (Pid, None),
                (Ipc, p("ns/ipc")),
                (Mount, None),
                (Cgroup, None),
            ],
        ),
        (
            NamespaceMode::Target,
            false,
            false,
            false,
            false,
            vec![
                (Pid, Some(PathBuf::from("/proc/77/ns/pid"))),
                (Ipc, p("ns/ipc")),
                (Uts, p("ns/uts")),
                (Mount, None),
                (Network, p("ns/net")),
            ],
        ),
    ];
    for (i, (pid, hn, hi, hp, v2, want)) in cases.into_iter().enumerate() {
        let mut f = Fixture::new();
        f.namespaces = SandboxNamespaces {
            network: p("ns/net"),
            ipc: p("ns/ipc"),
            uts: p("ns/uts"),
            pid: Some(NamespaceRef::Process(4242)),
            target_pid: Some(NamespaceRef::Process(77)),
            host_network: hn,
            host_ipc: hi,
            host_pid: hp,
            user: None,
        };
        f.facts.cgroup_v2 = v2;
        f.sc().namespace_options.as_mut().unwrap().pid = pid as i32;
        assert_eq!(namespaces(&f.build().unwrap()), want, "case {i}");
    }

    // A privileged container gets no cgroup namespace even on v2.
    let mut f = Fixture::new();
    f.facts.cgroup_v2 = true;
    f.sc().privileged = true;
    f.sandbox.linux.as_mut().unwrap().security_context = Some(LinuxSandboxSecurityContext {
        privileged: true,
        ..Default::default()
    });
    assert!(
        !namespaces(&f.build().unwrap())
            .iter()
            .any(|(t, _)| *t == Cgroup)
    );

    // Missing pinned namespaces are a sandbox problem.
    let mut f = Fixture::new();
    f.namespaces.network = None;
    assert_eq!(
        f.build().unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    let mut f = Fixture::new();
    f.sc().namespace_options.as_mut().unwrap().pid = NamespaceMode::Target as i32;
    assert!(
        f.build()
            .unwrap_err()
            .to_string()
            .contains("invalid target container")
    );
}

#[test]
fn user_namespaces_join_the_pods_and_carry_its_maps() {
    use crate::sandbox::UserMappings;
    use crate::sandbox::userns::IdMap;
    let maps = UserMappings {
        uids: vec![IdMap {
            container_id: 0,
            host_id: 65536,
            size: 65536,
        }],
        gids: vec![IdMap {
            container_id: 0,
            host_id: 131072,
            size: 65536,
        }],
    };
    let cri_maps = |host_id| {
        vec![IdMapping {
            host_id,
            container_id: 0,
            length: 65536,
        }]
    };
    let pod_mode = |uids, gids| UserNamespace {
        mode: NamespaceMode::Pod as i32,
        uids,
        gids,
    };

    // A pod without a user namespace: NODE (or nothing) is fine, POD is not.
    let mut f = Fixture::new();
    f.sc().namespace_options.as_mut().unwrap().userns_options = Some(UserNamespace {
        mode: NamespaceMode::Node as i32,
        ..Default::default()
    });
    let spec = f.build().unwrap();
    assert!(spec.linux().as_ref().unwrap().uid_mappings().is_none());
    f.sc().namespace_options.as_mut().unwrap().userns_options =
        Some(pod_mode(cri_maps(65536), cri_maps(131072)));
    let err = f.build().unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.to_string().contains("created without a user namespace"),
        "{err}"
    );

    // A pod with one: the container joins it, first, with its maps in the spec.
    f.namespaces.user = Some(PodUserNamespace {
        path: "/run/ns/user".into(),
        mappings: maps,
    });
    let spec = f.build().unwrap();
    let linux = spec.linux().as_ref().unwrap();
    let first = &linux.namespaces().as_ref().unwrap()[0];
    assert_eq!(first.typ(), LinuxNamespaceType::User);
    assert_eq!(first.path().as_deref(), Some(Path::new("/run/ns/user")));
    let uid = linux.uid_mappings().as_ref().unwrap();
    let gid = linux.gid_mappings().as_ref().unwrap();
    assert_eq!((uid[0].host_id(), uid[0].size()), (65536, 65536));
    assert_eq!(gid[0].host_id(), 131072);
    // Unset options follow the pod as well.
    f.sc().namespace_options.as_mut().unwrap().userns_options = None;
    assert!(f.build().is_ok());

    for (opts, want) in [
        (
            pod_mode(cri_maps(1 << 20), cri_maps(131072)),
            "differ from the sandbox's",
        ),
        (
            UserNamespace {
                mode: NamespaceMode::Node as i32,
                ..Default::default()
            },
            "must use it (mode POD)",
        ),
        (
            UserNamespace {
                mode: NamespaceMode::Container as i32,
                ..Default::default()
            },
            "unsupported user namespace mode CONTAINER",
        ),
    ] {
        f.sc().namespace_options.as_mut().unwrap().userns_options = Some(opts);
        let err = f.build().unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.to_string().contains(want), "{err}");
    }
}

fn seccomp_profile(t: ProfileType, r: &str) -> Option<SecurityProfile> {
    Some(SecurityProfile {
        profile_type: t as i32,
        localhost_ref: r.into(),
    })
}

#[test]
fn seccomp_profiles() {
    // RuntimeDefault: errno by default, namespace-creating clone refused, clone3 ENOSYS.
    let mut f = Fixture::new();
    f.sc().seccomp = seccomp_profile(ProfileType::RuntimeDefault, "");
    let spec = f.build().unwrap();
    let s = spec.linux().as_ref().unwrap().seccomp().clone().unwrap();
    assert_eq!(s.default_action(), LinuxSeccompAction::ScmpActErrno);
    let calls = s.syscalls().clone().unwrap();
    let names = |pred: &dyn Fn(&oci_spec::runtime::LinuxSyscall) -> bool| -> Vec<String> {
        calls
            .iter()
            .filter(|c| pred(c))
            .flat_map(|c| c.names().clone())
            .collect()
    };
    let unconditional =
        names(&|c| c.action() == LinuxSeccompAction::ScmpActAllow && c.args().is_none());
    for n in ["read", "execve", "chroot", "ptrace", "futex_waitv"] {
        assert!(
            unconditional.contains(&n.to_string()),
            "{n} should be allowed"
        );
    }
    for n in ["mount", "unshare", "io_uring_setup", "bpf", "reboot"] {
        assert!(
            !unconditional.contains(&n.to_string()),
            "{n} should not be allowed"
        );
    }
    let clone3 = calls
        .iter()
        .find(|c| c.names() == &["clone3".to_string()])
        .unwrap();
    assert_eq!(
        (clone3.action(), clone3.errno_ret()),
        (LinuxSeccompAction::ScmpActErrno, Some(38))
    );
    assert!(
        calls
            .iter()
            .any(|c| c.names() == &["clone".to_string()] && c.args().is_some())
    );

    // With CAP_SYS_ADMIN the admin syscalls are allowed and clone is unrestricted.
    f.sc().capabilities = Some(CriCaps {
        add_capabilities: vec!["SYS_ADMIN".into()],
        ..Default::default()
    });
    let spec = f.build().unwrap();
    let calls = spec
        .linux()
        .as_ref()
        .unwrap()
        .seccomp()
        .clone()
        .unwrap()
        .syscalls()
        .clone()
        .unwrap();
    assert!(
        calls
            .iter()
            .any(|c| c.names().contains(&"mount".to_string()))
    );
    assert!(!calls.iter().any(|c| c.names() == &["clone3".to_string()]));

    // Without CAP_SYS_CHROOT no chroot.
    f.sc().capabilities = Some(CriCaps {
        drop_capabilities: vec!["SYS_CHROOT".into()],
        ..Default::default()
    });
    let spec = f.build().unwrap();
    let calls = spec
        .linux()
        .as_ref()
        .unwrap()
        .seccomp()
        .clone()
        .unwrap()
        .syscalls()
        .clone()
        .unwrap();
    assert!(
        !calls
            .iter()
            .any(|c| c.names().contains(&"chroot".to_string()))
    );

    // Unconfined, and privileged: no seccomp.
    f.sc().seccomp = seccomp_profile(ProfileType::Unconfined, "");
    assert!(
        f.build()
            .unwrap()
            .linux()
            .as_ref()
            .unwrap()
            .seccomp()
            .is_none()
    );
    f.sc().seccomp = seccomp_profile(ProfileType::RuntimeDefault, "");
    f.sc().privileged = true;
    f.sandbox.linux.as_mut().unwrap().security_context = Some(LinuxSandboxSecurityContext {
        privileged: true,
        ..Default::default()
    });
    assert!(
        f.build()
            .unwrap()
            .linux()
            .as_ref()
            .unwrap()
            .seccomp()
            .is_none()
    );

    // Deprecated path form.
    let mut f = Fixture::new();
    #[allow(deprecated)]
    {
        f.sc().seccomp_profile_path = "runtime/default".into();
    }
    assert!(
        f.build()
            .unwrap()
            .linux()
            .as_ref()
            .unwrap()
            .seccomp()
            .is_some()
    );
    #[allow(deprecated)]
    {
        f.sc().seccomp_profile_path = "bogus".into();
    }
    assert_eq!(f.build().unwrap_err().code(), tonic::Code::InvalidArgument);

    // localhost_ref only with Localhost.
    let mut f = Fixture::new();
    f.sc().seccomp = seccomp_profile(ProfileType::RuntimeDefault, "/x.json");
    assert!(
        f.build()
            .unwrap_err()
            .to_string()
            .contains("must only be set if profile_type is Localhost")
    );
}

#[test]
fn seccomp_localhost() {
    let mut f = Fixture::new();
    let profile = json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [{"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"}]
    });
    std::fs::create_dir_all(f.path("profiles")).unwrap();
    std::fs::write(f.path("profiles/p.json"), profile.to_string()).unwrap();
    std::fs::write(f.path("profiles/broken.json"), "{").unwrap();

    f.sc().seccomp = seccomp_profile(
        ProfileType::Localhost,
        &f.path("profiles/p.json").display().to_string(),
    );
    let s = f
        .build()
        .unwrap()
        .linux()
        .as_ref()
        .unwrap()
        .seccomp()
        .clone()
        .unwrap();
    assert_eq!(
        s.syscalls().as_ref().unwrap()[0].names(),
        &["read".to_string(), "write".to_string()]
    );

    // Relative to the profile root.
    f.profile_root = Some(f.path("profiles"));
    f.sc().seccomp = seccomp_profile(ProfileType::Localhost, "p.json");
    assert!(
        f.build()
            .unwrap()
            .linux()
            .as_ref()
            .unwrap()
            .seccomp()
            .is_some()
    );

    let missing = f.path("profiles/missing.json").display().to_string();
    f.sc().seccomp = seccomp_profile(ProfileType::Localhost, &missing);
    let err = f.build().unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.to_string().contains(&missing), "{err}");

    f.sc().seccomp = seccomp_profile(ProfileType::Localhost, "broken.json");
    assert!(
        f.build()
            .unwrap_err()
            .to_string()
            .contains("decoding seccomp profile failed")
    );

    f.profile_root = None;
    f.sc().seccomp = seccomp_profile(ProfileType::Localhost, "p.json");
    assert!(
        f.build()
            .unwrap_err()
            .to_string()
            .contains("must be an absolute path")
    );
}

#[test]
fn privileged_containers() {
    let mut f = Fixture::new();
    f.sc().privileged = true;
    let err = f.build().unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.to_string()
            .contains("no privileged container allowed in sandbox"),
        "{err}"
    );

    f.sandbox.linux.as_mut().unwrap().security_context = Some(LinuxSandboxSecurityContext {
        privileged: true,
        ..Default::default()
    });
    f.sc().masked_paths = vec!["/proc/kcore".into()];
    f.sc().capabilities = Some(CriCaps {
        drop_capabilities: vec!["ALL".into()],
        ..Default::default()
    });
    let spec = f.build().unwrap();
    assert_eq!(caps(&spec), ["CHOWN", "NET_ADMIN", "SYS_ADMIN"]);
    let linux = spec.linux().as_ref().unwrap();
    assert!(linux.masked_paths().is_none() && linux.readonly_paths().is_none());
    assert_eq!(
        options(mount_at(&spec, "/sys")),
        ["nosuid", "noexec", "nodev", "rw"]
    );
    assert_eq!(
        options(mount_at(&spec, "/sys/fs/cgroup"))
            .last()
            .map(String::as_str),
        Some("rw")
    );
    let rules = linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .clone()
        .unwrap();
    assert_eq!(rules.len(), 1);
    assert!(rules[0].allow() && rules[0].typ().is_none());
    let devices = linux.devices().clone().unwrap_or_default();
    assert!(
        devices.iter().any(|d| d.path() == Path::new("/dev/null")),
        "host devices are added"
    );
}

#[test]
fn devices_and_masked_paths() {
    let mut f = Fixture::new();
    f.config.devices = vec![Device {
        container_path: "/dev/mynull".into(),
        host_path: "/dev/null".into(),
        permissions: "rw".into(),
    }];
    f.sc().masked_paths = vec!["/proc/kcore".into()];
    f.sc().readonly_paths = vec!["/proc/sys".into()];
    let spec = f.build().unwrap();
    let linux = spec.linux().as_ref().unwrap();
    let dev = &linux.devices().as_ref().unwrap()[0];
    assert_eq!(dev.path(), Path::new("/dev/mynull"));
    assert_eq!(
        (dev.typ(), dev.major(), dev.minor()),
        (LinuxDeviceType::C, 1, 3)
    );
    let rules = linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .clone()
        .unwrap();
    assert_eq!(rules.len(), 2);
    assert!(rules[1].allow());
    assert_eq!((rules[1].major(), rules[1].minor()), (Some(1), Some(3)));
    assert_eq!(rules[1].access().as_deref(), Some("rw"));
    assert_eq!(
        linux.masked_paths().as_deref(),
        Some(&["/proc/kcore".to_string()][..])
    );
    assert_eq!(
        linux.readonly_paths().as_deref(),
        Some(&["/proc/sys".to_string()][..])
    );

    f.config.devices[0].host_path = "/dev/does-not-exist".into();
    let err = f.build().unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.to_string().contains("/dev/does-not-exist"), "{err}");
    f.config.devices[0].host_path = "/dev/null".into();
    f.config.devices[0].permissions = "rwx".into();
    assert!(
        f.build()
            .unwrap_err()
            .to_string()
            .contains("permissions \"rwx\"")
    );
}

#[test]
fn resources_oom_and_user_through_build() {
    let mut f = Fixture::new();
    f.config.linux.as_mut().unwrap().resources = Some(LinuxContainerResources {
        cpu_shares: 2,
        cpu_quota: 20_000,
        cpu_period: 100_000,
        memory_limit_in_bytes: 128 << 20,
        oom_score_adj: -997,
        ..Default::default()
    });
    f.sc().run_as_user = Some(Int64Value { value: 1000 });
    f.sc().supplemental_groups = vec![2000];
    f.sc().readonly_rootfs = true;
    f.sc().no_new_privs = true;
    f.config.working_dir = "/work".into();
    let spec = f.build().unwrap();
    let p = spec.process().as_ref().unwrap();
    assert_eq!(
        p.oom_score_adj(),
        Some(0),
        "clamped to the runtime's own value"
    );
    assert_eq!((p.user().uid(), p.user().gid()), (1000, 1000));
    assert_eq!(
        p.user().additional_gids().as_deref(),
        Some(&[500, 1000, 2000][..])
    );
    assert_eq!(p.no_new_privileges(), Some(true));
    assert_eq!(p.cwd(), Path::new("/work"));
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
    assert_eq!(
        options(mount_at(&spec, "/etc/resolv.conf")),
        ["rbind", "rprivate", "ro"]
    );
    assert_eq!(
        options(mount_at(&spec, "/dev/shm")),
        ["rbind", "rprivate", "rw"]
    );
    let res = spec.linux().as_ref().unwrap().resources().clone().unwrap();
    let mem = res.memory().unwrap();
    assert_eq!(
        (mem.limit(), mem.swap()),
        (Some(128 << 20), Some(128 << 20))
    );
    assert_eq!(res.cpu().as_ref().unwrap().shares(), Some(2));

    f.floor = -999;
    assert_eq!(
        f.build()
            .unwrap()
            .process()
            .as_ref()
            .unwrap()
            .oom_score_adj(),
        Some(-997)
    );
}

#[test]
fn sysctls_follow_namespaces() {
    let mut f = Fixture::new();
    let sysctls = &mut f.sandbox.linux.as_mut().unwrap().sysctls;
    sysctls.insert("net.ipv4.ip_unprivileged_port_start".into(), "0".into());
    sysctls.insert("kernel/shm_rmid_forced".into(), "1".into());
    let spec = f.build().unwrap();
    let s = spec.linux().as_ref().unwrap().sysctl().clone().unwrap();
    assert_eq!(s["net.ipv4.ip_unprivileged_port_start"], "0");
    assert_eq!(s["kernel.shm_rmid_forced"], "1");

    f.namespaces.host_network = true;
    let err = f.build().unwrap_err();
    assert!(
        err.to_string()
            .contains("needs the pod's own network namespace"),
        "{err}"
    );

    let mut f = Fixture::new();
    f.sandbox
        .linux
        .as_mut()
        .unwrap()
        .sysctls
        .insert("vm.swappiness".into(), "1".into());
    assert!(
        f.build()
            .unwrap_err()
            .to_string()
            .contains("\"vm.swappiness\" is not namespaced")
    );
}

#[test]
fn hostname_env_and_annotation_passthrough() {
    let mut f = Fixture::new();
    f.sandbox.hostname.clear();
    f.namespaces.host_network = true;
    f.sandbox
        .annotations
        .insert("io.katacontainers.config.x".into(), "1".into());
    f.sandbox.annotations.insert("other".into(), "2".into());
    f.config
        .annotations
        .insert("example.com/keep".into(), "3".into());
    f.config
        .annotations
        .insert("io.kubernetes.cri.container-type".into(), "spoofed".into());
    let spec = f.build().unwrap();
    assert!(
        spec.process()
            .as_ref()
            .unwrap()
            .env()
            .as_ref()
            .unwrap()
            .contains(&"HOSTNAME=node-1".to_string())
    );
    assert_eq!(
        spec.annotations().as_ref().unwrap().len(),
        7,
        "nothing passes without patterns"
    );

    f.pod_patterns = vec!["io.katacontainers.*".into()];
    f.container_patterns = vec!["example.com/*".into(), "io.kubernetes.cri.*".into()];
    let spec = f.build().unwrap();
    let a = spec.annotations().as_ref().unwrap();
    assert_eq!(a["io.katacontainers.config.x"], "1");
    assert_eq!(a["example.com/keep"], "3");
    assert!(!a.contains_key("other"));
    assert_eq!(
        a["io.kubernetes.cri.container-type"], "container",
        "CRI annotations win"
    );
}

#[test]
fn apparmor_localhost_is_refused() {
    let mut f = Fixture::new();
    f.sc().apparmor = Some(SecurityProfile {
        profile_type: ProfileType::Localhost as i32,
        localhost_ref: "k8s-deny".into(),
    });
    assert!(
        f.build()
            .unwrap_err()
            .to_string()
            .contains("apparmor is not supported")
    );
    f.sc().apparmor = seccomp_profile(ProfileType::RuntimeDefault, "");
    assert!(f.build().is_ok());
}

#[test]
fn bundle_config_round_trips() {
    let mut f = Fixture::new();
    f.config.tty = true;
    f.sc().seccomp = seccomp_profile(ProfileType::RuntimeDefault, "");
    f.config.linux.as_mut().unwrap().resources = Some(LinuxContainerResources {
        memory_limit_in_bytes: 1 << 30,
        ..Default::default()
    });
    let spec = f.build().unwrap();
    let bundle = f.path("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    spec.save(bundle.join("config.json")).unwrap();
    let loaded = Spec::load(bundle.join("config.json")).unwrap();
    assert_eq!(loaded, spec);

    let raw: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    assert_eq!(raw["ociVersion"], OCI_VERSION);
    assert!(raw["root"]["path"].as_str().unwrap().ends_with("rootfs"));
    assert_eq!(raw["process"]["args"], json!(["sh"]));
    assert_eq!(raw["process"]["cwd"], "/");
    assert_eq!(raw["process"]["terminal"], true);
    assert_eq!(raw["process"]["user"]["uid"], 0);
    assert!(
        raw["process"]["capabilities"]["bounding"]
            .as_array()
            .unwrap()
            .contains(&json!("CAP_CHOWN"))
    );
    assert_eq!(raw["linux"]["resources"]["memory"]["limit"], 1 << 30);
    assert_eq!(
        raw["linux"]["resources"]["devices"][0],
        json!({"allow": false, "access": "rwm"})
    );
    assert_eq!(raw["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ERRNO");
    assert_eq!(
        raw["linux"]["seccomp"]["architectures"][0],
        "SCMP_ARCH_X86_64"
    );
    assert_eq!(
        raw["linux"]["cgroupsPath"],
        "/kubepods/besteffort/poduid-1/c0ffee"
    );
    assert!(
        raw["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .contains(&json!({"type": "mount"}))
    );
    assert!(
        raw["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["destination"].is_string() && m["type"].is_string())
    );
    assert!(raw.get("hostname").is_none());
    fn no_nulls(v: &Value, at: &str) {
        match v {
            Value::Null => panic!("null at {at}"),
            Value::Object(m) => m
                .iter()
                .for_each(|(k, v)| no_nulls(v, &format!("{at}.{k}"))),
            Value::Array(a) => a
                .iter()
                .enumerate()
                .for_each(|(i, v)| no_nulls(v, &format!("{at}[{i}]"))),
            _ => {}
        }
    }
    no_nulls(&raw, "$");
}
