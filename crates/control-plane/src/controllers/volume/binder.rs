//! The PV controller's binder (upstream's `syncClaim`/`syncVolume`): an unbound claim gets
//! the smallest Available volume that fits it (class, access modes, capacity, selector,
//! volumeMode, a volume pre-bound to it first) or, failing that, a provisioned one; a
//! bound pair is kept consistent (phases, `claimRef`, `volumeName`, annotations); a volume
//! whose claim is gone is Released and handed to [`super::reclaim`].

use std::collections::BTreeMap;
use std::sync::Arc;

use nodus_k8s::quantity::parse_quantity;
use serde_json::{Value, json};

use super::{
    ANN_BETA_STORAGE_PROVISIONER, ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER, ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER, ClaimPhase, Ctx, LOCAL_PATH_PROVISIONER, Reason, VolumePhase,
    annotation, class_of, s, set_annotation,
};
use crate::apiserver::rest::now_rfc3339;
use crate::controllers::objects;

fn storage_nanos(v: &Value, ptr: &str) -> Option<i128> {
    let q = v.pointer(ptr)?;
    let text = match q {
        Value::String(t) => t.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    parse_quantity(&text).ok().map(|q| q.nano_value())
}

fn strings(v: &Value, ptr: &str) -> Vec<String> {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect()
}

fn volume_mode(v: &Value) -> &str {
    match s(v, "/spec/volumeMode") {
        "" => "Filesystem",
        m => m,
    }
}

/// Whether the volume's `claimRef` names this claim (uid too, when it has one).
pub(crate) fn bound_to_claim(volume: &Value, claim: &Value) -> bool {
    let r = &volume["spec"]["claimRef"];
    if !r.is_object() {
        return false;
    }
    s(r, "/name") == s(claim, "/metadata/name")
        && s(r, "/namespace") == s(claim, "/metadata/namespace")
        && (s(r, "/uid").is_empty() || s(r, "/uid") == s(claim, "/metadata/uid"))
}

fn selector_matches(claim: &Value, volume: &Value) -> bool {
    let Some(sel) = claim.pointer("/spec/selector").filter(|v| v.is_object()) else {
        return true;
    };
    let Ok(sel) = serde_json::from_value(sel.clone()) else {
        return false;
    };
    let Ok(sel) = nodus_k8s::selector::from_metav1(&sel) else {
        return false;
    };
    let labels: BTreeMap<String, String> = volume
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default();
    sel.matches(&labels)
}

/// Whether the volume's required node affinity admits `node` (a volume without one fits
/// every node). Labels other than the node name are not known here: terms on
/// `kubernetes.io/hostname` are checked, others accepted.
fn volume_fits_node(volume: &Value, node: &str) -> bool {
    let terms = volume
        .pointer("/spec/nodeAffinity/required/nodeSelectorTerms")
        .and_then(Value::as_array);
    let Some(terms) = terms else { return true };
    terms.iter().any(|t| {
        t["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["key"] == "kubernetes.io/hostname")
            .all(|e| {
                let has = e["values"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x == node));
                match e["operator"].as_str() {
                    Some("In") => has,
                    Some("NotIn") => !has,
                    _ => true,
                }
            })
    })
}

/// Upstream's `FindMatchingVolume`: a volume pre-bound to the claim wins; otherwise the
/// smallest Available, unclaimed volume of the claim's class whose capacity covers the
/// request, whose access modes include all the claim's, whose volumeMode equals the claim's,
/// whose labels match the claim's selector, and (once a node is selected) which fits that
/// node. A WaitForFirstConsumer claim without a node matches only a pre-bound volume.
pub(crate) fn find_best_match<'a>(
    claim: &Value,
    volumes: impl IntoIterator<Item = &'a Arc<Value>>,
    delay_binding: bool,
    node: Option<&str>,
) -> Option<&'a Arc<Value>> {
    let request = storage_nanos(claim, "/spec/resources/requests/storage").unwrap_or(0);
    let modes = strings(claim, "/spec/accessModes");
    let class = class_of(claim);
    let mut best: Option<(&'a Arc<Value>, i128)> = None;
    for v in volumes {
        if v.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let Some(cap) = storage_nanos(v, "/spec/capacity/storage") else {
            continue;
        };
        if cap < request || volume_mode(v) != volume_mode(claim) {
            continue;
        }
        if node.is_some_and(|n| !volume_fits_node(v, n)) {
            continue;
        }
        if bound_to_claim(v, claim) {
            return Some(v);
        }
        if delay_binding && node.is_none() {
            continue;
        }
        if s(v, "/status/phase") != VolumePhase::Available.as_str()
            || v["spec"]["claimRef"].is_object()
            || class_of(v) != class
            || !selector_matches(claim, v)
        {
            continue;
        }
        let pv_modes = strings(v, "/spec/accessModes");
        if !modes.iter().all(|m| pv_modes.contains(m)) {
            continue;
        }
        if best.is_none_or(|(_, c)| cap < c) {
            best = Some((v, cap));
        }
    }
    best.map(|(v, _)| v)
}

