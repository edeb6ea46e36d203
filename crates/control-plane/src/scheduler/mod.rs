//! The scheduler: binds pending pods to nodes that fit (upstream's kube-scheduler with the
//! default plugins that matter on a small cluster: NodeUnschedulable, NodeName,
//! TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, LeastAllocated,
//! VolumeBinding, VolumeZone, PodTopologySpread, InterPodAffinity). Feasible nodes are scored by each score plugin
//! (TaintToleration, NodeAffinity, NodeResourcesFit's LeastAllocated, PodTopologySpread,
//! InterPodAffinity), normalized to 0–100 and summed with upstream's default weights.
//! A pod that fits nowhere may [`preemption`] lower-priority pods: it is nominated to a
//! node, the victims are deleted gracefully, and it is placed once they are gone.
//!
//! It runs in the control-plane process over informer caches of Pods and Nodes. Pending
//! pods wait in an active queue ordered by priority then age; a pod that fits nowhere gets
//! a FailedScheduling event and `PodScheduled=False/Unschedulable`, and moves to the
//! unschedulable set, from which a change that could help (a node added or changed, a
//! bound pod gone) or the 5-minute flush brings it back, after a back-off of 1 s doubling
//! to 10 s (upstream's podInitialBackoff / podMaxBackoff / podMaxInUnschedulablePodsDuration).

pub mod fit;
pub(crate) mod interpodaffinity;
pub(crate) mod podtopologyspread;
pub(crate) mod preemption;
pub(crate) mod volumebinding;

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::rest::subresources::bound_pod;
use crate::apiserver::state::ApiState;
use crate::controllers::cache::{Cache, Change};
use crate::controllers::controller_utils::{DisruptionReason, mark_disruption_target};
use crate::controllers::events::Recorder;
use crate::controllers::objects;
use crate::storage::{EventKind, MutateOp, Mutation, Store, StoreError, Stored};
use fit::{NodeView, PodFacts, Unfit, Usage};

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
    /// Refused by pod affinity or topology spread, which a newly bound pod may satisfy.
    wakes_on_pod_bound: bool,
}

struct Scheduler {
    st: Arc<ApiState>,
    recorder: Recorder,
    nodes: HashMap<String, NodeView>,
    /// Node names in a stable order, so equal scores break ties the same way each time.
    node_order: Vec<String>,
    usage: HashMap<String, Usage>,
    /// Bound, non-terminal pods, including those decided in the current batch.
    bound: BoundPods,
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

/// Bound, non-terminal pods: key → (node, facts), with the keys of those carrying pod
/// (anti-)affinity terms kept apart (upstream's PodsWithAffinity), since every decision
/// must consult their terms.
#[derive(Default)]
struct BoundPods {
    pods: HashMap<String, (String, PodFacts)>,
    with_affinity: HashSet<String>,
}

impl BoundPods {
    fn insert(&mut self, key: String, entry: (String, PodFacts)) {
        if entry.1.affinity.is_empty() {
            self.with_affinity.remove(&key);
        } else {
            self.with_affinity.insert(key.clone());
        }
        self.pods.insert(key, entry);
    }

    fn remove(&mut self, key: &str) -> Option<(String, PodFacts)> {
        self.with_affinity.remove(key);
        self.pods.remove(key)
    }

    fn clear(&mut self) {
        self.pods.clear();
        self.with_affinity.clear();
    }
}

/// Why a pod was not placed: the FailedScheduling message, whether a newly bound pod could
/// change the verdict, and the preemption that would make room, if any.
struct Unplaced {
    message: String,
    pod_bound_may_help: bool,
    preemption: Option<Box<preemption::Candidate>>,
}

impl Unplaced {
    fn new(message: String) -> Unplaced {
        Unplaced {
            message,
            pod_bound_may_help: false,
            preemption: None,
        }
    }
}

/// What the filter and score plugins see of the cluster in one scheduling cycle.
pub(crate) struct Snapshot<'a> {
    nodes: &'a HashMap<String, NodeView>,
    bound: &'a BoundPods,
    store: &'a dyn Store,
    namespace_labels: RefCell<HashMap<String, BTreeMap<String, String>>>,
}

