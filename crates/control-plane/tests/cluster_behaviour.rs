//! Built-in cluster behaviour through kube-rs: namespace lifecycle, ServiceAccounts,
//! garbage collection, finalizers, Service IP/port allocation, binding, eviction with
//! PodDisruptionBudgets, scale, status subresource rules, pagination and streaming lists.

mod common;

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use serde_json::json;

async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..300 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("object")
}

fn api_code(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_get_a_service_account_and_are_emptied_on_delete() {
    let c = common::start().await;
    let client = c.client().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &from(json!({"metadata": {"name": "doomed"}})),
    )
    .await
    .expect("ns");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "doomed");
    eventually("default ServiceAccount", || async {
        sas.get_opt("default").await.ok().flatten().is_some()
    })
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    cms.create(
        &PostParams::default(),
        &from(json!({"metadata": {"name": "x"}})),
    )
    .await
    .expect("cm");
    nss.delete("doomed", &DeleteParams::default())
        .await
        .expect("delete ns");
    eventually("namespace gone", || async {
        nss.get_opt("doomed").await.ok().flatten().is_none()
    })
    .await;
    assert!(
        cms.get_opt("x").await.expect("get").is_none(),
        "contents deleted"
    );
    let err = cms
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "y"}})),
        )
        .await
        .expect_err("no ns");
    assert_eq!(api_code(err).0, 404);
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_background_orphan_foreground_and_finalizers() {
    let c = common::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client().await, "default");
    let owned = |name: &str, owner: &ConfigMap| -> ConfigMap {
        from(json!({"metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name,
            "uid": owner.metadata.uid, "blockOwnerDeletion": true}]}}))
    };
    let pp = PostParams::default();

    let o1 = cms
        .create(&pp, &from(json!({"metadata": {"name": "owner1"}})))
        .await
        .expect("owner");
    cms.create(&pp, &owned("dep1", &o1)).await.expect("dep");
    cms.delete("owner1", &DeleteParams::background())
        .await
        .expect("delete");
    eventually("background dependent deleted", || async {
        cms.get_opt("dep1").await.ok().flatten().is_none()
    })
    .await;

    let o2 = cms
        .create(&pp, &from(json!({"metadata": {"name": "owner2"}})))
        .await
        .expect("owner");
    cms.create(&pp, &owned("dep2", &o2)).await.expect("dep");
    cms.delete("owner2", &DeleteParams::orphan())
        .await
        .expect("delete");
    eventually("orphaning owner gone", || async {
        cms.get_opt("owner2").await.ok().flatten().is_none()
    })
    .await;
    let dep2 = cms.get("dep2").await.expect("orphan kept");
    assert!(
        dep2.metadata
            .owner_references
            .unwrap_or_default()
            .is_empty(),
        "owner reference removed"
    );

    let o3 = cms
        .create(&pp, &from(json!({"metadata": {"name": "owner3"}})))
        .await
        .expect("owner");
    cms.create(&pp, &owned("dep3", &o3)).await.expect("dep");
    cms.delete("owner3", &DeleteParams::foreground())
        .await
        .expect("delete");
    eventually("foreground owner gone after its dependent", || async {
        cms.get_opt("owner3").await.ok().flatten().is_none()
            && cms.get_opt("dep3").await.ok().flatten().is_none()
    })
    .await;

    cms.create(
        &pp,
        &from(json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}})),
    )
    .await
    .expect("cm");
    cms.delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    let held = cms.get("held").await.expect("kept by its finalizer");
    assert!(held.metadata.deletion_timestamp.is_some());
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("drop finalizer");
    assert!(
        cms.get_opt("held").await.expect("get").is_none(),
        "gone once the finalizer is removed"
    );
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_get_cluster_ips_and_node_ports() {
    let c = common::start().await;
    let svcs: Api<Service> = Api::namespaced(c.client().await, "default");
    let pp = PostParams::default();
    let a = svcs
        .create(&pp, &from(json!({"metadata": {"name": "a"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}})))
        .await
        .expect("svc");
    let spec = a.spec.expect("spec");
    let ip: std::net::Ipv4Addr = spec
        .cluster_ip
        .clone()
        .expect("clusterIP")
        .parse()
        .expect("ipv4");
    assert_eq!(ip.octets()[0], 10);
    assert!((96..112).contains(&ip.octets()[1]), "{ip} in 10.96.0.0/12");
    let np = spec.ports.expect("ports")[0].node_port.expect("nodePort");
    assert!((30000..=32767).contains(&np), "{np}");

    let clash = json!({"metadata": {"name": "b"}, "spec": {"clusterIP": ip.to_string(), "ports": [{"port": 80}]}});
    let (code, msg) = api_code(svcs.create(&pp, &from(clash)).await.expect_err("clash"));
    assert_eq!(code, 422);
    assert!(msg.contains("provided IP is already allocated"), "{msg}");
    let kubernetes = svcs.get("kubernetes").await.expect("kubernetes service");
    assert_eq!(
        kubernetes.spec.and_then(|s| s.cluster_ip).as_deref(),
        Some("10.96.0.1")
    );

    let change =
        Patch::Merge(json!({"spec": {"clusterIP": "10.96.9.9", "clusterIPs": ["10.96.9.9"]}}));
    let (code, _) = api_code(
        svcs.patch("a", &PatchParams::default(), &change)
            .await
            .expect_err("immutable"),
    );
    assert_eq!(code, 422);
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_eviction_and_scale() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let pod = |name: &str| -> Pod {
        from(
            json!({"metadata": {"name": name, "labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        )
    };
    pods.create(&pp, &pod("p")).await.expect("pod");
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}});
    pods.create_subresource::<serde_json::Value, serde_json::Value>("binding", "p", &pp, &binding)
        .await
        .expect("bind");
    assert_eq!(
        pods.get("p")
            .await
            .expect("pod")
            .spec
            .and_then(|s| s.node_name)
            .as_deref(),
        Some("n1")
    );
    let (code, msg) = api_code(
        pods.create_subresource::<serde_json::Value, serde_json::Value>(
            "binding", "p", &pp, &binding,
        )
        .await
        .expect_err("rebind"),
    );
    assert_eq!(code, 409, "{msg}");
    assert!(msg.contains("is already assigned to node \"n1\""), "{msg}");

    pods.create(&pp, &pod("q")).await.expect("pod");
    // A Pending pod is evicted without a budget check (upstream's canIgnorePDB): q runs.
    pods.patch_status("q", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})))
        .await
        .expect("q running");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    pdbs.create(&pp, &from(json!({"metadata": {"name": "budget"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "x"}}}}))).await.expect("pdb");
    let observed = |generation: i64| {
        let pdbs = pdbs.clone();
        async move {
            common::eventually("the disruption controller's status", || async {
                let b = pdbs.get("budget").await.ok()?;
                let st = b.status?;
                (st.observed_generation == Some(generation)).then_some(st)
            })
            .await
        }
    };
    let st = observed(1).await;
    assert_eq!(
        (
            st.current_healthy,
            st.desired_healthy,
            st.disruptions_allowed
        ),
        (1, 1, 0)
    );
    let (code, msg) = api_code(
        pods.evict("q", &EvictParams::default())
            .await
            .expect_err("blocked"),
    );
    assert_eq!(code, 429);
    assert_eq!(
        msg,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    pdbs.patch(
        "budget",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 0}})),
    )
    .await
    .expect("lower the budget");
    assert_eq!(observed(2).await.disruptions_allowed, 1);
    pods.evict("q", &EvictParams::default())
        .await
        .expect("evicted");
    assert!(
        pods.get_opt("q").await.expect("get").is_none(),
        "unbound pod evicted at once"
    );

    let deps: Api<Deployment> = Api::namespaced(client.clone(), "default");
    deps.create(&pp, &from(json!({"metadata": {"name": "d"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}},
        "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})))
        .await
        .expect("deployment");
    let out = c
        .kubectl(&["scale", "deployment", "d", "--replicas=3"])
        .await;
    assert_eq!(out.ok().trim(), "deployment.apps/d scaled");
    let scale = deps.get_scale("d").await.expect("scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(3));
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_subresource_pagination_and_streaming_lists() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    pods.create(&pp, &from(json!({"metadata": {"name": "s"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))).await.expect("pod");
    // The scheduler writes this pod's status once (no node fits); the read-modify-writes
    // below start after it, or they would race it and get a 409 as any client would.
    eventually("the scheduler's PodScheduled=False", || async {
        let p = pods.get("s").await.expect("pod");
        p.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False")
    })
    .await;
    let mut p = pods.get("s").await.expect("pod");
    p.status.as_mut().expect("status").phase = Some("Running".into());
    let after = pods.replace("s", &pp, &p).await.expect("main update");
    assert_eq!(
        after.status.and_then(|s| s.phase).as_deref(),
        Some("Pending"),
        "the main resource ignores status"
    );
    let mut p = pods.get("s").await.expect("pod");
    p.status.as_mut().expect("status").phase = Some("Running".into());
    p.metadata.labels = Some([("ignored".to_string(), "yes".to_string())].into());
    let after = pods
        .replace_status("s", &pp, &p)
        .await
        .expect("status update");
    assert_eq!(
        after.status.and_then(|s| s.phase).as_deref(),
        Some("Running")
    );

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..5 {
        cms.create(
            &pp,
            &from(json!({"metadata": {"name": format!("page{i}")}})),
        )
        .await
        .expect("cm");
    }
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut lp = ListParams::default().limit(2);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = cms.list(&lp).await.expect("page");
        pages += 1;
        assert!(page.items.len() <= 2);
        // The namespace's published cluster CA (`kube-root-ca.crt`) is not ours to count.
        names.extend(
            page.items
                .iter()
                .filter_map(|c| c.metadata.name.clone())
                .filter(|n| n != "kube-root-ca.crt"),
        );
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names, vec!["page0", "page1", "page2", "page3", "page4"]);

    let mut stream = cms
        .watch(&WatchParams::streaming_lists(), "0")
        .await
        .expect("watch")
        .boxed();
    let mut added = 0;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("in time")
            .expect("event")
            .expect("ok");
        match ev {
            WatchEvent::Added(cm) if cm.metadata.name.as_deref() != Some("kube-root-ca.crt") => {
                added += 1
            }
            WatchEvent::Added(_) => {}
            WatchEvent::Bookmark(b) => {
                assert_eq!(
                    b.metadata
                        .annotations
                        .get("k8s.io/initial-events-end")
                        .map(String::as_str),
                    Some("true")
                );
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(added, 5);
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_written_through_events_k8s_io_show_in_describe() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let p = pods
        .create(&PostParams::default(), &from(json!({"metadata": {"name": "ev"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})))
        .await
        .expect("pod");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    events
        .create(&PostParams::default(), &from(json!({
            "metadata": {"name": "ev.1"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "ev", "namespace": "default", "uid": p.metadata.uid},
            "reason": "Pulled", "note": "Container image \"busybox\" already present on machine",
            "type": "Normal", "action": "Pull", "reportingController": "kubelet", "reportingInstance": "n1"})))
        .await
        .expect("event");
    let back = events
        .get("ev.1")
        .await
        .expect("read through events.k8s.io");
    assert_eq!(
        back.note.as_deref(),
        Some("Container image \"busybox\" already present on machine")
    );
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let as_core = core.get("ev.1").await.expect("read through core v1");
    assert_eq!(as_core.involved_object.name.as_deref(), Some("ev"));
    let d = c.kubectl(&["describe", "pod", "ev"]).await;
    let text = d.ok();
    assert!(text.contains("already present on machine"), "{text}");
    c.handle.shutdown().await;
}
