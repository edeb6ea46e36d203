//! The kubelet joined to a control plane, end to end and seen through real kubectl: the
//! lesson's node flow (register → watch → reconcile via CRI → report status → stay alive).
//! The control plane, the runtime and the kubelet share a private network namespace.

mod common;

use common::BareNode;
use common::cluster::{self, ControlPlane, NODE_IP, condition, events_for};
use common::kubelet::{Kubelet, NODE_NAME};
use serde_json::Value;
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

fn str_of<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

fn quantity_bytes(q: &str) -> i64 {
    let (num, mult) = if let Some(n) = q.strip_suffix("Ki") {
        (n, 1024)
    } else if let Some(n) = q.strip_suffix("Mi") {
        (n, 1024 * 1024)
    } else if let Some(n) = q.strip_suffix("Gi") {
        (n, 1024 * 1024 * 1024)
    } else {
        (q, 1)
    };
    num.parse::<i64>().expect("an integer quantity") * mult
}

const WEB: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: default
spec:
  nodeName: test-node
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
"#;

const SICK: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: sick
  namespace: default
spec:
  nodeName: test-node
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    livenessProbe:
      exec: {command: ["false"]}
      periodSeconds: 1
      failureThreshold: 1
"#;

/// A readiness probe whose output differs at every failure (the uptime), so each Unhealthy
/// event has a message of its own.
const FLAKY: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: flaky
  namespace: default
spec:
  nodeName: test-node
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    readinessProbe:
      exec: {command: ["sh", "-c", "cat /proc/uptime; exit 1"]}
      periodSeconds: 1
"#;

const HUGE: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: huge
  namespace: default
spec:
  nodeName: test-node
  containers:
  - name: main
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    resources:
      requests: {cpu: "1000"}
"#;

const STATIC: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: static-web
  namespace: default
spec:
  containers:
  - name: main
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#;

struct Cluster {
    // Dropped in this order: kubelet, control plane, then the node (runtime, netns).
    kubelet: Kubelet,
    cp: ControlPlane,
    node: BareNode,
}

impl Cluster {
    fn start(subnet: &str) -> Cluster {
        let node = BareNode::new(subnet);
        node.cgroup.create();
        cluster::add_node_address(&node.netns);
        let cp = ControlPlane::start(node.netns.clone());
        let kubeconfig = cp.node_kubeconfig(NODE_NAME);
        let kc = kubeconfig.display().to_string();
        let kubelet = Kubelet::start(
            node.netns.clone(),
            &node.rt.endpoint(),
            &node.cgroup.path(),
            &[
                "--kubeconfig",
                &kc,
                "--node-labels",
                "nodus.test/role=worker",
                "--register-with-taints",
                "nodus.test/dedicated=yes:PreferNoSchedule",
                "--node-lease-duration-seconds",
                "8",
                "--node-status-update-frequency",
                "2s",
            ],
        );
        Cluster { kubelet, cp, node }
    }

    fn logs(&self) -> String {
        format!("kubelet log:\n{}", self.kubelet.log())
    }

    fn wait(&self, args: &[&str], what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.cp.wait_json(args, T, what, &|| self.logs(), pred)
    }

    fn running_containers(&self, pod: &str) -> usize {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let c = self.node.rt.clients().await;
            c.runtime
                .clone()
                .list_containers(cri::runtime::v1::ListContainersRequest {
                    filter: Some(cri::runtime::v1::ContainerFilter {
                        state: Some(cri::runtime::v1::ContainerStateValue {
                            state: cri::runtime::v1::ContainerState::ContainerRunning as i32,
                        }),
                        label_selector: [("io.kubernetes.pod.name".to_string(), pod.to_string())]
                            .into(),
                        ..Default::default()
                    }),
                })
                .await
                .unwrap()
                .into_inner()
                .containers
                .len()
        })
    }
}

fn is_ready(node: &Value) -> bool {
    condition(node, "Ready").is_some_and(|c| c["status"] == "True")
}

