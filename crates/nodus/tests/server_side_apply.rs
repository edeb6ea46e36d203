//! Server-side apply through the real kubectl against `nodus control-plane`: `kubectl apply
//! --server-side` creates, drops what a later apply no longer names, refuses to change a
//! field another manager owns with upstream's conflict message unless forced, shows the
//! managed fields, dry-runs, and applies ConfigMaps and custom resources alike.

mod common;

use std::sync::Arc;

use common::cluster::ControlPlane;
use serde_json::Value;

fn deploy(replicas: u32, annotations: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
  annotations: {annotations}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
      - name: app
        image: registry.invalid/app:1
        ports: [{{containerPort: 80}}]
"#
    )
}

const REPLICAS_ONLY: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\nspec: {replicas: 5}\n";

/// The managed fields entry of `manager`.
fn entry<'a>(obj: &'a Value, manager: &str) -> Option<&'a Value> {
    obj["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| e["manager"] == manager)
}

#[test]
fn server_side_apply_with_kubectl() {
    if !common::have_root() {
        return;
    }
    let netns = Arc::new(testkit::Netns::new("ssa").expect("netns"));
    let cp = ControlPlane::start(netns);
    let ssa = |args: &[&str], yaml: &str| {
        let mut all = vec!["apply", "--server-side", "-f", "-"];
        all.extend_from_slice(args);
        cp.kubectl_stdin(&all, yaml)
    };
    let get = |args: &[&str]| {
        let mut all = args.to_vec();
        all.push("--show-managed-fields");
        cp.get_json(&all)
    };

    // Create.
    let (ok, out, err) = ssa(&[], &deploy(2, "{a: one, b: two}"));
    assert!(ok, "{out}{err}\n{}", cp.log());
    assert_eq!(out.trim(), "deployment.apps/web serverside-applied");
    let d = get(&["deployment", "web", "-n", "default"]).expect("web");
    assert_eq!(d["spec"]["replicas"], 2);
    let mine = entry(&d, "kubectl").unwrap_or_else(|| panic!("no kubectl entry: {d}"));
    assert_eq!(mine["operation"], "Apply");
    assert_eq!(mine["apiVersion"], "apps/v1");
    assert_eq!(mine["fieldsType"], "FieldsV1");
    assert_eq!(
        mine["fieldsV1"]["f:spec"]["f:replicas"],
        serde_json::json!({})
    );
    assert!(
        mine["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"app\"}"]
            ["f:ports"]
            .get("k:{\"containerPort\":80,\"protocol\":\"TCP\"}")
            .is_some(),
        "{mine}"
    );

    // Reapplying without annotation b removes it.
    let (ok, out, err) = ssa(&[], &deploy(2, "{a: one}"));
    assert!(ok, "{out}{err}");
    let d = get(&["deployment", "web", "-n", "default"]).expect("web");
    let ann = &d["metadata"]["annotations"];
    assert_eq!(ann["a"], "one", "{ann}");
    assert!(ann.get("b").is_none(), "b survived: {ann}");

    // Another manager changing replicas conflicts, with upstream's message.
    let (ok, out, err) = ssa(&["--field-manager=other"], REPLICAS_ONLY);
    assert!(!ok, "{out}");
    assert!(
        err.contains(
            "Apply failed with 1 conflict: conflict with \"kubectl\" using apps/v1: .spec.replicas"
        ),
        "{err}"
    );
    let d = get(&["deployment", "web", "-n", "default"]).expect("web");
    assert_eq!(d["spec"]["replicas"], 2);

    // A server-side dry run changes nothing.
    let (ok, out, err) = ssa(
        &[
            "--field-manager=other",
            "--force-conflicts",
            "--dry-run=server",
        ],
        REPLICAS_ONLY,
    );
    assert!(
        ok && out.contains("serverside-applied (server dry run)"),
        "{out}{err}"
    );
    let d = get(&["deployment", "web", "-n", "default"]).expect("web");
    assert_eq!(d["spec"]["replicas"], 2);

    // --force-conflicts wins, and the field moves to the new manager.
    let (ok, out, err) = ssa(
        &["--field-manager=other", "--force-conflicts"],
        REPLICAS_ONLY,
    );
    assert!(ok, "{out}{err}");
    let d = get(&["deployment", "web", "-n", "default"]).expect("web");
    assert_eq!(d["spec"]["replicas"], 5);
    let other = entry(&d, "other").expect("other's entry");
    assert_eq!(other["operation"], "Apply");
    assert_eq!(
        other["fieldsV1"],
        serde_json::json!({"f:spec": {"f:replicas": {}}})
    );
    let mine = entry(&d, "kubectl").expect("kubectl's entry");
    assert!(
        mine["fieldsV1"]["f:spec"].get("f:replicas").is_none(),
        "{mine}"
    );

    // The YAML view shows the entries; without the flag kubectl hides them.
    let (ok, out, err) = cp.kubectl(&[
        "get",
        "deployment",
        "web",
        "-n",
        "default",
        "-o",
        "yaml",
        "--show-managed-fields",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("managedFields:")
            && out.contains("manager: other")
            && out.contains("operation: Apply"),
        "{out}"
    );
    let (_, out, _) = cp.kubectl(&["get", "deployment", "web", "-n", "default", "-o", "yaml"]);
    assert!(!out.contains("managedFields:"), "{out}");

    // An imperative change is an Update by its manager: kubectl scale takes replicas.
    let (ok, out, err) = cp.kubectl(&[
        "scale",
        "deployment",
        "web",
        "-n",
        "default",
        "--replicas=1",
    ]);
    assert!(ok, "{out}{err}");
    let d = get(&["deployment", "web", "-n", "default"]).expect("web");
    assert_eq!(d["spec"]["replicas"], 1);

    // ConfigMaps: create, then drop a key.
    let cm = |data: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings, namespace: default}}\ndata: {data}\n"
        )
    };
    let (ok, out, err) = ssa(&[], &cm("{a: '1', b: '2'}"));
    assert!(
        ok && out.trim() == "configmap/settings serverside-applied",
        "{out}{err}"
    );
    let (ok, out, err) = ssa(&[], &cm("{a: '3'}"));
    assert!(ok, "{out}{err}");
    let c = get(&["configmap", "settings", "-n", "default"]).expect("settings");
    assert_eq!(c["data"], serde_json::json!({"a": "3"}), "{c}");
    assert_eq!(
        entry(&c, "kubectl").map(|e| e["operation"].clone()),
        Some("Apply".into())
    );

    // A custom resource goes through the same path.
    let crd = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
              color: {type: string}
"#;
    let (ok, out, err) = ssa(&[], crd);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/gadgets.example.com",
        "--timeout=30s",
    ]);
    assert!(ok, "{out}{err}");
    let gadget = |spec: &str| {
        format!(
            "apiVersion: example.com/v1\nkind: Gadget\nmetadata: {{name: g1, namespace: default}}\nspec: {spec}\n"
        )
    };
    let (ok, out, err) = ssa(&[], &gadget("{size: 1, color: red}"));
    assert!(
        ok && out.trim() == "gadget.example.com/g1 serverside-applied",
        "{out}{err}"
    );
    let (ok, out, err) = ssa(&[], &gadget("{size: 2}"));
    assert!(ok, "{out}{err}");
    let g = get(&["gadget", "g1", "-n", "default"]).expect("g1");
    assert_eq!(g["spec"], serde_json::json!({"size": 2}), "{g}");
    let (ok, _, err) = ssa(&["--field-manager=other"], &gadget("{size: 3}"));
    assert!(
        !ok && err.contains(
            "Apply failed with 1 conflict: conflict with \"kubectl\" using example.com/v1: .spec.size"
        ),
        "{err}"
    );
}