fn set_volume_phase(v: &mut Value, phase: VolumePhase, message: Option<&str>) -> bool {
    let mut changed = false;
    if s(v, "/status/phase") != phase.as_str() {
        v["status"]["phase"] = json!(phase.as_str());
        v["status"]["lastPhaseTransitionTime"] = json!(now_rfc3339());
        changed = true;
    }
    let msg = message.unwrap_or("");
    if s(v, "/status/message") != msg {
        if let Some(st) = v["status"].as_object_mut() {
            if msg.is_empty() {
                st.remove("message");
            } else {
                st.insert("message".into(), json!(msg));
            }
        }
        changed = true;
    }
    changed
}

pub(crate) fn update_volume_phase(
    ctx: &Ctx<'_>,
    name: &str,
    phase: VolumePhase,
    message: Option<&str>,
) {
    let _ = objects::modify(ctx.st, &Ctx::volume_key(name), &mut |v| {
        set_volume_phase(v, phase, message)
    });
}

fn claim_ref(claim: &Value) -> Value {
    json!({
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "namespace": s(claim, "/metadata/namespace"),
        "name": s(claim, "/metadata/name"),
        "uid": s(claim, "/metadata/uid"),
        "resourceVersion": s(claim, "/metadata/resourceVersion"),
    })
}

/// Binds both halves: the volume's `claimRef` and phase first (so a crash between the two
/// writes leaves a volume pre-bound to the claim, which the next pass finishes), then the
/// claim's `volumeName`, annotations and status.
fn bind(ctx: &Ctx<'_>, volume: &Value, claim: &Value) {
    let pv_name = s(volume, "/metadata/name").to_string();
    let cref = claim_ref(claim);
    let ok = objects::modify(ctx.st, &Ctx::volume_key(&pv_name), &mut |v| {
        let mut changed = false;
        if !v["spec"]["claimRef"].is_object() {
            set_annotation(v, ANN_BOUND_BY_CONTROLLER, "yes");
            changed = true;
        }
        if !bound_to_claim(v, claim) && v["spec"]["claimRef"].is_object() {
            // Taken by another claim since the cache was read.
            return false;
        }
        if s(v, "/spec/claimRef/uid").is_empty() {
            v["spec"]["claimRef"] = cref.clone();
            changed = true;
        }
        set_volume_phase(v, VolumePhase::Bound, None) || changed
    });
    let Ok(stored) = ok else { return };
    let stored_pv = match stored {
        Some(s) => s.object,
        None => match ctx.st.store.get(&Ctx::volume_key(&pv_name)) {
            Ok(Some(s)) => s.object,
            _ => return,
        },
    };
    if !bound_to_claim(&stored_pv, claim) {
        return;
    }
    let key = Ctx::claim_key(s(claim, "/metadata/namespace"), s(claim, "/metadata/name"));
    let _ = objects::modify(ctx.st, &key, &mut |c| {
        if s(c, "/metadata/uid") != s(claim, "/metadata/uid") {
            return false;
        }
        let mut changed = false;
        if s(c, "/spec/volumeName").is_empty() {
            c["spec"]["volumeName"] = json!(pv_name);
            set_annotation(c, ANN_BOUND_BY_CONTROLLER, "yes");
            changed = true;
        } else if s(c, "/spec/volumeName") != pv_name {
            return false;
        }
        if annotation(c, ANN_BIND_COMPLETED) != Some("yes") {
            set_annotation(c, ANN_BIND_COMPLETED, "yes");
            changed = true;
        }
        let status = json!({
            "phase": ClaimPhase::Bound.as_str(),
            "accessModes": stored_pv["spec"]["accessModes"],
            "capacity": stored_pv["spec"]["capacity"],
        });
        for k in ["phase", "accessModes", "capacity"] {
            if c["status"][k] != status[k] {
                c["status"][k] = status[k].clone();
                changed = true;
            }
        }
        changed
    });
    ctx.forget(claim);
}