#[test]
fn kubelet_registers_heartbeats_and_runs_api_pods() {
    if !common::have_root() {
        return;
    }
    let c = Cluster::start("10.99.60.0/24");

    // Registration: the node is Ready, labelled, tainted, sized and described.
    let node = c.wait(&["node", NODE_NAME], "node Ready", is_ready);
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready["reason"], "KubeletReady");
    assert_eq!(ready["message"], "kubelet is posting ready status");
    for (t, reason) in [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
    ] {
        let cond = condition(&node, t).unwrap_or_else(|| panic!("{t} condition: {node}"));
        assert_eq!(
            (cond["status"].as_str(), cond["reason"].as_str()),
            (Some("False"), Some(reason))
        );
    }
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], NODE_NAME);
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert!(
        labels["kubernetes.io/arch"]
            .as_str()
            .is_some_and(|a| !a.is_empty())
    );
    assert_eq!(labels["nodus.test/role"], "worker");
    let taints = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t["key"] == "nodus.test/dedicated" && t["effect"] == "PreferNoSchedule"),
        "{taints:?}"
    );
    let st = &node["status"];
    let addrs = st["addresses"].as_array().cloned().unwrap_or_default();
    assert!(
        addrs
            .iter()
            .any(|a| a["type"] == "InternalIP" && a["address"] == NODE_IP),
        "{addrs:?}"
    );
    assert!(
        addrs
            .iter()
            .any(|a| a["type"] == "Hostname" && a["address"] == NODE_NAME),
        "{addrs:?}"
    );
    let cpus = std::thread::available_parallelism()
        .unwrap()
        .get()
        .to_string();
    assert_eq!(str_of(st, "/capacity/cpu"), cpus);
    assert_eq!(str_of(st, "/capacity/pods"), "110");
    let cap_mem = quantity_bytes(str_of(st, "/capacity/memory"));
    let alloc_mem = quantity_bytes(str_of(st, "/allocatable/memory"));
    assert!(
        alloc_mem < cap_mem,
        "allocatable {alloc_mem} < capacity {cap_mem}"
    );
    let info = &st["nodeInfo"];
    assert!(
        str_of(info, "/containerRuntimeVersion").starts_with("nodus://"),
        "{info}"
    );
    assert_eq!(str_of(info, "/kubeletVersion"), "v1.33.0+nodus");
    assert_eq!(str_of(info, "/operatingSystem"), "linux");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(str_of(info, "/bootID"), boot.trim());
    assert!(!str_of(info, "/osImage").is_empty());
    assert!(!str_of(info, "/kernelVersion").is_empty());
    assert_eq!(st["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
    let images = st["images"].as_array().cloned().unwrap_or_default();
    assert!(
        images
            .iter()
            .any(|i| i["names"].as_array().is_some_and(|n| n
                .iter()
                .any(|x| x.as_str().is_some_and(|s| s.contains("busybox"))))),
        "{images:?}"
    );
    let (ok, wide, err) = c.cp.kubectl(&["get", "nodes", "-o", "wide"]);
    assert!(ok, "{err}");
    assert!(
        wide.contains(NODE_NAME) && wide.contains("Ready") && wide.contains("nodus://"),
        "{wide}"
    );

    // The Lease: held by the node, owned by the Node, renewed.
    let node_uid = str_of(&node, "/metadata/uid").to_string();
    let lease = c.wait(
        &["lease", "-n", "kube-node-lease", NODE_NAME],
        "lease",
        |l| l["metadata"]["ownerReferences"].is_array(),
    );
    assert_eq!(lease["spec"]["holderIdentity"], NODE_NAME);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 8);
    let owner = &lease["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("Node"), Some(NODE_NAME))
    );
    assert_eq!(owner["uid"], node_uid.as_str());
    let first = str_of(&lease, "/spec/renewTime").to_string();
    c.wait(
        &["lease", "-n", "kube-node-lease", NODE_NAME],
        "lease renewal",
        |l| str_of(l, "/spec/renewTime") != first,
    );

    // A pod bound to the node runs, and its status reaches the API.
    c.cp.apply(WEB);
    let pod = c.wait(&["pod", "web"], "pod web Running", |p| {
        p["status"]["phase"] == "Running"
            && condition(p, "Ready").is_some_and(|r| r["status"] == "True")
    });
    assert!(!str_of(&pod, "/status/podIP").is_empty(), "{pod}");
    assert!(
        str_of(&pod, "/status/podIP").starts_with("10.99.60."),
        "{pod}"
    );
    assert_eq!(str_of(&pod, "/status/hostIP"), NODE_IP);
    let cs = &pod["status"]["containerStatuses"][0];
    assert_eq!(cs["name"], "main");
    assert!(cs["state"]["running"].is_object(), "{cs}");
    assert!(str_of(cs, "/containerID").starts_with("nodus://"), "{cs}");
    assert_eq!(pod["status"]["qosClass"], "BestEffort");
    assert_eq!(c.running_containers("web"), 1);

    // Events from the pod's lifecycle (Scheduled is the scheduler's, not the kubelet's).
    let logs = || c.logs();
    let ev =
        c.cp.wait_events(("default", "web"), T, "pod events", &logs, |ev| {
            ["Pulled", "Created", "Started"]
                .iter()
                .all(|r| ev.iter().any(|e| e.reason == *r))
        });
    assert!(
        ev.iter()
            .any(|e| e.reason == "Started" && e.message == "Started container main"),
        "{ev:?}"
    );
    let node_events = events_for(&c.cp, "default", NODE_NAME);
    for r in ["Starting", "NodeReady", "NodeHasSufficientMemory"] {
        assert!(
            node_events.iter().any(|(x, _)| x == r),
            "{r} in {node_events:?}"
        );
    }
    let (ok, table, _) = c.cp.kubectl(&["get", "events", "-n", "default"]);
    assert!(
        ok && table.contains("Started") && table.contains("pod/web"),
        "{table}"
    );

    // Graceful deletion: kubectl waits until the kubelet stopped the containers and
    // removed the pod for good.
    let (ok, out, err) = c.cp.kubectl(&["delete", "pod", "web", "--timeout=60s"]);
    assert!(ok, "kubectl delete: {out}{err}\n{}", c.logs());
    assert!(
        c.cp.get_json(&["pod", "web"]).is_none(),
        "pod still in the API"
    );
    assert_eq!(c.running_containers("web"), 0);
    let ev = events_for(&c.cp, "default", "web");
    assert!(
        ev.iter()
            .any(|(r, m)| r == "Killing" && m == "Stopping container main"),
        "{ev:?}"
    );

    // A failing liveness probe: Unhealthy, then Killing with upstream's reason.
    c.cp.apply(SICK);
    c.cp.wait_events(("default", "sick"), T, "liveness events", &logs, |ev| {
        let unhealthy = ev
            .iter()
            .any(|e| e.reason == "Unhealthy" && e.message.starts_with("Liveness probe failed"));
        let killing = ev.iter().any(|e| {
            e.reason == "Killing"
                && e.message == "Container main failed liveness probe, will be restarted"
        });
        unhealthy && killing
    });

    // Ten different messages of one reason on one pod are combined, as upstream's
    // EventCorrelator does: nine Unhealthy Events, then one "(combined from similar
    // events)" Event whose count goes up, and never an eleventh.
    c.cp.apply(FLAKY);
    c.cp.wait_events(("default", "flaky"), T, "readiness events", &logs, |ev| {
        let unhealthy: Vec<_> = ev.iter().filter(|e| e.reason == "Unhealthy").collect();
        assert!(unhealthy.len() <= 10, "{unhealthy:#?}");
        let combined: Vec<_> = unhealthy
            .iter()
            .filter(|e| {
                e.message
                    .starts_with("(combined from similar events): Readiness probe failed: ")
            })
            .collect();
        if !combined.iter().any(|e| e.count >= 2) {
            return false;
        }
        assert_eq!(combined.len(), 1, "{unhealthy:#?}");
        let plain = unhealthy
            .iter()
            .filter(|e| e.message.starts_with("Readiness probe failed: "))
            .count();
        assert_eq!(plain, 9, "{unhealthy:#?}");
        true
    });

    // A pod the node cannot admit fails with upstream's reason.
    c.cp.apply(HUGE);
    let huge = c.wait(&["pod", "huge"], "pod huge Failed", |p| {
        p["status"]["phase"] == "Failed"
    });
    assert_eq!(huge["status"]["reason"], "OutOfcpu", "{huge}");
    assert!(
        str_of(&huge, "/status/message")
            .starts_with("Pod was rejected: Node didn't have enough resource: cpu"),
        "{huge}"
    );
    assert_eq!(c.running_containers("huge"), 0);

    // A static pod shows up as a mirror pod owned by the Node, and comes back when deleted.
    c.kubelet.write_manifest("static-web.yaml", STATIC);
    let mirror_name = format!("static-web-{NODE_NAME}");
    let mirror = c.wait(&["pod", &mirror_name], "mirror pod Running", |p| {
        p["status"]["phase"] == "Running"
    });
    let hash = str_of(
        &mirror,
        "/metadata/annotations/kubernetes.io~1config.mirror",
    );
    assert!(!hash.is_empty(), "{mirror}");
    assert_eq!(
        str_of(&mirror, "/metadata/annotations/kubernetes.io~1config.hash"),
        hash
    );
    let owner = &mirror["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("Node"), Some(NODE_NAME))
    );
    assert_eq!(owner["controller"], true);
    assert_eq!(owner["uid"], node_uid.as_str());
    let old_uid = str_of(&mirror, "/metadata/uid").to_string();
    // --wait=false: kubectl's wait for the deletion occasionally never ends when the
    // kubelet recreates the mirror at once (seen 1 run in ~8; see the report to the lead).
    let (ok, out, err) =
        c.cp.kubectl(&["delete", "pod", &mirror_name, "--wait=false"]);
    assert!(ok, "kubectl delete mirror: {out}{err}");
    c.wait(&["pod", &mirror_name], "mirror pod recreated", |p| {
        str_of(p, "/metadata/uid") != old_uid && p["status"]["phase"] == "Running"
    });
    // Deleting the mirror never stops the static pod itself.
    assert_eq!(c.running_containers(&mirror_name), 1);

    // A changed manifest is a new static pod: its mirror is replaced.
    let old_hash = hash.to_string();
    c.kubelet
        .write_manifest("static-web.yaml", &STATIC.replace("\"3600\"", "\"3601\""));
    let replaced = c.wait(&["pod", &mirror_name], "mirror pod replaced", |p| {
        let h = str_of(p, "/metadata/annotations/kubernetes.io~1config.mirror");
        !h.is_empty() && h != old_hash && p["status"]["phase"] == "Running"
    });
    assert_eq!(
        replaced["spec"]["containers"][0]["command"][1], "3601",
        "{replaced}"
    );
}

