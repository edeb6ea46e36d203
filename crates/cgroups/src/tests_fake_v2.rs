//! cgroup v2 on a fake cgroupfs tree in a temp dir: the files a kernel would show exist
//! beforehand, and the tests assert the exact bytes the driver writes.

use crate::controller::ControllerKind;
use crate::error::CgroupError;
use crate::hierarchy::Hierarchy;
use crate::manager::CgroupManager;
use crate::resources::Resources;
use crate::v2::V2Manager;
use std::path::Path;

fn put(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

fn get(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A root offering the usual controllers, with `kubepods` existing and already enabling cpu
/// and memory for its children.
fn tree() -> (tempfile::TempDir, V2Manager) {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    put(
        &r.join("cgroup.controllers"),
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    );
    put(&r.join("cgroup.subtree_control"), "");
    put(
        &r.join("kubepods/cgroup.controllers"),
        "cpuset cpu io memory hugetlb pids\n",
    );
    put(&r.join("kubepods/cgroup.subtree_control"), "cpu memory\n");
    put(&r.join("kubepods/hugetlb.2MB.max"), "max\n");
    put(&r.join("kubepods/hugetlb.2MB.rsvd.max"), "max\n");
    let h = Hierarchy::detect_at(r);
    assert!(h.is_v2());
    (d, V2Manager::fake(h))
}

#[test]
fn create_enables_controllers_and_writes_v2_files() {
    let (d, m) = tree();
    let r = d.path();
    m.create(
        "/kubepods/burstable",
        &Resources {
            cpu_shares: Some(102),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 << 20),
            memory_high: Some(-1),
            pids_limit: Some(-1),
            hugetlb: vec![("2MB".into(), 0)],
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        get(&r.join("cgroup.subtree_control")),
        "+cpu +cpuset +hugetlb +io +memory +pids"
    );
    // Only what kubepods did not enable yet.
    assert_eq!(
        get(&r.join("kubepods/cgroup.subtree_control")),
        "+cpuset +hugetlb +io +pids"
    );
    let b = r.join("kubepods/burstable");
    assert_eq!(get(&b.join("cpu.weight")), "17");
    assert_eq!(get(&b.join("cpu.max")), "50000 100000");
    assert_eq!(get(&b.join("memory.max")), "67108864");
    assert_eq!(get(&b.join("memory.high")), "max");
    assert_eq!(get(&b.join("pids.max")), "max");
    assert_eq!(get(&b.join("hugetlb.2MB.max")), "0");
    assert!(!b.join("cpuset.cpus").exists());
    assert!(!b.join("cgroup.subtree_control").exists());
}

#[test]
fn shares_and_quota_map_to_weight_and_cpu_max() {
    let (d, m) = tree();
    let c = d.path().join("kubepods");
    let upd = |r: Resources| m.update("kubepods", &r).unwrap();
    upd(Resources {
        cpu_shares: Some(2),
        cpu_period: Some(100_000),
        ..Default::default()
    });
    assert_eq!(get(&c.join("cpu.weight")), "1");
    assert_eq!(get(&c.join("cpu.max")), "max 100000");
    upd(Resources {
        cpu_shares: Some(1024),
        cpu_quota: Some(-1),
        ..Default::default()
    });
    assert_eq!(get(&c.join("cpu.weight")), "100");
    // No period given: the kernel keeps the one it has.
    assert_eq!(get(&c.join("cpu.max")), "max");
    upd(Resources {
        cpu_shares: Some(262_144),
        cpu_quota: Some(25_000),
        cpu_period: Some(50_000),
        cpuset_cpus: Some("0-1".into()),
        cpuset_mems: Some("0".into()),
        memory_limit: Some(-1),
        pids_limit: Some(4096),
        ..Default::default()
    });
    assert_eq!(get(&c.join("cpu.weight")), "10000");
    assert_eq!(get(&c.join("cpu.max")), "25000 50000");
    assert_eq!(get(&c.join("cpuset.cpus")), "0-1");
    assert_eq!(get(&c.join("cpuset.mems")), "0");
    assert_eq!(get(&c.join("memory.max")), "max");
    assert_eq!(get(&c.join("pids.max")), "4096");
    // What the kernel reports back, in v1 terms.
    let back = m.read_resources("kubepods").unwrap();
    assert_eq!(back.cpu_shares, Some(262_144));
    assert_eq!(back.cpu_quota, Some(25_000));
    assert_eq!(back.cpu_period, Some(50_000));
    assert_eq!(back.memory_limit, Some(-1));
    assert_eq!(back.pids_limit, Some(4096));
    assert_eq!(back.cpuset_cpus.as_deref(), Some("0-1"));
    assert_eq!(back.memory_high, None);
}

#[test]
fn a_controller_the_kernel_lacks_is_an_error_and_nothing_is_left() {
    let (d, m) = tree();
    let r = d.path();
    put(&r.join("kubepods/cgroup.controllers"), "cpu memory pids\n");
    let err = m
        .create(
            "kubepods/pod1/ctr",
            &Resources {
                hugetlb: vec![("1GB".into(), 1 << 30)],
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "hugetlb needs the hugetlb cgroup controller, which is not available"
    );
    assert!(!r.join("kubepods/pod1").exists());
    assert!(r.join("kubepods").exists());
}

#[test]
fn update_of_a_missing_cgroup_and_bad_values_are_refused() {
    let (d, m) = tree();
    assert!(
        m.has_controller(ControllerKind::Hugetlb) && !m.has_controller(ControllerKind::Freezer)
    );
    assert_eq!(
        m.update("kubepods/nope", &Resources::default())
            .unwrap_err()
            .to_string(),
        "cgroup kubepods/nope does not exist"
    );
    let err = m
        .create(
            "kubepods/x",
            &Resources {
                pids_limit: Some(-7),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(matches!(
        err,
        CgroupError::InvalidResource {
            field: "pids_limit",
            ..
        }
    ));
    assert!(!d.path().join("kubepods/x").exists());
}

#[test]
fn kill_uses_cgroup_kill_and_freeze_waits_for_the_kernel() {
    let (d, m) = tree();
    let c = d.path().join("kubepods");
    put(&c.join("cgroup.kill"), "");
    m.kill_all("kubepods").unwrap();
    assert_eq!(get(&c.join("cgroup.kill")), "1");

    put(&c.join("cgroup.events"), "populated 1\nfrozen 1\n");
    m.freeze("kubepods").unwrap();
    assert_eq!(get(&c.join("cgroup.freeze")), "1");
    // A kernel that never reports the thaw: a bounded wait and an error naming the file.
    let err = m.thaw("kubepods").unwrap_err();
    assert_eq!(get(&c.join("cgroup.freeze")), "0");
    assert!(
        err.to_string()
            .ends_with("kubepods/cgroup.events: still frozen 1 after waiting (wanted frozen 0)"),
        "{err}"
    );
}

#[test]
fn pids_are_collected_recursively_and_delete_removes_the_subtree() {
    let (d, m) = tree();
    let c = d.path().join("kubepods");
    put(&c.join("cgroup.procs"), "10\n");
    put(&c.join("pod1/cgroup.procs"), "12\n11\n");
    put(&c.join("pod1/ctr/cgroup.procs"), "10\n");
    assert_eq!(m.pids("kubepods").unwrap(), vec![10, 11, 12]);
    assert_eq!(m.pids("/kubepods/pod1/").unwrap(), vec![10, 11, 12]);
    assert!(matches!(m.pids("nope"), Err(CgroupError::NotFound(_))));
    m.delete("kubepods/pod1").unwrap();
    assert!(!c.join("pod1").exists());
    assert!(c.exists());
    m.delete("kubepods/pod1").unwrap();
}

#[test]
fn exists_follows_upstream_controller_check() {
    let (d, m) = tree();
    put(
        &d.path().join("kubepods/cgroup.controllers"),
        "cpu io memory\n",
    );
    // kubepods lacks pids, cpuset and hugetlb, which the root offers: not usable yet.
    assert!(!m.exists("kubepods"));
    put(
        &d.path().join("kubepods/cgroup.controllers"),
        "cpuset cpu io memory hugetlb pids\n",
    );
    assert!(m.exists("kubepods"));
    assert!(!m.exists("kubepods/nope"));
    assert_eq!(
        m.read_resources("kubepods").unwrap().hugetlb,
        vec![("2MB".to_string(), 0)]
    );
}

#[test]
fn the_root_itself_is_never_killed_frozen_or_removed() {
    let (_d, m) = tree();
    for p in ["", "/", "//", "kubepods/.."] {
        assert!(
            matches!(m.kill_all(p), Err(CgroupError::InvalidPath(_))),
            "{p}"
        );
        assert!(
            matches!(m.freeze(p), Err(CgroupError::InvalidPath(_))),
            "{p}"
        );
        assert!(matches!(m.thaw(p), Err(CgroupError::InvalidPath(_))), "{p}");
        assert!(
            matches!(m.delete(p), Err(CgroupError::InvalidPath(_))),
            "{p}"
        );
    }
}

#[test]
fn memory_qos_values_are_written_and_read_back() {
    let (d, m) = tree();
    let pod = d.path().join("kubepods/burstable/pod1");
    // The tier as the kernel shows it once made.
    put(
        &d.path().join("kubepods/burstable/cgroup.controllers"),
        "cpuset cpu io memory hugetlb pids\n",
    );
    put(
        &d.path().join("kubepods/burstable/cgroup.subtree_control"),
        "",
    );
    // What the kubelet writes for a Burstable pod with MemoryQoS: requests protected by
    // memory.min, shares as weight, a pids cap.
    m.create(
        "kubepods/burstable/pod1",
        &Resources {
            cpu_shares: Some(1024),
            memory_min: Some(128 << 20),
            memory_high: Some(255_012_864),
            pids_limit: Some(1024),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(get(&pod.join("memory.min")), "134217728");
    assert_eq!(get(&pod.join("memory.high")), "255012864");
    assert_eq!(get(&pod.join("cpu.weight")), "100");
    assert_eq!(get(&pod.join("pids.max")), "1024");
    assert!(!pod.join("memory.max").exists());
    // The tier's protection follows its pods; 0 is a valid memory.min.
    m.update(
        "kubepods/burstable",
        &Resources {
            memory_min: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(get(&d.path().join("kubepods/burstable/memory.min")), "0");
    let back = m.read_resources("kubepods/burstable/pod1").unwrap();
    assert_eq!(back.memory_min, Some(128 << 20));
    assert_eq!(back.memory_high, Some(255_012_864));
    let err = m
        .update(
            "kubepods/burstable/pod1",
            &Resources {
                memory_min: Some(-1),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid memory_min: -1 must not be negative"
    );
}

#[test]
fn the_root_reports_the_machine_and_psi_when_present() {
    let (d, m) = tree();
    put(
        &d.path().join("memory.stat"),
        "anon 10\ninactive_file 4096\n",
    );
    let s = m.read_stats("/").unwrap();
    // The root has no memory.current: usage is the machine's, less inactive file.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let used = crate::v2::meminfo_usage(&meminfo).unwrap();
    // MemFree moves between the two reads; compare loosely against the kernel, exactly
    // against the inactive_file subtraction.
    assert_eq!(s.memory.usage_bytes - s.memory.working_set_bytes, 4096);
    assert!(s.memory.usage_bytes.abs_diff(used) < 1 << 30, "{s:?}");
    let c = d.path().join("kubepods");
    put(
        &c.join("io.pressure"),
        "some avg10=0.50 avg60=0.10 avg300=0.00 total=77\nfull avg10=0.25 avg60=0.00 avg300=0.00 total=33\n",
    );
    put(
        &c.join("cpu.pressure"),
        "some avg10=1.00 avg60=0.00 avg300=0.00 total=5\n",
    );
    let s = m.read_stats("kubepods").unwrap();
    let io = s.psi.io.unwrap();
    assert_eq!((io.some.avg10, io.some.total_us), (0.5, 77));
    assert_eq!(io.full.unwrap().total_us, 33);
    assert_eq!(s.psi.cpu.unwrap().full, None);
    assert_eq!(s.psi.memory, None);
}

#[test]
fn meminfo_usage_is_total_minus_free() {
    let info = "MemTotal:       1000 kB\nMemFree:         200 kB\nMemAvailable:    500 kB\n";
    assert_eq!(crate::v2::meminfo_usage(info), Some(800 * 1024));
    assert_eq!(crate::v2::meminfo_usage("MemFree: 1 kB\n"), None);
}
