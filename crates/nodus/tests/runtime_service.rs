//! The CRI RuntimeService of `nodus runtime` with real containers: each test is a node in
//! its own network namespace and cgroup parent, with runc, the CNI plugins and busybox
//! images imported from an OCI archive (no registry inside the namespace).

mod common;

use common::*;
use cri::runtime::v1 as pb;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SUBNET: &str = "10.99.0.0/24";
const GATEWAY: &str = "10.99.0.1";

async fn node() -> TestNode {
    TestNode::new(SUBNET).await
}

/// Mount points pods left under the runtime's `dir` (must be none after cleanup).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    testkit::leftovers::pod_mounts_under(dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_and_container_lifecycle_with_logs_exec_and_events() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let mut events =
        n.c.runtime
            .clone()
            .get_container_events(pb::GetEventsRequest {})
            .await
            .expect("GetContainerEvents")
            .into_inner();
    let sb_cfg = n.sandbox_config("web");
    let sb = n.run_sandbox(&sb_cfg).await;
    let st = n.sandbox_status(&sb).await;
    assert_eq!(st.state, pb::PodSandboxState::SandboxReady as i32);
    let ip = st
        .network
        .as_ref()
        .map(|n| n.ip.clone())
        .unwrap_or_default();
    assert!(
        ip.starts_with("10.99.0."),
        "pod IP from the bridge network: {ip:?}"
    );

    let id = n
        .create(
            &sb,
            &sb_cfg,
            n.container_config(
                "main",
                &[
                    "sh",
                    "-c",
                    "trap '' TERM; echo hello; echo oops >&2; hostname; while :; do sleep 1; done",
                ],
            ),
        )
        .await
        .expect("CreateContainer");
    assert_eq!(
        n.status(&id).await.state,
        pb::ContainerState::ContainerCreated as i32
    );
    n.start(&id).await;
    let s = n.status(&id).await;
    assert_eq!(s.state, pb::ContainerState::ContainerRunning as i32);
    assert!(s.started_at >= s.created_at && s.created_at > 0);

    // CRI log format: <RFC3339Nano> <stream> <F|P> <line>.
    let mut log = String::new();
    for _ in 0..100 {
        log = n.log("web", "main");
        if log.lines().count() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines: Vec<Vec<&str>> = log.lines().map(|l| l.splitn(4, ' ').collect()).collect();
    assert!(
        lines.iter().any(|l| l[1..] == ["stdout", "F", "hello"]),
        "{log}"
    );
    assert!(
        lines.iter().any(|l| l[1..] == ["stderr", "F", "oops"]),
        "{log}"
    );
    assert!(
        lines.iter().any(|l| l[1..] == ["stdout", "F", "web"]),
        "hostname is the pod's: {log}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l[0].ends_with('Z') && l[0].contains('T')),
        "{log}"
    );

    // ExecSync: output, exit codes, timeout.
    let r = n.exec(&id, &["cat", "/etc/hostname"], 10).await.unwrap();
    assert_eq!(
        (String::from_utf8_lossy(&r.stdout).trim(), r.exit_code),
        ("web", 0)
    );
    let r = n
        .exec(&id, &["sh", "-c", "echo e >&2; exit 7"], 10)
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.stderr.as_slice()), (7, &b"e\n"[..]));
    let t = n.exec(&id, &["sleep", "30"], 1).await.unwrap_err();
    assert_eq!(t.code(), tonic::Code::DeadlineExceeded, "{t:?}");
    let ps = n.exec(&id, &["ps"], 10).await.unwrap();
    assert!(
        !String::from_utf8_lossy(&ps.stdout).contains("sleep 30"),
        "timed-out exec was killed"
    );

    // A container that exits on its own: exit code, reason, times.
    let short = n
        .create(
            &sb,
            &sb_cfg,
            n.container_config("short", &["sh", "-c", "exit 3"]),
        )
        .await
        .unwrap();
    n.start(&short).await;
    let s = n
        .wait_state(&short, pb::ContainerState::ContainerExited)
        .await;
    assert_eq!((s.exit_code, s.reason.as_str()), (3, "Error"));
    assert!(s.finished_at >= s.started_at);

    // StopContainer: the shell ignores SIGTERM, so the grace period ends in SIGKILL.
    n.c.runtime
        .clone()
        .stop_container(pb::StopContainerRequest {
            container_id: id.clone(),
            timeout: 1,
        })
        .await
        .unwrap();
    let s = n.status(&id).await;
    assert_eq!(s.state, pb::ContainerState::ContainerExited as i32);
    assert_eq!(s.exit_code, 137);

    // Listing and filters.
    let all =
        n.c.runtime
            .clone()
            .list_containers(pb::ListContainersRequest { filter: None })
            .await
            .unwrap()
            .into_inner()
            .containers;
    assert_eq!(all.len(), 2);
    let pods =
        n.c.runtime
            .clone()
            .list_pod_sandbox(pb::ListPodSandboxRequest {
                filter: Some(pb::PodSandboxFilter {
                    label_selector: HashMap::from([("app".into(), "web".into())]),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .items;
    assert_eq!(pods.len(), 1);

    // Remove: idempotent; the sandbox's removal takes everything with it.
    n.c.runtime
        .clone()
        .remove_container(pb::RemoveContainerRequest {
            container_id: short.clone(),
        })
        .await
        .unwrap();
    n.c.runtime
        .clone()
        .remove_container(pb::RemoveContainerRequest {
            container_id: short.clone(),
        })
        .await
        .expect("removing an absent container succeeds");
    n.stop_and_remove_sandbox(&sb).await;
    n.stop_and_remove_sandbox(&sb).await;
    assert!(
        mounts_under(n.rt.dir.path()).is_empty(),
        "{:?}",
        mounts_under(n.rt.dir.path())
    );

    // Events: created → started → stopped → deleted for the short container.
    let mut seen = Vec::new();
    while let Ok(Some(Ok(ev))) = tokio::time::timeout(
        Duration::from_millis(200),
        futures::StreamExt::next(&mut events),
    )
    .await
    {
        if ev.container_id == short {
            seen.push(ev.container_event_type);
        }
    }
    use pb::ContainerEventType::*;
    assert_eq!(
        seen,
        vec![
            ContainerCreatedEvent as i32,
            ContainerStartedEvent as i32,
            ContainerStoppedEvent as i32,
            ContainerDeletedEvent as i32
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn oom_kill_pod_to_pod_traffic_and_host_ports() {
    if !have_root() {
        return;
    }
    let n = node().await;
    // Pod A serves HTTP on 8080, published on hostPort 18080.
    let mut a_cfg = n.sandbox_config("a");
    a_cfg.port_mappings = vec![pb::PortMapping {
        protocol: pb::Protocol::Tcp as i32,
        container_port: 8080,
        host_port: 18080,
        host_ip: String::new(),
    }];
    let a = n.run_sandbox(&a_cfg).await;
    let a_ip = n.sandbox_status(&a).await.network.unwrap().ip;
    let web = n
        .create(
            &a,
            &a_cfg,
            n.container_config(
                "web",
                &["sh", "-c", "mkdir -p /www && echo hi-from-a > /www/index.html && exec httpd -f -p 8080 -h /www"],
            ),
        )
        .await
        .unwrap();
    n.start(&web).await;

    let b_cfg = n.sandbox_config("b");
    let b = n.run_sandbox(&b_cfg).await;
    let client = n
        .create(&b, &b_cfg, n.container_config("client", &["sleep", "3600"]))
        .await
        .unwrap();
    n.start(&client).await;

    // busybox-static's wget crashes without NSS libraries in the image; nc does not.
    let fetch = format!("printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc {a_ip} 8080");
    let mut body = String::new();
    for _ in 0..50 {
        let r = n.exec(&client, &["sh", "-c", &fetch], 10).await.unwrap();
        body = String::from_utf8_lossy(&r.stdout).into_owned();
        if body.contains("hi-from-a") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        body.contains("hi-from-a"),
        "pod B reaches pod A across the bridge: {body:?}"
    );

    // hostPort: from the node (the test netns) to the node's own address.
    let out = n
        .netns
        .run(
            "sh",
            &[
                "-c",
                &format!(
                    "printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | busybox nc {GATEWAY} 18080"
                ),
            ],
        )
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        body.contains("hi-from-a"),
        "hostPort 18080 → pod A:8080: {body:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // OOM kill: a 16 MiB limit and a shell that wants 64 MiB.
    let hog = common::node::memory_hog("hog", 16 << 20);
    let hog = n.create(&b, &b_cfg, hog).await.unwrap();
    n.start(&hog).await;
    let s = n
        .wait_state(&hog, pb::ContainerState::ContainerExited)
        .await;
    assert_eq!(s.reason, "OOMKilled", "{s:?}");
    assert_eq!(s.exit_code, 137);

    n.stop_and_remove_sandbox(&a).await;
    n.stop_and_remove_sandbox(&b).await;
    // No IP allocations left behind by host-local.
    let leftover: Vec<_> = std::fs::read_dir(n.rt.dir.path().parent().unwrap())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("10.99."))
        .collect();
    assert!(leftover.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn containers_survive_a_daemon_restart_and_exits_meanwhile_are_recorded() {
    if !have_root() {
        return;
    }
    let mut n = node().await;
    let sb_cfg = n.sandbox_config("survivor");
    let sb = n.run_sandbox(&sb_cfg).await;
    let long = n
        .create(&sb, &sb_cfg, n.container_config("long", &["sleep", "3600"]))
        .await
        .unwrap();
    n.start(&long).await;
    let soon = n
        .create(
            &sb,
            &sb_cfg,
            n.container_config("soon", &["sh", "-c", "sleep 2; exit 5"]),
        )
        .await
        .unwrap();
    n.start(&soon).await;
    // Created, not started: no process exists until StartContainer, across a restart too.
    let later = n
        .create(
            &sb,
            &sb_cfg,
            n.container_config("later", &["sleep", "3600"]),
        )
        .await
        .unwrap();

    n.rt.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    n.rt.start_again();
    n.c = n.rt.clients().await;

    assert_eq!(
        n.status(&later).await.state,
        pb::ContainerState::ContainerCreated as i32
    );
    n.start(&later).await;
    let r = n.exec(&later, &["echo", "started"], 10).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "started");

    let s = n.status(&long).await;
    assert_eq!(
        s.state,
        pb::ContainerState::ContainerRunning as i32,
        "still running: {s:?}"
    );
    let r = n.exec(&long, &["echo", "alive"], 10).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "alive");
    let s = n
        .wait_state(&soon, pb::ContainerState::ContainerExited)
        .await;
    assert_eq!(
        s.exit_code, 5,
        "the exit that happened while the daemon was down"
    );
    assert_eq!(
        n.sandbox_status(&sb).await.state,
        pb::PodSandboxState::SandboxReady as i32
    );
    n.stop_and_remove_sandbox(&sb).await;
    assert!(mounts_under(n.rt.dir.path()).is_empty());
}

/// A host reboot, as the runtime sees it: every process and mount of its pods gone while
/// its records stay. The sandbox turns NotReady (so the kubelet makes a new one rather than
/// starting containers into namespaces that no longer exist), its containers Exited, and
/// both can be stopped and removed.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_reboot_a_sandbox_without_its_namespaces_is_not_ready() {
    if !have_root() {
        return;
    }
    let mut n = node().await;
    let sb_cfg = n.sandbox_config("rebooted");
    let sb = n.run_sandbox(&sb_cfg).await;
    let c = n
        .create(&sb, &sb_cfg, n.container_config("app", &["sleep", "3600"]))
        .await
        .unwrap();
    n.start(&c).await;
    n.rt.kill();
    common::kill_runtime_leftovers(&n.rt.dir.path().join("state"), n.rt.dir.path());
    n.rt.start_again();
    n.c = n.rt.clients().await;
    assert_eq!(
        n.sandbox_status(&sb).await.state,
        pb::PodSandboxState::SandboxNotready as i32
    );
    let s = n.wait_state(&c, pb::ContainerState::ContainerExited).await;
    assert_ne!(s.exit_code, 0, "{s:?}");
    n.stop_and_remove_sandbox(&sb).await;
    assert!(mounts_under(n.rt.dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_clear_errors_and_leave_nothing_behind() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let mut r = n.c.runtime.clone();
    // Missing metadata.
    let e = r
        .run_pod_sandbox(pb::RunPodSandboxRequest {
            config: Some(pb::PodSandboxConfig::default()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // Unknown handler.
    let e = r
        .run_pod_sandbox(pb::RunPodSandboxRequest {
            config: Some(n.sandbox_config("x")),
            runtime_handler: "kata".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("kata"), "{e:?}");

    let sb_cfg = n.sandbox_config("ok");
    let sb = n.run_sandbox(&sb_cfg).await;
    // Duplicate sandbox name.
    let e = r
        .run_pod_sandbox(pb::RunPodSandboxRequest {
            config: Some(sb_cfg.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    // Image not present.
    let mut cfg = n.container_config("c", &["true"]);
    cfg.image = spec("docker.io/library/absent:1");
    let e = n.create(&sb, &sb_cfg, cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    // Duplicate container name.
    let id = n
        .create(&sb, &sb_cfg, n.container_config("c", &["sleep", "60"]))
        .await
        .unwrap();
    let e = n
        .create(&sb, &sb_cfg, n.container_config("c", &["sleep", "60"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    // A binary that does not exist: as in containerd, the create only prepares the bundle
    // and the start fails with runc's own message; the container is then exited with
    // reason StartError, and removing it leaves nothing behind.
    let before = std::fs::read_dir(n.rt.dir.path().join("state/containers"))
        .unwrap()
        .count();
    let bad = n
        .create(
            &sb,
            &sb_cfg,
            n.container_config("bad", &["/no/such/binary"]),
        )
        .await
        .expect("create prepares the bundle");
    let e = r
        .start_container(pb::StartContainerRequest {
            container_id: bad.clone(),
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("/no/such/binary"), "{e:?}");
    let st = n.status(&bad).await;
    assert_eq!(st.state, pb::ContainerState::ContainerExited as i32);
    assert_eq!((st.reason.as_str(), st.exit_code), ("StartError", 128));
    assert!(st.message.contains("/no/such/binary"), "{st:?}");
    r.remove_container(pb::RemoveContainerRequest {
        container_id: bad.clone(),
    })
    .await
    .expect("remove");
    let after = std::fs::read_dir(n.rt.dir.path().join("state/containers"))
        .unwrap()
        .count();
    assert_eq!(before, after, "nothing left of the failed container");
    // Unknown sandbox / container ids.
    let e = n
        .create("nope", &sb_cfg, n.container_config("z", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    r.stop_container(pb::StopContainerRequest {
        container_id: "nope".into(),
        timeout: 0,
    })
    .await
    .expect("stopping an absent container succeeds");
    let _ = id;
    n.stop_and_remove_sandbox(&sb).await;
    assert!(mounts_under(n.rt.dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_resource_updates_and_log_rotation() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = n.sandbox_config("busy");
    let sb = n.run_sandbox(&sb_cfg).await;
    let id = n
        .create(
            &sb,
            &sb_cfg,
            n.container_config(
                "ticker",
                &["sh", "-c", "while :; do echo tick; i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; sleep 0.1; done"],
            ),
        )
        .await
        .unwrap();
    n.start(&id).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut r = n.c.runtime.clone();
    let st = r
        .container_stats(pb::ContainerStatsRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    let cpu = st.cpu.unwrap().usage_core_nano_seconds.unwrap().value;
    let ws = st.memory.unwrap().working_set_bytes.unwrap().value;
    assert!(cpu > 0 && ws > 0, "cpu {cpu} ns, working set {ws} bytes");
    assert!(st.writable_layer.unwrap().inodes_used.is_some());

    // Pod stats: the pod's eth0 counters from inside its network namespace.
    let _ = n
        .exec(&id, &["ping", "-c", "1", "-W", "1", GATEWAY], 5)
        .await;
    let ps = r
        .pod_sandbox_stats(pb::PodSandboxStatsRequest {
            pod_sandbox_id: sb.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    let linux = ps.linux.unwrap();
    let eth0 = linux
        .network
        .unwrap()
        .default_interface
        .expect("eth0 counters");
    assert!(eth0.tx_bytes.unwrap().value > 0);
    assert_eq!(linux.containers.len(), 1);
    let listed = r
        .list_container_stats(pb::ListContainerStatsRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .stats;
    assert_eq!(listed.len(), 1);

    // UpdateContainerResources reaches the container's cgroup.
    r.update_container_resources(pb::UpdateContainerResourcesRequest {
        container_id: id.clone(),
        linux: Some(pb::LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            cpu_shares: 256,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let h = nodus_cgroups_dir(&format!("{}/{id}", n.cgroup.path()));
    let limit = std::fs::read_to_string(h.join("memory.limit_in_bytes"))
        .or_else(|_| std::fs::read_to_string(h.join("memory.max")))
        .unwrap();
    assert_eq!(limit.trim(), (64u64 << 20).to_string());

    // Log rotation: rename, reopen, new lines land in a fresh file.
    let log = n.logs.path().join("busy").join("ticker.log");
    let rotated = log.with_extension("log.1");
    std::fs::rename(&log, &rotated).unwrap();
    r.reopen_container_log(pb::ReopenContainerLogRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    let mut fresh = String::new();
    for _ in 0..50 {
        fresh = std::fs::read_to_string(&log).unwrap_or_default();
        if fresh.contains("tick") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(fresh.contains("stdout F tick"), "{fresh:?}");
    assert!(std::fs::read_to_string(&rotated).unwrap().contains("tick"));
    n.stop_and_remove_sandbox(&sb).await;
}

/// The memory cgroup directory of a cgroup path, v1 or v2.
fn nodus_cgroups_dir(path: &str) -> PathBuf {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        root.join(path.trim_start_matches('/'))
    } else {
        root.join("memory").join(path.trim_start_matches('/'))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn security_context_mounts_and_image_volumes() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = n.sandbox_config("sec");
    let sb = n.run_sandbox(&sb_cfg).await;
    let host_dir = tempfile::tempdir().unwrap();
    std::fs::write(host_dir.path().join("data.txt"), "from-the-host\n").unwrap();
    std::fs::create_dir(host_dir.path().join("sub")).unwrap();
    let mut cfg = n.container_config("sec", &["sleep", "3600"]);
    cfg.mounts = vec![
        pb::Mount {
            container_path: "/host".into(),
            host_path: host_dir.path().display().to_string(),
            readonly: true,
            recursive_read_only: true,
            ..Default::default()
        },
        busybox_image_volume("/img"),
    ];
    cfg.linux = Some(pb::LinuxContainerConfig {
        security_context: Some(pb::LinuxContainerSecurityContext {
            run_as_user: Some(pb::Int64Value { value: 1000 }),
            supplemental_groups: vec![100],
            readonly_rootfs: true,
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = n.create(&sb, &sb_cfg, cfg).await.expect("create");
    n.start(&id).await;
    let out = |r: pb::ExecSyncResponse| {
        (
            String::from_utf8_lossy(&r.stdout).trim().to_string(),
            r.exit_code,
        )
    };
    let (ids, _) = out(sh(&n, &id, "id -u; id -G").await);
    let ids: Vec<&str> = ids.lines().collect();
    assert_eq!(ids[0], "1000", "runs as uid 1000");
    assert!(
        ids[1].split_whitespace().any(|g| g == "100"),
        "supplemental group 100: {ids:?}"
    );
    assert!(
        ids[1].split_whitespace().any(|g| g == "1000"),
        "primary group from /etc/passwd: {ids:?}"
    );
    assert_eq!(
        out(sh(&n, &id, "cat /host/data.txt").await).0,
        "from-the-host"
    );
    assert_ne!(
        sh(&n, &id, "touch /host/new").await.exit_code,
        0,
        "read-only hostPath"
    );
    assert_ne!(
        sh(&n, &id, "touch /rootfs-file").await.exit_code,
        0,
        "read-only rootfs"
    );
    assert_eq!(
        out(sh(&n, &id, "test -x /img/bin/busybox && echo yes").await).0,
        "yes",
        "image volume"
    );
    assert_ne!(
        sh(&n, &id, "touch /img/x").await.exit_code,
        0,
        "image volumes are read-only"
    );
    n.stop_and_remove_sandbox(&sb).await;
    assert!(mounts_under(n.rt.dir.path()).is_empty());
}

/// A read-only image volume of the busybox image at `path`.
fn busybox_image_volume(path: &str) -> pb::Mount {
    pb::Mount {
        container_path: path.into(),
        image: spec("busybox"),
        readonly: true,
        ..Default::default()
    }
}

/// Containers `sleep 3600` named `names` in the sandbox, created and started.
async fn sleepers(
    n: &TestNode,
    sb: &str,
    cfg: &pb::PodSandboxConfig,
    names: &[&str],
) -> Vec<String> {
    let mut ids = Vec::new();
    for name in names {
        let id = n
            .create(sb, cfg, n.container_config(name, &["sleep", "3600"]))
            .await
            .expect("create");
        n.start(&id).await;
        ids.push(id);
    }
    ids
}

async fn sh(n: &TestNode, id: &str, cmd: &str) -> pb::ExecSyncResponse {
    n.exec(id, &["sh", "-c", cmd], 10).await.expect("ExecSync")
}

/// A pod with its own user namespace (CRI userns mode POD, Kubernetes' `hostUsers: false`):
/// root in the pod is an unprivileged host uid, yet sees its image, its rootfs and its
/// volumes as its own through idmapped mounts.
#[tokio::test(flavor = "multi_thread")]
async fn user_namespaces_map_ids_of_processes_layers_and_volumes() {
    if !have_root() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    const HOST_ID: u32 = 0x7000_0000;
    let mut n = node().await;
    let userns = pb::UserNamespace {
        mode: pb::NamespaceMode::Pod as i32,
        uids: vec![pb::IdMapping {
            host_id: HOST_ID,
            container_id: 0,
            length: 65536,
        }],
        gids: vec![pb::IdMapping {
            host_id: HOST_ID,
            container_id: 0,
            length: 65536,
        }],
    };
    let namespaces = |userns: &pb::UserNamespace, pid: pb::NamespaceMode, net| {
        Some(pb::NamespaceOption {
            network: net as i32,
            pid: pid as i32,
            ipc: pb::NamespaceMode::Pod as i32,
            userns_options: Some(userns.clone()),
            ..Default::default()
        })
    };
    let mut sb_cfg = n.sandbox_config("userns");
    if let Some(l) = sb_cfg.linux.as_mut() {
        l.security_context = Some(pb::LinuxSandboxSecurityContext {
            namespace_options: namespaces(&userns, pb::NamespaceMode::Pod, pb::NamespaceMode::Pod),
            ..Default::default()
        });
    }

    // Bad requests first: each is refused and leaves nothing behind.
    let refused = |mut cfg: pb::PodSandboxConfig, what: &'static str| {
        let rt = n.c.runtime.clone();
        async move {
            cfg.metadata.as_mut().unwrap().uid = format!("bad-{what}");
            let err = rt
                .clone()
                .run_pod_sandbox(pb::RunPodSandboxRequest {
                    config: Some(cfg),
                    runtime_handler: String::new(),
                })
                .await
                .unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{what}: {err:?}");
            err.message().to_string()
        }
    };
    let mut no_maps = sb_cfg.clone();
    fn opts(c: &mut pb::PodSandboxConfig) -> &mut pb::NamespaceOption {
        c.linux
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
            .namespace_options
            .as_mut()
            .unwrap()
    }
    opts(&mut no_maps)
        .userns_options
        .as_mut()
        .unwrap()
        .gids
        .clear();
    assert!(
        refused(no_maps, "no-gids")
            .await
            .contains("mode POD needs both uid and gid mappings")
    );
    let mut host_net = sb_cfg.clone();
    opts(&mut host_net).network = pb::NamespaceMode::Node as i32;
    assert!(
        refused(host_net, "host-net")
            .await
            .contains("cannot use the host's network namespace")
    );
    let sandboxes_dir = n.rt.dir.path().join("state/sandboxes");
    let left: Vec<_> = std::fs::read_dir(&sandboxes_dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "refused sandboxes left {left:?}");

    let sb = n.run_sandbox(&sb_cfg).await;
    // A volume owned by the host's root, as the kubelet makes them.
    let vol = tempfile::tempdir().unwrap();
    std::fs::write(vol.path().join("data.txt"), "from-the-host\n").unwrap();
    let mut cfg = n.container_config("main", &["sleep", "3600"]);
    cfg.mounts = vec![
        pb::Mount {
            container_path: "/vol".into(),
            host_path: vol.path().display().to_string(),
            ..Default::default()
        },
        busybox_image_volume("/img"),
    ];
    let container_linux = |userns: &pb::UserNamespace| {
        Some(pb::LinuxContainerConfig {
            security_context: Some(pb::LinuxContainerSecurityContext {
                namespace_options: namespaces(
                    userns,
                    pb::NamespaceMode::Pod,
                    pb::NamespaceMode::Pod,
                ),
                ..Default::default()
            }),
            ..Default::default()
        })
    };
    cfg.linux = container_linux(&userns);
    let id = n.create(&sb, &sb_cfg, cfg.clone()).await.expect("create");
    n.start(&id).await;
    let out = |r: pb::ExecSyncResponse| {
        assert_eq!(
            r.exit_code,
            0,
            "{}",
            String::from_utf8_lossy(&r.stderr).trim()
        );
        String::from_utf8_lossy(&r.stdout).trim().to_string()
    };
    let uid_map = out(sh(&n, &id, "cat /proc/self/uid_map").await);
    assert_eq!(
        uid_map.split_whitespace().collect::<Vec<_>>(),
        ["0", &HOST_ID.to_string(), "65536"]
    );
    assert_eq!(out(sh(&n, &id, "id -u; id -g").await), "0\n0");
    assert_eq!(
        out(sh(
            &n,
            &id,
            "stat -c %u:%g / /bin/busybox /img/bin/busybox /vol/data.txt"
        )
        .await),
        "0:0\n0:0\n0:0\n0:0",
        "the image, the rootfs and the volume show as the pod's root's"
    );
    out(sh(&n, &id, "echo hi > /new && echo made > /vol/made-in-pod").await);
    assert_eq!(out(sh(&n, &id, "hostname").await), "userns");
    // Seen from the host, what the pod's root made in its rootfs belongs to the mapped host
    // uid; in the idmapped volume it keeps the ids the pod sees, as upstream's idmapped
    // volumes do (so pods with different maps can share it).
    let upper_new = std::fs::read_dir(n.rt.root().join("layers"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("upper/new"))
        .find(|p| p.exists())
        .expect("the rootfs's new file in the writable layer");
    let made = std::fs::metadata(&upper_new).unwrap();
    assert_eq!((made.uid(), made.gid()), (HOST_ID, HOST_ID));
    let made = std::fs::metadata(vol.path().join("made-in-pod")).unwrap();
    assert_eq!((made.uid(), made.gid()), (0, 0));
    // Root in the pod is not the host's root: it cannot make device nodes (CAP_MKNOD counts
    // only in the initial user namespace) nor write the host's sysctls.
    assert_ne!(sh(&n, &id, "mknod /m c 1 1").await.exit_code, 0);
    assert_ne!(
        sh(&n, &id, "echo 1 > /proc/sys/kernel/panic")
            .await
            .exit_code,
        0,
        "a host sysctl is not writable from the pod"
    );

    // A container that asks for the node's user namespace in this pod is refused.
    let mut bad = cfg.clone();
    bad.metadata.as_mut().unwrap().name = "bad".into();
    bad.linux = container_linux(&pb::UserNamespace {
        mode: pb::NamespaceMode::Node as i32,
        ..Default::default()
    });
    let err = n.create(&sb, &sb_cfg, bad).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("must use it (mode POD)"), "{err:?}");

    // A restarted daemon finds the pod's user namespace again: a new container joins it.
    n.rt.kill();
    n.rt.start_again();
    n.c = n.rt.clients().await;
    let mut again = cfg.clone();
    again.metadata.as_mut().unwrap().name = "again".into();
    again.mounts.clear();
    let id2 = n
        .create(&sb, &sb_cfg, again)
        .await
        .expect("create after restart");
    n.start(&id2).await;
    let uid_map2 = out(sh(&n, &id2, "cat /proc/self/uid_map").await);
    assert_eq!(uid_map2, uid_map, "the same user namespace");
    assert_eq!(
        out(sh(&n, &id, "id -u").await),
        "0",
        "the first container lives on"
    );

    n.stop_and_remove_sandbox(&sb).await;
    assert!(mounts_under(n.rt.dir.path()).is_empty());
    // Removing the container went through no idmapped mount into the volume.
    assert_eq!(
        std::fs::read_to_string(vol.path().join("data.txt")).unwrap(),
        "from-the-host\n"
    );
    assert!(vol.path().join("made-in-pod").exists());
}

/// A pod's `/dev/shm` and its containers' root filesystems are mounted in a mount
/// namespace of the pod's own, so the node's mount table (which runc reads several times
/// per container it starts) holds only the pod's namespace pins; its containers still see
/// an overlay root and one shm shared between them, and removing the pod leaves no process
/// in that namespace. A privileged pod keeps the node's mount namespace (its Bidirectional
/// mounts must reach the node).
#[tokio::test(flavor = "multi_thread")]
async fn a_pods_mounts_live_in_a_mount_namespace_of_its_own() {
    use std::os::unix::fs::MetadataExt;
    if !have_root() {
        return;
    }
    let n = node().await;
    let sb_cfg = n.sandbox_config("mntns");
    let sb = n.run_sandbox(&sb_cfg).await;
    let ids = sleepers(&n, &sb, &sb_cfg, &["a", "b"]).await;
    let node_mounts = mounts_under(n.rt.dir.path());
    let mut names: Vec<String> = node_mounts
        .iter()
        .map(|m| {
            let parent = m.parent().and_then(Path::file_name);
            let dir = parent.and_then(|p| p.to_str()).unwrap_or_default();
            assert!(
                dir == "ns" || dir == "mntns",
                "only namespace pins in the node's mount table: {node_mounts:?}"
            );
            format!(
                "{dir}/{}",
                if dir == "ns" {
                    m.file_name().unwrap().to_string_lossy()
                } else {
                    "<pod>".into()
                }
            )
        })
        .collect();
    names.sort();
    // The test pods share one PID namespace (pinned too); no shm, no rootfs.
    assert_eq!(
        names,
        ["mntns/<pod>", "ns/ipc", "ns/net", "ns/pid", "ns/uts"],
        "{node_mounts:?}"
    );
    let pin = node_mounts
        .iter()
        .find(|m| {
            m.parent()
                .and_then(Path::file_name)
                .is_some_and(|d| d == "mntns")
        })
        .unwrap();
    let pod_ns = std::fs::metadata(pin).unwrap().ino();

    let out = |r: pb::ExecSyncResponse| String::from_utf8_lossy(&r.stdout).trim().to_string();
    let root_fs = out(sh(&n, &ids[0], "awk '$2 == \"/\" {print $3}' /proc/mounts").await);
    assert_eq!(root_fs, "overlay", "the container's root is its overlay");
    let shm = out(sh(&n, &ids[0], "grep ' /dev/shm ' /proc/mounts").await);
    assert!(shm.starts_with("shm /dev/shm tmpfs "), "{shm}");
    assert!(shm.contains("size=65536k"), "the pod's 64 MiB shm: {shm}");
    assert_eq!(
        sh(&n, &ids[0], "echo shared > /dev/shm/x").await.exit_code,
        0
    );
    assert_eq!(
        out(sh(&n, &ids[1], "cat /dev/shm/x").await),
        "shared",
        "the pod's containers share one /dev/shm"
    );

    // The shims (and the OCI runtime they ran) are in the pod's namespace.
    let in_pod = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::metadata(e.path().join("ns/mnt")).is_ok_and(|m| m.ino() == pod_ns))
            .count()
    };
    assert!(
        in_pod() >= 2,
        "one shim per container in the pod's namespace"
    );
    n.stop_and_remove_sandbox(&sb).await;
    assert!(
        mounts_under(n.rt.dir.path()).is_empty(),
        "{:?}",
        mounts_under(n.rt.dir.path())
    );
    let mut left = in_pod();
    for _ in 0..50 {
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = in_pod();
    }
    assert_eq!(left, 0, "no process is left in the removed pod's namespace");

    let mut priv_cfg = n.sandbox_config("mntns-priv");
    if let Some(l) = priv_cfg.linux.as_mut() {
        l.security_context = Some(pb::LinuxSandboxSecurityContext {
            privileged: true,
            ..Default::default()
        });
    }
    let sb = n.run_sandbox(&priv_cfg).await;
    let id = n
        .create(&sb, &priv_cfg, n.container_config("p", &["sleep", "3600"]))
        .await
        .expect("create");
    n.start(&id).await;
    let node_mounts = mounts_under(n.rt.dir.path());
    assert!(
        node_mounts.iter().any(|m| m.ends_with("bundle/rootfs"))
            && node_mounts.iter().any(|m| m.ends_with("shm"))
            && !node_mounts.iter().any(|m| m
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|d| d == "mntns")),
        "a privileged pod's mounts are the node's: {node_mounts:?}"
    );
    n.stop_and_remove_sandbox(&sb).await;
    assert!(mounts_under(n.rt.dir.path()).is_empty());
}

/// `/proc/<pid>/cmdline` as its NUL-separated arguments.
fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses: state, then the parent's pid.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The daemon's children that are its shims' fork server.
fn fork_servers(daemon: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| parent_of(p) == Some(daemon))
        .filter(|&p| cmdline(p).get(1).is_some_and(|a| a == "shim-fork-server"))
        .collect()
}

/// The shim of container `id`, found as `ps` would show it: `nodus shim --id <id> …`.
fn shim_of(id: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|&p| {
            let c = cmdline(p);
            c.get(1).is_some_and(|a| a == "shim")
                && c.windows(2).any(|w| w[0] == "--id" && w[1] == id)
        })
}

#[tokio::test(flavor = "multi_thread")]
async fn shims_are_forked_by_one_server_that_may_die_without_harm() {
    if !have_root() {
        return;
    }
    let n = node().await;
    let daemon = n.rt.pid().expect("daemon running");
    let sb_cfg = n.sandbox_config("forked");
    let sb = n.run_sandbox(&sb_cfg).await;
    let ids = sleepers(&n, &sb, &sb_cfg, &["a", "b"]).await;
    let servers = fork_servers(daemon);
    assert_eq!(servers.len(), 1, "one fork server for the daemon's shims");
    let server = servers[0];
    for id in &ids {
        let shim = shim_of(id).unwrap_or_else(|| panic!("no process shows `nodus shim --id {id}`"));
        assert_eq!(
            parent_of(shim),
            Some(server),
            "the shim of {id} was forked by the server"
        );
        let c = cmdline(shim);
        assert!(
            c.windows(2).any(|w| w[0] == "--bundle") && c.iter().any(|a| a == "--start"),
            "the shim's command line is that of `nodus shim`: {c:?}"
        );
    }

    // The server dies: the containers and their shims carry on, the next container gets a
    // server anew.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let r = n.exec(&ids[0], &["echo", "alive"], 10).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "alive");
    let c = n
        .create(&sb, &sb_cfg, n.container_config("c", &["sleep", "3600"]))
        .await
        .expect("create");
    n.start(&c).await;
    let r = n.exec(&c, &["echo", "started"], 10).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "started");
    let again = fork_servers(daemon);
    assert!(
        again.len() == 1 && again[0] != server,
        "a new fork server replaced the dead one: {again:?} (was {server})"
    );
    assert_eq!(
        parent_of(shim_of(&c).expect("the new shim")),
        Some(again[0])
    );
    for id in &ids {
        let shim = shim_of(id).expect("the first shims outlive their server");
        assert_ne!(
            parent_of(shim),
            Some(daemon),
            "re-parented away from the daemon"
        );
        assert_eq!(
            n.status(id).await.state,
            pb::ContainerState::ContainerRunning as i32
        );
    }
    // Their exits are still seen and recorded.
    n.c.runtime
        .clone()
        .stop_container(pb::StopContainerRequest {
            container_id: ids[1].clone(),
            timeout: 1,
        })
        .await
        .expect("stop");
    let s = n
        .wait_state(&ids[1], pb::ContainerState::ContainerExited)
        .await;
    // SIGTERM (143), or SIGKILL after the grace period (137) where sleep is a pid 1.
    assert!(
        [137, 143].contains(&s.exit_code),
        "the exit the shim saw is recorded: {s:?}"
    );
    n.stop_and_remove_sandbox(&sb).await;
    assert!(mounts_under(n.rt.dir.path()).is_empty());
}
