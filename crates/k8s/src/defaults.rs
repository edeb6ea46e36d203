//! Upstream's API defaulting (`SetDefaults_*`) for the catalogue kinds.

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::gvk::Gvk;

/// Applies upstream's defaults to an object of a catalogue kind (others are left alone).
pub fn default_object(gvk: &Gvk, obj: &mut Value) {
    let _ = (gvk, obj);
}

/// The DefaultTolerationSeconds admission plugin: not-ready/unreachable NoExecute for 300s.
pub fn default_tolerations(pod: &mut Value) {
    let _ = pod;
}

/// The pod defaults on the typed struct (static pods).
pub fn default_pod(pod: &mut Pod) {
    let _ = pod;
}
