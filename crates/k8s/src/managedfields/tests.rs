use serde_json::json;

use super::*;
use crate::Gvk;

fn deploy_root() -> Ty {
    root_type(&Gvk::new("apps", "v1", "Deployment"))
}

fn w(manager: &str) -> Writer<'_> {
    Writer {
        manager,
        api_version: "apps/v1",
        subresource: "",
        time: "2026-12-03T15:00:00Z",
    }
}

fn deploy(replicas: i64, image: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
           "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                                 "spec": {"containers": [{"name": "app", "image": image,
                                          "ports": [{"containerPort": 80}]}]}}}})
}

fn fields_of_manager(obj: &Value, manager: &str) -> Value {
    entries(obj)
        .into_iter()
        .find(|e| e.manager == manager)
        .map(|e| e.fields.to_fields_v1())
        .unwrap_or(Value::Null)
}

#[test]
fn apply_creates_and_owns_what_it_applied() {
    let out = apply(
        None,
        &deploy(2, "nginx"),
        deploy_root(),
        &w("kubectl"),
        false,
    )
    .unwrap();
    assert_eq!(out["spec"]["replicas"], 2);
    let e = &out["metadata"]["managedFields"][0];
    assert_eq!(e["manager"], "kubectl");
    assert_eq!(e["operation"], "Apply");
    assert_eq!(e["apiVersion"], "apps/v1");
    assert_eq!(e["fieldsType"], "FieldsV1");
    assert_eq!(
        e["fieldsV1"],
        json!({
            "f:metadata": {"f:labels": {"f:app": {}}},
            "f:spec": {
                "f:replicas": {},
                "f:selector": {},
                "f:template": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {
                        ".": {}, "f:image": {}, "f:name": {},
                        "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {
                            ".": {}, "f:containerPort": {}}}}}}}}
        })
    );
}

#[test]
fn reapply_without_a_field_removes_it_unless_another_manager_owns_it() {
    let root = deploy_root();
    let mut first = deploy(2, "nginx");
    first["metadata"]["annotations"] = json!({"note": "x", "keep": "y"});
    let live = apply(None, &first, root, &w("kubectl"), false).unwrap();
    // Another manager sets the same value of `keep`: shared ownership.
    let mut shared = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "web", "annotations": {"keep": "y"}}});
    let live = apply(Some(&live), &shared, root, &w("other"), false).unwrap();
    shared = deploy(2, "nginx");
    let out = apply(Some(&live), &shared, root, &w("kubectl"), false).unwrap();
    assert_eq!(out["metadata"]["annotations"], json!({"keep": "y"}));
    // Dropping `replicas` from the configuration removes it.
    let mut no_replicas = deploy(2, "nginx");
    no_replicas["spec"]
        .as_object_mut()
        .unwrap()
        .remove("replicas");
    let out = apply(Some(&out), &no_replicas, root, &w("kubectl"), false).unwrap();
    assert!(out["spec"].get("replicas").is_none(), "{}", out["spec"]);
    assert_eq!(
        out["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx"
    );
}

#[test]
fn apply_drops_list_items_it_no_longer_applies() {
    let root = deploy_root();
    let mut two = deploy(1, "nginx");
    two["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "sidecar", "image": "busybox"}));
    let live = apply(None, &two, root, &w("kubectl"), false).unwrap();
    assert_eq!(
        live["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let out = apply(Some(&live), &deploy(1, "nginx"), root, &w("kubectl"), false).unwrap();
    let names: Vec<&str> = out["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["app"]);
}

#[test]
fn conflicts_name_the_owner_and_force_takes_ownership() {
    let root = deploy_root();
    let live = apply(None, &deploy(2, "nginx"), root, &w("kubectl"), false).unwrap();
    let partial = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                         "metadata": {"name": "web"}, "spec": {"replicas": 5}});
    let err = apply(Some(&live), &partial, root, &w("other"), false).unwrap_err();
    assert_eq!(
        err.message(),
        "Apply failed with 1 conflict: conflict with \"kubectl\" using apps/v1: .spec.replicas"
    );
    assert_eq!(
        err.causes(),
        vec![json!({"reason": "FieldManagerConflict",
                    "message": "conflict with \"kubectl\" using apps/v1",
                    "field": ".spec.replicas"})]
    );
    // The same value is no conflict: both own it.
    let same = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": "web"}, "spec": {"replicas": 2}});
    let out = apply(Some(&live), &same, root, &w("other"), false).unwrap();
    assert_eq!(
        fields_of_manager(&out, "other"),
        json!({"f:spec": {"f:replicas": {}}})
    );
    assert!(
        fields_of_manager(&out, "kubectl")["f:spec"]
            .get("f:replicas")
            .is_some()
    );
    // Forced: the value changes and the field moves.
    let out = apply(Some(&live), &partial, root, &w("other"), true).unwrap();
    assert_eq!(out["spec"]["replicas"], 5);
    assert!(
        fields_of_manager(&out, "kubectl")["f:spec"]
            .get("f:replicas")
            .is_none()
    );
    assert_eq!(
        fields_of_manager(&out, "other"),
        json!({"f:spec": {"f:replicas": {}}})
    );
}

#[test]
fn several_conflicts_group_by_manager() {
    let c = |m: &str, f: &str| Conflict {
        manager: m.into(),
        field: f.into(),
    };
    let err = Conflicts(vec![
        c("\"b\" using v1", ".data.x"),
        c("\"a\" using v1", ".data.y"),
        c("\"b\" using v1", ".data.z"),
    ]);
    assert_eq!(
        err.message(),
        "Apply failed with 3 conflicts: conflicts with \"a\" using v1:\n- .data.y\nconflicts with \"b\" using v1:\n- .data.x\n- .data.z"
    );
}

#[test]
fn merge_keyed_lists_sets_and_atomic_lists() {
    let root = deploy_root();
    let live = apply(None, &deploy(1, "nginx"), root, &w("a"), false).unwrap();
    // A second manager adds an env var to the same container and a finalizer.
    let add = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "finalizers": ["x/y"]},
        "spec": {"template": {"spec": {"containers": [
            {"name": "app", "env": [{"name": "A", "value": "1"}], "args": ["--v"]}]}}}});
    let out = apply(Some(&live), &add, root, &w("b"), false).unwrap();
    let c = &out["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "nginx");
    assert_eq!(c["env"], json!([{"name": "A", "value": "1"}]));
    assert_eq!(out["metadata"]["finalizers"], json!(["x/y"]));
    assert_eq!(
        fields_of_manager(&out, "b"),
        json!({"f:metadata": {"f:finalizers": {"v:\"x/y\"": {}}},
               "f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {
                   ".": {}, "f:args": {}, "f:name": {},
                   "f:env": {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}}}}}}}})
    );
    // Atomic list: args replaced whole.
    let args = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"template": {"spec": {"containers": [{"name": "app", "args": ["--w"]}]}}}});
    let out = apply(Some(&out), &args, root, &w("b"), false).unwrap();
    assert_eq!(
        out["spec"]["template"]["spec"]["containers"][0]["args"],
        json!(["--w"])
    );
    // b no longer applies env nor the finalizer: both go.
    assert!(
        out["spec"]["template"]["spec"]["containers"][0]
            .get("env")
            .is_none()
    );
    assert!(
        out["metadata"].get("finalizers").is_none(),
        "{}",
        out["metadata"]
    );
}

