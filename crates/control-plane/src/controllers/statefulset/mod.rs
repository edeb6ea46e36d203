//! The StatefulSet controller (upstream's pkg/controller/statefulset): pods with a sticky
//! identity ([`identity`]) made, replaced and updated in the order [`control`] plans, from
//! the pod templates kept as ControllerRevisions ([`history`]), each pod's claims made
//! from the set's `volumeClaimTemplates` before the pod and kept after it (unless the
//! set's `persistentVolumeClaimRetentionPolicy` says Delete).
//!
//! Pod names are fixed by ordinal, so a slow or restarted watch cannot lead to a second
//! pod for an ordinal: a repeated create meets AlreadyExists. Syncs that wait for
//! minReadySeconds, and syncs that failed (with back-off), are queued for later.

pub(crate) mod control;
pub(crate) mod identity;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::rest::list::labels_of;
use crate::apiserver::state::ApiState;
use crate::controllers::cache::{Cache, Change};
use crate::controllers::controller_utils::{controller_ref, deleting, i, label_selector, s};
use crate::controllers::events::Recorder;
use crate::controllers::history;
use crate::controllers::objects;
use crate::storage::{EventKind, StoreError};
use control::{Action, DeleteReason, SetSpec, Strategy, plan};

const SETS: &str = "/apps/statefulsets/";
const PODS: &str = "/core/pods/";
const REVISIONS: &str = "/apps/controllerrevisions/";
/// Every set is synced at least this often, whatever the watches said.
const RESYNC: Duration = Duration::from_secs(30);
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

struct Controller {
    st: Arc<ApiState>,
    events: Recorder,
}

/// Why a sync must be tried again.
struct SyncError(String);

impl From<StoreError> for SyncError {
    fn from(e: StoreError) -> Self {
        SyncError(e.to_string())
    }
}

