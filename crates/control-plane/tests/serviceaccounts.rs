//! Service-account tokens as users meet them with the real kubectl: `kubectl create token`
//! (audiences, duration, bound pod), the token authenticating requests and TokenReviews,
//! refusals of wrong-audience, tampered, expired and invalidated tokens, the OIDC discovery
//! documents whose JWKS verifies a token, ServiceAccount admission's token volume, and the
//! `kube-root-ca.crt` ConfigMap in every namespace.

mod common;

use base64::Engine;
use serde_json::{Value, json};

const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const UNAUTHORIZED: &str = "error: You must be logged in to the server (Unauthorized)";

fn b64url(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

fn claims_of(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("a JWT");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url payload");
    serde_json::from_slice(&bytes).expect("JSON claims")
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// kubectl with only a server, the CA and a bearer token (no client certificate).
async fn with_token(c: &common::Cluster, token: &str, args: &[&str]) -> common::Out {
    let empty = c.dir.path().join("empty.kubeconfig");
    std::fs::write(&empty, "apiVersion: v1\nkind: Config\n").unwrap();
    let server = format!("--server={}", c.handle.url);
    let ca = format!(
        "--certificate-authority={}",
        c.dir.path().join("pki/ca.crt").display()
    );
    let tok = format!("--token={token}");
    let mut all = vec![server.as_str(), ca.as_str(), tok.as_str()];
    all.extend_from_slice(args);
    common::kubectl_with(&empty, &all, None).await
}

/// The TokenReview status the API server gives for `token` (and `audiences`).
async fn review(c: &common::Cluster, token: &str, audiences: &[&str]) -> Value {
    let mut tr = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token}});
    if !audiences.is_empty() {
        tr["spec"]["audiences"] = json!(audiences);
    }
    let out = c
        .kubectl_stdin(
            &[
                "create",
                "--raw",
                "/apis/authentication.k8s.io/v1/tokenreviews",
                "-f",
                "-",
            ],
            Some(&tr.to_string()),
        )
        .await;
    let v: Value = serde_json::from_str(out.ok()).expect("TokenReview JSON");
    v["status"].clone()
}

async fn create_token(c: &common::Cluster, args: &[&str]) -> String {
    let mut all = vec!["create", "token"];
    all.extend_from_slice(args);
    c.kubectl(&all).await.ok().trim().to_string()
}

