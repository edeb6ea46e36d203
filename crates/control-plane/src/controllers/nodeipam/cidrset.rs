//! One cluster CIDR cut into node-sized blocks, tracked in a bitmap (upstream's
//! `nodeipam/ipam/cidrset`): allocate the next free block round-robin from where the last
//! allocation stopped, occupy blocks nodes already hold (or a range that must never be
//! handed out), release them when their node goes. Pure: no I/O, no clock.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Upstream's clusterSubnetMaxDiff for IPv6: its bitmap is uncompressed, so a node block
/// may be at most 16 bits longer than the cluster prefix. nodus applies a looser 24 to
/// IPv4 (a /8 cut into /32s is 2 MiB of bitmap) rather than none.
const MAX_DIFF_V6: u8 = 16;
const MAX_DIFF_V4: u8 = 24;

/// A parsed CIDR, normalised to its network address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Cidr {
    pub(crate) addr: IpAddr,
    pub(crate) prefix: u8,
}

impl Cidr {
    /// Parses `10.42.0.0/16` or `fd00:42::/56`; host bits are masked off, as Go's
    /// `net.ParseCIDR` returns the network.
    pub(crate) fn parse(s: &str) -> Result<Cidr, String> {
        let (ip, bits) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a CIDR (expected e.g. 10.42.0.0/16)"))?;
        let addr: IpAddr = ip
            .parse()
            .map_err(|_| format!("{s:?}: {ip:?} is not an IP address"))?;
        let prefix: u8 = bits
            .parse()
            .map_err(|_| format!("{s:?}: {bits:?} is not a prefix length"))?;
        if prefix > width(addr) {
            return Err(format!(
                "{s:?}: the prefix length must be at most {}",
                width(addr)
            ));
        }
        Ok(Cidr {
            addr: from_u128(addr.is_ipv4(), to_u128(addr) & mask(addr.is_ipv4(), prefix)),
            prefix,
        })
    }

    pub(crate) fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    fn bits(&self) -> u8 {
        width(self.addr)
    }

    /// Whether the two share any address (one contains the other: CIDRs nest or are apart).
    pub(crate) fn overlaps(&self, other: &Cidr) -> bool {
        if self.is_ipv4() != other.is_ipv4() {
            return false;
        }
        let p = self.prefix.min(other.prefix);
        let m = mask(self.is_ipv4(), p);
        to_u128(self.addr) & m == to_u128(other.addr) & m
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn width(a: IpAddr) -> u8 {
    if a.is_ipv4() { 32 } else { 128 }
}

fn to_u128(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v) => u128::from(u32::from(v)),
        IpAddr::V6(v) => u128::from(v),
    }
}

fn from_u128(v4: bool, n: u128) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(n as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(n))
    }
}

/// The network mask of `prefix` bits, in the low 32 bits for IPv4.
fn mask(v4: bool, prefix: u8) -> u128 {
    let (w, all) = if v4 {
        (32u32, u128::from(u32::MAX))
    } else {
        (128, u128::MAX)
    };
    match w - u32::from(prefix) {
        _ if prefix == 0 => 0,
        0 => all,
        host => all & !((1u128 << host) - 1),
    }
}

/// Why a set could not be made or a block not handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CidrSetError {
    /// Upstream's ErrCIDRRangeNoCIDRsRemaining.
    NoCidrsRemaining,
    /// The node mask is shorter than the cluster's, or too much longer (upstream's
    /// ErrCIDRSetSubNetTooBig and kube-controller-manager's mask check).
    BadMaskSize { cluster: Cidr, node_mask: u8 },
    /// A CIDR to occupy or release that is not inside the cluster CIDR.
    OutOfRange { cidr: Cidr, cluster: Cidr },
}

