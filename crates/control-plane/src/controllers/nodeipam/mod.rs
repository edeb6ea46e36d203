//! The node IPAM controller with upstream's range allocator (kube-controller-manager's
//! `--allocate-node-cidrs`, `--cluster-cidr`, `--node-cidr-mask-size[-ipv4|-ipv6]`): every
//! Node gets `spec.podCIDR(s)`, one block per cluster CIDR ([`cidrset`]), the kubelet hands
//! it to the runtime, and the runtime's default CNI network allocates pod IPs from it.
//!
//! As upstream's rangeAllocator: at start the blocks existing Nodes hold are occupied;
//! a Node seen without podCIDRs gets the next free block of each cluster CIDR; a deleted
//! Node's blocks are released. When a cluster CIDR has no block left, the Node gets the
//! `CIDRNotAvailable` event and is tried again on its next update (the kubelet's status
//! reports), as upstream retries on Node updates.

pub(crate) mod cidrset;

use std::net::Ipv4Addr;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::apiserver::state::ApiState;
use crate::controllers::cache::{Cache, Change};
use crate::controllers::events::Recorder;
use crate::controllers::objects;
use crate::storage::EventKind;
use cidrset::{Cidr, CidrSet};

/// kube-controller-manager's default node block for IPv4.
pub const DEFAULT_NODE_CIDR_MASK_SIZE_IPV4: u8 = 24;
/// kube-controller-manager's default node block for IPv6.
pub const DEFAULT_NODE_CIDR_MASK_SIZE_IPV6: u8 = 64;

/// The cluster CIDRs (one, or an IPv4 and an IPv6 one for dual-stack, in the order the
/// flag gave them: the first is a Node's `spec.podCIDR`) and each one's node mask size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIpamConfig {
    sets: Vec<(Cidr, u8)>,
}

/// The node IPAM flags as given.
#[derive(Clone, Debug, Default)]
pub struct NodeIpamFlags<'a> {
    pub allocate_node_cidrs: bool,
    pub cluster_cidr: Option<&'a str>,
    pub node_cidr_mask_size: Option<u8>,
    pub node_cidr_mask_size_ipv4: Option<u8>,
    pub node_cidr_mask_size_ipv6: Option<u8>,
}

/// Checks the flags as kube-controller-manager does at start, plus nodus's refusal of a
/// cluster CIDR that overlaps the Service range (upstream quietly carves the Service range
/// out; nodus's kube-proxy would then see pod and Service addresses in one range).
/// `Ok(None)`: allocation is off.
pub fn config(
    flags: &NodeIpamFlags<'_>,
    service_cidr: (Ipv4Addr, u8),
) -> Result<Option<NodeIpamConfig>, String> {
    if !flags.allocate_node_cidrs {
        return Ok(None);
    }
    let raw = flags.cluster_cidr.unwrap_or("").trim();
    if raw.is_empty() {
        return Err("--cluster-cidr is required when --allocate-node-cidrs=true".into());
    }
    let cidrs = raw
        .split(',')
        .map(|s| Cidr::parse(s).map_err(|e| format!("invalid --cluster-cidr: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let dual = match cidrs.as_slice() {
        [_] => false,
        [a, b] if a.is_ipv4() != b.is_ipv4() => true,
        [a, b] => {
            return Err(format!(
                "invalid --cluster-cidr {raw:?}: two CIDRs are dual-stack and need one IPv4 and one IPv6 CIDR ({a} and {b} are of one family{})",
                if a.overlaps(b) { " and overlap" } else { "" }
            ));
        }
        _ => {
            return Err(format!(
                "invalid --cluster-cidr {raw:?}: at most two CIDRs (one IPv4, one IPv6), got {}",
                cidrs.len()
            ));
        }
    };
    // upstream's setNodeCIDRMaskSizes: the family-less flag is single-stack only, and a
    // flag for a family the cluster does not have is a mistake.
    if dual && flags.node_cidr_mask_size.is_some() {
        return Err(
            "usage of --node-cidr-mask-size is not allowed with dual-stack clusters".into(),
        );
    }
    if !dual {
        let (unused, family) = if cidrs[0].is_ipv4() {
            (flags.node_cidr_mask_size_ipv6, "ipv6")
        } else {
            (flags.node_cidr_mask_size_ipv4, "ipv4")
        };
        if unused.is_some() {
            return Err(format!(
                "usage of --node-cidr-mask-size-{family} is not allowed with a single-stack {} cluster CIDR",
                if family == "ipv6" { "IPv4" } else { "IPv6" }
            ));
        }
    }
    let service = Cidr {
        addr: service_cidr.0.into(),
        prefix: service_cidr.1,
    };
    let mut sets = Vec::new();
    for cidr in cidrs {
        let mask = if cidr.is_ipv4() {
            flags
                .node_cidr_mask_size
                .or(flags.node_cidr_mask_size_ipv4)
                .unwrap_or(DEFAULT_NODE_CIDR_MASK_SIZE_IPV4)
        } else {
            flags
                .node_cidr_mask_size
                .or(flags.node_cidr_mask_size_ipv6)
                .unwrap_or(DEFAULT_NODE_CIDR_MASK_SIZE_IPV6)
        };
        if cidr.overlaps(&service) {
            return Err(format!(
                "--cluster-cidr {cidr} overlaps --service-cluster-ip-range {service}: pod and Service addresses must not share a range"
            ));
        }
        CidrSet::new(cidr, mask).map_err(|e| format!("invalid --node-cidr-mask-size: {e}"))?;
        sets.push((cidr, mask));
    }
    Ok(Some(NodeIpamConfig { sets }))
}

/// The Node status changes the allocator reports as Normal events (upstream's
/// RecordNodeStatusChange: "Node <name> status is now: <reason>").
#[derive(Clone, Copy, Debug)]
enum StatusChange {
    CidrNotAvailable,
    CidrAssignmentFailed,
}

impl StatusChange {
    fn reason(self) -> &'static str {
        match self {
            StatusChange::CidrNotAvailable => "CIDRNotAvailable",
            StatusChange::CidrAssignmentFailed => "CIDRAssignmentFailed",
        }
    }

    fn record(self, st: &ApiState, rec: &Recorder, node: &Value) {
        let message = format!("Node {} status is now: {}", name(node), self.reason());
        rec.record(st, node, "Normal", self.reason(), &message);
    }
}

fn pod_cidrs(node: &Value) -> Vec<&str> {
    match node.pointer("/spec/podCIDRs").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => a.iter().filter_map(Value::as_str).collect(),
        _ => node
            .pointer("/spec/podCIDR")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .into_iter()
            .collect(),
    }
}

