//! RuntimeConfig: the cgroup driver the kubelet must use, so that the pod cgroups it makes
//! are the ones the runtime places containers in (containerd answers from `SystemdCgroup`).

use super::Inner;
use cri::runtime::v1 as pb;

/// The driver for the runtime config's `systemd-cgroup` key.
pub(crate) fn cgroup_driver(systemd_cgroup: bool) -> pb::CgroupDriver {
    if systemd_cgroup {
        pb::CgroupDriver::Systemd
    } else {
        pb::CgroupDriver::Cgroupfs
    }
}

pub fn runtime_config(
    inner: &Inner,
    _req: pb::RuntimeConfigRequest,
) -> Result<pb::RuntimeConfigResponse, tonic::Status> {
    Ok(pb::RuntimeConfigResponse {
        linux: Some(pb::LinuxRuntimeConfiguration {
            cgroup_driver: inner.cgroup_driver as i32,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_follows_the_systemd_cgroup_key() {
        assert_eq!(cgroup_driver(false), pb::CgroupDriver::Cgroupfs);
        assert_eq!(cgroup_driver(true), pb::CgroupDriver::Systemd);
    }
}
