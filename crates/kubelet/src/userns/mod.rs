//! Pod user namespaces (upstream's pkg/kubelet/userns): which block of host ids each pod
//! with `spec.hostUsers: false` owns.
//!
//! The kubelet owns one range of ids (`/etc/subuid` and `/etc/subgid` entries of user
//! `kubelet`, else everything from 65536 up), cut into blocks of `userNamespaces.idsPerPod`
//! ids (65536 by default). Each such pod gets one whole block for both uids and gids
//! (container id 0 → the block's first host id), so no two pods share a host id. The choice is persisted in `<root-dir>/pods/<uid>/userns`
//! with upstream's JSON field names, so a restarted kubelet gives a running pod the same
//! block and never hands that block to another pod; it is released when the pod's
//! directory goes.

pub mod allocator;

use allocator::Allocator;
use cri::runtime::v1 as pb;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The default ids per pod, and the unit `idsPerPod` must be a multiple of: the whole
/// 16-bit range a container's files and users expect.
pub const USERNS_LENGTH: u32 = 65536;

/// The file in the pod's directory that holds its mappings.
pub const MAPPINGS_FILE: &str = "userns";

/// The user whose subordinate ids the kubelet may hand out.
pub const KUBELET_USER: &str = "kubelet";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UsernsError {
    #[error("{path}: {message}")]
    SubIds { path: String, message: String },
    #[error("mismatched subuids and subgids for user \"{KUBELET_USER}\"")]
    SubIdsMismatch,
    #[error("kubelet user assigned ID {0} is not a multiple of {1}")]
    FirstIdNotAligned(u32, u32),
    #[error("kubelet user assigned ID {0} must be greater or equal to {1}")]
    FirstIdTooLow(u32, u32),
    #[error("kubelet user assigned IDs length {0} is not a multiple of {1}")]
    LengthNotAligned(u32, u32),
    #[error("kubelet user namespace length {0} is not a multiple of {USERNS_LENGTH}")]
    IdsPerPodNotAligned(u32),
    #[error(
        "kubelet user assigned IDs {first_id}..{first_id}+{length} go past the largest id 4294967295"
    )]
    PastIdSpace { first_id: u32, length: u32 },
    #[error("kubelet user assigned IDs are not enough to support {0} pods")]
    TooFewIds(u32),
    #[error("invalid user namespace mappings file: {0}")]
    BadFile(String),
    #[error("invalid user namespace configuration: {0}")]
    BadConfig(&'static str),
    #[error("wrong user namespace length {0}")]
    WrongLength(u32),
    #[error("wrong user namespace offset specified {0}")]
    WrongOffset(u32),
    #[error("different user namespace range already used by pod {0:?}")]
    DifferentRange(String),
    #[error("id {0} is out of range")]
    OutOfRange(u32),
    #[error("range picked for pod {0:?} already taken")]
    Taken(String),
    #[error("could not find an empty slot to allocate a user namespace")]
    Exhausted,
    #[error("{path}: {message}")]
    Io { path: String, message: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> UsernsError + '_ {
    move |e| UsernsError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Where the kubelet's subordinate id ranges are read from.
#[derive(Clone, Debug)]
pub struct SubIdFiles {
    pub subuid: PathBuf,
    pub subgid: PathBuf,
}

impl Default for SubIdFiles {
    fn default() -> SubIdFiles {
        SubIdFiles {
            subuid: "/etc/subuid".into(),
            subgid: "/etc/subgid".into(),
        }
    }
}

/// The kubelet's whole id range: `first_id` and how many ids follow it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KubeletMappings {
    pub first_id: u32,
    pub length: u32,
}

impl KubeletMappings {
    /// upstream's default range when `kubelet` has no subordinate ids: every whole block
    /// of `ids_per_pod` ids but the first (ids below it belong to the host's own users).
    /// With 65536 ids per pod: 65536 up to the last id, 65535 blocks.
    pub fn default_for(ids_per_pod: u32) -> KubeletMappings {
        let per = u64::from(ids_per_pod.max(1));
        let blocks = ((1u64 << 32) - per) / per;
        KubeletMappings {
            first_id: ids_per_pod,
            length: u32::try_from(blocks * per).unwrap_or(u32::MAX),
        }
    }
}

impl Default for KubeletMappings {
    fn default() -> KubeletMappings {
        KubeletMappings::default_for(USERNS_LENGTH)
    }
}

/// `user:start:count` lines of a subuid/subgid file that name `user`. Blank lines and
/// `#` comments are skipped; a malformed line for `user` is an error, other users' lines
/// are not ours to judge.
pub fn parse_subids(text: &str, user: &str) -> Result<Vec<(u32, u32)>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut f = line.split(':');
        if f.next() != Some(user) {
            continue;
        }
        let (Some(start), Some(count), None) = (f.next(), f.next(), f.next()) else {
            return Err(format!("invalid line {line:?}"));
        };
        let num = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|e| format!("error parsing line {line:?}: {e}"))
        };
        out.push((num(start)?, num(count)?));
    }
    Ok(out)
}

