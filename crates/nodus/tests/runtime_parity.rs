//! The same CRI RuntimeService requests sent to `nodus runtime` and to a real containerd,
//! each a test node in its own network namespace with the same CNI network: the answers a
//! kubelet acts on (states, exit codes, reasons, exec output, error codes) must agree.

mod common;

use common::*;
use cri::runtime::v1 as pb;
use nodus_crictl::Clients;

use std::time::Duration;
use testkit::{CgroupParent, Netns};

struct Side {
    name: &'static str,
    c: Clients,
    cgroup: CgroupParent,
    logs: tempfile::TempDir,
    _keep: Vec<Box<dyn std::any::Any>>,
}

async fn nodus_side() -> Side {
    let TestNode {
        node:
            BareNode {
                rt,
                cgroup,
                logs,
                dir,
                netns,
            },
        c,
    } = TestNode::new("10.97.0.0/24").await;
    Side {
        name: "nodus",
        c,
        cgroup,
        logs,
        _keep: vec![Box::new(rt), Box::new(dir), Box::new(netns)],
    }
}

async fn containerd_side() -> Side {
    let netns = Netns::new("parity-c").unwrap();
    let base = tempfile::tempdir().unwrap();
    let ctrd = common::node::start_containerd(&netns, base.path(), "10.96.0.0/24");
    let c = connect(&ctrd.endpoint()).await;
    Side {
        name: "containerd",
        c,
        cgroup: CgroupParent::new("parity-ctrd"),
        logs: tempfile::tempdir().unwrap(),
        _keep: vec![Box::new(ctrd), Box::new(base), Box::new(netns)],
    }
}

fn sandbox_config(s: &Side, name: &str) -> pb::PodSandboxConfig {
    common::node::pod_config(name, "parity", s.logs.path(), s.cgroup.path())
}

/// What the kubelet acts on, from one side, for one scenario.
#[derive(Debug, PartialEq)]
struct Observed {
    short_exit: (i32, String),
    ok_exit: (i32, String),
    oom: (i32, String),
    exec: (String, i32),
    exec_fail: i32,
    missing_image: tonic::Code,
    duplicate_container: tonic::Code,
    unknown_container_status: tonic::Code,
    stop_absent: tonic::Code,
    remove_absent: tonic::Code,
    sandbox_ready: bool,
    has_ip: bool,
}

