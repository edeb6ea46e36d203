//! Table tests of the allocator on fake sysfs trees: 2 sockets × 2 NUMA nodes × 2 cores,
//! with and without SMT (Linux numbering: CPU n and n+8 are siblings). Expected sets follow
//! upstream's takeByTopology rules: whole NUMA nodes/sockets, then whole cores, then threads
//! from the units with the fewest free CPUs.

use super::*;

fn topo(threads: usize) -> CpuTopology {
    let d = tempfile::tempdir().unwrap();
    crate::cm::topology::fake_sysfs(d.path(), 2, 2, 2, threads);
    CpuTopology::discover(d.path()).unwrap()
}

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

#[test]
fn packed_with_smt() {
    let t = topo(2);
    assert_eq!((t.num_sockets, t.num_numa_nodes, t.num_cpus), (2, 4, 16));
    let all = t.cpus();
    let cases: &[(&str, &CpuSet, usize, &str)] = &[
        ("one cpu: the first thread of the first core", &all, 1, "0"),
        ("two cpus: a whole core, siblings together", &all, 2, "0,8"),
        (
            "three cpus: a core, then a thread of the next core",
            &all,
            3,
            "0-1,8",
        ),
        ("four cpus: a whole NUMA node", &all, 4, "0-1,8-9"),
        (
            "six cpus: a NUMA node and a core of the next",
            &all,
            6,
            "0-2,8-10",
        ),
        ("eight cpus: a whole socket", &all, 8, "0-3,8-11"),
        ("sixteen cpus: everything", &all, 16, "0-15"),
    ];
    for (name, avail, n, want) in cases {
        let got = take_by_topology_numa_packed(&t, avail, *n).unwrap();
        assert_eq!(got.to_string(), *want, "{name}");
    }
    // A half-used core is filled before a free one is broken.
    let avail = all.difference(&set("0"));
    assert_eq!(
        take_by_topology_numa_packed(&t, &avail, 1)
            .unwrap()
            .to_string(),
        "8"
    );
    // The socket with fewer free CPUs is used first (packing), its free NUMA node whole.
    let avail = all.difference(&set("0"));
    assert_eq!(
        take_by_topology_numa_packed(&t, &avail, 6)
            .unwrap()
            .to_string(),
        "1-3,9-11"
    );
    assert_eq!(
        take_by_topology_numa_packed(&t, &set("0-1"), 3)
            .unwrap_err()
            .to_string(),
        "not enough cpus available to satisfy request: requested=3, available=2"
    );
}

#[test]
fn packed_without_smt() {
    let t = topo(1);
    assert_eq!((t.num_cpus, t.num_cores, t.cpus_per_core()), (8, 8, 1));
    let all = t.cpus();
    assert_eq!(
        take_by_topology_numa_packed(&t, &all, 1)
            .unwrap()
            .to_string(),
        "0"
    );
    assert_eq!(
        take_by_topology_numa_packed(&t, &all, 2)
            .unwrap()
            .to_string(),
        "0-1"
    );
    assert_eq!(
        take_by_topology_numa_packed(&t, &all, 3)
            .unwrap()
            .to_string(),
        "0-2"
    );
    assert_eq!(
        take_by_topology_numa_packed(&t, &all, 4)
            .unwrap()
            .to_string(),
        "0-3"
    );
    let avail = all.difference(&set("0"));
    assert_eq!(
        take_by_topology_numa_packed(&t, &avail, 1)
            .unwrap()
            .to_string(),
        "1"
    );
}

#[test]
fn distributed_across_numa_nodes() {
    let t = topo(2);
    let all = t.cpus();
    // Fits one NUMA node: taken as packed would.
    assert_eq!(
        take_by_topology_numa_distributed(&t, &all, 4, 1)
            .unwrap()
            .to_string(),
        "0-1,8-9"
    );
    // Six CPUs with CPU 0 used: three from each of the two NUMA nodes that leave the free
    // CPUs of all nodes most even (1 and 2), where packing takes NUMA node 1 and a core of 0.
    let avail = all.difference(&set("0"));
    assert_eq!(
        take_by_topology_numa_distributed(&t, &avail, 6, 1)
            .unwrap()
            .to_string(),
        "2-5,10,12"
    );
    // In groups of whole cores (full-pcpus-only).
    let got = take_by_topology_numa_distributed(&t, &avail, 6, 2).unwrap();
    assert_eq!(got.len(), 6);
    for c in got.iter() {
        let sibling = if c >= 8 { c - 8 } else { c + 8 };
        assert!(got.contains(sibling), "{got:?} splits a core");
    }
    // A request not a multiple of the group is packed.
    assert_eq!(
        take_by_topology_numa_distributed(&t, &all, 3, 2)
            .unwrap()
            .to_string(),
        "0-1,8"
    );
}
