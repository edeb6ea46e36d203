//! Writes the in-process controllers make, through the same preparation the REST create
//! path applies (uid, timestamps, defaults, generateName), so their objects are
//! indistinguishable from ones a client POSTed.

use nodus_k8s::catalog;
use serde_json::{Value, json};

use crate::apiserver::rest::ApiError;
use crate::apiserver::rest::create::prepare_for_create;
use crate::apiserver::rest::path::{Target, key};
use crate::apiserver::state::ApiState;
use crate::storage::{Mutation, StoreError, Stored};

pub fn target(group: &str, plural: &str, ns: Option<&str>) -> Option<Target> {
    let info = catalog::served()
        .into_iter()
        .find(|i| i.group == group && i.plural == plural)?;
    Some(Target {
        info,
        namespace: ns.map(str::to_string),
        name: None,
        sub: None,
        watch_path: false,
        rest: Vec::new(),
    })
}

pub fn key_of(group: &str, plural: &str, ns: Option<&str>, name: &str) -> String {
    match target(group, plural, ns) {
        Some(t) => key(t.info, ns, name),
        None => String::new(),
    }
}

/// `obj` as the server would store it on create: kind, namespace, uid, timestamps and
/// defaults filled in (the status it carries is kept). Returns the catalogue target too.
pub fn prepare(
    group: &str,
    plural: &str,
    ns: Option<&str>,
    mut obj: Value,
) -> Result<(Target, Value), StoreError> {
    let t = target(group, plural, ns)
        .ok_or_else(|| StoreError::Backend(format!("{plural}.{group} is not in the catalogue")))?;
    obj["apiVersion"] = json!(t.gvk().api_version());
    obj["kind"] = json!(t.info.kind);
    if let Some(ns) = ns {
        obj["metadata"]["namespace"] = json!(ns);
    }
    let status = obj.get("status").cloned();
    prepare_for_create(&t, &mut obj);
    // Controllers create objects together with their status (the REST path drops it).
    if let Some(s) = status {
        obj["status"] = s;
    }
    nodus_k8s::defaults::default_object(&t.gvk(), &mut obj);
    Ok((t, obj))
}

/// Creates `obj` (a name or `metadata.generateName` required); returns it as stored.
pub fn create(
    st: &ApiState,
    group: &str,
    plural: &str,
    ns: Option<&str>,
    obj: Value,
) -> Result<Stored, StoreError> {
    let (t, obj) = prepare(group, plural, ns, obj)?;
    store_named(st, &t, ns, obj)
}

/// Stores a prepared object under its name, or a fresh one from `metadata.generateName`.
fn store_named(
    st: &ApiState,
    t: &Target,
    ns: Option<&str>,
    mut obj: Value,
) -> Result<Stored, StoreError> {
    let generate = obj
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)
        .map(str::to_string);
    for _ in 0..8 {
        let name = match (
            &generate,
            obj.pointer("/metadata/name").and_then(Value::as_str),
        ) {
            (_, Some(n)) if !n.is_empty() => n.to_string(),
            (Some(g), _) => {
                let n = format!("{g}{}", crate::apiserver::rest::generate_suffix());
                obj["metadata"]["name"] = json!(n);
                n
            }
            _ => return Err(StoreError::Backend("object has no name".into())),
        };
        match st.store.create(&key(t.info, ns, &name), obj.clone()) {
            Err(StoreError::AlreadyExists(_)) if generate.is_some() => {
                obj["metadata"]["name"] = Value::Null;
                continue;
            }
            other => return other,
        }
    }
    Err(StoreError::Backend("could not generate a free name".into()))
}

