//! The scheduler: binds pending pods to nodes that fit (upstream's kube-scheduler with the
//! default plugins that matter on a small cluster: NodeUnschedulable, NodeName,
//! TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, LeastAllocated).
//!
//! It runs in the control-plane process over informer caches of Pods and Nodes. Pending
//! pods wait in an active queue ordered by priority then age; a pod that fits nowhere gets
//! a FailedScheduling event and `PodScheduled=False/Unschedulable`, and moves to the
//! unschedulable set, from which a change that could help (a node added or changed, a
//! bound pod gone) or the 5-minute flush brings it back, after a back-off of 1 s doubling
//! to 10 s (upstream's podInitialBackoff / podMaxBackoff / podMaxInUnschedulablePodsDuration).

pub mod fit;

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use crate::apiserver::rest::subresources::bound_pod;
use crate::apiserver::state::ApiState;
use crate::controllers::cache::{Cache, Change};
use crate::controllers::events::Recorder;
use crate::controllers::objects;
use crate::storage::{EventKind, MutateOp, Mutation, StoreError, Stored};
use fit::{NodeView, PodFacts, Usage};

pub const SCHEDULER_NAME: &str = "default-scheduler";
const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
const UNSCHEDULABLE_FLUSH: Duration = Duration::from_secs(300);
/// Pods decided before their bindings are committed together.
const BATCH: usize = 64;

/// Queue order: higher priority first, then older, then by key.
type QueueKey = (Reverse<i32>, String, String);

struct Waiting {
    attempts: u32,
    since: Instant,
    retry_at: Option<Instant>,
}

struct Scheduler {
    st: Arc<ApiState>,
    recorder: Recorder,
    nodes: HashMap<String, NodeView>,
    /// Node names in a stable order, so equal scores break ties the same way each time.
    node_order: Vec<String>,
    usage: HashMap<String, Usage>,
    /// Bound, non-terminal pods: key → (node, what they take).
    bound: HashMap<String, (String, PodFacts)>,
    active: BTreeSet<QueueKey>,
    queued: HashMap<String, QueueKey>,
    unschedulable: HashMap<String, Waiting>,
    pending: HashMap<String, Arc<Value>>,
}

fn str_at<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn terminal(v: &Value) -> bool {
    matches!(str_at(v, "/status/phase"), "Succeeded" | "Failed")
}

/// Whether this scheduler should place the pod.
fn wants_scheduling(v: &Value) -> bool {
    let name = str_at(v, "/spec/schedulerName");
    str_at(v, "/spec/nodeName").is_empty()
        && (name.is_empty() || name == SCHEDULER_NAME)
        && v.pointer("/metadata/deletionTimestamp").is_none()
        && !terminal(v)
}

impl Scheduler {
    fn pod_changed(&mut self, key: &str, obj: Option<&Arc<Value>>) {
        // Forget what the pod was; if it no longer holds room on its node (gone, finished),
        // pods waiting may fit now.
        if let Some((node, facts)) = self.bound.remove(key) {
            if let Some(u) = self.usage.get_mut(&node) {
                u.remove(&facts);
            }
            let still_there =
                obj.is_some_and(|v| str_at(v, "/spec/nodeName") == node && !terminal(v));
            if !still_there {
                self.wake_unschedulable();
            }
        }
        if let Some(q) = self.queued.remove(key) {
            self.active.remove(&q);
        }
        let Some(v) = obj else {
            self.pending.remove(key);
            self.unschedulable.remove(key);
            return;
        };
        let node = str_at(v, "/spec/nodeName");
        if !node.is_empty() {
            self.pending.remove(key);
            self.unschedulable.remove(key);
            if terminal(v) {
                return;
            }
            let Ok(pod) = serde_json::from_value::<Pod>((**v).clone()) else {
                return;
            };
            let facts = PodFacts::of(pod);
            self.usage.entry(node.to_string()).or_default().add(&facts);
            self.bound
                .insert(key.to_string(), (node.to_string(), facts));
            return;
        }
        if !wants_scheduling(v) {
            self.pending.remove(key);
            self.unschedulable.remove(key);
            return;
        }
        self.pending.insert(key.to_string(), v.clone());
        if !self.unschedulable.contains_key(key) {
            self.enqueue(key, v);
        }
    }

    fn enqueue(&mut self, key: &str, v: &Value) {
        let prio = v
            .pointer("/spec/priority")
            .and_then(Value::as_i64)
            .unwrap_or(0) as i32;
        let created = str_at(v, "/metadata/creationTimestamp").to_string();
        let q = (Reverse(prio), created, key.to_string());
        self.active.insert(q.clone());
        self.queued.insert(key.to_string(), q);
    }

