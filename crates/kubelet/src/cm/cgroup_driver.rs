//! The cgroup driver (upstream's KubeletCgroupDriverFromCRI): the kubelet asks the runtime
//! with the RuntimeConfig RPC which driver places containers, and follows it whatever its
//! own `cgroupDriver` says; its own setting is used only when the runtime cannot say.

use crate::cri::RuntimeClient;
use cri::runtime::v1 as pb;
use std::time::Duration;

/// A cgroup driver, as `cgroupDriver` names it: who creates the cgroups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CgroupDriver {
    /// The kubelet writes cgroupfs itself.
    #[default]
    Cgroupfs,
    /// systemd creates a slice per cgroup (cgroup v2 hosts run by systemd only).
    Systemd,
}

impl CgroupDriver {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }

    /// `cgroupDriver` / `--cgroup-driver`.
    pub fn parse(s: &str) -> Result<CgroupDriver, String> {
        match s {
            "cgroupfs" => Ok(CgroupDriver::Cgroupfs),
            "systemd" => Ok(CgroupDriver::Systemd),
            _ => Err(format!(
                "cgroupDriver {s:?} is invalid: supported values: \"cgroupfs\", \"systemd\""
            )),
        }
    }

    /// The runtime's answer; None when it has no Linux configuration to give.
    pub fn from_cri(resp: &pb::RuntimeConfigResponse) -> Result<Option<CgroupDriver>, String> {
        let Some(linux) = resp.linux.as_ref() else {
            return Ok(None);
        };
        match pb::CgroupDriver::try_from(linux.cgroup_driver) {
            Ok(pb::CgroupDriver::Systemd) => Ok(Some(CgroupDriver::Systemd)),
            Ok(pb::CgroupDriver::Cgroupfs) => Ok(Some(CgroupDriver::Cgroupfs)),
            Err(_) => Err(format!(
                "runtime returned an unknown cgroup driver {}",
                linux.cgroup_driver
            )),
        }
    }
}

/// How long a runtime still starting gets to answer (upstream's three tries 2 s apart), in
/// short steps: `nodus node` starts its runtime alongside the kubelet, and its socket is up
/// within milliseconds.
const PATIENCE: Duration = Duration::from_secs(6);
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// The driver to use: the runtime's, or `configured` when the runtime does not implement
/// RuntimeConfig, gives no Linux configuration, or does not answer.
pub async fn from_runtime(
    runtime: &RuntimeClient,
    configured: CgroupDriver,
) -> Result<CgroupDriver, String> {
    let mut last_error = None;
    for attempt in 0..(PATIENCE.as_millis() / RETRY_AFTER.as_millis()) {
        if attempt > 0 {
            tokio::time::sleep(RETRY_AFTER).await;
        }
        match runtime
            .clone()
            .runtime_config(pb::RuntimeConfigRequest {})
            .await
        {
            Ok(resp) => {
                let Some(driver) = CgroupDriver::from_cri(&resp.into_inner())? else {
                    return Ok(configured);
                };
                tracing::info!(
                    cgroupDriver = driver.as_str(),
                    "Using cgroup driver setting received from the CRI runtime"
                );
                if driver != configured {
                    tracing::info!(
                        configured = configured.as_str(),
                        cgroupDriver = driver.as_str(),
                        "the kubelet's cgroupDriver differs from the runtime's; following the runtime"
                    );
                }
                return Ok(driver);
            }
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                tracing::info!(
                    "CRI implementation should be updated to support RuntimeConfig when KubeletCgroupDriverFromCRI feature gate has been enabled. Falling back to using cgroupDriver from kubelet config."
                );
                return Ok(configured);
            }
            Err(s) => last_error = Some(s),
        }
    }
    // Upstream stops here; nodus's kubelet starts before its runtime answers (the PLEG
    // reports it), so it keeps going with its own setting.
    tracing::warn!(
        error = %last_error.map(|s| s.message().to_string()).unwrap_or_default(),
        cgroupDriver = configured.as_str(),
        "the container runtime did not answer RuntimeConfig; using the configured cgroup driver"
    );
    Ok(configured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_config_and_cri_values() {
        assert_eq!(CgroupDriver::parse("cgroupfs"), Ok(CgroupDriver::Cgroupfs));
        assert_eq!(CgroupDriver::parse("systemd"), Ok(CgroupDriver::Systemd));
        assert!(
            CgroupDriver::parse("Systemd")
                .unwrap_err()
                .contains("invalid")
        );
        let resp = |d: i32| pb::RuntimeConfigResponse {
            linux: Some(pb::LinuxRuntimeConfiguration { cgroup_driver: d }),
        };
        assert_eq!(
            CgroupDriver::from_cri(&resp(pb::CgroupDriver::Cgroupfs as i32)),
            Ok(Some(CgroupDriver::Cgroupfs))
        );
        assert_eq!(
            CgroupDriver::from_cri(&resp(pb::CgroupDriver::Systemd as i32)),
            Ok(Some(CgroupDriver::Systemd))
        );
        assert_eq!(
            CgroupDriver::from_cri(&resp(7)),
            Err("runtime returned an unknown cgroup driver 7".into())
        );
        assert_eq!(
            CgroupDriver::from_cri(&pb::RuntimeConfigResponse { linux: None }),
            Ok(None)
        );
    }
}
