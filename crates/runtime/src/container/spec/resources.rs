//! cgroup resources (containerd's `WithResources`), the OOM score adjustment
//! (`WithOOMScoreAdj` with `restrict_oom_score_adj`), and the cgroups path.

use std::collections::HashMap;

use cri::runtime::v1::LinuxContainerResources;
use oci_spec::runtime::{
    LinuxCpu, LinuxDeviceCgroup, LinuxHugepageLimit, LinuxMemory, LinuxResources,
};

use super::{HostFacts, SpecError};

fn non_negative(v: i64, field: &str) -> Result<u64, SpecError> {
    u64::try_from(v).map_err(|_| {
        SpecError::InvalidArgument(format!(
            "linux.resources.{field} must not be negative, got {v}"
        ))
    })
}

/// The resources section: the device rules always, CPU and memory (as empty objects when
/// unset, like containerd) and the rest when the CRI config has resources.
pub(crate) fn build(
    res: Option<&LinuxContainerResources>,
    device_rules: Vec<LinuxDeviceCgroup>,
    host: &HostFacts,
    container_id: &str,
) -> Result<LinuxResources, SpecError> {
    let mut out = LinuxResources::default();
    out.set_devices(Some(device_rules));
    let Some(res) = res else { return Ok(out) };

    let mut cpu = LinuxCpu::default();
    if res.cpu_period != 0 {
        cpu.set_period(Some(non_negative(res.cpu_period, "cpu_period")?));
    }
    if res.cpu_quota != 0 {
        cpu.set_quota(Some(res.cpu_quota));
    }
    if res.cpu_shares != 0 {
        cpu.set_shares(Some(non_negative(res.cpu_shares, "cpu_shares")?));
    }
    if !res.cpuset_cpus.is_empty() {
        cpu.set_cpus(Some(res.cpuset_cpus.clone()));
    }
    if !res.cpuset_mems.is_empty() {
        cpu.set_mems(Some(res.cpuset_mems.clone()));
    }
    out.set_cpu(Some(cpu));

    let mut memory = LinuxMemory::default();
    let limit = res.memory_limit_in_bytes;
    let swap = res.memory_swap_limit_in_bytes;
    if limit != 0 {
        memory.set_limit(Some(limit));
        // memory+swap equal to memory: no swapping by default.
        if swap == 0 && host.swap_controller {
            memory.set_swap(Some(limit));
        }
    }
    if swap != 0 && host.swap_controller {
        memory.set_swap(Some(swap));
    }
    out.set_memory(Some(memory));

    if !res.hugepage_limits.is_empty() {
        if host.hugetlb_controller {
            let limits = res
                .hugepage_limits
                .iter()
                .map(|h| {
                    let limit = i64::try_from(h.limit).map_err(|_| {
                        SpecError::InvalidArgument(format!(
                            "linux.resources.hugepage_limits: limit {} for page size {} is too large",
                            h.limit, h.page_size
                        ))
                    })?;
                    let mut l = LinuxHugepageLimit::default();
                    l.set_page_size(h.page_size.clone());
                    l.set_limit(limit);
                    Ok(l)
                })
                .collect::<Result<Vec<_>, SpecError>>()?;
            out.set_hugepage_limits(Some(limits));
        } else {
            tracing::warn!(
                container_id,
                "hugetlb cgroup controller is absent, skipping huge pages limits"
            );
        }
    }

    if !res.unified.is_empty() {
        out.set_unified(Some(
            res.unified
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<HashMap<_, _>>(),
        ));
    }
    Ok(out)
}

/// The process's `oom_score_adj`: only when the CRI config has resources; never below the
/// runtime's own value (`floor`), since lowering it needs CAP_SYS_RESOURCE.
pub(crate) fn oom_score_adj(
    res: Option<&LinuxContainerResources>,
    floor: i32,
    container_id: &str,
) -> Result<Option<i32>, SpecError> {
    let Some(res) = res else { return Ok(None) };
    let wanted = res.oom_score_adj;
    if !(-1000..=1000).contains(&wanted) {
        return Err(SpecError::InvalidArgument(format!(
            "linux.resources.oom_score_adj {wanted} is outside -1000..=1000"
        )));
    }
    let wanted = wanted as i32;
    if wanted < floor {
        tracing::info!(
            container_id,
            requested = wanted,
            applied = floor,
            "oom_score_adj clamped to the runtime's own value (restrict_oom_score_adj)"
        );
        return Ok(Some(floor));
    }
    Ok(Some(wanted))
}

/// The unit name prefix of containers' scopes (containerd's is `cri-containerd`).
pub(crate) const SYSTEMD_SCOPE_PREFIX: &str = "cri-nodus";

