//! The Deployment controller's arithmetic and bookkeeping (upstream's deployment/util):
//! int-or-percent resolution and the surge/unavailable fenceposts, the new ReplicaSet's
//! next size, how far old sets may be scaled down, proportional scaling, the template
//! hash and the revision annotations. Everything here is pure.

use std::cmp::Ordering;

use serde_json::{Value, json};

pub(crate) const REVISION: &str = "deployment.kubernetes.io/revision";
pub(crate) const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
pub(crate) const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
pub(crate) const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
pub(crate) const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// Deployment annotations never copied to its ReplicaSets (upstream's annotationsToSkip).
const SKIPPED_ANNOTATIONS: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    REVISION_HISTORY,
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    "deprecated.deployment.rollback.to",
];

/// A Deployment's `spec.strategy`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Strategy {
    Recreate,
    RollingUpdate {
        max_surge: Value,
        max_unavailable: Value,
    },
}

impl Strategy {
    pub(crate) fn of(d: &Value) -> Strategy {
        match d.pointer("/spec/strategy/type").and_then(Value::as_str) {
            Some("Recreate") => Strategy::Recreate,
            _ => Strategy::RollingUpdate {
                max_surge: d
                    .pointer("/spec/strategy/rollingUpdate/maxSurge")
                    .cloned()
                    .unwrap_or(json!("25%")),
                max_unavailable: d
                    .pointer("/spec/strategy/rollingUpdate/maxUnavailable")
                    .cloned()
                    .unwrap_or(json!("25%")),
            },
        }
    }
}

/// Upstream's GetScaledValueFromIntOrPercent: an integer as is, `N%` of `total` rounded
/// up or down. Anything else counts as 0 (validation refuses it).
pub(crate) fn scaled_value(v: &Value, total: i64, round_up: bool) -> i64 {
    match v {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::String(s) => {
            let Some(p) = s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) else {
                return 0;
            };
            let x = p * total;
            if round_up {
                (x + 99).div_euclid(100)
            } else {
                x.div_euclid(100)
            }
        }
        _ => 0,
    }
}

/// Upstream's ResolveFenceposts: (maxSurge, maxUnavailable) for `desired` replicas;
/// both 0 makes maxUnavailable 1, else a rollout could never make progress.
pub(crate) fn resolve_fenceposts(surge: &Value, unavailable: &Value, desired: i64) -> (i64, i64) {
    let s = scaled_value(surge, desired, true);
    let u = scaled_value(unavailable, desired, false);
    if s == 0 && u == 0 { (0, 1) } else { (s, u) }
}

/// Upstream's MaxSurge.
pub(crate) fn max_surge(strategy: &Strategy, replicas: i64) -> i64 {
    match strategy {
        Strategy::Recreate => 0,
        Strategy::RollingUpdate {
            max_surge,
            max_unavailable,
        } => resolve_fenceposts(max_surge, max_unavailable, replicas).0,
    }
}

/// Upstream's MaxUnavailable (never more than the replicas).
pub(crate) fn max_unavailable(strategy: &Strategy, replicas: i64) -> i64 {
    match strategy {
        Strategy::Recreate => 0,
        _ if replicas == 0 => 0,
        Strategy::RollingUpdate {
            max_surge,
            max_unavailable,
        } => resolve_fenceposts(max_surge, max_unavailable, replicas)
            .1
            .min(replicas),
    }
}

/// Upstream's NewRSNewReplicas for a rolling update: grow the new set as far as the
/// surge allows. `current` is the sum of every set's spec.replicas.
pub(crate) fn new_rs_new_replicas(
    strategy: &Strategy,
    replicas: i64,
    current: i64,
    new_rs_replicas: i64,
) -> i64 {
    match strategy {
        Strategy::Recreate => replicas,
        Strategy::RollingUpdate { .. } => {
            let max_total = replicas + max_surge(strategy, replicas);
            if current >= max_total {
                return new_rs_replicas;
            }
            let up = (max_total - current).min(replicas - new_rs_replicas);
            new_rs_replicas + up.max(0)
        }
    }
}

/// reconcileOldReplicaSets' maxScaledDown: how many old pods may go while keeping
/// `replicas - maxUnavailable` available, counting the new set's unavailable pods.
pub(crate) fn max_scaled_down(
    all_pods: i64,
    replicas: i64,
    max_unavailable: i64,
    new_spec: i64,
    new_available: i64,
) -> i64 {
    let min_available = replicas - max_unavailable;
    let new_unavailable = new_spec - new_available;
    all_pods - min_available - new_unavailable
}

