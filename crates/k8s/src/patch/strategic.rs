//! Strategic merge patch as the API server applies it (`StrategicMergeMapPatch` with
//! parallel deletion lists merged and unmatched nulls ignored).

use serde_json::{Map, Value};

use super::PatchError;
use super::schema::{FieldMeta, Ty, lookup, type_name};
use crate::gvk::Gvk;

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_PREFIX: &str = "$deleteFromPrimitiveList/";
const ORDER_PREFIX: &str = "$setElementOrder/";

fn invalid(msg: impl Into<String>) -> PatchError {
    PatchError::Invalid(msg.into())
}

/// Applies a strategic merge patch to an object of a built-in kind. Kinds outside the
/// catalogue (CRDs, unknown kinds) get [`PatchError::StrategicNotSupported`] (415 upstream).
pub fn strategic_merge_patch(
    gvk: &Gvk,
    original: &Value,
    patch: &Value,
) -> Result<Value, PatchError> {
    if !super::supports_strategic(gvk) {
        return Err(PatchError::StrategicNotSupported(gvk.kind.clone()));
    }
    let Value::Object(p) = patch else {
        return Err(invalid(format!(
            "json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
            go_kind(patch)
        )));
    };
    let o = match original {
        Value::Object(o) => o.clone(),
        _ => Map::new(),
    };
    let kind: &'static str = crate::catalog::by_kind(&gvk.group, &gvk.kind).map_or("", |r| r.kind);
    merge_map(o, p.clone(), Ty::Root(kind)).map(Value::Object)
}

fn go_kind(v: &Value) -> &'static str {
    match v {
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "bool",
        Value::Null => "null",
        Value::Object(_) => "object",
    }
}

fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    ty: Ty,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(d) = patch.get(DIRECTIVE) {
        return match d.as_str() {
            Some("replace") => {
                patch.remove(DIRECTIVE);
                Ok(patch)
            }
            Some("delete") => Ok(Map::new()),
            _ => Err(invalid(format!(
                "unknown patch type: {d} in map: {}",
                Value::Object(patch.clone())
            ))),
        };
    }
    apply_retain_keys(&mut original, &mut patch)?;
    merge_ordered_lists(&mut original, &mut patch, ty)?;
    for (key, patch_v) in patch {
        let (k, is_delete_list) = match key.strip_prefix(DELETE_PREFIX) {
            Some(rest) => (rest.to_string(), true),
            None => (key, false),
        };
        if patch_v.is_null() {
            original.remove(&k);
            continue;
        }
        let meta = lookup(ty, &k);
        let Some(orig_v) = original.remove(&k) else {
            if !is_delete_list {
                original.insert(k, clean(patch_v, meta)?);
            }
            continue;
        };
        let merged = match (orig_v, patch_v) {
            (Value::Object(o), Value::Object(p)) => Value::Object(merge_map(o, p, meta.ty)?),
            (Value::Array(o), Value::Array(p)) => {
                Value::Array(merge_slice_handler(o, p, meta, is_delete_list)?)
            }
            (orig_v, patch_v) => {
                if is_delete_list {
                    orig_v
                } else if std::mem::discriminant(&orig_v) != std::mem::discriminant(&patch_v) {
                    clean(patch_v, meta)?
                } else {
                    patch_v
                }
            }
        };
        original.insert(k, merged);
    }
    Ok(original)
}

/// A patch value landing where the original has nothing comparable: directives are resolved
/// against an empty original and nulls dropped, so none leak into the stored object.
fn clean(v: Value, meta: FieldMeta) -> Result<Value, PatchError> {
    match v {
        Value::Object(p) => Ok(Value::Object(merge_map(Map::new(), p, meta.ty)?)),
        // With nothing to merge into, upstream takes the list as given minus its directives
        // (no merge keys are required; validation reports missing ones).
        Value::Array(p) if meta.merge => {
            let mut out = Vec::with_capacity(p.len());
            for item in p {
                match item {
                    Value::Object(m) if m.contains_key(DIRECTIVE) => {}
                    Value::Object(m) => out.push(Value::Object(merge_map(Map::new(), m, meta.ty)?)),
                    other => out.push(other),
                }
            }
            Ok(Value::Array(out))
        }
        Value::Array(p) => Ok(Value::Array(p.into_iter().map(discard_nulls).collect())),
        other => Ok(other),
    }
}

fn discard_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, discard_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(discard_nulls).collect()),
        other => other,
    }
}

