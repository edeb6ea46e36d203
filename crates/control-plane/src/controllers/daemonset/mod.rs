//! The DaemonSet controller (upstream's `pkg/controller/daemon`): one pod per eligible node
//! ([`eligibility`]), created pinned to its node by node affinity for the scheduler to
//! bind; pods of ineligible nodes deleted, failed pods replaced with back-off ([`backoff`]);
//! template changes rolled out by the RollingUpdate strategy ([`rolling`]) or left to the
//! user (OnDelete); one ControllerRevision per template ([`crate::controllers::history`]);
//! and the DaemonSet's status. [`expectations`] keep a slow watch from causing duplicates.

pub(crate) mod backoff;
pub(crate) mod eligibility;
pub(crate) mod expectations;
pub(crate) mod pods;
pub(crate) mod rolling;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::apiserver::rest::delete::{DeleteOptions, delete_object};
use crate::apiserver::rest::now_ts;
use crate::apiserver::rest::update::TEMPLATE_GENERATION;
use crate::apiserver::state::ApiState;
use crate::controllers::cache::{Cache, Change};
use crate::controllers::events::Recorder;
use crate::controllers::history::{self, HASH_LABEL};
use crate::controllers::objects;
use crate::storage::EventKind;
use eligibility::Fit;

/// The label carrying the DaemonSet's template generation on its pods.
pub(crate) const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";

const PREFIX: &str = "/apps/daemonsets/";

/// How long a sync that failed on the API (a write refused, a revision collision) waits
/// before it is tried again.
const RETRY: Duration = Duration::from_secs(2);

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// Event reasons, with upstream's texts.
#[derive(Clone, Copy)]
enum Reason {
    SuccessfulCreate,
    FailedCreate,
    SuccessfulDelete,
    FailedDelete,
    FailedDaemonPod,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Reason::SuccessfulCreate => "SuccessfulCreate",
            Reason::FailedCreate => "FailedCreate",
            Reason::SuccessfulDelete => "SuccessfulDelete",
            Reason::FailedDelete => "FailedDelete",
            Reason::FailedDaemonPod => "FailedDaemonPod",
        }
    }

    fn event_type(self) -> &'static str {
        match self {
            Reason::SuccessfulCreate | Reason::SuccessfulDelete => "Normal",
            _ => "Warning",
        }
    }
}

/// The DaemonSet of a pod's (or revision's) controller reference, as a cache key.
fn owner_key(obj: &Value) -> Option<String> {
    let r = obj
        .pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)?;
    if r["kind"] != "DaemonSet" || !r["apiVersion"].as_str()?.starts_with("apps/") {
        return None;
    }
    Some(format!(
        "{PREFIX}{}/{}",
        s(obj, "/metadata/namespace"),
        r["name"].as_str()?
    ))
}

fn template_generation(ds: &Value) -> Option<i64> {
    ds.pointer("/metadata/annotations")?
        .get(TEMPLATE_GENERATION)?
        .as_str()?
        .parse()
        .ok()
}

struct Controller {
    st: Arc<ApiState>,
    recorder: Recorder,
    expectations: expectations::Expectations,
    backoff: backoff::Backoff,
    /// DaemonSets to sync again at a time (back-off, minReadySeconds, retries).
    requeue: HashMap<String, Instant>,
}

/// The world one sync reads.
struct View<'a> {
    pods: &'a Cache,
    nodes: &'a Cache,
    revisions: &'a Cache,
}

impl Controller {
    fn after(&mut self, key: &str, d: Duration) {
        let at = Instant::now() + d;
        let e = self.requeue.entry(key.to_string()).or_insert(at);
        if at < *e {
            *e = at;
        }
    }

    fn event(&self, ds: &Value, reason: Reason, message: &str) {
        self.recorder
            .record(&self.st, ds, reason.event_type(), reason.as_str(), message);
    }