/// One ReplicaSet as proportional scaling sees it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SetSize {
    pub replicas: i64,
    /// The `max-replicas` annotation, when set.
    pub max_replicas: Option<i64>,
    /// Creation time (unix seconds) and name, for the tie-breaking sort.
    pub created: i64,
    pub name: String,
}

/// Upstream's getReplicaSetFraction.
fn fraction(rs: &SetSize, d_replicas: i64, d_max: i64, d_status_replicas: i64) -> i64 {
    if d_replicas == 0 {
        return -rs.replicas;
    }
    let annotated = rs.max_replicas.unwrap_or(d_status_replicas);
    if annotated == 0 {
        return 0;
    }
    let size = (rs.replicas * d_max) as f64 / annotated as f64;
    size.round() as i64 - rs.replicas
}

/// Upstream's proportional scaling in `scale()`: the deployment was resized during a
/// rollout; spread the difference over the active sets in proportion to their size,
/// the leftover going to the largest. Returns the new size of each set, in input order.
pub(crate) fn proportional_sizes(
    sets: &[SetSize],
    d_replicas: i64,
    max_surge: i64,
    d_status_replicas: i64,
) -> Vec<i64> {
    let total: i64 = sets.iter().map(|s| s.replicas).sum();
    let allowed = if d_replicas > 0 {
        d_replicas + max_surge
    } else {
        0
    };
    let to_add = allowed - total;
    let mut order: Vec<usize> = (0..sets.len()).collect();
    // Bigger first; ties: newer first when growing, older first when shrinking.
    order.sort_by(|&a, &b| {
        let (x, y) = (&sets[a], &sets[b]);
        y.replicas.cmp(&x.replicas).then_with(|| {
            let by_age = x.created.cmp(&y.created).then(x.name.cmp(&y.name));
            if to_add > 0 { by_age.reverse() } else { by_age }
        })
    });
    let mut sizes: Vec<i64> = sets.iter().map(|s| s.replicas).collect();
    if to_add == 0 {
        return sizes;
    }
    let mut added = 0;
    for &ix in &order {
        let rs = &sets[ix];
        let p = if rs.replicas == 0 || to_add == added {
            0
        } else {
            let f = fraction(rs, d_replicas, allowed, d_status_replicas);
            let left = to_add - added;
            if to_add > 0 { f.min(left) } else { f.max(left) }
        };
        sizes[ix] = rs.replicas + p;
        added += p;
    }
    if let Some(&first) = order.first() {
        sizes[first] = (sizes[first] + to_add - added).max(0);
    }
    sizes
}

/// Upstream's ComputeHash: fnv-32a of the template (here its canonical JSON) and the
/// collision count, its decimal digits mapped onto the safe alphabet.
pub(crate) fn compute_hash(template: &Value, collision_count: Option<i64>) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut h: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    feed(
        serde_json::to_string(template)
            .unwrap_or_default()
            .as_bytes(),
    );
    if let Some(c) = collision_count {
        feed(&(c as u32).to_le_bytes());
    }
    h.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// Upstream's EqualIgnoreHash: two templates equal but for the pod-template-hash label.
pub(crate) fn equal_ignore_hash(a: &Value, b: &Value) -> bool {
    fn strip(t: &Value) -> Value {
        let mut t = t.clone();
        if let Some(l) = t
            .pointer_mut("/metadata/labels")
            .and_then(Value::as_object_mut)
        {
            l.remove(POD_TEMPLATE_HASH);
            if l.is_empty()
                && let Some(m) = t["metadata"].as_object_mut()
            {
                m.remove("labels");
            }
        }
        if let Some(m) = t.get_mut("metadata").and_then(Value::as_object_mut)
            && m.is_empty()
        {
            t.as_object_mut().map(|o| o.remove("metadata"));
        }
        t
    }
    strip(a) == strip(b)
}

pub(crate) fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")?.get(key)?.as_str()
}

