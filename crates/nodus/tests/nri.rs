//! NRI (containerd/nri's Node Resource Interface) in `nodus runtime`, with real plugin
//! processes (`nodus nri-plugin`) over the real NRI socket: the events plugins see and
//! their order and metadata, adjustments the running container shows, a failing or slow
//! hook failing the CRI call without leaving anything behind, pre-installed plugins started
//! from the plugin directory in index order (and their conflicts), synchronization with
//! existing pods and containers, and container updates and evictions plugins ask for.

mod common;

use common::*;
use cri::runtime::v1 as pb;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use testkit::daemon::Daemon;

/// A test node with NRI on, its socket and plugin directories in `nri`.
struct NriNode {
    n: TestNode,
    nri: tempfile::TempDir,
}

impl NriNode {
    async fn start(subnet: &str, extra: &str) -> NriNode {
        let nri = tempfile::Builder::new()
            .prefix("nodus-nri-")
            .tempdir()
            .unwrap();
        std::fs::create_dir_all(nri.path().join("plugins")).unwrap();
        std::fs::create_dir_all(nri.path().join("conf.d")).unwrap();
        let cfg = format!(
            "nri = true\nnri-socket = \"{0}/nri.sock\"\nnri-plugin-path = \"{0}/plugins\"\nnri-plugin-config-path = \"{0}/conf.d\"\n{extra}",
            nri.path().display()
        );
        let n = TestNode::with_runtime_config(subnet, &cfg).await;
        NriNode { n, nri }
    }

    fn socket(&self) -> PathBuf {
        self.nri.path().join("nri.sock")
    }

    /// Starts `nodus nri-plugin` as plugin `idx`-test with `args`, logging events to
    /// `<nri>/<idx>.events`, and waits until the runtime synchronized it.
    fn plugin(&self, idx: &str, args: &[&str]) -> Daemon {
        let log = self.events_path(idx);
        let mut cmd = Command::new(nodus_bin());
        cmd.args(["nri-plugin", "--name", "test", "--idx", idx])
            .arg("--socket")
            .arg(self.socket())
            .arg("--event-log")
            .arg(&log)
            .args(args);
        let mut d = Daemon::spawn(
            "nri-plugin",
            cmd,
            &self.nri.path().join(format!("{idx}.plugin.log")),
            Duration::from_secs(5),
        )
        .expect("spawn nri-plugin");
        d.wait_ready(Duration::from_secs(30), || {
            events(&log).iter().any(|e| e["event"] == "Synchronize")
        })
        .unwrap_or_else(|e| panic!("plugin {idx} never synchronized: {e}\n{}", self.n.rt.log()));
        d
    }

    fn events_path(&self, idx: &str) -> PathBuf {
        self.nri.path().join(format!("{idx}.events"))
    }
}

/// The JSON lines a plugin logged.
fn events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The events a plugin saw for the pod named `pod`, in order.
fn pod_events(path: &Path, pod: &str) -> Vec<Value> {
    events(path)
        .into_iter()
        .filter(|e| e["pod"]["name"] == pod)
        .collect()
}