impl<'a> Snapshot<'a> {
    pub(crate) fn nodes(&self) -> impl Iterator<Item = &'a NodeView> + use<'a> {
        self.nodes.values()
    }

    /// Bound pods with the node they are on (pods on nodes gone from the cache left out).
    pub(crate) fn pods(&self) -> impl Iterator<Item = (&'a NodeView, &'a PodFacts)> + use<'a> {
        let nodes = self.nodes;
        self.bound
            .pods
            .values()
            .filter_map(move |(n, p)| Some((nodes.get(n)?, p)))
    }

    /// Bound pods that have pod (anti-)affinity terms.
    pub(crate) fn pods_with_affinity(
        &self,
    ) -> impl Iterator<Item = (&'a NodeView, &'a PodFacts)> + use<'a> {
        let (nodes, bound) = (self.nodes, self.bound);
        bound.with_affinity.iter().filter_map(move |k| {
            let (n, p) = bound.pods.get(k)?;
            Some((nodes.get(n)?, p))
        })
    }

    pub(crate) fn has_pods_with_affinity(&self) -> bool {
        !self.bound.with_affinity.is_empty()
    }

    /// A namespace's labels (for namespaceSelector), read once per cycle.
    pub(crate) fn namespace_labels(&self, ns: &str) -> BTreeMap<String, String> {
        if let Some(l) = self.namespace_labels.borrow().get(ns) {
            return l.clone();
        }
        let labels: BTreeMap<String, String> = self
            .get(&format!("/core/namespaces/{ns}"))
            .and_then(|v| serde_json::from_value(v["metadata"]["labels"].clone()).ok())
            .unwrap_or_default();
        self.namespace_labels
            .borrow_mut()
            .insert(ns.to_string(), labels.clone());
        labels
    }

    /// An object of another kind from the store (Services, owners for default spreading).
    pub(crate) fn get(&self, key: &str) -> Option<Arc<Value>> {
        self.store.get(key).ok().flatten().map(|s| s.object)
    }

    pub(crate) fn list(&self, prefix: &str) -> Vec<Arc<Value>> {
        self.store
            .list(prefix)
            .map(|(items, _)| items.into_iter().map(|s| s.object).collect())
            .unwrap_or_default()
    }
}

/// The score plugins, with upstream's default weights in the default profile.
#[derive(Clone, Copy)]
enum ScorePlugin {
    TaintToleration,
    NodeAffinity,
    NodeResourcesFit,
    PodTopologySpread,
    InterPodAffinity,
}

impl ScorePlugin {
    fn weight(self) -> i64 {
        match self {
            ScorePlugin::TaintToleration => 3,
            ScorePlugin::NodeAffinity => 2,
            ScorePlugin::NodeResourcesFit => 1,
            ScorePlugin::PodTopologySpread => 2,
            ScorePlugin::InterPodAffinity => 2,
        }
    }
}

impl Scheduler {
    fn new(st: Arc<ApiState>) -> Scheduler {
        Scheduler {
            st,
            recorder: Recorder::new(SCHEDULER_NAME),
            nodes: HashMap::new(),
            node_order: Vec::new(),
            usage: HashMap::new(),
            bound: BoundPods::default(),
            active: BTreeSet::new(),
            queued: HashMap::new(),
            unschedulable: HashMap::new(),
            pending: HashMap::new(),
        }
    }

