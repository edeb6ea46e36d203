//! Finding the container's memory cgroup from its OCI config, to read the OOM kill counter
//! when the container exits (before anyone deletes the cgroup).
//!
//! The path is resolved as runc resolves `linux.cgroupsPath`:
//! * cgroupfs driver: an absolute path under the controller's mount; a relative path (or
//!   none: the container id) under the cgroup of the runtime process, which is ours;
//! * systemd driver (`slice:prefix:name`): the slice expanded into its ancestry
//!   (`a-b.slice` → `a.slice/a-b.slice`), then `prefix-name.scope`.
//!
//! On cgroup v1 the counter is `oom_kill N` in `memory.oom_control`, on v2 `oom_kill N` in
//! `memory.events`.

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
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    if parts.len() == 3 && !cgroups_path.starts_with('/') {
        // systemd driver: slice:prefix:name.
        let slice = if parts[0].is_empty() {
            "system.slice"
        } else {
            parts[0]
        };
        let unit = if parts[2].ends_with(".slice") {
            parts[2].to_string()
        } else if parts[1].is_empty() {
            format!("{}.scope", parts[2])
        } else {
            format!("{}-{}.scope", parts[1], parts[2])
        };
        return format!("{}/{}", expand_slice(slice), unit);
    }
    if cgroups_path.is_empty() {
        return id.to_string();
    }
    cgroups_path.to_string()
}

/// systemd's slice naming: `a-b-c.slice` lives at `/a.slice/a-b.slice/a-b-c.slice`.
fn expand_slice(slice: &str) -> String {
    let name = slice.strip_suffix(".slice").unwrap_or(slice);
    if name.is_empty() || name == "-" {
        return String::new();
    }
    let mut out = String::new();
    let mut prefix = String::new();
    for (i, part) in name.split('-').enumerate() {
        if i > 0 {
            prefix.push('-');
        }
        prefix.push_str(part);
        out.push('/');
        out.push_str(&prefix);
        out.push_str(".slice");
    }
    out
}

fn resolve(cgroups_path: &str, id: &str, mountinfo: &str, own: &str) -> Option<PathBuf> {
    let inner = inner_path(cgroups_path, id);
    let mut v1_memory = None;
    let mut v2 = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        let mut r = right.split(' ');
        let fstype = r.next().unwrap_or("");
        let super_opts = r.nth(1).unwrap_or("");
        match fstype {
            "cgroup" if super_opts.split(',').any(|o| o == "memory") => {
                v1_memory.get_or_insert(unescape_mount(mount_point));
            }
            "cgroup2" => {
                v2.get_or_insert(unescape_mount(mount_point));
            }
            _ => {}
        }
    }
    let (mount, file, own_path) = if let Some(m) = v1_memory {
        let own_path = own.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            ctrls
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        });
        (m, "memory.oom_control", own_path)
    } else {
        let m = v2?;
        let own_path = own
            .lines()
            .find_map(|l| l.strip_prefix("0::").map(str::to_string));
        (m, "memory.events", own_path)
    };
    let mut dir = PathBuf::from(mount);
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

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
        assert_eq!(expand_slice("-.slice"), "");
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
        assert_eq!(unescape_mount("/a\\040b"), "/a b");
    }
}
