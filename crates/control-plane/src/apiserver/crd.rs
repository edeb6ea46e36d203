//! apiextensions.k8s.io/v1 CustomResourceDefinitions as apiextensions-apiserver serves them.
//!
//! The CRDs are ordinary stored objects; this module owns what they *define*: a registry of
//! served custom resources ([`Registry`]) that feeds `nodus_k8s::catalog`'s dynamic part, so
//! the generic REST handlers, discovery, OpenAPI and RBAC serve custom resources exactly as
//! built-in kinds. A control loop ([`run`]) plays the roles of upstream's naming, establishing
//! and finalizer controllers: it sets `NamesAccepted` and `Established`, and when a CRD is
//! deleted it deletes every object of it before dropping the
//! `customresourcecleanup.apiextensions.k8s.io` finalizer.
//!
//! The per-request hooks (pruning, defaulting, schema validation, printer columns, scale)
//! are the free functions below; the REST handlers call them for `info.custom` targets.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use nodus_k8s::catalog::{self, ResourceInfo};
use nodus_k8s::structural;
use nodus_k8s::validation::FieldError;
use serde_json::{Value, json};

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::rest::path::Target;
use crate::apiserver::state::ApiState;
use crate::storage::Mutation;

pub(crate) const GROUP: &str = "apiextensions.k8s.io";
pub(crate) const KIND: &str = "CustomResourceDefinition";
/// Where CRDs are stored.
const PREFIX: &str = "/apiextensions.k8s.io/customresourcedefinitions/";
/// Upstream's finalizer: the CRD is kept until all its objects are gone.
pub(crate) const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// The scale subresource's JSON paths.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

/// What one served version of a CRD needs at request time.
#[derive(Clone, Debug)]
pub(crate) struct CustomVersion {
    pub schema: Value,
    pub columns: Vec<Value>,
    pub scale: Option<ScalePaths>,
}

type Key = (String, String, String);
static VERSIONS: RwLock<Option<HashMap<Key, Arc<CustomVersion>>>> = RwLock::new(None);

/// Whether a target is a CustomResourceDefinition.
pub(crate) fn is_crd(t: &Target) -> bool {
    t.info.group == GROUP && t.info.kind == KIND
}

/// The served version behind a custom resource target.
pub(crate) fn lookup(info: &ResourceInfo) -> Option<Arc<CustomVersion>> {
    if !info.custom {
        return None;
    }
    let g = VERSIONS.read().unwrap_or_else(|e| e.into_inner());
    g.as_ref()?
        .get(&(
            info.group.to_string(),
            info.version.to_string(),
            info.plural.to_string(),
        ))
        .cloned()
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn condition_true(crd: &Value, ty: &str) -> bool {
    crd.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty && c["status"] == "True"))
}

/// Rebuilds the registry from the stored CRDs: every established CRD's served versions.
fn rebuild(crds: &[Value]) {
    let mut infos = Vec::new();
    let mut versions = HashMap::new();
    for crd in crds.iter().filter(|c| condition_true(c, "Established")) {
        let spec = &crd["spec"];
        let group = s(spec, "/group");
        let plural = s(spec, "/names/plural");
        for v in spec
            .get("versions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|v| v.get("served").and_then(Value::as_bool) == Some(true))
        {
            let version = s(v, "/name");
            let mut subresources = Vec::new();
            if v.pointer("/subresources/status").is_some() {
                subresources.push("status".to_string());
            }
            let scale = v.pointer("/subresources/scale").map(|sc| ScalePaths {
                spec_replicas: s(sc, "/specReplicasPath").to_string(),
                status_replicas: s(sc, "/statusReplicasPath").to_string(),
                label_selector: Some(s(sc, "/labelSelectorPath").to_string())
                    .filter(|p| !p.is_empty()),
            });
            if scale.is_some() {
                subresources.push("scale".to_string());
            }
            infos.push(ResourceInfo {
                group: catalog::intern(group),
                version: catalog::intern(version),
                kind: catalog::intern(s(spec, "/names/kind")),
                plural: catalog::intern(plural),
                singular: catalog::intern(s(spec, "/names/singular")),
                namespaced: s(spec, "/scope") == "Namespaced",
                short_names: catalog::intern_list(&strings(spec.pointer("/names/shortNames"))),
                categories: catalog::intern_list(&strings(spec.pointer("/names/categories"))),
                verbs: nodus_k8s::catalog::ALL_VERBS,
                subresources: catalog::intern_list(&subresources),
                custom: true,
            });
            let columns = v
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_else(|| {
                    vec![json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})]
                });
            versions.insert(
                (group.to_string(), version.to_string(), plural.to_string()),
                Arc::new(CustomVersion {
                    schema: v
                        .pointer("/schema/openAPIV3Schema")
                        .cloned()
                        .unwrap_or_else(|| json!({"type": "object"})),
                    columns,
                    scale,
                }),
            );
        }
    }
    *VERSIONS.write().unwrap_or_else(|e| e.into_inner()) = Some(versions);
    catalog::set_custom(infos);
}

