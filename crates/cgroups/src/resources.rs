//! The limits a cgroup can be given, their validation, and the conversions between the
//! kubelet's units and the kernel's files (shares → v2 weight, quota/period → `cpu.max`,
//! milli-CPU → shares/quota).

use crate::error::CgroupError;

/// cgroup v1 `cpu.shares` bounds (the kernel's MIN_SHARES / MAX_SHARES); the kubelet's
/// BestEffort tier gets the minimum.
pub const MIN_SHARES: u64 = 2;
pub const MAX_SHARES: u64 = 262_144;
pub const SHARES_PER_CPU: u64 = 1024;
/// The default CFS period (100ms), in microseconds.
pub const DEFAULT_CPU_PERIOD: u64 = 100_000;
/// The kernel's minimum CFS quota and period (1ms), in microseconds.
pub const MIN_QUOTA_PERIOD: i64 = 1_000;
/// The kernel's maximum CFS period (1s), in microseconds.
pub const MAX_CPU_PERIOD: u64 = 1_000_000;
/// cgroup v2 `cpu.weight` bounds.
pub const MIN_WEIGHT: u64 = 1;
pub const MAX_WEIGHT: u64 = 10_000;

/// Limits to set on a cgroup. `None` (and an empty `hugetlb`) leaves a setting unchanged.
/// `-1` means "unlimited" where the field allows it (`max` on v2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// v1 `cpu.shares` (2..=262144); on v2 converted to `cpu.weight` by [`shares_to_weight`].
    pub cpu_shares: Option<u64>,
    /// CFS quota in µs per period: -1 (unlimited) or ≥ 1000.
    pub cpu_quota: Option<i64>,
    /// CFS period in µs (1000..=1000000).
    pub cpu_period: Option<u64>,
    /// Bytes: -1 (unlimited) or > 0.
    pub memory_limit: Option<i64>,
    /// v2 `memory.high` in bytes: -1 (unlimited) or > 0. v1 has no equivalent; ignored there,
    /// as upstream's v1 driver does.
    pub memory_high: Option<i64>,
    /// v2 `memory.min` in bytes (≥ 0): memory the kernel does not reclaim from the cgroup;
    /// the kubelet's MemoryQoS sets it to the requests. Ignored on v1, which has no
    /// equivalent.
    pub memory_min: Option<i64>,
    /// -1 (unlimited) or > 0.
    pub pids_limit: Option<i64>,
    /// A cpu list such as `0-3,6`.
    pub cpuset_cpus: Option<String>,
    /// A NUMA node list such as `0`.
    pub cpuset_mems: Option<String>,
    /// (page size as the kernel names it, e.g. `2MB` or `1GB`; limit in bytes).
    pub hugetlb: Vec<(String, u64)>,
}

impl Resources {
    /// True when nothing would be written.
    pub fn is_empty(&self) -> bool {
        *self == Resources::default()
    }

    /// Rejects values the kernel would refuse or silently clamp, naming the field.
    pub fn validate(&self) -> Result<(), CgroupError> {
        fn bad(field: &'static str, reason: String) -> Result<(), CgroupError> {
            Err(CgroupError::InvalidResource { field, reason })
        }
        if let Some(s) = self.cpu_shares
            && !(MIN_SHARES..=MAX_SHARES).contains(&s)
        {
            return bad(
                "cpu_shares",
                format!("{s} is outside {MIN_SHARES}..={MAX_SHARES}"),
            );
        }
        if let Some(q) = self.cpu_quota
            && q != -1
            && q < MIN_QUOTA_PERIOD
        {
            return bad(
                "cpu_quota",
                format!("{q} must be -1 (unlimited) or at least {MIN_QUOTA_PERIOD}µs"),
            );
        }
        if let Some(p) = self.cpu_period
            && !(MIN_QUOTA_PERIOD as u64..=MAX_CPU_PERIOD).contains(&p)
        {
            return bad(
                "cpu_period",
                format!("{p} is outside {MIN_QUOTA_PERIOD}..={MAX_CPU_PERIOD}µs"),
            );
        }
        for (field, v) in [
            ("memory_limit", self.memory_limit),
            ("memory_high", self.memory_high),
            ("pids_limit", self.pids_limit),
        ] {
            if let Some(v) = v
                && v != -1
                && v <= 0
            {
                return bad(field, format!("{v} must be -1 (unlimited) or positive"));
            }
        }
        if let Some(v) = self.memory_min
            && v < 0
        {
            return bad("memory_min", format!("{v} must not be negative"));
        }
        for (field, v) in [
            ("cpuset_cpus", &self.cpuset_cpus),
            ("cpuset_mems", &self.cpuset_mems),
        ] {
            if let Some(v) = v
                && !is_cpu_list(v)
            {
                return bad(field, format!("{v:?} is not a list like 0-3,6"));
            }
        }
        for (size, _) in &self.hugetlb {
            if !is_page_size(size) {
                return bad(
                    "hugetlb",
                    format!("page size {size:?} is not like 2MB or 1GB"),
                );
            }
        }
        Ok(())
    }
}

