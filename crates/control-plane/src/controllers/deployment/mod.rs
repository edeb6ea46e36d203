//! The Deployment controller (upstream's pkg/controller/deployment): a Deployment owns
//! ReplicaSets, one per pod template (named `<deployment>-<pod-template-hash>`), and
//! rolls pods from the old ones to the new one by its strategy ([`rolling`],
//! [`recreate`]); a resize mid-rollout is spread proportionally ([`sync`]); its status
//! and conditions follow ([`progress`]); the arithmetic is in [`util`]. The
//! ReplicaSet controller makes the pods. All state is read back from the store on
//! every sync, so a restarted control plane picks a rollout up where it stood.

pub(crate) mod progress;
pub(crate) mod recreate;
pub(crate) mod rolling;
pub(crate) mod sync;
pub(crate) mod util;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::apiserver::rest::list::labels_of;
use crate::apiserver::state::ApiState;
use crate::controllers::cache::{Cache, Change};
use crate::controllers::events::Recorder;
use crate::controllers::objects;
use crate::controllers::replicaset::{
    controller_ref, deleting, i, label_selector, owner_ref, parse_ts, s,
};
use crate::storage::EventKind;

const DEPLOYMENTS: &str = "/apps/deployments/";
const REPLICASETS: &str = "/apps/replicasets/";

/// A ReplicaSet as the controller works on it: its storage key and current object,
/// replaced by what the store returns after each write.
#[derive(Clone, Debug)]
pub(crate) struct Rs {
    pub key: String,
    pub obj: Value,
}

impl Rs {
    pub(crate) fn name(&self) -> &str {
        s(&self.obj, "/metadata/name")
    }
    pub(crate) fn uid(&self) -> &str {
        s(&self.obj, "/metadata/uid")
    }
    pub(crate) fn replicas(&self) -> i64 {
        i(&self.obj, "/spec/replicas")
    }
    pub(crate) fn status(&self, f: &str) -> i64 {
        i(&self.obj, &format!("/status/{f}"))
    }
    /// The pods this set has or is about to have: its spec, or more while the ReplicaSet
    /// controller has not yet deleted the pods a scale-down asked it to drop (its
    /// `status.replicas` counts the live ones). Upstream counts spec alone, so for the moment
    /// between an old set's scale-down and its pod's deletion (always after a control-plane
    /// restart that fell there) the new set could grow past replicas + maxSurge.
    pub(crate) fn pods(&self) -> i64 {
        self.replicas().max(self.status("replicas"))
    }
    pub(crate) fn created(&self) -> i64 {
        parse_ts(s(&self.obj, "/metadata/creationTimestamp"))
            .map(|t| t.as_second())
            .unwrap_or(0)
    }
}

pub(crate) fn sort_by_creation(sets: &mut [Rs]) {
    sets.sort_by(|a, b| util::by_creation((a.created(), a.name()), (b.created(), b.name())));
}

