//! CustomResourceDefinitions through the real kubectl against `nodus control-plane`: a CRD
//! is applied and becomes Established, its objects are validated against the structural
//! schema (422 texts), pruned and defaulted, printed with the CRD's columns, explained,
//! scaled, written through the status subresource, served at every version, and deleted
//! with the CRD.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::cluster::{ControlPlane, condition};

fn crd(extra_version: &str) -> String {
    let schema = r#"
      openAPIV3Schema:
        type: object
        description: A Widget is a test custom resource.
        properties:
          spec:
            type: object
            description: The desired state of the widget.
            required: [replicas]
            properties:
              replicas: {type: integer, minimum: 0, maximum: 10, description: How many widgets are wanted.}
              color: {type: string, enum: [red, blue], default: red}
              labels:
                type: object
                additionalProperties: {type: string}
          status:
            type: object
            properties:
              replicas: {type: integer}
              selector: {type: string}"#;
    format!(
        r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {{}}
      scale: {{specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}}
    additionalPrinterColumns:
    - {{name: Replicas, type: integer, jsonPath: .spec.replicas}}
    - {{name: Color, type: string, jsonPath: .spec.color}}
    - {{name: Age, type: date, jsonPath: .metadata.creationTimestamp}}
    schema:{schema}
{extra_version}"#
    )
}

fn widget(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: {name}, namespace: default}}\nspec: {spec}\n"
    )
}

