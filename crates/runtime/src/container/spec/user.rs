//! The container process's uid, gid and additional gids, resolved against the image's own
//! `/etc/passwd` and `/etc/group` the way containerd does (`oci.WithUser`,
//! `oci.WithAdditionalGIDs`, the CRI plugin's supplemental-groups policy).

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use cri::runtime::v1::{LinuxContainerSecurityContext, SupplementalGroupsPolicy};

use super::SpecError;

/// The resolved identity of the container's first process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResolvedUser {
    pub uid: u32,
    pub gid: u32,
    /// Sorted, without duplicates; empty means "none" (omitted from the spec).
    pub additional_gids: Vec<u32>,
}

/// One `/etc/passwd` entry (the fields the runtime uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PasswdEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// One `/etc/group` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupEntry {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

/// Parse `/etc/passwd` text: `name:password:uid:gid:gecos:home:shell`. Blank lines, comments
/// and lines whose ids are not numbers are skipped.
pub(crate) fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                return None;
            }
            let mut f = line.split(':');
            let name = f.next()?.to_string();
            let _password = f.next();
            let uid = f.next()?.trim().parse().ok()?;
            let gid = f.next().map(str::trim).unwrap_or("0").parse().ok()?;
            Some(PasswdEntry { name, uid, gid })
        })
        .collect()
}

/// Parse `/etc/group` text: `name:password:gid:member,member`.
pub(crate) fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                return None;
            }
            let mut f = line.split(':');
            let name = f.next()?.to_string();
            let _password = f.next();
            let gid = f.next()?.trim().parse().ok()?;
            let members = f
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(String::from)
                .collect();
            Some(GroupEntry { name, gid, members })
        })
        .collect()
}

/// Resolve `rel` (e.g. `etc/passwd`) inside `root`, following symlinks as if `root` were `/`
/// (absolute targets are re-anchored at `root`, `..` never climbs above it).
pub(crate) fn resolve_in_root(root: &Path, rel: &str) -> std::io::Result<PathBuf> {
    const MAX_LINKS: usize = 40;
    let mut pending: Vec<String> = rel
        .split('/')
        .filter(|p| !p.is_empty())
        .map(String::from)
        .rev()
        .collect();
    let mut resolved: Vec<String> = Vec::new();
    let mut links = 0;
    while let Some(part) = pending.pop() {
        match part.as_str() {
            "." => continue,
            ".." => {
                resolved.pop();
                continue;
            }
            _ => {}
        }
        resolved.push(part);
        let here = resolved.iter().fold(root.to_path_buf(), |p, c| p.join(c));
        let meta = std::fs::symlink_metadata(&here)?;
        if !meta.file_type().is_symlink() {
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(std::io::Error::other(format!(
                "too many levels of symbolic links resolving {rel}"
            )));
        }
        let target = std::fs::read_link(&here)?;
        resolved.pop();
        if target.is_absolute() {
            resolved.clear();
        }
        let mut parts: Vec<String> = target
            .components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                Component::ParentDir => Some("..".to_string()),
                _ => None,
            })
            .collect();
        parts.reverse();
        pending.extend(parts);
    }
    Ok(resolved.iter().fold(root.to_path_buf(), |p, c| p.join(c)))
}

