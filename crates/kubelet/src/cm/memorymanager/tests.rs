//! The Static policy on a fake machine of 2 sockets × 2 NUMA nodes (8Gi each), against the
//! outcomes upstream documents (the memory manager task page, the KEP's "single vs. cross
//! NUMA node allocation" and policy_static_test.go's cases).

use super::machine::fake;
use super::*;
use crate::admission::{PodAdmitAttributes, PodAdmitHandler, PodAdmitResult, Reason};
use crate::cm::topologymanager::TopologyManager;
use crate::cm::topologymanager::{BitMask, HintProvider, TopologyHint};
use std::sync::Mutex;

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;

fn cm_config(system_reserved_memory: &str) -> crate::cm::Config {
    crate::cm::Config {
        system_reserved: BTreeMap::from([("memory".into(), system_reserved_memory.into())]),
        eviction_hard: BTreeMap::from([("memory.available".into(), "100Mi".into())]),
        enforce_node_allocatable: vec!["pods".into()],
        ..crate::cm::Config::defaults(crate::cm::qos::Layout {
            root: "/".into(),
            per_qos: true,
        })
    }
}

/// 4 nodes of 8Gi; node 3 also has `node3_1gi_pages` 1Gi hugepages.
struct Fixture {
    sysfs: tempfile::TempDir,
    root: tempfile::TempDir,
}

impl Fixture {
    fn new(node3_1gi_pages: u64) -> Fixture {
        let sysfs = tempfile::tempdir().unwrap();
        // 2 sockets × 2 NUMA nodes × 2 cores × 2 threads, each node with 8Gi.
        crate::cm::topology::fake_sysfs(sysfs.path(), 2, 2, 2, 2);
        for id in 0..4 {
            let pages = if id == 3 { node3_1gi_pages } else { 0 };
            fake::node(sysfs.path(), id, 8 * GI, &[(2 * MI, 0), (GI, pages)]);
        }
        Fixture {
            sysfs,
            root: tempfile::tempdir().unwrap(),
        }
    }

    fn config(&self, policy: &str, reserved: &str) -> Config {
        Config {
            policy: policy.into(),
            reserved_memory: reserved::parse_flag(reserved).unwrap(),
            sysfs_root: self.sysfs.path().to_path_buf(),
        }
    }

    /// Static, 512Mi system-reserved + 100Mi eviction, reserved on nodes 0 and 1; the
    /// only hint provider of a topology manager with the `none` policy, as the kubelet wires
    /// it.
    fn start(&self) -> Node {
        self.start_under("none")
    }

    /// [`Fixture::start`] under the topology manager policy `policy`.
    fn start_under(&self, policy: &str) -> Node {
        let m = Arc::new(
            self.start_with("Static", "512Mi", "0:memory=512Mi;1:memory=100Mi")
                .unwrap(),
        );
        let tm = Arc::new(
            TopologyManager::new(self.sysfs.path(), policy, "container", &BTreeMap::new()).unwrap(),
        );
        m.set_affinity(Arc::clone(&tm) as _);
        tm.add_hint_provider(Arc::clone(&m) as _);
        let active: Arc<Mutex<Vec<Pod>>> = Arc::default();
        let pending: Arc<Mutex<Vec<String>>> = Arc::default();
        let (a, p) = (Arc::clone(&active), Arc::clone(&pending));
        m.set_active_pods(
            Box::new(move || a.lock().unwrap().clone()),
            Box::new(move |uid| p.lock().unwrap().iter().any(|u| u == uid)),
        );
        Node {
            m,
            tm,
            active,
            pending,
        }
    }

    fn start_with(
        &self,
        policy: &str,
        system: &str,
        reserved: &str,
    ) -> Result<MemoryManager, Error> {
        MemoryManager::start(
            &self.config(policy, reserved),
            &cm_config(system),
            (32 * GI) as i64,
            self.root.path(),
        )
    }

    fn state_file(&self) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(self.root.path().join(state::FILE)).unwrap())
            .unwrap()
    }
}

fn pod(uid: &str, resources: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": resources}]}
    }))
    .unwrap()
}

/// A Guaranteed pod of `memory` (and `hugepages-1Gi` when given).
fn guaranteed(uid: &str, memory: &str, hugepages_1gi: Option<&str>) -> Pod {
    let mut limits = serde_json::json!({"cpu": "1", "memory": memory});
    if let Some(h) = hugepages_1gi {
        limits["hugepages-1Gi"] = h.into();
    }
    pod(
        uid,
        serde_json::json!({"requests": limits, "limits": limits}),
    )
}