pub async fn run(st: Arc<ApiState>) {
    let mut sets = Cache::new(st.store.clone(), SETS);
    let mut pods = Cache::new(st.store.clone(), PODS);
    let mut revisions = Cache::new(st.store.clone(), REVISIONS);
    let ctl = Controller {
        st: st.clone(),
        events: Recorder::new("statefulset-controller"),
    };
    let mut dirty: HashSet<String> = sets.objects.keys().cloned().collect();
    // Syncs due later (minReadySeconds, back-off after an error), and each set's back-off.
    let mut later: HashMap<String, Instant> = HashMap::new();
    let mut backoff: HashMap<String, Duration> = HashMap::new();
    let mut resync = tokio::time::interval(RESYNC);
    resync.tick().await;
    loop {
        let due = later.values().min().copied();
        if dirty.is_empty() {
            let wake = async {
                match due {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                c = sets.next() => note_set(c, &sets, &mut dirty),
                c = pods.next() => note_pod(c, &sets, &mut dirty),
                _ = revisions.next() => {}
                _ = resync.tick() => dirty.extend(sets.objects.keys().cloned()),
                _ = wake => {}
            }
        }
        while let Some(c) = sets.try_next() {
            note_set(c, &sets, &mut dirty);
        }
        while let Some(c) = pods.try_next() {
            note_pod(c, &sets, &mut dirty);
        }
        while revisions.try_next().is_some() {}
        let now = Instant::now();
        later.retain(|k, t| {
            if *t <= now {
                dirty.insert(k.clone());
                false
            } else {
                true
            }
        });
        for key in std::mem::take(&mut dirty) {
            let Some(set) = sets.get(&key).cloned() else {
                later.remove(&key);
                backoff.remove(&key);
                continue;
            };
            match ctl.sync(&set, &pods, &revisions).await {
                Ok(requeue) => {
                    backoff.remove(&key);
                    match requeue {
                        Some(after) => {
                            later.insert(key, Instant::now() + after);
                        }
                        None => {
                            later.remove(&key);
                        }
                    }
                }
                Err(SyncError(e)) => {
                    let b = backoff
                        .get(&key)
                        .map_or(BACKOFF_MIN, |b| (*b * 2).min(BACKOFF_MAX));
                    tracing::warn!(statefulset = %key, error = %e, retry_in = ?b, "statefulset sync failed");
                    backoff.insert(key.clone(), b);
                    later.insert(key, Instant::now() + b);
                }
            }
            // Our own writes come back as events; take them in before the next set.
            while let Some(c) = pods.try_next() {
                note_pod(c, &sets, &mut dirty);
            }
            while revisions.try_next().is_some() {}
        }
    }
}

fn note_set(c: Change, sets: &Cache, dirty: &mut HashSet<String>) {
    match c {
        Change::Event(ev) => {
            dirty.insert(ev.key.clone());
        }
        Change::Relisted => dirty.extend(sets.objects.keys().cloned()),
    }
}

/// A pod change concerns its controlling StatefulSet, or, for a pod without a controller
/// (one to adopt), every set in its namespace.
fn note_pod(c: Change, sets: &Cache, dirty: &mut HashSet<String>) {
    let ev = match c {
        Change::Event(ev) => ev,
        Change::Relisted => {
            dirty.extend(sets.objects.keys().cloned());
            return;
        }
    };
    let p = &ev.object;
    let ns = s(p, "/metadata/namespace");
    match controller_ref(p) {
        Some(r) if r["kind"] == "StatefulSet" => {
            dirty.insert(format!("{SETS}{ns}/{}", r["name"].as_str().unwrap_or("")));
        }
        Some(_) => {}
        None if ev.kind != EventKind::Deleted => {
            let prefix = format!("{SETS}{ns}/");
            dirty.extend(
                sets.objects
                    .keys()
                    .filter(|k| k.starts_with(&prefix))
                    .cloned(),
            );
        }
        None => {}
    }
}

impl Controller {
    /// One sync; returns when to sync again (minReadySeconds still running).
    async fn sync(
        &self,
        set: &Value,
        pods: &Cache,
        revisions: &Cache,
    ) -> Result<Option<Duration>, SyncError> {
        let ns = s(set, "/metadata/namespace");
        let uid = s(set, "/metadata/uid");
        let selector = set.pointer("/spec/selector").and_then(label_selector);
        let mut owned: Vec<Arc<Value>> = Vec::new();
        let prefix = format!("{PODS}{ns}/");
        for (key, p) in &pods.objects {
            if !key.starts_with(&prefix) {
                continue;
            }
            let matches = selector
                .as_ref()
                .is_some_and(|sel| !sel.is_empty() && sel.matches(&labels_of(p)));
            match controller_ref(p) {
                Some(r) if r["uid"] == uid => {
                    if matches || deleting(set) {
                        owned.push(p.clone());
                    } else {
                        self.release(key, uid);
                    }
                }
                Some(_) => {}
                None if matches && !deleting(set) && !deleting(p) => {
                    if let Some(adopted) = self.adopt(key, set, uid)? {
                        owned.push(adopted);
                    }
                }
                None => {}
            }
        }
        if deleting(set) {
            return Ok(None);
        }
        let (current, update, collisions) = self.revisions(set, revisions)?;
        let current_name = s(&current, "/metadata/name").to_string();
        let update_name = s(&update, "/metadata/name").to_string();
        let spec = SetSpec::from_object(set);
        let refs: Vec<&Value> = owned.iter().map(|p| p.as_ref()).collect();
        let now = crate::apiserver::rest::now_ts();
        let p = plan(&spec, &refs, &current_name, &update_name, now);
        for a in &p.actions {
            self.act(set, a, &current, &update).await?;
        }
        self.write_status(
            set,
            &spec,
            &p.counts,
            &current_name,
            &update_name,
            collisions,
        );
        self.truncate_history(set, revisions, &refs, &current_name, &update_name);
        Ok(p.requeue_after
            .map(|s| Duration::from_secs(s.max(1) as u64)))
    }

    fn release(&self, key: &str, uid: &str) {
        let _ = objects::modify(&self.st, key, &mut |p| {
            let Some(refs) = p
                .pointer_mut("/metadata/ownerReferences")
                .and_then(Value::as_array_mut)
            else {
                return false;
            };
            let before = refs.len();
            refs.retain(|r| r["uid"] != uid);
            refs.len() != before
        });
    }

    /// Upstream's ClaimPods for an orphan the selector matches: it becomes the set's.
    fn adopt(&self, key: &str, set: &Value, uid: &str) -> Result<Option<Arc<Value>>, SyncError> {
        let r = crate::controllers::controller_utils::owner_ref("apps/v1", "StatefulSet", set);
        let out = objects::modify(&self.st, key, &mut |p| {
            if controller_ref(p).is_some() || deleting(p) {
                return false;
            }
            let mut refs = p["metadata"]["ownerReferences"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            refs.retain(|x| x["uid"] != uid);
            refs.push(r.clone());
            p["metadata"]["ownerReferences"] = json!(refs);
            true
        })?;
        Ok(out.map(|stored| stored.object))
    }

    /// The current and update revisions (creating the update revision when the template is
    /// new), and the collision count used to name it.
    fn revisions(&self, set: &Value, cache: &Cache) -> Result<(Value, Value, i64), SyncError> {
        let owned = history::owned(cache.objects.values(), set);
        let next = history::next_revision(&owned);
        let data = history::template_patch(set);
        let mut collisions = i(set, "/status/collisionCount");
        let labels = set
            .pointer("/spec/template/metadata/labels")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let update: Value = match owned.iter().find(|r| r.get("data") == Some(&data)) {
            // Rolling back to an older template makes its revision the newest again.
            Some(existing) if history::revision_of(existing) < next - 1 => {
                history::bump(&self.st, existing, next)?;
                let mut r = (**existing).clone();
                r["revision"] = json!(next);
                r
            }
            Some(existing) => (**existing).clone(),
            None => loop {
                let hash = history::hash(&data, Some(collisions));
                match history::create(&self.st, set, &hash, &labels, data.clone(), next) {
                    Ok(r) => break (*r).clone(),
                    // Upstream resolves a hash collision by counting it into the name.
                    Err(history::CreateError::Collision) if collisions < 100 => collisions += 1,
                    Err(history::CreateError::Collision) => {
                        return Err(SyncError("too many revision name collisions".into()));
                    }
                    Err(history::CreateError::Store(e)) => return Err(e.into()),
                }
            },
        };
        let current_name = s(set, "/status/currentRevision");
        let current = owned
            .iter()
            .find(|r| !current_name.is_empty() && s(r, "/metadata/name") == current_name)
            .map(|r| (**r).clone())
            .unwrap_or_else(|| update.clone());
        Ok((current, update, collisions))
    }

    async fn act(
        &self,
        set: &Value,
        a: &Action,
        current: &Value,
        update: &Value,
    ) -> Result<(), SyncError> {
        let set_name = s(set, "/metadata/name");
        let ns = s(set, "/metadata/namespace");
        match a {
            Action::Create { ordinal, at_update } => {
                let rev = if *at_update { update } else { current };
                let template = history::template_of(rev);
                let pod = identity::new_pod(set, &template, *ordinal, s(rev, "/metadata/name"));
                let pod_name = identity::pod_name(set_name, *ordinal);
                for claim in identity::claims(set, *ordinal) {
                    self.create_claim(set, &pod_name, claim).await?;
                }
                match objects::create_pod(&self.st, ns, pod) {
                    Ok(_) => {
                        self.events.record(
                            &self.st,
                            set,
                            "Normal",
                            "SuccessfulCreate",
                            &format!("create Pod {pod_name} in StatefulSet {set_name} successful"),
                        );
                    }
                    // Names are fixed per ordinal: a pod made before the cache saw it.
                    Err(e) if nodus_k8s::status::code(&e.0) == 409 => {}
                    Err(e) => {
                        self.events.record(
                            &self.st,
                            set,
                            "Warning",
                            "FailedCreate",
                            &format!(
                                "create Pod {pod_name} in StatefulSet {set_name} failed error: {e}"
                            ),
                        );
                        return Err(SyncError(e.to_string()));
                    }
                }
            }
            Action::Delete { name, reason } => {
                if *reason == DeleteReason::Condemned
                    && s(set, "/spec/persistentVolumeClaimRetentionPolicy/whenScaled") == "Delete"
                {
                    self.hand_claims_to_pod(set, name);
                }
                let Some(mut t) = objects::target("", "pods", Some(ns)) else {
                    return Err(SyncError("pods are not in the catalogue".into()));
                };
                t.namespace = Some(ns.to_string());
                match delete_object(&self.st, &t, name, &DeleteOptions::default()) {
                    Ok(_) => self.events.record(
                        &self.st,
                        set,
                        "Normal",
                        "SuccessfulDelete",
                        &format!("delete Pod {name} in StatefulSet {set_name} successful"),
                    ),
                    Err(e) if nodus_k8s::status::code(&e.0) == 404 => {}
                    Err(e) => {
                        let msg = e.0["message"].as_str().unwrap_or("").to_string();
                        self.events.record(
                            &self.st,
                            set,
                            "Warning",
                            "FailedDelete",
                            &format!(
                                "delete Pod {name} in StatefulSet {set_name} failed error: {msg}"
                            ),
                        );
                        return Err(SyncError(msg));
                    }
                }
            }
            Action::FixIdentity { name, ordinal } => {
                let key = objects::key_of("", "pods", Some(ns), name);
                objects::modify(&self.st, &key, &mut |p| {
                    identity::set_identity(set, p, *ordinal);
                    true
                })?;
            }
        }
        Ok(())
    }

    /// Creates a pod's claim unless it exists; with `whenDeleted: Delete` the set owns it,
    /// so deleting the set deletes its claims.
    async fn create_claim(
        &self,
        set: &Value,
        pod: &str,
        mut claim: Value,
    ) -> Result<(), SyncError> {
        let ns = s(set, "/metadata/namespace");
        let set_name = s(set, "/metadata/name");
        let name = s(&claim, "/metadata/name").to_string();
        let key = objects::key_of("", "persistentvolumeclaims", Some(ns), &name);
        if key.is_empty() {
            return Err(SyncError(
                "persistentvolumeclaims are not served: volumeClaimTemplates cannot be honoured"
                    .into(),
            ));
        }
        if self.st.store.get(&key)?.is_some() {
            return Ok(());
        }
        if s(
            set,
            "/spec/persistentVolumeClaimRetentionPolicy/whenDeleted",
        ) == "Delete"
        {
            let mut r =
                crate::controllers::controller_utils::owner_ref("apps/v1", "StatefulSet", set);
            r["controller"] = json!(false);
            claim["metadata"]["ownerReferences"] = json!([r]);
        }
        match objects::create_as_client(&self.st, "", "persistentvolumeclaims", ns, claim).await {
            Ok(_) => {
                self.events.record(
                    &self.st,
                    set,
                    "Normal",
                    "SuccessfulCreate",
                    &format!("create Claim {name} Pod {pod} in StatefulSet {set_name} success"),
                );
                Ok(())
            }
            Err(e) if nodus_k8s::status::code(&e.0) == 409 => Ok(()),
            Err(e) => {
                self.events.record(
                    &self.st,
                    set,
                    "Warning",
                    "FailedCreate",
                    &format!("create Claim {name} for Pod {pod} in StatefulSet {set_name} failed error: {e}"),
                );
                Err(SyncError(e.to_string()))
            }
        }
    }

    /// `whenScaled: Delete`: a condemned pod's claims become the pod's, so the garbage
    /// collector removes them with it.
    fn hand_claims_to_pod(&self, set: &Value, pod_name: &str) {
        let ns = s(set, "/metadata/namespace");
        let Some(ord) = identity::ordinal(s(set, "/metadata/name"), pod_name) else {
            return;
        };
        let Ok(Some(pod)) = self
            .st
            .store
            .get(&objects::key_of("", "pods", Some(ns), pod_name))
        else {
            return;
        };
        let mut r = crate::controllers::controller_utils::owner_ref("v1", "Pod", &pod.object);
        r["controller"] = json!(false);
        for claim in identity::claims(set, ord) {
            let key = objects::key_of(
                "",
                "persistentvolumeclaims",
                Some(ns),
                s(&claim, "/metadata/name"),
            );
            if key.is_empty() {
                return;
            }
            let _ = objects::modify(&self.st, &key, &mut |c| {
                let mut refs = c["metadata"]["ownerReferences"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if refs.iter().any(|x| x["uid"] == r["uid"]) {
                    return false;
                }
                refs.push(r.clone());
                c["metadata"]["ownerReferences"] = json!(refs);
                true
            });
        }
    }

    fn write_status(
        &self,
        set: &Value,
        spec: &SetSpec,
        c: &control::Counts,
        current: &str,
        update: &str,
        collisions: i64,
    ) {
        let mut current_rev = current.to_string();
        let mut current_replicas = c.current;
        // Upstream's completeRollingUpdate: once every pod runs the update revision and is
        // ready, the update revision becomes the current one.
        let rolling = matches!(spec.strategy, Strategy::RollingUpdate { .. });
        if rolling
            && c.updated == c.replicas
            && c.ready == c.replicas
            && c.replicas == spec.replicas
        {
            current_rev = update.to_string();
            current_replicas = c.updated;
        }
        let status = json!({
            "observedGeneration": i(set, "/metadata/generation"),
            "replicas": c.replicas,
            "readyReplicas": c.ready,
            "currentReplicas": current_replicas,
            "updatedReplicas": c.updated,
            "availableReplicas": c.available,
            "currentRevision": current_rev,
            "updateRevision": update,
            "collisionCount": collisions,
        });
        let key = objects::key_of(
            "apps",
            "statefulsets",
            Some(s(set, "/metadata/namespace")),
            s(set, "/metadata/name"),
        );
        let _ = objects::modify(&self.st, &key, &mut |o| {
            let mut new = o.get("status").cloned().unwrap_or_else(|| json!({}));
            for (k, v) in status.as_object().into_iter().flatten() {
                new[k] = v.clone();
            }
            if o.get("status") == Some(&new) {
                return false;
            }
            o["status"] = new;
            true
        });
    }

    /// Upstream's truncateHistory: revisions no pod runs and that are neither current nor
    /// update are kept up to `revisionHistoryLimit`, oldest removed first.
    /// Upstream's truncateHistory: revisions no pod runs and that are neither current nor
    /// update are kept up to `revisionHistoryLimit`, oldest removed first.
    fn truncate_history(
        &self,
        set: &Value,
        cache: &Cache,
        pods: &[&Value],
        current: &str,
        update: &str,
    ) {
        let limit = set
            .pointer("/spec/revisionHistoryLimit")
            .and_then(Value::as_i64)
            .unwrap_or(10);
        // StatefulSet pods carry the revision's name; history speaks of its hash label.
        let live_names: HashSet<&str> = pods
            .iter()
            .map(|p| s(p, "/metadata/labels/controller-revision-hash"))
            .collect();
        let old: Vec<Arc<Value>> = history::owned(cache.objects.values(), set)
            .into_iter()
            .filter(|r| {
                let n = s(r, "/metadata/name");
                n != current && n != update && !live_names.contains(n)
            })
            .collect();
        let doomed = history::to_truncate(&old, &HashSet::new(), limit);
        history::delete(&self.st, &doomed);
    }
}