async fn wait_exited(c: &Clients, id: &str) -> pb::ContainerStatus {
    for _ in 0..300 {
        let s = c
            .runtime
            .clone()
            .container_status(pb::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        if s.state == pb::ContainerState::ContainerExited as i32 {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} did not exit");
}

fn code<T>(r: Result<T, tonic::Status>) -> tonic::Code {
    match r {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

async fn scenario(s: &Side) -> Observed {
    let mut r = s.c.runtime.clone();
    let sb_cfg = sandbox_config(s, "p");
    let sb = r
        .run_pod_sandbox(pb::RunPodSandboxRequest {
            config: Some(sb_cfg.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_or_else(|e| panic!("{}: RunPodSandbox: {e:?}", s.name))
        .into_inner()
        .pod_sandbox_id;
    let st = r
        .pod_sandbox_status(pb::PodSandboxStatusRequest {
            pod_sandbox_id: sb.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    let create = |cfg: pb::ContainerConfig| {
        let mut r = s.c.runtime.clone();
        let (sb, sb_cfg) = (sb.clone(), sb_cfg.clone());
        async move {
            r.create_container(pb::CreateContainerRequest {
                pod_sandbox_id: sb,
                config: Some(cfg),
                sandbox_config: Some(sb_cfg),
            })
            .await
            .map(|x| x.into_inner().container_id)
        }
    };
    let run = |cfg: pb::ContainerConfig| {
        let create = &create;
        let mut r = s.c.runtime.clone();
        async move {
            let id = create(cfg).await.unwrap();
            r.start_container(pb::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .unwrap();
            id
        }
    };
    let short = run(container_config("short", &["sh", "-c", "exit 3"])).await;
    let ok = run(container_config("ok", &["true"])).await;
    let mut hog = container_config(
        "hog",
        &["sh", "-c", "x=$(head -c 67108864 /dev/zero | tr '\\0' a)"],
    );
    hog.linux = Some(pb::LinuxContainerConfig {
        resources: Some(pb::LinuxContainerResources {
            memory_limit_in_bytes: 16 << 20,
            ..Default::default()
        }),
        ..Default::default()
    });
    let hog = run(hog).await;
    let long = run(container_config("long", &["sleep", "3600"])).await;
    let (a, b, o) = (
        wait_exited(&s.c, &short).await,
        wait_exited(&s.c, &ok).await,
        wait_exited(&s.c, &hog).await,
    );
    let e = r
        .exec_sync(pb::ExecSyncRequest {
            container_id: long.clone(),
            cmd: vec!["cat".into(), "/etc/hostname".into()],
            timeout: 10,
        })
        .await
        .unwrap()
        .into_inner();
    let ef = r
        .exec_sync(pb::ExecSyncRequest {
            container_id: long.clone(),
            cmd: vec!["sh".into(), "-c".into(), "exit 4".into()],
            timeout: 10,
        })
        .await
        .unwrap()
        .into_inner();
    let mut missing = container_config("m", &["true"]);
    missing.image = spec("docker.io/library/absent:1");
    let observed = Observed {
        short_exit: (a.exit_code, a.reason),
        ok_exit: (b.exit_code, b.reason),
        oom: (o.exit_code, o.reason),
        exec: (
            String::from_utf8_lossy(&e.stdout).trim().to_string(),
            e.exit_code,
        ),
        exec_fail: ef.exit_code,
        missing_image: code(create(missing).await),
        duplicate_container: code(create(container_config("long", &["true"])).await),
        unknown_container_status: code(
            r.container_status(pb::ContainerStatusRequest {
                container_id: "0123456789abcdef".into(),
                verbose: false,
            })
            .await,
        ),
        stop_absent: code(
            r.stop_container(pb::StopContainerRequest {
                container_id: "0123456789abcdef".into(),
                timeout: 0,
            })
            .await,
        ),
        remove_absent: code(
            r.remove_container(pb::RemoveContainerRequest {
                container_id: "0123456789abcdef".into(),
            })
            .await,
        ),
        sandbox_ready: st.state == pb::PodSandboxState::SandboxReady as i32,
        has_ip: st.network.is_some_and(|n| !n.ip.is_empty()),
    };
    r.stop_pod_sandbox(pb::StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    })
    .await
    .unwrap();
    r.remove_pod_sandbox(pb::RemovePodSandboxRequest { pod_sandbox_id: sb })
        .await
        .unwrap();
    observed
}

#[tokio::test(flavor = "multi_thread")]
async fn runtime_answers_match_containerd() {
    if !have_root() {
        return;
    }
    let n = nodus_side().await;
    let c = containerd_side().await;
    let (on, oc) = (scenario(&n).await, scenario(&c).await);
    eprintln!("nodus:      {on:?}\ncontainerd: {oc:?}");
    assert_eq!(on.short_exit, (3, "Error".to_string()));
    assert_eq!(on.ok_exit, (0, "Completed".to_string()));
    assert_eq!(on.oom, (137, "OOMKilled".to_string()));
    assert_eq!(on.exec, ("p".to_string(), 0));
    // Two answers follow the current CRI contract where containerd 1.6 predates it:
    // a duplicate name is AlreadyExists (1.6: Unknown) and stopping an absent container
    // succeeds (1.6: NotFound).
    assert_eq!(on.duplicate_container, tonic::Code::AlreadyExists);
    assert!(matches!(
        oc.duplicate_container,
        tonic::Code::AlreadyExists | tonic::Code::Unknown
    ));
    assert_eq!(on.stop_absent, tonic::Code::Ok);
    assert!(matches!(
        oc.stop_absent,
        tonic::Code::Ok | tonic::Code::NotFound
    ));
    let oc = Observed {
        duplicate_container: on.duplicate_container,
        stop_absent: on.stop_absent,
        ..oc
    };
    assert_eq!(on, oc, "nodus and containerd disagree");
}
