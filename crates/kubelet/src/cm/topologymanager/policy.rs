//! The topology manager's policies (upstream's policy*.go): how the hints of every provider
//! merge into one NUMA affinity, and whether the pod may run on it.
//!
//! The merge takes one hint per resource in every combination (the cross product), ANDs
//! their masks, marks the result preferred when every hint was preferred and their masks
//! equal, and keeps the best: preferred over not, then the narrowest mask (or, with
//! `prefer-closest-numa-nodes`, the one whose nodes are closest); among non-preferred
//! hints the one whose width is closest to the widest provider's narrowest need.

use super::TopologyHint;
use super::bitmask::{BitMask, and_all};
use super::numa_info::NumaInfo;
use std::collections::{BTreeMap, HashMap};

/// `prefer-closest-numa-nodes`.
pub const PREFER_CLOSEST_NUMA_NODES: &str = "prefer-closest-numa-nodes";
/// `max-allowable-numa-nodes`.
pub const MAX_ALLOWABLE_NUMA_NODES: &str = "max-allowable-numa-nodes";
/// upstream's defaultMaxAllowableNUMANodes.
pub const DEFAULT_MAX_ALLOWABLE_NUMA_NODES: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyName {
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

impl PolicyName {
    pub fn parse(s: &str) -> Result<PolicyName, String> {
        Ok(match s {
            "none" => PolicyName::None,
            "best-effort" => PolicyName::BestEffort,
            "restricted" => PolicyName::Restricted,
            "single-numa-node" => PolicyName::SingleNumaNode,
            _ => return Err(format!("unknown policy: \"{s}\"")),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::None => "none",
            PolicyName::BestEffort => "best-effort",
            PolicyName::Restricted => "restricted",
            PolicyName::SingleNumaNode => "single-numa-node",
        }
    }
}

/// upstream's PolicyOptions.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyOptions {
    pub prefer_closest_numa: bool,
    pub max_allowable_numa_nodes: usize,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        PolicyOptions {
            prefer_closest_numa: false,
            max_allowable_numa_nodes: DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
        }
    }
}

impl PolicyOptions {
    /// upstream's NewPolicyOptions, with its texts.
    pub fn parse(options: &BTreeMap<String, String>) -> Result<PolicyOptions, String> {
        let mut o = PolicyOptions::default();
        for (name, value) in options {
            match name.as_str() {
                PREFER_CLOSEST_NUMA_NODES => {
                    o.prefer_closest_numa = crate::cm::parse_go_bool(value).ok_or_else(|| {
                        format!(
                            "bad value for option {name:?}: strconv.ParseBool: parsing {value:?}: invalid syntax"
                        )
                    })?;
                }
                MAX_ALLOWABLE_NUMA_NODES => {
                    let v: usize = value.parse().map_err(|_| {
                        format!(
                            "unable to convert policy option to integer {name:?}: strconv.Atoi: parsing {value:?}: invalid syntax"
                        )
                    })?;
                    if v < DEFAULT_MAX_ALLOWABLE_NUMA_NODES {
                        return Err(format!(
                            "the minimum value of {name:?} should not be less than {DEFAULT_MAX_ALLOWABLE_NUMA_NODES}"
                        ));
                    }
                    // NUMA node sets are 64-bit masks here.
                    if v > 64 {
                        return Err(format!(
                            "the maximum value of {name:?} supported by this kubelet is 64"
                        ));
                    }
                    if v > DEFAULT_MAX_ALLOWABLE_NUMA_NODES {
                        tracing::warn!(
                            value = v,
                            "the value of max-allowable-numa-nodes is more than the default recommended value"
                        );
                    }
                    o.max_allowable_numa_nodes = v;
                }
                _ => return Err(format!("unknown Topology Manager Policy option: {name:?}")),
            }
        }
        Ok(o)
    }
}

/// A policy with what it merges against.
#[derive(Clone, Debug)]
pub struct Policy {
    pub name: PolicyName,
    pub numa: NumaInfo,
    pub opts: PolicyOptions,
}

impl Policy {
    /// upstream's Merge: the best hint and whether the pod is admitted with it.
    pub fn merge(&self, providers: &[HashMap<String, Vec<TopologyHint>>]) -> (TopologyHint, bool) {
        let any = TopologyHint {
            numa_node_affinity: None,
            preferred: false,
        };
        match self.name {
            PolicyName::None => (any, true),
            PolicyName::BestEffort => (self.merge_hints(filter_providers_hints(providers)), true),
            PolicyName::Restricted => {
                let best = self.merge_hints(filter_providers_hints(providers));
                let admit = best.preferred;
                (best, admit)
            }
            PolicyName::SingleNumaNode => {
                let filtered = filter_single_numa_hints(filter_providers_hints(providers));
                let mut best = self.merge_hints(filtered);
                if best.numa_node_affinity == Some(self.numa.default_affinity_mask()) {
                    best.numa_node_affinity = None;
                }
                let admit = best.preferred;
                (best, admit)
            }
        }
    }

