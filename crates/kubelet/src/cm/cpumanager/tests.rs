//! The CPU manager with the topology manager on fake sysfs trees (2 sockets × 2 NUMA nodes
//! × 2 cores, SMT on/off): admission, exclusive CPUs, the shared pool, init container reuse,
//! release, the state file and the policy options.

use super::*;
use crate::admission::{PodAdmitAttributes, PodAdmitHandler};
use crate::cm::topologymanager::{BitMask, PolicyOptions, TopologyManager};

fn topo(threads: usize) -> CpuTopology {
    let d = tempfile::tempdir().unwrap();
    crate::cm::topology::fake_sysfs(d.path(), 2, 2, 2, threads);
    CpuTopology::discover(d.path()).unwrap()
}

fn config(dir: &std::path::Path, policy: &str, reserved: &str) -> Config {
    Config {
        policy: policy.into(),
        policy_options: BTreeMap::new(),
        reconcile_period: DEFAULT_RECONCILE_PERIOD,
        reserved_cpus: CpuSet::parse(reserved).unwrap(),
        reserved_milli: Some(CpuSet::parse(reserved).unwrap().len() as i64 * 1000),
        state_dir: dir.to_path_buf(),
    }
}

fn pod(uid: &str, cpu: &str, init_cpu: Option<&str>) -> Pod {
    let res = |c: &str| serde_json::json!({"requests": {"cpu": c, "memory": "64Mi"}, "limits": {"cpu": c, "memory": "64Mi"}});
    let mut spec = serde_json::json!({"containers": [{"name": "app", "resources": res(cpu)}]});
    if let Some(i) = init_cpu {
        spec["initContainers"] = serde_json::json!([{"name": "init", "resources": res(i)}]);
    }
    serde_json::from_value(serde_json::json!({"metadata": {"uid": uid}, "spec": spec})).unwrap()
}

fn best_effort(uid: &str) -> Pod {
    serde_json::from_value(
        serde_json::json!({"metadata": {"uid": uid}, "spec": {"containers": [{"name": "app"}]}}),
    )
    .unwrap()
}

/// A device plugin's hints: its resource only on `node`.
struct Device(usize);
impl HintProvider for Device {
    fn get_topology_hints(&self, _: &Pod, _: &Container) -> HashMap<String, Vec<TopologyHint>> {
        let h = TopologyHint {
            numa_node_affinity: BitMask::new(&[self.0]),
            preferred: true,
        };
        HashMap::from([("example.com/dev".to_string(), vec![h])])
    }
    fn get_pod_topology_hints(&self, p: &Pod) -> HashMap<String, Vec<TopologyHint>> {
        let c = Container::default();
        self.get_topology_hints(p, &c)
    }
    fn allocate(&self, _: &Pod, _: &Container) -> Result<(), String> {
        Ok(())
    }
}

struct Node {
    cpu: Arc<CpuManager>,
    tm: Arc<TopologyManager>,
    admitted: Vec<Pod>,
    _dir: tempfile::TempDir,
}

impl Node {
    fn new(threads: usize, tm_policy: &str, scope: &str, options: &[(&str, &str)]) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let t = topo(threads);
        let mut c = config(dir.path(), "static", "0");
        c.policy_options = options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let cpu = Arc::new(CpuManager::new(&c, t.clone()).unwrap());
        let numa = crate::cm::topologymanager::NumaInfo {
            nodes: t.numa_nodes(),
            ..Default::default()
        };
        let tm = Arc::new(
            TopologyManager::with_numa(numa, tm_policy, scope, PolicyOptions::default()).unwrap(),
        );
        cpu.set_affinity(Arc::clone(&tm) as _);
        tm.add_hint_provider(Arc::clone(&cpu) as _);
        Node {
            cpu,
            tm,
            admitted: vec![],
            _dir: dir,
        }
    }

    fn admit(&mut self, p: Pod) -> crate::admission::PodAdmitResult {
        let others: Vec<_> = self
            .admitted
            .iter()
            .cloned()
            .map(std::sync::Arc::new)
            .collect();
        let r = futures::executor::block_on(self.tm.admit(&PodAdmitAttributes {
            pod: &p,
            other_pods: &others,
        }));
        if r.admit {
            self.admitted.push(p);
        }
        r
    }

    fn cpus(&self, uid: &str, c: &str) -> String {
        self.cpu.container_cpuset(uid, c).unwrap_or_default()
    }
}