fn condition(ty: &str, ok: bool, reason: &str, message: &str, prev: &Value) -> Value {
    let status = if ok { "True" } else { "False" };
    // The transition time only moves when the status does.
    let since = prev
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == ty && c["status"] == status))
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(crate::apiserver::rest::now_rfc3339()));
    json!({"type": ty, "status": status, "lastTransitionTime": since, "reason": reason, "message": message})
}

/// The names this CRD conflicts on with an older CRD of the same group, as upstream's naming
/// controller reports them.
fn name_conflict(crd: &Value, older: &[&Value]) -> Option<String> {
    let spec = &crd["spec"];
    let group = s(spec, "/group");
    let plural = s(spec, "/names/plural");
    let kind = s(spec, "/names/kind");
    let shorts = strings(spec.pointer("/names/shortNames"));
    for o in older.iter().filter(|o| s(&o["spec"], "/group") == group) {
        let accepted = o
            .pointer("/status/acceptedNames")
            .unwrap_or(&o["spec"]["names"]);
        if s(accepted, "/plural") == plural {
            return Some(format!("\"{plural}\" is already in use"));
        }
        if s(accepted, "/kind") == kind {
            return Some(format!("\"{kind}\" is already in use"));
        }
        let theirs = strings(accepted.get("shortNames"));
        if let Some(sn) = shorts.iter().find(|sn| theirs.contains(sn)) {
            return Some(format!("\"{sn}\" is already in use"));
        }
    }
    None
}

/// The status a CRD should have: acceptedNames, NamesAccepted, Established, storedVersions.
fn desired_status(crd: &Value, older: &[&Value]) -> Value {
    let mut status = crd.get("status").cloned().unwrap_or_else(|| json!({}));
    if !status.is_object() {
        status = json!({});
    }
    let conflict = name_conflict(crd, older);
    let mut conditions = Vec::new();
    match &conflict {
        None => {
            status["acceptedNames"] = crd["spec"]["names"].clone();
            conditions.push(condition(
                "NamesAccepted",
                true,
                "NoConflicts",
                "no conflicts found",
                crd,
            ));
            conditions.push(condition(
                "Established",
                true,
                "InitialNamesAccepted",
                "the initial names have been accepted",
                crd,
            ));
        }
        Some(msg) => {
            conditions.push(condition("NamesAccepted", false, "NameConflict", msg, crd));
            conditions.push(condition(
                "Established",
                false,
                "NotAccepted",
                "not all names are accepted",
                crd,
            ));
        }
    }
    if crd.pointer("/metadata/deletionTimestamp").is_some() {
        conditions.push(condition(
            "Terminating",
            true,
            "InstanceDeletionInProgress",
            "CustomResource deletion is in progress",
            crd,
        ));
    }
    status["conditions"] = Value::Array(conditions);
    let storage = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["storage"] == true)
        .and_then(|v| v["name"].as_str())
        .unwrap_or("")
        .to_string();
    let mut stored = strings(status.get("storedVersions"));
    if !storage.is_empty() && !stored.contains(&storage) {
        stored.push(storage);
    }
    status["storedVersions"] = json!(stored);
    status
}

/// One pass: conditions written where they changed, the registry rebuilt, deleted CRDs'
/// objects removed.
pub(crate) fn sync(st: &ApiState) {
    let Ok((items, _)) = st.store.list(PREFIX) else {
        return;
    };
    let mut crds: Vec<Value> = items.iter().map(|s| (*s.object).clone()).collect();
    crds.sort_by(|a, b| {
        (s(a, "/metadata/creationTimestamp"), s(a, "/metadata/name"))
            .cmp(&(s(b, "/metadata/creationTimestamp"), s(b, "/metadata/name")))
    });
    let mut settled = Vec::new();
    for (i, crd) in crds.iter().enumerate() {
        let older: Vec<&Value> = crds[..i].iter().collect();
        let want = desired_status(crd, &older);
        let mut crd = crd.clone();
        if crd.get("status") != Some(&want) {
            let key = format!("{PREFIX}{}", s(&crd, "/metadata/name"));
            let out = st.store.mutate(&key, &mut |cur| {
                let Some(cur) = cur else {
                    return Ok(Mutation::Keep);
                };
                let mut new = (*cur.object).clone();
                new["status"] = want.clone();
                Ok(Mutation::Put(new))
            });
            if let Ok(Some(stored)) = out.map(|o| o.stored) {
                crd = (*stored.object).clone();
            }
        }
        settled.push(crd);
    }
    rebuild(&settled);
    super::autoregister::sync(st);
    for crd in settled
        .iter()
        .filter(|c| c.pointer("/metadata/deletionTimestamp").is_some())
    {
        cleanup(st, crd);
    }
}

