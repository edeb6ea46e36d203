//! Sandbox and container records: what the runtime knows about each, persisted as one JSON
//! value per object in the record store (`records`) so a restarted daemon finds every
//! sandbox and container again.
//!
//! The CRI configs are kept as their protobuf encoding (base64 in the JSON): lossless, and
//! immune to our own struct changes. Each save is a transaction of the store, so a crash
//! leaves the old or the new record, never a torn one.

mod records;

pub use records::{RecordStore, Records};

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state record {path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

mod b64 {
    use base64::Engine as _;
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(serde::de::Error::custom)
    }
}

/// Nanoseconds since the epoch, the CRI's timestamp unit.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// A record's protobuf config, decoded on first use and kept: listings read every record's
/// labels on each call, and decoding them each time made a list cost a decode per
/// container. Clones of a record share it; a record whose config changes gets a new one.
#[derive(Clone, Default)]
pub struct Decoded<M>(std::sync::Arc<std::sync::OnceLock<M>>);

impl<M> std::fmt::Debug for Decoded<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Decoded")
    }
}

impl<M: prost::Message + Default> Decoded<M> {
    fn get(&self, bytes: &[u8]) -> &M {
        self.0.get_or_init(|| M::decode(bytes).unwrap_or_default())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    /// `PodSandboxConfig`, protobuf-encoded; a sandbox's config never changes.
    #[serde(with = "b64")]
    pub config: Vec<u8>,
    #[serde(skip)]
    pub decoded: Decoded<cri::runtime::v1::PodSandboxConfig>,
    pub handler: String,
    pub created_at: i64,
    pub state: SandboxState,
    /// The reserved name: `<name>_<namespace>_<uid>_<attempt>`.
    pub name: String,
    pub netns: Option<PathBuf>,
    pub ipc_ns: Option<PathBuf>,
    pub uts_ns: Option<PathBuf>,
    pub pid_ns: Option<PathBuf>,
    pub pid_init: Option<u32>,
    /// The pod's user namespace (`hostUsers: false`) and its maps.
    #[serde(default)]
    pub user_ns: Option<PathBuf>,
    #[serde(default)]
    pub user_mappings: Option<crate::sandbox::UserMappings>,
    /// The pod's own mount namespace ([`crate::sandbox::mountns`]); none for privileged
    /// pods and sandboxes of earlier versions, whose mounts are the node's.
    #[serde(default)]
    pub mnt_ns: Option<PathBuf>,
    pub ip: Option<String>,
    pub additional_ips: Vec<String>,
    /// Whether CNI ADD succeeded, so stop knows a DEL is owed.
    pub network_ready: bool,
    pub dir: PathBuf,
}

impl SandboxRecord {
    /// The pod's pinned user namespace and its maps, when it has one.
    pub fn user_namespace(&self) -> Option<(&std::path::Path, &crate::sandbox::UserMappings)> {
        self.user_ns.as_deref().zip(self.user_mappings.as_ref())
    }

    pub fn config(&self) -> cri::runtime::v1::PodSandboxConfig {
        self.config_ref().clone()
    }

    /// The config, decoded once.
    pub fn config_ref(&self) -> &cri::runtime::v1::PodSandboxConfig {
        self.decoded.get(&self.config)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub id: String,
    pub sandbox_id: String,
    /// `ContainerConfig`, protobuf-encoded; changed only with [`ContainerRecord::set_config`].
    #[serde(with = "b64")]
    pub config: Vec<u8>,
    #[serde(skip)]
    pub decoded: Decoded<cri::runtime::v1::ContainerConfig>,
    /// The reserved name: `<name>_<sandbox name>_<namespace>_<uid>_<attempt>`.
    pub name: String,
    /// The image as the client named it, and its resolved id.
    pub image_ref: String,
    pub image_id: String,
    pub handler: String,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub state: ContainerState,
    pub log_path: String,
    /// The bundle (config.json + rootfs mount point) and the writable layer.
    pub bundle: PathBuf,
    pub layer_dir: PathBuf,
    /// The shim's state dir (shim.sock, exit.json).
    pub shim_dir: PathBuf,
    pub shim_pid: Option<u32>,
    pub init_pid: Option<u32>,
    /// The identity the OCI spec starts the init process with (ContainerStatus `user`
    /// while the process is not running); absent in records from before it was kept.
    #[serde(default)]
    pub user: Option<ProcessUser>,
}

/// The OCI spec's `process.user`: uid, gid and additional gids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessUser {
    pub uid: u32,
    pub gid: u32,
    pub additional_gids: Vec<u32>,
}

impl ContainerRecord {
    pub fn config(&self) -> cri::runtime::v1::ContainerConfig {
        self.config_ref().clone()
    }

    /// The config, decoded once.
    pub fn config_ref(&self) -> &cri::runtime::v1::ContainerConfig {
        self.decoded.get(&self.config)
    }

    /// Replaces the config (and what was decoded of the old one).
    pub fn set_config(&mut self, cfg: &cri::runtime::v1::ContainerConfig) {
        self.config = encode(cfg);
        self.decoded = Decoded::default();
    }
}

/// Encodes a CRI message for a record.
pub fn encode<M: prost::Message>(m: &M) -> Vec<u8> {
    m.encode_to_vec()
}

/// Name reservation: one sandbox or container per name, as the CRI requires.
#[derive(Debug, Default)]
pub struct Names {
    by_name: HashMap<String, String>,
}

impl Names {
    /// Reserves `name` for `id`; Err(holder) when another id has it.
    pub fn reserve(&mut self, name: &str, id: &str) -> Result<(), String> {
        match self.by_name.get(name) {
            Some(holder) if holder != id => Err(holder.clone()),
            _ => {
                self.by_name.insert(name.to_string(), id.to_string());
                Ok(())
            }
        }
    }

    pub fn release(&mut self, name: &str) {
        self.by_name.remove(name);
    }
}

/// A fresh 64-hex id, as containerd generates them.
pub fn new_id() -> String {
    let bytes: [u8; 32] = rand::random();
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_corrupt_ones_are_skipped() {
        let d = tempfile::tempdir().unwrap();
        let store = RecordStore::open(&d.path().join("meta.redb")).unwrap();
        let dir = Records::open(&store, "sandboxes", &d.path().join("sandboxes")).unwrap();
        let cfg = cri::runtime::v1::PodSandboxConfig {
            hostname: "h".into(),
            ..Default::default()
        };
        let rec = SandboxRecord {
            id: "a".into(),
            config: encode(&cfg),
            decoded: Default::default(),
            handler: "runc".into(),
            created_at: 1,
            state: SandboxState::Ready,
            name: "n".into(),
            netns: None,
            ipc_ns: None,
            uts_ns: None,
            pid_ns: None,
            pid_init: None,
            user_ns: None,
            user_mappings: None,
            mnt_ns: None,
            ip: Some("10.0.0.2".into()),
            additional_ips: vec![],
            network_ready: true,
            dir: "/x".into(),
        };
        dir.save_blocking("a", &rec).unwrap();
        dir.save_blocking("b", &serde_json::json!({"id": "b", "garbage": true}))
            .unwrap();
        let all: Vec<SandboxRecord> = dir.load_all().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].config().hostname, "h");
    }

    #[test]
    fn names_are_exclusive() {
        let mut n = Names::default();
        n.reserve("x", "1").unwrap();
        assert_eq!(n.reserve("x", "2").unwrap_err(), "1");
        n.reserve("x", "1").unwrap();
        n.release("x");
        n.reserve("x", "2").unwrap();
    }
}