    fn pod_changed(&mut self, key: &str, obj: Option<&Arc<Value>>) {
        // Forget what the pod was; if it no longer holds room on its node (gone, finished),
        // pods waiting may fit now.
        let was_bound = self.bound.remove(key);
        let newly_bound = was_bound.is_none();
        if let Some((node, facts)) = was_bound {
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
            if newly_bound {
                self.wake_on_pod_bound();
            }
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
        self.wake(false);
    }

    /// A pod newly bound: only pods waiting for pods to appear (affinity, spreading) may
    /// fit now (upstream's AssignedPodAdd queueing hint).
    fn wake_on_pod_bound(&mut self) {
        self.wake(true);
    }

    fn wake(&mut self, only_pod_bound: bool) {
        let now = Instant::now();
        for w in self
            .unschedulable
            .values_mut()
            .filter(|w| w.wakes_on_pod_bound || !only_pod_bound)
        {
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
        let mut decided: Vec<(String, Arc<Value>, String)> = Vec::new();
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
                    // Assume the binding: the next pods see the room it takes and count it
                    // in affinity and spreading.
                    self.usage.entry(node.clone()).or_default().add(&facts);
                    self.bound.insert(key.clone(), (node.clone(), facts));
                    decided.push((key, v, node));
                }
                Err(unplaced) => {
                    let msg = unplaced.message;
                    tracing::info!(pod = %key, message = %msg, "scheduler: no node fits");
                    let _ = objects::modify(&self.st, &key, &mut |p| set_unschedulable(p, &msg));
                    self.recorder
                        .record(&self.st, &v, "Warning", "FailedScheduling", &msg);
                    if let Some(c) = &unplaced.preemption {
                        self.preempt(&key, &v, c);
                    }
                    self.park(&key, unplaced.pod_bound_may_help);
                }
            }
        }
        if decided.is_empty() {
            return took;
        }
        let mut ops: Vec<MutateOp<'_>> = decided
            .iter()
            .map(|(key, v, node)| {
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
        for ((key, v, node), r) in decided.into_iter().zip(results) {
            match r {
                Ok(_) => {
                    tracing::debug!(pod = %key, node = %node, "scheduler: bound");
                    crate::controllers::volume::select_node_for_claims(&self.st, &v, &node);
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
                    if let Some((node, facts)) = self.bound.remove(&key)
                        && let Some(u) = self.usage.get_mut(&node)
                    {
                        u.remove(&facts);
                    }
                    self.park(&key, false);
                }
            }
        }
        if !events.is_empty() {
            self.wake_on_pod_bound();
        }
        let items: Vec<(&Value, &str, &str, &str)> = events
            .iter()
            .map(|(v, msg)| (&**v, "Normal", "Scheduled", msg.as_str()))
            .collect();
        self.recorder.record_many(&self.st, &items);
        true
    }

    /// The node the filters and scores choose for `facts`, or why none fits.
    fn place(&self, facts: &PodFacts) -> Result<String, Unplaced> {
        let snap = Snapshot {
            nodes: &self.nodes,
            bound: &self.bound,
            store: &*self.st.store,
            namespace_labels: RefCell::default(),
        };
        if self.nodes.is_empty() {
            return Err(Unplaced::new(fit::fit_error(0, &[])));
        }
        let volumes = volumebinding::pre_filter(facts, &snap).map_err(|r| {
            // Refused before any node was tried: deleting pods changes nothing anywhere.
            let refused = fit::pre_filter_error(self.nodes.len(), &r.to_string());
            let why = self
                .preemption_eligibility(facts)
                .map_or_else(String::from, |()| {
                    let all = vec![preemption::NotHelped::NotHelpful; self.nodes.len()];
                    preemption::failure_message(self.nodes.len(), &all)
                });
            Unplaced::new(format!("{refused} preemption: {why}"))
        })?;
        let spread = podtopologyspread::pre_filter(facts, &snap);
        let affinity = interpodaffinity::pre_filter(facts, &snap);
        let empty = Usage::default();
        let mut feasible: Vec<(&NodeView, &Usage)> = Vec::new();
        let mut reasons = Vec::new();
        // Nodes where preemption might help (upstream's Unschedulable refusals).
        let mut might_help: Vec<&NodeView> = Vec::new();
        for name in &self.node_order {
            let Some(node) = self.nodes.get(name) else {
                continue;
            };
            let used = self.usage.get(name).unwrap_or(&empty);
            let verdict = fit::filter(facts, node, used)
                .and_then(|()| {
                    volumes
                        .as_ref()
                        .map_or(Ok(()), |v| v.filter(node))
                        .map_err(|r| vec![r])
                })
                .and_then(|()| {
                    spread
                        .as_ref()
                        .map_or(Ok(()), |s| s.filter(node))
                        .map_err(|r| vec![r])
                })
                .and_then(|()| {
                    affinity
                        .as_ref()
                        .map_or(Ok(()), |a| a.filter(node))
                        .map_err(|r| vec![r])
                });
            match verdict {
                Ok(()) => feasible.push((node, used)),
                Err(r) => {
                    let r = fit::dedup(r);
                    if preemption::resolvable(&r) {
                        might_help.push(node);
                    }
                    reasons.extend(r);
                }
            }
        }
        if feasible.is_empty() {
            let others_fit = |node: &NodeView| -> Result<(), Vec<Unfit>> {
                let one = |r: Result<(), Unfit>| r.map_err(|u| vec![u]);
                volumes.as_ref().map_or(Ok(()), |v| one(v.filter(node)))?;
                spread.as_ref().map_or(Ok(()), |s| one(s.filter(node)))?;
                affinity.as_ref().map_or(Ok(()), |a| one(a.filter(node)))
            };
            let refused = fit::fit_error(self.nodes.len(), &reasons);
            // Upstream's FitError carries the preemption's own FitError when it found no
            // node to free; a nomination adds nothing.
            let (message, preemption) =
                match self.preemption(facts, &snap, &might_help, &others_fit) {
                    Ok(c) => (refused, Some(Box::new(c))),
                    Err(why) => (format!("{refused} preemption: {why}"), None),
                };
            return Err(Unplaced {
                message,
                pod_bound_may_help: reasons.iter().any(Unfit::helped_by_pod_bound),
                preemption,
            });
        }
        let views: Vec<&NodeView> = feasible.iter().map(|(n, _)| *n).collect();
        let mut total = vec![0i64; feasible.len()];
        let per_node = |f: fn(&PodFacts, &NodeView) -> i64| -> Vec<i64> {
            feasible.iter().map(|(n, _)| f(facts, n)).collect()
        };
        let plugins = [
            (
                ScorePlugin::TaintToleration,
                Some(fit::default_normalize(
                    per_node(fit::intolerable_prefer_no_schedule),
                    true,
                )),
            ),
            (
                ScorePlugin::NodeAffinity,
                Some(fit::default_normalize(
                    per_node(fit::preferred_node_affinity),
                    false,
                )),
            ),
            (
                ScorePlugin::NodeResourcesFit,
                Some(
                    feasible
                        .iter()
                        .map(|(n, u)| fit::score(facts, n, u))
                        .collect(),
                ),
            ),
            (
                ScorePlugin::PodTopologySpread,
                podtopologyspread::score(facts, &snap, &views),
            ),
            (
                ScorePlugin::InterPodAffinity,
                interpodaffinity::score(facts, &snap, &views),
            ),
        ];
        for (plugin, scores) in plugins {
            for (t, s) in total.iter_mut().zip(scores.into_iter().flatten()) {
                *t += s * plugin.weight();
            }
        }
        // Equal scores: the emptier node, then the first in name order.
        let best = feasible
            .iter()
            .zip(&total)
            .map(|((n, u), s)| ((*s, -u.pods), n.name.as_str()))
            .reduce(|best, cand| if cand.0 > best.0 { cand } else { best });
        Ok(best.map(|(_, n)| n.to_string()).unwrap_or_default())
    }

    /// Whether `facts` may preempt at all, else upstream's reason.
    fn preemption_eligibility(&self, facts: &PodFacts) -> Result<(), &'static str> {
        let prio = preemption::priority(facts);
        let nominated = facts
            .pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .unwrap_or("");
        let victims_terminating = !nominated.is_empty()
            && self.bound.pods.values().any(|(n, p)| {
                n == nominated
                    && p.pod.metadata.deletion_timestamp.is_some()
                    && preemption::priority(p) < prio
            });
        preemption::eligible(facts, victims_terminating)
    }

