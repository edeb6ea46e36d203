//! The runtime's OCI runtime handlers (a RuntimeClass's `handler`) through the CRI, as the
//! upstream validation suite exercises a handler: the pod lifecycle, container logs, exec
//! and an OOM kill, each container checked to be run by the handler named (its state is in
//! that OCI runtime's own root).
//!
//! `runc` runs everywhere; `crun` refuses cgroup v1 and hybrid hosts ("cgroups in hybrid
//! mode not supported"), so its test runs on pure cgroup v2 hosts: the VM lane's guest.

mod common;

use common::*;
use cri::runtime::v1 as pb;
use std::path::Path;

const SUBNET: &str = "10.97.8.0/24";

fn pure_cgroup_v2() -> bool {
    nix::sys::statfs::statfs("/sys/fs/cgroup")
        .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
        .unwrap_or(false)
}

/// `<handler> --root <root> state <id>`: the OCI runtime's own view of the container.
fn oci_state(handler: &str, root: &Path, id: &str) -> serde_json::Value {
    let out = std::process::Command::new(handler)
        .arg("--root")
        .arg(root)
        .args(["state", id])
        .output()
        .unwrap_or_else(|e| panic!("{handler}: {e}"));
    assert!(
        out.status.success(),
        "{handler} state {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("state JSON")
}

async fn lifecycle_logs_exec_and_oom(handler: &str) {
    let n = TestNode::new(SUBNET).await;
    let oci_root = n.rt.dir.path().join("state").join("oci").join(handler);

    // Lifecycle and logs.
    let sb_cfg = n.sandbox_config(&format!("{handler}-pod"));
    let sb = n.run_sandbox_on(&sb_cfg, handler).await;
    let app = n
        .run(
            &sb,
            &sb_cfg,
            n.container_config(
                "app",
                &[
                    "sh",
                    "-c",
                    "trap 'echo bye; exit 7' TERM; echo hello from $0; while true; do sleep 0.2; done",
                    handler,
                ],
            ),
        )
        .await;
    let s = n
        .wait_state(&app, pb::ContainerState::ContainerRunning)
        .await;
    assert_eq!(s.exit_code, 0, "{s:?}");
    let state = oci_state(handler, &oci_root, &app);
    assert_eq!(state["status"], "running", "{state}");
    assert_eq!(
        n.sandbox_status(&sb).await.state,
        pb::PodSandboxState::SandboxReady as i32
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !n
        .log(&sb_cfg.metadata.as_ref().unwrap().name, "app")
        .contains("hello from")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no log line from the {handler} container\n{}",
            n.rt.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let line = n.log(&sb_cfg.metadata.as_ref().unwrap().name, "app");
    assert!(
        line.contains(&format!(" stdout F hello from {handler}")),
        "CRI log format: {line}"
    );

    // Exec: output, exit codes, and the container's own namespaces.
    let r = n
        .exec(&app, &["sh", "-c", "hostname; exit 3"], 30)
        .await
        .expect("ExecSync");
    assert_eq!(
        (String::from_utf8_lossy(&r.stdout).trim(), r.exit_code),
        (format!("{handler}-pod").as_str(), 3),
        "{r:?}"
    );

    // Stop and remove: the OCI runtime forgets the container.
    let mut rt = n.c.runtime.clone();
    rt.stop_container(pb::StopContainerRequest {
        container_id: app.clone(),
        timeout: 30,
    })
    .await
    .expect("StopContainer");
    let s = n
        .wait_state(&app, pb::ContainerState::ContainerExited)
        .await;
    assert_eq!(
        s.exit_code, 7,
        "SIGTERM reaches the container's trap: {s:?}"
    );
    assert!(
        n.log(&sb_cfg.metadata.as_ref().unwrap().name, "app")
            .contains("stdout F bye")
    );
    rt.remove_container(pb::RemoveContainerRequest {
        container_id: app.clone(),
    })
    .await
    .expect("RemoveContainer");
    assert!(
        !oci_root.join(&app).exists(),
        "{handler} still holds {app} after RemoveContainer"
    );

    // An OOM kill under a 20 MiB limit is OOMKilled, exit code 137.
    let hog = common::node::memory_hog("hog", 20 << 20);
    let hog = n.run(&sb, &sb_cfg, hog).await;
    let s = n
        .wait_state(&hog, pb::ContainerState::ContainerExited)
        .await;
    assert_eq!(
        (s.reason.as_str(), s.exit_code),
        ("OOMKilled", 137),
        "{handler}: {s:?}\n{}",
        n.rt.log()
    );
    n.stop_and_remove_sandbox(&sb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn runc_handler_runs_the_lifecycle_logs_exec_and_oom() {
    if !have_root() {
        return;
    }
    lifecycle_logs_exec_and_oom("runc").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crun_handler_runs_the_lifecycle_logs_exec_and_oom() {
    if !have_root() {
        return;
    }
    if !pure_cgroup_v2() {
        eprintln!(
            "skipped: crun needs a pure cgroup v2 host (this one is v1 or hybrid); the VM lane runs this test"
        );
        return;
    }
    lifecycle_logs_exec_and_oom("crun").await;
}
