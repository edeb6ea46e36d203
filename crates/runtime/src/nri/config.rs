//! NRI's settings in the runtime's config (`nri`, `nri-socket`, `nri-plugin-path`,
//! `nri-plugin-config-path`, `nri-plugin-registration-timeout`,
//! `nri-plugin-request-timeout`), with containerd's defaults.
//!
//! NRI is on unless `nri = false`, as in containerd 2.x. Its socket is one per host
//! (`/var/run/nri/nri.sock`), and containerd/nri takes it over from whoever serves it (it
//! removes the file and binds anew). nodus does not: a runtime finding a live NRI server on
//! its `nri-socket` leaves it alone. With `nri` unset it logs why and runs without NRI, as
//! containerd runs on when its NRI plugin fails to start, so `nodus up` or `nodus node`
//! beside containerd still comes up; with `nri = true` it refuses to start.

use std::path::PathBuf;
use std::time::Duration;

pub(crate) fn default_socket() -> PathBuf {
    "/var/run/nri/nri.sock".into()
}
pub(crate) fn default_plugin_path() -> PathBuf {
    "/opt/nri/plugins".into()
}
pub(crate) fn default_plugin_config_path() -> PathBuf {
    "/etc/nri/conf.d".into()
}
/// containerd/nri's DefaultPluginRegistrationTimeout.
pub(crate) const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
/// containerd/nri's DefaultPluginRequestTimeout.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What the runtime starts NRI with.
#[derive(Debug, Clone)]
pub struct NriOptions {
    pub socket: PathBuf,
    pub plugin_path: PathBuf,
    pub plugin_config_path: PathBuf,
    pub registration_timeout: Duration,
    pub request_timeout: Duration,
}

impl NriOptions {
    /// NRI's options from the runtime config; `None` when NRI is off (`nri = false`).
    pub fn from_config(c: &crate::config::RuntimeConfig) -> Option<NriOptions> {
        (c.nri != Some(false)).then(|| NriOptions {
            socket: c.nri_socket.clone(),
            plugin_path: c.nri_plugin_path.clone(),
            plugin_config_path: c.nri_plugin_config_path.clone(),
            registration_timeout: c.nri_plugin_registration_timeout,
            request_timeout: c.nri_plugin_request_timeout,
        })
    }
}

/// Whether NRI failing to start fails the runtime's start (`nri = true` was asked for
/// explicitly) rather than leaving the runtime without NRI.
pub fn required(c: &crate::config::RuntimeConfig) -> bool {
    c.nri == Some(true)
}

/// Reads a Go duration (`5s`, `500ms`) from the config.
pub(crate) fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = <String as serde::Deserialize>::deserialize(d)?;
    let t = nodus_k8s::duration::parse_duration(&s).map_err(serde::de::Error::custom)?;
    if t.is_zero() {
        return Err(serde::de::Error::custom(format!(
            "{s:?}: an NRI timeout must be more than zero"
        )));
    }
    Ok(t)
}
