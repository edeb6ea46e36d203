//! Node capacity read from the machine and Allocatable = Capacity − kubeReserved −
//! systemReserved − hard eviction thresholds (upstream's GetNodeAllocatableAbsolute).

use std::collections::BTreeMap;
use std::path::Path;

/// Resources as the kubelet counts them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeResources {
    pub cpu_milli: i64,
    pub memory_bytes: i64,
    pub ephemeral_storage_bytes: i64,
    pub pods: i64,
    /// e.g. ("hugepages-2Mi", bytes)
    pub hugepages: Vec<(String, i64)>,
}

/// What the machine has: CPUs online, MemTotal, the root-dir filesystem, `maxPods`,
/// hugepages by size.
pub fn machine_capacity(root_dir: &Path, max_pods: i64) -> NodeResources {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as i64)
        .unwrap_or(1);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kb = |key: &str| -> i64 {
        meminfo
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let storage = nix::sys::statvfs::statvfs(root_dir)
        .map(|s| s.blocks() as i64 * s.fragment_size() as i64)
        .unwrap_or(0);
    let mut hugepages = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/sys/kernel/mm/hugepages") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            // hugepages-2048kB → hugepages-2Mi
            if let Some(kbs) = name
                .strip_prefix("hugepages-")
                .and_then(|s| s.strip_suffix("kB"))
                .and_then(|s| s.parse::<i64>().ok())
            {
                let count: i64 = std::fs::read_to_string(e.path().join("nr_hugepages"))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                hugepages.push((hugepage_resource_name(kbs * 1024), count * kbs * 1024));
            }
        }
    }
    hugepages.sort();
    NodeResources {
        cpu_milli: cpus * 1000,
        memory_bytes: kb("MemTotal:") * 1024,
        ephemeral_storage_bytes: storage,
        pods: max_pods,
        hugepages,
    }
}

/// The resource name of a hugepage size (upstream's HugePageResourceName):
/// 2097152 → `hugepages-2Mi`, 1073741824 → `hugepages-1Gi`.
pub fn hugepage_resource_name(page_bytes: i64) -> String {
    use nodus_k8s::quantity::{Format, ParsedQuantity};
    let q = ParsedQuantity::from_nanos(i128::from(page_bytes) * 1_000_000_000, Format::BinarySI);
    format!("hugepages-{}", q.canonical())
}

/// kubeReserved / systemReserved as given (`{cpu: 100m, memory: 100Mi, …}`), parsed.
pub fn parse_reserved(
    field: &str,
    map: &BTreeMap<String, String>,
) -> Result<NodeResources, String> {
    let mut r = NodeResources::default();
    for (k, v) in map {
        let q = nodus_k8s::quantity::parse_quantity(v)
            .map_err(|e| format!("{field}: invalid quantity {v:?} for {k}: {e}"))?;
        if q.milli_value() < 0 {
            return Err(format!("{field}: {k} must not be negative, got {v:?}"));
        }
        match k.as_str() {
            "cpu" => r.cpu_milli = q.milli_value(),
            "memory" => r.memory_bytes = q.value(),
            "ephemeral-storage" => r.ephemeral_storage_bytes = q.value(),
            "pid" => r.pods = 0,
            other => {
                return Err(format!(
                    "{field}: unsupported resource {other:?} (cpu, memory, ephemeral-storage, pid)"
                ));
            }
        }
    }
    Ok(r)
}

/// upstream's default evictionHard.
pub fn default_eviction_hard() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("memory.available".into(), "100Mi".into()),
        ("nodefs.available".into(), "10%".into()),
        ("imagefs.available".into(), "15%".into()),
        ("nodefs.inodesFree".into(), "5%".into()),
    ])
}

/// A threshold in absolute terms: `100Mi` or `10%` of `capacity`.
pub(crate) fn threshold(field: &str, key: &str, v: &str, capacity: i64) -> Result<i64, String> {
    if let Some(p) = v.strip_suffix('%') {
        let pct: f64 = p
            .parse()
            .map_err(|_| format!("{field}: invalid percentage {v:?} for {key}"))?;
        if !(0.0..=100.0).contains(&pct) {
            return Err(format!(
                "{field}: percentage {v:?} for {key} is out of range"
            ));
        }
        return Ok((capacity as f64 * pct / 100.0) as i64);
    }
    let q = nodus_k8s::quantity::parse_quantity(v)
        .map_err(|e| format!("{field}: invalid quantity {v:?} for {key}: {e}"))?;
    if q.milli_value() < 0 {
        return Err(format!("{field}: {key} must not be negative"));
    }
    Ok(q.value())
}