/// The memory manager behind the topology manager, with the kubelet's active pods.
struct Node {
    m: Arc<MemoryManager>,
    tm: Arc<TopologyManager>,
    active: Arc<Mutex<Vec<Pod>>>,
    /// Pods still on their way to admission after a restart.
    pending: Arc<Mutex<Vec<String>>>,
}

impl std::ops::Deref for Node {
    type Target = MemoryManager;
    fn deref(&self) -> &MemoryManager {
        &self.m
    }
}

/// Admission as the kubelet's chain runs it (the topology manager calls Allocate) with
/// `others` the active pods.
async fn admit(n: &Node, pod: &Pod, others: &[Pod]) -> PodAdmitResult {
    *n.active.lock().unwrap() = others.to_vec();
    let others: Vec<_> = others.iter().cloned().map(std::sync::Arc::new).collect();
    n.tm.admit(&PodAdmitAttributes {
        pod,
        other_pods: &others,
    })
    .await
}

fn node_table(m: &MemoryManager, node: usize, resource: &str) -> state::MemoryTable {
    m.inner.lock().unwrap().state.machine_state[&node].memory_map[resource].clone()
}

fn cells(m: &MemoryManager, node: usize) -> Vec<usize> {
    m.inner.lock().unwrap().state.machine_state[&node]
        .cells
        .clone()
}

#[test]
fn default_machine_state_subtracts_reservations_and_hugepages() {
    let f = Fixture::new(2);
    let m = f.start();
    let t = node_table(&m, 0, "memory");
    assert_eq!(t.total_mem_size, 8 * GI);
    assert_eq!(t.system_reserved, 512 * MI);
    assert_eq!(
        (t.allocatable, t.free, t.reserved),
        (8 * GI - 512 * MI, 8 * GI - 512 * MI, 0)
    );
    assert_eq!(node_table(&m, 1, "memory").allocatable, 8 * GI - 100 * MI);
    // Memory given to hugepages is not regular memory.
    assert_eq!(node_table(&m, 3, "memory").allocatable, 6 * GI);
    assert_eq!(node_table(&m, 3, "hugepages-1Gi").allocatable, 2 * GI);
    assert_eq!(node_table(&m, 2, "hugepages-2Mi").allocatable, 0);
    let v = f.state_file();
    assert_eq!(v["policyName"], "Static");
    assert_eq!(
        v["machineState"]["1"]["memoryMap"]["memory"]["systemReserved"],
        100 * MI
    );
}

#[tokio::test]
async fn guaranteed_pods_are_pinned_other_classes_are_not() {
    let f = Fixture::new(0);
    let m = f.start();
    let g = guaranteed("g", "1Gi", None);
    assert!(admit(&m, &g, &[]).await.admit);
    // The narrowest, lowest-numbered node with room.
    assert_eq!(m.cpuset_mems("g", "c").as_deref(), Some("0"));
    assert_eq!(node_table(&m, 0, "memory").reserved, GI);
    let v = f.state_file();
    assert_eq!(
        v["entries"]["g"]["c"],
        serde_json::json!([{"numaAffinity": [0], "type": "memory", "size": GI}])
    );
    assert_eq!(v["machineState"]["0"]["numberOfAssignments"], 1);

    let b = pod("b", serde_json::json!({"requests": {"memory": "1Gi"}}));
    let be = pod("be", serde_json::json!({}));
    for p in [&b, &be] {
        assert!(admit(&m, p, std::slice::from_ref(&g)).await.admit);
        let uid = p.metadata.uid.as_deref().unwrap();
        assert_eq!(m.cpuset_mems(uid, "c"), None);
    }
    assert_eq!(node_table(&m, 0, "memory").reserved, GI);
}

