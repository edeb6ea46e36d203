//! Pod user namespaces end to end: a `nodus kubelet` joined to `nodus control-plane` in the
//! test node's network namespace, driving the nodus runtime, with the real kubectl.
//!
//! A pod with `hostUsers: false` runs as root inside its own user namespace: its
//! `/proc/self/uid_map` maps container id 0 to a block of 65536 host ids that starts on a
//! multiple of 65536 at or above 65536, and `id -u` says 0. A second such pod gets another
//! block; the kubelet persisted both in the pods' directories and a restarted kubelet
//! hands a third pod neither of them; a deleted pod's block is free again. Secret and
//! read-only Memory emptyDir volumes (tmpfs mounts of the kubelet's) mount in such a pod. The Node
//! reports that its default runtime handler supports user namespaces. A pod asking for a
//! user namespace and the host's network is refused by the API server with upstream's
//! message. On containerd 1.6, which reports no runtime handlers, the kubelet refuses such
//! a pod as upstream's does.

mod common;

use common::BareNode;
use common::kubelet::{Kubelet, NODE_NAME, container_status, is_running};
use common::kubelet_api::ControlPlane;
use serde_json::Value;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);

fn userns_pod(name: &str, extra: &str) -> String {
    common::kubelet_api::busybox_pod(
        name,
        &format!("  hostUsers: false\n{extra}"),
        "cat /proc/self/uid_map; cat /proc/self/gid_map; id -u; exec sleep 3600",
        "",
    )
}

/// What the pod's container printed: (uid_map line, gid_map line, `id -u`).
struct Seen {
    uid_map: (u64, u64, u64),
    gid_map: (u64, u64, u64),
    id: String,
}

fn map_line(line: &str) -> Option<(u64, u64, u64)> {
    let f: Vec<u64> = line
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    match f[..] {
        [inside, outside, len] => Some((inside, outside, len)),
        _ => None,
    }
}

