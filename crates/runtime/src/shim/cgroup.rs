//! Finding the container's memory cgroup from its OCI config, to read the OOM kill counter
//! when the container exits (before anyone deletes the cgroup).
//!
//! The path is resolved as runc resolves `linux.cgroupsPath`:
//! * cgroupfs driver: an absolute path under the controller's mount; a relative path (or
//!   none: the container id) under the cgroup of the runtime process, which is ours;
//! * systemd driver (`slice:prefix:name`): the slice expanded into its ancestry
//!   (`a-b.slice` → `a.slice/a-b.slice`), then `prefix-name.scope`
//!   (`nodus_cgroups::systemd::names::scope_path`).
//!
//! On cgroup v1 the counter is `oom_kill N` in `memory.oom_control`, on v2 `oom_kill N` in
//! `memory.events`.
//!
//! With the systemd driver the container's cgroup is a transient scope that systemd stops, and
//! removes, as soon as its last process exits — which races the shim's read after `waitpid`.
//! On v2 the kernel counts an OOM kill in every ancestor's `memory.events` too, so the probe
//! also keeps the parent's counter from when the shim started: when the container's own file
//! is gone, a rise in the parent's counter is the kill. (The parent is the pod's cgroup; a
//! sibling container OOM-killed in the same window would be counted too — the same
//! attribution containerd's event-based monitor makes when its events arrive late.)

use nodus_cgroups::Hierarchy;
use nodus_cgroups::hierarchy::process_cgroup;
use std::path::{Path, PathBuf};

/// Where to read the OOM kill counter of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomProbe {
    /// `memory.oom_control` (v1) or `memory.events` (v2); None when no memory cgroup
    /// hierarchy was found.
    pub file: Option<PathBuf>,
    /// v2 only: the parent cgroup's `memory.events` and its `oom_kill` when the probe was made.
    pub parent: Option<(PathBuf, u64)>,
}

impl OomProbe {
    /// Resolves the probe from the bundle's `config.json` and this process's view of cgroups.
    pub fn for_bundle(bundle: &Path, id: &str) -> OomProbe {
        OomProbe::for_file(oom_file(bundle, id))
    }

    /// The probe of a counter file resolved already (by the daemon, which passes it to the
    /// shim as `--oom-file`), with the parent's baseline read now.
    pub fn for_file(file: Option<PathBuf>) -> OomProbe {
        let parent = file.as_deref().and_then(parent_baseline);
        OomProbe { file, parent }
    }

    /// The number of OOM kills in the container's cgroup or, when that cgroup is already
    /// gone, the rise in its parent's (v2); None when neither can be read.
    pub fn oom_kills(&self) -> Option<u64> {
        let own = self.file.as_deref().and_then(read_oom_kill);
        own.or_else(|| {
            let (file, before) = self.parent.as_ref()?;
            Some(read_oom_kill(file)?.saturating_sub(*before))
        })
    }
}

/// The OOM kill counter file of the container in `bundle`, resolved against this process's
/// cgroup and the host's hierarchy, both read once per process: the daemon resolves it for
/// every shim it starts, so no shim reads the mount table (which grows with the pods).
pub fn oom_file(bundle: &Path, id: &str) -> Option<PathBuf> {
    #[derive(serde::Deserialize, Default)]
    struct Spec {
        #[serde(default)]
        linux: Linux,
    }
    #[derive(serde::Deserialize, Default)]
    struct Linux {
        #[serde(default, rename = "cgroupsPath")]
        cgroups_path: String,
    }
    static HOST: std::sync::OnceLock<(Option<Hierarchy>, String)> = std::sync::OnceLock::new();
    let (h, own) = HOST.get_or_init(|| {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        (Hierarchy::from_mountinfo(&mountinfo), own)
    });
    let spec: Spec = std::fs::read(bundle.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    resolve_in(h.as_ref()?, &spec.linux.cgroups_path, id, own)
}

fn read_oom_kill(file: &Path) -> Option<u64> {
    parse_oom_kill(&std::fs::read_to_string(file).ok()?)
}

/// The parent's `memory.events` and its current count, for v2 files only: v1's counter is
/// the cgroup's own and does not rise in its ancestors.
fn parent_baseline(own: &Path) -> Option<(PathBuf, u64)> {
    if own.file_name()? != "memory.events" {
        return None;
    }
    let file = own.parent()?.parent()?.join("memory.events");
    let count = read_oom_kill(&file)?;
    Some((file, count))
}

pub fn parse_oom_kill(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut w = l.split_ascii_whitespace();
        (w.next() == Some("oom_kill"))
            .then(|| w.next()?.parse().ok())
            .flatten()
    })
}