fn apply_retain_keys(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
) -> Result<(), PatchError> {
    let Some(retain) = patch.remove(RETAIN_KEYS) else {
        return Ok(());
    };
    let bad = || invalid("invalid patch format of retainKeys");
    let Value::Array(list) = retain else {
        return Err(bad());
    };
    let keep: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
    for (k, v) in patch.iter() {
        if v.is_null() || k.starts_with(DELETE_PREFIX) || k.starts_with(ORDER_PREFIX) {
            continue;
        }
        if !keep.contains(&k.as_str()) {
            return Err(bad());
        }
    }
    original.retain(|k, _| keep.contains(&k.as_str()));
    Ok(())
}

/// Handles every `$setElementOrder/<field>` directive together with its patch list.
fn merge_ordered_lists(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
    ty: Ty,
) -> Result<(), PatchError> {
    let order_keys: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(ORDER_PREFIX))
        .cloned()
        .collect();
    for order_key in order_keys {
        let Some(order_v) = patch.remove(&order_key) else {
            continue;
        };
        let field = &order_key[ORDER_PREFIX.len()..];
        let Value::Array(order) = order_v else {
            return Err(invalid("invalid patch format of setElementOrder list"));
        };
        let meta = lookup(ty, field);
        let orig_list = match original.get(field) {
            None => None,
            Some(Value::Array(a)) => Some(a.clone()),
            Some(_) => return Err(invalid("invalid patch format of setElementOrder list")),
        };
        let patch_list = match patch.remove(field) {
            None => None,
            Some(Value::Array(a)) => Some(a),
            Some(_) => return Err(invalid("invalid patch format of setElementOrder list")),
        };
        validate_order(patch_list.as_deref().unwrap_or(&[]), &order, meta.key)?;
        let merged = match (orig_list.clone(), patch_list) {
            (Some(o), None) => o,
            (None, Some(p)) => merge_slice_handler(Vec::new(), p, meta, false)?,
            (Some(o), Some(p)) => merge_slice_handler(o, p, meta, false)?,
            (None, None) => continue,
        };
        let (in_order, server_only): (Vec<Value>, Vec<Value>) = merged
            .into_iter()
            .partition(|item| index_of(&order, item, meta.key).is_some());
        let both = normalize_element_order(
            in_order,
            server_only,
            &order,
            orig_list.as_deref().unwrap_or(&[]),
            meta.key,
        );
        original.insert(field.to_string(), Value::Array(both));
    }
    Ok(())
}

/// The patch list must follow the relative order of its `$setElementOrder` list.
fn validate_order(
    patch_list: &[Value],
    order: &[Value],
    key: Option<&str>,
) -> Result<(), PatchError> {
    let mut last = None;
    for item in patch_list {
        if key.is_some() && item.get(DIRECTIVE).is_some() {
            continue;
        }
        let Some(i) = index_of(order, item, key) else {
            return Err(invalid("invalid patch format of setElementOrder list"));
        };
        if last.is_some_and(|l| i < l) {
            return Err(invalid("invalid patch format of setElementOrder list"));
        }
        last = Some(i);
    }
    Ok(())
}

fn merge_slice_handler(
    original: Vec<Value>,
    patch: Vec<Value>,
    meta: FieldMeta,
    is_delete_list: bool,
) -> Result<Vec<Value>, PatchError> {
    if meta.merge || is_delete_list {
        merge_slice(original, patch, meta, is_delete_list)
    } else {
        Ok(patch)
    }
}