pub(crate) fn replicas_of(d: &Value) -> i64 {
    d.pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

/// What a sync asks of the loop.
pub(crate) enum Outcome {
    Done,
    /// Look again after this many seconds (the progress deadline).
    After(i64),
    Failed,
}

pub(crate) struct DeploymentController {
    pub st: Arc<ApiState>,
    pub recorder: Recorder,
}

impl DeploymentController {
    /// Upstream's syncDeployment.
    async fn sync_deployment(
        &self,
        key: &str,
        deployments: &Cache,
        sets: &Cache,
        pods: &Cache,
    ) -> Outcome {
        let Some(d) = deployments.get(key) else {
            return Outcome::Done;
        };
        let mut d = (**d).clone();
        let Some(selector) = d.pointer("/spec/selector").and_then(label_selector) else {
            return Outcome::Done;
        };
        if selector.is_empty() {
            if i(&d, "/status/observedGeneration") < i(&d, "/metadata/generation") {
                self.recorder.record(
                    &self.st,
                    &d,
                    "Warning",
                    "SelectingAll",
                    "This deployment is selecting all pods. A non-empty selector is required.",
                );
                let g = d["metadata"]["generation"].clone();
                d["status"]["observedGeneration"] = g;
                self.write_deployment(key, &d);
            }
            return Outcome::Done;
        }
        let rs_list = match self.claim_replica_sets(&d, &selector, sets) {
            Ok(l) => l,
            Err(()) => return Outcome::Failed,
        };
        if deleting(&d) {
            return self.sync_status_only(key, d, rs_list);
        }
        if !d["status"].is_object() {
            d["status"] = json!({});
        }
        let mut status = d["status"].clone();
        if progress::paused_condition(&d, &mut status) {
            d["status"] = status;
        }
        if d.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) {
            return self.sync(key, d, rs_list).await;
        }
        if self.is_scaling_event(&d, &rs_list) {
            return self.sync(key, d, rs_list).await;
        }
        match util::Strategy::of(&d) {
            util::Strategy::Recreate => self.rollout_recreate(key, d, rs_list, pods).await,
            util::Strategy::RollingUpdate { .. } => self.rollout_rolling(key, d, rs_list).await,
        }
    }

    /// Upstream's getReplicaSetsForDeployment: owned sets, orphans the selector matches
    /// adopted, owned ones it no longer matches released.
    fn claim_replica_sets(
        &self,
        d: &Value,
        selector: &nodus_k8s::selector::LabelSelector,
        sets: &Cache,
    ) -> Result<Vec<Rs>, ()> {
        let ns = s(d, "/metadata/namespace");
        let uid = s(d, "/metadata/uid");
        let prefix = format!("{REPLICASETS}{ns}/");
        let mut out = Vec::new();
        let mut failed = false;
        for (k, rs) in sets.objects.iter().filter(|(k, _)| k.starts_with(&prefix)) {
            let matches = selector.matches(&labels_of(rs));
            match controller_ref(rs) {
                Some(r) if r["uid"] == uid => {
                    if matches {
                        out.push(Rs {
                            key: k.clone(),
                            obj: (**rs).clone(),
                        });
                    } else if !deleting(rs) {
                        let _ = objects::modify(&self.st, k, &mut |o| {
                            let Some(list) = o
                                .pointer_mut("/metadata/ownerReferences")
                                .and_then(Value::as_array_mut)
                            else {
                                return false;
                            };
                            list.retain(|r| r["uid"] != uid);
                            true
                        });
                    }
                }
                Some(_) => {}
                None if matches && !deleting(rs) && !deleting(d) => {
                    let r = owner_ref("apps/v1", "Deployment", d);
                    let res = objects::modify(&self.st, k, &mut |o| {
                        if controller_ref(o).is_some() {
                            return false;
                        }
                        let m = &mut o["metadata"];
                        if !m["ownerReferences"].is_array() {
                            m["ownerReferences"] = json!([]);
                        }
                        if let Some(l) = m["ownerReferences"].as_array_mut() {
                            l.push(r.clone());
                        }
                        true
                    });
                    match res {
                        Ok(Some(stored)) => out.push(Rs {
                            key: k.clone(),
                            obj: (*stored.object).clone(),
                        }),
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!(rs = %k, error = %e, "deployment: adoption failed");
                            failed = true;
                        }
                    }
                }
                None => {}
            }
        }
        if failed {
            return Err(());
        }
        sort_by_creation(&mut out);
        Ok(out)
    }

    /// Upstream's isScalingEvent: an active set's desired-replicas annotation differs
    /// from the deployment's replicas.
    fn is_scaling_event(&self, d: &Value, rs_list: &[Rs]) -> bool {
        let (new, old) = sync::find_new_and_old(d, rs_list.to_vec());
        let want = replicas_of(d).to_string();
        new.iter()
            .chain(old.iter())
            .filter(|rs| rs.replicas() > 0)
            .any(|rs| util::annotation(&rs.obj, util::DESIRED_REPLICAS).is_some_and(|a| a != want))
    }

    /// Stores the deployment's status and revision annotation when they changed.
    pub(crate) fn write_deployment(&self, key: &str, d: &Value) {
        let status = d.get("status").cloned().unwrap_or(json!({}));
        let rev = util::annotation(d, util::REVISION).map(str::to_string);
        let res = objects::modify(&self.st, key, &mut |o| {
            if o.pointer("/metadata/uid") != d.pointer("/metadata/uid") {
                return false;
            }
            let mut changed = false;
            if o["status"] != status {
                o["status"] = status.clone();
                changed = true;
            }
            if let Some(r) = &rev {
                changed |= util::set_deployment_revision(o, r);
            }
            changed
        });
        if let Err(e) = res {
            tracing::warn!(deployment = %key, error = %e, "deployment: status update failed");
        }
    }
}