    /// The node and victims preemption chooses for `facts`, if it is eligible and any node
    /// where preemption might help would take it once some lower-priority pods are gone; else
    /// why not, in upstream's words (without the `preemption: ` prefix).
    fn preemption(
        &self,
        facts: &PodFacts,
        snap: &Snapshot<'_>,
        might_help: &[&NodeView],
        others_fit: &dyn Fn(&NodeView) -> Result<(), Vec<Unfit>>,
    ) -> Result<preemption::Candidate, String> {
        self.preemption_eligibility(facts).map_err(String::from)?;
        let total = self.nodes.len();
        if might_help.is_empty() {
            let all = vec![preemption::NotHelped::NotHelpful; total];
            return Err(preemption::failure_message(total, &all));
        }
        let budgets: Vec<preemption::Budget> = snap
            .list(&objects::key_of("policy", "poddisruptionbudgets", None, ""))
            .iter()
            .filter_map(|b| preemption::Budget::of(b))
            .collect();
        let mut on_node: HashMap<&str, Vec<(&str, &PodFacts)>> = might_help
            .iter()
            .map(|n| (n.name.as_str(), Vec::new()))
            .collect();
        for (key, (node, p)) in &self.bound.pods {
            if let Some(list) = on_node.get_mut(node.as_str()) {
                list.push((key.as_str(), p));
            }
        }
        let empty = Usage::default();
        let mut candidates = Vec::new();
        let mut not_helped = Vec::new();
        for n in might_help {
            let used = self.usage.get(&n.name).unwrap_or(&empty);
            let fits = |u: &Usage| fit::filter(facts, n, u).and_then(|()| others_fit(n));
            match preemption::select_victims(
                facts,
                &n.name,
                used,
                &on_node[n.name.as_str()],
                &budgets,
                &fits,
            ) {
                Ok(c) => candidates.push(c),
                Err(why) => not_helped.push(why),
            }
        }
        if let Some(c) = preemption::pick(candidates) {
            return Ok(c);
        }
        // Every node not tried was refused by a filter deleting pods cannot change.
        not_helped.resize(total, preemption::NotHelped::NotHelpful);
        Err(preemption::failure_message(total, &not_helped))
    }

