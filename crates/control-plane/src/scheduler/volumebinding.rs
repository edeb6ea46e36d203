//! The VolumeBinding and VolumeZone filters: a pod using PersistentVolumeClaims may only go
//! where its volumes can be reached. A claim already bound pins the pod to the nodes its
//! PV's `spec.nodeAffinity` admits (so a StatefulSet pod made again returns to the node
//! holding its local volume) and to the zone/region its PV's labels name. Unbound claims of a
//! WaitForFirstConsumer class accept every node: the scheduler picks one and records it as
//! the claim's selected node, and the provisioner makes the volume there. A missing or
//! deleted claim, or an unbound claim of an Immediate class, keeps the pod pending as
//! upstream's PreFilter does, until the PV controller has bound it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::NodeSelector;
use nodus_k8s::scheduling;
use serde_json::Value;

use super::Snapshot;
use super::fit::{NodeView, PodFacts, Unfit};
use crate::controllers::volume::{self, Ctx};

/// The topology labels VolumeZone compares between a PV and a node (GA and beta names).
const ZONE_LABELS: [&str; 4] = [
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

/// A PV's zone label may list several zones joined by this (upstream's
/// `volumehelpers.LabelZonesToSet`).
const ZONE_SEPARATOR: &str = "__";

/// Why the pod cannot be placed on any node before nodes are even looked at (upstream's
/// PreFilter refusals, UnschedulableAndUnresolvable).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PreFilterRefusal {
    ClaimNotFound(String),
    ClaimBeingDeleted(String),
    UnboundImmediateClaims,
}

impl std::fmt::Display for PreFilterRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PreFilterRefusal::ClaimNotFound(c) => {
                write!(f, "persistentvolumeclaim \"{c}\" not found")
            }
            PreFilterRefusal::ClaimBeingDeleted(c) => {
                write!(f, "persistentvolumeclaim \"{c}\" is being deleted")
            }
            PreFilterRefusal::UnboundImmediateClaims => {
                write!(f, "pod has unbound immediate PersistentVolumeClaims")
            }
        }
    }
}

/// The bound volumes of one pod, looked up once per scheduling cycle.
pub(crate) struct FilterState {
    /// Per bound claim: its PV, or `None` when the claim names a PV that does not exist.
    volumes: Vec<Option<Arc<Value>>>,
}

/// The claims `pod` mounts. (Generic ephemeral volumes are not served, so no claim is
/// made for them.)
fn claim_names(pod: &PodFacts) -> Vec<String> {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect()
}

fn delayed_binding(snap: &Snapshot<'_>, claim: &Value) -> bool {
    let class = volume::class_of(claim);
    !class.is_empty()
        && snap
            .get(&crate::controllers::objects::key_of(
                "storage.k8s.io",
                "storageclasses",
                None,
                class,
            ))
            .is_some_and(|c| volume::s(&c, "/volumeBindingMode") == "WaitForFirstConsumer")
}

/// The filter's state for `pod`: `Ok(None)` when it uses no bound claim, the refusal when
/// a claim is missing, going away, or waiting for the PV controller to bind it.
pub(crate) fn pre_filter(
    pod: &PodFacts,
    snap: &Snapshot<'_>,
) -> Result<Option<FilterState>, PreFilterRefusal> {
    let names = claim_names(pod);
    if names.is_empty() {
        return Ok(None);
    }
    let mut volumes = Vec::new();
    let mut unbound_immediate = false;
    for name in names {
        let Some(claim) = snap.get(&Ctx::claim_key(&pod.namespace, &name)) else {
            return Err(PreFilterRefusal::ClaimNotFound(name));
        };
        if claim.pointer("/metadata/deletionTimestamp").is_some() {
            return Err(PreFilterRefusal::ClaimBeingDeleted(name));
        }
        match volume::s(&claim, "/spec/volumeName") {
            "" if delayed_binding(snap, &claim) => {}
            "" => unbound_immediate = true,
            pv => volumes.push(snap.get(&Ctx::volume_key(pv))),
        }
    }
    if unbound_immediate {
        return Err(PreFilterRefusal::UnboundImmediateClaims);
    }
    Ok((!volumes.is_empty()).then_some(FilterState { volumes }))
}

