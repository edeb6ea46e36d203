//! Persistent storage as kube-controller-manager and k3s run it: the PV controller's
//! [`binder`] (claims ↔ volumes, phases, annotations), [`reclaim`] (what happens to a
//! released volume), the pvc-/pv-[`protection`] finalizers, and k3s's local-path
//! [`provisioner`] for the default `local-path` class.
//!
//! One level-triggered loop over informer caches of PVs, PVCs, StorageClasses and pods: a
//! change to any of them (or the 15 s resync upstream's controller also has) runs one pass
//! over everything. Every write re-reads the stored object and changes it only when it
//! differs, so a pass after a stale cache or a restarted watch converges instead of
//! duplicating work; a provisioned PV has a name derived from the claim's uid, so a repeated
//! provisioning attempt meets `AlreadyExists`, never a second volume.

pub(crate) mod binder;
pub(crate) mod protection;
pub(crate) mod provisioner;
pub(crate) mod reclaim;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::apiserver::state::ApiState;
use crate::controllers::cache::Cache;
use crate::controllers::events::Recorder;
use crate::controllers::objects;

/// The default StorageClass k3s ships.
pub const LOCAL_PATH_CLASS: &str = "local-path";
/// local-path-provisioner's provisioner name, as k3s registers it.
pub const LOCAL_PATH_PROVISIONER: &str = "rancher.io/local-path";

/// The node the scheduler chose for a pod using a WaitForFirstConsumer claim.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
pub(crate) const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
pub(crate) const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
pub(crate) const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub(crate) const ANN_BETA_STORAGE_PROVISIONER: &str =
    "volume.beta.kubernetes.io/storage-provisioner";
/// Which provisioner made a PV (the kubelet reads it to know a local-path directory).
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// Upstream's PV controller resync period.
const RESYNC: Duration = Duration::from_secs(15);

/// PV phases (`v1.PersistentVolumePhase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VolumePhase {
    Available,
    Bound,
    Released,
    Failed,
}

impl VolumePhase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            VolumePhase::Available => "Available",
            VolumePhase::Bound => "Bound",
            VolumePhase::Released => "Released",
            VolumePhase::Failed => "Failed",
        }
    }
}

/// PVC phases (`v1.PersistentVolumeClaimPhase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClaimPhase {
    Bound,
    Lost,
}

impl ClaimPhase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ClaimPhase::Bound => "Bound",
            ClaimPhase::Lost => "Lost",
        }
    }
}

/// Event reasons of the PV controller and the provisioner, as upstream spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    WaitForFirstConsumer,
    FailedBinding,
    ExternalProvisioning,
    Provisioning,
    ProvisioningSucceeded,
    ProvisioningFailed,
    ClaimLost,
    ClaimMisbound,
    VolumeFailedDelete,
    VolumeFailedRecycle,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::WaitForFirstConsumer => "WaitForFirstConsumer",
            Reason::FailedBinding => "FailedBinding",
            Reason::ExternalProvisioning => "ExternalProvisioning",
            Reason::Provisioning => "Provisioning",
            Reason::ProvisioningSucceeded => "ProvisioningSucceeded",
            Reason::ProvisioningFailed => "ProvisioningFailed",
            Reason::ClaimLost => "ClaimLost",
            Reason::ClaimMisbound => "ClaimMisbound",
            Reason::VolumeFailedDelete => "VolumeFailedDelete",
            Reason::VolumeFailedRecycle => "VolumeFailedRecycle",
        }
    }
}

pub(crate) fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

pub(crate) fn annotation<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.pointer("/metadata/annotations")?.get(key)?.as_str()
}

pub(crate) fn set_annotation(v: &mut Value, key: &str, value: &str) {
    if !v["metadata"]["annotations"].is_object() {
        v["metadata"]["annotations"] = json!({});
    }
    v["metadata"]["annotations"][key] = json!(value);
}

/// The class a PV or PVC asks for: the field, else the beta annotation ("" = no class).
pub(crate) fn class_of(v: &Value) -> &str {
    match s(v, "/spec/storageClassName") {
        "" => annotation(v, "volume.beta.kubernetes.io/storage-class").unwrap_or(""),
        c => c,
    }
}

/// The world one pass works from, and what it writes through.
pub(crate) struct Ctx<'a> {
    pub st: &'a ApiState,
    pub volumes: HashMap<String, Arc<Value>>,
    pub claims: HashMap<String, Arc<Value>>,
    pub classes: HashMap<String, Arc<Value>>,
    pub pods: Vec<Arc<Value>>,
    pub recorder: &'a Recorder,
    pub provisioner_recorder: &'a Recorder,
    pub storage_path: &'a std::path::Path,
    /// (object uid, reason) already told this run, for events upstream repeats every
    /// resync: told once per state instead.
    pub told: &'a Mutex<HashSet<(String, &'static str)>>,
}