/// Deletes every object of a terminating CRD, then lets the CRD go.
fn cleanup(st: &ApiState, crd: &Value) {
    let name = s(crd, "/metadata/name");
    let has_finalizer = strings(crd.pointer("/metadata/finalizers"))
        .iter()
        .any(|f| f == CLEANUP_FINALIZER);
    if !has_finalizer {
        return;
    }
    let spec = &crd["spec"];
    let group = s(spec, "/group");
    let plural = s(spec, "/names/plural");
    let version = spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["storage"] == true)
        .and_then(|v| v["name"].as_str())
        .unwrap_or("");
    let prefix = format!("/{group}/{plural}/");
    let Ok((items, _)) = st.store.list(&prefix) else {
        return;
    };
    let mut remaining = 0;
    if let Some(info) = catalog::by_plural(group, version, plural) {
        for obj in &items {
            let t = Target {
                info,
                namespace: obj
                    .object
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                name: None,
                sub: None,
                watch_path: false,
                rest: Vec::new(),
            };
            let obj_name = s(&obj.object, "/metadata/name");
            match delete_object(st, &t, obj_name, &DeleteOptions::default()) {
                Ok(o) if o.pointer("/metadata/deletionTimestamp").is_some() => remaining += 1,
                _ => {}
            }
        }
    } else {
        for obj in &items {
            let _ = st.store.delete(&obj.key, None);
        }
    }
    if remaining == 0 {
        crate::apiserver::controllers::drop_finalizer(
            st,
            &format!("{PREFIX}{name}"),
            CLEANUP_FINALIZER,
        );
    }
}

/// Runs [`sync`] on every change to a CRD, and every few seconds for deletions waiting on
/// finalizers of their objects.
pub(crate) async fn run(st: Arc<ApiState>) {
    loop {
        let rev = st.store.revision();
        let st2 = st.clone();
        let _ = tokio::task::spawn_blocking(move || sync(&st2)).await;
        let Ok(mut rx) = st.store.watch(PREFIX, rev) else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        loop {
            tokio::select! {
                ev = rx.recv() => {
                    if ev.is_none() {
                        break;
                    }
                    while rx.try_recv().is_ok() {}
                }
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
            let st2 = st.clone();
            let _ = tokio::task::spawn_blocking(move || sync(&st2)).await;
        }
        // A watch refused at once (an identity that may not read CRDs) is not retried hot.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

// ---- request hooks for custom resources ----

/// Prunes undeclared fields and applies defaults; returns the pruned paths (for
/// `fieldValidation`).
pub(crate) fn normalize(t: &Target, obj: &mut Value) -> Vec<String> {
    let Some(v) = lookup(t.info) else {
        return Vec::new();
    };
    let pruned = structural::prune(&v.schema, obj);
    structural::apply_defaults(&v.schema, obj);
    // Defaults may carry fields the schema does not declare; they go too.
    structural::prune(&v.schema, obj);
    pruned
}

/// The fields of `obj` its schema does not declare, without changing it.
pub(crate) fn unknown_fields(t: &Target, obj: &Value) -> Vec<String> {
    let Some(v) = lookup(t.info) else {
        return Vec::new();
    };
    let mut copy = obj.clone();
    structural::prune(&v.schema, &mut copy)
}

/// Validates a custom object against its version's schema.
pub(crate) fn validate(t: &Target, obj: &Value) -> Vec<FieldError> {
    let Some(v) = lookup(t.info) else {
        return Vec::new();
    };
    // metadata is validated as ObjectMeta elsewhere; the schema covers the rest.
    let mut body = obj.clone();
    if let Some(o) = body.as_object_mut() {
        o.remove("metadata");
    }
    structural::validate(&v.schema, &body)
}

/// A Table of custom objects with the version's additionalPrinterColumns.
pub(crate) fn table(t: &Target, objects: &[Value]) -> Option<Value> {
    let v = lookup(t.info)?;
    let mut columns = vec![json!({"name": "Name", "type": "string", "format": "name",
        "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
        "priority": 0})];
    for c in &v.columns {
        columns.push(json!({
            "name": c["name"], "type": c["type"],
            "format": c.get("format").cloned().unwrap_or(json!("")),
            "description": c.get("description").cloned().unwrap_or(json!("")),
            "priority": c.get("priority").cloned().unwrap_or(json!(0)),
        }));
    }
    let now = crate::apiserver::rest::now_ts();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![o.pointer("/metadata/name").cloned().unwrap_or(Value::Null)];
            for c in &v.columns {
                cells.push(cell(o, c, now));
            }
            json!({"cells": cells, "object": nodus_k8s::printers::partial_metadata(o)})
        })
        .collect();
    Some(
        json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {},
        "columnDefinitions": columns, "rows": rows}),
    )
}