/// One claim: bind, provision or wait (unbound), or keep the binding consistent.
pub(crate) fn sync_claim(ctx: &Ctx<'_>, claim: &Arc<Value>) {
    let volume_name = s(claim, "/spec/volumeName");
    if volume_name.is_empty() {
        return sync_unbound_claim(ctx, claim);
    }
    let Some(volume) = ctx.volumes.get(volume_name) else {
        if s(claim, "/status/phase") != ClaimPhase::Lost.as_str()
            && s(claim, "/status/phase") == ClaimPhase::Bound.as_str()
        {
            let key = Ctx::claim_key(s(claim, "/metadata/namespace"), s(claim, "/metadata/name"));
            let _ = objects::modify(ctx.st, &key, &mut |c| {
                c["status"]["phase"] = json!(ClaimPhase::Lost.as_str());
                true
            });
            ctx.tell_once(
                claim,
                "Warning",
                Reason::ClaimLost,
                "Bound claim has lost its PersistentVolume. Data on the claim is lost!",
            );
        }
        return;
    };
    if !volume["spec"]["claimRef"].is_object() || bound_to_claim(volume, claim) {
        if s(claim, "/status/phase") != ClaimPhase::Bound.as_str()
            || s(volume, "/status/phase") != VolumePhase::Bound.as_str()
            || s(volume, "/spec/claimRef/uid").is_empty()
            || annotation(claim, ANN_BIND_COMPLETED) != Some("yes")
        {
            bind(ctx, volume, claim);
        }
        return;
    }
    ctx.tell_once(
        claim,
        "Warning",
        Reason::ClaimMisbound,
        "Two claims are bound to the same volume, this one is bound incorrectly",
    );
}

fn sync_unbound_claim(ctx: &Ctx<'_>, claim: &Arc<Value>) {
    if claim.pointer("/metadata/deletionTimestamp").is_some() {
        return;
    }
    let class_name = class_of(claim);
    let class = ctx.classes.get(class_name);
    let delay = class.is_some_and(|c| s(c, "/volumeBindingMode") == "WaitForFirstConsumer");
    let node = annotation(claim, ANN_SELECTED_NODE);
    if let Some(v) = find_best_match(claim, ctx.volumes.values(), delay, node) {
        bind(ctx, v, claim);
        return;
    }
    if class_name.is_empty() {
        ctx.tell_once(
            claim,
            "Normal",
            Reason::FailedBinding,
            "no persistent volumes available for this claim and no storage class is set",
        );
        return;
    }
    let Some(class) = class else {
        ctx.tell_once(
            claim,
            "Warning",
            Reason::ProvisioningFailed,
            &format!("storageclass.storage.k8s.io {class_name:?} not found"),
        );
        return;
    };
    if delay && node.is_none() {
        ctx.tell_once(
            claim,
            "Normal",
            Reason::WaitForFirstConsumer,
            "waiting for first consumer to be created before binding",
        );
        return;
    }
    let provisioner = s(class, "/provisioner").to_string();
    if annotation(claim, ANN_STORAGE_PROVISIONER) != Some(provisioner.as_str()) {
        let key = Ctx::claim_key(s(claim, "/metadata/namespace"), s(claim, "/metadata/name"));
        let _ = objects::modify(ctx.st, &key, &mut |c| {
            set_annotation(c, ANN_STORAGE_PROVISIONER, &provisioner);
            set_annotation(c, ANN_BETA_STORAGE_PROVISIONER, &provisioner);
            true
        });
    }
    if provisioner == LOCAL_PATH_PROVISIONER {
        super::provisioner::provision(ctx, claim, class, node);
    } else {
        ctx.tell_once(
            claim,
            "Normal",
            Reason::ExternalProvisioning,
            &format!(
                "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
            ),
        );
    }
}

