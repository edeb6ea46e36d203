//! The machine's CPU topology (upstream's cpumanager/topology, there from cAdvisor's
//! MachineInfo): which socket, core and NUMA node each logical CPU belongs to, read from a
//! sysfs root (`/sys` on a node; a fake tree in tests):
//! `devices/system/cpu/cpuN/topology/{physical_package_id,core_id}` and
//! `devices/system/node/nodeN/cpulist`. A machine without `devices/system/node` is one NUMA
//! node 0.

use super::cpuset::CpuSet;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where one logical CPU sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuInfo {
    pub numa_node_id: usize,
    pub socket_id: usize,
    /// Unique over the machine (sysfs' core_id is per socket, so this is the lowest
    /// CPU id sharing the core, as cAdvisor numbers cores).
    pub core_id: usize,
}

/// CPU id → where it sits (upstream's CPUDetails).
pub type CpuDetails = BTreeMap<usize, CpuInfo>;

#[derive(Clone, Debug, PartialEq)]
pub struct CpuTopology {
    pub num_cpus: usize,
    pub num_cores: usize,
    pub num_sockets: usize,
    pub num_numa_nodes: usize,
    pub details: CpuDetails,
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("could not read CPU topology: {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("could not read CPU topology: {0}: {1}")]
    Parse(PathBuf, String),
    #[error("could not read CPU topology: no online CPUs under {0}")]
    NoCpus(PathBuf),
}

fn read(path: &Path) -> Result<String, TopologyError> {
    std::fs::read_to_string(path).map_err(|e| TopologyError::Io(path.to_path_buf(), e))
}

fn read_num(path: &Path) -> Result<usize, TopologyError> {
    let s = read(path)?;
    s.trim()
        .parse::<i64>()
        .map(|v| v.max(0) as usize)
        .map_err(|_| TopologyError::Parse(path.to_path_buf(), format!("not a number: {s:?}")))
}

fn read_set(path: &Path) -> Result<CpuSet, TopologyError> {
    let s = read(path)?;
    CpuSet::parse(&s).map_err(|e| TopologyError::Parse(path.to_path_buf(), e.to_string()))
}

impl CpuTopology {
    /// Reads the topology of the online CPUs under `sysfs` (e.g. `/sys`).
    pub fn discover(sysfs: &Path) -> Result<CpuTopology, TopologyError> {
        let cpu_dir = sysfs.join("devices/system/cpu");
        let online = read_set(&cpu_dir.join("online"))?;
        if online.is_empty() {
            return Err(TopologyError::NoCpus(cpu_dir));
        }
        let mut numa_of = BTreeMap::new();
        let node_dir = sysfs.join("devices/system/node");
        if let Ok(entries) = std::fs::read_dir(&node_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(id) = name
                    .strip_prefix("node")
                    .and_then(|n| n.parse::<usize>().ok())
                else {
                    continue;
                };
                for cpu in read_set(&e.path().join("cpulist"))?.iter() {
                    numa_of.insert(cpu, id);
                }
            }
        }
        // (socket, per-socket core_id) → lowest CPU on that core.
        let mut core_key = BTreeMap::<(usize, usize), usize>::new();
        let mut raw = Vec::new();
        for cpu in online.iter() {
            let t = cpu_dir.join(format!("cpu{cpu}/topology"));
            let socket = read_num(&t.join("physical_package_id"))?;
            let core = read_num(&t.join("core_id"))?;
            let e = core_key.entry((socket, core)).or_insert(cpu);
            *e = (*e).min(cpu);
            raw.push((cpu, socket, core));
        }
        let details: CpuDetails = raw
            .into_iter()
            .map(|(cpu, socket, core)| {
                let info = CpuInfo {
                    numa_node_id: numa_of.get(&cpu).copied().unwrap_or(0),
                    socket_id: socket,
                    core_id: core_key[&(socket, core)],
                };
                (cpu, info)
            })
            .collect();
        Ok(CpuTopology::from_details(details))
    }

    /// The topology of `details` (also how tests build one).
    pub fn from_details(details: CpuDetails) -> CpuTopology {
        let count = |f: fn(&CpuInfo) -> usize| {
            details
                .values()
                .map(f)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        };
        CpuTopology {
            num_cpus: details.len(),
            num_cores: count(|i| i.core_id),
            num_sockets: count(|i| i.socket_id),
            num_numa_nodes: count(|i| i.numa_node_id),
            details,
        }
    }

    /// Hyper-threads per core (upstream's CPUsPerCore).
    pub fn cpus_per_core(&self) -> usize {
        if self.num_cores == 0 {
            return 0;
        }
        self.num_cpus / self.num_cores
    }

