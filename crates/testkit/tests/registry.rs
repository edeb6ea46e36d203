//! The real registry: anonymous, basic-auth and token-auth; pushing and reading back.

use testkit::image::{ManifestFormat, busybox, busybox_multiplatform, sha256_digest};
use testkit::registry::{Corruption, Registry};

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json";

#[tokio::test]
async fn push_busybox_and_read_it_back() {
    let reg = Registry::start().unwrap();
    let img = busybox();
    let digest = reg.push("library/busybox", "latest", &img).await.unwrap();
    assert_eq!(digest, img.manifest_digest);

    let resp = http()
        .get(format!("{}/v2/library/busybox/manifests/latest", reg.url()))
        .header("accept", ACCEPT)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["docker-content-digest"], digest.as_str());
    assert_eq!(resp.headers()["content-type"], img.media_type());
    let body = resp.bytes().await.unwrap();
    assert_eq!(sha256_digest(&body), digest);
    assert_eq!(body, img.manifest);

    let layer = &img.layers[0];
    let blob = reg
        .client()
        .get_blob("library/busybox", &layer.digest)
        .await
        .unwrap();
    assert_eq!(sha256_digest(&blob), layer.digest);

    // Pushing again is a no-op that still succeeds (blobs exist).
    reg.push("library/busybox", "again", &img).await.unwrap();

    // corrupt_blob: the registry serves damaged bytes.
    reg.corrupt_blob(&layer.digest, Corruption::Truncate(10))
        .unwrap();
    let blob = reg
        .client()
        .get_blob("library/busybox", &layer.digest)
        .await
        .unwrap();
    assert_eq!(blob.len(), 10);

    reg.delete_manifest("library/busybox", &digest)
        .await
        .unwrap();
    let err = reg
        .client()
        .get_manifest("library/busybox", "latest")
        .await
        .unwrap_err();
    assert!(format!("{err:#}").contains("404"), "{err:#}");
}

#[tokio::test]
async fn push_multiplatform_indexes() {
    let reg = Registry::start().unwrap();
    for (format, tag) in [
        (ManifestFormat::Oci, "oci"),
        (ManifestFormat::Docker, "docker"),
    ] {
        let index = busybox_multiplatform(format);
        let digest = reg.push_index("multi", tag, &index).await.unwrap();
        let got = reg.client().get_manifest("multi", tag).await.unwrap();
        assert_eq!(got.digest.as_deref(), Some(digest.as_str()));
        assert_eq!(got.media_type, format.index_media_type());
        let arm = index.image_for("arm64").unwrap();
        let child = reg
            .client()
            .get_manifest("multi", &arm.manifest_digest)
            .await
            .unwrap();
        assert_eq!(child.media_type, format.manifest_media_type());
        assert_eq!(child.body, arm.manifest);
    }
}

#[tokio::test]
async fn basic_auth_registry() {
    let reg = Registry::start_with_basic_auth("alice", "s3cret").unwrap();
    let img = busybox();
    reg.push("private/busybox", "v1", &img).await.unwrap();

    let url = format!("{}/v2/private/busybox/manifests/v1", reg.url());
    let anon = http()
        .get(&url)
        .header("accept", ACCEPT)
        .send()
        .await
        .unwrap();
    assert_eq!(anon.status(), 401);
    let challenge = anon.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(challenge.starts_with("Basic "), "{challenge}");

    let wrong = http()
        .get(&url)
        .basic_auth("alice", Some("nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);

    let ok = http()
        .get(&url)
        .header("accept", ACCEPT)
        .basic_auth("alice", Some("s3cret"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(
        ok.headers()["docker-content-digest"],
        img.manifest_digest.as_str()
    );

    assert!(
        reg.anonymous_client()
            .get_manifest("private/busybox", "v1")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn token_auth_registry() {
    let reg = Registry::start_with_token_auth("bob", "hunter2").unwrap();
    let img = busybox();
    reg.push("private/busybox", "v1", &img).await.unwrap();
    let tokens = reg.token_server().unwrap();
    assert!(tokens.issued() >= 1);

    // Anonymous: 401 with a Bearer challenge naming realm, service and scope.
    let url = format!("{}/v2/private/busybox/manifests/v1", reg.url());
    let anon = http()
        .get(&url)
        .header("accept", ACCEPT)
        .send()
        .await
        .unwrap();
    assert_eq!(anon.status(), 401);
    let header = anon.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string();
    let challenge = testkit::registry::Challenge::parse(&header).unwrap();
    assert_eq!(challenge.scheme, "bearer", "{header}");
    let realm = &challenge.params["realm"];
    let service = &challenge.params["service"];
    let scope = &challenge.params["scope"];
    assert_eq!(scope, "repository:private/busybox:pull");

    // The token server refuses anonymous and wrong credentials.
    let token_url = format!("{realm}?service={service}&scope={scope}");
    assert_eq!(http().get(&token_url).send().await.unwrap().status(), 401);
    let wrong = http()
        .get(&token_url)
        .basic_auth("bob", Some("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);

    // The right credentials get a token the registry accepts.
    let resp = http()
        .get(&token_url)
        .basic_auth("bob", Some("hunter2"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    let token = v["token"].as_str().unwrap();
    let ok = http()
        .get(&url)
        .header("accept", ACCEPT)
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(
        ok.headers()["docker-content-digest"],
        img.manifest_digest.as_str()
    );

    // The OAuth2 password grant (containerd's first try) works too.
    let form = resp_form(realm, service, scope).await;
    assert_eq!(form.0, 200);
    let ok = http()
        .get(&url)
        .header("accept", ACCEPT)
        .bearer_auth(&form.1)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);

    // A pull-only token cannot push; an expired token is refused.
    let push = http()
        .post(format!("{}/v2/private/busybox/blobs/uploads/", reg.url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(push.status(), 401);
    let access = [testkit::registry::Access::parse(scope).unwrap()];
    let expired = tokens.issuer().token("bob", service, &access, -3600);
    let resp = http().get(&url).bearer_auth(expired).send().await.unwrap();
    assert_eq!(resp.status(), 401);

    // A token with a bad signature is refused.
    // (Change a character in the middle: the last one may only carry padding bits.)
    let mut forged = token.as_bytes().to_vec();
    let i = forged.len() - 20;
    forged[i] = if forged[i] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let resp = http().get(&url).bearer_auth(forged).send().await.unwrap();
    assert_eq!(resp.status(), 401);

    assert!(
        reg.anonymous_client()
            .get_manifest("private/busybox", "v1")
            .await
            .is_err()
    );
}

async fn resp_form(realm: &str, service: &str, scope: &str) -> (u16, String) {
    let resp = http()
        .post(realm)
        .form(&[
            ("grant_type", "password"),
            ("username", "bob"),
            ("password", "hunter2"),
            ("service", service),
            ("scope", scope),
            ("client_id", "testkit"),
        ])
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let v: serde_json::Value = resp.json().await.unwrap();
    (
        status,
        v["access_token"].as_str().unwrap_or_default().to_string(),
    )
}

#[test]
fn cleanup_after_panic() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::panic::catch_unwind(move || {
        let reg = Registry::start_with_token_auth("u", "p").unwrap();
        tx.send((reg.pid(), reg.dir().to_path_buf())).unwrap();
        panic!("test failure while the registry runs");
    });
    assert!(result.is_err());
    let (pid, dir) = rx.recv().unwrap();
    assert!(!dir.exists(), "temp dir removed");
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    assert!(
        !comm.contains("docker-registry"),
        "registry {pid} still running"
    );
}
