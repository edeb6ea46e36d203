//! Seccomp: which profile a container gets (containerd's `GenerateSeccompSpecOpts`) and the
//! runtime default profile, an allowlist equivalent to containerd's
//! `contrib/seccomp.DefaultProfile` for x86_64 (with x86 and x32), written out as data here.

use std::path::{Path, PathBuf};

use cri::runtime::v1::{
    LinuxContainerSecurityContext, SecurityProfile, security_profile::ProfileType,
};
use oci_spec::runtime::{
    Arch, Capability, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompOperator, LinuxSyscall,
};

use super::{HostFacts, SpecError};

/// Syscalls every container may use.
const ALLOWED: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chown32",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_getres",
    "clock_getres_time64",
    "clock_gettime",
    "clock_gettime64",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fadvise64_64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchown",
    "fchown32",
    "fchownat",
    "fcntl",
    "fcntl64",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstat64",
    "fstatat64",
    "fstatfs",
    "fstatfs64",
    "fsync",
    "ftruncate",
    "ftruncate64",
    "futex",
    "futex_time64",
    "futex_waitv",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "getegid32",
    "geteuid",
    "geteuid32",
    "getgid",
    "getgid32",
    "getgroups",
    "getgroups32",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresgid32",
    "getresuid",
    "getresuid32",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getuid32",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "ipc",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lchown32",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "_llseek",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "lstat64",
    "madvise",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mmap2",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "nanosleep",
    "newfstatat",
    "_newselect",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "poll",
    "ppoll",
    "ppoll_time64",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pselect6_time64",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recv",
    "recvfrom",
    "recvmmsg",
    "recvmmsg_time64",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "send",
    "sendfile",
    "sendfile64",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsgid32",
    "setfsuid",
    "setfsuid32",
    "setgid",
    "setgid32",
    "setgroups",
    "setgroups32",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setregid32",
    "setresgid",
    "setresgid32",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setuid32",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "sigprocmask",
    "sigreturn",
    "socket",
    "socketcall",
    "socketpair",
    "splice",
    "stat",
    "stat64",
    "statfs",
    "statfs64",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_gettime64",
    "timerfd_settime",
    "timerfd_settime64",
    "times",
    "tkill",
    "truncate",
    "truncate64",
    "ugetrlimit",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimensat_time64",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "waitpid",
    "write",
    "writev",
];

/// Allowed on kernels >= 4.8 (where ptrace can no longer bypass seccomp); older kernels are
/// not supported by nodus at all.
const ALLOWED_KERNEL_4_8: &[&str] = &["ptrace"];

/// x86_64-only additions.
const ALLOWED_X86_64: &[&str] = &["arch_prctl", "modify_ldt"];

/// `personality(2)` values allowed: PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, and
/// the query value 0xffffffff.
const PERSONALITIES: &[u64] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Syscalls unlocked by a capability in the bounding set.
const BY_CAPABILITY: &[(Capability, &[&str])] = &[
    (Capability::DacReadSearch, &["open_by_handle_at"]),
    (
        Capability::SysAdmin,
        &[
            "bpf",
            "clone",
            "clone3",
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
            "mount",
            "mount_setattr",
            "move_mount",
            "name_to_handle_at",
            "open_tree",
            "perf_event_open",
            "quotactl",
            "quotactl_fd",
            "setdomainname",
            "sethostname",
            "setns",
            "syslog",
            "umount",
            "umount2",
            "unshare",
        ],
    ),
    (Capability::SysBoot, &["reboot"]),
    (Capability::SysChroot, &["chroot"]),
    (
        Capability::SysModule,
        &["delete_module", "init_module", "finit_module"],
    ),
    (Capability::SysPacct, &["acct"]),
    (
        Capability::SysPtrace,
        &[
            "kcmp",
            "pidfd_getfd",
            "process_madvise",
            "process_vm_readv",
            "process_vm_writev",
            "ptrace",
        ],
    ),
    (Capability::SysRawio, &["iopl", "ioperm"]),
    (
        Capability::SysTime,
        &["settimeofday", "stime", "clock_settime", "clock_settime64"],
    ),
    (Capability::SysTtyConfig, &["vhangup"]),
    (Capability::Syslog, &["syslog"]),
    (Capability::Bpf, &["bpf"]),
    (Capability::Perfmon, &["perf_event_open"]),
];

/// CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET |
/// CLONE_NEWCGROUP: `clone` without CAP_SYS_ADMIN may not create namespaces.
const CLONE_NAMESPACE_FLAGS: u64 =
    0x0002_0000 | 0x0400_0000 | 0x0800_0000 | 0x1000_0000 | 0x2000_0000 | 0x4000_0000 | 0x0200_0000;

const ENOSYS: u32 = 38;

fn allow(names: &[&str]) -> LinuxSyscall {
    let mut s = LinuxSyscall::default();
    s.set_names(names.iter().map(|n| n.to_string()).collect());
    s.set_action(LinuxSeccompAction::ScmpActAllow);
    s
}

fn arg(
    index: usize,
    value: u64,
    value_two: Option<u64>,
    op: LinuxSeccompOperator,
) -> LinuxSeccompArg {
    let b = LinuxSeccompArgBuilder::default()
        .index(index)
        .value(value)
        .op(op);
    let b = match value_two {
        Some(v) => b.value_two(v),
        None => b,
    };
    // Every field has a value: building cannot fail.
    b.build().unwrap_or_default()
}

