//! A node of an HA control plane: two `nodus control-plane` processes on one etcd (Debian's,
//! in the control plane's network namespace) at two addresses, and a real `nodus node` in a
//! namespace of its own given both (`--server https://A:6443,https://B:6443`). It reaches
//! them through its local API server load balancer (127.0.0.1:6444, as k3s's agent does).
//! When the server it is connected to is killed (SIGKILL by PID), the node keeps renewing
//! its Lease through the other one, stays Ready, and its pod keeps running untouched.

mod common;

use common::cluster::{self, ControlPlane, NodeOptions, NodeProcess};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CP1_IP: &str = "10.99.93.1";
const CP2_IP: &str = "10.99.93.3";
const NODE_IP: &str = "10.99.93.2";
const ETCD: &str = "http://127.0.0.1:23790";
const T: Duration = Duration::from_secs(90);

/// Etcd inside `netns` on fixed ports (the namespace is the test's own).
struct Etcd {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Etcd {
    fn start(netns: &testkit::Netns) -> Etcd {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log");
        let child = netns
            .command("etcd")
            .expect("command in netns")
            .arg("--name=ha")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={ETCD}"))
            .arg(format!("--advertise-client-urls={ETCD}"))
            .arg("--listen-peer-urls=http://127.0.0.1:23800")
            .arg("--initial-advertise-peer-urls=http://127.0.0.1:23800")
            .arg("--initial-cluster=ha=http://127.0.0.1:23800")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("etcd starts (Debian's etcd-server)");
        let addr = "127.0.0.1:23790".parse().expect("addr");
        let deadline = Instant::now() + Duration::from_secs(30);
        while netns.connect_tcp(addr).is_err() {
            assert!(Instant::now() < deadline, "etcd did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Etcd { child, _dir: dir }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn renew_time(lease: &Value) -> String {
    lease["spec"]["renewTime"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[test]
fn a_node_with_two_api_servers_keeps_its_lease_and_pods_when_one_dies() {
    if !common::have_root() {
        return;
    }
    let cp_ns = Arc::new(testkit::Netns::new("nodus-hacp").expect("netns"));
    let node_ns = Arc::new(testkit::Netns::new("nodus-hanode").expect("netns"));
    cluster::link_namespaces(&cp_ns, CP1_IP, &node_ns, NODE_IP);
    let out = cp_ns
        .run(
            "ip",
            &["addr", "add", &format!("{CP2_IP}/24"), "dev", "peer0"],
        )
        .expect("ip");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cgroup = testkit::CgroupParent::new("nodus-hanode");
    cgroup.create();
    let _etcd = Etcd::start(&cp_ns);
    // The node is only ever judged by the survivor's controllers; keep its grace long so
    // the test sees the kubelet's own renewals, not a controller's verdict.
    let flags = ["--etcd-servers", ETCD, "--node-monitor-grace-period", "40s"];
    let mut cp1 = ControlPlane::start_bound(cp_ns.clone(), CP1_IP.parse().expect("ip"), &flags);
    let cp2 = cp1.start_peer(CP2_IP.parse().expect("ip"), &flags);

    let servers = format!(
        "https://{CP1_IP}:{p},https://{CP2_IP}:{p}",
        p = cluster::API_PORT
    );
    let node = NodeProcess::start_opts(
        &node_ns,
        &cp1,
        "ha-node",
        &cgroup.path(),
        &NodeOptions {
            subnet: Some("10.99.94.0/24"),
            extra: &["--server", &servers],
        },
    );
    let logs = || format!("--- node:\n{}\n--- cp1:\n{}", node.log(), cp1.log());
    let ready = |n: &Value| cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True");
    cp2.wait_json(&["node", "ha-node"], T, "ha-node Ready", &logs, ready);
    let kc = std::fs::read_to_string(node.dir.path().join("data/kubelet/apiserver-lb.kubeconfig"))
        .expect("the node's load-balanced kubeconfig");
    assert!(kc.contains("server: https://127.0.0.1:6444"), "{kc}");

    cp2.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: steady\n  namespace: default\nspec:\n  nodeName: ha-node\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n",
    );
    let running = |p: &Value| p["status"]["phase"] == "Running";
    let pod = cp2.wait_json(&["pod", "steady"], T, "pod Running", &logs, running);
    let container_id = pod["status"]["containerStatuses"][0]["containerID"].clone();

    // Everything the node does goes through the first server until it dies.
    let before = renew_time(&cp2.wait_json(
        &["lease", "-n", "kube-node-lease", "ha-node"],
        T,
        "the node's Lease",
        &logs,
        |l| !renew_time(l).is_empty(),
    ));
    cp1.kill();

    // Two renewals after the kill: the kubelet reconnected through the balancer.
    let mut seen = vec![before.clone()];
    let deadline = Instant::now() + T;
    while seen.len() < 3 {
        assert!(
            Instant::now() < deadline,
            "the Lease was not renewed twice after the kill: {seen:?}\n{}",
            node.log()
        );
        if let Some(l) = cp2.get_json(&["lease", "-n", "kube-node-lease", "ha-node"]) {
            let t = renew_time(&l);
            if seen.last() != Some(&t) {
                seen.push(t);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let n = cp2.get_json(&["node", "ha-node"]).expect("node");
    assert!(ready(&n), "the node is not Ready after the switch: {n}");
    let pod = cp2.get_json(&["pod", "steady"]).expect("pod");
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    let cs = &pod["status"]["containerStatuses"][0];
    assert_eq!(
        cs["containerID"], container_id,
        "the container was replaced: {pod}"
    );
    assert_eq!(cs["restartCount"], 0, "{pod}");
    let log = std::fs::read_to_string(node.dir.path().join("node.log")).unwrap_or_default();
    assert!(
        log.contains("API server load balancer: switching server"),
        "no switch logged:\n{}",
        node.log()
    );
}