/// containerd's `getCgroupsPath`: `<parent>/<id>` for cgroupfs parents, `slice:cri-nodus:id`
/// for systemd slices (the kubelet passes the slice's expanded path; its last component is
/// the slice); containerd's namespaced default without a parent. With `systemd-cgroup` the
/// path is always in systemd's form (a parent that is no slice leaves runc's default,
/// system.slice).
pub(crate) fn cgroups_path(parent: &str, container_id: &str, systemd: bool) -> String {
    let base = parent
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("");
    if base.ends_with(".slice") {
        return format!("{base}:{SYSTEMD_SCOPE_PREFIX}:{container_id}");
    }
    if systemd {
        return format!(":{SYSTEMD_SCOPE_PREFIX}:{container_id}");
    }
    if parent.is_empty() {
        return format!("/k8s.io/{container_id}");
    }
    super::mounts::clean(&format!("{parent}/{container_id}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::runtime::v1::HugepageLimit;

    fn facts(swap: bool, hugetlb: bool) -> HostFacts {
        HostFacts {
            cgroup_v2: false,
            swap_controller: swap,
            hugetlb_controller: hugetlb,
            current_caps: vec![],
            hostname: "node".into(),
            seccomp_enabled: true,
            mountinfo_path: "/proc/self/mountinfo".into(),
            dev_dir: "/dev".into(),
        }
    }

    #[test]
    fn resources_table() {
        let full = LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 64 << 20,
            cpuset_cpus: "0-1".into(),
            cpuset_mems: "0".into(),
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 4 << 20,
            }],
            unified: [("memory.high".to_string(), "1000".to_string())].into(),
            ..Default::default()
        };
        let r = build(Some(&full), vec![], &facts(true, true), "c").unwrap();
        let cpu = r.cpu().clone().unwrap();
        assert_eq!(
            (cpu.period(), cpu.quota(), cpu.shares()),
            (Some(100_000), Some(50_000), Some(512))
        );
        assert_eq!(
            (cpu.cpus().as_deref(), cpu.mems().as_deref()),
            (Some("0-1"), Some("0"))
        );
        let mem = r.memory().unwrap();
        assert_eq!((mem.limit(), mem.swap()), (Some(64 << 20), Some(64 << 20)));
        assert_eq!(r.hugepage_limits().as_ref().unwrap()[0].page_size(), "2MB");
        assert_eq!(r.unified().as_ref().unwrap()["memory.high"], "1000");

        // No swap accounting: no swap limit; no hugetlb: limits skipped.
        let r = build(Some(&full), vec![], &facts(false, false), "c").unwrap();
        assert_eq!(r.memory().unwrap().swap(), None);
        assert!(r.hugepage_limits().is_none());

        // An explicit swap limit wins.
        let swap = LinuxContainerResources {
            memory_limit_in_bytes: 100,
            memory_swap_limit_in_bytes: 300,
            ..Default::default()
        };
        assert_eq!(
            build(Some(&swap), vec![], &facts(true, true), "c")
                .unwrap()
                .memory()
                .unwrap()
                .swap(),
            Some(300)
        );

        // Empty resources: empty cpu/memory objects; none: only devices.
        let r = build(
            Some(&LinuxContainerResources::default()),
            vec![],
            &facts(true, true),
            "c",
        )
        .unwrap();
        assert_eq!(r.cpu(), &Some(LinuxCpu::default()));
        assert_eq!(r.memory(), &Some(LinuxMemory::default()));
        let r = build(None, vec![], &facts(true, true), "c").unwrap();
        assert!(r.cpu().is_none() && r.memory().is_none());
        assert_eq!(r.devices(), &Some(vec![]));

        let bad = LinuxContainerResources {
            cpu_shares: -2,
            ..Default::default()
        };
        let err = build(Some(&bad), vec![], &facts(true, true), "c").unwrap_err();
        assert!(
            err.to_string().contains("cpu_shares must not be negative"),
            "{err}"
        );
    }

    #[test]
    fn oom_clamp() {
        let res = |adj| LinuxContainerResources {
            oom_score_adj: adj,
            ..Default::default()
        };
        assert_eq!(oom_score_adj(None, 0, "c").unwrap(), None);
        assert_eq!(oom_score_adj(Some(&res(-998)), 0, "c").unwrap(), Some(0));
        assert_eq!(
            oom_score_adj(Some(&res(-998)), -999, "c").unwrap(),
            Some(-998)
        );
        assert_eq!(oom_score_adj(Some(&res(1000)), 0, "c").unwrap(), Some(1000));
        assert_eq!(oom_score_adj(Some(&res(0)), 0, "c").unwrap(), Some(0));
        assert_eq!(oom_score_adj(Some(&res(5)), 10, "c").unwrap(), Some(10));
        assert!(oom_score_adj(Some(&res(1001)), 0, "c").is_err());
    }

    #[test]
    fn cgroups_paths() {
        assert_eq!(
            cgroups_path("/kubepods/burstable/pod123", "abc", false),
            "/kubepods/burstable/pod123/abc"
        );
        assert_eq!(cgroups_path("/kubepods/", "abc", false), "/kubepods/abc");
        assert_eq!(
            cgroups_path("kubepods-burstable-pod1.slice", "abc", false),
            "kubepods-burstable-pod1.slice:cri-nodus:abc"
        );
        assert_eq!(cgroups_path("", "abc", false), "/k8s.io/abc");
        // The systemd driver's kubelet passes the expanded slice path.
        assert_eq!(
            cgroups_path(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice",
                "abc",
                true
            ),
            "kubepods-burstable-pod1.slice:cri-nodus:abc"
        );
        assert_eq!(cgroups_path("", "abc", true), ":cri-nodus:abc");
    }
}