#[test]
fn guaranteed_containers_get_exclusive_cpus_and_the_rest_share_the_pool() {
    let mut n = Node::new(2, "none", "container", &[]);
    assert_eq!(n.cpus("be", "app"), "0-15");
    assert!(n.admit(pod("g1", "2", None)).admit);
    // CPU 0 is reserved, so the first whole core is 1 and its sibling 9.
    assert_eq!(n.cpus("g1", "app"), "1,9");
    assert_eq!(n.cpus("be", "app"), "0,2-8,10-15");
    // The pod-resources API's view: exclusive CPUs only, and every CPU but the reserved.
    assert_eq!(n.cpu.exclusive_cpus("g1", "app"), vec![1, 9]);
    assert!(n.cpu.exclusive_cpus("be", "app").is_empty());
    assert_eq!(n.cpu.allocatable_cpus(), (1..16).collect::<Vec<i64>>());
    // A fractional request shares the pool; so does a Burstable or BestEffort pod.
    assert!(n.admit(pod("g2", "1500m", None)).admit);
    assert_eq!(n.cpus("g2", "app"), "0,2-8,10-15");
    assert!(n.admit(best_effort("be")).admit);
    // The state file says so in upstream's layout.
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(n._dir.path().join(state::FILE)).unwrap()).unwrap();
    assert_eq!(v["policyName"], "static");
    assert_eq!(v["defaultCpuSet"], "0,2-8,10-15");
    assert_eq!(v["entries"]["g1"]["app"], "1,9");
    // The pod goes: its CPUs come back when the next pod is admitted.
    n.admitted
        .retain(|p| p.metadata.uid.as_deref() != Some("g1"));
    n.cpu.set_active_pods(
        {
            let pods = n.admitted.clone();
            Box::new(move || pods.clone())
        },
        Box::new(|_| false),
    );
    assert!(n.admit(best_effort("be2")).admit);
    assert_eq!(n.cpus("be", "app"), "0-15");
    assert_eq!(n.cpu.state().assignments.len(), 0);
}

#[test]
fn init_container_cpus_are_reused_by_the_app_container() {
    let mut n = Node::new(2, "none", "container", &[]);
    assert!(n.admit(pod("p", "2", Some("2"))).admit);
    assert_eq!(n.cpus("p", "init"), "1,9");
    assert_eq!(n.cpus("p", "app"), "1,9");
    assert_eq!(n.cpu.state().default_cpu_set.to_string(), "0,2-8,10-15");
}

#[test]
fn topology_manager_aligns_cpus_with_a_device() {
    let mut n = Node::new(2, "single-numa-node", "container", &[]);
    n.tm.add_hint_provider(Arc::new(Device(2)));
    assert!(n.admit(pod("p", "2", None)).admit);
    // NUMA node 2 holds CPUs 4,5,12,13.
    assert_eq!(n.cpus("p", "app"), "4,12");
    // Five CPUs fit no single NUMA node (four CPUs each).
    let r = n.admit(pod("big", "5", None));
    assert!(!r.admit);
    assert_eq!(r.reason.unwrap().as_string(), "TopologyAffinityError");
    assert_eq!(
        r.message,
        "Resources cannot be allocated with Topology locality"
    );
    // best-effort admits it anyway, on two NUMA nodes.
    let mut n = Node::new(2, "best-effort", "container", &[]);
    assert!(n.admit(pod("big", "5", None)).admit);
    assert_eq!(CpuSet::parse(&n.cpus("big", "app")).unwrap().len(), 5);
    // restricted refuses a device on one node with CPUs needing two.
    let mut n = Node::new(2, "restricted", "container", &[]);
    n.tm.add_hint_provider(Arc::new(Device(1)));
    assert!(!n.admit(pod("big", "5", None)).admit);
    assert!(n.admit(pod("small", "1", None)).admit);
    assert_eq!(n.cpus("small", "app"), "2");
}

