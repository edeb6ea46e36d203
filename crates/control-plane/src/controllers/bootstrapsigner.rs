//! The bootstrap signer (upstream's `pkg/controller/bootstrap/bootstrapsigner`) and the
//! `cluster-info` ConfigMap it signs: kube-public/cluster-info holds a kubeconfig with the
//! server and CA and no credentials; for every unexpired token with
//! `usage-bootstrap-signing` the signer keeps `jws-kubeconfig-<token-id>`, a detached JWS
//! of that kubeconfig keyed by the token, so a joining node holding the token can trust
//! what it read anonymously.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use serde_json::{Value, json};

use super::cache::Cache;
use crate::apiserver::authn::bootstraptoken::{BootstrapToken, compute_detached_signature};
use crate::apiserver::rest::now_ts;
use crate::apiserver::state::ApiState;
use crate::controllers::objects;
use crate::storage::StoreError;

pub const CLUSTER_INFO_NAMESPACE: &str = "kube-public";
pub const CLUSTER_INFO_NAME: &str = "cluster-info";
pub const KUBECONFIG_KEY: &str = "kubeconfig";
pub const JWS_KEY_PREFIX: &str = "jws-kubeconfig-";

/// The credential-less kubeconfig kubeadm puts in cluster-info.
pub fn cluster_info_kubeconfig(server: &str, ca_pem: &str) -> String {
    let cfg = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "", "cluster": {
            "server": server,
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        }}],
        "contexts": [],
        "current-context": "",
        "preferences": {},
        "users": [],
    });
    serde_yaml::to_string(&cfg).unwrap_or_default()
}

/// Creates or refreshes cluster-info for this run's server URL and CA.
pub fn ensure_cluster_info(st: &ApiState, server: &str, ca_pem: &str) -> Result<(), StoreError> {
    let kubeconfig = cluster_info_kubeconfig(server, ca_pem);
    crate::apiserver::bootstrap::upsert(
        st,
        "",
        "configmaps",
        CLUSTER_INFO_NAMESPACE,
        CLUSTER_INFO_NAME,
        &|o| {
            if !o.get("data").is_some_and(Value::is_object) {
                o["data"] = json!({});
            }
            o["data"][KUBECONFIG_KEY] = json!(kubeconfig);
        },
    )
}

/// The signatures cluster-info should carry for `tokens`, keyed by data key.
pub(crate) fn signatures(kubeconfig: &str, tokens: &[BootstrapToken]) -> BTreeMap<String, String> {
    let now = now_ts();
    tokens
        .iter()
        .filter(|t| t.usage_signing && !t.expired(now))
        .map(|t| {
            (
                format!("{JWS_KEY_PREFIX}{}", t.id),
                compute_detached_signature(kubeconfig, &t.id, &t.secret),
            )
        })
        .collect()
}

fn sync(st: &ApiState, secrets: &Cache) {
    let tokens: Vec<BootstrapToken> = secrets
        .objects
        .values()
        .filter(|s| s.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|s| BootstrapToken::from_secret(s))
        .collect();
    let key = objects::key_of(
        "",
        "configmaps",
        Some(CLUSTER_INFO_NAMESPACE),
        CLUSTER_INFO_NAME,
    );
    let r = objects::modify(st, &key, &mut |cm| {
        let Some(kubeconfig) = cm
            .pointer(&format!("/data/{KUBECONFIG_KEY}"))
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return false;
        };
        let want = signatures(&kubeconfig, &tokens);
        let Some(data) = cm.get_mut("data").and_then(Value::as_object_mut) else {
            return false;
        };
        data.retain(|k, _| !k.starts_with(JWS_KEY_PREFIX));
        for (k, v) in &want {
            data.insert(k.clone(), json!(v));
        }
        true
    });
    if let Err(e) = r {
        tracing::warn!(error = %e, "bootstrap signer: updating cluster-info failed");
    }
}

pub async fn run(st: Arc<ApiState>) {
    let mut secrets = Cache::new(st.store.clone(), "/core/secrets/kube-system/");
    let cm_key = objects::key_of(
        "",
        "configmaps",
        Some(CLUSTER_INFO_NAMESPACE),
        CLUSTER_INFO_NAME,
    );
    let mut cluster_info = Cache::new(st.store.clone(), &cm_key);
    loop {
        sync(&st, &secrets);
        // Expiry changes which tokens sign without any object changing.
        tokio::select! {
            _ = secrets.next() => {}
            _ = cluster_info.next() => {}
            _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
        }
        while secrets.try_next().is_some() {}
        while cluster_info.try_next().is_some() {}
    }
}
