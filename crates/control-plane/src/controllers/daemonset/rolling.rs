//! The RollingUpdate strategy (upstream's daemon/update.go `rollingUpdate`): how many nodes
//! may be without an available daemon pod (maxUnavailable) or run an extra new one beside
//! the old (maxSurge), and, node by node, which old pods to delete and where to surge.

use std::collections::BTreeMap;

use serde_json::Value;

/// Upstream's GetScaledValueFromIntOrPercent: an integer as is, `"N%"` of `total` rounded
/// up or down; anything else is not a value.
pub(crate) fn scaled(v: Option<&Value>, total: i64, round_up: bool) -> Option<i64> {
    match v {
        None | Some(Value::Null) => Some(0),
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => {
            let pct: i64 = s.strip_suffix('%')?.parse().ok()?;
            let x = pct * total;
            Some(if round_up {
                (x + 99).div_euclid(100)
            } else {
                x.div_euclid(100)
            })
        }
        _ => None,
    }
}

/// (maxSurge, maxUnavailable) for `desired` nodes, both rounded up; a DaemonSet that
/// allows neither still updates one node at a time (upstream's guard against 0/0).
pub(crate) fn budget(ds: &Value, desired: i64) -> Option<(i64, i64)> {
    if ds
        .pointer("/spec/updateStrategy/type")
        .and_then(Value::as_str)
        != Some("RollingUpdate")
    {
        return Some((0, 0));
    }
    let ru = ds.pointer("/spec/updateStrategy/rollingUpdate");
    let surge = scaled(ru.and_then(|r| r.get("maxSurge")), desired, true)?;
    let mut unavailable = scaled(ru.and_then(|r| r.get("maxUnavailable")), desired, true)?;
    if desired > 0 && surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Some((surge, unavailable))
}

/// The one new and one old pod on a node (pods being deleted left out); None when a node
/// has two of either kind, which the manage pass sorts out first.
fn updated_and_old<'a>(
    pods: &[&'a Value],
    is_updated: &dyn Fn(&Value) -> bool,
) -> Option<(Option<&'a Value>, Option<&'a Value>)> {
    let (mut new, mut old) = (None, None);
    for p in pods.iter().filter(|p| !super::pods::deleting(p)) {
        let slot = if is_updated(p) { &mut new } else { &mut old };
        if slot.is_some() {
            return None;
        }
        *slot = Some(*p);
    }
    Some((new, old))
}

/// What one rolling-update pass does.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Old pods to delete (their nodes then get a new one from the manage pass).
    pub delete: Vec<String>,
    /// Nodes to surge a new pod onto beside the old one.
    pub create_on: Vec<String>,
}