    fn note_pod(&mut self, c: Change, daemonsets: &Cache, dirty: &mut HashSet<String>) {
        match c {
            Change::Relisted => {
                // The cache is now at least as new as every write we made.
                self.expectations.clear();
                dirty.extend(daemonsets.objects.keys().cloned());
            }
            Change::Event(ev) => {
                let Some(key) = owner_key(&ev.object) else {
                    return;
                };
                let name = s(&ev.object, "/metadata/name");
                match ev.kind {
                    EventKind::Added => self.expectations.observed_add(&key, name),
                    EventKind::Deleted => self.expectations.observed_delete(&key, name),
                    EventKind::Modified => {
                        if pods::deleting(&ev.object) {
                            self.expectations.observed_delete(&key, name)
                        }
                    }
                }
                dirty.insert(key);
            }
        }
    }

    /// The current revision (created or renumbered as needed) and the older ones.
    fn history(
        &mut self,
        ds: &Value,
        revisions: &Cache,
    ) -> Result<(Arc<Value>, Vec<Arc<Value>>), String> {
        let owned = history::owned(revisions.objects.values(), ds);
        let patch = history::template_patch(ds);
        let (mut current, old): (Vec<_>, Vec<_>) = owned
            .into_iter()
            .partition(|r| r.get("data") == Some(&patch));
        let next = history::next_revision(&old);
        let Some(cur) = current.pop() else {
            let template = ds.pointer("/spec/template").cloned().unwrap_or(Value::Null);
            let collisions = ds.pointer("/status/collisionCount").and_then(Value::as_i64);
            let hash = history::hash(&template, collisions);
            let labels = ds
                .pointer("/spec/template/metadata/labels")
                .cloned()
                .unwrap_or_else(|| json!({}));
            return match history::create(&self.st, ds, &hash, &labels, patch, next) {
                Ok(r) => Ok((r, old)),
                Err(history::CreateError::Collision) => {
                    let key = format!(
                        "{PREFIX}{}/{}",
                        s(ds, "/metadata/namespace"),
                        s(ds, "/metadata/name")
                    );
                    let _ = objects::modify(&self.st, &key, &mut |d| {
                        if d.pointer("/status/collisionCount").and_then(Value::as_i64) != collisions
                        {
                            return false;
                        }
                        if !d.get("status").is_some_and(Value::is_object) {
                            d["status"] = json!({});
                        }
                        d["status"]["collisionCount"] = json!(collisions.unwrap_or(0) + 1);
                        true
                    });
                    Err(format!(
                        "hash collision on revision {}",
                        history::revision_name(s(ds, "/metadata/name"), &hash)
                    ))
                }
                Err(history::CreateError::Store(e)) => Err(e.to_string()),
            };
        };
        // Duplicates of the current template (a lost race): the newest number wins.
        let dups: Vec<&Arc<Value>> = current.iter().collect();
        history::delete(&self.st, &dups);
        if history::revision_of(&cur) < next {
            history::bump(&self.st, &cur, next).map_err(|e| e.to_string())?;
        }
        Ok((cur, old))
    }