/// The cgroup path inside a hierarchy that runc derives from `cgroupsPath`; relative
/// results are relative to the runtime's own cgroup.
fn inner_path(cgroups_path: &str, id: &str) -> String {
    if cgroups_path.split(':').count() == 3 && !cgroups_path.starts_with('/') {
        // systemd driver: slice:prefix:name, the scope in the expanded slice.
        if let Ok(p) = nodus_cgroups::systemd::names::scope_path(cgroups_path) {
            return format!("/{p}");
        }
    }
    if cgroups_path.is_empty() {
        return id.to_string();
    }
    cgroups_path.to_string()
}

#[cfg(test)]
fn resolve(cgroups_path: &str, id: &str, mountinfo: &str, own: &str) -> Option<PathBuf> {
    resolve_in(
        &Hierarchy::from_mountinfo(mountinfo)?,
        cgroups_path,
        id,
        own,
    )
}

fn resolve_in(h: &Hierarchy, cgroups_path: &str, id: &str, own: &str) -> Option<PathBuf> {
    let inner = inner_path(cgroups_path, id);
    let v1_memory = (!h.is_v2()).then(|| h.mount("memory")).flatten();
    let (mount, file, own_path) = match v1_memory {
        Some(m) => (m, "memory.oom_control", process_cgroup(own, Some("memory"))),
        None => {
            let m = if h.is_v2() {
                h.root().to_path_buf()
            } else {
                h.unified()?.to_path_buf()
            };
            (m, "memory.events", process_cgroup(own, None))
        }
    };
    let mut dir = mount;
    if !inner.starts_with('/') {
        dir.push(own_path.unwrap_or_default().trim_start_matches('/'));
    }
    for part in inner
        .split('/')
        .filter(|p| !p.is_empty() && *p != "." && *p != "..")
    {
        dir.push(part);
    }
    Some(dir.join(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 24 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:4 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:5 - cgroup2 cgroup2 rw,nsdelegate
35 30 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,memory
36 30 0:32 / /sys/fs/cgroup/cpu rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,cpu
";
    const V2: &str = "\
31 24 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:5 - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn cgroupfs_paths() {
        let own = "9:memory:/user.slice\n0::/user.slice/x.scope\n";
        assert_eq!(
            resolve("/kubepods/pod1/abc", "abc", HYBRID, own),
            Some("/sys/fs/cgroup/memory/kubepods/pod1/abc/memory.oom_control".into())
        );
        assert_eq!(
            resolve("rel/abc", "abc", HYBRID, own),
            Some("/sys/fs/cgroup/memory/user.slice/rel/abc/memory.oom_control".into())
        );
        assert_eq!(
            resolve("", "abc", HYBRID, own),
            Some("/sys/fs/cgroup/memory/user.slice/abc/memory.oom_control".into())
        );
        assert_eq!(
            resolve("/kubepods/pod1/abc", "abc", V2, own),
            Some("/sys/fs/cgroup/kubepods/pod1/abc/memory.events".into())
        );
        assert_eq!(resolve("/x", "x", "", own), None);
    }

    #[test]
    fn a_removed_scope_is_read_through_its_parent_on_v2() {
        let dir = tempfile::tempdir().unwrap();
        let pod = dir.path().join("pod.slice");
        let scope = pod.join("cri-abc.scope");
        std::fs::create_dir_all(&scope).unwrap();
        std::fs::write(pod.join("memory.events"), "oom 4\noom_kill 2\n").unwrap();
        std::fs::write(scope.join("memory.events"), "oom 0\noom_kill 0\n").unwrap();
        let file = scope.join("memory.events");
        let probe = OomProbe {
            parent: parent_baseline(&file),
            file: Some(file),
        };
        assert_eq!(probe.oom_kills(), Some(0), "the scope's own count first");

        std::fs::write(pod.join("memory.events"), "oom 5\noom_kill 3\n").unwrap();
        std::fs::remove_dir_all(&scope).unwrap();
        assert_eq!(
            probe.oom_kills(),
            Some(1),
            "the scope is gone: the parent's rise"
        );

        let v1 = OomProbe {
            parent: parent_baseline(&scope.join("memory.oom_control")),
            file: Some(scope.join("memory.oom_control")),
        };
        assert_eq!(v1.parent, None, "v1 counters are not hierarchical");
        assert_eq!(v1.oom_kills(), None);
    }

    #[test]
    fn systemd_paths() {
        assert_eq!(
            inner_path("kubepods-burstable-pod12.slice:cri-containerd:abc", "abc"),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice/cri-containerd-abc.scope"
        );
        assert_eq!(
            inner_path(":runc:abc", "abc"),
            "/system.slice/runc-abc.scope"
        );
    }

    #[test]
    fn oom_counters() {
        assert_eq!(
            parse_oom_kill("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"),
            Some(3)
        );
        assert_eq!(
            parse_oom_kill("low 0\nhigh 0\nmax 5\noom 2\noom_kill 1\noom_group_kill 0\n"),
            Some(1)
        );
        assert_eq!(parse_oom_kill("oom_kill_disable 0\n"), None);
    }
}
