//! Tests against the kernel's cgroup filesystem on this machine, whichever hierarchy it has
//! (v1 or hybrid: the v1 driver, plus the hybrid cgroup2 mount driven as a v2 hierarchy;
//! unified: the v2 driver), each under its own `nodus-cgtest-<pid>-<n>` root that a guard
//! removes even when the test panics. Assertions name the files of the detected version.
//! Without a usable hierarchy (not root, read-only) the tests skip, unless
//! `NODUS_TEST_REQUIRE_ROOT=1` makes that a failure.

use crate::common::DeleteRetries;
use crate::controller::ControllerKind;
use crate::error::CgroupError;
use crate::hierarchy::Hierarchy;
use crate::manager::CgroupManager;
use crate::resources::Resources;
use crate::resources::{shares_to_weight, weight_to_shares};
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

/// This machine's driver, when its hierarchy can be written.
fn host() -> Option<Arc<dyn CgroupManager>> {
    let m = crate::detect();
    let usable = m.check_root().and_then(|()| {
        if m.has_controller(ControllerKind::Memory) {
            Ok(())
        } else {
            Err(CgroupError::ControllerMissing {
                controller: "memory",
                field: "tests",
            })
        }
    });
    if let Err(e) = usable {
        if std::env::var("NODUS_TEST_REQUIRE_ROOT").as_deref() == Ok("1") {
            panic!("NODUS_TEST_REQUIRE_ROOT=1 but the cgroup hierarchy is not usable: {e}");
        }
        eprintln!("skipped: the cgroup hierarchy is not usable: {e}");
        return None;
    }
    Some(m)
}

fn is_v2(m: &Arc<dyn CgroupManager>) -> bool {
    m.hierarchy().is_v2()
}