impl fmt::Display for CidrSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CidrSetError::NoCidrsRemaining => f.write_str(
                "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range",
            ),
            CidrSetError::BadMaskSize { cluster, node_mask } => {
                let max = if cluster.is_ipv4() {
                    (cluster.prefix + MAX_DIFF_V4).min(32)
                } else {
                    (cluster.prefix + MAX_DIFF_V6).min(128)
                };
                write!(
                    f,
                    "the node CIDR mask size /{node_mask} does not fit cluster CIDR {cluster}: it must be between /{} and /{max}",
                    cluster.prefix
                )
            }
            CidrSetError::OutOfRange { cidr, cluster } => {
                write!(f, "cidr {cidr} is out the range of cluster cidr {cluster}")
            }
        }
    }
}

/// The blocks of one cluster CIDR and which of them are taken.
#[derive(Debug)]
pub(crate) struct CidrSet {
    cluster: Cidr,
    node_mask: u8,
    max: usize,
    allocated: usize,
    next_candidate: usize,
    used: Vec<u64>,
}

impl CidrSet {
    pub(crate) fn new(cluster: Cidr, node_mask: u8) -> Result<CidrSet, CidrSetError> {
        let max_diff = if cluster.is_ipv4() {
            MAX_DIFF_V4
        } else {
            MAX_DIFF_V6
        };
        if node_mask < cluster.prefix
            || node_mask > cluster.bits()
            || node_mask - cluster.prefix > max_diff
        {
            return Err(CidrSetError::BadMaskSize { cluster, node_mask });
        }
        let max = 1usize << (node_mask - cluster.prefix);
        Ok(CidrSet {
            cluster,
            node_mask,
            max,
            allocated: 0,
            next_candidate: 0,
            used: vec![0; max.div_ceil(64)],
        })
    }

    fn bit(&self, i: usize) -> bool {
        self.used[i / 64] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, i: usize, on: bool) {
        if on {
            self.used[i / 64] |= 1 << (i % 64);
        } else {
            self.used[i / 64] &= !(1 << (i % 64));
        }
    }

    fn block(&self, i: usize) -> Cidr {
        let shift = u32::from(self.cluster.bits() - self.node_mask);
        let base = to_u128(self.cluster.addr) | ((i as u128) << shift);
        Cidr {
            addr: from_u128(self.cluster.is_ipv4(), base),
            prefix: self.node_mask,
        }
    }

    /// The next free block after the last one handed out, wrapping round (upstream's
    /// AllocateNext: a released block is not reused until the others have been).
    pub(crate) fn allocate_next(&mut self) -> Result<Cidr, CidrSetError> {
        if self.allocated == self.max {
            return Err(CidrSetError::NoCidrsRemaining);
        }
        let mut c = self.next_candidate;
        while self.bit(c) {
            c = (c + 1) % self.max;
        }
        self.next_candidate = (c + 1) % self.max;
        self.set(c, true);
        self.allocated += 1;
        Ok(self.block(c))
    }

    /// The indices of the blocks `cidr` covers: a node's own block, a bigger range (a
    /// Service CIDR) or a smaller one inside a block.
    fn span(&self, cidr: &Cidr) -> Result<(usize, usize), CidrSetError> {
        if !cidr.overlaps(&self.cluster) {
            return Err(CidrSetError::OutOfRange {
                cidr: *cidr,
                cluster: self.cluster,
            });
        }
        if cidr.prefix <= self.cluster.prefix {
            return Ok((0, self.max - 1));
        }
        let shift = u32::from(self.cluster.bits() - self.node_mask);
        let off = to_u128(cidr.addr) - to_u128(self.cluster.addr);
        let size = if cidr.bits() - cidr.prefix >= 128 {
            u128::MAX
        } else {
            1u128 << (cidr.bits() - cidr.prefix)
        };
        let first = (off >> shift) as usize;
        let last = ((off + (size - 1)) >> shift) as usize;
        Ok((first, last.min(self.max - 1)))
    }

    /// Marks `cidr` taken; taking a taken block again is no error (upstream's Occupy).
    pub(crate) fn occupy(&mut self, cidr: &Cidr) -> Result<(), CidrSetError> {
        let (a, b) = self.span(cidr)?;
        for i in a..=b {
            if !self.bit(i) {
                self.set(i, true);
                self.allocated += 1;
            }
        }
        Ok(())
    }