fn is_cpu_list(s: &str) -> bool {
    !s.is_empty()
        && s.split(',').all(|part| {
            let mut it = part.splitn(2, '-');
            let num = |x: Option<&str>| {
                x.is_some_and(|x| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit()))
            };
            let a = it.next();
            match it.next() {
                None => num(a),
                Some(b) => num(a) && num(Some(b)),
            }
        })
}

fn is_page_size(s: &str) -> bool {
    let Some(num) = s
        .strip_suffix("KB")
        .or_else(|| s.strip_suffix("MB"))
        .or_else(|| s.strip_suffix("GB"))
    else {
        return false;
    };
    !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit())
}

/// cgroup v1 `cpu.shares` → v2 `cpu.weight` as the v2 driver writes it: the conversion
/// opencontainers/cgroups adopted in 2025 (kubernetes issue 131216; runc 1.3.2/1.4, crun
/// 1.23), which upstream's kubelet now gets through its vendored libcontainer for the pod
/// and QoS cgroups. A quadratic in log2(shares) through the three points that matter:
/// 2 → 1, 1024 → 100 (the default weight, so a pod requesting one CPU weighs as much as a
/// systemd service), 262144 → 10000. The linear mapping used before
/// ([`shares_to_weight_linear`]) gave 1024 shares weight 39, so a one-CPU pod lost to every
/// default-weight service on the machine. 0 means "unset" and stays 0.
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    if shares <= MIN_SHARES {
        return MIN_WEIGHT;
    }
    if shares >= MAX_SHARES {
        return MAX_WEIGHT;
    }
    let l = (shares as f64).log2();
    let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
    (10f64.powf(exponent).ceil() as u64).clamp(MIN_WEIGHT, MAX_WEIGHT)
}

/// The inverse of [`shares_to_weight`], for reading a v2 cgroup back in v1 terms (to the
/// nearest share; a weight step spans several shares, so the round trip is approximate).
pub fn weight_to_shares(weight: u64) -> u64 {
    let w = weight.clamp(MIN_WEIGHT, MAX_WEIGHT) as f64;
    let e = w.log10() + 7.0 / 34.0;
    let l = (-125.0 + (125.0f64 * 125.0 + 4.0 * 612.0 * e).sqrt()) / 2.0;
    (2f64.powf(l).round() as u64).clamp(MIN_SHARES, MAX_SHARES)
}

/// The linear mapping of [2, 262144] onto [1, 10000] that runc, crun and upstream's kubelet
/// used until 2025: `1 + ((shares - 2) * 9999) / 262142`. Not written by the v2 driver;
/// kept to recognise (and compare with) weights written by older runtimes.
pub fn shares_to_weight_linear(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    let s = shares.clamp(MIN_SHARES, MAX_SHARES);
    (1 + ((s - 2) * 9999) / 262_142).clamp(MIN_WEIGHT, MAX_WEIGHT)
}

/// The v2 `cpu.max` line for a quota and period, as runc writes it: `max` when the quota is
/// absent or -1, followed by the period only when one is given (the kernel keeps the current
/// period otherwise, 100000 by default): `"max 100000"`, `"50000 100000"`, `"max"`. None
/// when neither is set (the file is left alone).
pub fn cpu_max(quota: Option<i64>, period: Option<u64>) -> Option<String> {
    if quota.is_none() && period.is_none() {
        return None;
    }
    let q = match quota {
        Some(q) if q > 0 => q.to_string(),
        _ => "max".to_string(),
    };
    Some(match period {
        Some(p) => format!("{q} {p}"),
        None => q,
    })
}