fn name(node: &Value) -> &str {
    node.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The allocator's state: one [`CidrSet`] per cluster CIDR.
struct RangeAllocator {
    sets: Vec<CidrSet>,
}

impl RangeAllocator {
    fn new(cfg: &NodeIpamConfig) -> RangeAllocator {
        RangeAllocator {
            sets: cfg
                .sets
                .iter()
                .filter_map(|(c, m)| CidrSet::new(*c, *m).ok())
                .collect(),
        }
    }

    /// Marks a Node's blocks taken (upstream's occupyCIDRs).
    fn occupy(&mut self, node: &Value) -> Result<(), String> {
        for (idx, s) in pod_cidrs(node).into_iter().enumerate() {
            let cidr = Cidr::parse(s)
                .map_err(|_| format!("failed to parse node {}, CIDR {s}", name(node)))?;
            let set = self.sets.get_mut(idx).ok_or_else(|| {
                format!(
                    "node:{} has an allocated cidr: {s} at index:{idx} that does not exist in cluster cidrs configuration",
                    name(node)
                )
            })?;
            set.occupy(&cidr).map_err(|e| {
                format!(
                    "failed to mark cidr[{cidr}] at idx [{idx}] as occupied for node: {}: {e}",
                    name(node)
                )
            })?;
        }
        Ok(())
    }

    fn release(&mut self, node: &Value) {
        for (idx, s) in pod_cidrs(node).into_iter().enumerate() {
            if let (Ok(cidr), Some(set)) = (Cidr::parse(s), self.sets.get_mut(idx))
                && let Err(e) = set.release(&cidr)
            {
                tracing::warn!(node = %name(node), cidr = %s, error = %e, "nodeipam: error when releasing CIDR");
            }
        }
    }

    /// One block from each cluster CIDR, or none at all.
    fn allocate(&mut self) -> Result<Vec<Cidr>, String> {
        let mut got = Vec::new();
        for idx in 0..self.sets.len() {
            match self.sets[idx].allocate_next() {
                Ok(c) => got.push(c),
                Err(e) => {
                    for (i, c) in got.iter().enumerate() {
                        let _ = self.sets[i].release(c);
                    }
                    return Err(format!(
                        "failed to allocate cidr from cluster cidr at idx:{idx}: {e}"
                    ));
                }
            }
        }
        Ok(got)
    }
}

/// What to do for one Node on an add or update (upstream's AllocateOrOccupyCIDR).
fn allocate_or_occupy(st: &ApiState, alloc: &mut RangeAllocator, rec: &Recorder, node: &Value) {
    if !pod_cidrs(node).is_empty() {
        if let Err(e) = alloc.occupy(node) {
            tracing::error!(node = %name(node), error = %e, "nodeipam: cannot occupy the node's pod CIDRs");
        }
        return;
    }
    let cidrs = match alloc.allocate() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(node = %name(node), error = %e, "nodeipam: no pod CIDR for node");
            StatusChange::CidrNotAvailable.record(st, rec, node);
            return;
        }
    };
    let strings: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
    let key = objects::key_of("", "nodes", None, name(node));
    // The Node may have got CIDRs meanwhile (another writer): then ours go back.
    let mut already = false;
    let result = objects::modify(st, &key, &mut |n| {
        if !pod_cidrs(n).is_empty() {
            already = true;
            return false;
        }
        n["spec"]["podCIDR"] = json!(strings[0]);
        n["spec"]["podCIDRs"] = json!(strings);
        true
    });
    match result {
        Ok(Some(_)) => {
            tracing::info!(node = %name(node), cidrs = ?strings, "Set Node PodCIDR");
        }
        Ok(None) => {
            if already {
                tracing::warn!(node = %name(node), "nodeipam: node already has a CIDR allocated; releasing the new one");
            }
            for (set, c) in alloc.sets.iter_mut().zip(&cidrs) {
                let _ = set.release(c);
            }
        }
        Err(e) => {
            tracing::error!(node = %name(node), cidrs = ?strings, error = %e, "nodeipam: failed to update Node PodCIDR");
            StatusChange::CidrAssignmentFailed.record(st, rec, node);
            for (set, c) in alloc.sets.iter_mut().zip(&cidrs) {
                let _ = set.release(c);
            }
        }
    }
}