impl KubeletMappings {
    /// upstream's getKubeletMappings, reading the files getsubids reads: the single
    /// range of user `kubelet`, the same in both files; upstream's default for
    /// `ids_per_pod` when neither file names the user (or the files do not exist).
    pub fn from_files(
        files: &SubIdFiles,
        ids_per_pod: u32,
    ) -> Result<KubeletMappings, UsernsError> {
        let read = |p: &Path| -> Result<Vec<(u32, u32)>, UsernsError> {
            let text = match std::fs::read_to_string(p) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(io_err(p)(e)),
            };
            parse_subids(&text, KUBELET_USER).map_err(|message| UsernsError::SubIds {
                path: p.display().to_string(),
                message,
            })
        };
        let uids = read(&files.subuid)?;
        let gids = read(&files.subgid)?;
        if uids.is_empty() && gids.is_empty() {
            return Ok(KubeletMappings::default_for(ids_per_pod));
        }
        if uids != gids {
            return Err(UsernsError::SubIdsMismatch);
        }
        if uids.len() != 1 {
            return Err(UsernsError::SubIds {
                path: files.subuid.display().to_string(),
                message: format!(
                    "user {KUBELET_USER:?} must have exactly one range, it has {}",
                    uids.len()
                ),
            });
        }
        let (first_id, length) = uids[0];
        Ok(KubeletMappings { first_id, length })
    }
}

/// The persisted form, with upstream's field names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UserNamespace {
    #[serde(rename = "uidMappings")]
    pub uid_mappings: Vec<IdMapping>,
    #[serde(rename = "gidMappings")]
    pub gid_mappings: Vec<IdMapping>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdMapping {
    #[serde(rename = "hostId")]
    pub host_id: u32,
    #[serde(rename = "containerId")]
    pub container_id: u32,
    pub length: u32,
}

impl UserNamespace {
    fn block(host_id: u32, length: u32) -> UserNamespace {
        let m = IdMapping {
            host_id,
            container_id: 0,
            length,
        };
        UserNamespace {
            uid_mappings: vec![m],
            gid_mappings: vec![m],
        }
    }

    /// Only what this kubelet writes is accepted: one mapping, the same for uids and
    /// gids, with container id 0 mapped (runtimes assume root is).
    fn parse(content: &[u8]) -> Result<UserNamespace, UsernsError> {
        let u: UserNamespace =
            serde_json::from_slice(content).map_err(|e| UsernsError::BadFile(e.to_string()))?;
        if u.uid_mappings.len() != 1 {
            return Err(UsernsError::BadConfig("no more than one mapping allowed."));
        }
        if u.uid_mappings.len() != u.gid_mappings.len() {
            return Err(UsernsError::BadConfig(
                "GID and UID mappings should be identical.",
            ));
        }
        if u.uid_mappings[0] != u.gid_mappings[0] {
            return Err(UsernsError::BadConfig(
                "GID and UID mapping should be identical",
            ));
        }
        if u.uid_mappings[0].container_id != 0 {
            return Err(UsernsError::BadConfig("UID 0 must be mapped"));
        }
        Ok(u)
    }

    /// The CRI form: a pod-level user namespace with these mappings.
    pub fn to_cri(&self) -> pb::UserNamespace {
        let conv = |v: &[IdMapping]| {
            v.iter()
                .map(|m| pb::IdMapping {
                    host_id: m.host_id,
                    container_id: m.container_id,
                    length: m.length,
                })
                .collect()
        };
        pb::UserNamespace {
            mode: pb::NamespaceMode::Pod as i32,
            uids: conv(&self.uid_mappings),
            gids: conv(&self.gid_mappings),
        }
    }
}

/// The CRI user namespace of a pod that shares the node's (hostUsers unset or true).
pub fn node_user_namespace() -> pb::UserNamespace {
    pb::UserNamespace {
        mode: pb::NamespaceMode::Node as i32,
        ..Default::default()
    }
}

/// Whether `handler` supports user namespaces, from the handlers the runtime's Status
/// reported (`None`: no Status answer yet). upstream's HandlerSupportsUserNamespaces.
pub fn handler_supports_userns(
    handlers: Option<&[pb::RuntimeHandler]>,
    handler: &str,
) -> Result<bool, String> {
    let Some(handlers) = handlers else {
        return Err("runtime handlers are not set".into());
    };
    handlers
        .iter()
        .find(|h| h.name == handler)
        .map(|h| h.features.as_ref().is_some_and(|f| f.user_namespaces))
        .ok_or_else(|| format!("the handler {handler:?} is not known"))
}