#[test]
fn crd_lifecycle_with_kubectl() {
    if !common::have_root() {
        return;
    }
    let netns = Arc::new(testkit::Netns::new("crd-life").expect("netns"));
    let cp = ControlPlane::start(netns);
    let k = |args: &[&str]| cp.kubectl(args);
    let k_in = |args: &[&str], yaml: &str| cp.kubectl_stdin(args, yaml);
    let v1beta1 = "  - name: v1beta1\n    served: true\n    storage: false\n    schema:\n      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}\n";
    cp.apply(&crd(v1beta1));
    let (ok, out, err) = k(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.example.com",
        "--timeout=30s",
    ]);
    assert!(ok, "CRD never Established: {out}{err}\n{}", cp.log());
    let crd_obj = cp.get_json(&["crd", "widgets.example.com"]).expect("crd");
    assert_eq!(
        condition(&crd_obj, "NamesAccepted").map(|c| c["status"].clone()),
        Some("True".into())
    );
    assert_eq!(crd_obj["status"]["acceptedNames"]["kind"], "Widget");

    // Discovery: the group and its resource, with the short name.
    let (ok, out, err) = k(&["api-resources", "--api-group=example.com"]);
    assert!(
        ok && out.contains("widgets") && out.contains("wd"),
        "{out}{err}"
    );

    // Create; defaulting fills spec.color.
    cp.apply(&widget("w1", "{replicas: 2}"));
    let w = cp.get_json(&["widget", "w1", "-n", "default"]).expect("w1");
    assert_eq!(w["spec"]["color"], "red", "{w}");
    assert_eq!(w["metadata"]["generation"], 1, "{w}");

    // Applying again patches it: kubectl sends a JSON merge patch, as the OpenAPI document
    // offers no strategic merge for custom resources.
    cp.apply(&widget("w1", "{replicas: 2, color: red}"));

    // Printer columns in `kubectl get`.
    let (ok, out, err) = k(&["get", "widgets", "-n", "default"]);
    assert!(ok, "{err}");
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "REPLICAS", "COLOR", "AGE"], "{out}");
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(&row[..3], ["w1", "2", "red"], "{out}");

    // Schema validation: 422 naming the field as upstream.
    let (ok, out, err) = k_in(
        &["apply", "-f", "-"],
        &widget("bad", "{replicas: 11, color: pink}"),
    );
    assert!(!ok, "{out}");
    assert!(
        err.contains("The Widget \"bad\" is invalid")
            && err.contains(
                "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10"
            )
            && err.contains("spec.color: Unsupported value: \"pink\": supported values: \"red\", \"blue\""),
        "{err}"
    );
    let (ok, _, err) = k_in(&["create", "-f", "-"], &widget("bad", "{color: blue}"));
    assert!(
        !ok && err.contains("spec.replicas: Required value"),
        "{err}"
    );

    // Unknown fields: refused under kubectl's default strict validation, pruned otherwise.
    let pruned = widget("p1", "{replicas: 1, bogus: yes, labels: {a: b}}");
    let (ok, _, err) = k_in(&["create", "-f", "-"], &pruned);
    assert!(!ok && err.contains("unknown field \"spec.bogus\""), "{err}");
    let (ok, out, err) = k_in(&["create", "--validate=false", "-f", "-"], &pruned);
    assert!(ok, "{out}{err}");
    let p1 = cp.get_json(&["widget", "p1", "-n", "default"]).expect("p1");
    assert_eq!(p1["spec"].get("bogus"), None, "{p1}");
    assert_eq!(p1["spec"]["labels"]["a"], "b", "{p1}");

    // kubectl explain reads the CRD's schema from OpenAPI v3.
    let (ok, out, err) = k(&["explain", "widgets.spec"]);
    assert!(
        ok && out.contains("replicas") && out.contains("How many widgets are wanted."),
        "{out}{err}"
    );

    // kubectl scale goes through the scale subresource.
    let (ok, out, err) = k(&["scale", "widget", "w1", "-n", "default", "--replicas=5"]);
    assert!(ok, "{out}{err}");
    let w = cp.get_json(&["widget", "w1", "-n", "default"]).expect("w1");
    assert_eq!(w["spec"]["replicas"], 5, "{w}");
    assert_eq!(w["metadata"]["generation"], 2, "{w}");

    // The status subresource ignores spec; the main resource ignores status.
    let (ok, out, err) = k(&[
        "patch",
        "widget",
        "w1",
        "-n",
        "default",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":3,"selector":"app=w"},"spec":{"replicas":9}}"#,
    ]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = k(&[
        "patch",
        "widget",
        "w1",
        "-n",
        "default",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":7}}"#,
    ]);
    assert!(ok, "{out}{err}");
    let w = cp.get_json(&["widget", "w1", "-n", "default"]).expect("w1");
    assert_eq!(
        (
            w["spec"]["replicas"].clone(),
            w["status"]["replicas"].clone()
        ),
        (5.into(), 3.into()),
        "{w}"
    );
    let (ok, out, err) = k(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/default/widgets/w1/scale",
    ]);
    let scale: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    assert!(ok, "{err}");
    assert_eq!(
        (
            scale["spec"]["replicas"].clone(),
            scale["status"]["replicas"].clone(),
            scale["status"]["selector"].clone()
        ),
        (5.into(), 3.into(), "app=w".into()),
        "{out}"
    );

    // Selectors: metadata.name and metadata.namespace are the field selectors of custom
    // resources; labels select as for any kind.
    let (ok, out, err) = k(&[
        "get",
        "widgets",
        "-A",
        "--field-selector=metadata.name=p1",
        "-o",
        "name",
    ]);
    assert!(ok && out.trim() == "widget.example.com/p1", "{out}{err}");
    let (ok, _, err) = k(&["get", "widgets", "--field-selector=spec.replicas=1"]);
    assert!(
        !ok && err.contains("\"spec.replicas\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""),
        "{err}"
    );

    // RBAC applies to custom resources like any resource.
    for args in [
        &[
            "create",
            "clusterrole",
            "widget-reader",
            "--verb=get,list",
            "--resource=widgets.example.com",
        ][..],
        &[
            "create",
            "rolebinding",
            "alice-widgets",
            "--clusterrole=widget-reader",
            "--user=alice",
            "-n",
            "default",
        ][..],
    ] {
        let (ok, out, err) = k(args);
        assert!(ok, "{out}{err}");
    }
    let (ok, out, err) = k(&[
        "get",
        "widgets",
        "-n",
        "default",
        "--as=alice",
        "-o",
        "name",
    ]);
    assert!(ok && out.contains("widget.example.com/w1"), "{out}{err}");
    let (ok, _, err) = k(&["delete", "widget", "w1", "-n", "default", "--as=alice"]);
    assert!(
        !ok && err.contains("User \"alice\" cannot delete resource \"widgets\" in API group \"example.com\" in the namespace \"default\""),
        "{err}"
    );

    // Strategic merge patch is refused for custom resources (415), as upstream.
    let (ok, _, err) = k(&[
        "patch",
        "widget",
        "w1",
        "-n",
        "default",
        "--type=strategic",
        "-p",
        r#"{"spec":{"replicas":1}}"#,
    ]);
    assert!(
        !ok && err.contains("the body of the request was in an unknown format"),
        "{err}"
    );

    // Every served version reads the same objects (the None conversion).
    let beta = cp
        .get_json(&["widgets.v1beta1.example.com", "w1", "-n", "default"])
        .expect("v1beta1");
    assert_eq!(beta["apiVersion"], "example.com/v1beta1", "{beta}");
    assert_eq!(beta["spec"]["replicas"], 5, "{beta}");

    // CRD validation: 422 with upstream's paths.
    let bad_crd = crd("").replace("name: widgets.example.com", "name: gadgets.example.com");
    let (ok, _, err) = k_in(&["create", "-f", "-"], &bad_crd);
    assert!(
        !ok && err.contains(
            "metadata.name: Invalid value: \"gadgets.example.com\": must be spec.names.plural+\".\"+spec.group"
        ),
        "{err}"
    );
    let non_structural = crd("")
        .replace("widgets", "things")
        .replace("Widget", "Thing")
        .replace("widget", "thing")
        .replace("shortNames: [wd]", "shortNames: [th]")
        .replace("labels:\n                type: object\n", "labels:\n");
    let (ok, _, err) = k_in(&["create", "-f", "-"], &non_structural);
    assert!(
        !ok && err.contains(
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[labels].type: Required value: must not be empty for specified object fields"
        ),
        "{err}"
    );

    // Deleting the CRD deletes its objects.
    let (ok, out, err) = k(&["delete", "crd", "widgets.example.com", "--timeout=60s"]);
    assert!(ok, "{out}{err}\n{}", cp.log());
    assert!(cp.get_json(&["crd", "widgets.example.com"]).is_none());
    cp.apply(&crd(""));
    let (ok, out, err) = k(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.example.com",
        "--timeout=30s",
    ]);
    assert!(ok, "{out}{err}");
    let list = cp.wait_json(
        &["widgets", "-A"],
        Duration::from_secs(30),
        "widgets listed after re-creating the CRD",
        &String::new,
        |v| v["items"].is_array(),
    );
    assert_eq!(list["items"], serde_json::json!([]), "{list}");
}
