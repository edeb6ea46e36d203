//! CRI conformance gaps of `nodus runtime` (issue 20), checked as the upstream validation
//! suite (critest) checks them, against real containers run by runc: each test is a node in
//! its own network namespace and cgroup parent, with busybox imported offline.

mod common;

use common::*;
use cri::runtime::v1 as pb;
use std::time::Duration;

const SUBNET: &str = "10.97.0.0/24";

async fn node() -> TestNode {
    TestNode::new(SUBNET).await
}

fn privileged_sandbox(n: &TestNode, name: &str) -> pb::PodSandboxConfig {
    let mut cfg = n.sandbox_config(name);
    if let Some(l) = cfg.linux.as_mut() {
        l.security_context = Some(pb::LinuxSandboxSecurityContext {
            privileged: true,
            ..Default::default()
        });
    }
    cfg
}

fn stdout(r: &pb::ExecSyncResponse) -> String {
    String::from_utf8_lossy(&r.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn oom_kill_in_a_privileged_sandbox_is_reported_as_oomkilled() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = privileged_sandbox(&n, "oom-priv");
    let sb = n.run_sandbox(&sb_cfg).await;
    // A 20 MiB limit and a shell that keeps 64 MiB.
    let mut hog = common::node::memory_hog("hog", 20 << 20);
    if let Some(l) = hog.linux.as_mut() {
        l.security_context = Some(pb::LinuxContainerSecurityContext {
            privileged: true,
            ..Default::default()
        });
    }
    let hog = n.create(&sb, &sb_cfg, hog).await.expect("CreateContainer");
    n.start(&hog).await;
    let s = n
        .wait_state(&hog, pb::ContainerState::ContainerExited)
        .await;
    assert_eq!(
        (s.reason.as_str(), s.exit_code),
        ("OOMKilled", 137),
        "{s:?}\n{}",
        n.rt.log()
    );
    assert!(!n.log("oom-priv", "hog").contains("survived"));
    n.stop_and_remove_sandbox(&sb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_sync_timeout_kills_the_exec_and_its_children() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = n.sandbox_config("exec-timeout");
    let sb = n.run_sandbox(&sb_cfg).await;
    let id = n
        .run(&sb, &sb_cfg, n.container_config("main", &["sleep", "3600"]))
        .await;
    // critest's shape: `sleep 4321` with a 1 s timeout.
    let e = n.exec(&id, &["sleep", "4321"], 1).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
    // And a shell whose child would outlive the shell itself.
    let e = n
        .exec(&id, &["sh", "-c", "sleep 4322 & sleep 4323; wait"], 1)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
    // SIGKILL is delivered before ExecSync returns, but the dying processes may still be
    // listed for a moment.
    let mut left = String::new();
    for _ in 0..50 {
        left = stdout(&n.exec(&id, &["ps", "-o", "args"], 10).await.unwrap());
        if !left.contains("sleep 43") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !left.contains("sleep 4321") && !left.contains("sleep 4322"),
        "timed-out execs left behind:\n{left}"
    );
    assert!(!left.contains("sleep 4323"), "{left}");
    n.stop_and_remove_sandbox(&sb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn runtime_config_reports_the_cgroupfs_driver() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let r =
        n.c.runtime
            .clone()
            .runtime_config(pb::RuntimeConfigRequest {})
            .await
            .expect("RuntimeConfig")
            .into_inner();
    assert_eq!(
        r.linux.map(|l| l.cgroup_driver),
        Some(pb::CgroupDriver::Cgroupfs as i32)
    );
}

#[test]
fn systemd_cgroup_true_without_systemd_refuses_to_start_naming_the_key() {
    if std::path::Path::new("/run/systemd/system").exists() {
        // A systemd host accepts it: kubelet_systemd.rs runs that in the VM lane.
        return;
    }
    let err = Runtime::refused(
        "systemd-cgroup = true\nnri = false\n",
        "systemd-cgroup = true",
    );
    assert!(
        err.contains(
            "systemd-cgroup = true needs systemd as init, and this machine does not run it"
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn container_status_reports_the_user_of_the_init_process() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = n.sandbox_config("user");
    let sb = n.run_sandbox(&sb_cfg).await;
    let mut cfg = n.container_config("main", &["sleep", "3600"]);
    cfg.linux = Some(pb::LinuxContainerConfig {
        security_context: Some(pb::LinuxContainerSecurityContext {
            run_as_user: Some(pb::Int64Value { value: 1000 }),
            run_as_group: Some(pb::Int64Value { value: 3000 }),
            supplemental_groups: vec![4000],
            supplemental_groups_policy: pb::SupplementalGroupsPolicy::Strict as i32,
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = n.create(&sb, &sb_cfg, cfg).await.expect("CreateContainer");
    let created = n.status(&id).await.user.and_then(|u| u.linux);
    n.start(&id).await;
    let user = n
        .status(&id)
        .await
        .user
        .and_then(|u| u.linux)
        .expect("ContainerStatus.user.linux of a running container");
    // What the process itself sees.
    let ids = stdout(
        &n.exec(&id, &["sh", "-c", "id -u; id -g; id -G"], 10)
            .await
            .unwrap(),
    );
    let ids: Vec<&str> = ids.lines().collect();
    assert_eq!(
        (user.uid.to_string(), user.gid.to_string()),
        (ids[0].to_string(), ids[1].to_string())
    );
    assert_eq!((user.uid, user.gid), (1000, 3000));
    let mut groups: Vec<i64> = ids[2]
        .split_whitespace()
        .map(|g| g.parse().unwrap())
        .collect();
    groups.retain(|g| *g != user.gid || user.supplemental_groups.contains(g));
    let mut reported = user.supplemental_groups.clone();
    reported.sort();
    groups.sort();
    assert_eq!(reported, groups, "id -G: {}", ids[2]);
    assert!(reported.contains(&4000), "{reported:?}");
    // Before the start and after the exit: the identity it was started with.
    assert_eq!(created.as_ref().map(|u| (u.uid, u.gid)), Some((1000, 3000)));
    n.c.runtime
        .clone()
        .stop_container(pb::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
    let exited = n.wait_state(&id, pb::ContainerState::ContainerExited).await;
    assert_eq!(
        exited.user.and_then(|u| u.linux).map(|u| (u.uid, u.gid)),
        Some((1000, 3000))
    );
    n.stop_and_remove_sandbox(&sb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_user_namespace_maps_must_map_root_and_not_overlap() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let m = |container_id, host_id, length| pb::IdMapping {
        container_id,
        host_id,
        length,
    };
    let cases = [
        (
            vec![m(1, 65536, 65536)],
            vec![m(0, 65536, 65536)],
            "UID mapping: container ID 0 cannot be mapped to a host ID",
        ),
        (
            vec![m(0, 65536, 65536)],
            vec![m(1000, 65536, 65536)],
            "GID mapping: container ID 0 cannot be mapped to a host ID",
        ),
        (
            vec![m(0, 65536, 0)],
            vec![m(0, 65536, 65536)],
            "uid mapping 0:65536:0 is empty or overflows",
        ),
        (
            vec![m(0, 65536, 1000), m(500, 200000, 1000)],
            vec![m(0, 65536, 65536)],
            "UID mapping: mappings 0:65536:1000 and 500:200000:1000 overlap",
        ),
    ];
    for (i, (uids, gids, want)) in cases.into_iter().enumerate() {
        let mut cfg = n.sandbox_config(&format!("userns-{i}"));
        if let Some(l) = cfg.linux.as_mut() {
            l.security_context = Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(pb::NamespaceOption {
                    userns_options: Some(pb::UserNamespace {
                        mode: pb::NamespaceMode::Pod as i32,
                        uids,
                        gids,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        let e =
            n.c.runtime
                .clone()
                .run_pod_sandbox(pb::RunPodSandboxRequest {
                    config: Some(cfg),
                    runtime_handler: String::new(),
                })
                .await
                .expect_err("RunPodSandbox with bad user namespace maps");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().ends_with(want), "{want:?}: {}", e.message());
    }
    let left =
        n.c.runtime
            .clone()
            .list_pod_sandbox(pb::ListPodSandboxRequest { filter: None })
            .await
            .unwrap()
            .into_inner()
            .items;
    assert!(left.is_empty(), "{left:?}");
}

fn image_volume(path: &str, sub_path: &str) -> pb::Mount {
    pb::Mount {
        container_path: path.into(),
        image: spec("busybox"),
        image_sub_path: sub_path.into(),
        readonly: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volumes_report_the_image_and_mount_only_their_sub_path() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let image_id =
        n.c.image
            .clone()
            .image_status(pb::ImageStatusRequest {
                image: spec("busybox"),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .image
            .expect("busybox is imported")
            .id;
    let sb_cfg = n.sandbox_config("imgvol");
    let sb = n.run_sandbox(&sb_cfg).await;
    let mut cfg = n.container_config("main", &["sleep", "3600"]);
    cfg.mounts = vec![image_volume("/whole", ""), image_volume("/sub", "bin")];
    let id = n.run(&sb, &sb_cfg, cfg).await;
    let ls = stdout(
        &n.exec(
            &id,
            &[
                "sh",
                "-c",
                "ls /sub; echo ---; ls -d /whole/bin /sub/bin 2>&1",
            ],
            10,
        )
        .await
        .unwrap(),
    );
    let (sub, rest) = ls.split_once("---").unwrap();
    assert!(
        sub.split_whitespace().any(|f| f == "busybox"),
        "/sub is the image's /bin: {ls}"
    );
    assert!(rest.contains("/whole/bin"), "{ls}");
    assert!(
        rest.contains("/sub/bin: No such file or directory"),
        "only the sub path is mounted: {ls}"
    );
    let mounts = n.status(&id).await.mounts;
    let images: Vec<(&str, &str, &str, &str)> = mounts
        .iter()
        .filter_map(|m| {
            let image = m.image.as_ref()?;
            Some((
                m.container_path.as_str(),
                image.image.as_str(),
                image.image_ref.as_str(),
                m.image_sub_path.as_str(),
            ))
        })
        .collect();
    // The image as asked for, and the id it resolved to (what containerStatuses' imageID is).
    let status = n.status(&id).await;
    assert_eq!(status.image_ref, image_id);
    assert_eq!(
        images,
        [
            ("/whole", "busybox", image_id.as_str(), ""),
            ("/sub", "busybox", image_id.as_str(), "bin")
        ]
    );

    for (i, (sub_path, why)) in [
        ("no/such/dir", "no such file or directory"),
        ("../../..", "path escapes from parent"),
        ("bin/busybox", "only directory subpath is supported"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut cfg = n.container_config(&format!("bad-{i}"), &["true"]);
        cfg.mounts = vec![image_volume("/sub", sub_path)];
        let e = n.create(&sb, &sb_cfg, cfg).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains(&format!("image subpath {sub_path:?}"))
                && e.message().ends_with(why),
            "{sub_path}: {}",
            e.message()
        );
    }
    n.stop_and_remove_sandbox(&sb).await;
    assert!(testkit::leftovers::pod_mounts_under(n.rt.dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_sandbox_metrics_follow_their_descriptors() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = n.sandbox_config("metrics");
    let sb = n.run_sandbox(&sb_cfg).await;
    let id = n
        .run(&sb, &sb_cfg, n.container_config("main", &["sleep", "3600"]))
        .await;
    // Some traffic on the pod's interface.
    let _ = n
        .exec(&id, &["ping", "-c", "1", "-W", "1", "10.97.0.1"], 10)
        .await;
    let mut rt = n.c.runtime.clone();
    let descriptors = rt
        .list_metric_descriptors(pb::ListMetricDescriptorsRequest {})
        .await
        .expect("ListMetricDescriptors")
        .into_inner()
        .descriptors;
    let keys = |name: &str| {
        descriptors
            .iter()
            .find(|d| d.name == name)
            .map(|d| d.label_keys.clone())
            .unwrap_or_else(|| panic!("no descriptor {name}"))
    };
    for name in [
        "container_cpu_usage_seconds_total",
        "container_memory_usage_bytes",
        "container_memory_working_set_bytes",
        "container_network_receive_bytes_total",
        "container_network_transmit_bytes_total",
    ] {
        let k = keys(name);
        for l in ["container", "id", "image", "name", "namespace", "pod"] {
            assert!(k.iter().any(|x| x == l), "{name}: {k:?}");
        }
    }
    assert_eq!(
        keys("container_network_receive_bytes_total")
            .last()
            .map(String::as_str),
        Some("interface")
    );
    let pods = rt
        .list_pod_sandbox_metrics(pb::ListPodSandboxMetricsRequest {})
        .await
        .expect("ListPodSandboxMetrics")
        .into_inner()
        .pod_metrics;
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    assert_eq!(pod.pod_sandbox_id, sb);
    let label = |m: &pb::Metric, key: &str| -> String {
        let k = keys(&m.name);
        assert_eq!(k.len(), m.label_values.len(), "{m:?}");
        let i = k.iter().position(|x| x == key).unwrap();
        m.label_values[i].clone()
    };
    let rx = pod
        .metrics
        .iter()
        .find(|m| {
            m.name == "container_network_receive_bytes_total" && label(m, "interface") == "eth0"
        })
        .unwrap_or_else(|| panic!("eth0 received bytes: {:?}", pod.metrics));
    assert_eq!(
        (
            label(rx, "pod"),
            label(rx, "namespace"),
            label(rx, "container")
        ),
        ("metrics".into(), "default".into(), "POD".into())
    );
    assert!(rx.value.as_ref().unwrap().value > 0, "{rx:?}");
    assert_eq!(pod.container_metrics.len(), 1);
    let c = &pod.container_metrics[0];
    assert_eq!(c.container_id, id);
    let ws = c
        .metrics
        .iter()
        .find(|m| m.name == "container_memory_working_set_bytes")
        .unwrap_or_else(|| panic!("{:?}", c.metrics));
    assert!(ws.value.as_ref().unwrap().value > 0, "{ws:?}");
    assert_eq!(ws.metric_type, pb::MetricType::Gauge as i32);
    assert_eq!(
        (label(ws, "container"), label(ws, "id"), label(ws, "pod")),
        ("main".into(), id.clone(), "metrics".into())
    );
    for m in pod.metrics.iter().chain(&c.metrics) {
        label(m, "id");
    }
    n.stop_and_remove_sandbox(&sb).await;
}

/// The kubelet's side: it takes the cgroup driver from RuntimeConfig over its own
/// `cgroupDriver`, and reports the runtime's ContainerUser in the pod's status.
#[tokio::test(flavor = "multi_thread")]
async fn kubelet_follows_the_runtimes_cgroup_driver_and_reports_the_container_user() {
    use common::kubelet::{Kubelet, NODE_NAME, container_status, is_running};
    if !have_root() {
        return;
    }
    let node = BareNode::new("10.97.1.0/24");
    node.cgroup.create();
    // systemd on its own would be refused: nodus's kubelet manages cgroupfs only. The
    // runtime says cgroupfs, and the kubelet follows it.
    let k = Kubelet::start(
        node.netns.clone(),
        &node.rt.endpoint(),
        &node.cgroup.path(),
        &["--cgroup-driver", "systemd"],
    );
    k.write_manifest(
        "who.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: who
spec:
  securityContext:
    runAsUser: 1000
    runAsGroup: 3000
    supplementalGroups: [4000]
    supplementalGroupsPolicy: Strict
  containers:
  - name: main
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#,
    );
    let name = format!("who-{NODE_NAME}");
    let p = k.wait_pod(&name, Duration::from_secs(60), "running with a user", |p| {
        is_running(p, "main") && container_status(p, "main").is_some_and(|c| !c["user"].is_null())
    });
    let user = &container_status(&p, "main").unwrap()["user"]["linux"];
    assert_eq!(
        (user["uid"].as_i64(), user["gid"].as_i64()),
        (Some(1000), Some(3000)),
        "{user}"
    );
    let groups: Vec<i64> = user["supplementalGroups"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g.as_i64())
        .collect();
    assert!(groups.contains(&4000), "{user}");
    let log = std::fs::read_to_string(k.dir.path().join("kubelet-1.log")).unwrap();
    assert!(
        log.lines().any(|l| l
            .contains("Using cgroup driver setting received from the CRI runtime")
            && l.contains("cgroupfs")),
        "{log}"
    );
    k.remove_manifest("who.yaml");
    k.wait_gone(&name, Duration::from_secs(60));
}

/// The OOM kill of a privileged pod through the kubelet: the pod's own cgroup (with the
/// pod-level memory limit) sits between the QoS tier and the container's.
#[tokio::test(flavor = "multi_thread")]
async fn kubelet_reports_oomkilled_for_a_privileged_pod() {
    use common::kubelet::{Kubelet, NODE_NAME, container_status};
    if !have_root() {
        return;
    }
    let node = BareNode::new("10.97.2.0/24");
    node.cgroup.create();
    let k = Kubelet::start(
        node.netns.clone(),
        &node.rt.endpoint(),
        &node.cgroup.path(),
        &[],
    );
    k.write_manifest(
        "hog.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: hog
spec:
  restartPolicy: Never
  containers:
  - name: hog
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    securityContext: {privileged: true}
    resources: {limits: {memory: 20Mi}}
    command: ["sh", "-c", "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo survived"]
"#,
    );
    let name = format!("hog-{NODE_NAME}");
    let p = k.wait_pod(&name, Duration::from_secs(60), "terminated", |p| {
        container_status(p, "hog").is_some_and(|c| !c["state"]["terminated"].is_null())
    });
    let t = &container_status(&p, "hog").unwrap()["state"]["terminated"];
    assert_eq!(
        (t["reason"].as_str(), t["exitCode"].as_i64()),
        (Some("OOMKilled"), Some(137)),
        "{t}"
    );
    k.remove_manifest("hog.yaml");
    k.wait_gone(&name, Duration::from_secs(60));
}

/// The shim appends a container's log as root: a CRI `log_path` that leaves the sandbox's
/// log directory is refused, and nothing is created outside it.
#[tokio::test(flavor = "multi_thread")]
async fn a_log_path_out_of_the_sandbox_log_directory_is_refused() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = n.sandbox_config("log-escape");
    let sb = n.run_sandbox(&sb_cfg).await;
    let outside = n.logs.path().join("escaped.log");
    for bad in [
        "../escaped.log".to_string(),
        outside.display().to_string(),
        "c/../../escaped.log".to_string(),
    ] {
        let mut cfg = n.container_config("c", &["true"]);
        cfg.log_path = bad.clone();
        let e = n.create(&sb, &sb_cfg, cfg).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}: {e:?}");
        assert!(
            e.message()
                .contains("must be relative and inside the sandbox's log directory"),
            "{bad}: {}",
            e.message()
        );
    }
    assert!(!outside.exists());
    // A sub-directory of the log directory is fine, and the name is free again.
    let mut cfg = n.container_config("c", &["echo", "inside"]);
    cfg.log_path = "c/0.log".into();
    let id = n.run(&sb, &sb_cfg, cfg).await;
    n.wait_state(&id, pb::ContainerState::ContainerExited).await;
    n.stop_and_remove_sandbox(&sb).await;
}

/// A container config whose PID namespace is `pid` (with `target_id` for TARGET).
fn with_pid(
    mut cfg: pb::ContainerConfig,
    pid: pb::NamespaceMode,
    target: &str,
) -> pb::ContainerConfig {
    cfg.linux = Some(pb::LinuxContainerConfig {
        security_context: Some(pb::LinuxContainerSecurityContext {
            namespace_options: Some(pb::NamespaceOption {
                pid: pid as i32,
                target_id: target.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    cfg
}

/// PID namespace mode TARGET (`kubectl debug --target`): the container joins the process
/// namespace of a running container of the same sandbox; anything else is refused with
/// InvalidArgument and leaves nothing behind.
#[tokio::test(flavor = "multi_thread")]
async fn pid_namespace_target_joins_the_target_containers_processes() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = n.sandbox_config("pid-target");
    let sb = n.run_sandbox(&sb_cfg).await;
    let own = pb::NamespaceMode::Container;
    let app = n
        .run(
            &sb,
            &sb_cfg,
            with_pid(n.container_config("app", &["sleep", "4711"]), own, ""),
        )
        .await;
    let debugger = n
        .run(
            &sb,
            &sb_cfg,
            with_pid(
                n.container_config("debugger", &["sleep", "4712"]),
                pb::NamespaceMode::Target,
                &app,
            ),
        )
        .await;
    let ps = |id: String| {
        let n = &n;
        async move { stdout(&n.exec(&id, &["ps", "-o", "args"], 10).await.expect("ps")) }
    };
    let seen = ps(debugger.clone()).await;
    assert!(
        seen.contains("sleep 4711") && seen.contains("sleep 4712"),
        "the debugger does not share app's processes:\n{seen}"
    );
    // The namespace is shared both ways; a container of its own sees neither.
    assert!(ps(app.clone()).await.contains("sleep 4712"));
    let alone = n
        .run(
            &sb,
            &sb_cfg,
            with_pid(n.container_config("alone", &["sleep", "4713"]), own, ""),
        )
        .await;
    let seen = ps(alone).await;
    assert!(!seen.contains("sleep 4711"), "{seen}");

    // Refusals: no such container, a container of another sandbox, one not running.
    let refused = |target: String, name: &'static str| {
        let (n, sb, sb_cfg) = (&n, &sb, &sb_cfg);
        async move {
            let cfg = with_pid(
                n.container_config(name, &["true"]),
                pb::NamespaceMode::Target,
                &target,
            );
            n.create(sb, sb_cfg, cfg).await.unwrap_err()
        }
    };
    let e = refused("nope".into(), "bad1").await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("does not exist"), "{}", e.message());
    let other_cfg = n.sandbox_config("pid-target-other");
    let other = n.run_sandbox(&other_cfg).await;
    let elsewhere = n
        .run(
            &other,
            &other_cfg,
            with_pid(n.container_config("elsewhere", &["sleep", "4714"]), own, ""),
        )
        .await;
    let e = refused(elsewhere, "bad2").await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("belongs to sandbox"),
        "{}",
        e.message()
    );
    let done = n
        .run(
            &sb,
            &sb_cfg,
            with_pid(n.container_config("done", &["true"]), own, ""),
        )
        .await;
    n.wait_state(&done, pb::ContainerState::ContainerExited)
        .await;
    let e = refused(done, "bad3").await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("not running"), "{}", e.message());
    // A refused name is free again.
    let ok = n
        .create(
            &sb,
            &sb_cfg,
            with_pid(
                n.container_config("bad1", &["true"]),
                pb::NamespaceMode::Target,
                &app,
            ),
        )
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    n.stop_and_remove_sandbox(&other).await;
    n.stop_and_remove_sandbox(&sb).await;
}