#[tokio::test]
async fn a_node_serves_single_or_one_cross_numa_group_never_both() {
    let f = Fixture::new(0);
    let m = f.start();
    let small = guaranteed("small", "1Gi", None);
    assert!(admit(&m, &small, &[]).await.admit);
    // 10Gi fits no single node: two nodes, but not node 0 which serves a single-node pod.
    let big = guaranteed("big", "10Gi", None);
    assert!(admit(&m, &big, std::slice::from_ref(&small)).await.admit);
    assert_eq!(m.cpuset_mems("big", "c").as_deref(), Some("1,2"));
    assert_eq!(
        (cells(&m, 1), cells(&m, 2), cells(&m, 3)),
        (vec![1, 2], vec![1, 2], vec![3])
    );
    // Node 1 fills first, node 2 takes the rest.
    assert_eq!(node_table(&m, 1, "memory").free, 0);
    assert_eq!(
        node_table(&m, 2, "memory").reserved,
        10 * GI - (8 * GI - 100 * MI)
    );
    // 7Gi: node 0 has 6.5Gi left, nodes 1 and 2 are a group: node 3.
    let mid = guaranteed("mid", "7Gi", None);
    let others = [small.clone(), big.clone()];
    assert!(admit(&m, &mid, &others).await.admit);
    assert_eq!(m.cpuset_mems("mid", "c").as_deref(), Some("3"));
    // 20Gi: every set is either too small or mixes single and grouped nodes.
    let huge = guaranteed("huge", "20Gi", None);
    let all = [small.clone(), big.clone(), mid.clone()];
    let r = admit(&m, &huge, &all).await;
    assert!(!r.admit);
    assert_eq!(r.reason, Some(Reason::UnexpectedAdmissionError));
    assert_eq!(
        r.message,
        "Allocate failed due to [memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available, which is unexpected"
    );
    assert!(f.state_file()["entries"].get("huge").is_none());
    // The group goes away with its pod.
    m.remove_pod("big");
    assert_eq!((cells(&m, 1), cells(&m, 2)), (vec![1], vec![2]));
    assert_eq!(node_table(&m, 1, "memory").free, 8 * GI - 100 * MI);
    assert_eq!(node_table(&m, 2, "memory").free, 8 * GI);
    assert_eq!(m.cpuset_mems("big", "c"), None);
}

#[tokio::test]
async fn hugepages_come_from_the_node_that_has_them() {
    let f = Fixture::new(2);
    let m = f.start();
    let p = guaranteed("h", "1Gi", Some("2Gi"));
    assert!(admit(&m, &p, &[]).await.admit);
    assert_eq!(m.cpuset_mems("h", "c").as_deref(), Some("3"));
    assert_eq!(node_table(&m, 3, "hugepages-1Gi").free, 0);
    assert_eq!(node_table(&m, 3, "memory").reserved, GI);
    // Two blocks on node 3: it counts two assignments.
    assert_eq!(
        f.state_file()["machineState"]["3"]["numberOfAssignments"],
        2
    );
    let more = guaranteed("h2", "1Gi", Some("1Gi"));
    let r = admit(&m, &more, std::slice::from_ref(&p)).await;
    assert!(!r.admit);
    assert!(
        r.message.contains("no NUMA nodes with enough memory"),
        "{}",
        r.message
    );
}

#[tokio::test]
async fn stale_pods_give_their_memory_back_at_the_next_admission() {
    let f = Fixture::new(0);
    let m = f.start();
    assert!(admit(&m, &guaranteed("gone", "6Gi", None), &[]).await.admit);
    assert_eq!(node_table(&m, 0, "memory").reserved, 6 * GI);
    // "gone" is no longer among the active pods.
    assert!(admit(&m, &guaranteed("next", "7Gi", None), &[]).await.admit);
    assert_eq!(m.cpuset_mems("gone", "c"), None);
    assert_eq!(m.cpuset_mems("next", "c").as_deref(), Some("0"));
    // ...unless it is still waiting for its turn at admission after a restart.
    m.pending.lock().unwrap().push("next".into());
    assert!(
        admit(&m, &guaranteed("third", "1Gi", None), &[])
            .await
            .admit
    );
    assert_eq!(m.cpuset_mems("next", "c").as_deref(), Some("0"));
}

