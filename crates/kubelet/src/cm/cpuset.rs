//! A set of CPU (or NUMA node) ids in the kernel's list format (`0-3,8,10-11`), as
//! upstream's k8s.io/utils/cpuset: what cgroups' `cpuset.cpus`/`cpuset.mems`, sysfs'
//! `cpulist` files and the CPU manager's state file hold.

use std::collections::BTreeSet;
use std::fmt;

#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<usize>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid cpuset {0:?}")]
pub struct ParseError(pub String);

impl CpuSet {
    pub fn new(cpus: impl IntoIterator<Item = usize>) -> CpuSet {
        CpuSet(cpus.into_iter().collect())
    }

    /// Parses the list format; the empty string is the empty set.
    pub fn parse(s: &str) -> Result<CpuSet, ParseError> {
        let bad = || ParseError(s.to_string());
        let mut set = BTreeSet::new();
        for part in s.trim().split(',').filter(|p| !p.is_empty()) {
            match part.split_once('-') {
                Some((a, b)) => {
                    let a: usize = a.trim().parse().map_err(|_| bad())?;
                    let b: usize = b.trim().parse().map_err(|_| bad())?;
                    if a > b {
                        return Err(bad());
                    }
                    set.extend(a..=b);
                }
                None => {
                    set.insert(part.trim().parse().map_err(|_| bad())?);
                }
            }
        }
        Ok(CpuSet(set))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, cpu: usize) -> bool {
        self.0.contains(&cpu)
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    pub fn is_subset_of(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }

    /// The members, lowest first.
    pub fn list(&self) -> Vec<usize> {
        self.0.iter().copied().collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().copied()
    }
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(i: I) -> CpuSet {
        CpuSet::new(i)
    }
}

impl fmt::Display for CpuSet {
    /// The list format with ranges collapsed (`0-2,4`), `""` for the empty set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.0.iter().copied().peekable();
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end = it.next().unwrap_or(end);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_list_format() {
        let s = CpuSet::parse("0-2,4,6-7\n").unwrap();
        assert_eq!(s.list(), vec![0, 1, 2, 4, 6, 7]);
        assert_eq!(s.to_string(), "0-2,4,6-7");
        assert_eq!(CpuSet::parse("").unwrap().to_string(), "");
        assert_eq!(CpuSet::new([3, 1]).to_string(), "1,3");
        assert!(CpuSet::parse("3-1").is_err());
        assert!(CpuSet::parse("a").is_err());
    }
}