fn name(p: &Value) -> String {
    p.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// One pass over `nodes` (every node that should run a pod, with its pods, possibly none).
/// Without surge: old pods are deleted while fewer than maxUnavailable nodes lack an
/// available pod, an unavailable old pod always. With surge: a new pod is started beside
/// an old one on up to maxSurge nodes at once (always where the old one is unavailable),
/// and the old one is deleted once the new one is available.
pub(crate) fn plan(
    nodes: &BTreeMap<String, Vec<&Value>>,
    max_surge: i64,
    max_unavailable: i64,
    is_updated: &dyn Fn(&Value) -> bool,
    is_available: &dyn Fn(&Value) -> bool,
) -> Plan {
    let mut out = Plan::default();
    if max_surge == 0 {
        let mut unavailable = 0;
        let mut replace = Vec::new();
        let mut candidates = Vec::new();
        for pods in nodes.values() {
            match updated_and_old(pods, is_updated) {
                None | Some((None, None)) | Some((Some(_), Some(_))) => unavailable += 1,
                Some((Some(new), None)) => {
                    if !is_available(new) {
                        unavailable += 1;
                    }
                }
                Some((None, Some(old))) => {
                    if !is_available(old) {
                        replace.push(name(old));
                    } else if unavailable < max_unavailable {
                        candidates.push(name(old));
                    }
                }
            }
        }
        let room = (max_unavailable - unavailable).clamp(0, candidates.len() as i64) as usize;
        out.delete = replace;
        out.delete.extend(candidates.into_iter().take(room));
        return out;
    }
    let mut surging = 0;
    let mut replace = Vec::new();
    let mut candidates = Vec::new();
    for (node, pods) in nodes {
        match updated_and_old(pods, is_updated) {
            None | Some((_, None)) => {}
            Some((None, Some(old))) => {
                if !is_available(old) {
                    replace.push(node.clone());
                } else if surging < max_surge {
                    candidates.push(node.clone());
                }
            }
            Some((Some(new), Some(old))) => {
                if is_available(new) {
                    out.delete.push(name(old));
                } else {
                    surging += 1;
                }
            }
        }
    }
    let room = (max_surge - surging).clamp(0, candidates.len() as i64) as usize;
    out.create_on = replace;
    out.create_on.extend(candidates.into_iter().take(room));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn int_or_percent_scaling() {
        let cases: &[(Value, i64, bool, Option<i64>)] = &[
            (json!(1), 10, true, Some(1)),
            (json!("10%"), 10, true, Some(1)),
            (json!("10%"), 15, true, Some(2)),
            (json!("10%"), 15, false, Some(1)),
            (json!("0%"), 15, true, Some(0)),
            (json!("100%"), 3, true, Some(3)),
            (json!("25%"), 0, true, Some(0)),
            (json!("ten"), 10, true, None),
            (Value::Null, 10, true, Some(0)),
        ];
        for (v, total, up, want) in cases {
            assert_eq!(scaled(Some(v), *total, *up), *want, "{v} of {total}");
        }
    }

    #[test]
    fn budgets_as_upstream() {
        let ds = |ru: Value| json!({"spec": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": ru}}});
        type Case = (Value, i64, Option<(i64, i64)>);
        let cases: &[Case] = &[
            (json!({"maxUnavailable": 1, "maxSurge": 0}), 5, Some((0, 1))),
            (
                json!({"maxUnavailable": "30%", "maxSurge": 0}),
                5,
                Some((0, 2)),
            ),
            (
                json!({"maxUnavailable": 0, "maxSurge": "20%"}),
                6,
                Some((2, 0)),
            ),
            (json!({"maxUnavailable": 0, "maxSurge": 0}), 3, Some((0, 1))),
            (json!({"maxUnavailable": 0, "maxSurge": 0}), 0, Some((0, 0))),
            (json!({"maxUnavailable": "x"}), 3, None),
        ];
        for (ru, desired, want) in cases {
            assert_eq!(
                budget(&ds(ru.clone()), *desired),
                *want,
                "{ru} of {desired}"
            );
        }
        let on_delete = json!({"spec": {"updateStrategy": {"type": "OnDelete"}}});
        assert_eq!(budget(&on_delete, 4), Some((0, 0)));
    }

    fn pod(name: &str, new: bool, available: bool) -> Value {
        json!({"metadata": {"name": name}, "new": new, "available": available})
    }

    fn run(nodes: &[(&str, Vec<Value>)], surge: i64, unavailable: i64) -> Plan {
        let map: BTreeMap<String, Vec<&Value>> = nodes
            .iter()
            .map(|(n, pods)| (n.to_string(), pods.iter().collect()))
            .collect();
        plan(&map, surge, unavailable, &|p| p["new"] == true, &|p| {
            p["available"] == true
        })
    }

    #[test]
    fn without_surge_old_pods_go_within_max_unavailable() {
        let old = |n: &str| pod(n, false, true);
        // Three old available pods, one at a time.
        let p = run(
            &[
                ("a", vec![old("pa")]),
                ("b", vec![old("pb")]),
                ("c", vec![old("pc")]),
            ],
            0,
            1,
        );
        assert_eq!(p.delete, ["pa"]);
        // Two at a time.
        let p = run(
            &[
                ("a", vec![old("pa")]),
                ("b", vec![old("pb")]),
                ("c", vec![old("pc")]),
            ],
            0,
            2,
        );
        assert_eq!(p.delete, ["pa", "pb"]);
        // A new pod still starting uses up the budget.
        let p = run(
            &[("a", vec![pod("na", true, false)]), ("b", vec![old("pb")])],
            0,
            1,
        );
        assert_eq!(p.delete, Vec::<String>::new());
        // A node with no pod yet counts as unavailable.
        let p = run(&[("a", vec![]), ("b", vec![old("pb")])], 0, 1);
        assert_eq!(p.delete, Vec::<String>::new());
        // An unavailable old pod is always replaced.
        let p = run(
            &[
                ("a", vec![pod("na", true, false)]),
                ("b", vec![pod("pb", false, false)]),
                ("c", vec![old("pc")]),
            ],
            0,
            1,
        );
        assert_eq!(p.delete, ["pb"]);
        // Done: nothing to do.
        let p = run(&[("a", vec![pod("na", true, true)])], 0, 1);
        assert_eq!(p, Plan::default());
    }

    #[test]
    fn with_surge_new_pods_start_beside_old_ones() {
        let old = |n: &str| pod(n, false, true);
        let p = run(
            &[
                ("a", vec![old("pa")]),
                ("b", vec![old("pb")]),
                ("c", vec![old("pc")]),
            ],
            1,
            0,
        );
        assert_eq!(p.create_on, ["a"]);
        assert!(p.delete.is_empty());
        // While a's new pod starts, nothing else surges.
        let p = run(
            &[
                ("a", vec![old("pa"), pod("na", true, false)]),
                ("b", vec![old("pb")]),
            ],
            1,
            0,
        );
        assert_eq!(p, Plan::default());
        // Once it is available the old one goes and the next node surges.
        let p = run(
            &[
                ("a", vec![old("pa"), pod("na", true, true)]),
                ("b", vec![old("pb")]),
            ],
            1,
            0,
        );
        assert_eq!(p.delete, ["pa"]);
        assert_eq!(p.create_on, ["b"]);
        // An unavailable old pod is surged past the budget.
        let p = run(
            &[
                ("a", vec![old("pa"), pod("na", true, false)]),
                ("b", vec![pod("pb", false, false)]),
            ],
            1,
            0,
        );
        assert_eq!(p.create_on, ["b"]);
    }
}
