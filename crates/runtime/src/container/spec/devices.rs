//! Device nodes and the device cgroup rules of a container: deny everything, then allow each
//! CRI device with its permissions (containerd's `WithDevices`); privileged containers get
//! every host device and access to all of them. runc and crun add their own default allowed
//! devices (`/dev/null`, `/dev/zero`, ...) on top, as they do for containerd.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use cri::runtime::v1::ContainerConfig;
use oci_spec::runtime::{LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType};

use super::{HostFacts, SpecError};

/// Devices to create plus the cgroup rules.
#[derive(Debug, Clone, Default)]
pub(crate) struct DevicePlan {
    pub devices: Vec<LinuxDevice>,
    pub rules: Vec<LinuxDeviceCgroup>,
}

fn rule(
    allow: bool,
    typ: Option<LinuxDeviceType>,
    major: Option<i64>,
    minor: Option<i64>,
    access: &str,
) -> LinuxDeviceCgroup {
    let mut r = LinuxDeviceCgroup::default();
    r.set_allow(allow);
    r.set_typ(typ);
    r.set_major(major);
    r.set_minor(minor);
    r.set_access(Some(access.to_string()));
    r
}

/// A device node described by `lstat` (containerd's `DeviceFromPath`); `None` when `path` is
/// not a block, character or FIFO device.
pub(crate) fn device_from_path(path: &Path) -> std::io::Result<Option<LinuxDevice>> {
    let meta = std::fs::symlink_metadata(path)?;
    let ft = meta.file_type();
    let typ = if ft.is_block_device() {
        LinuxDeviceType::B
    } else if ft.is_char_device() {
        LinuxDeviceType::C
    } else if ft.is_fifo() {
        LinuxDeviceType::P
    } else {
        return Ok(None);
    };
    let rdev = meta.rdev();
    let mut d = LinuxDevice::default();
    d.set_path(path.to_path_buf());
    d.set_typ(typ);
    d.set_major(nix::sys::stat::major(rdev) as i64);
    d.set_minor(nix::sys::stat::minor(rdev) as i64);
    d.set_file_mode(Some(meta.mode() & 0o7777));
    d.set_uid(Some(meta.uid()));
    d.set_gid(Some(meta.gid()));
    Ok(Some(d))
}

/// containerd's `getDevices`: a device path, or every device below a directory (skipping
/// `pts`, `shm`, `fd`, `mqueue` and FIFOs), renamed under `container_path` when given.
fn get_devices(path: &Path, container_path: Option<&Path>) -> Result<Vec<LinuxDevice>, SpecError> {
    let meta = std::fs::metadata(path).map_err(|e| {
        SpecError::InvalidArgument(format!("error stating device path {}: {e}", path.display()))
    })?;
    if !meta.is_dir() {
        let resolved = std::fs::canonicalize(path).map_err(|e| {
            SpecError::InvalidArgument(format!(
                "error resolving device path {}: {e}",
                path.display()
            ))
        })?;
        let dev = device_from_path(&resolved)
            .map_err(|e| {
                SpecError::InvalidArgument(format!(
                    "error stating device path {}: {e}",
                    path.display()
                ))
            })?
            .ok_or_else(|| {
                SpecError::InvalidArgument(format!(
                    "get device path: {:?} containerPath: {:?} error: not a device node",
                    path.display().to_string(),
                    container_path
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                ))
            })?;
        let mut dev = dev;
        if let Some(cp) = container_path {
            dev.set_path(cp.to_path_buf());
        }
        return Ok(vec![dev]);
    }
    let mut entries: Vec<_> = std::fs::read_dir(path)
        .map_err(|e| {
            SpecError::InvalidArgument(format!(
                "error reading device directory {}: {e}",
                path.display()
            ))
        })?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    let mut out = Vec::new();
    for entry in entries {
        let name = entry.file_name();
        let child = path.join(&name);
        let child_cp: Option<PathBuf> = container_path.map(|cp| cp.join(&name));
        let Ok(ft) = entry.file_type() else { continue };
        if ft.is_dir() {
            if matches!(
                name.to_str(),
                Some("pts" | "shm" | "fd" | "mqueue" | ".lxc" | ".lxd-mounts" | ".udev")
            ) {
                continue;
            }
            out.extend(get_devices(&child, child_cp.as_deref())?);
            continue;
        }
        if name == "console" {
            continue;
        }
        match device_from_path(&child) {
            Ok(Some(mut d)) if d.typ() != LinuxDeviceType::P => {
                if let Some(cp) = child_cp {
                    d.set_path(cp);
                }
                out.push(d);
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(SpecError::InvalidArgument(format!(
                    "error stating device {}: {e}",
                    child.display()
                )));
            }
        }
    }
    Ok(out)
}

/// The devices of a container.
pub(crate) fn build(
    config: &ContainerConfig,
    privileged: bool,
    host: &HostFacts,
) -> Result<DevicePlan, SpecError> {
    let mut plan = DevicePlan {
        devices: Vec::new(),
        rules: vec![rule(false, None, None, None, "rwm")],
    };
    let mut devices = config.devices.clone();
    // A tty container with the host's /dev gets /dev/console too (containerd does this).
    let host_dev = config
        .mounts
        .iter()
        .any(|m| m.container_path == "/dev" && m.host_path == "/dev");
    if config.tty
        && host_dev
        && !devices
            .iter()
            .any(|d| d.container_path == "/dev/console" && !d.host_path.is_empty())
    {
        devices.push(cri::runtime::v1::Device {
            container_path: "/dev/console".into(),
            host_path: "/dev/console".into(),
            permissions: "rwm".into(),
        });
    }
    for (i, d) in devices.iter().enumerate() {
        if d.host_path.is_empty() {
            return Err(SpecError::InvalidArgument(format!(
                "devices[{i}].host_path is empty (container_path {:?})",
                d.container_path
            )));
        }
        if !d.permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return Err(SpecError::InvalidArgument(format!(
                "devices[{i}].permissions {:?} must be a combination of r, w and m",
                d.permissions
            )));
        }
        let cp = (!d.container_path.is_empty()).then(|| PathBuf::from(&d.container_path));
        for dev in get_devices(Path::new(&d.host_path), cp.as_deref())? {
            plan.rules.push(rule(
                true,
                Some(dev.typ()),
                Some(dev.major()),
                Some(dev.minor()),
                &d.permissions,
            ));
            plan.devices.push(dev);
        }
    }
    if privileged {
        plan.devices.extend(get_devices(&host.dev_dir, None)?);
        plan.rules = vec![rule(true, None, None, None, "rwm")];
    }
    Ok(plan)
}
