//! Deployment, ReplicaSet, ReplicationController, DaemonSet, ControllerRevision and
//! PodDisruptionBudget validation.

use serde_json::{Value, json};

use super::common::{
    Errs, arr, enum_field, int_or_percent, nonnegative, not_supported, present, s, semantic, strmap,
};
use super::meta::validate_labels;
use super::pod::validate_pod_spec;
use super::{FieldError, Path};
use crate::gvk::Gvk;

pub(super) fn validate_workload(errs: &mut Errs, gvk: &Gvk, obj: &Value, old: Option<&Value>) {
    let sp = Path::new("spec");
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    if gvk.kind != "DaemonSet" {
        nonnegative(errs, sp.child("replicas"), spec, "replicas");
    }
    let template_labels = spec
        .pointer("/template/metadata/labels")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let rc_selector = (gvk.kind == "ReplicationController")
        .then(|| strmap(spec, "selector"))
        .filter(|m| !m.is_empty());
    match spec.get("selector").filter(|v| !v.is_null()) {
        _ if gvk.kind == "ReplicationController" => match &rc_selector {
            None => errs.push(FieldError::required(sp.child("selector"), "")),
            Some(sel) => {
                validate_labels(errs, sel, &sp.child("selector"));
                let labels = strmap(&json!({"l": template_labels}), "l");
                if !crate::selector::LabelSelector::from_map(sel).matches(&labels) {
                    errs.push(FieldError::invalid(
                        sp.child("template").child("metadata").child("labels"),
                        template_labels.clone(),
                        "`selector` does not match template `labels`",
                    ));
                }
            }
        },
        None => errs.push(FieldError::required(sp.child("selector"), "")),
        Some(sel) => {
            let parsed: Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector, _> =
                serde_json::from_value(sel.clone());
            match parsed
                .map_err(|e| e.to_string())
                .and_then(|s| crate::selector::from_metav1(&s).map_err(|e| e.to_string()))
            {
                Err(e) => errs.push(FieldError::invalid(sp.child("selector"), sel.clone(), e)),
                Ok(selector) if selector.is_empty() => {
                    let what = match gvk.kind.as_str() {
                        "Deployment" => "empty selector is invalid for deployment",
                        "DaemonSet" => "empty selector is invalid for daemonset",
                        "StatefulSet" => "empty selector is invalid for statefulset",
                        _ => "empty selector is invalid for deployment",
                    };
                    errs.push(FieldError::invalid(sp.child("selector"), sel.clone(), what));
                }
                Ok(selector) => {
                    let labels = strmap(&json!({"l": template_labels}), "l");
                    if !selector.matches(&labels) {
                        errs.push(FieldError::invalid(
                            sp.child("template").child("metadata").child("labels"),
                            template_labels.clone(),
                            "`selector` does not match template `labels`",
                        ));
                    }
                }
            }
        }
    }
    let tp = sp.child("template");
    let tmeta = spec
        .pointer("/template/metadata")
        .cloned()
        .unwrap_or_else(|| json!({}));
    validate_labels(
        errs,
        &strmap(&tmeta, "labels"),
        &tp.child("metadata").child("labels"),
    );
    let mut tspec = spec
        .pointer("/template/spec")
        .cloned()
        .unwrap_or_else(|| json!({}));
    // A StatefulSet's claim templates are volumes of its pods, which mounts may name.
    let claims: Vec<String> = arr(spec, "volumeClaimTemplates")
        .iter()
        .filter_map(|c| c.pointer("/metadata/name").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    if gvk.kind == "StatefulSet" && !claims.is_empty() {
        let mut vols = arr(&tspec, "volumes").to_vec();
        for c in claims {
            if !vols.iter().any(|v| v["name"] == c.as_str()) {
                vols.push(json!({"name": c, "persistentVolumeClaim": {"claimName": c}}));
            }
        }
        tspec["volumes"] = json!(vols);
    }
    validate_pod_spec(errs, &tspec, &tp.child("spec"), false);
    let rp = s(&tspec, "restartPolicy");
    if rp != "Always" && !rp.is_empty() {
        not_supported(
            errs,
            tp.child("spec").child("restartPolicy"),
            rp,
            &["Always"],
        );
    }
    if !arr(&tspec, "ephemeralContainers").is_empty() {
        errs.push(FieldError::forbidden(
            tp.child("spec").child("ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
    if gvk.kind == "Deployment" {
        let st = spec.get("strategy").cloned().unwrap_or_else(|| json!({}));
        let ty = s(&st, "type");
        enum_field(
            errs,
            sp.child("strategy").child("type"),
            ty,
            &["Recreate", "RollingUpdate"],
        );
        if ty == "Recreate" && present(&st, "rollingUpdate") {
            errs.push(FieldError::forbidden(
                sp.child("strategy").child("rollingUpdate"),
                "may not be specified when strategy `type` is 'Recreate'",
            ));
        }
        if ty == "RollingUpdate"
            && let Some(ru) = st.get("rollingUpdate").filter(|v| !v.is_null())
        {
            let rp = sp.child("strategy").child("rollingUpdate");
            let unavailable = int_or_percent(
                errs,
                ru.get("maxUnavailable"),
                rp.child("maxUnavailable"),
                true,
            );
            let surge = int_or_percent(errs, ru.get("maxSurge"), rp.child("maxSurge"), false);
            if unavailable == Some(0) && surge == Some(0) {
                let shown = match ru.get("maxUnavailable") {
                    Some(Value::String(t)) => json!({"$stringer": t}),
                    Some(other) => other.clone(),
                    None => Value::Null,
                };
                errs.push(FieldError::invalid(
                    rp.child("maxUnavailable"),
                    shown,
                    "may not be 0 when `maxSurge` is 0",
                ));
            }
        }
        nonnegative(
            errs,
            sp.child("revisionHistoryLimit"),
            spec,
            "revisionHistoryLimit",
        );
        if let (Some(pd), min_ready) = (
            spec.get("progressDeadlineSeconds").and_then(Value::as_i64),
            spec.get("minReadySeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0),
        ) && pd <= min_ready
        {
            errs.push(FieldError::invalid(
                sp.child("progressDeadlineSeconds"),
                json!(pd),
                "must be greater than minReadySeconds",
            ));
        }
    }
    if gvk.kind == "DaemonSet" {
        let ty = spec
            .pointer("/updateStrategy/type")
            .and_then(Value::as_str)
            .unwrap_or("");
        enum_field(
            errs,
            sp.child("updateStrategy").child("type"),
            ty,
            &["OnDelete", "RollingUpdate"],
        );
    }
    if gvk.kind == "StatefulSet" {
        validate_statefulset(errs, spec, old);
    }
    // A ReplicationController's selector may change; apps/v1 selectors may not, and
    // a StatefulSet's spec has its own rule.
    if let Some(old) = old
        && !matches!(gvk.kind.as_str(), "ReplicationController" | "StatefulSet")
        && spec.get("selector").map(semantic) != old.pointer("/spec/selector").map(semantic)
    {
        errs.push(FieldError::invalid(
            sp.child("selector"),
            spec.get("selector").cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

/// Upstream's ValidateControllerRevision(Update): data is mandatory and, once written,
/// immutable (a revision is a snapshot); the revision number may move (a rollback bumps it).
pub(super) fn validate_controller_revision(errs: &mut Errs, obj: &Value, old: Option<&Value>) {
    let data = obj.get("data").filter(|d| !d.is_null());
    if data.is_none() {
        errs.push(FieldError::required(Path::new("data"), "data is mandatory"));
    }
    nonnegative(errs, Path::new("revision"), obj, "revision");
    if let Some(old) = old
        && data != old.get("data").filter(|d| !d.is_null())
    {
        errs.push(FieldError::invalid(
            Path::new("data"),
            data.cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

/// Upstream's ValidateStatefulSetSpec and ValidateStatefulSetUpdate beyond what every
/// workload shares.
fn validate_statefulset(errs: &mut Errs, spec: &Value, old: Option<&Value>) {
    let sp = Path::new("spec");
    let policy = s(spec, "podManagementPolicy");
    if !policy.is_empty() && !matches!(policy, "OrderedReady" | "Parallel") {
        errs.push(FieldError::invalid(
            sp.child("podManagementPolicy"),
            json!(policy),
            "must be 'OrderedReady' or 'Parallel'",
        ));
    }
    let strategy = spec
        .get("updateStrategy")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let sp_us = sp.child("updateStrategy");
    match s(&strategy, "type") {
        "" | "RollingUpdate" => {
            if let Some(ru) = strategy.get("rollingUpdate").filter(|v| !v.is_null()) {
                nonnegative(
                    errs,
                    sp_us.child("rollingUpdate").child("partition"),
                    ru,
                    "partition",
                );
                if present(ru, "maxUnavailable") {
                    int_or_percent(
                        errs,
                        ru.get("maxUnavailable"),
                        sp_us.child("rollingUpdate").child("maxUnavailable"),
                        true,
                    );
                }
            }
        }
        "OnDelete" => {
            if present(&strategy, "rollingUpdate") {
                errs.push(FieldError::invalid(
                    sp_us.child("rollingUpdate"),
                    strategy["rollingUpdate"].clone(),
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
        }
        other => errs.push(FieldError::invalid(
            sp_us,
            json!(other),
            "must be 'RollingUpdate' or 'OnDelete'",
        )),
    }
    nonnegative(
        errs,
        sp.child("revisionHistoryLimit"),
        spec,
        "revisionHistoryLimit",
    );
    nonnegative(errs, sp.child("minReadySeconds"), spec, "minReadySeconds");
    if let Some(o) = spec.get("ordinals").filter(|v| !v.is_null()) {
        nonnegative(errs, sp.child("ordinals").child("start"), o, "start");
    }
    let rp = sp.child("persistentVolumeClaimRetentionPolicy");
    for field in ["whenDeleted", "whenScaled"] {
        if let Some(v) = spec
            .pointer(&format!("/persistentVolumeClaimRetentionPolicy/{field}"))
            .and_then(Value::as_str)
        {
            enum_field(errs, rp.child(field), v, &["Retain", "Delete"]);
        }
    }
    for (i, claim) in arr(spec, "volumeClaimTemplates").iter().enumerate() {
        let cp = sp.child("volumeClaimTemplates").index(i);
        if claim
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            errs.push(FieldError::required(cp.child("metadata").child("name"), ""));
        }
        if arr(claim.get("spec").unwrap_or(&json!({})), "accessModes").is_empty() {
            errs.push(FieldError::required(
                cp.child("spec").child("accessModes"),
                "at least 1 access mode is required",
            ));
        }
        if claim.pointer("/spec/resources/requests/storage").is_none() {
            errs.push(FieldError::required(
                cp.child("spec")
                    .child("resources")
                    .child("requests")
                    .child("storage"),
                "",
            ));
        }
    }
    // Upstream lets only these fields change after creation.
    if let Some(old) = old {
        let mut a = spec.clone();
        let mut b = old.get("spec").cloned().unwrap_or_else(|| json!({}));
        for f in [
            "replicas",
            "ordinals",
            "template",
            "updateStrategy",
            "persistentVolumeClaimRetentionPolicy",
            "minReadySeconds",
        ] {
            if let Value::Object(m) = &mut a {
                m.remove(f);
            }
            if let Value::Object(m) = &mut b {
                m.remove(f);
            }
        }
        if semantic(&a) != semantic(&b) {
            errs.push(FieldError::forbidden(
                sp,
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', \
                 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and \
                 'minReadySeconds' are forbidden",
            ));
        }
    }
}

pub(super) fn validate_pdb(errs: &mut Errs, obj: &Value) {
    let empty = json!({});
    let spec = obj.get("spec").unwrap_or(&empty);
    let sp = Path::new("spec");
    if present(spec, "minAvailable") && present(spec, "maxUnavailable") {
        errs.push(FieldError::invalid(
            &sp,
            spec.clone(),
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    int_or_percent(
        errs,
        spec.get("minAvailable"),
        sp.child("minAvailable"),
        true,
    );
    int_or_percent(
        errs,
        spec.get("maxUnavailable"),
        sp.child("maxUnavailable"),
        true,
    );
    if let Some(sel) = spec.get("selector").filter(|v| !v.is_null()) {
        super::common::label_selector(errs, sp.child("selector"), sel);
    }
    if let Some(p) = spec
        .get("unhealthyPodEvictionPolicy")
        .and_then(Value::as_str)
    {
        enum_field(
            errs,
            sp.child("unhealthyPodEvictionPolicy"),
            p,
            &["AlwaysAllow", "IfHealthyBudget"],
        );
    }
}
