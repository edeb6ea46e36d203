//! The ReplicaSet controller (upstream's ReplicaSetController), which also runs
//! ReplicationControllers: the two differ only in how their selector is written
//! ([`Kind::selector`]). It keeps `spec.replicas` active pods owned by each set: orphans the
//! selector matches are adopted, owned pods it no longer matches are released, missing
//! pods are created in slow-start batches, surplus ones deleted in upstream's
//! ActivePodsWithRanks order ([`deletion_order`]). Expectations ([`Expectations`]) hold a
//! set's next sync back until the watch has shown the creations and deletions it made,
//! so a slow watch never leads to extra pods; after a restart they start empty and the
//! caches are a fresh list of the store, which already holds every pod made before.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use nodus_k8s::selector::LabelSelector;
use serde_json::{Value, json};

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::rest::list::labels_of;
use crate::apiserver::rest::{now_rfc3339, now_ts};
use crate::apiserver::state::ApiState;
use crate::controllers::cache::{Cache, Change, Index};
pub(crate) use crate::controllers::controller_utils::{
    controller_ref, deleting, i, label_selector, owner_ref, parse_ts, pod_active, pod_available,
    pod_ready, ready_since, s,
};
use crate::controllers::events::Recorder;
use crate::controllers::objects;
use crate::storage::EventKind;

/// Upstream's BurstReplicas: the most pods one sync creates or deletes.
const BURST_REPLICAS: usize = 500;
/// Upstream's SlowStartInitialBatchSize.
const SLOW_START_INITIAL_BATCH: usize = 1;
/// Upstream's ExpectationsTimeout: unobserved expectations are given up after this.
const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Upstream's `controller.kubernetes.io/pod-deletion-cost`.
pub(crate) const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The two resources this controller runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    ReplicaSet,
    ReplicationController,
}

impl Kind {
    pub(crate) fn plural(self) -> &'static str {
        match self {
            Kind::ReplicaSet => "replicasets",
            Kind::ReplicationController => "replicationcontrollers",
        }
    }
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Kind::ReplicaSet => "ReplicaSet",
            Kind::ReplicationController => "ReplicationController",
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Kind::ReplicaSet => "apps/v1",
            Kind::ReplicationController => "v1",
        }
    }
    fn prefix(self) -> String {
        format!("/{}/{}/", self.storage_group(), self.plural())
    }
    fn storage_group(self) -> &'static str {
        match self {
            Kind::ReplicaSet => "apps",
            Kind::ReplicationController => "core",
        }
    }
    fn component(self) -> &'static str {
        match self {
            Kind::ReplicaSet => "replicaset-controller",
            Kind::ReplicationController => "replication-controller",
        }
    }
    /// The set's selector; None when it selects nothing (missing, empty or unparsable:
    /// upstream never lets an empty selector adopt every pod in the namespace).
    pub(crate) fn selector(self, obj: &Value) -> Option<LabelSelector> {
        let sel = obj.pointer("/spec/selector")?;
        let parsed = match self {
            Kind::ReplicaSet => label_selector(sel)?,
            Kind::ReplicationController => {
                LabelSelector::from_map(&labels_of(&json!({"metadata": {"labels": sel}})))
            }
        };
        (!parsed.is_empty()).then_some(parsed)
    }
}

/// When a ready pod that is not yet available becomes so (for the requeue).
fn available_at(p: &Value, min_ready: i64) -> Option<i64> {
    if min_ready <= 0 || !pod_ready(p) {
        return None;
    }
    Some(ready_since(p)?.as_second() + min_ready)
}

/// Upstream's podPhaseToOrdinal, for the scale-down order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum PhaseRank {
    Pending,
    Unknown,
    Running,
}

/// What the scale-down order looks at in a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RankedPod {
    pub assigned: bool,
    pub phase: PhaseRank,
    pub ready: bool,
    pub deletion_cost: i64,
    /// Active pods of the same owner on this pod's node (doubled-up pods go first).
    pub rank: usize,
    /// Unix seconds the pod became Ready.
    pub ready_since: Option<i64>,
    pub restarts: i64,
    /// Unix seconds the pod was created.
    pub created: Option<i64>,
}

