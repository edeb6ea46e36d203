//! The same kubelet on containerd: a CRI runtime nodus did not write, started by the test
//! on a private socket in a private network namespace.

mod common;

use common::kubelet::{Kubelet, NODE_NAME, container_status, is_running, phase};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::{CgroupParent, Containerd, Netns};

const T: Duration = Duration::from_secs(90);

struct Node {
    // Dropped first: the kubelet, then containerd, then the namespace and directories.
    k: Kubelet,
    ctrd: Containerd,
    _cgroup: CgroupParent,
    _base: tempfile::TempDir,
    _netns: Arc<Netns>,
}

fn start(subnet: &str, extra: &[&str]) -> Node {
    let netns = Arc::new(Netns::new("kubelet-ctrd").unwrap());
    let base = tempfile::tempdir().unwrap();
    let ctrd = common::node::start_containerd(&netns, base.path(), subnet);
    let cgroup = CgroupParent::new("kubelet-ctrd");
    cgroup.create();
    let k = Kubelet::start(Arc::clone(&netns), &ctrd.endpoint(), &cgroup.path(), extra);
    Node {
        k,
        ctrd,
        _cgroup: cgroup,
        _base: base,
        _netns: netns,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn static_pods_run_restart_and_go_on_containerd() {
    if !common::have_root() {
        return;
    }
    // EventedPLEG on: containerd 1.6 lacks GetContainerEvents, so the kubelet must fall
    // back to relisting and still see every transition.
    let n = start("10.89.1.0/24", &["--feature-gates", "EventedPLEG=true"]);
    let k = &n.k;
    k.write_manifest(
        "web.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n  - name: crash\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"exit 2\"]\n",
    );
    let name = format!("web-{NODE_NAME}");
    let p = k.wait_pod(&name, T, "main running, crash restarted", |p| {
        is_running(p, "main")
            && container_status(p, "crash").is_some_and(|c| c["restartCount"].as_i64() >= Some(1))
    });
    assert_eq!(phase(&p), "Running");
    let main = container_status(&p, "main").unwrap();
    assert!(
        main["containerID"]
            .as_str()
            .unwrap()
            .starts_with("containerd://"),
        "{main}"
    );
    assert!(
        p["status"]["podIP"]
            .as_str()
            .unwrap()
            .starts_with("10.89.1."),
        "{p}"
    );
    assert_eq!(
        container_status(&p, "crash").unwrap()["lastState"]["terminated"]["exitCode"],
        2
    );
    assert!(
        k.log().contains("does not implement GetContainerEvents") || k.log().contains("relisting"),
        "{}",
        k.log()
    );

    k.remove_manifest("web.yaml");
    k.wait_gone(&name, T);
    let deadline = Instant::now() + T;
    loop {
        let out = n
            .ctrd
            .ctr_output(["-n", "k8s.io", "containers", "ls", "-q"])
            .unwrap_or_default();
        if out.trim().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "containerd still has containers: {out}\n{}",
            k.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
