//! A set of NUMA nodes (upstream's pkg/kubelet/cm/topologymanager/bitmask): bit `i` set
//! means NUMA node `i` is in the set. Nodes are 0..64, which covers every machine the
//! `max-allowable-numa-nodes` option lets the topology manager start on.

use std::fmt;

#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BitMask(u64);

impl BitMask {
    /// The mask of `nodes`; `None` when a node is outside 0..64 (upstream: "bit number
    /// must be in range 0-63").
    pub fn new(nodes: &[usize]) -> Option<BitMask> {
        let mut m = BitMask(0);
        for &n in nodes {
            if n >= 64 {
                return None;
            }
            m.0 |= 1 << n;
        }
        Some(m)
    }

    /// The mask from its raw bits.
    pub fn from_bits(bits: u64) -> BitMask {
        BitMask(bits)
    }

    pub fn bits(self) -> u64 {
        self.0
    }

    pub fn add(&mut self, node: usize) {
        if node < 64 {
            self.0 |= 1 << node;
        }
    }

    pub fn remove(&mut self, node: usize) {
        if node < 64 {
            self.0 &= !(1 << node);
        }
    }

    /// Intersection with `other`.
    pub fn and(self, other: BitMask) -> BitMask {
        BitMask(self.0 & other.0)
    }

    /// Union with `other`.
    pub fn or(self, other: BitMask) -> BitMask {
        BitMask(self.0 | other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn is_set(self, node: usize) -> bool {
        node < 64 && self.0 & (1 << node) != 0
    }

    pub fn any_set(self, nodes: &[usize]) -> bool {
        nodes.iter().any(|&n| self.is_set(n))
    }

    pub fn is_equal(self, other: BitMask) -> bool {
        self == other
    }

    /// The number of nodes in the set.
    pub fn count(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The nodes in the set, lowest first.
    pub fn get_bits(self) -> Vec<usize> {
        (0..64).filter(|&i| self.is_set(i)).collect()
    }

    /// upstream's IsLessThan: compared as binary numbers read lowest bit first, i.e. the
    /// mask whose lowest differing bit is set in it wins (the lower NUMA nodes).
    pub fn is_less_than(self, other: BitMask) -> bool {
        let diff = self.0 ^ other.0;
        if diff == 0 {
            return false;
        }
        let lowest = diff.trailing_zeros();
        self.0 & (1 << lowest) != 0
    }

    pub fn is_greater_than(self, other: BitMask) -> bool {
        other.is_less_than(self)
    }

    /// upstream's IsNarrowerThan: fewer nodes, or as many but lower ones.
    pub fn is_narrower_than(self, other: BitMask) -> bool {
        if self.count() == other.count() {
            return self.is_less_than(other);
        }
        self.count() < other.count()
    }
}

impl fmt::Debug for BitMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // upstream prints the binary string, highest node first.
        write!(f, "{:02b}", self.0)
    }
}

impl fmt::Display for BitMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// upstream's And over many masks.
pub fn and_all(masks: &[BitMask]) -> BitMask {
    masks.iter().fold(BitMask(u64::MAX), |a, &m| a.and(m))
}

/// upstream's Or over many masks.
pub fn or_all(masks: &[BitMask]) -> BitMask {
    masks.iter().fold(BitMask(0), |a, &m| a.or(m))
}

/// upstream's IterateBitMasks: every non-empty subset of `nodes`, smallest subsets first,
/// each subset in ascending order of its members.
pub fn iterate_bit_masks(nodes: &[usize], mut f: impl FnMut(BitMask)) {
    fn rec(
        nodes: &[usize],
        start: usize,
        size: usize,
        acc: &mut Vec<usize>,
        f: &mut dyn FnMut(BitMask),
    ) {
        if acc.len() == size {
            if let Some(m) = BitMask::new(acc) {
                f(m);
            }
            return;
        }
        for i in start..nodes.len() {
            acc.push(nodes[i]);
            rec(nodes, i + 1, size, acc, f);
            acc.pop();
        }
    }
    for size in 1..=nodes.len() {
        rec(nodes, 0, size, &mut Vec::new(), &mut f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(n: &[usize]) -> BitMask {
        BitMask::new(n).unwrap()
    }

    #[test]
    fn ops_as_upstream() {
        assert_eq!(m(&[0, 1]).and(m(&[1, 2])), m(&[1]));
        assert_eq!(m(&[0]).or(m(&[2])), m(&[0, 2]));
        assert_eq!(m(&[0, 2]).count(), 2);
        assert_eq!(m(&[3, 1]).get_bits(), vec![1, 3]);
        assert!(BitMask::new(&[64]).is_none());
        assert!(m(&[0]).is_narrower_than(m(&[0, 1])));
        assert!(m(&[0]).is_narrower_than(m(&[1])));
        assert!(!m(&[1]).is_narrower_than(m(&[0])));
        assert!(m(&[0, 1]).is_narrower_than(m(&[0, 2])));
        assert!(m(&[0, 3]).is_less_than(m(&[1, 2])));
        assert_eq!(and_all(&[m(&[0, 1]), m(&[1, 2]), m(&[1])]), m(&[1]));
        assert_eq!(format!("{}", m(&[0, 2])), "101");
    }

    #[test]
    fn iterates_smallest_subsets_first() {
        let mut seen = vec![];
        iterate_bit_masks(&[0, 1, 2], |b| seen.push(b.get_bits()));
        assert_eq!(
            seen,
            vec![
                vec![0],
                vec![1],
                vec![2],
                vec![0, 1],
                vec![0, 2],
                vec![1, 2],
                vec![0, 1, 2]
            ]
        );
    }
}
