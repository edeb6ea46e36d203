//! projected volumes (upstream's pkg/volume/projected): configMap, secret, downwardAPI and
//! serviceAccountToken sources merged into one directory with one atomic writer.

use super::PodObjects;
use super::atomic_writer::{FileProjection, Payload};
use super::configmap::object_payload;
use super::downwardapi::add_items;
use crate::kuberuntime::env::EnvContext;
use crate::objectcache::Kind;
use k8s_openapi::api::core::v1::{Pod, ProjectedVolumeSource};

/// The payload of projected volume `volume`.
pub fn payload(
    pod: &Pod,
    volume: &str,
    src: &ProjectedVolumeSource,
    objects: &PodObjects,
    ctx: &EnvContext,
) -> Result<Payload, String> {
    let mut out = Payload::new();
    let default_mode = src.default_mode;
    for s in src.sources.iter().flatten() {
        if let Some(cm) = &s.config_map {
            object_payload(
                Kind::ConfigMap,
                &cm.name,
                cm.items.as_deref(),
                default_mode,
                cm.optional.unwrap_or(false),
                objects,
                &mut out,
            )?;
        }
        if let Some(sec) = &s.secret {
            object_payload(
                Kind::Secret,
                &sec.name,
                sec.items.as_deref(),
                default_mode,
                sec.optional.unwrap_or(false),
                objects,
                &mut out,
            )?;
        }
        if let Some(d) = &s.downward_api {
            add_items(
                pod,
                d.items.as_deref().unwrap_or_default(),
                default_mode,
                ctx,
                &mut out,
            )?;
        }
        if let Some(t) = &s.service_account_token {
            match objects.tokens.get(&(volume.to_string(), t.path.clone())) {
                Some(Ok(token)) => {
                    out.insert(
                        t.path.clone(),
                        FileProjection {
                            data: token.clone().into_bytes(),
                            // upstream writes tokens 0600 unless defaultMode says otherwise.
                            mode: default_mode.map_or(0o600, |m| m as u32),
                        },
                    );
                }
                Some(Err(e)) => {
                    // Without TokenRequest the rest of the volume is still useful; the
                    // missing token is logged on every sync so it is not silent.
                    tracing::warn!(pod = ?pod.metadata.name, volume, path = %t.path, error = %e,
                        "projected serviceAccountToken left out: the API server did not issue a token");
                }
                None => {}
            }
        }
    }
    Ok(out)
}