    fn node_changed(&mut self, key: &str, obj: Option<&Arc<Value>>) {
        let name = key.rsplit('/').next().unwrap_or("").to_string();
        let before = self.nodes.get(&name).cloned();
        match obj.and_then(|v| serde_json::from_value::<Node>((**v).clone()).ok()) {
            Some(n) => {
                let view = NodeView::of(&n);
                let changed = before.as_ref() != Some(&view);
                if before.is_none()
                    && let Err(i) = self.node_order.binary_search(&name)
                {
                    self.node_order.insert(i, name.clone());
                }
                self.nodes.insert(name, view);
                if changed {
                    self.wake_unschedulable();
                }
            }
            None => {
                self.nodes.remove(&name);
                self.node_order.retain(|n| *n != name);
            }
        }
    }

    /// A cluster change that may help: unschedulable pods are retried after their back-off.
    fn wake_unschedulable(&mut self) {
        let now = Instant::now();
        for w in self.unschedulable.values_mut() {
            let backoff = INITIAL_BACKOFF
                .saturating_mul(1 << w.attempts.saturating_sub(1).min(4))
                .min(MAX_BACKOFF);
            w.retry_at = Some((w.since + backoff).max(now));
        }
    }

    /// Moves unschedulable pods whose time has come back to the active queue.
    fn requeue_due(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let due: Vec<String> = self
            .unschedulable
            .iter()
            .filter(|(_, w)| {
                w.retry_at.is_some_and(|t| t <= now)
                    || now.duration_since(w.since) >= UNSCHEDULABLE_FLUSH
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            if let Some(v) = self.pending.get(&k).cloned() {
                self.enqueue(&k, &v);
            }
        }
        self.unschedulable
            .values()
            .map(|w| w.retry_at.unwrap_or(w.since + UNSCHEDULABLE_FLUSH))
            .min()
    }

    /// Scheduling cycles for up to [`BATCH`] pods from the head of the queue. Each pod's
    /// placement assumes the ones decided before it; the bindings (and their Scheduled
    /// events) are then written in one store commit each, as upstream binds asynchronously
    /// while it goes on scheduling. Returns whether any pod was taken from the queue.
    fn schedule_batch(&mut self) -> bool {
        let mut decided: Vec<(String, Arc<Value>, String, PodFacts)> = Vec::new();
        let mut took = false;
        while decided.len() < BATCH {
            let Some(q) = self.active.pop_first() else {
                break;
            };
            took = true;
            let key = q.2.clone();
            self.queued.remove(&key);
            let Some(v) = self.pending.get(&key).cloned() else {
                continue;
            };
            let Ok(pod) = serde_json::from_value::<Pod>((*v).clone()) else {
                tracing::warn!(pod = %key, "scheduler: pod does not decode; skipped");
                continue;
            };
            let facts = PodFacts::of(pod);
            match self.place(&facts) {
                Ok(node) => {
                    // Assume the binding: the next pods see the room it takes.
                    self.usage.entry(node.clone()).or_default().add(&facts);
                    decided.push((key, v, node, facts));
                }
                Err(msg) => {
                    tracing::info!(pod = %key, message = %msg, "scheduler: no node fits");
                    let _ = objects::modify(&self.st, &key, &mut |p| set_unschedulable(p, &msg));
                    self.recorder
                        .record(&self.st, &v, "Warning", "FailedScheduling", &msg);
                    self.park(&key);
                }
            }
        }
        if decided.is_empty() {
            return took;
        }
        let mut ops: Vec<MutateOp<'_>> = decided
            .iter()
            .map(|(key, v, node, _)| {
                let name = str_at(v, "/metadata/name").to_string();
                let node = node.clone();
                let op: MutateOp<'_> = (
                    key.clone(),
                    Box::new(move |cur: Option<&Stored>| {
                        bound_pod(cur, &name, &node, None)
                            .map(Mutation::Put)
                            .map_err(|e| {
                                StoreError::Backend(
                                    e.0["message"].as_str().unwrap_or("refused").to_string(),
                                )
                            })
                    }),
                );
                op
            })
            .collect();
        let results = match self.st.store.mutate_many(&mut ops) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "scheduler: binding commit failed");
                decided
                    .iter()
                    .map(|_| Err(StoreError::Backend(e.to_string())))
                    .collect()
            }
        };
        drop(ops);
        let mut events = Vec::new();
        for ((key, v, node, facts), r) in decided.into_iter().zip(results) {
            match r {
                Ok(_) => {
                    tracing::debug!(pod = %key, node = %node, "scheduler: bound");
                    crate::controllers::volume::select_node_for_claims(&self.st, &v, &node);
                    self.bound.insert(key.clone(), (node.clone(), facts));
                    self.pending.remove(&key);
                    self.unschedulable.remove(&key);
                    let msg = format!(
                        "Successfully assigned {}/{} to {node}",
                        str_at(&v, "/metadata/namespace"),
                        str_at(&v, "/metadata/name")
                    );
                    events.push((v, msg));
                }
                Err(e) => {
                    tracing::info!(pod = %key, node = %node, error = %e, "scheduler: binding failed");
                    if let Some(u) = self.usage.get_mut(&node) {
                        u.remove(&facts);
                    }
                    self.park(&key);
                }
            }
        }
        let items: Vec<(&Value, &str, &str, &str)> = events
            .iter()
            .map(|(v, msg)| (&**v, "Normal", "Scheduled", msg.as_str()))
            .collect();
        self.recorder.record_many(&self.st, &items);
        true
    }

    /// The node the filters and score choose for `facts`, or the FailedScheduling message.
    fn place(&self, facts: &PodFacts) -> Result<String, String> {
        let empty = Usage::default();
        let mut best: Option<(i64, i64, &str)> = None;
        let mut reasons = Vec::new();
        for name in &self.node_order {
            let Some(node) = self.nodes.get(name) else {
                continue;
            };
            let used = self.usage.get(name).unwrap_or(&empty);
            match fit::filter(facts, node, used) {
                Ok(()) => {
                    let s = fit::score(facts, node, used);
                    let cand = (s, -used.pods, name.as_str());
                    if best.is_none_or(|b| (cand.0, cand.1) > (b.0, b.1)) {
                        best = Some(cand);
                    }
                }
                Err(r) => reasons.extend(fit::dedup(r)),
            }
        }
        match best {
            Some((_, _, node)) => Ok(node.to_string()),
            None => Err(fit::fit_error(self.nodes.len(), &reasons)),
        }
    }

    fn park(&mut self, key: &str) {
        let attempts = self.unschedulable.get(key).map_or(0, |w| w.attempts) + 1;
        self.unschedulable.insert(
            key.to_string(),
            Waiting {
                attempts,
                since: Instant::now(),
                retry_at: None,
            },
        );
    }
}

