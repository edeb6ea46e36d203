//! kube-rs clients against an in-process control plane: conflicts, field selectors,
//! graceful deletion, watches (bookmarks, 410 Gone then re-list) and node identities.

mod common;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use nodus_control_plane::apiserver::state::ApiConfig;
use serde_json::json;

fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut v = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    if let Some(n) = node {
        v["spec"]["nodeName"] = json!(n);
    }
    serde_json::from_value(v).expect("pod")
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).expect("cm")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_update_is_a_409_conflict() {
    let c = common::start().await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().await, "default");
    let created = api
        .create(&PostParams::default(), &cm("c1"))
        .await
        .expect("create");
    let mut first = created.clone();
    first.data = Some([("k".to_string(), "1".to_string())].into());
    let updated = api
        .replace("c1", &PostParams::default(), &first)
        .await
        .expect("first update");
    let rv1: u64 = created
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default()
        .parse()
        .unwrap_or(0);
    let rv2: u64 = updated
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default()
        .parse()
        .unwrap_or(0);
    assert!(rv2 > rv1, "resourceVersion increases: {rv1} -> {rv2}");
    let mut stale = created.clone();
    stale.data = Some([("k".to_string(), "2".to_string())].into());
    let err = api
        .replace("c1", &PostParams::default(), &stale)
        .await
        .expect_err("conflict");
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "Conflict");
        }
        other => panic!("unexpected {other:?}"),
    }
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_selector_on_node_name_and_graceful_deletion() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("a", Some("n1")))
        .await
        .expect("a");
    pods.create(&PostParams::default(), &pod("b", Some("n2")))
        .await
        .expect("b");
    pods.create(&PostParams::default(), &pod("c", None))
        .await
        .expect("c");
    let all: Api<Pod> = Api::all(client.clone());
    let on_n1 = all
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .expect("list");
    let names: Vec<_> = on_n1
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(names, vec!["a"]);
    let unbound = pods
        .list(&ListParams::default().fields("spec.nodeName="))
        .await
        .expect("list");
    let names: Vec<_> = unbound
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(names, vec!["c"]);

    // A pod bound to a node is deleted gracefully: it stays, marked, until the kubelet
    // confirms with a zero grace period.
    pods.delete("a", &DeleteParams::default())
        .await
        .expect("delete");
    let marked = pods.get("a").await.expect("still there");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    pods.delete(
        "a",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("final delete");
    assert!(pods.get_opt("a").await.expect("get").is_none());
    // An unbound pod goes at once.
    pods.delete("c", &DeleteParams::default())
        .await
        .expect("delete c");
    assert!(pods.get_opt("c").await.expect("get").is_none());
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_bookmarks_and_gone_after_compaction() {
    let api_cfg = ApiConfig {
        bookmark_interval: Duration::from_millis(300),
        ..ApiConfig::default()
    };
    let c = common::start_with(api_cfg).await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().await, "default");
    let list = api.list(&ListParams::default()).await.expect("list");
    let rv = list.metadata.resource_version.clone().expect("list rv");
    let mut stream = api
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .expect("watch")
        .boxed();
    api.create(&PostParams::default(), &cm("w1"))
        .await
        .expect("create");
    let mut added = false;
    let mut bookmark = false;
    for _ in 0..20 {
        let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(10), stream.next()).await
        else {
            break;
        };
        match ev.expect("event") {
            WatchEvent::Added(o) => added |= o.metadata.name.as_deref() == Some("w1"),
            WatchEvent::Bookmark(b) => bookmark |= !b.metadata.resource_version.is_empty(),
            _ => {}
        }
        if added && bookmark {
            break;
        }
    }
    assert!(added, "ADDED event for w1");
    assert!(bookmark, "a BOOKMARK arrived");

    // Compact past rv: a watch from it is answered with 410 Gone, and a re-list works.
    api.create(&PostParams::default(), &cm("w2"))
        .await
        .expect("create");
    let store = c.handle.store();
    store.compact(store.revision()).expect("compact");
    let mut old = api
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(10), old.next())
        .await
        .expect("event in time");
    match ev {
        Some(Ok(WatchEvent::Error(e))) => {
            assert_eq!(e.code, 410);
            assert!(
                e.message.starts_with("too old resource version"),
                "{}",
                e.message
            );
        }
        Some(Err(kube::Error::Api(e))) => assert_eq!(e.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
    let relist = api.list(&ListParams::default()).await.expect("re-list");
    // Every namespace also holds the published cluster CA (`kube-root-ca.crt`).
    let ours = relist
        .items
        .iter()
        .filter(|c| c.metadata.name.as_deref() != Some("kube-root-ca.crt"))
        .count();
    assert_eq!(ours, 2);
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_identity_is_limited_to_its_own_objects() {
    let c = common::start().await;
    let admin = c.client().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    for n in ["a", "b"] {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": n}})).expect("node");
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("node");
    }
    let kc = nodus_control_plane::pki::issue_node_kubeconfig(c.dir.path(), "a", &c.handle.url)
        .expect("node kubeconfig");
    let node_client = common::client_for(&kc).await;
    let as_a: Api<Node> = Api::all(node_client.clone());
    let mut own = as_a.get("a").await.expect("node a reads itself");
    own.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    as_a.replace("a", &PostParams::default(), &own)
        .await
        .expect("node a updates itself");
    let mut other = as_a.get("b").await.expect("nodes may read other nodes");
    other.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    let err = as_a
        .replace("b", &PostParams::default(), &other)
        .await
        .expect_err("forbidden");
    match err {
        kube::Error::Api(s) => assert_eq!(s.code, 403, "{}", s.message),
        e => panic!("unexpected {e:?}"),
    }
    let leases: Api<Lease> = Api::namespaced(node_client.clone(), "kube-node-lease");
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "a"}, "spec": {"holderIdentity": "a"}}))
            .expect("lease");
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("own lease");
    let lease_b: Lease =
        serde_json::from_value(json!({"metadata": {"name": "b"}, "spec": {"holderIdentity": "b"}}))
            .expect("lease");
    assert!(
        leases
            .create(&PostParams::default(), &lease_b)
            .await
            .is_err(),
        "not another node's lease"
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(node_client, "default");
    assert!(
        secrets.list(&ListParams::default()).await.is_err(),
        "nodes cannot list secrets"
    );
    c.handle.shutdown().await;
}

