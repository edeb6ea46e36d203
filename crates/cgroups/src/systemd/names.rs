//! The kubelet's cgroup names in systemd's terms (upstream's `CgroupName.ToSystemd`,
//! `ParseSystemdToCgroupName` and libcontainer's `ExpandSlice`): the internal name
//! `/kubepods/burstable/pod<uid>` is the slice `kubepods-burstable-pod<uid>.slice`, whose
//! cgroup is `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`.
//! A `-` inside a component would read as a nesting level, so it becomes `_`.

use crate::error::CgroupError;

const SLICE: &str = ".slice";

/// `-` → `_` in one component (upstream's `escapeSystemdCgroupName`).
pub fn escape(part: &str) -> String {
    part.replace('-', "_")
}

/// `_` → `-` (upstream's `unescapeSystemdCgroupName`).
pub fn unescape(part: &str) -> String {
    part.replace('_', "-")
}

/// The slice unit of an internal cgroup name: `/kubepods/burstable` →
/// `kubepods-burstable.slice`; the root is `-.slice`.
pub fn slice_name(cgroup: &str) -> String {
    let parts: Vec<String> = cgroup
        .split('/')
        .filter(|p| !p.is_empty())
        .map(escape)
        .collect();
    if parts.is_empty() {
        return format!("-{SLICE}");
    }
    format!("{}{SLICE}", parts.join("-"))
}

/// The cgroup path of a slice unit, relative to the hierarchy root (libcontainer's
/// `ExpandSlice` without the leading `/`): `a-b-c.slice` → `a.slice/a-b.slice/a-b-c.slice`;
/// the root slice `-.slice` is the empty path.
pub fn expand_slice(slice: &str) -> Result<String, CgroupError> {
    let bad = || CgroupError::InvalidPath(slice.to_string());
    let name = slice.strip_suffix(SLICE).ok_or_else(bad)?;
    if name.contains('/') {
        return Err(bad());
    }
    if name == "-" {
        return Ok(String::new());
    }
    if name.is_empty() || name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Err(bad());
    }
    let mut out = Vec::new();
    let mut prefix = String::new();
    for part in name.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        out.push(format!("{prefix}{SLICE}"));
    }
    Ok(out.join("/"))
}

/// The cgroup path (relative to the hierarchy root) of an internal cgroup name:
/// `/kubepods/burstable/pod1` → `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice`
/// (upstream's `ToSystemd`, which returns it with a leading `/`).
pub fn to_systemd(cgroup: &str) -> String {
    // slice_name never yields a name expand_slice refuses: components are non-empty and
    // carry no `-` after escaping.
    expand_slice(&slice_name(cgroup)).unwrap_or_default()
}

/// The internal name of a systemd cgroup path's last slice (upstream's
/// `ParseSystemdToCgroupName`): `/kubepods.slice/kubepods-burstable.slice` →
/// `["kubepods", "burstable"]`.
pub fn parse_systemd(path: &str) -> Vec<String> {
    let base = path.rsplit('/').find(|p| !p.is_empty()).unwrap_or_default();
    let base = base.strip_suffix(SLICE).unwrap_or(base);
    if base.is_empty() || base == "-" {
        return Vec::new();
    }
    base.split('-').map(unescape).collect()
}

/// Where the cgroup of a container lives when its OCI `linux.cgroupsPath` is in systemd's
/// `slice:prefix:name` form (runc's and crun's `--systemd-cgroup`): the scope
/// `<prefix>-<name>.scope` in the expanded slice. `kubepods-pod1.slice:cri-nodus:abc` →
/// `kubepods.slice/kubepods-pod1.slice/cri-nodus-abc.scope`. An empty slice is
/// `system.slice`, and a name that is itself a slice is the unit, as runc takes them.
pub fn scope_path(cgroups_path: &str) -> Result<String, CgroupError> {
    let bad = || CgroupError::InvalidPath(cgroups_path.to_string());
    let mut it = cgroups_path.split(':');
    let (Some(slice), Some(prefix), Some(name), None) =
        (it.next(), it.next(), it.next(), it.next())
    else {
        return Err(bad());
    };
    if name.is_empty() || name.contains('/') || prefix.contains('/') {
        return Err(bad());
    }
    let slice = if slice.is_empty() {
        "system.slice"
    } else {
        slice
    };
    let dir = expand_slice(slice)?;
    let unit = if name.ends_with(SLICE) {
        name.to_string()
    } else if prefix.is_empty() {
        format!("{name}.scope")
    } else {
        format!("{prefix}-{name}.scope")
    };
    Ok(if dir.is_empty() {
        unit
    } else {
        format!("{dir}/{unit}")
    })
}