/// Read a file of the image (`None` when it does not exist).
fn read_image_file(rootfs: &Path, rel: &str) -> Result<Option<String>, SpecError> {
    let path = match resolve_in_root(rootfs, rel) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(SpecError::Internal(format!(
                "failed to resolve /{rel} in the container rootfs {}: {e}",
                rootfs.display()
            )));
        }
    };
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let read_failed = |e: std::io::Error| {
        SpecError::Internal(format!(
            "failed to read /{rel} of the container rootfs {}: {e}",
            rootfs.display()
        ))
    };
    // The image chooses what these paths are: a FIFO would block the open (and the
    // CreateContainer with it) for good, a device node could be read without end, a huge
    // file would be read into memory. Only a bounded regular file is read.
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_failed(e)),
    };
    let meta = file.metadata().map_err(read_failed)?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let kind = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device node"
        } else if ft.is_dir() {
            "a directory"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "a special file"
        };
        return Err(SpecError::InvalidArgument(format!(
            "/{rel} in the image is {kind}, not a regular file"
        )));
    }
    if meta.len() > MAX_IMAGE_ID_FILE {
        return Err(SpecError::InvalidArgument(format!(
            "/{rel} in the image is {} bytes, more than the {MAX_IMAGE_ID_FILE} read for users and groups",
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_IMAGE_ID_FILE)
        .read_to_end(&mut bytes)
        .map_err(read_failed)?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// The most read of an image's `/etc/passwd` or `/etc/group` (about 50,000 entries).
const MAX_IMAGE_ID_FILE: u64 = 4 << 20;

fn passwd(rootfs: &Path) -> Result<Option<Vec<PasswdEntry>>, SpecError> {
    Ok(read_image_file(rootfs, "etc/passwd")?.map(|t| parse_passwd(&t)))
}

fn groups(rootfs: &Path) -> Result<Option<Vec<GroupEntry>>, SpecError> {
    Ok(read_image_file(rootfs, "etc/group")?.map(|t| parse_group(&t)))
}

/// The CRI user string: `username`, `uid`, `username:gid`, `uid:gid` (containerd's
/// `GenerateUserString`); `None` when the security context names no user.
pub(crate) fn cri_user_string(
    sc: Option<&LinuxContainerSecurityContext>,
) -> Result<Option<String>, SpecError> {
    let Some(sc) = sc else { return Ok(None) };
    let mut user = sc.run_as_user.as_ref().map(|u| u.value.to_string());
    if !sc.run_as_username.is_empty() {
        user = Some(sc.run_as_username.clone());
    }
    let group = sc.run_as_group.as_ref().map(|g| g.value.to_string());
    match (user, group) {
        (None, Some(g)) => Err(SpecError::InvalidArgument(format!(
            "linux.security_context.run_as_group {g} is specified without run_as_user or run_as_username"
        ))),
        (None, None) => Ok(None),
        (Some(u), None) => Ok(Some(u)),
        (Some(u), Some(g)) => Ok(Some(format!("{u}:{g}"))),
    }
}

enum Id {
    Number(u32),
    Name(String),
}

/// A uid or gid field of a user string: numbers in `0..=i32::MAX` (runc's limit), anything
/// not numeric is a name.
fn parse_id(field: &str, what: &str, userstr: &str) -> Result<Id, SpecError> {
    match field.parse::<i64>() {
        Ok(v) if (0..=i64::from(i32::MAX)).contains(&v) => Ok(Id::Number(v as u32)),
        Ok(_) => Err(SpecError::InvalidArgument(format!(
            "invalid USER value {userstr:?}: {what} out of range"
        ))),
        Err(e)
            if matches!(
                e.kind(),
                std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow
            ) =>
        {
            Err(SpecError::InvalidArgument(format!(
                "invalid USER value {userstr:?}: {what} out of range"
            )))
        }
        Err(_) => Ok(Id::Name(field.to_string())),
    }
}

fn user_by_name(rootfs: &Path, name: &str) -> Result<PasswdEntry, SpecError> {
    let Some(users) = passwd(rootfs)? else {
        return Err(SpecError::InvalidArgument(format!(
            "unable to find user {name}: the image has no /etc/passwd (open etc/passwd: no such file or directory)"
        )));
    };
    users.into_iter().find(|u| u.name == name).ok_or_else(|| {
        SpecError::InvalidArgument(format!(
            "unable to find user {name}: no users found (no entry for {name:?} in the image's /etc/passwd)"
        ))
    })
}

fn group_by_name(rootfs: &Path, name: &str) -> Result<u32, SpecError> {
    let Some(groups) = groups(rootfs)? else {
        return Err(SpecError::InvalidArgument(format!(
            "unable to find group {name}: the image has no /etc/group (open etc/group: no such file or directory)"
        )));
    };
    groups
        .into_iter()
        .find(|g| g.name == name)
        .map(|g| g.gid)
        .ok_or_else(|| {
            SpecError::InvalidArgument(format!(
                "unable to find group {name}: no groups found (no entry for {name:?} in the image's /etc/group)"
            ))
        })
}

/// containerd's `oci.WithUser`: `(uid, gid)` for a user string.
pub(crate) fn uid_gid_for(rootfs: &Path, userstr: &str) -> Result<(u32, u32), SpecError> {
    let parts: Vec<&str> = userstr.split(':').collect();
    match parts.as_slice() {
        [user] => match parse_id(user, "uid", userstr)? {
            Id::Number(uid) => {
                // A uid without an entry runs with gid 0.
                let gid = passwd(rootfs)?
                    .and_then(|users| users.into_iter().find(|u| u.uid == uid))
                    .map(|u| u.gid)
                    .unwrap_or(0);
                Ok((uid, gid))
            }
            Id::Name(name) => {
                let u = user_by_name(rootfs, &name)?;
                Ok((u.uid, u.gid))
            }
        },
        [user, group] => {
            let uid = match parse_id(user, "uid", userstr)? {
                Id::Number(uid) => uid,
                Id::Name(name) => user_by_name(rootfs, &name)?.uid,
            };
            let gid = match parse_id(group, "gid", userstr)? {
                Id::Number(gid) => gid,
                Id::Name(name) => group_by_name(rootfs, &name)?,
            };
            Ok((uid, gid))
        }
        _ => Err(SpecError::InvalidArgument(format!(
            "invalid USER value {userstr:?}"
        ))),
    }
}

/// containerd's `oci.WithAdditionalGIDs`: the gids of the groups in `/etc/group` that list the
/// user as a member (not the user's own same-named group), plus the primary gid.
fn groups_of(rootfs: &Path, userstr: &str, primary_gid: u32) -> Result<Vec<u32>, SpecError> {
    let mut out = Vec::new();
    let username = match userstr.parse::<i64>() {
        Ok(uid) => passwd(rootfs)?
            .and_then(|users| users.into_iter().find(|u| i64::from(u.uid) == uid))
            .map(|u| u.name),
        Err(_) => Some(userstr.to_string()),
    };
    if let Some(username) = username
        && let Some(groups) = groups(rootfs)?
    {
        out.extend(
            groups
                .iter()
                .filter(|g| g.name != username && g.members.contains(&username))
                .map(|g| g.gid),
        );
    }
    if !out.contains(&primary_gid) {
        out.insert(0, primary_gid);
    }
    Ok(out)
}

/// Resolve the container user from the CRI security context, falling back to the image's
/// `config.User`, and compute the additional gids by the supplemental-groups policy.
pub(crate) fn resolve(
    rootfs: &Path,
    sc: Option<&LinuxContainerSecurityContext>,
    image_user: &str,
) -> Result<ResolvedUser, SpecError> {
    // The user: CRI first, then the image, else root without looking anything up.
    let userstr = match cri_user_string(sc)? {
        Some(u) => Some(u),
        None if !image_user.is_empty() => Some(image_user.to_string()),
        None => None,
    };
    let (uid, gid, mut gids) = match &userstr {
        Some(u) => {
            let (uid, gid) = uid_gid_for(rootfs, u)?;
            (uid, gid, BTreeSet::from([gid]))
        }
        None => (0, 0, BTreeSet::new()),
    };

    // Whose /etc/group memberships count: the CRI user, else the image user (without group).
    let member = sc
        .filter(|s| !s.run_as_username.is_empty())
        .map(|s| s.run_as_username.clone())
        .or_else(|| {
            sc.and_then(|s| s.run_as_user.as_ref())
                .map(|u| u.value.to_string())
        })
        .or_else(|| {
            (!image_user.is_empty()).then(|| image_user.split(':').next().unwrap_or("").to_string())
        })
        .unwrap_or_else(|| "0".to_string());

    let policy_value = sc.map(|s| s.supplemental_groups_policy).unwrap_or(0);
    match SupplementalGroupsPolicy::try_from(policy_value) {
        Ok(SupplementalGroupsPolicy::Merge) => {
            gids.extend(groups_of(rootfs, &member, gid)?);
        }
        Ok(SupplementalGroupsPolicy::Strict) => {}
        Err(_) => {
            return Err(SpecError::InvalidArgument(format!(
                "linux.security_context.supplemental_groups_policy {policy_value} is not implemented (known: Merge, Strict)"
            )));
        }
    }
    for g in sc.map(|s| s.supplemental_groups.as_slice()).unwrap_or(&[]) {
        let g = u32::try_from(*g).map_err(|_| {
            SpecError::InvalidArgument(format!(
                "linux.security_context.supplemental_groups: gid {g} out of range"
            ))
        })?;
        gids.insert(g);
    }
    Ok(ResolvedUser {
        uid,
        gid,
        additional_gids: gids.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::runtime::v1::Int64Value;

    const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
alice:x:1000:1000:Alice:/home/alice:/bin/sh
bob:x:1001:100::/home/bob:/bin/sh
# comment:x:5:5
";
    const GROUP: &str = "\
root:x:0:root
bin:x:1:root,daemon
wheel:x:10:root,alice
users:x:100:
alice:x:1000:alice
audio:x:29:alice,bob
video:x:44:bob
";

    fn rootfs(passwd: Option<&str>, group: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        if let Some(p) = passwd {
            std::fs::write(dir.path().join("etc/passwd"), p).unwrap();
        }
        if let Some(g) = group {
            std::fs::write(dir.path().join("etc/group"), g).unwrap();
        }
        dir
    }

    fn sc(
        user: Option<i64>,
        name: &str,
        group: Option<i64>,
        supplemental: &[i64],
        policy: SupplementalGroupsPolicy,
    ) -> LinuxContainerSecurityContext {
        LinuxContainerSecurityContext {
            run_as_user: user.map(|value| Int64Value { value }),
            run_as_username: name.to_string(),
            run_as_group: group.map(|value| Int64Value { value }),
            supplemental_groups: supplemental.to_vec(),
            supplemental_groups_policy: policy as i32,
            ..Default::default()
        }
    }

    type UserCase<'a> = (
        Option<LinuxContainerSecurityContext>,
        &'a str,
        u32,
        u32,
        Vec<u32>,
    );

    #[test]
    fn user_resolution_table() {
        use SupplementalGroupsPolicy::{Merge, Strict};
        let root = rootfs(Some(PASSWD), Some(GROUP));
        // (security context, image user, uid, gid, additional gids)
        let cases: Vec<UserCase> = vec![
            // Nothing anywhere: root, with root's memberships.
            (None, "", 0, 0, vec![0, 1, 10]),
            // Image user by name.
            (None, "alice", 1000, 1000, vec![10, 29, 1000]),
            // Image user by uid with an entry: gid from passwd.
            (None, "1001", 1001, 100, vec![29, 44, 100]),
            // Image uid without an entry: gid 0, no memberships.
            (None, "4242", 4242, 0, vec![0]),
            // Image uid:gid: no lookup of the gid.
            (None, "1000:5", 1000, 5, vec![5, 10, 29]),
            // Image name:group.
            (None, "bob:wheel", 1001, 10, vec![10, 29, 44]),
            // CRI run_as_user overrides the image user.
            (
                Some(sc(Some(1000), "", None, &[], Merge)),
                "bob",
                1000,
                1000,
                vec![10, 29, 1000],
            ),
            // CRI run_as_username overrides run_as_user.
            (
                Some(sc(Some(1000), "bob", None, &[], Merge)),
                "",
                1001,
                100,
                vec![29, 44, 100],
            ),
            // run_as_group sets the primary gid.
            (
                Some(sc(Some(1000), "", Some(3000), &[], Merge)),
                "",
                1000,
                3000,
                vec![10, 29, 3000],
            ),
            // Supplemental groups merge with /etc/group memberships.
            (
                Some(sc(Some(1000), "", None, &[4000, 10], Merge)),
                "",
                1000,
                1000,
                vec![10, 29, 1000, 4000],
            ),
            // Strict: only the primary gid and the supplemental groups.
            (
                Some(sc(Some(1000), "", None, &[4000], Strict)),
                "",
                1000,
                1000,
                vec![1000, 4000],
            ),
            // Strict without any user: just the supplemental groups.
            (Some(sc(None, "", None, &[7], Strict)), "", 0, 0, vec![7]),
            (Some(sc(None, "", None, &[], Strict)), "", 0, 0, vec![]),
        ];
        for (i, (sc, image_user, uid, gid, gids)) in cases.into_iter().enumerate() {
            let got = resolve(root.path(), sc.as_ref(), image_user)
                .unwrap_or_else(|e| panic!("case {i}: {e}"));
            assert_eq!(
                got,
                ResolvedUser {
                    uid,
                    gid,
                    additional_gids: gids
                },
                "case {i} (image user {image_user:?})"
            );
        }
    }

    #[test]
    fn missing_files() {
        let root = rootfs(None, None);
        // A numeric user needs no files.
        let got = resolve(root.path(), None, "1234").unwrap();
        assert_eq!((got.uid, got.gid, got.additional_gids), (1234, 0, vec![0]));
        // A name does.
        let err = resolve(root.path(), None, "alice").unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.to_string().contains("unable to find user alice"),
            "{err}"
        );
    }

    #[test]
    fn user_errors() {
        let root = rootfs(Some(PASSWD), Some(GROUP));
        for (sc, image_user, needle) in [
            (None, "nobody", "unable to find user nobody: no users found"),
            (
                None,
                "alice:nogroup",
                "unable to find group nogroup: no groups found",
            ),
            (None, "a:b:c", "invalid USER value \"a:b:c\""),
            (None, "-1", "uid out of range"),
            (None, "99999999999", "uid out of range"),
            (None, "1:2147483648", "gid out of range"),
            (
                Some(sc(None, "", Some(5), &[], SupplementalGroupsPolicy::Merge)),
                "",
                "run_as_group 5 is specified without",
            ),
            (
                Some(sc(
                    None,
                    "ghost",
                    None,
                    &[],
                    SupplementalGroupsPolicy::Merge,
                )),
                "alice",
                "unable to find user ghost",
            ),
        ] {
            let err = resolve(root.path(), sc.as_ref(), image_user).unwrap_err();
            assert!(err.to_string().contains(needle), "{image_user:?}: {err}");
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
        }
        let mut bad = sc(Some(1), "", None, &[], SupplementalGroupsPolicy::Merge);
        bad.supplemental_groups_policy = 7;
        let err = resolve(root.path(), Some(&bad), "").unwrap_err();
        assert!(
            err.to_string().contains("supplemental_groups_policy 7"),
            "{err}"
        );
    }

    #[test]
    fn only_bounded_regular_files_are_read() {
        // A FIFO: the open must not block, and the error names what it is.
        let root = rootfs(None, Some(GROUP));
        let fifo = std::ffi::CString::new(
            root.path()
                .join("etc/passwd")
                .as_os_str()
                .as_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let err = resolve(root.path(), None, "alice").unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            err.to_string(),
            "/etc/passwd in the image is a FIFO, not a regular file"
        );
        // A directory.
        let root = rootfs(Some(PASSWD), None);
        std::fs::create_dir(root.path().join("etc/group")).unwrap();
        let err = resolve(root.path(), None, "alice").unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
        // Too big: refused before anything is read.
        let root = rootfs(None, Some(GROUP));
        let f = std::fs::File::create(root.path().join("etc/passwd")).unwrap();
        f.set_len(300 << 20).unwrap();
        let err = resolve(root.path(), None, "alice").unwrap_err();
        assert!(
            err.to_string()
                .contains("/etc/passwd in the image is 314572800 bytes"),
            "{err}"
        );
    }

    #[test]
    fn passwd_behind_absolute_symlink_stays_in_the_rootfs() {
        let root = rootfs(None, None);
        std::fs::create_dir_all(root.path().join("nix/store")).unwrap();
        std::fs::write(
            root.path().join("nix/store/passwd"),
            "carol:x:77:78::/:/bin/sh\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("/nix/store/passwd", root.path().join("etc/passwd")).unwrap();
        let got = resolve(root.path(), None, "carol").unwrap();
        assert_eq!((got.uid, got.gid), (77, 78));
        // A link climbing out with .. is clamped at the rootfs.
        std::fs::remove_file(root.path().join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink(
            "../../../../nix/store/passwd",
            root.path().join("etc/passwd"),
        )
        .unwrap();
        assert_eq!(resolve(root.path(), None, "carol").unwrap().uid, 77);
    }
}