#[test]
fn node_not_ready_when_the_runtime_stops() {
    if !common::have_root() {
        return;
    }
    let mut c = Cluster::start("10.99.61.0/24");
    c.wait(&["node", NODE_NAME], "node Ready", is_ready);
    c.node.rt.kill();
    let node = c.wait(&["node", NODE_NAME], "node NotReady", |n| {
        condition(n, "Ready").is_some_and(|r| r["status"] == "False")
    });
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready["reason"], "KubeletNotReady");
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("container runtime is down")),
        "{ready}"
    );
    // The Lease keeps being renewed: the kubelet is alive, only its runtime is not.
    let lease =
        c.cp.get_json(&["lease", "-n", "kube-node-lease", NODE_NAME])
            .unwrap();
    let before = str_of(&lease, "/spec/renewTime").to_string();
    c.wait(
        &["lease", "-n", "kube-node-lease", NODE_NAME],
        "lease renewal",
        |l| str_of(l, "/spec/renewTime") != before,
    );
    c.node.rt.start_again();
    c.wait(&["node", NODE_NAME], "node Ready again", is_ready);
    let ev = events_for(&c.cp, "default", NODE_NAME);
    assert!(ev.iter().any(|(r, _)| r == "NodeNotReady"), "{ev:?}");
}