#[test]
fn updates_take_the_fields_they_change() {
    let root = deploy_root();
    let live = apply(None, &deploy(2, "nginx"), root, &w("kubectl"), false).unwrap();
    let mut new = live.clone();
    new["spec"]["replicas"] = json!(4);
    new["metadata"]["labels"]["tier"] = json!("front");
    track_update(Some(&live), &mut new, root, &w("kube-controller-manager"));
    assert_eq!(
        fields_of_manager(&new, "kube-controller-manager"),
        json!({"f:metadata": {"f:labels": {"f:tier": {}}}, "f:spec": {"f:replicas": {}}})
    );
    let e = entries(&new);
    assert_eq!(e[1].operation, Operation::Update);
    assert!(
        fields_of_manager(&new, "kubectl")["f:spec"]
            .get("f:replicas")
            .is_none()
    );
    // Removing a field drops it from every owner.
    let mut newer = new.clone();
    newer["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("app");
    track_update(Some(&new), &mut newer, root, &w("editor"));
    assert_eq!(
        fields_of_manager(&newer, "kubectl")["f:metadata"],
        Value::Null
    );
    assert_eq!(
        fields_of_manager(&newer, "editor"),
        Value::Null,
        "removal alone owns nothing"
    );
}

#[test]
fn create_owns_everything_but_identity() {
    let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "d", "uid": "u", "resourceVersion": "3",
                     "creationTimestamp": "t"},
        "data": {"k": "v"}});
    let cm = root_type(&Gvk::new("", "v1", "ConfigMap"));
    track_update(
        None,
        &mut obj,
        cm,
        &Writer {
            api_version: "v1",
            ..w("kubectl-create")
        },
    );
    assert_eq!(
        fields_of_manager(&obj, "kubectl-create"),
        json!({"f:data": {"f:k": {}}})
    );
    assert_eq!(obj["metadata"]["managedFields"][0]["operation"], "Update");
}

#[test]
fn first_apply_to_an_untracked_object_keeps_its_fields() {
    let root = deploy_root();
    let mut live = deploy(3, "nginx");
    live["metadata"]["annotations"] = json!({"old": "1"});
    let partial = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                         "metadata": {"name": "web", "annotations": {"new": "2"}}});
    let out = apply(Some(&live), &partial, root, &w("kubectl"), false).unwrap();
    assert_eq!(
        out["metadata"]["annotations"],
        json!({"old": "1", "new": "2"})
    );
    assert!(fields_of_manager(&out, "before-first-apply").is_object());
    let err = apply(
        Some(&live),
        &json!({"spec": {"replicas": 1}}),
        root,
        &w("kubectl"),
        false,
    )
    .unwrap_err();
    assert!(
        err.message().contains("\"before-first-apply\""),
        "{}",
        err.message()
    );
}

#[test]
fn custom_resources_merge_maps_and_replace_lists() {
    let root = root_type(&Gvk::new("example.com", "v1", "Widget"));
    let live = apply(
        None,
        &json!({"spec": {"size": 1, "tags": ["a"], "cfg": {"x": 1}}}),
        root,
        &w("a"),
        false,
    )
    .unwrap();
    let out = apply(
        Some(&live),
        &json!({"spec": {"tags": ["b"], "cfg": {"y": 2}}}),
        root,
        &w("b"),
        true,
    )
    .unwrap();
    assert_eq!(
        out["spec"],
        json!({"size": 1, "tags": ["b"], "cfg": {"x": 1, "y": 2}})
    );
    assert_eq!(
        fields_of_manager(&out, "a"),
        json!({"f:spec": {"f:cfg": {"f:x": {}}, "f:size": {}}})
    );
}
