//! `--reserved-memory` / KubeletConfiguration `reservedMemory`: the memory (and hugepages)
//! kept back from pods on each NUMA node, parsed and validated as upstream: the flag's
//! `0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi` syntax, the configuration checks
//! (supported types, non-zero, no duplicates), and at start the rule that per memory type
//! the reservations add up to what Node Allocatable holds back (kube-reserved +
//! system-reserved + the hard eviction threshold).

use super::machine::MachineInfo;
use nodus_k8s::quantity::{Format, ParsedQuantity, parse_quantity};
use serde::Deserialize;
use std::collections::BTreeMap;

/// upstream's MemoryReservation (a `reservedMemory` item).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryReservation {
    pub numa_node: i32,
    /// Memory type (`memory`, `hugepages-<size>`) → quantity.
    #[serde(default)]
    pub limits: BTreeMap<String, String>,
}

/// `memory` or `hugepages-<size>`: what the memory manager places.
pub(crate) fn is_memory_type(name: &str) -> bool {
    name == "memory" || name.starts_with("hugepages-")
}

/// One `--reserved-memory` value (upstream's ReservedMemoryVar.Set); the flag may repeat.
pub fn parse_flag(s: &str) -> Result<Vec<MemoryReservation>, String> {
    let mut out = Vec::new();
    if s.is_empty() {
        return Ok(out);
    }
    for reservation in s.split(';') {
        let parts: Vec<&str> = reservation.split(':').collect();
        if parts.len() != 2 {
            return Err(format!(
                "the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...], got {reservation}"
            ));
        }
        let numa_node: i32 = parts[0].parse().map_err(|_| {
            format!(
                "failed to convert the NUMA node ID, exptected integer, got {}",
                parts[0]
            )
        })?;
        let mut r = MemoryReservation {
            numa_node,
            limits: BTreeMap::new(),
        };
        for limit in parts[1].split(',') {
            let kv: Vec<&str> = limit.split('=').collect();
            if kv.len() != 2 {
                return Err(format!(
                    "the reserved limit has incorrect value, expected type=quantatity, got {limit}"
                ));
            }
            if !is_memory_type(kv[0]) {
                return Err(format!(
                    "memory type conversion error, unknown type: {:?}",
                    kv[0]
                ));
            }
            parse_quantity(kv[1]).map_err(|_| {
                format!(
                    "failed to parse the quantatity, expected quantatity, got {}",
                    kv[1]
                )
            })?;
            r.limits.insert(kv[0].to_string(), kv[1].to_string());
        }
        out.push(r);
    }
    Ok(out)
}

/// upstream's validateReservedMemoryConfiguration (the first problem found).
pub fn validate_config(reservations: &[MemoryReservation]) -> Result<(), String> {
    let mut seen: BTreeMap<i32, Vec<&str>> = BTreeMap::new();
    for r in reservations {
        let node = r.numa_node;
        for (name, q) in &r.limits {
            if !is_memory_type(name) {
                return Err(format!(
                    "invalid configuration: the limit type {name:?} for NUMA node {node} is not supported, only [memory hugepages-<HugePageSize>] is accepted"
                ));
            }
            let q = parse_quantity(q).map_err(|e| {
                format!(
                    "invalid configuration: reservedMemory: NUMA node {node}: {name}: {q:?}: {e}"
                )
            })?;
            if q.is_zero() {
                return Err(format!(
                    "invalid configuration: reserved memory may not be zero for NUMA node {node} and resource {name:?}"
                ));
            }
            let names = seen.entry(node).or_default();
            if names.contains(&name.as_str()) {
                return Err(format!(
                    "invalid configuration: the reserved memory has a duplicate value for NUMA node {node} and resource {name:?}"
                ));
            }
            names.push(name);
        }
    }
    Ok(())
}

/// A sum with Go's `Quantity.Add` formatting: the format of the first non-zero summand.
pub(crate) fn sum(parts: impl IntoIterator<Item = ParsedQuantity>) -> ParsedQuantity {
    let mut acc = ParsedQuantity::from_nanos(0, Format::DecimalSI);
    for p in parts {
        let format = if acc.is_zero() {
            p.format()
        } else {
            acc.format()
        };
        acc = ParsedQuantity::from_nanos(acc.nano_value() + p.nano_value(), format);
    }
    acc
}

/// NUMA node → memory type → bytes reserved (upstream's systemReservedMemory).
pub type SystemReservedMemory = BTreeMap<usize, BTreeMap<String, u64>>;