    /// Carries out a preemption: the preemptor is nominated to the node, each victim gets
    /// `DisruptionTarget` and a `Preempted` event and is deleted with its grace period.
    fn preempt(&self, key: &str, pod: &Value, c: &preemption::Candidate) {
        let node = c.node.as_str();
        let _ = objects::modify(&self.st, key, &mut |p| {
            if str_at(p, "/status/nominatedNodeName") == node {
                return false;
            }
            p["status"]["nominatedNodeName"] = json!(node);
            true
        });
        let Some(target) = objects::target("", "pods", None) else {
            return;
        };
        let msg = format!(
            "Preempted by pod {} on node {node}",
            str_at(pod, "/metadata/uid")
        );
        for victim in &c.victims {
            let Ok(Some(v)) = self.st.store.get(victim) else {
                continue;
            };
            tracing::info!(preemptor = %key, victim = %victim, node = %node, "scheduler: preempting");
            let _ = objects::modify(&self.st, victim, &mut |p| {
                mark_disruption_target(p, DisruptionReason::PreemptionByScheduler)
            });
            self.recorder
                .record(&self.st, &v.object, "Normal", "Preempted", &msg);
            let mut t = target.clone();
            t.namespace = Some(str_at(&v.object, "/metadata/namespace").to_string());
            if let Err(e) = delete_object(
                &self.st,
                &t,
                str_at(&v.object, "/metadata/name"),
                &DeleteOptions::default(),
            ) {
                tracing::warn!(victim = %victim, error = %e.0["message"], "scheduler: deleting a victim failed");
            }
        }
    }