    fn sync(&mut self, key: &str, daemonsets: &Cache, view: &View<'_>) {
        let Some(ds) = daemonsets.get(key).cloned() else {
            self.expectations.forget(key);
            return;
        };
        if ds.pointer("/metadata/deletionTimestamp").is_some() {
            return;
        }
        let ns = s(&ds, "/metadata/namespace");
        let (cur, old) = match self.history(&ds, view.revisions) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(daemonset = %key, error = %e, "daemonset: history");
                self.after(key, RETRY);
                return;
            }
        };
        let hash = cur
            .pointer("/metadata/labels")
            .and_then(|l| l.get(HASH_LABEL))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let generation = template_generation(&ds);
        let own: Vec<&Arc<Value>> = view
            .pods
            .objects
            .values()
            .filter(|p| s(p, "/metadata/namespace") == ns && history::controlled_by(p, &ds))
            .collect();
        let mut by_node: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
        for p in &own {
            if let Some(n) = eligibility::target_node(p) {
                by_node.entry(n).or_default().push(p);
            }
        }
        let mut nodes: Vec<&Arc<Value>> = view.nodes.objects.values().collect();
        nodes.sort_by(|a, b| s(a, "/metadata/name").cmp(s(b, "/metadata/name")));
        let fits: BTreeMap<String, Fit> = nodes
            .iter()
            .map(|n| {
                (
                    s(n, "/metadata/name").to_string(),
                    eligibility::node_should_run(&ds, n),
                )
            })
            .collect();
        let now = Instant::now();
        if self.expectations.satisfied(key, now) {
            let (creates, deletes) = self.manage(key, &ds, &hash, &by_node, &fits, now);
            let acted = !creates.is_empty() || !deletes.is_empty();
            self.sync_nodes(key, &ds, &hash, generation, creates, deletes);
            if !acted && s(&ds, "/spec/updateStrategy/type") == "RollingUpdate" {
                self.rolling_update(key, &ds, &hash, generation, &by_node, &fits);
            }
            if self.expectations.satisfied(key, Instant::now()) {
                let live: HashSet<String> =
                    own.iter().map(|p| pods::hash_of(p).to_string()).collect();
                let limit = ds
                    .pointer("/spec/revisionHistoryLimit")
                    .and_then(Value::as_i64)
                    .unwrap_or(10);
                history::delete(&self.st, &history::to_truncate(&old, &live, limit));
            }
        }
        self.update_status(key, &ds, &hash, generation, &by_node, &fits);
    }

    /// Upstream's manage/podsShouldBeOnNode: nodes needing a pod, and pods to delete
    /// (failed ones, after their back-off; extra ones; ones on nodes they no longer fit).
    fn manage(
        &mut self,
        key: &str,
        ds: &Value,
        hash: &str,
        by_node: &BTreeMap<String, Vec<&Value>>,
        fits: &BTreeMap<String, Fit>,
        now: Instant,
    ) -> (Vec<String>, Vec<String>) {
        let surge = rolling::budget(ds, 1).is_some_and(|(s, _)| s > 0)
            && s(ds, "/spec/updateStrategy/type") == "RollingUpdate";
        let mut creates = Vec::new();
        let mut deletes = Vec::new();
        for (node, fit) in fits {
            let pods_here = by_node.get(node).map(Vec::as_slice).unwrap_or(&[]);
            if fit.should_run && pods_here.is_empty() {
                creates.push(node.clone());
                continue;
            }
            if !fit.should_continue_running {
                deletes.extend(
                    pods_here
                        .iter()
                        .filter(|p| !pods::deleting(p))
                        .map(|p| s(p, "/metadata/name").to_string()),
                );
                continue;
            }
            let mut running = Vec::new();
            for p in pods_here.iter().filter(|p| !pods::deleting(p)) {
                match pods::phase(p) {
                    "Failed" => {
                        let bkey = format!("{key}/{node}");
                        if let Some(wait) = self.backoff.remaining(&bkey, now) {
                            self.after(key, wait);
                            continue;
                        }
                        self.backoff.next(&bkey, now);
                        self.event(
                            ds,
                            Reason::FailedDaemonPod,
                            &format!(
                                "Found failed daemon pod {}/{} on node {node}, will try to kill it",
                                s(p, "/metadata/namespace"),
                                s(p, "/metadata/name")
                            ),
                        );
                        deletes.push(s(p, "/metadata/name").to_string());
                    }
                    "Succeeded" => deletes.push(s(p, "/metadata/name").to_string()),
                    _ => running.push(*p),
                }
            }
            if running.len() <= 1 {
                continue;
            }
            running.sort_by(|a, b| pods::keep_order(a, b));
            if !surge {
                deletes.extend(
                    running[1..]
                        .iter()
                        .map(|p| s(p, "/metadata/name").to_string()),
                );
                continue;
            }
            // Surging: keep the oldest updated pod and the oldest old one.
            let (mut kept_new, mut kept_old) = (false, false);
            for p in running {
                let slot = if pods::hash_of(p) == hash {
                    &mut kept_new
                } else {
                    &mut kept_old
                };
                if !*slot {
                    *slot = true;
                    continue;
                }
                deletes.push(s(p, "/metadata/name").to_string());
            }
        }
        // Pods never bound whose node is gone (bound ones are the pod GC's).
        for (node, pods_there) in by_node {
            if fits.contains_key(node) {
                continue;
            }
            deletes.extend(
                pods_there
                    .iter()
                    .filter(|p| s(p, "/spec/nodeName").is_empty() && !pods::deleting(p))
                    .map(|p| s(p, "/metadata/name").to_string()),
            );
        }
        (creates, deletes)
    }

    fn rolling_update(
        &mut self,
        key: &str,
        ds: &Value,
        hash: &str,
        generation: Option<i64>,
        by_node: &BTreeMap<String, Vec<&Value>>,
        fits: &BTreeMap<String, Fit>,
    ) {
        let mut nodes: BTreeMap<String, Vec<&Value>> = by_node.clone();
        let mut desired = 0;
        for (n, fit) in fits {
            if fit.should_run {
                desired += 1;
                nodes.entry(n.clone()).or_default();
            }
        }
        let Some((surge, unavailable)) = rolling::budget(ds, desired) else {
            tracing::warn!(daemonset = %key, "daemonset: invalid rollingUpdate values");
            return;
        };
        let min_ready = ds
            .pointer("/spec/minReadySeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let now = now_ts();
        let plan = rolling::plan(
            &nodes,
            surge,
            unavailable,
            &|p| pods::is_updated(p, hash, generation),
            &|p| pods::is_available(p, min_ready, now),
        );
        self.sync_nodes(key, ds, hash, generation, plan.create_on, plan.delete);
        if min_ready > 0 {
            self.after(key, Duration::from_secs(min_ready as u64));
        }
    }

    /// Creates a pod on each of `creates` and deletes the pods named in `deletes`, with
    /// expectations for each and upstream's events.
    fn sync_nodes(
        &mut self,
        key: &str,
        ds: &Value,
        hash: &str,
        generation: Option<i64>,
        creates: Vec<String>,
        deletes: Vec<String>,
    ) {
        let ns = s(ds, "/metadata/namespace").to_string();
        for node in creates {
            let pod = eligibility::new_pod(ds, &node, hash, generation);
            match objects::create_pod(&self.st, &ns, pod) {
                Ok(stored) => {
                    let name = s(&stored.object, "/metadata/name").to_string();
                    self.expectations.expect_add(key, &name, Instant::now());
                    self.event(
                        ds,
                        Reason::SuccessfulCreate,
                        &format!("Created pod: {name}"),
                    );
                }
                Err(e) => {
                    self.event(ds, Reason::FailedCreate, &format!("Error creating: {e}"));
                    self.after(key, RETRY);
                }
            }
        }
        let Some(mut t) = objects::target("", "pods", None) else {
            return;
        };
        t.namespace = Some(ns);
        for name in deletes {
            match delete_object(&self.st, &t, &name, &DeleteOptions::default()) {
                Ok(_) => {
                    self.expectations.expect_delete(key, &name, Instant::now());
                    self.event(
                        ds,
                        Reason::SuccessfulDelete,
                        &format!("Deleted pod: {name}"),
                    );
                }
                Err(e) if e.0["code"] == 404 => {}
                Err(e) => {
                    let msg = e.0["message"].as_str().unwrap_or("").to_string();
                    self.event(ds, Reason::FailedDelete, &format!("Error deleting: {msg}"));
                    self.after(key, RETRY);
                }
            }
        }
    }

    fn update_status(
        &mut self,
        key: &str,
        ds: &Value,
        hash: &str,
        generation: Option<i64>,
        by_node: &BTreeMap<String, Vec<&Value>>,
        fits: &BTreeMap<String, Fit>,
    ) {
        let min_ready = ds
            .pointer("/spec/minReadySeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let counts = status_counts(fits, by_node, hash, generation, min_ready, now_ts());
        let observed = ds
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let mut status = json!({
            "currentNumberScheduled": counts.current,
            "numberMisscheduled": counts.misscheduled,
            "desiredNumberScheduled": counts.desired,
            "numberReady": counts.ready,
        });
        // Upstream's omitempty fields.
        for (k, v) in [
            ("observedGeneration", observed),
            ("updatedNumberScheduled", counts.updated),
            ("numberAvailable", counts.available),
            ("numberUnavailable", counts.desired - counts.available),
        ] {
            if v != 0 {
                status[k] = json!(v);
            }
        }
        let _ = objects::modify(&self.st, key, &mut |d| {
            if d.pointer("/metadata/uid") != ds.pointer("/metadata/uid") {
                return false;
            }
            let mut next = status.clone();
            for k in ["collisionCount", "conditions"] {
                if let Some(v) = d.pointer(&format!("/status/{k}")) {
                    next[k] = v.clone();
                }
            }
            d["status"] = next;
            true
        });
        if min_ready > 0 && counts.ready != counts.available {
            self.after(key, Duration::from_secs(min_ready as u64));
        }
    }
}

/// The numbers of a DaemonSet's status.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub desired: i64,
    pub current: i64,
    pub misscheduled: i64,
    pub ready: i64,
    pub available: i64,
    pub updated: i64,
}