/// One volume: its phase from its claim's state; a released volume goes to reclaim.
pub(crate) fn sync_volume(ctx: &Ctx<'_>, volume: &Arc<Value>) {
    let name = s(volume, "/metadata/name");
    let phase = s(volume, "/status/phase");
    let cref = &volume["spec"]["claimRef"];
    if !cref.is_object() || s(cref, "/uid").is_empty() {
        if phase != VolumePhase::Available.as_str() && phase != VolumePhase::Failed.as_str() {
            update_volume_phase(ctx, name, VolumePhase::Available, None);
        }
        return;
    }
    let claim = ctx
        .claims
        .get(&format!("{}/{}", s(cref, "/namespace"), s(cref, "/name")))
        .filter(|c| s(c, "/metadata/uid") == s(cref, "/uid"));
    match claim {
        Some(c) if s(c, "/spec/volumeName") == name => {
            if phase != VolumePhase::Bound.as_str() {
                update_volume_phase(ctx, name, VolumePhase::Bound, None);
            }
        }
        // The claim is being bound (it finds this pre-bound volume first).
        Some(c) if s(c, "/spec/volumeName").is_empty() => {}
        Some(_) => {
            // The claim is bound to another volume: a binding this controller made is
            // undone, a user's pre-binding stays.
            if annotation(volume, ANN_BOUND_BY_CONTROLLER) == Some("yes") {
                let _ = objects::modify(ctx.st, &Ctx::volume_key(name), &mut |v| {
                    if let Some(spec) = v["spec"].as_object_mut() {
                        spec.remove("claimRef");
                    }
                    set_volume_phase(v, VolumePhase::Available, None);
                    true
                });
            }
        }
        None => {
            if phase != VolumePhase::Released.as_str() && phase != VolumePhase::Failed.as_str() {
                update_volume_phase(ctx, name, VolumePhase::Released, None);
            }
            super::reclaim::reclaim(ctx, volume);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(name: &str, size: &str, modes: &[&str], class: &str, extra: Value) -> Arc<Value> {
        let mut v = json!({"metadata": {"name": name, "labels": {"tier": "fast"}},
            "spec": {"capacity": {"storage": size}, "accessModes": modes, "storageClassName": class,
                "volumeMode": "Filesystem"},
            "status": {"phase": "Available"}});
        for (k, x) in extra.as_object().into_iter().flatten() {
            match k.as_str() {
                "phase" => v["status"]["phase"] = x.clone(),
                _ => v["spec"][k] = x.clone(),
            }
        }
        Arc::new(v)
    }

    fn pvc(size: &str, modes: &[&str], class: &str, extra: Value) -> Value {
        let mut c = json!({"metadata": {"name": "data", "namespace": "default", "uid": "u1"},
            "spec": {"resources": {"requests": {"storage": size}}, "accessModes": modes,
                "storageClassName": class, "volumeMode": "Filesystem"}});
        for (k, x) in extra.as_object().into_iter().flatten() {
            c["spec"][k] = x.clone();
        }
        c
    }

    #[test]
    fn matching_table() {
        let rwo = &["ReadWriteOnce"][..];
        let vols = vec![
            pv("big", "10Gi", rwo, "", json!({})),
            pv("small", "2Gi", rwo, "", json!({})),
            pv("tiny", "512Mi", rwo, "", json!({})),
            pv(
                "rwx",
                "1Gi",
                &["ReadWriteMany", "ReadWriteOnce"],
                "",
                json!({}),
            ),
            pv("gold", "1Gi", rwo, "gold", json!({})),
            pv("block", "1Gi", rwo, "", json!({"volumeMode": "Block"})),
            pv(
                "taken",
                "1Gi",
                rwo,
                "",
                json!({"phase": "Bound",
                "claimRef": {"namespace": "default", "name": "other", "uid": "u2"}}),
            ),
            pv("released", "1Gi", rwo, "", json!({"phase": "Released"})),
        ];
        let cases: Vec<(&str, Value, Option<&str>)> = vec![
            (
                "smallest fit",
                pvc("1500Mi", rwo, "", json!({})),
                Some("small"),
            ),
            ("exact fit", pvc("512Mi", rwo, "", json!({})), Some("tiny")),
            (
                "access modes must all be offered",
                pvc("1Gi", &["ReadWriteMany"], "", json!({})),
                Some("rwx"),
            ),
            (
                "class must equal",
                pvc("1Gi", rwo, "gold", json!({})),
                Some("gold"),
            ),
            ("nothing big enough", pvc("20Gi", rwo, "", json!({})), None),
            (
                "volumeMode must equal",
                pvc("1Gi", rwo, "", json!({"volumeMode": "Block"})),
                Some("block"),
            ),
            (
                "selector filters",
                pvc(
                    "1Gi",
                    rwo,
                    "",
                    json!({"selector": {"matchLabels": {"tier": "slow"}}}),
                ),
                None,
            ),
            ("no such class", pvc("1Gi", rwo, "silver", json!({})), None),
        ];
        for (what, claim, want) in cases {
            let got = find_best_match(&claim, &vols, false, None).map(|v| s(v, "/metadata/name"));
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn pre_bound_volume_wins_and_delayed_claims_wait_for_a_node() {
        let rwo = &["ReadWriteOnce"][..];
        let claim = pvc("1Gi", rwo, "local-path", json!({}));
        let pinned = |n: &str| {
            json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [n]}]}]}})
        };
        let vols = vec![
            pv(
                "free",
                "1Gi",
                rwo,
                "local-path",
                json!({"nodeAffinity": pinned("n1")}),
            ),
            pv(
                "mine",
                "5Gi",
                rwo,
                "local-path",
                json!({"phase": "Pending",
                "claimRef": {"namespace": "default", "name": "data", "uid": "u1"}}),
            ),
        ];
        let name = |v: Option<&Arc<Value>>| v.map(|v| s(v, "/metadata/name").to_string());
        assert_eq!(
            name(find_best_match(&claim, &vols, true, None)),
            Some("mine".into())
        );
        let only_free = vec![vols[0].clone()];
        assert_eq!(name(find_best_match(&claim, &only_free, true, None)), None);
        assert_eq!(
            name(find_best_match(&claim, &only_free, true, Some("n1"))),
            Some("free".into())
        );
        assert_eq!(
            name(find_best_match(&claim, &only_free, true, Some("n2"))),
            None
        );
        assert_eq!(
            name(find_best_match(&claim, &only_free, false, None)),
            Some("free".into())
        );
    }
}
