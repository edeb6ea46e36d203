//! A restart on the same data dir keeps every object and resourceVersions keep increasing.

mod common;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use nodus_control_plane::apiserver::state::ApiConfig;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_and_revisions_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = common::start_in(dir.path(), ApiConfig::default()).await;
    let api: Api<ConfigMap> =
        Api::namespaced(common::client_for(&first.kubeconfig).await, "default");
    let mut last = 0u64;
    for i in 0..5 {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("c{i}")}})).expect("cm");
        let o = api
            .create(&PostParams::default(), &cm)
            .await
            .expect("create");
        last = o
            .metadata
            .resource_version
            .unwrap_or_default()
            .parse()
            .expect("rv");
    }
    first.shutdown().await;

    let second = common::start_in(dir.path(), ApiConfig::default()).await;
    let api: Api<ConfigMap> =
        Api::namespaced(common::client_for(&second.kubeconfig).await, "default");
    let list = api.list(&Default::default()).await.expect("list");
    let names: Vec<_> = list
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    for i in 0..5 {
        assert!(names.contains(&format!("c{i}")), "{names:?}");
    }
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "after"}})).expect("cm");
    let o = api
        .create(&PostParams::default(), &cm)
        .await
        .expect("create after restart");
    let rv: u64 = o
        .metadata
        .resource_version
        .unwrap_or_default()
        .parse()
        .expect("rv");
    assert!(
        rv > last,
        "resourceVersion {rv} after restart is above {last}"
    );
    second.shutdown().await;
}