    pub(crate) fn release(&mut self, cidr: &Cidr) -> Result<(), CidrSetError> {
        let (a, b) = self.span(cidr)?;
        for i in a..=b {
            if self.bit(i) {
                self.set(i, false);
                self.allocated -= 1;
            }
        }
        Ok(())
    }

    #[cfg(test)]
    fn allocated(&self) -> usize {
        self.allocated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    fn set(cluster: &str, mask: u8) -> CidrSet {
        CidrSet::new(c(cluster), mask).unwrap()
    }

    fn take(s: &mut CidrSet, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| s.allocate_next().unwrap().to_string())
            .collect()
    }

    #[test]
    fn parse_masks_host_bits_and_refuses_garbage() {
        for (input, want) in [
            ("10.42.0.0/16", "10.42.0.0/16"),
            ("10.42.7.9/16", "10.42.0.0/16"),
            (" 10.88.0.0/24", "10.88.0.0/24"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("fd00:42::1/56", "fd00:42::/56"),
            ("10.0.0.1/32", "10.0.0.1/32"),
        ] {
            assert_eq!(c(input).to_string(), want, "{input}");
        }
        for bad in [
            "10.42.0.0",
            "10.42.0/16",
            "10.42.0.0/33",
            "fd00::/129",
            "x/8",
            "",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn allocates_in_order_per_mask_size() {
        for (cluster, mask, want) in [
            (
                "10.42.0.0/16",
                24,
                vec!["10.42.0.0/24", "10.42.1.0/24", "10.42.2.0/24"],
            ),
            (
                "10.42.0.0/16",
                26,
                vec!["10.42.0.0/26", "10.42.0.64/26", "10.42.0.128/26"],
            ),
            ("10.0.0.0/8", 16, vec!["10.0.0.0/16", "10.1.0.0/16"]),
            ("192.168.0.0/24", 24, vec!["192.168.0.0/24"]),
            ("10.1.0.0/30", 32, vec!["10.1.0.0/32", "10.1.0.1/32"]),
            (
                "fd00:42::/56",
                64,
                vec!["fd00:42::/64", "fd00:42:0:1::/64", "fd00:42:0:2::/64"],
            ),
            (
                "2001:db8::/48",
                64,
                vec!["2001:db8::/64", "2001:db8:0:1::/64"],
            ),
            (
                "2001:db8::/112",
                120,
                vec!["2001:db8::/120", "2001:db8::100/120"],
            ),
        ] {
            let mut s = set(cluster, mask);
            assert_eq!(take(&mut s, want.len()), want, "{cluster} /{mask}");
        }
    }

    #[test]
    fn exhaustion_gives_upstreams_error_and_release_frees_a_block() {
        let mut s = set("10.42.0.0/22", 24);
        let got = take(&mut s, 4);
        assert_eq!(got[3], "10.42.3.0/24");
        let err = s.allocate_next().unwrap_err();
        assert_eq!(err, CidrSetError::NoCidrsRemaining);
        assert_eq!(
            err.to_string(),
            "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range"
        );
        s.release(&c("10.42.1.0/24")).unwrap();
        assert_eq!(s.allocate_next().unwrap().to_string(), "10.42.1.0/24");
        assert!(s.allocate_next().is_err());
    }

    #[test]
    fn released_block_is_reused_only_after_the_others() {
        let mut s = set("10.42.0.0/22", 24);
        take(&mut s, 2);
        s.release(&c("10.42.0.0/24")).unwrap();
        assert_eq!(
            take(&mut s, 3),
            vec!["10.42.2.0/24", "10.42.3.0/24", "10.42.0.0/24"]
        );
    }

    #[test]
    fn occupy_skips_held_blocks_and_counts_once() {
        let mut s = set("10.42.0.0/16", 24);
        s.occupy(&c("10.42.0.0/24")).unwrap();
        s.occupy(&c("10.42.0.0/24")).unwrap();
        s.occupy(&c("10.42.2.0/24")).unwrap();
        assert_eq!(s.allocated(), 2);
        assert_eq!(take(&mut s, 2), vec!["10.42.1.0/24", "10.42.3.0/24"]);
        // A range wider than a block (a Service CIDR inside the cluster CIDR) takes all of
        // its blocks; one narrower takes the block it sits in.
        s.occupy(&c("10.42.4.0/23")).unwrap();
        s.occupy(&c("10.42.6.128/25")).unwrap();
        assert_eq!(s.allocated(), 7);
        assert_eq!(take(&mut s, 1), vec!["10.42.7.0/24"]);
        // Releasing twice does not under-count.
        s.release(&c("10.42.4.0/23")).unwrap();
        s.release(&c("10.42.4.0/23")).unwrap();
        assert_eq!(s.allocated(), 6);
        // A range covering the whole cluster CIDR takes everything.
        s.occupy(&c("10.0.0.0/8")).unwrap();
        assert_eq!(s.allocated(), 256);
        assert!(s.allocate_next().is_err());
    }

    #[test]
    fn occupy_and_release_outside_the_cluster_cidr_are_refused() {
        let mut s = set("10.42.0.0/16", 24);
        for outside in ["10.43.0.0/24", "192.168.0.0/16", "fd00::/64"] {
            let err = s.occupy(&c(outside)).unwrap_err();
            assert!(
                matches!(err, CidrSetError::OutOfRange { .. }),
                "{outside}: {err}"
            );
            assert!(s.release(&c(outside)).is_err(), "{outside}");
        }
        assert_eq!(
            s.occupy(&c("10.43.0.0/24")).unwrap_err().to_string(),
            "cidr 10.43.0.0/24 is out the range of cluster cidr 10.42.0.0/16"
        );
        assert_eq!(s.allocated(), 0);
    }

    #[test]
    fn mask_sizes_outside_the_cluster_prefix_are_refused() {
        for (cluster, mask, ok) in [
            ("10.42.0.0/16", 24, true),
            ("10.42.0.0/16", 16, true),
            ("10.42.0.0/16", 15, false),
            ("10.42.0.0/16", 33, false),
            ("10.0.0.0/8", 32, true),
            ("0.0.0.0/0", 24, true),
            ("0.0.0.0/0", 25, false),
            ("fd00::/48", 64, true),
            ("fd00::/48", 65, false),
            ("fd00::/112", 128, true),
        ] {
            let r = CidrSet::new(c(cluster), mask);
            assert_eq!(r.is_ok(), ok, "{cluster} /{mask}: {r:?}");
        }
        let err = CidrSet::new(c("10.42.0.0/16"), 8).unwrap_err().to_string();
        assert!(err.contains("10.42.0.0/16") && err.contains("/8"), "{err}");
    }

    #[test]
    fn dual_stack_sets_allocate_independently() {
        let mut v4 = set("10.42.0.0/16", 24);
        let mut v6 = set("fd00:42::/56", 64);
        assert_eq!(take(&mut v4, 1), vec!["10.42.0.0/24"]);
        assert_eq!(take(&mut v6, 1), vec!["fd00:42::/64"]);
        v6.occupy(&c("fd00:42:0:1::/64")).unwrap();
        assert_eq!(take(&mut v6, 1), vec!["fd00:42:0:2::/64"]);
        assert_eq!(take(&mut v4, 1), vec!["10.42.1.0/24"]);
        assert!(v4.occupy(&c("fd00:42::/64")).is_err());
    }

    #[test]
    fn overlap_is_symmetric_and_family_aware() {
        for (a, b, want) in [
            ("10.42.0.0/16", "10.42.3.0/24", true),
            ("10.42.3.0/24", "10.42.0.0/16", true),
            ("10.42.0.0/16", "10.43.0.0/16", false),
            ("10.96.0.0/12", "10.100.0.0/16", true),
            ("10.0.0.0/8", "10.96.0.0/12", true),
            ("10.88.0.0/16", "10.96.0.0/12", false),
            ("10.0.0.0/8", "fd00::/8", false),
        ] {
            assert_eq!(c(a).overlaps(&c(b)), want, "{a} {b}");
        }
    }
}
