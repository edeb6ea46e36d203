//! configMap volumes (upstream's pkg/volume/configmap): the object's keys (or the listed
//! `items`) as files, `defaultMode` 0644, a missing object or key an error unless
//! `optional`.

use super::PodObjects;
use super::atomic_writer::{FileProjection, Payload};
use crate::objectcache::{Kind, ObjectError};
use k8s_openapi::api::core::v1::KeyToPath;

/// upstream's configMap/secret/downwardAPI/projected `defaultMode`.
pub const DEFAULT_MODE: i32 = 0o644;

/// The files of a configMap or secret source: every key, or `items` (key → path, mode).
pub(super) fn object_payload(
    kind: Kind,
    name: &str,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
    objects: &PodObjects,
    out: &mut Payload,
) -> Result<(), String> {
    let data = match objects.get(kind, name) {
        Ok(d) => d,
        Err(ObjectError::NotFound(_)) if optional => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    let mode = default_mode.unwrap_or(DEFAULT_MODE) as u32;
    match items {
        Some(items) if !items.is_empty() => {
            for it in items {
                let Some(v) = data.get(&it.key) else {
                    if optional {
                        continue;
                    }
                    return Err(match kind {
                        Kind::ConfigMap => {
                            format!("configmap references non-existent config key: {}", it.key)
                        }
                        Kind::Secret => {
                            format!("references non-existent secret key: {}", it.key)
                        }
                    });
                };
                out.insert(
                    it.path.clone(),
                    FileProjection {
                        data: v.clone(),
                        mode: it.mode.map_or(mode, |m| m as u32),
                    },
                );
            }
        }
        _ => {
            for (k, v) in data {
                out.insert(
                    k.clone(),
                    FileProjection {
                        data: v.clone(),
                        mode,
                    },
                );
            }
        }
    }
    Ok(())
}

/// The payload of a configMap volume.
pub fn payload(
    src: &k8s_openapi::api::core::v1::ConfigMapVolumeSource,
    objects: &PodObjects,
) -> Result<Payload, String> {
    let mut out = Payload::new();
    object_payload(
        Kind::ConfigMap,
        &src.name,
        src.items.as_deref(),
        src.default_mode,
        src.optional.unwrap_or(false),
        objects,
        &mut out,
    )?;
    Ok(out)
}