/// Booleans in the query are read as upstream reads them: Python's client sends
/// `watch=True`, and an informer built on it must get a watch stream, not a list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_true_in_any_spelling_is_a_watch() {
    let c = common::start().await;
    let client = c.client().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let list = api.list(&ListParams::default()).await.expect("list");
    let rv = list.metadata.resource_version.clone().unwrap_or_default();
    let req = http::Request::get(format!(
        "/api/v1/namespaces/default/configmaps?watch=True&resourceVersion={rv}"
    ))
    .body(Vec::new())
    .expect("request");
    let mut events = client
        .request_events::<ConfigMap>(req)
        .await
        .expect("watch=True opens a watch")
        .boxed();
    api.create(&PostParams::default(), &cm("seen"))
        .await
        .expect("create");
    // Controllers start once they hold their Lease and may add `kube-root-ca.crt` to this
    // namespace after the list: events for other ConfigMaps are passed over.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ev = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("the new ConfigMap's event within 20 s")
            .expect("stream open")
            .expect("event decodes");
        match ev {
            WatchEvent::Added(o) if o.metadata.name.as_deref() == Some("seen") => break,
            WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Bookmark(_) => {}
            other => panic!("expected ADDED for the new ConfigMap, got {other:?}"),
        }
    }
    // `watch=False` (any case) is an ordinary list.
    let text = client
        .request_text(
            http::Request::get("/api/v1/namespaces/default/configmaps?watch=FALSE")
                .body(Vec::new())
                .expect("request"),
        )
        .await
        .expect("list");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["kind"], "ConfigMapList", "{text}");
    c.handle.shutdown().await;
}