/// Upstream's updateDaemonSetStatus arithmetic: per node that should run a pod, whether it
/// has one and whether the oldest is ready, available, updated; per node that should not,
/// whether it has one anyway. Terminal pods being deleted no longer count.
pub(crate) fn status_counts(
    fits: &BTreeMap<String, Fit>,
    by_node: &BTreeMap<String, Vec<&Value>>,
    hash: &str,
    generation: Option<i64>,
    min_ready: i64,
    now: k8s_openapi::jiff::Timestamp,
) -> Counts {
    let mut c = Counts::default();
    for (node, fit) in fits {
        let mut here: Vec<&Value> = by_node
            .get(node)
            .into_iter()
            .flatten()
            .copied()
            .filter(|p| !(pods::deleting(p) && matches!(pods::phase(p), "Succeeded" | "Failed")))
            .collect();
        if !fit.should_run {
            if !here.is_empty() {
                c.misscheduled += 1;
            }
            continue;
        }
        c.desired += 1;
        if here.is_empty() {
            continue;
        }
        c.current += 1;
        here.sort_by(|a, b| pods::keep_order(a, b));
        let p = here[0];
        if pods::is_ready(p) {
            c.ready += 1;
            if pods::is_available(p, min_ready, now) {
                c.available += 1;
            }
        }
        if pods::is_updated(p, hash, generation) {
            c.updated += 1;
        }
    }
    c
}

