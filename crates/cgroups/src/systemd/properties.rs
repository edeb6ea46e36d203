//! The unit properties a slice gets from [`Resources`], as runc's systemd driver builds them
//! for the kubelet: accounting on, no default dependencies, the parent slice wanted, and each
//! limit under the name systemd's D-Bus API gives it (`MemoryMax`, `CPUWeight`,
//! `CPUQuotaPerSecUSec`, `TasksMax`, `AllowedCPUs`, …). Pure, so the D-Bus side only
//! translates [`Prop`] values into D-Bus variants.

use crate::resources::{Resources, shares_to_weight};

/// systemd's "infinity" for a 64-bit limit.
pub const INFINITY: u64 = u64::MAX;

/// A property value in the D-Bus types systemd expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prop {
    /// `b`
    Bool(bool),
    /// `t`
    U64(u64),
    /// `s`
    Str(String),
    /// `as`
    Strs(Vec<String>),
    /// `ay` (a CPU or NUMA node bitmask)
    Bytes(Vec<u8>),
}

/// What a new slice unit is started with: its description, the parent slice it lives in
/// (a slice names its parent by `Wants=`; `Delegate=` is only for the container scopes the
/// runtime starts, as in runc), accounting for every controller the kubelet reads, no
/// default dependencies (which would tie pod slices to shutdown.target ordering), then the
/// limits.
pub fn slice_properties(unit: &str, parent: &str, r: &Resources) -> Vec<(&'static str, Prop)> {
    let mut p = vec![
        ("Description", Prop::Str(format!("nodus cgroup {unit}"))),
        ("Wants", Prop::Strs(vec![parent.to_string()])),
        ("MemoryAccounting", Prop::Bool(true)),
        ("CPUAccounting", Prop::Bool(true)),
        ("IOAccounting", Prop::Bool(true)),
        ("TasksAccounting", Prop::Bool(true)),
        ("DefaultDependencies", Prop::Bool(false)),
    ];
    p.extend(resource_properties(r));
    p
}

/// The limits of `r` as unit properties (runc's `genV2ResourcesProperties` and the
/// `unified` keys it maps): -1 becomes infinity; what systemd has no property for (hugetlb)
/// is left to the cgroup files.
pub fn resource_properties(r: &Resources) -> Vec<(&'static str, Prop)> {
    let limit = |v: i64| Prop::U64(if v < 0 { INFINITY } else { v as u64 });
    let mut p = Vec::new();
    if let Some(v) = r.memory_limit {
        p.push(("MemoryMax", limit(v)));
    }
    if let Some(v) = r.memory_min {
        p.push(("MemoryMin", limit(v)));
    }
    if let Some(v) = r.memory_high {
        p.push(("MemoryHigh", limit(v)));
    }
    if let Some(s) = r.cpu_shares.filter(|s| *s > 0) {
        p.push(("CPUWeight", Prop::U64(shares_to_weight(s))));
    }
    if let Some(period) = r.cpu_period.filter(|p| *p > 0) {
        p.push(("CPUQuotaPeriodUSec", Prop::U64(period)));
    }
    if let Some(q) = r.cpu_quota {
        p.push((
            "CPUQuotaPerSecUSec",
            Prop::U64(quota_per_sec(q, r.cpu_period)),
        ));
    }
    if let Some(v) = r.pids_limit {
        p.push(("TasksMax", limit(v)));
    }
    if let Some(cpus) = r.cpuset_cpus.as_deref().and_then(list_to_bits) {
        p.push(("AllowedCPUs", Prop::Bytes(cpus)));
    }
    if let Some(mems) = r.cpuset_mems.as_deref().and_then(list_to_bits) {
        p.push(("AllowedMemoryNodes", Prop::Bytes(mems)));
    }
    p
}

/// A CFS quota per `period` µs as systemd's per-second quota: unlimited is infinity; systemd
/// keeps the value in 10ms steps of a second, so it is rounded up to the next step (runc's
/// `addCpuQuota`), and the exact `cpu.max` is written to the file afterwards.
pub fn quota_per_sec(quota: i64, period: Option<u64>) -> u64 {
    if quota <= 0 {
        return INFINITY;
    }
    let period = period
        .filter(|p| *p > 0)
        .unwrap_or(crate::resources::DEFAULT_CPU_PERIOD);
    let per_sec = (quota as u64).saturating_mul(1_000_000) / period;
    per_sec.div_ceil(10_000) * 10_000
}