/// upstream's getSystemReservedMemory: the reservations must name nodes this machine has
/// and, per memory type, add up to `node_allocatable_reservation` (what kube-reserved,
/// system-reserved and the hard eviction threshold keep from Allocatable).
pub fn system_reserved_memory(
    machine: &MachineInfo,
    node_allocatable_reservation: &BTreeMap<String, ParsedQuantity>,
    reservations: &[MemoryReservation],
) -> Result<SystemReservedMemory, String> {
    let ids = machine.node_ids();
    let mut totals: BTreeMap<String, Vec<ParsedQuantity>> = BTreeMap::new();
    let mut out: SystemReservedMemory = ids.iter().map(|n| (*n, BTreeMap::new())).collect();
    for r in reservations {
        let Some(node) = usize::try_from(r.numa_node)
            .ok()
            .filter(|n| ids.contains(n))
        else {
            return Err(format!(
                "the reserved memory configuration references a NUMA node {} that does not exist on this machine",
                r.numa_node
            ));
        };
        for (name, q) in &r.limits {
            let q = parse_quantity(q).map_err(|e| format!("reservedMemory: {q:?}: {e}"))?;
            totals.entry(name.clone()).or_default().push(q);
            out.entry(node)
                .or_default()
                .insert(name.clone(), u64::try_from(q.value()).unwrap_or(0));
        }
    }
    let mut types: Vec<&String> = totals.keys().collect();
    types.extend(
        node_allocatable_reservation
            .keys()
            .filter(|k| is_memory_type(k)),
    );
    types.sort();
    types.dedup();
    for t in types {
        let allocatable = sum(node_allocatable_reservation.get(t).copied());
        let reserved = sum(totals.get(t).into_iter().flatten().copied());
        if allocatable.nano_value() != reserved.nano_value() {
            return Err(format!(
                "the total amount {:?} of type {t:?} is not equal to the value {:?} determined by Node Allocatable feature",
                reserved.canonical(),
                allocatable.canonical()
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::memorymanager::machine::NumaNode;

    fn q(s: &str) -> ParsedQuantity {
        parse_quantity(s).unwrap()
    }

    #[test]
    fn flag_syntax_as_upstream() {
        let r = parse_flag("0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].numa_node, 0);
        assert_eq!(r[0].limits["hugepages-1Gi"], "2Gi");
        assert_eq!(r[1].limits["memory"], "2Gi");
        assert_eq!(
            parse_flag("0memory=1Gi").unwrap_err(),
            "the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...], got 0memory=1Gi"
        );
        assert_eq!(
            parse_flag("a:memory=1Gi").unwrap_err(),
            "failed to convert the NUMA node ID, exptected integer, got a"
        );
        assert_eq!(
            parse_flag("0:memory").unwrap_err(),
            "the reserved limit has incorrect value, expected type=quantatity, got memory"
        );
        assert_eq!(
            parse_flag("0:cpu=1").unwrap_err(),
            "memory type conversion error, unknown type: \"cpu\""
        );
        assert_eq!(
            parse_flag("0:memory=1Gx").unwrap_err(),
            "failed to parse the quantatity, expected quantatity, got 1Gx"
        );
    }

    #[test]
    fn configuration_checks() {
        let r = |node, name: &str, v: &str| MemoryReservation {
            numa_node: node,
            limits: BTreeMap::from([(name.to_string(), v.to_string())]),
        };
        assert!(validate_config(&[r(0, "memory", "1Gi"), r(1, "memory", "1Gi")]).is_ok());
        assert_eq!(
            validate_config(&[r(0, "memory", "1Gi"), r(0, "memory", "2Gi")]).unwrap_err(),
            "invalid configuration: the reserved memory has a duplicate value for NUMA node 0 and resource \"memory\""
        );
        assert_eq!(
            validate_config(&[r(0, "memory", "0")]).unwrap_err(),
            "invalid configuration: reserved memory may not be zero for NUMA node 0 and resource \"memory\""
        );
        assert_eq!(
            validate_config(&[r(0, "cpu", "1")]).unwrap_err(),
            "invalid configuration: the limit type \"cpu\" for NUMA node 0 is not supported, only [memory hugepages-<HugePageSize>] is accepted"
        );
    }

    #[test]
    fn reservations_must_add_up_to_node_allocatable() {
        let machine = MachineInfo {
            nodes: (0..4)
                .map(|id| NumaNode {
                    id,
                    memory: 8 << 30,
                    hugepages: vec![],
                })
                .collect(),
        };
        let alloc = BTreeMap::from([("memory".to_string(), sum([q("1Gi"), q("100Mi")]))]);
        let ok = parse_flag("0:memory=1Gi;1:memory=100Mi").unwrap();
        let s = system_reserved_memory(&machine, &alloc, &ok).unwrap();
        assert_eq!(s[&0]["memory"], 1 << 30);
        assert_eq!(s[&1]["memory"], 100 << 20);
        assert!(s[&3].is_empty());
        let e = system_reserved_memory(&machine, &alloc, &parse_flag("0:memory=1Gi").unwrap())
            .unwrap_err();
        assert_eq!(
            e,
            "the total amount \"1Gi\" of type \"memory\" is not equal to the value \"1124Mi\" determined by Node Allocatable feature"
        );
        let e = system_reserved_memory(
            &machine,
            &alloc,
            &parse_flag("0:memory=1124Mi,hugepages-1Gi=1Gi").unwrap(),
        )
        .unwrap_err();
        assert_eq!(
            e,
            "the total amount \"1Gi\" of type \"hugepages-1Gi\" is not equal to the value \"0\" determined by Node Allocatable feature"
        );
        let e = system_reserved_memory(&machine, &alloc, &parse_flag("4:memory=1124Mi").unwrap())
            .unwrap_err();
        assert_eq!(
            e,
            "the reserved memory configuration references a NUMA node 4 that does not exist on this machine"
        );
    }
}