#[test]
fn hints_prefer_the_fewest_nodes_and_follow_existing_assignments() {
    let f = Fixture::new(0);
    let m = f.start();
    let p = guaranteed("p", "1Gi", None);
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    let hints = m.topology_hints(&p, &c).unwrap();
    let memory = &hints["memory"];
    // Every non-empty set of the 4 nodes fits 1Gi; the single nodes are preferred.
    assert_eq!(memory.len(), 15);
    let preferred: Vec<Vec<usize>> = memory
        .iter()
        .filter(|h| h.preferred)
        .filter_map(|h| h.numa_node_affinity.map(|m| m.get_bits()))
        .collect();
    assert_eq!(preferred, vec![vec![0], vec![1], vec![2], vec![3]]);
    // 9Gi needs two nodes: only pairs and wider, the pairs preferred.
    let big = guaranteed("big", "9Gi", None);
    let bc = big.spec.as_ref().unwrap().containers[0].clone();
    let hints = m.topology_hints(&big, &bc).unwrap();
    assert!(
        hints["memory"]
            .iter()
            .all(|h| h.numa_node_affinity.unwrap().count() >= 2)
    );
    assert_eq!(hints["memory"].iter().filter(|h| h.preferred).count(), 6);
    // Once allocated, the hints are the assignment (as after a kubelet restart).
    m.allocate_container(&p, &c, None).unwrap();
    assert_eq!(
        m.topology_hints(&p, &c).unwrap()["memory"],
        vec![TopologyHint {
            numa_node_affinity: BitMask::new(&[0]),
            preferred: true
        }]
    );
    assert_eq!(m.pod_topology_hints(&p).unwrap()["memory"].len(), 1);
    let b = pod("b", serde_json::json!({"requests": {"memory": "1Gi"}}));
    assert!(
        m.topology_hints(&b, &b.spec.as_ref().unwrap().containers[0])
            .is_none()
    );
}

#[test]
fn a_topology_hint_too_narrow_is_extended() {
    let f = Fixture::new(0);
    let m = f.start();
    let p = guaranteed("p", "9Gi", None);
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    // The topology manager chose node 1 alone (restricted merging): it is extended to the
    // narrowest set containing it.
    m.allocate_container(
        &p,
        &c,
        Some(TopologyHint {
            numa_node_affinity: BitMask::new(&[1]),
            preferred: false,
        }),
    )
    .unwrap();
    assert_eq!(m.cpuset_mems("p", "c").as_deref(), Some("0,1"));
    // A hint on nodes the policy can take is used as it is.
    let q = guaranteed("q", "1Gi", None);
    m.allocate_container(
        &q,
        &q.spec.as_ref().unwrap().containers[0],
        Some(TopologyHint {
            numa_node_affinity: BitMask::new(&[3]),
            preferred: true,
        }),
    )
    .unwrap();
    assert_eq!(m.cpuset_mems("q", "c").as_deref(), Some("3"));
}

#[tokio::test]
async fn init_container_memory_is_reused_by_the_app_containers() {
    let f = Fixture::new(0);
    let m = f.start();
    let limits = |mem: &str| serde_json::json!({"requests": {"cpu": "1", "memory": mem}, "limits": {"cpu": "1", "memory": mem}});
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "p"},
        "spec": {
            "initContainers": [{"name": "init", "resources": limits("2Gi")}],
            "containers": [{"name": "app", "resources": limits("1Gi")}]
        }
    }))
    .unwrap();
    assert!(admit(&m, &p, &[]).await.admit);
    // The pod holds 2Gi, not 3Gi: the app container took 1Gi of the init container's.
    assert_eq!(node_table(&m, 0, "memory").reserved, 2 * GI);
    let v = f.state_file();
    assert_eq!(v["entries"]["p"]["init"][0]["size"], GI);
    assert_eq!(v["entries"]["p"]["app"][0]["size"], GI);
    assert_eq!(m.cpuset_mems("p", "app").as_deref(), Some("0"));
    m.remove_pod("p");
    assert_eq!(node_table(&m, 0, "memory").reserved, 0);
}

#[tokio::test]
async fn restart_restores_and_checks_the_state() {
    let f = Fixture::new(0);
    {
        let m = f.start();
        assert!(admit(&m, &guaranteed("g", "1Gi", None), &[]).await.admit);
    }
    let m = f.start();
    assert_eq!(m.cpuset_mems("g", "c").as_deref(), Some("0"));
    assert_eq!(node_table(&m, 0, "memory").reserved, GI);
    drop(m);
    // Another reservation changes what the machine offers: the old state is refused.
    let e = f
        .start_with("Static", "412Mi", "0:memory=412Mi;1:memory=100Mi")
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        e,
        "start memory manager error: [memorymanager] the expected machine state is different from the real one"
    );
    // Another policy: refused with upstream's message.
    let e = f.start_with("None", "512Mi", "").err().unwrap().to_string();
    assert_eq!(
        e,
        format!(
            "start memory manager error: could not restore state from checkpoint: [memorymanager] configured policy \"None\" differs from state checkpoint policy \"Static\", please drain this node and delete the memory manager checkpoint file {:?} before restarting Kubelet",
            f.root.path().join(state::FILE)
        )
    );
}