    fn merge_hints(&self, hints: Vec<Vec<TopologyHint>>) -> TopologyHint {
        let default = self.numa.default_affinity_mask();
        let merger = Merger {
            policy: self,
            best_non_preferred_affinity_count: max_of_min_affinity_counts(&hints),
        };
        let mut best: Option<(BitMask, bool)> = None;
        iterate_permutations(&hints, &mut Vec::new(), &mut |perm| {
            let candidate = merge_permutation(default, perm);
            best = merger.compare(best, candidate);
        });
        let (mask, preferred) = best.unwrap_or((default, false));
        TopologyHint {
            numa_node_affinity: Some(mask),
            preferred,
        }
    }
}

/// One list of hints per resource of every provider (upstream's filterProvidersHints): a
/// provider without hints, or a resource without a list, has no preference (any NUMA node,
/// preferred); a resource with an empty list cannot be placed (any NUMA node, not preferred).
pub fn filter_providers_hints(
    providers: &[HashMap<String, Vec<TopologyHint>>],
) -> Vec<Vec<TopologyHint>> {
    let mut all = Vec::new();
    for hints in providers {
        if hints.is_empty() {
            all.push(vec![TopologyHint {
                numa_node_affinity: None,
                preferred: true,
            }]);
            continue;
        }
        // Sorted so that merges (and their ties) do not depend on map order.
        let mut names: Vec<&String> = hints.keys().collect();
        names.sort();
        for name in names {
            let h = &hints[name];
            if h.is_empty() {
                all.push(vec![TopologyHint {
                    numa_node_affinity: None,
                    preferred: false,
                }]);
            } else {
                all.push(h.clone());
            }
        }
    }
    all
}

/// Only "don't care" hints and preferred single-node hints (upstream's filterSingleNumaHints).
fn filter_single_numa_hints(all: Vec<Vec<TopologyHint>>) -> Vec<Vec<TopologyHint>> {
    all.into_iter()
        .map(|hints| {
            hints
                .into_iter()
                .filter(|h| h.preferred && h.numa_node_affinity.is_none_or(|m| m.count() == 1))
                .collect()
        })
        .collect()
}

fn merge_permutation(default: BitMask, perm: &[&TopologyHint]) -> (BitMask, bool) {
    let mut preferred = true;
    let mut masks = vec![default];
    let mut first: Option<BitMask> = None;
    for h in perm {
        if let Some(m) = h.numa_node_affinity {
            masks.push(m);
            if *first.get_or_insert(m) != m {
                preferred = false;
            }
        }
        if !h.preferred {
            preferred = false;
        }
    }
    (and_all(&masks), preferred)
}

fn iterate_permutations<'a>(
    all: &'a [Vec<TopologyHint>],
    acc: &mut Vec<&'a TopologyHint>,
    f: &mut dyn FnMut(&[&TopologyHint]),
) {
    let i = acc.len();
    if i == all.len() {
        f(acc);
        return;
    }
    for h in &all[i] {
        acc.push(h);
        iterate_permutations(all, acc, f);
        acc.pop();
    }
}

fn narrowest_hint(hints: &[TopologyHint]) -> Option<BitMask> {
    let mut best: Option<BitMask> = None;
    for m in hints.iter().filter_map(|h| h.numa_node_affinity) {
        if best.is_none_or(|b| m.is_narrower_than(b)) {
            best = Some(m);
        }
    }
    best
}

fn max_of_min_affinity_counts(all: &[Vec<TopologyHint>]) -> usize {
    all.iter()
        .filter_map(|h| narrowest_hint(h))
        .map(BitMask::count)
        .max()
        .unwrap_or(0)
}

struct Merger<'a> {
    policy: &'a Policy,
    best_non_preferred_affinity_count: usize,
}

impl Merger<'_> {
    fn fitter(&self, current: BitMask, candidate: BitMask) -> BitMask {
        if current == candidate {
            return current;
        }
        if self.policy.name != PolicyName::SingleNumaNode && self.policy.opts.prefer_closest_numa {
            self.policy.numa.closest(current, candidate)
        } else {
            self.policy.numa.narrowest(current, candidate)
        }
    }

    /// upstream's HintMerger.compare, case for case.
    fn compare(
        &self,
        current: Option<(BitMask, bool)>,
        candidate: (BitMask, bool),
    ) -> Option<(BitMask, bool)> {
        let (cand, cand_pref) = candidate;
        if cand.count() == 0 {
            return current;
        }
        let Some((cur, cur_pref)) = current else {
            return Some(candidate);
        };
        let pick = |m: BitMask| {
            if m == cur { current } else { Some(candidate) }
        };
        match (cur_pref, cand_pref) {
            (false, true) => return Some(candidate),
            (true, false) => return current,
            (true, true) => return pick(self.fitter(cur, cand)),
            (false, false) => {}
        }
        let best = self.best_non_preferred_affinity_count;
        let (cur_n, cand_n) = (cur.count(), cand.count());
        if cur_n > best {
            return pick(self.fitter(cur, cand));
        }
        if cur_n == best {
            if cand_n != best {
                return current;
            }
            return pick(self.fitter(cur, cand));
        }
        if cand_n > best {
            return current;
        }
        if cand_n == best {
            return Some(candidate);
        }
        if cand_n > cur_n {
            return Some(candidate);
        }
        if cand_n < cur_n {
            return current;
        }
        pick(self.fitter(cur, cand))
    }
}

#[cfg(test)]
mod tests;