/// `nodus node --control-plane-data-dir`: the runtime and the kubelet in one process join
/// the control plane with credentials issued from its CA, and run a pod bound to them.
#[test]
fn nodus_node_joins_and_runs_pods() {
    if !common::have_root() {
        return;
    }
    let netns = std::sync::Arc::new(testkit::Netns::new("nodus-node").expect("netns"));
    let cgroup = testkit::CgroupParent::new("nodus-test");
    cgroup.create();
    cluster::add_node_address(&netns);
    let cp = ControlPlane::start(netns.clone());
    let node = cluster::NodeProcess::start(&netns, &cp, "node-b", "10.99.62.0/24", &cgroup.path());
    let logs = || format!("node log:\n{}", node.log());
    let n = cp.wait_json(&["node", "node-b"], T, "node-b Ready", &logs, is_ready);
    assert!(
        str_of(&n, "/status/nodeInfo/containerRuntimeVersion").starts_with("nodus://"),
        "{n}"
    );
    assert!(cp.data_dir().join("nodes/node-b.kubeconfig").exists());
    cp.apply(&WEB.replace("nodeName: test-node", "nodeName: node-b"));
    let pod = cp.wait_json(
        &["pod", "web"],
        T,
        "pod web Running on node-b",
        &logs,
        |p| p["status"]["phase"] == "Running",
    );
    assert!(
        str_of(&pod, "/status/podIP").starts_with("10.99.62."),
        "{pod}"
    );
    // 10,000 idle sockets against the kubelet API (as a client that never finishes its TLS
    // handshake would open them): the kubelet's connection limit and handshake timeout keep
    // it answering, `kubectl exec` through it works, and the node stays Ready.
    let nofile = nodus_serving::rlimit::raise_nofile_limit().expect("raise RLIMIT_NOFILE");
    assert!(
        nofile >= 12_000,
        "the test needs 12000 open files, the hard limit is {nofile}"
    );
    let kubelet_api: std::net::SocketAddr = format!("{NODE_IP}:10250").parse().unwrap();
    let lease = |l: &Value| l.pointer("/spec/renewTime").cloned().unwrap_or_default();
    let before = cp
        .get_json(&["lease", "-n", "kube-node-lease", "node-b"])
        .map(|l| lease(&l))
        .unwrap_or_default();
    let idle: Vec<std::net::TcpStream> = (0..10_000)
        .map(|i| {
            netns
                .connect_tcp(kubelet_api)
                .unwrap_or_else(|e| panic!("idle socket {i}: {e}"))
        })
        .collect();
    let (ok, out, err) = cp.kubectl(&["exec", "web", "--", "echo", "still serving"]);
    assert!(
        ok && out.trim() == "still serving",
        "kubectl exec with 10000 idle sockets open: {out}{err}\n{}",
        logs()
    );
    assert_eq!(
        netns.http_get(10248, "/healthz").map(|(c, _)| c).ok(),
        Some(200),
        "kubelet healthz"
    );
    cp.wait_json(
        &["lease", "-n", "kube-node-lease", "node-b"],
        T,
        "node-b's Lease renewed with idle sockets open",
        &logs,
        |l| lease(l) != before,
    );
    let n = cp
        .get_json(&["node", "node-b"])
        .expect("node-b with idle sockets open");
    assert!(is_ready(&n), "node-b not Ready with idle sockets open: {n}");
    drop(idle);
    let (ok, out, err) = cp.kubectl(&["delete", "pod", "web", "--timeout=60s"]);
    assert!(ok, "kubectl delete: {out}{err}\n{}", logs());
    drop(node);
    drop(cp);
    drop(cgroup);
}