fn merge_slice(
    original: Vec<Value>,
    patch: Vec<Value>,
    meta: FieldMeta,
    is_delete_list: bool,
) -> Result<Vec<Value>, PatchError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let first = original.first().or(patch.first());
    if original.iter().chain(&patch).any(Value::is_array) {
        return Err(invalid("cannot merge lists of lists"));
    }
    let maps = first.is_some_and(Value::is_object);
    if maps && original.iter().chain(&patch).any(|v| !v.is_object()) {
        return Err(invalid("mismatched types of elements in the list"));
    }
    let (server_order, patch, merged) = if !maps {
        if is_delete_list {
            return Ok(original
                .into_iter()
                .filter(|v| !patch.contains(v))
                .collect());
        }
        let mut merged: Vec<Value> = Vec::new();
        for v in original.iter().chain(&patch) {
            if !merged.contains(v) {
                merged.push(v.clone());
            }
        }
        (original, patch, merged)
    } else {
        let Some(key) = meta.key else {
            return Err(invalid(format!(
                "cannot merge lists without merge key for {}",
                type_name(meta.ty)
            )));
        };
        let (original, patch) = merge_special_elements(original, patch, key, meta.ty)?;
        let mut merged = original.clone();
        for item in &patch {
            let Some(kv) = item.get(key) else {
                return Err(invalid(format!(
                    "map: {item} does not contain declared merge key: {key}"
                )));
            };
            match merged.iter().position(|o| o.get(key) == Some(kv)) {
                Some(i) => {
                    let (Value::Object(o), Value::Object(p)) = (merged[i].clone(), item.clone())
                    else {
                        continue;
                    };
                    merged[i] = Value::Object(merge_map(o, p, meta.ty)?);
                }
                None => merged.push(clean(
                    item.clone(),
                    FieldMeta {
                        ty: meta.ty,
                        merge: false,
                        key: None,
                    },
                )?),
            }
        }
        (original, patch, merged)
    };
    let (in_patch, server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|item| index_of(&patch, item, meta.key).is_some());
    Ok(normalize_element_order(
        in_patch,
        server_only,
        &patch,
        &server_order,
        meta.key,
    ))
}

/// Resolves `$patch: delete` and `$patch: replace` elements of a merge-keyed list.
fn merge_special_elements(
    original: Vec<Value>,
    patch: Vec<Value>,
    key: &str,
    ty: Ty,
) -> Result<(Vec<Value>, Vec<Value>), PatchError> {
    let mut original = original;
    let mut rest = Vec::new();
    let mut replace = false;
    for item in patch {
        match item.get(DIRECTIVE) {
            None => rest.push(item),
            Some(d) => match d.as_str() {
                Some("delete") => {
                    let Some(kv) = item.get(key) else {
                        return Err(invalid(format!(
                            "map: {item} does not contain declared merge key: {key}"
                        )));
                    };
                    original.retain(|o| o.get(key) != Some(kv));
                }
                Some("replace") => replace = true,
                Some("merge") => {
                    return Err(invalid(
                        "merging lists cannot yet be specified in the patch",
                    ));
                }
                _ => return Err(invalid(format!("unknown patch type: {d} in map: {item}"))),
            },
        }
    }
    if replace {
        let elem = FieldMeta {
            ty,
            merge: false,
            key: None,
        };
        let cleaned = rest
            .into_iter()
            .map(|v| clean(v, elem))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((cleaned, Vec::new()))
    } else {
        Ok((original, rest))
    }
}

fn index_of(list: &[Value], item: &Value, key: Option<&str>) -> Option<usize> {
    match key {
        Some(k) => {
            let v = item.get(k)?;
            list.iter().position(|o| o.get(k) == Some(v))
        }
        None => list.iter().position(|o| o == item),
    }
}