pub(crate) async fn run(st: Arc<ApiState>) {
    let mut deployments = Cache::new(st.store.clone(), DEPLOYMENTS);
    let mut sets = Cache::new(st.store.clone(), REPLICASETS);
    let mut pods = Cache::new(st.store.clone(), "/core/pods/");
    let ctl = DeploymentController {
        st: st.clone(),
        recorder: Recorder::new("deployment-controller"),
    };
    let mut requeue: HashMap<String, (Instant, Duration)> = HashMap::new();
    let mut dirty: HashSet<String> = deployments.objects.keys().cloned().collect();
    loop {
        if dirty.is_empty() {
            let wake = requeue.values().map(|(at, _)| *at).min();
            let sleep = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                c = deployments.next() => note_deployment(c, &deployments, &mut dirty),
                c = sets.next() => note_set(c, &deployments, &mut dirty),
                c = pods.next() => note_pod(c, &deployments, &sets, &mut dirty),
                _ = sleep => {}
            }
        }
        while let Some(c) = deployments.try_next() {
            note_deployment(c, &deployments, &mut dirty)
        }
        while let Some(c) = sets.try_next() {
            note_set(c, &deployments, &mut dirty)
        }
        while let Some(c) = pods.try_next() {
            note_pod(c, &deployments, &sets, &mut dirty)
        }
        let now = Instant::now();
        let due: Vec<String> = requeue
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        dirty.extend(due);
        for key in std::mem::take(&mut dirty) {
            let backoff = requeue.get(&key).map(|(at, b)| (*at, *b));
            if let Some((at, b)) = backoff
                && at > now
                && !b.is_zero()
            {
                continue;
            }
            match ctl.sync_deployment(&key, &deployments, &sets, &pods).await {
                Outcome::Done => {
                    requeue.remove(&key);
                }
                Outcome::After(secs) => {
                    requeue.insert(
                        key,
                        (
                            now + Duration::from_secs(secs.max(1) as u64),
                            Duration::ZERO,
                        ),
                    );
                }
                Outcome::Failed => {
                    let prev = backoff.map(|(_, b)| b).unwrap_or(Duration::ZERO);
                    let next = (prev * 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
                    requeue.insert(key, (now + next, next));
                }
            }
            // Our own writes, in before the next deployment's sync.
            while let Some(c) = sets.try_next() {
                note_set(c, &deployments, &mut dirty)
            }
            while let Some(c) = deployments.try_next() {
                note_deployment(c, &deployments, &mut dirty)
            }
        }
    }
}

fn note_deployment(c: Change, deployments: &Cache, dirty: &mut HashSet<String>) {
    match c {
        Change::Event(ev) if ev.kind == EventKind::Deleted => {}
        Change::Event(ev) => {
            dirty.insert(ev.key.clone());
        }
        Change::Relisted => dirty.extend(deployments.objects.keys().cloned()),
    }
}

/// The deployment controlling `obj` (a ReplicaSet), by its controller reference.
fn owning_deployment(obj: &Value, deployments: &Cache) -> Option<String> {
    let r = controller_ref(obj)?;
    if r["kind"] != "Deployment" {
        return None;
    }
    let k = format!(
        "{DEPLOYMENTS}{}/{}",
        s(obj, "/metadata/namespace"),
        r["name"].as_str()?
    );
    deployments
        .get(&k)
        .filter(|d| s(d, "/metadata/uid") == r["uid"].as_str().unwrap_or(""))
        .map(|_| k)
}

fn note_set(c: Change, deployments: &Cache, dirty: &mut HashSet<String>) {
    let ev = match c {
        Change::Event(ev) => ev,
        Change::Relisted => {
            dirty.extend(deployments.objects.keys().cloned());
            return;
        }
    };
    for o in std::iter::once(&ev.object).chain(ev.prev.iter()) {
        match owning_deployment(o, deployments) {
            Some(k) => {
                dirty.insert(k);
            }
            None if controller_ref(o).is_none() => {
                let prefix = format!("{DEPLOYMENTS}{}/", s(o, "/metadata/namespace"));
                let l = labels_of(o);
                for (k, d) in deployments
                    .objects
                    .iter()
                    .filter(|(k, _)| k.starts_with(&prefix))
                {
                    if d.pointer("/spec/selector")
                        .and_then(label_selector)
                        .is_some_and(|sel| !sel.is_empty() && sel.matches(&l))
                    {
                        dirty.insert(k.clone());
                    }
                }
            }
            None => {}
        }
    }
}

/// Only a pod going away matters here: Recreate waits for old pods to be gone.
fn note_pod(c: Change, deployments: &Cache, sets: &Cache, dirty: &mut HashSet<String>) {
    let Change::Event(ev) = c else {
        return;
    };
    if ev.kind != EventKind::Deleted {
        return;
    }
    let Some(r) = controller_ref(&ev.object) else {
        return;
    };
    if r["kind"] != "ReplicaSet" {
        return;
    }
    let k = format!(
        "{REPLICASETS}{}/{}",
        s(&ev.object, "/metadata/namespace"),
        r["name"].as_str().unwrap_or("")
    );
    if let Some(rs) = sets.get(&k)
        && let Some(d) = owning_deployment(rs, deployments)
    {
        dirty.insert(d);
    }
}
