//! The real kubectl's typed clients send bodies of built-in kinds as
//! `application/vnd.kubernetes.protobuf` (and accept protobuf or JSON back):
//! `create configmap|deployment|namespace|secret|serviceaccount|service|priorityclass|pdb`
//! must succeed against nodus, print nothing on stderr, and store what the equivalent JSON
//! body would have stored. (`kubectl scale` sends a JSON merge patch to `/scale` and
//! `kubectl expose` a JSON Service; both run on a protobuf-created deployment.)

mod common;

use nodus_control_plane::apiserver::protobuf;
use serde_json::{Value, json};

async fn get_json(c: &common::Cluster, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    let out = c.kubectl(&all).await;
    serde_json::from_str(out.ok()).unwrap_or_else(|e| panic!("kubectl {all:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_typed_create_and_scale_send_protobuf() {
    let c = common::start().await;

    let created = [
        (
            vec!["create", "configmap", "x", "--from-literal=a=b"],
            "configmap/x created",
        ),
        (
            vec!["create", "deployment", "d", "--image=busybox"],
            "deployment.apps/d created",
        ),
        (vec!["create", "namespace", "n"], "namespace/n created"),
        (
            vec!["create", "secret", "generic", "s", "--from-literal=k=v"],
            "secret/s created",
        ),
        (
            vec!["create", "serviceaccount", "sa"],
            "serviceaccount/sa created",
        ),
        (
            vec!["create", "service", "clusterip", "svc", "--tcp=80:8080"],
            "service/svc created",
        ),
        (
            vec!["scale", "deployment", "d", "--replicas=3"],
            "deployment.apps/d scaled",
        ),
    ];
    for (args, expected) in created {
        let out = c.kubectl(&args).await;
        assert_eq!(out.ok().trim(), expected, "kubectl {args:?}");
    }

    let cm = get_json(&c, &["configmap", "x"]).await;
    assert_eq!(cm["data"], json!({"a": "b"}));
    assert_eq!(cm["metadata"]["namespace"], json!("default"));
    assert!(cm["metadata"]["uid"].is_string(), "{cm}");

    let d = get_json(&c, &["deployment", "d"]).await;
    assert_eq!(d["spec"]["replicas"], json!(3), "scaled: {d}");
    assert_eq!(d["spec"]["selector"]["matchLabels"], json!({"app": "d"}));
    let container = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], json!("busybox"));
    assert_eq!(container["image"], json!("busybox"));

    let ns = get_json(&c, &["namespace", "n"]).await;
    assert_eq!(ns["status"]["phase"], json!("Active"));

    // The protobuf body carries the raw bytes; the stored object has them base64-encoded.
    let s = get_json(&c, &["secret", "s"]).await;
    assert_eq!(s["data"], json!({"k": "dg=="}));
    assert_eq!(s["type"], json!("Opaque"));

    let sa = get_json(&c, &["serviceaccount", "sa"]).await;
    assert_eq!(sa["metadata"]["name"], json!("sa"));

    let svc = get_json(&c, &["service", "svc"]).await;
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}])
    );
    assert_eq!(svc["spec"]["type"], json!("ClusterIP"));
    assert!(svc["spec"]["clusterIP"].is_string(), "allocated: {svc}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_typed_kinds_named_ports_and_int_or_string() {
    let c = common::start().await;
    let created = [
        (
            vec!["create", "service", "nodeport", "np", "--tcp=80:http"],
            "service/np created",
        ),
        (
            vec![
                "create",
                "priorityclass",
                "pc",
                "--value=5",
                "--description=d",
            ],
            "priorityclass.scheduling.k8s.io/pc created",
        ),
        (
            vec![
                "create",
                "poddisruptionbudget",
                "pdb",
                "--selector=a=b",
                "--min-available=50%",
            ],
            "poddisruptionbudget.policy/pdb created",
        ),
        (
            vec![
                "create",
                "deployment",
                "web",
                "--image=nginx",
                "--replicas=0",
                "--port=8080",
            ],
            "deployment.apps/web created",
        ),
        (
            vec![
                "expose",
                "deployment",
                "web",
                "--port=80",
                "--target-port=8080",
            ],
            "service/web exposed",
        ),
    ];
    for (args, expected) in created {
        let out = c.kubectl(&args).await;
        assert_eq!(out.ok().trim(), expected, "kubectl {args:?}");
    }

    let np = get_json(&c, &["service", "np"]).await;
    assert_eq!(np["spec"]["ports"][0]["targetPort"], json!("http"));
    assert!(np["spec"]["ports"][0]["nodePort"].is_u64(), "{np}");

    let pc = get_json(&c, &["priorityclass", "pc"]).await;
    assert_eq!(pc["value"], json!(5));
    assert_eq!(pc["description"], json!("d"));

    let pdb = get_json(&c, &["pdb", "pdb"]).await;
    assert_eq!(pdb["spec"]["minAvailable"], json!("50%"));

    // `replicas` is a pointer upstream: an explicit 0 must not be defaulted to 1.
    let web = get_json(&c, &["deployment", "web"]).await;
    assert_eq!(web["spec"]["replicas"], json!(0), "{web}");
    assert_eq!(
        web["spec"]["template"]["spec"]["containers"][0]["ports"],
        json!([{"containerPort": 8080, "protocol": "TCP"}])
    );

    // kubectl scale merge-patches /scale in JSON (not protobuf); checked here because it
    // acts on a deployment whose body came in as protobuf with a pointer replicas of 0.
    c.kubectl(&["scale", "deployment", "web", "--replicas=2"])
        .await
        .ok();
    let out = c
        .kubectl(&["scale", "deployment", "web", "--replicas=0"])
        .await;
    assert_eq!(out.ok().trim(), "deployment.apps/web scaled");
    let web = get_json(&c, &["deployment", "web"]).await;
    assert_eq!(web["spec"]["replicas"], json!(0), "{web}");

    let exposed = get_json(&c, &["service", "web"]).await;
    assert_eq!(exposed["spec"]["ports"][0]["targetPort"], json!(8080));
    assert_eq!(exposed["spec"]["selector"], json!({"app": "web"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_protobuf_body_is_a_bad_request() {
    let c = common::start().await;
    let client = c.client().await;
    let req = http::Request::post("/api/v1/namespaces/default/configmaps")
        .header("content-type", protobuf::PROTOBUF)
        .body(b"k8s\0\xff\xff".to_vec())
        .expect("request");
    let err = client
        .request_text(req)
        .await
        .expect_err("garbage is refused");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err}");
    };
    assert_eq!(status.code, 400, "{status:?}");
    assert!(
        status.message.starts_with("malformed protobuf envelope"),
        "{}",
        status.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_only_clients_get_protobuf_others_json() {
    let c = common::start().await;
    let client = c.client().await;
    let cm = json!({
        "kind": "ConfigMap", "apiVersion": "v1",
        "metadata": {"name": "pb", "namespace": "default"},
        "data": {"k": "v"}
    });
    let create = http::Request::post("/api/v1/namespaces/default/configmaps")
        .header("content-type", protobuf::PROTOBUF)
        .header("accept", protobuf::PROTOBUF)
        .body(kube::client::Body::from(
            protobuf::encode(&cm).expect("encodes"),
        ))
        .expect("request");
    let resp = client.send(create).await.expect("create");
    assert_eq!(resp.status(), 201);
    assert_eq!(resp.headers()["content-type"], protobuf::PROTOBUF);
    let body = resp.into_body().collect_bytes().await.expect("body");
    let created = protobuf::decode(&body).expect("a protobuf ConfigMap");
    assert_eq!(created["data"], json!({"k": "v"}));
    assert!(created["metadata"]["uid"].is_string(), "{created}");

    // What client-go sends: JSON is acceptable, and nodus answers JSON.
    let get = http::Request::get("/api/v1/namespaces/default/configmaps/pb")
        .header(
            "accept",
            "application/vnd.kubernetes.protobuf,application/json",
        )
        .body(kube::client::Body::empty())
        .expect("request");
    let resp = client.send(get).await.expect("get");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
}
