//! What happens to a Released volume (upstream's `reclaimVolume`): Retain keeps it
//! Released for an administrator; Delete removes the PV object when nodus provisioned it
//! (the kubelet of its node then removes the directory) and fails it otherwise, since no
//! deleter plugin exists for a volume nodus did not make; Recycle is deprecated upstream
//! and has no recycler here.

use serde_json::Value;

use super::binder::update_volume_phase;
use super::{ANN_PROVISIONED_BY, Ctx, LOCAL_PATH_PROVISIONER, Reason, VolumePhase, s};
use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::controllers::objects;

/// `spec.persistentVolumeReclaimPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReclaimPolicy {
    Retain,
    Delete,
    Recycle,
}

impl ReclaimPolicy {
    fn of(volume: &Value) -> ReclaimPolicy {
        match s(volume, "/spec/persistentVolumeReclaimPolicy") {
            "Delete" => ReclaimPolicy::Delete,
            "Recycle" => ReclaimPolicy::Recycle,
            _ => ReclaimPolicy::Retain,
        }
    }
}

pub(crate) fn reclaim(ctx: &Ctx<'_>, volume: &Value) {
    if volume.pointer("/metadata/deletionTimestamp").is_some()
        || s(volume, "/status/phase") == VolumePhase::Failed.as_str()
    {
        return;
    }
    let name = s(volume, "/metadata/name");
    match ReclaimPolicy::of(volume) {
        ReclaimPolicy::Retain => {}
        ReclaimPolicy::Delete
            if volume
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(ANN_PROVISIONED_BY))
                .and_then(Value::as_str)
                == Some(LOCAL_PATH_PROVISIONER) =>
        {
            let Some(t) = objects::target("", "persistentvolumes", None) else {
                return;
            };
            let opts = DeleteOptions {
                uid: Some(s(volume, "/metadata/uid").to_string()),
                ..Default::default()
            };
            if let Err(e) = delete_object(ctx.st, &t, name, &opts) {
                tracing::warn!(volume = %name, error = %e.0["message"], "reclaim: delete failed");
            }
        }
        ReclaimPolicy::Delete => {
            let msg = format!(
                "error getting deleter volume plugin for volume {name:?}: no deletable volume plugin matched"
            );
            update_volume_phase(ctx, name, VolumePhase::Failed, Some(&msg));
            ctx.tell_once(volume, "Warning", Reason::VolumeFailedDelete, &msg);
        }
        ReclaimPolicy::Recycle => {
            let msg = "No recycler plugin found for the volume!";
            update_volume_phase(ctx, name, VolumePhase::Failed, Some(msg));
            ctx.tell_once(volume, "Warning", Reason::VolumeFailedRecycle, msg);
        }
    }
}
