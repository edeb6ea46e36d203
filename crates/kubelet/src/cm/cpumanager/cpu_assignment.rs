//! Which CPUs an exclusive allocation takes (upstream's cpu_assignment.go): whole NUMA
//! nodes and sockets when the request covers them, then whole cores, then single threads
//! filling partly used cores first — always from the units with the fewest free CPUs, so
//! allocations pack and leave whole cores, sockets and NUMA nodes free for later ones.
//! `distribute-cpus-across-numa` spreads a request evenly over the fewest NUMA nodes that
//! can balance it, leaving the free CPUs of the NUMA nodes as even as possible.

use crate::cm::cpuset::CpuSet;
use crate::cm::topology::{CpuDetails, CpuTopology};
use std::collections::BTreeSet;

/// Why no CPUs could be taken (upstream's texts).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TakeError {
    #[error(
        "not enough cpus available to satisfy request: requested={requested}, available={available}"
    )]
    NotEnough { requested: usize, available: usize },
    #[error("failed to allocate cpus")]
    Failed,
    #[error("accounting error, not enough CPUs allocated, remaining: {0}")]
    Accounting(usize),
}

/// A level of the CPU topology whose groups can be taken whole.
#[derive(Clone, Copy)]
enum Level {
    NumaNode,
    Socket,
    Core,
}

struct Accumulator<'a> {
    topo: &'a CpuTopology,
    /// The CPUs still available.
    details: CpuDetails,
    needed: usize,
    result: CpuSet,
    /// NUMA nodes hold sockets (or map 1:1): take whole NUMA nodes before sockets.
    numa_first: bool,
}

fn ids(details: &CpuDetails, f: impl Fn(&crate::cm::topology::CpuInfo) -> usize) -> Vec<usize> {
    ids_where(details, |_| true, f)
}

