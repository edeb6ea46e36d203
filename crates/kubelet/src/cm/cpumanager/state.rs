//! The CPU manager's state and its checkpoint `<root-dir>/cpu_manager_state`, in upstream's
//! JSON layout: `{"policyName":"static","defaultCpuSet":"0","entries":{"<pod
//! uid>":{"<container>":"1"}},"checksum":N}`. The checksum is [`crate::cm::checksum`] over the
//! same object without it. A file written under another policy is refused with upstream's
//! message: the operator drains the node and deletes the file before changing the policy.

use crate::cm::cpuset::CpuSet;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const FILE: &str = "cpu_manager_state";

/// pod UID → container → its exclusive CPUs.
pub type Assignments = BTreeMap<String, BTreeMap<String, CpuSet>>;

/// What the CPU manager remembers: the shared pool and the exclusive CPUs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub default_cpu_set: CpuSet,
    pub assignments: Assignments,
}

impl State {
    pub fn get(&self, uid: &str, container: &str) -> Option<&CpuSet> {
        self.assignments.get(uid)?.get(container)
    }

    /// The container's exclusive CPUs, or the shared pool (upstream's GetCPUSetOrDefault).
    pub fn get_or_default(&self, uid: &str, container: &str) -> CpuSet {
        self.get(uid, container)
            .cloned()
            .unwrap_or_else(|| self.default_cpu_set.clone())
    }

    pub fn set(&mut self, uid: &str, container: &str, cpus: CpuSet) {
        self.assignments
            .entry(uid.to_string())
            .or_default()
            .insert(container.to_string(), cpus);
    }

    pub fn delete(&mut self, uid: &str, container: &str) {
        if let Some(p) = self.assignments.get_mut(uid) {
            p.remove(container);
            if p.is_empty() {
                self.assignments.remove(uid);
            }
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Data {
    #[serde(rename = "policyName")]
    policy_name: String,
    #[serde(rename = "defaultCpuSet")]
    default_cpu_set: String,
    #[serde(
        rename = "entries",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    entries: BTreeMap<String, BTreeMap<String, String>>,
}

#[derive(Serialize, Deserialize)]
struct File {
    #[serde(flatten)]
    data: Data,
    checksum: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "could not restore state from checkpoint: {0}, please drain this node and delete the CPU manager checkpoint file {1:?} before restarting Kubelet"
    )]
    Restore(String, PathBuf),
    #[error("could not write CPU manager state {0:?}: {1}")]
    Write(PathBuf, String),
}

/// Reads the state written under `policy`; `Ok(None)` when there is no file yet.
pub fn read(dir: &Path, policy: &str) -> Result<Option<State>, StateError> {
    let path = dir.join(FILE);
    let restore = |m: String| StateError::Restore(m, path.clone());
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(restore(e.to_string())),
    };
    let file: File = serde_json::from_slice(&bytes).map_err(|e| restore(e.to_string()))?;
    let sum = crate::cm::checksum::of_json(&file.data).map_err(|e| restore(e.to_string()))?;
    if sum != file.checksum {
        return Err(restore("checkpoint is corrupted".into()));
    }
    let d = file.data;
    if d.policy_name != policy {
        return Err(restore(format!(
            "configured policy {policy:?} differs from state checkpoint policy {:?}",
            d.policy_name
        )));
    }
    let default_cpu_set = CpuSet::parse(&d.default_cpu_set).map_err(|e| {
        restore(format!(
            "could not parse default cpu set {:?}: {e}",
            d.default_cpu_set
        ))
    })?;
    let mut state = State {
        default_cpu_set,
        assignments: BTreeMap::new(),
    };
    for (pod, containers) in d.entries {
        for (c, s) in containers {
            let set = CpuSet::parse(&s).map_err(|e| {
                restore(format!(
                    "could not parse cpuset {s:?} for container {c:?} in pod {pod:?}: {e}"
                ))
            })?;
            state.set(&pod, &c, set);
        }
    }
    Ok(Some(state))
}

/// Writes atomically (a temporary file renamed over the old one).
pub fn write(dir: &Path, policy: &str, state: &State) -> Result<(), StateError> {
    let path = dir.join(FILE);
    let err = |e: String| StateError::Write(path.clone(), e);
    let data = Data {
        policy_name: policy.to_string(),
        default_cpu_set: state.default_cpu_set.to_string(),
        entries: state
            .assignments
            .iter()
            .map(|(p, cs)| {
                let cs = cs.iter().map(|(c, s)| (c.clone(), s.to_string())).collect();
                (p.clone(), cs)
            })
            .collect(),
    };
    let checksum = crate::cm::checksum::of_json(&data).map_err(|e| err(e.to_string()))?;
    let bytes = serde_json::to_vec(&File { data, checksum }).map_err(|e| err(e.to_string()))?;
    let tmp = dir.join(format!(".{FILE}.tmp"));
    std::fs::write(&tmp, bytes).map_err(|e| err(e.to_string()))?;
    std::fs::rename(&tmp, &path).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_upstreams_layout_and_refuses_another_policy() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read(d.path(), "static").unwrap(), None);
        let mut s = State {
            default_cpu_set: CpuSet::parse("0,2-3").unwrap(),
            ..Default::default()
        };
        s.set("uid-1", "app", CpuSet::new([1]));
        write(d.path(), "static", &s).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.path().join(FILE)).unwrap()).unwrap();
        assert_eq!(v["policyName"], "static");
        assert_eq!(v["defaultCpuSet"], "0,2-3");
        assert_eq!(v["entries"]["uid-1"]["app"], "1");
        assert!(v["checksum"].as_u64().unwrap() > 0);
        assert_eq!(read(d.path(), "static").unwrap(), Some(s));
        let e = read(d.path(), "none").unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "could not restore state from checkpoint: configured policy \"none\" differs from state checkpoint policy \"static\", please drain this node and delete the CPU manager checkpoint file {:?} before restarting Kubelet",
                d.path().join(FILE)
            )
        );
        // An edited file fails its checksum.
        let text = std::fs::read_to_string(d.path().join(FILE)).unwrap();
        std::fs::write(d.path().join(FILE), text.replace("0,2-3", "0-3")).unwrap();
        assert!(
            read(d.path(), "static")
                .unwrap_err()
                .to_string()
                .contains("checkpoint is corrupted")
        );
    }

    #[test]
    fn none_policy_state_has_no_entries_key() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "none", &State::default()).unwrap();
        let text = std::fs::read_to_string(d.path().join(FILE)).unwrap();
        assert!(
            text.starts_with(r#"{"policyName":"none","defaultCpuSet":"","checksum":"#),
            "{text}"
        );
    }
}
