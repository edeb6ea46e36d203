//! The machine's NUMA nodes and the distances between them (upstream's NUMAInfo), read from
//! `devices/system/node/nodeN/distance` under the sysfs root; `prefer-closest-numa-nodes`
//! compares hints by these distances.

use super::bitmask::BitMask;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NumaInfo {
    /// NUMA node ids, lowest first.
    pub nodes: Vec<usize>,
    /// node → distance to every node (indexed by node id); empty when not known.
    pub distances: BTreeMap<usize, Vec<u64>>,
}

impl NumaInfo {
    /// The NUMA nodes under `sysfs` (one node 0 on a machine without NUMA); distances are
    /// read only when `want_distances` (upstream reads them for `prefer-closest-numa-nodes`).
    pub fn discover(sysfs: &Path, want_distances: bool) -> Result<NumaInfo, String> {
        let dir = sysfs.join("devices/system/node");
        let mut nodes: Vec<usize> = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()?
                            .strip_prefix("node")?
                            .parse::<usize>()
                            .ok()
                    })
                    .collect()
            })
            .unwrap_or_default();
        nodes.sort_unstable();
        if nodes.is_empty() {
            nodes.push(0);
        }
        let mut distances = BTreeMap::new();
        if want_distances {
            for &n in &nodes {
                let p = dir.join(format!("node{n}/distance"));
                let s = std::fs::read_to_string(&p).map_err(|e| {
                    format!(
                        "error getting NUMA distances from sysfs: {}: {e}",
                        p.display()
                    )
                })?;
                let d: Result<Vec<u64>, _> = s.split_whitespace().map(str::parse).collect();
                let d = d.map_err(|_| {
                    format!(
                        "error getting NUMA distances from sysfs: {}: {s:?}",
                        p.display()
                    )
                })?;
                distances.insert(n, d);
            }
        }
        Ok(NumaInfo { nodes, distances })
    }

    /// Every NUMA node (upstream's DefaultAffinityMask).
    pub fn default_affinity_mask(&self) -> BitMask {
        BitMask::new(&self.nodes).unwrap_or_default()
    }

    /// The narrower of two masks (`m1` on a tie).
    pub fn narrowest(&self, m1: BitMask, m2: BitMask) -> BitMask {
        if m2.is_narrower_than(m1) { m2 } else { m1 }
    }

    /// The mask with the shorter average distance between its nodes; the narrower one when
    /// the sizes differ, the one with lower nodes when the distances tie.
    pub fn closest(&self, m1: BitMask, m2: BitMask) -> BitMask {
        if m1.count() != m2.count() {
            return self.narrowest(m1, m2);
        }
        let (d1, d2) = (self.average_distance(m1), self.average_distance(m2));
        if d1 == d2 {
            return if m1.is_less_than(m2) { m1 } else { m2 };
        }
        if d1 < d2 { m1 } else { m2 }
    }

    fn average_distance(&self, m: BitMask) -> f64 {
        let bits = m.get_bits();
        if bits.is_empty() {
            return 0.0;
        }
        let mut sum = 0u64;
        for a in &bits {
            for b in &bits {
                sum += self
                    .distances
                    .get(a)
                    .and_then(|d| d.get(*b))
                    .copied()
                    .unwrap_or(0);
            }
        }
        sum as f64 / (bits.len() * bits.len()) as f64
    }
}