/// The runtime default profile for a process whose bounding set is `bounding`.
pub(crate) fn default_profile(bounding: &[Capability]) -> LinuxSeccomp {
    let mut syscalls = vec![allow(ALLOWED)];
    for p in PERSONALITIES {
        let mut s = allow(&["personality"]);
        s.set_args(Some(vec![arg(
            0,
            *p,
            None,
            LinuxSeccompOperator::ScmpCmpEq,
        )]));
        syscalls.push(s);
    }
    syscalls.push(allow(ALLOWED_KERNEL_4_8));
    if cfg!(target_arch = "x86_64") {
        syscalls.push(allow(ALLOWED_X86_64));
    }
    let admin = bounding.contains(&Capability::SysAdmin);
    for (cap, names) in BY_CAPABILITY {
        if bounding.contains(cap) {
            syscalls.push(allow(names));
        }
    }
    if !admin {
        let mut clone = allow(&["clone"]);
        clone.set_args(Some(vec![arg(
            0,
            CLONE_NAMESPACE_FLAGS,
            Some(0),
            LinuxSeccompOperator::ScmpCmpMaskedEq,
        )]));
        syscalls.push(clone);
        // clone3 cannot be filtered by its flags: make libcs fall back to clone.
        let mut clone3 = LinuxSyscall::default();
        clone3.set_names(vec!["clone3".into()]);
        clone3.set_action(LinuxSeccompAction::ScmpActErrno);
        clone3.set_errno_ret(Some(ENOSYS));
        syscalls.push(clone3);
    }
    let mut s = LinuxSeccomp::default();
    s.set_default_action(LinuxSeccompAction::ScmpActErrno);
    s.set_architectures(Some(if cfg!(target_arch = "x86_64") {
        vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
    } else if cfg!(target_arch = "aarch64") {
        vec![Arch::ScmpArchArm, Arch::ScmpArchAarch64]
    } else {
        vec![]
    }));
    s.set_syscalls(Some(syscalls));
    s
}

/// The profile the CRI asks for, honouring the deprecated `seccomp_profile_path` when the
/// typed field is absent (`runtime/default`, `docker/default`, `unconfined`, `localhost/<path>`).
fn requested(
    sc: Option<&LinuxContainerSecurityContext>,
) -> Result<Option<SecurityProfile>, SpecError> {
    let Some(sc) = sc else { return Ok(None) };
    if let Some(p) = &sc.seccomp {
        return Ok(Some(p.clone()));
    }
    #[allow(deprecated)]
    let path = sc.seccomp_profile_path.as_str();
    let profile = |t: ProfileType, r: &str| SecurityProfile {
        profile_type: t as i32,
        localhost_ref: r.to_string(),
    };
    Ok(match path {
        "" => None,
        "runtime/default" | "docker/default" => Some(profile(ProfileType::RuntimeDefault, "")),
        "unconfined" => Some(profile(ProfileType::Unconfined, "")),
        p => match p.strip_prefix("localhost/") {
            Some(r) => Some(profile(ProfileType::Localhost, r)),
            None => {
                return Err(SpecError::InvalidArgument(format!(
                    "linux.security_context.seccomp_profile_path: invalid profile {p:?}"
                )));
            }
        },
    })
}

fn load_localhost(reference: &str, root: Option<&Path>) -> Result<LinuxSeccomp, SpecError> {
    let reference = reference.strip_prefix("localhost/").unwrap_or(reference);
    let path: PathBuf = match (Path::new(reference).is_absolute(), root) {
        (true, _) => PathBuf::from(reference),
        (false, Some(root)) => root.join(reference),
        (false, None) => {
            return Err(SpecError::InvalidArgument(format!(
                "linux.security_context.seccomp.localhost_ref {reference:?} must be an absolute path (no seccomp profile root is configured)"
            )));
        }
    };
    let bytes = std::fs::read(&path).map_err(|e| {
        SpecError::InvalidArgument(format!(
            "cannot load seccomp profile {:?} (linux.security_context.seccomp.localhost_ref): {e}",
            path.display().to_string()
        ))
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        SpecError::InvalidArgument(format!(
            "decoding seccomp profile failed {:?}: {e}",
            path.display().to_string()
        ))
    })
}

/// The seccomp section of a container, `None` for unconfined.
pub(crate) fn build(
    sc: Option<&LinuxContainerSecurityContext>,
    privileged: bool,
    bounding: &[Capability],
    profile_root: Option<&Path>,
    host: &HostFacts,
) -> Result<Option<LinuxSeccomp>, SpecError> {
    if privileged {
        return Ok(None);
    }
    let Some(sp) = requested(sc)? else {
        return Ok(None);
    };
    let typ = ProfileType::try_from(sp.profile_type).map_err(|_| {
        SpecError::InvalidArgument(format!(
            "linux.security_context.seccomp.profile_type: unknown seccomp profile type {}",
            sp.profile_type
        ))
    })?;
    if !host.seccomp_enabled {
        if typ == ProfileType::Unconfined {
            return Ok(None);
        }
        return Err(SpecError::FailedPrecondition(
            "seccomp is not supported by this kernel".into(),
        ));
    }
    if typ != ProfileType::Localhost && !sp.localhost_ref.is_empty() {
        return Err(SpecError::InvalidArgument(format!(
            "seccomp config invalid: localhost_ref {:?} must only be set if profile_type is Localhost",
            sp.localhost_ref
        )));
    }
    match typ {
        ProfileType::Unconfined => Ok(None),
        ProfileType::RuntimeDefault => Ok(Some(default_profile(bounding))),
        ProfileType::Localhost => load_localhost(&sp.localhost_ref, profile_root).map(Some),
    }
}