impl RankedPod {
    fn of(p: &Value, rank: usize) -> RankedPod {
        let phase = match s(p, "/status/phase") {
            "Running" => PhaseRank::Running,
            "Unknown" => PhaseRank::Unknown,
            _ => PhaseRank::Pending,
        };
        let restarts = p
            .pointer("/status/containerStatuses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| i(c, "/restartCount"))
            .max()
            .unwrap_or(0);
        RankedPod {
            assigned: !s(p, "/spec/nodeName").is_empty(),
            phase,
            ready: pod_ready(p),
            deletion_cost: p
                .pointer(&format!(
                    "/metadata/annotations/{}",
                    POD_DELETION_COST.replace('/', "~1")
                ))
                .and_then(Value::as_str)
                .and_then(|c| c.parse::<i32>().ok())
                .map(i64::from)
                .unwrap_or(0),
            rank,
            ready_since: ready_since(p).map(|t| t.as_second()),
            restarts,
            created: parse_ts(s(p, "/metadata/creationTimestamp")).map(|t| t.as_second()),
        }
    }
}

/// Upstream's logarithmic bucket of how long ago `t` was (LogarithmicScaleDown): pods
/// within the same power-of-two age are treated as equally old.
fn age_bucket(t: i64, now: i64) -> i64 {
    let age = (now - t).max(0);
    if age == 0 {
        return 0;
    }
    64 - i64::from(age.leading_zeros())
}

/// Upstream's ActivePodsWithRanks.Less: `Less` means "delete this one first".
/// Unassigned before assigned; Pending before Unknown before Running; not ready before
/// ready; lower deletion cost first; more doubled-up first; ready for less time first;
/// more restarts first; newer first.
pub(crate) fn deletion_order(a: &RankedPod, b: &RankedPod, now: i64) -> Ordering {
    a.assigned
        .cmp(&b.assigned)
        .then(a.phase.cmp(&b.phase))
        .then(a.ready.cmp(&b.ready))
        .then(a.deletion_cost.cmp(&b.deletion_cost))
        .then(b.rank.cmp(&a.rank))
        .then_with(
            || match (a.ready && b.ready, a.ready_since, b.ready_since) {
                (true, Some(x), Some(y)) => age_bucket(x, now).cmp(&age_bucket(y, now)),
                _ => Ordering::Equal,
            },
        )
        .then(b.restarts.cmp(&a.restarts))
        .then_with(|| match (a.created, b.created) {
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some(x), Some(y)) => age_bucket(x, now).cmp(&age_bucket(y, now)).then(y.cmp(&x)),
            (None, None) => Ordering::Equal,
        })
}

/// Upstream's slowStartBatch sizes for `count` creations: 1, 2, 4 … until done.
pub(crate) fn slow_start_batches(count: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut remaining = count;
    let mut batch = SLOW_START_INITIAL_BATCH.min(remaining);
    while batch > 0 {
        out.push(batch);
        remaining -= batch;
        batch = (2 * batch).min(remaining);
    }
    out
}

/// Creations and deletions a set has made that the watch has not shown yet.
#[derive(Default, Debug)]
pub(crate) struct Expectations {
    by_owner: HashMap<String, Expected>,
}

#[derive(Debug)]
struct Expected {
    adds: i64,
    dels: HashSet<String>,
    since: Instant,
}

impl Expectations {
    /// Whether `owner` may be synced: nothing outstanding, or what is outstanding is so
    /// old the watch must have missed it.
    pub(crate) fn satisfied(&self, owner: &str) -> bool {
        match self.by_owner.get(owner) {
            None => true,
            Some(e) => {
                (e.adds <= 0 && e.dels.is_empty()) || e.since.elapsed() > EXPECTATIONS_TIMEOUT
            }
        }
    }
    pub(crate) fn expect(&mut self, owner: &str, adds: i64, dels: HashSet<String>) {
        self.by_owner.insert(
            owner.to_string(),
            Expected {
                adds,
                dels,
                since: Instant::now(),
            },
        );
    }
    /// One creation that will never be observed (it failed or was skipped).
    pub(crate) fn lower_adds(&mut self, owner: &str, n: i64) {
        if let Some(e) = self.by_owner.get_mut(owner) {
            e.adds -= n;
        }
    }
    pub(crate) fn observed_add(&mut self, owner: &str) {
        self.lower_adds(owner, 1);
    }
    pub(crate) fn observed_delete(&mut self, owner: &str, pod_key: &str) {
        if let Some(e) = self.by_owner.get_mut(owner) {
            e.dels.remove(pod_key);
        }
    }
    pub(crate) fn forget(&mut self, owner: &str) {
        self.by_owner.remove(owner);
    }
}

