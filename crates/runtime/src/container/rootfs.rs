//! A container's root filesystem and image volumes in a pod with a user namespace.
//!
//! Image layers are shared by every container and owned by the host's root, who does not
//! exist inside a pod's user namespace: seen from there, every file would belong to
//! `nobody` and root in the pod could not write its own `/`. So each layer is idmapped
//! through the pod's user namespace (an idmapped copy of its mount, in a scratch directory)
//! and the overlay is built on those copies; this kernel refuses to idmap the overlay mount
//! itself. The overlay holds private clones of its lower mounts, so the scratch mounts are
//! detached right after and nothing extra stays mounted. The writable upper directory is
//! given to the pod's root, since the overlay's root directory shows the upper's owner and
//! files created in the container land there with the pod's host ids anyway.
//!
//! Bind mounts of volumes get the same treatment ([`idmap_bind_source`]), as runc ≥ 1.2 does
//! for mounts with `uidMappings`; runc 1.1 has no idmapped mounts of its own.

use crate::image::digest::Digest;
use crate::image::snapshot::{MountGuard, Snapshotter, mount_overlay, unmount};
use crate::sandbox::userns::idmapped_mount;
use std::path::{Path, PathBuf};

/// The pod's user namespace as the rootfs needs it.
#[derive(Debug, Clone, Copy)]
pub struct Idmap<'a> {
    /// The pinned user namespace file.
    pub userns: &'a Path,
    /// Host uid and gid of the namespace's root.
    pub root: Option<(u32, u32)>,
}

/// Mounts each lower directory idmapped under `scratch/<i>`, calls `mount` with them, then
/// detaches them (the overlay keeps its own clones) and removes `scratch`.
fn with_idmapped_lowers<T>(
    lowers: &[PathBuf],
    idmap: &Idmap,
    scratch: &Path,
    mount: impl FnOnce(&[PathBuf]) -> Result<T, String>,
) -> Result<T, String> {
    let mut mapped = Vec::with_capacity(lowers.len());
    let result = (|| {
        for (i, lower) in lowers.iter().enumerate() {
            let t = scratch.join(i.to_string());
            std::fs::create_dir_all(&t).map_err(|e| format!("creating {}: {e}", t.display()))?;
            idmapped_mount(lower, &t, idmap.userns, false, false).map_err(|e| e.to_string())?;
            mapped.push(t);
        }
        mount(&mapped)
    })();
    let mut detached = true;
    for t in &mapped {
        if let Err(e) = nix::mount::umount2(t.as_path(), nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(path = %t.display(), error = %e, "detaching an idmapped layer failed");
            detached = false;
        }
    }
    // Never remove through a mount that is still there: it would be the image's layer.
    if detached {
        let _ = std::fs::remove_dir_all(scratch);
    }
    result
}

/// The writable root filesystem of a container: an overlay of the image's chain over
/// `upper`/`work` at `target`, its layers idmapped when the pod has a user namespace.
pub fn mount_rw(
    snap: &Snapshotter,
    chain: &[Digest],
    upper: &Path,
    work: &Path,
    target: &Path,
    idmap: Option<&Idmap>,
    scratch: &Path,
) -> Result<MountGuard, String> {
    let Some(idmap) = idmap else {
        return snap
            .mount_rw(chain, upper, work, target)
            .map_err(|e| e.to_string());
    };
    let lowers = snap.existing_lowerdirs(chain).map_err(|e| e.to_string())?;
    if lowers.is_empty() {
        return Err("an empty layer chain cannot be mounted".into());
    }
    if let Some((uid, gid)) = idmap.root {
        std::os::unix::fs::lchown(upper, Some(uid), Some(gid))
            .map_err(|e| format!("giving {} to the pod's root: {e}", upper.display()))?;
    }
    with_idmapped_lowers(&lowers, idmap, scratch, |mapped| {
        mount_overlay(mapped, Some((upper, work)), target).map_err(|e| e.to_string())
    })
}

/// A read-only view of an image (an image volume), idmapped like [`mount_rw`].
pub fn mount_view(
    snap: &Snapshotter,
    chain: &[Digest],
    target: &Path,
    idmap: Option<&Idmap>,
    scratch: &Path,
) -> Result<MountGuard, String> {
    let Some(idmap) = idmap else {
        return snap.mount_view(chain, target).map_err(|e| e.to_string());
    };
    let lowers = snap.existing_lowerdirs(chain).map_err(|e| e.to_string())?;
    match lowers.as_slice() {
        [] => Err("an empty layer chain cannot be mounted".into()),
        [single] => {
            idmapped_mount(single, target, idmap.userns, true, false).map_err(|e| e.to_string())?;
            Ok(MountGuard::adopt(target))
        }
        _ => with_idmapped_lowers(&lowers, idmap, scratch, |mapped| {
            mount_overlay(mapped, None, target).map_err(|e| e.to_string())
        }),
    }
}

/// Makes an idmapped copy of a bind mount's `source` at `target` (created as a file or a
/// directory like the source) and returns it. `Ok(None)` when the source's filesystem cannot
/// be idmapped (procfs, sysfs, …): the caller then binds the source as it is.
pub fn idmap_bind_source(
    source: &Path,
    target: &Path,
    userns: &Path,
    recursive: bool,
) -> Result<Option<PathBuf>, String> {
    let meta = std::fs::metadata(source)
        .map_err(|e| format!("bind mount source {}: {e}", source.display()))?;
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    let made = if meta.is_dir() {
        std::fs::create_dir(target)
    } else {
        std::fs::write(target, b"")
    };
    made.map_err(|e| format!("creating {}: {e}", target.display()))?;
    match idmapped_mount(source, target, userns, false, recursive) {
        Ok(()) => Ok(Some(target.to_path_buf())),
        Err(crate::sandbox::SandboxError::Sys {
            source: nix::errno::Errno::EINVAL,
            ..
        }) => {
            let _ = if meta.is_dir() {
                std::fs::remove_dir(target)
            } else {
                std::fs::remove_file(target)
            };
            Ok(None)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Unmounts every mount at or below `dir`, deepest first. Must run before a container's
/// directory is removed: an idmapped volume under it is the volume itself.
pub fn unmount_all_under(dir: &Path) -> Result<(), String> {
    // A mount hidden under another one shows once the upper one is gone: ask again.
    for _ in 0..16 {
        let points = nodus_cgroups::mountinfo::mounts_under(dir)
            .map_err(|e| format!("listing the mounts under {}: {e}", dir.display()))?;
        if points.is_empty() {
            return Ok(());
        }
        for p in points {
            if let Err(e) = unmount(&p) {
                let still = nodus_cgroups::mountinfo::mounts_under(&p)
                    .map(|m| m.contains(&p))
                    .unwrap_or(true);
                if still {
                    return Err(e.to_string());
                }
            }
        }
    }
    Err(format!(
        "{} is still mounted after repeated unmounts",
        dir.display()
    ))
}
