use super::*;

fn numa(n: usize) -> NumaInfo {
    NumaInfo {
        nodes: (0..n).collect(),
        ..Default::default()
    }
}

#[test]
fn refuses_more_numa_nodes_than_allowed_unless_the_policy_is_none() {
    let e = TopologyManager::with_numa(
        numa(9),
        "best-effort",
        "container",
        PolicyOptions::default(),
    )
    .err()
    .unwrap();
    assert_eq!(e, "unsupported on machines with more than 8 NUMA Nodes");
    assert!(
        TopologyManager::with_numa(numa(9), "none", "container", PolicyOptions::default()).is_ok()
    );
    let opts = PolicyOptions {
        max_allowable_numa_nodes: 9,
        ..Default::default()
    };
    assert!(TopologyManager::with_numa(numa(9), "restricted", "pod", opts).is_ok());
    assert_eq!(
        TopologyManager::with_numa(numa(2), "bogus", "container", PolicyOptions::default())
            .err()
            .unwrap(),
        "unknown policy: \"bogus\""
    );
    assert_eq!(
        TopologyManager::with_numa(numa(2), "none", "node", PolicyOptions::default())
            .err()
            .unwrap(),
        "unknown scope: \"node\""
    );
}

#[test]
fn reads_numa_nodes_and_distances_from_sysfs() {
    let d = tempfile::tempdir().unwrap();
    crate::cm::topology::fake_sysfs(d.path(), 2, 2, 1, 1);
    for (n, dist) in [
        (0, "10 11 20 20"),
        (1, "11 10 20 20"),
        (2, "20 20 10 11"),
        (3, "20 20 11 10"),
    ] {
        std::fs::write(
            d.path()
                .join(format!("devices/system/node/node{n}/distance")),
            dist,
        )
        .unwrap();
    }
    let info = NumaInfo::discover(d.path(), true).unwrap();
    assert_eq!(info.nodes, vec![0, 1, 2, 3]);
    assert_eq!(info.distances[&2], vec![20, 20, 10, 11]);
    let m = |n: &[usize]| BitMask::new(n).unwrap();
    assert_eq!(info.closest(m(&[0, 2]), m(&[2, 3])), m(&[2, 3]));
    std::fs::remove_file(d.path().join("devices/system/node/node3/distance")).unwrap();
    let e = TopologyManager::new(
        d.path(),
        "best-effort",
        "container",
        &BTreeMap::from([(
            policy::PREFER_CLOSEST_NUMA_NODES.to_string(),
            "true".to_string(),
        )]),
    )
    .err()
    .unwrap();
    assert!(
        e.starts_with("cannot discover NUMA topology: error getting NUMA distances"),
        "{e}"
    );
}