/// Upstream's calculateStatus, without conditions.
fn replica_status(
    set: &Value,
    pods: &[&Arc<Value>],
    template_labels: &BTreeMap<String, String>,
    now: Timestamp,
) -> (Value, Option<i64>) {
    let min_ready = i(set, "/spec/minReadySeconds");
    let (mut full, mut ready, mut available) = (0, 0, 0);
    let mut next: Option<i64> = None;
    for p in pods {
        let l = labels_of(p);
        if template_labels.iter().all(|(k, v)| l.get(k) == Some(v)) {
            full += 1;
        }
        if pod_ready(p) {
            ready += 1;
            if pod_available(p, min_ready, now) {
                available += 1;
            } else if let Some(at) = available_at(p, min_ready) {
                next = Some(next.map_or(at, |n: i64| n.min(at)));
            }
        }
    }
    let st = json!({
        "replicas": pods.len(),
        "fullyLabeledReplicas": full,
        "readyReplicas": ready,
        "availableReplicas": available,
        "observedGeneration": i(set, "/metadata/generation"),
    });
    (st, next)
}

/// Drops zero counters as the API server's omitempty output does, keeping `replicas`.
fn compact_status(mut st: Value, conditions: Vec<Value>) -> Value {
    if let Some(m) = st.as_object_mut() {
        m.retain(|k, v| k == "replicas" || v.as_i64() != Some(0));
        if !conditions.is_empty() {
            m.insert("conditions".into(), json!(conditions));
        }
    }
    st
}

pub(crate) struct ReplicaSetController {
    st: Arc<ApiState>,
    kind: Kind,
    recorder: Recorder,
    expectations: Expectations,
    /// Sets to look at again at a given time (minReadySeconds, error backoff).
    requeue: HashMap<String, (Instant, Duration)>,
}

/// What a sync asks of the loop.
enum Outcome {
    Done,
    /// Look again at this unix second (a pod turning available).
    At(i64),
    /// Something failed: back off.
    Failed,
}