/// An apply patch sent as raw JSON to `path` with `query`.
fn apply_request(path: &str, query: &str, body: serde_json::Value) -> http::Request<Vec<u8>> {
    http::Request::patch(format!("{path}{query}"))
        .header("Content-Type", "application/apply-patch+yaml")
        .body(body.to_string().into_bytes())
        .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_options_create_and_conflict_status() {
    let c = common::start().await;
    let client = c.client().await;
    let path = "/api/v1/namespaces/default/configmaps/ssa";
    let cm = |v: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"},
               "data": {"k": v}})
    };
    // Apply needs a field manager (upstream's PatchOptions validation).
    match client.request_text(apply_request(path, "", cm("1"))).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422);
            assert_eq!(
                s.message,
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
            );
        }
        other => panic!("expected 422, got {other:?}"),
    }
    // Only apply may force.
    let merge = http::Request::patch(format!("{path}?force=true"))
        .header("Content-Type", "application/merge-patch+json")
        .body(b"{}".to_vec())
        .expect("request");
    match client.request_text(merge).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422);
            assert!(
                s.message
                    .contains("force: Forbidden: may not be specified for non-apply patch"),
                "{}",
                s.message
            );
        }
        other => panic!("expected 422, got {other:?}"),
    }
    // Apply to a missing object creates it, owned by the manager.
    let created: serde_json::Value = serde_json::from_str(
        &client
            .request_text(apply_request(path, "?fieldManager=a", cm("1")))
            .await
            .expect("apply creates"),
    )
    .expect("json");
    assert_eq!(created["data"]["k"], "1");
    assert_eq!(created["metadata"]["managedFields"][0]["manager"], "a");
    assert_eq!(
        created["metadata"]["managedFields"][0]["operation"],
        "Apply"
    );
    assert_eq!(
        created["metadata"]["managedFields"][0]["fieldsV1"],
        json!({"f:data": {"f:k": {}}})
    );
    // Another manager changing it: 409 with upstream's text and a FieldManagerConflict cause.
    let raw = c
        .kubectl(&["get", "--raw", "/api/v1/namespaces/default/configmaps/ssa"])
        .await;
    assert!(raw.ok().contains("\"manager\":\"a\""), "{}", raw.stdout);
    match client
        .request_text(apply_request(path, "?fieldManager=b", cm("2")))
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "Conflict");
            assert_eq!(
                s.message,
                "Apply failed with 1 conflict: conflict with \"a\" using v1: .data.k"
            );
            let causes = s.details.map(|d| d.causes).unwrap_or_default();
            assert_eq!(causes.len(), 1, "{causes:?}");
            assert_eq!(causes[0].reason, "FieldManagerConflict");
            assert_eq!(causes[0].message, "conflict with \"a\" using v1");
            assert_eq!(causes[0].field, ".data.k");
        }
        other => panic!("expected 409, got {other:?}"),
    }
    // A PUT is an Update by its `?fieldManager=`, and takes the field it changes.
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut cur = api.get("ssa").await.expect("get");
    cur.data = Some([("k".to_string(), "3".to_string())].into());
    let pp = PostParams {
        field_manager: Some("editor".into()),
        ..PostParams::default()
    };
    let updated = api.replace("ssa", &pp, &cur).await.expect("put");
    let entries = updated.metadata.managed_fields.unwrap_or_default();
    let editor = entries
        .iter()
        .find(|e| e.manager.as_deref() == Some("editor"))
        .expect("editor entry");
    assert_eq!(editor.operation.as_deref(), Some("Update"));
    assert!(
        entries.iter().all(|e| e.manager.as_deref() != Some("a")),
        "a lost its only field: {entries:?}"
    );
}

/// On etcd, a watcher of a quiet resource gets bookmarks that follow the cluster's
/// revision (upstream's cacher), not its last event: it can resume from there after a
/// compaction instead of listing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_a_quiet_watchers_bookmarks_follow_the_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd = nodus_control_plane::storage::EtcdServer::start(&dir.path().join("etcd"))
        .expect("etcd starts");
    let mut cfg = nodus_control_plane::ControlPlaneConfig::new(
        dir.path().join("cp"),
        "127.0.0.1".parse().expect("ip"),
        0,
    );
    cfg.api.bookmark_interval = Duration::from_millis(300);
    cfg.storage = nodus_control_plane::storage::StorageBackend::Etcd(
        nodus_control_plane::storage::EtcdConfig::new(vec![etcd.url()]),
    );
    let handle = nodus_control_plane::start(cfg)
        .await
        .expect("control plane starts");
    let c = common::Cluster { handle, dir };
    let client = c.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client, "default");
    let rv = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("list rv");
    let mut stream = cms
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .expect("watch")
        .boxed();
    let mut last = 0u64;
    for i in 0..3 {
        let s: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("s{i}")}}))
                .expect("secret");
        let made = secrets
            .create(&PostParams::default(), &s)
            .await
            .expect("create");
        last = made
            .metadata
            .resource_version
            .expect("rv")
            .parse()
            .expect("number");
    }
    let mut seen = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap_or_else(|_| panic!("no bookmark at or past {last}: {seen:?}"));
        match ev.expect("open").expect("event") {
            WatchEvent::Bookmark(b) => {
                let at: u64 = b.metadata.resource_version.parse().expect("number");
                seen.push(at);
                if at >= last {
                    break;
                }
            }
            // The cluster CA's ConfigMap may still be published into the namespace.
            WatchEvent::Added(cm) if cm.metadata.name.as_deref() == Some("kube-root-ca.crt") => {}
            other => panic!("a quiet watcher got {other:?}"),
        }
    }
    c.handle.shutdown().await;
    drop(etcd);
}