/// The distinct ids `f` gives the CPUs `inside` keeps (the cores of one socket, say).
fn ids_where(
    details: &CpuDetails,
    inside: impl Fn(&crate::cm::topology::CpuInfo) -> bool,
    f: impl Fn(&crate::cm::topology::CpuInfo) -> usize,
) -> Vec<usize> {
    details
        .values()
        .filter(|i| inside(i))
        .map(f)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

impl<'a> Accumulator<'a> {
    fn new(topo: &'a CpuTopology, available: &CpuSet, needed: usize) -> Accumulator<'a> {
        let details = topo
            .details
            .iter()
            .filter(|(c, _)| available.contains(**c))
            .map(|(c, i)| (*c, *i))
            .collect();
        Accumulator {
            topo,
            details,
            needed,
            result: CpuSet::default(),
            numa_first: topo.num_sockets >= topo.num_numa_nodes,
        }
    }

    fn count(&self, f: impl Fn(&crate::cm::topology::CpuInfo) -> bool) -> usize {
        self.details.values().filter(|i| f(i)).count()
    }

    fn avail_in_numa(&self, n: usize) -> usize {
        self.count(|i| i.numa_node_id == n)
    }
    fn avail_in_socket(&self, s: usize) -> usize {
        self.count(|i| i.socket_id == s)
    }
    fn avail_in_core(&self, c: usize) -> usize {
        self.count(|i| i.core_id == c)
    }

    /// Fewest available CPUs first, then lowest id (upstream's sort).
    fn sort(&self, mut v: Vec<usize>, avail: impl Fn(usize) -> usize) -> Vec<usize> {
        v.sort_by_key(|&id| (avail(id), id));
        v
    }

    fn sorted_numa_nodes(&self) -> Vec<usize> {
        if self.numa_first {
            return self.sort(ids(&self.details, |i| i.numa_node_id), |n| {
                self.avail_in_numa(n)
            });
        }
        let mut out = Vec::new();
        for s in self.sorted_sockets() {
            let numas = ids_where(&self.details, |i| i.socket_id == s, |i| i.numa_node_id);
            out.extend(self.sort(numas, |n| self.avail_in_numa(n)));
        }
        out
    }

    fn sorted_sockets(&self) -> Vec<usize> {
        if !self.numa_first {
            return self.sort(ids(&self.details, |i| i.socket_id), |s| {
                self.avail_in_socket(s)
            });
        }
        let mut out: Vec<usize> = Vec::new();
        for n in self.sorted_numa_nodes() {
            let sockets = ids_where(&self.details, |i| i.numa_node_id == n, |i| i.socket_id)
                .into_iter()
                .filter(|s| !out.contains(s))
                .collect();
            out.extend(self.sort(sockets, |s| self.avail_in_socket(s)));
        }
        out
    }

    /// Cores grouped by the outer unit (sockets when NUMA nodes are the larger unit, else
    /// NUMA nodes), each group sorted by its free CPUs.
    fn sorted_cores(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let groups: Vec<(usize, bool)> = if self.numa_first {
            self.sorted_sockets()
                .into_iter()
                .map(|s| (s, true))
                .collect()
        } else {
            self.sorted_numa_nodes()
                .into_iter()
                .map(|n| (n, false))
                .collect()
        };
        for (g, socket) in groups {
            let inside = |i: &crate::cm::topology::CpuInfo| {
                if socket {
                    i.socket_id == g
                } else {
                    i.numa_node_id == g
                }
            };
            let cores = ids_where(&self.details, inside, |i| i.core_id);
            out.extend(self.sort(cores, |c| self.avail_in_core(c)));
        }
        out
    }

    /// Free CPUs core by core in [`Self::sorted_cores`] order (upstream's
    /// sortAvailableCPUsPacked).
    fn sorted_cpus(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for c in self.sorted_cores() {
            out.extend(
                self.details
                    .iter()
                    .filter(|(_, i)| i.core_id == c)
                    .map(|(cpu, _)| *cpu),
            );
        }
        out
    }

    fn take(&mut self, cpus: &CpuSet) {
        self.result = self.result.union(cpus);
        for c in cpus.iter() {
            self.details.remove(&c);
        }
        self.needed = self.needed.saturating_sub(cpus.len());
    }

    fn satisfied(&self) -> bool {
        self.needed == 0
    }

    fn failed(&self) -> bool {
        self.needed > self.details.len()
    }

    /// Takes every group of `level` whose CPUs are all still free and all still needed,
    /// in the level's sorted order (upstream's takeFullNUMANodes/Sockets/Cores).
    fn take_full(&mut self, level: Level) {
        let topo = self.topo;
        let ids = match level {
            Level::NumaNode => self.sorted_numa_nodes(),
            Level::Socket => self.sorted_sockets(),
            Level::Core => self.sorted_cores(),
        };
        for id in ids {
            let (all, avail) = match level {
                Level::NumaNode => (topo.cpus_in_numa_nodes(&[id]), self.avail_in_numa(id)),
                Level::Socket => (topo.cpus_in_sockets(&[id]), self.avail_in_socket(id)),
                Level::Core => (topo.cpus_in_cores(&[id]), self.avail_in_core(id)),
            };
            if avail != all.len() || self.needed < all.len() {
                continue;
            }
            self.take(&all);
        }
    }

    fn take_remaining_cpus(&mut self) {
        for cpu in self.sorted_cpus() {
            self.take(&CpuSet::new([cpu]));
            if self.satisfied() {
                return;
            }
        }
    }
}

/// upstream's takeByTopologyNUMAPacked.
pub fn take_by_topology_numa_packed(
    topo: &CpuTopology,
    available: &CpuSet,
    num: usize,
) -> Result<CpuSet, TakeError> {
    let mut acc = Accumulator::new(topo, available, num);
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if acc.failed() {
        return Err(TakeError::NotEnough {
            requested: num,
            available: acc.details.len(),
        });
    }
    if acc.numa_first {
        acc.take_full(Level::NumaNode);
        if acc.satisfied() {
            return Ok(acc.result);
        }
        acc.take_full(Level::Socket);
    } else {
        acc.take_full(Level::Socket);
        if acc.satisfied() {
            return Ok(acc.result);
        }
        acc.take_full(Level::NumaNode);
    }
    if acc.satisfied() {
        return Ok(acc.result);
    }
    acc.take_full(Level::Core);
    if acc.satisfied() {
        return Ok(acc.result);
    }
    acc.take_remaining_cpus();
    if acc.satisfied() {
        return Ok(acc.result);
    }
    Err(TakeError::Failed)
}

/// Every `k`-subset of `items`, in lexicographic order of positions.
fn combinations(items: &[usize], k: usize, f: &mut dyn FnMut(&[usize]) -> bool) {
    fn rec(
        items: &[usize],
        k: usize,
        start: usize,
        acc: &mut Vec<usize>,
        f: &mut dyn FnMut(&[usize]) -> bool,
    ) -> bool {
        if acc.len() == k {
            return f(acc);
        }
        for i in start..items.len() {
            acc.push(items[i]);
            let go_on = rec(items, k, i + 1, acc, f);
            acc.pop();
            if !go_on {
                return false;
            }
        }
        true
    }
    rec(items, k, 0, &mut Vec::new(), f);
}

fn std_dev(values: &[usize]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<usize>() as f64 / n;
    let var = values
        .iter()
        .map(|&v| (v as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    var.sqrt()
}

/// upstream's takeByTopologyNUMADistributed: `group` is the unit CPUs are handed out in
/// (the threads of a core with `full-pcpus-only`, else 1).
pub fn take_by_topology_numa_distributed(
    topo: &CpuTopology,
    available: &CpuSet,
    num: usize,
    group: usize,
) -> Result<CpuSet, TakeError> {
    let group = group.max(1);
    if !num.is_multiple_of(group) {
        return take_by_topology_numa_packed(topo, available, num);
    }
    let mut acc = Accumulator::new(topo, available, num);
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if acc.failed() {
        return Err(TakeError::NotEnough {
            requested: num,
            available: acc.details.len(),
        });
    }
    let numas = acc.sorted_numa_nodes();
    // upstream's rangeNUMANodesNeededToSatisfy.
    let num_numa_nodes = topo.num_numa_nodes.max(1);
    let num_groups = (topo.num_cpus - 1) / group + 1;
    let groups_per_numa = (num_groups - 1) / num_numa_nodes + 1;
    let groups_needed = (acc.needed - 1) / group + 1;
    let min_numas = (groups_needed - 1) / groups_per_numa + 1;
    let max_numas = groups_needed.min(numas.len());
    let avail = |acc: &Accumulator, n: usize| acc.avail_in_numa(n);
    for k in min_numas..=max_numas {
        let mut best_balance = f64::MAX;
        let mut best: Option<(Vec<usize>, Vec<usize>)> = None;
        combinations(&numas, k, &mut |combo| {
            if best_balance == 0.0 {
                return false;
            }
            let total: usize = combo.iter().map(|&n| avail(&acc, n)).sum();
            if total < num {
                return true;
            }
            let groups: usize = combo.iter().map(|&n| avail(&acc, n) / group).sum();
            if groups * group < num {
                return true;
            }
            let distribution = (num / combo.len() / group) * group;
            if combo.iter().any(|&n| avail(&acc, n) < distribution) {
                return true;
            }
            let mut after: std::collections::BTreeMap<usize, usize> =
                numas.iter().map(|&n| (n, avail(&acc, n))).collect();
            for n in combo {
                *after.entry(*n).or_default() -= distribution;
            }
            let remainder = num - distribution * combo.len();
            let remainder_combo: Vec<usize> = combo
                .iter()
                .copied()
                .filter(|n| after[n] >= group)
                .collect();
            let mut best_local = f64::MAX;
            let mut best_local_rem: Vec<usize> = Vec::new();
            if remainder == 0 {
                best_local = std_dev(&after.values().copied().collect::<Vec<_>>());
            }
            let mut kk = remainder_combo.len();
            while remainder > 0 && kk >= 1 {
                combinations(&remainder_combo, kk, &mut |subset| {
                    let mut rem = remainder;
                    let mut after = after.clone();
                    if subset.iter().map(|n| after[n]).sum::<usize>() < rem {
                        return true;
                    }
                    while rem > 0 {
                        let mut progressed = false;
                        for n in subset {
                            if rem == 0 {
                                break;
                            }
                            if after[n] < group {
                                continue;
                            }
                            *after.entry(*n).or_default() -= group;
                            rem = rem.saturating_sub(group);
                            progressed = true;
                        }
                        if !progressed {
                            return true;
                        }
                    }
                    let balance = std_dev(&after.values().copied().collect::<Vec<_>>());
                    if balance < best_local {
                        best_local = balance;
                        best_local_rem = subset.to_vec();
                    }
                    true
                });
                kk -= 1;
            }
            if best_local < best_balance {
                best_balance = best_local;
                best = Some((combo.to_vec(), best_local_rem));
            }
            true
        });
        let Some((combo, remainder_set)) = best else {
            continue;
        };
        let distribution = (num / combo.len() / group) * group;
        for &n in &combo {
            let in_numa: CpuSet = acc
                .details
                .iter()
                .filter(|(_, i)| i.numa_node_id == n)
                .map(|(c, _)| *c)
                .collect();
            let cpus = take_by_topology_numa_packed(topo, &in_numa, distribution)?;
            acc.take(&cpus);
        }
        let mut remainder = num - distribution * combo.len();
        while remainder > 0 {
            let mut progressed = false;
            for &n in &remainder_set {
                if remainder == 0 {
                    break;
                }
                if acc.avail_in_numa(n) < group {
                    continue;
                }
                let in_numa: CpuSet = acc
                    .details
                    .iter()
                    .filter(|(_, i)| i.numa_node_id == n)
                    .map(|(c, _)| *c)
                    .collect();
                let cpus = take_by_topology_numa_packed(topo, &in_numa, group)?;
                acc.take(&cpus);
                remainder -= group;
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
        if acc.needed > 0 {
            return Err(TakeError::Accounting(acc.needed));
        }
        return Ok(acc.result);
    }
    take_by_topology_numa_packed(topo, available, num)
}

#[cfg(test)]
mod tests;
