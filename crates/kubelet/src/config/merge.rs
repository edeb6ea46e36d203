//! The per-source pod store behind [`super::PodConfig`] (upstream's `podStorage`).

use super::{
    CONFIG_FIRST_SEEN_ANNOTATION, CONFIG_MIRROR_ANNOTATION, CONFIG_SOURCE_ANNOTATION, PodOperation,
    PodUpdate, SourceUpdate, pod_full_name,
};
use k8s_openapi::api::core::v1::Pod;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Annotations the kubelet itself adds; a difference in them is not a change of the pod.
const LOCAL_ANNOTATIONS: [&str; 3] = [
    CONFIG_SOURCE_ANNOTATION,
    CONFIG_MIRROR_ANNOTATION,
    CONFIG_FIRST_SEEN_ANNOTATION,
];

#[derive(Default)]
pub(super) struct PodStorage {
    /// source → pod key (UID) → pod.
    pods: HashMap<String, HashMap<String, Pod>>,
    /// Sources that have sent at least one set.
    seen: HashSet<String>,
}

fn pod_key(pod: &Pod) -> String {
    match pod.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_string(),
        // Sources always set a UID; keying by name keeps a UID-less pod stable anyway.
        _ => format!("name:{}", pod_full_name(pod)),
    }
}

enum Change {
    None,
    Update,
    Reconcile,
    Delete,
}

impl PodStorage {
    pub(super) fn seen(&self, source: &str) -> bool {
        self.seen.contains(source)
    }

    pub(super) fn all_pods(&self) -> Vec<Pod> {
        let mut sources: Vec<&String> = self.pods.keys().collect();
        sources.sort();
        let mut out = Vec::new();
        for s in sources {
            let mut pods: Vec<&Pod> = self.pods[s].values().collect();
            pods.sort_by_key(|p| pod_full_name(p));
            out.extend(pods.into_iter().cloned());
        }
        out
    }

    /// Applies what `source` sent and returns the updates it makes (upstream's
    /// `podStorage.merge`).
    pub(super) fn merge(&mut self, source: &str, update: SourceUpdate) -> Vec<PodUpdate> {
        match update {
            SourceUpdate::Set(pods) => self.merge_set(source, pods),
            SourceUpdate::Upsert(pod) => self.merge_upsert(source, pod),
            SourceUpdate::Remove(pod) => self.merge_remove(source, pod),
        }
    }

    /// One pod of `source` created or changed: ADD when it is new, else what
    /// [`check_and_update_pod`] finds. Only this pod is compared, whatever the node runs.
    fn merge_upsert(&mut self, source: &str, mut pod: Pod) -> Vec<PodUpdate> {
        self.seen.insert(source.to_string());
        let key = pod_key(&pod);
        if let Some(other) = self.provider_of_name(&pod, &key) {
            tracing::warn!(
                pod = %pod_full_name(&pod),
                source,
                other_source = other,
                "Pod failed validation due to duplicate pod name: another pod with this name is already provided, ignoring"
            );
            return Vec::new();
        }
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(CONFIG_SOURCE_ANNOTATION.to_string(), source.to_string());
        let set = self.pods.entry(source.to_string()).or_default();
        if let Some(existing) = set.get_mut(&key) {
            let op = match check_and_update_pod(existing, pod) {
                Change::Update => PodOperation::Update,
                Change::Reconcile => PodOperation::Reconcile,
                Change::Delete => PodOperation::Delete,
                Change::None => return Vec::new(),
            };
            return vec![update(op, vec![existing.clone()], source)];
        }
        record_first_seen_time(&mut pod);
        tracing::debug!(source, pod = %pod_full_name(&pod), "receiving a new pod");
        set.insert(key, pod.clone());
        vec![update(PodOperation::Add, vec![pod], source)]
    }

    /// One pod gone from `source`: REMOVE with the pod as it was kept.
    fn merge_remove(&mut self, source: &str, pod: Pod) -> Vec<PodUpdate> {
        self.seen.insert(source.to_string());
        match self
            .pods
            .get_mut(source)
            .and_then(|set| set.remove(&pod_key(&pod)))
        {
            Some(gone) => vec![update(PodOperation::Remove, vec![gone], source)],
            None => Vec::new(),
        }
    }