    pub fn cpus_per_socket(&self) -> usize {
        if self.num_sockets == 0 {
            return 0;
        }
        self.num_cpus / self.num_sockets
    }

    pub fn cpus_per_numa_node(&self) -> usize {
        if self.num_numa_nodes == 0 {
            return 0;
        }
        self.num_cpus / self.num_numa_nodes
    }

    pub fn cpus(&self) -> CpuSet {
        self.details.keys().copied().collect()
    }

    /// The NUMA node ids, lowest first.
    pub fn numa_nodes(&self) -> Vec<usize> {
        let s: std::collections::BTreeSet<usize> =
            self.details.values().map(|i| i.numa_node_id).collect();
        s.into_iter().collect()
    }

    pub fn cpus_in_numa_nodes(&self, nodes: &[usize]) -> CpuSet {
        self.filter(|i| nodes.contains(&i.numa_node_id))
    }

    pub fn cpus_in_sockets(&self, sockets: &[usize]) -> CpuSet {
        self.filter(|i| sockets.contains(&i.socket_id))
    }

    pub fn cpus_in_cores(&self, cores: &[usize]) -> CpuSet {
        self.filter(|i| cores.contains(&i.core_id))
    }

    fn filter(&self, f: impl Fn(&CpuInfo) -> bool) -> CpuSet {
        self.details
            .iter()
            .filter(|(_, i)| f(i))
            .map(|(c, _)| *c)
            .collect()
    }
}

/// Writes a fake sysfs tree for tests: `sockets` × `numa_per_socket` NUMA nodes ×
/// `cores_per_numa` cores × `threads` threads, numbered as Linux numbers them (the first
/// thread of every core first, siblings after). For tests and benchmarks.
#[doc(hidden)]
pub fn fake_sysfs(
    root: &Path,
    sockets: usize,
    numa_per_socket: usize,
    cores_per_numa: usize,
    threads: usize,
) {
    let cores = sockets * numa_per_socket * cores_per_numa;
    let ncpu = cores * threads;
    let cpu_dir = root.join("devices/system/cpu");
    let write = |p: &Path, text: String| {
        std::fs::create_dir_all(p.parent().unwrap_or(root)).expect("fake sysfs directory");
        std::fs::write(p, text).expect("fake sysfs file");
    };
    write(&cpu_dir.join("online"), format!("0-{}\n", ncpu - 1));
    let mut nodes: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for cpu in 0..ncpu {
        let core = cpu % cores;
        let numa = core / cores_per_numa;
        let socket = numa / numa_per_socket;
        let t = cpu_dir.join(format!("cpu{cpu}/topology"));
        write(&t.join("physical_package_id"), format!("{socket}\n"));
        write(
            &t.join("core_id"),
            format!("{}\n", core % (cores / sockets)),
        );
        nodes.entry(numa).or_default().push(cpu);
    }
    for (n, cpus) in nodes {
        let d = root.join(format!("devices/system/node/node{n}"));
        write(&d.join("cpulist"), format!("{}\n", CpuSet::new(cpus)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_two_sockets_two_numa_nodes_with_smt() {
        let d = tempfile::tempdir().unwrap();
        fake_sysfs(d.path(), 2, 2, 2, 2);
        let t = CpuTopology::discover(d.path()).unwrap();
        assert_eq!(
            (t.num_cpus, t.num_cores, t.num_sockets, t.num_numa_nodes),
            (16, 8, 2, 4)
        );
        assert_eq!(t.cpus_per_core(), 2);
        // cpu 8 is cpu 0's sibling.
        assert_eq!(t.details[&8].core_id, t.details[&0].core_id);
        assert_eq!(t.cpus_in_numa_nodes(&[1]).to_string(), "2-3,10-11");
        assert_eq!(t.cpus_in_sockets(&[1]).to_string(), "4-7,12-15");
        assert_eq!(t.numa_nodes(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn reads_without_smt_and_without_numa_directory() {
        let d = tempfile::tempdir().unwrap();
        fake_sysfs(d.path(), 2, 2, 2, 1);
        std::fs::remove_dir_all(d.path().join("devices/system/node")).unwrap();
        let t = CpuTopology::discover(d.path()).unwrap();
        assert_eq!((t.num_cpus, t.num_cores, t.num_numa_nodes), (8, 8, 1));
        assert_eq!(t.cpus_per_core(), 1);
    }

    #[test]
    fn reads_this_machine() {
        let t = CpuTopology::discover(Path::new("/sys")).unwrap();
        assert!(t.num_cpus >= 1);
    }
}
