//! A StatefulSet with `volumeClaimTemplates` end to end: `nodus control-plane` (the
//! StatefulSet controller, the default `local-path` class and its provisioner) and one real
//! `nodus node`, driven with the real kubectl. Pods start in order with their sticky names
//! and hostnames, each gets its own Bound claim `data-web-<ordinal>`; a pod deleted and made
//! again under the same name finds what it wrote; a scale-down keeps the claims (the
//! default retention policy), so scaling back up finds the data again.

mod common;

use common::cluster::{self, ControlPlane, NodeProcess};
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(120);

const SET: &str = r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: default
spec:
  serviceName: web
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: docker.io/library/busybox:latest
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "[ -f /data/first ] || hostname > /data/first; cat /data/first; sleep 3600"]
        volumeMounts:
        - {name: data, mountPath: /data}
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      accessModes: [ReadWriteOnce]
      resources:
        requests:
          storage: 64Mi
"#;

#[test]
fn a_statefulset_keeps_names_claims_and_data() {
    if !common::have_root() {
        return;
    }
    let netns = Arc::new(testkit::Netns::new("nodus-sts").expect("netns"));
    let cgroup = testkit::CgroupParent::new("nodus-sts");
    cgroup.create();
    cluster::add_node_address(&netns);
    let storage = tempfile::Builder::new()
        .prefix("nodus-sts-storage-")
        .tempdir()
        .expect("tempdir");
    let storage_path = storage.path().to_string_lossy().into_owned();
    let cp = ControlPlane::start_with(
        netns.clone(),
        &["--default-local-storage-path", &storage_path],
    );
    let node = NodeProcess::start(&netns, &cp, "node-a", "10.99.66.0/24", &cgroup.path());
    let logs = || format!("{}\n--- control plane ---\n{}", node.log(), cp.log());
    cp.wait_json(&["node", "node-a"], T, "node-a Ready", &logs, |n| {
        cluster::condition(n, "Ready").is_some_and(|c| c["status"] == "True")
    });

    cp.apply(SET);
    for ordinal in 0..2 {
        let name = format!("web-{ordinal}");
        cp.wait_json(&["pod", &name], T, &format!("{name} Ready"), &logs, |p| {
            cluster::condition(p, "Ready").is_some_and(|c| c["status"] == "True")
        });
        let claim = format!("data-web-{ordinal}");
        let pvc = cp.wait_json(&["pvc", &claim], T, &format!("{claim} Bound"), &logs, |c| {
            c["status"]["phase"] == "Bound"
        });
        assert_eq!(pvc["spec"]["storageClassName"], "local-path", "{pvc}");
        assert_eq!(pvc["metadata"]["labels"]["app"], "web", "{pvc}");
        let (ok, out, err) = cp.kubectl(&["logs", &name]);
        assert!(ok, "{err}");
        assert_eq!(out.trim(), name, "the pod's hostname is its name");
    }
    let sts = cp.wait_json(&["statefulset", "web"], T, "2/2 ready", &logs, |s| {
        s["status"]["readyReplicas"] == 2
    });
    assert_eq!(
        sts["status"]["currentRevision"],
        sts["status"]["updateRevision"]
    );

    // web-1 deleted: made again under the same name, on the same claim and data.
    let uid = cp.get_json(&["pod", "web-1"]).expect("web-1")["metadata"]["uid"].clone();
    let (ok, _, err) = cp.kubectl(&["delete", "pod", "web-1", "--wait=false"]);
    assert!(ok, "{err}");
    cp.wait_json(&["pod", "web-1"], T, "web-1 made again", &logs, |p| {
        p["metadata"]["uid"] != uid
            && cluster::condition(p, "Ready").is_some_and(|c| c["status"] == "True")
    });
    let (_, out, _) = cp.kubectl(&["logs", "web-1"]);
    assert_eq!(
        out.trim(),
        "web-1",
        "the file web-1 wrote before is still there"
    );

    // Scale to 1 and back: the claim of web-1 is kept and bound again.
    let (ok, _, err) = cp.kubectl(&["scale", "statefulset", "web", "--replicas=1"]);
    assert!(ok, "{err}");
    cp.wait_json(&["statefulset", "web"], T, "one replica", &logs, |s| {
        s["status"]["replicas"] == 1
    });
    assert!(
        cp.get_json(&["pvc", "data-web-1"]).is_some(),
        "the default retention policy keeps the claim"
    );
    let (ok, _, err) = cp.kubectl(&["scale", "statefulset", "web", "--replicas=2"]);
    assert!(ok, "{err}");
    cp.wait_json(&["pod", "web-1"], T, "web-1 back", &logs, |p| {
        cluster::condition(p, "Ready").is_some_and(|c| c["status"] == "True")
    });
    let (_, out, _) = cp.kubectl(&["logs", "web-1"]);
    assert_eq!(out.trim(), "web-1");
    cp.wait_json(&["statefulset", "web"], T, "2/2 ready again", &logs, |s| {
        s["status"]["readyReplicas"] == 2
    });
    let (ok, out, _) = cp.kubectl(&["get", "statefulset", "web"]);
    assert!(ok && out.contains("2/2"), "{out}");
}