impl ReplicaSetController {
    async fn sync(&mut self, key: &str, sets: &Cache, pods: &Cache) -> Outcome {
        let Some(set) = sets.get(key).cloned() else {
            self.expectations.forget(key);
            return Outcome::Done;
        };
        let ns = s(&set, "/metadata/namespace").to_string();
        let uid = s(&set, "/metadata/uid").to_string();
        let selector = self.kind.selector(&set);
        let mut failed = false;
        // Claim: adopt matching orphans, release owned pods that no longer match.
        let mut owned: Vec<(String, Arc<Value>)> = Vec::new();
        for (pk, p) in pods.by_index(Index::Namespace, &ns) {
            let matches = selector
                .as_ref()
                .is_some_and(|sel| sel.matches(&labels_of(p)));
            match controller_ref(p) {
                Some(r) if r["uid"] == uid.as_str() => {
                    if matches {
                        owned.push((pk.clone(), p.clone()));
                    } else if !deleting(p) {
                        let _ = objects::modify(&self.st, pk, &mut |o| release(o, &uid));
                    }
                }
                Some(_) => {}
                None if matches && !deleting(p) && !deleting(&set) && pod_active(p) => {
                    let r = owner_ref(self.kind.api_version(), self.kind.kind(), &set);
                    match objects::modify(&self.st, pk, &mut |o| adopt(o, &r)) {
                        Ok(Some(stored)) => owned.push((pk.clone(), stored.object)),
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!(pod = %pk, error = %e, "replicaset: adoption failed");
                            failed = true;
                        }
                    }
                }
                None => {}
            }
        }
        let active: Vec<&(String, Arc<Value>)> =
            owned.iter().filter(|(_, p)| pod_active(p)).collect();
        let mut create_error: Option<String> = None;
        if self.expectations.satisfied(key) && !deleting(&set) && selector.is_some() {
            let want = i(&set, "/spec/replicas").max(0) as usize;
            if active.len() < want {
                let n = (want - active.len()).min(BURST_REPLICAS);
                create_error = self.create_pods(key, &set, n).await;
            } else if active.len() > want {
                let n = (active.len() - want).min(BURST_REPLICAS);
                if !self.delete_pods(key, &set, &active, n) {
                    failed = true;
                }
            }
        }
        let template_labels = labels_of(&json!({"metadata": {"labels":
            set.pointer("/spec/template/metadata/labels").cloned().unwrap_or(json!({}))}}));
        let active_pods: Vec<&Arc<Value>> = active.iter().map(|(_, p)| p).collect();
        let (status, next) = replica_status(&set, &active_pods, &template_labels, now_ts());
        let conditions = failure_conditions(&set, create_error.as_deref());
        let status = compact_status(status, conditions);
        let _ = objects::modify(&self.st, key, &mut |o| {
            if o["status"] == status {
                return false;
            }
            o["status"] = status.clone();
            true
        });
        if create_error.is_some() || failed {
            return Outcome::Failed;
        }
        match next {
            Some(at) => Outcome::At(at),
            None => Outcome::Done,
        }
    }

    /// Creates `n` pods in slow-start batches; returns the first error's message.
    async fn create_pods(&mut self, key: &str, set: &Value, n: usize) -> Option<String> {
        self.expectations.expect(key, n as i64, HashSet::new());
        let ns = s(set, "/metadata/namespace").to_string();
        let pod = pod_from_template(self.kind, set);
        let mut done = 0;
        for batch in slow_start_batches(n) {
            let mut error = None;
            for _ in 0..batch {
                let r = objects::create_as_client(&self.st, "", "pods", &ns, pod.clone()).await;
                done += 1;
                match r {
                    Ok(stored) => self.recorder.record(
                        &self.st,
                        set,
                        "Normal",
                        "SuccessfulCreate",
                        &format!("Created pod: {}", s(&stored.object, "/metadata/name")),
                    ),
                    Err(e) => {
                        self.expectations.lower_adds(key, 1);
                        let msg = e.0["message"].as_str().unwrap_or("").to_string();
                        self.recorder.record(
                            &self.st,
                            set,
                            "Warning",
                            "FailedCreate",
                            &format!("Error creating: {msg}"),
                        );
                        error.get_or_insert(msg);
                    }
                }
            }
            if let Some(e) = error {
                // The rest of this sync's creations are skipped, as upstream.
                self.expectations.lower_adds(key, (n - done) as i64);
                return Some(e);
            }
        }
        None
    }

    /// Deletes the `n` pods first in [`deletion_order`]; false when a deletion failed.
    fn delete_pods(
        &mut self,
        key: &str,
        set: &Value,
        active: &[&(String, Arc<Value>)],
        n: usize,
    ) -> bool {
        let mut per_node: HashMap<&str, usize> = HashMap::new();
        for (_, p) in active {
            *per_node.entry(s(p, "/spec/nodeName")).or_default() += 1;
        }
        let now = now_ts().as_second();
        let mut ranked: Vec<(RankedPod, &(String, Arc<Value>))> = active
            .iter()
            .map(|e| {
                let node = s(&e.1, "/spec/nodeName");
                let rank = if node.is_empty() { 0 } else { per_node[node] };
                (RankedPod::of(&e.1, rank), *e)
            })
            .collect();
        ranked.sort_by(|a, b| deletion_order(&a.0, &b.0, now));
        let victims: Vec<&(String, Arc<Value>)> =
            ranked.into_iter().take(n).map(|(_, e)| e).collect();
        self.expectations
            .expect(key, 0, victims.iter().map(|(k, _)| k.clone()).collect());
        let Some(mut t) = objects::target("", "pods", None) else {
            return false;
        };
        t.namespace = Some(s(set, "/metadata/namespace").to_string());
        let mut ok = true;
        for (pk, p) in victims {
            let name = s(p, "/metadata/name");
            match delete_object(&self.st, &t, name, &DeleteOptions::default()) {
                Ok(_) => self.recorder.record(
                    &self.st,
                    set,
                    "Normal",
                    "SuccessfulDelete",
                    &format!("Deleted pod: {name}"),
                ),
                Err(e) if nodus_k8s::status::code(&e.0) == 404 => {
                    self.expectations.observed_delete(key, pk)
                }
                Err(e) => {
                    self.expectations.observed_delete(key, pk);
                    let msg = e.0["message"].as_str().unwrap_or("");
                    self.recorder.record(
                        &self.st,
                        set,
                        "Warning",
                        "FailedDelete",
                        &format!("Error deleting: {msg}"),
                    );
                    ok = false;
                }
            }
        }
        ok
    }
}

