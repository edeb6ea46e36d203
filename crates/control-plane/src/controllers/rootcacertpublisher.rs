//! The root-CA publisher (kube-controller-manager's `root-ca-cert-publisher`): a
//! `kube-root-ca.crt` ConfigMap with the cluster CA (`ca.crt`) in every namespace, put
//! back when deleted or edited, so the projected service-account volume can mount it.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::apiserver::admission::serviceaccount::ROOT_CA_CONFIGMAP;
use crate::apiserver::bootstrap::ensure_object;
use crate::apiserver::state::ApiState;
use crate::controllers::cache::Cache;
use crate::controllers::objects;

/// Upstream's annotation on the ConfigMap.
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

fn wanted_data(ca: &str) -> Value {
    json!({"ca.crt": ca})
}

/// Makes the namespace's ConfigMap match the CA.
fn sync(st: &ApiState, ns: &str, current: Option<&Value>) {
    let data = wanted_data(&st.ca_pem);
    match current {
        None => {
            let obj = json!({"metadata": {"name": ROOT_CA_CONFIGMAP,
                "annotations": {"kubernetes.io/description": DESCRIPTION}}, "data": data});
            if let Err(e) = ensure_object(st, "", "configmaps", Some(ns), obj) {
                tracing::warn!(namespace = %ns, error = %e, "root-ca-cert-publisher: create failed");
            }
        }
        Some(cm) if cm.get("data") != Some(&data) || cm.get("binaryData").is_some() => {
            let key = objects::key_of("", "configmaps", Some(ns), ROOT_CA_CONFIGMAP);
            let _ = objects::modify(st, &key, &mut |o| {
                o["data"] = data.clone();
                if let Some(m) = o.as_object_mut() {
                    m.remove("binaryData");
                }
                true
            });
        }
        Some(_) => {}
    }
}

pub async fn run(st: Arc<ApiState>) {
    let mut namespaces = Cache::new(st.store.clone(), "/core/namespaces/");
    let mut configmaps = Cache::new(st.store.clone(), "/core/configmaps/");
    loop {
        while namespaces.try_next().is_some() {}
        while configmaps.try_next().is_some() {}
        for ns in namespaces.objects.values() {
            if ns.pointer("/metadata/deletionTimestamp").is_some() {
                continue;
            }
            let Some(name) = ns.pointer("/metadata/name").and_then(Value::as_str) else {
                continue;
            };
            let key = objects::key_of("", "configmaps", Some(name), ROOT_CA_CONFIGMAP);
            sync(&st, name, configmaps.get(&key).map(|v| v.as_ref()));
        }
        tokio::select! {
            _ = namespaces.next() => {}
            _ = configmaps.next() => {}
        }
    }
}