/// A token signed with the cluster's own key, for claims no TokenRequest would give.
fn forge(c: &common::Cluster, claims: &Value) -> String {
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
    let pem = std::fs::read(c.dir.path().join("pki/sa.key")).unwrap();
    let der = rustls_pemfile::private_key(&mut pem.as_slice())
        .unwrap()
        .unwrap();
    let rng = ring::rand::SystemRandom::new();
    let key =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der.secret_der(), &rng).unwrap();
    let input = format!(
        "{}.{}",
        b64url(br#"{"alg":"ES256"}"#),
        b64url(claims.to_string().as_bytes())
    );
    let sig = key.sign(&rng, input.as_bytes()).unwrap();
    format!("{input}.{}", b64url(sig.as_ref()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_issued_authenticated_and_refused_as_upstream() {
    let c = common::start().await;
    let key_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(c.dir.path().join("pki/sa.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(key_mode & 0o777, 0o600);
    c.kubectl(&["create", "serviceaccount", "builder"])
        .await
        .ok();
    let sa: Value = serde_json::from_str(
        c.kubectl(&["get", "sa", "builder", "-o", "json"])
            .await
            .ok(),
    )
    .unwrap();
    let sa_uid = sa["metadata"]["uid"].as_str().unwrap().to_string();

    // Defaults: the API server's audience, an hour.
    let plain = create_token(&c, &["builder"]).await;
    let cl = claims_of(&plain);
    assert_eq!(cl["iss"], ISSUER);
    assert_eq!(cl["sub"], "system:serviceaccount:default:builder");
    assert_eq!(cl["aud"], json!([ISSUER]));
    assert_eq!(
        cl["exp"].as_i64().unwrap() - cl["iat"].as_i64().unwrap(),
        3600
    );
    assert_eq!(
        cl["kubernetes.io"]["serviceaccount"]["uid"],
        sa_uid.as_str()
    );
    assert!(cl["kubernetes.io"].get("pod").is_none());

    // The token authenticates a request, as that service account.
    let doc = with_token(
        &c,
        &plain,
        &["get", "--raw", "/.well-known/openid-configuration"],
    )
    .await;
    let doc: Value = serde_json::from_str(doc.ok()).unwrap();
    assert_eq!(doc["issuer"], ISSUER);
    let st = review(&c, &plain, &[]).await;
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(
        st["user"]["username"],
        "system:serviceaccount:default:builder"
    );
    assert_eq!(st["user"]["uid"], sa_uid.as_str());
    assert_eq!(
        st["user"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ])
    );
    assert_eq!(st["audiences"], json!([ISSUER]));
    assert_eq!(
        st["user"]["extra"]["authentication.kubernetes.io/credential-id"],
        json!([format!("JTI={}", cl["jti"].as_str().unwrap())])
    );

    // The JWKS verifies the token's signature.
    let jwks: Value =
        serde_json::from_str(c.kubectl(&["get", "--raw", "/openid/v1/jwks"]).await.ok()).unwrap();
    let k = &jwks["keys"][0];
    assert_eq!(
        (k["kty"].as_str(), k["alg"].as_str()),
        (Some("EC"), Some("ES256"))
    );
    let dec = |f: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(k[f].as_str().unwrap())
            .unwrap()
    };
    let mut point = vec![4u8];
    point.extend(dec("x"));
    point.extend(dec("y"));
    let (signed, sig) = plain.rsplit_once('.').unwrap();
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &point)
        .verify(
            signed.as_bytes(),
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(sig)
                .unwrap(),
        )
        .expect("the JWKS key verifies the token");
    assert!(
        doc["jwks_uri"]
            .as_str()
            .unwrap()
            .ends_with("/openid/v1/jwks")
    );

    // Another audience and duration.
    let vault = create_token(&c, &["builder", "--audience", "vault", "--duration", "20m"]).await;
    let cl = claims_of(&vault);
    assert_eq!(cl["aud"], json!(["vault"]));
    assert_eq!(
        cl["exp"].as_i64().unwrap() - cl["iat"].as_i64().unwrap(),
        1200
    );
    let refused = with_token(
        &c,
        &vault,
        &["get", "--raw", "/.well-known/openid-configuration"],
    )
    .await;
    assert!(refused.fails().contains(UNAUTHORIZED), "{}", refused.stderr);
    let st = review(&c, &vault, &[]).await;
    assert_eq!(st.get("authenticated"), None, "{st}");
    assert_eq!(
        st["error"],
        format!(
            "[invalid bearer token, token audiences [\"vault\"] is invalid for the target audiences [\"{ISSUER}\"]]"
        )
    );
    let st = review(&c, &vault, &["vault", "other"]).await;
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(st["audiences"], json!(["vault"]));

    // Too short a lifetime is Invalid, with upstream's text.
    let short = c
        .kubectl(&["create", "token", "builder", "--duration", "5m"])
        .await;
    assert!(
        short.fails().contains(
            "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 300: may not specify a duration less than 10 minutes"
        ),
        "{}",
        short.stderr
    );
    let missing = c.kubectl(&["create", "token", "nobody"]).await;
    assert!(
        missing
            .fails()
            .contains("serviceaccounts \"nobody\" not found"),
        "{}",
        missing.stderr
    );

    // Tampered: the payload changed under the signature.
    let mut parts: Vec<String> = plain.split('.').map(str::to_string).collect();
    let mut forged_claims = claims_of(&plain);
    forged_claims["sub"] = json!("system:serviceaccount:kube-system:default");
    parts[1] = b64url(forged_claims.to_string().as_bytes());
    let tampered = parts.join(".");
    let refused = with_token(
        &c,
        &tampered,
        &["get", "--raw", "/.well-known/openid-configuration"],
    )
    .await;
    assert!(refused.fails().contains(UNAUTHORIZED), "{}", refused.stderr);
    let st = review(&c, &tampered, &[]).await;
    assert!(
        st["error"]
            .as_str()
            .unwrap()
            .contains("error in cryptographic primitive"),
        "{st}"
    );

    // Expired (beyond the minute of leeway), signed with the real key.
    let mut old = claims_of(&plain);
    old["iat"] = json!(now() - 4000);
    old["nbf"] = json!(now() - 4000);
    old["exp"] = json!(now() - 400);
    let expired = forge(&c, &old);
    let refused = with_token(
        &c,
        &expired,
        &["get", "--raw", "/.well-known/openid-configuration"],
    )
    .await;
    assert!(refused.fails().contains(UNAUTHORIZED), "{}", refused.stderr);
    let st = review(&c, &expired, &[]).await;
    assert_eq!(
        st["error"],
        "[invalid bearer token, service account token has expired]"
    );

    // Bound to a pod: the pod's name and uid are in the token and its user.
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: worker}\nspec:\n  serviceAccountName: builder\n  containers: [{name: c, image: busybox}]\n",
    )
    .await
    .ok();
    let pod_uid = c
        .kubectl(&["get", "pod", "worker", "-o", "jsonpath={.metadata.uid}"])
        .await
        .ok()
        .to_string();
    let bound = create_token(
        &c,
        &[
            "builder",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "worker",
        ],
    )
    .await;
    let cl = claims_of(&bound);
    assert_eq!(
        cl["kubernetes.io"]["pod"],
        json!({"name": "worker", "uid": pod_uid})
    );
    let st = review(&c, &bound, &[]).await;
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(
        st["user"]["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["worker"])
    );
    assert_eq!(
        st["user"]["extra"]["authentication.kubernetes.io/pod-uid"],
        json!([pod_uid])
    );
    let other = c
        .kubectl(&[
            "create",
            "token",
            "default",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "worker",
        ])
        .await;
    assert!(
        other.fails().contains(
            "cannot bind token for serviceaccount \"default\" to pod running with different serviceaccount name."
        ),
        "{}",
        other.stderr
    );

    // The pod goes: its token is refused; the plain token still works.
    c.kubectl(&["delete", "pod", "worker", "--grace-period=0", "--force"])
        .await;
    common::eventually("the pod is gone", || async {
        let out = c.kubectl(&["get", "pod", "worker"]).await;
        (out.code != 0).then_some(())
    })
    .await;
    let refused = with_token(
        &c,
        &bound,
        &["get", "--raw", "/.well-known/openid-configuration"],
    )
    .await;
    assert!(refused.fails().contains(UNAUTHORIZED), "{}", refused.stderr);
    let st = review(&c, &bound, &[]).await;
    assert_eq!(
        st["error"],
        "[invalid bearer token, service account token has been invalidated]"
    );
    assert_eq!(review(&c, &plain, &[]).await["authenticated"], true);

    // A token bound to a Node (upstream's node binding): it names the node, authenticates
    // while the Node exists and is refused once it is gone.
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: Node\nmetadata: {name: builder-node}\n"),
    )
    .await
    .ok();
    let node_uid = c
        .kubectl(&[
            "get",
            "node",
            "builder-node",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .await
        .ok()
        .to_string();
    let node_bound = create_token(
        &c,
        &[
            "builder",
            "--bound-object-kind",
            "Node",
            "--bound-object-name",
            "builder-node",
        ],
    )
    .await;
    assert_eq!(
        claims_of(&node_bound)["kubernetes.io"]["node"],
        json!({"name": "builder-node", "uid": node_uid})
    );
    let st = review(&c, &node_bound, &[]).await;
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(
        st["user"]["extra"]["authentication.kubernetes.io/node-name"],
        json!(["builder-node"])
    );
    c.kubectl(&["delete", "node", "builder-node"]).await.ok();
    let st = review(&c, &node_bound, &[]).await;
    assert_eq!(
        st["error"],
        "[invalid bearer token, service account token has been invalidated]"
    );

    // The service account goes: every token of it is refused.
    c.kubectl(&["delete", "sa", "builder"]).await.ok();
    let refused = with_token(
        &c,
        &plain,
        &["get", "--raw", "/.well-known/openid-configuration"],
    )
    .await;
    assert!(refused.fails().contains(UNAUTHORIZED), "{}", refused.stderr);
    let st = review(&c, &plain, &[]).await;
    assert_eq!(
        st["error"],
        "[invalid bearer token, serviceaccounts \"builder\" not found]"
    );
    // A new account of the same name has another uid.
    c.kubectl(&["create", "serviceaccount", "builder"])
        .await
        .ok();
    let st = review(&c, &plain, &[]).await;
    assert!(
        st["error"]
            .as_str()
            .unwrap()
            .contains(&format!("does not match claim ({sa_uid})")),
        "{st}"
    );
    c.handle.shutdown().await;
}

fn token_volume(pod: &Value) -> Option<&Value> {
    pod["spec"]["volumes"].as_array()?.iter().find(|v| {
        v["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("kube-api-access-"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_mounts_the_token_volume_and_the_ca_is_published() {
    let c = common::start().await;
    c.kubectl(&["create", "namespace", "team"]).await.ok();
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: app, namespace: team}\nspec:\n  initContainers: [{name: init, image: busybox}]\n  containers:\n  - {name: a, image: busybox}\n  - name: b\n    image: busybox\n    volumeMounts: [{name: own, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}]\n  volumes: [{name: own, emptyDir: {}}]\n",
    )
    .await
    .ok();
    let pod: Value = serde_json::from_str(
        c.kubectl(&["get", "pod", "app", "-n", "team", "-o", "json"])
            .await
            .ok(),
    )
    .unwrap();
    assert_eq!(pod["spec"]["serviceAccountName"], "default");
    let vol = token_volume(&pod).expect("a kube-api-access volume");
    let name = vol["name"].as_str().unwrap();
    assert_eq!(name.len(), "kube-api-access-".len() + 5, "{name}");
    assert_eq!(
        vol["projected"],
        json!({"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]})
    );
    let mount = json!({"name": name, "readOnly": true,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
    assert!(
        pod["spec"]["initContainers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(&mount)
    );
    assert!(
        pod["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(&mount)
    );
    assert_eq!(
        pod["spec"]["containers"][1]["volumeMounts"],
        json!([{"name": "own", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}])
    );

    // Opting out on the pod, or on the account.
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: quiet, namespace: team}\nspec:\n  automountServiceAccountToken: false\n  containers: [{name: a, image: busybox}]\n",
    )
    .await
    .ok();
    c.apply(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: nomount, namespace: team}\nautomountServiceAccountToken: false\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: viasa, namespace: team}\nspec:\n  serviceAccountName: nomount\n  containers: [{name: a, image: busybox}]\n",
    )
    .await
    .ok();
    for p in ["quiet", "viasa"] {
        let pod: Value = serde_json::from_str(
            c.kubectl(&["get", "pod", p, "-n", "team", "-o", "json"])
                .await
                .ok(),
        )
        .unwrap();
        assert!(token_volume(&pod).is_none(), "{p}: {pod}");
        assert!(
            pod["spec"]["containers"][0].get("volumeMounts").is_none(),
            "{p}"
        );
    }

    // A service account that does not exist.
    let refused = c
        .apply(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: lost, namespace: team}\nspec:\n  serviceAccountName: ghost\n  containers: [{name: a, image: busybox}]\n",
        )
        .await;
    assert!(
        refused.fails().contains(
            "pods \"lost\" is forbidden: error looking up service account team/ghost: serviceaccount \"ghost\" not found"
        ),
        "{}",
        refused.stderr
    );

    // The cluster CA is published in every namespace, and put back when deleted.
    let ca = std::fs::read_to_string(c.dir.path().join("pki/ca.crt")).unwrap();
    for ns in ["team", "default", "kube-system"] {
        let got = common::eventually("kube-root-ca.crt", || async {
            let out = c
                .kubectl(&[
                    "get",
                    "configmap",
                    "kube-root-ca.crt",
                    "-n",
                    ns,
                    "-o",
                    "json",
                ])
                .await;
            (out.code == 0).then(|| serde_json::from_str::<Value>(&out.stdout).unwrap())
        })
        .await;
        assert_eq!(got["data"]["ca.crt"], ca.as_str(), "{ns}");
    }
    c.kubectl(&["delete", "configmap", "kube-root-ca.crt", "-n", "team"])
        .await
        .ok();
    common::eventually("kube-root-ca.crt is re-created", || async {
        let out = c
            .kubectl(&[
                "get",
                "configmap",
                "kube-root-ca.crt",
                "-n",
                "team",
                "-o",
                "json",
            ])
            .await;
        (out.code == 0).then_some(())
    })
    .await;
    c.handle.shutdown().await;
}
