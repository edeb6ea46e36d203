//! cgroup v1 on a fake tree shaped like a hybrid machine: `cpu,cpuacct` co-mounted with
//! symlink aliases, no v1 hugetlb, and a cgroup2 `unified` mount that has it.

use crate::controller::ControllerKind;
use crate::hierarchy::Hierarchy;
use crate::manager::CgroupManager;
use crate::resources::Resources;
use crate::v1::V1Manager;
use std::path::Path;

fn put(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

fn get(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn hybrid_tree_writes_v1_files_and_hugetlb_through_unified() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    for m in ["cpu,cpuacct", "memory", "pids", "freezer"] {
        std::fs::create_dir(r.join(m)).unwrap();
    }
    std::os::unix::fs::symlink(r.join("cpu,cpuacct"), r.join("cpu")).unwrap();
    std::os::unix::fs::symlink(r.join("cpu,cpuacct"), r.join("cpuacct")).unwrap();
    put(&r.join("cpuset/cpuset.cpus"), "0-3\n");
    put(&r.join("cpuset/cpuset.mems"), "0\n");
    put(&r.join("unified/cgroup.controllers"), "hugetlb\n");
    put(&r.join("unified/cgroup.subtree_control"), "");
    // The kernel would fill these in when kubepods is made; this tree has it already.
    put(&r.join("unified/kubepods/cgroup.controllers"), "hugetlb\n");
    put(&r.join("unified/kubepods/cgroup.subtree_control"), "");

    let h = Hierarchy::detect_at(r);
    assert!(!h.is_v2());
    assert_eq!(h.unified(), Some(r.join("unified").as_path()));
    let m = V1Manager::fake(h);
    assert!(m.has_controller(ControllerKind::Hugetlb) && m.has_controller(ControllerKind::Memory));
    assert!(!m.has_controller(ControllerKind::Blkio));
    m.create(
        "kubepods/pod1",
        &Resources {
            cpu_shares: Some(512),
            cpu_quota: Some(20_000),
            cpu_period: Some(100_000),
            memory_limit: Some(104_857_600),
            memory_high: Some(1),
            pids_limit: Some(-1),
            hugetlb: vec![("2MB".into(), 2_097_152)],
            ..Default::default()
        },
    )
    .unwrap();
    let cpu = r.join("cpu,cpuacct/kubepods/pod1");
    assert_eq!(get(&cpu.join("cpu.shares")), "512");
    assert_eq!(get(&cpu.join("cpu.cfs_period_us")), "100000");
    assert_eq!(get(&cpu.join("cpu.cfs_quota_us")), "20000");
    let mem = r.join("memory/kubepods/pod1");
    assert_eq!(get(&mem.join("memory.limit_in_bytes")), "104857600");
    assert!(!mem.join("memory.high").exists());
    assert_eq!(get(&r.join("pids/kubepods/pod1/pids.max")), "max");
    // New cpuset levels inherit the parent's cpus and mems.
    assert_eq!(get(&r.join("cpuset/kubepods/cpuset.cpus")), "0-3");
    assert_eq!(get(&r.join("cpuset/kubepods/pod1/cpuset.mems")), "0");
    assert!(r.join("freezer/kubepods/pod1").is_dir());
    assert_eq!(get(&r.join("unified/cgroup.subtree_control")), "+hugetlb");
    assert_eq!(
        get(&r.join("unified/kubepods/cgroup.subtree_control")),
        "+hugetlb"
    );
    assert_eq!(
        get(&r.join("unified/kubepods/pod1/hugetlb.2MB.max")),
        "2097152"
    );
    assert!(m.exists("kubepods/pod1"));

    m.delete("kubepods").unwrap();
    for m in [
        "cpu,cpuacct",
        "memory",
        "pids",
        "freezer",
        "cpuset",
        "unified",
    ] {
        assert!(!r.join(m).join("kubepods").exists(), "{m}");
    }
}
