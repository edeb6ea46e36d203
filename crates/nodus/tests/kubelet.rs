//! The kubelet's sync engine end to end: static pods from a manifest directory run on a
//! real runtime (nodus's own here; containerd in kubelet_containerd.rs), in a private
//! network namespace, and their status is read back from the kubelet as a user would.

mod common;

use common::BareNode;
use common::kubelet::{Kubelet, NODE_NAME, condition, container_status, is_running, phase};
use serde_json::Value;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn node_and_kubelet(subnet: &str, extra: &[&str]) -> (BareNode, Kubelet) {
    let node = BareNode::new(subnet);
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
