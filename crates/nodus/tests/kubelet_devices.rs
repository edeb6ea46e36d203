//! Device plugins end to end: `nodus device-plugin` offering the host's `/dev/fuse` (two
//! shares) registers with a real `nodus kubelet` joined to `nodus control-plane`; the node
//! reports the resource; a pod gets `/dev/fuse` only when it asks for it; the scheduler
//! keeps a pod asking for more than exist Pending; the pod-resources API names the devices;
//! a kubelet restart keeps the allocations (checkpoint) and the plugin registers again;
//! killing the plugin drops allocatable to 0 and refuses new pods while the running one
//! keeps its device.

mod common;

use common::BareNode;
use common::kubelet::{Kubelet, NODE_NAME, exec, is_running};
use common::kubelet_api::ControlPlane;
use serde_json::Value;
use std::time::{Duration, Instant};
use testkit::daemon::Daemon;

const T: Duration = Duration::from_secs(120);
const FUSE: &str = "devices.nodus.dev/fuse";

fn device_pod(name: &str, count: u32, bound: bool) -> String {
    let node = if bound {
        format!("  nodeName: {NODE_NAME}\n")
    } else {
        String::new()
    };
    let resources = if count > 0 {
        format!(
            "    resources:\n      limits:\n        {FUSE}: \"{count}\"\n      requests:\n        {FUSE}: \"{count}\"\n"
        )
    } else {
        String::new()
    };
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
{node}  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "exec sleep 3600"]
{resources}"#
    )
}

