//! The machine's memory per NUMA node, as cAdvisor's MachineInfo.Topology gives it to
//! upstream's memory manager: each node's `MemTotal` from
//! `<sysfs>/devices/system/node/node<N>/meminfo` and its hugepages from
//! `node<N>/hugepages/hugepages-<size>kB/nr_hugepages`. A machine without the node
//! directory (no NUMA support in the kernel) is one node 0 holding `/proc/meminfo`'s total.

use std::path::Path;

/// One NUMA node's memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NumaNode {
    pub id: usize,
    /// `MemTotal`, bytes.
    pub memory: u64,
    /// Per hugepage size: (page size in bytes, pages).
    pub hugepages: Vec<(u64, u64)>,
}

/// The nodes, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineInfo {
    pub nodes: Vec<NumaNode>,
}

impl MachineInfo {
    /// Reads `<sysfs_root>/devices/system/node`.
    pub fn read(sysfs_root: &Path) -> std::io::Result<MachineInfo> {
        let dir = sysfs_root.join("devices/system/node");
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(MachineInfo {
                    nodes: vec![NumaNode {
                        id: 0,
                        memory: meminfo_total(&std::fs::read_to_string("/proc/meminfo")?),
                        hugepages: Vec::new(),
                    }],
                });
            }
            Err(e) => return Err(e),
        };
        let mut nodes = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(id) = name
                .strip_prefix("node")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            let memory = meminfo_total(&std::fs::read_to_string(e.path().join("meminfo"))?);
            nodes.push(NumaNode {
                id,
                memory,
                hugepages: hugepages(&e.path().join("hugepages")),
            });
        }
        nodes.sort_by_key(|n| n.id);
        Ok(MachineInfo { nodes })
    }

    pub fn node_ids(&self) -> Vec<usize> {
        self.nodes.iter().map(|n| n.id).collect()
    }
}

/// `MemTotal` of a meminfo file (`/proc/meminfo`, or a node's `Node 0 MemTotal: … kB`).
fn meminfo_total(text: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            words.position(|w| w == "MemTotal:")?;
            words.next()?.parse::<u64>().ok()
        })
        .unwrap_or(0)
        * 1024
}

fn hugepages(dir: &Path) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(kb) = name
            .strip_prefix("hugepages-")
            .and_then(|s| s.strip_suffix("kB"))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        let pages = std::fs::read_to_string(e.path().join("nr_hugepages"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        out.push((kb * 1024, pages));
    }
    out.sort();
    out
}

/// Test fixtures: fake sysfs trees.
#[cfg(test)]
pub(crate) mod fake {
    use std::path::Path;

    /// Writes node `id` with `memory` bytes and hugepages `(page size bytes, pages)`.
    pub fn node(root: &Path, id: usize, memory: u64, hugepages: &[(u64, u64)]) {
        let dir = root.join(format!("devices/system/node/node{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("meminfo"),
            format!(
                "Node {id} MemTotal:       {} kB\nNode {id} MemFree:        1024 kB\n",
                memory / 1024
            ),
        )
        .unwrap();
        for (size, pages) in hugepages {
            let h = dir.join(format!("hugepages/hugepages-{}kB", size / 1024));
            std::fs::create_dir_all(&h).unwrap();
            std::fs::write(h.join("nr_hugepages"), format!("{pages}\n")).unwrap();
            std::fs::write(h.join("free_hugepages"), format!("{pages}\n")).unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nodes_memory_and_hugepages() {
        let d = tempfile::tempdir().unwrap();
        fake::node(d.path(), 1, 8 << 30, &[(2 << 20, 0), (1 << 30, 2)]);
        fake::node(d.path(), 0, 4 << 30, &[]);
        std::fs::write(d.path().join("devices/system/node/online"), "0-1\n").unwrap();
        let m = MachineInfo::read(d.path()).unwrap();
        assert_eq!(m.node_ids(), vec![0, 1]);
        assert_eq!(m.nodes[0].memory, 4 << 30);
        assert_eq!(m.nodes[1].hugepages, vec![(2 << 20, 0), (1 << 30, 2)]);
    }
}