/// Waits for the pod's three lines of output through `kubectl logs` (API server →
/// kubelet), panicking with the pod, its events and the kubelet's log otherwise.
fn wait_output(cp: &ControlPlane, k: &Kubelet, name: &str) -> Seen {
    let deadline = Instant::now() + T;
    loop {
        let out = cp.kubectl(&["logs", name]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if out.status.success() && lines.len() >= 3 {
            return Seen {
                uid_map: map_line(lines[0])
                    .unwrap_or_else(|| panic!("{name}: not a uid_map line: {text:?}")),
                gid_map: map_line(lines[1])
                    .unwrap_or_else(|| panic!("{name}: not a gid_map line: {text:?}")),
                id: lines[2].trim().to_string(),
            };
        }
        if Instant::now() > deadline {
            let pod = cp.kubectl(&["get", "pod", name, "-o", "json"]);
            let events = cp.kubectl(&[
                "get",
                "events",
                "--field-selector",
                &format!("involvedObject.name={name}"),
            ]);
            panic!(
                "pod {name} printed no user namespace within {T:?}\nlogs: {text}{}\npod: {}\nevents: {}{}\nkubelet log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&pod.stdout),
                String::from_utf8_lossy(&events.stdout),
                String::from_utf8_lossy(&events.stderr),
                k.log()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn pod_uid(cp: &ControlPlane, name: &str) -> String {
    cp.kubectl_ok(
        &["get", "pod", name, "-o", "jsonpath={.metadata.uid}"],
        None,
    )
}

/// The block the kubelet persisted for the pod, from `<root>/pods/<uid>/userns`.
fn persisted_host_id(k: &Kubelet, uid: &str) -> u64 {
    let path = k.root().join("pods").join(uid).join("userns");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).expect("userns file is JSON");
    assert_eq!(
        v["uidMappings"], v["gidMappings"],
        "uid and gid mappings are the same: {text}"
    );
    assert_eq!(v["uidMappings"][0]["containerId"], 0, "{text}");
    assert_eq!(v["uidMappings"][0]["length"], 65536, "{text}");
    v["uidMappings"][0]["hostId"].as_u64().expect("hostId")
}

/// A pod's user namespace: root inside, a whole aligned block of unprivileged ids
/// outside, the same block for groups.
fn assert_pod_block(name: &str, seen: &Seen) -> u64 {
    let (inside, host_id, len) = seen.uid_map;
    assert_eq!(inside, 0, "{name}: container id 0 is mapped");
    assert_eq!(len, 65536, "{name}: a whole block of 65536 ids");
    assert!(
        host_id >= 65536 && host_id % 65536 == 0,
        "{name}: host id {host_id} is an aligned block above the host's own ids"
    );
    assert_eq!(seen.gid_map, seen.uid_map, "{name}: groups map like users");
    assert_eq!(seen.id, "0", "{name}: the container runs as root inside");
    host_id
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_without_host_users_get_their_own_id_blocks() {
    if !common::have_root() {
        return;
    }
    let node = BareNode::new("10.89.51.0/24");
    node.cgroup.create();
    let cp = ControlPlane::start(node.netns.clone());
    let mut k = cp.join_kubelet(&node, &[]);

    // The API server refuses a user namespace together with the host's network.
    let out = cp
        .kubectl_cmd(&["create", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            if let Some(mut s) = c.stdin.take() {
                s.write_all(userns_pod("hostnet", "  hostNetwork: true\n").as_bytes())?;
            }
            c.wait_with_output()
        })
        .expect("run kubectl");
    assert!(
        !out.status.success(),
        "hostNetwork with hostUsers=false was accepted"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "The Pod \"hostnet\" is invalid: spec.hostNetwork: Forbidden: when `pod.Spec.HostUsers` is false"
    );

    // The Node tells where user namespaces can run: the runtime's default handler ("").
    let deadline = Instant::now() + T;
    let handlers = loop {
        let out = cp.kubectl(&[
            "get",
            "node",
            NODE_NAME,
            "-o",
            "jsonpath={.status.runtimeHandlers}",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "the node never reported runtimeHandlers: {text}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            k.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let default = handlers
        .as_array()
        .and_then(|a| a.iter().find(|h| h["name"] == ""))
        .unwrap_or_else(|| panic!("no default handler in {handlers}"));
    assert_eq!(
        default["features"]["userNamespaces"], true,
        "the nodus runtime's default handler supports user namespaces: {handlers}"
    );

    cp.kubectl_ok(&["create", "-f", "-"], Some(&userns_pod("first", "")));
    // The second pod also mounts a secret and a Memory emptyDir read-only: both are tmpfs
    // mounts the kubelet makes on the host, whose flags the container's user namespace
    // locks, so the runtime's read-only remount must not need to drop any.
    cp.kubectl_ok(
        &[
            "create",
            "secret",
            "generic",
            "creds",
            "--from-literal=token=t0p",
        ],
        None,
    );
    cp.kubectl_ok(
        &["create", "-f", "-"],
        Some(&common::kubelet_api::busybox_pod(
            "second",
            "  hostUsers: false\n  volumes:\n  - {name: creds, secret: {secretName: creds}}\n  - {name: scratch, emptyDir: {medium: Memory}}\n",
            "cat /proc/self/uid_map; cat /proc/self/gid_map; id -u; exec sleep 3600",
            "    volumeMounts:\n    - {name: creds, mountPath: /creds}\n    - {name: scratch, mountPath: /scratch, readOnly: true}\n",
        )),
    );
    let first = assert_pod_block("first", &wait_output(&cp, &k, "first"));
    let second = assert_pod_block("second", &wait_output(&cp, &k, "second"));
    assert_eq!(
        cp.kubectl_ok(&["exec", "second", "--", "cat", "/creds/token"], None),
        "t0p",
        "the secret reaches the user-namespaced pod"
    );
    assert!(
        cp.kubectl_ok(
            &["exec", "second", "--", "grep", " /scratch ", "/proc/mounts"],
            None
        )
        .contains("tmpfs ro,"),
        "the Memory emptyDir is a read-only tmpfs in the container"
    );
    assert_ne!(first, second, "two pods never share a block");
    assert_eq!(persisted_host_id(&k, &pod_uid(&cp, "first")), first);
    assert_eq!(persisted_host_id(&k, &pod_uid(&cp, "second")), second);

    // A restarted kubelet reloads the blocks: both pods keep running with theirs, and a
    // new pod gets a third one.
    k.kill();
    k.start_again();
    cp.kubectl_ok(&["create", "-f", "-"], Some(&userns_pod("third", "")));
    let third = assert_pod_block("third", &wait_output(&cp, &k, "third"));
    assert!(
        third != first && third != second,
        "after a restart the kubelet handed out a block in use: {third} (first {first}, second {second})"
    );
    let p = k.wait_pod("first", T, "still running after the restart", |p| {
        is_running(p, "app")
    });
    assert_eq!(
        p["status"]["containerStatuses"][0]["restartCount"], 0,
        "the restart left the pod alone"
    );
    assert_eq!(persisted_host_id(&k, &pod_uid(&cp, "first")), first);

    // Deleting a pod frees its block: its directory (and file) go, and the block is
    // handed out again (the manager gives the lowest free block).
    let first_uid = pod_uid(&cp, "first");
    cp.kubectl_ok(&["delete", "pod", "first", "--grace-period=1"], None);
    let dir = k.root().join("pods").join(&first_uid);
    let deadline = Instant::now() + T;
    while dir.exists() {
        assert!(
            Instant::now() < deadline,
            "{} still exists after the pod was deleted\n{}",
            dir.display(),
            k.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    cp.kubectl_ok(&["create", "-f", "-"], Some(&userns_pod("fourth", "")));
    let fourth = assert_pod_block("fourth", &wait_output(&cp, &k, "fourth"));
    assert_eq!(fourth, first, "the deleted pod's block is free again");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_without_user_namespaces_gets_no_such_pod() {
    if !common::have_root() {
        return;
    }
    let netns = std::sync::Arc::new(testkit::Netns::new("kubelet-userns").expect("netns"));
    let base = tempfile::tempdir().expect("tempdir");
    let ctrd = common::node::start_containerd(&netns, base.path(), "10.89.52.0/24");
    let cgroup = testkit::CgroupParent::new("kubelet-userns");
    cgroup.create();
    let k = Kubelet::start(netns.clone(), &ctrd.endpoint(), &cgroup.path(), &[]);
    k.write_manifest(
        "userns.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: userns}\nspec:\n  hostUsers: false\n  containers:\n  - name: app\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [sleep, \"3600\"]\n",
    );
    let name = format!("userns-{NODE_NAME}");
    let want = "can't set `spec.hostUsers: false`, runtime does not support user namespaces: the handler \"\" is not known";
    let p = k.wait_pod(&name, T, "the refusal in the container's status", |p| {
        container_status(p, "app")
            .and_then(|c| c["state"]["waiting"]["message"].as_str())
            .is_some_and(|m| m.contains(want))
    });
    let waiting = &container_status(&p, "app").expect("status")["state"]["waiting"];
    assert_eq!(waiting["reason"], "ContainerCreating");
    let uid = p["metadata"]["uid"].as_str().expect("uid");
    assert_eq!(
        waiting["message"],
        format!("Failed to generate sandbox config for pod \"{name}_default({uid})\": {want}")
    );
    assert!(
        !k.root().join("pods").join(uid).join("userns").exists(),
        "no block is allocated for a pod that cannot run"
    );
    let (code, metrics) = k.get("/metrics");
    assert_eq!(code, 200, "{metrics}");
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{metrics}"))
    };
    let started = value("kubelet_started_user_namespaced_pods_total");
    let errors = value("kubelet_started_user_namespaced_pods_errors_total");
    assert!(started >= 1.0, "attempts are counted: {started}");
    // Every attempt failed on this runtime (a sync between the two reads may have counted
    // one more attempt whose error is not counted yet).
    assert!(
        errors >= 1.0 && started - errors <= 1.0,
        "errors are counted: {errors} of {started}"
    );
    drop(k);
    drop(ctrd);
}
