//! Tests against the kernel's cgroup filesystem on this machine (v1 controllers, plus the
//! hybrid cgroup2 mount driven as a v2 hierarchy), each under its own
//! `nodus-cgtest-<pid>-<n>` root that a guard removes even when the test panics.

use crate::common::DeleteRetries;
use crate::error::CgroupError;
use crate::hierarchy::Hierarchy;
use crate::manager::CgroupManager;
use crate::resources::Resources;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A test cgroup root and the processes a test started; both go away on drop.
struct Guard {
    m: Arc<dyn CgroupManager>,
    root: String,
    children: Vec<Child>,
}

impl Guard {
    fn new(m: Arc<dyn CgroupManager>) -> Guard {
        let root = format!(
            "nodus-cgtest-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        Guard {
            m,
            root,
            children: Vec::new(),
        }
    }

    fn path(&self, rel: &str) -> String {
        format!("{}/{rel}", self.root)
    }

    /// A `sleep` that the test owns, moved into cgroup `rel`.
    fn sleeper(&mut self, rel: &str, secs: &str) -> u32 {
        let child = Command::new("sleep").arg(secs).spawn().unwrap();
        let pid = child.id();
        self.children.push(child);
        self.m.add_process(&self.path(rel), pid as i32).unwrap();
        pid
    }

    fn take_child(&mut self, pid: u32) -> Child {
        let i = self.children.iter().position(|c| c.id() == pid).unwrap();
        self.children.remove(i)
    }

    /// Every directory of the test root in every mount.
    fn leftovers(&self) -> Vec<PathBuf> {
        let h = self.m.hierarchy();
        let mut mounts = h.all_mounts();
        mounts.extend(h.unified().map(Path::to_path_buf));
        mounts
            .into_iter()
            .map(|m| m.join(&self.root))
            .filter(|d| d.exists())
            .collect()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self.m.delete(&self.root);
    }
}

fn v1() -> Option<Arc<dyn CgroupManager>> {
    let h = Hierarchy::detect();
    if h.is_v2() || h.mount("memory").is_none() {
        eprintln!("skipped: this machine has no cgroup v1 memory controller");
        return None;
    }
    Some(crate::detect())
}

