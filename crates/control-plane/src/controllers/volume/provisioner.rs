//! k3s's local-path provisioner for claims of a `rancher.io/local-path` class: a hostPath
//! PersistentVolume pinned to the claim's selected node, pre-bound to the claim, at
//! `<storage path>/pvc-<claim uid>_<namespace>_<claim name>` (local-path-provisioner's
//! layout under k3s's `--default-local-storage-path`).
//!
//! The directory itself is made on the node by the kubelet when it first mounts the
//! volume (`hostPath` type `DirectoryOrCreate`, as local-path's setup helper pod would),
//! and removed by the kubelet once the PV is gone (reclaim policy Delete): the control
//! plane never touches a node's disk.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{ANN_PROVISIONED_BY, Ctx, LOCAL_PATH_PROVISIONER, Reason, s};
use crate::apiserver::admission::PV_PROTECTION;
use crate::controllers::objects;
use crate::storage::StoreError;

/// The PV name upstream's provisioning controller derives from the claim.
pub(crate) fn volume_name(claim: &Value) -> String {
    format!("pvc-{}", s(claim, "/metadata/uid"))
}

/// The PV for `claim` on `node`.
pub(crate) fn volume_for(ctx: &Ctx<'_>, claim: &Value, class: &Value, node: &str) -> Value {
    let (ns, name) = (s(claim, "/metadata/namespace"), s(claim, "/metadata/name"));
    let pv_name = volume_name(claim);
    let dir = ctx.storage_path.join(format!("{pv_name}_{ns}_{name}"));
    let policy = match s(class, "/reclaimPolicy") {
        "" => "Delete",
        p => p,
    };
    json!({
        "metadata": {
            "name": pv_name,
            "annotations": {ANN_PROVISIONED_BY: LOCAL_PATH_PROVISIONER,
                "local.path.provisioner/selected-node": node},
            "finalizers": [PV_PROTECTION],
        },
        "spec": {
            "capacity": {"storage": claim.pointer("/spec/resources/requests/storage").cloned().unwrap_or(json!("0"))},
            "accessModes": claim["spec"]["accessModes"].clone(),
            "persistentVolumeReclaimPolicy": policy,
            "storageClassName": s(class, "/metadata/name"),
            "volumeMode": "Filesystem",
            "hostPath": {"path": dir.to_string_lossy(), "type": "DirectoryOrCreate"},
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": ns,
                "name": name, "uid": s(claim, "/metadata/uid"),
                "resourceVersion": s(claim, "/metadata/resourceVersion")},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
        },
        "status": {"phase": "Pending"},
    })
}

/// Provisions the claim's volume (once: the name is the claim's uid).
pub(crate) fn provision(ctx: &Ctx<'_>, claim: &Arc<Value>, class: &Value, node: Option<&str>) {
    let Some(node) = node else {
        ctx.tell_once(
            claim,
            "Warning",
            Reason::ProvisioningFailed,
            &format!(
                "failed to provision volume with StorageClass {:?}: configuration error, no node was specified",
                s(class, "/metadata/name")
            ),
        );
        return;
    };
    if ctx.volumes.contains_key(&volume_name(claim)) {
        return;
    }
    let ns = s(claim, "/metadata/namespace");
    let name = s(claim, "/metadata/name");
    let pv = volume_for(ctx, claim, class, node);
    let record = |kind: &str, reason: Reason, msg: &str| {
        ctx.provisioner_recorder
            .record(ctx.st, claim, kind, reason.as_str(), msg);
    };
    record(
        "Normal",
        Reason::Provisioning,
        &format!("External provisioner is provisioning volume for claim \"{ns}/{name}\""),
    );
    match objects::create(ctx.st, "", "persistentvolumes", None, pv) {
        Ok(_) => record(
            "Normal",
            Reason::ProvisioningSucceeded,
            &format!("Successfully provisioned volume {}", volume_name(claim)),
        ),
        Err(StoreError::AlreadyExists(_)) => {}
        Err(e) => record(
            "Warning",
            Reason::ProvisioningFailed,
            &format!(
                "failed to provision volume with StorageClass {:?}: {e}",
                s(class, "/metadata/name")
            ),
        ),
    }
}
