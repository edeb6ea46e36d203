//! The faulty proxy in front of a real registry damages exactly what its rule says.

use std::time::Duration;

use testkit::image::{busybox, sha256_digest};
use testkit::registry::RegistryClient;
use testkit::{Fault, FaultRule, FaultTarget, FaultyProxy, Registry};

#[tokio::test]
async fn faults_are_injected() {
    let reg = Registry::start().unwrap();
    let img = busybox();
    reg.push("library/busybox", "latest", &img).await.unwrap();
    let layer = img.layers[0].clone();
    let (repo, digest) = ("library/busybox", layer.digest.as_str());

    let proxy = FaultyProxy::start(reg.addr(), Fault::PassThrough).unwrap();
    let client = RegistryClient::new(&proxy.host(), None);
    let blob = client.get_blob(repo, digest).await.unwrap();
    assert_eq!(sha256_digest(&blob), layer.digest);
    assert_eq!(proxy.injected(), 0);

    // Pushing through the proxy works too (upload Locations point back at it).
    client
        .push_image("through/proxy", "v1", &img)
        .await
        .unwrap();

    proxy.set_rule(Fault::FlipByte { offset: 1000 });
    let blob = client.get_blob(repo, digest).await.unwrap();
    assert_eq!(blob.len() as u64, layer.size());
    assert_ne!(sha256_digest(&blob), layer.digest);
    assert_eq!(blob[1000], layer.blob[1000] ^ 0xff);
    assert_eq!(proxy.injected(), 1);
    // Manifests are untouched by a blob rule.
    let m = client.get_manifest(repo, "latest").await.unwrap();
    assert_eq!(m.body, img.manifest);

    proxy.set_rule(Fault::ShortBody { len: 100 });
    assert_eq!(client.get_blob(repo, digest).await.unwrap().len(), 100);

    proxy.set_rule(Fault::TruncateBody { after: 100 });
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://{}/v2/{repo}/blobs/{digest}", proxy.host());
    let resp = http.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.content_length(), Some(layer.size()));
    let err = resp.bytes().await.unwrap_err();
    eprintln!("truncated: {err:#}");
    assert!(client.get_blob(repo, digest).await.is_err());

    proxy.set_rule(FaultRule::manifests(Fault::Status(500)).times(1));
    let err = client.get_manifest(repo, "latest").await.unwrap_err();
    assert!(format!("{err:#}").contains("500"), "{err:#}");
    client.get_manifest(repo, "latest").await.unwrap();
    assert_eq!(proxy.injected(), 1);

    proxy.set_rule(FaultRule {
        fault: Fault::Hang,
        target: FaultTarget::All,
        times: None,
    });
    let url = format!("http://{}/v2/", proxy.host());
    let r = tokio::time::timeout(Duration::from_millis(500), http.get(&url).send()).await;
    assert!(r.is_err(), "hang: no answer");

    proxy.set_rule(Fault::StallBody { after: 10 });
    let url = format!("http://{}/v2/{repo}/blobs/{digest}", proxy.host());
    let resp = http.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let r = tokio::time::timeout(Duration::from_millis(500), resp.bytes()).await;
    assert!(r.is_err(), "stalled body never completes");
    assert!(proxy.requests() >= 8);
}
