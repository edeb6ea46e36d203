//! Objects every cluster has from its first start: the four system namespaces, the
//! `kubernetes` Service with its Endpoints and EndpointSlice, the two system
//! PriorityClasses, k3s's default `local-path` StorageClass, and API Priority and Fairness's
//! mandatory and suggested PriorityLevelConfigurations and FlowSchemas (stored for kubectl
//! and tools; nodus's own request limiting is the max-in-flight filter, `super::inflight`).

use serde_json::{Value, json};

use crate::apiserver::rest::create::prepare_for_create;
use crate::apiserver::rest::path::key;
use crate::apiserver::state::ApiState;
use crate::storage::{Mutation, StoreError};

use crate::controllers::objects::target;

/// Creates `obj` as the server would on POST, unless it exists. Used for built-in objects.
pub fn ensure_object(
    st: &ApiState,
    group: &str,
    plural: &str,
    ns: Option<&str>,
    mut obj: Value,
) -> Result<(), StoreError> {
    let Some(t) = target(group, plural, ns) else {
        return Err(StoreError::Backend(format!(
            "{plural}.{group} is not in the catalogue"
        )));
    };
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let k = key(t.info, ns, &name);
    if st.store.get(&k)?.is_some() {
        return Ok(());
    }
    obj["apiVersion"] = json!(t.gvk().api_version());
    obj["kind"] = json!(t.info.kind);
    if let Some(ns) = ns {
        obj["metadata"]["namespace"] = json!(ns);
    }
    prepare_for_create(&t, &mut obj);
    nodus_k8s::defaults::default_object(&t.gvk(), &mut obj);
    match st.store.create(&k, obj) {
        Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates or replaces a built-in object's content (the `kubernetes` endpoints follow the
/// address and port of this run).
pub(crate) fn upsert(
    st: &ApiState,
    group: &str,
    plural: &str,
    ns: &str,
    name: &str,
    set: &dyn Fn(&mut Value),
) -> Result<(), StoreError> {
    let Some(t) = target(group, plural, Some(ns)) else {
        return Err(StoreError::Backend(format!(
            "{plural}.{group} is not in the catalogue"
        )));
    };
    let mut fresh = json!({"metadata": {"name": name}});
    set(&mut fresh);
    ensure_object(st, group, plural, Some(ns), fresh)?;
    st.store.mutate(&key(t.info, Some(ns), name), &mut |cur| {
        let Some(cur) = cur else {
            return Ok(Mutation::Keep);
        };
        let mut new = (*cur.object).clone();
        set(&mut new);
        if new == *cur.object {
            Ok(Mutation::Keep)
        } else {
            Ok(Mutation::Put(new))
        }
    })?;
    Ok(())
}

/// Upstream's APF configuration objects, each FlowSchema's `Dangling` condition written
/// before the first request (`super::apfconfig` keeps it current).
fn ensure_flowcontrol(st: &ApiState) -> Result<(), StoreError> {
    use nodus_k8s::flowcontrol::{AUTOUPDATE_ANNOTATION, flow_schemas, priority_levels};
    const GROUP: &str = "flowcontrol.apiserver.k8s.io";
    let meta = |name: &str| json!({"name": name, "annotations": {AUTOUPDATE_ANNOTATION: "true"}});
    for (name, spec) in priority_levels() {
        let obj = json!({"metadata": meta(name), "spec": spec});
        ensure_object(st, GROUP, "prioritylevelconfigurations", None, obj)?;
    }
    for (name, spec) in flow_schemas() {
        let obj = json!({"metadata": meta(name), "spec": spec});
        ensure_object(st, GROUP, "flowschemas", None, obj)?;
    }
    crate::apiserver::apfconfig::sync(st);
    Ok(())
}

pub fn ensure(st: &ApiState) -> Result<(), StoreError> {
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        ensure_object(
            st,
            "",
            "namespaces",
            None,
            json!({"metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}}),
        )?;
    }
    for (name, value, desc) in [
        (
            "system-cluster-critical",
            2_000_000_000i64,
            "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
        ),
        (
            "system-node-critical",
            2_000_001_000,
            "Used for system critical pods that must not be moved from their current node.",
        ),
    ] {
        ensure_object(
            st,
            "scheduling.k8s.io",
            "priorityclasses",
            None,
            json!({
            "metadata": {"name": name}, "value": value, "globalDefault": false,
            "description": desc, "preemptionPolicy": "PreemptLowerPriority"}),
        )?;
    }
    ensure_flowcontrol(st)?;
    // k3s ships local-path-provisioner's class as the default; nodus provisions it in
    // `controllers::volume::provisioner`.
    ensure_object(
        st,
        "storage.k8s.io",
        "storageclasses",
        None,
        json!({
        "metadata": {"name": crate::controllers::volume::LOCAL_PATH_CLASS,
                     "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": crate::controllers::volume::LOCAL_PATH_PROVISIONER,
        "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}),
    )?;
    let ip = crate::apiserver::admission::first_service_ip(st.config.service_cidr).to_string();
    let port = st.config.secure_port;
    let addr = if st.config.advertise_address.is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        st.config.advertise_address.to_string()
    };
    ensure_object(
        st,
        "",
        "services",
        Some("default"),
        json!({
        "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "sessionAffinity": "None",
                 "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster",
                 "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]}}),
    )?;
    upsert(st, "", "services", "default", "kubernetes", &|o| {
        o["spec"]["ports"] =
            json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]);
    })?;
    let addr2 = addr.clone();
    upsert(st, "", "endpoints", "default", "kubernetes", &move |o| {
        o["metadata"]["labels"] = json!({"endpointslice.kubernetes.io/skip-mirror": "true"});
        o["subsets"] = json!([{"addresses": [{"ip": addr2}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}]);
    })?;
    upsert(
        st,
        "discovery.k8s.io",
        "endpointslices",
        "default",
        "kubernetes",
        &move |o| {
            o["metadata"]["labels"] = json!({"kubernetes.io/service-name": "kubernetes"});
            o["addressType"] = json!("IPv4");
            o["endpoints"] = json!([{"addresses": [addr], "conditions": {"ready": true}}]);
            o["ports"] = json!([{"name": "https", "port": port, "protocol": "TCP"}]);
        },
    )?;
    Ok(())
}