/// A list such as `0-3,6` as the byte mask systemd takes for `AllowedCPUs` (bit j of byte
/// i is CPU 8i+j). None for a malformed list ([`Resources::validate`] refuses those first).
pub fn list_to_bits(list: &str) -> Option<Vec<u8>> {
    let mut bits: Vec<u8> = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        if b < a || b >= 1 << 16 {
            return None;
        }
        for cpu in a..=b {
            if bits.len() <= cpu / 8 {
                bits.resize(cpu / 8 + 1, 0);
            }
            bits[cpu / 8] |= 1 << (cpu % 8);
        }
    }
    (!bits.is_empty()).then_some(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burstable_pod_slice() {
        let r = Resources {
            cpu_shares: Some(1024),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 << 20),
            pids_limit: Some(-1),
            ..Default::default()
        };
        let p = slice_properties(
            "kubepods-burstable-pod1.slice",
            "kubepods-burstable.slice",
            &r,
        );
        let get = |k: &str| p.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        assert_eq!(
            get("Wants"),
            Some(Prop::Strs(vec!["kubepods-burstable.slice".into()]))
        );
        assert_eq!(get("DefaultDependencies"), Some(Prop::Bool(false)));
        assert_eq!(get("Delegate"), None);
        assert_eq!(get("MemoryAccounting"), Some(Prop::Bool(true)));
        assert_eq!(get("MemoryMax"), Some(Prop::U64(64 << 20)));
        assert_eq!(get("CPUWeight"), Some(Prop::U64(100)));
        assert_eq!(get("CPUQuotaPeriodUSec"), Some(Prop::U64(100_000)));
        assert_eq!(get("CPUQuotaPerSecUSec"), Some(Prop::U64(500_000)));
        assert_eq!(get("TasksMax"), Some(Prop::U64(INFINITY)));
        assert_eq!(get("MemoryMin"), None);
        assert_eq!(get("AllowedCPUs"), None);
    }

    #[test]
    fn memory_qos_and_cpusets() {
        let r = Resources {
            memory_min: Some(32 << 20),
            memory_high: Some(-1),
            memory_limit: Some(-1),
            cpuset_cpus: Some("0-3,9".into()),
            cpuset_mems: Some("0".into()),
            ..Default::default()
        };
        assert_eq!(
            resource_properties(&r),
            vec![
                ("MemoryMax", Prop::U64(INFINITY)),
                ("MemoryMin", Prop::U64(32 << 20)),
                ("MemoryHigh", Prop::U64(INFINITY)),
                ("AllowedCPUs", Prop::Bytes(vec![0b0000_1111, 0b0000_0010])),
                ("AllowedMemoryNodes", Prop::Bytes(vec![1])),
            ]
        );
        assert!(resource_properties(&Resources::default()).is_empty());
    }

    #[test]
    fn quotas_in_ten_millisecond_steps() {
        assert_eq!(quota_per_sec(-1, Some(100_000)), INFINITY);
        assert_eq!(quota_per_sec(100_000, Some(100_000)), 1_000_000);
        // 10m CPU: 1000µs per 100ms is 10ms per second.
        assert_eq!(quota_per_sec(1_000, Some(100_000)), 10_000);
        // 25m: 25ms per second rounds up to 30ms.
        assert_eq!(quota_per_sec(2_500, Some(100_000)), 30_000);
        assert_eq!(quota_per_sec(25_000, Some(50_000)), 500_000);
        assert_eq!(quota_per_sec(20_000, None), 200_000);
    }

    #[test]
    fn cpu_lists_as_masks() {
        assert_eq!(list_to_bits("0"), Some(vec![1]));
        assert_eq!(list_to_bits("7-8"), Some(vec![0x80, 0x01]));
        assert_eq!(list_to_bits("x"), None);
        assert_eq!(list_to_bits("3-1"), None);
    }
}
