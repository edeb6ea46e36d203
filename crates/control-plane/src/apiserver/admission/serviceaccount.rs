//! The ServiceAccount admission plugin for pod creates: defaults `serviceAccountName` to
//! `default`, refuses a pod whose service account does not exist, copies the account's
//! `imagePullSecrets` to a pod without any, and (unless `automountServiceAccountToken` is
//! false on the pod or the account) mounts the `kube-api-access-*` projected volume — a
//! bound token, the cluster CA from `kube-root-ca.crt` and the namespace — into every
//! container at `/var/run/secrets/kubernetes.io/serviceaccount`. Mirror pods are exempt.

use nodus_k8s::status;
use serde_json::{Value, json};

use crate::apiserver::bootstrap::ensure_object;
use crate::apiserver::rest::{ApiError, ApiResult, generate_suffix, meta_str};
use crate::apiserver::state::ApiState;

pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Where the token volume is mounted (upstream's `DefaultAPITokenMountPath`).
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const VOLUME_PREFIX: &str = "kube-api-access-";
/// The ConfigMap the root-CA publisher keeps in every namespace.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
/// The kubelet's projected token lifetime, which upstream extends (see `authn`).
const TOKEN_EXPIRATION_SECS: i64 =
    crate::apiserver::authn::serviceaccount::WARN_ONLY_EXPIRATION_SECS;

fn is_mirror(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some()
}

/// Admits a pod being created.
pub(crate) fn admit(st: &ApiState, pod: &mut Value) -> ApiResult<()> {
    if is_mirror(pod) {
        return Ok(());
    }
    let ns = meta_str(pod, "namespace").unwrap_or("default").to_string();
    let name = pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_SERVICE_ACCOUNT)
        .to_string();
    pod["spec"]["serviceAccountName"] = json!(name);
    let sa = service_account(st, &ns, &name)?.ok_or_else(|| {
        ApiError(status::forbidden_with(
            "",
            "pods",
            meta_str(pod, "name").unwrap_or(""),
            &format!(
                "error looking up service account {ns}/{name}: serviceaccount {} not found",
                status::go_quote(&name)
            ),
        ))
    })?;
    let has_pull_secrets = pod
        .pointer("/spec/imagePullSecrets")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if !has_pull_secrets
        && let Some(secrets) = sa
            .get("imagePullSecrets")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty())
    {
        pod["spec"]["imagePullSecrets"] = json!(secrets);
    }
    if should_automount(&sa, pod) {
        mount_token(pod);
    }
    Ok(())
}

/// The service account, waiting for nobody: the `default` account the ServiceAccount
/// controller makes in every namespace is made here when a pod needs it first (upstream's
/// admission retries its lookup until the controller has caught up).
fn service_account(st: &ApiState, ns: &str, name: &str) -> ApiResult<Option<Value>> {
    let key = format!("/core/serviceaccounts/{ns}/{name}");
    let get = || {
        st.listers
            .service_accounts
            .get(&key)
            .map(|o| o.map(|s| (*s.object).clone()))
            .map_err(crate::apiserver::rest::storage_failure)
    };
    match get()? {
        Some(sa) => Ok(Some(sa)),
        None if name == DEFAULT_SERVICE_ACCOUNT => {
            let _ = ensure_object(
                st,
                "",
                "serviceaccounts",
                Some(ns),
                json!({"metadata": {"name": DEFAULT_SERVICE_ACCOUNT}}),
            );
            get()
        }
        None => Ok(None),
    }
}

/// The pod's `automountServiceAccountToken` wins, then the account's; default true.
fn should_automount(sa: &Value, pod: &Value) -> bool {
    pod.pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| {
            sa.get("automountServiceAccountToken")
                .and_then(Value::as_bool)
        })
        .unwrap_or(true)
}

/// The projected volume upstream's admission adds.
fn token_volume(name: &str) -> Value {
    json!({"name": name, "projected": {"defaultMode": 0o644, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_SECS}},
        {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}})
}

/// Mounts the token volume in every init and app container that has nothing mounted at
/// the token path yet; adds the volume if any container took it.
fn mount_token(pod: &mut Value) {
    let taken: Vec<String> = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
        .collect();
    let volume = loop {
        let n = format!("{VOLUME_PREFIX}{}", generate_suffix());
        if !taken.contains(&n) {
            break n;
        }
    };
    let mount = json!({"name": volume, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        let Some(containers) = pod
            .get_mut("spec")
            .and_then(|s| s.get_mut(list))
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for c in containers {
            let mounts = c
                .as_object_mut()
                .map(|o| o.entry("volumeMounts").or_insert_with(|| json!([])));
            let Some(Value::Array(mounts)) = mounts else {
                continue;
            };
            if mounts
                .iter()
                .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(TOKEN_MOUNT_PATH))
            {
                continue;
            }
            mounts.push(mount.clone());
            needed = true;
        }
    }
    if needed {
        match pod
            .pointer_mut("/spec/volumes")
            .and_then(Value::as_array_mut)
        {
            Some(v) => v.push(token_volume(&volume)),
            None => pod["spec"]["volumes"] = json!([token_volume(&volume)]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_container_without_a_mount_at_the_path_gets_the_volume() {
        let mut pod = json!({"spec": {
            "initContainers": [{"name": "init"}],
            "containers": [
                {"name": "app"},
                {"name": "own", "volumeMounts": [{"name": "x", "mountPath": TOKEN_MOUNT_PATH}]},
            ],
            "volumes": [{"name": "x", "emptyDir": {}}],
        }});
        mount_token(&mut pod);
        let vols = pod["spec"]["volumes"].as_array().unwrap();
        assert_eq!(vols.len(), 2);
        let name = vols[1]["name"].as_str().unwrap();
        assert!(name.starts_with("kube-api-access-") && name.len() == 21);
        assert_eq!(vols[1]["projected"]["defaultMode"], 420);
        assert_eq!(
            vols[1]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"],
            3607
        );
        for c in [
            &pod["spec"]["initContainers"][0],
            &pod["spec"]["containers"][0],
        ] {
            assert_eq!(
                c["volumeMounts"][0],
                json!({"name": name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH})
            );
        }
        assert_eq!(
            pod["spec"]["containers"][1]["volumeMounts"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn the_pod_setting_wins_over_the_account() {
        let sa_off = json!({"automountServiceAccountToken": false});
        let pod_on = json!({"spec": {"automountServiceAccountToken": true}});
        assert!(should_automount(&sa_off, &pod_on));
        assert!(!should_automount(&sa_off, &json!({"spec": {}})));
        assert!(should_automount(&json!({}), &json!({"spec": {}})));
    }
}