fn cat(m: &Arc<dyn CgroupManager>, controller: &str, path: &str, file: &str) -> String {
    let p = m.hierarchy().dir(controller, path).join(file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

#[test]
fn v1_create_sets_limits_the_kernel_reports_back() {
    let Some(m) = v1() else { return };
    let g = Guard::new(m);
    let m = &g.m;
    let kubepods = g.path("kubepods");
    m.create(
        &kubepods,
        &Resources {
            cpu_shares: Some(2048),
            memory_limit: Some(1 << 30),
            ..Default::default()
        },
    )
    .unwrap();
    let pod = g.path("kubepods/burstable/pod1");
    m.create(
        &pod,
        &Resources {
            cpu_shares: Some(102),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 << 20),
            pids_limit: Some(100),
            cpuset_cpus: Some("0".into()),
            cpuset_mems: Some("0".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(m.exists(&pod));
    assert_eq!(cat(m, "cpu", &kubepods, "cpu.shares"), "2048");
    assert_eq!(
        cat(m, "memory", &kubepods, "memory.limit_in_bytes"),
        "1073741824"
    );
    assert_eq!(cat(m, "cpu", &pod, "cpu.shares"), "102");
    assert_eq!(cat(m, "cpu", &pod, "cpu.cfs_quota_us"), "50000");
    assert_eq!(cat(m, "cpu", &pod, "cpu.cfs_period_us"), "100000");
    assert_eq!(cat(m, "memory", &pod, "memory.limit_in_bytes"), "67108864");
    assert_eq!(cat(m, "pids", &pod, "pids.max"), "100");
    assert_eq!(cat(m, "cpuset", &pod, "cpuset.cpus"), "0");
    // The intermediate tier got its parent's cpuset, or no task could ever join it.
    let tier = g.path("kubepods/burstable");
    let host_cpus = cat(m, "cpuset", "", "cpuset.cpus");
    assert_eq!(cat(m, "cpuset", &tier, "cpuset.cpus"), host_cpus);
    assert!(!cat(m, "cpuset", &tier, "cpuset.mems").is_empty());
    for c in ["cpuacct", "freezer"] {
        if m.hierarchy().mount(c).is_some() {
            assert!(m.hierarchy().dir(c, &pod).is_dir(), "{c}");
        }
    }
    // Creating again is harmless; updating changes only what is asked.
    m.create(&pod, &Resources::default()).unwrap();
    m.update(
        &pod,
        &Resources {
            memory_limit: Some(-1),
            pids_limit: Some(-1),
            cpu_quota: Some(-1),
            ..Default::default()
        },
    )
    .unwrap();
    let unlimited: u64 = cat(m, "memory", &pod, "memory.limit_in_bytes")
        .parse()
        .unwrap();
    assert!(unlimited > 1 << 62, "{unlimited}");
    assert_eq!(cat(m, "pids", &pod, "pids.max"), "max");
    assert_eq!(cat(m, "cpu", &pod, "cpu.cfs_quota_us"), "-1");
    assert_eq!(cat(m, "cpu", &pod, "cpu.shares"), "102");
    let s = m.read_stats(&pod).unwrap();
    assert_eq!(s.memory.limit_bytes, None);
    let back = m.read_resources(&pod).unwrap();
    assert_eq!(back.cpu_shares, Some(102));
    assert_eq!(back.cpu_quota, Some(-1));
    assert_eq!(back.cpu_period, Some(100_000));
    assert_eq!(back.memory_limit, Some(-1));
    assert_eq!(back.pids_limit, Some(-1));
    assert_eq!(back.cpuset_cpus.as_deref(), Some("0"));
    assert_eq!(s.pids, Some(0));
}

#[test]
fn v1_period_refused_before_the_quota_is_retried_quota_first() {
    let Some(m) = v1() else { return };
    let g = Guard::new(m);
    let parent = g.path("tier");
    let child = g.path("tier/pod");
    let half_cpu = Resources {
        cpu_quota: Some(50_000),
        cpu_period: Some(100_000),
        ..Default::default()
    };
    g.m.create(&parent, &half_cpu).unwrap();
    g.m.create(&child, &half_cpu).unwrap();
    // Still half a CPU, but 50ms quota over a 20ms period would be 2.5 CPUs, more than the
    // parent allows, so the kernel refuses the period until the quota has shrunk.
    let r = Resources {
        cpu_quota: Some(10_000),
        cpu_period: Some(20_000),
        ..Default::default()
    };
    g.m.update(&child, &r).unwrap();
    assert_eq!(cat(&g.m, "cpu", &child, "cpu.cfs_quota_us"), "10000");
    assert_eq!(cat(&g.m, "cpu", &child, "cpu.cfs_period_us"), "20000");
    // And more than the parent allows is refused with the kernel's word for it.
    let err =
        g.m.update(
            &child,
            &Resources {
                cpu_quota: Some(200_000),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        err.to_string().starts_with("write 200000 to ")
            && err
                .to_string()
                .ends_with("/tier/pod/cpu.cfs_quota_us: Invalid argument"),
        "{err}"
    );
}

/// A shell that waits for a line on stdin before running `script`, so it can be moved into
/// the cgroup before it allocates or spins.
fn gated_shell(g: &mut Guard, rel: &str, script: &str) -> (u32, std::process::ChildStdin) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("read _go; {script}"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let pid = child.id();
    g.children.push(child);
    g.m.add_process(&g.path(rel), pid as i32).unwrap();
    (pid, stdin)
}

#[test]
fn v1_memory_limit_oom_kills_and_is_counted() {
    use std::io::Write;
    let Some(m) = v1() else { return };
    let mut g = Guard::new(m);
    let c = g.path("oom");
    g.m.create(
        &c,
        &Resources {
            memory_limit: Some(16 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    // 64 MiB in a shell variable cannot fit under a 16 MiB limit.
    let (pid, mut go) = gated_shell(
        &mut g,
        "oom",
        "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo ${#x}",
    );
    writeln!(go, "go").unwrap();
    drop(go);
    let status = g.take_child(pid).wait().unwrap();
    // The shell or its command substitution was killed; either way the kernel counted it.
    let s = g.m.read_stats(&c).unwrap();
    assert!(s.memory.oom_kills >= 1, "{s:?} {status:?}");
    assert_eq!(s.memory.limit_bytes, Some(16 << 20));
}

#[test]
fn v1_cpu_quota_throttles_without_killing() {
    use std::io::Write;
    let Some(m) = v1() else { return };
    let mut g = Guard::new(m);
    let c = g.path("spin");
    g.m.create(
        &c,
        &Resources {
            cpu_quota: Some(1_000),
            cpu_period: Some(10_000),
            ..Default::default()
        },
    )
    .unwrap();
    let (pid, mut go) = gated_shell(&mut g, "spin", "while :; do :; done");
    writeln!(go, "go").unwrap();
    // Bounded wait for the kernel to report throttling; no assertion on how fast.
    let mut s = g.m.read_stats(&c).unwrap();
    for _ in 0..500 {
        // throttled_time is added when a period ends throttled, so wait for both.
        if s.cpu.throttled_periods > 0 && s.cpu.throttled_ns > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        s = g.m.read_stats(&c).unwrap();
    }
    assert!(s.cpu.throttled_periods > 0, "{s:?}");
    assert!(s.cpu.periods >= s.cpu.throttled_periods);
    assert!(s.cpu.throttled_ns > 0);
    assert!(s.cpu.usage_ns > 0);
    assert_eq!(g.m.pids(&c).unwrap(), vec![pid as i32]);
    drop(go);
}

#[test]
fn v1_processes_are_listed_frozen_killed_and_the_tree_removed() {
    let Some(m) = v1() else { return };
    let mut g = Guard::new(m);
    let pod = g.path("pod");
    g.m.create(&pod, &Resources::default()).unwrap();
    g.m.create(&g.path("pod/ctr"), &Resources::default())
        .unwrap();
    let pid = g.sleeper("pod/ctr", "1000");
    assert_eq!(g.m.pids(&pod).unwrap(), vec![pid as i32]);
    let s = g.m.read_stats(&g.path("pod/ctr")).unwrap();
    assert_eq!(s.pids, Some(1));
    // On a hybrid machine the cgroup2 mount supplies pressure figures for the same path.
    if g.m
        .hierarchy()
        .unified()
        .is_some_and(|u| u.join("cpu.pressure").exists())
    {
        assert!(s.psi.cpu.is_some() && s.psi.memory.is_some(), "{:?}", s.psi);
    }

    g.m.freeze(&pod).unwrap();
    assert_eq!(cat(&g.m, "freezer", &pod, "freezer.state"), "FROZEN");
    g.m.thaw(&pod).unwrap();
    assert_eq!(cat(&g.m, "freezer", &pod, "freezer.state"), "THAWED");

    g.m.kill_all(&pod).unwrap();
    let status = g.take_child(pid).wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    g.m.delete(&g.root).unwrap();
    assert_eq!(g.leftovers(), Vec::<PathBuf>::new());
    assert!(!g.m.exists(&pod));
}

#[test]
fn v1_busy_delete_retries_then_kills_stragglers() {
    let Some(m) = v1() else { return };
    let mut g = Guard::new(m);
    let pod = g.path("pod");
    g.m.create(&pod, &Resources::default()).unwrap();
    let pid = g.sleeper("pod", "1000");

    // Without permission to kill, the bounded retries end in a busy error naming the dir.
    let patient = crate::with_retries(
        g.m.hierarchy().clone(),
        DeleteRetries {
            attempts: 3,
            kill_after: u32::MAX,
        },
    );
    let err = patient.delete(&pod).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EBUSY), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&g.root) && msg.contains("after 3 attempts"),
        "{msg}"
    );
    assert!(g.m.exists(&pod));

    // The default manager kills what is left after a few rounds and then succeeds.
    g.m.delete(&pod).unwrap();
    let status = g.take_child(pid).wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(!g.m.exists(&pod));
}

#[test]
fn v1_busy_delete_succeeds_once_the_process_leaves() {
    let Some(m) = v1() else { return };
    let mut g = Guard::new(m);
    let pod = g.path("pod");
    g.m.create(&pod, &Resources::default()).unwrap();
    let pid = g.sleeper("pod", "0.3");
    let mut child = g.take_child(pid);
    let reaper = std::thread::spawn(move || child.wait());
    // Generous bound, never killing: success can only come from the process exiting.
    let patient = crate::with_retries(
        g.m.hierarchy().clone(),
        DeleteRetries {
            attempts: 60,
            kill_after: u32::MAX,
        },
    );
    patient.delete(&pod).unwrap();
    let status = reaper.join().unwrap().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!g.m.exists(&pod));
    assert!(g.m.exists(&g.root));
}

#[test]
fn v1_failed_create_leaves_nothing_behind() {
    let Some(m) = v1() else { return };
    let g = Guard::new(m);
    let p = g.path("a/b");
    let err =
        g.m.create(
            &p,
            &Resources {
                cpuset_cpus: Some("4096".into()),
                ..Default::default()
            },
        )
        .unwrap_err();
    let msg = err.to_string();
    // The kernel says EINVAL or ERANGE depending on its version; either is named in words.
    assert!(
        msg.starts_with("write 4096 to /")
            && msg.contains("/a/b/cpuset.cpus: ")
            && !msg.contains("os error"),
        "{msg}"
    );
    assert_eq!(g.leftovers(), Vec::<PathBuf>::new());

    // A pre-existing parent survives a failed create of its child.
    g.m.create(&g.root, &Resources::default()).unwrap();
    let err =
        g.m.create(
            &p,
            &Resources {
                cpuset_cpus: Some("4096".into()),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(matches!(err, CgroupError::Write { .. }));
    assert!(g.m.exists(&g.root));
    assert!(!g.m.exists(&g.path("a")));
}

#[test]
fn missing_cgroup_root_is_a_clear_error() {
    let m = crate::for_hierarchy(Hierarchy::v1("/nonexistent-nodus-cgroup-root"));
    let err = m.create("kubepods", &Resources::default()).unwrap_err();
    assert!(matches!(err, CgroupError::RootMissing(_)));
    assert!(
        err.to_string()
            .starts_with("cgroup root /nonexistent-nodus-cgroup-root"),
        "{err}"
    );
    let m = crate::for_hierarchy(Hierarchy::v2("/nonexistent-nodus-cgroup-root"));
    assert_eq!(
        m.create("kubepods", &Resources::default())
            .unwrap_err()
            .to_string(),
        "cgroup root /nonexistent-nodus-cgroup-root does not exist"
    );
    assert!(matches!(
        m.delete("../etc"),
        Err(CgroupError::InvalidPath(_))
    ));
    assert!(matches!(m.delete("/"), Err(CgroupError::InvalidPath(_))));
}

/// The hybrid machine's cgroup2 mount is a real v2 hierarchy (without cpu/memory, which v1
/// holds): enough to exercise the v2 paths of create, cgroup.procs, cgroup.freeze,
/// cgroup.kill and removal against the kernel. The manager is rooted at a test directory so
/// nothing is ever enabled in the host's root `cgroup.subtree_control`.
#[test]
fn real_v2_unified_mount_freeze_kill_delete() {
    let Some(unified) = Hierarchy::detect().unified().map(Path::to_path_buf) else {
        eprintln!("skipped: no hybrid cgroup2 mount");
        return;
    };
    if !unified.join("cgroup.kill").exists() {
        eprintln!("skipped: kernel without cgroup.kill");
        return;
    }
    // The outer guard only removes the test directory from the unified root.
    let outer = Guard::new(crate::for_hierarchy(Hierarchy::v2(&unified)));
    let top = unified.join(&outer.root);
    std::fs::create_dir(&top).unwrap();
    let mut g = Guard::new(crate::for_hierarchy(Hierarchy::v2(&top)));
    let before = std::fs::read_to_string(top.join("cgroup.subtree_control")).unwrap();
    let pod = g.path("pod");
    g.m.create(&g.path("pod/ctr"), &Resources::default())
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(top.join("cgroup.subtree_control")).unwrap(),
        before
    );
    let pid = g.sleeper("pod/ctr", "1000");
    assert_eq!(g.m.pids(&pod).unwrap(), vec![pid as i32]);
    g.m.freeze(&pod).unwrap();
    let events = std::fs::read_to_string(top.join(&pod).join("cgroup.events")).unwrap();
    assert!(events.contains("frozen 1"), "{events}");
    g.m.thaw(&pod).unwrap();
    g.m.kill_all(&pod).unwrap();
    let status = g.take_child(pid).wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    g.m.delete(&g.root).unwrap();
    assert!(!top.join(&g.root).exists());
    drop(g);
    drop(outer);
    assert!(!top.exists());
}

#[test]
fn v1_concurrent_creates_under_a_new_parent_all_get_a_usable_cpuset() {
    let Some(m) = v1() else { return };
    let mut g = Guard::new(m);
    let pods: Vec<String> = (0..8)
        .map(|i| g.path(&format!("kubepods/burstable/pod{i}")))
        .collect();
    std::thread::scope(|s| {
        for p in &pods {
            let m = &g.m;
            s.spawn(move || m.create(p, &Resources::default()).unwrap());
        }
    });
    for p in &pods {
        assert!(!cat(&g.m, "cpuset", p, "cpuset.cpus").is_empty(), "{p}");
        assert!(!cat(&g.m, "cpuset", p, "cpuset.mems").is_empty(), "{p}");
    }
    // A task can join: the kernel refuses an empty cpuset with ENOSPC.
    g.sleeper("kubepods/burstable/pod7", "1000");
}
