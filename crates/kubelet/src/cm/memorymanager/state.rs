//! The memory manager's state (upstream's memorymanager/state): per NUMA node the memory
//! table of every memory type, how many assignments use the node and the group of nodes
//! it is allocated with; per container the memory blocks it got. Kept in
//! `<root-dir>/memory_manager_state` in upstream's JSON layout:
//!
//! `{"policyName":"Static","machineState":{"0":{"numberOfAssignments":1,"memoryMap":
//! {"memory":{"total":…,"systemReserved":…,"allocatable":…,"reserved":…,"free":…}},
//! "cells":[0]}},"entries":{"<pod uid>":{"<container>":[{"numaAffinity":[0],
//! "type":"memory","size":…}]}},"checksum":N}`
//!
//! The checksum is [`crate::cm::checksum`] over the file's JSON with `checksum` 0.

use crate::cm::checksum::of_json as checksum;
use crate::cm::devicemanager::checkpoint::{CheckpointError, write_atomic};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// upstream's memoryManagerStateFileName.
pub const FILE: &str = "memory_manager_state";

/// One memory type on one NUMA node, bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryTable {
    #[serde(rename = "total")]
    pub total_mem_size: u64,
    #[serde(rename = "systemReserved")]
    pub system_reserved: u64,
    pub allocatable: u64,
    pub reserved: u64,
    pub free: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNodeState {
    /// Memory blocks placed on this node (a container with memory and hugepages counts twice).
    #[serde(rename = "numberOfAssignments")]
    pub number_of_assignments: i64,
    #[serde(rename = "memoryMap")]
    pub memory_map: BTreeMap<String, MemoryTable>,
    /// This node and the nodes it is allocated together with (`[n]` alone).
    pub cells: Vec<usize>,
}

/// NUMA node id → its state.
pub type NumaNodeMap = BTreeMap<usize, NumaNodeState>;

/// An amount of one memory type on a set of NUMA nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    #[serde(rename = "numaAffinity")]
    pub numa_affinity: Vec<usize>,
    #[serde(rename = "type")]
    pub type_: String,
    pub size: u64,
}

/// pod UID → container → blocks.
pub type ContainerMemoryAssignments = BTreeMap<String, BTreeMap<String, Vec<Block>>>;

#[derive(Serialize, Deserialize)]
struct Checkpoint {
    #[serde(rename = "policyName")]
    policy_name: String,
    #[serde(rename = "machineState", default)]
    machine_state: NumaNodeMap,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: ContainerMemoryAssignments,
    #[serde(default)]
    checksum: u64,
}

/// The state and where it is kept; every change is written through ([`State::store`]).
#[derive(Debug)]
pub struct State {
    dir: PathBuf,
    policy_name: String,
    pub machine_state: NumaNodeMap,
    pub assignments: ContainerMemoryAssignments,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "could not restore state from checkpoint: {cause}, please drain this node and delete the memory manager checkpoint file {path:?} before restarting Kubelet"
    )]
    Restore { cause: String, path: PathBuf },
    #[error("could not save the memory manager state {path:?}: {cause}")]
    Store { cause: String, path: PathBuf },
}