    /// The source already providing a pod with `pod`'s full name under another key, if any.
    /// Compares names in place: a scan without allocating, cheap beside a pod's sync.
    fn provider_of_name(&self, pod: &Pod, key: &str) -> Option<&str> {
        let same_name = |p: &Pod| {
            p.metadata.name == pod.metadata.name && p.metadata.namespace == pod.metadata.namespace
        };
        self.pods.iter().find_map(|(s, set)| {
            set.iter()
                .any(|(k, p)| k != key && same_name(p))
                .then_some(s.as_str())
        })
    }

    /// Replaces the pods of `source` with `pods` and returns the updates that turn the
    /// previous state into the new one, in upstream's delivery order: REMOVE, ADD, UPDATE,
    /// DELETE, then RECONCILE. The first set of a source that changes nothing still yields
    /// an empty ADD, which tells the kubelet the source is ready.
    pub(super) fn merge_set(&mut self, source: &str, pods: Vec<Pod>) -> Vec<PodUpdate> {
        let first_set = self.seen.insert(source.to_string());
        let filtered = self.filter_invalid_pods(source, pods);
        let mut old = self.pods.remove(source).unwrap_or_default();
        let mut current: HashMap<String, Pod> = HashMap::with_capacity(filtered.len());

        let (mut adds, mut updates, mut deletes, mut reconciles) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for mut pod in filtered {
            pod.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(CONFIG_SOURCE_ANNOTATION.to_string(), source.to_string());
            let key = pod_key(&pod);
            if let Some(mut existing) = old.remove(&key) {
                match check_and_update_pod(&mut existing, pod) {
                    Change::Update => updates.push(existing.clone()),
                    Change::Reconcile => reconciles.push(existing.clone()),
                    Change::Delete => deletes.push(existing.clone()),
                    Change::None => {}
                }
                current.insert(key, existing);
                continue;
            }
            record_first_seen_time(&mut pod);
            tracing::debug!(source, pod = %pod_full_name(&pod), "receiving a new pod");
            adds.push(pod.clone());
            current.insert(key, pod);
        }
        let mut removes: Vec<Pod> = old.into_values().collect();
        removes.sort_by_key(pod_full_name);
        self.pods.insert(source.to_string(), current);

        let mk = |op, pods| update(op, pods, source);
        let mut out = Vec::new();
        if !removes.is_empty() {
            out.push(mk(PodOperation::Remove, removes));
        }
        let nothing_else = adds.is_empty() && updates.is_empty() && deletes.is_empty();
        if !adds.is_empty() {
            out.push(mk(PodOperation::Add, adds));
        }
        if !updates.is_empty() {
            out.push(mk(PodOperation::Update, updates));
        }
        if !deletes.is_empty() {
            out.push(mk(PodOperation::Delete, deletes));
        }
        if first_set && nothing_else {
            out.push(mk(PodOperation::Add, Vec::new()));
        }
        if !reconciles.is_empty() {
            out.push(mk(PodOperation::Reconcile, reconciles));
        }
        out
    }

    /// Drops pods whose full name repeats one earlier in the same set (upstream's
    /// `filterInvalidPods`) or one that another source already provides under another UID.
    fn filter_invalid_pods(&self, source: &str, pods: Vec<Pod>) -> Vec<Pod> {
        let mut others: HashMap<String, (&str, String)> = HashMap::new();
        for (s, set) in &self.pods {
            if s == source {
                continue;
            }
            for (key, p) in set {
                others.insert(pod_full_name(p), (s.as_str(), key.clone()));
            }
        }
        let mut names = HashSet::new();
        let mut out = Vec::with_capacity(pods.len());
        for (index, pod) in pods.into_iter().enumerate() {
            let name = pod_full_name(&pod);
            if !names.insert(name.clone()) {
                tracing::warn!(
                    index,
                    pod = %name,
                    source,
                    "Pod failed validation due to duplicate pod name, ignoring"
                );
                continue;
            }
            if let Some((other, key)) = others.get(&name)
                && *key != pod_key(&pod)
            {
                tracing::warn!(
                    pod = %name,
                    source,
                    other_source = other,
                    "Pod failed validation due to duplicate pod name: another source already provides a pod with this name, ignoring"
                );
                continue;
            }
            out.push(pod);
        }
        out
    }
}

fn update(op: PodOperation, pods: Vec<Pod>, source: &str) -> PodUpdate {
    PodUpdate {
        op,
        pods,
        source: source.to_string(),
    }
}

fn record_first_seen_time(pod: &mut Pod) {
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_FIRST_SEEN_ANNOTATION.to_string(), now_rfc3339_nano());
}

/// The current time as Go's `time.RFC3339Nano` prints it in UTC.
pub(super) fn now_rfc3339_nano() -> String {
    super::now_timestamp().to_string()
}