    fn park(&mut self, key: &str, wakes_on_pod_bound: bool) {
        let attempts = self.unschedulable.get(key).map_or(0, |w| w.attempts) + 1;
        self.unschedulable.insert(
            key.to_string(),
            Waiting {
                attempts,
                since: Instant::now(),
                retry_at: None,
                wakes_on_pod_bound,
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
    // Claims and volumes are read from the store when a pod is placed; their changes only
    // wake pods VolumeBinding refused (a claim bound, a volume made).
    let mut claims = Cache::new(st.store.clone(), "/core/persistentvolumeclaims/");
    let mut volumes = Cache::new(st.store.clone(), "/core/persistentvolumes/");
    let mut s = Scheduler::new(st.clone());
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
        let mut storage_changed = false;
        while claims.try_next().is_some() || volumes.try_next().is_some() {
            storage_changed = true;
        }
        if storage_changed {
            s.wake_unschedulable();
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
            _ = claims.next() => s.wake_unschedulable(),
            _ = volumes.next() => s.wake_unschedulable(),
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Fake clusters for the plugins' table tests: nodes and bound pods as JSON, other objects
/// (Namespaces, Services, owners) in a throwaway store.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::storage::embedded::EmbeddedStore;

    pub(crate) struct Fixture {
        pub(crate) nodes: HashMap<String, NodeView>,
        bound: BoundPods,
        store: EmbeddedStore,
        _dir: tempfile::TempDir,
    }

    pub(crate) fn pod(v: Value) -> PodFacts {
        let mut v = v;
        if v["metadata"]["namespace"].is_null() {
            v["metadata"]["namespace"] = json!("default");
        }
        if v["spec"]["containers"].is_null() {
            v["spec"]["containers"] = json!([{"name": "c"}]);
        }
        PodFacts::of(serde_json::from_value(v).expect("pod"))
    }

    /// A node with `labels` (its hostname label added) and room for anything.
    pub(crate) fn node(name: &str, labels: Value) -> Value {
        let mut labels = labels;
        labels["kubernetes.io/hostname"] = json!(name);
        json!({"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "pods": "110"}}})
    }

    impl Fixture {
        /// `pods` are (node name, pod) pairs, already bound there.
        pub(crate) fn new(nodes: &[Value], pods: Vec<(&str, Value)>) -> Fixture {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = EmbeddedStore::open(&dir.path().join("s.redb")).expect("store");
            let nodes = nodes
                .iter()
                .map(|n| {
                    let v = NodeView::of(&serde_json::from_value(n.clone()).expect("node"));
                    (v.name.clone(), v)
                })
                .collect();
            let mut bound = BoundPods::default();
            for (i, (n, p)) in pods.into_iter().enumerate() {
                bound.insert(format!("p{i}"), (n.to_string(), pod(p)));
            }
            Fixture {
                nodes,
                bound,
                store,
                _dir: dir,
            }
        }

        pub(crate) fn put(&self, key: &str, obj: Value) {
            self.store.create(key, obj).expect("create");
        }

        pub(crate) fn snapshot(&self) -> Snapshot<'_> {
            Snapshot {
                nodes: &self.nodes,
                bound: &self.bound,
                store: &self.store,
                namespace_labels: RefCell::default(),
            }
        }

        /// The nodes in name order, as the scheduler walks them.
        pub(crate) fn views(&self) -> Vec<&NodeView> {
            let mut v: Vec<&NodeView> = self.nodes.values().collect();
            v.sort_by(|a, b| a.name.cmp(&b.name));
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::node;
    use super::*;
    use crate::apiserver::state::ApiConfig;
    use crate::storage::embedded::EmbeddedStore;

    /// A scheduler over a throwaway store holding `nodes` and pending `pods`.
    fn scheduler(dir: &tempfile::TempDir, nodes: Vec<Value>, pods: Vec<Value>) -> Scheduler {
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open(&dir.path().join("s.redb")).expect("store"));
        let st = Arc::new(ApiState {
            store: store.clone(),
            config: ApiConfig::default(),
            tokens: Default::default(),
            authz: crate::apiserver::authz::Chain::new(
                &ApiConfig::default().authorization_modes,
                store.clone(),
            ),
            ca_pem: String::new(),
            kubelet_tls: None,
            sa_keys: Arc::new(crate::apiserver::authn::serviceaccount::Keys::generate()),
            alloc_lock: tokio::sync::Mutex::new(()),
            metrics: Default::default(),
            resource_metrics: Default::default(),
            listers: crate::apiserver::listers::Listers::new(store.clone()),
            aggregator: Default::default(),
        });
        let mut s = Scheduler::new(st);
        for n in nodes {
            let key = format!("/core/nodes/{}", str_at(&n, "/metadata/name"));
            let stored = store.create(&key, n).expect("node");
            s.node_changed(&key, Some(&stored.object));
        }
        for (i, mut p) in pods.into_iter().enumerate() {
            let name = format!("p{i}");
            p["apiVersion"] = json!("v1");
            p["kind"] = json!("Pod");
            p["metadata"]["name"] = json!(name);
            p["metadata"]["namespace"] = json!("default");
            p["metadata"]["uid"] = json!(format!("uid-{i}"));
            p["metadata"]["creationTimestamp"] = json!(format!("2026-01-01T00:00:{i:02}Z"));
            p["spec"]["containers"] = json!([{"name": "c", "image": "busybox"}]);
            let key = format!("/core/pods/default/{name}");
            let stored = store.create(&key, p).expect("pod");
            s.pod_changed(&key, Some(&stored.object));
        }
        s
    }

    /// Where each pod went (None: still pending), in creation order.
    fn placements(s: &Scheduler, n: usize) -> Vec<Option<String>> {
        (0..n)
            .map(|i| {
                let v =
                    s.st.store
                        .get(&format!("/core/pods/default/p{i}"))
                        .unwrap()
                        .unwrap();
                let node = str_at(&v.object, "/spec/nodeName");
                (!node.is_empty()).then(|| node.to_string())
            })
            .collect()
    }

    #[test]
    fn pods_decided_in_one_batch_see_each_other_for_anti_affinity() {
        let dir = tempfile::tempdir().unwrap();
        let anti = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "web"}},
                "topologyKey": "kubernetes.io/hostname"}]}}}});
        let nodes = ["n1", "n2", "n3"].map(|n| node(n, json!({}))).to_vec();
        let mut s = scheduler(&dir, nodes, vec![anti.clone(); 4]);
        assert!(s.schedule_batch());
        let got = placements(&s, 4);
        let mut bound: Vec<String> = got.iter().flatten().cloned().collect();
        bound.sort();
        assert_eq!(bound, ["n1", "n2", "n3"], "{got:?}");
        assert_eq!(got[3], None, "the last in the queue is left over");
        // Only a pod going away can help it: a pod bound elsewhere does not wake it.
        assert!(!s.unschedulable["/core/pods/default/p3"].wakes_on_pod_bound);
    }

    #[test]
    fn pods_decided_in_one_batch_count_for_topology_spread() {
        let dir = tempfile::tempdir().unwrap();
        let zone = "topology.kubernetes.io/zone";
        // Zone a has three nodes: on resources alone most pods would go there.
        let nodes = vec![
            node("a1", json!({zone: "a"})),
            node("a2", json!({zone: "a"})),
            node("a3", json!({zone: "a"})),
            node("b1", json!({zone: "b"})),
        ];
        let spread = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": zone, "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"app": "web"}}}]}});
        let mut s = scheduler(&dir, nodes, vec![spread; 6]);
        assert!(s.schedule_batch());
        let got = placements(&s, 6);
        let in_b = got.iter().filter(|n| n.as_deref() == Some("b1")).count();
        assert_eq!((got.iter().flatten().count(), in_b), (6, 3), "{got:?}");
    }
}