impl State {
    /// upstream's NewCheckpointState: restores `dir/memory_manager_state`, or creates it
    /// empty; a file written under another policy is refused.
    pub fn new(dir: &Path, policy_name: &str) -> Result<State, StateError> {
        let mut s = State {
            dir: dir.to_path_buf(),
            policy_name: policy_name.to_string(),
            machine_state: NumaNodeMap::new(),
            assignments: ContainerMemoryAssignments::new(),
        };
        let path = dir.join(FILE);
        let restore = |cause: String| StateError::Restore {
            cause,
            path: path.clone(),
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                s.store()?;
                return Ok(s);
            }
            Err(e) => return Err(restore(e.to_string())),
        };
        let mut cp: Checkpoint =
            serde_json::from_slice(&bytes).map_err(|e| restore(e.to_string()))?;
        let want = cp.checksum;
        cp.checksum = 0;
        if checksum(&cp).map_err(|e| restore(e.to_string()))? != want {
            return Err(restore(CheckpointError::Corrupt.to_string()));
        }
        if cp.policy_name != policy_name {
            return Err(restore(format!(
                "[memorymanager] configured policy {policy_name:?} differs from state checkpoint policy {:?}",
                cp.policy_name
            )));
        }
        s.machine_state = cp.machine_state;
        s.assignments = cp.entries;
        tracing::info!(
            pods = s.assignments.len(),
            "memory manager: restored state from checkpoint"
        );
        Ok(s)
    }

    /// Writes the state file.
    pub fn store(&self) -> Result<(), StateError> {
        let path = self.dir.join(FILE);
        let err = |cause: String| StateError::Store {
            cause,
            path: path.clone(),
        };
        let mut cp = Checkpoint {
            policy_name: self.policy_name.clone(),
            machine_state: self.machine_state.clone(),
            entries: self.assignments.clone(),
            checksum: 0,
        };
        cp.checksum = checksum(&cp).map_err(|e| err(e.to_string()))?;
        let bytes = serde_json::to_vec(&cp).map_err(|e| err(e.to_string()))?;
        write_atomic(&self.dir, FILE, &bytes).map_err(|e| err(e.to_string()))
    }

    /// [`State::store`], logging a failure (upstream logs and goes on).
    pub fn store_or_log(&self) {
        if let Err(e) = self.store() {
            tracing::warn!(error = %e, "Store state to checkpoint error");
        }
    }

    pub fn memory_blocks(&self, pod_uid: &str, container: &str) -> Option<&Vec<Block>> {
        self.assignments.get(pod_uid).and_then(|c| c.get(container))
    }

    pub fn set_memory_blocks(&mut self, pod_uid: &str, container: &str, blocks: Vec<Block>) {
        self.assignments
            .entry(pod_uid.to_string())
            .or_default()
            .insert(container.to_string(), blocks);
    }

    pub fn delete(&mut self, pod_uid: &str, container: &str) {
        if let Some(c) = self.assignments.get_mut(pod_uid) {
            c.remove(container);
            if c.is_empty() {
                self.assignments.remove(pod_uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_layout_policy_check_and_corruption() {
        let d = tempfile::tempdir().unwrap();
        let mut s = State::new(d.path(), "Static").unwrap();
        s.machine_state.insert(
            0,
            NumaNodeState {
                number_of_assignments: 1,
                memory_map: BTreeMap::from([(
                    "memory".into(),
                    MemoryTable {
                        total_mem_size: 10,
                        system_reserved: 1,
                        allocatable: 9,
                        reserved: 2,
                        free: 7,
                    },
                )]),
                cells: vec![0],
            },
        );
        s.set_memory_blocks(
            "uid",
            "c",
            vec![Block {
                numa_affinity: vec![0],
                type_: "memory".into(),
                size: 2,
            }],
        );
        s.store().unwrap();
        let text = std::fs::read_to_string(d.path().join(FILE)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["policyName"], "Static");
        assert_eq!(v["machineState"]["0"]["memoryMap"]["memory"]["free"], 7);
        assert_eq!(v["machineState"]["0"]["memoryMap"]["memory"]["total"], 10);
        assert_eq!(v["machineState"]["0"]["cells"], serde_json::json!([0]));
        assert_eq!(
            v["entries"]["uid"]["c"][0]["numaAffinity"],
            serde_json::json!([0])
        );
        assert_eq!(v["entries"]["uid"]["c"][0]["type"], "memory");
        assert!(v["checksum"].as_u64().unwrap() > 0);
        let again = State::new(d.path(), "Static").unwrap();
        assert_eq!(again.machine_state, s.machine_state);
        assert_eq!(again.assignments, s.assignments);

        let e = State::new(d.path(), "None").unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "could not restore state from checkpoint: [memorymanager] configured policy \"None\" differs from state checkpoint policy \"Static\", please drain this node and delete the memory manager checkpoint file {:?} before restarting Kubelet",
                d.path().join(FILE)
            )
        );
        std::fs::write(
            d.path().join(FILE),
            text.replace("\"size\":2", "\"size\":3"),
        )
        .unwrap();
        let e = State::new(d.path(), "Static").unwrap_err().to_string();
        assert!(e.contains(": checkpoint is corrupted, please drain"), "{e}");

        // A new file has no entries at all (upstream's omitempty).
        let d = tempfile::tempdir().unwrap();
        State::new(d.path(), "None").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.path().join(FILE)).unwrap()).unwrap();
        assert_eq!(v["policyName"], "None");
        assert_eq!(v["machineState"], serde_json::json!({}));
        assert!(v.get("entries").is_none());
    }
}