/// A set's revision (0 when unset or unparsable).
pub(crate) fn revision(obj: &Value) -> i64 {
    annotation(obj, REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn set_annotation(obj: &mut Value, key: &str, val: &str) -> bool {
    if annotation(obj, key) == Some(val) {
        return false;
    }
    if !obj["metadata"]["annotations"].is_object() {
        obj["metadata"]["annotations"] = json!({});
    }
    obj["metadata"]["annotations"][key] = json!(val);
    true
}

/// Upstream's SetReplicasAnnotations.
pub(crate) fn set_replicas_annotations(rs: &mut Value, desired: i64, max: i64) -> bool {
    let a = set_annotation(rs, DESIRED_REPLICAS, &desired.to_string());
    let b = set_annotation(rs, MAX_REPLICAS, &max.to_string());
    a || b
}

/// Upstream's SetNewReplicaSetAnnotations: the deployment's own annotations, the new
/// revision (the old one moved to `revision-history`), and, when `replicas_too`, the
/// desired and max replicas.
pub(crate) fn set_new_rs_annotations(
    d: &Value,
    rs: &mut Value,
    new_revision: i64,
    replicas_too: bool,
    max_surge: i64,
) -> bool {
    let mut changed = false;
    if let Some(m) = d
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        for (k, v) in m {
            if SKIPPED_ANNOTATIONS.contains(&k.as_str()) {
                continue;
            }
            if let Some(v) = v.as_str() {
                changed |= set_annotation(rs, k, v);
            }
        }
    }
    let old = annotation(rs, REVISION).map(str::to_string);
    let old_n: i64 = old.as_deref().and_then(|o| o.parse().ok()).unwrap_or(0);
    if old_n < new_revision {
        changed |= set_annotation(rs, REVISION, &new_revision.to_string());
        if let Some(o) = old.filter(|o| !o.is_empty()) {
            let hist = match annotation(rs, REVISION_HISTORY) {
                Some(h) if !h.is_empty() => format!("{h},{o}"),
                _ => o,
            };
            changed |= set_annotation(rs, REVISION_HISTORY, &hist);
        }
    }
    if replicas_too {
        let replicas = d
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        changed |= set_replicas_annotations(rs, replicas, replicas + max_surge);
    }
    changed
}

/// Upstream's SetDeploymentRevision.
pub(crate) fn set_deployment_revision(d: &mut Value, rev: &str) -> bool {
    set_annotation(d, REVISION, rev)
}

/// ReplicaSetsByCreationTimestamp: oldest first, then by name.
pub(crate) fn by_creation(a: (i64, &str), b: (i64, &str)) -> Ordering {
    a.0.cmp(&b.0).then(a.1.cmp(b.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rolling(surge: Value, unavailable: Value) -> Strategy {
        Strategy::RollingUpdate {
            max_surge: surge,
            max_unavailable: unavailable,
        }
    }

    #[test]
    fn percent_rounding_and_fenceposts() {
        // (maxSurge, maxUnavailable, desired) → (surge, unavailable)
        let table = [
            (json!("25%"), json!("25%"), 10, (3, 2)),
            (json!("25%"), json!("25%"), 1, (1, 0)),
            (json!("25%"), json!("25%"), 3, (1, 0)),
            (json!(0), json!(0), 3, (0, 1)),
            (json!("0%"), json!("10%"), 5, (0, 1)),
            (json!(2), json!("50%"), 5, (2, 2)),
            (json!("100%"), json!(0), 4, (4, 0)),
        ];
        for (s, u, d, want) in table {
            assert_eq!(resolve_fenceposts(&s, &u, d), want, "{s} {u} {d}");
        }
        assert_eq!(max_unavailable(&rolling(json!(0), json!(10)), 3), 3);
        assert_eq!(max_unavailable(&rolling(json!(1), json!(1)), 0), 0);
        assert_eq!(max_surge(&Strategy::Recreate, 3), 0);
    }

    #[test]
    fn new_replica_set_growth() {
        let r = rolling(json!("25%"), json!("25%"));
        // (replicas, sum of all sets, new set) → new set's size
        for (replicas, current, new, want) in [
            (4, 4, 0, 1),   // surge 1: one new pod
            (4, 5, 1, 1),   // at the surge limit
            (10, 10, 0, 3), // surge 3
            (10, 12, 3, 4),
            (2, 0, 0, 2), // fresh deployment
            (3, 3, 3, 3), // done
        ] {
            assert_eq!(
                new_rs_new_replicas(&r, replicas, current, new),
                want,
                "{replicas} {current} {new}"
            );
        }
        assert_eq!(new_rs_new_replicas(&Strategy::Recreate, 5, 9, 0), 5);
    }

    #[test]
    fn old_sets_scale_down_budget() {
        // (all pods, replicas, maxUnavailable, new spec, new available) → max scaled down
        for (all, replicas, mu, ns, na, want) in [
            (5, 4, 1, 1, 0, 1), // new pod not available yet: one old may go
            (5, 4, 0, 1, 0, 0), // maxUnavailable 0: wait for the new pod
            (5, 4, 0, 1, 1, 1),
            (4, 4, 1, 0, 0, 1),
            (6, 4, 1, 3, 1, 1),
        ] {
            assert_eq!(max_scaled_down(all, replicas, mu, ns, na), want);
        }
    }

    fn set(name: &str, replicas: i64, max: Option<i64>, created: i64) -> SetSize {
        SetSize {
            replicas,
            max_replicas: max,
            created,
            name: name.into(),
        }
    }

    #[test]
    fn proportional_scaling() {
        // Mid-rollout 10 → 15 (surge 3 → 4): old 8, new 5 (annotated max 13) grow to
        // 19 in proportion: 8*19/13 = 11.7 → 12, 5*19/13 = 7.3 → 7.
        let sets = [set("old", 8, Some(13), 1), set("new", 5, Some(13), 2)];
        assert_eq!(proportional_sizes(&sets, 15, 4, 13), vec![12, 7]);
        // Scaled down 10 → 5 (surge 2 → 7 allowed): 6 old, 7 new (max 13).
        let sets = [set("old", 6, Some(13), 1), set("new", 7, Some(13), 2)];
        let got = proportional_sizes(&sets, 5, 2, 13);
        assert_eq!(got.iter().sum::<i64>(), 7);
        assert_eq!(got, vec![3, 4]);
        // To zero: every set to zero.
        let sets = [set("a", 3, Some(4), 1), set("b", 1, Some(4), 2)];
        assert_eq!(proportional_sizes(&sets, 0, 0, 4), vec![0, 0]);
        // Nothing to add: sizes kept.
        let sets = [set("a", 3, None, 1), set("b", 2, None, 2)];
        assert_eq!(proportional_sizes(&sets, 4, 1, 5), vec![3, 2]);
        // Leftover goes to the biggest set (ties: the newer when growing).
        let sets = [set("a", 1, Some(2), 1), set("b", 1, Some(2), 2)];
        assert_eq!(proportional_sizes(&sets, 3, 0, 2), vec![1, 2]);
    }

    #[test]
    fn hash_is_stable_and_collision_aware() {
        let t = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        let h = compute_hash(&t, None);
        assert_eq!(h, compute_hash(&t.clone(), None));
        assert_ne!(h, compute_hash(&t, Some(1)));
        assert_ne!(h, compute_hash(&json!({"spec": {}}), None));
        assert!(
            h.bytes()
                .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b))
        );
        let mut hashed = t.clone();
        hashed["metadata"]["labels"][POD_TEMPLATE_HASH] = json!(h);
        assert!(equal_ignore_hash(&t, &hashed));
        hashed["spec"]["containers"][0]["image"] = json!("nginx");
        assert!(!equal_ignore_hash(&t, &hashed));
    }

    #[test]
    fn revision_annotations() {
        let d = json!({"metadata": {"annotations": {"kubernetes.io/change-cause": "x",
            "kubectl.kubernetes.io/last-applied-configuration": "{}"}}, "spec": {"replicas": 4}});
        let mut rs = json!({"metadata": {"annotations": {REVISION: "1"}}});
        assert!(set_new_rs_annotations(&d, &mut rs, 3, true, 1));
        assert_eq!(annotation(&rs, REVISION), Some("3"));
        assert_eq!(annotation(&rs, REVISION_HISTORY), Some("1"));
        assert_eq!(annotation(&rs, DESIRED_REPLICAS), Some("4"));
        assert_eq!(annotation(&rs, MAX_REPLICAS), Some("5"));
        assert_eq!(annotation(&rs, "kubernetes.io/change-cause"), Some("x"));
        assert_eq!(
            annotation(&rs, "kubectl.kubernetes.io/last-applied-configuration"),
            None
        );
        assert!(!set_new_rs_annotations(&d, &mut rs, 3, true, 1));
        set_new_rs_annotations(&d, &mut rs, 5, false, 1);
        assert_eq!(annotation(&rs, REVISION_HISTORY), Some("1,3"));
    }
}