impl FilterState {
    /// VolumeBinding's then VolumeZone's verdict on `node`.
    pub(crate) fn filter(&self, node: &NodeView) -> Result<(), Unfit> {
        let mut found = Vec::with_capacity(self.volumes.len());
        for pv in &self.volumes {
            let Some(pv) = pv else {
                return Err(Unfit::VolumeBoundToMissingPv);
            };
            if !node_affinity_admits(pv, node) {
                return Err(Unfit::VolumeNodeAffinityConflict);
            }
            found.push(pv);
        }
        if found.iter().any(|pv| !zone_admits(pv, node)) {
            return Err(Unfit::VolumeZoneConflict);
        }
        Ok(())
    }
}

/// Upstream's `CheckNodeAffinity`: the PV's required node selector terms (ORed) match the
/// node; a PV without one fits everywhere.
fn node_affinity_admits(pv: &Value, node: &NodeView) -> bool {
    let Some(required) = pv.pointer("/spec/nodeAffinity/required") else {
        return true;
    };
    let Ok(sel) = serde_json::from_value::<NodeSelector>(required.clone()) else {
        return false;
    };
    sel.node_selector_terms
        .iter()
        .any(|t| scheduling::term_matches(t, &node.name, &node.labels))
}

/// VolumeZone: for each topology label the PV carries, a node labelled with that key must
/// have one of the PV's values. A node with none of the topology labels is not judged.
fn zone_admits(pv: &Value, node: &NodeView) -> bool {
    if !ZONE_LABELS.iter().any(|k| node.labels.contains_key(*k)) {
        return true;
    }
    let labels = pv.pointer("/metadata/labels").and_then(Value::as_object);
    ZONE_LABELS.iter().all(|k| {
        let Some(want) = labels.and_then(|l| l.get(*k)).and_then(Value::as_str) else {
            return true;
        };
        node.labels
            .get(*k)
            .is_some_and(|have| want.split(ZONE_SEPARATOR).any(|z| z.trim() == have))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{Fixture, node, pod};
    use serde_json::json;

    const ZONE: &str = "topology.kubernetes.io/zone";

    fn pod_with_claims(claims: &[&str]) -> PodFacts {
        let vols: Vec<Value> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        pod(json!({"metadata": {"name": "app"}, "spec": {"volumes": vols}}))
    }

    fn claim(f: &Fixture, name: &str, class: &str, volume: &str) {
        f.put(
            &Ctx::claim_key("default", name),
            json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"storageClassName": class, "volumeName": volume}}),
        );
    }

    fn local_pv(f: &Fixture, name: &str, host: &str, labels: Value) {
        f.put(
            &Ctx::volume_key(name),
            json!({"metadata": {"name": name, "labels": labels},
                "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}]}}}}),
        );
    }

    fn classes(f: &Fixture) {
        f.put(
            "/storage.k8s.io/storageclasses/wait",
            json!({"metadata": {"name": "wait"}, "volumeBindingMode": "WaitForFirstConsumer"}),
        );
        f.put(
            "/storage.k8s.io/storageclasses/now",
            json!({"metadata": {"name": "now"}, "volumeBindingMode": "Immediate"}),
        );
    }

    /// The nodes refused for `p`, with the reason, in name order.
    fn refused(f: &Fixture, p: &PodFacts) -> Result<Vec<(String, Unfit)>, PreFilterRefusal> {
        let snap = f.snapshot();
        let Some(state) = pre_filter(p, &snap)? else {
            return Ok(vec![]);
        };
        Ok(f.views()
            .into_iter()
            .filter_map(|n| state.filter(n).err().map(|r| (n.name.clone(), r)))
            .collect())
    }

    fn nodes() -> Vec<Value> {
        vec![
            node("n1", json!({ZONE: "a"})),
            node("n2", json!({ZONE: "b"})),
            node("n3", json!({})),
        ]
    }

    #[test]
    fn a_bound_claim_pins_the_pod_to_its_volumes_node() {
        let f = Fixture::new(&nodes(), vec![]);
        classes(&f);
        claim(&f, "data", "wait", "pv-data");
        local_pv(&f, "pv-data", "n2", json!({}));
        assert_eq!(
            refused(&f, &pod_with_claims(&["data"])),
            Ok(vec![
                ("n1".into(), Unfit::VolumeNodeAffinityConflict),
                ("n3".into(), Unfit::VolumeNodeAffinityConflict)
            ])
        );
        // Two bound claims on different nodes: nowhere fits.
        claim(&f, "logs", "", "pv-logs");
        local_pv(&f, "pv-logs", "n1", json!({}));
        assert_eq!(
            refused(&f, &pod_with_claims(&["data", "logs"]))
                .unwrap()
                .len(),
            3
        );
        // A PV without node affinity fits every node.
        claim(&f, "shared", "", "pv-shared");
        f.put(
            &Ctx::volume_key("pv-shared"),
            json!({"metadata": {"name": "pv-shared"}, "spec": {"hostPath": {"path": "/x"}}}),
        );
        assert_eq!(refused(&f, &pod_with_claims(&["shared"])), Ok(vec![]));
    }

    #[test]
    fn unbound_claims_wait_for_first_consumer_or_for_the_binder() {
        let f = Fixture::new(&nodes(), vec![]);
        classes(&f);
        claim(&f, "later", "wait", "");
        assert_eq!(refused(&f, &pod_with_claims(&["later"])), Ok(vec![]));
        claim(&f, "now", "now", "");
        assert_eq!(
            refused(&f, &pod_with_claims(&["later", "now"])),
            Err(PreFilterRefusal::UnboundImmediateClaims)
        );
        // No class at all binds immediately too.
        claim(&f, "plain", "", "");
        assert_eq!(
            refused(&f, &pod_with_claims(&["plain"])),
            Err(PreFilterRefusal::UnboundImmediateClaims)
        );
        assert_eq!(
            refused(&f, &pod_with_claims(&["absent"])),
            Err(PreFilterRefusal::ClaimNotFound("absent".into()))
        );
        assert_eq!(
            PreFilterRefusal::ClaimNotFound("absent".into()).to_string(),
            "persistentvolumeclaim \"absent\" not found"
        );
        f.put(
            &Ctx::claim_key("default", "going"),
            json!({"metadata": {"name": "going", "namespace": "default",
                "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"volumeName": "pv-x"}}),
        );
        assert_eq!(
            refused(&f, &pod_with_claims(&["going"]))
                .unwrap_err()
                .to_string(),
            "persistentvolumeclaim \"going\" is being deleted"
        );
    }

    #[test]
    fn a_claim_bound_to_a_missing_volume_fits_nowhere() {
        let f = Fixture::new(&nodes(), vec![]);
        claim(&f, "data", "", "pv-gone");
        let got = refused(&f, &pod_with_claims(&["data"])).unwrap();
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|(_, r)| *r == Unfit::VolumeBoundToMissingPv));
        assert_eq!(
            Unfit::VolumeBoundToMissingPv.to_string(),
            "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
        );
    }

    #[test]
    fn volume_zone_labels_must_match_labelled_nodes() {
        let f = Fixture::new(&nodes(), vec![]);
        claim(&f, "data", "", "pv-zoned");
        f.put(
            &Ctx::volume_key("pv-zoned"),
            json!({"metadata": {"name": "pv-zoned", "labels": {ZONE: "a__c"}},
                "spec": {"hostPath": {"path": "/x"}}}),
        );
        // n1 is in zone a (listed), n2 in b (not listed), n3 carries no zone label.
        assert_eq!(
            refused(&f, &pod_with_claims(&["data"])),
            Ok(vec![("n2".into(), Unfit::VolumeZoneConflict)])
        );
        assert_eq!(
            Unfit::VolumeZoneConflict.to_string(),
            "node(s) had no available volume zone"
        );
    }

    #[test]
    fn pods_without_claims_are_not_judged() {
        let f = Fixture::new(&nodes(), vec![]);
        let p = pod(json!({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}));
        assert!(matches!(pre_filter(&p, &f.snapshot()), Ok(None)));
    }
}