/// `PodScheduled=False` with reason Unschedulable, as the scheduler's status update.
fn set_unschedulable(p: &mut Value, msg: &str) -> bool {
    if p.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty())
    {
        return false;
    }
    let conds = p["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let existing = conds.iter().find(|c| c["type"] == "PodScheduled");
    if existing.is_some_and(|c| c["status"] == "False" && c["message"] == msg) {
        return false;
    }
    let mut conds: Vec<Value> = conds
        .into_iter()
        .filter(|c| c["type"] != "PodScheduled")
        .collect();
    conds.push(json!({"type": "PodScheduled", "status": "False", "lastProbeTime": null,
        "lastTransitionTime": crate::apiserver::rest::now_rfc3339(), "reason": "Unschedulable", "message": msg}));
    p["status"]["conditions"] = json!(conds);
    true
}

/// Runs the scheduler until the task is aborted.
pub async fn run(st: Arc<ApiState>) {
    let mut nodes = Cache::new(st.store.clone(), "/core/nodes/");
    let mut pods = Cache::new(st.store.clone(), "/core/pods/");
    let mut s = Scheduler {
        st: st.clone(),
        recorder: Recorder::new(SCHEDULER_NAME),
        nodes: HashMap::new(),
        node_order: Vec::new(),
        usage: HashMap::new(),
        bound: HashMap::new(),
        active: BTreeSet::new(),
        queued: HashMap::new(),
        unschedulable: HashMap::new(),
        pending: HashMap::new(),
    };
    let load = |s: &mut Scheduler, nodes: &Cache, pods: &Cache| {
        s.nodes.clear();
        s.node_order.clear();
        s.usage.clear();
        s.bound.clear();
        s.active.clear();
        s.queued.clear();
        s.pending.clear();
        for (k, v) in &nodes.objects {
            s.node_changed(k, Some(v));
        }
        for (k, v) in &pods.objects {
            s.pod_changed(k, Some(v));
        }
    };
    load(&mut s, &nodes, &pods);
    loop {
        // Take in every change already waiting, then place pods one at a time, yielding
        // between them so changes (and other tasks) are never starved.
        let mut relisted = false;
        while let Some(c) = nodes.try_next() {
            match c {
                Change::Event(ev) => s.node_changed(
                    &ev.key,
                    (ev.kind != EventKind::Deleted).then_some(&ev.object),
                ),
                Change::Relisted => relisted = true,
            }
        }
        while let Some(c) = pods.try_next() {
            match c {
                Change::Event(ev) => s.pod_changed(
                    &ev.key,
                    (ev.kind != EventKind::Deleted).then_some(&ev.object),
                ),
                Change::Relisted => relisted = true,
            }
        }
        if relisted {
            load(&mut s, &nodes, &pods);
        }
        let next_retry = s.requeue_due();
        if s.schedule_batch() {
            tokio::task::yield_now().await;
            continue;
        }
        let sleep = next_retry
            .map(|t| t.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            c = nodes.next() => match c {
                Change::Event(ev) => s.node_changed(&ev.key, (ev.kind != EventKind::Deleted).then_some(&ev.object)),
                Change::Relisted => load(&mut s, &nodes, &pods),
            },
            c = pods.next() => match c {
                Change::Event(ev) => s.pod_changed(&ev.key, (ev.kind != EventKind::Deleted).then_some(&ev.object)),
                Change::Relisted => load(&mut s, &nodes, &pods),
            },
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}