#[test]
fn pod_scope_merges_the_whole_pod() {
    // Two app containers of 3 CPUs: each fits a NUMA node, together they do not.
    let mut p = pod("p", "3", None);
    let mut second = p.spec.as_ref().unwrap().containers[0].clone();
    second.name = "app2".into();
    p.spec.as_mut().unwrap().containers.push(second);
    let mut n = Node::new(2, "single-numa-node", "container", &[]);
    assert!(n.admit(p.clone()).admit);
    let mut n = Node::new(2, "single-numa-node", "pod", &[]);
    let r = n.admit(p);
    assert_eq!(r.reason.unwrap().as_string(), "TopologyAffinityError");
}

#[test]
fn full_pcpus_only_refuses_split_cores() {
    let mut n = Node::new(
        2,
        "none",
        "container",
        &[(policy_static::FULL_PCPUS_ONLY, "true")],
    );
    let r = n.admit(pod("p", "1", None));
    assert!(!r.admit);
    assert_eq!(r.reason.unwrap().as_string(), "SMTAlignmentError");
    assert_eq!(
        r.message,
        "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2"
    );
    assert!(n.admit(pod("p2", "2", None)).admit);
    // CPU 0's core (0 and 8) is off limits: the first free whole core is 1.
    assert_eq!(n.cpus("p2", "app"), "1,9");
    // Without SMT every request is whole cores.
    let mut n = Node::new(
        1,
        "none",
        "container",
        &[(policy_static::FULL_PCPUS_ONLY, "true")],
    );
    assert!(n.admit(pod("p", "1", None)).admit);
}

#[test]
fn distribute_cpus_across_numa_spreads_a_large_request() {
    let mut n = Node::new(
        2,
        "none",
        "container",
        &[(policy_static::DISTRIBUTE_CPUS_ACROSS_NUMA, "true")],
    );
    assert!(n.admit(pod("p", "6", None)).admit);
    let got = CpuSet::parse(&n.cpus("p", "app")).unwrap();
    let t = topo(2);
    let per_node: Vec<usize> = t
        .numa_nodes()
        .iter()
        .map(|&x| got.intersection(&t.cpus_in_numa_nodes(&[x])).len())
        .filter(|&k| k > 0)
        .collect();
    assert_eq!(per_node, vec![3, 3], "{got:?}");
}

#[test]
fn a_changed_policy_or_bad_configuration_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let t = topo(1);
    CpuManager::new(&config(dir.path(), "none", ""), t.clone()).unwrap();
    let e = CpuManager::new(&config(dir.path(), "static", "0"), t.clone())
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        e,
        format!(
            "could not restore state from checkpoint: configured policy \"static\" differs from state checkpoint policy \"none\", please drain this node and delete the CPU manager checkpoint file {:?} before restarting Kubelet",
            dir.path().join(state::FILE)
        )
    );
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "static", "");
    c.reserved_milli = Some(0);
    assert_eq!(
        CpuManager::new(&c, t.clone()).err().unwrap().to_string(),
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    );
    // 1500m reserved rounds up to two CPUs, taken low cores first.
    c.reserved_milli = Some(1500);
    let m = CpuManager::new(&c, t.clone()).unwrap();
    let reserved = m
        .inner
        .lock()
        .unwrap()
        .policy
        .as_ref()
        .unwrap()
        .reserved
        .clone();
    assert_eq!(reserved.to_string(), "0-1");
    let mut c = config(dir.path(), "bogus", "");
    c.reserved_milli = None;
    assert_eq!(
        CpuManager::new(&c, t.clone()).err().unwrap().to_string(),
        "unknown policy: \"bogus\""
    );
}
