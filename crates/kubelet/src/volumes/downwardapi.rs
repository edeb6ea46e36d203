//! downwardAPI volumes (upstream's pkg/volume/downwardapi): pod metadata and container
//! resources as files. Whole label and annotation maps are written as sorted
//! `key="value"` lines (upstream's fieldpath.FormatMap).

use super::atomic_writer::{FileProjection, Payload};
use super::configmap::DEFAULT_MODE;
use crate::kuberuntime::env::{self, EnvContext};
use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, Pod};
use std::collections::BTreeMap;

/// upstream's fieldpath.FormatMap.
pub fn format_map(m: Option<&BTreeMap<String, String>>) -> String {
    m.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", nodus_k8s::status::go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn field(pod: &Pod, ctx: &EnvContext, path: &str) -> Result<String, String> {
    match path {
        "metadata.labels" => Ok(format_map(pod.metadata.labels.as_ref())),
        "metadata.annotations" => Ok(format_map(pod.metadata.annotations.as_ref())),
        p => env::field_ref(pod, ctx, p).map_err(|e| e.0),
    }
}

/// Adds the files of downward API `items` to `out`.
pub(super) fn add_items(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    ctx: &EnvContext,
    out: &mut Payload,
) -> Result<(), String> {
    let mode = default_mode.unwrap_or(DEFAULT_MODE) as u32;
    for it in items {
        let value = if let Some(f) = &it.field_ref {
            field(pod, ctx, &f.field_path)?
        } else if let Some(r) = &it.resource_field_ref {
            let cname = r.container_name.as_deref().unwrap_or_default();
            let container = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| c.name == cname))
                .ok_or_else(|| {
                    format!("container {cname:?} not found in the pod for {}", it.path)
                })?;
            env::resource_ref(
                container,
                ctx,
                &r.resource,
                r.divisor.as_ref().map(|d| d.0.as_str()),
            )
            .map_err(|e| e.0)?
        } else {
            String::new()
        };
        out.insert(
            it.path.clone(),
            FileProjection {
                data: value.into_bytes(),
                mode: it.mode.map_or(mode, |m| m as u32),
            },
        );
    }
    Ok(())
}

/// The payload of a downwardAPI volume.
pub fn payload(
    pod: &Pod,
    src: &k8s_openapi::api::core::v1::DownwardAPIVolumeSource,
    ctx: &EnvContext,
) -> Result<Payload, String> {
    let mut out = Payload::new();
    add_items(
        pod,
        src.items.as_deref().unwrap_or_default(),
        src.default_mode,
        ctx,
        &mut out,
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_format_like_upstream() {
        let m: BTreeMap<String, String> =
            [("b".into(), "two \"q\"".into()), ("a".into(), "one".into())].into();
        assert_eq!(format_map(Some(&m)), "a=\"one\"\nb=\"two \\\"q\\\"\"");
        assert_eq!(format_map(None), "");
    }
}
