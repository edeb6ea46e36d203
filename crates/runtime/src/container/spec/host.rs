//! Facts about the machine the spec is built on: the cgroup layout, the runtime process's own
//! capabilities, the host name. containerd probes the same things once at start; here they are
//! probed once per process ([`HostFacts::get`]) and can be replaced wholesale in tests.

use std::path::PathBuf;
use std::sync::OnceLock;

use oci_spec::runtime::Capability;

/// What the spec builder needs to know about the host.
#[derive(Debug, Clone)]
pub struct HostFacts {
    /// `/sys/fs/cgroup` is a cgroup2 mount (unified mode): containers get a cgroup namespace.
    pub cgroup_v2: bool,
    /// The memory controller accounts swap (`memory.memsw.*` on v1, `memory.swap.max` on v2):
    /// a memory limit then also sets the swap limit, as containerd does.
    pub swap_controller: bool,
    /// The hugetlb controller is usable; without it hugepage limits are skipped with a warning
    /// (containerd's default `tolerate_missing_hugetlb_controller = true`).
    pub hugetlb_controller: bool,
    /// The effective capabilities of the runtime process: what privileged containers and
    /// `add_capabilities: ["ALL"]` get (containerd's `cap.Current()`).
    pub current_caps: Vec<Capability>,
    /// The node's host name, for `HOSTNAME` when the sandbox has none (host network).
    pub hostname: String,
    /// The kernel supports seccomp filters.
    pub seccomp_enabled: bool,
    /// Where mount propagation of host paths is looked up.
    pub mountinfo_path: PathBuf,
    /// The host's device directory, walked for privileged containers.
    pub dev_dir: PathBuf,
}

impl HostFacts {
    /// The facts of this machine, probed on first use.
    pub fn get() -> &'static HostFacts {
        static FACTS: OnceLock<HostFacts> = OnceLock::new();
        FACTS.get_or_init(HostFacts::probe)
    }

    /// Probe the running machine.
    pub fn probe() -> HostFacts {
        let cgroup_v2 = nix::sys::statfs::statfs("/sys/fs/cgroup")
            .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
            .unwrap_or(false);
        let h = nodus_cgroups::Hierarchy::detect();
        HostFacts {
            cgroup_v2,
            swap_controller: probe_swap(&h),
            hugetlb_controller: probe_hugetlb(&h),
            current_caps: probe_current_caps(),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            seccomp_enabled: std::fs::read_to_string("/proc/self/status")
                .map(|s| s.lines().any(|l| l.starts_with("Seccomp:")))
                .unwrap_or(false),
            mountinfo_path: PathBuf::from("/proc/self/mountinfo"),
            dev_dir: PathBuf::from("/dev"),
        }
    }
}

fn probe_swap(h: &nodus_cgroups::Hierarchy) -> bool {
    if !h.is_v2() {
        return h
            .dir("memory", "/")
            .join("memory.memsw.limit_in_bytes")
            .exists();
    }
    // memory.swap.max does not exist in the root cgroup: look in our own.
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    nodus_cgroups::hierarchy::process_cgroup(&own, None)
        .is_some_and(|rel| h.dir("memory", &rel).join("memory.swap.max").exists())
}

/// On v1 only a v1 hugetlb mount counts: the OCI runtime does not use the hybrid cgroup2
/// mount for limits.
fn probe_hugetlb(h: &nodus_cgroups::Hierarchy) -> bool {
    if h.is_v2() {
        std::fs::read_to_string(h.root().join("cgroup.controllers"))
            .map(|c| c.split_whitespace().any(|c| c == "hugetlb"))
            .unwrap_or(false)
    } else {
        h.mount("hugetlb").is_some_and(|m| m.is_dir())
    }
}

fn probe_current_caps() -> Vec<Capability> {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Vec::new();
    };
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    caps_from_mask(mask)
}

/// The capabilities set in a kernel capability bit mask, lowest bit first.
pub(crate) fn caps_from_mask(mask: u64) -> Vec<Capability> {
    CAPS_BY_NUMBER
        .iter()
        .enumerate()
        .filter(|(bit, _)| mask & (1u64 << bit) != 0)
        .map(|(_, c)| *c)
        .collect()
}

/// Linux capabilities indexed by their number (`include/uapi/linux/capability.h`).
pub(crate) const CAPS_BY_NUMBER: [Capability; 41] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::DacReadSearch,
    Capability::Fowner,
    Capability::Fsetid,
    Capability::Kill,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setpcap,
    Capability::LinuxImmutable,
    Capability::NetBindService,
    Capability::NetBroadcast,
    Capability::NetAdmin,
    Capability::NetRaw,
    Capability::IpcLock,
    Capability::IpcOwner,
    Capability::SysModule,
    Capability::SysRawio,
    Capability::SysChroot,
    Capability::SysPtrace,
    Capability::SysPacct,
    Capability::SysAdmin,
    Capability::SysBoot,
    Capability::SysNice,
    Capability::SysResource,
    Capability::SysTime,
    Capability::SysTtyConfig,
    Capability::Mknod,
    Capability::Lease,
    Capability::AuditWrite,
    Capability::AuditControl,
    Capability::Setfcap,
    Capability::MacOverride,
    Capability::MacAdmin,
    Capability::Syslog,
    Capability::WakeAlarm,
    Capability::BlockSuspend,
    Capability::AuditRead,
    Capability::Perfmon,
    Capability::Bpf,
    Capability::CheckpointRestore,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_mask_of_this_machine_kind() {
        // CapEff on this machine kind: everything up to CAP_CHECKPOINT_RESTORE except
        // CAP_SYS_RESOURCE (bit 24).
        let caps = caps_from_mask(0x0000_01ff_feff_ffff);
        assert_eq!(caps.len(), 40);
        assert!(!caps.contains(&Capability::SysResource));
        assert!(caps.contains(&Capability::CheckpointRestore));
        assert!(caps.contains(&Capability::SysAdmin));
    }
}