fn cell(obj: &Value, col: &Value, now: k8s_openapi::jiff::Timestamp) -> Value {
    let Some(found) = json_path(obj, s(col, "/jsonPath")) else {
        return Value::Null;
    };
    let ty = s(col, "/type");
    match &found {
        Value::String(ts) if ty == "date" => ts
            .parse::<k8s_openapi::jiff::Timestamp>()
            .map(|t| {
                json!(nodus_k8s::printers::human_duration(
                    now.as_second() - t.as_second()
                ))
            })
            .unwrap_or_else(|_| found.clone()),
        Value::String(_) => found.clone(),
        other if ty == "string" => json!(other.to_string()),
        _ => found.clone(),
    }
}

/// The JSONPath subset printer columns use: `.a.b`, `.a[0].b`, `.a[?(@.k=="v")].b`.
fn json_path(obj: &Value, path: &str) -> Option<Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut cur = obj.clone();
    let mut rest = path.trim_start_matches('.');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            rest = r[end + 1..].trim_start_matches('.');
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, want) = filter.split_once("==")?;
                let want = want.trim().trim_matches('"').trim_matches('\'');
                cur = cur
                    .as_array()?
                    .iter()
                    .find(|e| {
                        e.get(k.trim()).is_some_and(|v| match v {
                            Value::String(s) => s == want,
                            // A number or boolean compares by its JSON text.
                            other => serde_json::from_str::<Value>(want).is_ok_and(|w| w == *other),
                        })
                    })?
                    .clone();
            } else {
                let i: usize = inner.parse().ok()?;
                cur = cur.get(i)?.clone();
            }
            continue;
        }
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        let seg = &rest[..end];
        cur = cur.get(seg)?.clone();
        rest = rest[end..].trim_start_matches('.');
    }
    Some(cur)
}

/// The scale subresource's paths for a custom resource target.
pub(crate) fn scale_paths(t: &Target) -> Option<ScalePaths> {
    lookup(t.info)?.scale.clone()
}

/// An autoscaling/v1 Scale of a custom object.
pub(crate) fn scale_of(paths: &ScalePaths, obj: &Value) -> Value {
    let meta = obj.get("metadata").cloned().unwrap_or(json!({}));
    let selector = paths
        .label_selector
        .as_deref()
        .and_then(|p| structural::value_at(obj, p))
        .and_then(Value::as_str)
        .unwrap_or("");
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                     "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"]},
        "spec": {"replicas": structural::value_at(obj, &paths.spec_replicas).cloned().unwrap_or(json!(0))},
        "status": {"replicas": structural::value_at(obj, &paths.status_replicas).cloned().unwrap_or(json!(0)),
                   "selector": selector},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printer_column_json_paths() {
        let o = json!({"spec": {"size": 3, "list": [{"a": 1}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "status": "False"}]}});
        let cases = [
            (".spec.size", Some(json!(3))),
            (".spec.list[0].a", Some(json!(1))),
            (
                ".status.conditions[?(@.type==\"Ready\")].status",
                Some(json!("True")),
            ),
            (".spec.missing", None),
        ];
        for (p, want) in cases {
            assert_eq!(json_path(&o, p), want, "{p}");
        }
    }

    #[test]
    fn conflicting_names_are_not_accepted() {
        let crd = |name: &str, plural: &str, kind: &str| {
            json!({"metadata": {"name": name}, "spec": {"group": "example.com",
                "names": {"plural": plural, "kind": kind},
                "versions": [{"name": "v1", "storage": true, "served": true}]}})
        };
        let a = crd("as.example.com", "as", "A");
        let b = crd("bs.example.com", "bs", "A");
        let st = desired_status(&b, &[&a]);
        assert_eq!(st["conditions"][0]["status"], "False");
        assert_eq!(st["conditions"][0]["message"], "\"A\" is already in use");
        let st = desired_status(&a, &[]);
        assert_eq!(
            (
                st["conditions"][1]["type"].clone(),
                st["conditions"][1]["status"].clone(),
                st["storedVersions"].clone()
            ),
            (json!("Established"), json!("True"), json!(["v1"]))
        );
    }
}