#[test]
fn bad_configurations_are_refused_as_upstream() {
    let f = Fixture::new(0);
    let e = f
        .start_with("Static", "512Mi", "0:memory=512Mi")
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        e,
        "the total amount \"512Mi\" of type \"memory\" is not equal to the value \"612Mi\" determined by Node Allocatable feature"
    );
    let e = f
        .start_with("static", "512Mi", "")
        .err()
        .unwrap()
        .to_string();
    assert_eq!(e, "unknown policy: \"static\"");
    let e = f
        .start_with("Static", "512Mi", "0:memory=512Mi;7:memory=100Mi")
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        e,
        "the reserved memory configuration references a NUMA node 7 that does not exist on this machine"
    );
    // The None policy ignores the reservations and still keeps a state file.
    let m = f.start_with("None", "512Mi", "").unwrap();
    assert_eq!(m.policy_name(), "None");
    let g = guaranteed("g", "1Gi", None);
    assert!(HintProvider::allocate(&m, &g, &g.spec.as_ref().unwrap().containers[0]).is_ok());
    assert_eq!(m.cpuset_mems("g", "c"), None);
    assert_eq!(f.state_file()["policyName"], "None");
}

struct FixedAffinity(TopologyHint);

impl crate::cm::topologymanager::Store for FixedAffinity {
    fn get_affinity(&self, _: &str, _: &str) -> TopologyHint {
        self.0.clone()
    }
}

#[test]
fn as_a_hint_provider_it_follows_the_merged_hint() {
    let f = Fixture::new(0);
    let m = f
        .start_with("Static", "512Mi", "0:memory=512Mi;1:memory=100Mi")
        .unwrap();
    m.set_affinity(std::sync::Arc::new(FixedAffinity(TopologyHint {
        numa_node_affinity: BitMask::new(&[2]),
        preferred: true,
    })));
    let p = guaranteed("p", "1Gi", None);
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    assert_eq!(
        HintProvider::get_topology_hints(&m, &p, &c)["memory"].len(),
        15
    );
    assert_eq!(
        HintProvider::get_pod_topology_hints(&m, &p)["memory"].len(),
        15
    );
    HintProvider::allocate(&m, &p, &c).unwrap();
    assert_eq!(m.cpuset_mems("p", "c").as_deref(), Some("2"));
    // Pods the policy does not pin have no preference.
    let b = pod("b", serde_json::json!({"requests": {"memory": "1Gi"}}));
    let bc = b.spec.as_ref().unwrap().containers[0].clone();
    assert!(HintProvider::get_topology_hints(&m, &b, &bc).is_empty());
    HintProvider::allocate(&m, &b, &bc).unwrap();
    assert_eq!(m.cpuset_mems("b", "c"), None);
}

#[tokio::test]
async fn under_single_numa_node_a_pod_spanning_nodes_is_a_topology_affinity_error() {
    let f = Fixture::new(0);
    let m = f.start_under("single-numa-node");
    let small = guaranteed("small", "6Gi", None);
    assert!(admit(&m, &small, &[]).await.admit);
    assert_eq!(m.cpuset_mems("small", "c").as_deref(), Some("0"));
    // 10Gi fits only two nodes together: the policy refuses it, nothing is placed.
    let big = guaranteed("big", "10Gi", None);
    let r = admit(&m, &big, std::slice::from_ref(&small)).await;
    assert!(!r.admit);
    assert_eq!(r.reason, Some(Reason::TopologyAffinityError));
    assert_eq!(
        r.message,
        "Resources cannot be allocated with Topology locality"
    );
    assert_eq!(m.cpuset_mems("big", "c"), None);
    // Under best-effort the same pod is admitted across two nodes.
    let f = Fixture::new(0);
    let m = f.start_under("best-effort");
    assert!(admit(&m, &big, &[]).await.admit);
    assert_eq!(m.cpuset_mems("big", "c").as_deref(), Some("0,1"));
}
