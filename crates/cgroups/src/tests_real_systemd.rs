//! Tests of the systemd driver against the machine's systemd and cgroup v2 tree: slices
//! under a `nodus-sdtest-<pid>-<n>` slice of their own, stopped by a guard even when a test
//! panics. Each value is read back both from the cgroup files and from `systemctl show`.
//! They run only where systemd is init (the VM lane); there, not being root is a failure
//! with `NODUS_TEST_REQUIRE_ROOT=1`.

use crate::hierarchy::Hierarchy;
use crate::manager::CgroupManager;
use crate::resources::{Resources, shares_to_weight};
use crate::systemd::{SystemdManager, names, running_systemd};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn manager() -> Option<SystemdManager> {
    if !running_systemd() {
        eprintln!("skipped: systemd is not the running init on this machine");
        return None;
    }
    let require = std::env::var("NODUS_TEST_REQUIRE_ROOT").as_deref() == Ok("1");
    let h = Hierarchy::detect();
    if !nix::unistd::geteuid().is_root() || !h.is_v2() {
        assert!(
            !require,
            "NODUS_TEST_REQUIRE_ROOT=1 but not root on a cgroup v2 systemd host"
        );
        eprintln!("skipped: needs root and cgroup v2");
        return None;
    }
    Some(SystemdManager::new(h).expect("systemd driver"))
}

/// The test's own slice and the processes it started; both go away on drop.
struct Guard {
    m: SystemdManager,
    root: String,
    children: Vec<Child>,
}

impl Guard {
    fn new(m: SystemdManager) -> Guard {
        let root = format!(
            "nodus-sdtest-{}-{}",
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

    fn dir(&self, rel: &str) -> std::path::PathBuf {
        self.m
            .hierarchy()
            .root()
            .join(SystemdManager::cgroup_path(&self.path(rel)))
    }

    fn file(&self, rel: &str, name: &str) -> String {
        let p = self.dir(rel).join(name);
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
            .trim()
            .to_string()
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

/// `systemctl show <unit> -p <prop> --value`.
fn show(unit: &str, prop: &str) -> String {
    let out = Command::new("systemctl")
        .args(["show", unit, "-p", prop, "--value"])
        .output()
        .expect("systemctl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn slices_are_created_updated_and_stopped_through_systemd() {
    let Some(m) = manager() else { return };
    let mut g = Guard::new(m);
    g.m.create(&g.root, &Resources::default()).unwrap();
    let pod = g.path("pod-0a1b");
    let r = Resources {
        cpu_shares: Some(1024),
        cpu_quota: Some(50_000),
        cpu_period: Some(100_000),
        memory_limit: Some(64 << 20),
        memory_min: Some(16 << 20),
        pids_limit: Some(100),
        ..Default::default()
    };
    g.m.create(&pod, &r).unwrap();

    // The slice is where upstream's kubelet puts it: dashes escaped, parents expanded.
    let unit = names::slice_name(&pod);
    assert_eq!(unit, format!("{}-pod_0a1b.slice", g.root.replace('-', "_")));
    assert!(
        g.dir("pod-0a1b").is_dir(),
        "{}",
        g.dir("pod-0a1b").display()
    );
    assert!(g.m.exists(&pod));
    assert_eq!(g.m.children(&g.root), vec!["pod-0a1b".to_string()]);

    // The kernel's files.
    assert_eq!(g.file("pod-0a1b", "memory.max"), (64u64 << 20).to_string());
    assert_eq!(g.file("pod-0a1b", "memory.min"), (16u64 << 20).to_string());
    assert_eq!(g.file("pod-0a1b", "cpu.max"), "50000 100000");
    assert_eq!(
        g.file("pod-0a1b", "cpu.weight"),
        shares_to_weight(1024).to_string()
    );
    assert_eq!(g.file("pod-0a1b", "pids.max"), "100");

    // What systemd holds (and would write again on a daemon-reload).
    assert_eq!(show(&unit, "MemoryMax"), (64u64 << 20).to_string());
    assert_eq!(show(&unit, "MemoryMin"), (16u64 << 20).to_string());
    assert_eq!(show(&unit, "CPUWeight"), "100");
    assert_eq!(show(&unit, "CPUQuotaPerSecUSec"), "500ms");
    assert_eq!(show(&unit, "TasksMax"), "100");
    assert_eq!(show(&unit, "ActiveState"), "active");
    assert_eq!(show(&unit, "Transient"), "yes");

    // Reads go through the files: a process in the slice is seen and counted.
    let child = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = child.id() as i32;
    g.children.push(child);
    g.m.add_process(&pod, pid).unwrap();
    assert_eq!(g.m.pids(&pod).unwrap(), vec![pid]);
    assert_eq!(g.m.read_stats(&pod).unwrap().pids, Some(1));
    let back = g.m.read_resources(&pod).unwrap();
    assert_eq!(back.memory_limit, Some(64 << 20));
    assert_eq!(back.pids_limit, Some(100));

    // Update: both systemd and the files follow; unlimited is infinity.
    g.m.update(
        &pod,
        &Resources {
            memory_limit: Some(128 << 20),
            pids_limit: Some(-1),
            cpu_quota: Some(-1),
            cpu_period: Some(100_000),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(g.file("pod-0a1b", "memory.max"), (128u64 << 20).to_string());
    assert_eq!(g.file("pod-0a1b", "pids.max"), "max");
    assert_eq!(g.file("pod-0a1b", "cpu.max"), "max 100000");
    assert_eq!(show(&unit, "MemoryMax"), (128u64 << 20).to_string());
    assert_eq!(show(&unit, "TasksMax"), "infinity");
    assert_eq!(show(&unit, "CPUQuotaPerSecUSec"), "infinity");

    // Delete stops the unit, which kills what runs in it, and the cgroup is gone.
    g.m.delete(&pod).unwrap();
    assert!(!g.dir("pod-0a1b").exists());
    assert!(!g.m.exists(&pod));
    assert_ne!(show(&unit, "ActiveState"), "active");
    let mut child = g.children.pop().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the sleeper outlived its slice");
    // Deleting again is fine.
    g.m.delete(&pod).unwrap();
}

#[test]
fn creating_an_existing_slice_updates_it_and_missing_ones_are_not_found() {
    let Some(m) = manager() else { return };
    let g = Guard::new(m);
    let r = Resources {
        memory_limit: Some(32 << 20),
        ..Default::default()
    };
    g.m.create(&g.root, &r).unwrap();
    g.m.create(
        &g.root,
        &Resources {
            memory_limit: Some(48 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    let unit = names::slice_name(&g.root);
    assert_eq!(show(&unit, "MemoryMax"), (48u64 << 20).to_string());
    assert_eq!(g.file("", "memory.max"), (48u64 << 20).to_string());
    let err = g.m.update(&g.path("nope"), &r).unwrap_err();
    assert!(
        matches!(err, crate::error::CgroupError::NotFound(_)),
        "{err}"
    );
}

#[test]
fn the_driver_refuses_a_machine_without_systemd() {
    if running_systemd() {
        return;
    }
    let err = SystemdManager::new(Hierarchy::detect()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "systemd cgroup driver: systemd is not the running init (no /run/systemd/system): \
         systemd cgroup flag passed, but systemd support for managing cgroups is not available"
    );
}