const WAITER: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: waiter
  namespace: default
spec:
  nodeName: test-node
  restartPolicy: Never
  containers:
  - name: main
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    # The pause after the loop: the exec that creates /tmp/stop must have exited before the
    # container's init does, or the end of its PID namespace kills it (exit 137).
    command: ["sh", "-c", "while [ ! -f /tmp/stop ]; do sleep 0.2; done; sleep 1"]
"#;

/// With the API server down, pods keep running and the kubelet keeps working; when it is
/// back, the status that changed meanwhile arrives and the Lease is renewed again.
#[test]
fn api_server_outage_loses_no_status() {
    if !common::have_root() {
        return;
    }
    let mut c = Cluster::start("10.99.63.0/24");
    c.wait(&["node", NODE_NAME], "node Ready", is_ready);
    c.cp.apply(WEB);
    c.cp.apply(WAITER);
    for p in ["web", "waiter"] {
        c.wait(&["pod", p], "pod Running", |v| {
            v["status"]["phase"] == "Running"
        });
    }
    c.cp.stop();
    // While the API server is away, the waiter's container finishes.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cl = c.node.rt.clients().await;
        let list = cl
            .runtime
            .clone()
            .list_containers(cri::runtime::v1::ListContainersRequest {
                filter: Some(cri::runtime::v1::ContainerFilter {
                    label_selector: [("io.kubernetes.pod.name".to_string(), "waiter".to_string())]
                        .into(),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .containers;
        assert_eq!(list.len(), 1, "{list:?}");
        let out = cl
            .runtime
            .clone()
            .exec_sync(cri::runtime::v1::ExecSyncRequest {
                container_id: list[0].id.clone(),
                cmd: vec!["touch".into(), "/tmp/stop".into()],
                timeout: 10,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(out.exit_code, 0);
    });
    let deadline = std::time::Instant::now() + T;
    while c.running_containers("waiter") != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "waiter still running\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The kubelet is still serving and its pods still run.
    let (code, _) = c.kubelet.healthz();
    assert_eq!(code, 200);
    assert_eq!(c.running_containers("web"), 1);
    c.cp.start_again();
    let waiter = c.wait(
        &["pod", "waiter"],
        "waiter Succeeded after the outage",
        |p| p["status"]["phase"] == "Succeeded",
    );
    let cs = &waiter["status"]["containerStatuses"][0];
    assert_eq!(cs["state"]["terminated"]["exitCode"], 0, "{cs}");
    let lease =
        c.cp.get_json(&["lease", "-n", "kube-node-lease", NODE_NAME])
            .unwrap();
    let before = str_of(&lease, "/spec/renewTime").to_string();
    c.wait(
        &["lease", "-n", "kube-node-lease", NODE_NAME],
        "lease renewed after the outage",
        |l| str_of(l, "/spec/renewTime") != before,
    );
    c.wait(
        &["node", NODE_NAME],
        "node Ready after the outage",
        is_ready,
    );
    c.wait(&["pod", "web"], "web still Running", |p| {
        p["status"]["phase"] == "Running"
    });
}

/// Containers of pod `pod` in any state (created, running, exited).
fn all_containers(c: &Cluster, pod: &str) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cl = c.node.rt.clients().await;
        cl.runtime
            .clone()
            .list_containers(cri::runtime::v1::ListContainersRequest {
                filter: Some(cri::runtime::v1::ContainerFilter {
                    label_selector: [("io.kubernetes.pod.name".to_string(), pod.to_string())]
                        .into(),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .containers
            .len()
    })
}

/// A pod deleted while its kubelet is down is, once the kubelet is back, stopped and
/// removed from the API (upstream's pod workers take a pod first seen with a deletion
/// timestamp straight to terminating; the status manager then deletes it); a pod deleted
/// before the kubelet ever started it is never started.
#[test]
fn pods_deleted_while_the_kubelet_is_down_are_stopped_not_started() {
    if !common::have_root() {
        return;
    }
    let mut c = Cluster::start("10.99.65.0/24");
    c.wait(&["node", NODE_NAME], "node Ready", is_ready);
    c.cp.apply(WEB);
    c.wait(&["pod", "web"], "web Running", |p| {
        p["status"]["phase"] == "Running"
    });
    assert_eq!(c.running_containers("web"), 1);

    c.kubelet.kill();
    // The runtime keeps the container running while the kubelet is away.
    assert_eq!(c.running_containers("web"), 1);
    let (ok, out, err) = c.cp.kubectl(&["delete", "pod", "web", "--wait=false"]);
    assert!(ok, "{out}{err}");
    // Bound to the node, but the kubelet never saw it before its deletion.
    c.cp.apply(&WEB.replace("name: web", "name: late"));
    let (ok, out, err) = c.cp.kubectl(&["delete", "pod", "late", "--wait=false"]);
    assert!(ok, "{out}{err}");
    for p in ["web", "late"] {
        let pod =
            c.cp.get_json(&["pod", p])
                .expect("still in the API, terminating");
        assert!(pod["metadata"]["deletionTimestamp"].is_string(), "{pod}");
    }

    c.kubelet.start_again();
    for p in ["web", "late"] {
        let deadline = std::time::Instant::now() + T;
        while c.cp.get_json(&["pod", p]).is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "pod {p} still in the API\n{}",
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    assert_eq!(c.running_containers("web"), 0, "{}", c.logs());
    assert_eq!(
        all_containers(&c, "late"),
        0,
        "a deleted pod got a container\n{}",
        c.logs()
    );
    let ev = events_for(&c.cp, "default", "late");
    assert!(
        !ev.iter().any(|(r, _)| r == "Started" || r == "Created"),
        "{ev:?}"
    );
}