/// Allocatable from capacity, reservations and the hard eviction thresholds that reserve
/// memory and node filesystem space.
pub fn allocatable(
    capacity: &NodeResources,
    kube: &NodeResources,
    system: &NodeResources,
    eviction_hard: &BTreeMap<String, String>,
) -> Result<NodeResources, String> {
    let mut evict_mem = 0;
    let mut evict_fs = 0;
    for (k, v) in eviction_hard {
        match k.as_str() {
            "memory.available" => {
                evict_mem = threshold("evictionHard", k, v, capacity.memory_bytes)?
            }
            "nodefs.available" => {
                evict_fs = threshold("evictionHard", k, v, capacity.ephemeral_storage_bytes)?
            }
            "imagefs.available" | "nodefs.inodesFree" | "imagefs.inodesFree" | "pid.available" => {
                // Validated for form; they do not reserve Allocatable.
                if !v.ends_with('%') {
                    nodus_k8s::quantity::parse_quantity(v).map_err(|e| {
                        format!("evictionHard: invalid quantity {v:?} for {k}: {e}")
                    })?;
                }
            }
            other => return Err(format!("evictionHard: unknown eviction signal {other:?}")),
        }
    }
    let sub = |c: i64, parts: &[i64]| (c - parts.iter().sum::<i64>()).max(0);
    Ok(NodeResources {
        cpu_milli: sub(capacity.cpu_milli, &[kube.cpu_milli, system.cpu_milli]),
        memory_bytes: sub(
            capacity.memory_bytes,
            &[kube.memory_bytes, system.memory_bytes, evict_mem],
        ),
        ephemeral_storage_bytes: sub(
            capacity.ephemeral_storage_bytes,
            &[
                kube.ephemeral_storage_bytes,
                system.ephemeral_storage_bytes,
                evict_fs,
            ],
        ),
        pods: capacity.pods,
        hugepages: capacity.hugepages.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocatable_subtracts_reservations_and_eviction() {
        let cap = NodeResources {
            cpu_milli: 2000,
            memory_bytes: 4 << 30,
            ephemeral_storage_bytes: 100 << 30,
            pods: 110,
            hugepages: vec![],
        };
        let kube = parse_reserved(
            "kubeReserved",
            &BTreeMap::from([
                ("cpu".into(), "100m".into()),
                ("memory".into(), "256Mi".into()),
            ]),
        )
        .unwrap();
        let system = parse_reserved(
            "systemReserved",
            &BTreeMap::from([("cpu".into(), "200m".into())]),
        )
        .unwrap();
        let a = allocatable(&cap, &kube, &system, &default_eviction_hard()).unwrap();
        assert_eq!(a.cpu_milli, 1700);
        assert_eq!(a.memory_bytes, (4 << 30) - (256 << 20) - (100 << 20));
        assert_eq!(a.ephemeral_storage_bytes, (100 << 30) - (10 << 30));
        assert_eq!(a.pods, 110);
    }

    #[test]
    fn bad_quantities_name_the_field() {
        let e = parse_reserved(
            "kubeReserved",
            &BTreeMap::from([("memory".into(), "100Mx".into())]),
        )
        .unwrap_err();
        assert!(
            e.starts_with("kubeReserved: invalid quantity \"100Mx\" for memory"),
            "{e}"
        );
        let e = parse_reserved(
            "systemReserved",
            &BTreeMap::from([("cpu".into(), "-1".into())]),
        )
        .unwrap_err();
        assert!(e.contains("must not be negative"), "{e}");
        let e = allocatable(
            &NodeResources::default(),
            &NodeResources::default(),
            &NodeResources::default(),
            &BTreeMap::from([("memory.avail".into(), "1Mi".into())]),
        )
        .unwrap_err();
        assert!(e.contains("memory.avail"), "{e}");
    }
}