/// The ReplicaFailure condition: set with the create error, kept (with its time) while
/// the same error repeats, dropped once creations succeed again.
fn failure_conditions(set: &Value, error: Option<&str>) -> Vec<Value> {
    let mut conds: Vec<Value> = set
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let existing = conds.iter().position(|c| c["type"] == "ReplicaFailure");
    match (error, existing) {
        (Some(msg), Some(ix)) => {
            if conds[ix]["message"] != msg {
                conds[ix]["message"] = json!(msg);
            }
        }
        (Some(msg), None) => conds.push(json!({"type": "ReplicaFailure", "status": "True",
            "reason": "FailedCreate", "message": msg, "lastTransitionTime": now_rfc3339()})),
        (None, Some(ix)) => {
            conds.remove(ix);
        }
        (None, None) => {}
    }
    conds
}

/// The pod a set creates: its template, named `<set>-<random>`, controlled by the set.
fn pod_from_template(kind: Kind, set: &Value) -> Value {
    let tmpl = set.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let mut meta = json!({
        "generateName": format!("{}-", s(set, "/metadata/name")),
        "ownerReferences": [owner_ref(kind.api_version(), kind.kind(), set)],
    });
    for f in ["labels", "annotations", "finalizers"] {
        if let Some(v) = tmpl.pointer(&format!("/metadata/{f}")) {
            meta[f] = v.clone();
        }
    }
    json!({"metadata": meta, "spec": tmpl.get("spec").cloned().unwrap_or(json!({}))})
}

fn adopt(pod: &mut Value, r: &Value) -> bool {
    if controller_ref(pod).is_some() {
        return false;
    }
    let refs = pod["metadata"]
        .as_object_mut()
        .map(|m| m.entry("ownerReferences").or_insert_with(|| json!([])));
    match refs.and_then(Value::as_array_mut) {
        Some(list) => {
            list.push(r.clone());
            true
        }
        None => false,
    }
}

fn release(pod: &mut Value, uid: &str) -> bool {
    let Some(list) = pod
        .pointer_mut("/metadata/ownerReferences")
        .and_then(Value::as_array_mut)
    else {
        return false;
    };
    list.retain(|r| r["uid"] != uid);
    if list.is_empty()
        && let Some(m) = pod["metadata"].as_object_mut()
    {
        m.remove("ownerReferences");
    }
    true
}

/// A set's spec and metadata as they matter for a sync (its own status writes do not).
fn sync_relevant(o: &Value) -> (Value, Value, Value, Value) {
    (
        o.get("spec").cloned().unwrap_or(Value::Null),
        o.pointer("/metadata/labels")
            .cloned()
            .unwrap_or(Value::Null),
        o.pointer("/metadata/deletionTimestamp")
            .cloned()
            .unwrap_or(Value::Null),
        o.pointer("/metadata/generation")
            .cloned()
            .unwrap_or(Value::Null),
    )
}

pub(crate) async fn run(st: Arc<ApiState>, kind: Kind) {
    let mut sets = Cache::new(st.store.clone(), &kind.prefix());
    let mut pods = Cache::new(st.store.clone(), "/core/pods/").with_index(Index::Namespace);
    let mut ctl = ReplicaSetController {
        st: st.clone(),
        kind,
        recorder: Recorder::new(kind.component()),
        expectations: Expectations::default(),
        requeue: HashMap::new(),
    };
    let mut dirty: HashSet<String> = sets.objects.keys().cloned().collect();
    loop {
        if dirty.is_empty() {
            let wake = ctl.requeue.values().map(|(at, _)| *at).min();
            let sleep = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                c = sets.next() => note_set(c, &sets, &mut dirty, &mut ctl),
                c = pods.next() => note_pod(c, &sets, &mut dirty, &mut ctl),
                _ = sleep => {}
            }
        }
        while let Some(c) = sets.try_next() {
            note_set(c, &sets, &mut dirty, &mut ctl)
        }
        while let Some(c) = pods.try_next() {
            note_pod(c, &sets, &mut dirty, &mut ctl)
        }
        let now = Instant::now();
        let due: Vec<String> = ctl
            .requeue
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        dirty.extend(due);
        for key in std::mem::take(&mut dirty) {
            let backoff = ctl.requeue.get(&key).map(|(at, b)| (*at, *b));
            if let Some((at, _)) = backoff
                && at > now
            {
                // Backing off after a failure: the timer brings it back.
                continue;
            }
            match ctl.sync(&key, &sets, &pods).await {
                Outcome::Done => {
                    ctl.requeue.remove(&key);
                }
                Outcome::At(unix) => {
                    let wait = (unix - now_ts().as_second()).max(0) as u64 + 1;
                    ctl.requeue
                        .insert(key, (now + Duration::from_secs(wait), Duration::ZERO));
                }
                Outcome::Failed => {
                    let prev = backoff.map(|(_, b)| b).unwrap_or(Duration::ZERO);
                    let next = (prev * 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
                    ctl.requeue.insert(key, (now + next, next));
                }
            }
            // Take in our own writes before the next set, so its claim sees them.
            while let Some(c) = pods.try_next() {
                note_pod(c, &sets, &mut dirty, &mut ctl)
            }
        }
    }
}