/// upstream's refusal of a pod whose runtime handler cannot give it a user namespace.
pub fn unsupported_message(handler: &str, err: Option<&str>) -> String {
    let msg = if handler.is_empty() {
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces".to_string()
    } else {
        format!(
            "can't set `spec.hostUsers: false`, RuntimeClass handler {handler:?} does not support user namespaces"
        )
    };
    match err {
        Some(e) => format!("{msg}: {e}"),
        None => msg,
    }
}

struct State {
    used: Allocator,
    /// pod uid → first host id of its block.
    by_pod: HashMap<String, u32>,
}

/// Hands out and remembers the pods' blocks (upstream's UsernsManager).
pub struct UsernsManager {
    pods_dir: PathBuf,
    /// Ids per pod: the size of every block.
    ids_per_pod: u32,
    /// Index of the kubelet range's first block, counted in blocks from id 0.
    off: u32,
    state: Mutex<State>,
}

impl UsernsManager {
    /// Checks the range as upstream does, then takes back every block a pod directory
    /// under `pods_dir` records. A pod whose file is unreadable is logged and left out:
    /// its next sync fails with the same error, and no other pod is affected.
    pub fn new(
        pods_dir: &Path,
        mappings: KubeletMappings,
        max_pods: u32,
        ids_per_pod: u32,
    ) -> Result<UsernsManager, UsernsError> {
        let KubeletMappings { first_id, length } = mappings;
        let per = ids_per_pod;
        if per == 0 || !per.is_multiple_of(USERNS_LENGTH) {
            return Err(UsernsError::IdsPerPodNotAligned(per));
        }
        if !first_id.is_multiple_of(per) {
            return Err(UsernsError::FirstIdNotAligned(first_id, per));
        }
        if first_id < per {
            // Mapping id 0 of the host into a pod would undo what the namespace is for.
            return Err(UsernsError::FirstIdTooLow(first_id, per));
        }
        if !length.is_multiple_of(per) {
            return Err(UsernsError::LengthNotAligned(length, per));
        }
        if u64::from(first_id) + u64::from(length) > 1 << 32 {
            return Err(UsernsError::PastIdSpace { first_id, length });
        }
        if length / per < max_pods {
            return Err(UsernsError::TooFewIds(max_pods));
        }
        let m = UsernsManager {
            pods_dir: pods_dir.to_path_buf(),
            ids_per_pod: per,
            off: first_id / per,
            state: Mutex::new(State {
                used: Allocator::new((length / per) as usize),
                by_pod: HashMap::new(),
            }),
        };
        tracing::debug!(
            first_id,
            length,
            ids_per_pod = per,
            blocks = length / per,
            "user namespace manager mapping"
        );
        let entries = match std::fs::read_dir(pods_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(m),
            Err(e) => return Err(io_err(pods_dir)(e)),
        };
        for e in entries.flatten() {
            let Ok(uid) = e.file_name().into_string() else {
                continue;
            };
            if let Err(err) = m.reload(&uid) {
                tracing::error!(pod_uid = %uid, error = %err, "record pod mappings for existing pod failed; its user namespace stays unusable until the file is fixed or the pod removed");
            }
        }
        Ok(m)
    }

    fn file(&self, uid: &str) -> PathBuf {
        self.pods_dir.join(uid).join(MAPPINGS_FILE)
    }