fn is_local_annotation(key: &str) -> bool {
    LOCAL_ANNOTATIONS.contains(&key)
}

/// Equal except for the kubelet's own annotations.
fn annotations_equal(
    existing: Option<&BTreeMap<String, String>>,
    candidate: Option<&BTreeMap<String, String>>,
) -> bool {
    let empty = BTreeMap::new();
    let existing = existing.unwrap_or(&empty);
    let candidate = candidate.unwrap_or(&empty);
    let strip = |m: &BTreeMap<String, String>| -> Vec<(String, String)> {
        m.iter()
            .filter(|(k, _)| !is_local_annotation(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    strip(existing) == strip(candidate)
}

fn pods_differ_semantically(existing: &Pod, candidate: &Pod) -> bool {
    existing.spec != candidate.spec
        || existing.metadata.labels != candidate.metadata.labels
        || existing.metadata.deletion_timestamp != candidate.metadata.deletion_timestamp
        || existing.metadata.deletion_grace_period_seconds
            != candidate.metadata.deletion_grace_period_seconds
        || !annotations_equal(
            existing.metadata.annotations.as_ref(),
            candidate.metadata.annotations.as_ref(),
        )
}

/// Folds `candidate` into `existing` and classifies the change (upstream's
/// `checkAndUpdatePod`): a semantic change with a deletion timestamp is a graceful delete,
/// any other semantic change an update, a status-only change a reconcile.
fn check_and_update_pod(existing: &mut Pod, mut candidate: Pod) -> Change {
    if !pods_differ_semantically(existing, &candidate) {
        if existing.status != candidate.status {
            existing.status = candidate.status;
            return Change::Reconcile;
        }
        return Change::None;
    }
    existing.spec = candidate.spec.take();
    existing.metadata.labels = candidate.metadata.labels.take();
    existing.metadata.deletion_timestamp = candidate.metadata.deletion_timestamp.take();
    existing.metadata.deletion_grace_period_seconds =
        candidate.metadata.deletion_grace_period_seconds;
    existing.metadata.generation = candidate.metadata.generation;
    existing.status = candidate.status.take();
    // The candidate's annotations plus the kubelet's own, kept from the existing pod (so
    // the first-seen time survives updates).
    let mut annotations = candidate.metadata.annotations.take().unwrap_or_default();
    if let Some(old) = existing.metadata.annotations.as_ref() {
        for key in LOCAL_ANNOTATIONS {
            match old.get(key) {
                Some(v) => {
                    annotations.insert(key.to_string(), v.clone());
                }
                None if key == CONFIG_FIRST_SEEN_ANNOTATION => {
                    annotations.remove(key);
                }
                None => {}
            }
        }
    }
    existing.metadata.annotations = Some(annotations);
    if existing.metadata.deletion_timestamp.is_some() {
        Change::Delete
    } else {
        Change::Update
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod(uid: &str, name: &str, image: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    image: Some(image.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ops(updates: &[PodUpdate]) -> Vec<(PodOperation, Vec<String>)> {
        updates
            .iter()
            .map(|u| {
                (
                    u.op,
                    u.pods
                        .iter()
                        .map(|p| p.metadata.name.clone().unwrap_or_default())
                        .collect(),
                )
            })
            .collect()
    }

    fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }

    #[test]
    fn new_pods_are_added_with_source_and_first_seen() {
        let mut s = PodStorage::default();
        let out = s.merge_set("file", vec![pod("1", "a", "img:1"), pod("2", "b", "img:1")]);
        assert_eq!(
            ops(&out),
            vec![(PodOperation::Add, vec!["a".into(), "b".into()])]
        );
        let added = &out[0].pods[0];
        assert_eq!(annotation(added, CONFIG_SOURCE_ANNOTATION), Some("file"));
        let seen = annotation(added, CONFIG_FIRST_SEEN_ANNOTATION).unwrap_or_default();
        assert!(
            seen.parse::<k8s_openapi::jiff::Timestamp>().is_ok() && seen.ends_with('Z'),
            "config.seen {seen:?} is not RFC 3339 in UTC"
        );
        assert_eq!(out[0].source, "file");
    }

    #[test]
    fn first_empty_set_marks_the_source_ready_with_an_empty_add() {
        let mut s = PodStorage::default();
        assert!(!s.seen("http"));
        let out = s.merge_set("http", vec![]);
        assert_eq!(ops(&out), vec![(PodOperation::Add, vec![])]);
        assert!(s.seen("http"));
        // The second empty set is not news.
        assert!(s.merge_set("http", vec![]).is_empty());
    }

    #[test]
    fn an_unchanged_set_yields_nothing() {
        let mut s = PodStorage::default();
        s.merge_set("file", vec![pod("1", "a", "img:1")]);
        assert!(s.merge_set("file", vec![pod("1", "a", "img:1")]).is_empty());
    }

    #[test]
    fn spec_change_is_an_update_that_keeps_first_seen() {
        let mut s = PodStorage::default();
        let first = s.merge_set("api", vec![pod("1", "a", "img:1")]);
        let seen = annotation(&first[0].pods[0], CONFIG_FIRST_SEEN_ANNOTATION).map(str::to_string);
        let out = s.merge_set("api", vec![pod("1", "a", "img:2")]);
        assert_eq!(ops(&out), vec![(PodOperation::Update, vec!["a".into()])]);
        let updated = &out[0].pods[0];
        assert_eq!(
            updated.spec.as_ref().unwrap().containers[0]
                .image
                .as_deref(),
            Some("img:2")
        );
        assert_eq!(
            annotation(updated, CONFIG_FIRST_SEEN_ANNOTATION).map(str::to_string),
            seen
        );
    }

    #[test]
    fn label_and_annotation_changes_are_updates_but_local_annotations_are_not() {
        let mut s = PodStorage::default();
        s.merge_set("api", vec![pod("1", "a", "img:1")]);
        let mut p = pod("1", "a", "img:1");
        p.metadata.annotations = Some(BTreeMap::from([(
            CONFIG_MIRROR_ANNOTATION.to_string(),
            "x".to_string(),
        )]));
        assert!(s.merge_set("api", vec![p]).is_empty());
        let mut p = pod("1", "a", "img:1");
        p.metadata.labels = Some(BTreeMap::from([("app".to_string(), "x".to_string())]));
        assert_eq!(
            ops(&s.merge_set("api", vec![p.clone()])),
            vec![(PodOperation::Update, vec!["a".into()])]
        );
        p.metadata.annotations = Some(BTreeMap::from([("team".to_string(), "y".to_string())]));
        assert_eq!(
            ops(&s.merge_set("api", vec![p])),
            vec![(PodOperation::Update, vec!["a".into()])]
        );
    }

    #[test]
    fn status_only_change_is_a_reconcile() {
        let mut s = PodStorage::default();
        s.merge_set("api", vec![pod("1", "a", "img:1")]);
        let mut p = pod("1", "a", "img:1");
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        let out = s.merge_set("api", vec![p]);
        assert_eq!(ops(&out), vec![(PodOperation::Reconcile, vec!["a".into()])]);
        assert_eq!(
            out[0].pods[0].status.as_ref().unwrap().phase.as_deref(),
            Some("Running")
        );
    }

    #[test]
    fn deletion_timestamp_is_a_delete_and_absence_a_remove() {
        let mut s = PodStorage::default();
        s.merge_set("api", vec![pod("1", "a", "img:1"), pod("2", "b", "img:1")]);
        let mut p = pod("1", "a", "img:1");
        p.metadata.deletion_timestamp = Some(Time(crate::config::now_timestamp()));
        p.metadata.deletion_grace_period_seconds = Some(30);
        let out = s.merge_set("api", vec![p.clone(), pod("2", "b", "img:1")]);
        assert_eq!(ops(&out), vec![(PodOperation::Delete, vec!["a".into()])]);
        let out = s.merge_set("api", vec![p]);
        assert_eq!(ops(&out), vec![(PodOperation::Remove, vec!["b".into()])]);
    }

    #[test]
    fn updates_come_in_upstream_order() {
        let mut s = PodStorage::default();
        s.merge_set("api", vec![pod("1", "a", "img:1"), pod("2", "b", "img:1")]);
        let mut deleted = pod("2", "b", "img:1");
        deleted.metadata.deletion_timestamp = Some(Time(crate::config::now_timestamp()));
        let mut reconciled = pod("4", "d", "img:1");
        reconciled.status = Some(PodStatus::default());
        s.merge_set(
            "api",
            vec![
                pod("1", "a", "img:1"),
                pod("2", "b", "img:1"),
                pod("4", "d", "img:1"),
            ],
        );
        let out = s.merge_set(
            "api",
            vec![pod("2", "b", "img:1"), pod("3", "c", "img:1"), reconciled],
        );
        // a gone, c new, d status-only.
        assert_eq!(
            ops(&out),
            vec![
                (PodOperation::Remove, vec!["a".into()]),
                (PodOperation::Add, vec!["c".into()]),
                (PodOperation::Reconcile, vec!["d".into()]),
            ]
        );
        let out = s.merge_set(
            "api",
            vec![pod("5", "e", "img:1"), deleted, pod("3", "c", "img:2")],
        );
        assert_eq!(
            ops(&out),
            vec![
                (PodOperation::Remove, vec!["d".into()]),
                (PodOperation::Add, vec!["e".into()]),
                (PodOperation::Update, vec!["c".into()]),
                (PodOperation::Delete, vec!["b".into()]),
            ]
        );
    }

    #[test]
    fn duplicate_names_within_a_source_keep_the_first() {
        let mut s = PodStorage::default();
        let out = s.merge_set("file", vec![pod("1", "a", "img:1"), pod("2", "a", "img:2")]);
        assert_eq!(ops(&out), vec![(PodOperation::Add, vec!["a".into()])]);
        assert_eq!(out[0].pods[0].metadata.uid.as_deref(), Some("1"));
    }

    #[test]
    fn a_second_source_cannot_add_a_pod_another_source_has() {
        let mut s = PodStorage::default();
        s.merge_set("file", vec![pod("1", "a", "img:1")]);
        let out = s.merge_set("http", vec![pod("9", "a", "img:1"), pod("8", "b", "img:1")]);
        assert_eq!(ops(&out), vec![(PodOperation::Add, vec!["b".into()])]);
        // Once the first source drops it, the other may have it.
        s.merge_set("file", vec![]);
        let out = s.merge_set("http", vec![pod("9", "a", "img:1"), pod("8", "b", "img:1")]);
        assert_eq!(ops(&out), vec![(PodOperation::Add, vec!["a".into()])]);
    }

    /// A watch's single-pod updates give the same operations a SET with that change would.
    #[test]
    fn single_pod_updates_match_what_a_set_gives() {
        let mut s = PodStorage::default();
        s.merge("api", SourceUpdate::Set(vec![pod("1", "a", "img:1")]));
        let deleting = {
            let mut p = pod("1", "a", "img:1");
            p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            p
        };
        let with_status = {
            let mut p = pod("2", "b", "img:1");
            p.status = Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            });
            p
        };
        type Ops = Vec<(PodOperation, Vec<String>)>;
        let table: Vec<(SourceUpdate, Ops)> = vec![
            (
                SourceUpdate::Upsert(pod("2", "b", "img:1")),
                vec![(PodOperation::Add, vec!["b".into()])],
            ),
            (SourceUpdate::Upsert(pod("2", "b", "img:1")), vec![]),
            (
                SourceUpdate::Upsert(pod("2", "b", "img:2")),
                vec![(PodOperation::Update, vec!["b".into()])],
            ),
            (
                SourceUpdate::Upsert({
                    let mut p = with_status.clone();
                    p.spec.as_mut().unwrap().containers[0].image = Some("img:2".into());
                    p
                }),
                vec![(PodOperation::Reconcile, vec!["b".into()])],
            ),
            (
                SourceUpdate::Upsert(deleting),
                vec![(PodOperation::Delete, vec!["a".into()])],
            ),
            (
                SourceUpdate::Remove(pod("1", "a", "img:1")),
                vec![(PodOperation::Remove, vec!["a".into()])],
            ),
            (SourceUpdate::Remove(pod("1", "a", "img:1")), vec![]),
            // Another pod under a name the source already has is refused.
            (SourceUpdate::Upsert(pod("3", "b", "img:1")), vec![]),
        ];
        for (i, (u, want)) in table.into_iter().enumerate() {
            assert_eq!(ops(&s.merge("api", u)), want, "step {i}");
        }
        let kept: Vec<String> = s
            .all_pods()
            .iter()
            .map(|p| p.metadata.uid.clone().unwrap_or_default())
            .collect();
        assert_eq!(kept, vec!["2"]);
        let first_seen = annotation(&s.all_pods()[0], CONFIG_FIRST_SEEN_ANNOTATION).is_some();
        assert!(first_seen, "an upserted pod records when it was first seen");
    }

    #[test]
    fn a_single_pod_never_takes_a_name_another_source_provides() {
        let mut s = PodStorage::default();
        s.merge("file", SourceUpdate::Set(vec![pod("1", "a", "img:1")]));
        assert!(
            s.merge("api", SourceUpdate::Upsert(pod("9", "a", "img:1")))
                .is_empty()
        );
        assert!(s.seen("api"));
    }
}
