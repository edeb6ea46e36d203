//! ImageStatus: one image by id, tag or digest; an absent image is an empty answer, not
//! an error (the CRI contract the kubelet's pull-policy logic relies on).

use super::{image_name, status, to_cri};
use crate::image::manager::ImageManager;
use cri::runtime::v1 as pb;
use std::collections::HashMap;
use tonic::Status;

pub fn image_status(
    images: &ImageManager,
    req: pb::ImageStatusRequest,
) -> Result<pb::ImageStatusResponse, Status> {
    let name = image_name("ImageStatus", req.image.as_ref())?;
    let Some(rec) = images
        .resolve(&name)
        .map_err(|e| status("ImageStatus", e))?
    else {
        return Ok(pb::ImageStatusResponse::default());
    };
    let mut info = HashMap::new();
    if req.verbose {
        let config = images
            .config_json(&rec)
            .map_err(|e| status("ImageStatus", e))?;
        let verbose = serde_json::json!({
            "chainID": rec.layers.last().map(|l| l.chain_id.to_string()),
            "imageSpec": config,
            "manifestDigest": rec.manifests.last().map(|d| d.to_string()),
            "layers": rec.layers.iter().map(|l| serde_json::json!({
                "digest": l.digest.to_string(),
                "diffID": l.diff_id.to_string(),
                "chainID": l.chain_id.to_string(),
                "size": l.size,
                "mediaType": l.media_type,
            })).collect::<Vec<_>>(),
        });
        info.insert("info".to_string(), verbose.to_string());
    }
    Ok(pb::ImageStatusResponse {
        image: Some(to_cri(&rec)),
        info,
    })
}
