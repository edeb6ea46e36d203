//! The pvc-protection and pv-protection controllers: a claim keeps
//! `kubernetes.io/pvc-protection` until no pod that may still run uses it, a volume keeps
//! `kubernetes.io/pv-protection` until it is no longer Bound. Both finalizers are added at
//! create by admission (StorageObjectInUseProtection) and here for objects that lack them.

use serde_json::Value;

use super::{Ctx, VolumePhase, s};
use crate::apiserver::admission::{PV_PROTECTION, PVC_PROTECTION, add_finalizer};
use crate::apiserver::controllers::drop_finalizer;
use crate::controllers::objects;

fn has_finalizer(o: &Value, f: &str) -> bool {
    o.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|x| x == f))
}

fn deleting(o: &Value) -> bool {
    o.pointer("/metadata/deletionTimestamp").is_some()
}

/// Whether a pod that has not finished names the claim among its volumes.
fn claim_in_use(ctx: &Ctx<'_>, ns: &str, claim: &str) -> bool {
    ctx.pods.iter().any(|p| {
        s(p, "/metadata/namespace") == ns
            && !matches!(s(p, "/status/phase"), "Succeeded" | "Failed")
            && p["spec"]["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| s(v, "/persistentVolumeClaim/claimName") == claim)
    })
}

fn ensure_finalizer(ctx: &Ctx<'_>, key: &str, f: &str) {
    let _ = objects::modify(ctx.st, key, &mut |o| {
        if deleting(o) || has_finalizer(o, f) {
            return false;
        }
        add_finalizer(o, f);
        true
    });
}

pub(crate) fn sync(ctx: &Ctx<'_>) {
    for c in ctx.claims.values() {
        let (ns, name) = (s(c, "/metadata/namespace"), s(c, "/metadata/name"));
        let key = Ctx::claim_key(ns, name);
        match (deleting(c), has_finalizer(c, PVC_PROTECTION)) {
            (false, false) => ensure_finalizer(ctx, &key, PVC_PROTECTION),
            (true, true) if !claim_in_use(ctx, ns, name) => {
                drop_finalizer(ctx.st, &key, PVC_PROTECTION)
            }
            _ => {}
        }
    }
    for v in ctx.volumes.values() {
        let key = Ctx::volume_key(s(v, "/metadata/name"));
        match (deleting(v), has_finalizer(v, PV_PROTECTION)) {
            (false, false) => ensure_finalizer(ctx, &key, PV_PROTECTION),
            (true, true) if s(v, "/status/phase") != VolumePhase::Bound.as_str() => {
                drop_finalizer(ctx.st, &key, PV_PROTECTION)
            }
            _ => {}
        }
    }
}