/// The slice unit that a systemd cgroup path ends in (`a.slice/a-b.slice` → `a-b.slice`);
/// the root path is `-.slice`.
pub fn unit_of(path: &str) -> String {
    path.rsplit('/')
        .find(|p| !p.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| format!("-{SLICE}"))
}

/// The parent slice of a slice unit (`a-b.slice` → `a.slice`, `a.slice` → `-.slice`).
pub fn parent_slice(slice: &str) -> String {
    let name = slice.strip_suffix(SLICE).unwrap_or(slice);
    match name.rsplit_once('-') {
        Some((parent, _)) if !parent.is_empty() => format!("{parent}{SLICE}"),
        _ => format!("-{SLICE}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Upstream's TestCgroupNameToSystemdBasename and TestCgroupNameToSystemd values.
    #[test]
    fn internal_names_become_slices() {
        for (input, slice, path) in [
            ("/", "-.slice", ""),
            ("/system", "system.slice", "system.slice"),
            (
                "/system/Burstable",
                "system-Burstable.slice",
                "system.slice/system-Burstable.slice",
            ),
            (
                "/Burstable/pod-123",
                "Burstable-pod_123.slice",
                "Burstable.slice/Burstable-pod_123.slice",
            ),
            (
                "/test/a/b",
                "test-a-b.slice",
                "test.slice/test-a.slice/test-a-b.slice",
            ),
            (
                "/test/a/b/Burstable",
                "test-a-b-Burstable.slice",
                "test.slice/test-a.slice/test-a-b.slice/test-a-b-Burstable.slice",
            ),
            ("/Burstable", "Burstable.slice", "Burstable.slice"),
            (
                "/BestEffort/pod-6c1a4e95-6bb6-11e6-bc26-28d2444e470d",
                "BestEffort-pod_6c1a4e95_6bb6_11e6_bc26_28d2444e470d.slice",
                "BestEffort.slice/BestEffort-pod_6c1a4e95_6bb6_11e6_bc26_28d2444e470d.slice",
            ),
            ("/kubepods", "kubepods.slice", "kubepods.slice"),
            (
                "kubepods/burstable/pod0a1b-2c3d",
                "kubepods-burstable-pod0a1b_2c3d.slice",
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b_2c3d.slice",
            ),
        ] {
            assert_eq!(slice_name(input), slice, "{input}");
            assert_eq!(to_systemd(input), path, "{input}");
        }
    }

    // libcontainer's TestExpandSlice values.
    #[test]
    fn slices_expand_to_their_ancestors() {
        assert_eq!(expand_slice("-.slice").unwrap(), "");
        assert_eq!(expand_slice("test.slice").unwrap(), "test.slice");
        assert_eq!(
            expand_slice("test-a.slice").unwrap(),
            "test.slice/test-a.slice"
        );
        assert_eq!(
            expand_slice("test-a-b.slice").unwrap(),
            "test.slice/test-a.slice/test-a-b.slice"
        );
        for bad in [
            "test",
            "test-.slice",
            "-test.slice",
            "test--a.slice",
            "a/b.slice",
            ".slice",
        ] {
            assert!(expand_slice(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn systemd_paths_parse_back() {
        assert_eq!(parse_systemd("/test"), ["test"]);
        assert_eq!(parse_systemd("/test.slice"), ["test"]);
        assert_eq!(
            parse_systemd(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b_2c3d.slice"
            ),
            ["kubepods", "burstable", "pod0a1b-2c3d"]
        );
        assert!(parse_systemd("/").is_empty());
    }

    #[test]
    fn container_scopes_in_pod_slices() {
        assert_eq!(
            scope_path("kubepods-burstable-pod1.slice:cri-nodus:abc").unwrap(),
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-nodus-abc.scope"
        );
        assert_eq!(
            scope_path(":cri-nodus:abc").unwrap(),
            "system.slice/cri-nodus-abc.scope"
        );
        assert_eq!(scope_path("-.slice::abc").unwrap(), "abc.scope");
        assert_eq!(
            scope_path("a.slice:x:a-b.slice").unwrap(),
            "a.slice/a-b.slice"
        );
        for bad in [
            "kubepods/pod1/abc",
            "a.slice:x",
            "a.slice:x:",
            "a:b:c:d",
            "x:p:n",
        ] {
            assert!(scope_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn units_and_parents() {
        assert_eq!(unit_of("a.slice/a-b.slice"), "a-b.slice");
        assert_eq!(unit_of(""), "-.slice");
        assert_eq!(parent_slice("a-b.slice"), "a.slice");
        assert_eq!(parent_slice("a.slice"), "-.slice");
    }
}