impl Ctx<'_> {
    /// Records an event once per (object, reason) until [`Ctx::forget`].
    pub(crate) fn tell_once(&self, obj: &Value, kind: &str, reason: Reason, msg: &str) {
        let key = (s(obj, "/metadata/uid").to_string(), reason.as_str());
        let fresh = self.told.lock().map(|mut t| t.insert(key)).unwrap_or(true);
        if fresh {
            self.recorder
                .record(self.st, obj, kind, reason.as_str(), msg);
        }
    }

    pub(crate) fn forget(&self, obj: &Value) {
        let uid = s(obj, "/metadata/uid");
        if let Ok(mut t) = self.told.lock() {
            t.retain(|(u, _)| u != uid);
        }
    }

    pub(crate) fn claim_key(ns: &str, name: &str) -> String {
        objects::key_of("", "persistentvolumeclaims", Some(ns), name)
    }

    pub(crate) fn volume_key(name: &str) -> String {
        objects::key_of("", "persistentvolumes", None, name)
    }
}

fn by_name(cache: &Cache) -> HashMap<String, Arc<Value>> {
    cache
        .objects
        .values()
        .map(|o| (s(o, "/metadata/name").to_string(), o.clone()))
        .collect()
}

fn by_namespaced_name(cache: &Cache) -> HashMap<String, Arc<Value>> {
    cache
        .objects
        .values()
        .map(|o| {
            (
                format!("{}/{}", s(o, "/metadata/namespace"), s(o, "/metadata/name")),
                o.clone(),
            )
        })
        .collect()
}

/// One pass over every claim, then every volume, then the finalizers.
fn sync_all(ctx: &Ctx<'_>) {
    let mut claims: Vec<&Arc<Value>> = ctx.claims.values().collect();
    claims.sort_by_key(|c| s(c, "/metadata/creationTimestamp").to_string());
    for c in claims {
        binder::sync_claim(ctx, c);
    }
    for v in ctx.volumes.values() {
        binder::sync_volume(ctx, v);
    }
    protection::sync(ctx);
}

/// The scheduler's hook at bind time: each unbound WaitForFirstConsumer claim of the pod
/// learns the chosen node (upstream's VolumeBinding plugin sets the same annotation in
/// PreBind), which lets the provisioner make the volume there.
pub fn select_node_for_claims(st: &ApiState, pod: &Value, node: &str) {
    let ns = s(pod, "/metadata/namespace");
    for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        let Some(claim) = v
            .pointer("/persistentVolumeClaim/claimName")
            .and_then(Value::as_str)
        else {
            continue;
        };
        let key = Ctx::claim_key(ns, claim);
        let Ok(Some(cur)) = st.store.get(&key) else {
            continue;
        };
        let class = class_of(&cur.object).to_string();
        let delayed = st
            .store
            .get(&objects::key_of(
                "storage.k8s.io",
                "storageclasses",
                None,
                &class,
            ))
            .ok()
            .flatten()
            .is_some_and(|c| s(&c.object, "/volumeBindingMode") == "WaitForFirstConsumer");
        if !delayed {
            continue;
        }
        let _ = objects::modify(st, &key, &mut |c| {
            if !s(c, "/spec/volumeName").is_empty() || annotation(c, ANN_SELECTED_NODE).is_some() {
                return false;
            }
            set_annotation(c, ANN_SELECTED_NODE, node);
            true
        });
    }
}

/// Runs the controller until the task is aborted. `storage_path` is where local-path
/// volumes live on every node (k3s's `--default-local-storage-path`).
pub async fn run(st: Arc<ApiState>, storage_path: PathBuf) {
    let mut pvs = Cache::new(st.store.clone(), "/core/persistentvolumes/");
    let mut pvcs = Cache::new(st.store.clone(), "/core/persistentvolumeclaims/");
    let mut classes = Cache::new(st.store.clone(), "/storage.k8s.io/storageclasses/");
    let mut pods = Cache::new(st.store.clone(), "/core/pods/");
    let recorder = Recorder::new("persistentvolume-controller");
    let provisioner_recorder = Recorder::new(&format!("{LOCAL_PATH_PROVISIONER}_nodus"));
    let told = Mutex::new(HashSet::new());
    let mut tick = tokio::time::interval(RESYNC);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = pvs.next() => {}
            _ = pvcs.next() => {}
            _ = classes.next() => {}
            _ = pods.next() => {}
        }
        // Let a burst of changes settle into one pass.
        tokio::time::sleep(Duration::from_millis(50)).await;
        while pvs.try_next().is_some() {}
        while pvcs.try_next().is_some() {}
        while classes.try_next().is_some() {}
        while pods.try_next().is_some() {}
        let ctx = Ctx {
            st: &st,
            volumes: by_name(&pvs),
            claims: by_namespaced_name(&pvcs),
            classes: by_name(&classes),
            pods: pods.objects.values().cloned().collect(),
            recorder: &recorder,
            provisioner_recorder: &provisioner_recorder,
            storage_path: &storage_path,
            told: &told,
        };
        sync_all(&ctx);
    }
}