    fn read_file(&self, uid: &str) -> Result<Option<Vec<u8>>, UsernsError> {
        let p = self.file(uid);
        match std::fs::read(&p) {
            Ok(c) if c.is_empty() => Ok(None),
            Ok(c) => Ok(Some(c)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&p)(e)),
        }
    }

    fn reload(&self, uid: &str) -> Result<(), UsernsError> {
        let Some(content) = self.read_file(uid)? else {
            return Ok(());
        };
        let u = UserNamespace::parse(&content)?;
        let mut st = self.lock();
        self.record(&mut st, uid, u.uid_mappings[0])
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent between statements, so a panic elsewhere leaves
        // nothing half-done behind the poison.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the block a pod's file names as the pod's (upstream's record).
    fn record(&self, st: &mut State, uid: &str, m: IdMapping) -> Result<(), UsernsError> {
        if m.length != self.ids_per_pod {
            return Err(UsernsError::WrongLength(m.length));
        }
        if !m.host_id.is_multiple_of(self.ids_per_pod) {
            return Err(UsernsError::WrongOffset(m.host_id));
        }
        let prev = st.by_pod.get(uid).copied();
        if let Some(p) = prev {
            if p != m.host_id {
                return Err(UsernsError::DifferentRange(uid.to_string()));
            }
            return Ok(());
        }
        let index = (m.host_id / self.ids_per_pod)
            .checked_sub(self.off)
            .map(|i| i as usize)
            .filter(|i| *i < st.used.len())
            .ok_or(UsernsError::OutOfRange(m.host_id))?;
        if !st.used.allocate(index) {
            return Err(UsernsError::Taken(uid.to_string()));
        }
        st.by_pod.insert(uid.to_string(), m.host_id);
        Ok(())
    }

    /// Writes the file so that a crash leaves either the old content or the new, never a
    /// torn one, and the new name survives a power cut (the directory is synced too).
    fn write_file(&self, uid: &str, u: &UserNamespace) -> Result<(), UsernsError> {
        let dir = self.pods_dir.join(uid);
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let data = serde_json::to_vec(u).map_err(|e| UsernsError::BadFile(e.to_string()))?;
        let tmp = dir.join(format!(".{MAPPINGS_FILE}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&data)?;
            f.sync_all()
        };
        write().map_err(io_err(&tmp))?;
        let dest = self.file(uid);
        std::fs::rename(&tmp, &dest).map_err(io_err(&dest))?;
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&dir))
    }

    /// The pod's user namespace in CRI terms (upstream's
    /// GetOrCreateUserNamespaceMappings): NODE when hostUsers is unset or true; otherwise
    /// the pod's block — the one its file records, else a new one, persisted before it is
    /// returned. `handlers` is what the runtime's Status reported and `handler` the pod's
    /// runtime handler: one that does not support user namespaces is refused.
    pub fn get_or_create(
        &self,
        pod: &Pod,
        handler: &str,
        handlers: Option<&[pb::RuntimeHandler]>,
    ) -> Result<pb::UserNamespace, String> {
        let host_users = pod.spec.as_ref().and_then(|s| s.host_users);
        if host_users != Some(false) {
            return Ok(node_user_namespace());
        }
        match handler_supports_userns(handlers, handler) {
            Ok(true) => {}
            Ok(false) => return Err(unsupported_message(handler, None)),
            Err(e) => return Err(unsupported_message(handler, Some(&e))),
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        // The uid names a directory under the pods dir: it must stay one path component.
        if uid.is_empty() || uid == "." || uid == ".." || uid.contains('/') {
            return Err(format!("create user namespace: invalid pod uid {uid:?}"));
        }
        self.mappings(uid).map(|u| u.to_cri())
    }

    /// The block of pod `uid`, from its file or newly allocated and persisted.
    pub fn mappings(&self, uid: &str) -> Result<UserNamespace, String> {
        let content = self
            .read_file(uid)
            .map_err(|e| format!("user namespace: {e}"))?;
        let mut st = self.lock();
        if let Some(content) = content {
            let u = UserNamespace::parse(&content)
                .and_then(|u| {
                    self.record(&mut st, uid, u.uid_mappings[0])?;
                    Ok(u)
                })
                .map_err(|e| format!("user namespace: {e}"))?;
            return Ok(u);
        }
        self.create(&mut st, uid)
            .map_err(|e| format!("create user namespace: {e}"))
    }

    fn create(&self, st: &mut State, uid: &str) -> Result<UserNamespace, UsernsError> {
        // A pod known in memory whose file vanished keeps its block rather than holding two.
        let host_id = match st.by_pod.get(uid) {
            Some(h) => *h,
            None => {
                let index = st.used.allocate_next().ok_or(UsernsError::Exhausted)?;
                let h = (index as u32 + self.off) * self.ids_per_pod;
                st.by_pod.insert(uid.to_string(), h);
                tracing::debug!(pod_uid = %uid, host_id = h, "new pod user namespace allocation");
                h
            }
        };
        let u = UserNamespace::block(host_id, self.ids_per_pod);
        if let Err(e) = self.write_file(uid, &u) {
            self.release_locked(st, uid);
            return Err(e);
        }
        Ok(u)
    }

    fn release_locked(&self, st: &mut State, uid: &str) {
        let Some(host_id) = st.by_pod.remove(uid) else {
            return;
        };
        tracing::debug!(pod_uid = %uid, host_id, "releasing pod user namespace allocation");
        let _ = std::fs::remove_file(self.file(uid));
        st.used
            .release((host_id / self.ids_per_pod - self.off) as usize);
    }

    /// Frees pod `uid`'s block and removes its file (the pod is gone).
    pub fn release(&self, uid: &str) {
        let mut st = self.lock();
        self.release_locked(&mut st, uid);
    }

    /// The pods holding a block.
    pub fn allocated(&self) -> Vec<String> {
        self.lock().by_pod.keys().cloned().collect()
    }

    /// The first host id of pod `uid`'s block, if it has one.
    pub fn host_id(&self, uid: &str) -> Option<u32> {
        self.lock().by_pod.get(uid).copied()
    }
}

#[cfg(test)]
mod tests;
