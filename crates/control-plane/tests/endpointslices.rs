//! The EndpointSlice controller against the real API server: slices follow pod readiness,
//! deletion (terminating endpoints marked) and label changes; named target ports resolve
//! per pod; the legacy Endpoints object follows; slices split at max-endpoints-per-slice;
//! a service without endpoints keeps one empty slice; deleting the service removes them.

mod common;

use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nodus_control_plane::controllers::ControllersConfig;
use serde_json::json;

use common::eventually;

async fn make_pod(pods: &Api<Pod>, name: &str, ip: &str, ready: bool) {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox",
            "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &p)
        .await
        .expect("create pod");
    set_ready(pods, name, ip, ready).await;
}

async fn set_ready(pods: &Api<Pod>, name: &str, ip: &str, ready: bool) {
    let st = if ready { "True" } else { "False" };
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": st}]}}),
        ),
    )
    .await
    .expect("pod status");
}

/// (address, ready, serving, terminating) of every endpoint of the service's slices.
async fn endpoints_of(slices: &Api<EndpointSlice>, svc: &str) -> Vec<(String, bool, bool, bool)> {
    let list = slices
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}")))
        .await
        .expect("slices");
    let mut out: Vec<(String, bool, bool, bool)> = list
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .map(|e| {
            let c = e.conditions.clone().unwrap_or_default();
            (
                e.addresses[0].clone(),
                c.ready.unwrap_or(false),
                c.serving.unwrap_or(false),
                c.terminating.unwrap_or(false),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_follow_pod_readiness_and_deletion() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web", "labels": {"tier": "front"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}))
    .expect("svc");
    svcs.create(&PostParams::default(), &svc)
        .await
        .expect("svc");
    // No pods yet: one empty slice, as upstream keeps.
    let empty = eventually("placeholder slice", || async {
        let l = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await
            .ok()?;
        (l.items.len() == 1).then(|| l.items[0].clone())
    })
    .await;
    assert!(empty.endpoints.is_empty());
    let labels = empty.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("endpointslice.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("endpointslice-controller.k8s.io")
    );
    assert_eq!(labels.get("tier").map(String::as_str), Some("front"));
    let owner = &empty.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("Service", "web", Some(true))
    );

    make_pod(&pods, "a", "10.0.0.1", true).await;
    make_pod(&pods, "b", "10.0.0.2", false).await;
    let want = vec![
        ("10.0.0.1".to_string(), true, true, false),
        ("10.0.0.2".to_string(), false, false, false),
    ];
    eventually("two endpoints", || async {
        (endpoints_of(&slices, "web").await == want).then_some(())
    })
    .await;
    // The named target port resolved to the pod's containerPort; the placeholder was reused.
    let l = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await
        .expect("slices");
    assert_eq!(l.items.len(), 1);
    let s = &l.items[0];
    let port = &s.ports.clone().unwrap_or_default()[0];
    assert_eq!(
        (port.name.as_deref(), port.port, port.protocol.as_deref()),
        (Some("http"), Some(8080), Some("TCP"))
    );
    let ep = s
        .endpoints
        .iter()
        .find(|e| e.addresses[0] == "10.0.0.1")
        .expect("a");
    assert_eq!(ep.node_name.as_deref(), Some("n1"));
    assert_eq!(
        ep.target_ref.as_ref().and_then(|r| r.name.as_deref()),
        Some("a")
    );

    // Legacy Endpoints: ready and not-ready addresses.
    let eps: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    eventually("legacy endpoints", || async {
        let e = eps.get("web").await.ok()?;
        let ss = e.subsets?.into_iter().next()?;
        let ready: Vec<String> = ss
            .addresses
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.ip)
            .collect();
        let not_ready: Vec<String> = ss
            .not_ready_addresses
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.ip)
            .collect();
        (ready == ["10.0.0.1"] && not_ready == ["10.0.0.2"]).then_some(())
    })
    .await;

    // b becomes Ready.
    set_ready(&pods, "b", "10.0.0.2", true).await;
    eventually("b ready", || async {
        (endpoints_of(&slices, "web").await.iter().all(|e| e.1)).then_some(())
    })
    .await;
    // a is deleted gracefully (bound, so it terminates first): terminating, still serving.
    pods.delete("a", &DeleteParams::default())
        .await
        .expect("delete a");
    let want = vec![
        ("10.0.0.1".to_string(), false, true, true),
        ("10.0.0.2".to_string(), true, true, false),
    ];
    eventually("a terminating", || async {
        (endpoints_of(&slices, "web").await == want).then_some(())
    })
    .await;
    // The kubelet finishes the deletion: a is gone.
    pods.delete(
        "a",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("force");
    eventually("a gone", || async {
        (endpoints_of(&slices, "web").await == vec![("10.0.0.2".to_string(), true, true, false)])
            .then_some(())
    })
    .await;
    // b's labels no longer match: no endpoints, one empty slice remains.
    pods.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
    )
    .await
    .expect("relabel");
    eventually("no endpoints", || async {
        let l = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await
            .ok()?;
        (l.items.len() == 1 && l.items[0].endpoints.is_empty()).then_some(())
    })
    .await;
    // Deleting the service removes its slices.
    svcs.delete("web", &DeleteParams::default())
        .await
        .expect("delete svc");
    eventually("slices removed", || async {
        let l = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await
            .ok()?;
        l.items.is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_split_at_the_maximum_and_a_change_rewrites_one_slice() {
    let c = common::start_with_controllers(ControllersConfig {
        max_endpoints_per_slice: 2,
        ..Default::default()
    })
    .await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    for i in 1..=5 {
        make_pod(&pods, &format!("p{i}"), &format!("10.0.1.{i}"), true).await;
    }
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}))
    .expect("svc");
    svcs.create(&PostParams::default(), &svc)
        .await
        .expect("svc");
    let lp = ListParams::default().labels("kubernetes.io/service-name=web");
    let before = eventually("5 endpoints in 3 slices", || async {
        let l = slices.list(&lp).await.ok()?;
        let n: usize = l.items.iter().map(|s| s.endpoints.len()).sum();
        (n == 5 && l.items.len() == 3).then_some(l.items)
    })
    .await;
    assert!(before.iter().all(|s| s.endpoints.len() <= 2));
    // One pod turns unready: exactly one slice is rewritten.
    set_ready(&pods, "p3", "10.0.1.3", false).await;
    let after = eventually("p3 unready", || async {
        let l = slices.list(&lp).await.ok()?;
        let flipped = l.items.iter().flat_map(|s| s.endpoints.iter()).any(|e| {
            e.addresses[0] == "10.0.1.3"
                && e.conditions.as_ref().and_then(|c| c.ready) == Some(false)
        });
        flipped.then_some(l.items)
    })
    .await;
    let rv = |items: &[EndpointSlice]| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = items
            .iter()
            .map(|s| {
                (
                    s.metadata.name.clone().unwrap_or_default(),
                    s.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let changed = rv(&before)
        .iter()
        .zip(rv(&after).iter())
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(
        changed,
        1,
        "one slice rewritten: {:?} -> {:?}",
        rv(&before),
        rv(&after)
    );
}

/// Cluster DNS: `kube-system/kube-dns` sits at the tenth address of the service CIDR; the
/// nodes announcing DNS (`dns.nodus.io/serving`) are its endpoints, ready while the Node is
/// Ready and gone with the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_dns_endpoints_are_the_nodes_serving_dns() {
    use k8s_openapi::api::core::v1::Node;
    let c = common::start().await;
    let client = c.client().await;
    let services: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "kube-system");
    let nodes: Api<Node> = Api::all(client);
    let svc = eventually("the kube-dns Service", || async {
        services.get_opt("kube-dns").await.ok().flatten()
    })
    .await;
    let spec = svc.spec.expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.10"));
    let ports: Vec<(String, i32, String)> = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            (
                p.name.unwrap_or_default(),
                p.port,
                p.protocol.unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [
            ("dns".to_string(), 53, "UDP".to_string()),
            ("dns-tcp".to_string(), 53, "TCP".to_string())
        ]
    );

    for (name, ip, annotated) in [
        ("n1", "10.0.0.1", true),
        ("n2", "10.0.0.2", true),
        ("n3", "10.0.0.3", false),
    ] {
        let mut n = json!({"metadata": {"name": name}});
        if annotated {
            n["metadata"]["annotations"] = json!({"dns.nodus.io/serving": format!("{ip}:53")});
        }
        nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(n).expect("node"),
            )
            .await
            .expect("create node");
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"conditions": [{"type": "Ready", "status": "True"}],
                    "addresses": [{"type": "InternalIP", "address": ip}]}}),
                ),
            )
            .await
            .expect("node status");
    }
    eventually("both DNS nodes as ready endpoints", || async {
        let eps = endpoints_of(&slices, "kube-dns").await;
        (eps == [
            ("10.0.0.1".to_string(), true, true, false),
            ("10.0.0.2".to_string(), true, true, false),
        ])
        .then_some(())
    })
    .await;

    // A node that stops reporting Ready stays listed, not ready; a deleted node goes.
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}),
            ),
        )
        .await
        .expect("node status");
    nodes
        .delete("n2", &DeleteParams::default())
        .await
        .expect("delete node");
    eventually("n1 not ready and n2 gone", || async {
        let eps = endpoints_of(&slices, "kube-dns").await;
        (eps == [("10.0.0.1".to_string(), false, false, false)]).then_some(())
    })
    .await;
}