fn note_set(c: Change, sets: &Cache, dirty: &mut HashSet<String>, ctl: &mut ReplicaSetController) {
    match c {
        Change::Event(ev) => {
            if ev.kind == EventKind::Deleted {
                ctl.expectations.forget(&ev.key);
                ctl.requeue.remove(&ev.key);
                return;
            }
            if ev.kind == EventKind::Modified
                && ev.prev.as_ref().map(|p| sync_relevant(p)) == Some(sync_relevant(&ev.object))
            {
                return;
            }
            // A changed spec is worth a sync now, backoff or not.
            ctl.requeue.remove(&ev.key);
            dirty.insert(ev.key.clone());
        }
        Change::Relisted => dirty.extend(sets.objects.keys().cloned()),
    }
}

fn note_pod(c: Change, sets: &Cache, dirty: &mut HashSet<String>, ctl: &mut ReplicaSetController) {
    let ev = match c {
        Change::Event(ev) => ev,
        Change::Relisted => {
            dirty.extend(sets.objects.keys().cloned());
            return;
        }
    };
    let ns = s(&ev.object, "/metadata/namespace");
    let set_prefix = format!("{}{ns}/", ctl.kind.prefix());
    let owner_of = |p: &Value| -> Option<String> {
        let r = controller_ref(p)?;
        if r["kind"] != ctl.kind.kind() {
            return None;
        }
        let k = format!("{set_prefix}{}", r["name"].as_str()?);
        sets.get(&k)
            .filter(|o| s(o, "/metadata/uid") == r["uid"].as_str().unwrap_or(""))
            .map(|_| k)
    };
    let owner = owner_of(&ev.object);
    if let Some(k) = &owner {
        let was_deleting = ev.prev.as_ref().is_some_and(|p| deleting(p));
        match ev.kind {
            EventKind::Added => ctl.expectations.observed_add(k),
            EventKind::Deleted => ctl.expectations.observed_delete(k, &ev.key),
            EventKind::Modified if deleting(&ev.object) && !was_deleting => {
                ctl.expectations.observed_delete(k, &ev.key)
            }
            EventKind::Modified => {}
        }
        dirty.insert(k.clone());
    }
    if let Some(prev) = &ev.prev
        && let Some(k) = owner_of(prev)
    {
        dirty.insert(k);
    }
    // Orphans (and pods whose labels changed) may be adopted by any matching set.
    if owner.is_none() || ev.prev.as_ref().map(|p| labels_of(p)) != Some(labels_of(&ev.object)) {
        let l = labels_of(&ev.object);
        for (k, set) in sets
            .objects
            .iter()
            .filter(|(k, _)| k.starts_with(&set_prefix))
        {
            if ctl.kind.selector(set).is_some_and(|sel| sel.matches(&l)) {
                dirty.insert(k.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(
        assigned: bool,
        phase: PhaseRank,
        ready: bool,
        cost: i64,
        rank: usize,
        created: i64,
    ) -> RankedPod {
        RankedPod {
            assigned,
            phase,
            ready,
            deletion_cost: cost,
            rank,
            ready_since: ready.then_some(created + 1),
            restarts: 0,
            created: Some(created),
        }
    }

    #[test]
    fn scale_down_order_as_upstream() {
        use PhaseRank::*;
        let now = 1_000_000;
        // (name, pod): expected deletion order is the table's order.
        let table = [
            ("unassigned", pod(false, Pending, false, 0, 0, now - 10)),
            ("pending", pod(true, Pending, false, 0, 1, now - 10)),
            ("unknown", pod(true, Unknown, false, 0, 1, now - 10)),
            (
                "running not ready",
                pod(true, Running, false, 0, 1, now - 10),
            ),
            ("ready, low cost", pod(true, Running, true, -5, 1, now - 10)),
            (
                "ready, doubled up",
                pod(true, Running, true, 0, 3, now - 10),
            ),
            (
                "ready, alone, recently ready",
                pod(true, Running, true, 0, 1, now - 10),
            ),
            (
                "ready, alone, ready long ago",
                pod(true, Running, true, 0, 1, now - 5000),
            ),
            (
                "ready, high cost",
                pod(true, Running, true, 100, 1, now - 10),
            ),
        ];
        let mut shuffled: Vec<_> = table.iter().rev().cloned().collect();
        shuffled.rotate_left(4);
        shuffled.sort_by(|a, b| deletion_order(&a.1, &b.1, now));
        let got: Vec<&str> = shuffled.iter().map(|(n, _)| *n).collect();
        let want: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn restarts_then_newer_first() {
        let now = 1_000_000;
        let base = pod(true, PhaseRank::Running, false, 0, 1, now - 100);
        let restarted = RankedPod {
            restarts: 3,
            ..base.clone()
        };
        assert_eq!(deletion_order(&restarted, &base, now), Ordering::Less);
        let newer = RankedPod {
            created: Some(now - 2),
            ..base.clone()
        };
        assert_eq!(deletion_order(&newer, &base, now), Ordering::Less);
        let no_time = RankedPod {
            created: None,
            ..base.clone()
        };
        assert_eq!(deletion_order(&no_time, &newer, now), Ordering::Less);
        // Same power-of-two age: the exact creation time still decides, newer first.
        let a = RankedPod {
            created: Some(now - 70),
            ..base.clone()
        };
        let b = RankedPod {
            created: Some(now - 80),
            ..base.clone()
        };
        assert_eq!(deletion_order(&a, &b, now), Ordering::Less);
    }

    #[test]
    fn slow_start_doubles() {
        for (n, want) in [
            (0, vec![]),
            (1, vec![1]),
            (2, vec![1, 1]),
            (3, vec![1, 2]),
            (10, vec![1, 2, 4, 3]),
            (16, vec![1, 2, 4, 8, 1]),
        ] {
            assert_eq!(slow_start_batches(n), want, "{n}");
        }
    }

    #[test]
    fn expectations_hold_until_observed() {
        let mut e = Expectations::default();
        assert!(e.satisfied("rs"));
        e.expect("rs", 2, HashSet::new());
        assert!(!e.satisfied("rs"));
        e.observed_add("rs");
        assert!(!e.satisfied("rs"));
        e.observed_add("rs");
        assert!(e.satisfied("rs"));
        e.expect("rs", 0, ["/core/pods/d/a".to_string()].into());
        assert!(!e.satisfied("rs"));
        e.observed_delete("rs", "/core/pods/d/b");
        assert!(!e.satisfied("rs"));
        e.observed_delete("rs", "/core/pods/d/a");
        assert!(e.satisfied("rs"));
        e.expect("rs", 3, HashSet::new());
        e.lower_adds("rs", 3);
        assert!(e.satisfied("rs"));
    }

    #[test]
    fn selectors_of_both_shapes() {
        let rs = json!({"spec": {"selector": {"matchLabels": {"app": "web"}}}});
        let rc = json!({"spec": {"selector": {"app": "web"}}});
        let l: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
        assert!(
            Kind::ReplicaSet
                .selector(&rs)
                .is_some_and(|s| s.matches(&l))
        );
        assert!(
            Kind::ReplicationController
                .selector(&rc)
                .is_some_and(|s| s.matches(&l))
        );
        assert!(
            Kind::ReplicationController
                .selector(&json!({"spec": {"selector": {}}}))
                .is_none()
        );
        assert!(Kind::ReplicaSet.selector(&json!({"spec": {}})).is_none());
    }

    #[test]
    fn availability_waits_min_ready_seconds() {
        let now = parse_ts("2026-01-01T00:01:00Z").expect("ts");
        let p = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
            "lastTransitionTime": "2026-01-01T00:00:30Z"}]}});
        assert!(pod_available(&p, 0, now));
        assert!(pod_available(&p, 30, now));
        assert!(!pod_available(&p, 31, now));
        assert!(!pod_available(&json!({}), 0, now));
    }
}