fn get_json(cp: &ControlPlane, args: &[&str]) -> Option<Value> {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend(["-o", "json"]);
    let out = cp.kubectl(&a);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn wait_for<V>(k: &Kubelet, what: &str, mut f: impl FnMut() -> Option<V>) -> V {
    let deadline = Instant::now() + T;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!(
                "{what} did not happen within {T:?}\nkubelet log:\n{}",
                k.log()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The node's (capacity, allocatable) of the fuse resource, as the API has them.
fn node_fuse(cp: &ControlPlane) -> Option<(String, String)> {
    let n = get_json(cp, &["node", NODE_NAME])?;
    let s = &n["status"];
    Some((
        s["capacity"][FUSE].as_str()?.to_string(),
        s["allocatable"][FUSE].as_str()?.to_string(),
    ))
}

fn start_plugin(dir: &std::path::Path, plugin_dir: &std::path::Path, n: usize) -> Daemon {
    let mut cmd = std::process::Command::new(common::nodus_bin());
    cmd.arg("device-plugin")
        .arg("--device")
        .arg(format!("{FUSE}=/dev/fuse,count=2"))
        .arg("--device-plugin-path")
        .arg(plugin_dir)
        .env("NODUS_LOG", "info");
    Daemon::spawn(
        "nodus-device-plugin",
        cmd,
        &dir.join(format!("device-plugin-{n}.log")),
        Duration::from_secs(5),
    )
    .expect("spawn nodus device-plugin")
}

/// The pod-resources API's answer for the `app` container of `pod`: (resource, ids).
async fn pod_resources(root: &std::path::Path, pod: &str) -> Vec<(String, Vec<String>)> {
    use cri::podresources::v1 as pr;
    let ch = nodus_kubelet::cri::dial_unix(
        root.join("pod-resources/kubelet.sock"),
        Duration::from_secs(10),
    )
    .await
    .expect("dial the pod-resources socket");
    let list = pr::pod_resources_lister_client::PodResourcesListerClient::new(ch)
        .list(pr::ListPodResourcesRequest {})
        .await
        .expect("List")
        .into_inner();
    list.pod_resources
        .into_iter()
        .filter(|p| p.name == pod && p.namespace == "default")
        .flat_map(|p| p.containers)
        .filter(|c| c.name == "app")
        .flat_map(|c| c.devices)
        .map(|d| (d.resource_name, d.device_ids))
        .collect()
}

fn rejection(cp: &ControlPlane, k: &Kubelet, name: &str) -> Value {
    wait_for(k, &format!("{name} rejected"), || {
        get_json(cp, &["pod", name]).filter(|p| p["status"]["phase"] == "Failed")
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn device_plugin_resources_are_reported_allocated_checkpointed_and_withdrawn() {
    if !common::have_root() {
        return;
    }
    if !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipping: the host has no /dev/fuse");
        return;
    }
    let node = BareNode::new("10.89.53.0/24");
    node.cgroup.create();
    let cp = ControlPlane::start(node.netns.clone());
    let mut flags = cp.kubelet_flags(NODE_NAME);
    flags.extend(["--node-status-update-frequency", "1s"].map(String::from));
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut k = Kubelet::start(
        node.netns.clone(),
        &node.rt.endpoint(),
        &node.cgroup.path(),
        &refs,
    );
    let plugin_dir = k.root().join("device-plugins");
    let logs = tempfile::tempdir().unwrap();
    let mut plugin = Some(start_plugin(logs.path(), &plugin_dir, 1));

    // The node reports both shares, and kubectl describe lists them.
    let (cap, alloc) = wait_for(&k, "the fuse resource on the node", || {
        node_fuse(&cp).filter(|(c, a)| c == "2" && a == "2")
    });
    assert_eq!((cap.as_str(), alloc.as_str()), ("2", "2"));
    let describe = cp.kubectl_ok(&["describe", "node", NODE_NAME], None);
    let capacity = describe
        .split("Capacity:")
        .nth(1)
        .and_then(|s| s.split("System Info:").next())
        .unwrap_or_default();
    assert!(
        capacity.contains(&format!("{FUSE}:")),
        "describe node:\n{describe}"
    );

    // /dev/fuse only for the pod that asks for it.
    cp.kubectl_ok(&["create", "-f", "-"], Some(&device_pod("plain", 0, true)));
    cp.kubectl_ok(&["create", "-f", "-"], Some(&device_pod("fuse1", 1, true)));
    let plain = k.wait_pod("plain", T, "app running", |p| is_running(p, "app"));
    let fuse1 = k.wait_pod("fuse1", T, "app running", |p| is_running(p, "app"));
    let endpoint = node.rt.endpoint();
    let probe = ["sh", "-c", "ls /dev/fuse 2>/dev/null || echo absent"];
    assert_eq!(exec(&endpoint, &plain, "app", &probe).await, "absent");
    assert_eq!(exec(&endpoint, &fuse1, "app", &probe).await, "/dev/fuse");
    let fuse1_id = fuse1["status"]["containerStatuses"][0]["containerID"].clone();

    // The scheduler counts what is allocated: two more do not fit on one left.
    cp.kubectl_ok(
        &["create", "-f", "-"],
        Some(&device_pod("toomany", 2, false)),
    );
    let cond = wait_for(&k, "toomany unschedulable", || {
        let p = get_json(&cp, &["pod", "toomany"])?;
        p["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
            .cloned()
    });
    assert_eq!(cond["reason"], "Unschedulable", "{cond:#}");
    let msg = cond["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(&format!("Insufficient {FUSE}")),
        "scheduler message: {msg}"
    );
    cp.kubectl_ok(&["delete", "pod", "toomany", "--wait=false"], None);

    // The pod resources API names fuse1's device; the checkpoint records it.
    let held = pod_resources(&k.root(), "fuse1").await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].0, FUSE);
    assert_eq!(held[0].1, vec!["/dev/fuse#0".to_string()]);
    let ckpt: Value = serde_json::from_slice(
        &std::fs::read(plugin_dir.join("kubelet_internal_checkpoint")).unwrap(),
    )
    .unwrap();
    let fuse1_uid = get_json(&cp, &["pod", "fuse1"]).unwrap()["metadata"]["uid"].clone();
    let entries = ckpt["Data"]["PodDeviceEntries"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e["PodUID"] == fuse1_uid && e["ResourceName"] == FUSE),
        "{ckpt:#}"
    );

    // A kubelet restart: the plugin registers again, fuse1 keeps its container and its
    // device, and the next pod gets the other share, not fuse1's.
    k.kill();
    k.start_again();
    let log = k.dir.path().join("kubelet-2.log");
    wait_for(&k, "the plugin registered again", || {
        std::fs::read_to_string(&log)
            .ok()?
            .contains("Registered endpoint")
            .then_some(())
    });
    let again = k.wait_pod("fuse1", T, "app running", |p| is_running(p, "app"));
    assert_eq!(
        again["status"]["containerStatuses"][0]["containerID"],
        fuse1_id
    );
    assert_eq!(
        pod_resources(&k.root(), "fuse1").await[0].1,
        vec!["/dev/fuse#0".to_string()]
    );
    cp.kubectl_ok(&["create", "-f", "-"], Some(&device_pod("fuse2", 1, true)));
    let fuse2 = k.wait_pod("fuse2", T, "app running", |p| is_running(p, "app"));
    assert_eq!(exec(&endpoint, &fuse2, "app", &probe).await, "/dev/fuse");
    assert_eq!(
        pod_resources(&k.root(), "fuse2").await[0].1,
        vec!["/dev/fuse#1".to_string()]
    );
    cp.kubectl_ok(&["delete", "pod", "fuse2"], None);

    // The plugin goes away: allocatable drops to 0 (capacity stays for the grace), a new
    // pod is refused, the running one keeps its device.
    drop(plugin.take());
    let (cap, _) = wait_for(&k, "allocatable 0", || {
        node_fuse(&cp).filter(|(_, a)| a == "0")
    });
    assert_eq!(cap, "2");
    cp.kubectl_ok(&["create", "-f", "-"], Some(&device_pod("fuse3", 1, true)));
    let refused = rejection(&cp, &k, "fuse3");
    assert_eq!(
        refused["status"]["reason"], "UnexpectedAdmissionError",
        "{refused:#}"
    );
    assert_eq!(
        refused["status"]["message"],
        format!(
            "Allocate failed due to requested number of devices unavailable for {FUSE}. Requested: 1, Available: 0, which is unexpected"
        )
    );
    let fuse1 = k.wait_pod("fuse1", T, "app running", |p| is_running(p, "app"));
    assert_eq!(exec(&endpoint, &fuse1, "app", &probe).await, "/dev/fuse");

    // The plugin comes back and registers again on its own socket.
    plugin = Some(start_plugin(logs.path(), &plugin_dir, 2));
    wait_for(&k, "allocatable back", || {
        node_fuse(&cp).filter(|(_, a)| a == "2")
    });
    drop(plugin);
}
