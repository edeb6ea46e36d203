//! secret volumes (upstream's pkg/volume/secret): like configMap volumes, on a tmpfs so
//! the secret never touches the node's disk.

use super::PodObjects;
use super::atomic_writer::Payload;
use super::configmap::object_payload;
use crate::objectcache::Kind;

/// The payload of a secret volume.
pub fn payload(
    src: &k8s_openapi::api::core::v1::SecretVolumeSource,
    objects: &PodObjects,
) -> Result<Payload, String> {
    let mut out = Payload::new();
    object_payload(
        Kind::Secret,
        src.secret_name.as_deref().unwrap_or_default(),
        src.items.as_deref(),
        src.default_mode,
        src.optional.unwrap_or(false),
        objects,
        &mut out,
    )?;
    Ok(out)
}
