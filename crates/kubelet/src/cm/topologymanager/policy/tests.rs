//! Table tests of the merge against upstream's documented outcomes, on a machine with
//! 2 sockets × 2 NUMA nodes (NUMA nodes 0-3).

use super::*;

fn numa() -> NumaInfo {
    NumaInfo {
        nodes: vec![0, 1, 2, 3],
        // Nodes 0 and 2 are close (as on a machine numbering NUMA nodes across sockets).
        distances: BTreeMap::from([
            (0, vec![10, 20, 11, 20]),
            (1, vec![20, 10, 20, 11]),
            (2, vec![11, 20, 10, 20]),
            (3, vec![20, 11, 20, 10]),
        ]),
    }
}

fn h(nodes: &[usize], preferred: bool) -> TopologyHint {
    TopologyHint {
        numa_node_affinity: Some(BitMask::new(nodes).unwrap()),
        preferred,
    }
}

fn any(preferred: bool) -> TopologyHint {
    TopologyHint {
        numa_node_affinity: None,
        preferred,
    }
}

fn provider(resource: &str, hints: Vec<TopologyHint>) -> HashMap<String, Vec<TopologyHint>> {
    HashMap::from([(resource.to_string(), hints)])
}

fn policy(name: PolicyName, prefer_closest: bool) -> Policy {
    Policy {
        name,
        numa: numa(),
        opts: PolicyOptions {
            prefer_closest_numa: prefer_closest,
            ..Default::default()
        },
    }
}

/// CPU hints for a request that fits one NUMA node: every single node preferred, wider
/// sets not.
fn cpu_one_node() -> Vec<TopologyHint> {
    let mut v = vec![];
    crate::cm::topologymanager::bitmask::iterate_bit_masks(&[0, 1, 2, 3], |m| {
        v.push(TopologyHint {
            numa_node_affinity: Some(m),
            preferred: m.count() == 1,
        })
    });
    v
}

#[test]
fn merges_as_upstream() {
    use PolicyName::*;
    struct Case {
        name: &'static str,
        providers: Vec<HashMap<String, Vec<TopologyHint>>>,
        // (best-effort, restricted, single-numa-node): merged hint and admit.
        want: [(TopologyHint, bool); 3],
    }
    let all = [0, 1, 2, 3];
    let cases = vec![
        Case {
            name: "no provider has a preference: any NUMA node, preferred",
            providers: vec![HashMap::new(), HashMap::new()],
            want: [
                (h(&all, true), true),
                (h(&all, true), true),
                (any(true), true),
            ],
        },
        Case {
            name: "CPUs fit anywhere, the device is on node 1: node 1",
            providers: vec![
                provider("cpu", cpu_one_node()),
                provider("dev", vec![h(&[1], true)]),
            ],
            want: [
                (h(&[1], true), true),
                (h(&[1], true), true),
                (h(&[1], true), true),
            ],
        },
        Case {
            name: "CPUs only on node 0, the device only on node 1: no common node",
            providers: vec![
                provider("cpu", vec![h(&[0], true)]),
                provider("dev", vec![h(&[1], true)]),
            ],
            want: [
                (h(&all, false), true),
                (h(&all, false), false),
                (any(false), false),
            ],
        },
        Case {
            name: "one provider preferred on 0, the other on 0-1: node 0, not preferred",
            providers: vec![
                provider("cpu", vec![h(&[0], true)]),
                provider("dev", vec![h(&[0, 1], true)]),
            ],
            want: [
                (h(&[0], false), true),
                (h(&[0], false), false),
                (any(false), false),
            ],
        },
        Case {
            name: "a resource that fits nowhere (empty hints)",
            providers: vec![
                provider("cpu", vec![]),
                provider("dev", vec![h(&[1], true)]),
            ],
            want: [
                (h(&[1], false), true),
                (h(&[1], false), false),
                (any(false), false),
            ],
        },
        Case {
            name: "a request spanning two nodes: the narrowest preferred pair",
            providers: vec![provider(
                "cpu",
                vec![h(&[0, 1], true), h(&[0, 2], true), h(&[1, 2, 3], false)],
            )],
            want: [
                (h(&[0, 1], true), true),
                (h(&[0, 1], true), true),
                (any(false), false),
            ],
        },
        Case {
            name: "non-preferred only: as wide as the widest provider's narrowest need",
            providers: vec![
                provider("cpu", vec![h(&[0, 1], false), h(&[0, 1, 2], false)]),
                provider("dev", vec![h(&[0], false), h(&[0, 1], false)]),
            ],
            want: [
                (h(&[0, 1], false), true),
                (h(&[0, 1], false), false),
                (any(false), false),
            ],
        },
    ];
    for c in cases {
        for (i, name) in [BestEffort, Restricted, SingleNumaNode]
            .into_iter()
            .enumerate()
        {
            let got = policy(name, false).merge(&c.providers);
            assert_eq!(got, c.want[i], "{}: {}", c.name, name.as_str());
        }
        assert_eq!(policy(None, false).merge(&c.providers), (any(false), true));
    }
}

#[test]
fn prefer_closest_numa_nodes_picks_the_closest_pair() {
    let providers = vec![provider(
        "cpu",
        vec![h(&[0, 1], true), h(&[0, 2], true), h(&[1, 3], true)],
    )];
    // Narrowest: equal widths, the lower nodes win.
    assert_eq!(
        policy(PolicyName::BestEffort, false).merge(&providers).0,
        h(&[0, 1], true)
    );
    // Closest: 0-2 (distance 11) over 0-1 (distance 20).
    assert_eq!(
        policy(PolicyName::BestEffort, true).merge(&providers).0,
        h(&[0, 2], true)
    );
    assert_eq!(
        policy(PolicyName::Restricted, true).merge(&providers).0,
        h(&[0, 2], true)
    );
    // A narrower mask still beats a closer wider one.
    let providers = vec![provider("cpu", vec![h(&[0, 2], true), h(&[3], true)])];
    assert_eq!(
        policy(PolicyName::BestEffort, true).merge(&providers).0,
        h(&[3], true)
    );
}

#[test]
fn options_are_parsed_with_upstreams_texts() {
    let o = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
    assert_eq!(
        PolicyOptions::parse(&BTreeMap::new()).unwrap(),
        PolicyOptions::default()
    );
    assert!(
        PolicyOptions::parse(&o(PREFER_CLOSEST_NUMA_NODES, "true"))
            .unwrap()
            .prefer_closest_numa
    );
    assert_eq!(
        PolicyOptions::parse(&o(MAX_ALLOWABLE_NUMA_NODES, "16"))
            .unwrap()
            .max_allowable_numa_nodes,
        16
    );
    assert_eq!(
        PolicyOptions::parse(&o(MAX_ALLOWABLE_NUMA_NODES, "4")).unwrap_err(),
        "the minimum value of \"max-allowable-numa-nodes\" should not be less than 8"
    );
    assert_eq!(
        PolicyOptions::parse(&o("bogus", "true")).unwrap_err(),
        "unknown Topology Manager Policy option: \"bogus\""
    );
    assert_eq!(
        PolicyOptions::parse(&o(PREFER_CLOSEST_NUMA_NODES, "yes")).unwrap_err(),
        "bad value for option \"prefer-closest-numa-nodes\": strconv.ParseBool: parsing \"yes\": invalid syntax"
    );
}