fn names(evs: &[Value]) -> Vec<String> {
    evs.iter()
        .map(|e| e["event"].as_str().unwrap_or_default().to_string())
        .collect()
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..300 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn list_containers(n: &TestNode) -> Vec<pb::Container> {
    n.c.runtime
        .clone()
        .list_containers(pb::ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers
}

async fn list_pods(n: &TestNode) -> Vec<pb::PodSandbox> {
    n.c.runtime
        .clone()
        .list_pod_sandbox(pb::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items
}

/// Container directories and mounts the runtime holds: none after a failed create.
fn container_leftovers(n: &TestNode) -> Vec<PathBuf> {
    let state = n.rt.dir.path().join("state");
    let mut left = list_dir(&state.join("containers"));
    left.extend(list_dir(&n.rt.root().join("layers")));
    left.extend(
        testkit::containerd::mounts_under(n.rt.dir.path())
            .into_iter()
            .filter(|m| m.starts_with(state.join("containers"))),
    );
    left
}

async fn wait_log(n: &TestNode, pod: &str, container: &str, needle: &str) -> String {
    for _ in 0..200 {
        let log = n.log(pod, container);
        if log.contains(needle) {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{container} never logged {needle:?}: {}",
        n.log(pod, container)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn events_in_order_with_metadata_and_adjustments_in_the_running_container() {
    if !have_root() {
        return;
    }
    let node = NriNode::start("10.97.40.0/24", "").await;
    let n = &node.n;
    // A host file to mount and a device node to inject.
    let data = node.nri.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("file"), "from-the-host\n").unwrap();
    let dev = node.nri.path().join("nri-null");
    nix::sys::stat::mknod(
        &dev,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .expect("mknod");
    let mount = format!("{}:/nri-data", data.display());
    let _plugin = node.plugin(
        "10",
        &[
            "--inject-env",
            "NRI_INJECTED=hello",
            "--inject-mount",
            &mount,
            "--inject-device",
            dev.to_str().unwrap(),
            "--annotate",
            "example.com/nri=yes",
        ],
    );

    let sb_cfg = n.sandbox_config("nri-order");
    let sb = n.run_sandbox(&sb_cfg).await;
    let script = format!(
        "echo env=$NRI_INJECTED; cat /nri-data/file; test -c {0} && echo x > {0} && echo device-ok; sleep 1000",
        dev.display()
    );
    // RuntimeDefault seccomp: the profile stays out of the plugin's view and must come
    // through the adjustment unchanged.
    let mut app_cfg = n.container_config("app", &["sh", "-c", &script]);
    app_cfg.linux = Some(pb::LinuxContainerConfig {
        security_context: Some(pb::LinuxContainerSecurityContext {
            seccomp: Some(pb::SecurityProfile {
                profile_type: pb::security_profile::ProfileType::RuntimeDefault as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let app = n.run(&sb, &sb_cfg, app_cfg).await;
    let log = wait_log(n, "nri-order", "app", "device-ok").await;
    assert!(log.contains("env=hello"), "{log}");
    assert!(log.contains("from-the-host"), "{log}");
    // The annotation is in the container's spec, in the bundle its verbose status names.
    let info = n.verbose_info(&app).await;
    let bundle = PathBuf::from(info["bundle"].as_str().expect("bundle in the verbose info"));
    assert!(
        bundle.starts_with(n.rt.dir.path().join("state/containers")),
        "{info}"
    );
    let spec: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    assert_eq!(spec["annotations"]["example.com/nri"], "yes");
    assert_eq!(
        spec["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ERRNO",
        "the seccomp profile was lost in the NRI adjustment"
    );

    n.c.runtime
        .clone()
        .update_container_resources(pb::UpdateContainerResourcesRequest {
            container_id: app.clone(),
            linux: Some(pb::LinuxContainerResources {
                cpu_shares: 256,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("UpdateContainerResources");
    let mut r = n.c.runtime.clone();
    r.stop_container(pb::StopContainerRequest {
        container_id: app.clone(),
        timeout: 0,
    })
    .await
    .expect("StopContainer");
    r.remove_container(pb::RemoveContainerRequest {
        container_id: app.clone(),
    })
    .await
    .expect("RemoveContainer");
    n.stop_and_remove_sandbox(&sb).await;

    let path = node.events_path("10");
    wait_for("RemovePodSandbox to reach the plugin", || {
        names(&pod_events(&path, "nri-order")).contains(&"RemovePodSandbox".to_string())
    })
    .await;
    let evs = pod_events(&path, "nri-order");
    assert_eq!(
        names(&evs),
        [
            "RunPodSandbox",
            "CreateContainer",
            "PostCreateContainer",
            "StartContainer",
            "PostStartContainer",
            "UpdateContainer",
            "PostUpdateContainer",
            "StopContainer",
            "RemoveContainer",
            "StopPodSandbox",
            "RemovePodSandbox",
        ]
    );
    for e in &evs {
        let pod = &e["pod"];
        assert_eq!(pod["id"], sb.as_str(), "{e}");
        assert_eq!(pod["namespace"], "default", "{e}");
        assert_eq!(pod["uid"], "uid-nri-order", "{e}");
        assert_eq!(pod["labels"]["app"], "nri-order", "{e}");
        assert_eq!(pod["runtime_handler"], "", "{e}");
        if !e["container"].is_null() {
            assert_eq!(e["container"]["id"], app.as_str(), "{e}");
            assert_eq!(e["container"]["name"], "app", "{e}");
            assert_eq!(e["container"]["pod_sandbox_id"], sb.as_str(), "{e}");
            assert!(
                !e["container"]["cgroups_path"].as_str().unwrap().is_empty(),
                "{e}"
            );
        }
    }
    // The pod as it runs: its network namespace and cgroup parent.
    let run = &evs[0]["pod"];
    assert!(
        run["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|ns| ns["type"] == "network" && !ns["path"].as_str().unwrap().is_empty()),
        "{run}"
    );
    assert_eq!(run["cgroup_parent"], n.cgroup.path(), "{run}");
    // The running container's pid at PostStartContainer; not yet at CreateContainer.
    assert_eq!(evs[1]["container"]["pid"], 0);
    assert!(
        evs[4]["container"]["pid"].as_u64().unwrap() > 0,
        "{}",
        evs[4]
    );
    // CreateContainer saw the spec before plugins; PostCreateContainer after them.
    let env_of = |e: &Value| e["container"]["env"].as_array().unwrap().clone();
    assert!(!env_of(&evs[1]).contains(&Value::from("NRI_INJECTED=hello")));
    assert!(env_of(&evs[2]).contains(&Value::from("NRI_INJECTED=hello")));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_hook_fails_the_call_leaves_nothing_and_a_retry_succeeds() {
    if !have_root() {
        return;
    }
    let node = NriNode::start("10.97.41.0/24", "").await;
    let n = &node.n;
    let sb_cfg = n.sandbox_config("nri-fail");

    // RunPodSandbox refused by a plugin.
    let mut plugin = node.plugin("10", &["--fail-on", "RunPodSandbox"]);
    let err =
        n.c.runtime
            .clone()
            .run_pod_sandbox(pb::RunPodSandboxRequest {
                config: Some(sb_cfg.clone()),
                runtime_handler: String::new(),
            })
            .await
            .expect_err("RunPodSandbox refused by the plugin");
    assert_eq!(err.code(), tonic::Code::Unknown, "{err:?}");
    assert!(
        err.message()
            .starts_with("NRI RunPodSandbox failed: plugin \"10-test\": "),
        "{err:?}"
    );
    assert!(err.message().contains("refused by nri-plugin"), "{err:?}");
    assert!(list_pods(n).await.is_empty());
    assert!(
        list_dir(&n.rt.dir.path().join("state/sandboxes")).is_empty(),
        "sandbox state left behind"
    );
    assert!(list_dir(&n.rt.root().join("sandboxes")).is_empty());
    plugin.stop();

    // CreateContainer refused: no container, directory, layer or mount left.
    let mut plugin = node.plugin("20", &["--fail-on", "CreateContainer"]);
    let sb = n.run_sandbox(&sb_cfg).await; // the same name: the failed one released it
    let err = n
        .create(&sb, &sb_cfg, n.container_config("app", &["sleep", "1000"]))
        .await
        .expect_err("CreateContainer refused by the plugin");
    assert!(
        err.message()
            .starts_with("NRI CreateContainer failed: plugin \"20-test\": "),
        "{err:?}"
    );
    assert!(list_containers(n).await.is_empty());
    assert_eq!(container_leftovers(n), Vec::<PathBuf>::new());

    // StartContainer refused: the container stays created and starts once allowed.
    plugin.stop();
    let mut plugin = node.plugin("30", &["--fail-on", "StartContainer"]);
    let app = n
        .create(&sb, &sb_cfg, n.container_config("app", &["sleep", "1000"]))
        .await
        .expect("CreateContainer with the same name after the failure");
    let err =
        n.c.runtime
            .clone()
            .start_container(pb::StartContainerRequest {
                container_id: app.clone(),
            })
            .await
            .expect_err("StartContainer refused");
    assert!(
        err.message().starts_with("NRI StartContainer failed"),
        "{err:?}"
    );
    assert_eq!(
        n.status(&app).await.state,
        pb::ContainerState::ContainerCreated as i32
    );
    plugin.stop();
    // The runtime drops a plugin whose connection closed; the start goes through then.
    let mut started = false;
    for _ in 0..100 {
        if n.c
            .runtime
            .clone()
            .start_container(pb::StartContainerRequest {
                container_id: app.clone(),
            })
            .await
            .is_ok()
        {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started,
        "StartContainer never succeeded after the plugin left"
    );
    n.wait_state(&app, pb::ContainerState::ContainerRunning)
        .await;
    n.stop_and_remove_sandbox(&sb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_hook_times_out_and_nothing_is_listed_while_a_hook_runs() {
    if !have_root() {
        return;
    }
    let node = NriNode::start("10.97.42.0/24", "nri-plugin-request-timeout = \"2s\"\n").await;
    let n = &node.n;
    let mut plugin = node.plugin(
        "10",
        &[
            "--delay-on",
            "RunPodSandbox=1s",
            "--delay-on",
            "CreateContainer=20s",
        ],
    );
    let path = node.events_path("10");

    // While RunPodSandbox's hook runs, the sandbox is not listed.
    let sb_cfg = n.sandbox_config("nri-slow");
    let run = {
        let (mut r, cfg) = (n.c.runtime.clone(), sb_cfg.clone());
        tokio::spawn(async move {
            r.run_pod_sandbox(pb::RunPodSandboxRequest {
                config: Some(cfg),
                runtime_handler: String::new(),
            })
            .await
        })
    };
    wait_for("the RunPodSandbox hook", || {
        names(&pod_events(&path, "nri-slow")).contains(&"RunPodSandbox".to_string())
    })
    .await;
    assert!(
        list_pods(n).await.is_empty(),
        "sandbox listed during its hook"
    );
    let sb = run
        .await
        .unwrap()
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    assert_eq!(list_pods(n).await.len(), 1);

    // CreateContainer's hook does not answer in time: DeadlineExceeded, nothing left, the
    // plugin disconnected; while it ran, no container was listed.
    let create = {
        let (mut r, sb, cfg, sb_cfg) = (
            n.c.runtime.clone(),
            sb.clone(),
            n.container_config("app", &["sleep", "1000"]),
            sb_cfg.clone(),
        );
        tokio::spawn(async move {
            r.create_container(pb::CreateContainerRequest {
                pod_sandbox_id: sb,
                config: Some(cfg),
                sandbox_config: Some(sb_cfg),
            })
            .await
        })
    };
    wait_for("the CreateContainer hook", || {
        names(&pod_events(&path, "nri-slow")).contains(&"CreateContainer".to_string())
    })
    .await;
    assert!(
        list_containers(n).await.is_empty(),
        "container listed during its hook"
    );
    let err = create
        .await
        .unwrap()
        .expect_err("CreateContainer timed out");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    assert!(
        err.message()
            .starts_with("NRI CreateContainer failed: plugin \"10-test\" did not answer within"),
        "{err:?}"
    );
    assert!(list_containers(n).await.is_empty());
    assert_eq!(container_leftovers(n), Vec::<PathBuf>::new());
    // The runtime closed the plugin's connection, so the plugin exits.
    let mut gone = false;
    for _ in 0..100 {
        if !plugin.is_running() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the timed-out plugin is still connected");
    // A retry succeeds and the container runs.
    let app = n
        .run(&sb, &sb_cfg, n.container_config("app", &["sleep", "1000"]))
        .await;
    n.wait_state(&app, pb::ContainerState::ContainerRunning)
        .await;
    n.stop_and_remove_sandbox(&sb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn preinstalled_plugins_in_index_order_synchronize_and_conflict() {
    if !have_root() {
        return;
    }
    let mut node = NriNode::start("10.97.43.0/24", "").await;
    let dir = node.nri.path().to_path_buf();
    // Two plugins in the directory, written out of index order; each injects its own
    // variable and, once `conflict` exists, the same one as the other.
    for (idx, name) in [("20", "second"), ("10", "first")] {
        let script = format!(
            "#!/bin/sh\nextra=\nif [ -e {dir}/conflict ]; then extra=\"--inject-env SHARED=$NRI_PLUGIN_NAME\"; fi\nexec {bin} nri-plugin --inject-env P{idx}=$NRI_PLUGIN_IDX-$NRI_PLUGIN_NAME --event-log {dir}/{idx}.events $extra\n",
            dir = dir.display(),
            bin = nodus_bin().display(),
        );
        let p = dir.join("plugins").join(format!("{idx}-{name}"));
        std::fs::write(&p, script).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(dir.join("conf.d/10-first.conf"), "greeting = \"hello\"\n").unwrap();
    // A non-executable file is no plugin.
    std::fs::write(dir.join("plugins/README"), "not a plugin").unwrap();

    // The plugins started with the runtime: restart it to pick them up.
    node.n.rt.restart();
    node.n.c = node.n.rt.clients().await;
    let n = &node.n;
    for idx in ["10", "20"] {
        let p = node.events_path(idx);
        wait_for("pre-installed plugins to synchronize", || {
            events(&p).iter().any(|e| e["event"] == "Synchronize")
        })
        .await;
    }
    let configure = |idx: &str| {
        events(&node.events_path(idx))
            .into_iter()
            .find(|e| e["event"] == "Configure")
            .unwrap()
    };
    assert_eq!(configure("10")["config"], "greeting = \"hello\"\n");
    assert_eq!(configure("20")["config"], "");

    let sb_cfg = n.sandbox_config("nri-pre");
    let sb = n.run_sandbox(&sb_cfg).await;
    let app = n
        .run(
            &sb,
            &sb_cfg,
            n.container_config("app", &["sh", "-c", "echo vars=$P10,$P20; sleep 1000"]),
        )
        .await;
    wait_log(n, "nri-pre", "app", "vars=10-first,20-second").await;
    // 10 was asked before 20: 20's CreateContainer saw 10's variable.
    let second = pod_events(&node.events_path("20"), "nri-pre");
    let create = second
        .iter()
        .find(|e| e["event"] == "CreateContainer")
        .unwrap();
    assert!(
        create["container"]["env"]
            .as_array()
            .unwrap()
            .contains(&Value::from("P10=10-first")),
        "{create}"
    );

    // Restarted with conflicting plugins: synchronized with the pod and container that
    // exist, and a create both adjust the same variable of fails naming both.
    std::fs::write(dir.join("conflict"), "").unwrap();
    for idx in ["10", "20"] {
        let _ = std::fs::remove_file(node.events_path(idx));
    }
    node.n.rt.restart();
    node.n.c = node.n.rt.clients().await;
    let n = &node.n;
    for idx in ["10", "20"] {
        let p = node.events_path(idx);
        wait_for("plugins to synchronize again", || {
            events(&p).iter().any(|e| e["event"] == "Synchronize")
        })
        .await;
    }
    let sync = events(&node.events_path("20"))
        .into_iter()
        .find(|e| e["event"] == "Synchronize")
        .unwrap();
    assert!(
        sync["pods"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["id"] == sb.as_str() && p["name"] == "nri-pre"),
        "{sync}"
    );
    assert!(
        sync["containers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["id"] == app.as_str() && c["name"] == "app" && c["state"] == 3),
        "{sync}"
    );
    let err = n
        .create(
            &sb,
            &sb_cfg,
            n.container_config("other", &["sleep", "1000"]),
        )
        .await
        .expect_err("conflicting adjustments");
    assert_eq!(
        err.message(),
        "NRI CreateContainer failed: plugins \"20-second\" and \"10-first\" both tried to set Env SHARED"
    );
    assert_eq!(list_containers(n).await.len(), 1);
    n.stop_and_remove_sandbox(&sb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn plugins_update_and_evict_containers() {
    if !have_root() {
        return;
    }
    let node = NriNode::start("10.97.44.0/24", "").await;
    let n = &node.n;
    let _plugin = node.plugin(
        "10",
        &[
            "--update-memory-on-start",
            "app=67108864",
            "--evict-on-start",
            "victim",
        ],
    );
    let sb_cfg = n.sandbox_config("nri-update");
    let sb = n.run_sandbox(&sb_cfg).await;
    let app = n
        .run(&sb, &sb_cfg, n.container_config("app", &["sleep", "1000"]))
        .await;
    let mut limit = 0;
    for _ in 0..100 {
        limit = n
            .status(&app)
            .await
            .resources
            .and_then(|r| r.linux)
            .map(|l| l.memory_limit_in_bytes)
            .unwrap_or(0);
        if limit == 64 << 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(limit, 64 << 20, "the plugin's update never applied");
    // The container's cgroup has it too.
    let out = n
        .exec(
            &app,
            &[
                "cat",
                "/sys/fs/cgroup/memory.max",
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            ],
            10,
        )
        .await
        .expect("exec");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("67108864"),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );

    let victim = n
        .run(
            &sb,
            &sb_cfg,
            n.container_config("victim", &["sleep", "1000"]),
        )
        .await;
    n.wait_state(&victim, pb::ContainerState::ContainerExited)
        .await;
    assert_eq!(
        n.status(&app).await.state,
        pb::ContainerState::ContainerRunning as i32,
        "only the container named was evicted"
    );
    n.stop_and_remove_sandbox(&sb).await;
}

/// NRI is on by default, and the NRI socket is one per host: a second runtime finding a
/// live NRI server on its `nri-socket` never takes it over. Asked for NRI (`nri = true`) it
/// refuses to start, naming the path and the key; with NRI merely on by default it starts,
/// says it runs without NRI, and plugins keep reaching the first runtime.
#[test]
fn a_live_nri_socket_is_never_taken_over() {
    if !have_root() {
        return;
    }
    let shared = tempfile::Builder::new()
        .prefix("nodus-nri-shared-")
        .tempdir()
        .unwrap();
    let socket = shared.path().join("nri.sock");
    let key = format!("nri-socket = \"{}\"\n", socket.display());
    // The owner: NRI on by default (no `nri` key).
    let owner = Runtime::start_with_config(Some(&key));
    assert!(
        std::os::unix::net::UnixStream::connect(&socket).is_ok(),
        "the runtime with NRI on by default serves {}: {}",
        socket.display(),
        owner.log()
    );

    // `nri = true` on the same socket: a start-up error naming the path and the key.
    let err = Runtime::refused(
        &format!("nri = true\n{key}"),
        "nri = true on a socket another runtime serves",
    );
    assert!(
        err.contains(&format!(
            "another runtime is serving NRI on {}",
            socket.display()
        )) && err.contains("nri-socket"),
        "{err}"
    );

    // NRI on by default on the same socket: the runtime comes up without NRI.
    let second = Runtime::start_with_config(Some(&key));
    let mut log = String::new();
    for _ in 0..100 {
        log = second.log();
        if log.contains("running without NRI") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        log.contains("running without NRI") && log.contains(&socket.display().to_string()),
        "{log}"
    );

    // The owner still has the socket: a plugin connecting there is synchronized by it.
    let events = shared.path().join("10.events");
    let mut cmd = Command::new(nodus_bin());
    cmd.args(["nri-plugin", "--name", "test", "--idx", "10"])
        .arg("--socket")
        .arg(&socket)
        .arg("--event-log")
        .arg(&events);
    let mut plugin = Daemon::spawn(
        "nri-plugin",
        cmd,
        &shared.path().join("plugin.log"),
        Duration::from_secs(5),
    )
    .expect("spawn nri-plugin");
    plugin
        .wait_ready(Duration::from_secs(30), || {
            self::events(&events)
                .iter()
                .any(|e| e["event"] == "Synchronize")
        })
        .unwrap_or_else(|e| panic!("plugin never synchronized: {e}\n{}", owner.log()));
    assert!(
        owner
            .log()
            .contains("NRI: plugin connected and synchronized"),
        "{}",
        owner.log()
    );
    assert!(!second.log().contains("NRI: plugin connected"));
}
