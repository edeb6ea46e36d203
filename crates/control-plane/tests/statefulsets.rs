//! The StatefulSet controller through the API, with the real kubectl: ordered start and
//! stop, sticky identities, rolling updates from the highest ordinal with a partition,
//! ControllerRevisions and `kubectl rollout`. No kubelet runs here: the test plays the
//! kubelet by writing each pod's status (Running and Ready) through the status subresource.

mod common;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::json;

const SET: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: default
spec:
  serviceName: nginx
  replicas: 3
  selector:
    matchLabels: {app: nginx}
  template:
    metadata:
      labels: {app: nginx}
    spec:
      containers:
      - name: nginx
        image: nginx:1
"#;

async fn mark_ready(pods: &Api<Pod>, name: &str) {
    let status = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap_or_else(|e| panic!("status of {name}: {e}"));
}

async fn pod_names(pods: &Api<Pod>) -> Vec<String> {
    let mut names: Vec<String> = pods
        .list(&ListParams::default().labels("app=nginx"))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

async fn wait_names(pods: &Api<Pod>, want: &[&str]) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    common::eventually(&format!("pods {want:?}"), || {
        let want = want.clone();
        async move { (pod_names(pods).await == want).then_some(()) }
    })
    .await;
}

async fn revision_of(pods: &Api<Pod>, name: &str) -> String {
    pods.get(name)
        .await
        .expect("pod")
        .metadata
        .labels
        .unwrap_or_default()
        .get("controller-revision-hash")
        .cloned()
        .unwrap_or_default()
}