/// Applies `f` to the current object at `key` and stores the result when it changed.
/// `f` returns false to leave the object alone.
pub fn modify(
    st: &ApiState,
    key: &str,
    f: &mut dyn FnMut(&mut Value) -> bool,
) -> Result<Option<Stored>, StoreError> {
    let out = st.store.mutate(key, &mut |cur| {
        let Some(cur) = cur else {
            return Ok(Mutation::Keep);
        };
        let mut new = (*cur.object).clone();
        if !f(&mut new) || new == *cur.object {
            return Ok(Mutation::Keep);
        }
        Ok(Mutation::Put(new))
    })?;
    Ok(out.stored)
}

/// Creates `obj` as a client POST would: namespace checked, admission run (a pod gets its
/// service account, default tolerations and priority) and validated. A refusal comes back
/// as the API's Status, whose `message` is what upstream's controllers put in their
/// FailedCreate events.
pub async fn create_as_client(
    st: &ApiState,
    group: &str,
    plural: &str,
    ns: &str,
    obj: Value,
) -> Result<Stored, ApiError> {
    if st.store.remote().is_some() {
        return create_through_api(st, group, plural, ns, obj);
    }
    crate::apiserver::rest::create::check_namespace(st, ns)?;
    let (t, mut obj) = prepare(group, plural, Some(ns), obj).map_err(internal)?;
    crate::apiserver::admission::create(st, &t, &mut obj, false).await?;
    store_validated(st, &t, ns, obj)
}

/// [`create_as_client`] for a pod, for controllers that create from a synchronous loop: pod
/// admission needs no await.
pub fn create_pod(st: &ApiState, ns: &str, pod: Value) -> Result<Stored, ApiError> {
    if st.store.remote().is_some() {
        return create_through_api(st, "", "pods", ns, pod);
    }
    crate::apiserver::rest::create::check_namespace(st, ns)?;
    let (t, mut pod) = prepare("", "pods", Some(ns), pod).map_err(internal)?;
    crate::apiserver::admission::admit_pod(st, &mut pod)?;
    store_validated(st, &t, ns, pod)
}

/// A component apart from the API server (`--kubeconfig`) leaves the namespace check,
/// admission and validation to the server's POST, whose Status comes back on a refusal.
fn create_through_api(
    st: &ApiState,
    group: &str,
    plural: &str,
    ns: &str,
    obj: Value,
) -> Result<Stored, ApiError> {
    let (t, obj) = prepare(group, plural, Some(ns), obj).map_err(internal)?;
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    store_named(st, &t, Some(ns), obj)
        .map_err(|e| crate::apiserver::rest::store_error(&t, &name, e))
}

fn internal(e: StoreError) -> ApiError {
    ApiError(nodus_k8s::status::internal(&e.to_string()))
}

/// Validates an admitted object and stores it under its name or a fresh generated one.
fn store_validated(
    st: &ApiState,
    t: &Target,
    ns: &str,
    mut obj: Value,
) -> Result<Stored, ApiError> {
    let generate = obj
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)
        .map(str::to_string);
    for _ in 0..8 {
        let name = match (
            &generate,
            obj.pointer("/metadata/name").and_then(Value::as_str),
        ) {
            (_, Some(n)) if !n.is_empty() => n.to_string(),
            (Some(g), _) => {
                let n = format!("{g}{}", crate::apiserver::rest::generate_suffix());
                obj["metadata"]["name"] = json!(n);
                n
            }
            _ => return Err(internal(StoreError::Backend("object has no name".into()))),
        };
        crate::apiserver::rest::create::validate(t, &obj, None)?;
        match st.store.create(&key(t.info, Some(ns), &name), obj.clone()) {
            Err(StoreError::AlreadyExists(_)) if generate.is_some() => {
                obj["metadata"]["name"] = Value::Null;
                continue;
            }
            Err(StoreError::AlreadyExists(_)) => {
                return Err(ApiError(nodus_k8s::status::already_exists(
                    t.info.group,
                    t.info.plural,
                    &name,
                )));
            }
            other => return other.map_err(internal),
        }
    }
    Err(internal(StoreError::Backend(
        "could not generate a free name".into(),
    )))
}