fn note_all(dirty: &mut HashSet<String>, daemonsets: &Cache) {
    dirty.extend(daemonsets.objects.keys().cloned());
}

fn note_ds(c: Change, dirty: &mut HashSet<String>, daemonsets: &Cache) {
    match c {
        Change::Event(ev) => {
            dirty.insert(ev.key.clone());
        }
        Change::Relisted => note_all(dirty, daemonsets),
    }
}

fn note_owned(c: Change, dirty: &mut HashSet<String>, daemonsets: &Cache) {
    match c {
        Change::Event(ev) => dirty.extend(owner_key(&ev.object)),
        Change::Relisted => note_all(dirty, daemonsets),
    }
}

pub async fn run(st: Arc<ApiState>) {
    let mut daemonsets = Cache::new(st.store.clone(), PREFIX);
    let mut pods = Cache::new(st.store.clone(), "/core/pods/");
    let mut nodes = Cache::new(st.store.clone(), "/core/nodes/");
    let mut revisions = Cache::new(st.store.clone(), "/apps/controllerrevisions/");
    let mut ctl = Controller {
        st,
        recorder: Recorder::new("daemonset-controller"),
        expectations: Default::default(),
        backoff: Default::default(),
        requeue: HashMap::new(),
    };
    let mut dirty: HashSet<String> = daemonsets.objects.keys().cloned().collect();
    loop {
        if dirty.is_empty() {
            let wake = ctl.requeue.values().min().copied();
            let sleep = async move {
                match wake {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                c = daemonsets.next() => note_ds(c, &mut dirty, &daemonsets),
                c = pods.next() => ctl.note_pod(c, &daemonsets, &mut dirty),
                _ = nodes.next() => note_all(&mut dirty, &daemonsets),
                c = revisions.next() => note_owned(c, &mut dirty, &daemonsets),
                _ = sleep => {}
            }
        }
        while let Some(c) = daemonsets.try_next() {
            note_ds(c, &mut dirty, &daemonsets);
        }
        while let Some(c) = pods.try_next() {
            ctl.note_pod(c, &daemonsets, &mut dirty);
        }
        while nodes.try_next().is_some() {
            note_all(&mut dirty, &daemonsets);
        }
        while let Some(c) = revisions.try_next() {
            note_owned(c, &mut dirty, &daemonsets);
        }
        let now = Instant::now();
        let due: Vec<String> = ctl
            .requeue
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            ctl.requeue.remove(&k);
            dirty.insert(k);
        }
        ctl.backoff.gc(now);
        let view = View {
            pods: &pods,
            nodes: &nodes,
            revisions: &revisions,
        };
        for key in dirty.drain() {
            ctl.sync(&key, &daemonsets, &view);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: &str, hash: &str, ready: bool, phase: &str) -> Value {
        json!({"metadata": {"name": format!("p-{node}-{hash}"), "labels": {"controller-revision-hash": hash}},
            "spec": {"nodeName": node},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    #[test]
    fn status_counts_as_upstream() {
        const RUN: Fit = Fit {
            should_run: true,
            should_continue_running: true,
        };
        const NO: Fit = Fit {
            should_run: false,
            should_continue_running: false,
        };
        let fits: BTreeMap<String, Fit> = [("a", RUN), ("b", RUN), ("c", RUN), ("d", NO)]
            .into_iter()
            .map(|(n, f)| (n.to_string(), f))
            .collect();
        let pa = pod("a", "new", true, "Running");
        let pb = pod("b", "old", false, "Pending");
        let pd = pod("d", "new", true, "Running");
        let by_node: BTreeMap<String, Vec<&Value>> =
            [("a", vec![&pa]), ("b", vec![&pb]), ("d", vec![&pd])]
                .into_iter()
                .map(|(n, p)| (n.to_string(), p))
                .collect();
        let c = status_counts(&fits, &by_node, "new", None, 0, now_ts());
        assert_eq!(
            c,
            Counts {
                desired: 3,
                current: 2,
                misscheduled: 1,
                ready: 1,
                available: 1,
                updated: 1
            }
        );
    }

    #[test]
    fn owner_keys_only_for_daemonsets() {
        let p = |kind: &str, api: &str| json!({"metadata": {"namespace": "ns", "ownerReferences": [{"apiVersion": api, "kind": kind, "name": "x", "uid": "u", "controller": true}]}});
        assert_eq!(
            owner_key(&p("DaemonSet", "apps/v1")).as_deref(),
            Some("/apps/daemonsets/ns/x")
        );
        assert_eq!(owner_key(&p("ReplicaSet", "apps/v1")), None);
        assert_eq!(owner_key(&json!({"metadata": {}})), None);
    }
}
