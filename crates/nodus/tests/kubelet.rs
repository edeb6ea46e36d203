//! The kubelet's sync engine end to end: static pods from a manifest directory run on a
//! real runtime (nodus's own here; containerd in kubelet_containerd.rs), in a private
//! network namespace, and their status is read back from the kubelet as a user would.

mod common;

use common::BareNode;
use common::kubelet::{Kubelet, NODE_NAME, condition, container_status, exec, is_running, phase};
use serde_json::Value;
use std::time::Duration;
use std::time::Instant;

const T: Duration = Duration::from_secs(60);

fn node_and_kubelet(subnet: &str, extra: &[&str]) -> (BareNode, Kubelet) {
    let node = BareNode::new(subnet);
    node.cgroup.create();
    let k = Kubelet::start(
        node.netns.clone(),
        &node.rt.endpoint(),
        &node.cgroup.path(),
        extra,
    );
    (node, k)
}

fn full(name: &str) -> String {
    format!("{name}-{NODE_NAME}")
}

fn restarts(p: &Value, c: &str) -> i64 {
    container_status(p, c)
        .and_then(|s| s["restartCount"].as_i64())
        .unwrap_or(0)
}

async fn runtime_containers(node: &BareNode, uid: &str) -> Vec<cri::runtime::v1::Container> {
    let c = node.rt.clients().await;
    c.runtime
        .clone()
        .list_containers(cri::runtime::v1::ListContainersRequest {
            filter: Some(cri::runtime::v1::ContainerFilter {
                label_selector: [("io.kubernetes.pod.uid".to_string(), uid.to_string())].into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .containers
}

async fn runtime_sandboxes(node: &BareNode, uid: &str) -> Vec<cri::runtime::v1::PodSandbox> {
    let c = node.rt.clients().await;
    c.runtime
        .clone()
        .list_pod_sandbox(cri::runtime::v1::ListPodSandboxRequest {
            filter: Some(cri::runtime::v1::PodSandboxFilter {
                label_selector: [("io.kubernetes.pod.uid".to_string(), uid.to_string())].into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .items
}

const SLEEPER: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: main
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo started $(POD_NAME); exec sleep 3600"]
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
"#;

#[tokio::test(flavor = "multi_thread")]
async fn static_pod_runs_reports_status_and_is_torn_down_when_its_file_goes() {
    if !common::have_root() {
        return;
    }
    let (node, k) = node_and_kubelet("10.88.1.0/24", &[]);
    k.write_manifest("web.yaml", SLEEPER);
    let p = k.wait_pod(&full("web"), T, "Running and Ready", |p| {
        phase(p) == "Running" && condition(p, "Ready") == Some("True")
    });
    // Upstream's static pod conventions.
    assert_eq!(p["metadata"]["namespace"], "default");
    assert_eq!(
        p["metadata"]["annotations"]["kubernetes.io/config.source"],
        "file"
    );
    assert_eq!(
        p["metadata"]["annotations"]["kubernetes.io/config.hash"],
        p["metadata"]["uid"]
    );
    assert_eq!(p["spec"]["nodeName"], NODE_NAME);
    assert_eq!(p["status"]["qosClass"], "BestEffort");
    let ip = p["status"]["podIP"].as_str().unwrap();
    assert!(ip.starts_with("10.88.1."), "pod IP {ip}");
    for c in [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
        "PodScheduled",
    ] {
        assert_eq!(condition(&p, c), Some("True"), "{c}: {p}");
    }
    let cs = container_status(&p, "main").unwrap();
    assert_eq!(cs["ready"], true);
    assert_eq!(cs["started"], true);
    assert_eq!(cs["restartCount"], 0);
    assert!(
        cs["containerID"].as_str().unwrap().starts_with("nodus://"),
        "{cs}"
    );
    assert!(
        !cs["imageID"].as_str().unwrap_or_default().is_empty(),
        "{cs}"
    );

    // The runtime has the sandbox and the container, labelled as upstream labels them.
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let sandboxes = runtime_sandboxes(&node, &uid).await;
    assert_eq!(sandboxes.len(), 1);
    assert_eq!(sandboxes[0].labels["io.kubernetes.pod.name"], full("web"));
    assert_eq!(sandboxes[0].labels["app"], "web");
    let containers = runtime_containers(&node, &uid).await;
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].labels["io.kubernetes.container.name"], "main");
    // The container log is where upstream puts it, with the downward API expanded.
    let log_dir = k.logs_dir().join(format!("default_{}_{uid}", full("web")));
    let log = std::fs::read_to_string(log_dir.join("main/0.log")).unwrap_or_default();
    assert!(
        log.contains(&format!("started {}", full("web"))),
        "log: {log:?}"
    );

    // Deleting the file deletes the pod: containers, sandbox, pod directory.
    k.remove_manifest("web.yaml");
    k.wait_gone(&full("web"), T);
    let deadline = std::time::Instant::now() + T;
    loop {
        let left = runtime_sandboxes(&node, &uid).await.len()
            + runtime_containers(&node, &uid).await.len();
        if left == 0 && !k.root().join("pods").join(&uid).exists() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pod not torn down: {left} objects left\n{}",
            k.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn pod_yaml(name: &str, body: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 2\n{body}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn crashing_container_restarts_with_back_off_and_keeps_its_last_state() {
    if !common::have_root() {
        return;
    }
    let (_node, k) = node_and_kubelet("10.88.2.0/24", &[]);
    k.write_manifest(
        "crash.yaml",
        &pod_yaml(
            "crash",
            r#"  containers:
  - name: c
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "echo bye; exit 3"]
"#,
        ),
    );
    // First exit: restarted at once; second: CrashLoopBackOff with the exit kept as lastState.
    let p = k.wait_pod(&full("crash"), T, "CrashLoopBackOff", |p| {
        container_status(p, "c")
            .is_some_and(|c| c["state"]["waiting"]["reason"] == "CrashLoopBackOff")
    });
    let c = container_status(&p, "c").unwrap();
    assert!(c["restartCount"].as_i64().unwrap() >= 1, "{c}");
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 3, "{c}");
    assert_eq!(c["lastState"]["terminated"]["reason"], "Error", "{c}");
    let msg = c["state"]["waiting"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("back-off 10s restarting failed container=c pod=crash-test-node_default("),
        "{msg}"
    );
    assert_eq!(
        phase(&p),
        "Running",
        "restartPolicy Always keeps the pod Running"
    );
    assert_eq!(condition(&p, "Ready"), Some("False"));
    // After the back-off the kubelet restarts it again.
    let before = restarts(&p, "c");
    k.wait_pod(
        &full("crash"),
        T,
        "another restart after the back-off",
        |p| restarts(p, "c") > before,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn init_containers_run_in_order_before_app_containers() {
    if !common::have_root() {
        return;
    }
    let (_node, k) = node_and_kubelet("10.88.3.0/24", &[]);
    k.write_manifest(
        "init.yaml",
        &pod_yaml(
            "init",
            r#"  initContainers:
  - name: first
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 1; echo first >> /work/order"]
    volumeMounts: [{name: work, mountPath: /work}]
  - name: second
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "echo second >> /work/order"]
    volumeMounts: [{name: work, mountPath: /work}]
  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "echo app >> /work/order; cat /work/order; exec sleep 3600"]
    volumeMounts: [{name: work, mountPath: /work}]
  volumes:
  - name: work
    emptyDir: {}
"#,
        ),
    );
    let p = k.wait_pod(&full("init"), T, "app running", |p| is_running(p, "app"));
    assert_eq!(condition(&p, "Initialized"), Some("True"));
    let inits = p["status"]["initContainerStatuses"].as_array().unwrap();
    for i in inits {
        assert_eq!(i["state"]["terminated"]["exitCode"], 0, "{i}");
        assert_eq!(i["state"]["terminated"]["reason"], "Completed", "{i}");
    }
    let uid = p["metadata"]["uid"].as_str().unwrap();
    let file = k
        .root()
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir/work/order");
    let deadline = Instant::now() + T;
    let mut order = String::new();
    while order.lines().count() < 3 && Instant::now() < deadline {
        order = std::fs::read_to_string(&file).unwrap_or_default();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(order, "first\nsecond\napp\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_init_container_under_restart_never_fails_the_pod() {
    if !common::have_root() {
        return;
    }
    let (_node, k) = node_and_kubelet("10.88.4.0/24", &[]);
    k.write_manifest(
        "bad-init.yaml",
        &pod_yaml(
            "bad-init",
            r#"  restartPolicy: Never
  initContainers:
  - name: setup
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["false"]
  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sleep", "3600"]
"#,
        ),
    );
    let p = k.wait_pod(&full("bad-init"), T, "Failed", |p| phase(p) == "Failed");
    assert!(
        container_status(&p, "app").is_some_and(|c| c["state"]["running"].is_null()),
        "{p}"
    );
    assert_eq!(condition(&p, "Initialized"), Some("False"));
}

#[tokio::test(flavor = "multi_thread")]
async fn liveness_failure_restarts_and_readiness_flips_ready() {
    if !common::have_root() {
        return;
    }
    let (_node, k) = node_and_kubelet("10.88.5.0/24", &[]);
    k.write_manifest(
        "probes.yaml",
        &pod_yaml(
            "probes",
            r#"  containers:
  - name: live
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "touch /tmp/healthy; sleep 3; rm /tmp/healthy; exec sleep 3600"]
    livenessProbe:
      exec: {command: ["cat", "/tmp/healthy"]}
      periodSeconds: 1
      failureThreshold: 1
  - name: ready
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "exec sleep 3600"]
    readinessProbe:
      exec: {command: ["test", "-f", "/tmp/ready"]}
      periodSeconds: 1
"#,
        ),
    );
    let p = k.wait_pod(
        &full("probes"),
        T,
        "live restarted by its liveness probe",
        |p| restarts(p, "live") >= 1,
    );
    // The readiness probe has never succeeded: not ready, so the pod is not Ready.
    assert_eq!(container_status(&p, "ready").unwrap()["ready"], false);
    assert_eq!(condition(&p, "Ready"), Some("False"));
    let ep = _node.rt.endpoint();
    exec(&ep, &p, "ready", &["touch", "/tmp/ready"]).await;
    k.wait_pod(&full("probes"), T, "ready", |p| {
        container_status(p, "ready").is_some_and(|c| c["ready"] == true)
    });
    exec(&ep, &p, "ready", &["rm", "/tmp/ready"]).await;
    k.wait_pod(&full("probes"), T, "not ready again", |p| {
        container_status(p, "ready").is_some_and(|c| c["ready"] == false)
    });
}

/// A busybox pod body whose container `c` sleeps with `out` mounted at `/out` and runs
/// `lifecycle` (YAML lines indented under `lifecycle:`): hooks write there for the test.
fn hook_pod_body(out: &std::path::Path, lifecycle: &str) -> String {
    format!(
        r#"  containers:
  - name: c
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "exec sleep 3600"]
    volumeMounts: [{{name: out, mountPath: /out}}]
    lifecycle:
{lifecycle}  volumes:
  - name: out
    hostPath: {{path: {}, type: Directory}}
"#,
        out.display()
    )
}

/// Waits up to [`T`] for a file a hook writes, failing with the kubelet's log.
async fn wait_for_file(k: &Kubelet, path: &std::path::Path, what: &str) {
    let deadline = Instant::now() + T;
    while !path.exists() {
        assert!(Instant::now() < deadline, "{what}\n{}", k.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pre_stop_runs_before_the_container_is_stopped() {
    if !common::have_root() {
        return;
    }
    let (_node, k) = node_and_kubelet("10.88.6.0/24", &[]);
    let out = tempfile::tempdir().unwrap();
    k.write_manifest(
        "hooks.yaml",
        &pod_yaml(
            "hooks",
            &hook_pod_body(
                out.path(),
                r#"      postStart:
        exec: {command: ["sh", "-c", "echo post-start > /out/post"]}
      preStop:
        exec: {command: ["sh", "-c", "echo pre-stop > /out/pre"]}
"#,
            ),
        ),
    );
    k.wait_pod(&full("hooks"), T, "running", |p| is_running(p, "c"));
    assert_eq!(
        std::fs::read_to_string(out.path().join("post")).unwrap(),
        "post-start\n"
    );
    k.remove_manifest("hooks.yaml");
    k.wait_gone(&full("hooks"), T);
    wait_for_file(&k, &out.path().join("pre"), "preStop did not run").await;
    assert_eq!(
        std::fs::read_to_string(out.path().join("pre")).unwrap(),
        "pre-stop\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubelet_restart_adopts_running_pods_and_removes_pods_deleted_meanwhile() {
    if !common::have_root() {
        return;
    }
    let (node, mut k) = node_and_kubelet("10.88.7.0/24", &[]);
    k.write_manifest("keep.yaml", &pod_yaml("keep", "  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sleep\", \"3600\"]\n"));
    k.write_manifest("drop.yaml", &pod_yaml("drop", "  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sleep\", \"3600\"]\n"));
    let keep = k.wait_pod(&full("keep"), T, "running", |p| is_running(p, "c"));
    let drop_ = k.wait_pod(&full("drop"), T, "running", |p| is_running(p, "c"));
    let keep_uid = keep["metadata"]["uid"].as_str().unwrap().to_string();
    let drop_uid = drop_["metadata"]["uid"].as_str().unwrap().to_string();
    let keep_id = container_status(&keep, "c").unwrap()["containerID"].clone();

    k.kill();
    k.remove_manifest("drop.yaml");
    k.start_again();

    let again = k.wait_pod(&full("keep"), T, "running", |p| is_running(p, "c"));
    assert_eq!(
        container_status(&again, "c").unwrap()["containerID"],
        keep_id,
        "adopted, not restarted\nbefore the restart:\n{}\nafter:\n{}",
        std::fs::read_to_string(k.dir.path().join("kubelet-1.log")).unwrap_or_default(),
        k.log()
    );
    assert_eq!(restarts(&again, "c"), 0);
    // Give the kubelet a few sync rounds: still one sandbox, one container.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(runtime_sandboxes(&node, &keep_uid).await.len(), 1);
    assert_eq!(runtime_containers(&node, &keep_uid).await.len(), 1);
    // The pod whose file went while the kubelet was down is torn down.
    let deadline = Instant::now() + T;
    while !runtime_sandboxes(&node, &drop_uid).await.is_empty() {
        assert!(Instant::now() < deadline, "orphan not removed\n{}", k.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(k.pod(&full("drop")).is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn runtime_restart_under_a_running_kubelet_changes_nothing() {
    if !common::have_root() {
        return;
    }
    let (mut node, k) = node_and_kubelet("10.88.8.0/24", &[]);
    k.write_manifest("p.yaml", &pod_yaml("p", "  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sleep\", \"3600\"]\n"));
    let p = k.wait_pod(&full("p"), T, "running", |p| is_running(p, "c"));
    let id = container_status(&p, "c").unwrap()["containerID"].clone();
    node.rt.restart();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let p = k.wait_pod(&full("p"), T, "running", |p| is_running(p, "c"));
    assert_eq!(container_status(&p, "c").unwrap()["containerID"], id);
    assert_eq!(restarts(&p, "c"), 0);
    let (code, body) = k.healthz();
    assert_eq!((code, body.as_str()), (200, "ok"));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_manifests_are_skipped_and_good_pods_run() {
    if !common::have_root() {
        return;
    }
    let (_node, k) = node_and_kubelet("10.88.9.0/24", &[]);
    k.write_manifest(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: broken\n",
    );
    k.write_manifest(
        "invalid.yaml",
        &pod_yaml(
            "invalid",
            "  restartPolicy: Sometimes\n  containers:\n  - name: c\n    image: busybox\n",
        ),
    );
    k.write_manifest(
        "noimage.yaml",
        &pod_yaml("noimage", "  containers:\n  - name: c\n    image: example.invalid/nope:1\n    imagePullPolicy: Never\n"),
    );
    k.write_manifest("good.yaml", &pod_yaml("good", "  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sleep\", \"3600\"]\n"));
    k.wait_pod(&full("good"), T, "running", |p| is_running(p, "c"));
    let p = k.wait_pod(&full("noimage"), T, "ErrImageNeverPull", |p| {
        container_status(p, "c")
            .is_some_and(|c| c["state"]["waiting"]["reason"] == "ErrImageNeverPull")
    });
    assert_eq!(phase(&p), "Pending");
    assert_eq!(
        container_status(&p, "c").unwrap()["state"]["waiting"]["message"],
        "Container image \"example.invalid/nope:1\" is not present with pull policy of Never"
    );
    assert!(k.pod(&full("broken")).is_none());
    assert!(k.pod(&full("invalid")).is_none());
    let log = k.log();
    assert!(
        log.contains("invalid.yaml") && log.contains("spec.restartPolicy"),
        "{log}"
    );
    assert!(log.contains("broken.yaml"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn evented_and_relisting_pleg_deliver_the_same_transitions() {
    if !common::have_root() {
        return;
    }
    for (subnet, gates) in [
        ("10.88.10.0/24", "EventedPLEG=false"),
        ("10.88.11.0/24", "EventedPLEG=true"),
    ] {
        let (_node, k) = node_and_kubelet(subnet, &["--feature-gates", gates]);
        k.write_manifest(
            "once.yaml",
            &pod_yaml(
                "once",
                "  restartPolicy: OnFailure\n  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", \"sleep 1; exit 0\"]\n",
            ),
        );
        let p = k.wait_pod(&full("once"), T, "Succeeded", |p| phase(p) == "Succeeded");
        let c = container_status(&p, "c").unwrap();
        assert_eq!(c["state"]["terminated"]["exitCode"], 0, "{gates}: {c}");
        assert_eq!(c["restartCount"], 0, "{gates}");
        let log = k.log();
        let pushed = log.contains("evented PLEG event");
        assert_eq!(
            pushed,
            gates.ends_with("true"),
            "{gates}: evented events in the log: {pushed}\n{log}"
        );
        let (_, metrics) = k.get("/metrics");
        assert!(
            metrics.contains("kubelet_pleg_relist_duration_seconds_count"),
            "{metrics}"
        );
        // One pod, one container, each made once: what the kubelet asked of the runtime.
        for op in ["run_podsandbox", "create_container", "start_container"] {
            let line = format!("kubelet_runtime_operations_total{{operation_type=\"{op}\"}} 1\n");
            assert!(
                metrics.contains(&line),
                "{gates}: no {line:?} in\n{metrics}"
            );
        }
        assert!(
            metrics.contains(
                "kubelet_runtime_operations_duration_seconds_count{operation_type=\"container_status\"}"
            ),
            "{gates}: {metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gone_runtime_makes_the_kubelet_unhealthy_with_the_reason() {
    if !common::have_root() {
        return;
    }
    let (mut node, k) = node_and_kubelet("10.88.12.0/24", &["--pleg-relist-threshold", "2s"]);
    assert_eq!(k.healthz(), (200, "ok".to_string()));
    node.rt.kill();
    let deadline = Instant::now() + T;
    let body = loop {
        let (code, body) = k.healthz();
        if code == 500 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "still healthy without a runtime\n{}",
            k.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        body.contains("[-]pleg failed: PLEG is not healthy: pleg was last seen active"),
        "{body}"
    );
    assert!(body.contains("threshold is 2s"), "{body}");
    assert!(body.contains("last relist error"), "{body}");
    node.rt.start_again();
    let deadline = Instant::now() + T;
    while k.healthz().0 != 200 {
        assert!(
            Instant::now() < deadline,
            "not healthy again after the runtime came back\n{}",
            k.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn volumes_sidecars_restart_never_and_active_deadline() {
    if !common::have_root() {
        return;
    }
    let (node, k) = node_and_kubelet("10.88.13.0/24", &[]);
    let host = tempfile::tempdir().unwrap();
    let created = host.path().join("made/by/kubelet");
    k.write_manifest(
        "vols.yaml",
        &pod_yaml(
            "vols",
            &format!(
                r#"  initContainers:
  - name: sidecar
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    restartPolicy: Always
    command: ["sh", "-c", "exec sleep 3600"]
  containers:
  - name: c
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "echo hi > /host/file; exec sleep 3600"]
    volumeMounts:
    - {{name: mem, mountPath: /cache}}
    - {{name: host, mountPath: /host}}
  volumes:
  - name: mem
    emptyDir: {{medium: Memory, sizeLimit: 16Mi}}
  - name: host
    hostPath: {{path: {}, type: DirectoryOrCreate}}
"#,
                created.display()
            ),
        ),
    );
    let p = k.wait_pod(&full("vols"), T, "running with its sidecar", |p| {
        is_running(p, "c")
            && p["status"]["initContainerStatuses"][0]["state"]["running"].is_object()
    });
    assert_eq!(phase(&p), "Running");
    assert_eq!(condition(&p, "Initialized"), Some("True"));
    let deadline = Instant::now() + T;
    while !created.join("file").exists() {
        assert!(Instant::now() < deadline, "hostPath not written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mounts = exec(
        &node.rt.endpoint(),
        &p,
        "c",
        &["grep", " /cache ", "/proc/mounts"],
    )
    .await;
    assert!(mounts.starts_with("tmpfs /cache tmpfs"), "{mounts}");
    assert!(mounts.contains("size=16384k"), "{mounts}");

    // restartPolicy Never: a failed container fails the pod, and is not restarted.
    k.write_manifest(
        "never.yaml",
        &pod_yaml(
            "never",
            "  restartPolicy: Never\n  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", \"exit 7\"]\n",
        ),
    );
    let p = k.wait_pod(&full("never"), T, "Failed", |p| phase(p) == "Failed");
    assert_eq!(
        container_status(&p, "c").unwrap()["state"]["terminated"]["exitCode"],
        7
    );
    assert_eq!(restarts(&p, "c"), 0);

    // activeDeadlineSeconds: the kubelet stops the pod and fails it.
    k.write_manifest(
        "deadline.yaml",
        &pod_yaml(
            "deadline",
            "  activeDeadlineSeconds: 2\n  containers:\n  - name: c\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sleep\", \"3600\"]\n",
        ),
    );
    let p = k.wait_pod(&full("deadline"), T, "DeadlineExceeded", |p| {
        p["status"]["reason"] == "DeadlineExceeded"
    });
    assert_eq!(phase(&p), "Failed");
    assert_eq!(
        p["status"]["message"],
        "Pod was active on the node longer than the specified deadline"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bounded_pod_starts_all_run_and_a_waiting_post_start_hook_gives_its_place_up() {
    if !common::have_root() {
        return;
    }
    let (_node, k) = node_and_kubelet("10.88.14.0/24", &["--max-parallel-pod-starts", "1"]);
    let out = tempfile::tempdir().unwrap();
    let hook = hook_pod_body(
        out.path(),
        r#"      postStart:
        exec: {command: ["sh", "-c", "touch /out/hook-started; until [ -e /out/go ]; do sleep 0.1; done"]}
"#,
    );
    // The hook may wait as long as the grace period (its timeout), longer than the test.
    k.write_manifest(
        "hook.yaml",
        &pod_yaml("hook", &hook).replace(
            "terminationGracePeriodSeconds: 2",
            "terminationGracePeriodSeconds: 300",
        ),
    );
    wait_for_file(
        &k,
        &out.path().join("hook-started"),
        "the postStart hook did not start",
    )
    .await;
    // The only place is the hook pod's until its hook began: these start while it waits,
    // one after the other.
    for name in ["one", "two", "three"] {
        k.write_manifest(
            &format!("{name}.yaml"),
            &pod_yaml(
                name,
                r#"  containers:
  - name: c
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "exec sleep 3600"]
"#,
            ),
        );
    }
    for name in ["one", "two", "three"] {
        k.wait_pod(
            &full(name),
            T,
            "running while another pod's hook waits",
            |p| is_running(p, "c"),
        );
    }
    std::fs::write(out.path().join("go"), "").unwrap();
    let p = k.wait_pod(&full("hook"), T, "ready once its hook returned", |p| {
        condition(p, "Ready") == Some("True")
    });
    assert_eq!(restarts(&p, "c"), 0, "the hook never failed: {p}");
}