/// The kubelet's milli-CPU → `cpu.shares` (requests): 1024 per CPU, 0 → the minimum 2,
/// clamped to the kernel's range.
pub fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    if milli_cpu <= 0 {
        return MIN_SHARES;
    }
    ((milli_cpu as u64).saturating_mul(SHARES_PER_CPU) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// The kubelet's milli-CPU limit → CFS quota for `period` µs: 0 (no limit) → 0, otherwise
/// `milli * period / 1000`, at least the kernel minimum of 1000µs.
pub fn milli_cpu_to_quota(milli_cpu: i64, period: u64) -> i64 {
    if milli_cpu <= 0 {
        return 0;
    }
    let q = (milli_cpu as i128 * period as i128 / 1000).min(i64::MAX as i128) as i64;
    q.max(MIN_QUOTA_PERIOD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_to_weight_follows_opencontainers_quadratic_conversion() {
        // (shares, weight) of ConvertCPUSharesToCgroupV2Value since opencontainers/cgroups
        // adopted the quadratic form: the fixed points 2 → 1, 1024 → 100, 262144 → 10000,
        // and the kubelet's usual values between them.
        for (shares, weight) in [
            (0, 0),
            (1, 1),
            (2, 1),
            (3, 2),
            (10, 4),
            (102, 17),
            (512, 59),
            (1024, 100),
            (2048, 174),
            (4096, 303),
            (10_240, 639),
            (100_000, 4340),
            (262_143, 10_000),
            (262_144, 10_000),
            (u64::MAX, 10_000),
        ] {
            assert_eq!(shares_to_weight(shares), weight, "shares {shares}");
        }
    }

    #[test]
    fn weight_reads_back_as_nearby_shares() {
        for (weight, shares) in [(1, 2), (17, 102), (100, 1024), (10_000, 262_144)] {
            assert_eq!(weight_to_shares(weight), shares, "weight {weight}");
        }
        // A weight step spans several shares; the error stays within 2%.
        for s in [2u64, 102, 512, 1024, 2048, 4096, 10_240, 100_000, 262_144] {
            let back = weight_to_shares(shares_to_weight(s));
            assert!(back.abs_diff(s) * 50 <= s.max(100), "{s} -> {back}");
        }
    }

    #[test]
    fn linear_conversion_matches_the_old_runc_values() {
        for (shares, weight) in [
            (0, 0),
            (1, 1),
            (2, 1),
            (102, 4),
            (512, 20),
            (1024, 39),
            (2048, 79),
            (262_144, 10_000),
            (u64::MAX, 10_000),
        ] {
            assert_eq!(shares_to_weight_linear(shares), weight, "shares {shares}");
        }
    }

    #[test]
    fn cpu_max_lines() {
        assert_eq!(cpu_max(None, None), None);
        assert_eq!(cpu_max(None, Some(100_000)).as_deref(), Some("max 100000"));
        assert_eq!(cpu_max(Some(-1), None).as_deref(), Some("max"));
        assert_eq!(cpu_max(Some(20_000), None).as_deref(), Some("20000"));
        assert_eq!(
            cpu_max(Some(-1), Some(DEFAULT_CPU_PERIOD)).as_deref(),
            Some("max 100000")
        );
        assert_eq!(
            cpu_max(Some(50_000), Some(100_000)).as_deref(),
            Some("50000 100000")
        );
        assert_eq!(
            cpu_max(Some(25_000), Some(50_000)).as_deref(),
            Some("25000 50000")
        );
    }

    #[test]
    fn milli_cpu_conversions_match_the_kubelet() {
        // MilliCPUToShares: 0 → 2, 1 → 2 (rounds to 1, clamped), 100m → 102, 1 CPU → 1024.
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(500_000), MAX_SHARES);
        // MilliCPUToQuota: 0 → 0, 10m → 1000 (1ms floor), 100m → 10000, 2 CPUs → 200000.
        assert_eq!(milli_cpu_to_quota(0, 100_000), 0);
        assert_eq!(milli_cpu_to_quota(5, 100_000), 1000);
        assert_eq!(milli_cpu_to_quota(10, 100_000), 1000);
        assert_eq!(milli_cpu_to_quota(100, 100_000), 10_000);
        assert_eq!(milli_cpu_to_quota(2000, 100_000), 200_000);
        assert_eq!(milli_cpu_to_quota(250, 50_000), 12_500);
    }

    #[test]
    fn validation_names_the_field() {
        let bad = |r: Resources| r.validate().unwrap_err().to_string();
        assert_eq!(
            bad(Resources {
                memory_limit: Some(-5),
                ..Default::default()
            }),
            "invalid memory_limit: -5 must be -1 (unlimited) or positive"
        );
        assert!(
            bad(Resources {
                cpu_shares: Some(1),
                ..Default::default()
            })
            .starts_with("invalid cpu_shares:")
        );
        assert!(
            bad(Resources {
                cpu_quota: Some(10),
                ..Default::default()
            })
            .starts_with("invalid cpu_quota:")
        );
        assert!(
            bad(Resources {
                cpu_period: Some(10_000_000),
                ..Default::default()
            })
            .starts_with("invalid cpu_period:")
        );
        assert!(
            bad(Resources {
                cpuset_cpus: Some("0-a".into()),
                ..Default::default()
            })
            .starts_with("invalid cpuset_cpus:")
        );
        assert!(
            bad(Resources {
                hugetlb: vec![("../x".into(), 1)],
                ..Default::default()
            })
            .starts_with("invalid hugetlb:")
        );
        assert!(
            Resources {
                cpu_shares: Some(2),
                cpu_quota: Some(-1),
                cpu_period: Some(100_000),
                memory_limit: Some(-1),
                pids_limit: Some(1024),
                cpuset_cpus: Some("0-1,3".into()),
                hugetlb: vec![("2MB".into(), 0)],
                ..Default::default()
            }
            .validate()
            .is_ok()
        );
    }
}