/// Upstream's `normalizeElementOrder`: patch items in patch order, server-only items in
/// server order, interleaved where the server order relates them.
fn normalize_element_order(
    mut patch_items: Vec<Value>,
    mut server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    patch_items.sort_by_key(|v| index_of(patch_order, v, key).unwrap_or(usize::MAX));
    server_only.sort_by_key(|v| index_of(server_order, v, key).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        patch_items.into_iter().peekable(),
    );
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => match (
                index_of(server_order, l, key),
                index_of(server_order, r, key),
            ) {
                (Some(li), Some(ri)) => li < ri,
                _ => false,
            },
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(kind: &str, original: Value, patch: Value) -> Result<Value, String> {
        let gvk = match kind {
            "Deployment" => Gvk::new("apps", "v1", kind),
            "Job" | "CronJob" => Gvk::new("batch", "v1", kind),
            _ => Gvk::new("", "v1", kind),
        };
        strategic_merge_patch(&gvk, &original, &patch).map_err(|e| e.to_string())
    }

    fn deployment(containers: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "patch-demo"},
               "spec": {"replicas": 2, "template": {"spec": {"containers": containers}}}})
    }

    #[test]
    fn kubectl_docs_containers_merge_by_name() {
        // kubectl patch docs: the new container lands first, the existing one is kept.
        let orig = deployment(json!([{"name": "patch-demo-ctr", "image": "nginx"}]));
        let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "patch-demo-ctr-2", "image": "redis"}]}}}});
        let out = smp("Deployment", orig, patch);
        assert_eq!(
            out.map(|o| o["spec"]["template"]["spec"]["containers"].clone()),
            Ok(
                json!([{"name": "patch-demo-ctr-2", "image": "redis"}, {"name": "patch-demo-ctr", "image": "nginx"}])
            )
        );
    }

    #[test]
    fn kubectl_docs_tolerations_are_replaced() {
        let orig = deployment(json!([{"name": "c", "image": "nginx"}]));
        let mut orig = orig;
        orig["spec"]["template"]["spec"]["tolerations"] =
            json!([{"key": "dedicated", "value": "test-team", "effect": "NoSchedule"}]);
        let patch = json!({"spec": {"template": {"spec": {"tolerations": [{"effect": "NoSchedule", "key": "disktype", "value": "ssd"}]}}}});
        let out = smp("Deployment", orig, patch);
        assert_eq!(
            out.map(|o| o["spec"]["template"]["spec"]["tolerations"].clone()),
            Ok(json!([{"effect": "NoSchedule", "key": "disktype", "value": "ssd"}]))
        );
    }

    #[test]
    fn existing_item_merges_in_place() {
        let orig = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}]}});
        let patch = json!({"spec": {"containers": [{"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}]}]}});
        let out = smp("Pod", orig, patch);
        assert_eq!(
            out.map(|o| o["spec"]["containers"].clone()),
            Ok(json!([
                {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}, {"name": "X", "value": "1"}]},
                {"name": "b", "image": "b:1"}]))
        );
    }

    #[test]
    fn patch_directives_in_lists() {
        let orig = json!({"spec": {"containers": [{"name": "a", "image": "a"}, {"name": "b", "image": "b"}]}});
        let del = json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}});
        assert_eq!(
            smp("Pod", orig.clone(), del).map(|o| o["spec"]["containers"].clone()),
            Ok(json!([{"name": "b", "image": "b"}]))
        );
        let rep =
            json!({"spec": {"containers": [{"name": "c", "image": "c"}, {"$patch": "replace"}]}});
        assert_eq!(
            smp("Pod", orig.clone(), rep).map(|o| o["spec"]["containers"].clone()),
            Ok(json!([{"name": "c", "image": "c"}]))
        );
        let merge = json!({"spec": {"containers": [{"$patch": "merge"}]}});
        assert_eq!(
            smp("Pod", orig.clone(), merge),
            Err("merging lists cannot yet be specified in the patch".into())
        );
        let no_key = json!({"spec": {"containers": [{"image": "x"}]}});
        assert!(
            smp("Pod", orig, no_key)
                .is_err_and(|e| e.contains("does not contain declared merge key: name"))
        );
    }

    #[test]
    fn patch_directives_in_maps() {
        let orig = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        let rep = json!({"metadata": {"labels": {"c": "3", "$patch": "replace"}}});
        assert_eq!(
            smp("Pod", orig.clone(), rep).map(|o| o["metadata"]["labels"].clone()),
            Ok(json!({"c": "3"}))
        );
        let del = json!({"metadata": {"labels": {"$patch": "delete"}}});
        assert_eq!(
            smp("Pod", orig.clone(), del).map(|o| o["metadata"]["labels"].clone()),
            Ok(json!({}))
        );
        let null = json!({"metadata": {"labels": {"a": null, "z": "9"}}});
        assert_eq!(
            smp("Pod", orig, null).map(|o| o["metadata"]["labels"].clone()),
            Ok(json!({"b": "2", "z": "9"}))
        );
    }

    #[test]
    fn retain_keys_clears_other_union_members() {
        let mut orig = deployment(json!([]));
        orig["spec"]["strategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}});
        let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}});
        assert_eq!(
            smp("Deployment", orig.clone(), patch).map(|o| o["spec"]["strategy"].clone()),
            Ok(json!({"type": "Recreate"}))
        );
        let bad = json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {}}}});
        assert_eq!(
            smp("Deployment", orig, bad),
            Err("invalid patch format of retainKeys".into())
        );
    }

    #[test]
    fn primitive_lists_finalizers_and_deletion_lists() {
        let orig = json!({"metadata": {"finalizers": ["a", "b"]}});
        assert_eq!(
            smp(
                "Pod",
                orig.clone(),
                json!({"metadata": {"finalizers": ["c", "a"]}})
            )
            .map(|o| o["metadata"]["finalizers"].clone()),
            Ok(json!(["c", "a", "b"]))
        );
        let del = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}});
        assert_eq!(
            smp("Pod", orig, del).map(|o| o["metadata"]["finalizers"].clone()),
            Ok(json!(["b"]))
        );
        // A list without patchStrategy (container args) is replaced.
        let o = json!({"spec": {"containers": [{"name": "a", "args": ["x", "y"]}]}});
        let p = json!({"spec": {"containers": [{"name": "a", "args": ["z"]}]}});
        assert_eq!(
            smp("Pod", o, p).map(|o| o["spec"]["containers"][0]["args"].clone()),
            Ok(json!(["z"]))
        );
    }

    #[test]
    fn set_element_order() {
        let orig = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
        let patch = json!({"spec": {"$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "b"}],
                                    "containers": [{"name": "a", "image": "new"}]}});
        assert_eq!(
            smp("Pod", orig, patch).map(|o| o["spec"]["containers"].clone()),
            Ok(json!([{"name": "c"}, {"name": "a", "image": "new"}, {"name": "b"}]))
        );
        let orig = json!({"metadata": {"finalizers": ["a", "b"]}});
        let patch = json!({"metadata": {"$setElementOrder/finalizers": ["b", "a", "x"], "finalizers": ["x"]}});
        assert_eq!(
            smp("Pod", orig, patch).map(|o| o["metadata"]["finalizers"].clone()),
            Ok(json!(["b", "a", "x"]))
        );
    }

    #[test]
    fn status_and_port_merge_keys() {
        let orig = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}]}});
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(
            smp("Node", orig, patch).map(|o| o["status"]["conditions"].clone()),
            Ok(
                json!([{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}])
            )
        );
        let orig = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}});
        let patch = json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}, {"port": 443}]}});
        assert_eq!(
            smp("Service", orig, patch).map(|o| o["spec"]["ports"].clone()),
            Ok(json!([{"port": 80, "targetPort": 9090}, {"port": 443}]))
        );
    }

    #[test]
    fn directives_never_leak_into_new_fields() {
        let orig = json!({"metadata": {"name": "p"}});
        let patch = json!({"spec": {"containers": [{"name": "a", "image": "x", "env": null}, {"$patch": "replace"}]}});
        assert_eq!(
            smp("Pod", orig, patch).map(|o| o["spec"].clone()),
            Ok(json!({"containers": [{"name": "a", "image": "x"}]}))
        );
    }

    #[test]
    fn new_lists_need_no_merge_keys() {
        let orig = json!({"metadata": {"name": "p"}});
        let patch =
            json!({"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "name": "rs"}]}});
        assert_eq!(
            smp("Pod", orig, patch).map(|o| o["metadata"]["ownerReferences"].clone()),
            Ok(json!([{"kind": "ReplicaSet", "name": "rs"}]))
        );
    }

    #[test]
    fn scale_subresource_patches() {
        let gvk = Gvk::new("autoscaling", "v1", "Scale");
        let out = strategic_merge_patch(
            &gvk,
            &json!({"spec": {"replicas": 1}}),
            &json!({"spec": {"replicas": 3}}),
        );
        assert_eq!(out, Ok(json!({"spec": {"replicas": 3}})));
    }

    #[test]
    fn unknown_kinds_are_unsupported() {
        let gvk = Gvk::new("example.com", "v1", "Widget");
        assert_eq!(
            strategic_merge_patch(&gvk, &json!({}), &json!({})).map_err(|e| e.to_string()),
            Err("strategic merge patch is not supported for Widget".into())
        );
    }

    #[test]
    fn job_and_cronjob_containers_merge_by_name() {
        let c = |image: &str| json!([{"name": "a", "image": image}, {"name": "b", "image": "b"}]);
        let job = json!({"spec": {"template": {"spec": {"containers": c("old")}}}});
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [{"name": "a", "image": "new"}]}}}});
        assert_eq!(
            smp("Job", job, patch).map(|o| o["spec"]["template"]["spec"]["containers"].clone()),
            Ok(c("new"))
        );
        let cj = json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": c("old")}}}}}});
        let patch = json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {
            "containers": [{"name": "a", "image": "new"}]}}}}}});
        assert_eq!(
            smp("CronJob", cj, patch).map(|o| o["spec"]["jobTemplate"]["spec"]["template"]["spec"]
                ["containers"]
                .clone()),
            Ok(c("new"))
        );
    }
}