/// Occupies what every Node holds, then allocates to those without (a start or a re-list).
fn sync_all(st: &ApiState, cfg: &NodeIpamConfig, rec: &Recorder, nodes: &Cache) -> RangeAllocator {
    let mut alloc = RangeAllocator::new(cfg);
    let mut all: Vec<&Arc<Value>> = nodes.objects.values().collect();
    // Deterministic order, so a restart hands blocks out as the first run did.
    all.sort_by_key(|n| {
        (
            n.pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            name(n).to_string(),
        )
    });
    for n in &all {
        if let Err(e) = alloc.occupy(n) {
            tracing::error!(node = %name(n), error = %e, "nodeipam: cannot occupy the node's pod CIDRs");
        }
    }
    for n in all {
        if pod_cidrs(n).is_empty() {
            allocate_or_occupy(st, &mut alloc, rec, n);
        }
    }
    alloc
}

pub async fn run(st: Arc<ApiState>, cfg: NodeIpamConfig) {
    let rec = Recorder::new("cidrAllocator");
    let mut nodes = Cache::new(st.store.clone(), "/core/nodes/");
    tracing::info!(cluster_cidrs = ?cfg.sets.iter().map(|(c, m)| format!("{c} (/{m} per node)")).collect::<Vec<_>>(), "Starting range CIDR allocator");
    let mut alloc = sync_all(&st, &cfg, &rec, &nodes);
    loop {
        match nodes.next().await {
            Change::Relisted => alloc = sync_all(&st, &cfg, &rec, &nodes),
            Change::Event(ev) => match ev.kind {
                EventKind::Added | EventKind::Modified => {
                    allocate_or_occupy(&st, &mut alloc, &rec, &ev.object)
                }
                EventKind::Deleted => alloc.release(&ev.object),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVC: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 96, 0, 0), 12);

    fn flags(cidr: &str) -> NodeIpamFlags<'_> {
        NodeIpamFlags {
            allocate_node_cidrs: true,
            cluster_cidr: Some(cidr),
            ..Default::default()
        }
    }

    fn masks(c: &Result<Option<NodeIpamConfig>, String>) -> Vec<String> {
        c.as_ref()
            .unwrap()
            .as_ref()
            .unwrap()
            .sets
            .iter()
            .map(|(c, m)| format!("{c}:{m}"))
            .collect()
    }

    #[test]
    fn flags_resolve_with_upstreams_defaults() {
        assert_eq!(config(&NodeIpamFlags::default(), SVC), Ok(None));
        assert_eq!(
            masks(&config(&flags("10.42.0.0/16"), SVC)),
            ["10.42.0.0/16:24"]
        );
        assert_eq!(
            masks(&config(&flags("fd00:42::/56"), SVC)),
            ["fd00:42::/56:64"]
        );
        assert_eq!(
            masks(&config(&flags("10.42.0.0/16,fd00:42::/56"), SVC)),
            ["10.42.0.0/16:24", "fd00:42::/56:64"]
        );
        let f = NodeIpamFlags {
            node_cidr_mask_size: Some(26),
            ..flags("10.42.0.0/16")
        };
        assert_eq!(masks(&config(&f, SVC)), ["10.42.0.0/16:26"]);
        let f = NodeIpamFlags {
            node_cidr_mask_size_ipv4: Some(25),
            node_cidr_mask_size_ipv6: Some(60),
            ..flags("fd00:42::/48,10.42.0.0/16")
        };
        assert_eq!(
            masks(&config(&f, SVC)),
            ["fd00:42::/48:60", "10.42.0.0/16:25"]
        );
    }

    #[test]
    fn bad_flags_are_refused_with_a_reason() {
        let cases: Vec<(NodeIpamFlags<'_>, &str)> = vec![
            (
                NodeIpamFlags {
                    allocate_node_cidrs: true,
                    ..Default::default()
                },
                "--cluster-cidr is required",
            ),
            (flags("10.42.0.0"), "invalid --cluster-cidr"),
            (flags("10.42.0.0/16,10.43.0.0/16"), "one IPv4 and one IPv6"),
            (flags("10.42.0.0/16,10.42.0.0/20"), "overlap"),
            (flags("10.42.0.0/16,fd00::/56,fd01::/56"), "at most two"),
            (flags("10.96.0.0/16"), "overlaps --service-cluster-ip-range"),
            (flags("10.0.0.0/8"), "overlaps --service-cluster-ip-range"),
            (
                NodeIpamFlags {
                    node_cidr_mask_size: Some(12),
                    ..flags("10.42.0.0/16")
                },
                "--node-cidr-mask-size",
            ),
            (
                NodeIpamFlags {
                    node_cidr_mask_size: Some(24),
                    ..flags("10.42.0.0/16,fd00::/56")
                },
                "not allowed with dual-stack",
            ),
            (
                NodeIpamFlags {
                    node_cidr_mask_size_ipv6: Some(64),
                    ..flags("10.42.0.0/16")
                },
                "--node-cidr-mask-size-ipv6 is not allowed",
            ),
            (flags("fd00::/32"), "--node-cidr-mask-size"),
        ];
        for (f, want) in cases {
            let err = config(&f, SVC).unwrap_err();
            assert!(err.contains(want), "{f:?}: {err}");
        }
    }

    #[test]
    fn allocator_occupies_allocates_and_releases_per_node() {
        let cfg = config(&flags("10.42.0.0/22,fd00:42::/63"), SVC)
            .unwrap()
            .unwrap();
        let mut a = RangeAllocator::new(&cfg);
        let held = json!({"metadata": {"name": "a"}, "spec": {"podCIDR": "10.42.0.0/24", "podCIDRs": ["10.42.0.0/24", "fd00:42::/64"]}});
        a.occupy(&held).unwrap();
        let got: Vec<String> = a
            .allocate()
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, ["10.42.1.0/24", "fd00:42:0:1::/64"]);
        // The IPv6 range is exhausted: the failed allocation names it and gives back the
        // IPv4 block (10.42.2.0/24) it had taken.
        let err = a.allocate().unwrap_err();
        assert_eq!(
            err,
            "failed to allocate cidr from cluster cidr at idx:1: CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range"
        );
        assert_eq!(
            a.sets[0].allocate_next().unwrap().to_string(),
            "10.42.3.0/24"
        );
        assert_eq!(
            a.sets[0].allocate_next().unwrap().to_string(),
            "10.42.2.0/24"
        );
        // A deleted node's blocks come back.
        a.release(&held);
        let got: Vec<String> = a
            .allocate()
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, ["10.42.0.0/24", "fd00:42::/64"]);
        let outside = json!({"metadata": {"name": "b"}, "spec": {"podCIDRs": ["10.43.0.0/24"]}});
        let err = a.occupy(&outside).unwrap_err();
        assert!(err.contains("out the range"), "{err}");
        let extra = json!({"metadata": {"name": "c"}, "spec": {"podCIDRs": ["10.42.2.0/24", "fd00:42::/64", "10.42.3.0/24"]}});
        assert!(a.occupy(&extra).unwrap_err().contains("index:2"));
    }
}
