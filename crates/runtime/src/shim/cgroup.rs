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

use nodus_cgroups::Hierarchy;
use nodus_cgroups::hierarchy::process_cgroup;
use std::path::{Path, PathBuf};

/// Where to read the OOM kill counter of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomProbe {
    /// `memory.oom_control` (v1) or `memory.events` (v2); None when no memory cgroup
    /// hierarchy was found.
    pub file: Option<PathBuf>,
}

impl OomProbe {
    /// Resolves the probe from the bundle's `config.json` and this process's view of cgroups.
    pub fn for_bundle(bundle: &Path, id: &str) -> OomProbe {
        let cgroups_path = std::fs::read(bundle.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| {
                v.pointer("/linux/cgroupsPath")
                    .and_then(|p| p.as_str())
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        OomProbe {
            file: resolve(&cgroups_path, id, &mountinfo, &own),
        }
    }

    /// The number of OOM kills in the cgroup; None when it cannot be read.
    pub fn oom_kills(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.file.as_ref()?).ok()?;
        parse_oom_kill(&text)
    }
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

fn resolve(cgroups_path: &str, id: &str, mountinfo: &str, own: &str) -> Option<PathBuf> {
    let inner = inner_path(cgroups_path, id);
    let h = Hierarchy::from_mountinfo(mountinfo)?;
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