/// A while for the controller to act if it were going to: several of its syncs.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_ready_starts_in_order_and_scales_down_in_reverse() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    c.apply(SET).await.ok();

    wait_names(&pods, &["web-0"]).await;
    settle().await;
    assert_eq!(
        pod_names(&pods).await,
        ["web-0"],
        "web-1 must wait for web-0 to be Running and Ready"
    );
    let p0 = pods.get("web-0").await.expect("web-0");
    let labels = p0.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["statefulset.kubernetes.io/pod-name"], "web-0");
    assert_eq!(labels["apps.kubernetes.io/pod-index"], "0");
    let spec = p0.spec.expect("spec");
    assert_eq!(spec.hostname.as_deref(), Some("web-0"));
    assert_eq!(spec.subdomain.as_deref(), Some("nginx"));
    let owner = &p0.metadata.owner_references.expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("StatefulSet", "web", Some(true))
    );

    mark_ready(&pods, "web-0").await;
    wait_names(&pods, &["web-0", "web-1"]).await;
    mark_ready(&pods, "web-1").await;
    wait_names(&pods, &["web-0", "web-1", "web-2"]).await;
    mark_ready(&pods, "web-2").await;
    common::eventually("readyReplicas 3", || async {
        let s = sets.get("web").await.ok()?.status?;
        (s.ready_replicas == Some(3) && s.replicas == 3).then_some(())
    })
    .await;
    let out = c.kubectl(&["get", "statefulset", "web"]).await;
    let row: Vec<&str> = out
        .ok()
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(&row[..2], ["web", "3/3"], "{}", out.ok());

    // Scale-down removes the highest ordinal first: the order the watch shows deletions in.
    let rv = pods
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut watch = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    c.kubectl(&["scale", "statefulset", "web", "--replicas=1"])
        .await
        .ok();
    let mut deleted = Vec::new();
    while deleted.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(30), watch.next())
            .await
            .expect("deletions within 30 s")
            .expect("watch open")
            .expect("watch event");
        if let WatchEvent::Deleted(p) = ev {
            deleted.push(p.metadata.name.unwrap_or_default());
        }
    }
    assert_eq!(deleted, ["web-2", "web-1"]);
    wait_names(&pods, &["web-0"]).await;

    // A deleted pod comes back under the same name.
    let uid0 = pods.get("web-0").await.expect("web-0").metadata.uid;
    c.kubectl(&["delete", "pod", "web-0", "--wait=false"])
        .await
        .ok();
    common::eventually("web-0 recreated", || async {
        let p = pods.get_opt("web-0").await.ok()??;
        (p.metadata.uid != uid0).then_some(())
    })
    .await;
    let events = c
        .kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=web",
        ])
        .await;
    assert!(
        events
            .ok()
            .contains("create Pod web-2 in StatefulSet web successful")
            && events
                .ok()
                .contains("delete Pod web-2 in StatefulSet web successful"),
        "{}",
        events.ok()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_goes_down_from_the_highest_ordinal_and_stops_at_the_partition() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), "default");
    c.apply(&SET.replace(
        "replicas: 3",
        "replicas: 3\n  podManagementPolicy: Parallel",
    ))
    .await
    .ok();
    wait_names(&pods, &["web-0", "web-1", "web-2"]).await;
    for n in ["web-0", "web-1", "web-2"] {
        mark_ready(&pods, n).await;
    }
    let old = revision_of(&pods, "web-0").await;
    common::eventually("status revisions", || async {
        let s = sets.get("web").await.ok()?.status?;
        (s.current_revision.as_deref() == Some(old.as_str())
            && s.update_revision.as_deref() == Some(old.as_str())
            && s.ready_replicas == Some(3))
        .then_some(())
    })
    .await;

    // Partition 1: web-2, then web-1 are updated; web-0 stays at the old revision.
    c.kubectl(&[
        "patch",
        "statefulset",
        "web",
        "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":1}}}}"#,
    ])
    .await
    .ok();
    c.kubectl(&["set", "image", "statefulset/web", "nginx=nginx:2"])
        .await
        .ok();
    let new = common::eventually("update revision", || async {
        let s = sets.get("web").await.ok()?.status?;
        let u = s.update_revision?;
        (u != old).then_some(u)
    })
    .await;
    // web-2 is replaced first; web-1 waits for it to be ready.
    common::eventually("web-2 at the new revision", || async {
        let p = pods.get_opt("web-2").await.ok()??;
        let rev = p.metadata.labels?.get("controller-revision-hash")?.clone();
        (rev == new && p.metadata.deletion_timestamp.is_none()).then_some(())
    })
    .await;
    settle().await;
    assert_eq!(
        revision_of(&pods, "web-1").await,
        old,
        "web-1 waits for web-2"
    );
    let image = pods
        .get("web-2")
        .await
        .expect("web-2")
        .spec
        .expect("spec")
        .containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("nginx:2"));
    mark_ready(&pods, "web-2").await;
    common::eventually("web-1 at the new revision", || async {
        let p = pods.get_opt("web-1").await.ok()??;
        let rev = p.metadata.labels?.get("controller-revision-hash")?.clone();
        (rev == new).then_some(())
    })
    .await;
    mark_ready(&pods, "web-1").await;
    let out = c
        .kubectl(&["rollout", "status", "statefulset/web", "--timeout=30s"])
        .await;
    assert!(
        out.ok()
            .contains("partitioned roll out complete: 2 new pods have been updated"),
        "{}",
        out.ok()
    );
    settle().await;
    assert_eq!(
        revision_of(&pods, "web-0").await,
        old,
        "web-0 is below the partition"
    );

    // Two templates, two ControllerRevisions owned by the set, numbered 1 and 2.
    let mut numbers: Vec<(i64, String)> = revisions
        .list(&ListParams::default())
        .await
        .expect("revisions")
        .items
        .into_iter()
        .map(|r| (r.revision, r.metadata.name.unwrap_or_default()))
        .collect();
    numbers.sort();
    assert_eq!(numbers, vec![(1, old.clone()), (2, new.clone())]);
    let history = c.kubectl(&["rollout", "history", "statefulset/web"]).await;
    let rows: Vec<&str> = history
        .ok()
        .lines()
        .filter(|l| l.starts_with(['1', '2']))
        .collect();
    assert_eq!(rows.len(), 2, "{}", history.ok());

    // Partition 0 finishes the update and makes it the current revision.
    c.kubectl(&[
        "patch",
        "statefulset",
        "web",
        "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}"#,
    ])
    .await
    .ok();
    common::eventually("web-0 at the new revision", || async {
        let p = pods.get_opt("web-0").await.ok()??;
        let rev = p.metadata.labels?.get("controller-revision-hash")?.clone();
        (rev == new).then_some(())
    })
    .await;
    mark_ready(&pods, "web-0").await;
    common::eventually("currentRevision is the update revision", || async {
        let s = sets.get("web").await.ok()?.status?;
        (s.current_revision.as_deref() == Some(new.as_str()) && s.updated_replicas == Some(3))
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_statefulsets_get_upstreams_messages() {
    let c = common::start().await;
    let bad = SET.replace(
        "replicas: 3",
        "replicas: 3\n  podManagementPolicy: Sometimes",
    );
    let out = c.apply(&bad).await;
    assert!(
        out.fails().contains(
            "spec.podManagementPolicy: Invalid value: \"Sometimes\": must be 'OrderedReady' or 'Parallel'"
        ),
        "{}",
        out.stderr
    );
    c.apply(SET).await.ok();
    let out = c
        .kubectl(&[
            "patch",
            "statefulset",
            "web",
            "-p",
            r#"{"spec":{"serviceName":"other"}}"#,
        ])
        .await;
    assert!(
        out.fails().contains("spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"),
        "{}",
        out.stderr
    );
}