/// A file of cgroup `path`: `file` in the mount of `controller` on v1, in the cgroup's
/// directory on v2.
fn cat(m: &Arc<dyn CgroupManager>, controller: &str, path: &str, file: &str) -> String {
    let p = m.hierarchy().dir(controller, path).join(file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

#[test]
fn create_sets_limits_the_kernel_reports_back() {
    let Some(m) = host() else { return };
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
    // What a user sees in the cgroup's files, in the detected version's terms.
    let (shares, quota, mem, period_line) = if is_v2(m) {
        ("cpu.weight", "cpu.max", "memory.max", None)
    } else {
        (
            "cpu.shares",
            "cpu.cfs_quota_us",
            "memory.limit_in_bytes",
            Some("cpu.cfs_period_us"),
        )
    };
    let weight = |s: u64| {
        if is_v2(m) {
            shares_to_weight(s).to_string()
        } else {
            s.to_string()
        }
    };
    assert_eq!(cat(m, "cpu", &kubepods, shares), weight(2048));
    assert_eq!(cat(m, "memory", &kubepods, mem), "1073741824");
    assert_eq!(cat(m, "cpu", &pod, shares), weight(102));
    match period_line {
        Some(period) => {
            assert_eq!(cat(m, "cpu", &pod, quota), "50000");
            assert_eq!(cat(m, "cpu", &pod, period), "100000");
        }
        None => assert_eq!(cat(m, "cpu", &pod, quota), "50000 100000"),
    }
    assert_eq!(cat(m, "memory", &pod, mem), "67108864");
    assert_eq!(cat(m, "pids", &pod, "pids.max"), "100");
    assert_eq!(cat(m, "cpuset", &pod, "cpuset.cpus"), "0");
    let tier = g.path("kubepods/burstable");
    if is_v2(m) {
        // An empty v2 cpuset uses its parent's: the tier can hold tasks without a copy.
        assert!(!cat(m, "cpuset", &tier, "cpuset.cpus.effective").is_empty());
    } else {
        // The intermediate tier got its parent's cpuset, or no task could ever join it.
        let host_cpus = cat(m, "cpuset", "", "cpuset.cpus");
        assert_eq!(cat(m, "cpuset", &tier, "cpuset.cpus"), host_cpus);
        assert!(!cat(m, "cpuset", &tier, "cpuset.mems").is_empty());
        for c in ["cpuacct", "freezer"] {
            if m.hierarchy().mount(c).is_some() {
                assert!(m.hierarchy().dir(c, &pod).is_dir(), "{c}");
            }
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
    if is_v2(m) {
        assert_eq!(cat(m, "memory", &pod, mem), "max");
        // No period given: the kernel keeps the one it has.
        assert_eq!(cat(m, "cpu", &pod, quota), "max 100000");
    } else {
        let unlimited: u64 = cat(m, "memory", &pod, mem).parse().unwrap();
        assert!(unlimited > 1 << 62, "{unlimited}");
        assert_eq!(cat(m, "cpu", &pod, quota), "-1");
    }
    assert_eq!(cat(m, "pids", &pod, "pids.max"), "max");
    assert_eq!(cat(m, "cpu", &pod, shares), weight(102));
    let s = m.read_stats(&pod).unwrap();
    assert_eq!(s.memory.limit_bytes, None);
    let back = m.read_resources(&pod).unwrap();
    let shares_back = if is_v2(m) {
        weight_to_shares(shares_to_weight(102))
    } else {
        102
    };
    assert_eq!(back.cpu_shares, Some(shares_back));
    assert_eq!(back.cpu_quota, Some(-1));
    assert_eq!(back.cpu_period, Some(100_000));
    assert_eq!(back.memory_limit, Some(-1));
    assert_eq!(back.pids_limit, Some(-1));
    assert_eq!(back.cpuset_cpus.as_deref(), Some("0"));
    assert_eq!(s.pids, Some(0));
}

#[test]
fn cfs_period_refused_before_the_quota_is_retried_quota_first() {
    let Some(m) = host() else { return };
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
    if is_v2(&g.m) {
        // v2 writes quota and period in one line, and caps a child at its parent's
        // bandwidth instead of refusing it.
        assert_eq!(cat(&g.m, "cpu", &child, "cpu.max"), "10000 20000");
        return;
    }
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
fn memory_limit_oom_kills_and_is_counted() {
    use std::io::Write;
    let Some(m) = host() else { return };
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
    // On v2 swap is limited apart from memory: without this the shell would swap, not die.
    let swap = g.m.hierarchy().dir("memory", &c).join("memory.swap.max");
    if is_v2(&g.m) && swap.exists() {
        std::fs::write(&swap, "0").unwrap();
    }
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
fn cpu_quota_throttles_without_killing() {
    use std::io::Write;
    let Some(m) = host() else { return };
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
fn processes_are_listed_frozen_killed_and_the_tree_removed() {
    let Some(m) = host() else { return };
    let mut g = Guard::new(m);
    let pod = g.path("pod");
    g.m.create(&pod, &Resources::default()).unwrap();
    g.m.create(&g.path("pod/ctr"), &Resources::default())
        .unwrap();
    let pid = g.sleeper("pod/ctr", "1000");
    assert_eq!(g.m.pids(&pod).unwrap(), vec![pid as i32]);
    let s = g.m.read_stats(&g.path("pod/ctr")).unwrap();
    assert_eq!(s.pids, Some(1));
    // Pressure figures come from the cgroup itself on v2, from the cgroup2 mount's
    // directory of the same path on a hybrid machine.
    let v2_dir = match g.m.hierarchy().unified() {
        Some(u) => Some(u.join(g.path("pod/ctr"))),
        None if is_v2(&g.m) => Some(g.m.hierarchy().dir("", &g.path("pod/ctr"))),
        None => None,
    };
    if v2_dir.is_some_and(|d| d.join("cpu.pressure").exists()) {
        assert!(s.psi.cpu.is_some() && s.psi.memory.is_some(), "{:?}", s.psi);
        if is_v2(&g.m) {
            assert!(s.psi.io.is_some(), "{:?}", s.psi);
        }
    }

    let (file, frozen, thawed) = if is_v2(&g.m) {
        ("cgroup.freeze", "1", "0")
    } else {
        ("freezer.state", "FROZEN", "THAWED")
    };
    g.m.freeze(&pod).unwrap();
    assert_eq!(cat(&g.m, "freezer", &pod, file), frozen);
    g.m.thaw(&pod).unwrap();
    assert_eq!(cat(&g.m, "freezer", &pod, file), thawed);

    g.m.kill_all(&pod).unwrap();
    let status = g.take_child(pid).wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    g.m.delete(&g.root).unwrap();
    assert_eq!(g.leftovers(), Vec::<PathBuf>::new());
    assert!(!g.m.exists(&pod));
}

#[test]
fn busy_delete_retries_then_kills_stragglers() {
    let Some(m) = host() else { return };
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
fn busy_delete_succeeds_once_the_process_leaves() {
    let Some(m) = host() else { return };
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
fn failed_create_leaves_nothing_behind() {
    let Some(m) = host() else { return };
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

/// A v2 driver rooted at a test directory of the cgroup2 mount (on a hybrid machine a real
/// v2 hierarchy without cpu/memory, which v1 holds, so nothing is ever enabled in the host's
/// root `cgroup.subtree_control`): create, cgroup.procs, cgroup.freeze, cgroup.kill and
/// removal against the kernel.
#[test]
fn real_v2_nested_root_freeze_kill_delete() {
    if host().is_none() {
        return;
    }
    let h = Hierarchy::detect();
    let hybrid = h.unified().is_some();
    let unified = match h.unified() {
        Some(u) => u.to_path_buf(),
        None if h.is_v2() => h.root().to_path_buf(),
        None => {
            eprintln!("skipped: a v1-only machine has no cgroup2 mount");
            return;
        }
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
    if hybrid {
        // The hybrid mount's controllers all belong to v1: nothing to enable there.
        assert_eq!(
            std::fs::read_to_string(top.join("cgroup.subtree_control")).unwrap(),
            before
        );
    }
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
fn concurrent_creates_under_a_new_parent_all_get_a_usable_cpuset() {
    let Some(m) = host() else { return };
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
    // v2 needs no copy: an empty cpuset uses the parent's effective one.
    let suffix = if is_v2(&g.m) { ".effective" } else { "" };
    for p in &pods {
        for f in ["cpuset.cpus", "cpuset.mems"] {
            let f = format!("{f}{suffix}");
            assert!(!cat(&g.m, "cpuset", p, &f).is_empty(), "{p} {f}");
        }
    }
    // A task can join: the kernel refuses an empty cpuset with ENOSPC.
    g.sleeper("kubepods/burstable/pod7", "1000");
}
